//! `cargo xtask bench-net`: ringcast against Open MPI over TCP and against the raw multicast
//! ceiling, side by side in one run, in the namespace lab of `cargo xtask netns` (P ranks on an
//! IGMPv3-snooping bridge, MTU 9000, one process per namespace).
//!
//! Per loss point (0 % and 1 % by default, nftables dropping that share of the data packets at
//! random on every receiver's input):
//! * `ringcast bench {bcast,allgather} --blocking --json` (the blocking calls on the caller's
//!   buffers, as MPI's), one process per namespace, bootstrapped from `RINGCAST_*`;
//! * Open MPI's `MPI_Bcast` / `MPI_Allgather` (`xtask/src/lab/mpi_bench.c`, timed the same way)
//!   over its TCP BTL, under mpirun with the lab's rsh agent;
//! * the ceiling: the transport's raw GSO sender (`goodput --role send`) in the first namespace
//!   and a `goodput --role recv` in every other one, same datagram size.
//!
//! Loss-free, it then measures the ceiling, a Broadcast's ceiling (`goodput --source
//! --deliver`: the sender takes its payloads from, and each receiver copies them into, a
//! buffer of the Broadcast's size, as a Broadcast's root and receivers must) and ringcast's
//! largest Broadcast in turn, three times, so that the goodput
//! goal compares each with ceilings measured next to it (the VM's speed drifts between the
//! sweeps); and it counts the bytes each rank's namespace put into
//! the bridge (the host-side veth's `rx_bytes`) over a few 16 MiB operations of each, to set
//! ringcast's injection (own block + headers) beside a ring's (P-1 times).
//!
//! `--huge-pages`: every side's buffers on 2 MiB transparent huge pages (`ringcast bench
//! --huge-pages`, from `ringcast::alloc_buffer`; `mpi_bench --huge-pages`; the Broadcast's
//! ceiling's `goodput --pages huge`), as a caller that allocates for communication has them.
//!
//! Both sides use the veths' segmentation offloads (TCP's TSO for Open MPI, UDP's USO for
//! ringcast's GSO batches), as they would a NIC's. Nothing is pinned, neither side (2 cores shared by P ranks' threads: pinning would only
//! choose which ranks share a core). Raw outputs land in `target/bench-net/<lab id>/`; the
//! `bench_net_report` example of the ringcast crate (serde_json and plotters stay out of
//! xtask) turns them into `results.md`, `results.json` and two SVG plots there, and with
//! `--record` into `docs/bench-net/`.

use crate::netns::{can_create_namespaces, mpirun_across, require_tools};
use crate::netns_lab::{Bg, Lab, Launch, Querier, Ranks, in_ns_limit, sh};
use crate::run::{Step, StepError};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const USAGE: &str = "bench-net [--ranks N] [--sizes B,B,..] [--iters N] [--warmup N] \
                     [--losses PCT,PCT,..] [--tcp-threshold B] [--huge-pages] [--quick] \
                     [--record]";

/// The data port of ringcast and of the ceiling's sender (RoCEv2's).
const DATA_PORT: u16 = 4791;
/// Payload per datagram, ringcast's chunk (the ceiling uses the same): `RINGCAST_CHUNK_SIZE`
/// where set (the ranks inherit it), else the default between hosts, 4 KiB.
fn payload() -> usize {
    std::env::var("RINGCAST_CHUNK_SIZE")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(4096)
}
/// The group that shows snooping works before anything is measured.
const CANARY: &str = "239.77.77.1";
/// How long the ceiling's sender sends.
const CEILING_SECS: f64 = 2.0;
/// The operation counted for the bytes on the bridge, and how many timed runs of it.
const BYTES_SIZE: u64 = 16 << 20;
const BYTES_ITERS: u32 = 3;
/// Rounds of the goodput comparison: the ceilings, then ringcast's largest Broadcast, each
/// round (the machine's speed drifts between the loss sweeps; a ratio within a round does not).
const GOODPUT_ROUNDS: u32 = 3;

