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
//! A barrier's wait that runs out does not blame at once: a rank that has not posted may be
//! alive and only late (an application that loads a checkpoint on one rank before a
//! Broadcast). The waiting rank asks the ranks it waits on where they stand (`Where`; the hub
//! every silent rank, the others the hub), and their sessions answer (`Here`, see
//! [`Standing`]) whatever their program does. One that does not answer within half a peer
//! timeout is hung or cut off, and named as before. One that has not posted is waited for
//! again, up to the post timeout from the start (then [`OpError::NotPosted`], told to every
//! rank, the late one included, which fails the operation as it posts it). The answer ends
//! the wait when it says that the rank ended the operation: without a barrier (the ranks
//! disagree on it: [`OpError::ShapeMismatch`]), or after one, failed over a rank (named, as
//! its `Abort` would) or not (this rank was left out: it is the one given up on). It ends it
//! too when the rank has not posted the operation and the last one it posted failed over
//! a rank (its program may have stopped there: that rank is named), unless that rank said
//! `Ready` here, or the failure was a disagreement (the programs go on). A rank other than
//! the hub whose hub runs the operation waits for the hub's verdict, past the post timeout,
//! up to twice it (the hub's own post timeout runs from a start no later).
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
use crate::time::Instant;
use crate::timer::Timer;
use crate::wire::{ControlKind, Standing};
use bitvec::prelude::*;

/// The barrier's own state.
#[derive(Clone, Debug)]
pub(crate) struct Barrier {
    hub: Rank,
    /// Hub only: which ranks said `Ready`.
    ready: BitVec<u64, Lsb0>,
    ready_count: u32,
    me: Rank,
    ranks: u32,
    /// This rank's fingerprint of the operation's shape.
    shape: u32,
    /// The ranks asked where they stand (`Where`) that have not answered; `None`: no
    /// question out.
    asked: Option<BitVec<u64, Lsb0>>,
    /// Until when the barrier waits for ranks that answer but have not posted (set at the
    /// start: the post timeout from then).
    pub(crate) post_by: Instant,
    /// The ranks whose last answer said that they have not posted the operation.
    late: BitVec<u64, Lsb0>,
    /// Every rank asked answered at least once.
    answered: bool,
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
            ranks,
            asked: None,
            post_by: Instant::ZERO,
            late: BitVec::new(),
            answered: false,
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

    /// Hub: whether `r` said `Ready`.
    fn said_ready(&self, r: Rank) -> bool {
        self.ready.get(r.index()).is_some_and(|b| *b)
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

    /// The ranks this barrier waits on: the hub every silent rank, the others the hub.
    fn waited(&self) -> impl Iterator<Item = Rank> + '_ {
        self.ring().filter(|&r| self.waits_on(r))
    }

    /// The other ranks in ring order from this one.
    fn ring(&self) -> impl Iterator<Item = Rank> + use<> {
        let (me, p) = (self.me.0, self.ranks);
        (1..p).map(move |i| Rank((me + i) % p))
    }

    /// The rank to name when the post timeout passed: the first rank waited on whose last
    /// answer said it had not posted, in ring order from this one.
    fn late_to_blame(&self) -> Option<Rank> {
        self.waited()
            .find(|r| self.late.get(r.index()).is_some_and(|b| *b))
    }

    /// The first rank asked where it stands that did not answer, in ring order from this one
    /// (with two hung, either is right).
    fn unanswered(&self) -> Option<Rank> {
        let asked = self.asked.as_ref()?;
        self.ring().find(|r| asked[r.index()])
    }

    /// Hub: whom to blame for the missing `Ready`s.
    ///
    /// A rank that has not said `Ready` may still be in the previous operation, done with its
    /// data but waiting for its successor's `Fin` (the hub, done with that operation, heard
    /// its own successor's): only a successor that hung withholds it, and that one has not
    /// said `Ready` either. So the blame goes along the ring, from the hub, to the first silent
    /// rank whose successor said `Ready` (or is the hub): the end of a run of silent ranks.
    pub(crate) fn silent_to_blame(&self) -> Option<Rank> {
        if !self.is_hub() {
            return None;
        }
        let p = self.ranks;
        let said = |r: u32| r == self.me.0 || self.ready[r as usize];
        self.ring().find(|r| !said(r.0) && said((r.0 + 1) % p))
    }
}

