//! Whom this rank's failures blame, and what its goodbye says about them.
//!
//! A rank that fails an operation over another rank's failure (the culprit) and then leaves
//! tells its peers so in its goodbye: a peer that hears of the departure before the failure
//! itself, or that finished the failed operation already (the `Abort` about it then tells it
//! nothing), fails its next operation naming the culprit, not the rank that left.

use super::error::CommError;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

/// A lost rank, with the goodbye mark it sent (the first operation it did not finish) when it
/// left cleanly, and the rank it left over (whose failure it was in), if it named one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Lost {
    pub(crate) rank: u32,
    pub(crate) mark: Option<u64>,
    pub(crate) blamed: Option<u32>,
}

impl Lost {
    /// Whether operation `op` can no longer finish.
    pub(crate) fn dooms(&self, op: u64) -> bool {
        self.mark.is_none_or(|m| op >= m)
    }

    /// What an operation this loss dooms fails with: the loss of the rank, or, when it left
    /// over another rank's failure, that failure, as reported by the rank that left.
    pub(crate) fn error(&self) -> CommError {
        match self.blamed {
            Some(b) => CommError::PeerFailed {
                peer: b,
                reported_by: self.rank,
            },
            None => CommError::PeerLost { peer: self.rank },
        }
    }
}

/// Of the peers `lost`, the one that dooms operation `k`: a crashed one before one that
/// left cleanly, since a rank may leave because of another's crash and be heard of first.
pub(crate) fn doomed_by(lost: &[Lost], k: u64) -> Option<&Lost> {
    let crashed = lost.iter().filter(|l| l.mark.is_none());
    let left = lost.iter().filter(|l| l.mark.is_some());
    crashed.chain(left).find(|l| l.dooms(k))
}

/// Whom this rank's failures blame: one record for the multicast engine and the TCP path,
/// which number their operations in one sequence. Each side's goodbye and doomed posts name
/// the first culprit whichever side failed over it (each kept its own, and a rank that failed
/// a TCP operation over a rank left naming nobody on the engine's mesh, whose peers then
/// named the rank that left). Clones share it.
///
/// A communicator split from another passes the failures it blames a rank for up to its
/// parent's record ([`link_up`](Self::link_up)), in the parent's numbering: a program that
/// stops over a failure on a part of its job (a half's Broadcast, say) and leaves says whom
/// on the whole too, where its peers may not have heard of that rank's loss yet.
#[derive(Clone, Debug)]
pub(crate) struct Blame(Arc<Shared>);

#[derive(Debug)]
struct Shared {
    record: Mutex<Record>,
    /// The parent's record, and the parent rank of each of this communicator's ranks.
    up: OnceLock<(Blame, Vec<u32>)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Record {
    /// This rank: never its own culprit (a rank that posted past the post timeout fails
    /// naming itself, which tells its peers nothing about whom to blame).
    me: u32,
    /// The rank the first failure blamed: what every later post's failure names, until an
    /// operation after it completes (this rank went on: a later loss is a failure of its
    /// own). Losses arrive over one connection each, so when a rank's failure makes
    /// another leave too, this rank may hear of the second first; the first verdict is the
    /// one to keep.
    culprit: Option<u32>,
    /// The latest operation that failed over a rank, until a later one completes. Kept here,
    /// not read off the live operations: a failed one is released once its reads drain, most
    /// often before the application drops the communicator.
    failing: Option<u64>,
    /// The latest operation that failed naming a rank, and that rank: a peer that asks about
    /// a later operation this rank has not posted hears it (its program may have stopped
    /// over that failure).
    last: Option<(u64, u32)>,
    /// The rank a failure on a communicator split from this one named (in this one's
    /// numbering), and the record that failure was first recorded in, until this rank posts
    /// here again (its program went on with this one) or an operation after it completes
    /// on that communicator (it went on there): what its goodbye names when it fails
    /// nothing here.
    beside: Option<(u32, usize)>,
}

impl Blame {
    /// The record of rank `me`.
    pub(crate) fn new(me: u32) -> Self {
        Blame(Arc::new(Shared {
            record: Mutex::new(Record {
                me,
                culprit: None,
                failing: None,
                last: None,
                beside: None,
            }),
            up: OnceLock::new(),
        }))
    }

    /// This record is a split communicator's: the failures it blames a rank for go up to
    /// `parent`, the record of the communicator it was split from, whose rank `members[r]`
    /// this communicator's rank `r` is. Once; a second link is ignored.
    pub(crate) fn link_up(&self, parent: Blame, members: Vec<u32>) {
        let _ = self.0.up.set((parent, members));
    }