struct Opts {
    ranks: usize,
    sizes: Vec<u64>,
    iters: u32,
    warmup: u32,
    losses: Vec<f64>,
    /// ringcast's `--tcp-threshold` (its default when `None`).
    tcp_threshold: Option<u64>,
    /// Every side's buffers on huge pages.
    huge_pages: bool,
    record: bool,
}

/// The sizes measured by default, 64 KiB to 64 MiB (here and in `bench-loopback`).
pub(crate) const SIZES: [u64; 6] = [64 << 10, 256 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20];

/// A `--sizes` value: positive byte counts, comma-separated.
pub(crate) fn sizes(v: &str) -> Option<Vec<u64>> {
    v.split(',')
        .map(|s| s.trim().parse::<u64>().ok().filter(|&n| n > 0))
        .collect()
}

/// Builds, in release mode, the `ringcast` CLI, the ceiling's `goodput` and `examples`
/// (package, example).
pub(crate) fn build(root: &Path, examples: &[(&str, &str)]) -> Result<(), StepError> {
    let cargo = crate::cargo();
    let cli = ["ringcast", "--features", "cli", "--bin", "ringcast"];
    let goodput = ["ringcast-transport-rocev2-udp", "--example", "goodput"];
    let more = examples.iter().map(|(p, e)| vec![*p, "--example", e]);
    for what in [cli.to_vec(), goodput.to_vec()].into_iter().chain(more) {
        let args = [&["build", "--release", "-p"][..], &what].concat();
        Step::new(root, &cargo, &args, crate::minutes(30)).run()?;
    }
    Ok(())
}

/// Builds `xtask/src/lab/mpi_bench.c` with mpicc into `dir`; its path.
pub(crate) fn mpi_bench(root: &Path, dir: &Path) -> Result<PathBuf, String> {
    let mpi = dir.join("mpi_bench");
    let src = root.join("xtask/src/lab/mpi_bench.c");
    sh(
        "mpicc",
        &["-O2", "-o", &mpi.to_string_lossy(), &src.to_string_lossy()],
    )?;
    Ok(mpi)
}

fn parse(args: &[String]) -> Result<Opts, StepError> {
    let mut o = Opts {
        ranks: 4,
        sizes: SIZES.to_vec(),
        iters: 5,
        warmup: 1,
        losses: vec![0.0, 1.0],
        tcp_threshold: None,
        huge_pages: false,
        record: false,
    };
    let bad = |m: String| StepError::Other(format!("{m}\n\nusage: cargo xtask {USAGE}"));
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |what: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| bad(format!("`{a}` wants {what}")))
        };
        match a.as_str() {
            "--ranks" => {
                o.ranks = value("2 to 8")?
                    .parse()
                    .ok()
                    .filter(|n| (2..=8).contains(n))
                    .ok_or_else(|| bad("`--ranks` wants 2 to 8".to_owned()))?;
            }
            "--sizes" => {
                o.sizes = sizes(&value("sizes in bytes")?)
                    .ok_or_else(|| bad("`--sizes` wants positive byte counts".to_owned()))?;
            }
            "--iters" => {
                o.iters = value("a count")?
                    .parse()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| bad("`--iters` wants a positive count".to_owned()))?;
            }
            "--warmup" => {
                o.warmup = value("a count")?
                    .parse()
                    .map_err(|_| bad("`--warmup` wants a count".to_owned()))?;
            }
            "--losses" => {
                o.losses = value("percentages")?
                    .split(',')
                    .map(|s| {
                        s.trim()
                            .parse::<f64>()
                            .ok()
                            .filter(|p| (0.0..50.0).contains(p))
                    })
                    .collect::<Option<_>>()
                    .ok_or_else(|| bad("`--losses` wants percentages below 50".to_owned()))?;
            }
            "--huge-pages" => o.huge_pages = true,
            "--tcp-threshold" => {
                o.tcp_threshold = Some(
                    value("bytes")?
                        .parse()
                        .map_err(|_| bad("`--tcp-threshold` wants bytes".to_owned()))?,
                );
            }
            "--quick" => {
                o.sizes = vec![64 << 10, 1 << 20, 16 << 20];
                o.iters = 3;
            }
            "--record" => o.record = true,
            other => return Err(bad(format!("unknown option `{other}`"))),
        }
    }
    Ok(o)
}

