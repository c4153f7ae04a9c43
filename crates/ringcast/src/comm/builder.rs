//! [`CommBuilder`]: everything explicit, or read from the launcher's environment.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::Duration;

use ringcast_core::port::Port;
use ringcast_core::wire::CONTROL_MAX_LEN;
use ringcast_core::{Config, MAX_TIMEOUT, Node};
use ringcast_transport_rocev2_udp::MAX_CHUNK_PAYLOAD;
use ringcast_transport_rocev2_udp::addr::{AddrConfig, JobAddrs, McastPrefix, ROCEV2_PORT};
use ringcast_transport_rocev2_udp::{
    ControlConfig, Registry, SocketConfig, TcpControl, UdpPort, UdpPortConfig,
};

use super::Communicator;
use super::blame::Blame;
use super::engine::{Engine, PostTx};
use super::error::BuildError;
use super::fallback::{self, FallbackConfig, FallbackReason, TransportMode};
use super::probe::{self, PROBE_LEN, ProbeSetup};
use super::split::{Builds, Lineage};
use super::track::{TrackedControl, TrackedTx};
use crate::bootstrap::{
    self, BootstrapError, EnvError, IfnameFilter, JobEnv, Launcher, PeerTable, Rendezvous,
    RendezvousAddr,
};

/// How long the fast path may see no chunk before it is stalled (see `build`). Measured in
/// the namespace lab (4 ranks on 2 cores, 16 MiB-per-rank Allgathers, nothing lost): at 5 ms,
/// 4-34 MB per rank were fetched over TCP while the multicast still brought them (a
/// descheduled root or receive worker); at 10 ms, with the receive workers answering a look
/// only after the batch queued on their socket, 1 run in 4 fetched (4.5 MB) and 3 none; at
/// 20 ms none, but a lost last chunk then waits 20 ms for its recovery.
const STALL: Duration = Duration::from_millis(10);
/// Posts that may wait for the engine before `post` blocks.
const POST_QUEUE: usize = 64;
/// The smallest chunk size taken: a start-up check's datagram must fit in one chunk.
const MIN_CHUNK: u32 = PROBE_LEN as u32;

/// What to do when multicast does not work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fallback {
    /// Fail (the default): a failed start-up check is a [`BuildError::MulticastUnreachable`].
    #[default]
    Off,
    /// Run a TCP ring Allgather(v) / chain (or, up to 256 KiB, binomial-tree) Broadcast instead,
    /// from the start when the start-up check fails, or from an operation all ranks agree on
    /// when multicast loses more than the threshold during the run
    /// ([`CommBuilder::fallback_loss_threshold`]). [`Communicator::transport_mode`] says which
    /// is in use; see
    /// [the module docs](super#start-up-check-and-tcp-fallback).
    Tcp,
}

impl std::str::FromStr for Fallback {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().to_ascii_lowercase().as_str() {
            "tcp" => Ok(Fallback::Tcp),
            "off" | "none" | "no" | "0" | "" => Ok(Fallback::Off),
            other => Err(format!("{other:?} is not a fallback: use tcp or off")),
        }
    }
}

/// Where the ranks' control addresses come from.
#[derive(Debug)]
enum Peers {
    /// Given: every rank's control address, and the job nonce.
    Table {
        control: Vec<SocketAddr>,
        nonce: u64,
    },
    /// A TCP rendezvous at rank 0 or this address.
    Rendezvous { addr: RendezvousAddr, job_key: u64 },
    /// Read from the launcher's environment.
    Env(Box<JobEnv>),
    /// [`CommBuilder::rendezvous`] was given this, which is no `host:port`.
    BadRendezvous(String),
}

/// Builds a [`Communicator`]: every setting explicit, or [`CommBuilder::from_env`].
///
/// ```no_run
/// use ringcast::Communicator;
/// use std::time::Duration;
/// let comm = Communicator::builder()
///     .rank(1)
///     .world_size(4)
///     .rendezvous("10.0.0.1:29400")
///     .lanes(2)
///     .peer_timeout(Duration::from_secs(5))
///     .build()?;
/// # Ok::<(), ringcast::BuildError>(())
/// ```
#[derive(Debug)]
#[must_use]
pub struct CommBuilder {
    rank: Option<u32>,
    world_size: Option<u32>,
    peers: Option<Peers>,
    listener: Option<TcpListener>,
    interface: Option<Ipv4Addr>,
    /// `None`: chosen from the cores of the ranks' hosts ([`auto_lanes`]).
    lanes: Option<u16>,
    /// `None`: chosen from the cores of the ranks' hosts ([`auto_chains`]).
    chains: Option<u32>,
    chunk_size: Option<u32>,
    udp_port: u16,
    prefix: McastPrefix,
    peer_timeout: Duration,
    /// `None`: [`DEFAULT_POST_TIMEOUT`], or the peer timeout if longer.
    post_timeout: Option<Duration>,
    link_bandwidth: Option<u64>,
    cutoff_alpha: Duration,
    connect_timeout: Duration,
    fallback: Fallback,
    probe_window: Duration,
    loss_threshold: f64,
    verify_icrc: bool,
    /// `None`: by where the ranks are ([`default_tcp_threshold`]).
    tcp_threshold: Option<u64>,
    /// [`job_id`](Self::job_id).
    job_id: Option<String>,
    /// Per rank, the lowest rank of its host, where a split knows them (its parent's); a
    /// given peer table's otherwise go by address.
    hosts: Option<Vec<u32>>,
    /// With `RINGCAST_PIN=1`, the first core of this rank's threads: a split's parent's
    /// (the process's cores); otherwise by the rank's place among its host's ranks.
    pin_base: Option<usize>,
    /// Set by another thread to give the start-up up (a split's parent aborted).
    cancel: Option<Arc<AtomicBool>>,
    /// The peers of a given table bound their listeners before this rank learned of them (a
    /// split's exchange): see [`ControlConfig::listeners_bound`]. A rendezvous's always did.
    table_listening: bool,
    /// A split's: its parent's builds (see [`split_of`](Self::split_of)).
    split_builds: Option<Arc<Builds>>,
}

impl Default for CommBuilder {
    fn default() -> Self {
        CommBuilder {
            rank: None,
            world_size: None,
            peers: None,
            listener: None,
            interface: None,
            lanes: None,
            chains: None,
            chunk_size: None,
            udp_port: ROCEV2_PORT,
            prefix: McastPrefix::ADMIN_SCOPED,
            peer_timeout: Duration::from_secs(5),
            post_timeout: None,
            link_bandwidth: None,
            cutoff_alpha: Duration::from_millis(5),
            connect_timeout: Duration::from_secs(30),
            fallback: Fallback::Off,
            probe_window: Duration::from_secs(2),
            loss_threshold: 0.10,
            verify_icrc: false,
            tcp_threshold: None,
            job_id: None,
            hosts: None,
            pin_base: None,
            cancel: None,
            table_listening: false,
            split_builds: None,
        }
    }
}

fn var(name: &str) -> Option<String> {
    bootstrap::env_var(name).filter(|v| !v.trim().is_empty())
}

/// A duration in seconds as a variable gives it: see [`bootstrap::parse_seconds`] (a plain
/// number, or one with a unit: `500ms`, `3s`).
struct Seconds(f64);

impl std::str::FromStr for Seconds {
    type Err = &'static str;
    fn from_str(v: &str) -> Result<Self, Self::Err> {
        bootstrap::parse_seconds(v)
            .map(Seconds)
            .ok_or("not a duration: give seconds (2.5) or a number with a unit (500ms, 3s, 2min)")
    }
}

fn parse_var<T: std::str::FromStr>(name: &str) -> Result<Option<T>, BuildError>
where
    T::Err: std::fmt::Display,
{
    var(name)
        .map(|v| {
            v.trim().parse::<T>().map_err(|e| BuildError::Invalid {
                setting: format!("{name}={v:?}"),
                why: e.to_string(),
            })
        })
        .transpose()
}

impl CommBuilder {
    /// A builder with defaults: lanes by the cores there are (see [`lanes`](Self::lanes)),
    /// UDP port 4791, groups in 239.0.0.0/8, 5 s peer timeout,
    /// 10 min post timeout, the interface's link speed with 5 ms cutoff slack (see
    /// [`link_bandwidth`](Self::link_bandwidth)), chunks as large as the interface MTU allows
    /// (at most 4 KiB; [`LOOPBACK_CHUNK`] on a loopback: see [`chunk_size`](Self::chunk_size)).
    pub fn new() -> Self {
        Self::default()
    }

    /// Rank, world size and rendezvous from the launcher's variables (see [`crate::bootstrap`]:
    /// `RINGCAST_RANK`/`RINGCAST_WORLD_SIZE`/`RINGCAST_BOOTSTRAP`, torchrun, Open MPI,
    /// MPICH/Hydra, Slurm; `RINGCAST_IFNAME`), plus optional `RINGCAST_PORT` (UDP port),
    /// `RINGCAST_LANES` (a count, or `auto`: see [`lanes`](Self::lanes)), `RINGCAST_CHAINS` (a
    /// count, or `auto`: see [`allgather_chains`](Self::allgather_chains)),
    /// `RINGCAST_CHUNK_SIZE` (bytes), `RINGCAST_LINK_GBPS` (gigabits per second,
    /// see [`link_bandwidth`](Self::link_bandwidth)), `RINGCAST_PEER_TIMEOUT` (seconds, or
    /// with a unit: `500ms`, `3s`, `2min`), `RINGCAST_POST_TIMEOUT` (the same),
    /// `RINGCAST_FALLBACK` (`tcp` or `off`), `RINGCAST_PROBE_WINDOW` (the start-up check's
    /// window, the same; 0 turns it off), `RINGCAST_FALLBACK_LOSS` (fraction, e.g. `0.1`) and
    /// `RINGCAST_VERIFY_ICRC` (`1` checks every datagram's ICRC, see
    /// [`verify_icrc`](Self::verify_icrc)) and `RINGCAST_TCP_THRESHOLD` (bytes, see
    /// [`tcp_threshold`](Self::tcp_threshold); `0` sends every operation to multicast).
    /// Builder calls made afterwards override them, except that the rank and world size stay
    /// the environment's (the rendezvous uses those): [`build`](Self::build) refuses others.
    pub fn from_env() -> Result<Self, BuildError> {
        let job = JobEnv::from_env().map_err(BootstrapError::from)?;
        let mut b = CommBuilder::new().rank(job.rank).world_size(job.world_size);
        if let Some(p) = parse_var::<u16>("RINGCAST_PORT")? {
            b.udp_port = p;
        }
        match var("RINGCAST_LANES") {
            Some(v) if v.trim() == "auto" => b.lanes = None,
            Some(_) => b.lanes = parse_var::<u16>("RINGCAST_LANES")?,
            None => {}
        }
        match var("RINGCAST_CHAINS") {
            Some(v) if v.trim() == "auto" => b.chains = None,
            Some(_) => b.chains = parse_var::<u32>("RINGCAST_CHAINS")?,
            None => {}
        }
        b.chunk_size = parse_var::<u32>("RINGCAST_CHUNK_SIZE")?;
        if let Some(g) = parse_var::<f64>("RINGCAST_LINK_GBPS")? {
            b.link_bandwidth = Some(link_gbps(g).ok_or_else(|| BuildError::Invalid {
                setting: format!("RINGCAST_LINK_GBPS={g}"),
                why: "not a positive number of gigabits per second".into(),
            })?);
        }
        if let Some(t) = parse_var::<Seconds>("RINGCAST_PEER_TIMEOUT")?.map(|s| s.0) {
            b.peer_timeout = Duration::try_from_secs_f64(t).map_err(|e| BuildError::Invalid {
                setting: format!("RINGCAST_PEER_TIMEOUT={t}"),
                why: e.to_string(),
            })?;
        }
        if let Some(t) = parse_var::<Seconds>("RINGCAST_POST_TIMEOUT")?.map(|s| s.0) {
            let t = Duration::try_from_secs_f64(t).map_err(|e| BuildError::Invalid {
                setting: format!("RINGCAST_POST_TIMEOUT={t}"),
                why: e.to_string(),
            })?;
            b.post_timeout = Some(t);
        }
        if let Some(f) = parse_var::<Fallback>("RINGCAST_FALLBACK")? {
            b.fallback = f;
        }
        if let Some(t) = parse_var::<Seconds>("RINGCAST_PROBE_WINDOW")?.map(|s| s.0) {
            b.probe_window = Duration::try_from_secs_f64(t).map_err(|e| BuildError::Invalid {
                setting: format!("RINGCAST_PROBE_WINDOW={t}"),
                why: e.to_string(),
            })?;
        }
        if let Some(l) = parse_var::<f64>("RINGCAST_FALLBACK_LOSS")? {
            b.loss_threshold = l;
        }
        if let Some(t) = parse_var::<u64>("RINGCAST_TCP_THRESHOLD")? {
            b.tcp_threshold = Some(t);
        }
        if let Some(v) = var("RINGCAST_VERIFY_ICRC") {
            b.verify_icrc = match v.trim() {
                "1" | "true" | "on" => true,
                "0" | "false" | "off" => false,
                _ => {
                    return Err(BuildError::Invalid {
                        setting: format!("RINGCAST_VERIFY_ICRC={v:?}"),
                        why: "want 1 or 0".to_owned(),
                    });
                }
            };
        }
        b.connect_timeout = job.timeout;
        b.peers = Some(Peers::Env(Box::new(job)));
        Ok(b)
    }

