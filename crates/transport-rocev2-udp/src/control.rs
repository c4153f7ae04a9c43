//! The control path over TCP: control messages and the fetch reads between ranks.
//!
//! ## Connections
//! **Full mesh, connected at start-up** ([`TcpControl::connect`]) from an address table
//! `Vec<SocketAddr>` indexed by rank: every rank listens on `table[rank]`; rank `i` connects to
//! every rank `j < i` and accepts every rank `j > i`. Each side sends a hello (magic, job nonce,
//! rank) and checks the other's, so a stray connection or another job is refused. The whole
//! start-up is bounded by [`ControlConfig::connect_timeout`], a hello that trickles in
//! included (a stray gets at most 2 s in all). Nothing connects later: a lost connection is
//! never re-established.
//!
//! ## Frames
//! Every frame is `[u32 length, big-endian][u8 kind][body]`, `length` covering kind and body.
//! Kinds: hello, control message (its bytes), read request `{id, op, offset, len}`, read
//! response `{id, bytes}`, read refusal `{id}`, goodbye `{mark}` or `{mark, blamed}`. Each kind
//! has its own bound on `length`: a message's is [`ControlConfig::max_message`], a read
//! response's [`ControlConfig::max_read`], the others' their fixed sizes, and the hello is
//! only taken at start-up. A longer frame is a protocol error as soon as its length and kind
//! are in, before any of its body is read or buffered.
//! Every field is checked; a malformed frame closes the connection. Nothing on network data is unwrapped.
//!
//! ## Threads
//! One **I/O thread** per rank, whatever the number of peers (`rc-ctl-io{rank}`): it waits on
//! every connection at once (mio: epoll), decodes frames, serves the peers' reads from the
//! [`Registry`], forwards everything else to the owner over a channel, and writes what is
//! queued when a socket takes it again. Sockets are non-blocking and nobody ever blocks on a
//! write: a frame goes out at once from the sending thread when nothing is queued before it
//! and the socket takes it, and waits in its connection's queue otherwise. So two ranks
//! serving each other's large reads cannot deadlock on full TCP buffers: both keep reading.
//! The owner, [`TcpControl`], is a [`ControlPort`]: `send_control` and `read` never block, and
//! neither does `poll_control`.
//!
//! ## The read service
//! A peer's read is served from this rank's operation buffer, registered per [`OpId`] with
//! [`Registry::register`] (and [`Registry::unregister`] when the operation is over). A read of
//! an unknown operation, or of a range outside the registered buffer, or longer than
//! [`ControlConfig::max_read`], is refused and counted ([`ControlStats::reads_refused`]), never
//! served, and nothing is allocated for it. Answers are copies queued on the connection; while
//! 16 MiB of it wait unwritten, further reads wait as requests, answered in order as it drains
//! ([`ControlStats::reads_deferred`]), so a peer that asks without reading costs a bounded
//! queue, not a copy of every range it names; past [`MAX_DEFERRED_READS`] of them its
//! connection is closed as malformed. A read this rank asks for lands in its own
//! registered buffer at the same offset, from the peer it asked only: an answer or refusal
//! from another is counted as stray ([`ControlStats::stray_responses`]) and changes nothing.
//!
//! ## Failures
//! A closed or broken connection (EOF, I/O error, malformed frame) marks the peer lost at once:
//! its pending reads and every later read from it complete with `Err(ReadError)`, messages to it
//! are dropped and counted, and [`TcpControl::lost_peers`] / [`TcpControl::take_lost`] name it
//! ([`PeerLost`]).
//!
//! A rank that leaves on purpose calls [`TcpControl::close`]: its queued frames are flushed
//! and a goodbye `{mark}` goes out before its connections close, so the peers can tell a clean
//! departure ([`TcpControl::departed`]) from a crash.

use std::collections::{HashMap, VecDeque};
use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::thread::{self, JoinHandle, Thread};
use std::time::{Duration, Instant};

use mio::unix::SourceFd;
use ringcast_core::Rank;
use ringcast_core::port::{ControlInput, ControlPort, ReadRequest};
use ringcast_core::{OpId, ReadError, ReadId};

const MAGIC: u32 = 0x5243_4331; // "RCC1"
const KIND_HELLO: u8 = 0;
const KIND_MESSAGE: u8 = 1;
const KIND_READ_REQ: u8 = 2;
const KIND_READ_RESP: u8 = 3;
const KIND_READ_REFUSED: u8 = 4;
const KIND_BYE: u8 = 5;
const HELLO_LEN: usize = 1 + 4 + 8 + 4;
const READ_REQ_LEN: usize = 1 + 8 * 4;
/// A peer's reads are answered while less than this many bytes wait on its connection; the
/// rest wait, as requests, for the queue to drain (a peer that asks and does not read costs
/// this much, not a copy of every range it names).
const SERVE_QUEUE: usize = 16 << 20;
/// Most reads of one peer that may wait for its connection's queue of answers to drain
/// below 16 MiB (8 MiB of requests). A rank asks one read per missing run, and its I/O
/// thread reads its answers as they come, so only a peer that asks and never reads gets near
/// it: past it, its connection is closed as malformed (the peer counts as lost).
pub const MAX_DEFERRED_READS: usize = 1 << 18;
/// Longest read a frame can answer: its 32-bit length counts the kind, the read's id and the
/// bytes.
pub const MAX_FRAME_READ: u64 = u32::MAX as u64 - 1 - 8;
/// Longest message a frame can carry (its length counts the kind and the message).
pub const MAX_FRAME_MESSAGE: usize = u32::MAX as usize - 1;
/// Longest wait for an accepted connection's hello.
const HELLO_WAIT: Duration = Duration::from_secs(2);
/// Parts of a frame [`Link::send_parts`] writes at once (the frame header included).
const MAX_PARTS: usize = 4;
/// Frames longer than this, when not read whole with their header, are read on straight into
/// the vector that carries the message ([`IoPeer::big`]).
const BIG_FRAME: usize = 16 << 10;
/// What such a vector reserves at a time.
const BIG_RESERVE: usize = 1 << 20;
/// Vectors a mesh keeps for reuse ([`Spare`]).
const SPARE_KEEP: usize = 8;

/// The vectors of large messages (from [`BIG_FRAME`] to [`BIG_RESERVE`] bytes of room), kept
/// for the next ones once consumed: a message read straight into its own vector
/// ([`IoPeer::big`]) when the owner has handed it back ([`ControlPort::poll_control`]'s
/// buffer), and a frame's rest queued on a connection once written. A TCP collective moves
/// 256 KiB pieces: a fresh vector per piece was memory the kernel had to map and zero, then
/// take back, for each of them (glibc gives freed memory of that size back to the kernel),
/// about a tenth of the CPU of a TCP Allgather of 16 MiB per rank on loopback.
#[derive(Default)]
struct Spare(Mutex<Vec<Vec<u8>>>);

impl Spare {
    /// An empty vector with room for `cap` bytes: a kept one if one has it.
    fn take(&self, cap: usize) -> Vec<u8> {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        match kept.iter().position(|v| v.capacity() >= cap) {
            Some(i) => kept.swap_remove(i),
            None => Vec::with_capacity(cap),
        }
    }

    /// Keeps `v` for reuse if it is a large message's and fewer than [`SPARE_KEEP`] are kept;
    /// drops it otherwise.
    fn give(&self, mut v: Vec<u8>) {
        if !(BIG_FRAME..=BIG_RESERVE).contains(&v.capacity()) {
            return;
        }
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.len() < SPARE_KEEP {
            v.clear();
            kept.push(v);
        }
    }
}

/// Where a large message's bytes go, as its receiver decides from its first bytes: straight
/// into a buffer, not into a vector of its own ([`TcpControl::set_lander`]).
#[derive(Debug)]
pub struct Landing {
    /// The buffer the message's bytes from `skip` on are written to, from `at` on.
    pub buf: OpBuffer,
    /// Where in `buf`.
    pub at: usize,
    /// Bytes at the message's start that are not written (its header).
    pub skip: usize,
    /// What the owner gets from the sender once every byte is written, in place of the
    /// message: nothing at all if the buffer is too short by then (its operation ended).
    pub note: Vec<u8>,
}

/// Decides where large messages land ([`TcpControl::set_lander`]).
pub trait Lander: Send {
    /// A message of `len` bytes from `from` begins with `head` (what has arrived of it, at
    /// least its first byte): where its bytes go, or `None` to have it delivered whole as
    /// usual. A landing whose `skip` exceeds `head` is not taken.
    fn land(&mut self, from: Rank, head: &[u8], len: usize) -> Option<Landing>;

    /// Every byte of the landing whose note is `note` is written: called just before the
    /// note goes to the owner. (The owner cannot tell a note from a message of the same
    /// bytes sent by a peer; the lander can say which bytes are really there.)
    fn landed(&mut self, note: &[u8]) {
        let _ = note;
    }
}

/// Bytes a connection reads at first after a large message (see `IoPeer::peek`).
const PEEK: usize = 256;

/// The most a connection reads next: [`PEEK`] once after a large message (`peek`, which this
/// clears), else as much as there is room for.
fn read_limit(peek: &mut bool) -> usize {
    if std::mem::take(peek) {
        PEEK
    } else {
        usize::MAX
    }
}

pub(crate) use crate::opbuf::range;
pub use crate::opbuf::{OpBuffer, Taken};

/// The operation buffers of one rank, by [`OpId`], shared by its control path and lanes.
#[derive(Clone, Debug, Default)]
pub struct Registry(Arc<RwLock<HashMap<u64, OpBuffer>>>);

impl Registry {
    /// Makes `buf` the buffer of `op`: chunks are placed into it, multicasts and peers' reads
    /// read from it. Register before starting the operation on the node.
    pub fn register(&self, op: OpId, buf: OpBuffer) {
        self.0
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(op.0, buf);
    }

    /// Forgets `op`'s buffer (peers' reads of it are refused from now on) and returns it.
    pub fn unregister(&self, op: OpId) -> Option<OpBuffer> {
        self.0
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&op.0)
    }

    /// `op`'s buffer, if registered.
    pub fn get(&self, op: OpId) -> Option<OpBuffer> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&op.0)
            .cloned()
    }
}

/// Settings of the control path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ControlConfig {
    /// The job nonce; both ends of every connection must agree.
    pub nonce: u64,
    /// Longest read served or asked for, in bytes; at most [`MAX_FRAME_READ`] (a larger
    /// value is taken as that).
    pub max_read: u64,
    /// Longest control message accepted or sent, in bytes. A longer one from a peer ends
    /// its connection as malformed; a longer one to send is dropped and counted
    /// ([`ControlStats::messages_too_long`]). At most [`MAX_FRAME_MESSAGE`] (a larger value
    /// is taken as that).
    pub max_message: usize,
    /// Bound on the whole start-up (connects, accepts, hellos).
    pub connect_timeout: Duration,
    /// No I/O thread: the owner's own calls do the I/O ([`TcpControl::poll_io`] waits on
    /// every connection; [`ControlPort::poll_control`] reads what is there without waiting).
    /// Saves a thread and a wake-up per frame for an owner that only waits on this mesh. The
    /// read service then runs in the owner's calls too, so keep it for meshes with small
    /// reads or none.
    pub inline_io: bool,
    /// Every peer's listener was bound before this rank learned its address (the table came
    /// from a rendezvous, or a split's exchange): a connection refused then means the peer
    /// is gone (its process exited, or failed its start-up), and the start-up fails at once
    /// with [`ControlError::PeerGone`] instead of retrying until the connect timeout. Off for
    /// a table whose peers may not have started yet.
    pub listeners_bound: bool,
}

impl ControlConfig {
    /// 8 MiB reads, 8 MiB messages, 10 s start-up.
    pub fn new(nonce: u64) -> Self {
        ControlConfig {
            nonce,
            max_read: 8 << 20,
            max_message: 8 << 20,
            connect_timeout: Duration::from_secs(10),
            inline_io: false,
            listeners_bound: false,
        }
    }

    /// These settings with the limits a frame's 32-bit length can carry.
    fn framable(self) -> Self {
        ControlConfig {
            max_read: self.max_read.min(MAX_FRAME_READ),
            max_message: self.max_message.min(MAX_FRAME_MESSAGE),
            ..self
        }
    }

    /// The longest frame of `kind` (kind and body) a peer may send after the hellos; 0 for a
    /// kind it may not send at all.
    fn frame_limit(&self, kind: u8) -> usize {
        match kind {
            KIND_MESSAGE => self.max_message.saturating_add(1),
            KIND_READ_REQ => READ_REQ_LEN,
            KIND_READ_RESP => usize::try_from(self.max_read)
                .unwrap_or(usize::MAX)
                .saturating_add(1 + 8),
            KIND_READ_REFUSED => 1 + 8,
            KIND_BYE => 1 + 8 + 4,
            _ => 0,
        }
    }

    /// The longest frame of any kind ([`Self::frame_limit`]).
    fn longest_frame(&self) -> usize {
        [
            KIND_MESSAGE,
            KIND_READ_REQ,
            KIND_READ_RESP,
            KIND_READ_REFUSED,
            KIND_BYE,
        ]
        .into_iter()
        .map(|k| self.frame_limit(k))
        .max()
        .unwrap_or(0)
    }
}

/// Start-up failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ControlError {
    /// The address table does not contain this rank, or has more than 2^24 ranks.
    #[error("address table of {ranks} ranks does not fit rank {rank}")]
    BadTable {
        /// This rank.
        rank: u32,
        /// Ranks in the table.
        ranks: usize,
    },
    /// Not every peer connected within [`ControlConfig::connect_timeout`].
    #[error("control mesh not connected within {0:?} (missing rank {1})")]
    Timeout(Duration, u32),
    /// Rank `peer` went away during the start-up: it refused the connection while its
    /// listener was known to be bound ([`ControlConfig::listeners_bound`]), or closed or
    /// reset it before its hello.
    #[error(
        "rank {peer} (control address {addr}) is gone: {source} during the control mesh's \
         start-up (its process exited, or failed its start-up; if it runs, check that the \
         address is its own and that no firewall rejects the connection)"
    )]
    PeerGone {
        /// The rank.
        peer: u32,
        /// Its control address.
        addr: SocketAddr,
        /// What the connection said.
        #[source]
        source: io::Error,
    },
    /// A peer's hello was wrong (another job, a stray client, a duplicate rank).
    #[error("bad hello from {0}: {1}")]
    BadHello(SocketAddr, &'static str),
    /// The caller cancelled the start-up ([`TcpControl::connect_or_cancel`]).
    #[error("control mesh start-up cancelled")]
    Cancelled,
    /// A socket call failed.
    #[error("{what}: {source}")]
    Io {
        /// The step that failed.
        what: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

impl ControlError {
    /// The rank this failure is over, when there is one ([`ControlError::PeerGone`],
    /// [`ControlError::Timeout`]).
    pub fn culprit(&self) -> Option<u32> {
        match self {
            ControlError::PeerGone { peer, .. } | ControlError::Timeout(_, peer) => Some(*peer),
            _ => None,
        }
    }
}

fn io_err(what: &'static str) -> impl FnOnce(io::Error) -> ControlError {
    move |source| ControlError::Io { what, source }
}

/// A peer's connection closed or broke: the peer counts as failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerLost(pub Rank);

/// Counters of the control path (shared with its threads).
#[derive(Debug, Default)]
pub struct ControlStats {
    /// Control messages sent.
    pub messages_sent: AtomicU64,
    /// Control messages received.
    pub messages_received: AtomicU64,
    /// Messages not sent because their peer was lost.
    pub messages_to_lost_peer: AtomicU64,
    /// Reads this rank asked for.
    pub reads_requested: AtomicU64,
    /// Reads this rank asked for that completed with data.
    pub reads_completed: AtomicU64,
    /// Bytes those reads brought in.
    pub bytes_read: AtomicU64,
    /// Reads this rank asked for that failed (refused, lost peer, bad response, no buffer).
    pub reads_failed: AtomicU64,
    /// Peers' reads served from this rank's buffers.
    pub reads_served: AtomicU64,
    /// Bytes served to peers' reads.
    pub bytes_served: AtomicU64,
    /// Peers' reads refused: unknown operation, range outside the buffer, too long.
    pub reads_refused: AtomicU64,
    /// Peers' reads that waited for their connection's queue to drain before being answered.
    pub reads_deferred: AtomicU64,
    /// Frames that broke the protocol (each closes its connection).
    pub malformed: AtomicU64,
    /// Messages not sent because they were longer than [`ControlConfig::max_message`] (the
    /// peer would take them for a protocol error).
    pub messages_too_long: AtomicU64,
    /// Responses naming no pending read, or one asked of another peer.
    pub stray_responses: AtomicU64,
    /// Peers lost.
    pub peers_lost: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// A connection's queue draining below this many bytes (from at least as many) wakes the
/// owner: see [`TcpControl::queued`].
pub const SEND_LOW_WATER: usize = 1 << 20;

/// What the I/O thread hands the owner.
enum Inbound {
    Message(Rank, Vec<u8>),
    ReadData(Rank, u64, Vec<u8>),
    Refused(Rank, u64),
    Lost(Rank),
    Bye(Rank, u64, Option<Rank>),
}

/// What the owner and the I/O thread share of one connection: the socket (non-blocking) and
/// the frames not written yet.
struct Link {
    stream: TcpStream,
    out: Mutex<Out>,
    /// The mesh's kept vectors: a queued frame's rest comes from there and goes back once
    /// written.
    spare: Arc<Spare>,
    /// What answering the peer's reads takes.
    serve: Serve,
}

/// What a connection needs to answer its peer's reads: the buffers and the counters.
#[derive(Clone, Debug, Default)]
struct Serve {
    peer: Rank,
    registry: Registry,
    stats: Arc<ControlStats>,
    /// [`ControlConfig::max_read`], shared by the mesh's connections ([`TcpControl::set_limits`]).
    max_read: Arc<AtomicU64>,
}

/// A peer's read of `len` bytes at `offset` of operation `op`'s buffer, to be answered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Asked {
    id: u64,
    op: OpId,
    offset: u64,
    len: u64,
}

/// A frame waiting on a connection: its bytes, or a header of its own and bytes that stay in
/// an operation's buffer until they are written ([`TcpControl::send_control_shared`]).
enum Frame {
    Owned(Vec<u8>),
    Shared {
        head: Vec<u8>,
        buf: OpBuffer,
        at: usize,
        len: usize,
    },
}

impl Frame {
    fn len(&self) -> usize {
        match self {
            Frame::Owned(f) => f.len(),
            Frame::Shared { head, len, .. } => head.len() + len,
        }
    }

    /// Writes what `sock` takes of the frame from byte `from` on. A shared frame whose buffer
    /// no longer holds its bytes is an error: its connection is shut down, never fed other
    /// bytes in their place.
    fn write(&self, sock: &socket2::SockRef<'_>, from: usize, flags: i32) -> io::Result<usize> {
        match self {
            Frame::Owned(f) => sock.send_with_flags(&f[from..], flags),
            Frame::Shared { head, buf, at, len } => buf
                .view(*at as u64, *len as u64, |data| {
                    let (h, d) = match from.checked_sub(head.len()) {
                        None => (&head[from..], data),
                        Some(past) => (&[][..], &data[past..]),
                    };
                    sock.send_vectored_with_flags(&[IoSlice::new(h), IoSlice::new(d)], flags)
                })
                .unwrap_or_else(|| Err(io::ErrorKind::InvalidData.into())),
        }
    }
}

/// Frames queued on a connection, the first one maybe partly written.
#[derive(Default)]
struct Out {
    frames: VecDeque<Frame>,
    /// Bytes of the first frame already written.
    head: usize,
    /// Bytes queued and not written yet.
    bytes: usize,
    /// The connection is shut down: nothing is queued any more.
    closed: bool,
    /// The peer's reads not answered yet: they wait while [`SERVE_QUEUE`] bytes are queued.
    asked: VecDeque<Asked>,
}

impl Link {
    fn new(stream: TcpStream, spare: Arc<Spare>, serve: Serve) -> Self {
        Link {
            stream,
            out: Mutex::default(),
            spare,
            serve,
        }
    }

    fn out(&self) -> std::sync::MutexGuard<'_, Out> {
        self.out.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `f` behind what is queued, then writes what the socket takes without blocking:
    /// a control message on an idle connection leaves at once, from the calling thread, and
    /// a frame by reference ([`Frame::Shared`]) leaves straight from its buffer, which it
    /// holds until its last byte is written. False when the connection is shut down.
    ///
    /// Frames never interleave: every write happens under the queue's lock, in queue order,
    /// and a partly written frame stays first until its rest is written.
    fn send(&self, f: Frame) -> bool {
        let mut out = self.out();
        if out.closed {
            return false;
        }
        out.bytes += f.len();
        out.frames.push_back(f);
        self.flush(&mut out);
        true
    }

    /// Sends one frame given as `parts` (their concatenation): on an idle connection written
    /// straight from them, with one vectored write, and only what the socket did not take is
    /// copied into the queue (behind queued frames, all of it is). False when the connection
    /// is shut down. A 256 KiB piece of a TCP collective then costs no copy in user space on
    /// its way out, where assembling it into a message and then a frame for [`Self::send`]
    /// took two.
    fn send_parts(&self, parts: &[&[u8]]) -> bool {
        let mut out = self.out();
        if out.closed {
            return false;
        }
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut done = 0;
        let idle = out.frames.is_empty();
        if idle {
            let sock = socket2::SockRef::from(&self.stream);
            let flags = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;
            while done < total {
                let mut slices = [IoSlice::new(&[]); MAX_PARTS];
                let mut n = 0;
                let mut skip = done;
                for p in parts {
                    if skip >= p.len() {
                        skip -= p.len();
                        continue;
                    }
                    if n == MAX_PARTS {
                        break;
                    }
                    slices[n] = IoSlice::new(&p[skip..]);
                    skip = 0;
                    n += 1;
                }
                match sock.send_vectored_with_flags(&slices[..n], flags) {
                    Ok(w) => done += w,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(_) => {
                        self.shut(&mut out);
                        return true;
                    }
                }
            }
        }
        if done < total {
            // The rest waits, copied; the writability edge of a full socket resumes it.
            let mut rest = self.spare.take(total - done);
            let mut skip = done;
            for p in parts {
                let s = skip.min(p.len());
                rest.extend_from_slice(&p[s..]);
                skip -= s;
            }
            out.bytes += rest.len();
            out.frames.push_back(Frame::Owned(rest));
            if !idle {
                self.flush(&mut out);
            }
        }
        true
    }

    /// Writes queued frames until none is left or the socket would block (it is then
    /// registered for writability with the I/O thread, which resumes). A failed write shuts
    /// the connection down: the I/O thread's read ends and reports the peer lost.
    ///
    /// The peer's reads waiting for the queue to drain ([`Self::ask`]) are answered here, as
    /// it does, whichever thread writes.
    fn flush(&self, out: &mut Out) {
        loop {
            let blocked = self.write_queued(out);
            let answered = self.answer(out);
            if blocked || !answered {
                return;
            }
        }
    }

    /// Writes queued frames until none is left (false) or the socket would block or failed
    /// (true; a failure shuts the connection down).
    fn write_queued(&self, out: &mut Out) -> bool {
        let sock = socket2::SockRef::from(&self.stream);
        let flags = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL;
        while let Some(f) = out.frames.front() {
            match f.write(&sock, out.head, flags) {
                Ok(n) => {
                    out.head += n;
                    out.bytes = out.bytes.saturating_sub(n);
                    if out.head >= f.len() {
                        if let Some(Frame::Owned(f)) = out.frames.pop_front() {
                            self.spare.give(f);
                        }
                        out.head = 0;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(_) => {
                    self.shut(out);
                    return true;
                }
            }
        }
        false
    }

    /// A peer's read: answered now, or once the queue holds less than [`SERVE_QUEUE`] bytes
    /// (after the reads asked before it). False when [`MAX_DEFERRED_READS`] already wait: a
    /// protocol error.
    fn ask(&self, a: Asked) -> bool {
        let now = {
            let out = self.out();
            if out.closed {
                return true;
            }
            if out.asked.len() >= MAX_DEFERRED_READS {
                return false;
            }
            out.asked.is_empty() && out.bytes < SERVE_QUEUE
        };
        if now {
            // The copy is made outside the queue's lock: the owner's messages to this peer
            // do not wait for it. (Only the thread that reads this connection asks, so no
            // read asked before this one can be waiting meanwhile.)
            self.send(Frame::Owned(self.serve.reply(a)));
            return true;
        }
        bump(&self.serve.stats.reads_deferred);
        let mut out = self.out();
        out.asked.push_back(a);
        self.flush(&mut out);
        true
    }

    /// Queues the answers of waiting reads while the queue is short enough; whether any was.
    fn answer(&self, out: &mut Out) -> bool {
        let mut any = false;
        while out.bytes < SERVE_QUEUE
            && !out.closed
            && let Some(a) = out.asked.pop_front()
        {
            let f = self.serve.reply(a);
            out.bytes += f.len();
            out.frames.push_back(Frame::Owned(f));
            any = true;
        }
        any
    }

    /// Shuts the connection down; what was queued is dropped.
    fn shut(&self, out: &mut Out) {
        out.closed = true;
        out.frames.clear();
        out.asked.clear();
        out.head = 0;
        out.bytes = 0;
        let _ = self.stream.shutdown(Shutdown::Both);
    }

    fn close(&self) {
        self.shut(&mut self.out());
    }

    /// Bytes queued and not taken by the socket yet.
    fn queued(&self) -> usize {
        self.out().bytes
    }

    /// Whether frames still wait to be written.
    fn pending(&self) -> bool {
        let out = self.out();
        !out.closed && !out.frames.is_empty()
    }
}

/// The owner's side of one peer.
struct Peer {
    link: Arc<Link>,
    lost: bool,
}

/// This rank's end of the TCP control mesh: a [`ControlPort`].
pub struct TcpControl {
    rank: Rank,
    peers: Vec<Option<Peer>>,
    inbound: Receiver<Inbound>,
    registry: Registry,
    stats: Arc<ControlStats>,
    cfg: ControlConfig,
    pending: HashMap<u64, ReadRequest>,
    ready: VecDeque<ControlInput>,
    local: VecDeque<Vec<u8>>,
    lost: Vec<Rank>,
    new_lost: VecDeque<PeerLost>,
    /// Peers that said goodbye: the mark, and the rank they blamed for leaving, if any.
    departed: Vec<(Rank, u64, Option<Rank>)>,
    waker: Arc<OnceLock<Thread>>,
    /// Who does the I/O: the I/O thread, or the owner's calls.
    io: IoMode,
    /// What the I/O thread is told ([`RUN`], [`STOP`], [`HAND_OVER`]), and its poll's waker
    /// (the owner's, inline).
    io_state: Arc<AtomicU8>,
    io_waker: Arc<mio::Waker>,
    /// Vectors of large messages kept for reuse.
    spare: Arc<Spare>,
    /// The longest read served, as the connections see it.
    max_read: Arc<AtomicU64>,
}

/// The I/O thread runs on.
const RUN: u8 = 0;
/// The I/O thread ends every connection and returns (the mesh is dropped).
const STOP: u8 = 1;
/// The I/O thread returns its connections as they are ([`TcpControl::make_inline`]).
const HAND_OVER: u8 = 2;

/// Who reads the connections.
enum IoMode {
    /// The I/O thread (`None` once joined); it hands its connections back when told to.
    Thread(Option<JoinHandle<Option<Io>>>),
    /// The owner, in [`TcpControl::poll_io`] and [`ControlPort::poll_control`].
    Inline(Box<Io>, mio::Events),
}

/// Wakes the owner of a [`TcpControl`] that waits in [`TcpControl::poll_io`]: from another
/// thread (a post to a dispatcher, say), where the mesh's own arrivals wake it by themselves.
#[derive(Clone, Debug)]
pub struct IoWaker(WakeBy);

#[derive(Clone, Debug)]
enum WakeBy {
    /// Inline I/O: the owner waits in the poll.
    Poll(Arc<mio::Waker>),
    /// An I/O thread: the owner parks (the thread given to
    /// [`wake_on_arrival`](TcpControl::wake_on_arrival)).
    Park(Arc<OnceLock<Thread>>),
}

impl IoWaker {
    /// Ends the owner's current (or next) [`TcpControl::poll_io`] wait.
    pub fn wake(&self) {
        match &self.0 {
            WakeBy::Poll(w) => {
                let _ = w.wake();
            }
            WakeBy::Park(t) => {
                if let Some(t) = t.get() {
                    t.unpark();
                }
            }
        }
    }
}

/// A wait on an inline mesh's connections that does not need the mesh itself
/// ([`TcpControl::io_wait`]): a thread that shares the mesh under a lock waits with it
/// without holding the lock, so that other threads can use the mesh meanwhile.
#[derive(Debug)]
pub struct IoWait(mio::Registry);

impl IoWait {
    /// Returns once the mesh's poll holds an event (a connection readable, or writable again
    /// after a full queue, or the [`IoWaker`] woken), or after `timeout` (rounded up to whole
    /// milliseconds). It takes no event: the owner's next
    /// [`poll_control`](ControlPort::poll_control) handles them, and until one does, this
    /// returns at once. Every thread waiting returns.
    pub fn wait(&self, timeout: Duration) {
        // The registry owns a duplicate of the poll's epoll descriptor: the same epoll
        // instance, open as long as this lives.
        if let Err(e) = crate::sys::wait_readable(&self.0, timeout) {
            tracing::error!(error = %e, "control: poll on the mesh failed");
            thread::sleep(timeout);
        }
    }
}

/// The I/O thread's way to the owner: a channel, and the thread to unpark after each send.
#[derive(Clone)]
struct Owner {
    tx: Sender<Inbound>,
    waker: Arc<OnceLock<Thread>>,
}

impl Owner {
    fn send(&self, i: Inbound) -> Result<(), mpsc::SendError<Inbound>> {
        self.tx.send(i)?;
        if let Some(t) = self.waker.get() {
            t.unpark();
        }
        Ok(())
    }
}

impl std::fmt::Debug for TcpControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TcpControl")
            .field("rank", &self.rank)
            .field("peers", &self.peers.len())
            .field("pending", &self.pending.len())
            .field("lost", &self.lost)
            .finish()
    }
}

/// A frame's header and room for its body; `body_len` is within what the limits allow
/// ([`MAX_FRAME_READ`], [`MAX_FRAME_MESSAGE`]), so that its length fits the header.
fn frame(kind: u8, body_len: usize) -> Vec<u8> {
    let mut f = Vec::with_capacity(5 + body_len);
    let len = u32::try_from(1 + body_len);
    debug_assert!(len.is_ok(), "a frame of {body_len} bytes");
    f.extend_from_slice(&len.unwrap_or(u32::MAX).to_be_bytes());
    f.push(kind);
    f
}

fn hello(nonce: u64, rank: u32) -> Vec<u8> {
    let mut f = frame(KIND_HELLO, HELLO_LEN - 1);
    f.extend_from_slice(&MAGIC.to_be_bytes());
    f.extend_from_slice(&nonce.to_be_bytes());
    f.extend_from_slice(&rank.to_be_bytes());
    f
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Reads one frame (kind and body) into `buf`; `Ok(false)` at a clean EOF before a frame,
/// an error on a frame longer than `max`.
fn read_frame(s: &mut impl Read, max: usize, buf: &mut Vec<u8>) -> io::Result<bool> {
    let mut len = [0u8; 4];
    match s.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(false),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len == 0 || len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "frame length out of bounds",
        ));
    }
    buf.clear();
    buf.resize(len, 0);
    s.read_exact(buf)?;
    Ok(true)
}

