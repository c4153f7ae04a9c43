//! Bootstrap: every launcher's variables, precedence, bad settings, and real rendezvous of
//! ranks as threads on 127.0.0.1.

use ringcast::bootstrap::{
    DERIVED_PORT_BASE, DERIVED_PORT_SPAN, EnvError, JobEnv, Launcher, MAX_WORLD_SIZE, PeerTable,
    Rendezvous, RendezvousAddr, RendezvousError,
};
use std::net::{Ipv4Addr, TcpListener};
use std::time::Duration;

fn job(vars: &[(&str, &str)]) -> Result<JobEnv, EnvError> {
    JobEnv::from_lookup(|k| {
        vars.iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| (*v).to_owned())
    })
}

fn ok(vars: &[(&str, &str)]) -> JobEnv {
    job(vars).unwrap_or_else(|e| panic!("{vars:?}: {e}"))
}

/// (launcher, rank, size, local rank, rendezvous `host:port`).
fn summary(j: &JobEnv) -> (Launcher, u32, u32, Option<u32>, Option<String>) {
    (
        j.launcher,
        j.rank,
        j.world_size,
        j.local_rank,
        j.rendezvous.as_ref().map(ToString::to_string),
    )
}

const TORCHRUN: &[(&str, &str)] = &[
    ("RANK", "5"),
    ("WORLD_SIZE", "8"),
    ("LOCAL_RANK", "1"),
    ("LOCAL_WORLD_SIZE", "4"),
    ("MASTER_ADDR", "node7"),
    ("MASTER_PORT", "29500"),
    ("TORCHELASTIC_RUN_ID", "abc"),
];

/// Open MPI 4.1 (Debian's openmpi-bin), one host, as `mpirun -np 2 env` prints them.
const OPEN_MPI: &[(&str, &str)] = &[
    ("OMPI_COMM_WORLD_RANK", "1"),
    ("OMPI_COMM_WORLD_SIZE", "2"),
    ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
    ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
    ("OMPI_MCA_ess_base_jobid", "1913913345"),
    ("OMPI_MCA_orte_num_nodes", "1"),
    ("PMIX_NAMESPACE", "1913913345"),
    ("PMIX_RANK", "1"),
];

const MPICH: &[(&str, &str)] = &[
    ("PMI_RANK", "3"),
    ("PMI_SIZE", "4"),
    ("MPI_LOCALRANKID", "1"),
    ("MPI_LOCALNRANKS", "2"),
    ("PMI_FD", "9"),
];

const MVAPICH: &[(&str, &str)] = &[
    ("MV2_COMM_WORLD_RANK", "2"),
    ("MV2_COMM_WORLD_SIZE", "3"),
    ("MV2_COMM_WORLD_LOCAL_RANK", "0"),
];

const SLURM: &[(&str, &str)] = &[
    ("SLURM_PROCID", "6"),
    ("SLURM_NTASKS", "8"),
    ("SLURM_NPROCS", "8"),
    ("SLURM_STEP_NUM_TASKS", "8"),
    ("SLURM_LOCALID", "2"),
    ("SLURM_STEP_NODELIST", "gpu[007-010],cpu1"),
    ("SLURM_JOB_ID", "4242"),
    ("SLURM_STEP_ID", "1"),
];

fn with(
    base: &[(&'static str, &'static str)],
    more: &[(&'static str, &'static str)],
) -> Vec<(&'static str, &'static str)> {
    let mut v: Vec<_> = base
        .iter()
        .filter(|(k, _)| !more.iter().any(|(m, _)| m == k))
        .copied()
        .collect();
    v.extend_from_slice(more);
    v
}

#[test]
fn each_launcher_parses() {
    let explicit = ok(&[
        ("RINGCAST_RANK", "2"),
        ("RINGCAST_WORLD_SIZE", "4"),
        ("RINGCAST_LOCAL_RANK", "0"),
        ("RINGCAST_BOOTSTRAP", "10.0.0.1:29600"),
    ]);
    assert_eq!(
        summary(&explicit),
        (
            Launcher::Explicit,
            2,
            4,
            Some(0),
            Some("10.0.0.1:29600".into())
        )
    );

    // torchrun: MASTER_PORT is torch's store; ringcast takes the next port.
    let t = ok(TORCHRUN);
    assert_eq!(
        summary(&t),
        (
            Launcher::Torchrun,
            5,
            8,
            Some(1),
            Some("node7:29501".into())
        )
    );
    assert_eq!(t.local_size, Some(4));
    assert_eq!(t.job_id.as_deref(), Some("abc"));

    // Open MPI on one host: loopback and a port from the job id.
    let o = ok(OPEN_MPI);
    let r = o.rendezvous.clone().expect("rendezvous");
    assert_eq!(
        (o.launcher, o.rank, o.world_size, o.local_rank),
        (Launcher::OpenMpi, 1, 2, Some(1))
    );
    assert_eq!(r.host, "127.0.0.1");
    assert!((DERIVED_PORT_BASE..DERIVED_PORT_BASE + DERIVED_PORT_SPAN).contains(&r.port));
    assert_eq!(o.job_id.as_deref(), Some("1913913345"));
    assert_eq!(r.origin, "OMPI_MCA_ess_base_jobid");
    // Open MPI 5 (PRRTE) sets PMIX_NAMESPACE alone: messages name it.
    let prrte: Vec<_> = OPEN_MPI
        .iter()
        .filter(|(k, _)| *k != "OMPI_MCA_ess_base_jobid")
        .copied()
        .collect();
    let p = ok(&prrte).rendezvous.expect("rendezvous");
    assert_eq!((p.port, p.origin), (r.port, "PMIX_NAMESPACE"));
    // Every rank of the job derives the same port; another job another one.
    let other_rank = ok(&with(
        OPEN_MPI,
        &[
            ("OMPI_COMM_WORLD_RANK", "0"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "0"),
        ],
    ));
    assert_eq!(other_rank.rendezvous, o.rendezvous);
    let other_job = ok(&with(
        OPEN_MPI,
        &[("OMPI_MCA_ess_base_jobid", "1913913346")],
    ));
    assert_ne!(other_job.rendezvous, o.rendezvous);
    assert_ne!(other_job.job_key(), o.job_key());

    // MPICH and MVAPICH2 give no rendezvous address: RINGCAST_BOOTSTRAP.
    let m = ok(&with(MPICH, &[("RINGCAST_BOOTSTRAP", "head:7000")]));
    assert_eq!(
        summary(&m),
        (Launcher::Mpich, 3, 4, Some(1), Some("head:7000".into()))
    );
    let v = ok(&with(MVAPICH, &[("RINGCAST_BOOTSTRAP", "[fd00::1]:7000")]));
    assert_eq!(
        summary(&v),
        (
            Launcher::Mvapich,
            2,
            3,
            Some(0),
            Some("[fd00::1]:7000".into())
        )
    );

    // Slurm: first host of the step, a port from job and step ids.
    let s = ok(SLURM);
    let port = DERIVED_PORT_BASE
        + u16::try_from((4242 * 67 + 1) % u32::from(DERIVED_PORT_SPAN)).expect("port");
    assert_eq!(
        summary(&s),
        (
            Launcher::Slurm,
            6,
            8,
            Some(2),
            Some(format!("gpu007:{port}"))
        )
    );
    assert_eq!(s.job_id.as_deref(), Some("4242.1"));
    assert_eq!(s.timeout, Duration::from_secs(30));
}

