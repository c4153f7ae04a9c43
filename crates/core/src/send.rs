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
    /// The sends' watch ([`look`](Self::look)): completions per lane at the last count,
    /// whether any lane moved since the last look, and whether there was one.
    seen: alloc::vec::Vec<u32>,
    progressed: bool,
    looked: bool,
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
            progressed: false,
            looked: false,
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
            self.progressed = true;
        }
    }

    /// Lane `lane` counted `done` of our multicasts completed.
    pub(crate) fn on_sent(&mut self, lane: u16, done: u32) {
        if self.sends_on(lane)
            && let Some(s) = self.seen.get_mut(usize::from(lane))
            && done > *s
        {
            *s = done;
            self.progressed = true;
        }
    }

    /// The sends' watch, once per patience: true when no lane completed a multicast since
    /// the last look (the transport stalled). Otherwise asks the lanes still sending for
    /// their counts, which the next look judges.
    pub(crate) fn look(&mut self, cx: &mut Ctx<'_>, op: OpId) -> bool {
        if self.looked && !self.progressed {
            return true;
        }
        self.looked = true;
        self.progressed = false;
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
