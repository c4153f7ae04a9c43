//! The engine and the user API: [`Communicator`].
//!
//! ```no_run
//! use ringcast::Communicator;
//! let comm = Communicator::from_env()?;            // mpirun / srun / torchrun / RINGCAST_*
//! let mut weights = vec![0f32; 1 << 20];
//! comm.broadcast(0, &mut weights)?;                  // blocking, typed through bytemuck
//! let req = comm.iallgather(&[comm.rank()], vec![0u32; comm.size() as usize])?;
//! // ... overlap computation ...
//! let ranks: Vec<u32> = req.wait()?;                 // the buffer comes back
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! ## Ordering
//! As in MPI, **every rank must issue the same collectives in the same order** (same kind,
//! root and sizes), blocking and non-blocking alike: the n-th operation posted on one rank
//! meets the n-th posted on every other. Any number may be in flight at once (the engine
//! queues what exceeds the core's in-flight limit), and they may complete in any order.
//! Posting from several threads at once is allowed, but then the order is theirs to agree on.
//!
//! A program that breaks this rule does not hang and gets no other operation's bytes: each
//! operation carries a fingerprint of its kind, root and sizes
//! ([`ringcast_core::broadcast_shape`]). Over multicast the barrier compares them before any
//! data moves (every disagreement is seen, see the core's barrier), and every rank fails the
//! operation with [`CommError::ShapeMismatch`] naming a rank that differs; the next operation
//! runs as usual. Over TCP the pieces carry it, and the rank that receives one of another
//! shape fails the operation and tells every rank (ranks upstream of it may have completed
//! already, with the bytes they posted for); where no piece crosses the disagreement, a rank
//! whose wait runs out asks its peer where it stands, and the answer carries the peer's
//! fingerprint. Ranks that disagree on a length across [`CommBuilder::tcp_threshold`] run the
//! operation on different paths: a rank that hears of it on the path it did not take (a
//! `Ready` at a rank that ran it over TCP, a piece at one that ran it over multicast) tells
//! every rank, and they fail it at once; where nothing crosses, a rank whose wait runs out
//! asks the rank it waits on where it stands, hears that it ran the operation on the other
//! path, and fails it then (about a peer timeout after the post). An operation that
//! is empty at one rank (it completes there at once) and not at another fails at once too:
//! the empty one still says `Ready` over multicast; over TCP an empty Broadcast's root shows
//! its shape to its children, and any other rank tells every rank when a piece of another
//! shape reaches it after it completed (so its children, which wait on it, fail at once).
//!
//! A call that this rank refuses before posting anything (a root out of range, counts of
//! the wrong length, a buffer of the wrong size, zero-sized elements), or that the engine
//! cannot start (too many chunks for the chunk size), returns its error and still takes its
//! place in the sequence: the other ranks fail their operation of that place (against this
//! rank, at once or at the peer timeout) and the next one lines up everywhere, so a rank's
//! mistake never hands another operation's bytes to anyone.
//!
//! ## Buffers and soundness
//! Non-blocking calls take an owned `Vec<T>` and hand it back from [`Request::wait`], in the
//! style of tokio-uring: the engine owns the bytes while the operation runs, so a dropped or
//! leaked request can never let it write into freed memory. Element types are
//! [`bytemuck::Pod`], any alignment: the vector itself is the operation's buffer and comes back
//! as itself, not copied (the transport's `OpBuffer::from_typed`).
//! Blocking calls run on the caller's slice itself, as MPI does: the engine reads and writes
//! it while the call runs and lets go of it before the call returns, whatever the outcome
//! (the transport's `OpBuffer::lend`, a scope in the manner of `std::thread::scope`). Nothing
//! is copied but an Allgather's own block from `send` into place, and that by the send
//! workers as they send it (the transport's `OpBuffer::lend_with`). A failed call may leave the
//! slice partly written, as `MPI_Bcast`'s buffer is undefined after an error. The crate has no
//! `unsafe`. Any buffer will do; [`alloc_buffer`] makes one on 2 MiB pages, which the
//! kernel's copies of the datagrams into and out of it walk faster.
//!
//! ## Threads
//! Each communicator runs a control thread (the core's [`Session`](ringcast_core::Session),
//! the TCP control path, timers, completions) and, per lane, a receive worker
//! ([`LaneRx`](ringcast_core::lane::LaneRx) and its socket) and a paced send worker
//! ([`LaneTx`](ringcast_core::lane::LaneTx) and its socket), with bounded queues between them;
//! the transport adds one I/O thread for TCP, whatever the number of peers. Operations that run
//! over TCP (the small ones, see [`CommBuilder::tcp_threshold`], and all of them after a
//! fallback) have a dispatcher, which reads and writes its own TCP mesh itself (no I/O
//! thread between it and the sockets; after a failed start-up check it takes over the
//! control mesh, whose I/O thread hands its connections over and stops). It has a thread,
//! but a TCP operation runs on the posting thread when it can, and the thread that waits for
//! one drives it (as `MPI_Wait` does): it waits on the mesh itself, so the data it waits for
//! wakes it with no hand-off. Otherwise the application thread only posts (a bounded
//! channel) and waits (each request has its own channel).
//! `RINGCAST_PIN=1` pins the control thread and the lane workers to consecutive cores, the
//! ranks of a host one run after another in rank order (hosts told apart by their kernels'
//! ids, from the rendezvous; with a peer table, or entries without ids, all ranks in rank
//! order). A split's communicators take their parent's cores: a process's threads stay on
//! its own. `RINGCAST_PACING=off` disables pacing.
//!
//! ## Sub-communicators
//! [`Communicator::split`] (`MPI_Comm_split`, `ncclCommSplit`), [`Communicator::dup`]
//! (`MPI_Comm_dup`) and [`Communicator::split_by_host`] (`MPI_Comm_split_type` with
//! `MPI_COMM_TYPE_SHARED`) make new communicators from this one without a new rendezvous: the
//! colors, keys and new control addresses travel as an Allgather on this one. Each new one
//! has its own threads, control connections, multicast groups and Q_Key (its nonce derives
//! from this one's), takes this one's settings, and runs beside it and its siblings.
//!
//! ## Failures
//! * A peer that stops answering fails every operation waiting on it after the peer timeout
//!   ([`CommError::PeerUnresponsive`], or [`CommError::PeerFailed`] when another rank noticed
//!   first), naming it.
//! * A peer that has not posted the operation yet is late, not hung: a rank whose wait runs
//!   out asks it where it stands, and its engine answers whatever its program does. It is
//!   waited for up to the post timeout ([`CommBuilder::post_timeout`], 10 minutes by
//!   default), then named ([`CommError::NotPosted`]); when it posts the operation later, it
//!   fails there at once ([`CommError::PeerFailed`] naming itself). One whose last operation
//!   failed (other than as a [`CommError::ShapeMismatch`]) and that has posted nothing since
//!   may have stopped over that failure: the rank that failure named is named at once,
//!   whichever path (multicast or TCP) each operation ran on. A program stuck before its
//!   call, its engine alive, is named only at the post timeout.
//! * An operation that fails over a rank that does not go on ([`CommError::NotPosted`],
//!   [`CommError::PeerUnresponsive`], [`CommError::PeerFailed`], [`CommError::PeerLost`],
//!   and this rank's own [`CommError::SendsStalled`])
//!   fails the operations posted before it failed and still waiting to start (beyond the
//!   operations in flight at once), with the same error, as NCCL's fail once a timeout
//!   aborted the communicator: behind a rank that never posts, each window of them would
//!   wait a post timeout of its own. Operations posted afterwards run as usual.
//! * A peer whose control connection closes (the process died) fails every operation in
//!   flight at once with [`CommError::PeerLost`] naming it; so does every later post: a
//!   communicator that lost a rank cannot run collectives any more. When one failure makes
//!   other ranks leave too, later posts keep naming the rank the first failure blamed, with
//!   [`CommError::PeerFailed`] (that rank may be alive), over either path.
//! * A peer that drops its communicator says goodbye first: operations it finished complete
//!   normally elsewhere, the others fail with [`CommError::PeerLost`]. (Over TCP, one that
//!   still waits on it after its goodbye, when the ranks disagreed on it, fails at once
//!   naming it.)
//! * A root whose own multicasts stop completing (its socket's send path is stuck, as on a
//!   NIC paused by PFC: no send finished between two looks, a peer timeout past its block's
//!   wire time apart) fails the operation with [`CommError::SendsStalled`] naming itself,
//!   and the others with [`CommError::PeerFailed`] naming it. A send waits at most 100 ms
//!   for socket buffer space ([`Counters::sends_timed_out`] counts those that waited in
//!   vain), so a stuck send path never holds a cancel or the communicator's drop.
//! * Ranks that post an operation with another kind, root or size fail it with
//!   [`CommError::ShapeMismatch`] (see Ordering): no rank crashed or hung, and the
//!   next operation runs as usual.
//! * Bad arguments are typed errors before anything is posted:
//!   [`CommError::BufferSize`], [`CommError::CountsLength`], [`CommError::CountsTooLarge`],
//!   [`CommError::RootOutOfRange`].
//! * Dropping a communicator cancels what is in flight (their requests return
//!   [`CommError::Cancelled`]), says goodbye to the peers, and joins every thread: it returns
//!   within about a second even when peers hang.
//! * [`Communicator::abort`] does the same from any thread, as `ncclCommAbort` does for a
//!   watchdog: the calls blocked in other threads return [`CommError::Cancelled`], and so
//!   does every later call; the drop then only joins the threads.
//!
//! ## Start-up check and TCP fallback
//! [`CommBuilder::build`] checks that multicast arrives before it returns: every rank
//! multicasts probe datagrams on every lane, small ones and ones as large as a chunk, and
//! reports over TCP whom it heard; within the window ([`CommBuilder::startup_check`], 2 s by
//! default, ended early once everyone heard everyone) every rank reaches the same verdict.
//! Multicast that does not reach every rank (no route, a snooping switch without a querier, a
//! firewall dropping the UDP port), or reaches it only in datagrams smaller than the data's (a
//! link or switch port on the way with a smaller MTU than the hosts'), is a
//! [`BuildError::MulticastUnreachable`] whose message names who did not hear whom, on which
//! group and interface, and what to check.
//!
//! With [`Fallback::Tcp`] (`RINGCAST_FALLBACK=tcp`) the communicator runs over TCP instead
//! (a pipelined ring Allgather(v), a pipelined chain Broadcast in 256 KiB pieces or, for one
//! piece or less, a binomial-tree Broadcast), and switches
//! to TCP during the run when multicast loses more than a threshold
//! ([`CommBuilder::fallback_loss_threshold`], 10% of the chunks fetched by ring recovery):
//! rank 0 freezes every rank's dispatch and picks the first operation none has posted to
//! multicast yet, so all switch at the same operation. [`Communicator::transport_mode`] and
//! [`CommStats::mode`] say which transport runs, from which operation, and why; a `tracing`
//! warning says so too.
//!
//! ## Observability
//! [`Communicator::stats`] returns every counter; each completion carries [`OpStats`]. Each
//! operation runs in a `tracing` span named `ringcast` (fields `kind`, `rank`, `bytes`, and
//! `root` for a Broadcast; its events carry the operation's id, `op`); the library
//! installs no subscriber.