    /// This process's rank, below the world size.
    pub fn rank(mut self, rank: u32) -> Self {
        self.rank = Some(rank);
        self
    }

    /// Number of ranks.
    pub fn world_size(mut self, n: u32) -> Self {
        self.world_size = Some(n);
        self
    }

    /// Every rank's control address (TCP), by rank, and the job nonce (the same on every
    /// rank; groups and Q_Key derive from it). This rank listens on `control[rank]`, or on
    /// the listener given to [`control_listener`](Self::control_listener).
    pub fn peer_table(mut self, control: Vec<SocketAddr>, nonce: u64) -> Self {
        self.peers = Some(Peers::Table { control, nonce });
        self
    }

    /// A listener already bound to this rank's entry of the peer table (avoids a race for a
    /// port picked with port 0).
    pub fn control_listener(mut self, l: TcpListener) -> Self {
        self.listener = Some(l);
        self
    }

    /// The job's id, as `RINGCAST_JOB_ID` gives it (any string every rank of the job shares,
    /// like NCCL's unique id or torchrun's `--rdzv-id`): ranks of jobs with different ids
    /// refuse each other at the rendezvous, so that two jobs that meet on one port (both
    /// started with [`rendezvous`](Self::rendezvous) to the same `host:port`, or a rank
    /// started with the wrong one) fail with a message saying so instead of mixing. With
    /// [`from_env`](Self::from_env) it is added to the environment's job id (the launcher's),
    /// as `RINGCAST_JOB_ID` is; without one, a [`rendezvous`](Self::rendezvous) job has none
    /// and admits any rank that fits.
    pub fn job_id(mut self, id: &str) -> Self {
        self.job_id = Some(id.to_owned());
        self
    }

    /// Meet the other ranks at `host:port` (rank 0 listens there; like `RINGCAST_BOOTSTRAP`).
    /// Anything else (no port, port 0, not a number) fails [`build`](Self::build) with
    /// [`BuildError::Invalid`].
    pub fn rendezvous(mut self, host_port: &str) -> Self {
        self.peers = Some(match bootstrap::parse_rendezvous(host_port) {
            Ok(mut addr) => {
                addr.origin = "CommBuilder::rendezvous";
                Peers::Rendezvous { addr, job_key: 0 }
            }
            Err(_) => Peers::BadRendezvous(host_port.to_owned()),
        });
        self
    }

    /// Address of the interface multicast leaves and is joined on. With
    /// [`peer_table`](Self::peer_table), the default is this rank's own entry's address
    /// (`127.0.0.1` where that is unspecified, such as `0.0.0.0`). With
    /// [`rendezvous`](Self::rendezvous), the default is the interface the kernel routes toward
    /// the rendezvous host, except that a host that resolves to loopback here but was not
    /// written as loopback (`127.x`, `::1`, `localhost`) is not taken for one: Debian's
    /// /etc/hosts maps a host's own name to 127.0.1.1, which the other hosts cannot reach.
    /// Then the interface `RINGCAST_IFNAME` picks is used, else the one multicast is routed
    /// through, else the only one besides loopback; with several and no route to choose by,
    /// [`build`](Self::build) fails naming `RINGCAST_IFNAME`.
    pub fn interface(mut self, addr: Ipv4Addr) -> Self {
        self.interface = Some(addr);
        self
    }

    /// Multicast lanes (groups): each has a send worker and a receive worker on every rank,
    /// and an operation's chunks are spread over them, so several cores send and receive
    /// one operation at once.
    ///
    /// By default (and with `RINGCAST_LANES=auto`) every rank picks the same count from what
    /// the rendezvous gathered: the cores each rank may run on (its affinity and cgroup
    /// limits), shared among the ranks of its host (one kernel: namespaces included), so
    /// that each rank gets two lanes per core it has to itself (at most its own cores),
    /// between 1 and 4. 4 or 8 ranks on a 16-core host get 4 lanes, 16 ranks get 2, 2 ranks
    /// on a 2-core host 2 and 3 or 4 ranks there 1 (BENCHMARKS.md, twenty-third and
    /// twenty-ninth rounds). The same shares set how many Allgather roots multicast at once:
    /// 2 where some rank has less than a core to itself, 4 otherwise. With an explicit
    /// [`peer_table`](Self::peer_table) there is no exchange to agree by, and the default is
    /// 1 (and 4 roots). Every rank must use the same count: the start-up check refuses a job
    /// that does not.
    pub fn lanes(mut self, lanes: u16) -> Self {
        self.lanes = Some(lanes);
        self
    }

    /// How many Allgather roots multicast at once (the protocol's broadcast chains `M`: the
    /// ring of ranks is cut into that many chains, whose roots take turns along them; at
    /// most the ranks). By default (and with `RINGCAST_CHAINS=auto`) every rank picks the
    /// same from what the rendezvous gathered: 2 where some rank has less than a core to
    /// itself, 4 otherwise (BENCHMARKS.md, twenty-ninth round); 4 with an explicit
    /// [`peer_table`](Self::peer_table). Every rank must use the same count: the start-up
    /// check refuses a job that does not. `0` is refused by [`build`](Self::build).
    pub fn allgather_chains(mut self, chains: u32) -> Self {
        self.chains = Some(chains);
        self
    }

    /// Payload bytes per chunk (one datagram each): at least the start-up check's probe (16
    /// bytes) and at most what fits one UDP datagram with its headers
    /// ([`MAX_CHUNK_PAYLOAD`](ringcast_transport_rocev2_udp::MAX_CHUNK_PAYLOAD), 65 476),
    /// and, where the interface's MTU can be read, at most what one datagram of that MTU
    /// carries (the MTU less 56 bytes of IPv4, UDP and RoCE headers); others are refused by
    /// [`build`](Self::build). By default the largest power of two of at most 4 KiB that the
    /// MTU carries (RoCE's largest path MTU), or on a loopback interface, where no NIC takes
    /// the packets, [`LOOPBACK_CHUNK`] (32 640 bytes: two datagrams to a GSO send).
    pub fn chunk_size(mut self, bytes: u32) -> Self {
        self.chunk_size = Some(bytes);
        self
    }

    /// UDP port of every lane (default 4791).
    pub fn udp_port(mut self, port: u16) -> Self {
        self.udp_port = port;
        self
    }

    /// IPv4 multicast prefix the groups are drawn from (default 239.0.0.0/8).
    pub fn multicast_prefix(mut self, prefix: McastPrefix) -> Self {
        self.prefix = prefix;
        self
    }

    /// How long to wait for a peer that owes an answer before failing the operation (5 s by
    /// default; like `RINGCAST_PEER_TIMEOUT`): a rank that stops answering (hung, cut off)
    /// is named within a few of these. A rank that answers but has not posted the operation
    /// yet is late, not hung: see [`post_timeout`](Self::post_timeout).
    pub fn peer_timeout(mut self, t: Duration) -> Self {
        self.peer_timeout = t;
        self
    }

    /// How long an operation waits for ranks that are alive but have not posted it yet (10
    /// minutes by default, torch's default for NCCL's collectives; like
    /// `RINGCAST_POST_TIMEOUT`, in seconds). One rank loading a checkpoint before a
    /// Broadcast is waited for; past this, the operation fails with
    /// [`CommError::NotPosted`](super::CommError::NotPosted) naming the rank, and so do the
    /// operations queued behind it (see [Failures](super#failures)). At least the peer
    /// timeout; left unset, it follows a peer timeout set longer than 10 minutes.
    pub fn post_timeout(mut self, t: Duration) -> Self {
        self.post_timeout = Some(t);
        self
    }

    /// The post timeout [`build`](Self::build) uses.
    fn post(&self) -> Duration {
        self.post_timeout
            .unwrap_or(DEFAULT_POST_TIMEOUT.max(self.peer_timeout))
    }

    /// Check every received datagram's RoCEv2 ICRC (default off; like `RINGCAST_VERIFY_ICRC`).
    ///
    /// Off because over kernel UDP it adds no integrity: the UDP checksum, which the kernel
    /// verifies before delivering, covers the whole UDP payload (BTH, DETH, the immediate,
    /// the payload), and a datagram that fails it never arrives. A wrong ICRC over a right
    /// checksum comes only from a sender that computes the ICRC wrongly (a forger could
    /// compute it right). The check costs a CRC-32 of every datagram: about 15% of a receive
    /// worker's time in the namespace lab (`perf`, 64 MiB Broadcasts), where the receive
    /// workers are what limits the goodput. Turn it on to count such datagrams as `bad_icrc`
    /// instead of taking them.
    pub fn verify_icrc(mut self, on: bool) -> Self {
        self.verify_icrc = on;
        self
    }

    /// Operations of at most `bytes` (a Broadcast's buffer; an Allgather's whole receive
    /// buffer, every block summed) run over TCP even while multicast works, as NCCL and Open
    /// MPI pick another algorithm for short messages; like `RINGCAST_TCP_THRESHOLD`. 0 sends
    /// every operation to multicast. By default [`DEFAULT_TCP_THRESHOLD`], or
    /// [`ONE_HOST_TCP_THRESHOLD`] where every rank's control address is the same (one host:
    /// no wire for multicast to spare, only copies, so TCP's shorter start wins up to larger
    /// sizes), as NCCL's tuner picks by the node count.
    ///
    /// A multicast operation pays a round of control messages before its data (the barrier
    /// that makes sure every receiver is ready) and one after (the FIN ring): for a few
    /// kilobytes that is most of its time. Over TCP, with no barrier, a Broadcast of one
    /// piece (256 KiB) goes down a binomial tree from its root and an Allgather of one piece
    /// runs Bruck's `ceil(log2 P)` rounds (one message per rank per round); longer ones take
    /// the fallback's paths (a pipelined chain Broadcast; an Allgather down one tree per
    /// block, or around a ring). A second TCP mesh carries them (as with
    /// [`Fallback::Tcp`]), so the engine's control messages never wait behind them. Every
    /// rank must use the same value: the start-up check compares them.
    pub fn tcp_threshold(mut self, bytes: u64) -> Self {
        self.tcp_threshold = Some(bytes);
        self
    }

    /// Link bandwidth in bytes per second: the cutoff timer `N / B + alpha`, and the pacer,
    /// which never sends a lane's multicast faster than four times it (a link reported slower
    /// than the path, such as a veth's, holds no root below what the path carries; a real
    /// NIC's line rate holds it first). By default the interface's
    /// speed as the kernel reports it (`/sys/class/net/<interface>/speed`, as NCCL reads it);
    /// 20 Gbit/s per lane on loopback, whose cost is memory copies on as many cores as there
    /// are lanes, not a line rate; 10 Gbit/s where
    /// the kernel reports none (some virtual devices). `RINGCAST_LINK_GBPS` sets it from the
    /// environment (a veth reports a nominal 10 Gbit/s whatever it carries).
    pub fn link_bandwidth(mut self, bytes_per_sec: u64) -> Self {
        self.link_bandwidth = Some(bytes_per_sec);
        self
    }

    /// The cutoff timer's slack. The fast path also ends only once no chunk came for this
    /// long, or 10 ms if that is longer.
    pub fn cutoff_alpha(mut self, alpha: Duration) -> Self {
        self.cutoff_alpha = alpha;
        self
    }

