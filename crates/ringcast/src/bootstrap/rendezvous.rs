//! The TCP rendezvous: rank 0 listens, every other rank connects and sends its rank, world size
//! and control addresses (an opaque blob); rank 0 checks them and answers everyone with the
//! whole table and a random 64-bit job nonce.

use super::env::{
    DEFAULT_TIMEOUT, JobEnv, MAX_WORLD_SIZE, RANK_VARIABLES, RendezvousAddr, SIZE_VARIABLES,
};
use super::lookup::{LookupError, LookupTimeout, lookup};
use super::wire::{self, Hello, MAX_CONTROL_LEN, Reply, WireError};
use std::io::{self, ErrorKind};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// [`Rendezvous::linger`]'s default.
const DEFAULT_LINGER: Duration = Duration::from_secs(5);
/// The least time a joining rank's lookup of rank 0's host name is given, even past its
/// deadline (see `Rendezvous::connect`).
const MIN_LOOKUP: Duration = Duration::from_secs(1);

/// A joining rank waits this much past its deadline for rank 0's answer, so that rank 0's own
/// timeout report (which names the missing ranks) arrives first.
const REPLY_GRACE: Duration = Duration::from_secs(2);
/// Backoff between connection attempts: from the first to the last.
const CONNECT_BACKOFF: (Duration, Duration) =
    (Duration::from_millis(10), Duration::from_millis(500));

/// One rank's entry in the table everyone receives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// The rank.
    pub rank: u32,
    /// Its local rank, when its launcher said.
    pub local_rank: Option<u32>,
    /// The control addresses it sent (opaque to the rendezvous).
    pub control: Vec<u8>,
}

/// What every rank holds after the rendezvous: the same table and nonce everywhere.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerTable {
    /// Random per-job value from rank 0 (group addresses and the Q_Key derive from it).
    pub nonce: u64,
    /// One entry per rank, in rank order.
    pub peers: Vec<Peer>,
}

/// What to do about a rendezvous port rank 0 could not listen on.
fn bind_hint(e: &io::Error) -> String {
    let free = "set RINGCAST_BOOTSTRAP to host:port with a free port";
    if e.kind() == io::ErrorKind::AddrInUse {
        format!(
            "another process listens there: if it is this job's rank 0, two processes were \
             started as rank 0 (every process needs its own rank: set {RANK_VARIABLES}); \
             otherwise {free}"
        )
    } else {
        free.to_string()
    }
}