mod blame;
mod builder;
mod engine;
mod error;
mod fallback;
mod memory;
mod probe;
mod request;
mod split;
mod stats;
mod track;

/// See [`crate::fuzzing::startup_report`].
pub(crate) fn fuzz_report(b: &[u8]) -> bool {
    probe::fuzz_report(b)
}

pub use builder::{
    CommBuilder, DEFAULT_TCP_THRESHOLD, Fallback, LOOPBACK_CHUNK, MAX_LANES, ONE_HOST_TCP_THRESHOLD,
};
pub use error::{BuildError, CommError};
pub use fallback::{FallbackReason, TransportMode};
pub use memory::alloc_buffer;
pub use probe::{ProbeFailure, Unheard};
pub use request::Request;
pub use split::SplitError;
pub use stats::{CommStats, ControlCounters, Counters, OpStats};

use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use bytemuck::Pod;

use engine::{Command, Kind, Post, PostTx};
use ringcast_transport_rocev2_udp::OpBuffer;

/// How long [`Communicator::stats`] waits for the engine.
const STATS_WAIT: Duration = Duration::from_secs(10);

/// A group of ranks that run Broadcast and Allgather together over multicast.
///
/// Built with [`Communicator::builder`] or [`Communicator::from_env`]. See the
/// [module docs](self) for ordering, buffers, threads and failures.
#[derive(Debug)]
pub struct Communicator {
    rank: u32,
    size: u32,
    /// Multicast lanes (see [`CommBuilder::lanes`]).
    lanes: u16,
    /// Allgather chains (see [`CommBuilder::allgather_chains`]).
    chains: u32,
    /// See [`Communicator::tcp_threshold`].
    tcp_threshold: u64,
    /// The multicast engine (`None` when the start-up check sent every operation to TCP).
    posts: Option<PostTx>,
    thread: Option<JoinHandle<()>>,
    /// With `fallback = tcp` or small operations over TCP: routes each post to the engine or
    /// to TCP.
    fallback: Option<fallback::Handle>,
    /// What [`split`](Self::split) and [`dup`](Self::dup) start from.
    lineage: split::Lineage,
}

