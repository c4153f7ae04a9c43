//! Errors of the communicator: building it, and running operations.

use std::io;

use ringcast_core::{OpError, StartError};
use ringcast_transport_rocev2_udp::{ControlError, PortError};

use crate::bootstrap::{BootstrapError, RendezvousError};

/// Why an operation failed. Errors that blame a rank name it ([`CommError::peer`]).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CommError {
    /// This rank waited on `peer` past the peer timeout.
    #[error("rank {peer} stopped answering (peer timeout)")]
    PeerUnresponsive {
        /// The rank that did not answer.
        peer: u32,
    },
    /// Another rank gave up on `peer` (it stopped answering, did not post the operation
    /// within the post timeout, or its connections closed) and aborted the operation. `peer == reported_by`: that rank
    /// failed the operation on its own side (its multicast sends stalled, or it had given up
    /// on the operation already) and told the others.
    #[error("{}", peer_failed(*peer, *reported_by))]
    PeerFailed {
        /// The rank that did not answer.
        peer: u32,
        /// The rank that reported it.
        reported_by: u32,
    },
    /// A recovery read from `peer` failed.
    #[error("a read from rank {peer} failed")]
    ReadFailed {
        /// The peer read from.
        peer: u32,
    },
    /// `peer`'s control connection closed (the process died, or left the communicator): the
    /// communicator cannot run collectives any more.
    #[error("rank {peer} is gone: its control connection closed")]
    PeerLost {
        /// The rank lost.
        peer: u32,
    },
    /// Rank `peer` posted this operation with another kind, root or size than rank
    /// `reported_by` did: an erroneous program (every rank must post the same collectives in
    /// the same order, with the same root and sizes). Over multicast it is found before any
    /// data moves and every rank fails the operation; over TCP, ranks upstream of the
    /// disagreement may complete it with the bytes they posted for. The communicator goes on
    /// with the next operation. `peer == reported_by`: that rank refused its own call (its
    /// arguments failed its checks: a root out of range, a buffer of the wrong size) and told
    /// the others.
    #[error("{}", shape_mismatch(*peer, *reported_by))]
    ShapeMismatch {
        /// The rank whose operation differs.
        peer: u32,
        /// The rank that compared.
        reported_by: u32,
    },
    /// Rank `peer` is alive (it answers) but did not post this operation within the post
    /// timeout ([`CommBuilder::post_timeout`](super::CommBuilder::post_timeout),
    /// `RINGCAST_POST_TIMEOUT`): its program is stuck before the call, or never makes it.
    #[error(
        "rank {peer} is alive but did not post this operation within the post timeout \
         (RINGCAST_POST_TIMEOUT)"
    )]
    NotPosted {
        /// The rank that did not post.
        peer: u32,
    },
    /// This rank's multicasts stopped completing: its send workers reported no send done for
    /// a whole peer timeout past the block's wire time (the socket's send path is stuck).
    /// The other ranks fail the operation naming this rank.
    #[error(
        "rank {rank} (this rank) stopped completing its multicasts: no send finished within \
         the peer timeout"
    )]
    SendsStalled {
        /// This rank.
        rank: u32,
    },
    /// The communicator was dropped (or its engine stopped) before the operation finished.
    #[error(
        "cancelled: the communicator was dropped, or its engine thread stopped (see the log), \
         before the operation finished"
    )]
    Cancelled,
    /// A buffer has the wrong size.
    #[error("{what} holds {got} elements; this operation needs {required}")]
    BufferSize {
        /// Which buffer.
        what: &'static str,
        /// Elements given.
        got: usize,
        /// Elements required.
        required: usize,
    },
    /// `counts` must have one entry per rank.
    #[error("{got} counts given for {ranks} ranks")]
    CountsLength {
        /// Entries given.
        got: usize,
        /// Ranks of the communicator.
        ranks: u32,
    },
    /// `counts` add up to more bytes than this machine can address.
    #[error("the counts add up to more bytes than this machine can address")]
    CountsTooLarge,
    /// The root is not a rank of the communicator.
    #[error("root {root} is not a rank of this {ranks}-rank communicator")]
    RootOutOfRange {
        /// Root given.
        root: u32,
        /// Ranks of the communicator.
        ranks: u32,
    },
    /// The element type has no bytes (a zero-sized type): there is nothing to send.
    #[error("the elements are of a zero-sized type: a collective of them moves no bytes")]
    ZeroSizedElements,
    /// The core refused to start the operation (too large for the configured chunk size).
    #[error("could not start: {0}")]
    Start(StartError),
    /// No answer from the engine thread in time (it is stuck or gone).
    #[error("the engine did not answer within {0:?}")]
    EngineTimeout(std::time::Duration),
}