    /// This record's identity, as the origin of a failure passed up.
    fn id(&self) -> usize {
        Arc::as_ptr(&self.0) as usize
    }

    /// A failure on a communicator split from this one (first recorded in record `origin`)
    /// named this one's rank `peer`.
    fn failed_beside(&self, peer: u32, origin: usize) {
        let forward = self.with(|r| {
            if peer == r.me {
                return false;
            }
            r.beside.get_or_insert((peer, origin));
            true
        });
        if forward {
            self.up(peer, origin);
        }
    }

    /// Passes a failure naming this communicator's rank `peer` up to the parent's record.
    fn up(&self, peer: u32, origin: usize) {
        if let Some((parent, members)) = self.0.up.get()
            && let Some(&p) = members.get(peer as usize)
        {
            parent.failed_beside(p, origin);
        }
    }

    /// The communicator of record `origin` went on after its failure: the records above
    /// this one forget what that failure passed up.
    fn went_on(&self, origin: usize) {
        if let Some((parent, _)) = self.0.up.get() {
            parent.with(|r| {
                if r.beside.is_some_and(|(_, o)| o == origin) {
                    r.beside = None;
                }
            });
            parent.went_on(origin);
        }
    }

    /// This rank posted an operation here: its program goes on with this communicator, so
    /// a failure beside it no longer says why it would leave.
    pub(crate) fn posted(&self) {
        self.with(|r| r.beside = None);
    }

