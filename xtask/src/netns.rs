//! `cargo xtask netns`: ringcast on a switched (bridged) fabric of network namespaces:
//! * correctness with several operations in flight, and a seeded random mix of every kind
//!   and size (small ones over TCP) under loss;
//! * sub-communicators (`split`, `split_by_host`) on their own groups;
//! * random loss, and hostile traffic;
//! * killed ranks (mid-run, during their start-up, and while the ranks split), a rank deaf to multicast for a while
//!   (it reads what it missed over TCP), a rank stopped for half a peer timeout (nobody is
//!   blamed) or longer (it is named);
//! * a bridge port whose MTU is below the hosts' (found by the start-up check);
//! * a rank whose egress stops (a tbf qdisc that holds every packet: all of it, or only the
//!   data port, as PFC pauses a class) or whose cable is pulled;
//! * control connections dropped or reset, and multicast that cannot arrive (and the TCP
//!   fallback);
//! * wire checks with tshark and scapy, on the veths and on a namespace's loopback (its own
//!   chunk size);
//! * Open MPI's mpirun locally and across the namespaces.
//!
//! See `netns_lab` for the lab and how it is always removed.

use crate::netns_lab::{
    Bg, Lab, Launch, Querier, Ranks, in_ns, in_ns_limit, kv, leftovers, log, sh,
};
use crate::run::{Step, StepError};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const USAGE: &str = "netns [--ranks N] [--long] [--only NAME,...] [--repeat N]";

/// The data port every lab job uses (RoCEv2's).
const DATA_PORT: u16 = 4791;

/// The lab veths' MTU (`netns_lab`).
const LAB_MTU: u32 = 9000;

struct Opts {
    ranks: usize,
    long: bool,
    only: Vec<String>,
    /// Runs each chosen check this many times in the one lab (hunting a rare failure).
    repeat: u32,
    lab_only: Option<u64>,
}

fn parse(args: &[String]) -> Result<Opts, StepError> {
    let mut o = Opts {
        ranks: 4,
        long: false,
        only: Vec::new(),
        repeat: 1,
        lab_only: None,
    };
    let mut it = args.iter();
    let bad = |m: String| StepError::Other(format!("{m}\n\nusage: cargo xtask {USAGE}"));
    while let Some(a) = it.next() {
        match a.as_str() {
            "--ranks" => {
                o.ranks = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|n| (2..=8).contains(n))
                    .ok_or_else(|| bad("`--ranks` wants 2 to 8".to_owned()))?;
            }
            "--long" => o.long = true,
            "--only" => {
                o.only = it
                    .next()
                    .ok_or_else(|| bad("`--only` wants names".to_owned()))?
                    .split(',')
                    .map(str::to_owned)
                    .collect();
            }
            "--repeat" => {
                o.repeat = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|&n| n >= 1)
                    .ok_or_else(|| bad("`--repeat` wants a count of 1 or more".to_owned()))?;
            }
            // Internal: build a lab, say so, wait (the Ctrl-C self-test's child).
            "--lab-only" => {
                o.lab_only = Some(
                    it.next()
                        .and_then(|v| v.parse().ok())
                        .ok_or_else(|| bad("`--lab-only` wants seconds".to_owned()))?,
                );
            }
            other => return Err(bad(format!("unknown option `{other}`"))),
        }
    }
    Ok(o)
}

/// Everything a check needs.
struct Ctx<'a> {
    lab: &'a Lab,
    root: &'a Path,
    rank_bin: PathBuf,
    cli_bin: Result<PathBuf, String>,
    long: bool,
    next_port: std::cell::Cell<u16>,
    /// With `--repeat`, the run number, so that each run's rank outputs are kept apart.
    run: std::cell::Cell<u32>,
}

impl Ctx<'_> {
    fn port(&self) -> u16 {
        let p = self.next_port.get();
        self.next_port.set(p + 1);
        p
    }

    fn p(&self) -> usize {
        self.lab.ns.len()
    }

    fn start(&self, tag: &str, args: &[&str], env: &[(&str, String)]) -> Result<Ranks, String> {
        let tag = match self.run.get() {
            0 => tag.to_owned(),
            k => format!("{tag}.{k}"),
        };
        let l = Launch {
            program: &self.rank_bin,
            args,
            env,
            tag: &tag,
        };
        Ranks::start(self.lab, &l, self.port())
    }
}

pub(crate) fn run(root: &Path, args: &[String]) -> Result<(), StepError> {
    let o = parse(args)?;
    if let Err(why) = can_create_namespaces() {
        eprintln!(
            "netns: SKIPPED -- this machine does not let us create network namespaces ({why}).\n\
             netns: nothing was tested; run as root (or with CAP_SYS_ADMIN and CAP_NET_ADMIN)."
        );
        return Ok(());
    }
    require_tools(
        "netns",
        &["nft", "tshark", "tcpdump", "ethtool", "bridge", "timeout"],
        "iproute2 nftables ethtool tshark tcpdump python3-scapy openmpi-bin",
    )?;
    let out = root.join("target").join("netns");
    if let Some(secs) = o.lab_only {
        return lab_only(&out, o.ranks, secs);
    }
    let cargo = crate::cargo();
    Step::new(
        root,
        &cargo,
        &["build", "-p", "ringcast", "--example", "lab_rank"],
        crate::minutes(20),
    )
    .run()?;
    // XTASK_NETNS_RINGCAST=path: use that `ringcast` binary for the mpirun checks instead of
    // building one (e.g. a release build).
    let cli_bin = match std::env::var_os("XTASK_NETNS_RINGCAST") {
        Some(p) => Ok(PathBuf::from(p)),
        None => build_cli(root, &cargo),
    };

    let started = Instant::now();
    let mut results: Vec<(String, Duration, Result<String, String>)> = Vec::new();
    let wanted = |n: &str| o.only.is_empty() || o.only.iter().any(|w| n.starts_with(w.as_str()));
    let id;
    {
        let t = Instant::now();
        let lab = Lab::new(o.ranks, &out, Querier::On).map_err(StepError::Other)?;
        id = lab.id.clone();
        eprintln!(
            "netns: lab {} ({} ranks, bridge {}, output in {})",
            lab.id,
            o.ranks,
            lab.bridge,
            lab.dir.display()
        );
        let canary = lab.canary("239.77.77.1", Duration::from_secs(15));
        results.push((
            "lab: IGMPv3 joins of every rank in the bridge mdb".to_owned(),
            t.elapsed(),
            canary.map(|d| format!("canary group learned on all ports in {d:.1?}")),
        ));
        let ctx = Ctx {
            lab: &lab,
            root,
            rank_bin: root.join("target/debug/examples/lab_rank"),
            cli_bin,
            long: o.long,
            next_port: std::cell::Cell::new(29_400),
            run: std::cell::Cell::new(0),
        };
        type Check = fn(&Ctx<'_>) -> Result<String, String>;
        let checks: &[(&str, Check)] = &[
            ("correctness+wire", correctness),
            ("loopback-wire", loopback_wire),
            ("no-offload", no_offload),
            ("small-tcp", small_tcp),
            ("random-mix", random_mix),
            ("run-ahead", run_ahead),
            ("late", late),
            ("mismatch", mismatch),
            ("split", split),
            ("loss", loss),
            ("lanes", lanes),
            ("hostile", hostile),
            ("kill", kill),
            ("pause", pause),
            ("mtu", mtu),
            ("deaf", deaf),
            ("cut", cut),
            ("stopped", stopped),
            ("kill-start", kill_start),
            ("kill-split", kill_split),
            ("tcp-block", tcp_block),
            ("unreachable", unreachable),
            ("no-querier", no_querier),
            ("mpirun-local", mpirun_local),
            ("mpirun-netns", mpirun_netns),
        ];
        for (name, f) in checks {
            if !wanted(name) {
                continue;
            }
            for k in 1..=o.repeat {
                let name = if o.repeat > 1 {
                    ctx.run.set(k);
                    format!("{name} #{k}")
                } else {
                    (*name).to_owned()
                };
                eprintln!("netns: {name} ...");
                let t = Instant::now();
                let r = f(&ctx);
                let d = t.elapsed();
                match &r {
                    Ok(m) => eprintln!("netns: {name}: ok ({:.1}s): {m}", d.as_secs_f64()),
                    Err(m) => eprintln!("netns: {name}: FAILED ({:.1}s): {m}", d.as_secs_f64()),
                }
                log(&lab.dir, &format!("{name}: {r:?}"));
                results.push((name, d, r));
            }
        }
        // The lab is dropped here: the watchdog removes it.
    }
    let left = leftovers(&id);
    results.push((
        "cleanup: nothing of the lab left".to_owned(),
        Duration::ZERO,
        if left.is_empty() {
            Ok(format!("no namespace, link or nft table named {id}*"))
        } else {
            Err(format!("left behind: {left:?}"))
        },
    ));
    if wanted("interrupt") {
        let t = Instant::now();
        let r = interrupt_selftest(&out);
        results.push(("cleanup on Ctrl-C (SIGINT)".to_owned(), t.elapsed(), r));
    }
    eprintln!("\nnetns summary ({:.0}s):", started.elapsed().as_secs_f64());
    let mut failed = 0;
    for (name, d, r) in &results {
        let (word, msg) = match r {
            Ok(m) => ("ok    ", m),
            Err(m) => {
                failed += 1;
                ("FAILED", m)
            }
        };
        eprintln!("  {word} {:>6.1}s  {name}: {msg}", d.as_secs_f64());
    }
    if failed > 0 {
        Err(StepError::Other(format!("netns: {failed} check(s) failed")))
    } else {
        Ok(())
    }
}

fn build_cli(root: &Path, cargo: &str) -> Result<PathBuf, String> {
    Step::new(
        root,
        cargo,
        &[
            "build",
            "-p",
            "ringcast",
            "--features",
            "cli",
            "--bin",
            "ringcast",
        ],
        crate::minutes(20),
    )
    .run()
    .map(|()| root.join("target/debug/ringcast"))
    .map_err(|e| e.to_string())
}

/// `Err` naming the programs of `tools` that are not on `PATH`, and the Debian packages
/// (`install`) that bring them, for `what` (the xtask command).
pub(crate) fn require_tools(what: &str, tools: &[&str], install: &str) -> Result<(), StepError> {
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|t| sh("sh", &["-c", &format!("command -v {t}")]).is_err())
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(StepError::Other(format!(
        "{what} needs {} (apt-get install {install})",
        missing.join(", ")
    )))
}

/// `ip netns add` of a throwaway name, then its removal.
pub(crate) fn can_create_namespaces() -> Result<(), String> {
    let name = format!("rcprobe{}", std::process::id());
    sh("ip", &["netns", "add", &name])?;
    sh("ip", &["netns", "del", &name]).map(|_| ())
}