/// A failed rendezvous. Messages name the address and the variables behind it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RendezvousError {
    /// Rank 0 could not listen. When the port is in use, the message says that a second
    /// process started as rank 0 is one cause.
    #[error(
        "rank 0 could not listen on port {port} (from {origin}): {source}; {}",
        bind_hint(source)
    )]
    Bind {
        /// The port.
        port: u16,
        /// The variables it came from.
        origin: &'static str,
        /// What the kernel said.
        #[source]
        source: io::Error,
    },
    /// Rank 0 gave up waiting for some ranks.
    #[error(
        "waited {:.1} s for ranks {} at {addr}; are they started with the same {origin}?{}",
        waited.as_secs_f64(), RankList(missing), Rejected(rejected)
    )]
    Timeout {
        /// The rendezvous address.
        addr: String,
        /// How long rank 0 waited.
        waited: Duration,
        /// The ranks that never joined.
        missing: Vec<u32>,
        /// The variables the address came from.
        origin: &'static str,
        /// Connections refused meanwhile, and why.
        rejected: Vec<String>,
    },
    /// Two live processes claim one rank. Rank 0 keeps the first and refuses the second, which
    /// gets this text in [`RendezvousError::Refused`]; rank 0 goes on waiting, and a
    /// [`RendezvousError::Timeout`] lists it. (A first claimant whose connection has closed
    /// is gone, and the second takes its place.)
    #[error(
        "rank {rank} joined twice, from {first} and then from {second}; rank 0 keeps the first \
         and refused the second: every process needs its own rank (set {RANK_VARIABLES})"
    )]
    DuplicateRank {
        /// The rank.
        rank: u32,
        /// The first claimant.
        first: String,
        /// The second.
        second: SocketAddr,
    },
    /// A rank disagrees with rank 0 about the world size. Rank 0 refuses it as it does a
    /// [`RendezvousError::DuplicateRank`], unless its hello carries this job's key (both know
    /// the key and it is the same): then the ranks of one launch disagree and the job cannot
    /// meet as started, so rank 0 fails with this error at once and tells every rank waiting
    /// why.
    #[error(
        "rank {rank} (from {peer}) says the world has {theirs} ranks, rank 0 says {ours}: start \
         every rank with the same world size (set {SIZE_VARIABLES})"
    )]
    WorldSizeMismatch {
        /// The offender's rank.
        rank: u32,
        /// Its address.
        peer: SocketAddr,
        /// Its world size.
        theirs: u32,
        /// Rank 0's.
        ours: u32,
    },
    /// A rank joined with a rank number outside the world it agrees on. Rank 0 refuses it as
    /// it does a [`RendezvousError::DuplicateRank`].
    #[error(
        "rank {rank} (from {peer}) is not a rank of this {ranks}-rank job: start every rank \
         with a rank below the world size (set {RANK_VARIABLES})"
    )]
    RankOutOfRange {
        /// The rank it claimed.
        rank: u32,
        /// Its address.
        peer: SocketAddr,
        /// The world size.
        ranks: u32,
    },
    /// A joining rank never reached rank 0.
    #[error(
        "could not connect to the rendezvous at {addr} for {:.1} s (last error: {last_error}); is \
         rank 0 running, with the same {origin}?",
        waited.as_secs_f64()
    )]
    Unreachable {
        /// The rendezvous address.
        addr: String,
        /// How long it tried.
        waited: Duration,
        /// The last connection error.
        last_error: String,
        /// The variables the address came from.
        origin: &'static str,
    },
    /// Looking up the rendezvous host's name took the whole timeout.
    #[error(transparent)]
    Lookup(#[from] LookupTimeout),
    /// Rank 0 accepted but never answered.
    #[error(
        "rank 0 at {addr} did not answer within {:.1} s; see its log (RINGCAST_BOOTSTRAP_TIMEOUT \
         sets the wait)",
        waited.as_secs_f64()
    )]
    NoReply {
        /// The rendezvous address.
        addr: String,
        /// How long it waited.
        waited: Duration,
    },
    /// Rank 0 refused this rank or gave up on the job; its text says why.
    #[error("rendezvous at {addr}: refused by rank 0: {message}")]
    Refused {
        /// The rendezvous address.
        addr: String,
        /// Rank 0's explanation.
        message: String,
    },
    /// Rank 0 (or whatever listens there) closed the connection without an answer: it
    /// stopped, or dropped this connection; its log says why.
    #[error("rank 0 at {addr} closed the connection without an answer; see its log")]
    ClosedWithoutAnswer {
        /// The rendezvous address.
        addr: String,
    },
    /// Something other than a ringcast rendezvous answered, or it broke the protocol.
    #[error(
        "{addr} does not speak ringcast's rendezvous ({detail}); does {origin} point at another \
         service, such as torch's store on MASTER_PORT?"
    )]
    Protocol {
        /// The rendezvous address.
        addr: String,
        /// What was wrong.
        detail: String,
        /// The variables the address came from.
        origin: &'static str,
    },
    /// The world size is over [`MAX_WORLD_SIZE`].
    #[error(
        "a world of {0} ranks is over ringcast's limit of {MAX_WORLD_SIZE}: check the world size \
         ({SIZE_VARIABLES})"
    )]
    TooManyRanks(u32),
    /// The control blob is over [`MAX_CONTROL_LEN`].
    #[error("control addresses of {0} bytes are over the limit of {MAX_CONTROL_LEN}")]
    ControlTooLong(usize),
    /// A socket error not covered above.
    #[error("rendezvous at {addr}: {source}")]
    Io {
        /// The rendezvous address.
        addr: String,
        /// The error.
        #[source]
        source: io::Error,
    },
}

/// `[3, 5, 7-9]`, at most 32 items.
struct RankList<'a>(&'a [u32]);

impl std::fmt::Display for RankList<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut runs: Vec<(u32, u32)> = Vec::new();
        for &r in self.0 {
            match runs.last_mut() {
                Some((_, hi)) if hi.checked_add(1) == Some(r) => *hi = r,
                _ => runs.push((r, r)),
            }
        }
        f.write_str("[")?;
        for (i, (lo, hi)) in runs.iter().enumerate() {
            if i == 32 {
                write!(f, ", ... ({} ranks in all)", self.0.len())?;
                break;
            }
            let sep = if i == 0 { "" } else { ", " };
            match hi - lo {
                0 => write!(f, "{sep}{lo}")?,
                1 => write!(f, "{sep}{lo}, {hi}")?,
                _ => write!(f, "{sep}{lo}-{hi}")?,
            }
        }
        f.write_str("]")
    }
}