impl Communicator {
    /// A builder taking every setting explicitly.
    pub fn builder() -> CommBuilder {
        CommBuilder::new()
    }

    /// Bootstraps from the launcher's environment ([`CommBuilder::from_env`]) and connects.
    pub fn from_env() -> Result<Self, BuildError> {
        CommBuilder::from_env()?.build()
    }

    /// This rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Number of ranks.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Multicast lanes the job runs on: set by [`CommBuilder::lanes`], or the count every
    /// rank picked from its host's cores.
    pub fn lanes(&self) -> u16 {
        self.lanes
    }

    /// How many Allgather roots multicast at once: set by [`CommBuilder::allgather_chains`],
    /// or the count every rank picked from its host's cores.
    pub fn allgather_chains(&self) -> u32 {
        self.chains
    }

    /// Payload bytes per chunk (one datagram each): [`CommBuilder::chunk_size`]'s, or the
    /// default the interface picked (4 KiB where its MTU has room, [`LOOPBACK_CHUNK`] on a
    /// loopback).
    pub fn chunk_size(&self) -> u32 {
        self.lineage.chunk
    }

    /// Operations of at most this many bytes (the whole buffer) run over TCP while multicast
    /// works: [`CommBuilder::tcp_threshold`]'s, or the default the job's layout picked
    /// ([`DEFAULT_TCP_THRESHOLD`], or [`ONE_HOST_TCP_THRESHOLD`] with every rank on one host);
    /// 0 when none do.
    pub fn tcp_threshold(&self) -> u64 {
        self.tcp_threshold
    }