fn lab_only(out: &Path, ranks: usize, secs: u64) -> Result<(), StepError> {
    let lab = Lab::new(ranks, out, Querier::On).map_err(StepError::Other)?;
    println!("LAB {} ready", lab.id);
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// Starts `xtask netns --lab-only`, SIGINTs it once its lab is up, and checks that nothing of
/// the lab remains.
fn interrupt_selftest(out: &Path) -> Result<String, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    std::fs::create_dir_all(out).map_err(|e| e.to_string())?;
    let file = out.join("interrupt-child.out");
    let f = std::fs::File::create(&file).map_err(|e| e.to_string())?;
    let mut child = Bg(Command::new(exe)
        .args(["netns", "--lab-only", "120", "--ranks", "2"])
        .stdin(Stdio::null())
        .stdout(f)
        .spawn()
        .map_err(|e| e.to_string())?);
    let t = Instant::now();
    let id = loop {
        let s = std::fs::read_to_string(&file).unwrap_or_default();
        if let Some(id) = s.lines().find_map(|l| l.strip_prefix("LAB ")) {
            break id.split_whitespace().next().unwrap_or("").to_owned();
        }
        if t.elapsed() > Duration::from_secs(60) || matches!(child.0.try_wait(), Ok(Some(_))) {
            return Err("the child lab did not come up".to_owned());
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let before = leftovers(&id).len();
    if before == 0 {
        return Err(format!("lab {id} reported ready but none of it is visible"));
    }
    // A process started from a non-interactive shell's `&` inherits SIGINT ignored (so does
    // the child): then Ctrl-C cannot reach it anyway, and SIGTERM stands in.
    let sig = if sigint_ignored() { "TERM" } else { "INT" };
    sh("sh", &["-c", &format!("kill -{sig} {}", child.0.id())])?;
    let t = Instant::now();
    let status = loop {
        if let Ok(Some(s)) = child.0.try_wait() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(10) {
            return Err(format!("the child did not exit on SIG{sig}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    loop {
        let left = leftovers(&id);
        if left.is_empty() {
            return Ok(format!(
                "lab {id} ({before} objects) sent SIG{sig} ({status}); all removed {:.1?} later",
                t.elapsed()
            ));
        }
        if t.elapsed() > Duration::from_secs(30) {
            return Err(format!("after SIG{sig}, left behind: {left:?}"));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether this process ignores SIGINT (`SigIgn` in `/proc/self/status`, bit 1).
fn sigint_ignored() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("SigIgn:"))
                .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        })
        .is_some_and(|m| m & 2 != 0)
}

/// STATS lines of a rank's output, by their `when=`.
fn stats(out: &str) -> HashMap<String, HashMap<String, String>> {
    out.lines()
        .filter(|l| l.starts_with("STATS "))
        .map(|l| {
            let m = kv(l);
            (m.get("when").cloned().unwrap_or_default(), m)
        })
        .collect()
}

fn num(m: &HashMap<String, String>, k: &str) -> u64 {
    m.get(k).and_then(|v| v.parse().ok()).unwrap_or(0)
}

/// Every rank exited 0 and printed `CHECKED`; `Err` with the first rank's story otherwise.
/// The fields of a rank's `CHECKED` line (none if it printed none).
fn checked(out: &str) -> HashMap<String, String> {
    kv(out.lines().find(|l| l.starts_with("CHECKED")).unwrap_or(""))
}

/// Chunks fetched over TCP, summed over the ranks' `STATS when=after` lines.
fn fetched_after(outs: &[String]) -> u64 {
    outs.iter()
        .filter_map(|o| stats(o).get("after").map(|m| num(m, "fetched")))
        .sum()
}

fn all_checked(r: &Ranks, p: usize) -> Result<Vec<String>, String> {
    (0..p)
        .map(|i| {
            let out = r.out(i);
            let ok = r.status[i].is_some_and(|s| s.success());
            match out.lines().find(|l| l.starts_with("CHECKED")) {
                Some(_) if ok => Ok(out),
                _ => Err(r.failure(i)),
            }
        })
        .collect()
}

/// A capture of at most `count` packets matching `filter` on rank 0's veth (the host side).
fn tcpdump(ctx: &Ctx<'_>, name: &str, filter: &str, count: u32) -> Result<(Bg, PathBuf), String> {
    tcpdump_on(ctx, None, &ctx.lab.veths[0], name, filter, count)
}

/// A capture on interface `iface`, in namespace `ns` (the host's where `None`).
fn tcpdump_on(
    ctx: &Ctx<'_>,
    ns: Option<&str>,
    iface: &str,
    name: &str,
    filter: &str,
    count: u32,
) -> Result<(Bg, PathBuf), String> {
    let pcap = ctx.lab.dir.join(format!("{name}.pcap"));
    let mut cmd = match ns {
        // `ip netns exec` execs tcpdump: stopping the child stops the capture.
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns, "tcpdump"]);
            c
        }
        None => Command::new("tcpdump"),
    };
    // A 64 MiB capture buffer: loopback's datagrams are 32 KiB each.
    cmd.args(["-i", iface, "-B", "65536", "-s", "0", "-U", "-n", "-c"])
        .arg(count.to_string())
        .arg("-w")
        .arg(&pcap)
        .arg(filter);
    let bg = Bg::spawn(&mut cmd, &ctx.lab.dir.join(format!("{name}.tcpdump.log")))?;
    // tcpdump says "listening on" once it captures.
    let t = Instant::now();
    let log = ctx.lab.dir.join(format!("{name}.tcpdump.log"));
    while !std::fs::read_to_string(&log)
        .unwrap_or_default()
        .contains("listening on")
    {
        if t.elapsed() > Duration::from_secs(10) {
            return Err("tcpdump did not start".to_owned());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok((bg, pcap))
}

/// Broadcast, Allgather, Allgatherv (zero-sized blocks), 6 in flight, 1 MiB, byte for byte,
/// captured on rank 0's sending side and checked with tshark and scapy.
fn correctness(ctx: &Ctx<'_>) -> Result<String, String> {
    let filter = format!("udp dst port {DATA_PORT} and src host {}", ctx.lab.ip(0));
    let (cap, pcap) = tcpdump(ctx, "wire", &filter, 200_000)?;
    let rounds = if ctx.long { "10" } else { "3" };
    let mut r = ctx.start(
        "check",
        &[
            "check",
            "--rounds",
            rounds,
            "--inflight",
            "6",
            "--size",
            "1048576",
        ],
        &[],
    )?;
    let joined = ctx
        .lab
        .wait_joins(&["239.77.77.1"], Duration::from_secs(20));
    let done = r.wait_all(Duration::from_secs(180));
    std::thread::sleep(Duration::from_millis(300));
    cap.stop();
    let outs = all_checked(&r, ctx.p())?;
    if !done {
        return Err("ranks ran past 180 s".to_owned());
    }
    let group = joined?;
    let ops = checked(&outs[0]);
    let w = wire_checks(ctx.root, &pcap, DATA_PORT, 1, LAB_MTU)?;
    let wire = format!(
        "wire: {} datagrams sent by rank 0 captured on its veth, {}",
        w.datagrams,
        w.decoded()
    );
    // The datagrams just checked on the wire were gathered from the operations' buffers.
    let (sent, in_place) = sent_in_place(&outs);
    if sent == 0 || in_place != sent {
        return Err(format!(
            "{in_place} of {sent} datagrams sent in place; with GSO on the veths, all should be"
        ));
    }
    Ok(format!(
        "{} ops per rank (bcast/allgather/allgatherv, 6 in flight, 1 MiB) byte for byte on \
         {} ranks in {} ms, all {sent} datagrams sent from the buffers in place; group {group} \
         joined on every port; {wire}",
        ops.get("ops").map_or("?", String::as_str),
        ctx.p(),
        ops.get("ms").map_or("?", String::as_str),
    ))
}

/// RoCEv2 headers and trailer a datagram carries beside its chunk: BTH, DETH, ImmDt, ICRC.
const ROCE_OVERHEAD: usize = 12 + 8 + 4 + 4;

/// Loopback's own datagrams: `ringcast bench --local 4` (a Broadcast and an Allgather of 1
/// MiB) in the first namespace, on its `lo`, whose UDP segmentation is turned off there so
/// that a capture sees every datagram as the receivers do. Every datagram decodes in tshark,
/// scapy recomputes every ICRC, and the longest carry the chunk the ranks report: loopback's
/// default, larger than the 4 KiB used between hosts.
fn loopback_wire(ctx: &Ctx<'_>) -> Result<String, String> {
    let bin = ctx.cli_bin.clone()?;
    let bin = bin.to_string_lossy();
    let ns = ctx.lab.ns[0].as_str();
    in_ns(ns, "ethtool", &["-K", "lo", "tx-udp-segmentation", "off"])?;
    let captured = (|| {
        let (cap, pcap) = tcpdump_on(ctx, Some(ns), "lo", "loopback-wire", "udp", 20_000)?;
        let mut chunks = Vec::new();
        let mut ran = Vec::new();
        for coll in ["bcast", "allgather"] {
            // On an error the capture stops as it drops.
            let out = in_ns_limit(
                120,
                ns,
                &bin,
                &[
                    "bench", coll, "--local", "4", "--sizes", "1MiB", "--iters", "2", "--warmup",
                    "1", "--json",
                ],
            )
            .map_err(|e| format!("ringcast bench {coll} --local 4: {e}"))?;
            ran.push(bench_ok(&out, coll)?);
            chunks.push(
                out.lines()
                    .find_map(|l| l.trim().strip_prefix("\"chunk_size\": "))
                    .and_then(|v| v.trim_end_matches(',').parse::<usize>().ok())
                    .ok_or_else(|| format!("ringcast bench {coll}: no chunk_size in {out}"))?,
            );
        }
        std::thread::sleep(Duration::from_millis(300));
        cap.stop();
        Ok::<_, String>((pcap, chunks, ran))
    })();
    // Back as it was, whatever happened.
    let restored = in_ns(ns, "ethtool", &["-K", "lo", "tx-udp-segmentation", "on"]);
    let (pcap, chunks, ran) = captured?;
    restored?;
    let chunk = chunks[0];
    if chunks.iter().any(|&c| c != chunk) || chunk <= 4096 {
        return Err(format!(
            "chunk sizes {chunks:?}: loopback's default should be one size above 4 KiB"
        ));
    }
    // Each local run's data port is a free one: the ports that carried full chunks.
    let lens = tshark_fields(&pcap, None, "udp", &["udp.dstport", "udp.length"])?;
    let mut ports: Vec<u16> = lens
        .lines()
        .filter_map(|l| {
            let mut w = l.split(',');
            let port = w.next()?.trim().parse::<u16>().ok()?;
            let len = w.next()?.trim().parse::<usize>().ok()?;
            (len > 4096 + ROCE_OVERHEAD + 8).then_some(port)
        })
        .collect();
    ports.sort_unstable();
    ports.dedup();
    // One port per run, or fewer where two runs drew the same free one.
    if ports.is_empty() || ports.len() > chunks.len() {
        return Err(format!(
            "full chunks went to ports {ports:?}: one port per run of {} expected",
            chunks.len()
        ));
    }
    let mut found = Vec::new();
    for &port in &ports {
        let w = wire_checks(ctx.root, &pcap, port, 4, 65_536)?;
        if w.longest != chunk + ROCE_OVERHEAD {
            return Err(format!(
                "port {port}: the longest datagram carried {} B, not a {chunk} B chunk and \
                 its {ROCE_OVERHEAD} B of RoCEv2 headers",
                w.longest
            ));
        }
        found.push(format!(
            "port {port}: {} datagrams, {}",
            w.datagrams,
            w.decoded()
        ));
    }
    Ok(format!(
        "bench bcast and allgather --local 4 ({}), {chunk} B chunks, captured on lo, the \
         longest datagrams {} B; {}",
        ran.join("; "),
        chunk + ROCE_OVERHEAD,
        found.join("; ")
    ))
}

/// Several lanes (three: each block split unevenly over three groups, a send and a receive
/// worker per lane) under 1 % loss at every receiver: every rank runs on them, every byte is
/// right, and the loss is recovered. The other checks run on the lane count the ranks pick
/// (one on a 2-core host).
fn lanes(ctx: &Ctx<'_>) -> Result<String, String> {
    ctx.lab.nft_input_all(&drop_data(1))?;
    let ran = ctx
        .start("lanes", SHORT_CHECK, &[("RINGCAST_LANES", "3".to_owned())])
        .map(|mut r| {
            let done = r.wait_all(Duration::from_secs(180));
            (r, done)
        });
    ctx.lab.nft_clear_all()?;
    let (r, done) = ran?;
    let outs = all_checked(&r, ctx.p())?;
    if !done {
        return Err("ranks ran past 180 s".to_owned());
    }
    let checked: Vec<HashMap<String, String>> = outs.iter().map(|o| checked(o)).collect();
    if let Some(c) = checked.iter().find(|c| num(c, "lanes") != 3) {
        return Err(format!("a rank ran on {:?} lanes, not 3", c.get("lanes")));
    }
    let fetched = fetched_after(&outs);
    if fetched == 0 {
        return Err("no chunk fetched at 1 % loss: the loss did not bite".to_owned());
    }
    Ok(format!(
        "{} ops per rank byte for byte on 3 lanes on every rank at 1 % loss, {fetched} chunks \
         recovered",
        checked[0].get("ops").map_or("?", String::as_str)
    ))
}

/// The nft input rule that drops `pct` % of the data datagrams at random.
fn drop_data(pct: u32) -> String {
    format!("udp dport {DATA_PORT} numgen random mod 100 < {pct} counter drop")
}

/// Every rank's `STATS when=after` line.
struct After(Vec<HashMap<String, String>>);

impl After {
    /// `k` summed over the ranks.
    fn sum(&self, k: &str) -> u64 {
        self.0.iter().map(|m| num(m, k)).sum()
    }
}

/// Every rank's `STATS when=after` line, and what went over TCP (bytes sent) and over
/// multicast (datagrams sent) summed over them; an error unless every rank reported and both
/// paths carried operations.
fn both_paths(ctx: &Ctx<'_>, outs: &[String]) -> Result<(After, u64, u64), String> {
    let after = After(
        outs.iter()
            .filter_map(|o| stats(o).remove("after"))
            .collect(),
    );
    let (tcp, datagrams) = (after.sum("tcp_sent"), after.sum("sent"));
    if after.0.len() != ctx.p() || tcp == 0 || datagrams == 0 {
        return Err(format!(
            "{} STATS lines, {tcp} bytes over TCP, {datagrams} datagrams: both paths should \
             carry operations",
            after.0.len()
        ));
    }
    Ok((after, tcp, datagrams))
}

/// Small operations over TCP beside multicast, on the bridge: with the TCP threshold one byte
/// below the 64 KiB size, the Broadcasts and Allgathers (64 KiB in all) multicast while the
/// Allgathervs (zero-sized blocks, less in all) run over TCP trees, 6 in flight at once, with
/// 1 % of the data datagrams dropped at every rank; byte for byte, both paths used, the
/// communicator still in multicast mode.
fn small_tcp(ctx: &Ctx<'_>) -> Result<String, String> {
    ctx.lab.nft_input_all(&drop_data(1))?;
    let mut r = ctx.start(
        "small",
        &[
            "check",
            "--rounds",
            "4",
            "--inflight",
            "6",
            "--size",
            "65536",
        ],
        &[("RINGCAST_TCP_THRESHOLD", "65535".to_owned())],
    )?;
    let done = r.wait_all(Duration::from_secs(120));
    ctx.lab.nft_clear_all()?;
    let outs = all_checked(&r, ctx.p())?;
    if !done {
        return Err("ranks ran past 120 s".to_owned());
    }
    let (after, tcp, datagrams) = both_paths(ctx, &outs)?;
    if let Some(m) = after
        .0
        .iter()
        .find(|m| m.get("mode").map(String::as_str) != Some("multicast"))
    {
        return Err(format!("small operations switched a rank to TCP: {m:?}"));
    }
    let ops = checked(&outs[0]);
    Ok(format!(
        "{} ops per rank byte for byte at 1 % loss: Allgathervs over TCP trees ({tcp} B \
         sent), Broadcasts and Allgathers over multicast ({datagrams} datagrams), still in \
         multicast mode",
        ops.get("ops").map_or("?", String::as_str),
    ))
}

/// The tests' seeded random mix across the namespaces (`lab_rank mix`): Broadcasts from any
/// root, Allgathers and Allgathervs (zero-sized blocks), 0 B to 1 MiB, the small ones over TCP
/// and the rest over multicast, a few in flight at once or blocking, with 1 % of the data
/// datagrams dropped at every rank; byte for byte. 200 operations (2 000 with `--long`).
fn random_mix(ctx: &Ctx<'_>) -> Result<String, String> {
    ctx.lab.nft_input_all(&drop_data(1))?;
    let ops = if ctx.long { "2000" } else { "200" };
    // Any seed, the same on every rank: printed, so that a failure can be replayed.
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
        .to_string();
    let mut r = ctx.start(
        "mix",
        &["mix", "--ops", ops, "--seed", &seed],
        &[("RINGCAST_TCP_THRESHOLD", "65536".to_owned())],
    )?;
    let done = r.wait_all(Duration::from_secs(180));
    ctx.lab.nft_clear_all()?;
    let outs = all_checked(&r, ctx.p()).map_err(|e| format!("seed {seed}: {e}"))?;
    if !done {
        return Err(format!("seed {seed}: ranks ran past 180 s"));
    }
    let (after, tcp, datagrams) =
        both_paths(ctx, &outs).map_err(|e| format!("seed {seed}: {e}"))?;
    let fetched = after.sum("fetched");
    let ms = checked(&outs[0]).remove("ms").unwrap_or_default();
    Ok(format!(
        "{ops} random operations per rank byte for byte at 1 % loss in {ms} ms (seed {seed}): \
         {datagrams} datagrams multicast, {tcp} B over TCP, {fetched} chunks fetched"
    ))
}

/// A root that runs ahead (`lab_rank flood`): rank 0 broadcasts 5 000 buffers of 32 KiB back
/// to back (blocking, no barrier; over TCP trees) while the others start 2 s late. Every
/// buffer byte for byte, and no rank's peak resident memory above 64 MiB: a root sends a rank
/// pieces of at most a window of operations it has not posted (8 MiB of them), where it once
/// left one of every operation (160 MiB here).
fn run_ahead(ctx: &Ctx<'_>) -> Result<String, String> {
    const PEAK_KB: u64 = 64 << 10;
    let mut r = ctx.start(
        "flood",
        &[
            "flood",
            "--ops",
            "5000",
            "--size",
            "32768",
            "--late-secs",
            "2",
        ],
        &[("RINGCAST_TCP_THRESHOLD", "65536".to_owned())],
    )?;
    let done = r.wait_all(Duration::from_secs(120));
    let outs = all_checked(&r, ctx.p())?;
    if !done {
        return Err("ranks ran past 120 s".to_owned());
    }
    let mut peaks = Vec::new();
    for (i, out) in outs.iter().enumerate() {
        let m = kv(out.lines().find(|l| l.starts_with("FLOOD")).unwrap_or(""));
        let peak = m
            .get("peak_kb")
            .and_then(|p| p.parse::<u64>().ok())
            .ok_or_else(|| format!("rank {i}: no peak memory: {out}"))?;
        if peak > PEAK_KB {
            return Err(format!(
                "rank {i} peaked at {peak} kB, above {PEAK_KB} kB: it kept what it had not \
                 posted"
            ));
        }
        peaks.push(format!("{} MB", peak / 1024));
    }
    Ok(format!(
        "5000 Broadcasts of 32 KiB from a root running ahead, the others 2 s late, byte for \
         byte; peak resident memory per rank {}",
        peaks.join(" / ")
    ))
}

/// A rank that posts far past the peer timeout (a checkpoint load before the call) across
/// the namespaces: with a 2 s peer timeout, the last rank posts an Allgather 8 s after the
/// others. They ask it where it stands, it answers that it has not posted, and they wait:
/// every rank completes byte for byte. (Before the barrier asked, the others failed it at
/// the peer timeout, blaming the late rank as hung.)
fn late(ctx: &Ctx<'_>) -> Result<String, String> {
    let mut r = ctx.start(
        "late",
        &["hold", "--size", "1048576", "--hold-secs", "8"],
        &[("RINGCAST_PEER_TIMEOUT", "2".to_owned())],
    )?;
    let done = r.wait_all(Duration::from_secs(60));
    all_checked_hold(&r, ctx.p())?;
    if !done {
        return Err("ranks ran past 60 s".to_owned());
    }
    Ok(format!(
        "an Allgather that rank {} posted 8 s late (4 peer timeouts): waited for, byte for \
         byte on every rank",
        ctx.p() - 1
    ))
}

/// An erroneous program across the namespaces: Broadcasts that the last rank posts with
/// twice the length, then naming another root. With a one-minute peer timeout, every rank
/// must fail both with `ShapeMismatch` naming the last rank (reported by the hub, rank 0, and
/// by rank 1, which its `Ready` reached), and the verified round after them must pass.
fn mismatch(ctx: &Ctx<'_>) -> Result<String, String> {
    let mut r = ctx.start(
        "mismatch",
        &["mismatch", "--size", "1048576"],
        &[("RINGCAST_PEER_TIMEOUT", "60".to_owned())],
    )?;
    let done = r.wait_all(Duration::from_secs(50));
    let outs = all_checked(&r, ctx.p())?;
    if !done {
        return Err("ranks ran past 50 s".to_owned());
    }
    let last = (ctx.p() - 1).to_string();
    let mut slowest = 0;
    for (i, out) in outs.iter().enumerate() {
        for (case, by) in [("length", "0"), ("root", "1")] {
            let m = out
                .lines()
                .filter(|l| l.starts_with("MISMATCH"))
                .map(kv)
                .find(|m| m.get("case").map(String::as_str) == Some(case))
                .ok_or_else(|| format!("rank {i}: no {case} mismatch: {out}"))?;
            if m.get("peer") != Some(&last) || m.get("by").map(String::as_str) != Some(by) {
                return Err(format!(
                    "rank {i}, {case}: {m:?}, not rank {last} reported by rank {by}"
                ));
            }
            slowest = slowest.max(num(&m, "ms"));
        }
    }
    Ok(format!(
        "a length and a root the last rank disagreed on failed on all {} ranks with \
         ShapeMismatch naming it, the slowest after {slowest} ms (peer timeout 60 s); the \
         verified round after them passed",
        ctx.p()
    ))
}

/// Sub-communicators across the bridge (`lab_rank split`): halves by parity, each with its
/// own groups (joined through the snooping bridge, checked by its own start-up check), run a
/// Broadcast and an Allgather of 1 MiB per rank while the whole runs an Allgather; then
/// `split_by_host` puts every namespace's rank in one part (one kernel) for a Broadcast.
/// Every buffer byte for byte, and every part over multicast.
fn split(ctx: &Ctx<'_>) -> Result<String, String> {
    let mut r = ctx.start("split", &["split", "--size", "1048576"], &[])?;
    let done = r.wait_all(Duration::from_secs(60));
    let outs = all_checked(&r, ctx.p())?;
    if !done {
        return Err("ranks ran past 60 s".to_owned());
    }
    let p = ctx.p();
    for (i, out) in outs.iter().enumerate() {
        let m = out
            .lines()
            .find(|l| l.starts_with("SPLIT"))
            .map(kv)
            .ok_or_else(|| format!("rank {i}: no SPLIT line: {out}"))?;
        let half_size = (p + 1 - i % 2) / 2;
        let want = [
            ("half", format!("{}/{half_size}", i / 2)),
            ("host", format!("{i}/{p}")),
            // Namespaces have their own addresses: a copy must know the kernel id too.
            ("copy_host", format!("{i}/{p}")),
            ("half_mode", "multicast".to_owned()),
        ];
        for (k, v) in want {
            if m.get(k) != Some(&v) {
                return Err(format!("rank {i}: {k} {:?}, want {v}: {out}", m.get(k)));
            }
        }
    }
    Ok(format!(
        "halves by parity ({} and {} ranks, their own groups through the snooping bridge) \
         ran a Broadcast and an Allgather of 1 MiB while the whole ran an Allgather, and the \
         host's part (all {p}: one kernel) a Broadcast, byte for byte",
        p.div_ceil(2),
        p / 2
    ))
}

/// `lab_rank` arguments of a short verified run: 2 rounds of Broadcast, Allgather and
/// Allgatherv, 4 in flight, 1 MiB.
const SHORT_CHECK: &[&str] = &[
    "check",
    "--rounds",
    "2",
    "--inflight",
    "4",
    "--size",
    "1048576",
];

/// Datagrams the ranks sent, and how many of them were gathered from the buffers in place
/// (summed over the ranks' final `STATS`).
fn sent_in_place(outs: &[String]) -> (u64, u64) {
    outs.iter()
        .filter_map(|o| {
            stats(o)
                .get("after")
                .map(|m| (num(m, "sent"), num(m, "sent_in_place")))
        })
        .fold((0, 0), |(a, b), (s, i)| (a + s, b + i))
}

/// A device without transmit checksum offload (`ethtool -K eth0 tx off` on every rank's
/// veth, which also turns its segmentation offloads off): GSO batches gathered from the
/// buffers must still leave whole. This kernel segments and checksums them in software; a
/// kernel that refuses (`EIO`) makes the sender lay its batches out instead (the transport's
/// unit test `a_refused_gathered_gso_send_is_resent_laid_out_and_arrives_whole`).
fn no_offload(ctx: &Ctx<'_>) -> Result<String, String> {
    let set = |on: &str| -> Result<(), String> {
        for ns in &ctx.lab.ns {
            in_ns(ns, "ethtool", &["-K", "eth0", "tx", on])?;
        }
        Ok(())
    };
    set("off")?;
    let run = ctx.start("nooffload", SHORT_CHECK, &[]);
    let run = run.map(|mut r| {
        let done = r.wait_all(Duration::from_secs(180));
        (r, done)
    });
    // Offload back on for the checks after this one, whatever happened.
    set("on")?;
    let (r, done) = run?;
    let outs = all_checked(&r, ctx.p())?;
    if !done {
        return Err("ranks ran past 180 s".to_owned());
    }
    let (sent, in_place) = sent_in_place(&outs);
    if sent == 0 {
        return Err("no datagram sent".to_owned());
    }
    let how = if in_place == sent {
        "all gathered in place, segmented in software".to_owned()
    } else {
        format!("{in_place} gathered in place, the rest laid out after the kernel refused GSO")
    };
    Ok(format!(
        "veths without checksum offload: {sent} datagrams sent ({how}), every op byte for byte"
    ))
}

/// `fields` of every packet of capture `pcap` that `filter` keeps, a line each, comma-separated
/// (first occurrences); UDP `port`'s datagrams decoded as RoCEv2 where given.
fn tshark_fields(
    pcap: &Path,
    port: Option<u16>,
    filter: &str,
    fields: &[&str],
) -> Result<String, String> {
    let pcap = pcap.to_string_lossy();
    let decode_as = port.map(|p| format!("udp.port=={p},infiniband"));
    let mut a = vec!["-r", &pcap];
    if let Some(d) = &decode_as {
        a.extend(["-d", d]);
    }
    a.extend(["-Y", filter, "-T", "fields"]);
    a.extend(["-E", "separator=,", "-E", "occurrence=f"]);
    for f in fields {
        a.extend(["-e", f]);
    }
    sh("tshark", &a)
}

/// What [`wire_checks`] found in a capture.
struct Wire {
    /// Datagrams to the data port.
    datagrams: usize,
    /// The one Q_Key they carried, as tshark prints it.
    qkey: String,
    /// SrcQPs allowed: the senders' ranks.
    senders: usize,
    /// Datagrams whose ICRC scapy recomputed the same.
    icrc_ok: String,
    /// Distinct IP IDs (several: GSO's segments).
    ip_ids: String,
    /// The longest UDP payload.
    longest: usize,
}

impl Wire {
    fn decoded(&self) -> String {
        let qps = match self.senders {
            1 => "0".to_owned(),
            n => format!("0-{}", n - 1),
        };
        format!(
            "all decoded by tshark (opcode 0x65, P_Key 0xffff, DestQP 0xffffff, Q_Key {}, SrcQP \
             {qps}, ImmDt), scapy ICRC ok on {}/{} ({} distinct IP IDs: GSO segments)",
            self.qkey, self.icrc_ok, self.datagrams, self.ip_ids
        )
    }
}

/// tshark decodes every datagram to `port` with the expected BTH/DETH/ImmDt (as RoCEv2 on a
/// port other than 4791 too); scapy recomputes every ICRC (wire.py) and finds every datagram
/// a segment within `mtu`; every SrcQP (the sender's rank) is below `senders`.
fn wire_checks(
    root: &Path,
    pcap: &Path,
    port: u16,
    senders: usize,
    mtu: u32,
) -> Result<Wire, String> {
    let pcap_s = pcap.to_string_lossy();
    let tshark = |filter: &str, fields: &[&str]| tshark_fields(pcap, Some(port), filter, fields);
    let udp = tshark(&format!("udp.dstport == {port}"), &["udp.length"])?;
    let lengths: Vec<usize> = udp
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.trim().parse::<usize>().unwrap_or(0).saturating_sub(8))
        .collect();
    let n_udp = lengths.len();
    let fields = tshark(
        "infiniband",
        &[
            "infiniband.bth.opcode",
            "infiniband.bth.p_key",
            "infiniband.bth.destqp",
            "infiniband.deth.q_key",
            "infiniband.deth.srcqp",
            "infiniband.immdt",
        ],
    )?;
    let rows: Vec<Vec<&str>> = fields
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split(',').collect())
        .collect();
    if n_udp == 0 || rows.len() != n_udp {
        return Err(format!(
            "tshark decoded {} of {n_udp} captured datagrams as InfiniBand",
            rows.len()
        ));
    }
    let int = |s: &str| {
        let s = s.trim();
        s.strip_prefix("0x").map_or_else(
            || s.parse::<u64>().ok(),
            |h| u64::from_str_radix(h, 16).ok(),
        )
    };
    let qkey0 = rows[0].get(3).copied().unwrap_or("");
    for (i, row) in rows.iter().enumerate() {
        let bad = row.len() != 6
            || int(row[0]) != Some(0x65)
            || int(row[1]) != Some(0xFFFF)
            || int(row[2]) != Some(0xFF_FFFF)
            || row[3] != qkey0
            || int(row[4]).is_none_or(|q| q >= senders as u64)
            || row[5].trim().is_empty();
        if bad {
            return Err(format!("tshark: datagram {i} has fields {row:?}"));
        }
    }
    let script = root.join("xtask/src/lab/wire.py");
    let py = sh(
        "/usr/bin/python3",
        &[
            &script.to_string_lossy(),
            &pcap_s,
            "--ranks",
            &senders.to_string(),
            "--port",
            &port.to_string(),
            "--mtu",
            &mtu.to_string(),
        ],
    )?;
    let w = kv(py.lines().find(|l| l.starts_with("WIRE")).unwrap_or(""));
    let got = |k: &str| w.get(k).map_or("?", String::as_str).to_owned();
    Ok(Wire {
        datagrams: n_udp,
        qkey: qkey0.to_owned(),
        senders,
        icrc_ok: got("icrc_ok"),
        ip_ids: got("distinct_ip_ids"),
        longest: lengths.iter().copied().max().unwrap_or(0),
    })
}

/// 1% then 5% random loss of data packets at every receiver (nft numgen), still byte for byte.
fn loss(ctx: &Ctx<'_>) -> Result<String, String> {
    let mut parts = Vec::new();
    let pcts: &[u32] = if ctx.long { &[1, 5, 10, 20] } else { &[1, 5] };
    for &pct in pcts {
        ctx.lab.nft_input_all(&drop_data(pct))?;
        let mut r = ctx.start(&format!("loss{pct}"), SHORT_CHECK, &[])?;
        let done = r.wait_all(Duration::from_secs(180));
        let dropped: u64 = ctx
            .lab
            .ns
            .iter()
            .filter_map(|ns| in_ns(ns, "nft", &["list", "table", "inet", "rclab"]).ok())
            .map(|s| {
                s.split_whitespace()
                    .skip_while(|w| *w != "packets")
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            })
            .sum();
        ctx.lab.nft_clear_all()?;
        let outs = all_checked(&r, ctx.p()).map_err(|e| format!("{pct}% loss: {e}"))?;
        if !done {
            return Err(format!("{pct}% loss: ranks ran past 180 s"));
        }
        let fetched = fetched_after(&outs);
        if dropped == 0 || fetched == 0 {
            return Err(format!(
                "{pct}% loss: nft dropped {dropped} datagrams, ranks fetched {fetched} chunks: \
                 the loss did not bite"
            ));
        }
        parts.push(format!(
            "{pct}%: nft dropped {dropped} datagrams, {fetched} chunks recovered, byte for byte"
        ));
    }
    Ok(parts.join("; "))
}

/// Hostile datagrams of every kind, from a separate namespace, while every rank but the last
/// holds an Allgather open; each counted by reason on every rank, the data still exact.
fn hostile(ctx: &Ctx<'_>) -> Result<String, String> {
    let p = ctx.p();
    let count = 10u64;
    let filter = format!("udp dst port {DATA_PORT} and src host {}", ctx.lab.ip(0));
    let (cap, pcap) = tcpdump(ctx, "template", &filter, 20)?;
    let mut r = ctx.start(
        "hostile",
        &["hold", "--size", "1048576", "--hold-secs", "5"],
        // The late rank is waited for (it answers where it stands), past any peer timeout.
        &[],
    )?;
    let hold = r
        .wait_line(0, "HOLD ", Duration::from_secs(60))
        .ok_or_else(|| format!("rank 0 never held: {}", r.out(0)))?;
    cap.stop();
    let group = ctx
        .lab
        .wait_joins(&["239.77.77.1"], Duration::from_secs(5))?;
    let seq: u64 = kv(&hold)
        .get("seq")
        .and_then(|s| s.parse().ok())
        .ok_or("no seq in HOLD")?;
    let snmp = |ns: &str| -> u64 {
        // "Udp: InDatagrams NoPorts InErrors ... InCsumErrors ..." header, then values.
        let s = in_ns(ns, "cat", &["/proc/net/snmp"]).unwrap_or_default();
        let udp: Vec<&str> = s.lines().filter(|l| l.starts_with("Udp:")).collect();
        if udp.len() < 2 {
            return 0;
        }
        let keys: Vec<&str> = udp[0].split_whitespace().collect();
        let vals: Vec<&str> = udp[1].split_whitespace().collect();
        keys.iter()
            .position(|k| *k == "InCsumErrors")
            .and_then(|i| vals.get(i))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let csum0: Vec<u64> = ctx.lab.ns.iter().map(|n| snmp(n)).collect();
    let script = ctx.root.join("xtask/src/lab/inject.py");
    let t = Instant::now();
    let sent = in_ns(
        &ctx.lab.hostile,
        "/usr/bin/python3",
        &[
            &script.to_string_lossy(),
            "--template",
            &pcap.to_string_lossy(),
            "--port",
            &DATA_PORT.to_string(),
            "--tag",
            &(seq & 0xFFF).to_string(),
            "--src-qp",
            &(p - 1).to_string(),
            "--count",
            &count.to_string(),
        ],
    )?;
    let inject_time = t.elapsed();
    let done = r.wait_all(Duration::from_secs(60));
    let csum1: Vec<u64> = ctx.lab.ns.iter().map(|n| snmp(n)).collect();
    let outs = all_checked_hold(&r, p)?;
    if !done {
        return Err("ranks ran past 60 s".to_owned());
    }
    if sent.lines().filter(|l| l.starts_with("SENT")).count() != 10 {
        return Err(format!("injector: {sent}"));
    }
    let mut problems = Vec::new();
    for (i, o) in outs.iter().enumerate() {
        let s = stats(o);
        let (Some(b), Some(a)) = (s.get("before"), s.get("after")) else {
            return Err(format!("rank {i}: no STATS before/after"));
        };
        let d = |k: &str| num(a, k).saturating_sub(num(b, k));
        let want = [
            ("qkey", 2 * count),
            ("pkey", count),
            ("opcode", count),
            ("truncated", count),
            ("oversize", count),
            ("destqp", 0),
            ("version", 0),
            ("malformed", 0),
        ];
        for (k, w) in want {
            if d(k) != w {
                problems.push(format!("rank {i}: {k} +{} (want {w})", d(k)));
            }
        }
        let (stale, oor) = (d("stale"), d("out_of_range"));
        let want_oor = if i == p - 1 { 0 } else { count };
        // Out-of-range drops are ours alone; stale ones are at least ours: a genuine chunk
        // of an operation this rank already finished (a late duplicate, or one still in
        // flight when the lane closed) is stale too.
        let want_stale = 2 * count - want_oor;
        if stale < want_stale || oor != want_oor {
            problems.push(format!(
                "rank {i}: stale +{stale}, out_of_range +{oor} (want at least {want_stale} \
                 and exactly {want_oor})"
            ));
        }
        if csum1[i] < csum0[i] + count {
            problems.push(format!(
                "rank {i}: the kernel's UDP InCsumErrors grew by {} (want >= {count})",
                csum1[i] - csum0[i]
            ));
        }
    }
    if !problems.is_empty() {
        return Err(problems.join("; "));
    }
    Ok(format!(
        "{count} each of wrong Q_Key, wrong P_Key, wrong opcode, stale op, out-of-range chunk, \
         truncated, oversize, bad ICRC (+bad UDP checksum), another job's group and another \
         job's Q_Key on ours, injected in {:.1}s into {group} while op {seq} was held open; \
         counted on every rank: qkey +{}, pkey/opcode/truncated/oversize +{count} each, \
         out_of_range +{count} (stale on the late rank), stale +{count}, kernel InCsumErrors \
         +{count} (bad ICRC), other group never delivered; every buffer still exact",
        inject_time.as_secs_f64(),
        2 * count
    ))
}

/// Every rank exited 0 after its `hold` run.
fn all_checked_hold(r: &Ranks, p: usize) -> Result<Vec<String>, String> {
    (0..p)
        .map(|i| {
            let out = r.out(i);
            if r.status[i].is_some_and(|s| s.success()) && out.contains("DONE") {
                Ok(out)
            } else {
                Err(r.failure(i))
            }
        })
        .collect()
}

/// Peer timeout the ranks run with (RINGCAST_PEER_TIMEOUT), and the deadline within which
/// survivors must fail: five peer timeouts, since a rank waiting for the barrier's `Go` right
/// after another operation waits 3.5 of them (its hub may still be stuck in that operation
/// on the hung rank, and the hub's verdict, naming it, must come first; see the core's
/// barrier), then asks the hub where it stands and gives it half a peer timeout to answer.
const PEER_TIMEOUT: Duration = Duration::from_secs(3);
const FAIL_DEADLINE: Duration = Duration::from_secs(15);

/// Starts `loop` ranks and waits until all run.
fn looping(ctx: &Ctx<'_>, tag: &str, size: u64, env: &[(&str, String)]) -> Result<Ranks, String> {
    let size = size.to_string();
    let mut r = ctx.start(tag, &["loop", "--size", &size, "--secs", "90"], env)?;
    all_running(&mut r, ctx.p())?;
    Ok(r)
}

/// Every rank failed to build with `MulticastUnreachable`, its message passing `says`:
/// rank 0's message.
fn all_unreachable(r: &Ranks, p: usize, says: impl Fn(&str) -> bool) -> Result<String, String> {
    let mut msg = String::new();
    for i in 0..p {
        let out = r.out(i);
        let line = end_line(&out, &["BUILD_ERROR"])
            .ok_or_else(|| format!("rank {i} did not fail to build: {out} {}", r.err_tail(i)))?;
        let m = kv(line);
        let text = m.get("msg").cloned().unwrap_or_default();
        if m.get("kind").map(String::as_str) != Some("MulticastUnreachable") || !says(&text) {
            return Err(format!("rank {i}: {line}"));
        }
        if i == 0 {
            msg = text;
        }
    }
    Ok(msg)
}

/// The first line of `out` that starts with one of `words`.
fn end_line<'a>(out: &'a str, words: &[&str]) -> Option<&'a str> {
    out.lines().find(|l| words.iter().any(|w| l.starts_with(w)))
}

