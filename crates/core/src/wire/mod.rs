//! Zero-copy views over untrusted bytes, in the smoltcp style.
//!
//! Every decoder here checks lengths once (`new_checked` / `check_len`); after that no accessor
//! panics. `Repr` types are the validated, owned-or-borrowed meaning of a packet and `emit`
//! writes them back byte for byte.
//!
//! Parsing fails with the unit [`Error`] (the bytes are not a valid packet), except the RoCEv2
//! UD receive check, which says why with [`RoceDrop`] so that transports can count drops by
//! reason. Emitting fails with [`EmitError`], which gives the buffer size needed when the
//! caller's buffer is too small.

mod control;
mod imm;
mod roce;
mod run;

pub use control::{
    ControlKind, ControlPacket, ControlRepr, HEADER_LEN as CONTROL_HEADER_LEN,
    MAX_LEN as CONTROL_MAX_LEN, RunList, Standing, VERSION as CONTROL_VERSION,
};
pub use imm::{Imm, ImmLayout};
pub use roce::{
    AETH_LEN, AethPacket, AethRepr, BTH_LEN, BthPacket, BthRepr, DEFAULT_P_KEY, DETH_LEN,
    DethPacket, DethRepr, ICRC_LEN, ICRC_PREFIX_LEN, ICRC_SEED, IMMDT_LEN, ImmDtPacket,
    MULTICAST_QPN, Opcode, RETH_LEN, ROCEV2_UDP_PORT, RethPacket, RethRepr, RoceDrop, RoceFlow,
    UD_SEND_IMM_HEADER_LEN, UD_SEND_IMM_OVERHEAD, UdKeys, UdSendImmPacket, UdSendImmRepr,
    icrc_mask_ipv4, icrc_rest,
};
pub use run::ChunkRun;

use core::fmt;

/// The one error type of the wire module's parsers: the bytes are not a valid packet.
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

/// Why a `Repr` could not be written.
///
/// ```
/// # use ringcast_core::wire::{ControlRepr, EmitError};
/// let fin = ControlRepr::Fin { op: 1 };
/// let mut small = [0u8; 4];
/// assert_eq!(
///     fin.emit(&mut small),
///     Err(EmitError::BufferTooSmall { required: fin.buffer_len() })
/// );
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum EmitError {
    /// The buffer is shorter than the message; retry with at least `required` bytes.
    BufferTooSmall {
        /// Bytes the message needs.
        required: usize,
    },
    /// The value has no canonical encoding: a field does not fit its bits, or a run list is
    /// empty, unsorted, overlapping, adjacent or too long.
    NotCanonical,
}

impl fmt::Display for EmitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EmitError::BufferTooSmall { required } => {
                write!(f, "buffer too small: {required} bytes required")
            }
            EmitError::NotCanonical => f.write_str("value has no canonical encoding"),
        }
    }
}

impl core::error::Error for EmitError {}

/// Checks that `buf` holds at least `required` bytes and returns exactly those.
fn emit_buf(buf: &mut [u8], required: usize) -> core::result::Result<&mut [u8], EmitError> {
    buf.get_mut(..required)
        .ok_or(EmitError::BufferTooSmall { required })
}