    /// Bound on the start-up (rendezvous and control mesh).
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }

    /// What to do when multicast does not work (like `RINGCAST_FALLBACK`). Every rank must
    /// choose the same.
    pub fn fallback(mut self, f: Fallback) -> Self {
        self.fallback = f;
        self
    }

    /// How long the start-up check listens for the other ranks' probes (default 2 s; like
    /// `RINGCAST_PROBE_WINDOW`). It ends as soon as every rank heard every other on every
    /// lane. `Duration::ZERO` skips the check (multicast is then assumed to work).
    pub fn startup_check(mut self, window: Duration) -> Self {
        self.probe_window = window;
        self
    }

    /// With [`Fallback::Tcp`]: the fraction of a window of multicast chunks that had to be
    /// fetched by ring recovery above which the communicator switches to TCP (default 0.1;
    /// like `RINGCAST_FALLBACK_LOSS`; 1 or more never switches).
    pub fn fallback_loss_threshold(mut self, fraction: f64) -> Self {
        self.loss_threshold = fraction;
        self
    }

    /// This builder's settings, without a rank, world size, peers, listener or job id: what a
    /// communicator split from the one it builds starts from.
    pub(super) fn clone_settings(&self) -> CommBuilder {
        CommBuilder {
            rank: None,
            world_size: None,
            peers: None,
            listener: None,
            job_id: None,
            hosts: None,
            pin_base: None,
            cancel: None,
            table_listening: false,
            split_builds: None,
            ..*self
        }
    }

    /// Each rank's host color (see `host_colors`), known from a parent (a split).
    pub(super) fn host_colors_of(mut self, hosts: Vec<u32>) -> Self {
        self.hosts = Some(hosts);
        self
    }

    /// The first core this rank's threads take with `RINGCAST_PIN=1`: its parent's (a
    /// split), so that a process's communicators share its cores, never another process's.
    pub(super) fn pin_base_of(mut self, base: usize) -> Self {
        self.pin_base = Some(base);
        self
    }

    /// A split's build, registered in its parent's `builds` under `flag`: the start-up
    /// gives up with [`ControlError::Cancelled`] once the flag is set (the parent aborted, or
    /// lost a member while the control mesh connected), and tells `builds` when the mesh is
    /// up.
    pub(super) fn split_of(mut self, builds: Arc<Builds>, flag: Arc<AtomicBool>) -> Self {
        self.cancel = Some(flag);
        self.split_builds = Some(builds);
        self
    }

    /// The peer table's listeners were all bound before it was handed here (a split's
    /// exchange of them): a peer that refuses a connection is gone, and the start-up fails
    /// at once naming it.
    pub(super) fn table_listening(mut self) -> Self {
        self.table_listening = true;
        self
    }

    /// Connects to the other ranks (every rank calls it at about the same time) and starts
    /// the engine.
    pub fn build(self) -> Result<Communicator, BuildError> {
        let post = self.post();
        let settings = self.clone_settings();
        // Every wait is bounded, so that its deadline can be computed (a week at most).
        for (d, setting) in [
            (self.peer_timeout, "peer timeout (RINGCAST_PEER_TIMEOUT)"),
            (post, "post timeout (RINGCAST_POST_TIMEOUT)"),
            (self.connect_timeout, "CommBuilder::connect_timeout"),
            (self.probe_window, "start-up check (RINGCAST_PROBE_WINDOW)"),
            (self.cutoff_alpha, "CommBuilder::cutoff_alpha"),
        ] {
            if d > MAX_TIMEOUT {
                return Err(BuildError::Invalid {
                    setting: setting.into(),
                    why: format!("{d:?} is longer than the {MAX_TIMEOUT:?} any wait may take"),
                });
            }
        }
        if post < self.peer_timeout {
            return Err(BuildError::Invalid {
                setting: "post timeout (RINGCAST_POST_TIMEOUT)".into(),
                why: format!(
                    "{:?} is shorter than the peer timeout ({:?}, RINGCAST_PEER_TIMEOUT)",
                    post, self.peer_timeout
                ),
            });
        }
        if let Some(c) = self.chunk_size
            && c < MIN_CHUNK
        {
            return Err(BuildError::Invalid {
                setting: "chunk size (RINGCAST_CHUNK_SIZE)".into(),
                why: format!("{c} bytes is below {MIN_CHUNK}, the start-up check's datagram"),
            });
        }
        if let Some(c) = self.chunk_size
            && c as usize > MAX_CHUNK_PAYLOAD
        {
            return Err(BuildError::Invalid {
                setting: "chunk size (RINGCAST_CHUNK_SIZE)".into(),
                why: format!(
                    "{c} bytes is above {MAX_CHUNK_PAYLOAD}: a chunk and its RoCEv2 headers \
                     must fit one UDP datagram"
                ),
            });
        }
        if self.lanes == Some(0) {
            return Err(BuildError::Invalid {
                setting: "lanes (CommBuilder::lanes, RINGCAST_LANES)".into(),
                why: "0 lanes: at least one multicast group is needed".into(),
            });
        }
        if let Some(l) = self.lanes
            && l > MAX_LANES
        {
            return Err(BuildError::Invalid {
                setting: "lanes (CommBuilder::lanes, RINGCAST_LANES)".into(),
                why: format!(
                    "{l} lanes is above {MAX_LANES}: each is a multicast group, two sockets and \
                     two threads on every rank"
                ),
            });
        }
        if self.udp_port == 0 {
            return Err(BuildError::Invalid {
                setting: "UDP port (CommBuilder::udp_port, RINGCAST_PORT)".into(),
                why: "0: the ranks must send to and join one known port".into(),
            });
        }
        if self.peer_timeout.is_zero() {
            return Err(BuildError::Invalid {
                setting: "peer timeout (RINGCAST_PEER_TIMEOUT)".into(),
                why: "0 s: every rank would count as hung at once".into(),
            });
        }
        if self.connect_timeout.is_zero() {
            return Err(BuildError::Invalid {
                setting: "connect timeout (CommBuilder::connect_timeout, \
                          RINGCAST_BOOTSTRAP_TIMEOUT)"
                    .into(),
                why: "0 s: no rank could be met".into(),
            });
        }
        if self.chains == Some(0) {
            return Err(BuildError::Invalid {
                setting: "Allgather chains (CommBuilder::allgather_chains, RINGCAST_CHAINS)".into(),
                why: "0 chains: at least one root must multicast".into(),
            });
        }
        if self.link_bandwidth == Some(0) {
            return Err(BuildError::Invalid {
                setting: "link bandwidth (CommBuilder::link_bandwidth)".into(),
                why: "0 bytes per second: the cutoff timer divides by it".into(),
            });
        }
        if self.loss_threshold.is_nan() || self.loss_threshold < 0.0 {
            return Err(BuildError::Invalid {
                setting: "fallback loss threshold (RINGCAST_FALLBACK_LOSS)".into(),
                why: format!("{} is not a fraction of at least 0", self.loss_threshold),
            });
        }
        let rank = self.rank.ok_or(BuildError::Missing(
            "rank",
            "call CommBuilder::rank, or set RINGCAST_RANK (or run under a launcher)",
        ))?;
        let size = self.world_size.ok_or(BuildError::Missing(
            "world size",
            "call CommBuilder::world_size, or set RINGCAST_WORLD_SIZE",
        ))?;
        if rank >= size {
            return Err(BuildError::Invalid {
                setting: "rank".into(),
                why: format!("rank {rank} is not below the world size {size}"),
            });
        }
        let max_ranks = ringcast_core::Limits::default().max_ranks;
        if size > max_ranks {
            return Err(BuildError::Invalid {
                setting: "world size (RINGCAST_WORLD_SIZE, or the launcher's)".into(),
                why: format!("{size} ranks is above the {max_ranks} a communicator may have"),
            });
        }
        // With fallback = tcp or small operations over TCP, a second TCP mesh.
        let tcp_fallback = self.fallback == Fallback::Tcp && size > 1;
        // Both defaults are above 0.
        let tcp_mesh = tcp_fallback || (self.tcp_threshold != Some(0) && size > 1);
        // Every mesh holds a connection to every peer: make sure this process may open them
        // before meeting anyone (the soft limit is raised as far as the hard one allows).
        // Lanes left to the default: at most what the rendezvous may pick (an explicit peer
        // table, or a job of one rank, gets 1).
        let most_lanes = self.lanes.unwrap_or(
            if size <= 1 || matches!(self.peers, Some(Peers::Table { .. })) {
                1
            } else {
                MAX_AUTO_LANES
            },
        );
        ensure_files(size, 1 + u32::from(tcp_mesh), most_lanes)?;
        let peers = self.peers.ok_or(BuildError::Missing(
            "peers",
            "call CommBuilder::peer_table or CommBuilder::rendezvous, or set RINGCAST_BOOTSTRAP",
        ))?;
        // `by_kernel`: the host colors come from every rank's kernel id (a rendezvous whose
        // entries all carry one), not from addresses.
        // Whether every peer's listener was bound before this rank learned its address.
        let listening =
            matches!(peers, Peers::Rendezvous { .. } | Peers::Env(_)) || self.table_listening;
        let (control, nonce, listener, iface, auto, (hosts, by_kernel)) = match peers {
            Peers::Table { control, nonce } => {
                if control.len() != size as usize {
                    return Err(BuildError::Invalid {
                        setting: "CommBuilder::peer_table".into(),
                        why: format!("{} addresses for {size} ranks", control.len()),
                    });
                }
                let me = control[rank as usize];
                let iface = self.interface.unwrap_or(match me.ip() {
                    IpAddr::V4(a) if !a.is_unspecified() => a,
                    _ => Ipv4Addr::LOCALHOST,
                });
                let listener = match self.listener {
                    Some(l) => l,
                    None => TcpListener::bind(me)
                        .map_err(|source| BuildError::Listen { addr: me, source })?,
                };
                let auto = Auto {
                    lanes: 1,
                    chains: None,
                };
                // No host ids in a given table: those a split's parent knew, or ranks of one
                // address share a host.
                let hosts = match self.hosts {
                    Some(h) if h.len() == control.len() => h,
                    _ => host_colors(control.iter().map(|a| format!("address {}", a.ip()))),
                };
                (control, nonce, listener, iface, auto, (hosts, false))
            }
            Peers::Rendezvous { addr, job_key } => {
                let iface = match self.interface {
                    Some(a) => a,
                    None => route_toward(&addr, self.connect_timeout)?,
                };
                let (listener, blob) = listen(self.listener, iface)?;
                let mut r = Rendezvous::new(rank, size, addr);
                r.job_key = match &self.job_id {
                    Some(id) => bootstrap::job_key_of(Launcher::Explicit, id),
                    None => job_key,
                };
                r.timeout = self.connect_timeout;
                let table = r.run(blob.as_bytes())?;
                let (control, nonce, auto, hosts) = parse_table(&table)?;
                (control, nonce, listener, iface, auto, hosts)
            }
            Peers::BadRendezvous(given) => {
                return Err(BuildError::Invalid {
                    setting: "CommBuilder::rendezvous".into(),
                    why: format!(
                        "{given:?} is not host:port (with a port from 1 to 65535, an IPv6 \
                         address in brackets)"
                    ),
                });
            }
            Peers::Env(mut job) => {
                if let Some(id) = &self.job_id {
                    job.job_id = Some(match job.job_id.take() {
                        Some(theirs) => format!("{theirs}/{id}"),
                        None => id.clone(),
                    });
                }
                // The rendezvous runs with the environment's rank and size, the communicator
                // with these: they must be the same.
                if (job.rank, job.world_size) != (rank, size) {
                    return Err(BuildError::Invalid {
                        setting: "CommBuilder::rank / CommBuilder::world_size".into(),
                        why: format!(
                            "rank {rank} of {size} differs from the environment's rank {} of {} \
                             ({}), which the rendezvous uses: drop the override, or start from \
                             CommBuilder::new()",
                            job.rank, job.world_size, job.launcher
                        ),
                    });
                }
                // From the environment (`RINGCAST_BOOTSTRAP_TIMEOUT`) unless the builder
                // was told otherwise since.
                job.timeout = self.connect_timeout;
                let iface = match self.interface {
                    Some(a) => a,
                    None => job.interface().map_err(BootstrapError::from)?.addr,
                };
                let (listener, blob) = listen(self.listener, iface)?;
                let table = job.exchange(blob.as_bytes())?;
                let (control, nonce, auto, hosts) = parse_table(&table)?;
                (control, nonce, listener, iface, auto, hosts)
            }
        };
        let lanes = self.lanes.unwrap_or(auto.lanes);
        // Whatever path the table came by, one entry per rank (this rank's is indexed below).
        if control.len() != size as usize {
            return Err(BuildError::Invalid {
                setting: "peer table".into(),
                why: format!("{} entries for {size} ranks", control.len()),
            });
        }
        let loopback = interface_of(iface).is_some_and(|(_, lo)| lo);
        let chunk = pick_chunk(self.chunk_size, chunk_room(iface), loopback, iface)?;
        let pin_base = self
            .pin_base
            .unwrap_or_else(|| pin_base(&hosts, by_kernel, rank, lanes));
        let lineage = Lineage {
            settings,
            ip: match control[rank as usize].ip() {
                ip if ip.is_unspecified() => IpAddr::V4(iface),
                ip => ip,
            },
            iface,
            nonce,
            chunk,
            hosts,
            pin_base,
            builds: Arc::default(),
        };
        // Every rank holds the same table, so every rank picks the same default (the start-up
        // check compares them all the same).
        let tcp_threshold = self
            .tcp_threshold
            .unwrap_or_else(|| default_tcp_threshold(&control));
        // The second mesh's listener, on the control address; its address travels in the
        // start-up reports.
        let fb_listener = if tcp_mesh {
            let ip = match control[rank as usize].ip() {
                IpAddr::V4(a) if !a.is_unspecified() => a,
                _ => iface,
            };
            let addr = SocketAddr::from((ip, 0));
            Some(TcpListener::bind(addr).map_err(|source| BuildError::Listen { addr, source })?)
        } else {
            None
        };
        let fb_extra = match &fb_listener {
            Some(l) => l
                .local_addr()
                .map_err(|source| BuildError::Listen {
                    addr: control[rank as usize],
                    source,
                })?
                .to_string()
                .into_bytes(),
            None => Vec::new(),
        };
        let mut cc = ControlConfig::new(nonce);
        // The core splits a recovery read of more into several (see `MAX_READ`). Messages
        // are the core's, the start-up check's reports and the rate reports.
        cc.max_read = MAX_READ;
        cc.max_message = CONTROL_MAX_LEN.max(probe::Report::max_len(lanes.into(), size as usize));
        cc.connect_timeout = self.connect_timeout;
        cc.listeners_bound = listening;
        let cancel = self.cancel.clone().unwrap_or_default();
        let tcp = TcpControl::connect_or_cancel(
            rank,
            &control,
            listener,
            Registry::default(),
            cc,
            &cancel,
        )?;
        // A split's members watch each other on this mesh from now on.
        if let Some(b) = &self.split_builds {
            b.settle(&cancel);
        }
        let pc = UdpPortConfig {
            rank,
            ranks: size,
            lanes,
            nonce,
            addr: AddrConfig {
                prefix: self.prefix,
                port: self.udp_port,
            },
            socket: SocketConfig {
                // Our own datagrams come back only if another rank shares this host (its
                // control address): a rank alone on its host would receive and drop its
                // whole block again. The start-up check catches a host shared through a
                // second address (multicast would not arrive there).
                multicast_loop: control
                    .iter()
                    .enumerate()
                    .any(|(r, a)| r != rank as usize && a.ip() == control[rank as usize].ip()),
                ..SocketConfig::on_interface(iface)
            },
            max_payload: chunk as usize,
            pkey: 0xFFFF,
            gso: true,
            verify_icrc: self.verify_icrc,
        };
        let mut cfg = Config::new(rank, size);
        cfg.limits.max_read = MAX_READ;
        cfg.lanes = lanes;
        if let Some(chains) = self.chains.or(auto.chains) {
            cfg.chains = chains;
        }
        let chains = cfg.chains;
        cfg.chunk_size = chunk;
        cfg.peer_timeout = self.peer_timeout;
        cfg.post_timeout = post;
        let cfg_link = self
            .link_bandwidth
            .unwrap_or_else(|| default_link_bandwidth(iface, lanes));
        cfg.link_bandwidth = cfg_link;
        cfg.cutoff_alpha = self.cutoff_alpha;
        // Kernel UDP on shared cores runs below any configured link rate: end the fast path
        // when it stalls, not when the link rate says it should be over. Stalled means no
        // chunk for STALL (or alpha, if longer): a receive worker or a root on a busy host is
        // descheduled for several ms at a time, and a fast path ended while its chunks were
        // still queued sends them over TCP as well.
        cfg.cutoff_extension = Some(self.cutoff_alpha.max(STALL));
        let node = Node::new(cfg).map_err(BuildError::Config)?;
        let port = UdpPort::open(&pc, tcp)?;
        let p = port.into_ports();
        let (mut rx, mut tx, mut control) = (p.rx, p.tx, p.control);
        // The start-up check: does multicast arrive? (see `probe`).
        let job = JobAddrs::derive(nonce, usize::from(lanes), &pc.addr)
            .map_err(|e| BuildError::Port(e.into()))?;
        let setup = ProbeSetup {
            rank,
            ranks: size,
            lanes,
            groups: (0..usize::from(lanes))
                .filter_map(|l| job.group(l))
                .collect(),
            interface: iface,
            window: self.probe_window,
            report_wait: self.peer_timeout.max(Duration::from_secs(2)),
            fallback_tcp: tcp_fallback,
            tcp_threshold,
            chunk_size: chunk,
            chains,
            extra: fb_extra,
            cancel: Arc::clone(&cancel),
        };
        let ex = match probe::run(&setup, &mut rx, &mut tx, &mut control) {
            Ok(ex) => ex,
            Err(f) => {
                // Flush what this rank owes the others (its report) before leaving, and name
                // the rank it leaves over.
                control.close_blaming(u64::MAX, f.culprit, PROBE_LINGER);
                return Err(f.error);
            }
        };
        let fcfg = FallbackConfig {
            rank,
            size,
            // Without fallback = tcp the mesh only runs small operations: never switch.
            threshold_permille: if tcp_fallback {
                (self.loss_threshold * 1000.0).min(1000.0) as u32
            } else {
                1001
            },
            peer_timeout: self.peer_timeout,
            post_timeout: post,
            piece: fallback::PIECE,
            tcp_threshold,
        };
        if let Some(failure) = ex.failure {
            if !tcp_fallback {
                tracing::error!(rank, "{failure}");
                control.close(u64::MAX, PROBE_LINGER);
                return Err(BuildError::MulticastUnreachable(Box::new(failure)));
            }
            tracing::warn!(
                rank,
                "{failure} -- fallback = tcp: every operation runs over TCP instead"
            );
            drop((rx, tx, fb_listener));
            // The dispatcher is now the mesh's only reader: it and the threads waiting for
            // its operations read the connections themselves, as on the second mesh, whose
            // limits it takes too (pieces; no recovery reads).
            control.make_inline();
            control.set_limits(FALLBACK_MAX_MESSAGE, 0);
            let mode = TransportMode::Tcp {
                from_op: 0,
                reason: FallbackReason::StartupCheck,
            };
            // Pieces a peer sent once its own check was over are back on the mesh, first.
            let handle = fallback::start(fcfg, control, None, mode, Arc::clone(&lineage.builds))
                .map_err(BuildError::Spawn)?;
            return Ok(Communicator {
                rank,
                size,
                lanes,
                chains,
                tcp_threshold,
                posts: None,
                thread: None,
                fallback: Some(handle),
                lineage,
            });
        }
        tracing::debug!(rank, elapsed = ?ex.elapsed, "start-up check: multicast reaches every rank");
        // The TCP mesh (kept apart from the engine's control mesh) for the fallback and the
        // small operations.
        let fb_mesh = match fb_listener {
            Some(l) => {
                let table = ex
                    .extras
                    .iter()
                    .enumerate()
                    .map(|(r, e)| {
                        let s = String::from_utf8_lossy(e);
                        s.parse::<SocketAddr>()
                            .map_err(|_| BuildError::PeerAddress {
                                rank: r as u32,
                                entry: s.into_owned(),
                            })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let mut fc = ControlConfig::new(nonce ^ FALLBACK_NONCE);
                fc.max_read = 0;
                fc.max_message = FALLBACK_MAX_MESSAGE;
                fc.connect_timeout = self.connect_timeout;
                // Every fallback listener was bound before the start-up check exchanged it.
                fc.listeners_bound = true;
                // Only the dispatcher waits on it, and it serves no reads: the dispatcher
                // reads it itself (no I/O thread to wake it for every piece).
                fc.inline_io = true;
                Some(TcpControl::connect_or_cancel(
                    rank,
                    &table,
                    l,
                    Registry::default(),
                    fc,
                    &cancel,
                )?)
            }
            None => None,
        };
        let ports = ringcast_core::port::Ports {
            caps: p.caps,
            rx,
            tx: tx.into_iter().map(TrackedTx::new).collect(),
            control: TrackedControl::new(control),
        };
        let (posts, prx) = mpsc::sync_channel(POST_QUEUE);
        let numbered = Arc::new(AtomicU64::new(0));
        let blame = Blame::new(rank);
        let engine = Engine::new(
            node,
            ports,
            prx,
            numbered.clone(),
            blame.clone(),
            pin_base,
            Arc::clone(&lineage.builds),
        );
        let thread = thread::Builder::new()
            .name(format!("ringcast-r{rank}"))
            .spawn(move || engine.run())
            .map_err(BuildError::Spawn)?;
        let posts = PostTx::new(posts, thread.thread().clone(), numbered, blame);
        let fallback = match fb_mesh {
            Some(mesh) => Some(
                fallback::start(
                    fcfg,
                    mesh,
                    Some(posts.clone()),
                    TransportMode::Multicast,
                    Arc::clone(&lineage.builds),
                )
                .map_err(BuildError::Spawn)?,
            ),
            None => None,
        };
        tracing::debug!(
            rank,
            size,
            %iface,
            chunk,
            lanes,
            chains,
            link_bandwidth = cfg_link,
            tcp_threshold,
            "communicator ready"
        );
        Ok(Communicator {
            rank,
            size,
            lanes,
            chains,
            // Without the second mesh (a threshold of 0, or one rank) nothing goes to TCP.
            tcp_threshold: if fallback.is_some() { tcp_threshold } else { 0 },
            posts: Some(posts),
            thread: Some(thread),
            fallback,
            lineage,
        })
    }
}

/// Default of [`CommBuilder::tcp_threshold`]: operations of at most this many bytes run
/// over TCP (BENCHMARKS.md, "Small operations over TCP").
pub const DEFAULT_TCP_THRESHOLD: u64 = 64 << 10;

/// Default of [`CommBuilder::tcp_threshold`] where every rank is on one host (every control
/// address the same): operations of at most this many bytes run over TCP (BENCHMARKS.md,
/// "One host: TCP up to 512 KiB").
pub const ONE_HOST_TCP_THRESHOLD: u64 = 512 << 10;

/// The TCP threshold when none is given: [`ONE_HOST_TCP_THRESHOLD`] if every control address
/// in `control` is the same (ranks in one host's network namespace), else
/// [`DEFAULT_TCP_THRESHOLD`].
fn default_tcp_threshold(control: &[SocketAddr]) -> u64 {
    match control.split_first() {
        Some((first, rest)) if rest.iter().all(|a| a.ip() == first.ip()) => ONE_HOST_TCP_THRESHOLD,
        _ => DEFAULT_TCP_THRESHOLD,
    }
}

/// File descriptors a rank holds: `meshes` TCP meshes of a connection to every peer, a
/// receive and a send socket per lane, and room for listeners, eventfds, epoll and the
/// application's own files.
fn files_needed(ranks: u32, meshes: u32, lanes: u16) -> u64 {
    files_needed_beside(ranks, meshes, lanes, open_files())
}

/// [`files_needed`] in a process that has `open` descriptors open already (other
/// communicators, the application's files): 64 to spare, or those and 16 more.
fn files_needed_beside(ranks: u32, meshes: u32, lanes: u16, open: u64) -> u64 {
    u64::from(ranks.saturating_sub(1)) * u64::from(meshes)
        + 2 * u64::from(lanes)
        + open.saturating_add(16).max(64)
}

/// Descriptors this process has open (`/proc/self/fd`; 0 where it cannot be read).
fn open_files() -> u64 {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64)
}