struct Rejected<'a>(&'a [String]);

impl std::fmt::Display for Rejected<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.0.is_empty() {
            write!(f, " Refused meanwhile: {}", self.0.join("; "))?;
        }
        Ok(())
    }
}

/// One rank's side of the rendezvous.
///
/// ```no_run
/// use ringcast::bootstrap::{Rendezvous, RendezvousAddr};
/// let addr = RendezvousAddr { host: "10.0.0.1".into(), port: 29500, origin: "RINGCAST_BOOTSTRAP" };
/// let table = Rendezvous::new(1, 4, addr).run(b"10.0.0.2:40000")?;
/// assert_eq!(table.peers.len(), 4);
/// # Ok::<(), ringcast::bootstrap::RendezvousError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rendezvous {
    /// This rank.
    pub rank: u32,
    /// Number of ranks.
    pub world_size: u32,
    /// This rank's local rank, passed on in the table.
    pub local_rank: Option<u32>,
    /// Where rank 0 listens.
    pub addr: RendezvousAddr,
    /// [`JobEnv::job_key`]; 0 when unknown. Ranks with different non-zero keys refuse each other.
    pub job_key: u64,
    /// How long to wait for everyone.
    pub timeout: Duration,
    /// Rank 0 only: how long it stays after the job failed at once (ranks disagree on the
    /// world size) to tell the job's ranks that come late why, unless every rank has been
    /// told sooner. Default 5 s.
    pub linger: Duration,
}

impl Rendezvous {
    /// A rendezvous for `rank` of `world_size` at `addr`, with no job key and the default timeout.
    pub fn new(rank: u32, world_size: u32, addr: RendezvousAddr) -> Self {
        Rendezvous {
            rank,
            world_size,
            local_rank: None,
            addr,
            job_key: 0,
            timeout: DEFAULT_TIMEOUT,
            linger: DEFAULT_LINGER,
        }
    }

    /// The rendezvous a job's environment describes; `None` for a single-rank job.
    pub fn for_job(job: &JobEnv) -> Option<Self> {
        job.rendezvous.as_ref().map(|addr| Rendezvous {
            rank: job.rank,
            world_size: job.world_size,
            local_rank: job.local_rank,
            addr: addr.clone(),
            job_key: job.job_key(),
            timeout: job.timeout,
            linger: DEFAULT_LINGER,
        })
    }

    /// When a rendezvous started at `started` gives up: `timeout` later, or a week at most.
    pub(super) fn deadline(&self, started: Instant) -> Instant {
        started + self.timeout.min(ringcast_core::MAX_TIMEOUT)
    }

    /// Runs this rank's side: rank 0 listens on the address's port (all local addresses) and
    /// serves; the others join.
    pub fn run(&self, control: &[u8]) -> Result<PeerTable, RendezvousError> {
        if self.rank != 0 {
            return self.join(control);
        }
        let any = match self.addr.host.parse::<IpAddr>() {
            Ok(IpAddr::V6(_)) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            _ => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
        };
        let listener =
            TcpListener::bind((any, self.addr.port)).map_err(|source| RendezvousError::Bind {
                port: self.addr.port,
                origin: self.addr.origin,
                source,
            })?;
        self.serve(listener, control)
    }

    /// Rank 0's side on a listener it already holds (for tests and for callers that bind
    /// port 0 first and hand the port to the ranks they start).
    pub fn serve(
        &self,
        listener: TcpListener,
        control: &[u8],
    ) -> Result<PeerTable, RendezvousError> {
        self.check(control)?;
        super::server::Server::new(self, listener)?.run(control)
    }

