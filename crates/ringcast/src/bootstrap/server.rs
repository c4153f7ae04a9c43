//! Rank 0's side of the rendezvous: accept ranks until all have joined (or the deadline
//! passes), check each hello, then send everyone the table.
//!
//! Hellos are read from every pending connection at once (non-blocking sockets polled with
//! mio, a buffer each), so that a connection that says nothing (a port scanner, a health
//! check) costs a pending slot until its own timeout, not the other ranks' turn.
//!
//! One bad hello does not fail the job: a process of another job, or one that disagrees with
//! rank 0 about the world size, claims a rank outside it, or claims a rank already joined, is
//! refused (it hears why at once), logged and counted, and rank 0 goes on waiting for the
//! job's own ranks. The exception is a hello that carries this job's key (both sides know it
//! and it is the same) but another world size: ranks of one launch disagree, so the job as
//! started cannot meet, and rank 0 fails at once with [`RendezvousError::WorldSizeMismatch`],
//! telling every rank that has joined or is sending its hello why, rather than waiting out
//! its timeout; for up to [`Rendezvous::linger`] after, it tells the job's ranks that come late why too
//! (until each rank of its world has been told), rather than leave them to retry a closed
//! port until their own timeout. (Without a job key on both sides the hello may be another
//! job's, and is refused alone.)
//!
//! Of two claims to one rank the first is kept while its connection is open: rank 0 cannot
//! tell which process is right, and the first has been waiting for the table since; a first
//! claimant whose connection has closed (killed, restarted by its launcher) could never take
//! the table, so the second takes its place. For the same reason, once every rank has joined,
//! those whose connection has closed since are dropped and waited for again. If the rank a
//! refused hello claimed never comes, the timeout names it as missing and lists the refusal.

use super::rendezvous::{PeerTable, Rendezvous, RendezvousError, job_nonce, table};
use super::wire::{self, By, Hello, MAX_HELLO_LEN, Reply, WireError};
use mio::{Events, Interest, Poll, Token};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{self, ErrorKind, Read};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// How long rank 0 waits for one connection's hello before dropping it, and gives a joined
/// rank to take the table (or a refusal).
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections whose hello is still coming that rank 0 holds at once. More wait in the
/// listener's backlog until one of these completes or times out: a flood of silent
/// connections delays the ranks behind it by at most [`HELLO_TIMEOUT`] a round, and costs
/// rank 0 a bounded number of sockets and buffers.
const MAX_PENDING: usize = 256;
/// How soon the rendezvous tries again to accept connections it could not (out of descriptors
/// or memory).
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// Whether an `accept(2)` error is one connection's, not the listener's: the errors the call
/// passes on from a connection that failed while it was queued (Linux's accept(2) lists them:
/// treat them as EAGAIN), and a connection refused by a firewall hook.
fn one_connection_s(e: &io::Error) -> bool {
    // EPROTO, ENOPROTOOPT, EHOSTDOWN, ENONET, EOPNOTSUPP (Linux's numbers): no std kind of
    // their own.
    const OTHERS: [i32; 5] = [71, 92, 112, 64, 95];
    matches!(
        e.kind(),
        ErrorKind::Interrupted
            | ErrorKind::ConnectionAborted
            | ErrorKind::ConnectionReset
            | ErrorKind::NetworkDown
            | ErrorKind::NetworkUnreachable
            | ErrorKind::HostUnreachable
            | ErrorKind::PermissionDenied
    ) || e.raw_os_error().is_some_and(|n| OTHERS.contains(&n))
}

/// Refused connections a timeout's message lists (a flood of strays makes it no longer); as
/// many again of this job's refused hellos, which come first.
const REJECTED_KEPT: usize = 16;
/// The listener's token; pending connections count up from 0.
const LISTENER: Token = Token(usize::MAX);

/// Whether a hello's job key and rank 0's may be one job's: equal, or either unknown (0).
fn may_be_one_job(theirs: u64, ours: u64) -> bool {
    theirs == 0 || ours == 0 || theirs == ours
}

/// A joined rank, waiting for the table.
struct Joined {
    peer: SocketAddr,
    stream: TcpStream,
    local_rank: Option<u32>,
    control: Vec<u8>,
}