pub(crate) fn run(root: &Path, args: &[String]) -> Result<(), StepError> {
    let o = parse(args)?;
    if let Err(why) = can_create_namespaces() {
        eprintln!(
            "bench-net: SKIPPED -- this machine does not let us create network namespaces \
             ({why}); nothing was measured. Run as root."
        );
        return Ok(());
    }
    require_tools(
        "bench-net",
        &["nft", "mpirun", "mpicc", "ethtool", "bridge", "timeout"],
        "iproute2 nftables ethtool openmpi-bin libopenmpi-dev",
    )?;
    build(root, &[("ringcast", "bench_net_report")])?;
    let bins = Bins {
        ringcast: root.join("target/release/ringcast"),
        goodput: root.join("target/release/examples/goodput"),
        mpi: PathBuf::new(),
    };
    let out = root.join("target").join("bench-net");
    let started = Instant::now();
    let dir;
    {
        let lab = Lab::new(o.ranks, &out, Querier::On).map_err(StepError::Other)?;
        dir = lab.dir.clone();
        eprintln!(
            "bench-net: lab {} ({} ranks), output in {}",
            lab.id,
            o.ranks,
            dir.display()
        );
        lab.canary(CANARY, Duration::from_secs(15))
            .and_then(|_| lab.leave(CANARY))
            .map_err(StepError::Other)?;
        // The netns checks segment UDP in software before the veth (so that captures see the
        // wire's segments); here both sides get their offload, as on a NIC: UDP segmentation
        // for ringcast's GSO batches, as TCP segmentation for Open MPI (on by default).
        for ns in &lab.ns {
            crate::netns_lab::in_ns(ns, "ethtool", &["-K", "eth0", "tx-udp-segmentation", "on"])
                .map_err(StepError::Other)?;
        }
        let mpi = mpi_bench(root, &dir).map_err(StepError::Other)?;
        let bins = Bins { mpi, ..bins };
        let b = Bench {
            lab: &lab,
            root,
            bins: &bins,
            o: &o,
            port: std::cell::Cell::new(29_800),
        };
        b.manifest().map_err(StepError::Other)?;
        for &loss in &o.losses {
            b.at_loss(loss).map_err(StepError::Other)?;
        }
        b.goodput_rounds().map_err(StepError::Other)?;
        b.bytes().map_err(StepError::Other)?;
        // The lab is dropped here: its watchdog removes everything.
    }
    eprintln!(
        "bench-net: measured in {:.0} s; writing the report",
        started.elapsed().as_secs_f64()
    );
    let mut report = vec!["--dir".to_owned(), dir.to_string_lossy().into_owned()];
    if o.record {
        report.push("--record".to_owned());
        report.push(root.join("docs/bench-net").to_string_lossy().into_owned());
    }
    let status = Command::new(root.join("target/release/examples/bench_net_report"))
        .args(&report)
        .status()
        .map_err(|e| StepError::Other(format!("could not run bench_net_report: {e}")))?;
    if status.success() {
        Ok(())
    } else {
        Err(StepError::Other(format!("bench_net_report: {status}")))
    }
}

struct Bins {
    ringcast: PathBuf,
    goodput: PathBuf,
    mpi: PathBuf,
}

struct Bench<'a> {
    lab: &'a Lab,
    root: &'a Path,
    bins: &'a Bins,
    o: &'a Opts,
    port: std::cell::Cell<u16>,
}

/// Which packets a loss rule drops.
#[derive(Clone, Copy)]
enum Traffic {
    /// ringcast's and the ceiling's datagrams.
    Multicast,
    /// TCP between the ranks (Open MPI's BTL).
    Tcp,
}

