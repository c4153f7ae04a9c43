//! The TCP rendezvous: rank 0 listens, every other rank connects and sends its rank, world size
//! and control addresses (an opaque blob); rank 0 checks them and answers everyone with the
//! whole table and a random 64-bit job nonce.

use super::env::{DEFAULT_TIMEOUT, JobEnv, RendezvousAddr};
use super::wire::{self, Hello, MAX_CONTROL_LEN, Reply, WireError};
use std::io::{self, ErrorKind};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

/// How long rank 0 waits for one connection's hello before dropping it.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// A joining rank waits this much past its deadline for rank 0's answer, so that rank 0's own
/// timeout report (which names the missing ranks) arrives first.
const REPLY_GRACE: Duration = Duration::from_secs(2);
/// How often rank 0 polls its listener.
const ACCEPT_POLL: Duration = Duration::from_millis(5);
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

/// A failed rendezvous. Messages name the address and the variables behind it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RendezvousError {
    /// Rank 0 could not listen.
    #[error(
        "rank 0 could not listen on port {port} (from {origin}): {source}; set RINGCAST_BOOTSTRAP \
         to host:port with a free port"
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
        "waited {} s for ranks {} at {addr}; are they started with the same {origin}?{}",
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
    /// Two processes claim one rank.
    #[error(
        "rank {rank} joined twice (from {first} and {second}): every process needs its own rank; \
         check RINGCAST_RANK / the launcher's rank variable"
    )]
    DuplicateRank {
        /// The rank.
        rank: u32,
        /// The first claimant.
        first: String,
        /// The second.
        second: SocketAddr,
    },
    /// A rank disagrees with rank 0 about the world size, or sent a rank outside it.
    #[error(
        "rank {rank} (from {peer}) says the world has {theirs} ranks, rank 0 says {ours}: start \
         every rank with the same world size (RINGCAST_WORLD_SIZE / the launcher's size variable)"
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
    /// A joining rank never reached rank 0.
    #[error(
        "could not connect to the rendezvous at {addr} for {} s (last error: {last_error}); is \
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
    /// Rank 0 accepted but never answered.
    #[error(
        "rank 0 at {addr} did not answer within {} s; see its log (RINGCAST_BOOTSTRAP_TIMEOUT \
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
    #[error("the rendezvous at {addr} failed: {message}")]
    Refused {
        /// The rendezvous address.
        addr: String,
        /// Rank 0's explanation.
        message: String,
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
        })
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
        check_control(control)?;
        Server::new(self, listener)?.run(control)
    }

    /// A non-zero rank's side: connects (retrying until the deadline), sends its hello and
    /// waits for the table.
    pub fn join(&self, control: &[u8]) -> Result<PeerTable, RendezvousError> {
        check_control(control)?;
        let started = Instant::now();
        let deadline = started + self.timeout;
        let addr = self.addr.to_string();
        let mut stream = self.connect(&addr, started, deadline)?;
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
        wire::send(&mut stream, &hello.encode()).map_err(io_err)?;
        let wait = deadline.saturating_duration_since(Instant::now()) + REPLY_GRACE;
        stream.set_read_timeout(Some(wait)).map_err(io_err)?;
        match Reply::read(&mut stream, self.world_size) {
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
                Err(RendezvousError::Refused {
                    addr,
                    message: "rank 0 closed the connection without an answer; see its log".into(),
                })
            }
            Err(e) => Err(RendezvousError::Protocol {
                addr,
                detail: e.to_string(),
                origin: self.addr.origin,
            }),
        }
    }

    /// Connects to rank 0, retrying with backoff (it may not listen yet) until `deadline`.
    fn connect(
        &self,
        addr: &str,
        started: Instant,
        deadline: Instant,
    ) -> Result<TcpStream, RendezvousError> {
        let mut backoff = CONNECT_BACKOFF.0;
        loop {
            let last_error = match (self.addr.host.as_str(), self.addr.port).to_socket_addrs() {
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
                Err(e) => e,
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

fn check_control(control: &[u8]) -> Result<(), RendezvousError> {
    if control.len() > MAX_CONTROL_LEN {
        return Err(RendezvousError::ControlTooLong(control.len()));
    }
    Ok(())
}

fn table(nonce: u64, entries: Vec<(Option<u32>, Vec<u8>)>) -> PeerTable {
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
fn job_nonce(job_key: u64) -> u64 {
    let random = getrandom::u64().unwrap_or_else(|e| {
        // No OS randomness (very unusual): fall back to std's randomly keyed hasher over the
        // time and pid.
        tracing::warn!(error = %e, "rendezvous: getrandom failed; using a hashed time and pid");
        use std::hash::{BuildHasher, Hash, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        std::time::SystemTime::now().hash(&mut h);
        std::process::id().hash(&mut h);
        h.finish()
    });
    random ^ job_key
}

/// A joined rank, waiting for the table.
struct Joined {
    peer: SocketAddr,
    stream: TcpStream,
    local_rank: Option<u32>,
    control: Vec<u8>,
}

/// Rank 0's state while ranks join.
struct Server<'a> {
    cfg: &'a Rendezvous,
    listener: TcpListener,
    addr: String,
    started: Instant,
    deadline: Instant,
    joined: Vec<Option<Joined>>,
    rejected: Vec<String>,
}

impl<'a> Server<'a> {
    fn new(cfg: &'a Rendezvous, listener: TcpListener) -> Result<Self, RendezvousError> {
        let addr = cfg.addr.to_string();
        listener
            .set_nonblocking(true)
            .map_err(|source| RendezvousError::Io {
                addr: addr.clone(),
                source,
            })?;
        let started = Instant::now();
        Ok(Server {
            cfg,
            listener,
            addr,
            started,
            deadline: started + cfg.timeout,
            joined: (0..cfg.world_size).map(|_| None).collect(),
            rejected: Vec::new(),
        })
    }

    fn run(mut self, control: &[u8]) -> Result<PeerTable, RendezvousError> {
        let mut waiting = self.cfg.world_size.saturating_sub(1);
        while waiting > 0 {
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    if self.admit(stream, peer)? {
                        waiting -= 1;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if Instant::now() >= self.deadline {
                        return Err(self.fail(self.timeout_error()));
                    }
                    std::thread::sleep(ACCEPT_POLL);
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        ErrorKind::Interrupted | ErrorKind::ConnectionAborted
                    ) => {}
                Err(source) => {
                    let addr = self.addr.clone();
                    return Err(self.fail(RendezvousError::Io { addr, source }));
                }
            }
        }
        let nonce = job_nonce(self.cfg.job_key);
        let mut entries = Vec::with_capacity(self.joined.len());
        let mut streams = Vec::with_capacity(self.joined.len());
        for (rank, slot) in (0u32..).zip(self.joined) {
            match slot {
                Some(j) => {
                    entries.push((j.local_rank, j.control));
                    streams.push((j.peer, j.stream));
                }
                None if rank == self.cfg.rank => {
                    entries.push((self.cfg.local_rank, control.to_vec()));
                }
                None => {
                    // Unreachable: `waiting` counted every other slot filled.
                    entries.push((None, Vec::new()));
                }
            }
        }
        let reply = Reply::Table {
            nonce,
            entries: entries.clone(),
        }
        .encode();
        for (peer, mut stream) in streams {
            if let Err(e) = wire::send(&mut stream, &reply) {
                tracing::warn!(%peer, error = %e, "rendezvous: a rank left before getting the table");
            }
        }
        tracing::info!(addr = %self.addr, ranks = self.cfg.world_size, nonce, "rendezvous: complete");
        Ok(table(nonce, entries))
    }

    /// Reads one connection's hello; `Ok(true)` when it is a new rank of this job.
    fn admit(&mut self, mut stream: TcpStream, peer: SocketAddr) -> Result<bool, RendezvousError> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        let setup = stream
            .set_nonblocking(false)
            .and_then(|()| {
                stream.set_read_timeout(Some(left.clamp(Duration::from_millis(100), HELLO_TIMEOUT)))
            })
            .and_then(|()| stream.set_nodelay(true));
        if let Err(e) = setup {
            tracing::debug!(%peer, error = %e, "rendezvous: dropping a connection");
            return Ok(false);
        }
        let hello = match Hello::read(&mut stream) {
            Ok(h) => h,
            Err(e) => {
                if let WireError::Version(_) = e {
                    refuse(
                        &mut stream,
                        &format!("{e}; run the same ringcast build on every rank"),
                    );
                }
                tracing::debug!(%peer, error = %e, "rendezvous: dropping a connection");
                self.rejected.push(format!("{peer} ({e})"));
                return Ok(false);
            }
        };
        let ours = self.cfg.job_key;
        if hello.job_key != 0 && ours != 0 && hello.job_key != ours {
            let why = format!(
                "rank {} from {peer} belongs to another job (job key {:016x}, rank 0's is {ours:016x})",
                hello.rank, hello.job_key
            );
            refuse(
                &mut stream,
                &format!("{why}; give each job its own RINGCAST_BOOTSTRAP port"),
            );
            tracing::warn!("rendezvous: {why}");
            self.rejected.push(why);
            return Ok(false);
        }
        if hello.world_size != self.cfg.world_size || hello.rank >= self.cfg.world_size {
            let e = RendezvousError::WorldSizeMismatch {
                rank: hello.rank,
                peer,
                theirs: hello.world_size,
                ours: self.cfg.world_size,
            };
            refuse(&mut stream, &e.to_string());
            return Err(self.fail(e));
        }
        let slot = hello.rank as usize;
        let first = if hello.rank == self.cfg.rank {
            Some("rank 0 itself".to_owned())
        } else {
            self.joined
                .get(slot)
                .and_then(|j| j.as_ref().map(|j| j.peer.to_string()))
        };
        if let Some(first) = first {
            let e = RendezvousError::DuplicateRank {
                rank: hello.rank,
                first,
                second: peer,
            };
            refuse(&mut stream, &e.to_string());
            return Err(self.fail(e));
        }
        tracing::debug!(rank = hello.rank, %peer, "rendezvous: rank joined");
        if let Some(s) = self.joined.get_mut(slot) {
            *s = Some(Joined {
                peer,
                stream,
                local_rank: hello.local_rank,
                control: hello.control,
            });
        }
        Ok(true)
    }

    fn timeout_error(&self) -> RendezvousError {
        let missing = (0u32..)
            .zip(&self.joined)
            .filter(|(r, j)| j.is_none() && *r != self.cfg.rank)
            .map(|(r, _)| r)
            .collect();
        RendezvousError::Timeout {
            addr: self.addr.clone(),
            waited: self.started.elapsed(),
            missing,
            origin: self.cfg.addr.origin,
            rejected: self.rejected.clone(),
        }
    }

    /// Tells every joined rank why the job failed, and returns the error.
    fn fail(&mut self, e: RendezvousError) -> RendezvousError {
        let text = format!("rank 0: {e}");
        for j in self.joined.iter_mut().flatten() {
            refuse(&mut j.stream, &text);
        }
        tracing::error!("rendezvous: {e}");
        e
    }
}

/// Best effort: the peer may already be gone.
fn refuse(stream: &mut TcpStream, text: &str) {
    if let Err(e) = wire::send(stream, &Reply::Refused(text.to_owned()).encode()) {
        tracing::debug!(error = %e, "rendezvous: could not deliver a refusal");
    }
}