/// Waits until every rank of a `loop` runs.
fn all_running(r: &mut Ranks, p: usize) -> Result<(), String> {
    for i in 0..p {
        r.wait_line(i, "RUNNING", Duration::from_secs(60))
            .ok_or_else(|| format!("rank {i} never ran: {} {}", r.out(i), r.err_tail(i)))?;
    }
    Ok(())
}

/// Every rank of a `loop` completed: the chunks each fetched over TCP, by rank.
fn all_done_fetched(r: &Ranks, p: usize) -> Result<Vec<u64>, String> {
    (0..p)
        .map(|i| {
            let out = r.out(i);
            if !out.lines().any(|l| l.starts_with("DONE")) {
                return Err(format!(
                    "rank {i} did not complete: {out} {}",
                    r.err_tail(i)
                ));
            }
            let s = stats(&out);
            let a = s
                .get("after")
                .ok_or_else(|| format!("rank {i}: no STATS: {out}"))?;
            Ok(num(a, "fetched"))
        })
        .collect()
}

/// Survivors (all but `victim`) failed within the deadline naming `victim`.
fn survivors_name(r: &mut Ranks, p: usize, victim: usize, t0: Instant) -> Result<String, String> {
    r.wait_all(FAIL_DEADLINE + Duration::from_secs(20));
    let mut seen = Vec::new();
    for i in (0..p).filter(|&i| i != victim) {
        let out = r.out(i);
        let line = out
            .lines()
            .find(|l| l.starts_with("FAILED"))
            .ok_or_else(|| format!("rank {i} did not fail: {out} {}", r.err_tail(i)))?;
        let m = kv(line);
        let after = r.ended[i].map(|e| e.duration_since(t0));
        if m.get("peer").map(String::as_str) != Some(&victim.to_string()) {
            return Err(format!("rank {i} blamed the wrong rank: {line}"));
        }
        match after {
            Some(d) if d <= FAIL_DEADLINE => {}
            _ => return Err(format!("rank {i} failed after {after:?}: {line}")),
        }
        seen.push(format!(
            "rank {i}: {} after {:.2}s",
            m.get("error").map_or("?", String::as_str),
            after.unwrap_or_default().as_secs_f64()
        ));
    }
    Ok(seen.join(", "))
}

