//! The RNR barrier that precedes every multicast: the root must not send a chunk before every
//! leaf has posted its receives.
//!
//! We gather at the operation's root (leaf -> root `Ready`, root -> leaves `Go`) rather than run
//! a dissemination barrier. It costs two message latencies instead of `2 log P`, and the root is
//! the one rank that needs the answer. It also blames exactly: the root waits on every leaf
//! directly, so when a leaf never answers the root names that leaf, and leaves (who wait twice
//! as long for `Go`) hear the verdict through `Abort` before their own deadline.

use crate::bcast::{Broadcast, Phase, Wait};
use crate::config::Rank;
use crate::out::{ControlMsg, Ctx, Outcome, bump};
use crate::wire::ControlKind;

impl Broadcast {
    /// First step after the operation was created.
    pub(crate) fn on_start(&mut self, cx: &mut Ctx<'_>) -> Option<Outcome> {
        if self.is_root() {
            self.wait = Some(Wait {
                peer: self.succ,
                deadline: cx.now + cx.config.peer_timeout,
            });
            self.maybe_go(cx)
        } else {
            cx.send(self.root, ControlMsg::simple(ControlKind::Ready, self.id.0));
            let deadline = cx.now + cx.config.peer_timeout * 2;
            self.wait = Some(Wait {
                peer: self.root,
                deadline,
            });
            None
        }
    }

    /// Root: a leaf posted its receives.
    pub(crate) fn on_ready(&mut self, cx: &mut Ctx<'_>, from: Rank) -> Option<Outcome> {
        let fresh = self.is_root()
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
        // The root never reads from anyone: release its predecessor at once.
        self.fin_sent = true;
        cx.send(self.pred, ControlMsg::simple(ControlKind::Fin, self.id.0));
        self.begin_data(cx);
        self.progress(cx)
    }

    /// Leaf: every leaf is ready and the root is multicasting.
    pub(crate) fn on_go(&mut self, cx: &mut Ctx<'_>, from: Rank) -> Option<Outcome> {
        if self.is_root() || from != self.root || self.phase != Phase::Barrier {
            bump(&mut cx.stats.control_unexpected);
            return None;
        }
        self.begin_data(cx);
        self.progress(cx)
    }

    fn begin_data(&mut self, cx: &mut Ctx<'_>) {
        self.phase = Phase::Data;
        self.wait = None;
        self.cutoff_at = Some(cx.now + self.wire_time(cx.config) + cx.config.cutoff_alpha);
    }

    /// Root: the lowest leaf whose `Ready` is missing.
    pub(crate) fn first_unready(&self) -> Option<Rank> {
        self.ready
            .iter_zeros()
            .map(|i| Rank(i as u32))
            .find(|r| *r != self.me)
    }
}