#[test]
fn precedence() {
    // RINGCAST_ over torchrun over Open MPI over MPICH over MVAPICH2 over Slurm.
    let explicit = [("RINGCAST_RANK", "0"), ("RINGCAST_WORLD_SIZE", "1")];
    let layers: [&[(&str, &str)]; 6] = [&explicit, TORCHRUN, OPEN_MPI, MPICH, MVAPICH, SLURM];
    let expected = [
        Launcher::Explicit,
        Launcher::Torchrun,
        Launcher::OpenMpi,
        Launcher::Mpich,
        Launcher::Mvapich,
        Launcher::Slurm,
    ];
    for (i, want) in expected.iter().enumerate() {
        let vars: Vec<_> = layers[i..].iter().flat_map(|l| l.iter().copied()).collect();
        let vars = with(&vars, &[("RINGCAST_BOOTSTRAP", "h:1")]);
        assert_eq!(ok(&vars).launcher, *want, "layers from {i}");
    }
}

#[test]
fn mpirun_inside_a_slurm_allocation_is_open_mpi() {
    // Every rank inherits the allocation's SLURM_PROCID=0; the Open MPI rank wins.
    let vars = with(
        OPEN_MPI,
        &[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_ID", "77"),
        ],
    );
    let j = ok(&vars);
    assert_eq!((j.launcher, j.rank), (Launcher::OpenMpi, 1));
    assert_eq!(j.rendezvous.expect("loopback").host, "127.0.0.1");
}

/// `srun --mpi=pmi2` sets PMI's rank and size beside Slurm's: the same ranks, and the step's
/// node list to meet at, make it Slurm's job, not Hydra's (which would find no rendezvous on
/// several hosts). PMI ranks that are not Slurm's (Hydra's mpirun inside an allocation) stay
/// MPICH's.
#[test]
fn srun_with_pmi_variables_is_slurm() {
    let pmi2 = with(
        SLURM,
        &[("PMI_RANK", "6"), ("PMI_SIZE", "8"), ("PMI_FD", "7")],
    );
    let j = ok(&pmi2);
    assert_eq!((j.launcher, j.rank, j.world_size), (Launcher::Slurm, 6, 8));
    assert_eq!(j.job_id.as_deref(), Some("4242.1"));
    assert_eq!(j.rendezvous.expect("rendezvous").host, "gpu007");
    let mpich = |r| {
        matches!(
            r,
            Err(EnvError::NoRendezvous {
                launcher: Launcher::Mpich,
                ..
            })
        )
    };
    let hydra = with(SLURM, &[("PMI_RANK", "3"), ("PMI_SIZE", "8")]);
    assert!(mpich(job(&hydra)));
    let no_list: Vec<_> = pmi2
        .iter()
        .copied()
        .filter(|(k, _)| *k != "SLURM_STEP_NODELIST")
        .collect();
    assert!(mpich(job(&no_list)));
}

/// torchrun's default `--rdzv-id` is `none`, shared by every job started without one: it is
/// no job id.
#[test]
fn torchrun_s_default_run_id_is_no_job_id() {
    let none = with(TORCHRUN, &[("TORCHELASTIC_RUN_ID", "none")]);
    let j = ok(&none);
    assert_eq!((j.job_id.as_deref(), j.job_key()), (None, 0));
    let named = ok(&with(TORCHRUN, &[("TORCHELASTIC_RUN_ID", "run7")]));
    assert_eq!(named.job_id.as_deref(), Some("run7"));
}

#[test]
fn bootstrap_variable_overrides_any_launcher() {
    for base in [TORCHRUN, OPEN_MPI, SLURM] {
        let j = ok(&with(base, &[("RINGCAST_BOOTSTRAP", "10.1.2.3:4000")]));
        let r = j.rendezvous.expect("rendezvous");
        assert_eq!(
            (r.host.as_str(), r.port, r.origin),
            ("10.1.2.3", 4000, "RINGCAST_BOOTSTRAP")
        );
    }
}

#[test]
fn single_rank_needs_no_rendezvous() {
    let j = ok(&[("OMPI_COMM_WORLD_RANK", "0"), ("OMPI_COMM_WORLD_SIZE", "1")]);
    assert_eq!(j.rendezvous, None);
    let table = j.exchange(b"me").expect("table");
    assert_eq!(table.peers.len(), 1);
    assert_eq!(table.peers[0].control, b"me");
    assert_eq!(j.interface().expect("loopback").addr, Ipv4Addr::LOCALHOST);
}

#[test]
fn other_settings() {
    let j = ok(&with(
        TORCHRUN,
        &[
            ("RINGCAST_IFNAME", "^docker,lo"),
            ("RINGCAST_BOOTSTRAP_TIMEOUT", "2.5"),
        ],
    ));
    let f = j.ifname.expect("filter");
    assert!(f.matches("eth0") && !f.matches("lo"));
    assert_eq!(j.timeout, Duration::from_millis(2500));
    // Empty values count as unset.
    let j = ok(&with(
        TORCHRUN,
        &[("RINGCAST_IFNAME", ""), ("RINGCAST_RANK", " ")],
    ));
    assert_eq!((j.launcher, j.ifname), (Launcher::Torchrun, None));
}

