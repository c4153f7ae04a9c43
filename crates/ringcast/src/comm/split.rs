//! [`Communicator::split`], [`Communicator::dup`] and [`Communicator::split_by_host`]: new
//! communicators over a subset of the ranks, as `MPI_Comm_split` and `ncclCommSplit` make
//! them, without a new rendezvous.
//!
//! Every rank of the parent calls it. Each binds a control listener for the new communicator
//! first, then the parent Allgathers one [`RECORD`]-byte record per rank, as a collective of
//! its own kind (`SPLIT_TAG`): its color, key, listener address, 64 random bits and which call
//! it made (or that it has no color, or could not listen). Each
//! color's members, ordered by key and then by parent rank, build a communicator from that
//! table with the parent's settings, under a nonce hashed from the parent's, the color and the
//! members' random bits: every new communicator has its own multicast groups and Q_Key, and
//! the members agree on it from what they exchanged alone.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::Communicator;
use super::builder::CommBuilder;
use super::error::{BuildError, CommError};
use ringcast_core::port::splitmix64;
use ringcast_transport_rocev2_udp::control::ControlError;

/// Bytes of one rank's record.
pub(super) const RECORD: usize = 40;

/// What a communicator split from this one starts from.
#[derive(Debug)]
pub(super) struct Lineage {
    /// The parent's builder settings (no rank, size, peers or listener).
    pub(super) settings: CommBuilder,
    /// Where this rank listens for control connections (the new listener's address).
    pub(super) ip: IpAddr,
    /// The interface the parent's multicast runs on.
    pub(super) iface: Ipv4Addr,
    /// The parent's nonce.
    pub(super) nonce: u64,
    /// The parent's chunk size.
    pub(super) chunk: u32,
    /// Per rank, the lowest rank on its host ([`Communicator::split_by_host`]'s colors).
    pub(super) hosts: Vec<u32>,
    /// The first core of this rank's threads with `RINGCAST_PIN=1`, which its children
    /// take too.
    pub(super) pin_base: usize,
    /// The builds of communicators split from this one under way, and what ends them: an
    /// [`abort`](Communicator::abort), or the loss of a member (its parent connections
    /// closed).
    pub(super) builds: Arc<Builds>,
}

/// The builds of new communicators a communicator's splits have under way, each with the
/// flag that gives it up, and the parent ranks lost so far: a member that dies (or aborts)
/// while the others connect the new communicator's control mesh fails their builds at once
/// ([`SplitError::MemberGone`]), where they waited for it up to their connect timeout; one
/// whose goodbye to the parent blamed another rank (it left over that rank's failure) is
/// named with it ([`SplitError::MemberLeft`]). Once a build's mesh is up, its own
/// connections watch the members (one that leaves its parent then, its own part done, is no
/// loss), and only the parent's abort still ends it.
#[derive(Debug, Default)]
pub(crate) struct Builds(Mutex<BuildsState>);

#[derive(Debug, Default)]
struct BuildsState {
    aborted: bool,
    /// Parent ranks whose connections closed, each with the rank its goodbye blamed (it left
    /// over that rank's failure), if it named one.
    gone: Vec<(u32, Option<u32>)>,
    under_way: Vec<Build>,
}

/// One build under way.
#[derive(Debug)]
struct Build {
    /// Its members (parent ranks), while its control mesh connects; empty after.
    members: Vec<u32>,
    flag: Arc<AtomicBool>,
    /// The member whose loss set the flag, and the rank its goodbye blamed.
    lost: Option<(u32, Option<u32>)>,
}

impl BuildsState {
    /// Parent rank `rank`'s loss, if it is lost: the rank and whom its goodbye blamed.
    fn gone(&self, rank: u32) -> Option<(u32, Option<u32>)> {
        self.gone.iter().find(|g| g.0 == rank).copied()
    }
}