/// Raises the soft `RLIMIT_NOFILE` as far as needed and allowed; [`BuildError::FileLimit`]
/// when the hard limit is too low. A limit that cannot be read is not checked.
fn ensure_files(ranks: u32, meshes: u32, lanes: u16) -> Result<(), BuildError> {
    let need = files_needed(ranks, meshes, lanes);
    match rlimit::increase_nofile_limit(need) {
        Ok(limit) if limit < need => Err(BuildError::FileLimit {
            ranks,
            meshes,
            need,
            limit,
        }),
        Ok(_) => Ok(()),
        Err(e) => {
            tracing::debug!(error = %e, "RLIMIT_NOFILE not checked");
            Ok(())
        }
    }
}

/// How long a rank whose build fails lets its last control frames flush.
const PROBE_LINGER: Duration = Duration::from_secs(1);

/// The longest message on the TCP fallback's mesh: a chain's largest piece and its header.
const FALLBACK_MAX_MESSAGE: usize = fallback::PIECE * fallback::MAX_PIECE_TIMES + 64;

/// Tells the fallback mesh's hellos from the control mesh's.
const FALLBACK_NONCE: u64 = 0x6661_6c6c_6261_636b; // "fallback"

/// Binds the control listener on the interface (port 0 unless one was given).
fn listen(
    given: Option<TcpListener>,
    iface: Ipv4Addr,
) -> Result<(TcpListener, String), BuildError> {
    let addr = SocketAddr::from((iface, 0));
    let l = match given {
        Some(l) => l,
        None => TcpListener::bind(addr).map_err(|source| BuildError::Listen { addr, source })?,
    };
    let mut local = l
        .local_addr()
        .map_err(|source| BuildError::Listen { addr, source })?;
    // A listener given on every address (`0.0.0.0`, `[::]`) is reached at the interface's.
    if local.ip().is_unspecified() {
        local.set_ip(IpAddr::V4(iface));
    }
    Ok((l, entry(local, &Host::here())))
}