/// [`CommError::PeerFailed`]'s message.
fn peer_failed(peer: u32, reported_by: u32) -> String {
    if peer == reported_by {
        format!(
            "rank {peer} failed this operation on its own side and told the others (its \
             multicast sends stalled, or it had given up on the operation already: see the \
             error its call returned)"
        )
    } else {
        format!(
            "rank {reported_by} gave up on rank {peer}: it stopped answering, did not post, or \
             its connections closed"
        )
    }
}

/// [`CommError::ShapeMismatch`]'s message.
fn shape_mismatch(peer: u32, reported_by: u32) -> String {
    const RULE: &str = "every rank must post the same collectives in the same order, with the \
                        same root and sizes";
    if peer == reported_by {
        format!(
            "rank {peer} refused its own call of this operation (its arguments failed its \
             checks: see the error its call returned) or posted another kind, root or size \
             ({RULE})"
        )
    } else {
        format!(
            "rank {peer} posted this operation with another kind, root or size than rank \
             {reported_by} did ({RULE})"
        )
    }
}

impl CommError {
    /// The rank this error blames, if any.
    pub fn peer(&self) -> Option<u32> {
        match *self {
            CommError::PeerUnresponsive { peer }
            | CommError::PeerFailed { peer, .. }
            | CommError::ReadFailed { peer }
            | CommError::PeerLost { peer }
            | CommError::ShapeMismatch { peer, .. }
            | CommError::NotPosted { peer } => Some(peer),
            CommError::SendsStalled { rank } => Some(rank),
            _ => None,
        }
    }
}

impl From<OpError> for CommError {
    fn from(e: OpError) -> Self {
        match e {
            OpError::PeerFailed { peer, reported_by } => CommError::PeerFailed {
                peer: peer.0,
                reported_by: reported_by.0,
            },
            OpError::ReadFailed { peer } => CommError::ReadFailed { peer: peer.0 },
            OpError::PeerLost { peer } => CommError::PeerLost { peer: peer.0 },
            OpError::ShapeMismatch { peer, reported_by } => CommError::ShapeMismatch {
                peer: peer.0,
                reported_by: reported_by.0,
            },
            OpError::NotPosted { peer } => CommError::NotPosted { peer: peer.0 },
            OpError::SendsStalled { rank } => CommError::SendsStalled { rank: rank.0 },
            // `PeerUnresponsive`, and any later variant, blame `peer()`.
            other => CommError::PeerUnresponsive {
                peer: other.peer().0,
            },
        }
    }
}

