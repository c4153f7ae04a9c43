//! # ringcast-core
//!
//! The sans-IO protocol core of ringcast: reliable, bandwidth-optimal Broadcast over an
//! unreliable multicast fabric, repaired through a ring of neighbours.
//!
//! The core is fully deterministic: it performs no I/O, reads no clock, spawns no thread and
//! draws no random number. Time comes in as an argument ([`Instant`]); the same inputs at the
//! same times give the same outputs. It never touches payload bytes either: it tells the driver
//! where a chunk goes ([`Placement`]) and what to send or read ([`Transmit`]).
//!
//! ## The run loop (one thread)
//! 1. Create a [`Node`] per rank from a validated [`Config`]: the [`Session`] (control path)
//!    and one [`LaneRx`](lane::LaneRx) / [`LaneTx`](lane::LaneTx) per lane (hot path).
//! 2. Start a collective with a command ([`Node::start_broadcast`],
//!    [`Node::start_allgather`]) on every rank.
//! 3. Feed inputs as they happen: [`Node::handle_chunk`] for each multicast chunk (copy the
//!    payload where the returned [`Placement`] says, then [`Node::commit`]),
//!    [`Node::handle_control`] for each control message, [`Node::handle_read_done`] /
//!    [`Node::handle_send_done`] for transport completions, [`Node::handle_timeout`] when
//!    the timer fires.
//! 4. After every command or input, drain [`Node::poll_transmit`] (control messages and
//!    reads) and [`Node::poll_multicast`] until `None` and act on each.
//! 5. Drain [`Node::poll_event`]: [`Event::Completed`] releases the buffer,
//!    [`Event::Failed`] carries a typed [`OpError`].
//! 6. Arm the timer from [`Node::poll_timeout`] and go back to 3.
//!
//! A transport that implements the [`port`] traits gets steps 3 to 5 from [`port::pump`].
//!
//! ```
//! use ringcast_core::{Config, Instant, Node, Rank, Transmit};
//! let mut leaf = Node::new(Config::new(1, 2)).unwrap();
//! let op = leaf.start_broadcast(Instant::ZERO, Rank(0), 8192).unwrap();
//! let mut buf = Vec::new();
//! // The leaf's first output: `Ready` to the root (the RNR barrier).
//! assert!(matches!(leaf.poll_transmit(&mut buf), Some(Transmit::Control { to: Rank(0), .. })));
//! # let _ = op;
//! ```
//!
//! ## Threads and lanes
//! Which type lives where, in an engine that gives every worker its own thread:
//!
//! | type | owner | touches |
//! |---|---|---|
//! | [`Session`] | the control thread (one per rank) | barrier, ring recovery, chains, timers, events |
//! | [`LaneRx`](lane::LaneRx) | lane `l`'s receive worker | lane `l`'s bitmaps and placement arithmetic, its counters |
//! | [`LaneTx`](lane::LaneTx) | lane `l`'s send worker | the active roots' cursors on lane `l`, its send window |
//! | [`Node`] | one thread holding all three | everything, commands and notes passed in place |
//!
//! All are `Send`; none is `Sync`-shared, none takes a lock or uses an atomic. The session
//! and the lanes exchange [`LaneCommand`](lane::LaneCommand)s and [`LaneNote`](lane::LaneNote)s:
//! a driver on one thread passes them in place ([`Node`]); an engine passes them over
//! bounded single-producer single-consumer queues. The rules that keep this safe (a lane
//! handles its commands before later chunks; a chunk is committed after its payload is
//! written, before the lane's next command) are in [`lane`]. The lanes hand their bitmaps to
//! the session at the cutoff instead of answering queries, so the control path never waits
//! on a hot-path thread and the hot path never waits on the control path. `LaneRx` and
//! `LaneTx` build for `riscv64gc-unknown-none-elf`: they are the kernels a DPA offload runs.

#![no_std]
#![forbid(unsafe_code)]
#![warn(missing_docs)]

extern crate alloc;
#[cfg(feature = "std")]
extern crate std;

mod barrier;
pub mod bitmap;
mod config;
mod event;
pub mod lane;
mod layout;
mod node;
mod op;
mod out;
pub mod port;
mod reports;
mod ring;
mod rxview;
mod schedule;
mod send;
mod session;
mod shape;
mod time;
mod timer;
pub mod wire;

pub use config::{Config, ConfigError, Limits, MAX_TIMEOUT, Rank};
pub use event::{
    DropReason, Event, OpError, OpId, Placement, ReadError, ReadId, StartError, Stats, Transmit,
};
pub use lane::Multicast;
pub use node::Node;
pub use reports::Reports;
pub use session::Session;
pub use shape::{allgather_shape, allgather_shape_tagged, broadcast_shape};
pub use time::Instant;
pub use wire::ChunkRun;
