//! `ringcast bootstrap` as separate processes, started the way srun, torchrun and mpirun start
//! ranks (their variables set by hand, or Open MPI's mpirun when it is installed): every rank
//! gets the same table and nonce.

use std::net::{Ipv4Addr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const RANKS: u32 = 4;

/// Starts `ringcast bootstrap --json` with only `vars` in its environment.
fn spawn(vars: &[(String, String)]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_ringcast"))
        .args(["bootstrap", "--json"])
        .env_clear()
        .env("RINGCAST_BOOTSTRAP_TIMEOUT", "20")
        .envs(vars.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the binary runs")
}

/// Waits for every child (killing them past a minute) and returns their JSON reports.
fn reports(children: Vec<Child>) -> Vec<serde_json::Value> {
    let deadline = Instant::now() + Duration::from_secs(60);
    children
        .into_iter()
        .map(|mut c| {
            while c.try_wait().expect("wait").is_none() {
                if Instant::now() > deadline {
                    let _ = c.kill();
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let out = c.wait_with_output().expect("output");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{:?}: {err}", out.status);
            serde_json::from_slice(&out.stdout).expect("JSON report")
        })
        .collect()
}

/// Every rank reports the same peers and nonce, and its own rank.
fn check(reports: &[serde_json::Value], launcher: &str) {
    let first = &reports[0];
    for (rank, r) in reports.iter().enumerate() {
        assert_eq!(r["rank"], rank, "{r}");
        assert_eq!(r["world_size"], RANKS, "{r}");
        assert_eq!(r["launcher"], launcher, "{r}");
        assert_eq!(r["nonce"], first["nonce"], "{r}");
        assert_eq!(r["peers"], first["peers"], "{r}");
    }
    let peers = first["peers"].as_array().expect("peers");
    assert_eq!(peers.len(), RANKS as usize);
    for (rank, p) in peers.iter().enumerate() {
        assert_eq!(p["rank"], rank, "{p}");
        let control = p["control"].as_str().expect("control");
        assert!(
            control.parse::<std::net::SocketAddrV4>().is_ok(),
            "{control}"
        );
    }
}

/// A port in `range` that is free now, starting the search at a place that differs between
/// test runs.
fn free_port_in(range: std::ops::Range<u16>) -> u16 {
    let span = range.end - range.start;
    let first = u16::try_from(std::process::id() % u32::from(span)).expect("below span");
    (0..span)
        .map(|i| range.start + (first + i) % span)
        .find(|&p| TcpListener::bind((Ipv4Addr::UNSPECIFIED, p)).is_ok())
        .expect("a free port")
}

#[test]
fn srun_style_variables() {
    use ringcast::bootstrap::{DERIVED_PORT_BASE, DERIVED_PORT_SPAN};
    // Pick the job and step ids whose derived port is free here.
    let port = free_port_in(DERIVED_PORT_BASE..DERIVED_PORT_BASE + DERIVED_PORT_SPAN);
    let offset = u32::from(port - DERIVED_PORT_BASE);
    // A job id that is a multiple of the span adds nothing, so the step id is the offset.
    let (job, step) = (u32::from(DERIVED_PORT_SPAN), offset);
    let children = (0..RANKS)
        .map(|rank| {
            spawn(&[
                ("SLURM_PROCID".into(), rank.to_string()),
                ("SLURM_NTASKS".into(), RANKS.to_string()),
                ("SLURM_LOCALID".into(), rank.to_string()),
                ("SLURM_STEP_NODELIST".into(), "localhost,node[2-4]".into()),
                ("SLURM_JOB_ID".into(), job.to_string()),
                ("SLURM_STEP_ID".into(), step.to_string()),
            ])
        })
        .collect();
    let reports = reports(children);
    check(&reports, "slurm");
    assert_eq!(reports[0]["rendezvous"], format!("localhost:{port}"));
    assert_eq!(reports[2]["peers"][3]["local_rank"], 3);
}

#[test]
fn torchrun_style_variables_leave_master_port_to_torch() {
    // torch's TCPStore holds MASTER_PORT for the whole run; ringcast must not need it.
    let (store, master_port) = loop {
        let store = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).expect("bind");
        let port = store.local_addr().expect("addr").port();
        if port < u16::MAX && TcpListener::bind((Ipv4Addr::UNSPECIFIED, port + 1)).is_ok() {
            break (store, port);
        }
    };
    let children = (0..RANKS)
        .map(|rank| {
            spawn(&[
                ("RANK".into(), rank.to_string()),
                ("WORLD_SIZE".into(), RANKS.to_string()),
                ("LOCAL_RANK".into(), rank.to_string()),
                ("LOCAL_WORLD_SIZE".into(), RANKS.to_string()),
                ("MASTER_ADDR".into(), "127.0.0.1".into()),
                ("MASTER_PORT".into(), master_port.to_string()),
                ("TORCHELASTIC_RUN_ID".into(), "test".into()),
            ])
        })
        .collect();
    let reports = reports(children);
    check(&reports, "torchrun");
    assert_eq!(
        reports[1]["rendezvous"],
        format!("127.0.0.1:{}", master_port + 1)
    );
    drop(store);
}

#[test]
fn a_bad_setting_is_reported_by_name() {
    let out = Command::new(env!("CARGO_BIN_EXE_ringcast"))
        .arg("bootstrap")
        .env_clear()
        .envs([("RANK", "4"), ("WORLD_SIZE", "4")])
        .output()
        .expect("the binary runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("set RANK to a rank in 0..4"), "{err}");
}

/// A value that is not UTF-8 is named in the error, not taken for unset: the same rank
/// without `RINGCAST_RANK` would report a missing variable instead.
#[test]
fn a_value_that_is_not_utf8_is_reported_by_name() {
    use std::os::unix::ffi::OsStrExt as _;
    let out = Command::new(env!("CARGO_BIN_EXE_ringcast"))
        .arg("bootstrap")
        .env_clear()
        .env("RINGCAST_RANK", std::ffi::OsStr::from_bytes(b"\xff1"))
        .env("RINGCAST_WORLD_SIZE", "2")
        .output()
        .expect("the binary runs");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("RINGCAST_RANK") && err.contains("number"),
        "{err}"
    );
}

/// Under Debian's openmpi-bin, when it is installed (issue 8's CI installs it).
#[test]
#[expect(clippy::print_stderr, reason = "a skipped test says so")]
fn under_open_mpi_mpirun() {
    let Ok(version) = Command::new("mpirun").arg("--version").output() else {
        eprintln!("skipped: no mpirun on PATH (apt-get install openmpi-bin)");
        return;
    };
    if !String::from_utf8_lossy(&version.stdout).contains("Open MPI") {
        eprintln!("skipped: mpirun is not Open MPI's");
        return;
    }
    let child = Command::new("mpirun")
        .args(["--allow-run-as-root", "--oversubscribe", "-np"])
        .arg(RANKS.to_string())
        .arg(env!("CARGO_BIN_EXE_ringcast"))
        .args(["bootstrap", "--json"])
        .env("RINGCAST_BOOTSTRAP_TIMEOUT", "20")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("mpirun runs");
    let out = reports_of(child);
    // One JSON line per rank, in any order.
    let mut reports: Vec<serde_json::Value> = String::from_utf8_lossy(&out)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    reports.sort_by_key(|r| r["rank"].as_u64());
    check(&reports, "openmpi");
}

/// mpirun's stdout, after it exits successfully within a minute.
fn reports_of(mut child: Child) -> Vec<u8> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("output");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {err}", out.status);
    out.stdout
}