/// Every bad setting is an error whose message names the variable to set.
#[test]
fn bad_settings_name_the_variable() {
    let cases: Vec<(Vec<(&str, &str)>, &str)> = vec![
        (vec![], "RINGCAST_RANK"),
        (vec![("PATH", "/bin")], "RINGCAST_RANK"),
        (vec![("RINGCAST_RANK", "0")], "RINGCAST_WORLD_SIZE"),
        (vec![("RINGCAST_WORLD_SIZE", "2")], "RINGCAST_RANK"),
        (
            vec![("RINGCAST_RANK", "x"), ("RINGCAST_WORLD_SIZE", "2")],
            "RINGCAST_RANK",
        ),
        (
            vec![("RINGCAST_RANK", "-1"), ("RINGCAST_WORLD_SIZE", "2")],
            "RINGCAST_RANK",
        ),
        (
            vec![("RINGCAST_RANK", "2"), ("RINGCAST_WORLD_SIZE", "2")],
            "RINGCAST_RANK",
        ),
        (
            vec![("RINGCAST_RANK", "0"), ("RINGCAST_WORLD_SIZE", "0")],
            "RINGCAST_WORLD_SIZE",
        ),
        (
            vec![("RINGCAST_RANK", "0"), ("RINGCAST_WORLD_SIZE", "2")],
            "RINGCAST_BOOTSTRAP",
        ),
        // A local rank is below the world size, even with no local size to check it against
        // (u32::MAX is the rendezvous' "unknown").
        (
            vec![
                ("RINGCAST_RANK", "0"),
                ("RINGCAST_WORLD_SIZE", "2"),
                ("RINGCAST_LOCAL_RANK", "2"),
                ("RINGCAST_BOOTSTRAP", "127.0.0.1:1"),
            ],
            "RINGCAST_LOCAL_RANK",
        ),
        (
            vec![
                ("RINGCAST_RANK", "0"),
                ("RINGCAST_WORLD_SIZE", "2"),
                ("RINGCAST_LOCAL_RANK", "4294967295"),
                ("RINGCAST_BOOTSTRAP", "127.0.0.1:1"),
            ],
            "RINGCAST_LOCAL_RANK",
        ),
        (
            with(MVAPICH, &[("MV2_COMM_WORLD_LOCAL_RANK", "3")]),
            "MV2_COMM_WORLD_LOCAL_RANK",
        ),
        (
            vec![
                ("RINGCAST_RANK", "0"),
                ("RINGCAST_WORLD_SIZE", "2"),
                ("RINGCAST_BOOTSTRAP", "nohost"),
            ],
            "RINGCAST_BOOTSTRAP",
        ),
        (
            vec![
                ("RINGCAST_RANK", "0"),
                ("RINGCAST_WORLD_SIZE", "2"),
                ("RINGCAST_BOOTSTRAP", "h:99999"),
            ],
            "RINGCAST_BOOTSTRAP",
        ),
        (with(TORCHRUN, &[("WORLD_SIZE", "")]), "WORLD_SIZE"),
        (with(TORCHRUN, &[("RANK", "8")]), "RANK"),
        // A typo, not a job: over the rank limit.
        (
            with(TORCHRUN, &[("WORLD_SIZE", "4294967295")]),
            "WORLD_SIZE",
        ),
        (with(TORCHRUN, &[("LOCAL_RANK", "4")]), "LOCAL_RANK"),
        (
            with(TORCHRUN, &[("LOCAL_WORLD_SIZE", "9")]),
            "LOCAL_WORLD_SIZE",
        ),
        (with(TORCHRUN, &[("MASTER_ADDR", "")]), "MASTER_ADDR"),
        (with(TORCHRUN, &[("MASTER_PORT", "")]), "MASTER_PORT"),
        (with(TORCHRUN, &[("MASTER_PORT", "http")]), "MASTER_PORT"),
        (
            with(TORCHRUN, &[("MASTER_PORT", "65535")]),
            "RINGCAST_BOOTSTRAP",
        ),
        (
            with(TORCHRUN, &[("RINGCAST_IFNAME", "^")]),
            "RINGCAST_IFNAME",
        ),
        (
            with(TORCHRUN, &[("RINGCAST_BOOTSTRAP_TIMEOUT", "soon")]),
            "RINGCAST_BOOTSTRAP_TIMEOUT",
        ),
        (
            with(TORCHRUN, &[("RINGCAST_BOOTSTRAP_TIMEOUT", "-1")]),
            "RINGCAST_BOOTSTRAP_TIMEOUT",
        ),
        (
            // Positive, but rounds to a zero `Duration`: rank 0 would give up at once.
            with(TORCHRUN, &[("RINGCAST_BOOTSTRAP_TIMEOUT", "1e-10")]),
            "RINGCAST_BOOTSTRAP_TIMEOUT",
        ),
        (
            // Longer than any deadline an `Instant` holds.
            with(TORCHRUN, &[("RINGCAST_BOOTSTRAP_TIMEOUT", "1e19")]),
            "RINGCAST_BOOTSTRAP_TIMEOUT",
        ),
        (
            with(OPEN_MPI, &[("OMPI_COMM_WORLD_SIZE", "")]),
            "OMPI_COMM_WORLD_SIZE",
        ),
        (
            with(OPEN_MPI, &[("OMPI_COMM_WORLD_LOCAL_SIZE", "3")]),
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ),
        // Several hosts: no address to derive.
        (
            with(
                OPEN_MPI,
                &[
                    ("OMPI_COMM_WORLD_SIZE", "4"),
                    ("OMPI_MCA_orte_num_nodes", "2"),
                ],
            ),
            "RINGCAST_BOOTSTRAP",
        ),
        (MPICH.to_vec(), "RINGCAST_BOOTSTRAP"),
        (with(MPICH, &[("PMI_SIZE", "four")]), "PMI_SIZE"),
        (MVAPICH.to_vec(), "RINGCAST_BOOTSTRAP"),
        (with(SLURM, &[("SLURM_NTASKS", "")]), "SLURM_NTASKS"),
        (
            with(SLURM, &[("SLURM_STEP_NUM_TASKS", "4")]),
            "SLURM_NTASKS",
        ),
        (with(SLURM, &[("SLURM_LOCALID", "x")]), "SLURM_LOCALID"),
        (
            with(SLURM, &[("SLURM_STEP_NODELIST", "")]),
            "RINGCAST_BOOTSTRAP",
        ),
        (
            with(SLURM, &[("SLURM_STEP_NODELIST", "gpu[1-")]),
            "RINGCAST_BOOTSTRAP",
        ),
        (with(SLURM, &[("SLURM_JOB_ID", "")]), "RINGCAST_BOOTSTRAP"),
    ];
    for (vars, var) in cases {
        let e = match job(&vars) {
            Ok(j) => panic!("{vars:?}: accepted as {j:?}"),
            Err(e) => e,
        };
        assert_eq!(e.variable(), var, "{vars:?}: {e}");
        let text = e.to_string();
        assert!(text.contains(&format!("set {var}")), "{vars:?}: {text}");
    }
}

fn addr(port: u16) -> RendezvousAddr {
    RendezvousAddr {
        host: "127.0.0.1".into(),
        port,
        origin: "RINGCAST_BOOTSTRAP",
    }
}

/// A joiner whose time runs out while rank 0 is not there names the host it could not
/// reach, not its resolver: the lookup on its last try is not cut to the few microseconds
/// left, where "localhost" would have seemed to hang.
#[test]
fn a_joiner_out_of_time_blames_the_absent_rank_0_not_the_resolver() {
    let closed = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let at = RendezvousAddr {
        host: "localhost".into(),
        port: closed,
        origin: "RINGCAST_BOOTSTRAP",
    };
    let mut r = Rendezvous::new(1, 2, at);
    r.timeout = Duration::ZERO;
    match r.join(b"127.0.0.1:1") {
        Err(RendezvousError::Unreachable { addr, .. }) => assert!(addr.contains("localhost")),
        other => panic!("{other:?}"),
    }
}

/// Rank 0 serves on a listener bound to port 0; ranks `1..n` (listed in `joiners`, world size
/// `sizes[i]`) join as threads. Returns rank 0's result and every joiner's.
fn meet(
    n: u32,
    joiners: &[(u32, u32)],
    timeout: Duration,
) -> (
    Result<PeerTable, RendezvousError>,
    Vec<Result<PeerTable, RendezvousError>>,
) {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::scope(|s| {
        let handles: Vec<_> = joiners
            .iter()
            .map(|&(rank, size)| {
                s.spawn(move || {
                    let mut r = Rendezvous::new(rank, size, addr(port));
                    r.local_rank = Some(rank % 2);
                    r.timeout = timeout;
                    r.run(format!("control of {rank}").as_bytes())
                })
            })
            .collect();
        let mut root = Rendezvous::new(0, n, addr(port));
        root.timeout = timeout;
        let table = root.serve(listener, b"control of 0");
        let joined = handles
            .into_iter()
            .map(|h| h.join().expect("no panic"))
            .collect();
        (table, joined)
    })
}