/// A rank SIGKILLed mid-collective: the others fail within the deadline naming it.
fn kill(ctx: &Ctx<'_>) -> Result<String, String> {
    let victim = ctx.p() / 2;
    let mut r = looping(ctx, "kill", 4 << 20, &[])?;
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    r.kill(victim);
    let who = survivors_name(&mut r, ctx.p(), victim, t0)?;
    Ok(format!(
        "rank {victim} SIGKILLed during 4 MiB Allgathers; {who} (deadline {}s)",
        FAIL_DEADLINE.as_secs()
    ))
}

/// A rank that stops receiving multicast mid-run (nft drops the data port at its input for
/// 3 s, then lets it through again) during 1 MiB operations back to back: every rank
/// completes every operation byte for byte, the deaf one reading what it missed from its
/// ring neighbour over TCP.
fn deaf(ctx: &Ctx<'_>) -> Result<String, String> {
    let victim = 1;
    let ns = ctx.lab.ns[victim].clone();
    let mut r = ctx.start("deaf", &["loop", "--size", "1048576", "--secs", "8"], &[])?;
    all_running(&mut r, ctx.p())?;
    std::thread::sleep(Duration::from_millis(500));
    let t = Instant::now();
    let cut = ctx
        .lab
        .nft(&ns, &[format!("udp dport {DATA_PORT} drop")], &[]);
    std::thread::sleep(Duration::from_secs(3));
    let deaf_for = t.elapsed();
    let healed = ctx.lab.nft_clear(&ns);
    cut?;
    healed?;
    r.wait_all(Duration::from_secs(60));
    let fetched = all_done_fetched(&r, ctx.p())?;
    if fetched[victim] == 0 {
        return Err(format!(
            "rank {victim} recovered nothing while deaf: {fetched:?}"
        ));
    }
    Ok(format!(
        "rank {victim} deaf to multicast for {:.1}s of 8 s of 1 MiB operations: every rank \
         completed every one byte for byte; chunks read over TCP by rank: {fetched:?}",
        deaf_for.as_secs_f64()
    ))
}