    /// Every counter of this communicator (asks the engine; socket drops read `/proc`), the
    /// TCP fallback's included, and the [`TransportMode`].
    pub fn stats(&self) -> Result<CommStats, CommError> {
        let mut s = if self.posts.is_some() {
            let (tx, rx) = mpsc::sync_channel(1);
            self.send(Command::Stats(tx))?;
            rx.recv_timeout(STATS_WAIT).map_err(|e| match e {
                mpsc::RecvTimeoutError::Timeout => CommError::EngineTimeout(STATS_WAIT),
                // The engine stopped (it answers every request it took before it does).
                mpsc::RecvTimeoutError::Disconnected => CommError::Cancelled,
            })?
        } else {
            CommStats::default()
        };
        if let Some(f) = &self.fallback {
            f.add_to(&mut s);
        }
        Ok(s)
    }

    /// Aborts the communicator from any thread, as `ncclCommAbort` does for a watchdog: the
    /// operations in flight and queued fail with [`CommError::Cancelled`] (threads blocked in
    /// [`Request::wait`] or a blocking call return), the peers are told goodbye (theirs fail
    /// naming this rank, [`CommError::PeerLost`]; operations this rank finished complete
    /// there), and every later call fails with [`CommError::Cancelled`]. Returns without
    /// waiting; dropping the communicator then joins its threads. Calling it again does
    /// nothing.
    ///
    /// A [`split`](Self::split) already past its exchange, building the new communicator,
    /// gives up within about 100 ms ([`SplitError::Cancelled`]); the other members' builds
    /// fail once they see it go, on their parent communicator's connections or on the new
    /// one's ([`SplitError::MemberGone`] naming it; in the lab, within 50 ms). Not for a
    /// signal handler (it takes locks and may log), nor for a `tracing` layer that runs on
    /// the library's own threads.
    pub fn abort(&self) {
        tracing::debug!(rank = self.rank, "abort");
        self.lineage.builds.abort();
        if let Some(f) = &self.fallback {
            f.start_close();
        }
        // Wakes the engine, which stops at once (a closed channel would too, but the
        // channel is this communicator's and others may still post into it).
        let _ = self.send(Command::Abort);
    }