#[test]
fn four_ranks_meet_and_agree_on_one_nonce() {
    let (root, joined) = meet(4, &[(3, 4), (1, 4), (2, 4)], Duration::from_secs(20));
    let root = root.expect("rank 0");
    assert_eq!(root.peers.len(), 4);
    for (rank, p) in (0u32..).zip(&root.peers) {
        assert_eq!(p.rank, rank);
        assert_eq!(p.control, format!("control of {rank}").as_bytes());
    }
    assert_eq!(root.peers[3].local_rank, Some(1));
    assert_eq!(root.peers[0].local_rank, None);
    for j in joined {
        assert_eq!(j.expect("joined"), root);
    }
}

#[test]
fn joiners_retry_until_rank_0_listens() {
    // Reserve a port, free it, start the joiners, then rank 0.
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let tables: Vec<PeerTable> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..3u32)
            .map(|rank| {
                s.spawn(move || {
                    if rank == 0 {
                        std::thread::sleep(Duration::from_millis(300));
                    }
                    let mut r = Rendezvous::new(rank, 3, addr(port));
                    r.timeout = Duration::from_secs(20);
                    r.run(&[rank as u8])
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("no panic").expect("met"))
            .collect()
    });
    assert!(tables.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn a_missing_rank_times_out_naming_it() {
    let (root, joined) = meet(6, &[(1, 6), (2, 6), (4, 6)], Duration::from_secs(1));
    let e = root.expect_err("ranks 3 and 5 never come");
    match &e {
        RendezvousError::Timeout { missing, .. } => assert_eq!(missing, &[3, 5]),
        other => panic!("{other}"),
    }
    let text = e.to_string();
    assert!(text.contains("for ranks [3, 5] at 127.0.0.1:"), "{text}");
    assert!(text.contains("same RINGCAST_BOOTSTRAP?"), "{text}");
    // The ranks that came hear why, rather than waiting for their own deadline.
    for j in joined {
        let text = j.expect_err("failed job").to_string();
        assert!(text.contains("ranks [3, 5]"), "{text}");
    }
}

#[test]
fn nobody_listening_is_a_clear_error() {
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let mut r = Rendezvous::new(1, 2, addr(port));
    r.timeout = Duration::from_millis(300);
    let text = r.run(b"").expect_err("no rank 0").to_string();
    assert!(
        text.contains("could not connect to the rendezvous at 127.0.0.1:"),
        "{text}"
    );
    assert!(text.contains("RINGCAST_BOOTSTRAP"), "{text}");
}

/// A rendezvous host given by name is looked up (on a helper thread, within the timeout) and
/// met at, as an address is.
#[test]
fn a_rendezvous_host_given_by_name_is_met_at() {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = port_of(&listener);
    std::thread::scope(|s| {
        let root = serve(s, 2, listener, Duration::from_secs(10));
        let mut by_name = addr(port);
        by_name.host = "localhost".into();
        let mut r = Rendezvous::new(1, 2, by_name);
        r.timeout = Duration::from_secs(10);
        let table = r.run(b"control of 1").expect("met");
        assert_eq!(root.join().expect("no panic").expect("met"), table);
    });
}

/// A hello as `Rendezvous::join` sends it (wire.rs): `RCBS`, version 2, rank, world size, no
/// local rank, job key, control blob.
fn raw_hello(rank: u32, world: u32, job_key: u64, control: &[u8]) -> Vec<u8> {
    let mut h = b"RCBS\x00\x02".to_vec();
    h.extend_from_slice(&rank.to_be_bytes());
    h.extend_from_slice(&world.to_be_bytes());
    h.extend_from_slice(&u32::MAX.to_be_bytes());
    h.extend_from_slice(&job_key.to_be_bytes());
    h.extend_from_slice(&(control.len() as u32).to_be_bytes());
    h.extend_from_slice(control);
    h
}

/// Rank 0 of `n` ranks serving on `listener` in a thread of `s`, waiting up to `timeout`.
fn serve<'s>(
    s: &'s std::thread::Scope<'s, '_>,
    n: u32,
    listener: TcpListener,
    timeout: Duration,
) -> std::thread::ScopedJoinHandle<'s, Result<PeerTable, RendezvousError>> {
    s.spawn(move || {
        let mut root = Rendezvous::new(0, n, addr(port_of(&listener)));
        root.timeout = timeout;
        root.serve(listener, b"control of 0")
    })
}

fn port_of(l: &TcpListener) -> u16 {
    l.local_addr().expect("addr").port()
}

/// `rank` of `size` joining at `port` with `control of {rank}`.
fn joiner(rank: u32, size: u32, port: u16) -> Result<PeerTable, RendezvousError> {
    let mut r = Rendezvous::new(rank, size, addr(port));
    r.timeout = Duration::from_secs(10);
    r.run(format!("control of {rank}").as_bytes())
}

