//! The transport port: what a transport implements so that the core can run over it, in the
//! style of smoltcp's `phy::Device`.
//!
//! The port is split so that every worker owns its half:
//! * per lane, receive ([`LaneRxPort`]): tokens carrying the source rank, the immediate and the
//!   length, and access to the payload; consuming a token writes the payload where the core
//!   said (or nothing, when the transport placed it itself, as UC RDMA Writes do) and reposts
//!   its receive buffer;
//! * per lane, send ([`LaneTxPort`]): post a multicast, poll send completions;
//! * control ([`ControlPort`]): send a message to a rank, read a byte range of a peer's
//!   operation buffer, poll arrivals and read completions.
//!
//! [`pump`] drives a [`Node`] over any [`Ports`] on one thread; it is the one dispatcher the
//! simulator, the tests and the fuzz targets share. [`inject`] wraps any port with
//! seeded faults.

mod fault;
pub mod mailbox;

pub use fault::{Faults, FaultyRx, FaultyToken, FaultyTx, SplitMix64, inject, mix, splitmix64};

use crate::config::Rank;
use crate::event::{Event, OpId, Placement, ReadError, ReadId, Transmit};
use crate::lane::Multicast;
use crate::node::Node;
use crate::time::Instant;
use crate::wire::ChunkRun;
use alloc::vec::Vec;

/// What a transport can do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Capabilities {
    /// Multicast subgroups (lanes) it carries.
    pub lanes: u16,
    /// Largest chunk payload in bytes.
    pub max_payload: u32,
    /// Whether payloads land in the operation's buffer without a copy (UC RDMA Write): the
    /// token only reports them.
    pub places_payload: bool,
    /// Largest single read in bytes.
    pub max_read: u64,
}

/// What arrived with a chunk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RxMeta {
    /// The sender, as the transport identifies it (source address, DETH SrcQP).
    pub from: Rank,
    /// The 32-bit immediate.
    pub imm: u32,
    /// Payload bytes.
    pub len: usize,
}

/// One received chunk, held in the transport's receive buffer.
pub trait RxToken {
    /// Source, immediate and length.
    fn meta(&self) -> RxMeta;
    /// Writes the payload where `placement` says (nothing on [`Placement::Drop`], or when the
    /// transport placed it already) and gives the receive buffer back to the transport.
    ///
    /// Returns whether the payload is now where the placement says: `false` only for a
    /// [`Placement::Place`] whose bytes could not be written (the transport counts why). The
    /// driver then [releases](Node::release) the chunk instead of committing it, and the
    /// core recovers it like a lost one.
    #[must_use = "a placed chunk whose write failed must be released, not committed"]
    fn consume(self, placement: &Placement) -> bool;
}

/// One lane's receive half.
pub trait LaneRxPort {
    /// A received chunk.
    type Token<'a>: RxToken
    where
        Self: 'a;
    /// The next chunk received on this lane, if any.
    fn receive(&mut self) -> Option<Self::Token<'_>>;
}

/// One lane's send half.
pub trait LaneTxPort {
    /// Posts a multicast of the operation's bytes. The lane's send window bounds how many
    /// are posted and not completed; the transport queues them.
    fn post_multicast(&mut self, m: &Multicast);
    /// A completion: `chunks` multicasts of `op` left the host.
    fn poll_send_done(&mut self) -> Option<(OpId, u32)>;
}

/// A read of a peer's operation buffer, asked for by the core.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadRequest {
    /// Names the read.
    pub id: ReadId,
    /// Operation.
    pub op: OpId,
    /// The peer holding the bytes.
    pub from: Rank,
    /// Chunks covered.
    pub run: ChunkRun,
    /// Byte offset, the same in both buffers.
    pub offset: u64,
    /// Bytes.
    pub len: u64,
}

/// Something that arrived on the control path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ControlInput {
    /// A message of `len` bytes, written to the caller's buffer.
    Message {
        /// Sender.
        from: Rank,
        /// Bytes.
        len: usize,
    },
    /// A read finished.
    ReadDone {
        /// Which.
        id: ReadId,
        /// How.
        result: Result<(), ReadError>,
    },
}

/// The reliable control path.
pub trait ControlPort {
    /// Sends a control message to `to`.
    fn send_control(&mut self, to: Rank, bytes: &[u8]);
    /// Starts a read; its completion comes back as [`ControlInput::ReadDone`].
    fn read(&mut self, req: &ReadRequest);
    /// The next arrival; a message is written into `buf` (cleared first).
    fn poll_control(&mut self, buf: &mut Vec<u8>) -> Option<ControlInput>;
}

