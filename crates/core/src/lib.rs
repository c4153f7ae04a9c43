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
//! ## The run loop
//! 1. Create a [`Session`] per rank from a validated [`Config`].
//! 2. Start a collective with a command ([`Session::start_broadcast`]) on every rank.
//! 3. Feed inputs as they happen: [`Session::handle_chunk`] for each multicast chunk (then copy
//!    the payload where the returned [`Placement`] says), [`Session::handle_control`] for each
//!    control message, [`Session::handle_read_done`] / [`Session::handle_send_done`] for
//!    transport completions, [`Session::handle_timeout`] when the timer fires.
//! 4. After every command or input, drain [`Session::poll_transmit`] until `None` and act on each
//!    [`Transmit`].
//! 5. Drain [`Session::poll_event`]: [`Event::Completed`] releases the buffer,
//!    [`Event::Failed`] carries a typed [`OpError`].
//! 6. Arm the timer from [`Session::poll_timeout`] and go back to 3.
//!
//! ```
//! use ringcast_core::{Config, Instant, Rank, Session, Transmit};
//! let mut leaf = Session::new(Config::new(1, 2)).unwrap();
//! let op = leaf.start_broadcast(Instant::ZERO, Rank(0), 8192).unwrap();
//! let mut buf = Vec::new();
//! // The leaf's first output: `Ready` to the root (the RNR barrier).
//! assert!(matches!(leaf.poll_transmit(&mut buf), Some(Transmit::Control { to: Rank(0), .. })));
//! # let _ = op;
//! ```

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
mod ring;
mod rxview;
mod schedule;
mod send;
mod session;
mod time;
mod timer;
pub mod wire;

pub use config::{Config, ConfigError, Limits, Rank};
pub use event::{
    DropReason, Event, OpError, OpId, Placement, ReadError, ReadId, StartError, Stats, Transmit,
};
pub use lane::Multicast;
pub use node::Node;
pub use session::Session;
pub use time::Instant;
pub use wire::ChunkRun;
