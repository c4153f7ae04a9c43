//! The namespace lab of `cargo xtask netns`: P network namespaces (plus one for a hostile
//! sender) on a Linux bridge with IGMPv3 snooping and a querier, MTU 9000, GRO on the veths,
//! software UDP segmentation before the veth (real segments on the wire), a multicast route
//! per namespace; rank processes started in them with deadlines.
//!
//! ## Cleanup
//! Every name carries a per-run id (`rc` + 6 hex digits from the pid and the clock), so
//! parallel runs and leftovers of killed runs never collide. Before anything is created, a
//! **watchdog** is started: `sh` in its own process group (so a terminal's Ctrl-C does not
//! reach it), ignoring SIGINT/SIGTERM/SIGHUP, blocked reading a pipe whose only writer is
//! this process. When the pipe closes -- [`Lab`]'s `Drop` on success or failure, a panic, or
//! the kernel closing it because xtask died of Ctrl-C, SIGTERM or even SIGKILL -- it kills
//! every process left in the lab's namespaces, deletes the namespaces (their veth ends and
//! nft tables go with them), the bridge and the host-side veths. One cleanup path for every
//! way out, no signal handler (xtask has no libc dependency and the workspace denies
//! `unsafe`), and it also covers SIGKILL, which no in-process handler can. [`leftovers`]
//! then lists anything of the run's id still present.

use std::collections::HashMap;
use std::fs::File;
use std::io::Write;
use std::net::Ipv4Addr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The lab's subnet (inside the namespaces only; the host namespace gets no address, so
/// parallel labs never clash).
pub(crate) const SUBNET: [u8; 3] = [10, 77, 0];

/// Runs `program args` under coreutils' `timeout` (30 s) and returns stdout; `Err` with
/// stderr.
pub(crate) fn sh(program: &str, args: &[&str]) -> Result<String, String> {
    sh_limit(30, program, args)
}

