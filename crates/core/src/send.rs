//! A root's side of an operation: its block's multicasts, one [`LaneTx`](crate::lane::LaneTx)
//! per lane, and the Allgather chain token it passes on when they are done.

use bitvec::{bitvec, vec::BitVec};

use crate::config::Rank;
use crate::event::OpId;
use crate::lane::{LaneCommand, TxCommand, TxStart};
use crate::layout::Layout;
use crate::out::{ControlMsg, Ctx, Outcome, bump};
use crate::wire::ControlKind;

/// The root's sends and the chain token.
#[derive(Clone, Debug)]
pub(crate) struct RootSend {
    /// Sending our own block is allowed (a Broadcast root, a chain head, or a rank whose
    /// chain predecessor handed over the token).
    activated: bool,
    chain_next: Option<Rank>,
    chain_prev: Option<Rank>,
    started: bool,
    /// Lanes whose sends are not reported done yet.
    lanes_left: u32,
    /// Which lanes those are: a lane's done note counts once (a driver that forwards one
    /// twice, or names a lane with nothing to send, does not end the sends early).
    sending_on: BitVec,
    token_passed: bool,
    /// Our block has no chunk: there is nothing to send.
    pub(crate) empty: bool,
    /// The sends' watch ([`look`](Self::look)): completions per lane at the last answers,
    /// the lanes whose answer to the current look is awaited, and whether a lane advanced
    /// or finished since the last verdict.
    seen: alloc::vec::Vec<u32>,
    awaiting: BitVec,
    moved: bool,
}

impl RootSend {
    pub(crate) fn new(activated: bool, next: Option<Rank>, prev: Option<Rank>) -> Self {
        RootSend {
            activated,
            chain_next: next,
            chain_prev: prev,
            started: false,
            lanes_left: 0,
            sending_on: BitVec::new(),
            token_passed: false,
            empty: false,
            seen: alloc::vec::Vec::new(),
            awaiting: BitVec::new(),
            moved: false,
        }
    }

    /// Every chunk of our block was sent (trivially so for an empty block).
    pub(crate) fn done(&self) -> bool {
        self.empty || self.started && self.lanes_left == 0
    }

    /// Our block's multicasts are under way: our uplink is busy with them.
    pub(crate) fn sending(&self) -> bool {
        self.started && self.lanes_left > 0
    }

    /// Hands our block to the lanes once activated (the data phase has begun). Returns
    /// whether lanes began sending now.
    pub(crate) fn start(
        &mut self,
        cx: &mut Ctx<'_>,
        op: OpId,
        tag: u32,
        layout: &Layout,
        me: Rank,
    ) -> bool {
        if !self.activated || self.started {
            return false;
        }
        self.started = true;
        self.sending_on = bitvec![0; layout.lanes() as usize];
        self.seen = alloc::vec![0; layout.lanes() as usize];
        self.awaiting = bitvec![0; layout.lanes() as usize];
        for l in 0..layout.lanes() {
            let block = layout.lane_block(me.0, l);
            if block.count == 0 {
                continue;
            }
            self.lanes_left += 1;
            self.sending_on.set(l as usize, true);
            cx.lane(LaneCommand::Tx {
                lane: l as u16,
                cmd: TxCommand::Start(TxStart { op, tag, block }),
            });
        }
        self.lanes_left > 0
    }

    /// Whether lane `lane` still sends our block.
    fn sends_on(&self, lane: u16) -> bool {
        self.sending_on.get(usize::from(lane)).is_some_and(|b| *b)
    }

    /// Lane `lane` finished its part of our block.
    pub(crate) fn on_sends_done(&mut self, lane: u16) {
        if self.sends_on(lane) {
            self.sending_on.set(usize::from(lane), false);
            self.lanes_left -= 1;
            self.moved = true;
        }
    }

    /// Lane `lane` answered a look: `done` of our multicasts on it completed so far. When
    /// it was the last answer awaited, the verdict: true (stalled) when no lane's count grew
    /// since the last answers and no lane finished since the last verdict.
    pub(crate) fn on_sent(&mut self, lane: u16, done: u32) -> bool {
        let l = usize::from(lane);
        if !self.awaiting.get(l).is_some_and(|b| *b) {
            return false;
        }
        self.awaiting.set(l, false);
        if self.sends_on(lane)
            && let Some(s) = self.seen.get_mut(l)
            && done > *s
        {
            *s = done;
            self.moved = true;
        }
        if self.awaiting.any() {
            return false;
        }
        !core::mem::replace(&mut self.moved, false) && !self.done()
    }

    /// The sends' watch, once per patience: asks the lanes still sending how many of our
    /// multicasts completed ([`on_sent`](Self::on_sent) judges their answers). True
    /// (stalled) when the last look's answers never all came: the lanes are stuck.
    pub(crate) fn look(&mut self, cx: &mut Ctx<'_>, op: OpId) -> bool {
        if self.awaiting.any() {
            return true;
        }
        self.awaiting.clone_from(&self.sending_on);
        for l in self.sending_on.iter_ones() {
            cx.lane(LaneCommand::Tx {
                lane: l as u16,
                cmd: TxCommand::Count { op },
            });
        }
        false
    }

    /// Passes the chain token once our block is sent.
    pub(crate) fn pass_token(&mut self, cx: &mut Ctx<'_>, op: OpId) {
        if self.activated && self.started && !self.token_passed && self.lanes_left == 0 {
            self.token_passed = true;
            if let Some(next) = self.chain_next {
                cx.send(next, ControlMsg::simple(ControlKind::Activate, op.0));
            }
        }
    }

    /// The operation failed: stop the lanes still sending.
    pub(crate) fn cancel(&mut self, cx: &mut Ctx<'_>, op: OpId, lanes: u32) {
        if self.started && self.lanes_left > 0 {
            for l in 0..lanes {
                cx.lane(LaneCommand::Tx {
                    lane: l as u16,
                    cmd: TxCommand::Cancel { op },
                });
            }
        }
    }

    /// We have a block to send and the chain token has not reached us.
    pub(crate) fn waiting(&self) -> bool {
        !self.activated && !self.empty
    }

    /// The cutoff passed without the token (the chain predecessor crashed before handing it
    /// on, or the chain is that late): send our block anyway, and pass the token on after.
    pub(crate) fn activate_late(&mut self) {
        self.activated = true;
    }

    /// A chain predecessor finished its block: our turn. False if unexpected.
    fn activate(&mut self, from: Rank) -> bool {
        if self.activated || self.chain_prev != Some(from) {
            return false;
        }
        self.activated = true;
        true
    }
}

impl crate::op::Collective {
    /// A chain predecessor finished its block: our turn to multicast.
    pub(crate) fn on_activate(&mut self, cx: &mut Ctx<'_>, from: Rank) -> Option<Outcome> {
        if !self.send.activate(from) {
            bump(&mut cx.stats.control_unexpected);
            return None;
        }
        self.progress(cx)
    }
}