/// Ranks `1..n` join at `port` as threads; every one must get `root`'s table.
fn the_rest_meet(n: u32, port: u16) -> Vec<PeerTable> {
    std::thread::scope(|s| {
        let handles: Vec<_> = (1..n)
            .map(|rank| s.spawn(move || joiner(rank, n, port)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("no panic").expect("met"))
            .collect()
    })
}

/// One process started with the wrong world size is refused at once, with a message naming the
/// variable to fix; rank 0 goes on waiting, and the job's own ranks meet. (Rank 0 used to fail
/// the whole rendezvous, and every correct rank with it.)
#[test]
fn a_hello_with_another_world_size_is_refused_and_the_job_goes_on() {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = port_of(&listener);
    std::thread::scope(|s| {
        let root = serve(s, 3, listener, Duration::from_secs(10));
        let e = joiner(2, 5, port).expect_err("refused");
        assert!(matches!(e, RendezvousError::Refused { .. }), "{e}");
        let text = e.to_string();
        // Refused, not failed, and rank 0's reason follows.
        assert!(text.contains("refused by rank 0: rank 2 (from"), "{text}");
        assert!(!text.contains("failed"), "{text}");
        assert!(
            text.contains("says the world has 5 ranks, rank 0 says 3"),
            "{text}"
        );
        assert!(text.contains("RINGCAST_WORLD_SIZE"), "{text}");
        assert!(text.contains("OMPI_COMM_WORLD_SIZE"), "{text}");
        let tables = the_rest_meet(3, port);
        let root = root.join().expect("no panic").expect("the job met");
        assert_eq!(root.peers[2].control, b"control of 2");
        assert!(tables.iter().all(|t| *t == root));
    });
}

/// A rank of the job (the same job key as rank 0) that says the world has another size means
/// the ranks of one launch disagree: the job cannot meet as started, so rank 0 fails at once,
/// naming both sizes and the variable to set, and tells the ranks waiting (joined, or with
/// their hello still to be read) why. It used to refuse each such rank and wait out its
/// whole timeout. (A hello with no job key may be another job's: see the test above.)
#[test]
fn a_rank_of_the_job_with_another_world_size_fails_the_rendezvous_at_once() {
    use std::io::Read;
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = port_of(&listener);
    std::thread::scope(|s| {
        let root = s.spawn(move || {
            let mut root = Rendezvous::new(0, 3, addr(port));
            root.job_key = 9;
            // Failing without the fix takes this long; passing takes none of it.
            root.timeout = Duration::from_secs(5);
            root.serve(listener, b"control of 0")
        });
        let mut waiting = raw_join_of_job(port, 1, 3, 9, b"control of 1");
        let e = rank_2_of_a_5_rank_world_is_refused(port);
        assert!(matches!(e, RendezvousError::Refused { .. }), "{e}");
        let text = e.to_string();
        assert!(
            text.contains("says the world has 5 ranks, rank 0 says 3"),
            "{text}"
        );
        let e = root
            .join()
            .expect("no panic")
            .expect_err("the job cannot meet");
        match &e {
            RendezvousError::WorldSizeMismatch {
                rank, theirs, ours, ..
            } => assert_eq!((*rank, *theirs, *ours), (2, 5, 3)),
            other => panic!("{other}"),
        }
        let text = e.to_string();
        assert!(text.contains("RINGCAST_WORLD_SIZE"), "{text}");
        assert!(text.contains("WORLD_SIZE / OMPI_COMM_WORLD_SIZE"), "{text}");
        // Rank 1 hears why (a refusal: status 1 after the 6-byte header) rather than a
        // closed connection or its own timeout.
        waiting
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut reply = Vec::new();
        waiting.read_to_end(&mut reply).expect("reply");
        assert_eq!(reply.get(6), Some(&1), "{reply:?}");
        let told = String::from_utf8_lossy(&reply);
        assert!(
            told.contains("says the world has 5 ranks, rank 0 says 3"),
            "{told}"
        );
    });
}

/// Rank 0 of a `world`-rank job of key 9, served on `listener` (30 s to meet).
fn rank_0_of_job_9(world: u32, listener: TcpListener) -> Result<PeerTable, RendezvousError> {
    let mut root = Rendezvous::new(0, world, addr(port_of(&listener)));
    root.job_key = 9;
    root.timeout = Duration::from_secs(30);
    root.serve(listener, b"control of 0")
}

/// Rank 2 of job 9 saying the world has 5 ranks: refused (and the job failed with it); the
/// refusal.
fn rank_2_of_a_5_rank_world_is_refused(port: u16) -> RendezvousError {
    let mut wrong = Rendezvous::new(2, 5, addr(port));
    wrong.job_key = 9;
    wrong.timeout = Duration::from_secs(5);
    wrong.run(b"control of 2").expect_err("refused")
}

/// After the job failed at once (a world size mismatch), rank 0 stays a moment to tell the
/// ranks that come late why (a rank of another job still hears that it is one), and leaves as
/// soon as every rank of its world has been told: the late rank does not retry a closed port
/// until its own timeout.
#[test]
fn ranks_that_come_after_the_job_failed_hear_why() {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = port_of(&listener);
    std::thread::scope(|s| {
        let root = s.spawn(move || rank_0_of_job_9(4, listener));
        let _waiting = raw_join_of_job(port, 1, 4, 9, b"control of 1");
        rank_2_of_a_5_rank_world_is_refused(port);
        // Another job's rank, then this job's rank 3, late.
        let mut stray = Rendezvous::new(3, 4, addr(port));
        stray.job_key = 7;
        stray.timeout = Duration::from_secs(5);
        let text = stray.run(b"stray").expect_err("refused").to_string();
        assert!(text.contains("belongs to another job"), "{text}");
        let mut late = Rendezvous::new(3, 4, addr(port));
        late.job_key = 9;
        // Without rank 0 telling it, it would retry the closed port this long and time out
        // (another error).
        late.timeout = Duration::from_secs(30);
        let e = late.run(b"control of 3").expect_err("refused");
        assert!(matches!(e, RendezvousError::Refused { .. }), "{e}");
        let text = e.to_string();
        assert!(
            text.contains("the job failed") && text.contains("says the world has 5 ranks"),
            "{text}"
        );
        let got = root.join().expect("no panic");
        assert!(
            matches!(got, Err(RendezvousError::WorldSizeMismatch { rank: 2, .. })),
            "{got:?}"
        );
    });
}

/// A rank of the job whose hello is still coming when the job fails (its bytes read in part,
/// or not yet read) hears why at once, and counts as told: rank 0, with every rank of its
/// world told, leaves at once rather than lingering out the whole time for it (ten minutes
/// here, so that a rank 0 that lingers is told apart without timing anything close).
#[test]
fn a_rank_halfway_through_its_hello_when_the_job_failed_counts_as_told() {
    use std::io::{Read, Write};
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = port_of(&listener);
    // Not scoped: a rank 0 that lingers must not hold the test for its ten minutes.
    let (done, left) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut root = Rendezvous::new(0, 3, addr(port_of(&listener)));
        root.job_key = 9;
        root.timeout = Duration::from_secs(30);
        root.linger = Duration::from_secs(600);
        let _ = done.send(root.serve(listener, b"control of 0"));
    });
    // Rank 1's hello but its last byte: its rank and job key are there.
    let hello = raw_hello(1, 3, 9, b"control of 1");
    let mut halfway = std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).expect("connect");
    halfway.write_all(&hello[..hello.len() - 1]).expect("hello");
    std::thread::sleep(Duration::from_millis(300));
    rank_2_of_a_5_rank_world_is_refused(port);
    let got = left
        .recv_timeout(Duration::from_secs(120))
        .expect("rank 0 left once every rank was told, not after its linger");
    assert!(
        matches!(got, Err(RendezvousError::WorldSizeMismatch { rank: 2, .. })),
        "{got:?}"
    );
    halfway
        .set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut reply = Vec::new();
    let _ = halfway.read_to_end(&mut reply);
    assert_eq!(reply.get(6), Some(&1), "{reply:?}");
    let told = String::from_utf8_lossy(&reply);
    assert!(told.contains("the job failed"), "{told}");
}

/// A rank number beyond the world it agrees on is refused and named as such (not as a world
/// size mismatch: "says the world has 2 ranks, rank 0 says 2"); the job goes on.
#[test]
fn a_rank_outside_the_world_is_refused_and_the_job_goes_on() {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = port_of(&listener);
    std::thread::scope(|s| {
        let root = serve(s, 2, listener, Duration::from_secs(10));
        let text = joiner(5, 2, port).expect_err("refused").to_string();
        assert!(
            text.contains("rank 5 (from") && text.contains("2-rank job"),
            "{text}"
        );
        assert!(text.contains("RINGCAST_RANK"), "{text}");
        let tables = the_rest_meet(2, port);
        let root = root.join().expect("no panic").expect("the job met");
        assert_eq!(tables, [root]);
    });
}