/// A socket whose reads all end by a deadline: each sets the socket's timeout to the time
/// left, so that a peer trickling a frame byte by byte cannot stretch a start-up past it.
/// A read gives up early once the flag is set (looked at every [`CANCEL_POLL`]).
struct ReadBy<'a>(&'a TcpStream, Instant, &'a AtomicBool);

/// How often a start-up blocked in a connect, an accept or a read looks at its cancel flag.
const CANCEL_POLL: Duration = Duration::from_millis(100);

/// The longest single connect try of a start-up (it retries until the deadline).
const CONNECT_TRY: Duration = Duration::from_secs(1);

impl Read for ReadBy<'_> {
    fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
        loop {
            if self.2.load(Ordering::Relaxed) {
                return Err(io::Error::other("cancelled"));
            }
            let left = self
                .1
                .checked_duration_since(Instant::now())
                .filter(|d| !d.is_zero())
                .ok_or(io::ErrorKind::TimedOut)?;
            self.0.set_read_timeout(Some(left.min(CANCEL_POLL)))?;
            match (&*self.0).read(b) {
                Err(e)
                    if left > CANCEL_POLL
                        && matches!(
                            e.kind(),
                            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                        ) =>
                {
                    continue;
                }
                r => return r,
            }
        }
    }
}

/// Checks a hello frame body; returns the rank it names.
fn check_hello(b: &[u8], nonce: u64) -> Result<u32, &'static str> {
    if b.len() != HELLO_LEN || b[0] != KIND_HELLO {
        return Err("not a hello frame");
    }
    if u32_at(b, 1) != Some(MAGIC) {
        return Err("wrong magic");
    }
    if u64_at(b, 5) != Some(nonce) {
        return Err("another job's nonce");
    }
    u32_at(b, 13).ok_or("short hello")
}

/// A frame that broke the protocol: its connection ends, counted
/// ([`ControlStats::malformed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Malformed;

/// Judges the frame at the start of `b` (what has arrived of it) by its header alone: its
/// length (kind and body) once the 4 bytes of it are in, `None` before. An error as soon as
/// what is in shows it too long: empty or longer than any kind allows from the length alone,
/// longer than its own kind allows ([`ControlConfig::frame_limit`]) once the kind is in too.
/// So nothing of such a frame's body is waited for.
fn frame_head(b: &[u8], cfg: &ControlConfig) -> Result<Option<usize>, Malformed> {
    let Some(len) = u32_at(b, 0) else {
        return Ok(None);
    };
    let len = len as usize;
    let kind = b.get(4);
    if len == 0 || len > cfg.longest_frame() || kind.is_some_and(|&k| len > cfg.frame_limit(k)) {
        return Err(Malformed);
    }
    Ok(Some(len))
}

/// A frame a peer may send once the hellos are exchanged, decoded from its kind and body,
/// every field checked.
#[derive(Debug, PartialEq, Eq)]
enum Incoming<'a> {
    /// A control message: its bytes.
    Message(&'a [u8]),
    /// A read to serve.
    ReadReq(Asked),
    /// The answer to read `id`.
    ReadResp { id: u64, bytes: &'a [u8] },
    /// Read `id` refused.
    Refused(u64),
    /// The peer leaves on purpose.
    Bye { mark: u64, blamed: Option<Rank> },
}

impl<'a> Incoming<'a> {
    /// Decodes a frame (kind and body); `None` on a protocol error.
    fn parse(b: &'a [u8]) -> Option<Self> {
        let (&kind, body) = b.split_first()?;
        match kind {
            KIND_MESSAGE => Some(Incoming::Message(body)),
            KIND_READ_REQ => {
                let (Some(id), Some(op), Some(offset), Some(len)) = (
                    u64_at(body, 0),
                    u64_at(body, 8),
                    u64_at(body, 16),
                    u64_at(body, 24),
                ) else {
                    return None;
                };
                if body.len() != READ_REQ_LEN - 1 {
                    return None;
                }
                Some(Incoming::ReadReq(Asked {
                    id,
                    op: OpId(op),
                    offset,
                    len,
                }))
            }
            KIND_READ_RESP => {
                let id = u64_at(body, 0)?;
                Some(Incoming::ReadResp {
                    id,
                    bytes: &body[8..],
                })
            }
            KIND_BYE => match (u64_at(body, 0), body.len()) {
                (Some(mark), 8) => Some(Incoming::Bye { mark, blamed: None }),
                (Some(mark), 12) => Some(Incoming::Bye {
                    mark,
                    blamed: u32_at(body, 8).map(Rank),
                }),
                _ => None,
            },
            KIND_READ_REFUSED => match u64_at(body, 0) {
                Some(id) if body.len() == 8 => Some(Incoming::Refused(id)),
                _ => None,
            },
            _ => None,
        }
    }
}

/// What a connection has read and not decoded yet: frames in `buf[start..end]`. No socket
/// here: the I/O thread reads into [`Self::room`] and takes frames with [`Self::next`]
/// ([`Io::read`]); [`StreamDecoder`] copies bytes there.
struct FrameReader {
    buf: Vec<u8>,
    start: usize,
    end: usize,
    /// The buffer's first length ([`READ_STEP`]), and the length above which it goes back
    /// to that once empty ([`READ_KEEP`]).
    step: usize,
    keep: usize,
    /// Messages longer than this not all in are handed out from their first bytes
    /// ([`Next::Big`], [`BIG_FRAME`]).
    big: usize,
}

/// What [`FrameReader::next`] found.
#[derive(Debug, PartialEq, Eq)]
enum Next<'a> {
    /// A whole frame (kind and body), taken.
    Whole(&'a [u8]),
    /// A message longer than [`FrameReader::big`] not all in: its frame's length (kind and
    /// body) and what is in of its body. The reader holds nothing of it any more: the rest
    /// of its body is the next bytes the connection brings.
    Big { len: usize, head: &'a [u8] },
    /// Nothing more until more bytes come.
    More,
}

impl FrameReader {
    /// An empty reader whose buffer starts at `step` bytes (at least one).
    fn new(step: usize, keep: usize, big: usize) -> Self {
        FrameReader {
            buf: vec![0; step.max(1)],
            start: 0,
            end: 0,
            step: step.max(1),
            keep,
            big,
        }
    }

    /// Where the next read goes: at most `max` bytes of the buffer's free end, at least one
    /// if `max` is. A full buffer first moves what it holds to its start, and doubles if
    /// still full (it holds the start of a frame longer than itself: [`Self::next`] checked
    /// its length).
    fn room(&mut self, max: usize) -> &mut [u8] {
        if self.end == self.buf.len() {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
            if self.end == self.buf.len() {
                self.buf.resize(self.buf.len() * 2, 0);
            }
        }
        let room = (self.buf.len() - self.end).min(max);
        &mut self.buf[self.end..self.end + room]
    }

    /// `n` bytes were read into [`Self::room`].
    fn filled(&mut self, n: usize) {
        self.end += n;
    }

    /// The next frame from what is held, judged by its header first ([`frame_head`]); its
    /// body is the caller's to check.
    fn next(&mut self, cfg: &ControlConfig) -> Result<Next<'_>, Malformed> {
        let held = &self.buf[self.start..self.end];
        let Some(len) = frame_head(held, cfg)? else {
            return Ok(Next::More);
        };
        let Some(frame) = held.get(4..4 + len) else {
            if len > self.big && held.get(4) == Some(&KIND_MESSAGE) {
                self.start = self.end;
                return Ok(Next::Big {
                    len,
                    head: &held[5..],
                });
            }
            return Ok(Next::More);
        };
        self.start += 4 + len;
        Ok(Next::Whole(frame))
    }

    /// Once everything held is taken: the next read goes to the buffer's start, and a
    /// buffer a long frame grew past `keep` shrinks back to `step` (a connection keeps at
    /// most `keep`, not its longest frame).
    fn settle(&mut self) {
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
            if self.buf.len() > self.keep {
                self.buf = vec![0; self.step];
            }
        }
    }

    /// The buffer as scratch for bytes to be dropped, at most `max` of them: only while it
    /// holds nothing (a landing whose buffer is gone).
    fn scratch(&mut self, max: usize) -> &mut [u8] {
        let n = max.min(self.buf.len());
        &mut self.buf[..n]
    }
}

/// A connection's bytes decoded as [`Io::read`] decodes them, from slices instead of a
/// socket's reads: the frames whole in the [`FrameReader`], a large message's body gathered
/// in a vector of its own. For the tests and the fuzz target.
struct StreamDecoder {
    frames: FrameReader,
    cfg: ControlConfig,
    /// A large message under way (its kind and what is in of its body), and its frame's
    /// length; empty with 0 otherwise.
    big: Vec<u8>,
    big_len: usize,
    /// The last frame was a large message: the next read takes at most [`PEEK`] bytes.
    peek: bool,
    /// The stream broke the protocol; nothing more is taken from it.
    malformed: bool,
}

impl StreamDecoder {
    fn new(cfg: ControlConfig, step: usize, keep: usize, big: usize) -> Self {
        StreamDecoder {
            frames: FrameReader::new(step, keep, big),
            cfg,
            big: Vec::new(),
            big_len: 0,
            peek: false,
            malformed: false,
        }
    }

    /// Takes `bytes` as the next reads would bring them (as many as the buffer's room
    /// needs), pushing every frame taken whole (kind and body) onto `out`, in order; stops
    /// at the first malformed frame.
    fn feed(&mut self, mut bytes: &[u8], out: &mut Vec<Vec<u8>>) {
        while !bytes.is_empty() && !self.malformed {
            if self.big_len > 0 {
                let n = (self.big_len - self.big.len()).min(bytes.len());
                self.big.extend_from_slice(&bytes[..n]);
                bytes = &bytes[n..];
                if self.big.len() == self.big_len {
                    self.big_len = 0;
                    self.peek = true;
                    out.push(std::mem::take(&mut self.big));
                }
                continue;
            }
            let max = read_limit(&mut self.peek);
            let room = self.frames.room(max);
            let n = room.len().min(bytes.len());
            room[..n].copy_from_slice(&bytes[..n]);
            self.frames.filled(n);
            bytes = &bytes[n..];
            loop {
                match self.frames.next(&self.cfg) {
                    Ok(Next::Whole(f)) if Incoming::parse(f).is_some() => out.push(f.to_vec()),
                    Ok(Next::Big { len, head }) => {
                        self.big.push(KIND_MESSAGE);
                        self.big.extend_from_slice(head);
                        self.big_len = len;
                        break;
                    }
                    Ok(Next::More) => break,
                    Ok(Next::Whole(_)) | Err(Malformed) => {
                        self.malformed = true;
                        return;
                    }
                }
            }
            self.frames.settle();
        }
    }
}

/// Entry points for the fuzz target `fuzz/fuzz_targets/framing.rs`: a connection's framing
/// without its socket. Not part of the API: they panic on a finding.
#[doc(hidden)]
pub mod fuzzing {
    use super::*;

    /// What a connection's bytes decode to.
    #[derive(Debug, PartialEq, Eq)]
    pub struct Decoded {
        /// The frames taken (kind and body), in order.
        pub frames: Vec<Vec<u8>>,
        /// The bytes after them broke the protocol: the connection ends there. (Bytes that
        /// end inside a frame do not: it waits for the rest.)
        pub malformed: bool,
    }

    /// The limits of a connection: messages of `max_message` bytes, reads of `max_read`
    /// bytes, and a read buffer that starts at `step` bytes (the I/O thread's sizes scaled
    /// down: messages longer than a quarter of it are gathered on their own, as longer than
    /// `BIG_FRAME` of `READ_STEP` are, and it shrinks back from 16 times it).
    #[derive(Clone, Copy, Debug)]
    pub struct Limits {
        /// [`ControlConfig::max_message`].
        pub max_message: usize,
        /// [`ControlConfig::max_read`].
        pub max_read: u64,
        /// The read buffer's first length (at least 1).
        pub step: usize,
    }

    impl Limits {
        fn cfg(&self) -> ControlConfig {
            ControlConfig {
                max_message: self.max_message,
                max_read: self.max_read,
                ..ControlConfig::new(0)
            }
        }

        /// `stream` decoded as the I/O thread decodes a connection's bytes, fed in slices of
        /// the sizes `splits` gives in turn (cycled; 0 read as 1; all at once if empty).
        /// Panics if the decoder held more than the limits allow, or if the frames taken do
        /// not re-encode (`frame`) to the stream's first bytes.
        pub fn decode(&self, stream: &[u8], splits: &[usize]) -> Decoded {
            let cfg = self.cfg();
            let step = self.step.max(1);
            let big = step / 4;
            let mut d = StreamDecoder::new(cfg, step, step * 16, big);
            // The longest frame the read buffer holds whole (a longer message is gathered
            // on its own), and so the longest the buffer may grow to: doubling from `step`
            // until that frame fits.
            let whole = [KIND_READ_REQ, KIND_READ_RESP, KIND_READ_REFUSED, KIND_BYE]
                .map(|k| cfg.frame_limit(k))
                .into_iter()
                .fold(cfg.frame_limit(KIND_MESSAGE).min(big), usize::max);
            let most = step.max(whole.saturating_add(4).saturating_mul(2));
            let mut frames = Vec::new();
            let mut sizes = splits.iter().map(|&n| n.max(1)).cycle();
            let mut rest = stream;
            while !rest.is_empty() {
                let n = sizes.next().unwrap_or(rest.len()).min(rest.len());
                d.feed(&rest[..n], &mut frames);
                rest = &rest[n..];
                assert!(
                    d.frames.buf.len() <= most,
                    "read buffer of {} bytes, at most {most} allowed",
                    d.frames.buf.len()
                );
                assert!(
                    d.big.len() <= cfg.frame_limit(KIND_MESSAGE),
                    "a message of {} bytes gathered, at most {} allowed",
                    d.big.len(),
                    cfg.frame_limit(KIND_MESSAGE)
                );
            }
            let mut at = 0;
            for f in &frames {
                let mut again = frame(f[0], f.len() - 1);
                again.extend_from_slice(&f[1..]);
                assert_eq!(
                    stream.get(at..at + again.len()),
                    Some(&again[..]),
                    "the frame at byte {at} re-encodes to other bytes"
                );
                at += again.len();
            }
            Decoded {
                frames,
                malformed: d.malformed,
            }
        }