/// Multicast that stops arriving at every rank mid-run (nft drops the data port at every
/// rank's input from 1 s on, for good: a switch that forgot the group, a querier gone) during
/// 1 MiB operations back to back:
/// * with `RINGCAST_FALLBACK=tcp`, the operations caught in the cut complete through the
///   ring's reads, the loss trips the switch, every rank switches at the same operation, and
///   the rest run over TCP;
/// * without it, every operation completes through the reads, on multicast still.
///
/// All byte for byte (every rank's loop checks each operation).
fn cut(ctx: &Ctx<'_>) -> Result<String, String> {
    let rule = format!("udp dport {DATA_PORT} drop");
    let mut said = Vec::new();
    for fallback in [true, false] {
        let (tag, env) = if fallback {
            (
                "cut-fallback",
                vec![("RINGCAST_FALLBACK", "tcp".to_owned())],
            )
        } else {
            ("cut", Vec::new())
        };
        let res = (|| {
            let mut r = ctx.start(tag, &["loop", "--size", "1048576", "--secs", "4"], &env)?;
            all_running(&mut r, ctx.p())?;
            std::thread::sleep(Duration::from_secs(1));
            ctx.lab.nft_input_all(&rule)?;
            r.wait_all(Duration::from_secs(90));
            let fetched = all_done_fetched(&r, ctx.p())?;
            let modes: Vec<String> = (0..ctx.p())
                .map(|i| {
                    stats(&r.out(i))
                        .get("after")
                        .and_then(|a| a.get("mode").cloned())
                        .unwrap_or_default()
                })
                .collect();
            if fetched.iter().all(|&f| f == 0) {
                return Err(format!("nothing read over TCP after the cut: {fetched:?}"));
            }
            let first = modes[0].clone();
            let want = if fallback {
                "tcp(from_op="
            } else {
                "multicast"
            };
            if !first.starts_with(want) || (fallback && !first.contains("Loss")) {
                return Err(format!(
                    "modes after the cut: {modes:?} (expected {want}...)"
                ));
            }
            if modes.iter().any(|m| *m != first) {
                return Err(format!("the ranks disagree on the switch: {modes:?}"));
            }
            Ok(if fallback {
                format!(
                    "with RINGCAST_FALLBACK=tcp every rank switched, at the same operation \
                     ({first}), chunks read over TCP before it by rank: {fetched:?}"
                )
            } else {
                format!("without fallback chunks read over TCP by rank: {fetched:?}")
            })
        })();
        ctx.lab.nft_clear_all()?;
        said.push(res?);
    }
    Ok(format!(
        "multicast cut at every rank 1 s into 4 s of 1 MiB operations, every operation byte \
         for byte: {}",
        said.join("; ")
    ))
}