/// A second hello for a rank already joined is refused and the first kept: the first is the
/// one rank 0 may already have told about (and the second, a stray or a misnumbered process,
/// is told why at once). The job goes on with the first.
#[test]
fn a_second_claim_to_a_rank_is_refused_and_the_first_kept() {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = port_of(&listener);
    std::thread::scope(|s| {
        let root = serve(s, 3, listener, Duration::from_secs(10));
        // Its hello is whole before the second claimant connects, so rank 0 reads it first.
        let first = raw_join(port, 1, 3, b"first");
        let text = joiner(1, 3, port).expect_err("refused").to_string();
        assert!(text.contains("rank 1 joined twice"), "{text}");
        assert!(text.contains("keeps the first"), "{text}");
        let rank2 = joiner(2, 3, port).expect("met");
        let root = root.join().expect("no panic").expect("the job met");
        assert_eq!(root.peers[1].control, b"first");
        assert_eq!(rank2, root);
        drop(first);
    });
}

/// Connects to rank 0 at `port` and sends a whole hello (before returning, so that rank 0
/// reads the hellos sent this way in the order they were sent).
fn raw_join(port: u16, rank: u32, world: u32, control: &[u8]) -> std::net::TcpStream {
    raw_join_of_job(port, rank, world, 0, control)
}

/// [`raw_join`] with job key `job_key`.
fn raw_join_of_job(
    port: u16,
    rank: u32,
    world: u32,
    job_key: u64,
    control: &[u8],
) -> std::net::TcpStream {
    use std::io::Write;
    let mut s = std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).expect("connect");
    s.write_all(&raw_hello(rank, world, job_key, control))
        .expect("hello");
    s
}

/// A rank whose process went away after its hello (killed, restarted by its launcher) can
/// join again: its first connection is closed, so the second claim takes the slot rather than
/// being refused in favour of a process that can never take the table.
#[test]
fn a_rank_whose_first_claim_left_can_join_again() {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = port_of(&listener);
    std::thread::scope(|s| {
        let root = serve(s, 3, listener, Duration::from_secs(10));
        drop(raw_join(port, 1, 3, b"gone"));
        let again = raw_join(port, 1, 3, b"again");
        let rank2 = joiner(2, 3, port).expect("met");
        let root = root.join().expect("no panic").expect("the job met");
        assert_eq!(root.peers[1].control, b"again");
        assert_eq!(rank2, root);
        drop(again);
    });
}

/// A rank that left after its hello is not handed to the others in the table: once every rank
/// has joined, rank 0 drops the ones whose connection closed and waits for them again.
///
/// Three ranks, the one that leaves closing before the last arrives: with two, rank 0 could
/// take the leaver's hello and hand out the table before its close came (a rank that leaves
/// after the table went is what no rendezvous can see), and the test failed now and then
/// under load.
#[test]
fn a_rank_that_left_before_the_table_is_waited_for_again() {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = port_of(&listener);
    std::thread::scope(|s| {
        let root = serve(s, 3, listener, Duration::from_secs(10));
        drop(raw_join(port, 1, 3, b"gone"));
        let rank2 = s.spawn(move || joiner(2, 3, port));
        let rank1 = joiner(1, 3, port).expect("met");
        let root = root.join().expect("no panic").expect("the job met");
        assert_eq!(root.peers[1].control, b"control of 1");
        assert_eq!(rank1, root);
        assert_eq!(rank2.join().expect("no panic").expect("met"), root);
    });
    // If it never comes back, the timeout says why it is missing.
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = port_of(&listener);
    std::thread::scope(|s| {
        let root = serve(s, 3, listener, Duration::from_secs(2));
        drop(raw_join(port, 1, 3, b"gone"));
        let rank2 = s.spawn(move || joiner(2, 3, port));
        let text = root
            .join()
            .expect("no panic")
            .expect_err("gone")
            .to_string();
        assert!(text.contains("for ranks [1]"), "{text}");
        assert!(
            text.contains("closed its connection before the table"),
            "{text}"
        );
        assert!(
            rank2.join().expect("no panic").is_err(),
            "rank 2 met without rank 1"
        );
    });
}

/// When the rank a refused hello claimed never comes, rank 0's timeout names it as missing and
/// says which hello was refused, and why.
#[test]
fn a_refused_hello_is_named_when_its_rank_never_comes() {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = port_of(&listener);
    std::thread::scope(|s| {
        let root = serve(s, 2, listener, Duration::from_secs(2));
        joiner(1, 3, port).expect_err("refused");
        let e = root
            .join()
            .expect("no panic")
            .expect_err("rank 1 never came");
        match &e {
            RendezvousError::Timeout { missing, .. } => assert_eq!(missing, &[1]),
            other => panic!("{other}"),
        }
        let text = e.to_string();
        assert!(text.contains("Refused meanwhile: rank 1 (from"), "{text}");
        assert!(
            text.contains("says the world has 3 ranks, rank 0 says 2"),
            "{text}"
        );
    });
}

/// `RINGCAST_JOB_ID` names the job for any launcher (one with no job id of its own, as
/// `RINGCAST_*` alone or Hydra, has only it): jobs with different ids get different keys,
/// and refuse each other at the rendezvous.
#[test]
fn ringcast_job_id_names_the_job_for_any_launcher() {
    const EXPLICIT: &[(&str, &str)] = &[
        ("RINGCAST_RANK", "1"),
        ("RINGCAST_WORLD_SIZE", "2"),
        ("RINGCAST_BOOTSTRAP", "head:7000"),
    ];
    assert_eq!(ok(EXPLICIT).job_key(), 0, "no id, no key");
    let a = ok(&with(EXPLICIT, &[("RINGCAST_JOB_ID", "a")]));
    let b = ok(&with(EXPLICIT, &[("RINGCAST_JOB_ID", "b")]));
    assert_eq!(a.job_id.as_deref(), Some("a"));
    assert_ne!(a.job_key(), 0);
    assert_ne!(a.job_key(), b.job_key());
    assert_eq!(
        ok(&with(EXPLICIT, &[("RINGCAST_JOB_ID", " ")])).job_key(),
        0
    );
    let o1 = ok(&with(OPEN_MPI, &[("RINGCAST_JOB_ID", "a")]));
    let o2 = ok(&with(
        OPEN_MPI,
        &[
            ("RINGCAST_JOB_ID", "a"),
            ("OMPI_MCA_ess_base_jobid", "1913913346"),
        ],
    ));
    // Beside a launcher's own id it is added, not put in its place: two launches that
    // export one value stay apart.
    assert_eq!(
        o1.job_id.as_deref(),
        Some("1913913345/a"),
        "{:?}",
        o1.job_id
    );
    assert_ne!(o1.job_key(), o2.job_key());
    assert_ne!(o1.job_key(), ok(OPEN_MPI).job_key());
}

#[test]
fn another_jobs_rank_is_refused_and_the_job_goes_on() {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::scope(|s| {
        let root = s.spawn(move || {
            let mut root = Rendezvous::new(0, 2, addr(port));
            root.job_key = 9;
            root.serve(listener, b"root")
        });
        let mut stranger = Rendezvous::new(1, 2, addr(port));
        stranger.job_key = 7;
        let text = stranger.run(b"stranger").expect_err("refused").to_string();
        assert!(text.contains("refused by rank 0: rank 1 from"), "{text}");
        assert!(text.contains("belongs to another job"), "{text}");
        let mut member = Rendezvous::new(1, 2, addr(port));
        member.job_key = 9;
        let table = member.run(b"member").expect("met");
        assert_eq!(root.join().expect("no panic").expect("met"), table);
        assert_eq!(table.peers[1].control, b"member");
    });
}