impl Builds {
    fn with<R>(&self, f: impl FnOnce(&mut BuildsState) -> R) -> R {
        f(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Parent rank `rank` is lost (its goodbye blamed `blamed`: it left over that rank's
    /// failure): the builds it is a member of give up.
    pub(crate) fn lost(&self, rank: u32, blamed: Option<u32>) {
        self.with(|s| {
            // Both meshes (the engine's and the TCP path's) may report a loss: a later
            // report may say whom it blamed where the first did not.
            match s.gone.iter_mut().find(|g| g.0 == rank) {
                Some(g) => g.1 = g.1.or(blamed),
                None => s.gone.push((rank, blamed)),
            }
            for b in &mut s.under_way {
                if b.members.contains(&rank) {
                    b.flag.store(true, Ordering::Relaxed);
                    let l = b.lost.get_or_insert((rank, blamed));
                    if l.0 == rank {
                        l.1 = l.1.or(blamed);
                    }
                }
            }
        });
    }

    /// Whom parent rank `rank` blamed in leaving, once the parent heard it leave, waiting
    /// up to `wait` for that: a member whose connections to a build closed has often left
    /// the parent over another rank's failure, and its goodbye there says whose.
    fn blamed_by(&self, rank: u32, wait: Duration) -> Option<u32> {
        let until = Instant::now() + wait;
        loop {
            if let Some(g) = self.with(|s| s.gone(rank)) {
                return g.1;
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The parent was aborted: every build gives up, now and to come.
    pub(super) fn abort(&self) {
        self.with(|s| {
            s.aborted = true;
            for b in &s.under_way {
                b.flag.store(true, Ordering::Relaxed);
            }
        });
    }

    /// Whether the parent was aborted.
    fn aborted(&self) -> bool {
        self.with(|s| s.aborted)
    }

    /// A build of `members` begins: its flag (set already if the parent was aborted or a
    /// member is lost).
    fn begin(&self, members: &[u32]) -> Arc<AtomicBool> {
        self.with(|s| {
            let lost = members.iter().find_map(|&m| s.gone(m));
            let flag = Arc::new(AtomicBool::new(s.aborted || lost.is_some()));
            s.under_way.push(Build {
                members: members.to_vec(),
                flag: Arc::clone(&flag),
                lost,
            });
            flag
        })
    }

    /// The control mesh of the build whose flag is `flag` is up: from now on only an abort
    /// ends it.
    pub(super) fn settle(&self, flag: &Arc<AtomicBool>) {
        self.with(|s| {
            if let Some(b) = s.under_way.iter_mut().find(|b| Arc::ptr_eq(&b.flag, flag)) {
                b.members.clear();
            }
        });
    }

    /// The build whose flag is `flag` is over; the member whose loss ended it, if one did,
    /// and the rank its goodbye blamed.
    fn end(&self, flag: &Arc<AtomicBool>) -> Option<(u32, Option<u32>)> {
        self.with(|s| {
            let i = s
                .under_way
                .iter()
                .position(|b| Arc::ptr_eq(&b.flag, flag))?;
            s.under_way.swap_remove(i).lost
        })
    }
}

/// Why [`Communicator::split`], [`Communicator::dup`] or [`Communicator::split_by_host`]
/// failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SplitError {
    /// The parent communicator's exchange of colors and keys failed (a rank is gone, or
    /// does not call the split: see [`CommError`]).
    #[error("exchanging colors over the parent communicator: {0}")]
    Exchange(#[source] CommError),
    /// `rank` (of the parent) has this rank's color but could not listen for the new
    /// communicator's control connections (it returned the reason).
    #[error("parent rank {rank}, of this color, could not join the new communicator")]
    MemberFailed {
        /// The parent rank.
        rank: u32,
    },
    /// `rank`'s record is not one this version writes: it called another collective of the
    /// same size in this place (an erroneous program), or runs another build.
    #[error(
        "parent rank {rank} sent no split record this build can read (did it call another \
         collective in this place?)"
    )]
    BadRecord {
        /// The parent rank.
        rank: u32,
    },
    /// `rank` called another of `split`, `dup` and `split_by_host` in this place, or (for a
    /// `dup`) did not join this rank's copy: every rank must call the same.
    #[error("parent rank {rank} called another kind of split in this place")]
    Mismatch {
        /// The parent rank.
        rank: u32,
    },
    /// Building the new communicator failed. The ranks the error names are the parent's (the
    /// numbering the caller knows), not the new communicator's.
    #[error("building the new communicator (ranks named as in this communicator): {0}")]
    Build(#[source] BuildError),
    /// This communicator was aborted ([`Communicator::abort`]) while the split built the
    /// new one: the build gave up (the other members' builds fail with
    /// [`SplitError::MemberGone`] naming this rank).
    #[error("cancelled: the parent communicator was aborted while the split built the new one")]
    Cancelled,
    /// `rank` (of the parent), a member of the new communicator, went away while it was
    /// being built: its connections closed (its process died, or its communicator was
    /// aborted).
    #[error(
        "parent rank {rank}, of this color, went away while the new communicator was being \
         built (its process died, or its communicator was aborted)"
    )]
    MemberGone {
        /// The parent rank.
        rank: u32,
    },
    /// `rank` (of the parent), a member of the new communicator, left while it was being
    /// built, over parent rank `over`'s failure (its goodbye to the parent said so: its own
    /// part of the split failed over `over`, which may not be of this color).
    #[error(
        "parent rank {rank}, of this color, left while the new communicator was being built, \
         over parent rank {over}'s failure"
    )]
    MemberLeft {
        /// The parent rank that left.
        rank: u32,
        /// The parent rank it left over.
        over: u32,
    },
}

/// One rank's part in a split.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Record {
    /// No color (`MPI_UNDEFINED`): joins nothing.
    None,
    /// Joins `color` at `key`, listening on `addr`, by `call`; `salt` is random (for the
    /// nonce).
    Join {
        color: u32,
        key: u32,
        addr: SocketAddr,
        salt: u64,
        call: Call,
    },
    /// Has `color` but could not listen.
    Failed { color: u32 },
}

