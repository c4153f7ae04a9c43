//! Rank 0's side of the rendezvous: accept ranks until all have joined (or the deadline
//! passes), check each hello, then send everyone the table.

use super::rendezvous::{PeerTable, Rendezvous, RendezvousError, job_nonce, table};
use super::wire::{self, By, Hello, Reply, WireError};
use std::collections::BTreeMap;
use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

/// How long rank 0 waits for one connection's hello before dropping it, and gives a joined
/// rank to take the table (or a refusal).
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// Refused connections a timeout's message lists (a flood of strays makes it no longer).
const REJECTED_KEPT: usize = 16;
/// How often rank 0 polls its listener.
const ACCEPT_POLL: Duration = Duration::from_millis(5);

/// A joined rank, waiting for the table.
struct Joined {
    peer: SocketAddr,
    stream: TcpStream,
    local_rank: Option<u32>,
    control: Vec<u8>,
}

/// Rank 0's state while ranks join.
pub(super) struct Server<'a> {
    cfg: &'a Rendezvous,
    listener: TcpListener,
    addr: String,
    started: Instant,
    deadline: Instant,
    /// By rank. A map, not a slot per rank: nothing is held for a rank before it arrives.
    joined: BTreeMap<u32, Joined>,
    rejected: Vec<String>,
    /// Connections refused, those not in `rejected` included.
    rejects: usize,
}

impl<'a> Server<'a> {
    pub(super) fn new(cfg: &'a Rendezvous, listener: TcpListener) -> Result<Self, RendezvousError> {
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
            deadline: cfg.deadline(started),
            joined: BTreeMap::new(),
            rejected: Vec::new(),
            rejects: 0,
        })
    }

    pub(super) fn run(mut self, control: &[u8]) -> Result<PeerTable, RendezvousError> {
        let mut waiting = self.cfg.world_size.saturating_sub(1);
        while waiting > 0 {
            // Every turn: connections that keep coming must not keep rank 0 past it.
            if Instant::now() >= self.deadline {
                return Err(self.fail(self.timeout_error()));
            }
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    if self.admit(stream, peer)? {
                        waiting -= 1;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
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
        tracing::info!(addr = %self.addr, ranks = self.cfg.world_size, nonce, "rendezvous: complete");
        Ok(table(nonce, entries))
    }

    /// Reads one connection's hello; `Ok(true)` when it is a new rank of this job.
    fn admit(&mut self, mut stream: TcpStream, peer: SocketAddr) -> Result<bool, RendezvousError> {
        // The whole hello within this, however it trickles in.
        let left = self.deadline.saturating_duration_since(Instant::now());
        let by = Instant::now() + left.clamp(Duration::from_millis(100), HELLO_TIMEOUT);
        let setup = stream
            .set_nonblocking(false)
            .and_then(|()| stream.set_nodelay(true));
        if let Err(e) = setup {
            tracing::debug!(%peer, error = %e, "rendezvous: dropping a connection");
            return Ok(false);
        }
        let hello = match Hello::read(&mut By(&stream, by)) {
            Ok(h) => h,
            Err(e) => {
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
            self.reject(why);
            return Ok(false);
        }
        if hello.world_size == self.cfg.world_size && hello.rank >= self.cfg.world_size {
            let e = RendezvousError::RankOutOfRange {
                rank: hello.rank,
                peer,
                ranks: self.cfg.world_size,
            };
            refuse(&mut stream, &e.to_string());
            return Err(self.fail(e));
        }
        if hello.world_size != self.cfg.world_size {
            let e = RendezvousError::WorldSizeMismatch {
                rank: hello.rank,
                peer,
                theirs: hello.world_size,
                ours: self.cfg.world_size,
            };
            refuse(&mut stream, &e.to_string());
            return Err(self.fail(e));
        }
        let first = if hello.rank == self.cfg.rank {
            Some("rank 0 itself".to_owned())
        } else {
            self.joined.get(&hello.rank).map(|j| j.peer.to_string())
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
        self.joined.insert(
            hello.rank,
            Joined {
                peer,
                stream,
                local_rank: hello.local_rank,
                control: hello.control,
            },
        );
        Ok(true)
    }

    /// Keeps why a connection was refused, for the timeout's message: the first
    /// [`REJECTED_KEPT`], then only how many more.
    fn reject(&mut self, why: String) {
        self.rejects += 1;
        if self.rejected.len() < REJECTED_KEPT {
            self.rejected.push(why);
        }
    }

    fn timeout_error(&self) -> RendezvousError {
        let mut rejected = self.rejected.clone();
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

    /// Tells every joined rank why the job failed, and returns the error.
    fn fail(&mut self, e: RendezvousError) -> RendezvousError {
        let text = format!("rank 0: {e}");
        for j in self.joined.values_mut() {
            refuse(&mut j.stream, &text);
        }
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