/// Why a [`Communicator`](super::Communicator) could not be built. Messages name the builder
/// method or the variable to set.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BuildError {
    /// A required setting is missing.
    #[error("{0} is not set: {1}")]
    Missing(&'static str, &'static str),
    /// A setting is out of range or unparsable.
    #[error("{setting}: {why}")]
    Invalid {
        /// The builder method or variable.
        setting: String,
        /// What is wrong.
        why: String,
    },
    /// Reading the launcher's environment, choosing the interface.
    #[error(transparent)]
    Bootstrap(#[from] BootstrapError),
    /// The rendezvous failed.
    #[error(transparent)]
    Rendezvous(#[from] RendezvousError),
    /// The control listener could not be bound.
    #[error("could not listen for control connections on {addr}: {source}")]
    Listen {
        /// Address tried.
        addr: std::net::SocketAddr,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A peer table entry is not a control address.
    #[error("rank {rank}'s peer table entry {entry:?} is not a socket address")]
    PeerAddress {
        /// The rank.
        rank: u32,
        /// What it sent.
        entry: String,
    },
    /// The control mesh did not form.
    #[error("control mesh: {0}")]
    Control(#[from] ControlError),
    /// The multicast data path could not be opened.
    #[error("multicast data path: {0}")]
    Port(#[from] PortError),
    /// The core rejected the configuration.
    #[error("configuration: {0}")]
    Config(ringcast_core::ConfigError),
    /// A feature that is not built yet.
    #[error("{0}")]
    Unsupported(&'static str),
    /// The start-up check found that multicast does not reach every rank (or not in
    /// datagrams as large as the data's: a path MTU below the hosts'), and the fallback is
    /// off: the message names who did not hear whom, where, and what to check.
    #[error(transparent)]
    MulticastUnreachable(Box<super::probe::ProbeFailure>),
    /// The start-up check could not run to its end (a peer's report missing or unreadable,
    /// settings that differ between ranks).
    #[error("start-up check: {0}")]
    StartupCheck(String),
    /// No start-up report came from `ranks` (ascending) within `waited`: they hang, or their
    /// control connections do not carry this rank's messages.
    #[error(
        "start-up check: no start-up report from {} {} within {:.1} s (is every rank running \
         and reachable over TCP?)",
        super::probe::ranks_word(ranks.len()),
        super::probe::list(ranks),
        waited.as_secs_f64()
    )]
    StartupReportMissing {
        /// The ranks whose reports are missing, ascending.
        ranks: Vec<u32>,
        /// How long this rank waited for them.
        waited: std::time::Duration,
    },
    /// Rank `rank`'s control connection closed during the start-up check (its process
    /// died, or its start-up failed); `seen_by`: the rank that told this one, leaving over
    /// it.
    #[error(
        "start-up check: rank {rank}'s control connection closed during the start-up check{}",
        seen_by.map_or(String::new(), |v| format!(" (rank {v} saw it and left)"))
    )]
    StartupPeerLost {
        /// The rank whose connection closed.
        rank: u32,
        /// The rank that left over it and said so, when one did.
        seen_by: Option<u32>,
    },
    /// The engine's thread, or the TCP dispatcher's, could not be started.
    #[error("could not start the engine's or the TCP dispatcher's thread: {0}")]
    Spawn(#[source] io::Error),
    /// This process may not open the file descriptors a rank needs (a TCP connection to every
    /// peer per mesh, its sockets), and its hard limit does not let it raise the soft one.
    #[error(
        "{ranks} ranks need about {need} open files per rank ({meshes} TCP {mesh} of {peers} \
         connections, the multicast sockets), but this process may open {limit}: raise the \
         limit (`ulimit -n {need}`, or the hard limit in limits.conf / the launcher){halve}",
        peers = ranks.saturating_sub(1),
        mesh = if *meshes > 1 { "meshes" } else { "mesh" },
        halve = if *meshes > 1 {
            ", or set RINGCAST_TCP_THRESHOLD=0 (and no fallback) for one mesh instead of two"
        } else {
            ""
        }
    )]
    FileLimit {
        /// The job's ranks.
        ranks: u32,
        /// TCP meshes this rank connects.
        meshes: u32,
        /// File descriptors needed, with some to spare.
        need: u64,
        /// The soft limit after trying to raise it.
        limit: u64,
    },
}

impl BuildError {
    /// The same error with every rank it names renumbered: rank `r` becomes `members[r]` (a
    /// split's new communicator to its parent's ranks); a rank past `members` stays. Lists
    /// documented as ascending are sorted again.
    pub(crate) fn renumbered(self, members: &[u32]) -> BuildError {
        let f = |r: u32| members.get(r as usize).copied().unwrap_or(r);
        match self {
            BuildError::PeerAddress { rank, entry } => BuildError::PeerAddress {
                rank: f(rank),
                entry,
            },
            BuildError::Control(c) => BuildError::Control(match c {
                ControlError::Timeout(d, r) => ControlError::Timeout(d, f(r)),
                ControlError::PeerGone { peer, addr, source } => ControlError::PeerGone {
                    peer: f(peer),
                    addr,
                    source,
                },
                ControlError::BadTable { rank, ranks } => ControlError::BadTable {
                    rank: f(rank),
                    ranks,
                },
                other => other,
            }),
            BuildError::MulticastUnreachable(mut p) => {
                p.renumber(&f);
                BuildError::MulticastUnreachable(p)
            }
            BuildError::StartupReportMissing { ranks, waited } => {
                let mut ranks: Vec<u32> = ranks.into_iter().map(f).collect();
                ranks.sort_unstable();
                BuildError::StartupReportMissing { ranks, waited }
            }
            BuildError::StartupPeerLost { rank, seen_by } => BuildError::StartupPeerLost {
                rank: f(rank),
                seen_by: seen_by.map(f),
            },
            other => other,
        }
    }
}