/// An accepted connection whose hello is still coming.
struct Pending {
    peer: SocketAddr,
    stream: mio::net::TcpStream,
    /// What it sent so far, at most [`MAX_HELLO_LEN`].
    hello: Vec<u8>,
    accepted: Instant,
}

impl Pending {
    /// Why it is dropped, `waited` after it connected, without a whole hello.
    fn silent(&self, waited: Duration) -> String {
        let secs = waited.as_secs_f64();
        match self.hello.len() {
            0 => format!("{} (sent no hello within {secs:.1} s)", self.peer),
            n => format!(
                "{} (sent {n} bytes, not a whole hello, within {secs:.1} s)",
                self.peer
            ),
        }
    }
}

/// Rank 0's state while ranks join.
pub(super) struct Server<'a> {
    cfg: &'a Rendezvous,
    listener: mio::net::TcpListener,
    poll: Poll,
    /// By token.
    pending: HashMap<Token, Pending>,
    next_token: usize,
    addr: String,
    started: Instant,
    deadline: Instant,
    /// By rank. A map, not a slot per rank: nothing is held for a rank before it arrives.
    joined: BTreeMap<u32, Joined>,
    /// Why hellos of this job were refused (a wrong world size or rank) or joined ranks
    /// dropped (gone before the table), for the timeout's message: the likeliest reasons a
    /// rank is missing, so kept apart from the strays.
    refused: Vec<String>,
    /// Why other connections were refused.
    rejected: Vec<String>,
    /// Connections refused or dropped, those in neither list included.
    rejects: usize,
    /// The job failed at once: what rank 0 tells every rank of it that comes late
    /// ([`Server::linger`]), and the ranks told so far.
    failed: Option<(String, BTreeSet<u32>)>,
}