/// A rank stopped (SIGSTOP: a long GC pause, a preempted VM), then continued, during 1 MiB
/// operations back to back:
/// * for half a peer timeout: nobody is blamed and every operation completes byte for byte
///   (what its socket dropped while it was stopped is read over TCP);
/// * for the failure deadline (five peer timeouts): the others fail naming it within it,
///   while it is stopped, and once continued it fails too and exits.
fn stopped(ctx: &Ctx<'_>) -> Result<String, String> {
    let short = stopped_for(ctx, PEER_TIMEOUT / 2)?;
    let long = stopped_for(ctx, FAIL_DEADLINE)?;
    Ok(format!("{short}; {long}"))
}

fn stopped_for(ctx: &Ctx<'_>, stop: Duration) -> Result<String, String> {
    let victim = 2;
    let long = stop > PEER_TIMEOUT;
    let tag = if long { "stoplong" } else { "stopped" };
    let mut r = ctx.start(tag, &["loop", "--size", "1048576", "--secs", "6"], &[])?;
    all_running(&mut r, ctx.p())?;
    std::thread::sleep(Duration::from_millis(500));
    let t0 = Instant::now();
    r.signal(victim, "STOP")?;
    // While it is stopped, the others end (or go on) on their own.
    let mut named = Vec::new();
    if long {
        for i in (0..ctx.p()).filter(|&i| i != victim) {
            let left = (t0 + stop).saturating_duration_since(Instant::now());
            let line = r.wait_line(i, "FAILED", left).ok_or_else(|| {
                format!(
                    "rank {i} did not fail while rank {victim} was stopped: {}",
                    r.out(i)
                )
            })?;
            if kv(&line).get("peer").map(String::as_str) != Some(&victim.to_string()) {
                return Err(format!("rank {i} blamed the wrong rank: {line}"));
            }
            named.push(format!("rank {i} after {:.2}s", t0.elapsed().as_secs_f64()));
        }
    }
    std::thread::sleep((t0 + stop).saturating_duration_since(Instant::now()));
    let resumed = Instant::now();
    r.signal(victim, "CONT")?;
    r.wait_all(Duration::from_secs(60));
    if long {
        let out = r.out(victim);
        if !out.lines().any(|l| l.starts_with("FAILED")) {
            return Err(format!("rank {victim} did not fail once continued: {out}"));
        }
        let after = r.ended[victim].map(|e| e.duration_since(resumed));
        if after.is_none_or(|d| d > FAIL_DEADLINE) {
            return Err(format!(
                "rank {victim} ended {after:?} after it was continued: {out}"
            ));
        }
        return Ok(format!(
            "stopped {:.1}s: named by {} (peer timeout {}s); it failed and exited {:.2}s after \
             it was continued",
            stop.as_secs_f64(),
            named.join(", "),
            PEER_TIMEOUT.as_secs(),
            after.unwrap_or_default().as_secs_f64()
        ));
    }
    let fetched = all_done_fetched(&r, ctx.p())?;
    Ok(format!(
        "rank {victim} stopped {:.1}s (peer timeout {}s) during 6 s of 1 MiB operations: every \
         rank completed every one byte for byte; chunks read over TCP by rank: {fetched:?}",
        stop.as_secs_f64(),
        PEER_TIMEOUT.as_secs()
    ))
}

/// A rank SIGKILLed 20 or 40 ms after it starts: during its rendezvous, the control mesh,
/// the start-up check or its first operation, as the machine's speed has it. Every other
/// rank ends with an error naming it, or completes what did not need it; none hangs. It is
/// named at once where a peer can tell: one whose connection it refused or reset, or that
/// another rank told in leaving; otherwise at the timeout it missed (the rendezvous's when
/// it never joined).
fn kill_start(ctx: &Ctx<'_>) -> Result<String, String> {
    let victim = 2;
    let mut res = Vec::new();
    for delay in [20u64, 40] {
        let t0 = Instant::now();
        let mut r = ctx.start(
            &format!("killstart{delay}"),
            &["check", "--rounds", "1", "--inflight", "1"],
            &[],
        )?;
        std::thread::sleep(Duration::from_millis(delay));
        r.kill(victim);
        if !r.wait_all(Duration::from_secs(60)) {
            return Err(format!("killed after {delay} ms: ranks ran past 60 s"));
        }
        let mut seen = Vec::new();
        for i in (0..ctx.p()).filter(|&i| i != victim) {
            let out = r.out(i);
            let end = end_line(&out, &["BUILD_ERROR", "FAILED", "CHECKED"])
                .ok_or_else(|| format!("killed after {delay} ms: rank {i} ended with {out}"))?;
            let m = kv(end);
            let text = m.get("msg").map_or("", String::as_str);
            let names = m.get("peer").map(String::as_str) == Some("2")
                || text.contains("rank 2")
                || text.contains("[2]");
            if !end.starts_with("CHECKED") && !names {
                return Err(format!(
                    "killed after {delay} ms: rank {i} did not name rank 2: {end}"
                ));
            }
            let word = end.split_whitespace().next().unwrap_or("?");
            let kind = m.get("kind").or(m.get("error")).map_or("", String::as_str);
            seen.push(format!("{word} {kind}").trim().to_owned());
        }
        seen.sort();
        seen.dedup();
        res.push(format!(
            "killed after {delay} ms: the others {} within {:.1}s",
            seen.join(" / "),
            t0.elapsed().as_secs_f64()
        ));
    }
    Ok(res.join("; "))
}