/// A transport's halves, each owned by the worker that uses it: one receive and one send
/// half per lane, and the control path.
#[derive(Debug)]
pub struct Ports<R, T, C> {
    /// What the transport can do.
    pub caps: Capabilities,
    /// Receive halves, by lane.
    pub rx: Vec<R>,
    /// Send halves, by lane.
    pub tx: Vec<T>,
    /// The control path.
    pub control: C,
}

/// A whole transport, split into [`Ports`] for the workers that drive it.
pub trait Port {
    /// A lane's receive half.
    type Rx: LaneRxPort;
    /// A lane's send half.
    type Tx: LaneTxPort;
    /// The control path.
    type Control: ControlPort;
    /// What it can do.
    fn capabilities(&self) -> Capabilities;
    /// Its halves.
    fn into_ports(self) -> Ports<Self::Rx, Self::Tx, Self::Control>;
}

/// How much one [`pump`] call did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pumped {
    /// Chunks taken from the receive halves.
    pub chunks: usize,
    /// Control messages and read completions taken.
    pub control: usize,
    /// Multicasts posted.
    pub multicasts: usize,
    /// Control messages and reads handed to the transport.
    pub transmits: usize,
}

impl Pumped {
    /// Whether nothing moved.
    pub fn is_idle(&self) -> bool {
        *self == Pumped::default()
    }
}

/// Drives `node` over `port` once at time `now`: takes up to `budget` chunks per lane and
/// every control arrival and completion, fires due timers, then posts everything the node
/// wants sent. Events are handed to `on_event`.
///
/// A caller loops on it (sleeping until [`Node::poll_timeout`] or the transport's next
/// arrival when a call did nothing). Every chunk is committed right after its token was
/// consumed (released instead, when the token says its write failed), so the control path
/// never vouches for bytes not yet written.
pub fn pump<R: LaneRxPort, T: LaneTxPort, C: ControlPort>(
    node: &mut Node,
    port: &mut Ports<R, T, C>,
    now: Instant,
    budget: usize,
    buf: &mut Vec<u8>,
    mut on_event: impl FnMut(Event),
) -> Pumped {
    let mut done = Pumped::default();
    for (l, rx) in port.rx.iter_mut().enumerate() {
        let lane = l as u16;
        for _ in 0..budget {
            let Some(tok) = rx.receive() else {
                break;
            };
            let meta = tok.meta();
            let p = node.handle_chunk(lane, meta.from, meta.imm, meta.len);
            let written = tok.consume(&p);
            if let Placement::Place { op, .. } = p {
                if written {
                    let _ = node.commit(now, lane, op);
                } else {
                    node.release(lane, meta.from, meta.imm);
                }
            }
            done.chunks += 1;
        }
    }
    for (l, tx) in port.tx.iter_mut().enumerate() {
        while let Some((op, n)) = tx.poll_send_done() {
            node.handle_send_done(now, l as u16, op, n);
        }
    }
    while let Some(input) = port.control.poll_control(buf) {
        done.control += 1;
        match input {
            ControlInput::Message { from, len } => {
                node.handle_control(now, from, &buf[..len.min(buf.len())])
            }
            ControlInput::ReadDone { id, result } => node.handle_read_done(now, id, result),
        }
    }
    if node.poll_timeout().is_some_and(|t| t <= now) {
        node.handle_timeout(now);
    }
    if node.has_output() {
        drain(node, port, now, buf, &mut done, &mut on_event);
    }
    done
}

/// Hands one [`Transmit`] to the control path: a message (its bytes are the first `len` of
/// `buf`, where `poll_transmit` wrote them) or a read.
pub fn send_transmit<C: ControlPort + ?Sized>(control: &mut C, t: Transmit, buf: &[u8]) {
    match t {
        Transmit::Control { to, len } => control.send_control(to, &buf[..len.min(buf.len())]),
        Transmit::Read(req) => control.read(&req),
    }
}

/// Hands every output of `node` to `port`, and its events to `on_event`.
pub fn drain<R: LaneRxPort, T: LaneTxPort, C: ControlPort>(
    node: &mut Node,
    port: &mut Ports<R, T, C>,
    now: Instant,
    buf: &mut Vec<u8>,
    done: &mut Pumped,
    on_event: &mut impl FnMut(Event),
) {
    while let Some(t) = node.poll_transmit(buf) {
        done.transmits += 1;
        send_transmit(&mut port.control, t, buf);
    }
    while let Some(m) = node.poll_multicast() {
        done.multicasts += 1;
        match port.tx.get_mut(usize::from(m.lane)) {
            Some(tx) => tx.post_multicast(&m),
            // A port with fewer lanes than the configuration: the chunk is lost, and the
            // ring recovery repairs it; completing the send keeps the window moving.
            None => node.handle_send_done(now, m.lane, m.op, 1),
        }
    }
    while let Some(e) = node.poll_event() {
        on_event(e);
    }
}