/// Most lanes [`auto_lanes`] picks: the most measured (on a 16-core host, a 4-rank Broadcast
/// gained from 2 to 4 lanes and an Allgather little past 2; BENCHMARKS.md, "Twenty-third
/// round").
const MAX_AUTO_LANES: u16 = 4;
/// The longest recovery read (the core splits a longer one): what one costs in memory is
/// bounded by it, at both ends (the answer is copied out of the operation's buffer, read into
/// a buffer of its own, and copied in). A whole block lost was read at once before, up to
/// 1 GiB, and a block larger than that could not be recovered.
const MAX_READ: u64 = 16 << 20;
/// Most lanes a communicator may be given.
pub const MAX_LANES: u16 = 64;

/// What a rank tells the others of its host through the rendezvous, for [`auto_lanes`].
#[derive(Clone, Debug, PartialEq, Eq)]
struct Host {
    /// Cores this rank may run on (its affinity mask and cgroup quota).
    cpus: u32,
    /// The cores of its affinity mask (sorted, no repeats), if known: ranks of one host bound
    /// to disjoint cores (`srun --cpu-bind`, `mpirun --map-by slot:PE=4`) each have theirs to
    /// themselves, where ranks that share a mask share its cores.
    set: Option<Vec<u32>>,
    /// The host's kernel (its boot id: network namespaces share it), if known.
    id: Option<String>,
}

/// Most cores a set in an entry may name, and the longest list written: a larger mask is
/// left out (its rank's cores then count as shared with the others of its host), and a
/// larger one read is not understood.
const MAX_SET_CPUS: usize = 4096;
const MAX_SET_LEN: usize = 1024;

impl Host {
    fn here() -> Self {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| {
                !s.is_empty()
                    && s.len() <= 64
                    && s.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')
            });
        // The kernel's own list of the mask (`0-3,8-11`), as `taskset -c` writes it.
        let set = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|st| {
                st.lines()
                    .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                    .map(|l| l.trim().to_owned())
            })
            .and_then(|l| parse_cpu_list(&l));
        Host {
            cpus: u32::try_from(cpus).unwrap_or(u32::MAX),
            set,
            id,
        }
    }
}

/// A cpu list (`0-3,8,10-11`) as its sorted cores; `None` if it is not one, is empty, or
/// names more than [`MAX_SET_CPUS`].
fn parse_cpu_list(l: &str) -> Option<Vec<u32>> {
    let mut set = Vec::new();
    for part in l.split(',') {
        let (lo, hi) = match part.split_once('-') {
            Some((a, b)) => (a.parse::<u32>().ok()?, b.parse::<u32>().ok()?),
            None => {
                let c = part.parse::<u32>().ok()?;
                (c, c)
            }
        };
        if hi < lo || (hi - lo) as usize >= MAX_SET_CPUS - set.len().min(MAX_SET_CPUS) {
            return None;
        }
        set.extend(lo..=hi);
    }
    set.sort_unstable();
    set.dedup();
    (!set.is_empty()).then_some(set)
}

/// Sorted cores as a cpu list (`0-3,8,10-11`).
fn cpu_list(set: &[u32]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < set.len() {
        let mut j = i;
        while j + 1 < set.len() && set[j + 1] == set[j] + 1 {
            j += 1;
        }
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(&set[i].to_string());
        if j > i {
            out.push('-');
            out.push_str(&set[j].to_string());
        }
        i = j + 1;
    }
    out
}

/// A rank's rendezvous entry: its control address, then its host's facts
/// (`10.0.0.2:41234 cpus=16 set=0-15 host=6f0b...`).
fn entry(control: SocketAddr, host: &Host) -> String {
    let mut e = format!("{control} cpus={}", host.cpus);
    if let Some(list) = host.set.as_deref().map(cpu_list)
        && list.len() <= MAX_SET_LEN
    {
        e.push_str(" set=");
        e.push_str(&list);
    }
    if let Some(id) = &host.id {
        e.push_str(" host=");
        e.push_str(id);
    }
    e
}

/// An entry's control address and host facts. A rank's facts that are missing or not
/// understood count as one core on a host of its own address (a set not understood, as no
/// set).
fn parse_entry(e: &str) -> Option<(SocketAddr, Host)> {
    let mut words = e.split_ascii_whitespace();
    let control: SocketAddr = words.next()?.parse().ok()?;
    let mut host = Host {
        cpus: 1,
        set: None,
        id: None,
    };
    for w in words {
        match w.split_once('=') {
            Some(("cpus", n)) => host.cpus = n.parse().unwrap_or(1),
            Some(("set", l)) if l.len() <= MAX_SET_LEN => host.set = parse_cpu_list(l),
            Some(("host", id)) => host.id = Some(id.to_owned()),
            _ => {}
        }
    }
    Some((control, host))
}

/// The lane count every rank of a job picks from the same entries: each rank gets twice the
/// cores it has to itself (at most the cores it may run on), and the job the fewest any rank
/// gets, between 1 and [`MAX_AUTO_LANES`] (1 for a job of one rank). Ranks whose host is not
/// known count as alone on their address's.
///
/// Why twice: a Broadcast's root sends on its lanes alone while the other ranks' workers
/// mostly wait, and on a host with several ranks its send workers also do the kernel's
/// delivery of every datagram to each local member; more lanes spread that over the cores the
/// others leave idle. On a 16-core host, 16 ranks ran a 16 MiB Broadcast in 9.4-11.2 ms on
/// 2 lanes against 14.4-16.3 on 1, and 8 ranks in 4.1-4.4 ms on 4 against 5.5-8.8 on 2, their
/// Allgathers 8 % and 5 % faster as well; on this 2-core VM 2 ranks ran a 64 MiB Broadcast
/// 20-40 % faster on 2 lanes than on 1, and 4 ranks keep 1 (BENCHMARKS.md, twenty-ninth
/// round).
///
/// What a rank has to itself: where every rank of its host told its set, each of its cores
/// counted as a share (one over the ranks of the host whose set holds it), so that ranks in
/// disjoint sets have theirs and ranks that share a set share it; where it may run on fewer
/// cores than its set names (a cgroup quota, which ranks of one container share; CPUs of the
/// mask not online), that share of those. Otherwise its cores, at most its share of its host's (the most
/// any rank there reports, over the ranks there): ranks in disjoint sets then count as
/// sharing the largest, fewer lanes than they could run, never more.
///
/// `halves`: [`half_cores`] of `ranks`.
fn auto_lanes(ranks: &[(SocketAddr, Host)], halves: &[u32]) -> u16 {
    // A job of one rank multicasts nothing: one lane's sockets and workers are plenty.
    if ranks.len() <= 1 {
        return 1;
    }
    let fewest = ranks
        .iter()
        .zip(halves)
        .map(|(r, &halves)| r.1.cpus.min(halves))
        .min()
        .unwrap_or(1);
    u16::try_from(fewest).map_or(MAX_AUTO_LANES, |l| l.clamp(1, MAX_AUTO_LANES))
}

/// The first core of rank `rank`'s threads with `RINGCAST_PIN=1`: ranks take consecutive
/// runs of cores, one thread a core (the control thread, then each lane's receive and send
/// worker), in the order of their ranks; those of one host from its first core where the
/// host colors tell kernels apart (`by_kernel`), all of them otherwise (colors by address
/// may split one kernel's ranks, an address each).
fn pin_base(hosts: &[u32], by_kernel: bool, rank: u32, lanes: u16) -> usize {
    let place = if by_kernel {
        let mine = hosts.get(rank as usize);
        hosts[..(rank as usize).min(hosts.len())]
            .iter()
            .filter(|h| Some(*h) == mine)
            .count()
    } else {
        rank as usize
    };
    place * (1 + 2 * usize::from(lanes))
}

/// Allgather chains (roots multicasting at once) where some rank of the job has less than a
/// whole core to itself ([`half_cores`] below 2), instead of the core's default (4).
///
/// On this 2-core VM 4 ranks gathered 64 MiB per rank faster with 2 chains than with 4 in
/// all nine interleaved pairs (by 5-32 %), and 16 MiB in six of nine (by 5 % on average): two
/// roots at once instead of four leave each receiver fewer streams interleaved on its socket
/// and fewer roots competing for the two cores. Where each rank has a core or more, 4 stays:
/// on the 16-core host 2 chains were as fast or slower at 4, 8 and 16 ranks (BENCHMARKS.md,
/// twenty-ninth round).
const CROWDED_CHAINS: u32 = 2;

/// The Allgather chains every rank of a job picks from the same entries ([`half_cores`] of
/// its ranks): [`CROWDED_CHAINS`] where some rank has less than a whole core to itself,
/// otherwise `None` (the core's default).
fn auto_chains(halves: &[u32]) -> Option<u32> {
    (halves.len() > 1 && halves.iter().min().is_some_and(|&h| h < 2)).then_some(CROWDED_CHAINS)
}

/// Per rank, in halves of a core, what it has to itself (see [`auto_lanes`]): twice its share
/// of its host's cores, rounded down.
fn half_cores(ranks: &[(SocketAddr, Host)]) -> Vec<u32> {
    #[derive(Default)]
    struct Seen {
        most_cpus: u32,
        ranks: u32,
        /// Per core, the ranks whose set holds it; `None` once a rank told no set.
        sharers: Option<std::collections::HashMap<u32, u32>>,
    }
    let mut hosts: std::collections::HashMap<String, Seen> = Default::default();
    for r in ranks {
        let e = hosts.entry(host_key(r)).or_insert_with(|| Seen {
            sharers: Some(Default::default()),
            ..Default::default()
        });
        e.most_cpus = e.most_cpus.max(r.1.cpus);
        e.ranks += 1;
        match (&mut e.sharers, &r.1.set) {
            (Some(sharers), Some(set)) => {
                for &c in set {
                    *sharers.entry(c).or_default() += 1;
                }
            }
            (sharers, _) => *sharers = None,
        }
    }
    ranks
        .iter()
        .map(|r| {
            let seen = &hosts[&host_key(r)];
            match (&seen.sharers, &r.1.set) {
                (Some(sharers), Some(set)) => {
                    let share: f64 = set.iter().map(|c| 1.0 / f64::from(sharers[c])).sum();
                    // Fewer cores to run on than the set names (a cgroup quota, which the
                    // ranks of one container share; CPUs of the mask not online): the
                    // rank's share of them, as of its set, not all of them.
                    let len = set.len() as f64;
                    let share = share * (f64::from(r.1.cpus) / len).min(1.0);
                    // Within a rounding error of a whole half core counts as one.
                    (2.0 * share + 1e-9).floor() as u32
                }
                // A peer's count is whatever it sent: no overflow whatever it says.
                _ => seen.most_cpus.saturating_mul(2) / seen.ranks.max(1),
            }
        })
        .collect()
}