        /// `stream` decoded as the frame format says, the whole of it at once: frame after
        /// frame while each is whole and well-formed; malformed at the first one whose
        /// length is 0 or over every kind's bound, over its own kind's once that is in, or
        /// whose fields are wrong once it is whole.
        pub fn spec(&self, stream: &[u8]) -> Decoded {
            let cfg = self.cfg();
            let mut frames = Vec::new();
            let mut rest = stream;
            let malformed = loop {
                let Some((len, after)) = rest.split_first_chunk::<4>() else {
                    break false;
                };
                let len = u32::from_be_bytes(*len) as usize;
                let limit = after
                    .first()
                    .map_or(cfg.longest_frame(), |&k| cfg.frame_limit(k));
                if len == 0 || len > limit {
                    break true;
                }
                let Some(f) = after.get(..len) else {
                    break false;
                };
                if Incoming::parse(f).is_none() {
                    break true;
                }
                frames.push(f.to_vec());
                rest = &after[len..];
            };
            Decoded { frames, malformed }
        }
    }

    /// A reader of `rest` in reads of the sizes `splits` gives in turn.
    struct Reads<'a, I> {
        rest: &'a [u8],
        sizes: I,
    }

    impl<I: Iterator<Item = usize>> Read for Reads<'_, I> {
        fn read(&mut self, b: &mut [u8]) -> io::Result<usize> {
            let n = self
                .sizes
                .next()
                .unwrap_or(usize::MAX)
                .min(b.len())
                .min(self.rest.len());
            b[..n].copy_from_slice(&self.rest[..n]);
            self.rest = &self.rest[n..];
            Ok(n)
        }
    }

    /// `stream` read as the start-up reads a peer's hello (`read_frame`, `check_hello`),
    /// in reads of the sizes `splits` gives in turn (as [`Limits::decode`]): the rank it
    /// names, if it is a hello of the nonce it names. Panics if such a hello does not
    /// re-encode (`hello`) to the stream's first bytes, or passes with another nonce.
    pub fn read_hello(stream: &[u8], splits: &[usize]) -> Option<u32> {
        let mut reads = Reads {
            rest: stream,
            sizes: splits.iter().map(|&n| n.max(1)).cycle(),
        };
        let mut buf = Vec::new();
        if !read_frame(&mut reads, HELLO_LEN, &mut buf).ok()? {
            return None;
        }
        assert!(buf.len() <= HELLO_LEN, "a hello of {} bytes", buf.len());
        let nonce = u64_at(&buf, 5)?;
        let rank = check_hello(&buf, nonce).ok()?;
        let again = hello(nonce, rank);
        assert_eq!(
            stream.get(..again.len()),
            Some(&again[..]),
            "a hello re-encodes"
        );
        assert!(check_hello(&buf, nonce ^ 1).is_err(), "another job's hello");
        Some(rank)
    }
}

impl TcpControl {
    /// Connects the full mesh: `listener` is bound to `table[rank]`; rank `i` connects to
    /// every lower rank and accepts every higher one, all within `cfg.connect_timeout`.
    /// `registry` holds the buffers the read service serves from (shared with the lanes).
    pub fn connect(
        rank: u32,
        table: &[SocketAddr],
        listener: TcpListener,
        registry: Registry,
        cfg: ControlConfig,
    ) -> Result<Self, ControlError> {
        Self::connect_or_cancel(
            rank,
            table,
            listener,
            registry,
            cfg,
            &AtomicBool::new(false),
        )
    }

    /// [`connect`](Self::connect), giving up with [`ControlError::Cancelled`] within about
    /// 100 ms once `cancel` is set by another thread (a connect try to an address that does
    /// not answer, at most a second).
    pub fn connect_or_cancel(
        rank: u32,
        table: &[SocketAddr],
        listener: TcpListener,
        registry: Registry,
        cfg: ControlConfig,
        cancel: &AtomicBool,
    ) -> Result<Self, ControlError> {
        let cfg = cfg.framable();
        let ranks = table.len();
        if rank as usize >= ranks || ranks > 1 << 24 {
            return Err(ControlError::BadTable { rank, ranks });
        }
        // A bound beyond any deadline an `Instant` can hold is no bound: a year then.
        let deadline = Instant::now()
            .checked_add(cfg.connect_timeout)
            .unwrap_or_else(|| Instant::now() + Duration::from_secs(365 * 24 * 3600));
        let mut streams: Vec<Option<TcpStream>> = (0..ranks).map(|_| None).collect();
        if let Err(e) = handshake(rank, table, &listener, cfg, cancel, deadline, &mut streams) {
            // The peers connected already, and those waiting in the backlog, hear whom this
            // rank leaves over: they name that rank, not this one.
            leave_over(&streams, &listener, cfg.nonce, &e);
            return Err(e);
        }
        drop(listener);
        let (to_owner, inbound) = mpsc::channel();
        let waker = Arc::new(OnceLock::new());
        let to_owner = Owner {
            tx: to_owner,
            waker: Arc::clone(&waker),
        };
        let stats = Arc::new(ControlStats::default());
        let poll = mio::Poll::new().map_err(io_err("epoll"))?;
        let io_waker = Arc::new(mio::Waker::new(poll.registry(), WAKE).map_err(io_err("eventfd"))?);
        let mut peers = Vec::with_capacity(ranks);
        let mut io_peers = Vec::with_capacity(ranks);
        let spare = Arc::new(Spare::default());
        let max_read = Arc::new(AtomicU64::new(cfg.max_read));
        for (j, s) in streams.into_iter().enumerate() {
            let Some(s) = s else {
                peers.push(None);
                io_peers.push(None);
                continue;
            };
            s.set_read_timeout(None).map_err(io_err("SO_RCVTIMEO"))?;
            s.set_nodelay(true).map_err(io_err("TCP_NODELAY"))?;
            s.set_nonblocking(true).map_err(io_err("O_NONBLOCK"))?;
            poll.registry()
                .register(
                    &mut SourceFd(&s.as_raw_fd()),
                    mio::Token(j),
                    mio::Interest::READABLE | mio::Interest::WRITABLE,
                )
                .map_err(io_err("epoll_ctl"))?;
            let serve = Serve {
                peer: Rank(j as u32),
                registry: registry.clone(),
                stats: Arc::clone(&stats),
                max_read: Arc::clone(&max_read),
            };
            let link = Arc::new(Link::new(s, Arc::clone(&spare), serve));
            io_peers.push(Some(IoPeer {
                rank: Rank(j as u32),
                link: Arc::clone(&link),
                frames: FrameReader::new(READ_STEP, READ_KEEP, BIG_FRAME),
                big: Vec::new(),
                big_len: 0,
                land: None,
                peek: false,
            }));
            peers.push(Some(Peer { link, lost: false }));
        }
        let io_state = Arc::new(AtomicU8::new(RUN));
        let io = Io {
            peers: io_peers,
            poll,
            failed: false,
            woken: false,
            io_state: Arc::clone(&io_state),
            owner: to_owner,
            stats: Arc::clone(&stats),
            cfg,
            lander: None,
        };
        let io = if cfg.inline_io {
            IoMode::Inline(Box::new(io), mio::Events::with_capacity(EVENTS))
        } else {
            IoMode::Thread(Some(
                thread::Builder::new()
                    .name(format!("rc-ctl-io{rank}"))
                    .spawn(move || io.run())
                    .map_err(io_err("spawn"))?,
            ))
        };
        tracing::debug!(
            rank,
            ranks,
            inline = cfg.inline_io,
            "control mesh connected"
        );
        Ok(TcpControl {
            rank: Rank(rank),
            peers,
            inbound,
            registry,
            stats,
            cfg,
            pending: HashMap::new(),
            ready: VecDeque::new(),
            local: VecDeque::new(),
            lost: Vec::new(),
            new_lost: VecDeque::new(),
            departed: Vec::new(),
            waker,
            io,
            io_state,
            io_waker,
            spare,
            max_read,
        })
    }

    /// Waits at most `timeout` for the mesh: with inline I/O ([`ControlConfig::inline_io`]),
    /// reads and writes what the connections allow and returns once something arrived for
    /// [`poll_control`](ControlPort::poll_control), the [`IoWaker`] was woken or the time is
    /// up; with an I/O thread, parks until that thread (see
    /// [`wake_on_arrival`](Self::wake_on_arrival)) or the waker unparks this thread.
    /// Returns at once when something is there already.
    pub fn poll_io(&mut self, timeout: Duration) {
        if let IoMode::Thread(_) = self.io {
            // The I/O thread unparks the owner it was given, or this thread from now on: what
            // arrives after the drain below ends the park at once.
            let _ = self.waker.get_or_init(thread::current);
        }
        self.drain_inbound();
        if !self.ready.is_empty() || !self.new_lost.is_empty() {
            return;
        }
        match &mut self.io {
            IoMode::Inline(io, events) => {
                // The drain's own look at the poll may have taken the waker's event, or
                // drained a long queue: then the owner was woken already, and must not wait
                // for another.
                if !std::mem::take(&mut io.woken) {
                    io.turn(events, Some(timeout));
                }
                io.woken = false;
            }
            IoMode::Thread(_) => thread::park_timeout(timeout),
        }
    }

    /// Has large messages (longer than 16 KiB, and not read whole at once: a TCP collective's
    /// pieces are longer than a connection's read buffer) land where `lander` says, from the
    /// first bytes that arrive of each: their bytes are read straight into the buffer it
    /// names, and the owner gets the landing's note in place of the message; a message it
    /// declines arrives as usual. Inline meshes only (the owner's calls do the reads, so no
    /// other thread holds the buffer's lock through a read): false, and nothing set, on a
    /// mesh that has an I/O thread.
    pub fn set_lander(&mut self, lander: Box<dyn Lander>) -> bool {
        match &mut self.io {
            IoMode::Inline(io, _) => {
                io.lander = Some(lander);
                true
            }
            IoMode::Thread(_) => false,
        }
    }

    /// Moves this mesh's I/O from its I/O thread onto the owner's calls, as if it had been
    /// connected with [`ControlConfig::inline_io`]: the thread stops and hands its
    /// connections back as they are (nothing read, queued or half-read is lost), so that
    /// [`io_wait`](Self::io_wait) serves and waiting threads read the mesh themselves. For an
    /// owner that learns only after connecting that it will be the mesh's sole reader (the
    /// engine's mesh, handed to the TCP fallback). Nothing happens on an inline mesh, or if
    /// the thread has already ended (its connections were then reported lost).
    pub fn make_inline(&mut self) {
        let IoMode::Thread(t) = &mut self.io else {
            return;
        };
        let Some(t) = t.take() else {
            return;
        };
        self.io_state.store(HAND_OVER, Ordering::Release);
        let _ = self.io_waker.wake();
        let Ok(Some(mut io)) = t.join() else {
            // Ended on its own (every connection gone, or the poll failed) or panicked: there
            // is nothing to take over, and the owner hears of the lost peers.
            return;
        };
        self.io_state.store(RUN, Ordering::Release);
        // The hand-over's wake-up is not the owner's; and inline, arrivals end the owner's
        // poll rather than unparking a thread (whichever thread polled before).
        io.woken = false;
        let waker = Arc::new(OnceLock::new());
        io.owner.waker = Arc::clone(&waker);
        self.waker = waker;
        self.io = IoMode::Inline(io.into(), mio::Events::with_capacity(EVENTS));
        tracing::debug!(rank = self.rank.0, "control mesh: I/O now inline");
    }

    /// Sets the longest message accepted and sent and the longest read served from now on
    /// ([`ControlConfig::max_message`], [`ControlConfig::max_read`]), on an inline mesh (a
    /// mesh whose owner now uses it for something else than it was connected for: the
    /// engine's, handed to the TCP fallback, takes pieces and serves no reads). False, and
    /// nothing changed, with an I/O thread.
    pub fn set_limits(&mut self, max_message: usize, max_read: u64) -> bool {
        // What a frame can carry, as at `connect`.
        let limits = ControlConfig {
            max_message,
            max_read,
            ..self.cfg
        }
        .framable();
        let IoMode::Inline(io, _) = &mut self.io else {
            return false;
        };
        for cfg in [&mut self.cfg, &mut io.cfg] {
            cfg.max_message = limits.max_message;
            cfg.max_read = limits.max_read;
        }
        self.max_read.store(limits.max_read, Ordering::Relaxed);
        true
    }

    /// A wait on this mesh that does not borrow it ([`IoWait`]), for an inline mesh
    /// ([`ControlConfig::inline_io`]) whose owner is shared under a lock; `None` with an I/O
    /// thread (which wakes the owner's thread, see [`wake_on_arrival`](Self::wake_on_arrival)),
    /// or if the epoll descriptor cannot be duplicated.
    pub fn io_wait(&self) -> Option<IoWait> {
        match &self.io {
            IoMode::Inline(io, _) => io.poll.registry().try_clone().ok().map(IoWait),
            IoMode::Thread(_) => None,
        }
    }

    /// What wakes this mesh's owner from [`poll_io`](Self::poll_io).
    pub fn waker(&self) -> IoWaker {
        IoWaker(match &self.io {
            IoMode::Inline(..) => WakeBy::Poll(Arc::clone(&self.io_waker)),
            IoMode::Thread(_) => WakeBy::Park(Arc::clone(&self.waker)),
        })
    }

    /// Unpark `owner` whenever the I/O thread has something for
    /// [`poll_control`](ControlPort::poll_control) (a message, a read's data or refusal, a lost
    /// peer), so that a thread that parks between polls hears of it at once instead of at its
    /// next timeout. Set once; later calls are ignored. Nothing on an inline mesh
    /// ([`ControlConfig::inline_io`]): what arrives there is read by a thread that is awake
    /// already (the one in [`poll_io`](Self::poll_io) or
    /// [`poll_control`](ControlPort::poll_control)), and an unpark per frame would only wake
    /// `owner` for nothing (and have it contend for whatever the reader holds).
    pub fn wake_on_arrival(&self, owner: Thread) {
        if let IoMode::Thread(_) = self.io {
            let _ = self.waker.set(owner);
        }
    }

    /// Bytes queued for `peer` that its connection has not taken yet (0 for a lost or
    /// unknown peer): what an owner that sends in bulk bounds, so that its queue, and the
    /// copies in it, stay short. When a queue of at least [`SEND_LOW_WATER`] bytes drains
    /// below it, the owner waiting in [`poll_io`](Self::poll_io) is woken.
    pub fn queued(&self, peer: Rank) -> usize {
        match self.peers.get(peer.0 as usize) {
            Some(Some(p)) if !p.lost => p.link.queued(),
            _ => 0,
        }
    }

    /// This rank.
    pub fn rank(&self) -> Rank {
        self.rank
    }

    /// The operation buffers (shared with the lanes and the read service).
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Counters.
    pub fn stats(&self) -> &ControlStats {
        &self.stats
    }

    /// Largest read served or asked for.
    pub fn max_read(&self) -> u64 {
        self.cfg.max_read
    }

    /// Every peer lost so far.
    pub fn lost_peers(&self) -> &[Rank] {
        &self.lost
    }

    /// The next peer lost since the last call (also noticed by [`ControlPort::poll_control`];
    /// this only drains what already arrived, without blocking).
    ///
    /// A peer is named only once [`ControlPort::poll_control`] has handed out every message
    /// it sent: draining here may queue its last messages, and an owner told of the loss
    /// first would take what they carry for never sent (a peer that left after sending all
    /// of an operation would be blamed for the part still queued here).
    pub fn take_lost(&mut self) -> Option<PeerLost> {
        self.drain_inbound();
        let ready = &self.ready;
        let i = self.new_lost.iter().position(|l| {
            !ready
                .iter()
                .any(|r| matches!(r, ControlInput::Message { from, .. } if *from == l.0))
        })?;
        self.new_lost.remove(i)
    }

    /// The mark `peer` sent with its goodbye ([`TcpControl::close`]), if it left cleanly.
    /// A goodbye always arrives before the closed connection it announces, so by the time
    /// [`take_lost`](Self::take_lost) names a peer, this tells a clean departure from a crash.
    pub fn departed(&self, peer: Rank) -> Option<u64> {
        self.departed
            .iter()
            .find(|(p, ..)| *p == peer)
            .map(|&(_, m, _)| m)
    }

    /// The rank `peer` blamed in its goodbye ([`close_blaming`](Self::close_blaming)): it left
    /// because that rank failed an operation it was in. Operations `peer`'s departure dooms
    /// are that rank's failure, not `peer`'s.
    pub fn departed_blaming(&self, peer: Rank) -> Option<Rank> {
        self.departed
            .iter()
            .find(|(p, ..)| *p == peer)
            .and_then(|&(.., b)| b)
    }

    /// Puts control messages taken off the mesh back in front of everything still queued, in
    /// the order given: a caller that polled messages it does not own (ringcast's start-up
    /// check reads only its reports) leaves the rest where the mesh's next owner finds them,
    /// before anything that arrived after them.
    pub fn unread(&mut self, messages: Vec<(Rank, Vec<u8>)>) {
        for (from, bytes) in messages.into_iter().rev() {
            self.ready.push_front(ControlInput::Message {
                from,
                len: bytes.len(),
            });
            self.local.push_front(bytes);
        }
    }

    /// Leaves the mesh cleanly: queues a goodbye carrying `mark` (an opaque value for the
    /// peers' [`departed`](Self::departed); ringcast sends the first operation this rank did
    /// not finish) to every live peer, lets the I/O thread flush what is queued (a peer that
    /// does not read for `linger` is cut off), then closes every connection and joins the
    /// I/O thread. Dropping a `TcpControl` without it closes at once and may lose queued frames.
    pub fn close(self, mark: u64, linger: Duration) {
        self.close_blaming(mark, None, linger);
    }

    /// [`close`](Self::close), naming in the goodbye the rank whose failure this one leaves
    /// over (see [`departed_blaming`](Self::departed_blaming)): a peer that hears of this
    /// departure before the failure itself then blames the right rank.
    pub fn close_blaming(self, mark: u64, blamed: Option<Rank>, linger: Duration) {
        let bye = bye_frame(mark, blamed.map(|b| b.0));
        let live: Vec<&Arc<Link>> = self
            .peers
            .iter()
            .flatten()
            .filter(|p| !p.lost)
            .map(|p| &p.link)
            .collect();
        for l in &live {
            l.send(Frame::Owned(bye.clone()));
        }
        let mut this = self;
        this.flush(linger);
        // Drop shuts the connections down and joins the I/O thread.
    }

    /// Waits up to `linger` for what is queued to the live peers to be written (the I/O
    /// thread, or inline this loop, writes it as the sockets take it): a message sent just
    /// before this mesh is dropped then reaches its peer, where one that does not read
    /// holds nothing up past `linger`. A linger past what an `Instant` can hold is no
    /// deadline.
    fn flush(&mut self, linger: Duration) {
        let live: Vec<Arc<Link>> = self
            .peers
            .iter()
            .flatten()
            .filter(|p| !p.lost)
            .map(|p| Arc::clone(&p.link))
            .collect();
        let deadline = Instant::now().checked_add(linger);
        while live.iter().any(|l| l.pending()) && deadline.is_none_or(|d| Instant::now() < d) {
            match &mut self.io {
                IoMode::Inline(io, events) => io.turn(events, Some(Duration::from_millis(1))),
                IoMode::Thread(_) => thread::sleep(Duration::from_millis(1)),
            }
        }
    }

    fn drain_inbound(&mut self) {
        // Inline, what the sockets hold is read now, without waiting.
        if let IoMode::Inline(io, events) = &mut self.io {
            io.turn(events, Some(Duration::ZERO));
        }
        while let Ok(i) = self.inbound.try_recv() {
            self.handle(i);
        }
    }

    /// The pending read `id`, if it was asked of `from`; otherwise it stays pending and the
    /// response counts as stray.
    fn take_pending(&mut self, from: Rank, id: u64) -> Option<ReadRequest> {
        if self.pending.get(&id).is_some_and(|q| q.from == from) {
            return self.pending.remove(&id);
        }
        bump(&self.stats.stray_responses);
        None
    }

    fn fail_read(&mut self, id: ReadId) {
        bump(&self.stats.reads_failed);
        self.ready.push_back(ControlInput::ReadDone {
            id,
            result: Err(ReadError),
        });
    }

    fn handle(&mut self, i: Inbound) {
        match i {
            Inbound::Message(from, bytes) => {
                bump(&self.stats.messages_received);
                // Messages keep their order relative to each other through `local`.
                self.local.push_back(bytes);
                let len = self.local.back().map_or(0, Vec::len);
                self.ready.push_back(ControlInput::Message { from, len });
            }
            Inbound::ReadData(from, id, bytes) => {
                // Only the peer the read was asked of answers it: any other's bytes, even
                // of the right length, are not the ones asked for.
                let Some(req) = self.take_pending(from, id) else {
                    return;
                };
                let ok = bytes.len() as u64 == req.len
                    && self
                        .registry
                        .get(req.op)
                        .is_some_and(|b| b.write_at(req.offset, &bytes));
                if ok {
                    bump(&self.stats.reads_completed);
                    self.stats.bytes_read.fetch_add(req.len, Ordering::Relaxed);
                    self.ready.push_back(ControlInput::ReadDone {
                        id: req.id,
                        result: Ok(()),
                    });
                } else {
                    self.fail_read(req.id);
                }
            }
            Inbound::Refused(from, id) => {
                if let Some(req) = self.take_pending(from, id) {
                    self.fail_read(req.id);
                }
            }
            Inbound::Lost(r) => self.mark_lost(r),
            Inbound::Bye(r, mark, blamed) => {
                // A blame naming no rank of the job names nobody.
                let blamed = blamed.filter(|b| (b.0 as usize) < self.peers.len());
                if !self.departed.iter().any(|(p, ..)| *p == r) {
                    self.departed.push((r, mark, blamed));
                }
            }
        }
    }

    fn mark_lost(&mut self, r: Rank) {
        let Some(Some(p)) = self.peers.get_mut(r.0 as usize) else {
            return;
        };
        if p.lost {
            return;
        }
        p.lost = true;
        p.link.close();
        bump(&self.stats.peers_lost);
        // A peer that said goodbye left (the end of a job); one that did not, crashed.
        if self.departed.iter().any(|&(p, ..)| p == r) {
            tracing::debug!(rank = self.rank.0, peer = r.0, "control: peer left");
        } else {
            tracing::warn!(rank = self.rank.0, peer = r.0, "control: peer lost");
        }
        self.lost.push(r);
        self.new_lost.push_back(PeerLost(r));
        let mut failed: Vec<ReadId> = self
            .pending
            .values()
            .filter(|q| q.from == r)
            .map(|q| q.id)
            .collect();
        failed.sort_unstable_by_key(|id| id.0);
        self.pending.retain(|_, q| q.from != r);
        for id in failed {
            self.fail_read(id);
        }
    }

    /// Sends a control message given as `parts` (the message is their concatenation): the
    /// same as [`ControlPort::send_control`] with the concatenation, but written straight
    /// from the parts when the connection has nothing queued (no copy), and copied into its
    /// queue only for what the socket does not take. For bulk messages, such as a piece of a
    /// TCP collective sent from its operation's buffer. More than three parts are joined
    /// first.
    pub fn send_control_parts(&mut self, to: Rank, parts: &[&[u8]]) {
        if parts.len() >= MAX_PARTS {
            self.send_control(to, &parts.concat());
            return;
        }
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if self.too_long(to, len) {
            return;
        }
        if to == self.rank {
            self.handle(Inbound::Message(to, parts.concat()));
            return;
        }
        let head = frame(KIND_MESSAGE, len);
        let mut all = [&[][..]; MAX_PARTS];
        all[0] = &head;
        all[1..=parts.len()].copy_from_slice(parts);
        let sent = self.on_link(to, |l| l.send_parts(&all[..=parts.len()]));
        self.count_message(sent);
    }