/// Which call made a rank's record: the members of one new communicator must agree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Call {
    Split,
    Dup,
    ByHost,
}

/// The exchange's collective kind ([`ringcast_core::allgather_shape_tagged`]): a user's
/// Allgather of 40 bytes per rank posted in a split's place fails, and the split with it,
/// instead of either taking the other's bytes.
const SPLIT_TAG: u32 = u32::from_be_bytes(*b"SPLT");

/// The last three bytes of every record.
const MAGIC: [u8; 3] = *b"RCS";

impl Record {
    /// Layout: kind (0 none, 1 join, 2 failed), address family (4 or 6), port (LE), color
    /// (LE), key (LE), 16 address bytes (IPv4 in the first 4), salt (LE), the call (0 split,
    /// 1 dup, 2 by host), [`MAGIC`].
    pub(super) fn encode(&self) -> [u8; RECORD] {
        let mut b = [0u8; RECORD];
        b[37..].copy_from_slice(&MAGIC);
        match *self {
            Record::None => {}
            Record::Join {
                color,
                key,
                addr,
                salt,
                call,
            } => {
                b[0] = 1;
                b[28..36].copy_from_slice(&salt.to_le_bytes());
                b[36] = match call {
                    Call::Split => 0,
                    Call::Dup => 1,
                    Call::ByHost => 2,
                };
                b[2..4].copy_from_slice(&addr.port().to_le_bytes());
                b[4..8].copy_from_slice(&color.to_le_bytes());
                b[8..12].copy_from_slice(&key.to_le_bytes());
                match addr.ip() {
                    IpAddr::V4(a) => {
                        b[1] = 4;
                        b[12..16].copy_from_slice(&a.octets());
                    }
                    IpAddr::V6(a) => {
                        b[1] = 6;
                        b[12..28].copy_from_slice(&a.octets());
                    }
                }
            }
            Record::Failed { color } => {
                b[0] = 2;
                b[4..8].copy_from_slice(&color.to_le_bytes());
            }
        }
        b
    }

    pub(super) fn decode(b: &[u8]) -> Option<Record> {
        let b: &[u8; RECORD] = b.try_into().ok()?;
        if b[37..] != MAGIC {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        match b[0] {
            0 => Some(Record::None),
            1 => {
                let ip = match b[1] {
                    4 => IpAddr::V4(Ipv4Addr::new(b[12], b[13], b[14], b[15])),
                    6 => {
                        let mut o = [0u8; 16];
                        o.copy_from_slice(&b[12..28]);
                        IpAddr::V6(Ipv6Addr::from(o))
                    }
                    _ => return None,
                };
                let port = u16::from_le_bytes([b[2], b[3]]);
                if port == 0 || ip.is_unspecified() {
                    return None;
                }
                let mut salt = [0u8; 8];
                salt.copy_from_slice(&b[28..36]);
                let call = match b[36] {
                    0 => Call::Split,
                    1 => Call::Dup,
                    2 => Call::ByHost,
                    _ => return None,
                };
                Some(Record::Join {
                    color: u32_at(4),
                    key: u32_at(8),
                    addr: SocketAddr::new(ip, port),
                    salt: u64::from_le_bytes(salt),
                    call,
                })
            }
            2 => Some(Record::Failed { color: u32_at(4) }),
            _ => None,
        }
    }
}

/// The new communicator of one rank: its rank there, every member's control address by new
/// rank, and the nonce.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Plan {
    pub(super) rank: u32,
    pub(super) control: Vec<SocketAddr>,
    pub(super) nonce: u64,
    /// Every member's parent rank, by new rank.
    pub(super) members: Vec<u32>,
}

