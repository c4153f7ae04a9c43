//! Whom this rank's failures blame, and what its goodbye says about them.
//!
//! A rank that fails an operation over another rank's failure (the culprit) and then leaves
//! tells its peers so in its goodbye: a peer that hears of the departure before the failure
//! itself, or that finished the failed operation already (the `Abort` about it then tells it
//! nothing), fails its next operation naming the culprit, not the rank that left.

use super::error::CommError;

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

/// The first culprit and whether this rank is still failing over it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Blame {
    /// The rank the first failure blamed: what every later post's failure names. Losses
    /// arrive over one connection each, so when a rank's failure makes another leave too,
    /// this rank may hear of the second first; the first verdict is the one to keep.
    culprit: Option<u32>,
    /// The latest operation that failed over a rank, until a later one completes. Kept here,
    /// not read off the live operations: a failed one is released once its reads drain, most
    /// often before the application drops the communicator.
    failing: Option<u64>,
}

impl Blame {
    /// Operation `op` failed naming `peer` (a shape mismatch is not a failure of a rank:
    /// it is not reported here).
    pub(crate) fn failed(&mut self, op: u64, peer: Option<u32>) {
        self.culprit = self.culprit.or(peer);
        self.failing = self.failing.max(Some(op));
    }

    /// Operation `op` completed: one that started after the last failure means this rank
    /// goes on without it.
    pub(crate) fn completed(&mut self, op: u64) {
        if self.failing.is_some_and(|f| op > f) {
            self.failing = None;
        }
    }

    /// A post that would have become operation `next_op` fails because `rank` was lost; what
    /// it names: the culprit, or `rank` when none is known yet (which it becomes).
    pub(crate) fn doomed(&mut self, next_op: u64, rank: u32) -> u32 {
        let peer = *self.culprit.get_or_insert(rank);
        self.failing = self.failing.max(Some(next_op));
        peer
    }

    /// A lost rank's goodbye named `blamed`: the rank whose failure it left over, which this
    /// rank may not have heard of yet (it travels over another connection).
    pub(crate) fn heard(&mut self, blamed: Option<u32>) {
        self.culprit = self.culprit.or(blamed);
    }

    /// What this rank's goodbye names: the culprit, while it is leaving over a failure.
    pub(crate) fn goodbye(&self) -> Option<u32> {
        self.failing.and(self.culprit)
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
        let mut b = Blame::default();
        b.completed(0);
        b.heard(None);
        assert_eq!(b.goodbye(), None);
        // Nobody was blamed: a post the loss of rank 3 dooms names it.
        assert_eq!(b.doomed(1, 3), 3);
    }

    #[test]
    fn a_failure_is_named_in_the_goodbye_until_a_later_operation_completes() {
        let mut b = Blame::default();
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
        // The culprit stays what later posts name.
        assert_eq!(b.doomed(8, 3), 2);
    }

    #[test]
    fn a_post_a_lost_rank_dooms_names_the_culprit_it_heard_of() {
        let mut b = Blame::default();
        b.heard(Some(2));
        assert_eq!(b.goodbye(), None, "hearing of a failure is not failing");
        assert_eq!(b.doomed(4, 3), 2);
        assert_eq!(b.goodbye(), Some(2));

        let mut b = Blame::default();
        assert_eq!(b.doomed(0, 3), 3);
        assert_eq!(b.goodbye(), Some(3));
        // A failure without a rank to name leaves nobody to blame.
        let mut b = Blame::default();
        b.failed(1, None);
        assert_eq!(b.goodbye(), None);
    }
}
