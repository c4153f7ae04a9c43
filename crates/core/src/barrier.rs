//! The RNR barrier that precedes every multicast: no root may send a chunk before every rank
//! has opened the operation on its lanes (posted its receives).
//!
//! We gather at a hub (the Broadcast root, or rank 0 for an Allgather): every other rank sends
//! `Ready`, the hub answers `Go` to all. Compared with a dissemination barrier this costs two
//! message latencies instead of `2 log P`, and it blames exactly: the hub waits on every rank
//! directly, so when one never answers the hub names it, and the others (who wait twice as
//! long for `Go`) hear the verdict through `Abort` before their own deadline.
//!
//! Right after other operations (back to back, as a program of blocking calls runs them), a
//! rank the barrier waits on may not have posted because it still waits in an earlier one: on
//! its successor's `Fin` (up to twice the peer timeout), or on a read. Its verdict must come
//! first, and name the rank it waited on: so the barrier waits longer then
//! (`Session::barrier_slack`: the others 3.5 peer timeouts for `Go`, plus the earlier
//! operation's time on the link; the hub 2.5 when two ranks or more are silent, and one when
//! a single rank is, which cannot be waiting on another: the common case stays fast), a
//! verdict of the barrier's own timers names the rank that
//! the rank it blames reported (its `Abort`, even for an operation over here; see
//! `Session::verdict`), and the hub blames the end of a run of silent ranks in ring order
//! ([`Barrier::silent_to_blame`]): the one a `Fin` waits on.
//!
//! A rank queues the lanes' `Open` before it says `Ready` (see [`crate::lane`]), so no chunk
//! can reach a lane before its operation.
//!
//! `Ready` carries the sender's fingerprint of the operation's shape (see [`crate::shape`]).
//! The hub compares it with its own, and a hub other than rank 0 also sends its own `Ready`
//! to rank 0 (the witness), which compares it too. No other rank expects a `Ready`, so one
//! that reaches it says that its sender took another rank for the root. The rank that sees a
//! difference fails the operation and tells every other rank (`Mismatch`, naming the
//! sender), before `Go`: no chunk of it is ever sent, and the ranks stay in step for the next
//! operation.
//!
//! With the witness every disagreement is seen: a rank whose shape differs from rank 0's
//! sends its `Ready` to the hub it believes in, which is rank 0 (which compares), a rank of
//! another shape (a hub compares; any other rank did not expect it), or a rank of its own
//! shape that is a hub, whose witness rank 0 compares. An empty operation completes at once
//! but still sends its `Ready`; a rank that ended an operation without a barrier (empty here,
//! or skipped: it ran over another path) compares the `Ready`s that reach it afterwards, and
//! tells every rank when they disagree (see `Session::late_ready`).

use crate::config::Rank;
use crate::event::OpError;
use crate::op::{Collective, Phase};
use crate::out::{ControlMsg, Ctx, Outcome, bump};
use crate::timer::Timer;
use crate::wire::ControlKind;
use bitvec::prelude::*;

/// The barrier's own state.
#[derive(Clone, Debug)]
pub(crate) struct Barrier {
    hub: Rank,
    /// Hub only: which ranks said `Ready`.
    ready: BitVec<u64, Lsb0>,
    ready_count: u32,
    me: Rank,
    /// This rank's fingerprint of the operation's shape.
    shape: u32,
}

impl Barrier {
    pub(crate) fn new(hub: Rank, me: Rank, ranks: u32, shape: u32) -> Self {
        Barrier {
            shape,
            hub,
            ready: if me == hub {
                bitvec![u64, Lsb0; 0; ranks as usize]
            } else {
                BitVec::new()
            },
            ready_count: 0,
            me,
        }
    }

    pub(crate) fn hub(&self) -> Rank {
        self.hub
    }

    /// This rank's fingerprint of the operation's shape.
    pub(crate) fn shape(&self) -> u32 {
        self.shape
    }

    fn is_hub(&self) -> bool {
        self.me == self.hub
    }

    /// Records `from`'s `Ready`; false if it was not expected.
    fn mark(&mut self, from: Rank) -> bool {
        let fresh =
            self.is_hub() && from != self.me && self.ready.get(from.index()).is_some_and(|b| !*b);
        if fresh {
            self.ready.set(from.index(), true);
            self.ready_count += 1;
        }
        fresh
    }

    /// Whether the barrier waits on `r`: the hub on its `Ready`, the others on the hub's `Go`.
    fn waits_on(&self, r: Rank) -> bool {
        if self.is_hub() {
            r != self.me && self.ready.get(r.index()).is_some_and(|b| !*b)
        } else {
            r == self.hub
        }
    }

    fn all_ready(&self, ranks: u32) -> bool {
        self.ready_count + 1 >= ranks
    }

    /// Hub: how many ranks have not said `Ready`.
    pub(crate) fn silent(&self) -> u32 {
        (self.ready.len() as u32).saturating_sub(self.ready_count + 1)
    }

    /// Hub: whom to blame for the missing `Ready`s.
    ///
    /// A rank that has not said `Ready` may still be in the previous operation, done with its
    /// data but waiting for its successor's `Fin` (the hub, done with that operation, heard
    /// its own successor's): only a successor that hung withholds it, and that one has not
    /// said `Ready` either. So the blame goes along the ring, from the hub, to the first silent
    /// rank whose successor said `Ready` (or is the hub): the end of a run of silent ranks.
    pub(crate) fn silent_to_blame(&self) -> Option<Rank> {
        let p = self.ready.len() as u32;
        let said = |r: u32| r == self.me.0 || self.ready[r as usize];
        (1..p)
            .map(|i| (self.me.0 + i) % p)
            .find(|&r| !said(r) && said((r + 1) % p))
            .map(Rank)
    }
}