    /// Sends `to` a message of `head` and bytes `at..at + len` of `buf`, which are not copied:
    /// what the socket does not take at once waits in the connection's queue as a reference
    /// into `buf`, which holds a clone of it until then. The owner must leave those bytes
    /// as they are until the mesh lets go of `buf` ([`OpBuffer::holders`]): a buffer that no
    /// longer holds them shuts the connection down rather than send other bytes.
    pub fn send_control_shared(
        &mut self,
        to: Rank,
        head: &[u8],
        buf: &OpBuffer,
        at: usize,
        len: usize,
    ) {
        if self.too_long(to, head.len().saturating_add(len)) {
            return;
        }
        if to == self.rank {
            let mut m = head.to_vec();
            buf.read_at(at as u64, len as u64, &mut m);
            self.handle(Inbound::Message(to, m));
            return;
        }
        let mut framed = frame(KIND_MESSAGE, head.len() + len);
        framed.extend_from_slice(head);
        let sent = self.queue(
            to,
            Frame::Shared {
                head: framed,
                buf: buf.clone(),
                at,
                len,
            },
        );
        self.count_message(sent);
    }

    /// Sends `f` to `to` (or queues it on the connection); false when the peer is gone.
    fn queue(&mut self, to: Rank, f: Frame) -> bool {
        self.on_link(to, |l| l.send(f))
    }

    /// Hands `send` the connection to `to`; false when there is none or `send` finds it shut
    /// down. A shut connection is not marked lost here: whether a write failed (the peer
    /// reset it) or the I/O side ended it, that side reads what the peer sent up to the end,
    /// its goodbye included, and only then reports the loss ([`Inbound::Lost`]). Marked
    /// here, a peer's last messages and its goodbye would come after its loss, and a clean
    /// departure read as a crash.
    fn on_link(&mut self, to: Rank, send: impl FnOnce(&Link) -> bool) -> bool {
        match self.peers.get(to.0 as usize) {
            Some(Some(p)) if !p.lost => send(&p.link),
            _ => false,
        }
    }

    /// Whether a message of `len` bytes is longer than the mesh carries: if so it is counted
    /// ([`ControlStats::messages_too_long`]) and not sent (the peer would take it for a
    /// protocol error and end the connection).
    fn too_long(&self, to: Rank, len: usize) -> bool {
        if len <= self.cfg.max_message {
            return false;
        }
        bump(&self.stats.messages_too_long);
        tracing::warn!(
            rank = self.rank.0,
            peer = to.0,
            len,
            max = self.cfg.max_message,
            "control: message too long to send, dropped"
        );
        true
    }

    /// Counts a message sent, or one for a lost peer.
    fn count_message(&self, sent: bool) {
        bump(if sent {
            &self.stats.messages_sent
        } else {
            &self.stats.messages_to_lost_peer
        });
    }
}

impl ControlPort for TcpControl {
    fn send_control(&mut self, to: Rank, bytes: &[u8]) {
        if self.too_long(to, bytes.len()) {
            return;
        }
        if to == self.rank {
            self.handle(Inbound::Message(to, bytes.to_vec()));
            return;
        }
        let mut f = frame(KIND_MESSAGE, bytes.len());
        f.extend_from_slice(bytes);
        let sent = self.queue(to, Frame::Owned(f));
        self.count_message(sent);
    }

    fn read(&mut self, req: &ReadRequest) {
        bump(&self.stats.reads_requested);
        let fits = self
            .registry
            .get(req.op)
            .is_some_and(|b| range(req.offset, req.len, b.len()).is_some());
        if !fits
            || req.len > self.cfg.max_read
            || req.from == self.rank
            || self.pending.contains_key(&req.id.0)
        {
            self.fail_read(req.id);
            return;
        }
        let mut f = frame(KIND_READ_REQ, READ_REQ_LEN - 1);
        for v in [req.id.0, req.op.0, req.offset, req.len] {
            f.extend_from_slice(&v.to_be_bytes());
        }
        self.pending.insert(req.id.0, *req);
        if !self.queue(req.from, Frame::Owned(f)) && self.pending.remove(&req.id.0).is_some() {
            // Unknown rank (lost peers' reads were failed by `mark_lost`).
            self.fail_read(req.id);
        }
    }

    fn poll_control(&mut self, buf: &mut Vec<u8>) -> Option<ControlInput> {
        if self.ready.is_empty() {
            self.drain_inbound();
        }
        let input = self.ready.pop_front()?;
        if let ControlInput::Message { .. } = input {
            // Moved, not copied: a TCP fallback's piece is 256 KiB. The last message's vector,
            // handed back in `buf`, is kept for the next large one.
            let last = std::mem::replace(buf, self.local.pop_front().unwrap_or_default());
            self.spare.give(last);
        }
        Some(input)
    }
}

/// The start-up's connections (see [`TcpControl::connect_or_cancel`]): this rank connects to
/// every lower rank and accepts every higher one, each saying hello, by `deadline`. Fills
/// `streams`; a peer connected already that goes away meanwhile ends it ([`Watch`]).
fn handshake(
    rank: u32,
    table: &[SocketAddr],
    listener: &TcpListener,
    cfg: ControlConfig,
    cancel: &AtomicBool,
    deadline: Instant,
    streams: &mut [Option<TcpStream>],
) -> Result<(), ControlError> {
    let ranks = table.len();
    let mut watch = Watch::default();
    let left = |peer: u32| {
        if cancel.load(Ordering::Relaxed) {
            return Err(ControlError::Cancelled);
        }
        deadline
            .checked_duration_since(Instant::now())
            .filter(|d| !d.is_zero())
            .ok_or(ControlError::Timeout(cfg.connect_timeout, peer))
    };
    // A failed read during the start-up: cancelled, or the socket's error.
    let read_err = |what: &'static str| {
        move |e: io::Error| {
            if cancel.load(Ordering::Relaxed) {
                ControlError::Cancelled
            } else {
                io_err(what)(e)
            }
        }
    };
    let mut buf = Vec::new();
    // Lower ranks: connect (retrying until they listen), hello, their hello.
    for (j, addr) in table.iter().enumerate().take(rank as usize) {
        let s = loop {
            // A try at most a second long, so that a cancel is seen.
            match TcpStream::connect_timeout(addr, left(j as u32)?.min(CONNECT_TRY)) {
                Ok(s) => break s,
                Err(source)
                    if cfg.listeners_bound && source.kind() == io::ErrorKind::ConnectionRefused =>
                {
                    return Err(ControlError::PeerGone {
                        peer: j as u32,
                        addr: *addr,
                        source,
                    });
                }
                Err(_) => {
                    watch.look(rank, &cfg, streams, table)?;
                    thread::sleep(Duration::from_millis(10));
                }
            }
        };
        left(j as u32)?;
        // A peer that closes or resets the connection now is gone (a read that runs out
        // of time, or a cancel, is not).
        let gone = |what: &'static str| {
            move |source: io::Error| match source.kind() {
                _ if cancel.load(Ordering::Relaxed) => ControlError::Cancelled,
                io::ErrorKind::ConnectionReset
                | io::ErrorKind::ConnectionAborted
                | io::ErrorKind::BrokenPipe
                | io::ErrorKind::UnexpectedEof => ControlError::PeerGone {
                    peer: j as u32,
                    addr: *addr,
                    source,
                },
                // The read ran out of the start-up's time.
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                    ControlError::Timeout(cfg.connect_timeout, j as u32)
                }
                _ => read_err(what)(source),
            }
        };
        (&s).write_all(&hello(cfg.nonce, rank))
            .map_err(gone("send hello"))?;
        let ok = read_frame(&mut ReadBy(&s, deadline, cancel), HELLO_LEN, &mut buf)
            .map_err(gone("read hello"))?;
        // It answered with a goodbye naming the rank its start-up failed over.
        if let Some(g) = ok.then(|| goodbye(&buf)).flatten() {
            return Err(g.error(rank, j as u32, &cfg, table));
        }
        let got = if ok {
            check_hello(&buf, cfg.nonce).map_err(|m| ControlError::BadHello(*addr, m))?
        } else {
            return Err(gone("read hello")(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "connection closed before its hello",
            )));
        };
        if got as usize != j {
            return Err(ControlError::BadHello(*addr, "wrong rank"));
        }
        streams[j] = Some(s);
    }
    // Higher ranks: accept, their hello, ours.
    listener
        .set_nonblocking(true)
        .map_err(io_err("O_NONBLOCK"))?;
    let mut missing = ranks - rank as usize - 1;
    while missing > 0 {
        let first_missing = (rank as usize + 1..ranks)
            .find(|&j| streams[j].is_none())
            .unwrap_or(ranks) as u32;
        let (s, from) = match listener.accept() {
            Ok(x) => x,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                left(first_missing)?;
                watch.look(rank, &cfg, streams, table)?;
                thread::sleep(Duration::from_millis(5));
                continue;
            }
            Err(e) => return Err(io_err("accept")(e)),
        };
        s.set_nonblocking(false).map_err(io_err("O_NONBLOCK"))?;
        // A peer sends its hello right after connecting: a client slower than that (silent,
        // or trickling) is a stray, and must not hold up the start-up.
        let by = Instant::now() + left(first_missing)?.min(HELLO_WAIT);
        // A stray client is refused without failing the mesh.
        let got = match read_frame(&mut ReadBy(&s, by, cancel), HELLO_LEN, &mut buf) {
            Ok(true) => check_hello(&buf, cfg.nonce),
            _ => Err("no hello"),
        };
        let j = match got {
            Ok(j) if j > rank && (j as usize) < ranks && streams[j as usize].is_none() => j,
            Ok(_) => {
                tracing::warn!(%from, "control: hello with an unexpected rank");
                continue;
            }
            Err(m) => {
                tracing::warn!(%from, reason = m, "control: refused connection");
                continue;
            }
        };
        (&s).write_all(&hello(cfg.nonce, rank))
            .map_err(io_err("send hello"))?;
        streams[j as usize] = Some(s);
        missing -= 1;
    }
    Ok(())
}

/// Looks, now and then, at the connections a start-up holds already: a peer that closed or
/// reset its own, or left its own start-up with a goodbye (naming the rank it failed over,
/// or not), ends this one naming that rank (it would otherwise wait out the connect timeout for a peer that
/// will never connect, or blame one that only left). What a peer sent after its own start-up
/// (its start-up check's report) is looked past; a peer that closed behind it without a
/// goodbye (its process died) ends this one too (`POLLRDHUP`, which a `peek` of the bytes
/// before the end cannot see).
#[derive(Default)]
struct Watch {
    last: Option<Instant>,
    buf: Vec<u8>,
}

impl Watch {
    /// Between looks (each one a `peek` per connection).
    const EVERY: Duration = Duration::from_millis(50);
    /// The most a look reads ahead on one connection.
    const AHEAD: usize = 16 << 10;

    fn look(
        &mut self,
        me: u32,
        cfg: &ControlConfig,
        streams: &[Option<TcpStream>],
        table: &[SocketAddr],
    ) -> Result<(), ControlError> {
        if self.last.is_some_and(|t| t.elapsed() < Self::EVERY) {
            return Ok(());
        }
        self.last = Some(Instant::now());
        self.buf.resize(Self::AHEAD, 0);
        for (j, s) in streams.iter().enumerate() {
            let Some(s) = s else { continue };
            if s.set_nonblocking(true).is_err() {
                continue;
            }
            // The close first, then the bytes: the kernel marks a close only behind every
            // byte sent before it, so a peek after a close seen here sees them all (a
            // goodbye included), where a close seen after the peek could hide one that came
            // between the two.
            let closed = crate::sys::peer_closed(s).unwrap_or(false);
            let r = s.peek(&mut self.buf);
            let _ = s.set_nonblocking(false);
            let gone = |source| ControlError::PeerGone {
                peer: j as u32,
                addr: table[j],
                source,
            };
            match r {
                Ok(0) => {
                    return Err(gone(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "connection closed",
                    )));
                }
                Ok(n) => {
                    // The frames read ahead, up to a goodbye.
                    let mut at = 0;
                    let mut bye = false;
                    while let Some(len) = u32_at(&self.buf[..n], at) {
                        let Some(body) = self.buf[..n].get(at + 4..at + 4 + len as usize) else {
                            break;
                        };
                        if body.first() == Some(&KIND_BYE) {
                            // A start-up's goodbye ends this one. Any other is of a peer that
                            // finished its start-up and left since, its part done (the
                            // mesh hears of it once this start-up is through).
                            if u64_at(body, 1).is_none_or(|mark| mark < START_TIMED_OUT) {
                                bye = true;
                                break;
                            }
                            return Err(match goodbye(body) {
                                Some(g) => g.error(me, j as u32, cfg, table),
                                None => gone(io::Error::other("it left its start-up")),
                            });
                        }
                        at += 4 + len as usize;
                    }
                    // Closed behind what it sent, with no goodbye among it (all of it read
                    // ahead: a goodbye could lie past a full look): its process died after
                    // it sent some (its start-up check's report, say).
                    if closed && !bye && n < Self::AHEAD {
                        return Err(gone(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "connection closed behind what it sent, without a goodbye",
                        )));
                    }
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted
                    ) =>
                {
                    return Err(gone(e));
                }
                Err(_) => {}
            }
        }
        Ok(())
    }
}

/// Body length of a goodbye that names a rank: kind, mark u64, blamed rank u32.
const BYE_BLAMING_LEN: usize = 1 + 8 + 4;

/// A goodbye frame: `mark`, and the rank it leaves over when it names one.
fn bye_frame(mark: u64, blamed: Option<u32>) -> Vec<u8> {
    let mut bye = frame(
        KIND_BYE,
        if blamed.is_some() {
            BYE_BLAMING_LEN - 1
        } else {
            8
        },
    );
    bye.extend_from_slice(&mark.to_be_bytes());
    if let Some(b) = blamed {
        bye.extend_from_slice(&b.to_be_bytes());
    }
    bye
}
/// The mark of a goodbye a failed start-up sends over a rank gone (a connection refused,
/// closed or reset).
const START_GONE: u64 = u64::MAX;
/// The mark of a goodbye a start-up sends when it timed out waiting for a rank.
const START_TIMED_OUT: u64 = u64::MAX - 1;

/// What a failed start-up's goodbye says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Goodbye {
    mark: u64,
    blamed: u32,
}

/// The goodbye in frame body `b` (kind first), if it is one that names a rank.
fn goodbye(b: &[u8]) -> Option<Goodbye> {
    if b.len() != BYE_BLAMING_LEN || b[0] != KIND_BYE {
        return None;
    }
    Some(Goodbye {
        mark: u64::from_be_bytes(b[1..9].try_into().ok()?),
        blamed: u32_at(b, 9)?,
    })
}

impl Goodbye {
    /// The failure it makes of rank `me`'s start-up, heard from rank `from`: the rank it
    /// names is gone, or was waited for in vain (or, naming `me` or no rank of the table,
    /// `from` gave up).
    fn error(self, me: u32, from: u32, cfg: &ControlConfig, table: &[SocketAddr]) -> ControlError {
        let k = self.blamed;
        match table.get(k as usize) {
            Some(_) if k != me && self.mark == START_TIMED_OUT => {
                ControlError::Timeout(cfg.connect_timeout, k)
            }
            Some(&addr) if k != me => ControlError::PeerGone {
                peer: k,
                addr,
                source: io::Error::other(format!("rank {from} left its start-up over it")),
            },
            _ => ControlError::PeerGone {
                peer: from,
                addr: table[from as usize],
                source: io::Error::other(format!("it gave up its start-up waiting for rank {k}")),
            },
        }
    }
}

/// A start-up that failed (`e`, over a rank) says so to every peer connected already, and to
/// every connection waiting in the backlog whose hello is of this job, before it drops them:
/// a goodbye naming that rank, and whether it was gone or waited for in vain. What they sent
/// is read away first, for at most [`BYE_WAIT`] in all (a socket closed on unread bytes
/// resets the connection, and the goodbye could be lost with it).
fn leave_over(streams: &[Option<TcpStream>], listener: &TcpListener, nonce: u64, e: &ControlError) {
    let Some(culprit) = e.culprit() else {
        return;
    };
    let mark = match e {
        ControlError::Timeout(..) => START_TIMED_OUT,
        _ => START_GONE,
    };
    let bye = bye_frame(mark, Some(culprit));
    let mut told: Vec<&TcpStream> = streams.iter().flatten().collect();
    // The backlog: only ranks of this job (a stray, another job's rank, is just closed).
    let mut waiting = Vec::new();
    if listener.set_nonblocking(true).is_ok() {
        while let Ok((s, _)) = listener.accept() {
            let mut hello = [0u8; 4 + HELLO_LEN];
            let ours = s.set_nonblocking(true).is_ok()
                && s.peek(&mut hello).ok() == Some(hello.len())
                && u32_at(&hello, 0) == Some(HELLO_LEN as u32)
                && check_hello(&hello[4..], nonce).is_ok();
            if ours {
                waiting.push(s);
            }
        }
    }
    told.extend(waiting.iter());
    for s in &told {
        // A goodbye fits any fresh socket's send buffer.
        let _ = s.set_nonblocking(true);
        let _ = (&**s).write_all(&bye);
        let _ = s.shutdown(std::net::Shutdown::Write);
    }
    // What they sent, read away against one deadline, a little from each in turn.
    let by = Instant::now() + BYE_WAIT;
    let mut open: Vec<&TcpStream> = told;
    let mut sink = [0u8; 4096];
    while !open.is_empty() && Instant::now() < by {
        open.retain(|s| match (&**s).read(&mut sink) {
            Ok(0) => false,
            Ok(_) => true,
            Err(e) => e.kind() == io::ErrorKind::WouldBlock,
        });
        if !open.is_empty() {
            thread::sleep(Duration::from_millis(1));
        }
    }
}

/// How long [`leave_over`] gives its goodbyes, all together, to be taken and its connections
/// to be read empty.
const BYE_WAIT: Duration = Duration::from_millis(100);

impl Drop for TcpControl {
    fn drop(&mut self) {
        for p in self.peers.iter().flatten() {
            p.link.close();
        }
        self.io_state.store(STOP, Ordering::Release);
        let _ = self.io_waker.wake();
        if let IoMode::Thread(t) = &mut self.io
            && let Some(t) = t.take()
        {
            let _ = t.join();
        }
    }
}

/// Readiness events one turn of the mesh's poll takes (the rest wait for the next turn).
const EVENTS: usize = 64;
/// The I/O thread's poll token of its waker (a peer's token is its rank).
const WAKE: mio::Token = mio::Token(usize::MAX);
/// Initial read buffer per connection; it grows to hold the longest frame read.
const READ_STEP: usize = 64 << 10;
/// Above this, a connection's read buffer shrinks back to `READ_STEP` once empty (the TCP
/// fallback's 256 KiB pieces keep theirs; a fetch's megabytes do not).
const READ_KEEP: usize = 1 << 20;

/// The I/O thread's side of one peer.
struct IoPeer {
    rank: Rank,
    link: Arc<Link>,
    /// Frames read and not decoded yet.
    frames: FrameReader,
    /// A large message being read straight into its own vector (its body, without the frame
    /// header), and the body's length; empty with 0 otherwise.
    big: Vec<u8>,
    big_len: usize,
    /// A large message being read straight into the buffer its [`Lander`] named.
    land: Option<Land>,
    /// The last message was a large one: the next read takes only [`PEEK`] bytes, so that
    /// a large message after it is read into its place from its first bytes on, not copied
    /// there out of a full read buffer.
    peek: bool,
}

/// A landing under way: `left` bytes are still to come, to `at..at + left` of `buf`.
struct Land {
    buf: OpBuffer,
    at: usize,
    left: usize,
    note: Vec<u8>,
    /// The buffer was too short when written to (its operation ended): the rest is read and
    /// dropped, and the owner hears nothing.
    gone: bool,
}

/// Why a connection's reading ended.
enum Ended {
    /// EOF, an I/O error, or a shutdown.
    Closed,
    /// A frame broke the protocol.
    Malformed,
}

/// The I/O thread: every connection of this rank.
struct Io {
    peers: Vec<Option<IoPeer>>,
    poll: mio::Poll,
    /// The poll failed: every connection was ended.
    failed: bool,
    /// A turn saw the waker's event, or drained a long queue below [`SEND_LOW_WATER`], since
    /// the owner last waited (inline I/O): the owner must not wait for another event then.
    woken: bool,
    io_state: Arc<AtomicU8>,
    owner: Owner,
    stats: Arc<ControlStats>,
    cfg: ControlConfig,
    /// Where large messages land ([`TcpControl::set_lander`]), if anywhere.
    lander: Option<Box<dyn Lander>>,
}

impl Io {
    /// Until the owner stops it (or every connection ended); returns itself, its connections
    /// untouched, when the owner takes them over ([`HAND_OVER`]).
    fn run(mut self) -> Option<Io> {
        let mut events = mio::Events::with_capacity(EVENTS);
        loop {
            match self.io_state.load(Ordering::Acquire) {
                RUN => {}
                HAND_OVER => return Some(self),
                _ => break,
            }
            if self.failed || self.peers.iter().all(Option::is_none) {
                break;
            }
            self.turn(&mut events, None);
        }
        // Stopped by the owner, or the poll failed: every connection still open counts as
        // lost (the owner, if still there, fails what waits on it).
        for j in 0..self.peers.len() {
            self.end(j, Ended::Closed);
        }
        None
    }

    /// One wait on every connection (at most `timeout`), then what the events allow: reads
    /// (frames to the owner, reads served) and writes. A failed poll ends every connection.
    fn turn(&mut self, events: &mut mio::Events, timeout: Option<Duration>) {
        if self.failed {
            if let Some(t) = timeout {
                thread::sleep(t);
            }
            return;
        }
        if let Err(e) = self.poll.poll(events, timeout) {
            if e.kind() != io::ErrorKind::Interrupted {
                tracing::error!(error = %e, "control: epoll failed");
                self.failed = true;
                for j in 0..self.peers.len() {
                    self.end(j, Ended::Closed);
                }
            }
            return;
        }
        for ev in events.iter() {
            let j = ev.token().0;
            if ev.token() == WAKE {
                self.woken = true;
                continue;
            }
            if ev.is_writable()
                && let Some(Some(p)) = self.peers.get(j)
            {
                let mut out = p.link.out();
                let before = out.bytes;
                p.link.flush(&mut out);
                // An owner that holds data back while a queue is long hears that it drained.
                // Inline, the poll's return tells it, unless this was `poll_io`'s look
                // before it waits (`drain_inbound`): a flush that took the whole queue there
                // leaves no write to raise another edge, so the wait must not start.
                if before >= SEND_LOW_WATER && out.bytes < SEND_LOW_WATER {
                    self.woken = true;
                    if let Some(t) = self.owner.waker.get() {
                        t.unpark();
                    }
                }
            }
            if ev.is_readable() || ev.is_read_closed() || ev.is_error() {
                // Without a hang-up or an error in the event, a short read means the
                // socket is empty: data arriving later raises a new edge.
                self.read(j, !(ev.is_read_closed() || ev.is_error()));
            }
        }
    }