    /// A non-zero rank's side: connects (retrying until the deadline), sends its hello and
    /// waits for the table.
    pub fn join(&self, control: &[u8]) -> Result<PeerTable, RendezvousError> {
        self.check(control)?;
        let started = Instant::now();
        let deadline = self.deadline(started);
        let addr = self.addr.to_string();
        let stream = self.connect(&addr, started, deadline)?;
        let io_err = |source| RendezvousError::Io {
            addr: addr.clone(),
            source,
        };
        stream.set_nodelay(true).map_err(io_err)?;
        let hello = Hello {
            version: wire::VERSION,
            rank: self.rank,
            world_size: self.world_size,
            local_rank: self.local_rank,
            job_key: self.job_key,
            control: control.to_vec(),
        };
        // The hello out and the whole reply in by rank 0's deadline (and a grace for its last
        // turn), however slowly either side's bytes move. Rank 0 listened before this connect
        // and its deadline counts from then, so it is at most a timeout from now; counted
        // from this rank's own start, a rank that came early gave up while rank 0 could still
        // complete with it in the table.
        let by = self.deadline(Instant::now()) + REPLY_GRACE;
        wire::send(&mut wire::By(&stream, by), &hello.encode()).map_err(io_err)?;
        match Reply::read(&mut wire::By(&stream, by), self.world_size) {
            Ok(Reply::Table { nonce, entries }) => {
                tracing::debug!(rank = self.rank, %addr, nonce, "rendezvous: joined");
                Ok(table(nonce, entries))
            }
            Ok(Reply::Refused(message)) => Err(RendezvousError::Refused { addr, message }),
            Err(WireError::Io(e))
                if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
            {
                Err(RendezvousError::NoReply {
                    addr,
                    waited: started.elapsed(),
                })
            }
            Err(WireError::Io(e))
                if matches!(
                    e.kind(),
                    ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset
                ) =>
            {
                Err(RendezvousError::ClosedWithoutAnswer { addr })
            }
            Err(e) => Err(RendezvousError::Protocol {
                addr,
                detail: e.to_string(),
                origin: self.addr.origin,
            }),
        }
    }

    /// What either side checks before touching the network.
    fn check(&self, control: &[u8]) -> Result<(), RendezvousError> {
        if self.world_size > MAX_WORLD_SIZE {
            return Err(RendezvousError::TooManyRanks(self.world_size));
        }
        if control.len() > MAX_CONTROL_LEN {
            return Err(RendezvousError::ControlTooLong(control.len()));
        }
        Ok(())
    }

    /// Connects to rank 0, retrying with backoff (it may not listen yet) until `deadline`.
    /// Each try looks the host up again (its address may not be published yet), within the
    /// time left but at least [`MIN_LOOKUP`]: a try that starts just before the deadline
    /// would otherwise blame the resolver for the time the retries took.
    fn connect(
        &self,
        addr: &str,
        started: Instant,
        deadline: Instant,
    ) -> Result<TcpStream, RendezvousError> {
        let mut backoff = CONNECT_BACKOFF.0;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let last_error = match lookup(&self.addr, left.max(MIN_LOOKUP)) {
                Err(LookupError::TimedOut(e)) => return Err(e.into()),
                Err(LookupError::Failed(e)) => e,
                Ok(addrs) => {
                    let mut last = io::Error::new(ErrorKind::NotFound, "the host has no address");
                    for a in addrs {
                        let left = deadline.saturating_duration_since(Instant::now());
                        let attempt = left.clamp(Duration::from_millis(1), Duration::from_secs(2));
                        match TcpStream::connect_timeout(&a, attempt) {
                            Ok(s) => return Ok(s),
                            Err(e) => last = e,
                        }
                    }
                    last
                }
            };
            if Instant::now() + backoff >= deadline {
                return Err(RendezvousError::Unreachable {
                    addr: addr.to_owned(),
                    waited: started.elapsed(),
                    last_error: last_error.to_string(),
                    origin: self.addr.origin,
                });
            }
            tracing::trace!(%addr, error = %last_error, "rendezvous: retrying");
            std::thread::sleep(backoff);
            backoff = (backoff * 2).min(CONNECT_BACKOFF.1);
        }
    }
}

pub(super) fn table(nonce: u64, entries: Vec<(Option<u32>, Vec<u8>)>) -> PeerTable {
    let peers = (0u32..)
        .zip(entries)
        .map(|(rank, (local_rank, control))| Peer {
            rank,
            local_rank,
            control,
        })
        .collect();
    PeerTable { nonce, peers }
}

/// The table of a single-rank job, which needs no network.
pub fn single_rank_table(local_rank: Option<u32>, control: &[u8], job_key: u64) -> PeerTable {
    table(job_nonce(job_key), vec![(local_rank, control.to_vec())])
}

/// A random 64-bit nonce, mixed with the job key.
pub(super) fn job_nonce(job_key: u64) -> u64 {
    random_u64() ^ job_key
}

/// 64 random bits from the OS.
pub(crate) fn random_u64() -> u64 {
    getrandom::u64().unwrap_or_else(|e| {
        // No OS randomness (very unusual): fall back to std's randomly keyed hasher over the
        // time and pid.
        tracing::warn!(error = %e, "getrandom failed; using a hashed time and pid");
        use std::hash::{BuildHasher, Hash, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        std::time::SystemTime::now().hash(&mut h);
        std::process::id().hash(&mut h);
        h.finish()
    })
}
