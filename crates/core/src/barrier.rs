//! The RNR barrier that precedes every multicast: no root may send a chunk before every rank
//! has posted its receives.
//!
//! We gather at a hub (the Broadcast root, or rank 0 for an Allgather): every other rank sends
//! `Ready`, the hub answers `Go` to all. Compared with a dissemination barrier this costs two
//! message latencies instead of `2 log P`, and it blames exactly: the hub waits on every rank
//! directly, so when one never answers the hub names it, and the others (who wait twice as
//! long for `Go`) hear the verdict through `Abort` before their own deadline.

use crate::config::Rank;
use crate::op::{Collective, Phase, Wait};
use crate::out::{ControlMsg, Ctx, Outcome, bump};
use crate::wire::ControlKind;

impl Collective {
    /// First step after the operation was created.
    pub(crate) fn on_start(&mut self, cx: &mut Ctx<'_>) -> Option<Outcome> {
        if self.me == self.hub {
            self.wait = Some(Wait {
                peer: self.succ,
                deadline: cx.now + cx.config.peer_timeout,
            });
            self.maybe_go(cx)
        } else {
            cx.send(self.hub, ControlMsg::simple(ControlKind::Ready, self.id.0));
            let deadline = cx.now + cx.config.peer_timeout * 2;
            self.wait = Some(Wait {
                peer: self.hub,
                deadline,
            });
            None
        }
    }

    /// Hub: a rank posted its receives.
    pub(crate) fn on_ready(&mut self, cx: &mut Ctx<'_>, from: Rank) -> Option<Outcome> {
        let fresh = self.me == self.hub
            && self.phase == Phase::Barrier
            && from != self.me
            && self.ready.get(from.index()).is_some_and(|b| !*b);
        if !fresh {
            bump(&mut cx.stats.control_unexpected);
            return None;
        }
        self.ready.set(from.index(), true);
        self.ready_count += 1;
        self.maybe_go(cx)
    }

    fn maybe_go(&mut self, cx: &mut Ctx<'_>) -> Option<Outcome> {
        if self.ready_count + 1 < cx.config.ranks {
            return None;
        }
        for r in (0..cx.config.ranks).map(Rank).filter(|r| *r != self.me) {
            cx.send(r, ControlMsg::simple(ControlKind::Go, self.id.0));
        }
        self.begin_data(cx);
        self.progress(cx)
    }

    /// Everyone is ready.
    pub(crate) fn on_go(&mut self, cx: &mut Ctx<'_>, from: Rank) -> Option<Outcome> {
        if self.me == self.hub || from != self.hub || self.phase != Phase::Barrier {
            bump(&mut cx.stats.control_unexpected);
            return None;
        }
        self.begin_data(cx);
        self.progress(cx)
    }

    /// Hub: the lowest rank whose `Ready` is missing.
    pub(crate) fn first_unready(&self) -> Option<Rank> {
        self.ready
            .iter_zeros()
            .map(|i| Rank(i as u32))
            .find(|r| *r != self.me)
    }
}