/// The plan of parent rank `me` from every rank's record (`records[r * RECORD..]`), or
/// `None` if it has no color. Members are ordered by key, then by parent rank.
pub(super) fn plan(records: &[u8], me: u32, parent_nonce: u64) -> Result<Option<Plan>, SplitError> {
    let decoded = records
        .chunks_exact(RECORD)
        .enumerate()
        .map(|(r, b)| Record::decode(b).ok_or(SplitError::BadRecord { rank: r as u32 }))
        .collect::<Result<Vec<_>, _>>()?;
    let (color, call) = match decoded.get(me as usize) {
        Some(Record::Join { color, call, .. }) => (*color, *call),
        Some(Record::None) => return Ok(None),
        // Our own failure is returned by the caller; ranks past the table are not ours.
        Some(Record::Failed { .. }) | None => return Err(SplitError::BadRecord { rank: me }),
    };
    let mut members = Vec::new();
    for (r, rec) in decoded.iter().enumerate() {
        match *rec {
            Record::Join {
                color: c,
                call: theirs,
                ..
            } if c == color && theirs != call => {
                return Err(SplitError::Mismatch { rank: r as u32 });
            }
            Record::Join {
                color: c,
                key,
                addr,
                salt,
                ..
            } if c == color => members.push((key, r, addr, salt)),
            Record::Failed { color: c } if c == color => {
                return Err(SplitError::MemberFailed { rank: r as u32 });
            }
            _ => {}
        }
    }
    // A copy has every rank, each at its own place.
    if call == Call::Dup
        && let Some(r) = (0..decoded.len()).find(|&r| members.get(r).is_none_or(|m| m.1 != r))
    {
        return Err(SplitError::Mismatch { rank: r as u32 });
    }
    members.sort_unstable_by_key(|&(key, r, _, _)| (key, r));
    let rank = members
        .iter()
        .position(|&(_, r, _, _)| r == me as usize)
        .ok_or(SplitError::BadRecord { rank: me })?;
    // Every member hashes the same records in the same order.
    let nonce = members.iter().fold(
        splitmix64(splitmix64(parent_nonce) ^ u64::from(color)),
        |h, m| splitmix64(h ^ m.3),
    );
    Ok(Some(Plan {
        rank: rank as u32,
        control: members.iter().map(|&(_, _, a, _)| a).collect(),
        nonce,
        members: members.iter().map(|&(_, r, _, _)| r as u32).collect(),
    }))
}

impl Communicator {
    /// Splits the ranks into disjoint new communicators, as `MPI_Comm_split` and
    /// `ncclCommSplit` do. Ranks passing the same `color` share one, ranked by `key` (ties
    /// by rank here); a rank passing `None` (`MPI_UNDEFINED`, `NCCL_SPLIT_NOCOLOR`) joins none
    /// and gets `Ok(None)`.
    ///
    /// Collective: every rank of this communicator calls it, in the same place among its
    /// operations (the colors travel as an Allgather of 40 bytes per rank, of a kind of its
    /// own: a rank that posts another collective in its place fails it, and the others'
    /// split, with a `ShapeMismatch`). The new
    /// communicators take this one's settings (interface, lanes, chunk size, timeouts,
    /// fallback, UDP port, multicast prefix, ICRC check, TCP threshold if one was given) and
    /// have their own control connections, engine and multicast groups: operations on
    /// them and on this one may run at the same time, from any threads. Each runs its own
    /// start-up check.
    ///
    /// ```no_run
    /// # use ringcast::Communicator;
    /// let world = Communicator::from_env()?;
    /// // Two halves, as a hybrid-sharded FSDP run groups its replicas.
    /// let upper = world.rank() >= world.size() / 2;
    /// let part = world.split(Some(u32::from(upper)), world.rank())?.expect("a color");
    /// let mut shard = vec![0u8; 1 << 20];
    /// part.broadcast(0, &mut shard)?;
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn split(&self, color: Option<u32>, key: u32) -> Result<Option<Communicator>, SplitError> {
        match color {
            None => self.exchange(Record::None).map(|_| None),
            Some(color) => self.join(color, key, Call::Split).map(Some),
        }
    }

    /// A new communicator over the same ranks, ranked the same (`MPI_Comm_dup`): a library
    /// can run its collectives apart from the application's. Collective, as
    /// [`split`](Self::split).
    pub fn dup(&self) -> Result<Communicator, SplitError> {
        self.join(0, self.rank, Call::Dup)
    }

    /// The ranks of this rank's host, ranked by `key` (ties by rank here), as
    /// `MPI_Comm_split_type(MPI_COMM_TYPE_SHARED)` makes them: a host's ranks, the node-local
    /// group of a hierarchical algorithm. A host is a kernel (network namespaces share one)
    /// where the rendezvous told each rank's, and an address where the peer table was given
    /// ([`CommBuilder::peer_table`](super::CommBuilder::peer_table)). Collective, as
    /// [`split`](Self::split).
    pub fn split_by_host(&self, key: u32) -> Result<Communicator, SplitError> {
        let color = self
            .lineage
            .hosts
            .get(self.rank as usize)
            .copied()
            .unwrap_or(self.rank);
        self.join(color, key, Call::ByHost)
    }