impl<'a> Server<'a> {
    pub(super) fn new(cfg: &'a Rendezvous, listener: TcpListener) -> Result<Self, RendezvousError> {
        let addr = cfg.addr.to_string();
        let io_err = |source| RendezvousError::Io {
            addr: addr.clone(),
            source,
        };
        listener.set_nonblocking(true).map_err(io_err)?;
        let mut listener = mio::net::TcpListener::from_std(listener);
        let poll = Poll::new().map_err(io_err)?;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)
            .map_err(io_err)?;
        let started = Instant::now();
        Ok(Server {
            cfg,
            listener,
            poll,
            pending: HashMap::new(),
            next_token: 0,
            addr,
            started,
            deadline: cfg.deadline(started),
            joined: BTreeMap::new(),
            refused: Vec::new(),
            rejected: Vec::new(),
            rejects: 0,
            failed: None,
        })
    }

    pub(super) fn run(mut self, control: &[u8]) -> Result<PeerTable, RendezvousError> {
        let mut events = Events::with_capacity(MAX_PENDING + 1);
        let mut waiting = self.cfg.world_size.saturating_sub(1);
        while waiting > 0 {
            // Every turn: connections that keep coming must not keep rank 0 past it.
            let now = Instant::now();
            if now >= self.deadline {
                for p in std::mem::take(&mut self.pending).into_values() {
                    self.reject(p.silent(now.saturating_duration_since(p.accepted)));
                }
                return Err(self.fail(self.timeout_error()));
            }
            self.expire(now);
            let again = self.accept();
            // Until the next hello could time out, the deadline at the latest (soon, where
            // connections wait that could not be accepted yet).
            let wake = self
                .pending
                .values()
                .map(|p| p.accepted + HELLO_TIMEOUT)
                .chain(again.then(|| now + ACCEPT_RETRY))
                .fold(self.deadline, Instant::min);
            let wait = wake.saturating_duration_since(Instant::now());
            if let Err(source) = self.poll.poll(&mut events, Some(wait)) {
                if source.kind() == ErrorKind::Interrupted {
                    continue;
                }
                let addr = self.addr.clone();
                return Err(self.fail(RendezvousError::Io { addr, source }));
            }
            for event in &events {
                // The listener's turn comes at the top of the loop.
                if event.token() == LISTENER {
                    continue;
                }
                match self.read_hello(event.token()) {
                    Ok(true) => waiting -= 1,
                    Ok(false) => {}
                    Err(e) => {
                        // Ranks whose hello is still coming hear why at once, below; those
                        // whose bytes already name them count as told.
                        let halfway = match &e {
                            RendezvousError::WorldSizeMismatch { .. } => self.pending_ranks(),
                            _ => Vec::new(),
                        };
                        let e = self.fail(e);
                        if let RendezvousError::WorldSizeMismatch { rank, .. } = &e {
                            self.linger(&e, *rank, halfway);
                        }
                        return Err(e);
                    }
                }
            }
            if waiting == 0 {
                // A rank that left since its hello could not take the table: wait for it
                // again (its launcher may restart it) rather than hand everyone a dead entry.
                waiting = self.drop_gone();
            }
        }
        let nonce = job_nonce(self.cfg.job_key);
        // Every rank is here now, so these are as long as the ranks that came.
        let mut entries = Vec::with_capacity(self.joined.len() + 1);
        let mut streams = Vec::with_capacity(self.joined.len());
        for rank in 0..self.cfg.world_size {
            match self.joined.remove(&rank) {
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
        // Each rank gets its own time to take it: one that does not read costs the others
        // that much, not a rank 0 blocked for good.
        for (peer, stream) in streams {
            let by = Instant::now() + HELLO_TIMEOUT;
            if let Err(e) = wire::send(&mut By(&stream, by), &reply) {
                tracing::warn!(%peer, error = %e, "rendezvous: a rank left before getting the table");
            }
        }
        tracing::info!(
            addr = %self.addr,
            ranks = self.cfg.world_size,
            nonce,
            refused = self.rejects,
            "rendezvous: complete"
        );
        Ok(table(nonce, entries))
    }

    /// Accepts connections while there is room for them. True where some may be left that
    /// could not be accepted now (out of descriptors or memory): the caller tries again
    /// after [`ACCEPT_RETRY`]. One connection's trouble (`accept(2)` passes on its network
    /// errors) costs that connection only; no error ends the rendezvous, which ends at its
    /// deadline naming the ranks that never came.
    fn accept(&mut self) -> bool {
        while self.pending.len() < MAX_PENDING {
            match self.listener.accept() {
                Ok((mut stream, peer)) => {
                    let token = Token(self.next_token);
                    self.next_token += 1;
                    let registered =
                        self.poll
                            .registry()
                            .register(&mut stream, token, Interest::READABLE);
                    if let Err(e) = registered {
                        tracing::debug!(%peer, error = %e, "rendezvous: dropping a connection");
                        continue;
                    }
                    let pending = Pending {
                        peer,
                        stream,
                        hello: Vec::new(),
                        accepted: Instant::now(),
                    };
                    self.pending.insert(token, pending);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if one_connection_s(&e) => {
                    tracing::debug!(error = %e, "rendezvous: a connection failed as it came");
                }
                Err(e) => {
                    tracing::warn!(addr = %self.addr, error = %e, "rendezvous: cannot accept now");
                    return true;
                }
            }
        }
        false
    }

    /// The ranks of this job (or of none: no job key) whose hello, still coming, already
    /// names them: what each pending connection sent so far is read first.
    fn pending_ranks(&mut self) -> Vec<u32> {
        let ours = self.cfg.job_key;
        let mut ranks = Vec::new();
        for p in self.pending.values_mut() {
            // Best effort: what it sent before an error still counts.
            let _ = read_some(&mut p.stream, &mut p.hello);
            if let Some((rank, key)) = Hello::rank_and_key(&p.hello)
                && may_be_one_job(key, ours)
            {
                ranks.push(rank);
            }
        }
        ranks
    }

    /// Drops the connections that sent no whole hello within [`HELLO_TIMEOUT`].
    fn expire(&mut self, now: Instant) {
        let late: Vec<Token> = self
            .pending
            .iter()
            .filter(|(_, p)| now >= p.accepted + HELLO_TIMEOUT)
            .map(|(t, _)| *t)
            .collect();
        for token in late {
            if let Some(p) = self.pending.remove(&token) {
                tracing::debug!(peer = %p.peer, "rendezvous: dropping a silent connection");
                self.reject(p.silent(HELLO_TIMEOUT));
            }
        }
    }

    /// Reads what a pending connection sent; once its hello is whole (or cannot become one),
    /// takes it out of the pending ones and admits it. Whether it is a new rank of this job;
    /// an error when its hello shows that the job cannot meet (see [`Server::admit`]).
    fn read_hello(&mut self, token: Token) -> Result<bool, RendezvousError> {
        let Some(p) = self.pending.get_mut(&token) else {
            return Ok(false);
        };
        let read = read_some(&mut p.stream, &mut p.hello);
        let hello = match Hello::read(&mut &p.hello[..]) {
            // Not all of it yet.
            Err(WireError::Io(e)) if e.kind() == ErrorKind::UnexpectedEof => match read {
                Ok(false) => return Ok(false),
                Ok(true) => Err(format!(
                    "closed the connection after {} bytes, not a whole hello",
                    p.hello.len()
                )),
                Err(e) => Err(e.to_string()),
            },
            parsed => Ok(parsed),
        };
        let Some(mut p) = self.pending.remove(&token) else {
            return Ok(false);
        };
        if let Err(e) = self.poll.registry().deregister(&mut p.stream) {
            tracing::debug!(peer = %p.peer, error = %e, "rendezvous: deregistering a connection");
        }
        let peer = p.peer;
        // Blocking again: what rank 0 writes to it below and later is bounded by `By`.
        let mut stream = TcpStream::from(p.stream);
        let setup = stream
            .set_nonblocking(false)
            .and_then(|()| stream.set_nodelay(true));
        if let Err(e) = setup {
            tracing::debug!(%peer, error = %e, "rendezvous: dropping a connection");
            return Ok(false);
        }
        let hello = match hello {
            Ok(Ok(h)) => h,
            Ok(Err(e)) => {
                if let WireError::Version(_) = e {
                    refuse(
                        &mut stream,
                        &format!("{e}; run the same ringcast build on every rank"),
                    );
                }
                tracing::debug!(%peer, error = %e, "rendezvous: dropping a connection");
                self.reject(format!("{peer} ({e})"));
                return Ok(false);
            }
            Err(why) => {
                tracing::debug!(%peer, error = %why, "rendezvous: dropping a connection");
                self.reject(format!("{peer} ({why})"));
                return Ok(false);
            }
        };
        self.admit(stream, peer, hello)
    }

    /// Checks a whole hello; whether it is a new rank of this job. A hello that carries this
    /// job's key (both non-zero and equal) but another world size is an error: the ranks of
    /// one launch disagree, so the job as started cannot meet, and waiting out the timeout
    /// would only hide why. The process is told why before the error is returned.
    fn admit(
        &mut self,
        mut stream: TcpStream,
        peer: SocketAddr,
        hello: Hello,
    ) -> Result<bool, RendezvousError> {
        let ours = self.cfg.job_key;
        if !may_be_one_job(hello.job_key, ours) {
            let why = format!(
                "rank {} from {peer} belongs to another job (job key {:016x}, rank 0's is {ours:016x})",
                hello.rank, hello.job_key
            );
            refuse(
                &mut stream,
                &format!("{why}; give each job its own RINGCAST_BOOTSTRAP port"),
            );
            tracing::warn!("rendezvous: {why}");
            self.reject(why);
            return Ok(false);
        }
        if let Some((text, told)) = &mut self.failed {
            refuse(&mut stream, text);
            told.insert(hello.rank);
            tracing::debug!(rank = hello.rank, %peer, "rendezvous: told a late rank why the job failed");
            return Ok(false);
        }
        let same_job = ours != 0 && hello.job_key == ours;
        let replaced = match self.fits(&hello, peer) {
            Ok(replaced) => replaced,
            Err(e @ RendezvousError::WorldSizeMismatch { .. }) if same_job => {
                refuse(&mut stream, &format!("the job cannot meet: {e}"));
                return Err(e);
            }
            Err(e) => {
                // This process alone is wrong (or a stray): it hears why at once, and the
                // ranks that are right go on meeting.
                refuse(&mut stream, &e.to_string());
                tracing::warn!(%peer, rank = hello.rank, refused = self.rejects + 1, "rendezvous: {e}");
                self.reject_rank(e.to_string());
                return Ok(false);
            }
        };
        tracing::debug!(rank = hello.rank, %peer, "rendezvous: rank joined");
        self.joined.insert(
            hello.rank,
            Joined {
                peer,
                stream,
                local_rank: hello.local_rank,
                control: hello.control,
            },
        );
        // A rank that took a gone claimant's place was counted when that one joined.
        Ok(!replaced)
    }

    /// Whether a hello of this job may join, and why not. A rank already joined whose
    /// connection has closed is dropped here, so that this hello takes its place: `Ok(true)`.
    fn fits(&mut self, hello: &Hello, peer: SocketAddr) -> Result<bool, RendezvousError> {
        let ours = self.cfg.world_size;
        if hello.world_size == ours && hello.rank >= ours {
            return Err(RendezvousError::RankOutOfRange {
                rank: hello.rank,
                peer,
                ranks: ours,
            });
        }
        if hello.world_size != ours {
            return Err(RendezvousError::WorldSizeMismatch {
                rank: hello.rank,
                peer,
                theirs: hello.world_size,
                ours,
            });
        }
        let first = if hello.rank == self.cfg.rank {
            Some("rank 0 itself".to_owned())
        } else {
            match self.joined.get(&hello.rank) {
                Some(j) if closed(&j.stream) => {
                    tracing::warn!(
                        rank = hello.rank,
                        first = %j.peer,
                        second = %peer,
                        "rendezvous: a rank's first connection closed before the table; its \
                         second takes its place"
                    );
                    self.joined.remove(&hello.rank);
                    return Ok(true);
                }
                Some(j) => Some(j.peer.to_string()),
                None => None,
            }
        };
        match first {
            Some(first) => Err(RendezvousError::DuplicateRank {
                rank: hello.rank,
                first,
                second: peer,
            }),
            None => Ok(false),
        }
    }

    /// Drops the joined ranks whose connection has closed; how many.
    fn drop_gone(&mut self) -> u32 {
        let gone: Vec<u32> = self
            .joined
            .iter()
            .filter(|(_, j)| closed(&j.stream))
            .map(|(rank, _)| *rank)
            .collect();
        for rank in &gone {
            if let Some(j) = self.joined.remove(rank) {
                let why = format!(
                    "rank {rank} from {} closed its connection before the table",
                    j.peer
                );
                tracing::warn!("rendezvous: {why}; waiting for it again");
                self.reject_rank(why);
            }
        }
        u32::try_from(gone.len()).unwrap_or(u32::MAX)
    }

    /// Keeps why a connection was refused, for the timeout's message: the first
    /// [`REJECTED_KEPT`], then only how many more.
    fn reject(&mut self, why: String) {
        self.rejects += 1;
        if self.rejected.len() < REJECTED_KEPT {
            self.rejected.push(why);
        }
    }

    /// As [`Server::reject`], for this job's own ranks, listed ahead of the strays.
    fn reject_rank(&mut self, why: String) {
        self.rejects += 1;
        if self.refused.len() < REJECTED_KEPT {
            self.refused.push(why);
        }
    }

    fn timeout_error(&self) -> RendezvousError {
        let mut rejected = self.refused.clone();
        rejected.extend_from_slice(&self.rejected);
        if self.rejects > rejected.len() {
            rejected.push(format!("{} more", self.rejects - rejected.len()));
        }
        let missing = (0..self.cfg.world_size)
            .filter(|r| *r != self.cfg.rank && !self.joined.contains_key(r))
            .collect();
        RendezvousError::Timeout {
            addr: self.addr.clone(),
            waited: self.started.elapsed(),
            missing,
            origin: self.cfg.addr.origin,
            rejected,
        }
    }

    /// After the job failed at once with `e` (`culprit` the rank whose hello showed it, told
    /// already, as the joined ranks and those `halfway` through their hello were): for up to
    /// [`Rendezvous::linger`], or until every rank of rank 0's world has been told, reads the hellos of
    /// ranks that come late and tells each why (a process of another job still hears that it
    /// is one).
    fn linger(&mut self, e: &RendezvousError, culprit: u32, halfway: Vec<u32>) {
        let mut told: BTreeSet<u32> = self.joined.keys().copied().collect();
        told.insert(culprit);
        told.extend(halfway);
        self.joined.clear();
        self.failed = Some((format!("the job failed: {e}"), told));
        let until = Instant::now() + self.cfg.linger.min(ringcast_core::MAX_TIMEOUT);
        let mut events = Events::with_capacity(MAX_PENDING + 1);
        let world = self.cfg.world_size;
        let all_told = |s: &Self| {
            s.failed
                .as_ref()
                .is_some_and(|(_, told)| (1..world).all(|r| r == s.cfg.rank || told.contains(&r)))
        };
        while !all_told(self) {
            let now = Instant::now();
            if now >= until {
                break;
            }
            self.expire(now);
            let wait = if self.accept() {
                ACCEPT_RETRY.min(until - now)
            } else {
                until - now
            };
            match self.poll.poll(&mut events, Some(wait)) {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => break,
            }
            for event in &events {
                if event.token() != LISTENER {
                    // Never an error: `admit` refuses every hello once the job failed.
                    let _ = self.read_hello(event.token());
                }
            }
        }
        let text = self
            .failed
            .as_ref()
            .map(|(t, _)| t.clone())
            .unwrap_or_default();
        self.refuse_pending(&text);
    }

    /// Tells every connection whose hello is still coming `text` (a rank halfway through its
    /// hello hears why rather than a closed connection), and drops it.
    fn refuse_pending(&mut self, text: &str) {
        for p in std::mem::take(&mut self.pending).into_values() {
            let mut stream = TcpStream::from(p.stream);
            if stream.set_nonblocking(false).is_ok() {
                refuse(&mut stream, text);
            }
        }
    }

    /// Tells every joined rank, and every connection whose hello is still coming (a rank
    /// halfway through its hello hears why rather than a closed connection), why the job
    /// failed, and returns the error.
    fn fail(&mut self, e: RendezvousError) -> RendezvousError {
        let text = format!("the job failed: {e}");
        for j in self.joined.values_mut() {
            refuse(&mut j.stream, &text);
        }
        self.refuse_pending(&text);
        tracing::error!("rendezvous: {e}");
        e
    }
}

/// Best effort, within a second: the peer may already be gone, or not read.
fn refuse(stream: &mut TcpStream, text: &str) {
    let by = Instant::now() + Duration::from_secs(1);
    if let Err(e) = wire::send(
        &mut By(stream, by),
        &Reply::Refused(text.to_owned()).encode(),
    ) {
        tracing::debug!(error = %e, "rendezvous: could not deliver a refusal");
    }
}

/// Whether the peer has closed a joined rank's connection (or it broke). A joining rank sends
/// nothing after its hello, so a connection with bytes to read is open; one that cannot be
/// checked is taken as open, and one that cannot be made blocking again as closed (rank 0
/// could not send it the table).
fn closed(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return false;
    }
    let closed = match stream.peek(&mut [0u8]) {
        Ok(n) => n == 0,
        Err(e) => !matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted),
    };
    stream.set_nonblocking(false).is_err() || closed
}