impl Collective {
    /// First step after the operation was created.
    pub(crate) fn on_start(&mut self, cx: &mut Ctx<'_>) -> Option<Outcome> {
        self.barrier.post_by = cx.now + cx.config.post_timeout;
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

    /// The barrier's own timer: the hub's wait for `Ready`s (`Timer::Ready`), or another
    /// rank's for `Go` (`Timer::Go`), ran out. If a question is out, a rank that did not
    /// answer it is to blame; otherwise the ranks waited on are asked where they stand, and
    /// have half a peer timeout to answer. Past the post timeout, the operation fails naming
    /// a rank whose last answer said it had not posted; at the hub, one that posted and owes
    /// its `Ready` is named as unresponsive; a rank other than the hub whose hub runs the
    /// operation waits for the hub's verdict, up to twice the post timeout.
    pub(crate) fn on_barrier_timeout(&mut self, cx: &mut Ctx<'_>) -> Option<Outcome> {
        let timer = self.barrier_timer();
        if let Some(peer) = self.barrier.unanswered() {
            return Some(Outcome::Failed {
                error: OpError::PeerUnresponsive { peer },
                abort: true,
            });
        }
        self.barrier.asked = None;
        if cx.now >= self.barrier.post_by {
            if let Some(peer) = self.barrier.late_to_blame() {
                return Some(Outcome::Failed {
                    error: OpError::NotPosted { peer },
                    abort: true,
                });
            }
            // Every rank waited on has posted (or not answered yet: it is asked). Elsewhere
            // than at the hub, the hub runs the operation, waiting on another rank: its
            // verdict comes first (its own post timeout, from a start no later than now,
            // bounds it; past one more, it is named all the same). At the hub, a rank that
            // posted and still owes its `Ready` is stuck: named as before.
            let hub_overdue = cx.now >= self.barrier.post_by + cx.config.post_timeout;
            if (self.barrier.is_hub() && self.barrier.answered) || hub_overdue {
                // Elsewhere than at the hub, the hub is the rank it waited for.
                let waited = if self.barrier.is_hub() {
                    self.succ
                } else {
                    self.barrier.hub()
                };
                let peer = self.barrier.silent_to_blame().unwrap_or(waited);
                return Some(Outcome::Failed {
                    error: OpError::PeerUnresponsive { peer },
                    abort: true,
                });
            }
        }
        let mut asked = bitvec![u64, Lsb0; 0; cx.config.ranks as usize];
        for r in self.barrier.waited() {
            asked.set(r.index(), true);
            cx.send(r, ControlMsg::simple(ControlKind::Where, self.id.0));
        }
        if asked.not_any() {
            // Nobody to wait on: every `Ready` is in (the hub then went on at the last one;
            // this only keeps the timer from staying due).
            self.timers.stop(timer);
            return self.maybe_go(cx);
        }
        self.barrier.asked = Some(asked);
        self.timers.set(timer, cx.now + cx.config.peer_timeout / 2);
        None
    }

    /// The barrier's timer at this rank.
    fn barrier_timer(&self) -> Timer {
        if self.barrier.is_hub() {
            Timer::Ready
        } else {
            Timer::Go
        }
    }

    /// `from` answered this rank's `Where`: it stands so on the operation. Alive, it is waited
    /// for again, a peer timeout from now once every rank asked answered (never past the
    /// post timeout), unless the answer ends the wait (see the module docs).
    pub(crate) fn on_here(
        &mut self,
        cx: &mut Ctx<'_>,
        from: Rank,
        standing: Standing,
    ) -> Option<Outcome> {
        let all_answered = match &mut self.barrier.asked {
            Some(a) if self.phase == Phase::Barrier && a.get(from.index()).is_some_and(|b| *b) => {
                a.set(from.index(), false);
                a.not_any()
            }
            _ => {
                bump(&mut cx.stats.control_unexpected);
                return None;
            }
        };
        let late = &mut self.barrier.late;
        if late.is_empty() {
            late.resize(cx.config.ranks as usize, false);
        }
        let not_posted = matches!(standing, Standing::NotPosted | Standing::NotPostedAfter(_));
        late.set(from.index(), not_posted);
        let me = self.me;
        let ranks = cx.config.ranks;
        match standing {
            // It failed the operation (or abandoned it) naming `c`, this rank included: it
            // will never say `Ready` or `Go`.
            Standing::EndedAfter(c) if c < ranks => {
                return Some(Outcome::Failed {
                    error: OpError::PeerFailed {
                        peer: Rank(c),
                        reported_by: from,
                    },
                    abort: true,
                });
            }
            // It ended the operation without this rank (completed: this rank's `Ready` or
            // the hub's `Go` went missing): nothing more will come.
            Standing::Ended | Standing::EndedAfter(_) => {
                return Some(Outcome::Failed {
                    error: OpError::PeerFailed {
                        peer: me,
                        reported_by: from,
                    },
                    abort: self.barrier.is_hub(),
                });
            }
            Standing::EndedApart => {
                return Some(Outcome::Failed {
                    error: OpError::ShapeMismatch {
                        peer: from,
                        reported_by: me,
                    },
                    abort: true,
                });
            }
            // Unless `c` has said `Ready` here: it posted this operation, so it is alive and
            // its program went on.
            Standing::NotPostedAfter(c)
                if c < ranks && c != me.0 && c != from.0 && !self.barrier.said_ready(Rank(c)) =>
            {
                return Some(Outcome::Failed {
                    error: OpError::PeerFailed {
                        peer: Rank(c),
                        reported_by: from,
                    },
                    abort: true,
                });
            }
            _ => {}
        }
        if all_answered {
            self.barrier.asked = None;
            self.barrier.answered = true;
            let mut at = cx.now + cx.config.peer_timeout;
            if self.barrier.late_to_blame().is_some() {
                at = at.min(self.barrier.post_by);
            }
            self.timers.set(self.barrier_timer(), at);
        }
        None
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