    fn join(&self, color: u32, key: u32, call: Call) -> Result<Communicator, SplitError> {
        let l = &self.lineage;
        let at = SocketAddr::new(l.ip, 0);
        let bound = TcpListener::bind(at).and_then(|s| s.local_addr().map(|a| (s, a)));
        let (listener, addr) = match bound {
            Ok(b) => b,
            Err(source) => {
                // Still take part, so that the others learn of it at once.
                self.exchange(Record::Failed { color })?;
                return Err(SplitError::Build(BuildError::Listen { addr: at, source }));
            }
        };
        let salt = crate::bootstrap::random_u64();
        let (records, op) = self.exchange_op(Record::Join {
            color,
            key,
            addr,
            salt,
            call,
        })?;
        let Some(p) = plan(&records, self.rank, l.nonce)? else {
            return Err(SplitError::BadRecord { rank: self.rank });
        };
        let size = p.control.len() as u32;
        // The hosts of the members as this communicator knows them (by kernel where the
        // rendezvous told it), for the new one's `split_by_host`: a new communicator is
        // built from a peer table, which carries none.
        let parent_color = |r: u32| l.hosts.get(r as usize).copied().unwrap_or(r);
        let hosts = super::builder::host_colors(p.members.iter().map(|&m| parent_color(m)));
        tracing::debug!(
            parent_rank = self.rank,
            color,
            rank = p.rank,
            size,
            "split: building the new communicator"
        );
        let members = p.members.clone();
        let flag = l.builds.begin(&members);
        let built = l
            .settings
            .clone_settings()
            .rank(p.rank)
            .world_size(size)
            .peer_table(p.control, p.nonce)
            .control_listener(listener)
            .interface(l.iface)
            .lanes(self.lanes)
            .allgather_chains(self.chains.clamp(1, size.max(1)))
            .chunk_size(l.chunk)
            .host_colors_of(hosts)
            .pin_base_of(l.pin_base)
            .split_of(Arc::clone(&l.builds), Arc::clone(&flag))
            .table_listening()
            .build();
        let lost = l.builds.end(&flag);
        built.map_err(|e| {
            let error = e.to_string();
            let out = build_failed(e, &members, lost.map(|g| g.0), l.builds.aborted());
            let (out, culprit) = left_over(out, lost, self.rank, |rank| {
                l.builds.blamed_by(rank, LEFT_OVER_WAIT)
            });
            if culprit.is_some() {
                tracing::warn!(parent_rank = self.rank, %out, %error, "split: a member went away");
            }
            // This rank failed its part in the split over `culprit`: a program that leaves
            // now leaves over it, and its goodbye says so, so that a peer that hears of the
            // departure first (an operation of the parent in flight there) names it, not
            // this one. An operation after the split that completes here clears it (this
            // rank went on).
            if let (Some(c), Some(b)) = (culprit, self.blame()) {
                b.failed(op, Some(c));
            }
            out
        })
        .inspect(|child| {
            // What the new communicator blames a rank for, this one hears (in its own
            // numbering): a program that stops over it and leaves says whom here too.
            if let (Some(mine), Some(theirs)) = (self.blame(), child.blame()) {
                theirs.link_up(mine.clone(), members.clone());
            }
        })
    }

    /// Allgathers this rank's record over this communicator: every rank's.
    fn exchange(&self, mine: Record) -> Result<Vec<u8>, SplitError> {
        self.exchange_op(mine).map(|(all, _)| all)
    }

    /// [`exchange`](Self::exchange), and the operation it ran as.
    fn exchange_op(&self, mine: Record) -> Result<(Vec<u8>, u64), SplitError> {
        let mut all = vec![0u8; RECORD * self.size as usize];
        let st = self
            .allgather_tagged(&mine.encode(), &mut all, SPLIT_TAG)
            .map_err(SplitError::Exchange)?;
        Ok((all, st.op))
    }
}

/// How long a split whose build lost a member waits for the parent to hear that member's
/// goodbye (whom it left over), where the build saw the member go first.
const LEFT_OVER_WAIT: Duration = Duration::from_millis(500);

/// A build that failed over a gone member (`out`, from [`build_failed`]): the member's
/// goodbye to the parent may say it left over another rank's failure (its own split's
/// exchange failed, say), from `lost` (the member whose loss gave the build up, and whom it
/// blamed) or `blamed_by` (whom a member blamed, once the parent heard it leave): that rank
/// is the one to name ([`SplitError::MemberLeft`]). Returns the error and the rank this
/// rank's failure blames (`me` never; `None` for a failure that names no member).
fn left_over(
    out: SplitError,
    lost: Option<(u32, Option<u32>)>,
    me: u32,
    blamed_by: impl FnOnce(u32) -> Option<u32>,
) -> (SplitError, Option<u32>) {
    let SplitError::MemberGone { rank } = out else {
        return (out, None);
    };
    let (rank, over) = match lost {
        // The loss that gave the build up: a member gone from the parent, whose goodbye
        // there said whom it left over, if anybody (another member that left the build
        // after it only followed it).
        Some((r, blamed)) => (r, blamed),
        None => (rank, blamed_by(rank)),
    };
    let over = over.filter(|&o| o != me && o != rank);
    match over {
        Some(over) => (SplitError::MemberLeft { rank, over }, Some(over)),
        None => (SplitError::MemberGone { rank }, Some(rank)),
    }
}