    fn with<R>(&self, f: impl FnOnce(&mut Record) -> R) -> R {
        f(&mut self.0.record.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Operation `op` failed naming `peer` (a shape mismatch is not a failure of a rank:
    /// it is not reported here).
    pub(crate) fn failed(&self, op: u64, peer: Option<u32>) {
        let peer = self.with(|r| {
            let peer = peer.filter(|&p| p != r.me);
            r.culprit = r.culprit.or(peer);
            r.failing = r.failing.max(Some(op));
            if let Some(c) = peer
                && r.last.is_none_or(|(f, _)| op >= f)
            {
                r.last = Some((op, c));
            }
            peer
        });
        if let Some(p) = peer {
            self.up(p, self.id());
        }
    }

    /// Operation `op` completed: one that started after the last failure means this rank
    /// goes on without it, and blames nobody for what comes next.
    pub(crate) fn completed(&self, op: u64) {
        let on = self.with(|r| {
            let on = r.failing.is_some_and(|f| op > f);
            if on {
                r.failing = None;
                r.culprit = None;
            }
            on
        });
        if on {
            self.went_on(self.id());
        }
    }

    /// A post that would have become operation `next_op` fails because `rank` was lost; what
    /// it names: the culprit, or `rank` when none is known yet (which it becomes).
    pub(crate) fn doomed(&self, next_op: u64, rank: u32) -> u32 {
        let peer = self.with(|r| *r.culprit.get_or_insert(rank));
        self.failed(next_op, Some(peer));
        peer
    }

    /// A lost rank's goodbye named `blamed`: the rank whose failure it left over, which this
    /// rank may not have heard of yet (it travels over another connection).
    pub(crate) fn heard(&self, blamed: Option<u32>) {
        self.with(|r| r.culprit = r.culprit.or(blamed))
    }

    /// What this rank's goodbye names: the culprit, while it is leaving over a failure; else
    /// the rank a failure beside this communicator named, if it posted nothing here since.
    pub(crate) fn goodbye(&self) -> Option<u32> {
        self.with(|r| r.failing.and(r.culprit).or(r.beside.map(|(b, _)| b)))
    }

    /// The latest operation that failed naming a rank, and that rank.
    pub(crate) fn last_failed(&self) -> Option<(u64, u32)> {
        self.with(|r| r.last)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_loss_names_the_rank_a_departure_blamed() {
        let crash = Lost {
            rank: 3,
            mark: None,
            blamed: None,
        };
        assert!(crash.dooms(0));
        assert_eq!(crash.error(), CommError::PeerLost { peer: 3 });
        let left = Lost {
            mark: Some(5),
            blamed: Some(2),
            ..crash
        };
        assert!(!left.dooms(4) && left.dooms(5));
        assert_eq!(
            left.error(),
            CommError::PeerFailed {
                peer: 2,
                reported_by: 3
            }
        );
    }

    #[test]
    fn a_clean_departure_names_nobody() {
        let b = Blame::new(0);
        b.completed(0);
        b.heard(None);
        assert_eq!(b.goodbye(), None);
        // Nobody was blamed: a post the loss of rank 3 dooms names it.
        assert_eq!(b.doomed(1, 3), 3);
    }

    #[test]
    fn a_failure_is_named_in_the_goodbye_until_a_later_operation_completes() {
        let b = Blame::new(0);
        b.completed(3);
        b.failed(5, Some(2));
        // Operations started before it may still complete: the rank is still failing.
        b.completed(4);
        assert_eq!(b.goodbye(), Some(2));
        // A later failure naming another rank keeps the first culprit.
        b.failed(6, Some(1));
        assert_eq!(b.goodbye(), Some(2));
        b.completed(6);
        assert_eq!(b.goodbye(), Some(2));
        b.completed(7);
        assert_eq!(b.goodbye(), None);
        // Gone on: a later loss is named for itself (it named rank 2, alive and well, which
        // had only been late once), and is the one a goodbye names from then on.
        assert_eq!(b.doomed(8, 3), 3);
        assert_eq!(b.goodbye(), Some(3));
    }

    #[test]
    fn a_rank_is_never_its_own_culprit() {
        // Rank 2 posted past the post timeout: its operation fails naming itself.
        let b = Blame::new(2);
        b.failed(0, Some(2));
        assert_eq!(b.goodbye(), None);
        assert_eq!(b.last_failed(), None);
        assert_eq!(b.doomed(1, 1), 1);
    }

    #[test]
    fn a_post_a_lost_rank_dooms_names_the_culprit_it_heard_of() {
        let b = Blame::new(0);
        b.heard(Some(2));
        assert_eq!(b.goodbye(), None, "hearing of a failure is not failing");
        assert_eq!(b.doomed(4, 3), 2);
        assert_eq!(b.goodbye(), Some(2));

        let b = Blame::new(0);
        assert_eq!(b.doomed(0, 3), 3);
        assert_eq!(b.goodbye(), Some(3));
        // A failure without a rank to name leaves nobody to blame.
        let b = Blame::new(0);
        b.failed(1, None);
        assert_eq!(b.goodbye(), None);
    }

    /// A half's failure naming its rank 1 (the parent's rank 3) is what the parent's goodbye
    /// names, up through a quarter split from the half too, until the program posts on the
    /// parent again; a failure naming this rank itself, or a rank outside the members,
    /// passes nothing up, and the parent's own culprit comes first.
    #[test]
    fn a_split_communicator_s_failure_goes_up_to_its_parent() {
        let whole = Blame::new(0);
        let half = Blame::new(0);
        half.link_up(whole.clone(), vec![0, 3]);
        let quarter = Blame::new(0);
        quarter.link_up(half.clone(), vec![0, 1]);
        quarter.failed(2, Some(0));
        quarter.failed(2, Some(7));
        assert_eq!(whole.goodbye(), None, "this rank itself, or no member");
        quarter.failed(3, Some(1));
        assert_eq!(half.goodbye(), Some(1));
        assert_eq!(whole.goodbye(), Some(3));
        assert_eq!(
            whole.last_failed(),
            None,
            "no operation of the whole failed"
        );
        whole.posted();
        assert_eq!(whole.goodbye(), None);
        half.failed(9, Some(1));
        assert_eq!(whole.goodbye(), Some(3));
        // The whole's own failure comes first.
        whole.failed(4, Some(2));
        assert_eq!(whole.goodbye(), Some(2));
        whole.completed(5);
        assert_eq!(whole.goodbye(), Some(3), "the half's, not posted since");
        // The quarter went on (an operation after its failure completed): what it passed up
        // is forgotten above; the half's own failure is not.
        whole.posted();
        quarter.failed(10, Some(1));
        assert_eq!(whole.goodbye(), Some(3));
        quarter.completed(11);
        assert_eq!((half.goodbye(), whole.goodbye()), (Some(1), None));
        half.posted();
        half.failed(12, Some(1));
        half.completed(12);
        assert_eq!(whole.goodbye(), Some(3), "not one after the failure");
        half.completed(13);
        assert_eq!(whole.goodbye(), None);
    }

    #[test]
    fn clones_share_one_record_and_the_last_failure_is_kept() {
        let engine = Blame::new(0);
        let tcp = engine.clone();
        tcp.failed(3, Some(2));
        // The engine's goodbye names the TCP path's culprit.
        assert_eq!(engine.goodbye(), Some(2));
        assert_eq!(engine.last_failed(), Some((3, 2)));
        engine.failed(5, Some(1));
        assert_eq!(tcp.last_failed(), Some((5, 1)));
        // An earlier operation failing late does not hide the latest.
        tcp.failed(4, Some(3));
        assert_eq!(tcp.last_failed(), Some((5, 1)));
        assert_eq!(tcp.doomed(6, 3), 2, "the first culprit");
        assert_eq!(engine.last_failed(), Some((6, 2)));
    }
}