/// A rank SIGKILLed 0, 5 or 20 ms after the ranks are ready, as they split the communicator
/// in halves (it shares one with rank 0) and run on both: its half's other member fails its
/// split naming it (`SplitError::MemberGone`, as soon as the parent sees it go; it waited
/// out the connect timeout before), the others fail their operations on the whole naming
/// it. Nobody hangs.
fn kill_split(ctx: &Ctx<'_>) -> Result<String, String> {
    let victim = 2;
    let mut res = Vec::new();
    for delay in [0u64, 5, 20] {
        let mut r = ctx.start(
            &format!("killsplit{delay}"),
            &["split", "--size", "65536"],
            &[],
        )?;
        for i in 0..ctx.p() {
            r.wait_line(i, "READY", Duration::from_secs(60))
                .ok_or_else(|| format!("rank {i} never got ready: {}", r.err_tail(i)))?;
        }
        let t0 = Instant::now();
        std::thread::sleep(Duration::from_millis(delay));
        r.kill(victim);
        if !r.wait_all(Duration::from_secs(60)) {
            return Err(format!("killed after {delay} ms: ranks ran past 60 s"));
        }
        let mut slowest = Duration::ZERO;
        for i in (0..ctx.p()).filter(|&i| i != victim) {
            let out = r.out(i);
            let end = end_line(&out, &["WRONG", "FAILED", "CHECKED"])
                .ok_or_else(|| format!("killed after {delay} ms: rank {i} ended with {out}"))?;
            // The split's own failure, one on the half (said with the parent rank), or one
            // on the whole (its exchange, or an operation).
            let named = kv(end).get("peer").map(String::as_str) == Some("2")
                || [
                    "parent rank 2",
                    "gave up on rank 2",
                    "rank 2 is gone",
                    "rank 2 stopped answering",
                ]
                .iter()
                .any(|p| end.contains(p));
            if !end.starts_with("CHECKED") && !named {
                return Err(format!(
                    "killed after {delay} ms: rank {i} did not name rank 2: {end}"
                ));
            }
            slowest = slowest.max(r.ended[i].map_or(Duration::MAX, |e| e.duration_since(t0)));
        }
        res.push(format!(
            "killed after {delay} ms: named by all within {:.2}s",
            slowest.as_secs_f64()
        ));
    }
    Ok(res.join("; "))
}

/// The fabric's MTU below the hosts': rank 1's switch port (the host side of its veth) at
/// 1500 bytes while every host runs 9000 and sizes its chunks from that. Small datagrams
/// reach rank 1, the data's do not (the bridge drops them, and says nothing). Every rank
/// fails to build within seconds with `MulticastUnreachable` naming the MTU; before, the
/// start-up check passed and the first operation failed a peer timeout later, blaming a rank.
fn mtu(ctx: &Ctx<'_>) -> Result<String, String> {
    let victim = 1;
    let port = ctx.lab.veths[victim].clone();
    sh("ip", &["link", "set", "dev", &port, "mtu", "1500"])?;
    let res = (|| {
        let t = Instant::now();
        let mut r = ctx.start("mtu", &["check", "--rounds", "1", "--inflight", "2"], &[])?;
        r.wait_all(Duration::from_secs(60));
        let took = t.elapsed();
        let msg = all_unreachable(&r, ctx.p(), |text| {
            text.contains("smaller MTU")
                && text.contains(&format!("rank {victim} heard small multicast"))
        })?;
        let short: String = msg.chars().take(300).collect();
        Ok::<_, String>(format!(
            "rank {victim}'s bridge port at MTU 1500 under 9000-byte hosts: every rank failed \
             to build in {:.1}s with MulticastUnreachable (\"{short}...\")",
            took.as_secs_f64()
        ))
    })();
    let restored = sh("ip", &["link", "set", "dev", &port, "mtu", "9000"]);
    let r = res?;
    restored?;
    Ok(r)
}

/// A rank whose egress stops during 4 MiB Allgathers: a tbf qdisc lets one packet through,
/// then 8 bit/s, and queues up to 1 GB, so every packet (and the socket memory it holds)
/// stays queued, never dropped.
/// * All of its egress (a wedged queue): every other rank fails within the deadline naming
///   it; it fails too (its peers look silent from where it stands).
/// * Only the data port, as PFC pauses RoCE's priority class and not TCP's: its multicast
///   sends stop completing, and every rank, itself included, fails naming it.
/// * Its cable pulled (the host side of its veth down): what it sends vanishes, nothing
///   reaches it; every other rank names it.
///
/// Every way, it exits while still cut off: no thread stuck in a send holds its drop.
fn pause(ctx: &Ctx<'_>) -> Result<String, String> {
    let mut done = Vec::new();
    for stop in [Stop::AllEgress, Stop::DataPort, Stop::Unplugged] {
        let what = match stop {
            Stop::AllEgress => "all egress",
            Stop::DataPort => "data port",
            Stop::Unplugged => "unplugged",
        };
        let r = pause_with(ctx, stop).map_err(|e| format!("{what}: {e}"))?;
        done.push(format!("{what}: {r}"));
    }
    Ok(format!(
        "{} (peer timeout {}s, deadline {}s)",
        done.join("; "),
        PEER_TIMEOUT.as_secs(),
        FAIL_DEADLINE.as_secs()
    ))
}

/// How [`pause`] stops a rank.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stop {
    AllEgress,
    DataPort,
    Unplugged,
}

fn pause_with(ctx: &Ctx<'_>, stop: Stop) -> Result<String, String> {
    let victim = ctx.p() / 2;
    let ns = ctx.lab.ns[victim].clone();
    let port = ctx.lab.veths[victim].clone();
    let data_only = stop == Stop::DataPort;
    let tag = match stop {
        Stop::AllEgress => "pauseall",
        Stop::DataPort => "pausedata",
        Stop::Unplugged => "unplugged",
    };
    let mut r = looping(ctx, tag, 4 << 20, &[])?;
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    let tc = |args: &str| in_ns(&ns, "tc", &args.split(' ').collect::<Vec<_>>());
    let hold = "tbf rate 8bit burst 9100 limit 1000000000";
    let held = if stop == Stop::Unplugged {
        sh("ip", &["link", "set", "dev", &port, "down"])
    } else if data_only {
        // Everything in class 1:10 (unlimited) but the data port's datagrams (1:20, held).
        tc("qdisc add dev eth0 root handle 1: htb default 10")
            .and_then(|_| tc("class add dev eth0 parent 1: classid 1:10 htb rate 100gbit"))
            .and_then(|_| tc("class add dev eth0 parent 1: classid 1:20 htb rate 8bit ceil 8bit"))
            .and_then(|_| tc(&format!("qdisc add dev eth0 parent 1:20 handle 20: {hold}")))
            .and_then(|_| {
                tc(&format!(
                    "filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dport {DATA_PORT} 0xffff flowid 1:20"
                ))
            })
    } else {
        tc(&format!("qdisc add dev eth0 root {hold}"))
    };
    let res = held.and_then(|_| {
        let who = survivors_name(&mut r, ctx.p(), victim, t0)?;
        let out = r.out(victim);
        let line = out
            .lines()
            .find(|l| l.starts_with("FAILED"))
            .ok_or_else(|| format!("rank {victim} did not fail: {out} {}", r.err_tail(victim)))?
            .to_owned();
        let m = kv(&line);
        let after = r.ended[victim].map(|e| e.duration_since(t0));
        if data_only && m.get("peer").map(String::as_str) != Some(&victim.to_string()) {
            return Err(format!(
                "rank {victim} (paused) blamed another rank: {line}"
            ));
        }
        // Cut off from everyone, it learns of nothing: its own timers end its wait (four
        // peer timeouts, unplugged), later than the others' verdict on it.
        let deadline = if data_only {
            FAIL_DEADLINE
        } else {
            FAIL_DEADLINE + 2 * PEER_TIMEOUT
        };
        match after {
            Some(d) if d <= deadline => Ok(format!(
                "{who}, rank {victim} (paused): {} naming {} after {:.2}s",
                m.get("error").map_or("?", String::as_str),
                m.get("peer").map_or("?", String::as_str),
                d.as_secs_f64()
            )),
            _ => Err(format!(
                "rank {victim} (paused) ended after {after:?}: {line}"
            )),
        }
    });
    let cleared = if stop == Stop::Unplugged {
        sh("ip", &["link", "set", "dev", &port, "up"])
    } else {
        tc("qdisc del dev eth0 root")
    };
    let who = res?;
    cleared?;
    Ok(who)
}

/// A rank's control connections blocked by nft drops on their TCP ports: detected like a
/// dead rank, within the peer timeout; and answered with resets instead (its connections
/// torn down): named at once. With `--long`, the drops also in a loop of 16 KiB-per-rank
/// Allgathers (operations back to back, the block most often lands while some ranks are in
/// the next one), over multicast and over the TCP path.
fn tcp_block(ctx: &Ctx<'_>) -> Result<String, String> {
    // (bytes per rank, over the TCP path rather than multicast, reset rather than drop)
    let runs: &[(u64, bool, bool)] = if ctx.long {
        &[
            (4 << 20, false, false),
            (4 << 20, false, true),
            (16 << 10, false, false),
            (16 << 10, true, false),
        ]
    } else {
        &[(4 << 20, false, false), (4 << 20, false, true)]
    };
    let mut done = Vec::new();
    for &(size, tcp, reset) in runs {
        let how = match (tcp, reset) {
            (true, _) => " over the TCP path",
            (false, true) => " reset",
            (false, false) => "",
        };
        let r = tcp_block_at(ctx, size, tcp, reset).map_err(|e| format!("{size} B{how}: {e}"))?;
        done.push(format!("{size} B{how}: {r}"));
    }
    Ok(done.join("; "))
}