/// What a split returns for its build's failure `e`: the members' own numbering (`members`,
/// by new rank) put back in the parent's; a build given up over a member's loss (`lost`,
/// the parent rank) or a gone member is [`SplitError::MemberGone`], one given up over this
/// communicator's abort [`SplitError::Cancelled`].
fn build_failed(e: BuildError, members: &[u32], lost: Option<u32>, aborted: bool) -> SplitError {
    let gone = match &e {
        // Given up: over the parent's abort, or a member's loss.
        BuildError::Control(ControlError::Cancelled) => match lost.filter(|_| !aborted) {
            Some(rank) => rank,
            None => return SplitError::Cancelled,
        },
        // A member gone in the new numbering.
        BuildError::Control(ControlError::PeerGone { peer: r, .. })
        | BuildError::StartupPeerLost { rank: r, .. } => match members.get(*r as usize) {
            Some(&rank) => rank,
            None => return SplitError::Build(e.renumbered(members)),
        },
        _ => return SplitError::Build(e.renumbered(members)),
    };
    SplitError::MemberGone { rank: gone }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A build gives up when one of its members is lost (before it began or while its mesh
    /// connects), not when another rank is, and every build does on an abort; its end names
    /// the member.
    #[test]
    fn builds_give_up_over_their_members_and_an_abort() {
        let b = Builds::default();
        let ours = b.begin(&[0, 2]);
        let theirs = b.begin(&[1, 3]);
        b.lost(3, None);
        assert!(!ours.load(Ordering::Relaxed));
        assert!(theirs.load(Ordering::Relaxed));
        assert_eq!(b.end(&theirs), Some((3, None)));
        // Rank 2 left over rank 7's failure: the first report (one mesh's) did not say so,
        // the second (the other's) does, for the builds too.
        b.lost(2, None);
        b.lost(2, Some(7));
        assert!(ours.load(Ordering::Relaxed));
        assert_eq!(b.end(&ours), Some((2, Some(7))));
        // A build of a member lost already gives up from the start.
        let late = b.begin(&[2, 4]);
        assert!(late.load(Ordering::Relaxed));
        assert_eq!(b.end(&late), Some((2, Some(7))));
        // Its mesh up, a build no longer hears of its members (one that drops its parent
        // once its own part is done is no loss): only of an abort.
        let settled = b.begin(&[0, 1]);
        b.settle(&settled);
        b.lost(1, None);
        assert!(!settled.load(Ordering::Relaxed));
        assert_eq!(b.end(&settled), None);
        let clean = b.begin(&[0, 5]);
        assert!(!clean.load(Ordering::Relaxed) && !b.aborted());
        b.abort();
        assert!(clean.load(Ordering::Relaxed) && b.aborted());
        assert_eq!(b.end(&clean), None);
        assert!(
            b.begin(&[6]).load(Ordering::Relaxed),
            "after an abort, every build"
        );
    }

    /// Whom a lost parent rank blamed: at once once the parent heard it leave, after a wait
    /// for a goodbye the parent hears later, and nobody after the wait when none comes.
    #[test]
    fn a_member_s_goodbye_says_whom_it_left_over() {
        let b = Arc::new(Builds::default());
        b.lost(2, Some(7));
        b.lost(3, None);
        assert_eq!(b.blamed_by(2, Duration::ZERO), Some(7));
        assert_eq!(b.blamed_by(3, Duration::from_secs(5)), None);
        let late = {
            let b = Arc::clone(&b);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                b.lost(9, Some(4));
            })
        };
        assert_eq!(b.blamed_by(9, Duration::from_secs(30)), Some(4));
        late.join().expect("join");
        assert_eq!(b.blamed_by(5, Duration::from_millis(30)), None);
    }

    /// A gone member that left blaming another rank is named as having left over it, from
    /// the build's own loss (the member lost first) or from the parent's later hearing; one
    /// that blamed nobody, this rank or itself stays gone; other failures name nobody.
    #[test]
    fn a_member_that_left_over_a_failure_names_it() {
        let gone = |rank| SplitError::MemberGone { rank };
        let left = |rank, over| SplitError::MemberLeft { rank, over };
        let asked = |_| panic!("the build's own loss says it");
        let name = |(e, c): (SplitError, Option<u32>)| (e.to_string(), c);
        assert_eq!(
            name(left_over(gone(1), Some((1, Some(2))), 3, asked)),
            name((left(1, 2), Some(2)))
        );
        assert_eq!(
            name(left_over(gone(1), None, 3, |r| (r == 1).then_some(2))),
            name((left(1, 2), Some(2)))
        );
        // The build lost another member first: that one is named, and nobody is asked.
        assert_eq!(
            name(left_over(gone(1), Some((4, Some(5))), 3, asked)),
            name((left(4, 5), Some(5)))
        );
        assert_eq!(
            name(left_over(gone(1), Some((4, None)), 3, asked)),
            name((gone(4), Some(4)))
        );
        for blamed in [None, Some(3), Some(1)] {
            assert_eq!(
                name(left_over(gone(1), None, 3, |_| blamed)),
                name((gone(1), Some(1))),
                "{blamed:?}"
            );
        }
        assert_eq!(
            name(left_over(SplitError::Cancelled, None, 3, asked)),
            name((SplitError::Cancelled, None))
        );
    }

    fn join(color: u32, key: u32, port: u16) -> Record {
        Record::Join {
            color,
            key,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            salt: u64::from(port) << 32 | u64::from(key),
            call: Call::Split,
        }
    }

    fn table(recs: &[Record]) -> Vec<u8> {
        recs.iter().flat_map(|r| r.encode()).collect()
    }

    #[test]
    fn records_round_trip() {
        let v6 = Record::Join {
            color: 7,
            key: u32::MAX,
            addr: "[fd00::1]:4000".parse().unwrap(),
            salt: u64::MAX - 1,
            call: Call::ByHost,
        };
        for r in [
            Record::None,
            join(3, 9, 1234),
            v6,
            Record::Failed { color: 5 },
        ] {
            assert_eq!(Record::decode(&r.encode()), Some(r));
        }
    }

    #[test]
    fn unreadable_records_are_refused() {
        let mut b = join(1, 1, 1).encode();
        b[1] = 5;
        assert_eq!(Record::decode(&b), None);
        let mut b = join(1, 1, 1).encode();
        b[0] = 3;
        assert_eq!(Record::decode(&b), None);
        // Port 0 or an unspecified address cannot be connected to.
        assert_eq!(Record::decode(&join(1, 1, 0).encode()), None);
        assert_eq!(Record::decode(&[0u8; RECORD - 1]), None);
        let t = table(&[join(0, 0, 10), Record::None]);
        let mut bad = t.clone();
        bad[RECORD] = 9;
        assert!(matches!(
            plan(&bad, 0, 1),
            Err(SplitError::BadRecord { rank: 1 })
        ));
    }

    #[test]
    fn members_are_ordered_by_key_then_rank() {
        // Ranks 0..5: color 1 for 0, 2, 4 with keys 5, 5, 0; color 2 for 1, 3; none for 5.
        let t = table(&[
            join(1, 5, 100),
            join(2, 0, 101),
            join(1, 5, 102),
            join(2, 0, 103),
            join(1, 0, 104),
            Record::None,
        ]);
        let p = plan(&t, 0, 42).unwrap().unwrap();
        assert_eq!(p.rank, 1);
        let ports: Vec<u16> = p.control.iter().map(SocketAddr::port).collect();
        assert_eq!(ports, [104, 100, 102]);
        let q = plan(&t, 4, 42).unwrap().unwrap();
        assert_eq!((q.rank, &q.control, q.nonce), (0, &p.control, p.nonce));
        let other = plan(&t, 3, 42).unwrap().unwrap();
        assert_eq!(other.rank, 1);
        assert_eq!(other.control.len(), 2);
        assert_ne!(other.nonce, p.nonce);
        assert_eq!(plan(&t, 5, 42).unwrap(), None);
        // Another parent, or the same members drawing other random bits (a second split),
        // give other nonces (other groups).
        assert_ne!(plan(&t, 0, 43).unwrap().unwrap().nonce, p.nonce);
        let mut again = t.clone();
        again[28] ^= 1;
        assert_ne!(plan(&again, 0, 42).unwrap().unwrap().nonce, p.nonce);
        assert_ne!(p.nonce, 42);
    }

    /// Any bytes, valid records or not: an error or a plan that places this rank among its
    /// color's members, never a panic.
    #[test]
    fn any_records_give_an_error_or_a_consistent_plan() {
        let mut x = 0x5EED_u64;
        let mut next = move || {
            x = splitmix64(x);
            x
        };
        for _ in 0..20_000 {
            let ranks = (next() % 6) as usize + 1;
            let me = (next() % (ranks as u64 + 1)) as u32;
            let mut t: Vec<u8> = (0..ranks)
                .flat_map(|_| {
                    let k = next();
                    let rec = match k % 4 {
                        0 => Record::None,
                        1 => Record::Failed {
                            color: (k >> 8) as u32 % 3,
                        },
                        _ => join(
                            (k >> 8) as u32 % 3,
                            (k >> 16) as u32 % 4,
                            (k >> 24) as u16 | 1,
                        ),
                    };
                    rec.encode()
                })
                .collect();
            // Now and then a byte gone wrong, or a short table.
            if next() % 4 == 0 {
                let at = (next() % t.len() as u64) as usize;
                t[at] = next() as u8;
            }
            if next() % 8 == 0 {
                t.truncate(t.len() - 1);
            }
            if let Ok(Some(p)) = plan(&t, me, 7) {
                assert!((p.rank as usize) < p.control.len());
                assert!(p.control.len() <= ranks);
            }
        }
    }

    /// A rank that called another collective of the same size (its bytes, zeros included,
    /// carry no record), or another kind of split, or stayed out of a `dup`: refused.
    #[test]
    fn calls_that_do_not_match_are_refused() {
        let dup = |key: u32, port: u16| Record::Join {
            color: 0,
            key,
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            salt: 1,
            call: Call::Dup,
        };
        let mut zeros = table(&[join(0, 0, 10), join(0, 1, 11)]);
        zeros[RECORD..].fill(0);
        assert!(matches!(
            plan(&zeros, 0, 1),
            Err(SplitError::BadRecord { rank: 1 })
        ));
        let t = table(&[dup(0, 10), join(0, 1, 11), dup(2, 12)]);
        assert!(matches!(
            plan(&t, 0, 1),
            Err(SplitError::Mismatch { rank: 1 })
        ));
        // Rank 1 asked for no color: a dup without it is no copy.
        let t = table(&[dup(0, 10), Record::None, dup(2, 12)]);
        assert!(matches!(
            plan(&t, 2, 1),
            Err(SplitError::Mismatch { rank: 1 })
        ));
        // Every rank at its place: a copy.
        let t = table(&[dup(0, 10), dup(1, 11), dup(2, 12)]);
        let p = plan(&t, 1, 1).unwrap().unwrap();
        assert_eq!((p.rank, p.members.as_slice()), (1, &[0, 1, 2][..]));
    }

    /// A failed build names the parent's ranks: the new communicator's ranks 0, 1, 2 are the
    /// parent's 9, 4, 6 here.
    #[test]
    fn a_failed_build_names_the_parents_ranks() {
        use super::super::probe::{ProbeFailure, Unheard};
        use std::net::SocketAddrV4;
        use std::time::Duration;
        let members = [9, 4, 6];
        let e = build_failed(
            BuildError::StartupReportMissing {
                ranks: vec![0, 2],
                waited: Duration::from_secs(3),
            },
            &members,
            None,
            false,
        );
        let SplitError::Build(BuildError::StartupReportMissing { ranks, .. }) = &e else {
            panic!("{e:?}");
        };
        assert_eq!(ranks, &[6, 9]);
        assert!(e.to_string().contains("as in this communicator"), "{e}");
        assert!(e.to_string().contains("ranks 6, 9 within"), "{e}");
        let e = build_failed(
            BuildError::Control(ControlError::Timeout(Duration::from_secs(1), 1)),
            &members,
            None,
            false,
        );
        assert!(
            matches!(
                e,
                SplitError::Build(BuildError::Control(ControlError::Timeout(_, 4)))
            ),
            "{e:?}"
        );
        let row = |rank: u32, from: Vec<u32>| Unheard {
            rank,
            interface: Ipv4Addr::LOCALHOST,
            lane: 0,
            group: SocketAddrV4::new(Ipv4Addr::new(239, 1, 2, 3), 4791),
            from,
        };
        let failure = ProbeFailure {
            window: Duration::from_secs(1),
            unheard: vec![row(0, vec![1, 2]), row(1, vec![0])],
            unheard_by_all: vec![0, 1],
            deaf: vec![2],
            port_mismatch: vec![(0, 4791), (2, 4792)],
            too_large: vec![row(2, vec![0])],
            chunk_size: 4096,
        };
        let e = build_failed(
            BuildError::MulticastUnreachable(Box::new(failure)),
            &members,
            None,
            false,
        );
        let SplitError::Build(BuildError::MulticastUnreachable(p)) = &e else {
            panic!("{e:?}");
        };
        let rows = |u: &[Unheard]| -> Vec<(u32, Vec<u32>)> {
            u.iter().map(|u| (u.rank, u.from.clone())).collect()
        };
        assert_eq!(rows(&p.unheard), [(4, vec![9]), (9, vec![4, 6])]);
        assert_eq!(rows(&p.too_large), [(6, vec![9])]);
        assert_eq!(
            (&p.unheard_by_all[..], &p.deaf[..]),
            (&[4, 9][..], &[6][..])
        );
        assert_eq!(p.port_mismatch, [(6, 4792), (9, 4791)]);
        assert!(
            e.to_string()
                .contains("rank 4 heard no multicast from rank 9"),
            "{e}"
        );
        // A member gone is named as the parent knows it; an abort is a cancel.
        let gone = || BuildError::StartupPeerLost {
            rank: 2,
            seen_by: None,
        };
        assert!(matches!(
            build_failed(gone(), &members, None, false),
            SplitError::MemberGone { rank: 6 }
        ));
        let cancelled = || BuildError::Control(ControlError::Cancelled);
        assert!(matches!(
            build_failed(cancelled(), &members, Some(4), false),
            SplitError::MemberGone { rank: 4 }
        ));
        assert!(matches!(
            build_failed(cancelled(), &members, Some(4), true),
            SplitError::Cancelled
        ));
    }

    #[test]
    fn a_member_that_could_not_listen_fails_its_color_only() {
        let t = table(&[
            join(1, 0, 100),
            Record::Failed { color: 1 },
            join(2, 0, 102),
        ]);
        assert!(matches!(
            plan(&t, 0, 1),
            Err(SplitError::MemberFailed { rank: 1 })
        ));
        assert_eq!(plan(&t, 2, 1).unwrap().unwrap().control.len(), 1);
    }
}
