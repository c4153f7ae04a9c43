//! A port made of queues, for drivers that move packets themselves: the simulator, the
//! tests and the fuzz targets push what arrives, call [`pump`](super::pump), and take what
//! the node sent.

use super::{
    Capabilities, ControlInput, ControlPort, LaneRxPort, LaneTxPort, Ports, ReadRequest, RxMeta,
    RxToken,
};
use crate::config::Rank;
use crate::event::{OpId, Placement, ReadError, ReadId};
use crate::lane::Multicast;
use alloc::collections::VecDeque;
use alloc::vec::Vec;

/// A lane's receive queue. Each chunk carries a payload `P` of the driver's choosing (bytes,
/// or a token standing for them); consumed chunks are collected in
/// [`consumed`](Self::consumed) with the core's verdict.
#[derive(Debug)]
pub struct MailRx<P> {
    /// Arrivals; `true`: its copy fails ([`push_failing`](Self::push_failing)).
    queue: VecDeque<(RxMeta, P, bool)>,
    /// Chunks consumed, with the core's placement and their payloads, in order: the driver
    /// writes the placed ones (and may log the drops).
    pub consumed: Vec<(Placement, P)>,
    /// Chunks placed whose copy failed, with their placement: nothing is written, and the
    /// token said so (the driver released them).
    pub failed: Vec<(Placement, P)>,
}

impl<P> Default for MailRx<P> {
    fn default() -> Self {
        MailRx {
            queue: VecDeque::new(),
            consumed: Vec::new(),
            failed: Vec::new(),
        }
    }
}

impl<P> MailRx<P> {
    /// A chunk arrives.
    pub fn push(&mut self, meta: RxMeta, payload: P) {
        self.queue.push_back((meta, payload, false));
    }

    /// A chunk arrives whose copy will fail if the core places it: its token's
    /// [`consume`](RxToken::consume) then returns `false` and logs it in
    /// [`failed`](Self::failed) (a drop goes to [`consumed`](Self::consumed) as usual).
    pub fn push_failing(&mut self, meta: RxMeta, payload: P) {
        self.queue.push_back((meta, payload, true));
    }
}

/// A chunk in a [`MailRx`].
#[derive(Debug)]
pub struct MailToken<'a, P> {
    consumed: &'a mut Vec<(Placement, P)>,
    failed: &'a mut Vec<(Placement, P)>,
    meta: RxMeta,
    payload: P,
    fails: bool,
}

impl<P> RxToken for MailToken<'_, P> {
    fn meta(&self) -> RxMeta {
        self.meta
    }
    fn consume(self, placement: &Placement) -> bool {
        if self.fails && matches!(placement, Placement::Place { .. }) {
            self.failed.push((*placement, self.payload));
            return false;
        }
        self.consumed.push((*placement, self.payload));
        true
    }
}

impl<P> LaneRxPort for MailRx<P> {
    type Token<'a>
        = MailToken<'a, P>
    where
        Self: 'a;

    fn receive(&mut self) -> Option<MailToken<'_, P>> {
        let (meta, payload, fails) = self.queue.pop_front()?;
        Some(MailToken {
            consumed: &mut self.consumed,
            failed: &mut self.failed,
            meta,
            payload,
            fails,
        })
    }
}

/// A lane's send queue.
#[derive(Debug, Default)]
pub struct MailTx {
    /// Multicasts posted, in order: the driver sends them.
    pub posted: VecDeque<Multicast>,
    done: VecDeque<(OpId, u32)>,
}

impl MailTx {
    /// The driver finished sending `chunks` multicasts of `op`.
    pub fn complete(&mut self, op: OpId, chunks: u32) {
        self.done.push_back((op, chunks));
    }
}

impl LaneTxPort for MailTx {
    fn post_multicast(&mut self, m: &Multicast) {
        self.posted.push_back(*m);
    }
    fn poll_send_done(&mut self) -> Option<(OpId, u32)> {
        self.done.pop_front()
    }
}

/// Something the node sent on the control path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MailOut {
    /// A message for `to`.
    Message {
        /// Destination.
        to: Rank,
        /// Bytes.
        bytes: Vec<u8>,
    },
    /// A read to carry out.
    Read(ReadRequest),
}

/// The control queues.
#[derive(Debug, Default)]
pub struct MailControl {
    inbox: VecDeque<(Rank, Vec<u8>)>,
    reads_done: VecDeque<(ReadId, Result<(), ReadError>)>,
    /// Messages and reads the node sent, in order: the driver carries them.
    pub outbox: VecDeque<MailOut>,
    /// Spare message buffers, reused.
    spare: Vec<Vec<u8>>,
}

impl MailControl {
    /// A message from `from` arrives.
    pub fn deliver(&mut self, from: Rank, bytes: &[u8]) {
        let mut v = self.spare.pop().unwrap_or_default();
        v.clear();
        v.extend_from_slice(bytes);
        self.inbox.push_back((from, v));
    }

    /// A read finished.
    pub fn read_done(&mut self, id: ReadId, result: Result<(), ReadError>) {
        self.reads_done.push_back((id, result));
    }

    /// Gives a message buffer taken from the outbox back for reuse.
    pub fn recycle(&mut self, v: Vec<u8>) {
        if self.spare.len() < 64 {
            self.spare.push(v);
        }
    }
}

impl ControlPort for MailControl {
    fn send_control(&mut self, to: Rank, bytes: &[u8]) {
        let mut v = self.spare.pop().unwrap_or_default();
        v.clear();
        v.extend_from_slice(bytes);
        self.outbox.push_back(MailOut::Message { to, bytes: v });
    }

    fn read(&mut self, req: &ReadRequest) {
        self.outbox.push_back(MailOut::Read(*req));
    }

    fn poll_control(&mut self, buf: &mut Vec<u8>) -> Option<ControlInput> {
        if let Some((id, result)) = self.reads_done.pop_front() {
            return Some(ControlInput::ReadDone { id, result });
        }
        let (from, v) = self.inbox.pop_front()?;
        buf.clear();
        buf.extend_from_slice(&v);
        self.recycle(v);
        Some(ControlInput::Message {
            from,
            len: buf.len(),
        })
    }
}

/// Mailbox ports for `lanes` lanes.
pub type Mailbox<P> = Ports<MailRx<P>, MailTx, MailControl>;

/// A mailbox port with `lanes` lanes that accepts any payload length and read size.
pub fn mailbox<P>(lanes: u16) -> Mailbox<P> {
    Ports {
        caps: Capabilities {
            lanes,
            max_payload: u32::MAX,
            places_payload: false,
            max_read: u64::MAX,
        },
        rx: (0..lanes).map(|_| MailRx::default()).collect(),
        tx: (0..lanes).map(|_| MailTx::default()).collect(),
        control: MailControl::default(),
    }
}