    /// Whether operations run over multicast or, with `fallback = tcp`, over TCP from some
    /// operation on (the start-up check failed, or multicast lost too much during the run).
    pub fn transport_mode(&self) -> TransportMode {
        self.fallback
            .as_ref()
            .map_or(TransportMode::Multicast, fallback::Handle::mode)
    }

    /// Fails an operation that this rank's own checks refused, with `e`. Its place in the
    /// sequence of collectives is taken all the same (see `Post::forfeit`): the peers fail
    /// their operation of that place (against this rank), and the next one still meets the
    /// same operation at every rank, never another's bytes.
    fn refuse<R>(&self, e: CommError) -> Result<R, CommError> {
        match &self.fallback {
            Some(f) => f.forfeit(),
            None => {
                let _ = self.send(Command::Post(Post::forfeit(None)));
            }
        }
        Err(e)
    }

    /// The size of a `T` in bytes; refused (see [`Self::refuse`]) for a zero-sized type.
    fn elem<T>(&self) -> Result<usize, CommError> {
        match std::mem::size_of::<T>() {
            0 => self.refuse(CommError::ZeroSizedElements),
            n => Ok(n),
        }
    }

    /// `counts` times `elem` bytes each, summed; refused with [`CommError::CountsTooLarge`]
    /// where that overflows.
    fn total_of(&self, counts: &[usize], elem: usize) -> Result<usize, CommError> {
        match total_of(counts, elem) {
            Some(t) => Ok(t),
            None => self.refuse(CommError::CountsTooLarge),
        }
    }

    /// Refuses `counts` unless it has one entry per rank.
    fn check_counts(&self, counts: &[usize]) -> Result<(), CommError> {
        if counts.len() != self.size as usize {
            return self.refuse(CommError::CountsLength {
                got: counts.len(),
                ranks: self.size,
            });
        }
        Ok(())
    }

    fn send(&self, c: Command) -> Result<(), CommError> {
        match &self.posts {
            Some(p) => p.send(c).map_err(|_| CommError::Cancelled),
            None => Err(CommError::Cancelled),
        }
    }

    fn post<T: Pod>(
        &self,
        kind: Kind,
        bytes: OpBuffer,
        span: tracing::Span,
    ) -> Result<Request<T>, CommError> {
        // The program goes on with this communicator: a failure on one split from it no
        // longer says why it would leave.
        if let Some(b) = self.blame() {
            b.posted();
        }
        if let Some(f) = &self.fallback {
            return f.post(kind, bytes, span);
        }
        let (reply, rx) = mpsc::sync_channel(1);
        self.send(Command::Post(Post {
            kind,
            buf: bytes,
            reply,
            span,
            index: None,
            forfeit: false,
            posted: std::time::Instant::now(),
            tap: None,
        }))?;
        Ok(Request::new(rx))
    }

    /// Starts a Broadcast of `buf` from `root`: on return of [`Request::wait`], every rank's
    /// buffer holds the root's. Every rank passes the same length.
    pub fn ibroadcast<T: Pod>(&self, root: u32, buf: Vec<T>) -> Result<Request<T>, CommError> {
        self.elem::<T>()?;
        let span = self.broadcast_span(root, std::mem::size_of_val(buf.as_slice()))?;
        self.post(Kind::Broadcast { root }, OpBuffer::from_typed(buf), span)
    }

