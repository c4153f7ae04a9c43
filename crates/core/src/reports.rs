//! The failures other ranks reported, for naming the right rank when a wait runs out.
//!
//! A rank that gives up on an operation over a peer tells the others whom it blames (an
//! `Abort`, or its goodbye when it leaves over it). A rank this one waits on may be stuck
//! in an earlier operation on that culprit, not hung itself: a wait that runs out on it names
//! the rank it reported, else the rank of the earliest report, until an operation after them
//! completes here (every rank took part in it, so what was reported before is over). The
//! session keeps one for the multicast operations; ringcast's TCP path keeps another.

use alloc::vec::Vec;

use crate::Rank;

/// Per rank, the last failure it reported: the operation and the rank it named.
#[derive(Clone, Debug)]
pub struct Reports {
    me: Rank,
    last: Vec<Option<(u64, Rank)>>,
    /// Reports of operations below this one are over: a later operation completed here.
    over: u64,
}

impl Reports {
    /// No reports, at rank `me` of `ranks`.
    #[must_use]
    pub fn new(me: Rank, ranks: u32) -> Self {
        Reports {
            me,
            last: alloc::vec![None; ranks as usize],
            over: 0,
        }
    }

    /// `from` reported that it failed operation `seq` over `culprit`. Kept only below
    /// `horizon` (an operation this rank ran or may still run: a report far ahead would
    /// outlive every completion that clears it), not before an operation that completed here
    /// (it is over, as it would be had it come before that completion), and only naming
    /// another rank than this one and the reporter (no rank gives up on itself: such a report
    /// is noise). Whether it was kept.
    pub fn report(&mut self, from: Rank, seq: u64, culprit: Rank, horizon: u64) -> bool {
        let known = culprit.index() < self.last.len();
        if known
            && culprit != self.me
            && culprit != from
            && seq < horizon
            && seq >= self.over
            && let Some(r) = self.last.get_mut(from.index())
        {
            *r = Some((seq, culprit));
            return true;
        }
        false
    }

    /// Operation `seq` completed here: the reports of operations before it are over.
    pub fn completed(&mut self, seq: u64) {
        self.over = self.over.max(seq);
        for r in &mut self.last {
            if r.is_some_and(|(s, _)| s < seq) {
                *r = None;
            }
        }
    }

    /// Whom a wait that ran out on `peer` names, as `(culprit, reported_by)`: the rank
    /// `peer` reported, else the rank of the earliest report (by operation, then rank);
    /// `None` when nothing was reported, and `peer` is to blame.
    #[must_use]
    pub fn blame(&self, peer: Rank) -> Option<(Rank, Rank)> {
        let own = self
            .last
            .get(peer.index())
            .copied()
            .flatten()
            .map(|(_, culprit)| (culprit, peer));
        own.or_else(|| {
            (0..self.last.len() as u32)
                .map(Rank)
                .filter_map(|r| Some((r, self.last[r.index()]?)))
                .min_by_key(|&(r, (seq, _))| (seq, r.0))
                .map(|(r, (_, culprit))| (culprit, r))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wait_names_the_rank_its_peer_reported_else_the_earliest() {
        let mut r = Reports::new(Rank(0), 5);
        assert_eq!(r.blame(Rank(1)), None);
        assert!(r.report(Rank(3), 7, Rank(4), 100));
        assert!(r.report(Rank(2), 5, Rank(1), 100));
        // Rank 3 reported: its culprit. Rank 1 did not: the earliest report's.
        assert_eq!(r.blame(Rank(3)), Some((Rank(4), Rank(3))));
        assert_eq!(r.blame(Rank(1)), Some((Rank(1), Rank(2))));
        // Completions clear what came before them, not what came after.
        r.completed(6);
        assert_eq!(r.blame(Rank(1)), Some((Rank(4), Rank(3))));
        r.completed(8);
        assert_eq!(r.blame(Rank(1)), None);
        // A report of an operation before one that completed is over when it comes.
        assert!(!r.report(Rank(3), 7, Rank(4), 100), "late");
        assert!(r.report(Rank(3), 8, Rank(4), 100));
        assert_eq!(r.blame(Rank(1)), Some((Rank(4), Rank(3))));
    }

    #[test]
    fn reports_that_blame_this_rank_the_reporter_or_nobody_or_lie_far_ahead_are_not_kept() {
        let mut r = Reports::new(Rank(0), 4);
        assert!(!r.report(Rank(1), 1, Rank(0), 100), "this rank");
        assert!(!r.report(Rank(1), 1, Rank(1), 100), "the reporter itself");
        assert!(!r.report(Rank(1), 1, Rank(9), 100), "no rank");
        assert!(!r.report(Rank(9), 1, Rank(2), 100), "from no rank");
        assert!(!r.report(Rank(1), 100, Rank(2), 100), "beyond the horizon");
        assert_eq!(r.blame(Rank(1)), None);
    }
}