    /// Reads what connection `j` holds, handling every whole frame; ends it at EOF, on an
    /// error or on a malformed frame. With `short_ends`, a read that does not fill the buffer
    /// ends the turn (the socket holds nothing more: a stream socket's short read drained it,
    /// epoll(7)), saving the read that would only say `EAGAIN`; an event that reported a
    /// hang-up or an error reads on until the EOF or the error itself.
    fn read(&mut self, j: usize, short_ends: bool) {
        let Io {
            peers,
            owner,
            cfg,
            lander,
            ..
        } = self;
        let Some(Some(p)) = peers.get_mut(j) else {
            return;
        };
        let ended = loop {
            if let Some(l) = &mut p.land {
                let stream = &p.link.stream;
                let room = l.left;
                // Into its place; once the buffer is gone, into the read buffer (empty now),
                // and dropped.
                let got = if l.gone {
                    None
                } else {
                    l.buf
                        .view_mut(l.at as u64, l.left as u64, |dst| (&*stream).read(dst))
                };
                let (got, room) = match got {
                    Some(r) => (r, room),
                    None => {
                        l.gone = true;
                        let scratch = p.frames.scratch(room);
                        let room = scratch.len();
                        ((&*stream).read(scratch), room)
                    }
                };
                let drained = match got {
                    Ok(0) => break Some(Ended::Closed),
                    Ok(n) => {
                        l.at += n;
                        l.left -= n;
                        short_ends && n < room
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break None,
                    Err(_) => break Some(Ended::Closed),
                };
                if l.left == 0 {
                    if let Some(l) = p.land.take().filter(|l| !l.gone) {
                        if let Some(lander) = lander.as_mut() {
                            lander.landed(&l.note);
                        }
                        let _ = owner.send(Inbound::Message(p.rank, l.note));
                    }
                    p.peek = true;
                }
                if drained {
                    break None;
                }
                continue;
            }
            if p.big_len > 0 {
                let want = p.big_len - p.big.len();
                if p.big.capacity() == p.big.len() {
                    p.big.reserve(want.min(BIG_RESERVE));
                }
                // A read shorter than the room it had drained the socket (not one shorter
                // than the message's rest: the vector may hold less).
                let room = want.min(p.big.capacity() - p.big.len());
                let drained = match crate::sys::recv_spare(&p.link.stream, &mut p.big, room) {
                    Ok(0) => break Some(Ended::Closed),
                    Ok(n) => short_ends && n < room,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break None,
                    Err(_) => break Some(Ended::Closed),
                };
                if p.big.len() == p.big_len {
                    p.big_len = 0;
                    p.peek = true;
                    let _ = owner.send(Inbound::Message(p.rank, std::mem::take(&mut p.big)));
                }
                if drained {
                    break None;
                }
                continue;
            }
            let max = read_limit(&mut p.peek);
            let room = p.frames.room(max);
            let want = room.len();
            let drained = match (&p.link.stream).read(room) {
                Ok(0) => break Some(Ended::Closed),
                Ok(n) => {
                    p.frames.filled(n);
                    short_ends && n < want
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break None,
                Err(_) => break Some(Ended::Closed),
            };
            // Every whole frame read so far.
            let mut bad = false;
            loop {
                match p.frames.next(cfg) {
                    Ok(Next::Whole(frame)) => {
                        let served = Served {
                            peer: p.rank,
                            link: &p.link,
                            owner,
                        };
                        if !served.handle(frame) {
                            bad = true;
                            break;
                        }
                    }
                    // A large message's rest is read straight into the vector that carries
                    // it to the owner (no copy out of the read buffer, nor growing it).
                    Ok(Next::Big { len, head }) => {
                        match lander.as_mut().and_then(|l| l.land(p.rank, head, len - 1)) {
                            Some(l) if l.skip <= head.len() => {
                                let (have, rest) = (head.len() - l.skip, len - 1 - l.skip);
                                // Where the message ends in the buffer; past what a buffer can
                                // hold, it is gone as one too short is.
                                let end = l.at.checked_add(rest);
                                let gone = end.is_none_or(|end| {
                                    l.buf
                                        .view_mut(l.at as u64, (end - l.at) as u64, |dst| {
                                            dst[..have].copy_from_slice(&head[l.skip..]);
                                        })
                                        .is_none()
                                });
                                p.land = Some(Land {
                                    buf: l.buf,
                                    at: if gone { 0 } else { l.at + have },
                                    left: rest - have,
                                    note: l.note,
                                    gone,
                                });
                            }
                            _ => {
                                // Memory as the bytes come, not as a header announces them.
                                p.big = p.link.spare.take((len - 1).min(BIG_RESERVE));
                                p.big.extend_from_slice(head);
                                p.big_len = len - 1;
                            }
                        }
                        break;
                    }
                    Ok(Next::More) => break,
                    Err(Malformed) => {
                        bad = true;
                        break;
                    }
                }
            }
            if bad {
                break Some(Ended::Malformed);
            }
            p.frames.settle();
            if drained {
                break None;
            }
        };
        if let Some(e) = ended {
            self.end(j, e);
        }
    }

    /// Ends connection `j`: shut down, forgotten, and reported lost to the owner (after every
    /// frame read before, which the owner already has).
    fn end(&mut self, j: usize, why: Ended) {
        let Some(p) = self.peers.get_mut(j).and_then(Option::take) else {
            return;
        };
        if let Ended::Malformed = why {
            bump(&self.stats.malformed);
        }
        let _ = self
            .poll
            .registry()
            .deregister(&mut SourceFd(&p.link.stream.as_raw_fd()));
        p.link.close();
        let _ = self.owner.send(Inbound::Lost(p.rank));
    }
}

/// One frame's handling: what the I/O thread needs of itself and of the frame's connection.
struct Served<'a> {
    peer: Rank,
    link: &'a Link,
    owner: &'a Owner,
}

impl Served<'_> {
    /// Handles one frame (kind and body); false on a protocol error.
    fn handle(&self, b: &[u8]) -> bool {
        let Some(frame) = Incoming::parse(b) else {
            return false;
        };
        let to_owner = match frame {
            Incoming::Message(body) => Inbound::Message(self.peer, body.to_vec()),
            Incoming::ReadReq(a) => return self.link.ask(a),
            Incoming::ReadResp { id, bytes } => Inbound::ReadData(self.peer, id, bytes.to_vec()),
            Incoming::Refused(id) => Inbound::Refused(self.peer, id),
            Incoming::Bye { mark, blamed } => Inbound::Bye(self.peer, mark, blamed),
        };
        let _ = self.owner.send(to_owner);
        true
    }
}