    /// Starts an Allgather: `recv` (`send.len()` times the world size) comes back holding
    /// every rank's `send`, in rank order.
    pub fn iallgather<T: Pod>(&self, send: &[T], recv: Vec<T>) -> Result<Request<T>, CommError> {
        let counts = vec![send.len(); self.size as usize];
        self.iallgatherv(send, recv, &counts)
    }

    /// Starts an Allgatherv: rank `r` contributes `counts[r]` elements (zero allowed);
    /// `recv` (`counts` summed) comes back holding the blocks in rank order.
    pub fn iallgatherv<T: Pod>(
        &self,
        send: &[T],
        recv: Vec<T>,
        counts: &[usize],
    ) -> Result<Request<T>, CommError> {
        self.post_allgatherv(Some(send), recv, counts)
    }

    /// Starts an Allgather in place (`MPI_IN_PLACE`; NCCL's in-place `ncclAllGather`): `buf`,
    /// the world size times one block, already holds this rank's block at its place (block
    /// `rank`), and comes back holding every rank's. Nothing is copied in: the layout of an
    /// FSDP shard, a view of the gathered tensor. A length that is not a multiple of the world
    /// size is a [`CommError::BufferSize`].
    pub fn iallgather_in_place<T: Pod>(&self, buf: Vec<T>) -> Result<Request<T>, CommError> {
        self.elem::<T>()?;
        let counts = self.equal_blocks(buf.len())?;
        self.post_allgatherv(None, buf, &counts)
    }

    /// The counts of an in-place Allgather of `len` elements in all: one block per rank.
    fn equal_blocks(&self, len: usize) -> Result<Vec<usize>, CommError> {
        let p = self.size as usize;
        if !len.is_multiple_of(p) {
            return self.refuse(CommError::BufferSize {
                what: "recv",
                got: len,
                required: len.checked_next_multiple_of(p).unwrap_or(len - len % p),
            });
        }
        Ok(vec![len / p; p])
    }

    /// Starts an Allgatherv in place: `buf` (`counts` summed) already holds this rank's
    /// `counts[rank]` elements at their place (after the blocks of the ranks before it), and
    /// comes back holding every block in rank order. See [`Self::iallgather_in_place`].
    pub fn iallgatherv_in_place<T: Pod>(
        &self,
        buf: Vec<T>,
        counts: &[usize],
    ) -> Result<Request<T>, CommError> {
        self.post_allgatherv(None, buf, counts)
    }

    /// An Allgatherv into `recv`, with this rank's block copied in from `send`, or already in
    /// place (`None`).
    fn post_allgatherv<T: Pod>(
        &self,
        send: Option<&[T]>,
        recv: Vec<T>,
        counts: &[usize],
    ) -> Result<Request<T>, CommError> {
        let shape = self.allgatherv_shape(send, recv.len(), counts)?;
        let mut recv = recv;
        shape.place(send, bytemuck::cast_slice_mut(&mut recv));
        self.post(shape.kind, OpBuffer::from_typed(recv), shape.span)
    }

    /// Checks an Allgatherv's buffers against `counts` (refusing it when they do not fit, see
    /// [`Self::refuse`]): its kind, span, and where this rank's block goes.
    fn allgatherv_shape<T: Pod>(
        &self,
        send: Option<&[T]>,
        recv_len: usize,
        counts: &[usize],
    ) -> Result<GatherShape, CommError> {
        let elem = self.elem::<T>()?;
        self.check_counts(counts)?;
        let me = self.rank as usize;
        let total = self.total_of(counts, 1)?;
        self.total_of(counts, elem)?;
        if let Some(send) = send
            && send.len() != counts[me]
        {
            return self.refuse(CommError::BufferSize {
                what: "send",
                got: send.len(),
                required: counts[me],
            });
        }
        if recv_len != total {
            return self.refuse(CommError::BufferSize {
                what: "recv",
                got: recv_len,
                required: total,
            });
        }
        let span = tracing::debug_span!(
            "ringcast",
            kind = "allgatherv",
            rank = self.rank,
            bytes = total * elem
        );
        // No product overflows: their sum did not.
        Ok(GatherShape {
            kind: Kind::Allgather {
                sizes: counts.iter().map(|&c| (c * elem) as u64).collect(),
                tag: 0,
            },
            at: counts[..me].iter().sum::<usize>() * elem,
            span,
        })
    }

