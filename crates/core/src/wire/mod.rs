//! Zero-copy views over untrusted bytes, in the smoltcp style.
//!
//! Every decoder here checks lengths once (`new_checked` / `check_len`); after that no accessor
//! panics. `Repr` types are the validated, owned-or-borrowed meaning of a packet and `emit`
//! writes them back byte for byte.

mod control;
mod imm;

pub use control::{
    ChunkRun, ControlKind, ControlPacket, ControlRepr, HEADER_LEN as CONTROL_HEADER_LEN, RunList,
    VERSION as CONTROL_VERSION,
};
pub use imm::{Imm, ImmLayout};

use core::fmt;

/// The one error type of the wire module: the bytes are not a valid packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Error;

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("malformed packet")
    }
}

impl core::error::Error for Error {}

/// Result of a wire operation.
pub type Result<T> = core::result::Result<T, Error>;