impl Serve {
    /// The answer to a peer's read: the bytes from the registered buffer, or a refusal (an
    /// unknown operation, a range outside its buffer, longer than `max_read`). Nothing is
    /// allocated for a read that is refused.
    fn reply(&self, a: Asked) -> Vec<u8> {
        let Asked {
            id,
            op,
            offset,
            len,
        } = a;
        let buf = self.registry.get(op).filter(|b| {
            len <= self.max_read.load(Ordering::Relaxed) && range(offset, len, b.len()).is_some()
        });
        if let Some(b) = buf {
            let mut f = frame(KIND_READ_RESP, 8 + len as usize);
            f.extend_from_slice(&id.to_be_bytes());
            // The buffer's length does not change while registered; checked again anyway.
            if b.read_at(offset, len, &mut f) {
                bump(&self.stats.reads_served);
                self.stats.bytes_served.fetch_add(len, Ordering::Relaxed);
                return f;
            }
        }
        bump(&self.stats.reads_refused);
        tracing::debug!(peer = self.peer.0, op = op.0, offset, len, "read refused");
        let mut f = frame(KIND_READ_REFUSED, 8);
        f.extend_from_slice(&id.to_be_bytes());
        f
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringcast_core::ChunkRun;

    fn mesh(n: usize, nonce: u64) -> Vec<TcpControl> {
        mesh_io(n, nonce, |_| false)
    }

    /// `n` listeners on loopback, and their addresses: a mesh's table.
    fn listeners(n: usize) -> (Vec<TcpListener>, Vec<SocketAddr>) {
        let listeners: Vec<TcpListener> = (0..n)
            .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind"))
            .collect();
        let table = listeners
            .iter()
            .map(|l| l.local_addr().expect("addr"))
            .collect();
        (listeners, table)
    }

    /// A mesh whose ranks `r` with `inline(r)` do their own I/O.
    fn mesh_io(n: usize, nonce: u64, inline: impl Fn(usize) -> bool) -> Vec<TcpControl> {
        let (listeners, table) = listeners(n);
        let handles: Vec<_> = listeners
            .into_iter()
            .enumerate()
            .map(|(r, l)| {
                let table = table.clone();
                let cfg = ControlConfig {
                    inline_io: inline(r),
                    ..ControlConfig::new(nonce)
                };
                thread::spawn(move || {
                    TcpControl::connect(r as u32, &table, l, Registry::default(), cfg)
                        .expect("connect")
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("join"))
            .collect()
    }

    fn wait(c: &mut TcpControl, buf: &mut Vec<u8>) -> ControlInput {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(i) = c.poll_control(buf) {
                return i;
            }
            assert!(Instant::now() < deadline, "no control input");
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// Rank `at`'s next control input, polling rank `io`'s inline I/O meanwhile (it may be
    /// the one that answers).
    fn polled_input(
        m: &mut [TcpControl],
        io: usize,
        at: usize,
        buf: &mut Vec<u8>,
        deadline: Instant,
    ) -> ControlInput {
        loop {
            m[io].poll_io(Duration::from_millis(1));
            if let Some(i) = m[at].poll_control(buf) {
                return i;
            }
            assert!(Instant::now() < deadline, "no input at rank {at}");
        }
    }

    fn req(id: u64, from: u32, op: u64, offset: u64, len: u64) -> ReadRequest {
        ReadRequest {
            id: ReadId(id),
            op: OpId(op),
            from: Rank(from),
            run: ChunkRun { start: 0, len: 1 },
            offset,
            len,
        }
    }

    #[test]
    fn messages_reads_refusals_and_loss() {
        messages_reads_refusals_and_loss_on(mesh(3, 77));
    }

    /// The same with ranks 0 and 2 doing their own I/O, rank 1 (which serves the reads) an
    /// I/O thread: both kinds meet on one mesh.
    #[test]
    fn inline_io_meets_the_same_checks() {
        messages_reads_refusals_and_loss_on(mesh_io(3, 76, |r| r != 1));
    }

    fn messages_reads_refusals_and_loss_on(mut m: Vec<TcpControl>) {
        let mut buf = Vec::new();
        m[2].send_control(Rank(0), b"hello zero");
        assert_eq!(
            wait(&mut m[0], &mut buf),
            ControlInput::Message {
                from: Rank(2),
                len: 10
            }
        );
        assert_eq!(buf, b"hello zero");

        // Rank 1 serves op 5; rank 0 reads into its own op 5 buffer.
        let src: Vec<u8> = (0..100u8).collect();
        m[1].registry()
            .register(OpId(5), OpBuffer::from_vec(src.clone()));
        let dst = OpBuffer::zeroed(100);
        m[0].registry().register(OpId(5), dst.clone());
        m[0].read(&req(1, 1, 5, 10, 20));
        assert_eq!(
            wait(&mut m[0], &mut buf),
            ControlInput::ReadDone {
                id: ReadId(1),
                result: Ok(())
            }
        );
        assert_eq!(dst.to_vec()[10..30], src[10..30]);
        assert_eq!(dst.to_vec()[30], 0);

        // Out of the peer's range (the peer's buffer is shorter), unknown op: refused.
        m[1].registry().register(OpId(6), OpBuffer::zeroed(8));
        m[0].registry().register(OpId(6), OpBuffer::zeroed(100));
        m[0].read(&req(2, 1, 6, 4, 8));
        m[0].registry().register(OpId(9), OpBuffer::zeroed(100));
        m[0].read(&req(3, 1, 9, 0, 8));
        for id in [2, 3] {
            assert_eq!(
                wait(&mut m[0], &mut buf),
                ControlInput::ReadDone {
                    id: ReadId(id),
                    result: Err(ReadError)
                }
            );
        }
        assert_eq!(m[1].stats().reads_refused.load(Ordering::Relaxed), 2);
        assert_eq!(m[1].stats().reads_served.load(Ordering::Relaxed), 1);
        // Out of this rank's own range: refused locally, never sent.
        m[0].read(&req(4, 1, 5, 90, 20));
        assert!(matches!(
            wait(&mut m[0], &mut buf),
            ControlInput::ReadDone {
                id: ReadId(4),
                result: Err(ReadError)
            }
        ));

        // Rank 2 goes away: rank 0 sees it lost, and reads from it fail at once.
        let gone = m.pop().expect("rank 2");
        drop(gone);
        let deadline = Instant::now() + Duration::from_secs(10);
        let lost = loop {
            if let Some(l) = m[0].take_lost() {
                break l;
            }
            assert!(Instant::now() < deadline, "loss not seen");
            thread::sleep(Duration::from_millis(1));
        };
        assert_eq!(lost, PeerLost(Rank(2)));
        m[0].read(&req(5, 2, 5, 0, 4));
        assert_eq!(
            wait(&mut m[0], &mut buf),
            ControlInput::ReadDone {
                id: ReadId(5),
                result: Err(ReadError)
            }
        );
        assert_eq!(m[0].lost_peers(), &[Rank(2)]);
    }

    #[test]
    fn ranks_serving_each_others_large_reads_do_not_deadlock() {
        large_reads_both_ways(mesh(2, 79));
    }

    /// The same with both ranks doing their own I/O: each serves the other's reads in its
    /// own polls, and neither blocks on a full socket.
    #[test]
    fn inline_ranks_serving_each_others_large_reads_do_not_deadlock() {
        large_reads_both_ways(mesh_io(2, 80, |_| true));
    }

    fn large_reads_both_ways(mut m: Vec<TcpControl>) {
        // Each rank asks the other for six 4 MiB reads at once, far more than the TCP
        // buffers hold: both sides must keep reading while their answers wait.
        const LEN: u64 = 4 << 20;
        const N: u64 = 6;
        let mut want = Vec::new();
        for (r, c) in m.iter().enumerate() {
            let src: Vec<u8> = (0..2 * N * LEN)
                .map(|i| (i % 251) as u8 ^ r as u8)
                .collect();
            c.registry()
                .register(OpId(9), OpBuffer::from_vec(src.clone()));
            want.push(src);
        }
        // Rank r reads the peer's half r into its own half r (a read lands at the offset it
        // names), so neither overwrites what it serves.
        let half = |r: usize| r as u64 * N * LEN;
        for (r, c) in m.iter_mut().enumerate() {
            for k in 0..N {
                c.read(&req(k, 1 - r as u32, 9, half(r) + k * LEN, LEN));
            }
        }
        // Both ranks polled by turns (an inline rank serves only while it polls).
        let mut buf = Vec::new();
        let mut done = [0u64; 2];
        let deadline = Instant::now() + Duration::from_secs(60);
        while done.iter().any(|&d| d < N) {
            assert!(Instant::now() < deadline, "reads done: {done:?}");
            for (r, c) in m.iter_mut().enumerate() {
                c.poll_io(Duration::from_millis(1));
                while let Some(got) = c.poll_control(&mut buf) {
                    assert!(
                        matches!(got, ControlInput::ReadDone { result: Ok(()), .. }),
                        "{got:?}"
                    );
                    done[r] += 1;
                }
            }
        }
        for (r, c) in m.iter().enumerate() {
            let have = c.registry().get(OpId(9)).expect("registered").to_vec();
            let h = half(r) as usize..(half(r) + N * LEN) as usize;
            assert!(
                have[h.clone()] == want[1 - r][h],
                "rank {r} holds the peer's bytes"
            );
            assert_eq!(c.stats().reads_served.load(Ordering::Relaxed), N);
        }
    }

    /// An inline rank waiting in `poll_io` returns when a frame arrives and when its waker is
    /// woken from another thread; an I/O-thread rank's `poll_io` parks and is unparked alike.
    #[test]
    fn poll_io_returns_on_arrival_and_on_wake() {
        for inline in [true, false] {
            let mut m = mesh_io(2, 81 + u64::from(inline), |r| r == 0 && inline);
            let mut one = m.pop().expect("rank 1");
            let mut zero = m.pop().expect("rank 0");
            let waker = zero.waker();
            let (tx, rx) = mpsc::channel();
            let waiter = thread::spawn(move || {
                zero.wake_on_arrival(thread::current());
                let mut buf = Vec::new();
                // Long waits: only the arrival and the waker end them in time.
                zero.poll_io(Duration::from_secs(600));
                let first = zero.poll_control(&mut buf).map(|_| buf.clone());
                let _ = tx.send(first);
                zero.poll_io(Duration::from_secs(600));
                let _ = tx.send(None);
                zero
            });
            one.send_control(Rank(0), b"wake up");
            let got = rx.recv_timeout(Duration::from_secs(60));
            assert_eq!(got, Ok(Some(b"wake up".to_vec())), "inline {inline}");
            waker.wake();
            assert_eq!(rx.recv_timeout(Duration::from_secs(60)), Ok(None));
            drop(waiter.join().expect("waiter"));
        }
    }

    /// `IoWait` waits on an inline mesh without borrowing it: an arrival and the waker end the
    /// wait, and it takes nothing, so it returns at once until the owner reads. A mesh with
    /// an I/O thread has none.
    #[test]
    fn io_wait_returns_on_arrival_and_on_wake_and_takes_nothing() {
        let mut m = mesh_io(2, 87, |r| r == 0);
        let one = m.pop().expect("rank 1");
        let mut zero = m.pop().expect("rank 0");
        assert!(one.io_wait().is_none(), "an I/O thread's mesh");
        let w = zero.io_wait().expect("inline mesh");
        let mut buf = Vec::new();
        // The connections' first events (writable) are taken by the owner's first look.
        assert!(zero.poll_control(&mut buf).is_none());
        // Nothing there: the wait runs out.
        let t = Instant::now();
        w.wait(Duration::from_millis(30));
        assert!(t.elapsed() >= Duration::from_millis(30));
        assert!(zero.poll_control(&mut buf).is_none());
        // An arrival ends a long wait, however often it is waited for before the owner reads.
        let mut one = one;
        let (tx, rx) = mpsc::channel();
        let waiter = thread::spawn(move || {
            for _ in 0..3 {
                w.wait(Duration::from_secs(600));
                let _ = tx.send(());
            }
            w
        });
        one.send_control(Rank(0), b"here");
        for _ in 0..3 {
            assert_eq!(rx.recv_timeout(Duration::from_secs(60)), Ok(()));
        }
        let w = waiter.join().expect("waiter");
        assert!(matches!(
            zero.poll_control(&mut buf),
            Some(ControlInput::Message { .. })
        ));
        assert_eq!(buf, b"here");
        // The owner took the event: waits run out again, until the waker.
        let t = Instant::now();
        w.wait(Duration::from_millis(30));
        assert!(t.elapsed() >= Duration::from_millis(30));
        let waker = zero.waker();
        let waiter = thread::spawn(move || w.wait(Duration::from_secs(600)));
        waker.wake();
        waiter.join().expect("woken");
    }

    /// `wake_on_arrival` names a thread for the I/O thread to unpark; an inline mesh, read
    /// by a thread that is awake already, unparks nobody (it woke the TCP path's dispatcher
    /// on every frame its leader read, for nothing), also once made inline.
    #[test]
    fn only_an_io_thread_unparks_on_arrival() {
        let mut m = mesh_io(3, 88, |r| r == 0);
        let mut two = m.pop().expect("rank 2");
        let one = m.pop().expect("rank 1");
        let zero = m.pop().expect("rank 0");
        zero.wake_on_arrival(thread::current());
        assert!(zero.waker.get().is_none(), "inline");
        one.wake_on_arrival(thread::current());
        assert!(one.waker.get().is_some(), "an I/O thread's");
        two.make_inline();
        two.wake_on_arrival(thread::current());
        assert!(two.waker.get().is_none(), "made inline");
    }

    /// An owner that waits in `poll_io` while a long queue drains (its peer reads at last) is
    /// woken, with an I/O thread and inline: it can then send more.
    #[test]
    fn poll_io_returns_when_a_long_queue_drains() {
        const MSGS: usize = 48;
        let chunk = vec![7u8; 1 << 20];
        for inline in [true, false] {
            let mut m = mesh_io(2, 83 + u64::from(inline), |r| r == 1 || inline);
            let mut one = m.pop().expect("rank 1");
            let mut zero = m.pop().expect("rank 0");
            for _ in 0..MSGS {
                zero.send_control(Rank(1), &chunk);
            }
            // Rank 1 reads nothing yet: what its socket buffers do not hold waits in the queue.
            assert!(
                zero.queued(Rank(1)) >= SEND_LOW_WATER,
                "inline {inline}: {} bytes queued",
                zero.queued(Rank(1))
            );
            let (tx, rx) = mpsc::channel();
            let waiter = thread::spawn(move || {
                zero.wake_on_arrival(thread::current());
                // A long wait: only the queue draining ends it in time.
                while zero.queued(Rank(1)) >= SEND_LOW_WATER {
                    zero.poll_io(Duration::from_secs(600));
                }
                let _ = tx.send(());
                // The rest goes out as the socket takes it.
                while zero.queued(Rank(1)) > 0 {
                    zero.poll_io(Duration::from_millis(10));
                }
                zero
            });
            let (mut got, mut buf) = (0, Vec::new());
            while got < MSGS {
                one.poll_io(Duration::from_millis(10));
                while let Some(ControlInput::Message { len, .. }) = one.poll_control(&mut buf) {
                    assert_eq!(len, chunk.len());
                    got += 1;
                }
            }
            assert_eq!(
                rx.recv_timeout(Duration::from_secs(60)),
                Ok(()),
                "inline {inline}: the waiter was not woken"
            );
            let zero = waiter.join().expect("waiter");
            assert_eq!(zero.queued(Rank(1)), 0);
        }
    }

    /// Lands a large message that starts with `L` and an offset (u64) at that offset of its
    /// buffer; notes `N` and the offset; records the notes it is told have landed.
    struct TestLander {
        dest: OpBuffer,
        landed: Arc<Mutex<Vec<Vec<u8>>>>,
    }

    impl Lander for TestLander {
        fn land(&mut self, _from: Rank, head: &[u8], _len: usize) -> Option<Landing> {
            if head.len() < 9 || head[0] != b'L' {
                return None;
            }
            let at = u64::from_be_bytes(head[1..9].try_into().expect("8 bytes"));
            let mut note = b"N".to_vec();
            note.extend_from_slice(&head[1..9]);
            Some(Landing {
                buf: self.dest.clone(),
                at: at as usize,
                skip: 9,
                note,
            })
        }

        fn landed(&mut self, note: &[u8]) {
            self.landed.lock().expect("lock").push(note.to_vec());
        }
    }

    /// Large messages land where the lander says, from their first bytes, and the owner
    /// gets the note instead; the ones it declines, and small ones, arrive whole; one whose
    /// place lies outside the buffer is read and dropped, without a note; and the messages
    /// after each arrive whole and in order. A mesh with an I/O thread takes no lander.
    #[test]
    fn large_messages_land_where_the_lander_says() {
        let mut threaded = mesh_io(2, 93, |_| false);
        assert!(!threaded[1].set_lander(Box::new(TestLander {
            dest: OpBuffer::zeroed(1),
            landed: Arc::default(),
        })));
        drop(threaded);
        let mut m = mesh_io(2, 94, |_| true);
        let mut one = m.pop().expect("rank 1");
        let mut zero = m.pop().expect("rank 0");
        const DEST: usize = 1 << 20;
        let dest = OpBuffer::zeroed(DEST);
        let landed = Arc::new(Mutex::new(Vec::new()));
        assert!(one.set_lander(Box::new(TestLander {
            dest: dest.clone(),
            landed: Arc::clone(&landed),
        })));
        let body = |tag: u8, at: u64, len: usize| -> Vec<u8> {
            let mut b = vec![tag];
            b.extend_from_slice(&at.to_be_bytes());
            b.extend((0..len).map(|j| (j * 7 + at as usize) as u8));
            b
        };
        let msgs = [
            body(b'L', 100, 200_000),
            body(b'W', 0, 70_000),
            body(b'L', 5, 100),
            // Longer than the read buffer: never read whole, so offered to the lander.
            body(b'L', (DEST - 10) as u64, 100_000),
            body(b'L', 300_000, 300_000),
            body(b'W', 1, 20_000),
        ];
        let sent = msgs.clone();
        let sender = thread::spawn(move || {
            for b in &sent {
                zero.send_control(Rank(1), b);
                zero.poll_io(Duration::from_millis(1));
            }
            while zero.queued(Rank(1)) > 0 {
                zero.poll_io(Duration::from_millis(10));
            }
            zero
        });
        let mut buf = Vec::new();
        let mut next = || {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                if let Some(ControlInput::Message { len, .. }) = one.poll_control(&mut buf) {
                    return buf[..len].to_vec();
                }
                assert!(Instant::now() < deadline, "a message is lost");
                one.poll_io(Duration::from_millis(10));
            }
        };
        // In order: a note, two whole messages, nothing for the one outside the buffer, a
        // note, a whole message.
        let note = |at: u64| [&b"N"[..], &at.to_be_bytes()].concat();
        for (i, want) in [
            note(100),
            msgs[1].clone(),
            msgs[2].clone(),
            note(300_000),
            msgs[5].clone(),
        ]
        .into_iter()
        .enumerate()
        {
            let got = next();
            assert!(
                got == want,
                "input {i}: {} bytes starting {:?}",
                got.len(),
                &got[..9]
            );
        }
        let zero = sender.join().expect("sender");
        assert_eq!(*landed.lock().expect("lock"), [note(100), note(300_000)]);
        dest.with(|v| {
            assert!(
                v[100..100 + 200_000] == msgs[0][9..],
                "the first landing's bytes"
            );
            assert!(
                v[300_000..600_000] == msgs[4][9..],
                "the second landing's bytes"
            );
            assert!(
                v[..100].iter().all(|&b| b == 0),
                "bytes before it are untouched"
            );
            assert!(
                v[600_000..].iter().all(|&b| b == 0),
                "bytes after it are untouched"
            );
        });
        drop(zero);
    }

    /// The kept vectors: only a large message's, at most `SPARE_KEEP`, handed out empty and
    /// only where they have the room asked for.
    #[test]
    fn spare_vectors_are_kept_within_bounds_and_handed_out_empty() {
        let spare = Spare::default();
        let kept = |s: &Spare| s.0.lock().expect("lock").len();
        spare.give(Vec::with_capacity(100));
        spare.give(Vec::with_capacity(2 * BIG_RESERVE));
        assert_eq!(kept(&spare), 0);
        for _ in 0..SPARE_KEEP + 3 {
            spare.give(vec![7; 300_000]);
        }
        assert_eq!(kept(&spare), SPARE_KEEP);
        let v = spare.take(200_000);
        assert!(v.is_empty() && v.capacity() >= 300_000);
        assert_eq!(kept(&spare), SPARE_KEEP - 1);
        // None of the kept ones has the room: a fresh one, and the kept ones stay.
        let big = spare.take(BIG_RESERVE);
        assert!(big.is_empty() && big.capacity() >= BIG_RESERVE);
        assert_eq!(kept(&spare), SPARE_KEEP - 1);
    }

    /// Messages sent in parts, written straight from them or, once the reader's socket is
    /// full, partly queued, mixed with small whole messages and frames longer than the read
    /// buffer (read straight into their own vector): every one arrives once, whole, in order,
    /// with an I/O thread and inline; a message to itself in parts too.
    #[test]
    fn messages_in_parts_and_large_frames_arrive_whole_and_in_order() {
        let body = |i: usize, len: usize| -> Vec<u8> {
            (0..len).map(|j| (i * 31 + j * 7) as u8).collect()
        };
        // Large ones (READ_STEP is 64 KiB), small ones, and one at the big-frame bound.
        let lens = |i: usize| match i % 4 {
            0 if i.is_multiple_of(8) => 300_000 + i,
            0 => 2 * BIG_RESERVE + 3 + i,
            1 => 12,
            2 => BIG_FRAME + 1,
            _ => 70_000,
        };
        const MSGS: usize = 120;
        for inline in [false, true] {
            let mut m = mesh_io(2, 91 + u64::from(inline), |_| inline);
            let mut one = m.pop().expect("rank 1");
            let mut zero = m.pop().expect("rank 0");
            let sender = thread::spawn(move || {
                let mut shared = Vec::new();
                for i in 0..MSGS {
                    let b = body(i, lens(i));
                    if i % 7 == 6 {
                        // Its first 3 bytes as the head, the rest from a buffer with 10 bytes
                        // before and after them, not copied.
                        let mut held = vec![0xAA; 10];
                        held.extend_from_slice(&b[3..]);
                        held.extend_from_slice(&[0xBB; 10]);
                        let buf = OpBuffer::from_vec(held);
                        zero.send_control_shared(Rank(1), &b[..3], &buf, 10, b.len() - 3);
                        shared.push(buf);
                        if inline {
                            zero.poll_io(Duration::from_millis(1));
                        }
                        continue;
                    }
                    let parts: &[&[u8]] = match i % 5 {
                        0 => &[],
                        1 => &[&b[..5], &b[5..]],
                        2 => &[&b[..1], &b[1..2], &b[2..]],
                        3 => &[&b[..1], &b[1..2], &b[2..3], &b[3..]],
                        _ => &[&b],
                    };
                    if parts.is_empty() {
                        zero.send_control(Rank(1), &b);
                    } else {
                        zero.send_control_parts(Rank(1), parts);
                    }
                    if inline {
                        zero.poll_io(Duration::from_millis(1));
                    }
                }
                while zero.queued(Rank(1)) > 0 {
                    zero.poll_io(Duration::from_millis(10));
                }
                // Every byte written: the mesh let go of every buffer it sent from.
                assert!(
                    shared.iter().all(|b| b.holders() == 1),
                    "a buffer still held"
                );
                zero
            });
            // Rank 1 reads late, so that rank 0's socket fills and its writes go partly
            // through the queue.
            thread::sleep(Duration::from_millis(200));
            let mut buf = Vec::new();
            for i in 0..MSGS {
                let deadline = Instant::now() + Duration::from_secs(30);
                let got = loop {
                    if let Some(got) = one.poll_control(&mut buf) {
                        break got;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "inline {inline}: message {i} lost"
                    );
                    one.poll_io(Duration::from_millis(10));
                };
                let want = body(i, lens(i));
                assert_eq!(
                    got,
                    ControlInput::Message {
                        from: Rank(0),
                        len: want.len()
                    },
                    "inline {inline}: message {i}"
                );
                assert!(buf == want, "inline {inline}: message {i}'s bytes");
            }
            let mut zero = sender.join().expect("sender");
            zero.send_control_parts(Rank(0), &[b"to ", b"myself"]);
            assert_eq!(
                wait(&mut zero, &mut buf),
                ControlInput::Message {
                    from: Rank(0),
                    len: 9
                }
            );
            assert_eq!(buf, b"to myself");
        }
    }

    /// Messages sent from a buffer by reference, mixed with copied ones, while the reader
    /// reads (so that queued frames are partly written when more are queued behind them):
    /// every one arrives once, whole, in order, and the sender lets go of every buffer once
    /// its bytes are written; with an I/O thread and inline. A buffer that no longer holds
    /// the bytes a queued frame refers to shuts the connection down: the reader loses the
    /// peer instead of getting other bytes.
    #[test]
    fn messages_sent_by_reference_arrive_whole_and_in_order() {
        const MSGS: usize = 200;
        let body = |i: usize| -> Vec<u8> {
            let len = 40_000 + (i * 7919) % 300_000;
            (0..len).map(|j| (i * 13 + j * 3) as u8).collect()
        };
        for inline in [false, true] {
            let mut m = mesh_io(2, 95 + u64::from(inline), |_| inline);
            let mut one = m.pop().expect("rank 1");
            let mut zero = m.pop().expect("rank 0");
            let reader = thread::spawn(move || {
                let mut buf = Vec::new();
                for i in 0..MSGS {
                    let deadline = Instant::now() + Duration::from_secs(30);
                    let got = loop {
                        if let Some(ControlInput::Message { len, .. }) = one.poll_control(&mut buf)
                        {
                            break buf[..len].to_vec();
                        }
                        assert!(Instant::now() < deadline, "message {i} lost");
                        one.poll_io(Duration::from_millis(5));
                    };
                    assert!(got == body(i), "inline {inline}: message {i}'s bytes");
                    // A slow reader: the sender's socket fills, and its queue is partly
                    // written when more is queued behind.
                    thread::sleep(Duration::from_micros(500));
                }
                one
            });
            let mut held = Vec::new();
            for i in 0..MSGS {
                let b = body(i);
                if i % 2 == 0 {
                    let buf = OpBuffer::from_vec([&[7u8; 5][..], &b[4..], &[9; 5]].concat());
                    zero.send_control_shared(Rank(1), &b[..4], &buf, 5, b.len() - 4);
                    held.push(buf);
                } else {
                    zero.send_control_parts(Rank(1), &[&b[..10], &b[10..]]);
                }
                if inline {
                    zero.poll_io(Duration::ZERO);
                }
            }
            while zero.queued(Rank(1)) > 0 {
                zero.poll_io(Duration::from_millis(5));
            }
            let mut one = reader.join().expect("reader");
            assert!(held.iter().all(|b| b.holders() == 1), "a buffer still held");
            if !inline {
                // The reader's I/O thread reads whatever comes: nothing stays queued.
                continue;
            }
            // A queued frame whose buffer was emptied meanwhile: the connection goes down.
            let mut stuck = Vec::new();
            for _ in 0..50 {
                let buf = OpBuffer::from_vec(vec![1; 1 << 20]);
                zero.send_control_shared(Rank(1), b"head", &buf, 0, 1 << 20);
                stuck.push(buf);
            }
            assert!(
                zero.queued(Rank(1)) > 0,
                "the reader's socket took 50 MiB unread"
            );
            for b in &stuck {
                b.with(std::mem::take);
            }
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut buf = Vec::new();
            while !one.lost_peers().contains(&Rank(0)) {
                assert!(
                    Instant::now() < deadline,
                    "inline {inline}: the peer never went down"
                );
                zero.poll_io(Duration::from_millis(1));
                one.poll_io(Duration::from_millis(1));
                while one.poll_control(&mut buf).is_some() {}
            }
        }
    }

    /// A link whose first queued frame is partly written when a frame by reference is queued
    /// behind it: the bytes leave in order, each frame whole (the reference's frame keeps
    /// the written part of the one in front).
    #[test]
    fn a_frame_by_reference_queues_behind_a_partly_written_one() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let writer = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (mut reader, _) = l.accept().expect("accept");
        writer.set_nonblocking(true).expect("nonblocking");
        let link = Link::new(writer, Arc::default(), Serve::default());
        let first: Vec<u8> = (0..16 << 20).map(|j: usize| (j / 1021) as u8).collect();
        assert!(link.send(Frame::Owned(first.clone())));
        let queued = link.queued();
        assert!(queued > 0, "the socket took 16 MiB unread");
        // The reader takes some; the queue's first frame is then written on, in part.
        let mut got = vec![0u8; 1 << 20];
        reader.read_exact(&mut got).expect("read");
        link.flush(&mut link.out());
        assert!(
            link.queued() < queued && link.queued() > 0,
            "no partial write"
        );
        let buf = OpBuffer::from_vec((0..300_000).map(|j: usize| (j % 251) as u8).collect());
        assert!(link.send(Frame::Shared {
            head: b"head".to_vec(),
            buf: buf.clone(),
            at: 100,
            len: 200_000,
        }));
        let mut rest = Vec::new();
        reader
            .set_read_timeout(Some(Duration::from_millis(50)))
            .expect("timeout");
        let want = [&first[..], b"head", &buf.to_vec()[100..200_100]].concat();
        let deadline = Instant::now() + Duration::from_secs(30);
        while got.len() + rest.len() < want.len() {
            assert!(Instant::now() < deadline, "bytes lost");
            link.flush(&mut link.out());
            let mut chunk = vec![0u8; 1 << 20];
            if let Ok(n) = reader.read(&mut chunk) {
                rest.extend_from_slice(&chunk[..n]);
            }
        }
        got.extend_from_slice(&rest);
        assert!(got == want, "the bytes left out of order");
        assert_eq!(buf.holders(), 1, "the link still holds the buffer");
    }

    /// `make_inline` takes the I/O thread's connections over while a peer streams frames at
    /// it: every frame, sent before, during or after the hand-over, arrives once, whole and in
    /// order; the mesh then waits through `IoWait`; the peer's loss is still reported; a
    /// second call changes nothing.
    #[test]
    fn make_inline_takes_the_connections_over_mid_stream() {
        const N: u32 = 600;
        let frame_of = |i: u32| {
            let len = 4 + (i as usize * 7919) % 90_000;
            let mut f = vec![(i % 251) as u8; len];
            f[..4].copy_from_slice(&i.to_be_bytes());
            f
        };
        let mut m = mesh(2, 93);
        let mut one = m.pop().expect("rank 1");
        let mut zero = m.pop().expect("rank 0");
        assert!(zero.io_wait().is_none(), "an I/O thread's mesh");
        let (go, started) = mpsc::channel();
        let sender = thread::spawn(move || {
            for i in 0..N {
                one.send_control(Rank(0), &frame_of(i));
                if i == 10 {
                    let _ = go.send(());
                }
            }
            one
        });
        let mut buf = Vec::new();
        // The I/O thread has read at least the first frame, and more keep coming.
        let ControlInput::Message { len, .. } = wait(&mut zero, &mut buf) else {
            panic!("a message");
        };
        assert_eq!(buf[..len], frame_of(0)[..]);
        started.recv().expect("sender running");
        zero.make_inline();
        let w = zero.io_wait().expect("inline after the hand-over");
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut next = 1;
        while next < N {
            assert!(Instant::now() < deadline, "frame {next} never came");
            match zero.poll_control(&mut buf) {
                Some(ControlInput::Message { from, len }) => {
                    assert_eq!(from, Rank(1));
                    assert!(buf[..len] == frame_of(next)[..], "frame {next}");
                    next += 1;
                }
                Some(other) => panic!("{other:?}"),
                None => w.wait(Duration::from_millis(100)),
            }
        }
        let one = sender.join().expect("sender");
        zero.make_inline();
        assert!(zero.io_wait().is_some());
        drop(one);
        while zero.take_lost().is_none() {
            assert!(Instant::now() < deadline, "loss not seen");
            zero.poll_io(Duration::from_millis(100));
        }
        assert!(zero.poll_control(&mut buf).is_none());
    }

    /// Limits set on an inline mesh hold from then on: a frame longer than the new limit ends
    /// the connection as malformed, and a read longer than it is refused. A mesh with an I/O
    /// thread keeps the limits it was connected with.
    #[test]
    fn limits_set_on_an_inline_mesh_hold_from_then_on() {
        let mut m = mesh_io(2, 95, |r| r == 0);
        let mut one = m.pop().expect("rank 1");
        let mut zero = m.pop().expect("rank 0");
        assert!(!one.set_limits(100, 0), "an I/O thread's mesh");
        assert!(zero.set_limits(100, 0));
        assert_eq!(zero.max_read(), 0);
        let mut buf = Vec::new();
        // A read from rank 0's buffer, now longer than it serves: refused.
        zero.registry().register(OpId(4), OpBuffer::zeroed(64));
        one.read(&req(1, 0, 4, 0, 8));
        let deadline = Instant::now() + Duration::from_secs(10);
        let got = loop {
            zero.poll_io(Duration::from_millis(10));
            while zero.poll_control(&mut buf).is_some() {}
            if let Some(i) = one.poll_control(&mut buf) {
                break i;
            }
            assert!(Instant::now() < deadline, "no answer");
        };
        assert!(
            matches!(got, ControlInput::ReadDone { result: Err(_), .. }),
            "{got:?}"
        );
        // A frame within the old limit and beyond the new one: the connection ends.
        one.send_control(Rank(0), &[7; 200]);
        while zero.take_lost().is_none() {
            assert!(Instant::now() < deadline, "loss not seen");
            zero.poll_io(Duration::from_millis(10));
        }
        assert_eq!(zero.stats().malformed.load(Ordering::Relaxed), 1);
    }

    /// Messages put back come out first, in the order given, then what arrived after them.
    #[test]
    fn unread_messages_come_back_first_and_in_order() {
        let mut m = mesh(3, 41);
        let mut two = m.pop().expect("rank 2");
        let mut one = m.pop().expect("rank 1");
        let mut zero = m.pop().expect("rank 0");
        let mut buf = Vec::new();
        zero.send_control(Rank(2), b"a");
        one.send_control(Rank(2), b"b");
        let mut taken = Vec::new();
        for _ in 0..2 {
            let ControlInput::Message { from, len } = wait(&mut two, &mut buf) else {
                panic!("a message");
            };
            taken.push((from, buf[..len].to_vec()));
        }
        taken.sort();
        zero.send_control(Rank(2), b"c");
        // Let "c" reach the owner's queue before the others go back in front of it.
        let deadline = Instant::now() + Duration::from_secs(10);
        while two.ready.is_empty() {
            two.drain_inbound();
            assert!(Instant::now() < deadline, "c never arrived");
            thread::sleep(Duration::from_millis(1));
        }
        two.unread(taken);
        let mut got = Vec::new();
        for _ in 0..3 {
            let ControlInput::Message { from, len } = wait(&mut two, &mut buf) else {
                panic!("a message");
            };
            got.push((from.0, buf[..len].to_vec()));
        }
        assert_eq!(
            got,
            vec![(0, b"a".to_vec()), (1, b"b".to_vec()), (0, b"c".to_vec())]
        );
        assert!(two.poll_control(&mut buf).is_none());
    }

    #[test]
    fn a_clean_close_flushes_and_says_goodbye() {
        let mut m = mesh(3, 78);
        let mut leaving = m.pop().expect("rank 2");
        leaving.send_control(Rank(0), b"last words");
        leaving.close(7, Duration::from_secs(2));
        let mut buf = Vec::new();
        assert_eq!(
            wait(&mut m[0], &mut buf),
            ControlInput::Message {
                from: Rank(2),
                len: 10
            }
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        for c in m.iter_mut() {
            let lost = loop {
                if let Some(l) = c.take_lost() {
                    break l;
                }
                assert!(Instant::now() < deadline, "loss not seen");
                thread::sleep(Duration::from_millis(1));
            };
            assert_eq!(lost, PeerLost(Rank(2)));
            assert_eq!(c.departed(Rank(2)), Some(7));
            assert_eq!(c.departed(Rank(0)), None);
            assert_eq!(c.departed_blaming(Rank(2)), None);
        }
    }

    /// A linger of `Duration::MAX` is no deadline: the close flushes and returns (it used to
    /// panic adding the linger to the clock).
    #[test]
    fn a_close_without_a_deadline_flushes_and_returns() {
        let mut m = mesh(2, 94);
        let mut leaving = m.pop().expect("rank 1");
        leaving.send_control(Rank(0), b"still said");
        leaving.close(5, Duration::MAX);
        let mut buf = Vec::new();
        assert!(matches!(
            wait(&mut m[0], &mut buf),
            ControlInput::Message { from: Rank(1), .. }
        ));
    }

    /// A peer's last messages and its loss reach the owner's queue together when the loss
    /// is looked for between two polls: the loss is told only after the messages are handed
    /// out, so that what they carry is never taken for missing.
    #[test]
    fn a_loss_is_told_after_the_messages_sent_before_it() {
        let mut m = mesh(2, 84);
        let mut leaving = m.pop().expect("rank 1");
        let mut staying = m.pop().expect("rank 0");
        leaving.send_control(Rank(0), b"the last piece");
        leaving.close(3, Duration::from_secs(2));
        let deadline = Instant::now() + Duration::from_secs(10);
        // Looked for before anything was polled: the drain queues the message and the loss.
        while staying.lost_peers().is_empty() {
            assert_eq!(staying.take_lost(), None, "told before the message");
            assert!(Instant::now() < deadline, "loss not seen");
            thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(staying.take_lost(), None, "told before the message");
        let mut buf = Vec::new();
        assert_eq!(
            staying.poll_control(&mut buf),
            Some(ControlInput::Message {
                from: Rank(1),
                len: 14
            })
        );
        assert_eq!(&buf[..14], b"the last piece");
        assert_eq!(staying.take_lost(), Some(PeerLost(Rank(1))));
        assert_eq!(staying.departed(Rank(1)), Some(3));
    }

    /// Sends to `to` until a send finds its connection shut (the peer reset it, or the I/O
    /// side ended it), by `deadline`.
    fn send_until_shut(m: &mut TcpControl, to: Rank, deadline: Instant) {
        while m.stats().messages_to_lost_peer.load(Ordering::Relaxed) == 0 {
            m.send_control(to, b"still there?");
            assert!(
                Instant::now() < deadline,
                "no send found the connection shut"
            );
            thread::sleep(Duration::from_millis(1));
        }
    }

    /// A peer that answered a read and left: a send that finds the connection shut does not
    /// fail the read for the loss, the answer completes it, and the loss is told after.
    #[test]
    fn a_read_answered_before_the_peer_left_completes_when_a_send_finds_it_gone() {
        let mut m = mesh(2, 86);
        let leaving = m.pop().expect("rank 1");
        let mut staying = m.pop().expect("rank 0");
        let src: Vec<u8> = (0..64u8).collect();
        leaving
            .registry()
            .register(OpId(3), OpBuffer::from_vec(src.clone()));
        let dst = OpBuffer::zeroed(64);
        staying.registry().register(OpId(3), dst.clone());
        staying.read(&req(1, 1, 3, 8, 16));
        let deadline = Instant::now() + Duration::from_secs(10);
        while leaving.stats().reads_served.load(Ordering::Relaxed) == 0 {
            assert!(Instant::now() < deadline, "the read was not served");
            thread::sleep(Duration::from_millis(1));
        }
        leaving.close(4, Duration::from_secs(2));
        // Nothing polled: sends go out until one finds the connection shut.
        send_until_shut(&mut staying, Rank(1), deadline);
        let mut buf = Vec::new();
        assert_eq!(
            wait(&mut staying, &mut buf),
            ControlInput::ReadDone {
                id: ReadId(1),
                result: Ok(())
            }
        );
        assert_eq!(dst.to_vec()[8..24], src[8..24]);
        while staying.lost_peers().is_empty() {
            assert!(staying.poll_control(&mut buf).is_none());
            assert!(Instant::now() < deadline, "loss not seen");
            thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(staying.take_lost(), Some(PeerLost(Rank(1))));
        assert_eq!(staying.departed(Rank(1)), Some(4));
    }

    /// The same when the I/O thread is slow to read (here: stuck serving a read from a
    /// buffer another thread holds) and the owner's own write found the connection reset:
    /// the peer's last message and its goodbye come first, then its loss (it was told at
    /// once, with no goodbye: a clean departure taken for a crash). Found by an audit.
    #[test]
    fn a_loss_a_failed_write_finds_waits_for_what_the_io_thread_still_reads() {
        let mut m = mesh(2, 88);
        let mut leaving = m.pop().expect("rank 1");
        let mut staying = m.pop().expect("rank 0");
        let held = OpBuffer::zeroed(64);
        staying.registry().register(OpId(5), held.clone());
        let (locked_tx, locked_rx) = mpsc::channel();
        let (release_tx, release_rx) = mpsc::channel::<()>();
        let holder = thread::spawn(move || {
            held.with(|_| {
                locked_tx.send(()).expect("locked");
                let _ = release_rx.recv();
            })
        });
        locked_rx.recv().expect("locked");
        // The staying rank's I/O thread blocks serving this read; what follows it on the
        // connection waits in its buffer or the socket.
        leaving.read(&req(1, 0, 5, 0, 8));
        leaving.send_control(Rank(0), b"the last word");
        leaving.close(7, Duration::from_secs(2));
        let deadline = Instant::now() + Duration::from_secs(10);
        send_until_shut(&mut staying, Rank(1), deadline);
        let told = staying.take_lost();
        release_tx.send(()).expect("release");
        holder.join().expect("holder");
        assert_eq!(told, None, "the loss was told before the last message");
        let mut buf = Vec::new();
        assert_eq!(
            wait(&mut staying, &mut buf),
            ControlInput::Message {
                from: Rank(1),
                len: 13
            }
        );
        while staying.lost_peers().is_empty() {
            let _ = staying.poll_control(&mut buf);
            assert!(Instant::now() < deadline, "loss not seen");
            thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(staying.take_lost(), Some(PeerLost(Rank(1))));
        assert_eq!(staying.departed(Rank(1)), Some(7));
    }

    /// A goodbye that names the rank it leaves over: every peer learns the mark and the name.
    #[test]
    fn a_goodbye_names_the_rank_it_blames() {
        let mut m = mesh(3, 82);
        let leaving = m.pop().expect("rank 2");
        leaving.close_blaming(9, Some(Rank(1)), Duration::from_secs(2));
        let deadline = Instant::now() + Duration::from_secs(10);
        for c in m.iter_mut() {
            while c.take_lost().is_none() {
                assert!(Instant::now() < deadline, "loss not seen");
                thread::sleep(Duration::from_millis(1));
            }
            assert_eq!(c.departed(Rank(2)), Some(9));
            assert_eq!(c.departed_blaming(Rank(2)), Some(Rank(1)));
        }
    }

    /// A frame and the connection's end often arrive together (one readiness event): the
    /// frame is handed over and the peer counted lost, every time, although the I/O thread
    /// stops reading at a short read when the event reports no hang-up.
    #[test]
    fn a_frame_and_the_close_behind_it_are_both_seen() {
        let mut buf = Vec::new();
        for round in 0..30u64 {
            let mut m = mesh(2, 900 + round);
            let mut leaving = m.pop().expect("rank 1");
            let mut staying = m.pop().expect("rank 0");
            leaving.send_control(Rank(0), b"bye now");
            drop(leaving);
            assert_eq!(
                wait(&mut staying, &mut buf),
                ControlInput::Message {
                    from: Rank(1),
                    len: 7
                },
                "round {round}"
            );
            let deadline = Instant::now() + Duration::from_secs(10);
            while staying.take_lost().is_none() {
                assert!(Instant::now() < deadline, "round {round}: loss not seen");
                thread::sleep(Duration::from_millis(1));
            }
        }
    }

    #[test]
    fn strays_are_refused_and_the_mesh_still_forms() {
        let l0 = TcpListener::bind("127.0.0.1:0").expect("bind");
        let l1 = TcpListener::bind("127.0.0.1:0").expect("bind");
        let table = vec![l0.local_addr().expect("a"), l1.local_addr().expect("a")];
        // Before rank 1: a client of another job, and one that says nothing.
        let mut other_job = TcpStream::connect(table[0]).expect("connect");
        other_job.write_all(&hello(99, 1)).expect("hello");
        let _silent = TcpStream::connect(table[0]).expect("connect");
        let t0 = {
            let table = table.clone();
            thread::spawn(move || {
                TcpControl::connect(0, &table, l0, Registry::default(), ControlConfig::new(5))
            })
        };
        let c1 = TcpControl::connect(1, &table, l1, Registry::default(), ControlConfig::new(5));
        let mut c0 = t0.join().expect("join").expect("rank 0");
        let mut c1 = c1.expect("rank 1");
        c1.send_control(Rank(0), b"x");
        let mut buf = Vec::new();
        assert_eq!(
            wait(&mut c0, &mut buf),
            ControlInput::Message {
                from: Rank(1),
                len: 1
            }
        );
        // The stray of another job got no hello back: its connection was closed.
        let mut b = [0u8; 1];
        assert!(matches!(other_job.read(&mut b), Ok(0) | Err(_)));
    }

    /// A start-up blocked on a peer that never comes (rank 0 waiting to accept rank 1), or
    /// on one whose listener never answers (rank 1 connected, waiting for rank 0's hello),
    /// ends with `Cancelled` once another thread sets the flag, long before its minute of
    /// connect timeout.
    #[test]
    fn a_start_up_waiting_on_a_silent_peer_ends_when_cancelled() {
        for me in [0u32, 1] {
            let l0 = TcpListener::bind("127.0.0.1:0").expect("bind");
            let l1 = TcpListener::bind("127.0.0.1:0").expect("bind");
            let table = vec![l0.local_addr().expect("a"), l1.local_addr().expect("a")];
            // The other rank's listener stays bound and never accepts nor says hello.
            let (mine, _silent) = if me == 0 { (l0, l1) } else { (l1, l0) };
            let mut cfg = ControlConfig::new(7);
            cfg.connect_timeout = Duration::from_secs(60);
            let cancel = Arc::new(AtomicBool::new(false));
            let t = {
                let cancel = Arc::clone(&cancel);
                thread::spawn(move || {
                    TcpControl::connect_or_cancel(
                        me,
                        &table,
                        mine,
                        Registry::default(),
                        cfg,
                        &cancel,
                    )
                })
            };
            thread::sleep(Duration::from_millis(300));
            assert!(!t.is_finished(), "rank {me}: the start-up did not wait");
            cancel.store(true, Ordering::Relaxed);
            let r = t.join().expect("join");
            assert!(
                matches!(r, Err(ControlError::Cancelled)),
                "rank {me}: {:?}",
                r.err()
            );
        }
    }

    /// Rank 1 connects to rank 0, whose listener is gone (closed: its process exited) or
    /// that closes the connection before its hello. With every listener known bound (a
    /// rendezvous's table), rank 1 fails at once naming rank 0; without, a refused
    /// connection is retried (rank 0 may not have started yet) until the connect timeout.
    #[test]
    fn a_peer_gone_during_the_start_up_is_named_at_once() {
        // Rank 1's start-up toward rank 0 at `at`.
        let start = |at: SocketAddr, listening: bool, timeout: Duration| {
            let l1 = TcpListener::bind("127.0.0.1:0").expect("bind");
            let table = vec![at, l1.local_addr().expect("a")];
            let mut cfg = ControlConfig::new(7);
            cfg.connect_timeout = timeout;
            cfg.listeners_bound = listening;
            move || TcpControl::connect(1, &table, l1, Registry::default(), cfg)
        };
        // An address whose listener is closed.
        let closed = || {
            let ([l0], table) = bound::<1>();
            drop(l0);
            table[0]
        };
        let run = start(closed(), true, Duration::from_secs(60));
        let t = Instant::now();
        match run() {
            Err(ControlError::PeerGone {
                peer: 0, source, ..
            }) => {
                assert_eq!(source.kind(), io::ErrorKind::ConnectionRefused);
                assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
            }
            r => panic!("{:?}", r.err()),
        }
        let run = start(closed(), false, Duration::from_millis(300));
        assert!(matches!(run(), Err(ControlError::Timeout(_, 0))));
        // Accepted, then closed before the hello.
        let ([l0], table) = bound::<1>();
        let run = start(table[0], true, Duration::from_secs(60));
        let closer = thread::spawn(move || {
            let (s, _) = l0.accept().expect("accept");
            drop(s);
        });
        let r = run();
        closer.join().expect("join");
        match r {
            Err(e @ ControlError::PeerGone { peer: 0, .. }) => {
                let msg = e.to_string();
                assert!(msg.contains("rank 0") && msg.contains("is gone"), "{msg}");
            }
            r => panic!("{:?}", r.err()),
        }
    }

    /// `N` listeners on loopback, and their addresses: a rank table.
    fn bound<const N: usize>() -> ([TcpListener; N], Vec<SocketAddr>) {
        let ls = std::array::from_fn(|_| TcpListener::bind("127.0.0.1:0").expect("bind"));
        let table = ls.iter().map(|l| l.local_addr().expect("addr")).collect();
        (ls, table)
    }

    /// Reads a hello frame from `s`; the rank it names.
    fn read_hello(s: &mut TcpStream, nonce: u64) -> u32 {
        let mut buf = Vec::new();
        assert!(read_frame(s, HELLO_LEN, &mut buf).expect("hello"));
        check_hello(&buf, nonce).expect("a hello")
    }

    /// A start-up that fails over a rank tells the others which: rank 1, whose connection
    /// to rank 0 closes before rank 0's hello, answers rank 2 (waiting in its backlog) with a
    /// goodbye naming rank 0, and rank 2 names rank 0 too, not rank 1, which only left.
    #[test]
    fn a_start_up_that_fails_names_its_culprit_to_those_waiting_on_it() {
        let nonce = 7;
        let ([l0, l1, l2], table) = bound();
        let mut cfg = ControlConfig::new(nonce);
        cfg.connect_timeout = Duration::from_secs(60);
        cfg.listeners_bound = true;
        // Rank 0, played by hand: it answers rank 2, then drops rank 1 unanswered once rank 2
        // waits in rank 1's backlog.
        let fake = thread::spawn(move || {
            let mut held = Vec::new();
            while held.len() < 2 {
                let (mut s, _) = l0.accept().expect("accept");
                let r = read_hello(&mut s, nonce);
                if r == 2 {
                    s.write_all(&hello(nonce, 0)).expect("hello");
                }
                held.push((r, s));
            }
            thread::sleep(Duration::from_millis(300));
            held.retain(|(r, _)| *r == 2);
            held
        });
        let run = |me: u32, l: TcpListener| {
            let table = table.clone();
            thread::spawn(move || TcpControl::connect(me, &table, l, Registry::default(), cfg))
        };
        let (r1, r2) = (run(1, l1), run(2, l2));
        let t = Instant::now();
        for (me, r) in [(1, r1), (2, r2)] {
            match r.join().expect("join") {
                Err(ControlError::PeerGone { peer: 0, .. }) => {}
                other => panic!("rank {me}: {:?}", other.err()),
            }
        }
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
        drop(fake.join().expect("join"));
    }

    /// A start-up that fails while holding many connections whose peers neither read nor
    /// close (20 of them here) says its goodbyes and leaves within one short wait, not one
    /// per connection.
    #[test]
    fn a_failed_start_up_leaves_many_connections_at_once() {
        let nonce = 5;
        let n = 22;
        let ls: Vec<TcpListener> = (0..n)
            .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind"))
            .collect();
        let table: Vec<SocketAddr> = ls.iter().map(|l| l.local_addr().expect("a")).collect();
        let mut ls = ls.into_iter();
        // Ranks 0..20 answer the hello and hold on; rank 20's listener is gone.
        let mut held = Vec::new();
        for r in 0..n - 2 {
            let l = ls.next().expect("listener");
            held.push(thread::spawn(move || {
                let (mut s, _) = l.accept().expect("accept");
                let _ = read_hello(&mut s, nonce);
                s.write_all(&hello(nonce, r as u32)).expect("hello");
                thread::sleep(Duration::from_secs(3));
                drop(s);
            }));
        }
        drop(ls.next());
        let mine = ls.next().expect("listener");
        let mut cfg = ControlConfig::new(nonce);
        cfg.connect_timeout = Duration::from_secs(60);
        cfg.listeners_bound = true;
        let t = Instant::now();
        let r = TcpControl::connect((n - 1) as u32, &table, mine, Registry::default(), cfg);
        let took = t.elapsed();
        assert!(matches!(r, Err(ControlError::PeerGone { peer, .. }) if peer as usize == n - 2));
        assert!(took < Duration::from_secs(1), "{took:?}");
        for h in held {
            h.join().expect("join");
        }
    }

    /// Rank 0 of a 3-rank table starting up (60 s connect timeout) on its thread, and rank 1
    /// played by hand: connected, hello said and answered. The listeners of ranks 1 and 2
    /// stay bound (nobody connects to them).
    #[allow(clippy::type_complexity)]
    fn rank0_with_rank1_by_hand(
        nonce: u64,
    ) -> (
        thread::JoinHandle<Result<TcpControl, ControlError>>,
        TcpStream,
        Vec<SocketAddr>,
        [TcpListener; 2],
    ) {
        let ([l0, l1, l2], table) = bound();
        let mut cfg = ControlConfig::new(nonce);
        cfg.connect_timeout = Duration::from_secs(60);
        let t0 = {
            let table = table.clone();
            thread::spawn(move || TcpControl::connect(0, &table, l0, Registry::default(), cfg))
        };
        let mut one = TcpStream::connect(table[0]).expect("connect");
        one.write_all(&hello(nonce, 1)).expect("hello");
        assert_eq!(read_hello(&mut one, nonce), 0);
        (t0, one, table, [l1, l2])
    }

    /// A peer that finished its start-up and leaves with an ordinary goodbye (its operations
    /// done: an application that drops its communicator at once) does not fail a start-up
    /// still waiting for another rank: that one completes, and the mesh hears the departure.
    #[test]
    fn a_peer_that_finished_and_left_does_not_fail_a_start_up() {
        let nonce = 11;
        let (t0, mut one, table, listeners) = rank0_with_rank1_by_hand(nonce);
        one.write_all(&bye_frame(7, Some(2))).expect("bye");
        // Longer than a look's interval: rank 0 has seen it.
        thread::sleep(Duration::from_millis(200));
        let mut two = TcpStream::connect(table[0]).expect("connect");
        two.write_all(&hello(nonce, 2)).expect("hello");
        assert_eq!(read_hello(&mut two, nonce), 0);
        let mesh = t0.join().expect("join").expect("the start-up completes");
        drop((mesh, one, two, listeners));
    }

    /// What a start-up's goodbye makes of the start-up that hears it: the rank it names is
    /// gone, or was waited for in vain; one naming the hearer itself (or no rank) blames the
    /// rank that sent it, which gave up waiting.
    #[test]
    fn a_start_up_s_goodbye_names_the_right_rank() {
        let table: Vec<SocketAddr> = (0..3)
            .map(|p| SocketAddr::from(([127, 0, 0, 1], 4000 + p)))
            .collect();
        let cfg = ControlConfig::new(1);
        let said = |mark, blamed| Goodbye { mark, blamed }.error(0, 1, &cfg, &table);
        assert!(matches!(
            said(START_GONE, 2),
            ControlError::PeerGone { peer: 2, .. }
        ));
        assert!(matches!(
            said(START_TIMED_OUT, 2),
            ControlError::Timeout(_, 2)
        ));
        for blamed in [0, 7] {
            let e = said(START_GONE, blamed);
            assert!(matches!(e, ControlError::PeerGone { peer: 1, .. }), "{e:?}");
            assert!(
                e.to_string().contains("gave up its start-up waiting"),
                "{e}"
            );
        }
        let bye = bye_frame(START_TIMED_OUT, Some(2));
        assert_eq!(
            goodbye(&bye[4..]),
            Some(Goodbye {
                mark: START_TIMED_OUT,
                blamed: 2
            })
        );
        assert_eq!(goodbye(&bye[4..bye.len() - 4]), None);
    }

    /// Rank 0 waits to accept ranks 1 and 2. Rank 1 (by hand) says hello, then leaves: with
    /// a goodbye naming rank 2 (its own start-up failed over it) behind a message of its
    /// check, with a plain goodbye, behind a message of its check without a word (its
    /// process died after sending it), or without a word. Rank 0 fails at once naming rank
    /// 2, or rank 1, instead of waiting out the connect timeout (a minute).
    #[test]
    fn a_start_up_waiting_to_accept_sees_a_connected_peer_leave() {
        let report = || {
            let mut f = frame(KIND_MESSAGE, 3);
            f.extend_from_slice(&[0xF0, 1, 2]);
            f
        };
        for (case, said, want) in [
            (
                "a goodbye naming 2",
                [report(), bye_frame(START_GONE, Some(2))].concat(),
                2,
            ),
            ("a plain goodbye", bye_frame(START_GONE, None), 1),
            ("its report, then nothing", report(), 1),
            ("nothing", Vec::new(), 1),
        ] {
            let (t0, mut s, _, listeners) = rank0_with_rank1_by_hand(9);
            thread::sleep(Duration::from_millis(200));
            if !said.is_empty() {
                s.write_all(&said).expect("write");
                // Longer than a look's interval: rank 0 has looked past it.
                thread::sleep(Duration::from_millis(200));
            }
            let t = Instant::now();
            drop(s);
            match t0.join().expect("join") {
                Err(ControlError::PeerGone { peer, .. }) if peer == want => {}
                other => panic!("{case}: {:?}", other.err()),
            }
            assert!(
                t.elapsed() < Duration::from_secs(10),
                "{case}: {:?}",
                t.elapsed()
            );
            drop(listeners);
        }
    }

    #[test]
    fn malformed_frame_closes_the_connection() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let l2 = TcpListener::bind("127.0.0.1:0").expect("bind");
        let table = vec![l.local_addr().expect("a"), l2.local_addr().expect("a")];
        let addr0 = table[0];
        let t = thread::spawn(move || {
            TcpControl::connect(0, &table, l, Registry::default(), ControlConfig::new(3))
                .expect("connect")
        });
        // Play rank 1 by hand.
        drop(l2);
        let mut s = TcpStream::connect(addr0).expect("connect");
        s.write_all(&hello(3, 1)).expect("hello");
        let mut buf = Vec::new();
        assert!(read_frame(&mut s, 64, &mut buf).expect("reply"));
        let mut c = t.join().expect("join");
        // A frame far longer than allowed.
        s.write_all(&u32::MAX.to_be_bytes()).expect("write");
        let deadline = Instant::now() + Duration::from_secs(10);
        while c.take_lost().is_none() {
            assert!(Instant::now() < deadline, "loss not seen");
            thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(c.stats().malformed.load(Ordering::Relaxed), 1);
    }

    /// Rank 0 of a two-rank mesh connected with `cfg`, and a connection to it on which the
    /// test plays rank 1 by hand (the hellos exchanged).
    fn mesh_with_hand_peer(cfg: ControlConfig) -> (TcpControl, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let l2 = TcpListener::bind("127.0.0.1:0").expect("bind");
        let table = vec![l.local_addr().expect("a"), l2.local_addr().expect("a")];
        let addr0 = table[0];
        let t = thread::spawn(move || {
            TcpControl::connect(0, &table, l, Registry::default(), cfg).expect("connect")
        });
        drop(l2);
        let mut s = TcpStream::connect(addr0).expect("connect");
        s.write_all(&hello(cfg.nonce, 1)).expect("hello");
        let mut buf = Vec::new();
        assert!(read_frame(&mut s, 64, &mut buf).expect("reply"));
        (t.join().expect("join"), s)
    }

    /// Limits past what a frame's 32-bit length can say are taken as the most it can: the
    /// longest answer and message then have lengths that fit their header exactly (a 4 GiB
    /// read's length wrapped, and its bytes were taken for frames).
    #[test]
    fn limits_beyond_a_frame_s_length_are_taken_as_its_most() {
        let cfg = ControlConfig {
            max_read: u64::MAX,
            max_message: usize::MAX,
            ..ControlConfig::new(1)
        }
        .framable();
        assert_eq!(
            (cfg.max_read, cfg.max_message),
            (MAX_FRAME_READ, MAX_FRAME_MESSAGE)
        );
        for kind in [KIND_READ_RESP, KIND_MESSAGE] {
            assert_eq!(cfg.frame_limit(kind), u32::MAX as usize, "kind {kind}");
        }
        let small = ControlConfig::new(1);
        assert_eq!(small.framable(), small);
        let mut m = mesh_io(2, 33, |r| r == 0);
        assert!(m[0].set_limits(usize::MAX, u64::MAX));
        assert_eq!(m[0].max_read.load(Ordering::Relaxed), MAX_FRAME_READ);
    }

    /// A peer that keeps asking and never reads costs at most [`MAX_DEFERRED_READS`] waiting
    /// requests: past them its connection is closed as malformed and it counts as lost (the
    /// requests cost 32 bytes each for the 33 the peer sends: without the bound, memory grows
    /// as long as it keeps sending).
    #[test]
    fn a_peer_that_asks_and_never_reads_is_cut_off() {
        const LEN: u64 = 4 << 20;
        let cfg = ControlConfig {
            max_read: LEN,
            ..ControlConfig::new(32)
        };
        let (mut c, mut s) = mesh_with_hand_peer(cfg);
        c.registry()
            .register(OpId(3), OpBuffer::zeroed(LEN as usize));
        // Eight whole-buffer reads fill the socket and the queue past SERVE_QUEUE; the tiny
        // ones after them wait.
        let reads = 8 + MAX_DEFERRED_READS as u64 + 1000;
        let mut asks = Vec::with_capacity(reads as usize * READ_REQ_LEN + 4);
        for i in 0..reads {
            asks.extend(frame(KIND_READ_REQ, READ_REQ_LEN - 1));
            for v in [i, 3, 0, if i < 8 { LEN } else { 1 }] {
                asks.extend_from_slice(&v.to_be_bytes());
            }
        }
        // Written until rank 0 closes the connection, unread meanwhile.
        let writer = thread::spawn(move || {
            let _ = s.write_all(&asks);
            s
        });
        let deadline = Instant::now() + Duration::from_secs(60);
        while c.take_lost().is_none() {
            assert!(Instant::now() < deadline, "the peer was never cut off");
            thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(c.stats().malformed.load(Ordering::Relaxed), 1);
        let deferred = c.stats().reads_deferred.load(Ordering::Relaxed);
        // (Some of the whole-buffer reads may have waited too, and been answered since.)
        let most = MAX_DEFERRED_READS as u64;
        assert!(
            (most..=most + 8).contains(&deferred),
            "{deferred} reads waited"
        );
        drop(writer.join().expect("writer"));
    }

    /// A frame longer than its kind allows ends the connection as soon as its length and kind
    /// are in: nothing of its body is waited for (each frame here is within what another kind
    /// may carry, and none of its body is ever sent). A message as long as the mesh allows
    /// gets through.
    #[test]
    fn a_frame_too_long_for_its_kind_ends_the_connection_from_its_header() {
        let cfg = ControlConfig {
            max_message: 1000,
            max_read: 4096,
            ..ControlConfig::new(31)
        };
        let heads: [(usize, u8); 6] = [
            (1002, KIND_MESSAGE),
            (READ_REQ_LEN + 1, KIND_READ_REQ),
            (4096 + 10, KIND_READ_RESP),
            (100, KIND_READ_REFUSED),
            (14, KIND_BYE),
            (HELLO_LEN, KIND_HELLO),
        ];
        for (len, kind) in heads {
            let (mut c, mut s) = mesh_with_hand_peer(cfg);
            let mut head = (len as u32).to_be_bytes().to_vec();
            head.push(kind);
            s.write_all(&head).expect("write");
            let deadline = Instant::now() + Duration::from_secs(10);
            while c.take_lost().is_none() {
                assert!(
                    Instant::now() < deadline,
                    "a frame of {len} bytes of kind {kind} was waited for"
                );
                thread::sleep(Duration::from_millis(1));
            }
            assert_eq!(
                c.stats().malformed.load(Ordering::Relaxed),
                1,
                "kind {kind}"
            );
        }
        // The longest message allowed.
        let (mut c, mut s) = mesh_with_hand_peer(cfg);
        let mut f = frame(KIND_MESSAGE, 1000);
        f.extend_from_slice(&[9; 1000]);
        s.write_all(&f).expect("write");
        let mut buf = Vec::new();
        let got = wait(&mut c, &mut buf);
        assert!(
            matches!(
                got,
                ControlInput::Message {
                    from: Rank(1),
                    len: 1000
                }
            ),
            "{got:?}"
        );
        assert_eq!(buf, [9; 1000]);
        assert!(c.take_lost().is_none());
    }

    /// A message longer than the mesh carries is not sent, by any of the three ways to send
    /// one, and is counted; the connection stays up and carries the next one.
    #[test]
    fn a_message_longer_than_the_mesh_carries_is_counted_not_sent() {
        let mut m = mesh(2, 33);
        let mut one = m.pop().expect("rank 1");
        let mut zero = m.pop().expect("rank 0");
        let max = zero.cfg.max_message;
        let long = vec![5u8; max + 1];
        zero.send_control(Rank(1), &long);
        zero.send_control_parts(Rank(1), &[&long[..10], &long[10..]]);
        let b = OpBuffer::zeroed(max);
        zero.send_control_shared(Rank(1), &[1, 2], &b, 0, max - 1);
        assert_eq!(zero.stats().messages_too_long.load(Ordering::Relaxed), 3);
        assert_eq!(zero.stats().messages_sent.load(Ordering::Relaxed), 0);
        zero.send_control(Rank(1), &[6; 16]);
        let mut buf = Vec::new();
        let got = wait(&mut one, &mut buf);
        assert!(
            matches!(
                got,
                ControlInput::Message {
                    from: Rank(0),
                    len: 16
                }
            ),
            "{got:?}"
        );
        assert!(one.take_lost().is_none() && zero.take_lost().is_none());
    }

    /// A read answered (or refused) by a rank it was not asked of is not taken: the bytes
    /// stay out of the buffer, the read stays pending, and the answer of the rank asked
    /// completes it.
    #[test]
    fn a_read_is_answered_only_by_the_rank_it_was_asked_of() {
        // Rank 2 does its own I/O and is not polled: it answers only when the test says.
        let mut m = mesh_io(3, 97, |r| r == 2);
        let mut buf = Vec::new();
        let dst = OpBuffer::zeroed(16);
        m[0].registry().register(OpId(5), dst.clone());
        m[2].registry()
            .register(OpId(5), OpBuffer::from_vec(vec![0xAA; 16]));
        m[0].read(&req(7, 2, 5, 0, 16));
        // Rank 1 answers first, with the right length, then refuses it.
        let mut forged = frame(KIND_READ_RESP, 8 + 16);
        forged.extend_from_slice(&7u64.to_be_bytes());
        forged.extend_from_slice(&[0xEE; 16]);
        let mut refusal = frame(KIND_READ_REFUSED, 8);
        refusal.extend_from_slice(&7u64.to_be_bytes());
        assert!(m[1].queue(Rank(0), Frame::Owned(forged)));
        assert!(m[1].queue(Rank(0), Frame::Owned(refusal)));
        let deadline = Instant::now() + Duration::from_secs(10);
        while m[0].stats().stray_responses.load(Ordering::Relaxed) < 2 {
            assert!(
                Instant::now() < deadline,
                "the forged answers did not arrive"
            );
            assert_eq!(
                m[0].poll_control(&mut buf),
                None,
                "a forged answer was taken"
            );
            thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(dst.to_vec(), vec![0; 16]);
        // Rank 2 answers: the read completes with its bytes.
        let got = polled_input(&mut m, 2, 0, &mut buf, deadline);
        assert_eq!(
            got,
            ControlInput::ReadDone {
                id: ReadId(7),
                result: Ok(())
            }
        );
        assert_eq!(dst.to_vec(), vec![0xAA; 16]);
        assert_eq!(m[0].stats().reads_failed.load(Ordering::Relaxed), 0);
    }

    /// A peer that asks for far more than it reads costs its connection a bounded queue:
    /// answers beyond [`SERVE_QUEUE`] wait as requests, and all of them arrive, in order and
    /// whole, once it reads. A read longer than any buffer is refused without allocating
    /// for it.
    #[test]
    fn reads_asked_faster_than_read_wait_as_requests() {
        const LEN: usize = 4 << 20;
        const READS: u64 = 24;
        // Rank 1 does its own I/O and reads nothing until polled.
        let mut m = mesh_io(2, 98, |r| r == 1);
        let src: Vec<u8> = (0..LEN).map(|j| (j % 253) as u8).collect();
        m[0].registry()
            .register(OpId(3), OpBuffer::from_vec(src.clone()));
        let dsts: Vec<OpBuffer> = (0..READS).map(|_| OpBuffer::zeroed(LEN)).collect();
        for (i, d) in (0..READS).zip(&dsts) {
            m[1].registry().register(OpId(100 + i), d.clone());
        }
        // Rank 1 asks for 96 MiB; as the request frames are small, each op's read names op
        // 3 at rank 0 but lands in its own buffer: rank 1's requests are sent by hand.
        for i in 0..READS {
            let mut f = frame(KIND_READ_REQ, READ_REQ_LEN - 1);
            for v in [i, 3, 0, LEN as u64] {
                f.extend_from_slice(&v.to_be_bytes());
            }
            assert!(m[1].queue(Rank(0), Frame::Owned(f)));
            m[1].pending.insert(i, req(i, 0, 100 + i, 0, LEN as u64));
        }
        // Until rank 0 has taken every request and holds answers back, rank 1 stays unread.
        let deadline = Instant::now() + Duration::from_secs(30);
        while m[0].stats().reads_deferred.load(Ordering::Relaxed) == 0 {
            assert!(Instant::now() < deadline, "no read waited");
            thread::sleep(Duration::from_millis(5));
        }
        thread::sleep(Duration::from_millis(100));
        let queued = m[0].queued(Rank(1));
        assert!(
            queued <= SERVE_QUEUE + LEN + 64,
            "{queued} bytes queued for a peer that reads nothing"
        );
        let mut buf = Vec::new();
        let mut done = 0;
        while done < READS {
            m[1].poll_io(Duration::from_millis(1));
            while let Some(i) = m[1].poll_control(&mut buf) {
                assert!(
                    matches!(i, ControlInput::ReadDone { result: Ok(()), .. }),
                    "{i:?}"
                );
                done += 1;
            }
            assert!(
                Instant::now() < deadline,
                "{done} of {READS} reads answered"
            );
        }
        assert!(dsts.iter().all(|d| d.to_vec() == src), "wrong bytes");
        // Far longer than any buffer, with no limit on reads: refused, and nothing reserved
        // for it (2^60 bytes cannot be).
        m[0].max_read.store(u64::MAX, Ordering::Relaxed);
        let mut f = frame(KIND_READ_REQ, READ_REQ_LEN - 1);
        for v in [99u64, 3, 0, 1 << 60] {
            f.extend_from_slice(&v.to_be_bytes());
        }
        assert!(m[1].queue(Rank(0), Frame::Owned(f)));
        m[1].pending.insert(99, req(99, 0, 100, 0, 1 << 60));
        let got = polled_input(&mut m, 1, 1, &mut buf, deadline);
        assert_eq!(
            got,
            ControlInput::ReadDone {
                id: ReadId(99),
                result: Err(ReadError)
            }
        );
    }

    /// A stray client that trickles its hello a byte at a time is dropped after
    /// [`HELLO_WAIT`] in all, not [`HELLO_WAIT`] per byte: the peer behind it still connects
    /// within the start-up's bound.
    #[test]
    fn a_trickling_stray_does_not_hold_up_the_start_up() {
        let (listeners, table) = listeners(2);
        // 21 bytes at one a second: 21 s, where the start-up has 8.
        let stray_to = table[0];
        let stray = thread::spawn(move || {
            let mut s = TcpStream::connect(stray_to).expect("stray connects");
            for b in hello(1, 1) {
                if s.write_all(&[b]).is_err() {
                    return;
                }
                thread::sleep(Duration::from_secs(1));
            }
        });
        thread::sleep(Duration::from_millis(100));
        let cfg = ControlConfig {
            connect_timeout: Duration::from_secs(8),
            ..ControlConfig::new(96)
        };
        let handles: Vec<_> = listeners
            .into_iter()
            .enumerate()
            .map(|(r, l)| {
                let table = table.clone();
                thread::spawn(move || {
                    if r == 1 {
                        // Behind the stray in rank 0's accept queue.
                        thread::sleep(Duration::from_millis(200));
                    }
                    TcpControl::connect(r as u32, &table, l, Registry::default(), cfg)
                })
            })
            .collect();
        for h in handles {
            h.join()
                .expect("join")
                .expect("connected despite the stray");
        }
        stray.join().expect("stray");
    }

    /// Frames of every kind a peer may send after the hellos, as the senders encode them:
    /// a message of `msg` bytes, a read request, its answer, a refusal, goodbyes with and
    /// without a blamed rank, an empty message.
    fn frames_of_every_kind(msg: usize) -> Vec<Vec<u8>> {
        let mut message = frame(KIND_MESSAGE, msg);
        message.extend((0..msg).map(|i| i as u8));
        let mut req = frame(KIND_READ_REQ, READ_REQ_LEN - 1);
        for v in [7u64, 2, 16, 5] {
            req.extend_from_slice(&v.to_be_bytes());
        }
        let mut resp = frame(KIND_READ_RESP, 8 + 5);
        resp.extend_from_slice(&7u64.to_be_bytes());
        resp.extend_from_slice(b"abcde");
        let mut refused = frame(KIND_READ_REFUSED, 8);
        refused.extend_from_slice(&8u64.to_be_bytes());
        let bye = bye_frame(9, None);
        let blaming = bye_frame(9, Some(3));
        vec![
            message,
            req,
            resp,
            refused,
            bye,
            blaming,
            frame(KIND_MESSAGE, 0),
        ]
    }

    /// `stream` fed to a decoder in the slices that `cuts` (ascending offsets) make: the
    /// frames taken and whether it found the stream malformed; the decoder's read buffer
    /// never longer than `most`.
    fn decode_cut(
        cfg: ControlConfig,
        (step, keep, big): (usize, usize, usize),
        stream: &[u8],
        cuts: &[usize],
        most: usize,
    ) -> (Vec<Vec<u8>>, bool) {
        let mut d = StreamDecoder::new(cfg, step, keep, big);
        let mut out = Vec::new();
        let mut from = 0;
        for &to in cuts.iter().chain([&stream.len()]) {
            d.feed(&stream[from..to], &mut out);
            from = to;
            assert!(d.frames.buf.len() <= most, "cut at {cuts:?}");
        }
        (out, d.malformed)
    }

    /// The frame's length, fixed bytes: what `frame` writes and `frame_head` reads.
    #[test]
    fn frame_heads_are_the_length_then_the_kind() {
        assert_eq!(frame(KIND_READ_REFUSED, 8), [0, 0, 0, 9, KIND_READ_REFUSED]);
        let cfg = ControlConfig::new(1);
        assert_eq!(frame_head(&[0, 0, 1, 2, KIND_MESSAGE], &cfg), Ok(Some(258)));
        assert_eq!(
            frame_head(&[0, 0, 0, 9, KIND_READ_REFUSED], &cfg),
            Ok(Some(9))
        );
    }

    /// A kind a peer may not send (the hello, after the start-up; an unknown one) is refused
    /// from its header, whatever its length, and ends the stream after the frames before it.
    #[test]
    fn a_frame_of_a_kind_a_peer_may_not_send_is_refused_from_its_header() {
        let cfg = ControlConfig::new(1);
        for kind in [KIND_HELLO, KIND_BYE + 1, 0x80, u8::MAX] {
            for len in [1u32, HELLO_LEN as u32, 1000] {
                let mut head = len.to_be_bytes().to_vec();
                // The length alone is within what some kind may carry.
                assert_eq!(frame_head(&head, &cfg), Ok(Some(len as usize)));
                head.push(kind);
                assert_eq!(
                    frame_head(&head, &cfg),
                    Err(Malformed),
                    "kind {kind}, {len}"
                );
            }
        }
        let mut stream = frames_of_every_kind(3).concat();
        let taken = frames_of_every_kind(3).len();
        stream.extend_from_slice(&hello(1, 2));
        stream.extend_from_slice(&frame(KIND_MESSAGE, 0));
        let (out, malformed) = decode_cut(cfg, (64, 1024, 16), &stream, &[], 64);
        assert!(malformed);
        assert_eq!(out.len(), taken, "the frames before the hello are taken");
        // A hello is refused for its kind, not its fields.
        assert_eq!(Incoming::parse(&hello(1, 2)[4..]), None);
    }

    /// Fields are checked once a frame is whole: fixed bytes of each kind decode to their
    /// fields, one byte more or less to an error.
    #[test]
    fn incoming_frames_decode_every_field_and_refuse_wrong_lengths() {
        let mut req = vec![KIND_READ_REQ];
        for v in [1u64, 2, 3, 4] {
            req.extend_from_slice(&v.to_be_bytes());
        }
        let asked = Asked {
            id: 1,
            op: OpId(2),
            offset: 3,
            len: 4,
        };
        assert_eq!(Incoming::parse(&req), Some(Incoming::ReadReq(asked)));
        assert_eq!(Incoming::parse(&req[..req.len() - 1]), None);
        req.push(0);
        assert_eq!(Incoming::parse(&req), None);
        let resp = [KIND_READ_RESP, 0, 0, 0, 0, 0, 0, 0, 9, 0xaa, 0xbb];
        assert_eq!(
            Incoming::parse(&resp),
            Some(Incoming::ReadResp {
                id: 9,
                bytes: &[0xaa, 0xbb]
            })
        );
        assert_eq!(
            Incoming::parse(&resp[..9]),
            Some(Incoming::ReadResp { id: 9, bytes: &[] })
        );
        assert_eq!(Incoming::parse(&resp[..8]), None);
        let refused = [KIND_READ_REFUSED, 0, 0, 0, 0, 0, 0, 1, 0];
        assert_eq!(Incoming::parse(&refused), Some(Incoming::Refused(256)));
        assert_eq!(Incoming::parse(&resp[..8]), None);
        assert_eq!(Incoming::parse(&[&refused[..], &[0]].concat()), None);
        let bye = [KIND_BYE, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 3];
        assert_eq!(
            Incoming::parse(&bye[..9]),
            Some(Incoming::Bye {
                mark: 5,
                blamed: None
            })
        );
        assert_eq!(
            Incoming::parse(&bye),
            Some(Incoming::Bye {
                mark: 5,
                blamed: Some(Rank(3))
            })
        );
        assert_eq!(Incoming::parse(&bye[..11]), None);
        assert_eq!(
            Incoming::parse(&[KIND_MESSAGE]),
            Some(Incoming::Message(&[]))
        );
        assert_eq!(Incoming::parse(&[]), None);
    }

    /// A frame longer than its kind allows is refused as soon as its length and kind are in,
    /// one longer than any kind allows from its length alone; one byte shorter is taken.
    #[test]
    fn a_frame_too_long_is_refused_from_its_header_alone() {
        let cfg = ControlConfig {
            max_message: 1000,
            max_read: 4096,
            ..ControlConfig::new(1)
        };
        assert_eq!(cfg.longest_frame(), 4096 + 9);
        for len in [0, 4096 + 10, u32::MAX as usize] {
            let head = (len as u32).to_be_bytes();
            assert_eq!(frame_head(&head, &cfg), Err(Malformed), "{len}");
        }
        let heads = [
            (1002, KIND_MESSAGE),
            (READ_REQ_LEN + 1, KIND_READ_REQ),
            (4096 + 10, KIND_READ_RESP),
            (10, KIND_READ_REFUSED),
            (14, KIND_BYE),
        ];
        for (len, kind) in heads {
            let mut head = (len as u32).to_be_bytes().to_vec();
            head.push(kind);
            assert_eq!(frame_head(&head, &cfg), Err(Malformed), "{len} of {kind}");
            let mut shorter = (len as u32 - 1).to_be_bytes().to_vec();
            shorter.push(kind);
            assert_eq!(frame_head(&shorter, &cfg), Ok(Some(len - 1)), "{kind}");
            // Nothing of its body is waited for: the decoder is done with the stream.
            let (out, malformed) = decode_cut(
                cfg,
                (READ_STEP, READ_KEEP, BIG_FRAME),
                &head,
                &[],
                READ_STEP,
            );
            assert!(malformed && out.is_empty(), "{len} of {kind}");
        }
    }

    /// A header cut short (fewer than 4 bytes of length) waits for more, and so does a frame
    /// whose body is not all in; the frame comes out whole once its last byte is there.
    #[test]
    fn a_truncated_header_waits_for_more() {
        let cfg = ControlConfig::new(1);
        let f = &frames_of_every_kind(3)[0];
        for n in 0..4 {
            assert_eq!(frame_head(&f[..n], &cfg), Ok(None), "{n} bytes");
        }
        for n in 4..f.len() {
            assert_eq!(frame_head(&f[..n], &cfg), Ok(Some(4)), "{n} bytes");
        }
        for n in 0..f.len() {
            let mut r = FrameReader::new(64, 1024, 16);
            r.room(usize::MAX)[..n].copy_from_slice(&f[..n]);
            r.filled(n);
            assert_eq!(r.next(&cfg), Ok(Next::More), "{n} bytes");
            let rest = f.len() - n;
            r.room(usize::MAX)[..rest].copy_from_slice(&f[n..]);
            r.filled(rest);
            assert_eq!(r.next(&cfg), Ok(Next::Whole(&f[4..])), "{n} bytes");
            assert_eq!(r.next(&cfg), Ok(Next::More));
        }
    }

    /// The same frames come out of a fixed stream of every kind however it is cut, into
    /// three slices at every pair of points, or byte by byte, with a read buffer of 16 bytes
    /// that moves, grows and shrinks on the way, and a message longer than a quarter of it
    /// gathered on its own; the buffer never grows past twice the longest frame it holds.
    #[test]
    fn frames_split_anywhere_decode_to_the_same_frames() {
        let cfg = ControlConfig {
            max_message: 100,
            max_read: 64,
            ..ControlConfig::new(1)
        };
        let frames = frames_of_every_kind(40);
        let stream = frames.concat();
        let want: Vec<Vec<u8>> = frames.iter().map(|f| f[4..].to_vec()).collect();
        let sizes = (16, 32, 4);
        // A read request (33 bytes) is the longest frame held whole.
        let most = 2 * (4 + READ_REQ_LEN);
        for i in 0..=stream.len() {
            for j in i..=stream.len() {
                let got = decode_cut(cfg, sizes, &stream, &[i, j], most);
                assert_eq!(got, (want.clone(), false), "cut at {i} and {j}");
            }
        }
        let bytes: Vec<usize> = (1..stream.len()).collect();
        assert_eq!(
            decode_cut(cfg, sizes, &stream, &bytes, most),
            (want.clone(), false)
        );
        // With the I/O thread's sizes too.
        let sizes = (READ_STEP, READ_KEEP, BIG_FRAME);
        let got = decode_cut(cfg, sizes, &stream, &bytes, READ_STEP);
        assert_eq!(got, (want, false));
    }

    /// The committed seeds of the `framing` fuzz target (`fuzz/corpus/framing/`) decode to
    /// the frames they are named for (a format change that leaves them stale fails here).
    #[test]
    fn the_framing_fuzz_seeds_decode() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/framing");
        let mut seen = 0;
        for entry in std::fs::read_dir(&dir).expect("seed directory") {
            let path = entry.expect("entry").path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            let Some(name) = name.strip_prefix("seed-") else {
                continue;
            };
            let data = std::fs::read(&path).expect("seed");
            // As the target reads its input.
            let [message, read, step, n] = data[..4] else {
                panic!("{name}: short");
            };
            let limit = |b: u8| {
                if b == u8::MAX {
                    u64::MAX
                } else {
                    u64::from(b) * 8
                }
            };
            let (sizes, stream) = data[4..].split_at(usize::from(n % 8));
            let splits: Vec<usize> = sizes.iter().map(|&s| usize::from(s) + 1).collect();
            let limits = fuzzing::Limits {
                max_message: usize::try_from(limit(message)).unwrap_or(usize::MAX),
                max_read: limit(read),
                step: usize::from(step % 64) + 1,
            };
            let got = limits.decode(stream, &splits);
            assert_eq!(got, limits.spec(stream), "{name}");
            let kinds: Vec<u8> = got.frames.iter().map(|f| f[0]).collect();
            let hello = fuzzing::read_hello(stream, &splits);
            let want: &[u8] = match name {
                "hello" => {
                    assert!(hello.is_some() && got.malformed, "{name}");
                    &[]
                }
                "message" | "big-message" => &[KIND_MESSAGE],
                "read" => &[KIND_READ_REQ, KIND_READ_RESP, KIND_READ_REFUSED],
                "bye" => &[KIND_BYE, KIND_BYE],
                "every-kind" => &[
                    KIND_MESSAGE,
                    KIND_READ_REQ,
                    KIND_READ_RESP,
                    KIND_READ_REFUSED,
                    KIND_BYE,
                    KIND_BYE,
                    KIND_MESSAGE,
                ],
                _ => panic!("seed-{name}: no such seed"),
            };
            assert_eq!(kinds, want, "{name}");
            assert!(
                name == "hello" || (!got.malformed && hello.is_none()),
                "{name}"
            );
            seen += 1;
        }
        assert_eq!(seen, 6);
    }
}