/// [`sh`] with a limit of `secs` seconds.
pub(crate) fn sh_limit(secs: u64, program: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new("timeout")
        .args(["-k", "2", &secs.to_string(), program])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("could not run `{program}`: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "`{program} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// `sh` inside namespace `ns`.
pub(crate) fn in_ns(ns: &str, program: &str, args: &[&str]) -> Result<String, String> {
    in_ns_limit(30, ns, program, args)
}

/// [`in_ns`] with a limit of `secs` seconds.
pub(crate) fn in_ns_limit(
    secs: u64,
    ns: &str,
    program: &str,
    args: &[&str],
) -> Result<String, String> {
    let mut a = vec!["netns", "exec", ns, program];
    a.extend_from_slice(args);
    sh_limit(secs, "ip", &a)
}

/// A unique id for this run: `rc` + 6 hex digits.
fn run_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mix = (std::process::id().wrapping_mul(0x9E37_79B1) ^ nanos) & 0xFF_FFFF;
    format!("rc{mix:06x}")
}

/// A built lab. Dropping it removes everything it created (through the watchdog).
pub(crate) struct Lab {
    pub(crate) id: String,
    /// The ranks' namespaces, then the hostile sender's.
    pub(crate) ns: Vec<String>,
    pub(crate) hostile: String,
    pub(crate) bridge: String,
    /// Host-side veth of namespace i (`veths[ranks]` is the hostile one's).
    pub(crate) veths: Vec<String>,
    pub(crate) dir: PathBuf,
    watchdog: Option<Child>,
    watch_in: Option<std::process::ChildStdin>,
}

/// How the bridge treats multicast.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Querier {
    /// IGMPv3 snooping with the bridge as querier (the normal lab).
    On,
    /// Snooping on, no querier anywhere, and unregistered multicast not flooded
    /// (`mcast_flood off` on every port), as a snooping switch without a querier behaves.
    Off,
}

impl Lab {
    /// Builds a lab of `ranks` namespaces; output files go under `out/<id>/`.
    pub(crate) fn new(ranks: usize, out: &Path, querier: Querier) -> Result<Lab, String> {
        let id = run_id();
        let dir = out.join(&id);
        std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let mut ns: Vec<String> = (0..ranks).map(|i| format!("{id}-n{i}")).collect();
        let hostile = format!("{id}-x");
        ns.push(hostile.clone());
        let bridge = format!("{id}br");
        let veths: Vec<String> = (0..=ranks)
            .map(|i| {
                if i == ranks {
                    format!("{id}vx")
                } else {
                    format!("{id}v{i}")
                }
            })
            .collect();
        // The watchdog first: whatever is created after this is covered.
        let (watchdog, watch_in) = start_watchdog(&dir, &ns, &bridge, &veths)?;
        let mut lab = Lab {
            id,
            ns,
            hostile,
            bridge,
            veths,
            dir,
            watchdog: Some(watchdog),
            watch_in: Some(watch_in),
        };
        lab.ns.pop();
        lab.build(querier)?;
        Ok(lab)
    }

    fn build(&self, querier: Querier) -> Result<(), String> {
        let br = self.bridge.as_str();
        // Response interval (centiseconds) and versions before the querier starts, so that a
        // fresh querier does not flood unknown groups for its default 10 s.
        sh(
            "ip",
            &[
                "link",
                "add",
                br,
                "mtu",
                "9000",
                "type",
                "bridge",
                "mcast_snooping",
                "1",
                "mcast_igmp_version",
                "3",
                "mcast_query_response_interval",
                "100",
                "mcast_startup_query_interval",
                "100",
                "mcast_query_interval",
                "1000",
            ],
        )?;
        if querier == Querier::On {
            sh(
                "ip",
                &["link", "set", br, "type", "bridge", "mcast_querier", "1"],
            )?;
        }
        sh("ip", &["link", "set", br, "up"])?;
        let all: Vec<&str> = self
            .ns
            .iter()
            .map(String::as_str)
            .chain([self.hostile.as_str()])
            .collect();
        for (i, ns) in all.iter().enumerate() {
            let v = self.veths[i].as_str();
            let ip = format!("{}/24", self.ip(i));
            sh("ip", &["netns", "add", ns])?;
            sh(
                "ip",
                &[
                    "link", "add", v, "mtu", "9000", "type", "veth", "peer", "name", "eth0", "mtu",
                    "9000", "netns", ns,
                ],
            )?;
            sh("ip", &["link", "set", v, "master", br, "up"])?;
            if querier == Querier::Off {
                sh("bridge", &["link", "set", "dev", v, "mcast_flood", "off"])?;
            }
            sh("ip", &["-n", ns, "link", "set", "lo", "up"])?;
            sh("ip", &["-n", ns, "addr", "add", &ip, "dev", "eth0"])?;
            sh("ip", &["-n", ns, "link", "set", "eth0", "up"])?;
            sh(
                "ip",
                &["-n", ns, "route", "add", "224.0.0.0/4", "dev", "eth0"],
            )?;
            in_ns(
                ns,
                "sysctl",
                &[
                    "-qw",
                    "net.ipv4.conf.all.force_igmp_version=3",
                    "net.ipv4.conf.eth0.force_igmp_version=3",
                ],
            )?;
            // GRO on receive; UDP segmentation in software before the veth (as on a NIC
            // without USO), so that the wire carries real segments and a capture sees them.
            in_ns(
                ns,
                "ethtool",
                &["-K", "eth0", "gro", "on", "tx-udp-segmentation", "off"],
            )?;
            sh("ethtool", &["-K", v, "gro", "on"])?;
        }
        Ok(())
    }

    /// Namespace i's address (i = ranks: the hostile one).
    pub(crate) fn ip(&self, i: usize) -> Ipv4Addr {
        let i = u8::try_from(i + 1).unwrap_or(250);
        Ipv4Addr::new(SUBNET[0], SUBNET[1], SUBNET[2], i)
    }

    /// Ports of `bridge mdb show` per group.
    pub(crate) fn mdb(&self) -> HashMap<String, Vec<String>> {
        let mut m: HashMap<String, Vec<String>> = HashMap::new();
        let Ok(out) = sh("bridge", &["mdb", "show", "dev", &self.bridge]) else {
            return m;
        };
        // "dev rc..br port rc..v0 grp 239.1.2.3 temp ..."
        for line in out.lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            let get = |k: &str| w.iter().position(|x| *x == k).and_then(|i| w.get(i + 1));
            if let (Some(port), Some(grp)) = (get("port"), get("grp")) {
                m.entry((*grp).to_owned())
                    .or_default()
                    .push((*port).to_owned());
            }
        }
        m
    }

    /// Waits until some group in 239/8 other than `except` has every rank's port in the
    /// bridge's mdb; returns it.
    pub(crate) fn wait_joins(&self, except: &[&str], limit: Duration) -> Result<String, String> {
        let t = Instant::now();
        loop {
            let m = self.mdb();
            let full = m.iter().find(|(g, ports)| {
                g.starts_with("239.")
                    && !except.contains(&g.as_str())
                    && self.veths[..self.ns.len()]
                        .iter()
                        .all(|v| ports.contains(v))
            });
            if let Some((g, _)) = full {
                return Ok(g.clone());
            }
            if t.elapsed() > limit {
                return Err(format!(
                    "no group joined by all {} ranks within {:?}; bridge mdb: {m:?}",
                    self.ns.len(),
                    limit
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Joins `group` in every rank namespace (`ip addr ... autojoin`) and waits until the
    /// bridge lists every rank's port for it: snooping and IGMPv3 work.
    pub(crate) fn canary(&self, group: &str, limit: Duration) -> Result<Duration, String> {
        self.group_addr("add", group, &["autojoin"])?;
        self.wait_group(group, 0..self.ns.len(), limit)
            .map_err(|e| format!("canary {e}"))
    }

    /// Waits until the bridge's mdb lists the ports of ranks `ranks` for `group`; how long
    /// that took.
    pub(crate) fn wait_group(
        &self,
        group: &str,
        ranks: std::ops::Range<usize>,
        limit: Duration,
    ) -> Result<Duration, String> {
        let t = Instant::now();
        loop {
            let m = self.mdb();
            if m.get(group)
                .is_some_and(|p| self.veths[ranks.clone()].iter().all(|v| p.contains(v)))
            {
                return Ok(t.elapsed());
            }
            if t.elapsed() > limit {
                return Err(format!(
                    "group {group}: not every port of ranks {ranks:?} in the bridge mdb after \
                     {limit:?}: {m:?}"
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Removes the canary's `group` address from every rank namespace (Open MPI's TCP BTL
    /// would take it for a peer address of eth0).
    pub(crate) fn leave(&self, group: &str) -> Result<(), String> {
        self.group_addr("del", group, &[])
    }

    /// `ip addr <verb> <group>/32 dev eth0 <flags>` in every rank namespace.
    fn group_addr(&self, verb: &str, group: &str, flags: &[&str]) -> Result<(), String> {
        let addr = format!("{group}/32");
        for ns in &self.ns {
            let args: Vec<&str> = ["-n", ns, "addr", verb, addr.as_str(), "dev", "eth0"]
                .into_iter()
                .chain(flags.iter().copied())
                .collect();
            sh("ip", &args)?;
        }
        Ok(())
    }

    /// An nft table `rclab` in namespace `ns` with an input and an output chain holding
    /// `input` / `output` rules (replacing any previous one).
    pub(crate) fn nft(&self, ns: &str, input: &[String], output: &[String]) -> Result<(), String> {
        let mut s = String::from("table inet rclab\ndelete table inet rclab\ntable inet rclab {\n");
        s += "  chain input { type filter hook input priority 0; policy accept;\n";
        for r in input {
            s += &format!("    {r}\n");
        }
        s += "  }\n  chain output { type filter hook output priority 0; policy accept;\n";
        for r in output {
            s += &format!("    {r}\n");
        }
        s += "  }\n}\n";
        let f = self.dir.join(format!("nft-{ns}.conf"));
        std::fs::write(&f, s).map_err(|e| format!("{}: {e}", f.display()))?;
        in_ns(ns, "nft", &["-f", &f.to_string_lossy()]).map(|_| ())
    }

    /// The same input rule in every rank's namespace ([`nft`](Self::nft), no output rules).
    pub(crate) fn nft_input_all(&self, rule: &str) -> Result<(), String> {
        let input = [rule.to_owned()];
        self.ns.iter().try_for_each(|ns| self.nft(ns, &input, &[]))
    }

    /// Removes the `rclab` table of every rank's namespace.
    pub(crate) fn nft_clear_all(&self) -> Result<(), String> {
        self.ns.iter().try_for_each(|ns| self.nft_clear(ns))
    }

    /// Removes the `rclab` table of namespace `ns`.
    pub(crate) fn nft_clear(&self, ns: &str) -> Result<(), String> {
        in_ns(ns, "nft", &["delete", "table", "inet", "rclab"])
            .or_else(|e| {
                if e.contains("No such file") {
                    Ok(String::new())
                } else {
                    Err(e)
                }
            })
            .map(|_| ())
    }
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Closing the pipe is the watchdog's signal; then wait for it (bounded).
        self.watch_in = None;
        if let Some(mut w) = self.watchdog.take() {
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(60) {
                if let Ok(Some(_)) = w.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            eprintln!("netns: the lab's watchdog did not finish its cleanup within 60 s");
        }
    }
}

fn start_watchdog(
    dir: &Path,
    ns: &[String],
    bridge: &str,
    veths: &[String],
) -> Result<(Child, std::process::ChildStdin), String> {
    let ns_list = ns.join(" ");
    let veth_list = veths.join(" ");
    // `cat` returns when the pipe's last writer (this process) closes it, however it ends.
    let script = format!(
        "trap '' INT TERM HUP\n\
         cat >/dev/null\n\
         for ns in {ns_list}; do\n\
           pids=$(ip netns pids \"$ns\" 2>/dev/null)\n\
           [ -n \"$pids\" ] && kill -KILL $pids 2>/dev/null\n\
         done\n\
         sleep 0.2\n\
         for ns in {ns_list}; do ip netns del \"$ns\" 2>/dev/null; done\n\
         ip link del {bridge} 2>/dev/null\n\
         for v in {veth_list}; do ip link del \"$v\" 2>/dev/null; done\n\
         echo \"watchdog: removed {ns_list} {bridge} {veth_list}\"\n"
    );
    let log = File::create(dir.join("watchdog.log")).map_err(|e| format!("watchdog log: {e}"))?;
    let log2 = log.try_clone().map_err(|e| format!("watchdog log: {e}"))?;
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::piped())
        .stdout(log)
        .stderr(log2)
        .process_group(0)
        .spawn()
        .map_err(|e| format!("could not start the cleanup watchdog: {e}"))?;
    let stdin = child
        .stdin
        .take()
        .ok_or_else(|| "the watchdog has no stdin".to_owned())?;
    Ok((child, stdin))
}

/// Everything whose name carries `id` that is still there: namespaces, links (bridge, veths)
/// and host nft tables.
pub(crate) fn leftovers(id: &str) -> Vec<String> {
    let mut left = Vec::new();
    let mut scan = |what: &str, out: Result<String, String>| match out {
        Ok(s) => left.extend(
            s.lines()
                .filter(|l| l.contains(id))
                .map(|l| format!("{what}: {}", l.trim())),
        ),
        Err(e) => left.push(format!("{what}: could not list: {e}")),
    };
    scan("netns", sh("ip", &["netns", "list"]));
    scan("link", sh("ip", &["-o", "link", "show"]));
    scan("nft", sh("nft", &["list", "tables"]));
    left
}

/// The rank processes of one run, one per namespace, output to files.
pub(crate) struct Ranks {
    children: Vec<Option<Child>>,
    pub(crate) outs: Vec<PathBuf>,
    pub(crate) status: Vec<Option<ExitStatus>>,
    pub(crate) ended: Vec<Option<Instant>>,
}

/// What every rank gets in its environment, and the per-rank extras.
pub(crate) struct Launch<'a> {
    pub(crate) program: &'a Path,
    pub(crate) args: &'a [&'a str],
    pub(crate) env: &'a [(&'a str, String)],
    pub(crate) tag: &'a str,
}

impl Ranks {
    pub(crate) fn start(lab: &Lab, l: &Launch<'_>, port: u16) -> Result<Ranks, String> {
        let p = lab.ns.len();
        let mut r = Ranks {
            children: Vec::new(),
            outs: Vec::new(),
            status: vec![None; p],
            ended: vec![None; p],
        };
        for (i, ns) in lab.ns.iter().enumerate() {
            let out = lab.dir.join(format!("{}-rank{i}.out", l.tag));
            let err = lab.dir.join(format!("{}-rank{i}.err", l.tag));
            let f = |p: &Path| File::create(p).map_err(|e| format!("{}: {e}", p.display()));
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", ns])
                .arg(l.program)
                .args(l.args)
                .env("RINGCAST_RANK", i.to_string())
                .env("RINGCAST_WORLD_SIZE", p.to_string())
                .env("RINGCAST_BOOTSTRAP", format!("{}:{port}", lab.ip(0)))
                .env("RINGCAST_IFNAME", "eth0")
                .env("RINGCAST_BOOTSTRAP_TIMEOUT", "20")
                .env("RINGCAST_PEER_TIMEOUT", "3")
                .env("RUST_BACKTRACE", "1")
                .stdin(Stdio::null())
                .stdout(f(&out)?)
                .stderr(f(&err)?);
            for (k, v) in l.env {
                cmd.env(k, v);
            }
            let child = cmd
                .spawn()
                .map_err(|e| format!("could not start rank {i}: {e}"))?;
            r.children.push(Some(child));
            r.outs.push(out);
        }
        Ok(r)
    }

    /// The rank's stdout so far.
    pub(crate) fn out(&self, i: usize) -> String {
        std::fs::read_to_string(&self.outs[i]).unwrap_or_default()
    }

    /// Why rank `i` failed: its exit status, its output but the stats, its stderr's tail.
    pub(crate) fn failure(&self, i: usize) -> String {
        format!(
            "rank {i} ({:?}): {} {}",
            self.status[i],
            self.out(i)
                .lines()
                .filter(|l| !l.starts_with("STATS"))
                .collect::<Vec<_>>()
                .join(" | "),
            self.err_tail(i)
        )
    }

    /// The rank's stderr so far (last lines).
    pub(crate) fn err_tail(&self, i: usize) -> String {
        let p = self.outs[i].with_extension("err");
        let s = std::fs::read_to_string(p).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" | ")
    }

    /// The first stdout line of rank `i` starting with `prefix`, waiting up to `limit`.
    pub(crate) fn wait_line(&mut self, i: usize, prefix: &str, limit: Duration) -> Option<String> {
        let t = Instant::now();
        loop {
            if let Some(l) = self.out(i).lines().find(|l| l.starts_with(prefix)) {
                return Some(l.to_owned());
            }
            self.poll();
            if t.elapsed() > limit || self.status[i].is_some() {
                return self
                    .out(i)
                    .lines()
                    .find(|l| l.starts_with(prefix))
                    .map(str::to_owned);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn poll(&mut self) {
        for (i, c) in self.children.iter_mut().enumerate() {
            if let Some(ch) = c
                && let Ok(Some(s)) = ch.try_wait()
            {
                self.status[i] = Some(s);
                self.ended[i] = Some(Instant::now());
                *c = None;
            }
        }
    }

    /// Waits for every rank, killing the rest after `limit`; true if all ended in time.
    pub(crate) fn wait_all(&mut self, limit: Duration) -> bool {
        let t = Instant::now();
        loop {
            self.poll();
            if self.children.iter().all(Option::is_none) {
                return true;
            }
            if t.elapsed() > limit {
                self.kill_all();
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILLs rank `i` (`ip netns exec` execs the rank, so this is the rank itself).
    pub(crate) fn kill(&mut self, i: usize) {
        if let Some(c) = &mut self.children[i] {
            let _ = c.kill();
        }
    }

    /// Sends `signal` (`STOP`, `CONT`...) to rank `i`, if it still runs.
    pub(crate) fn signal(&mut self, i: usize, signal: &str) -> Result<(), String> {
        match &self.children[i] {
            Some(c) => sh("kill", &[&format!("-{signal}"), &c.id().to_string()]).map(|_| ()),
            None => Ok(()),
        }
    }

    fn kill_all(&mut self) {
        for c in self.children.iter_mut().flatten() {
            let _ = c.kill();
            let _ = c.wait();
        }
        self.poll();
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        self.kill_all();
    }
}

/// `key=value` pairs of a report line (`msg=` takes the rest of the line).
pub(crate) fn kv(line: &str) -> HashMap<String, String> {
    let mut m = HashMap::new();
    let (head, msg) = match line.find(" msg=") {
        Some(i) => (&line[..i], Some(&line[i + 5..])),
        None => (line, None),
    };
    for w in head.split_whitespace() {
        if let Some((k, v)) = w.split_once('=') {
            m.insert(k.to_owned(), v.to_owned());
        }
    }
    if let Some(msg) = msg {
        m.insert("msg".to_owned(), msg.to_owned());
    }
    m
}

/// A background process (tcpdump, ...) killed when dropped.
pub(crate) struct Bg(pub(crate) Child);

impl Bg {
    pub(crate) fn spawn(cmd: &mut Command, log: &Path) -> Result<Bg, String> {
        let f = File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let f2 = f.try_clone().map_err(|e| e.to_string())?;
        cmd.stdin(Stdio::null())
            .stdout(f)
            .stderr(f2)
            .spawn()
            .map(Bg)
            .map_err(|e| format!("could not start {cmd:?}: {e}"))
    }

    /// Asks it to stop (SIGINT, so tcpdump flushes) and waits up to 5 s.
    pub(crate) fn stop(mut self) {
        let _ = Command::new("sh")
            .args(["-c", &format!("kill -INT {} 2>/dev/null", self.0.id())])
            .status();
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}

/// Appends a line to the run's log.
pub(crate) fn log(dir: &Path, line: &str) {
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join("netns.log"))
    {
        let _ = writeln!(f, "{line}");
    }
}