/// torch elastic does not synchronise `TORCHELASTIC_RESTART_COUNT` between agents: after one
/// node's workers restart, the ranks of one round may see different counts. They are one job.
#[test]
fn torchrun_ranks_with_different_restart_counts_meet() {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = listener.local_addr().expect("addr").port();
    // ringcast listens on MASTER_PORT + 1.
    let master_port = (port - 1).to_string();
    let env = |rank: &'static str, restarts: &'static str| {
        ok(&[
            ("RANK", rank),
            ("WORLD_SIZE", "2"),
            ("LOCAL_RANK", "0"),
            ("LOCAL_WORLD_SIZE", "1"),
            ("MASTER_ADDR", "127.0.0.1"),
            ("MASTER_PORT", &master_port),
            ("TORCHELASTIC_RUN_ID", "run42"),
            ("TORCHELASTIC_RESTART_COUNT", restarts),
            ("RINGCAST_BOOTSTRAP_TIMEOUT", "20"),
        ])
    };
    let (node_a, node_b) = (env("0", "1"), env("1", "0"));
    assert_eq!(node_a.job_key(), node_b.job_key());
    std::thread::scope(|s| {
        let b = s.spawn(|| Rendezvous::for_job(&node_b).expect("rdzv").run(b"b"));
        let a = Rendezvous::for_job(&node_a)
            .expect("rdzv")
            .serve(listener, b"a")
            .expect("rank 0");
        assert_eq!(b.join().expect("no panic").expect("rank 1"), a);
    });
}

/// A world over the rank limit (a mistyped size) is refused before either side waits or holds
/// anything for its ranks; a world at the limit waits as usual.
#[test]
fn a_world_over_the_rank_limit_is_refused_at_once() {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let mut root = Rendezvous::new(0, MAX_WORLD_SIZE + 1, addr(port));
    root.timeout = Duration::from_secs(1);
    let e = root.serve(listener, b"r").expect_err("over the limit");
    assert!(matches!(e, RendezvousError::TooManyRanks(_)), "{e}");
    assert!(e.to_string().contains("limit of 1048576"), "{e}");

    let mut member = Rendezvous::new(1, u32::MAX, addr(port));
    member.timeout = Duration::from_secs(1);
    let e = member.run(b"m").expect_err("over the limit");
    assert!(matches!(e, RendezvousError::TooManyRanks(_)), "{e}");

    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let mut root = Rendezvous::new(0, MAX_WORLD_SIZE, addr(port));
    root.timeout = Duration::from_millis(300);
    match root.serve(listener, b"r").expect_err("nobody joins") {
        RendezvousError::Timeout { missing, .. } => {
            assert_eq!(missing.len() as u32, MAX_WORLD_SIZE - 1);
        }
        e => panic!("{e}"),
    }
}

#[test]
fn a_stray_client_does_not_break_the_rendezvous() {
    use std::io::Write;
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let mut stray = std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).expect("connect");
    stray.write_all(b"GET / HTTP/1.0\r\n\r\n").expect("write");
    std::thread::scope(|s| {
        let member = s.spawn(move || Rendezvous::new(1, 2, addr(port)).run(b"m"));
        let table = Rendezvous::new(0, 2, addr(port))
            .serve(listener, b"r")
            .expect("met");
        assert_eq!(member.join().expect("no panic").expect("met"), table);
    });
}

/// Connections that say nothing (a port scanner's connect scan, a health check) queued ahead of
/// a real rank do not hold it up: rank 0 reads hellos from every connection at once. (Read one
/// at a time, each idle one held rank 0 for five seconds, six of them more than the timeout.)
#[test]
fn idle_connections_do_not_hold_up_a_rank_behind_them() {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let idle: Vec<_> = (0..6)
        .map(|_| std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).expect("connect"))
        .collect();
    std::thread::scope(|s| {
        let member = s.spawn(move || {
            let mut r = Rendezvous::new(1, 2, addr(port));
            r.timeout = Duration::from_secs(20);
            r.run(b"m")
        });
        let mut root = Rendezvous::new(0, 2, addr(port));
        root.timeout = Duration::from_secs(20);
        let table = root.serve(listener, b"r").expect("rank 1 came");
        assert_eq!(member.join().expect("no panic").expect("met"), table);
    });
    drop(idle);
}

/// A connection still silent when rank 0 gives up is named as such in the timeout.
#[test]
fn an_idle_connection_is_named_in_the_timeout() {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let idle = std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).expect("connect");
    let local = idle.local_addr().expect("addr");
    let mut root = Rendezvous::new(0, 2, addr(port));
    root.timeout = Duration::from_secs(1);
    let text = root
        .serve(listener, b"r")
        .expect_err("rank 1 never comes")
        .to_string();
    assert!(
        text.contains(&format!("{local} (sent no hello within")),
        "{text}"
    );
}

/// Writes `bytes` to `s` one a second until done or `stop` (the reader gave up): whether it
/// wrote them all.
fn trickle(mut s: std::net::TcpStream, bytes: &[u8], stop: &std::sync::atomic::AtomicBool) -> bool {
    use std::io::Write;
    use std::sync::atomic::Ordering;
    for b in bytes {
        if stop.load(Ordering::Relaxed) || s.write_all(&[*b]).is_err() {
            return false;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    true
}

/// A client that trickles a hello a byte a second (a minute's worth) does not keep rank 0
/// past its deadline, nor does a flood of silent connections, and the timeout's message
/// stays short however many it refused.
#[test]
fn trickling_and_flooding_clients_do_not_keep_rank_0_past_its_deadline() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let trickler = s.spawn(|| {
            let c = std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).expect("connect");
            trickle(c, &[b'R'; 60], &stop)
        });
        let flood = s.spawn(|| {
            let mut held = Vec::new();
            for _ in 0..3000 {
                if stop.load(Ordering::Relaxed) {
                    return false;
                }
                if let Ok(c) = std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)) {
                    held.push(c);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            true
        });
        let mut root = Rendezvous::new(0, 2, addr(port));
        root.timeout = Duration::from_secs(2);
        let e = root.serve(listener, b"r").expect_err("nobody joins");
        stop.store(true, Ordering::Relaxed);
        assert!(
            !trickler.join().expect("no panic"),
            "rank 0 waited for the whole trickle"
        );
        assert!(
            !flood.join().expect("no panic"),
            "rank 0 waited for the whole flood"
        );
        assert!(matches!(e, RendezvousError::Timeout { .. }), "{e}");
        let text = e.to_string();
        assert!(text.len() < 4096, "{} bytes: {text}", text.len());
    });
}