impl Collective {
    /// First step after the operation was created.
    pub(crate) fn on_start(&mut self, cx: &mut Ctx<'_>) -> Option<Outcome> {
        self.open_lanes(cx);
        self.say_ready(cx);
        if self.barrier.is_hub() {
            self.timers
                .set(Timer::Ready, cx.now + cx.config.peer_timeout);
            self.maybe_go(cx)
        } else {
            self.timers.set(
                Timer::Go,
                cx.now + cx.config.peer_timeout * 2 + self.barrier_slack,
            );
            None
        }
    }

    /// Sends this rank's `Ready`: to the hub, or from a hub other than rank 0 to rank 0 (the
    /// witness).
    pub(crate) fn say_ready(&self, cx: &mut Ctx<'_>) {
        if !self.barrier.is_hub() {
            cx.send(self.barrier.hub(), self.ready_msg());
        } else if self.me != Rank(0) {
            cx.send(Rank(0), self.ready_msg());
        }
    }

    /// `Ready` with this rank's shape fingerprint.
    fn ready_msg(&self) -> ControlMsg {
        let mut m = ControlMsg::simple(ControlKind::Ready, self.id.0);
        m.arg = self.barrier.shape;
        m
    }

    /// Hub: a rank posted its receives, for an operation of shape `shape`. Rank 0: the hub's
    /// witness. Anywhere else, or with a shape other than this rank's, the ranks disagree on
    /// the operation.
    pub(crate) fn on_ready(&mut self, cx: &mut Ctx<'_>, from: Rank, shape: u32) -> Option<Outcome> {
        let same = shape == self.barrier.shape;
        if !self.barrier.is_hub() && self.me == Rank(0) && from == self.barrier.hub() && same {
            return None;
        }
        if self.phase == Phase::Barrier && from != self.me && (!self.barrier.is_hub() || !same) {
            return Some(Outcome::Failed {
                error: OpError::ShapeMismatch {
                    peer: from,
                    reported_by: self.me,
                },
                abort: true,
            });
        }
        if self.phase != Phase::Barrier || !self.barrier.mark(from) {
            bump(&mut cx.stats.control_unexpected);
            return None;
        }
        self.maybe_go(cx)
    }

    fn maybe_go(&mut self, cx: &mut Ctx<'_>) -> Option<Outcome> {
        if !self.barrier.all_ready(cx.config.ranks) {
            return None;
        }
        for r in (0..cx.config.ranks).map(Rank).filter(|r| *r != self.me) {
            cx.send(r, ControlMsg::simple(ControlKind::Go, self.id.0));
        }
        self.begin_data(cx);
        self.progress(cx)
    }

    /// `reporter` failed an operation over `culprit` (its `Abort`, or its goodbye): still in
    /// the barrier and waiting on that rank, this operation cannot go on. It fails now,
    /// naming it, rather than at a timer that right after other operations waits long for
    /// exactly such a report (the session's `barrier_slack`).
    pub(crate) fn on_report(&self, culprit: Rank, reporter: Rank) -> Option<Outcome> {
        (self.phase == Phase::Barrier && self.barrier.waits_on(culprit)).then_some(
            Outcome::Failed {
                error: OpError::PeerFailed {
                    peer: culprit,
                    reported_by: reporter,
                },
                abort: true,
            },
        )
    }

    /// Everyone is ready.
    pub(crate) fn on_go(&mut self, cx: &mut Ctx<'_>, from: Rank) -> Option<Outcome> {
        if self.barrier.is_hub() || from != self.barrier.hub() || self.phase != Phase::Barrier {
            bump(&mut cx.stats.control_unexpected);
            return None;
        }
        self.begin_data(cx);
        self.progress(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hub `hub` of `ranks` with `said` having said `Ready`: whom it blames.
    fn blamed(hub: u32, ranks: u32, said: &[u32]) -> Option<u32> {
        let mut b = Barrier::new(Rank(hub), Rank(hub), ranks, 0);
        for &r in said {
            assert!(b.mark(Rank(r)));
        }
        b.silent_to_blame().map(|r| r.0)
    }

    #[test]
    fn the_hub_blames_the_end_of_a_run_of_silent_ranks() {
        // One silent rank: that one.
        assert_eq!(blamed(0, 4, &[1, 3]), Some(2));
        assert_eq!(blamed(0, 4, &[1, 2]), Some(3));
        // Rank 1 may wait for rank 2's `Fin`: rank 2.
        assert_eq!(blamed(0, 4, &[3]), Some(2));
        assert_eq!(blamed(2, 6, &[3, 0]), Some(5));
        // Nobody said anything: the hub's predecessor (the run ends at the hub).
        assert_eq!(blamed(0, 4, &[]), Some(3));
        assert_eq!(blamed(1, 2, &[]), Some(0));
        // Two runs: the first after the hub.
        assert_eq!(blamed(0, 6, &[3, 5]), Some(2));
        assert_eq!(blamed(0, 4, &[1, 2, 3]), None);
    }
}