    /// Runs an operation on the caller's `bytes` (lent, see the module docs) and waits for it;
    /// `own`, when given, is this rank's block and where it goes in `bytes`, copied in as the
    /// operation reaches it ([`OpBuffer::lend_with`]).
    fn run_lent(
        &self,
        kind: Kind,
        bytes: &mut [u8],
        own: Option<(&[u8], usize)>,
        span: tracing::Span,
    ) -> Result<OpStats, CommError> {
        let (source, at) = own.unwrap_or_default();
        OpBuffer::lend_with(bytes, source, at, |b| {
            self.post::<u8>(kind, b.clone(), span)?
                .wait_with_stats()
                .map(|(_, stats)| stats)
        })
    }

    /// The span of a Broadcast of `bytes` from `root`, refused (see [`Self::refuse`]) when
    /// `root` is not a rank.
    fn broadcast_span(&self, root: u32, bytes: usize) -> Result<tracing::Span, CommError> {
        if root >= self.size {
            return self.refuse(CommError::RootOutOfRange {
                root,
                ranks: self.size,
            });
        }
        Ok(tracing::debug_span!(
            "ringcast",
            kind = "broadcast",
            rank = self.rank,
            root,
            bytes
        ))
    }

    /// Blocks until every rank called it (`MPI_Barrier`). It is a collective like the others
    /// (an Allgather of one byte per rank, so a small operation: over TCP in Bruck's
    /// `ceil(log2 P)` rounds, the dissemination barrier, unless
    /// [`CommBuilder::tcp_threshold`] is below the rank count), ordered with them: every rank
    /// must call it at the same place in its sequence of collectives.
    pub fn barrier(&self) -> Result<(), CommError> {
        let mut all = vec![0u8; self.size as usize];
        self.allgather(&[1u8], &mut all).map(|_| ())
    }

    /// Broadcast of `buf` from `root`, blocking, on `buf` itself (see the module docs). The
    /// root's `buf` is only read; the others' holds the root's bytes once it returns `Ok`,
    /// and may be partly written when it fails.
    pub fn broadcast<T: Pod>(&self, root: u32, buf: &mut [T]) -> Result<OpStats, CommError> {
        self.elem::<T>()?;
        let bytes = bytemuck::cast_slice_mut::<T, u8>(buf);
        let span = self.broadcast_span(root, bytes.len())?;
        self.run_lent(Kind::Broadcast { root }, bytes, None, span)
    }

    /// Allgather, blocking: `recv` gets every rank's `send` in rank order.
    pub fn allgather<T: Pod>(&self, send: &[T], recv: &mut [T]) -> Result<OpStats, CommError> {
        let counts = vec![send.len(); self.size as usize];
        self.allgatherv(send, recv, &counts)
    }

    /// Allgather in place, blocking (`MPI_Allgather` with `MPI_IN_PLACE`): `buf` (the world
    /// size times one block) holds this rank's block at its place and gets every rank's.
    pub fn allgather_in_place<T: Pod>(&self, buf: &mut [T]) -> Result<OpStats, CommError> {
        self.elem::<T>()?;
        let counts = self.equal_blocks(buf.len())?;
        self.allgatherv_in_place(buf, &counts)
    }

    /// Allgatherv in place, blocking, on `buf` itself: `buf` (`counts` summed) holds this
    /// rank's `counts[rank]` elements at their place and gets every rank's block; the other
    /// blocks may be partly written when it fails.
    pub fn allgatherv_in_place<T: Pod>(
        &self,
        buf: &mut [T],
        counts: &[usize],
    ) -> Result<OpStats, CommError> {
        let shape = self.allgatherv_shape::<T>(None, buf.len(), counts)?;
        let bytes = bytemuck::cast_slice_mut::<T, u8>(buf);
        self.run_lent(shape.kind, bytes, None, shape.span)
    }