/// A rank that starts long before rank 0 waits for the table as long as rank 0 may take, not
/// only until its own deadline: with one timeout everywhere and ranks started seconds apart
/// (imports take seconds), rank 1 (at 0 s) once gave up at 8 s (its deadline and the grace)
/// while rank 0 (at 4 s, deadline 10 s) completed at 9 s with it in the table when rank 2 came.
/// Whatever the timing, rank 0 and rank 1 agree.
#[test]
fn an_early_rank_waits_as_long_as_rank_0_may() {
    let timeout = Duration::from_secs(6);
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let start = |rank: u32, after: Duration| {
        std::thread::sleep(after);
        let mut r = Rendezvous::new(rank, 3, addr(port));
        r.timeout = timeout;
        r.run(&[rank as u8])
    };
    let (root, one) = std::thread::scope(|s| {
        let one = s.spawn(|| start(1, Duration::ZERO));
        let two = s.spawn(|| start(2, Duration::from_secs(9)));
        let root = start(0, Duration::from_secs(4));
        let _ = two.join().expect("no panic");
        (root, one.join().expect("no panic"))
    });
    match (root, one) {
        (Ok(root), Ok(one)) => assert_eq!(root, one),
        (Err(_), Err(_)) => {}
        (root, one) => panic!("rank 0 and rank 1 disagree: {root:?}\n{one:?}"),
    }
}

/// A joining rank whose rank 0 trickles the table a byte a second gives up at its deadline.
#[test]
fn a_trickled_reply_does_not_keep_a_rank_past_its_deadline() {
    use std::io::Read;
    use std::sync::atomic::{AtomicBool, Ordering};
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        let fake = s.spawn(|| {
            let (mut c, _) = listener.accept().expect("accept");
            let mut hello = [0u8; 64];
            let _ = c.read(&mut hello);
            // "RCBS", version 2, status table, then a minute of the rest.
            let mut reply = b"RCBS\x00\x02\x00".to_vec();
            reply.resize(60, 0);
            trickle(c, &reply, &stop)
        });
        let mut member = Rendezvous::new(1, 2, addr(port));
        member.timeout = Duration::from_secs(1);
        let e = member.run(b"m").expect_err("no table in time");
        stop.store(true, Ordering::Relaxed);
        assert!(
            !fake.join().expect("no panic"),
            "the rank waited for the whole trickle"
        );
        assert!(matches!(e, RendezvousError::NoReply { .. }), "{e}");
    });
}

#[test]
fn rendezvous_that_is_not_ours_is_named() {
    // Something else (torch's store, say) listens where RINGCAST_BOOTSTRAP points.
    use std::io::{Read, Write};
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let server = std::thread::spawn(move || {
        if let Ok((mut s, _)) = listener.accept() {
            let mut buf = [0u8; 64];
            let _ = s.read(&mut buf);
            let _ = s.write_all(b"HTTP/1.0 400 Bad Request\r\n\r\n");
        }
    });
    let text = Rendezvous::new(1, 2, addr(port))
        .run(b"x")
        .expect_err("not ours")
        .to_string();
    assert!(
        text.contains("does not speak ringcast's rendezvous"),
        "{text}"
    );
    server.join().expect("no panic");
}

/// A rendezvous that closes the connection without an answer is not reported as a refusal
/// (it gave no reason): the message says so and points at rank 0's log.
#[test]
fn a_connection_closed_without_an_answer_is_not_called_a_refusal() {
    use std::io::Read;
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let port = port_of(&listener);
    let server = std::thread::spawn(move || {
        if let Ok((mut s, _)) = listener.accept() {
            let mut buf = [0u8; 64];
            let _ = s.read(&mut buf);
        }
    });
    let mut r = Rendezvous::new(1, 2, addr(port));
    r.timeout = Duration::from_secs(10);
    let e = r.run(b"x").expect_err("closed");
    assert!(
        matches!(e, RendezvousError::ClosedWithoutAnswer { .. }),
        "{e}"
    );
    let text = e.to_string();
    assert!(
        text.contains("closed the connection without an answer"),
        "{text}"
    );
    assert!(!text.contains("refused"), "{text}");
    server.join().expect("no panic");
}

#[test]
fn interface_defaults() {
    // One node: every task is local, and a host name for this host keeps loopback.
    let one = ok(&with(SLURM, &[("SLURM_STEP_NODELIST", "localhost")]));
    assert!(one.single_host());
    assert_eq!(one.interface().expect("loopback").addr, Ipv4Addr::LOCALHOST);
    // Several nodes meeting at `localhost`: written as loopback, so loopback is kept, as for
    // CommBuilder::rendezvous (it took the interface routed toward multicast). A host name that
    // resolves to loopback here (Debian's 127.0.1.1) is kept off it: see the unit tests of
    // bootstrap::job_interface.
    let many = ok(&with(SLURM, &[("SLURM_STEP_NODELIST", "localhost,node2")]));
    assert!(!many.single_host());
    assert_eq!(
        many.interface().expect("loopback").addr,
        Ipv4Addr::LOCALHOST
    );
    // An IP literal is taken at its word.
    let literal = ok(&with(SLURM, &[("RINGCAST_BOOTSTRAP", "127.0.0.1:5000")]));
    assert_eq!(
        literal.interface().expect("loopback").addr,
        Ipv4Addr::LOCALHOST
    );
    // RINGCAST_IFNAME decides.
    let named = ok(&with(SLURM, &[("RINGCAST_IFNAME", "=lo")]));
    assert_eq!(named.interface().expect("lo").name, "lo");
    let none = ok(&with(SLURM, &[("RINGCAST_IFNAME", "=no-such-if0")]));
    let text = none.interface().expect_err("no such interface").to_string();
    assert!(text.contains("set RINGCAST_IFNAME"), "{text}");
}

/// The committed seeds of the `bootstrap` fuzz target are the messages they are named for
/// (a format change that leaves them stale fails here, not silently in the fuzzer).
#[test]
fn the_bootstrap_fuzz_seeds_parse() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/bootstrap");
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).expect("seed directory") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("")
            .to_owned();
        if !name.starts_with("seed-") {
            continue;
        }
        let data = std::fs::read(&path).expect("seed");
        let (&world, msg) = data.split_first().expect("not empty");
        let (hello, reply) = ringcast::fuzzing::bootstrap_wire(msg, u32::from(world));
        let report = ringcast::fuzzing::startup_report(&data);
        let want = if name.starts_with("seed-hello") {
            hello
        } else if name.starts_with("seed-report") {
            report
        } else {
            reply
        };
        assert!(want, "{name} does not parse as what it is named for");
        seen += 1;
    }
    assert!(seen >= 5, "{seen} seeds");
}

/// A second process started as rank 0 finds the rendezvous port taken by the first: the
/// message names that cause and the variables, not only "address in use".
#[test]
fn a_second_rank_0_is_told_it_may_be_a_duplicate() {
    let first = TcpListener::bind((Ipv4Addr::UNSPECIFIED, 0)).expect("bind");
    let port = first.local_addr().expect("addr").port();
    let addr = RendezvousAddr {
        host: "127.0.0.1".into(),
        port,
        origin: "RINGCAST_BOOTSTRAP",
    };
    let e = Rendezvous::new(0, 2, addr)
        .run(b"127.0.0.1:1")
        .expect_err("the port is taken");
    assert!(matches!(e, RendezvousError::Bind { .. }), "{e:?}");
    let msg = e.to_string();
    assert!(
        msg.contains("two processes were started as rank 0") && msg.contains("RINGCAST_RANK"),
        "{msg}"
    );
}