/// What every rank of a job picks alike from the rendezvous' table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Auto {
    /// [`auto_lanes`].
    lanes: u16,
    /// [`auto_chains`].
    chains: Option<u32>,
}

impl Auto {
    /// Both, from one reckoning of what each rank has to itself.
    fn of(ranks: &[(SocketAddr, Host)]) -> Auto {
        let halves = half_cores(ranks);
        Auto {
            lanes: auto_lanes(ranks, &halves),
            chains: auto_chains(&halves),
        }
    }
}

/// What tells a rank's host: its kernel's id where the entry gives it, else its address.
fn host_key((a, h): &(SocketAddr, Host)) -> String {
    match &h.id {
        Some(id) => format!("host {id}"),
        None => format!("address {}", a.ip()),
    }
}

/// Per rank, the lowest rank with the same key (its host's, by [`host_key`]s in rank order):
/// the color of [`Communicator::split_by_host`].
pub(super) fn host_colors<K: std::hash::Hash + Eq>(keys: impl Iterator<Item = K>) -> Vec<u32> {
    let mut first: std::collections::HashMap<K, u32> = Default::default();
    keys.enumerate()
        .map(|(r, k)| *first.entry(k).or_insert(r as u32))
        .collect()
}

/// Each rank's host color ([`host_colors`]), and whether the colors tell kernels apart
/// (every entry gave its kernel's id) rather than addresses.
type HostColors = (Vec<u32>, bool);