fn tcp_block_at(ctx: &Ctx<'_>, size: u64, tcp_path: bool, reset: bool) -> Result<String, String> {
    let victim = ctx.p() / 2;
    let ns = ctx.lab.ns[victim].clone();
    let (tag, env) = if tcp_path {
        let all = (size * ctx.p() as u64).to_string();
        (
            format!("tcpblock{size}tcp"),
            vec![("RINGCAST_TCP_THRESHOLD", all)],
        )
    } else if reset {
        (format!("tcpreset{size}"), Vec::new())
    } else {
        (format!("tcpblock{size}"), Vec::new())
    };
    let mut r = looping(ctx, &tag, size, &env)?;
    let ss = in_ns(&ns, "ss", &["-Htn", "state", "established"])?;
    let mut ports: Vec<String> = ss
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2))
        .filter_map(|a| a.rsplit(':').next())
        .map(str::to_owned)
        .collect();
    let listen = in_ns(&ns, "ss", &["-Htln"])?;
    ports.extend(
        listen
            .lines()
            .filter_map(|l| l.split_whitespace().nth(3))
            .filter_map(|a| a.rsplit(':').next())
            .map(str::to_owned),
    );
    ports.sort();
    ports.dedup();
    if ports.is_empty() {
        return Err(format!("rank {victim} has no TCP connection: {ss}"));
    }
    let set = ports.join(", ");
    let t0 = Instant::now();
    if reset {
        // Every segment that reaches its ports is answered with a reset.
        ctx.lab.nft(
            &ns,
            &[format!("tcp dport {{ {set} }} reject with tcp reset")],
            &[],
        )?;
    } else {
        ctx.lab.nft(
            &ns,
            &[format!("tcp dport {{ {set} }} drop")],
            &[format!("tcp sport {{ {set} }} drop")],
        )?;
    }
    let res = survivors_name(&mut r, ctx.p(), victim, t0);
    ctx.lab.nft_clear(&ns)?;
    let what = if reset {
        "answered with resets by nft"
    } else {
        "dropped by nft in both directions"
    };
    Ok(format!(
        "rank {victim}'s TCP ports {{{set}}} {what}; {} \
         (peer timeout {}s, deadline {}s)",
        res?,
        PEER_TIMEOUT.as_secs(),
        FAIL_DEADLINE.as_secs()
    ))
}

/// nft drops the data port at every rank: the start-up check fails with its clear error;
/// with RINGCAST_FALLBACK=tcp the collectives complete over TCP and say so.
fn unreachable(ctx: &Ctx<'_>) -> Result<String, String> {
    let rule = format!("udp dport {DATA_PORT} drop");
    ctx.lab.nft_input_all(&rule)?;
    let res = (|| {
        let t = Instant::now();
        let mut r = ctx.start(
            "unreachable",
            &["check", "--rounds", "1", "--inflight", "3"],
            &[],
        )?;
        r.wait_all(Duration::from_secs(60));
        let took = t.elapsed();
        let msg = all_unreachable(&r, ctx.p(), |_| true)?;
        let mut r = ctx.start(
            "fallback",
            SHORT_CHECK,
            &[("RINGCAST_FALLBACK", "tcp".to_owned())],
        )?;
        r.wait_all(Duration::from_secs(120));
        let outs = all_checked(&r, ctx.p())?;
        let mut mode = String::new();
        let (mut received, mut landed) = (0, 0);
        for (i, o) in outs.iter().enumerate() {
            let s = stats(o);
            let a = s.get("after").ok_or("no STATS")?;
            let m = a.get("mode").cloned().unwrap_or_default();
            if !m.starts_with("tcp") || num(a, "tcp_sent") == 0 {
                return Err(format!(
                    "rank {i}: mode {m}, tcp_sent {}",
                    num(a, "tcp_sent")
                ));
            }
            // The 1 MiB operations' 256 KiB pieces land straight in their buffers.
            let (r, l) = (num(a, "tcp_received"), num(a, "tcp_landed"));
            if l == 0 || l > r {
                return Err(format!(
                    "rank {i}: {l} of {r} bytes over TCP landed in place"
                ));
            }
            (received, landed) = (received + r, landed + l);
            mode = m;
        }
        let short: String = msg.chars().take(240).collect();
        Ok(format!(
            "without fallback every rank failed to build in {:.1}s with MulticastUnreachable \
             (\"{short}...\"); with RINGCAST_FALLBACK=tcp all ops byte for byte, mode {mode}, \
             {landed} of the {received} bytes received over TCP read straight into place",
            took.as_secs_f64()
        ))
    })();
    ctx.lab.nft_clear_all()?;
    res
}

/// A second lab whose snooping bridge has no querier (and floods no unregistered
/// multicast): the start-up check must say that multicast does not arrive.
fn no_querier(ctx: &Ctx<'_>) -> Result<String, String> {
    let out = ctx.lab.dir.parent().unwrap_or(ctx.lab.dir.as_path());
    let lab = Lab::new(ctx.p(), out, Querier::Off)?;
    let sub = Ctx {
        lab: &lab,
        root: ctx.root,
        rank_bin: ctx.rank_bin.clone(),
        cli_bin: Err("unused".to_owned()),
        long: ctx.long,
        next_port: std::cell::Cell::new(ctx.port()),
        run: std::cell::Cell::new(ctx.run.get()),
    };
    let mut r = sub.start(
        "noquerier",
        &["check", "--rounds", "1", "--inflight", "3"],
        &[],
    )?;
    r.wait_all(Duration::from_secs(60));
    let mut kinds = Vec::new();
    for i in 0..sub.p() {
        let out = r.out(i);
        match out.lines().find(|l| l.starts_with("BUILD_ERROR")) {
            Some(l) => kinds.push(kv(l).get("kind").cloned().unwrap_or_default()),
            None => {
                return Err(format!(
                    "lab {}: rank {i} was not stopped by the start-up check: {out}",
                    lab.id
                ));
            }
        }
    }
    if kinds.iter().any(|k| k != "MulticastUnreachable") {
        return Err(format!("lab {}: {kinds:?}", lab.id));
    }
    let id = lab.id.clone();
    drop(r);
    drop(sub);
    drop(lab);
    let left = leftovers(&id);
    if !left.is_empty() {
        return Err(format!("lab {id} left behind: {left:?}"));
    }
    Ok(format!(
        "lab {id} (snooping, no querier, mcast_flood off): every rank stopped with \
         MulticastUnreachable; lab removed"
    ))
}

fn bench_ok(out: &str, what: &str) -> Result<String, String> {
    let verified = out.matches("\"verified\": true").count();
    if verified == 0 {
        return Err(format!("{what}: no verified result in {out}"));
    }
    let lat: Vec<String> = out
        .lines()
        .filter(|l| l.contains("\"avg_us\""))
        .map(|l| l.trim().trim_end_matches(',').replace("\"avg_us\": ", ""))
        .collect();
    Ok(format!(
        "{verified} sizes verified, avg latency (us) {}",
        lat.join(" / ")
    ))
}

/// What the launcher checks run under mpirun: a short verified Allgather bench.
const LAUNCHED_BENCH: [&str; 9] = [
    "bench",
    "allgather",
    "--sizes",
    "64KiB,1MiB",
    "--iters",
    "3",
    "--warmup",
    "1",
    "--json",
];

/// `mpirun -np P ringcast bench allgather` in the host namespace (loopback).
fn mpirun_local(ctx: &Ctx<'_>) -> Result<String, String> {
    let bin = ctx.cli_bin.clone()?;
    let np = ctx.p().to_string();
    let mut args = vec!["--allow-run-as-root", "--oversubscribe", "-np", &np];
    let bin = bin.to_string_lossy();
    args.push(&bin);
    args.extend(LAUNCHED_BENCH);
    let out = sh("mpirun", &args)?;
    bench_ok(&out, "mpirun local").map(|m| format!("{np} ranks on loopback: {m}"))
}

/// mpirun in the first namespace, the other ranks started through an rsh agent running
/// `ip netns exec` + `unshare --uts` (distinct hostnames), rendezvous at rank 0's address.
fn mpirun_netns(ctx: &Ctx<'_>) -> Result<String, String> {
    let bin = ctx.cli_bin.clone()?;
    let boot = format!("RINGCAST_BOOTSTRAP={}:{}", ctx.lab.ip(0), ctx.port());
    let program: Vec<String> = std::iter::once(bin.to_string_lossy().into_owned())
        .chain(LAUNCHED_BENCH.iter().map(|s| (*s).to_owned()))
        .collect();
    let (out, nss) = mpirun_across(
        ctx.lab,
        ctx.root,
        30,
        &[],
        &[boot, "RINGCAST_IFNAME=eth0".to_owned()],
        &program,
    )?;
    bench_ok(&out, "mpirun across namespaces").map(|m| {
        format!(
            "mpirun in {}, orted through the rsh agent in {}: {m}",
            ctx.lab.ns[0],
            nss.join(", ")
        )
    })
}

/// Runs `program` on every rank namespace under mpirun started in the first one, the others
/// reached through the rsh agent (`ip netns exec` + `unshare --uts`); `mca` are extra
/// `--mca`/option words, `env` `KEY=VALUE`s exported to the ranks (`-x`); killed after
/// `secs`. Returns mpirun's stdout and the namespaces the agent ran in.
pub(crate) fn mpirun_across(
    lab: &Lab,
    root: &Path,
    secs: u64,
    mca: &[&str],
    env: &[String],
    program: &[String],
) -> Result<(String, Vec<String>), String> {
    let p = lab.ns.len();
    let np = p.to_string();
    let hosts: Vec<String> = (0..p).map(|i| lab.ip(i).to_string()).collect();
    let agent = root.join("xtask/src/lab/rsh-agent.sh");
    let agent_log = lab.dir.join("rsh-agent.log");
    let _ = std::fs::remove_file(&agent_log);
    // By subnet, not by interface: eth0 also carries the canary group's /32 (autojoin), which
    // Open MPI would otherwise take for a peer address.
    let [a, b, c] = crate::netns_lab::SUBNET;
    let subnet = format!("{a}.{b}.{c}.0/24");
    let mut args: Vec<String> = [
        "env",
        &format!("RCLAB_ID={}", lab.id),
        &format!("RCLAB_LOG={}", agent_log.display()),
        "mpirun",
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        &np,
        "--host",
        &hosts.join(","),
        "--mca",
        "plm_rsh_agent",
        &agent.to_string_lossy(),
        "--mca",
        "plm_rsh_no_tree_spawn",
        "1",
        "--mca",
        "oob_tcp_if_include",
        &subnet,
        "--mca",
        "btl_tcp_if_include",
        &subnet,
        "-x",
        "RCLAB_ID",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    args.extend(mca.iter().map(|s| (*s).to_owned()));
    for e in env {
        args.push("-x".to_owned());
        args.push(e.clone());
    }
    args.extend(program.iter().cloned());
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = in_ns_limit(secs, &lab.ns[0], a[0], &a[1..])?;
    let hops = std::fs::read_to_string(&agent_log).unwrap_or_default();
    let nss: Vec<String> = hops
        .lines()
        .filter_map(|l| l.rsplit(' ').next())
        .map(str::to_owned)
        .collect();
    if nss.len() + 1 != p {
        return Err(format!(
            "the rsh agent ran {} times, want {} (one per namespace but mpirun's): {hops}",
            nss.len(),
            p - 1
        ));
    }
    Ok((out, nss))
}