    /// Allgatherv, blocking, on `recv` itself: rank `r` contributes `counts[r]` elements; the
    /// other blocks may be partly written when it fails. This rank's block is copied from
    /// `send` into place (the only copy) piece by piece as the operation sends it, not all
    /// before it starts; it is whole in `recv` when the call returns, unless the call was
    /// refused before it started.
    pub fn allgatherv<T: Pod>(
        &self,
        send: &[T],
        recv: &mut [T],
        counts: &[usize],
    ) -> Result<OpStats, CommError> {
        let shape = self.allgatherv_shape(Some(send), recv.len(), counts)?;
        let bytes = bytemuck::cast_slice_mut::<T, u8>(recv);
        let own = (bytemuck::cast_slice::<T, u8>(send), shape.at);
        self.run_lent(shape.kind, bytes, Some(own), shape.span)
    }
}

impl Communicator {
    /// Whom this rank's failures blame: the one record the engine and the TCP dispatcher
    /// share, whichever of them this communicator has (a communicator whose start-up check
    /// sent everything to TCP has no engine).
    fn blame(&self) -> Option<&blame::Blame> {
        self.posts
            .as_ref()
            .map(PostTx::blame)
            .or_else(|| self.fallback.as_ref().map(fallback::Handle::blame))
    }

    /// A blocking Allgather of `send`'s bytes from every rank into `recv`, as a collective of
    /// the library's own kind `tag` (a split's exchange): a user's Allgather of the same
    /// sizes in its place fails it, and itself, with a `ShapeMismatch` at every rank.
    fn allgather_tagged(
        &self,
        send: &[u8],
        recv: &mut [u8],
        tag: u32,
    ) -> Result<OpStats, CommError> {
        let counts = vec![send.len(); self.size as usize];
        let mut shape = self.allgatherv_shape(Some(send), recv.len(), &counts)?;
        if let Kind::Allgather { tag: t, .. } = &mut shape.kind {
            *t = tag;
        }
        let own = (send, shape.at);
        self.run_lent(shape.kind, recv, Some(own), shape.span)
    }
}

/// What [`Communicator::allgatherv_shape`] found.
struct GatherShape {
    kind: Kind,
    /// Where this rank's block starts, in bytes.
    at: usize,
    span: tracing::Span,
}

impl GatherShape {
    /// Copies `send` (when given) into its place in `recv`'s bytes.
    fn place<T: Pod>(&self, send: Option<&[T]>, recv: &mut [u8]) {
        if let Some(send) = send {
            let mine: &[u8] = bytemuck::cast_slice(send);
            recv[self.at..self.at + mine.len()].copy_from_slice(mine);
        }
    }
}

/// `counts` times `elem` bytes each, summed; `None` where that overflows.
fn total_of(counts: &[usize], elem: usize) -> Option<usize> {
    counts.iter().try_fold(0usize, |sum, &c| {
        c.checked_mul(elem).and_then(|b| sum.checked_add(b))
    })
}

impl Drop for Communicator {
    /// Cancels the operations in flight, says goodbye to the peers and joins the engine.
    fn drop(&mut self) {
        // The fallback's dispatcher and the engine close side by side, each lingering up to a
        // second for a peer that does not read. The fallback holds a sender of the engine's
        // channel, which its close lets go at once.
        let fallback = self.fallback.take();
        if let Some(f) = &fallback {
            f.start_close();
        }
        self.posts = None;
        if let Some(t) = self.thread.take()
            && {
                // The engine parks between turns: wake it to see the closed channel now.
                t.thread().unpark();
                t.join().is_err()
            }
        {
            tracing::error!(rank = self.rank, "the engine thread panicked");
        }
        // Joins the dispatcher.
        drop(fallback);
    }
}

/// A communicator is shared by threads (`&Communicator` from any of them, as the module docs
/// say) and moved between them; requests and errors move too.
const _: () = {
    const fn shared<T: Send + Sync>() {}
    const fn moved<T: Send>() {}
    shared::<Communicator>();
    moved::<Request<f32>>();
    shared::<CommError>();
    shared::<BuildError>();
    shared::<SplitError>();
};