impl Bench<'_> {
    fn p(&self) -> usize {
        self.lab.ns.len()
    }

    fn file(&self, name: &str) -> PathBuf {
        self.lab.dir.join(name)
    }

    fn save(&self, name: &str, text: &str) -> Result<(), String> {
        let f = self.file(name);
        std::fs::write(&f, text).map_err(|e| format!("{}: {e}", f.display()))
    }

    /// What the report needs to know about the run.
    fn manifest(&self) -> Result<(), String> {
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|c| {
                c.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split(':').nth(1))
                    .map(|s| s.trim().to_owned())
            })
            .unwrap_or_else(|| "?".to_owned());
        let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
        let commit = sh(
            "git",
            &[
                "-C",
                &self.root.to_string_lossy(),
                "rev-parse",
                "--short",
                "HEAD",
            ],
        )
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "?".to_owned());
        let mpi = sh("mpirun", &["--version"])
            .ok()
            .and_then(|s| s.lines().next().map(str::to_owned))
            .unwrap_or_else(|| "?".to_owned());
        let sizes: Vec<String> = self.o.sizes.iter().map(u64::to_string).collect();
        let losses: Vec<String> = self.o.losses.iter().map(f64::to_string).collect();
        self.save(
            "manifest.txt",
            &format!(
                "ranks={}\nsizes={}\niters={}\nwarmup={}\nlosses={}\npayload={}\n\
                 bytes_size={BYTES_SIZE}\nbytes_ops={}\ncpu={cpu}\ncores={cores}\n\
                 commit={commit}\nmpi={mpi}\ngoodput_rounds={GOODPUT_ROUNDS}\n\
                 tcp_threshold={}\nhuge_pages={}\n",
                self.p(),
                sizes.join(","),
                self.o.iters,
                self.o.warmup,
                losses.join(","),
                payload(),
                BYTES_ITERS + 1,
                self.o
                    .tcp_threshold
                    .map_or_else(|| "default".to_owned(), |t| t.to_string()),
                self.o.huge_pages,
            ),
        )
    }

    /// Every rank namespace drops `pct` % of `what` on input (0: no rule).
    fn set_loss(&self, pct: f64, what: Traffic) -> Result<(), String> {
        for ns in &self.lab.ns {
            if pct <= 0.0 {
                self.lab.nft_clear(ns)?;
                continue;
            }
            let per_100k = (pct * 1000.0).round() as u64;
            let m = match what {
                Traffic::Multicast => format!("udp dport {DATA_PORT}"),
                Traffic::Tcp => "meta l4proto tcp".to_owned(),
            };
            let rule = format!("{m} numgen random mod 100000 < {per_100k} counter drop");
            self.lab.nft(ns, &[rule], &[])?;
        }
        Ok(())
    }

    fn at_loss(&self, loss: f64) -> Result<(), String> {
        let tag = format!("loss{loss}");
        let sizes: Vec<String> = self.o.sizes.iter().map(u64::to_string).collect();
        self.set_loss(loss, Traffic::Multicast)?;
        for coll in ["bcast", "allgather"] {
            eprintln!("bench-net: {loss}% loss: ringcast {coll} ...");
            let json = self.ringcast(coll, &sizes.join(","), self.o.warmup, self.o.iters)?;
            self.save(&format!("{tag}-ringcast-{coll}.json"), &json)?;
        }
        eprintln!("bench-net: {loss}% loss: raw multicast ceiling ...");
        let ceiling = self.ceiling(None)?;
        self.save(&format!("{tag}-ceiling.txt"), &ceiling)?;
        self.set_loss(loss, Traffic::Tcp)?;
        for coll in ["bcast", "allgather"] {
            eprintln!("bench-net: {loss}% loss: Open MPI {coll} over TCP ...");
            let table = self.mpi(coll, &sizes, self.o.warmup, self.o.iters)?;
            self.save(&format!("{tag}-mpi-{coll}.txt"), &table)?;
        }
        self.set_loss(0.0, Traffic::Tcp)
    }

    /// Loss-free, [`GOODPUT_ROUNDS`] times: the ceiling (raw, then a Broadcast's), then
    /// ringcast's Broadcast of the largest size, so that each goodput is
    /// compared with ceilings measured next to it.
    fn goodput_rounds(&self) -> Result<(), String> {
        let largest = self.o.sizes.iter().max().copied().unwrap_or(64 << 20);
        for r in 1..=GOODPUT_ROUNDS {
            eprintln!("bench-net: goodput round {r} of {GOODPUT_ROUNDS} ...");
            let ceiling = self.ceiling(None)?;
            self.save(&format!("goodput-r{r}-ceiling.txt"), &ceiling)?;
            let broadcast = self.ceiling(Some(largest))?;
            self.save(&format!("goodput-r{r}-ceiling-broadcast.txt"), &broadcast)?;
            let json = self.ringcast("bcast", &largest.to_string(), self.o.warmup, self.o.iters)?;
            self.save(&format!("goodput-r{r}-ringcast-bcast.json"), &json)?;
        }
        Ok(())
    }

    /// `ringcast bench COLL --json` on every namespace; rank 0's JSON.
    fn ringcast(&self, coll: &str, sizes: &str, warmup: u32, iters: u32) -> Result<String, String> {
        let (w, i) = (warmup.to_string(), iters.to_string());
        let t = self.o.tcp_threshold.map(|t| t.to_string());
        // The blocking calls, on the caller's buffers: `MPI_Bcast`'s and `MPI_Allgather`'s
        // contract.
        let mut args = vec![
            "bench",
            coll,
            "--blocking",
            "--sizes",
            sizes,
            "--warmup",
            &w,
            "--iters",
            &i,
            "--json",
        ];
        if let Some(t) = &t {
            args.extend(["--tcp-threshold", t]);
        }
        if self.o.huge_pages {
            args.push("--huge-pages");
        }
        let tag = format!("rc-{coll}-{}", self.port.get());
        let l = Launch {
            program: &self.bins.ringcast,
            args: &args,
            env: &[],
            tag: &tag,
        };
        let port = self.port.get();
        self.port.set(port + 1);
        let mut r = Ranks::start(self.lab, &l, port)?;
        if !r.wait_all(Duration::from_secs(900)) {
            return Err(format!("ringcast bench {coll}: ranks ran past 900 s"));
        }
        for i in 0..self.p() {
            if !r.status[i].is_some_and(|s| s.success()) {
                return Err(format!("ringcast bench {coll}: {}", r.failure(i)));
            }
        }
        let json = r.out(0);
        if !json.contains("\"verified\": true") {
            return Err(format!("ringcast bench {coll}: no verified result: {json}"));
        }
        Ok(json)
    }

    /// `mpi_bench COLL` over the TCP BTL on every namespace; its table.
    fn mpi(&self, coll: &str, sizes: &[String], warmup: u32, iters: u32) -> Result<String, String> {
        let mut program = vec![self.bins.mpi.to_string_lossy().into_owned()];
        if self.o.huge_pages {
            program.push("--huge-pages".to_owned());
        }
        program.extend([coll.to_owned(), warmup.to_string(), iters.to_string()]);
        program.extend(sizes.iter().cloned());
        let (out, _) = mpirun_across(
            self.lab,
            self.root,
            1800,
            &["--mca", "btl", "tcp,self", "--bind-to", "none"],
            &[],
            &program,
        )?;
        Ok(out)
    }

    /// The raw sender in the first namespace, a receiver in every other; their lines. With
    /// `deliver`, a Broadcast's: the sender takes its payloads from, and each receiver copies
    /// what it accepts into, a buffer of that many bytes (`goodput --source`, `--deliver`).
    fn ceiling(&self, deliver: Option<u64>) -> Result<String, String> {
        let secs = CEILING_SECS.to_string();
        let deliver = deliver.map(|d| d.to_string());
        let pages = if self.o.huge_pages { "huge" } else { "small" };
        let port = DATA_PORT.to_string();
        let payload = payload().to_string();
        let mut rx = Vec::new();
        for i in 1..self.p() {
            let log = self.file(&format!("ceiling-recv{i}.log"));
            let ip = self.lab.ip(i).to_string();
            let mut cmd = Command::new("ip");
            cmd.args(["netns", "exec", &self.lab.ns[i]])
                .arg(&self.bins.goodput)
                .args(["--role", "recv", "--iface", &ip, "--port", &port])
                .args(["--payload", &payload, "--secs", &secs, "--pages", pages]);
            if let Some(d) = &deliver {
                cmd.args(["--deliver", d]);
            }
            rx.push((log.clone(), Bg::spawn(&mut cmd, &log)?));
        }
        // Every receiver has joined (its READY line) and the bridge forwards the group to
        // each of them (its mdb) before the sender starts. (Waiting for a group of every
        // rank's port, as the ranks' own wait does, passed only on a stale ringcast group:
        // the sender does not join.)
        let t = Instant::now();
        let group = loop {
            let logs: Vec<String> = rx
                .iter()
                .map(|(log, _)| std::fs::read_to_string(log).unwrap_or_default())
                .collect();
            let ready: Option<Vec<&str>> = logs
                .iter()
                .map(|s| s.lines().find_map(|l| l.strip_prefix("READY group=")))
                .collect();
            if let Some(g) = ready.as_ref().and_then(|r| r.first()) {
                break g.split(':').next().unwrap_or_default().to_owned();
            }
            if t.elapsed() > Duration::from_secs(10) {
                return Err("ceiling: receivers not ready within 10 s".to_owned());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        self.lab
            .wait_group(&group, 1..self.p(), Duration::from_secs(10))
            .map_err(|e| format!("ceiling: {e}"))?;
        let ip0 = self.lab.ip(0).to_string();
        let sent = in_ns_limit(
            60,
            &self.lab.ns[0],
            &self.bins.goodput.to_string_lossy(),
            &[
                "--role",
                "send",
                "--iface",
                &ip0,
                "--port",
                &port,
                "--payload",
                &payload,
                "--secs",
                &secs,
                "--source",
                deliver.as_deref().unwrap_or("0"),
                "--pages",
                pages,
            ],
        )?;
        let mut lines = vec![sent.trim().to_owned()];
        for (log, mut bg) in rx {
            let t = Instant::now();
            while bg.0.try_wait().ok().flatten().is_none() && t.elapsed() < Duration::from_secs(15)
            {
                std::thread::sleep(Duration::from_millis(20));
            }
            let s = std::fs::read_to_string(&log).unwrap_or_default();
            let g = s
                .lines()
                .find(|l| l.starts_with("GOODPUT"))
                .ok_or_else(|| format!("ceiling: a receiver reported nothing: {s}"))?;
            lines.push(g.to_owned());
        }
        Ok(lines.join("\n") + "\n")
    }

    /// The host-side veth's received bytes of every rank namespace: what it put on the bridge.
    fn injected(&self) -> Vec<u64> {
        (0..self.p())
            .map(|i| {
                let f = format!("/sys/class/net/{}/statistics/rx_bytes", self.lab.veths[i]);
                std::fs::read_to_string(f)
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or(0)
            })
            .collect()
    }

    /// Bytes on the bridge per rank over `BYTES_ITERS + 1` 16 MiB operations of each side.
    fn bytes(&self) -> Result<(), String> {
        self.set_loss(0.0, Traffic::Multicast)?;
        let size = BYTES_SIZE.to_string();
        for coll in ["bcast", "allgather"] {
            eprintln!("bench-net: bytes on the bridge, {coll} ...");
            let before = self.injected();
            self.ringcast(coll, &size, 0, BYTES_ITERS)?;
            let rc = self.injected();
            self.mpi(coll, std::slice::from_ref(&size), 0, BYTES_ITERS)?;
            let mpi = self.injected();
            let line = |who: &str, a: &[u64], b: &[u64]| {
                let d: Vec<String> = a.iter().zip(b).map(|(x, y)| (y - x).to_string()).collect();
                format!("{who} {}\n", d.join(","))
            };
            self.save(
                &format!("bytes-{coll}.txt"),
                &(line("ringcast", &before, &rc) + &line("mpi", &rc, &mpi)),
            )?;
        }
        Ok(())
    }
}