/// The control addresses, the nonce, what every rank picks from them ([`Auto`]), and each
/// rank's host color ([`host_colors`]) with whether every entry gave its kernel's id (the
/// colors then tell kernels apart, not addresses).
fn parse_table(t: &PeerTable) -> Result<(Vec<SocketAddr>, u64, Auto, HostColors), BuildError> {
    let ranks = t
        .peers
        .iter()
        .map(|p| {
            let s = String::from_utf8_lossy(&p.control);
            parse_entry(&s).ok_or_else(|| BuildError::PeerAddress {
                rank: p.rank,
                entry: s.into_owned(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let auto = Auto::of(&ranks);
    let hosts = host_colors(ranks.iter().map(host_key));
    let by_kernel = ranks.iter().all(|(_, h)| h.id.is_some());
    Ok((
        ranks.into_iter().map(|(a, _)| a).collect(),
        t.nonce,
        auto,
        (hosts, by_kernel),
    ))
}

/// The interface to advertise when [`CommBuilder::interface`] was not called: see
/// [`crate::bootstrap::interface_toward`] (never loopback for a host that was not written as
/// one, unless this host has nothing else).
fn route_toward(addr: &RendezvousAddr, timeout: Duration) -> Result<Ipv4Addr, BuildError> {
    let ifname = || {
        var("RINGCAST_IFNAME")
            .map(|v| v.parse::<IfnameFilter>())
            .transpose()
            .map_err(EnvError::BadIfname)
    };
    Ok(bootstrap::interface_toward(addr, timeout, ifname)?.addr)
}

/// The interface whose address is `iface`: its name and whether it is a loopback.
fn interface_of(iface: Ipv4Addr) -> Option<(String, bool)> {
    let i = if_addrs::get_if_addrs()
        .ok()?
        .into_iter()
        .find(|i| i.ip() == IpAddr::V4(iface))?;
    let lo = i.is_loopback();
    Some((i.name, lo))
}

/// The kernel's `/sys/class/net/<name>/<file>`, trimmed.
fn sysfs_net(name: &str, file: &str) -> Option<String> {
    let v = std::fs::read_to_string(format!("/sys/class/net/{name}/{file}")).ok()?;
    Some(v.trim().to_owned())
}

/// The post timeout unless set (torch's default for NCCL's collectives).
const DEFAULT_POST_TIMEOUT: Duration = Duration::from_secs(600);

/// Link rate (bytes per second) where the kernel reports none.
const UNKNOWN_LINK: u64 = 10_000_000_000 / 8;
/// Link rate (bytes per second) taken for loopback, whose cost is memory copies, not a line
/// rate: the pacer's ceiling, twice it when this was chosen (5 GB/s; four times since the
/// twenty-fifth round), was about the raw multicast ceiling measured on loopback (4.4-5.8
/// GB/s per receiver on this 2-vCPU VM). Under the 10 Gbit/s default
/// (2.5 GB/s) a 64 MiB Broadcast of 4 ranks took 30-34 ms, at this rate 26-29 ms; at
/// 100 Gbit/s the four roots of a 64 MiB Allgather overran their receivers, which fetched
/// 22-48 MB each over TCP, and it took 195-266 ms instead of 145-218 (BENCHMARKS.md).
///
/// Per lane: on loopback the "link" is the cores that copy, and each lane adds a send worker
/// and a receive worker on every rank. With 4 lanes on a 16-core host a Broadcast of 4 ranks
/// ran into the pacer's ceiling at 20 Gbit/s (4.7 GB/s for 64 MiB); at 80 Gbit/s it took
/// 12-13 ms instead of 14, and a 64 MiB-per-rank Allgather 50-53 ms instead of 55-69, with
/// nothing fetched (BENCHMARKS.md, twenty-third round).
const LOOPBACK_LINK: u64 = 20_000_000_000 / 8;

/// `RINGCAST_LINK_GBPS`'s gigabits per second in bytes per second; `None` unless positive
/// and at most 2^64 bytes per second.
fn link_gbps(g: f64) -> Option<u64> {
    let b = (g * 1e9 / 8.0).round();
    (g.is_finite() && b >= 1.0 && b < u64::MAX as f64).then_some(b as u64)
}

/// The default [`CommBuilder::link_bandwidth`] for the interface at `iface`, for a job on
/// `lanes` lanes.
fn default_link_bandwidth(iface: Ipv4Addr, lanes: u16) -> u64 {
    match interface_of(iface) {
        Some((name, lo)) => link_rate(lo, sysfs_net(&name, "speed").as_deref(), lanes),
        None => UNKNOWN_LINK,
    }
}

/// The link rate of an interface, from whether it is a loopback and what its sysfs `speed`
/// file says (megabits per second; `-1`, or unreadable, where the device has none): a
/// loopback's, [`LOOPBACK_LINK`] per lane.
fn link_rate(loopback: bool, speed: Option<&str>, lanes: u16) -> u64 {
    if loopback {
        return LOOPBACK_LINK.saturating_mul(u64::from(lanes.max(1)));
    }
    speed
        .and_then(|s| s.parse::<u64>().ok())
        .filter(|&mbps| mbps > 0)
        .and_then(|mbps| mbps.checked_mul(1_000_000 / 8))
        .unwrap_or(UNKNOWN_LINK)
}

/// The largest chunk whose datagram fits the MTU of the interface at `iface`, where it can be
/// read ([`room_in_mtu`]).
fn chunk_room(iface: Ipv4Addr) -> Option<u32> {
    let mtu = interface_of(iface)
        .and_then(|(name, _)| sysfs_net(&name, "mtu"))
        .and_then(|m| m.parse::<u32>().ok())?;
    Some(room_in_mtu(mtu))
}

/// The largest chunk whose IPv4 packet fits `mtu` bytes: the MTU less IPv4 20, UDP 8 and the
/// RoCE headers and ICRC, rounded down to a multiple of 4 (a payload is padded to one).
pub(crate) fn room_in_mtu(mtu: u32) -> u32 {
    mtu.saturating_sub(28 + ringcast_transport_rocev2_udp::DATAGRAM_OVERHEAD as u32) & !3
}

/// The chunk size: `asked`, unless its datagram would not fit the `room` the MTU of the
/// interface at `iface` leaves (see [`chunk_room`]), or the default within it.
fn pick_chunk(
    asked: Option<u32>,
    room: Option<u32>,
    loopback: bool,
    iface: Ipv4Addr,
) -> Result<u32, BuildError> {
    match (asked, room) {
        (None, room) => Ok(default_chunk(room, loopback)),
        (Some(c), Some(room)) if c > room => Err(BuildError::Invalid {
            setting: "chunk size (CommBuilder::chunk_size, RINGCAST_CHUNK_SIZE)".into(),
            why: format!(
                "{c} bytes and their headers do not fit one datagram within the MTU of the \
                 interface at {iface} (room for {room} bytes): the kernel would refuse every \
                 multicast"
            ),
        }),
        (Some(c), _) => Ok(c),
    }
}

/// Default of [`CommBuilder::chunk_size`] on a loopback interface (every rank on one host,
/// no NIC on the path): the largest multiple of 128 bytes two of whose datagrams fit one GSO
/// send (65 507 bytes of UDP payload). Larger chunks cost the host less per byte (fewer
/// headers to build and parse, fewer chunks to track) as long as a send stays full; on this
/// project's 2-core VM a 16 MiB Broadcast took 15-20 % less time than with 4 KiB chunks, a
/// 16 MiB-per-rank Allgather 10-20 % less (BENCHMARKS.md, thirty-fourth round).
pub const LOOPBACK_CHUNK: u32 = ((ringcast_transport_rocev2_udp::tx::MAX_UDP_PAYLOAD / 2
    - ringcast_transport_rocev2_udp::DATAGRAM_OVERHEAD)
    & !127) as u32;

/// The default chunk: on a loopback interface [`LOOPBACK_CHUNK`] (within `room`, a multiple
/// of 128 bytes, where `room` has 4 KiB); elsewhere the largest power of two of at most 4 KiB (RoCE's largest path MTU, so that the datagrams
/// stay packets a RoCE NIC takes), at least 256 bytes, within `room` (see [`chunk_room`];
/// 4 KiB where unknown).
fn default_chunk(room: Option<u32>, loopback: bool) -> u32 {
    const MAX: u32 = 4096;
    // A loopback with room for less than 4 KiB (an odd MTU) takes the rule below.
    if loopback && room.is_none_or(|r| r >= MAX) {
        return room.map_or(LOOPBACK_CHUNK, |r| LOOPBACK_CHUNK.min(r & !127));
    }
    let Some(room) = room else {
        return MAX;
    };
    let mut c = MAX;
    while c > 256 && c > room {
        c /= 2;
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bootstrap::RendezvousError;

    /// A builder as [`CommBuilder::from_env`] makes it, from these variables.
    fn from_vars(vars: &[(&str, &str)]) -> CommBuilder {
        let job = JobEnv::from_lookup(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        })
        .expect("env");
        let mut b = CommBuilder::new().rank(job.rank).world_size(job.world_size);
        b.peers = Some(Peers::Env(Box::new(job)));
        b
    }

    /// Ranks that all share one control address are on one host and get the larger
    /// default; one address apart (another host, or another network namespace) and the
    /// default is the fabric's.
    #[test]
    fn the_default_tcp_threshold_follows_where_the_ranks_are() {
        let at = |ip: [u8; 4], port| SocketAddr::from((ip, port));
        let one_host = [at([10, 0, 0, 1], 5000), at([10, 0, 0, 1], 5001)];
        assert_eq!(default_tcp_threshold(&one_host), ONE_HOST_TCP_THRESHOLD);
        assert_eq!(
            default_tcp_threshold(&one_host[..1]),
            ONE_HOST_TCP_THRESHOLD
        );
        let two_hosts = [one_host[0], one_host[1], at([10, 0, 0, 2], 5000)];
        assert_eq!(default_tcp_threshold(&two_hosts), DEFAULT_TCP_THRESHOLD);
        const { assert!(ONE_HOST_TCP_THRESHOLD > DEFAULT_TCP_THRESHOLD) };
    }

    /// `connect_timeout` called after `from_env` bounds the rendezvous too, not only the
    /// mesh: a rank that finds nobody at the rendezvous gives up after it, not after
    /// `RINGCAST_BOOTSTRAP_TIMEOUT`'s minute.
    #[test]
    fn connect_timeout_overrides_the_environment_s_rendezvous_timeout() {
        // A port nobody listens on (bound, then closed).
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a port")
            .port();
        let at = format!("127.0.0.1:{port}");
        let b = from_vars(&[
            ("RINGCAST_RANK", "1"),
            ("RINGCAST_WORLD_SIZE", "2"),
            ("RINGCAST_BOOTSTRAP", &at),
            ("RINGCAST_BOOTSTRAP_TIMEOUT", "60"),
        ]);
        match b.connect_timeout(Duration::from_millis(300)).build() {
            Err(BuildError::Rendezvous(RendezvousError::Unreachable { waited, .. })) => {
                assert!(waited < Duration::from_secs(30), "{waited:?}");
            }
            other => panic!("{:?}", other.err()),
        }
    }

    /// A peer timeout longer than the default post timeout raises it (`ringcast bench
    /// --peer-timeout 700s` was refused, naming a post timeout it has no flag for); a post
    /// timeout set shorter than the peer timeout is still refused.
    #[test]
    fn an_unset_post_timeout_follows_a_long_peer_timeout() {
        let long = Duration::from_secs(700);
        assert_eq!(CommBuilder::new().post(), DEFAULT_POST_TIMEOUT);
        assert_eq!(CommBuilder::new().peer_timeout(long).post(), long);
        assert!(matches!(
            CommBuilder::new().peer_timeout(long).build(),
            Err(BuildError::Missing("rank", _))
        ));
        let short = CommBuilder::new()
            .peer_timeout(long)
            .post_timeout(Duration::from_secs(600));
        match short.build() {
            Err(BuildError::Invalid { setting, .. }) => {
                assert!(setting.contains("RINGCAST_POST_TIMEOUT"), "{setting}")
            }
            other => panic!("{:?}", other.err()),
        }
    }

    /// A link's rate is what the kernel reports, in megabits per second; loopback's is taken
    /// as 20 Gbit/s, and a device that reports none (`-1`, or no file) gets 10 Gbit/s.
    /// An explicit chunk whose datagram the interface's MTU cannot carry is refused (the
    /// kernel would refuse every send, and every chunk would be fetched over TCP), one that
    /// fits is kept, and the default is the largest power of two that fits.
    #[test]
    fn chunks_must_fit_the_interface_s_mtu() {
        let at = Ipv4Addr::new(10, 0, 0, 1);
        // An Ethernet MTU of 1500 leaves 1500 - 28 - the RoCEv2 headers.
        let room = room_in_mtu(1500);
        assert_eq!(room, 1444);
        match pick_chunk(Some(2048), Some(room), false, at) {
            Err(BuildError::Invalid { setting, why }) => {
                assert!(setting.contains("RINGCAST_CHUNK_SIZE"), "{setting}");
                assert!(why.contains("10.0.0.1") && why.contains("MTU"), "{why}");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            pick_chunk(Some(room), Some(room), false, at).ok(),
            Some(room)
        );
        assert_eq!(pick_chunk(Some(9000), None, false, at).ok(), Some(9000));
        assert_eq!(pick_chunk(None, Some(room), false, at).ok(), Some(1024));
        assert_eq!(pick_chunk(None, Some(65_000), false, at).ok(), Some(4096));
        assert_eq!(pick_chunk(None, None, false, at).ok(), Some(4096));
        assert_eq!(pick_chunk(None, Some(10), false, at).ok(), Some(256));
        // On loopback: two chunks to a GSO send, within the MTU's room; below 4 KiB of room,
        // the rule above.
        assert_eq!(LOOPBACK_CHUNK, 32_640);
        let lo = room_in_mtu(65_536);
        assert_eq!(
            pick_chunk(None, Some(lo), true, at).ok(),
            Some(LOOPBACK_CHUNK)
        );
        assert_eq!(pick_chunk(None, None, true, at).ok(), Some(LOOPBACK_CHUNK));
        assert_eq!(
            pick_chunk(None, Some(room_in_mtu(16_384)), true, at).ok(),
            Some(16_256)
        );
        assert_eq!(pick_chunk(None, Some(4100), true, at).ok(), Some(4096));
        assert_eq!(pick_chunk(None, Some(1444), true, at).ok(), Some(1024));
        assert_eq!(pick_chunk(Some(4096), Some(lo), true, at).ok(), Some(4096));
    }

    /// The room an MTU leaves is the largest chunk whose packet (IPv4, UDP, the RoCE
    /// headers, the payload padded to a multiple of 4, the ICRC) fits it. It ignored the pad:
    /// at MTU 1450 (VXLAN's) it took 1394-byte chunks, whose 1452-byte packets the kernel
    /// refused.
    #[test]
    fn the_room_an_mtu_leaves_counts_the_pad() {
        let packet = |c: u32| 28 + ringcast_transport_rocev2_udp::datagram_len(c as usize) as u32;
        assert_eq!(room_in_mtu(1450), 1392);
        for mtu in 68..9300 {
            let room = room_in_mtu(mtu);
            if room == 0 {
                continue;
            }
            assert!(packet(room) <= mtu, "mtu {mtu}: room {room}");
            assert!(
                packet(room + 1) > mtu,
                "mtu {mtu}: room {room} is not the largest"
            );
        }
    }

    #[test]
    fn link_rates_follow_the_kernel_s_speed() {
        assert_eq!(link_rate(false, Some("25000"), 1), 25_000_000_000 / 8);
        assert_eq!(link_rate(false, Some("100000"), 4), 100_000_000_000 / 8);
        assert_eq!(link_rate(false, Some("-1"), 1), UNKNOWN_LINK);
        assert_eq!(link_rate(false, Some("0"), 1), UNKNOWN_LINK);
        assert_eq!(link_rate(false, None, 2), UNKNOWN_LINK);
        assert_eq!(link_rate(true, None, 1), LOOPBACK_LINK);
        // Loopback's cores grow with the lanes; a NIC's line rate does not.
        assert_eq!(link_rate(true, None, 4), 4 * LOOPBACK_LINK);
        assert_eq!(link_gbps(100.0), Some(12_500_000_000));
        assert_eq!(link_gbps(0.5), Some(62_500_000));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, 1e30] {
            assert_eq!(link_gbps(bad), None, "{bad}");
        }
        assert_eq!(
            default_link_bandwidth(Ipv4Addr::LOCALHOST, 1),
            LOOPBACK_LINK
        );
        assert_eq!(
            default_link_bandwidth(Ipv4Addr::LOCALHOST, 2),
            2 * LOOPBACK_LINK
        );
        assert_eq!(
            default_link_bandwidth(Ipv4Addr::new(192, 0, 2, 1), 4),
            UNKNOWN_LINK
        );
    }

    /// A chunk too long for a UDP datagram, no lanes and a zero link bandwidth are refused
    /// naming the setting, before any rank is asked for or connected.
    #[test]
    fn settings_the_transport_cannot_take_are_named() {
        let chunk = u32::try_from(MAX_CHUNK_PAYLOAD).unwrap();
        for (b, named) in [
            (
                CommBuilder::new().chunk_size(chunk + 1),
                "RINGCAST_CHUNK_SIZE",
            ),
            (CommBuilder::new().lanes(0), "RINGCAST_LANES"),
            (
                CommBuilder::new().link_bandwidth(0),
                "CommBuilder::link_bandwidth",
            ),
        ] {
            match b.build() {
                Err(BuildError::Invalid { setting, .. }) => {
                    assert!(setting.contains(named), "{setting}")
                }
                other => panic!("{named}: {:?}", other.err()),
            }
        }
        // The longest chunk that fits passes that check: what is missing next is the rank.
        assert!(matches!(
            CommBuilder::new().chunk_size(chunk).build(),
            Err(BuildError::Missing("rank", _))
        ));
    }

    /// The rendezvous uses the environment's rank and size: others given afterwards are an
    /// error naming both, not a table of the wrong length indexed out of bounds.
    #[test]
    fn a_rank_or_size_other_than_the_environments_is_refused() {
        let env = [("RINGCAST_RANK", "0"), ("RINGCAST_WORLD_SIZE", "1")];
        for b in [
            from_vars(&env).world_size(2).rank(1),
            from_vars(&env).world_size(2),
        ] {
            match b.build() {
                Err(BuildError::Invalid { setting, why }) => {
                    assert!(setting.contains("CommBuilder::world_size"), "{setting}");
                    assert!(why.contains("environment's rank 0 of 1"), "{why}");
                }
                other => panic!("{:?}", other.err()),
            }
        }
    }
    fn on(addr: &str, cpus: u32, id: Option<&str>) -> (SocketAddr, Host) {
        (
            addr.parse().expect("address"),
            Host {
                cpus,
                set: None,
                id: id.map(str::to_owned),
            },
        )
    }

    /// [`on`], with an affinity mask.
    fn bound(addr: &str, set: std::ops::Range<u32>, id: &str) -> (SocketAddr, Host) {
        let set: Vec<u32> = set.collect();
        (
            addr.parse().expect("address"),
            Host {
                cpus: set.len() as u32,
                set: Some(set),
                id: Some(id.to_owned()),
            },
        )
    }

    /// `n` ranks of one host, each bound to its cores `0..cores`.
    fn sharing(n: u32, cores: u32) -> Vec<(SocketAddr, Host)> {
        (0..n)
            .map(|r| bound(&format!("10.0.0.1:{}", 1 + r), 0..cores, "a"))
            .collect()
    }

    /// Ranks bound to cores of their own each get theirs; ranks that share a mask share its
    /// cores; a rank that told no set makes its host count as before.
    #[test]
    fn lanes_follow_the_cores_of_each_rank_s_mask() {
        let disjoint: Vec<_> = (0..4u32)
            .map(|r| bound(&format!("10.0.0.1:{}", 1 + r), r * 4..r * 4 + 4, "a"))
            .collect();
        assert_eq!(Auto::of(&disjoint).lanes, 4, "4 ranks with 4 cores each");
        let two_each: Vec<_> = (0..4u32)
            .map(|r| bound(&format!("10.0.0.1:{}", 1 + r), r * 2..r * 2 + 2, "a"))
            .collect();
        assert_eq!(Auto::of(&two_each).lanes, 2);
        assert_eq!(
            Auto::of(&sharing(4, 16)).lanes,
            4,
            "16 shared cores over 4 ranks"
        );
        assert_eq!(
            Auto::of(&sharing(8, 16)).lanes,
            4,
            "twice 2 shared cores each"
        );
        assert_eq!(
            Auto::of(&sharing(16, 16)).lanes,
            2,
            "twice 1 shared core each"
        );
        assert_eq!(Auto::of(&sharing(4, 2)).lanes, 1, "twice half a core each");
        assert_eq!(Auto::of(&sharing(2, 2)).lanes, 2);
        assert_eq!(Auto::of(&sharing(3, 2)).lanes, 1, "twice 2/3 of a core");
        // Two ranks overlapping on 4 of 8 cores each: 4 + 4 / 2 = 6 (at most 4).
        let overlap = [
            bound("10.0.0.1:1", 0..8, "a"),
            bound("10.0.0.1:2", 4..12, "a"),
        ];
        assert_eq!(Auto::of(&overlap).lanes, 4);
        // One core each, three ranks on one, one alone on another: the fewest, 1.
        let uneven = [
            bound("10.0.0.1:1", 0..1, "a"),
            bound("10.0.0.1:2", 0..1, "a"),
            bound("10.0.0.1:3", 0..1, "a"),
            bound("10.0.0.1:4", 1..2, "a"),
        ];
        assert_eq!(Auto::of(&uneven).lanes, 1);
        // A cgroup quota below the mask bounds it.
        let mut quota = disjoint.clone();
        quota[2].1.cpus = 2;
        assert_eq!(Auto::of(&quota).lanes, 2);
        // A rank of the host without a set (an entry from elsewhere): the host counts as
        // sharing its largest count, as before (twice 16 / 4, at most 4; twice 4 / 4).
        let mut unknown = disjoint.clone();
        unknown[0].1.set = None;
        unknown[0].1.cpus = 16;
        assert_eq!(Auto::of(&unknown).lanes, 4);
        unknown[0].1.cpus = 4;
        assert_eq!(Auto::of(&unknown).lanes, 2);
    }

    /// A rank's `cpus` below its set's size (a cgroup quota that ranks of one container
    /// share, or a mask that names CPUs not online, as the default mask does on a VM whose
    /// possible CPUs outnumber its online ones) bounds its share of its set, not only the
    /// rank: ranks sharing a quota must not each get all of it.
    #[test]
    fn a_quota_below_the_mask_is_shared_like_the_mask() {
        let with = |n: u32, set: std::ops::Range<u32>, cpus: u32| -> Vec<_> {
            (0..n)
                .map(|r| {
                    let mut b = bound(&format!("10.0.0.1:{}", 1 + r), set.clone(), "a");
                    b.1.cpus = cpus;
                    b
                })
                .collect()
        };
        // `docker run --cpus=2` around 4 ranks, unbound on a 16-core host: half a core each,
        // 1 lane (before sets, 2 / 4).
        assert_eq!(Auto::of(&with(4, 0..16, 2)).lanes, 1);
        // 8 unbound ranks on a VM with 16 CPUs online of 64 possible: 2 each, twice that;
        // 16 of them: 1 each.
        assert_eq!(Auto::of(&with(8, 0..64, 16)).lanes, 4);
        assert_eq!(Auto::of(&with(16, 0..64, 16)).lanes, 2);
        assert_eq!(Auto::of(&with(4, 0..64, 16)).lanes, 4);
        // Ranks bound to cores of their own, with a quota each: the quota.
        let mut own: Vec<_> = (0..4u32)
            .map(|r| bound(&format!("10.0.0.1:{}", 1 + r), r * 4..r * 4 + 4, "a"))
            .collect();
        for r in &mut own {
            r.1.cpus = 3;
        }
        assert_eq!(Auto::of(&own).lanes, 3);
    }

    /// Fewer Allgather roots at once only where some rank has less than a core to itself.
    #[test]
    fn chains_drop_to_two_where_ranks_have_less_than_a_core_each() {
        assert_eq!(
            Auto::of(&sharing(4, 2)).chains,
            Some(CROWDED_CHAINS),
            "this VM's 4 ranks"
        );
        assert_eq!(Auto::of(&sharing(3, 2)).chains, Some(CROWDED_CHAINS));
        assert_eq!(Auto::of(&sharing(2, 2)).chains, None, "a core each");
        assert_eq!(Auto::of(&sharing(4, 16)).chains, None);
        assert_eq!(Auto::of(&sharing(16, 16)).chains, None);
        assert_eq!(Auto::of(&sharing(17, 16)).chains, Some(CROWDED_CHAINS));
        assert_eq!(
            Auto::of(&sharing(1, 1)).chains,
            None,
            "one rank gathers nothing"
        );
        let pinned: Vec<_> = (0..4u32)
            .map(|r| bound(&format!("10.0.0.1:{}", 1 + r), r..r + 1, "a"))
            .collect();
        assert_eq!(Auto::of(&pinned).chains, None, "a core of its own each");
        // Without sets: the host's largest count over its ranks (the namespace lab's 4 ranks
        // on 2 cores); one crowded host is enough.
        let lab: Vec<_> = (1..=4)
            .map(|r| on(&format!("10.77.0.{r}:9000"), 2, Some("b00t")))
            .collect();
        assert_eq!(Auto::of(&lab).chains, Some(CROWDED_CHAINS));
        let mut hosts: Vec<_> = (1..=4)
            .map(|r| on(&format!("10.0.0.{r}:9000"), 8, Some(&format!("h{r}"))))
            .collect();
        assert_eq!(Auto::of(&hosts).chains, None);
        hosts.push(on("10.0.0.4:9001", 1, Some("h4")));
        assert_eq!(
            Auto::of(&hosts).chains,
            None,
            "a rank with a core of its own"
        );
        hosts.push(on("10.0.0.5:9000", 1, Some("h5")));
        hosts.push(on("10.0.0.5:9001", 1, Some("h5")));
        assert_eq!(
            Auto::of(&hosts).chains,
            Some(CROWDED_CHAINS),
            "two ranks on one core"
        );
    }

    #[test]
    fn cpu_lists_read_and_write_as_the_kernel_writes_them() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpu_list("5"), Some(vec![5]));
        assert_eq!(parse_cpu_list("3,1-2,2"), Some(vec![1, 2, 3]));
        for bad in ["", "a", "3-1", "1-", "-1", "0-4294967295", "1,,2"] {
            assert_eq!(parse_cpu_list(bad), None, "{bad:?}");
        }
        assert_eq!(parse_cpu_list("0-4095").map(|s| s.len()), Some(4096));
        assert_eq!(parse_cpu_list("0-4096"), None, "more than MAX_SET_CPUS");
        assert_eq!(cpu_list(&[0, 1, 2, 3, 8, 10, 11]), "0-3,8,10-11");
        assert_eq!(cpu_list(&[7]), "7");
        assert_eq!(cpu_list(&[]), "");
        // This process's own mask reads back.
        let here = Host::here();
        if let Some(set) = &here.set {
            assert!(set.len() as u32 >= here.cpus || here.cpus == 1, "{here:?}");
            assert_eq!(parse_cpu_list(&cpu_list(set)).as_ref(), Some(set));
        }
    }

    /// The lanes every rank picks: two per core each rank has to itself, 1 to 4.
    #[test]
    fn lanes_follow_the_cores_each_rank_has_to_itself() {
        // Counts are whatever the peers sent: the largest is no overflow.
        let huge = [
            on("10.0.0.1:1", u32::MAX, Some("a")),
            on("10.0.0.1:2", u32::MAX, Some("a")),
        ];
        assert_eq!(Auto::of(&huge).lanes, 4);
        assert_eq!(Auto::of(&huge).chains, None);
        let same = |n: u16, cpus: u32| -> Vec<(SocketAddr, Host)> {
            (0..n)
                .map(|r| on(&format!("127.0.0.1:{}", 1000 + r), cpus, Some("b00t")))
                .collect()
        };
        assert_eq!(Auto::of(&same(4, 16)).lanes, 4, "4 ranks on 16 cores");
        assert_eq!(Auto::of(&same(8, 16)).lanes, 4, "8 ranks on 16 cores");
        assert_eq!(Auto::of(&same(16, 16)).lanes, 2, "16 ranks on 16 cores");
        assert_eq!(Auto::of(&same(2, 2)).lanes, 2, "2 ranks on 2 cores");
        assert_eq!(Auto::of(&same(4, 2)).lanes, 1, "4 ranks on 2 cores");
        assert_eq!(Auto::of(&same(2, 64)).lanes, 4, "at most 4");
        assert_eq!(
            Auto::of(&same(1, 64)).lanes,
            1,
            "one rank multicasts nothing"
        );
        assert_eq!(
            Auto::of(&same(4, 1)).lanes,
            1,
            "each bound to a core of its own"
        );
        // Namespaces on one kernel: other addresses, the same cores.
        let lab: Vec<_> = (1..=4)
            .map(|r| on(&format!("10.77.0.{r}:9000"), 2, Some("b00t")))
            .collect();
        assert_eq!(Auto::of(&lab).lanes, 1);
        // One rank per host: each has its host's cores.
        let hosts: Vec<_> = (1..=4)
            .map(|r| on(&format!("10.0.0.{r}:9000"), 32, Some(&format!("host{r}"))))
            .collect();
        assert_eq!(Auto::of(&hosts).lanes, 4);
        // The job takes the fewest any rank gets: 2 ranks on 16 cores, 2 on 2.
        let mixed = [
            on("10.0.0.1:1", 16, Some("a")),
            on("10.0.0.1:2", 16, Some("a")),
            on("10.0.0.2:1", 2, Some("b")),
            on("10.0.0.2:2", 2, Some("b")),
        ];
        assert_eq!(Auto::of(&mixed).lanes, 2);
        // A rank bound to fewer cores than its host's share.
        let bound = [
            on("10.0.0.1:1", 16, Some("a")),
            on("10.0.0.1:2", 1, Some("a")),
        ];
        assert_eq!(Auto::of(&bound).lanes, 1);
        // Hosts not known: by address.
        let anon = [
            on("127.0.0.1:1", 4, None),
            on("127.0.0.1:2", 4, None),
            on("10.0.0.9:1", 4, None),
        ];
        assert_eq!(Auto::of(&anon).lanes, 4);
        assert_eq!(Auto::of(&anon[1..]).lanes, 4);
        assert_eq!(
            Auto::of(&[anon[0].clone(), anon[0].clone(), anon[0].clone()]).lanes,
            2
        );
    }

    /// A communicator's descriptors come on top of those the process holds already (another
    /// communicator's, say, for a `dup`): past 48 of them, they are counted.
    #[test]
    fn files_needed_counts_those_already_open() {
        // 63 peers on 2 meshes, 4 lanes: 126 + 8, and 64 to spare.
        assert_eq!(files_needed_beside(64, 2, 4, 5), 198);
        assert_eq!(files_needed_beside(64, 2, 4, 48), 198);
        assert_eq!(files_needed_beside(64, 2, 4, 100), 126 + 8 + 116);
        assert!(open_files() >= 3, "stdin, stdout, stderr");
    }

    /// `split_by_host`'s colors: the lowest rank of each host, by its kernel's id where the
    /// entry has one (namespaces with their own addresses share it), else by address.
    #[test]
    fn pinned_ranks_take_consecutive_cores_by_their_place_on_their_host() {
        // Hosts 0 and 2; one lane: three threads a rank.
        let hosts = [0, 0, 2, 2, 0];
        let bases: Vec<usize> = (0..5).map(|r| pin_base(&hosts, true, r, 1)).collect();
        assert_eq!(bases, [0, 3, 0, 3, 6]);
        assert_eq!(pin_base(&hosts, true, 4, 2), 10);
        // A rank past the table (never built so) takes the first cores.
        assert_eq!(pin_base(&hosts, true, 9, 1), 0);
        // Colors by address: by rank.
        let bases: Vec<usize> = (0..5).map(|r| pin_base(&hosts, false, r, 1)).collect();
        assert_eq!(bases, [0, 3, 6, 9, 12]);
    }

    #[test]
    fn host_colors_are_each_hosts_lowest_rank() {
        let entries = [
            "10.0.0.1:1 cpus=2 host=a",
            "10.0.0.9:1 cpus=2 host=b",
            "10.0.0.2:7 cpus=2 host=a",
            "10.0.0.4:1",
            "10.0.0.4:2 cpus=8",
            "10.0.0.5:1",
        ];
        let ranks: Vec<_> = entries.iter().filter_map(|e| parse_entry(e)).collect();
        assert_eq!(host_colors(ranks.iter().map(host_key)), [0, 1, 0, 3, 3, 5]);
        assert!(host_colors(std::iter::empty::<String>()).is_empty());
    }

    #[test]
    fn a_rendezvous_entry_carries_the_address_and_the_host() {
        let (addr, host) = on("10.1.2.3:4567", 12, Some("0c1d-ab"));
        let e = entry(addr, &host);
        assert_eq!(e, "10.1.2.3:4567 cpus=12 host=0c1d-ab");
        assert_eq!(parse_entry(&e), Some((addr, host)));
        let (_, with_set) = bound("10.1.2.3:4567", 4..8, "0c1d-ab");
        let e = entry(addr, &with_set);
        assert_eq!(e, "10.1.2.3:4567 cpus=4 set=4-7 host=0c1d-ab");
        assert_eq!(parse_entry(&e), Some((addr, with_set.clone())));
        // A set not understood, or too long to be sent: none.
        let no_set = Host {
            set: None,
            ..with_set.clone()
        };
        assert_eq!(
            parse_entry("10.1.2.3:4567 cpus=4 set=7-4 host=0c1d-ab"),
            Some((addr, no_set.clone()))
        );
        let wide = Host {
            set: Some((0..4096).step_by(2).collect()),
            ..with_set
        };
        assert!(!entry(addr, &wide).contains("set="));
        let no_id = Host {
            cpus: 3,
            set: None,
            id: None,
        };
        assert_eq!(parse_entry(&entry(addr, &no_id)), Some((addr, no_id)));
        // A bare address (an older entry) or facts not understood: one core.
        let one = Host {
            cpus: 1,
            set: None,
            id: None,
        };
        assert_eq!(parse_entry("10.1.2.3:4567"), Some((addr, one.clone())));
        assert_eq!(parse_entry("10.1.2.3:4567 cpus=lots x"), Some((addr, one)));
        assert_eq!(parse_entry("not an address cpus=4"), None);
        assert_eq!(parse_entry(""), None);
        // This host's facts are well formed.
        let here = Host::here();
        assert!(here.cpus >= 1);
        assert_eq!(parse_entry(&entry(addr, &here)), Some((addr, here)));
    }
}