/// Reads what `stream` has (non-blocking) into `hello`, up to [`MAX_HELLO_LEN`] in all:
/// whether the peer closed its side.
fn read_some(stream: &mut mio::net::TcpStream, hello: &mut Vec<u8>) -> io::Result<bool> {
    let mut chunk = [0u8; 1024];
    loop {
        // Past the longest hello the bytes already say whether it is one.
        let room = MAX_HELLO_LEN.saturating_sub(hello.len()).min(chunk.len());
        if room == 0 {
            return Ok(false);
        }
        match stream.read(&mut chunk[..room]) {
            Ok(0) => return Ok(true),
            Ok(n) => hello.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What accept(2) passes on from one failed connection costs that connection; running out
    /// of descriptors or memory is waited out; neither ends the rendezvous.
    #[test]
    fn a_connection_s_failure_is_not_the_listener_s() {
        // EINTR, EPERM, ECONNABORTED, ECONNRESET, ENETDOWN, ENETUNREACH, EHOSTUNREACH, and
        // the five without a kind.
        for n in [4, 1, 103, 104, 100, 101, 113, 71, 92, 112, 64, 95] {
            assert!(one_connection_s(&io::Error::from_raw_os_error(n)), "{n}");
        }
        // EMFILE, ENFILE, ENOBUFS, ENOMEM, EBADF.
        for n in [24, 23, 105, 12, 9] {
            assert!(!one_connection_s(&io::Error::from_raw_os_error(n)), "{n}");
        }
    }
}
