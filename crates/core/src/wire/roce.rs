//! RoCEv2 headers (InfiniBand transport headers in a UDP datagram, port 4791) and the ICRC
//! recipe.
//!
//! ```text
//! BTH   0        1                    2       4              5        8              9     12
//!       | opcode | SE M PadCnt TVer   | P_Key | FECN BECN rsv | DestQP | AckReq rsv   | PSN |
//! DETH  | Q_Key (4) | reserved (1) | SrcQP (3) |
//! ImmDt | immediate (4) |
//! RETH  | virtual address (8) | R_Key (4) | DMA length (4) |
//! AETH  | syndrome (1) | MSN (3) |
//! ```
//! Integers are big-endian, except the ICRC, which is sent least-significant byte first.
//!
//! The data path sends UD SEND_ONLY_WITH_IMMEDIATE packets; their UDP payload is
//! `BTH | DETH | ImmDt | payload | pad | ICRC` ([`UdSendImmPacket`]). The ICRC is a CRC-32 that
//! the core does not compute (it takes no dependency): it lays out the masked bytes the CRC
//! covers ([`RoceFlow::icrc_prefix`], [`icrc_rest`], [`icrc_mask_ipv4`]) and the transport
//! hashes them.

use super::{EmitError, Error, Result, emit_buf};
use core::fmt;

mod field {
    use core::ops::Range;

    // BTH
    pub(super) const OPCODE: usize = 0;
    /// SE (bit 7), MigReq (bit 6), PadCnt (bits 5-4), TVer (bits 3-0).
    pub(super) const FLAGS: usize = 1;
    pub(super) const P_KEY: Range<usize> = 2..4;
    /// FECN (bit 7), BECN (bit 6), reserved (bits 5-0). Masked in the ICRC.
    pub(super) const ECN: usize = 4;
    pub(super) const DEST_QP: Range<usize> = 5..8;
    /// AckReq (bit 7), reserved (bits 6-0).
    pub(super) const ACK_REQ: usize = 8;
    pub(super) const PSN: Range<usize> = 9..12;

    // DETH
    pub(super) const Q_KEY: Range<usize> = 0..4;
    pub(super) const DETH_RESERVED: usize = 4;
    pub(super) const SRC_QP: Range<usize> = 5..8;

    // ImmDt
    pub(super) const IMM: Range<usize> = 0..4;

    // RETH
    pub(super) const VA: Range<usize> = 0..8;
    pub(super) const R_KEY: Range<usize> = 8..12;
    pub(super) const DMA_LEN: Range<usize> = 12..16;

    // AETH
    pub(super) const SYNDROME: usize = 0;
    pub(super) const MSN: Range<usize> = 1..4;

    // IPv4 header (no options) and UDP header, for the ICRC.
    pub(super) const IP_VER_IHL: usize = 0;
    pub(super) const IP_TOS: usize = 1;
    pub(super) const IP_TOTAL_LEN: Range<usize> = 2..4;
    pub(super) const IP_ID: Range<usize> = 4..6;
    pub(super) const IP_FLAGS_FRAG: Range<usize> = 6..8;
    pub(super) const IP_TTL: usize = 8;
    pub(super) const IP_PROTOCOL: usize = 9;
    pub(super) const IP_CHECKSUM: Range<usize> = 10..12;
    pub(super) const IP_SRC: Range<usize> = 12..16;
    pub(super) const IP_DST: Range<usize> = 16..20;
    pub(super) const UDP_SRC_PORT: Range<usize> = 0..2;
    pub(super) const UDP_DST_PORT: Range<usize> = 2..4;
    pub(super) const UDP_LEN: Range<usize> = 4..6;
    pub(super) const UDP_CHECKSUM: Range<usize> = 6..8;
}

const SE: u8 = 0x80;
const MIG_REQ: u8 = 0x40;
const PAD_SHIFT: u32 = 4;
const PAD_MASK: u8 = 0x30;
const TVER_MASK: u8 = 0x0f;
const FECN: u8 = 0x80;
const BECN: u8 = 0x40;
const ECN_RESERVED: u8 = 0x3f;
const ACK_REQ: u8 = 0x80;
const ACK_RESERVED: u8 = 0x7f;
const U24_MAX: u32 = 0x00ff_ffff;

/// Bytes of the Base Transport Header.
pub const BTH_LEN: usize = 12;
/// Bytes of the Datagram Extended Transport Header.
pub const DETH_LEN: usize = 8;
/// Bytes of the Immediate Data header.
pub const IMMDT_LEN: usize = 4;
/// Bytes of the RDMA Extended Transport Header.
pub const RETH_LEN: usize = 16;
/// Bytes of the ACK Extended Transport Header.
pub const AETH_LEN: usize = 4;
/// Bytes of the invariant CRC that ends every RoCEv2 packet.
pub const ICRC_LEN: usize = 4;
/// Headers of a UD SEND_ONLY_WITH_IMMEDIATE packet before the payload: BTH, DETH, ImmDt.
pub const UD_SEND_IMM_HEADER_LEN: usize = BTH_LEN + DETH_LEN + IMMDT_LEN;
/// Bytes of a UD SEND_ONLY_WITH_IMMEDIATE packet besides payload and pad: headers and ICRC.
pub const UD_SEND_IMM_OVERHEAD: usize = UD_SEND_IMM_HEADER_LEN + ICRC_LEN;

/// The UDP destination port IANA assigned to RoCEv2.
pub const ROCEV2_UDP_PORT: u16 = 4791;
/// The default partition key (full member of the default partition).
pub const DEFAULT_P_KEY: u16 = 0xffff;
/// The destination QP number of every multicast packet.
pub const MULTICAST_QPN: u32 = 0x00ff_ffff;

/// Eight bytes of all-ones that precede the masked packet in the ICRC computation.
pub const ICRC_SEED: [u8; 8] = [0xff; 8];
/// Bytes [`RoceFlow::icrc_prefix`] yields: the seed, the masked IPv4 and UDP headers, and the
/// first 8 BTH bytes (opcode to DestQP, byte 4 masked).
pub const ICRC_PREFIX_LEN: usize = ICRC_SEED.len() + IPV4_HEADER_LEN + UDP_HEADER_LEN + ICRC_BTH;

const IPV4_HEADER_LEN: usize = 20;
const UDP_HEADER_LEN: usize = 8;
/// The BTH bytes the ICRC prefix holds; the rest of the packet is hashed as sent.
const ICRC_BTH: usize = 8;

fn be_u24(b: &[u8]) -> u32 {
    u32::from_be_bytes([0, b[0], b[1], b[2]])
}
fn put_u24(b: &mut [u8], v: u32) {
    b.copy_from_slice(&v.to_be_bytes()[1..]);
}
fn be_u16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}
fn be_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}
fn set_bit(b: &mut u8, mask: u8, on: bool) {
    if on { *b |= mask } else { *b &= !mask }
}

/// A BTH opcode: transport (high 3 bits) and operation (low 5 bits).
///
/// ```
/// # use ringcast_core::wire::Opcode;
/// assert_eq!(Opcode::UD_SEND_ONLY_WITH_IMMEDIATE, Opcode(0x65));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Opcode(pub u8);

impl Opcode {
    /// RC SEND Only.
    pub const RC_SEND_ONLY: Opcode = Opcode(0x04);
    /// RC SEND Only with Immediate.
    pub const RC_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x05);
    /// RC RDMA WRITE First.
    pub const RC_RDMA_WRITE_FIRST: Opcode = Opcode(0x06);
    /// RC RDMA WRITE Middle.
    pub const RC_RDMA_WRITE_MIDDLE: Opcode = Opcode(0x07);
    /// RC RDMA WRITE Last.
    pub const RC_RDMA_WRITE_LAST: Opcode = Opcode(0x08);
    /// RC RDMA WRITE Last with Immediate.
    pub const RC_RDMA_WRITE_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x09);
    /// RC RDMA WRITE Only.
    pub const RC_RDMA_WRITE_ONLY: Opcode = Opcode(0x0a);
    /// RC RDMA WRITE Only with Immediate.
    pub const RC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x0b);
    /// RC RDMA READ Request.
    pub const RC_RDMA_READ_REQUEST: Opcode = Opcode(0x0c);
    /// RC RDMA READ Response Only.
    pub const RC_RDMA_READ_RESPONSE_ONLY: Opcode = Opcode(0x10);
    /// RC Acknowledge (carries an AETH).
    pub const RC_ACKNOWLEDGE: Opcode = Opcode(0x11);
    /// UC RDMA WRITE First.
    pub const UC_RDMA_WRITE_FIRST: Opcode = Opcode(0x26);
    /// UC RDMA WRITE Middle.
    pub const UC_RDMA_WRITE_MIDDLE: Opcode = Opcode(0x27);
    /// UC RDMA WRITE Last.
    pub const UC_RDMA_WRITE_LAST: Opcode = Opcode(0x28);
    /// UC RDMA WRITE Last with Immediate.
    pub const UC_RDMA_WRITE_LAST_WITH_IMMEDIATE: Opcode = Opcode(0x29);
    /// UC RDMA WRITE Only.
    pub const UC_RDMA_WRITE_ONLY: Opcode = Opcode(0x2a);
    /// UC RDMA WRITE Only with Immediate.
    pub const UC_RDMA_WRITE_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x2b);
    /// UD SEND Only.
    pub const UD_SEND_ONLY: Opcode = Opcode(0x64);
    /// UD SEND Only with Immediate: ringcast's data packet.
    pub const UD_SEND_ONLY_WITH_IMMEDIATE: Opcode = Opcode(0x65);
    /// RoCEv2 Congestion Notification Packet.
    pub const CNP: Opcode = Opcode(0x81);
}

impl fmt::Display for Opcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:#04x}", self.0)
    }
}

/// Declares a fixed-size header view: the struct and its length checks.
macro_rules! header_view {
    ($(#[$doc:meta])* $name:ident, $len:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone)]
        pub struct $name<T: AsRef<[u8]>> {
            buffer: T,
        }

        impl<T: AsRef<[u8]>> $name<T> {
            /// Wraps a buffer without checking it; accessors may panic until
            /// [`Self::check_len`] passed.
            pub fn new_unchecked(buffer: T) -> Self {
                Self { buffer }
            }

            /// Wraps a buffer and checks that it holds the whole header.
            pub fn new_checked(buffer: T) -> Result<Self> {
                let p = Self::new_unchecked(buffer);
                p.check_len()?;
                Ok(p)
            }

            /// Checks that the buffer holds the whole header (bytes after it are ignored).
            pub fn check_len(&self) -> Result<()> {
                if self.buffer.as_ref().len() < $len {
                    Err(Error)
                } else {
                    Ok(())
                }
            }

            /// Gives the buffer back.
            pub fn into_inner(self) -> T {
                self.buffer
            }
        }
    };
}

header_view!(
    /// A view of a Base Transport Header (12 bytes).
    BthPacket,
    BTH_LEN
);
header_view!(
    /// A view of a Datagram Extended Transport Header (8 bytes).
    DethPacket,
    DETH_LEN
);
header_view!(
    /// A view of an Immediate Data header (4 bytes).
    ImmDtPacket,
    IMMDT_LEN
);
header_view!(
    /// A view of an RDMA Extended Transport Header (16 bytes).
    RethPacket,
    RETH_LEN
);
header_view!(
    /// A view of an ACK Extended Transport Header (4 bytes).
    AethPacket,
    AETH_LEN
);

impl<T: AsRef<[u8]>> BthPacket<T> {
    /// Operation code.
    pub fn opcode(&self) -> Opcode {
        Opcode(self.buffer.as_ref()[field::OPCODE])
    }
    /// Solicited event bit.
    pub fn solicited(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & SE != 0
    }
    /// Migration request bit.
    pub fn mig_req(&self) -> bool {
        self.buffer.as_ref()[field::FLAGS] & MIG_REQ != 0
    }
    /// Pad bytes (0-3) between the payload and the ICRC.
    pub fn pad_count(&self) -> u8 {
        (self.buffer.as_ref()[field::FLAGS] & PAD_MASK) >> PAD_SHIFT
    }
    /// Transport header version; 0 is the only one defined.
    pub fn tver(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS] & TVER_MASK
    }
    /// Partition key.
    pub fn p_key(&self) -> u16 {
        be_u16(&self.buffer.as_ref()[field::P_KEY])
    }
    /// Forward explicit congestion notification bit.
    pub fn fecn(&self) -> bool {
        self.buffer.as_ref()[field::ECN] & FECN != 0
    }
    /// Backward explicit congestion notification bit.
    pub fn becn(&self) -> bool {
        self.buffer.as_ref()[field::ECN] & BECN != 0
    }
    /// Destination queue pair (24 bits).
    pub fn dest_qp(&self) -> u32 {
        be_u24(&self.buffer.as_ref()[field::DEST_QP])
    }
    /// Acknowledge request bit.
    pub fn ack_req(&self) -> bool {
        self.buffer.as_ref()[field::ACK_REQ] & ACK_REQ != 0
    }
    /// Packet sequence number (24 bits).
    pub fn psn(&self) -> u32 {
        be_u24(&self.buffer.as_ref()[field::PSN])
    }
    /// True when a reserved bit (byte 4 bits 5-0, byte 8 bits 6-0) is set.
    pub fn reserved_set(&self) -> bool {
        let b = self.buffer.as_ref();
        b[field::ECN] & ECN_RESERVED != 0 || b[field::ACK_REQ] & ACK_RESERVED != 0
    }
}

/// Setters. The 24-bit fields keep the low 24 bits of what they are given; reserved bits are
/// cleared by [`BthRepr::emit`], not by the setters.
impl<T: AsRef<[u8]> + AsMut<[u8]>> BthPacket<T> {
    /// Sets the operation code.
    pub fn set_opcode(&mut self, v: Opcode) {
        self.buffer.as_mut()[field::OPCODE] = v.0;
    }
    /// Sets the solicited event bit.
    pub fn set_solicited(&mut self, v: bool) {
        set_bit(&mut self.buffer.as_mut()[field::FLAGS], SE, v);
    }
    /// Sets the migration request bit.
    pub fn set_mig_req(&mut self, v: bool) {
        set_bit(&mut self.buffer.as_mut()[field::FLAGS], MIG_REQ, v);
    }
    /// Sets the pad count (low 2 bits of `v`).
    pub fn set_pad_count(&mut self, v: u8) {
        let b = &mut self.buffer.as_mut()[field::FLAGS];
        *b = (*b & !PAD_MASK) | ((v << PAD_SHIFT) & PAD_MASK);
    }
    /// Sets the transport header version (low 4 bits of `v`).
    pub fn set_tver(&mut self, v: u8) {
        let b = &mut self.buffer.as_mut()[field::FLAGS];
        *b = (*b & !TVER_MASK) | (v & TVER_MASK);
    }
    /// Sets the partition key.
    pub fn set_p_key(&mut self, v: u16) {
        self.buffer.as_mut()[field::P_KEY].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets the FECN bit.
    pub fn set_fecn(&mut self, v: bool) {
        set_bit(&mut self.buffer.as_mut()[field::ECN], FECN, v);
    }
    /// Sets the BECN bit.
    pub fn set_becn(&mut self, v: bool) {
        set_bit(&mut self.buffer.as_mut()[field::ECN], BECN, v);
    }
    /// Sets the destination queue pair (low 24 bits of `v`).
    pub fn set_dest_qp(&mut self, v: u32) {
        put_u24(&mut self.buffer.as_mut()[field::DEST_QP], v);
    }
    /// Sets the acknowledge request bit.
    pub fn set_ack_req(&mut self, v: bool) {
        set_bit(&mut self.buffer.as_mut()[field::ACK_REQ], ACK_REQ, v);
    }
    /// Sets the packet sequence number (low 24 bits of `v`).
    pub fn set_psn(&mut self, v: u32) {
        put_u24(&mut self.buffer.as_mut()[field::PSN], v);
    }
}

/// The meaning of a BTH. Reserved bits are zero and TVer is 0 in every valid one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BthRepr {
    /// Operation code.
    pub opcode: Opcode,
    /// Solicited event.
    pub solicited: bool,
    /// Migration request.
    pub mig_req: bool,
    /// Pad bytes before the ICRC (0-3).
    pub pad_count: u8,
    /// Partition key.
    pub p_key: u16,
    /// Forward congestion notification.
    pub fecn: bool,
    /// Backward congestion notification.
    pub becn: bool,
    /// Destination queue pair (24 bits).
    pub dest_qp: u32,
    /// Acknowledge request.
    pub ack_req: bool,
    /// Packet sequence number (24 bits).
    pub psn: u32,
}

impl BthRepr {
    /// Parses a BTH; fails on a short buffer, TVer other than 0, or a reserved bit set.
    pub fn parse<T: AsRef<[u8]>>(packet: &BthPacket<T>) -> Result<Self> {
        packet.check_len()?;
        if packet.tver() != 0 || packet.reserved_set() {
            return Err(Error);
        }
        Ok(BthRepr {
            opcode: packet.opcode(),
            solicited: packet.solicited(),
            mig_req: packet.mig_req(),
            pad_count: packet.pad_count(),
            p_key: packet.p_key(),
            fecn: packet.fecn(),
            becn: packet.becn(),
            dest_qp: packet.dest_qp(),
            ack_req: packet.ack_req(),
            psn: packet.psn(),
        })
    }

    /// Bytes [`Self::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        BTH_LEN
    }

    /// Writes the header into the first [`BTH_LEN`] bytes of `buf` and returns that length.
    ///
    /// Fails with [`EmitError::NotCanonical`] if the pad count exceeds 3 or the DestQP or PSN
    /// exceeds 24 bits.
    pub fn emit(&self, buf: &mut [u8]) -> core::result::Result<usize, EmitError> {
        if self.pad_count > 3 || self.dest_qp > U24_MAX || self.psn > U24_MAX {
            return Err(EmitError::NotCanonical);
        }
        let buf = emit_buf(buf, BTH_LEN)?;
        // Zero first: TVer 0 and every reserved bit clear.
        buf.fill(0);
        let mut p = BthPacket::new_unchecked(buf);
        p.set_opcode(self.opcode);
        p.set_solicited(self.solicited);
        p.set_mig_req(self.mig_req);
        p.set_pad_count(self.pad_count);
        p.set_p_key(self.p_key);
        p.set_fecn(self.fecn);
        p.set_becn(self.becn);
        p.set_dest_qp(self.dest_qp);
        p.set_ack_req(self.ack_req);
        p.set_psn(self.psn);
        Ok(BTH_LEN)
    }
}

impl<T: AsRef<[u8]>> DethPacket<T> {
    /// Queue key.
    pub fn q_key(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[field::Q_KEY])
    }
    /// The reserved byte.
    pub fn reserved(&self) -> u8 {
        self.buffer.as_ref()[field::DETH_RESERVED]
    }
    /// Source queue pair (24 bits).
    pub fn src_qp(&self) -> u32 {
        be_u24(&self.buffer.as_ref()[field::SRC_QP])
    }
}

/// Setters.
impl<T: AsRef<[u8]> + AsMut<[u8]>> DethPacket<T> {
    /// Sets the queue key.
    pub fn set_q_key(&mut self, v: u32) {
        self.buffer.as_mut()[field::Q_KEY].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets the reserved byte.
    pub fn set_reserved(&mut self, v: u8) {
        self.buffer.as_mut()[field::DETH_RESERVED] = v;
    }
    /// Sets the source queue pair (low 24 bits of `v`).
    pub fn set_src_qp(&mut self, v: u32) {
        put_u24(&mut self.buffer.as_mut()[field::SRC_QP], v);
    }
}

/// The meaning of a DETH.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DethRepr {
    /// Queue key.
    pub q_key: u32,
    /// Source queue pair (24 bits).
    pub src_qp: u32,
}

impl DethRepr {
    /// Parses a DETH; fails on a short buffer or a non-zero reserved byte.
    pub fn parse<T: AsRef<[u8]>>(packet: &DethPacket<T>) -> Result<Self> {
        packet.check_len()?;
        if packet.reserved() != 0 {
            return Err(Error);
        }
        Ok(DethRepr {
            q_key: packet.q_key(),
            src_qp: packet.src_qp(),
        })
    }

    /// Bytes [`Self::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        DETH_LEN
    }

    /// Writes the header into the first [`DETH_LEN`] bytes of `buf` and returns that length;
    /// [`EmitError::NotCanonical`] if the SrcQP exceeds 24 bits.
    pub fn emit(&self, buf: &mut [u8]) -> core::result::Result<usize, EmitError> {
        if self.src_qp > U24_MAX {
            return Err(EmitError::NotCanonical);
        }
        let mut p = DethPacket::new_unchecked(emit_buf(buf, DETH_LEN)?);
        p.set_q_key(self.q_key);
        p.set_reserved(0);
        p.set_src_qp(self.src_qp);
        Ok(DETH_LEN)
    }
}

impl<T: AsRef<[u8]>> ImmDtPacket<T> {
    /// The immediate value.
    pub fn imm(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[field::IMM])
    }
}

/// Setters.
impl<T: AsRef<[u8]> + AsMut<[u8]>> ImmDtPacket<T> {
    /// Sets the immediate value.
    pub fn set_imm(&mut self, v: u32) {
        self.buffer.as_mut()[field::IMM].copy_from_slice(&v.to_be_bytes());
    }
}

impl<T: AsRef<[u8]>> RethPacket<T> {
    /// Remote virtual address.
    pub fn va(&self) -> u64 {
        let b = &self.buffer.as_ref()[field::VA];
        u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
    }
    /// Remote key.
    pub fn r_key(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[field::R_KEY])
    }
    /// Bytes of the whole RDMA operation.
    pub fn dma_len(&self) -> u32 {
        be_u32(&self.buffer.as_ref()[field::DMA_LEN])
    }
}

/// Setters.
impl<T: AsRef<[u8]> + AsMut<[u8]>> RethPacket<T> {
    /// Sets the remote virtual address.
    pub fn set_va(&mut self, v: u64) {
        self.buffer.as_mut()[field::VA].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets the remote key.
    pub fn set_r_key(&mut self, v: u32) {
        self.buffer.as_mut()[field::R_KEY].copy_from_slice(&v.to_be_bytes());
    }
    /// Sets the DMA length.
    pub fn set_dma_len(&mut self, v: u32) {
        self.buffer.as_mut()[field::DMA_LEN].copy_from_slice(&v.to_be_bytes());
    }
}

/// The meaning of a RETH.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RethRepr {
    /// Remote virtual address.
    pub va: u64,
    /// Remote key.
    pub r_key: u32,
    /// Bytes of the whole RDMA operation.
    pub dma_len: u32,
}

impl RethRepr {
    /// Parses a RETH; fails only on a short buffer.
    pub fn parse<T: AsRef<[u8]>>(packet: &RethPacket<T>) -> Result<Self> {
        packet.check_len()?;
        Ok(RethRepr {
            va: packet.va(),
            r_key: packet.r_key(),
            dma_len: packet.dma_len(),
        })
    }

    /// Bytes [`Self::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        RETH_LEN
    }

    /// Writes the header into the first [`RETH_LEN`] bytes of `buf` and returns that length.
    pub fn emit(&self, buf: &mut [u8]) -> core::result::Result<usize, EmitError> {
        let mut p = RethPacket::new_unchecked(emit_buf(buf, RETH_LEN)?);
        p.set_va(self.va);
        p.set_r_key(self.r_key);
        p.set_dma_len(self.dma_len);
        Ok(RETH_LEN)
    }
}

impl<T: AsRef<[u8]>> AethPacket<T> {
    /// Syndrome: ACK, RNR NAK or NAK, with its credit count, timer or code.
    pub fn syndrome(&self) -> u8 {
        self.buffer.as_ref()[field::SYNDROME]
    }
    /// Message sequence number (24 bits).
    pub fn msn(&self) -> u32 {
        be_u24(&self.buffer.as_ref()[field::MSN])
    }
}

/// Setters.
impl<T: AsRef<[u8]> + AsMut<[u8]>> AethPacket<T> {
    /// Sets the syndrome.
    pub fn set_syndrome(&mut self, v: u8) {
        self.buffer.as_mut()[field::SYNDROME] = v;
    }
    /// Sets the message sequence number (low 24 bits of `v`).
    pub fn set_msn(&mut self, v: u32) {
        put_u24(&mut self.buffer.as_mut()[field::MSN], v);
    }
}

/// The meaning of an AETH.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AethRepr {
    /// Syndrome byte.
    pub syndrome: u8,
    /// Message sequence number (24 bits).
    pub msn: u32,
}

impl AethRepr {
    /// Parses an AETH; fails only on a short buffer.
    pub fn parse<T: AsRef<[u8]>>(packet: &AethPacket<T>) -> Result<Self> {
        packet.check_len()?;
        Ok(AethRepr {
            syndrome: packet.syndrome(),
            msn: packet.msn(),
        })
    }

    /// Bytes [`Self::emit`] writes.
    pub const fn buffer_len(&self) -> usize {
        AETH_LEN
    }

    /// Writes the header into the first [`AETH_LEN`] bytes of `buf` and returns that length;
    /// [`EmitError::NotCanonical`] if the MSN exceeds 24 bits.
    pub fn emit(&self, buf: &mut [u8]) -> core::result::Result<usize, EmitError> {
        if self.msn > U24_MAX {
            return Err(EmitError::NotCanonical);
        }
        let mut p = AethPacket::new_unchecked(emit_buf(buf, AETH_LEN)?);
        p.set_syndrome(self.syndrome);
        p.set_msn(self.msn);
        Ok(AETH_LEN)
    }
}

/// The keys a receiver expects in every data packet, and a sender writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UdKeys {
    /// Partition key, compared for equality (ringcast's senders and receivers share one).
    pub p_key: u16,
    /// Destination QP: [`MULTICAST_QPN`] for multicast.
    pub dest_qp: u32,
    /// Queue key, derived from the job's nonce so that two jobs never accept each other's
    /// packets.
    pub q_key: u32,
}

impl UdKeys {
    /// Multicast keys: the default P_Key, DestQP [`MULTICAST_QPN`], and `q_key`.
    pub const fn multicast(q_key: u32) -> Self {
        UdKeys {
            p_key: DEFAULT_P_KEY,
            dest_qp: MULTICAST_QPN,
            q_key,
        }
    }
}

/// Why a datagram is not an acceptable UD SEND_ONLY_WITH_IMMEDIATE packet, in the order the
/// checks run (a datagram wrong in several ways reports the first).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum RoceDrop {
    /// Shorter than the headers and ICRC, or than the pad count it announces.
    Truncated,
    /// Another opcode.
    Opcode,
    /// Another partition key.
    PKey,
    /// Another destination QP.
    DestQp,
    /// Another queue key (another job, or stray traffic).
    QKey,
    /// A transport header version other than 0.
    Version,
    /// A reserved bit or pad byte set, or payload and pad not a multiple of 4 bytes.
    Malformed,
}

impl RoceDrop {
    /// Number of reasons: the size of a counter array indexed by [`Self::index`].
    pub const COUNT: usize = 7;
    /// Every reason, in check order (`ALL[r.index()] == r`).
    pub const ALL: [RoceDrop; Self::COUNT] = [
        RoceDrop::Truncated,
        RoceDrop::Opcode,
        RoceDrop::PKey,
        RoceDrop::DestQp,
        RoceDrop::QKey,
        RoceDrop::Version,
        RoceDrop::Malformed,
    ];

    /// A dense index below [`Self::COUNT`], for per-reason counters.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// A short name for logs and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            RoceDrop::Truncated => "truncated",
            RoceDrop::Opcode => "opcode",
            RoceDrop::PKey => "p_key",
            RoceDrop::DestQp => "dest_qp",
            RoceDrop::QKey => "q_key",
            RoceDrop::Version => "version",
            RoceDrop::Malformed => "malformed",
        }
    }
}

impl fmt::Display for RoceDrop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl core::error::Error for RoceDrop {}

/// Pad bytes that make `payload_len` a multiple of 4.
const fn pad_for(payload_len: usize) -> u8 {
    ((4 - payload_len % 4) % 4) as u8
}

/// A view of a whole UD SEND_ONLY_WITH_IMMEDIATE UDP payload:
/// `BTH | DETH | ImmDt | payload | pad | ICRC`.
#[derive(Debug, Clone)]
pub struct UdSendImmPacket<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> UdSendImmPacket<T> {
    /// Wraps a buffer without checking it; accessors may panic until [`Self::check_len`] passed.
    pub fn new_unchecked(buffer: T) -> Self {
        UdSendImmPacket { buffer }
    }

    /// Wraps a buffer and checks its length.
    pub fn new_checked(buffer: T) -> Result<Self> {
        let p = Self::new_unchecked(buffer);
        p.check_len()?;
        Ok(p)
    }

    /// Checks that the buffer holds the headers, the ICRC, and the pad bytes the BTH announces.
    pub fn check_len(&self) -> Result<()> {
        let b = self.buffer.as_ref();
        if b.len() < UD_SEND_IMM_OVERHEAD {
            return Err(Error);
        }
        let pad = usize::from(self.bth().pad_count());
        if b.len() - UD_SEND_IMM_OVERHEAD < pad {
            return Err(Error);
        }
        Ok(())
    }

    /// Gives the buffer back.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// The BTH.
    pub fn bth(&self) -> BthPacket<&[u8]> {
        BthPacket::new_unchecked(&self.buffer.as_ref()[..BTH_LEN])
    }

    /// The DETH.
    pub fn deth(&self) -> DethPacket<&[u8]> {
        DethPacket::new_unchecked(&self.buffer.as_ref()[BTH_LEN..BTH_LEN + DETH_LEN])
    }

    /// The immediate.
    pub fn imm(&self) -> u32 {
        ImmDtPacket::new_unchecked(&self.buffer.as_ref()[BTH_LEN + DETH_LEN..]).imm()
    }

    /// Bytes of payload: the datagram less headers, pad and ICRC.
    pub fn payload_len(&self) -> usize {
        let pad = usize::from(self.bth().pad_count());
        self.buffer.as_ref().len() - UD_SEND_IMM_OVERHEAD - pad
    }

    /// The payload.
    pub fn payload(&self) -> &[u8] {
        let end = UD_SEND_IMM_HEADER_LEN + self.payload_len();
        &self.buffer.as_ref()[UD_SEND_IMM_HEADER_LEN..end]
    }

    /// The pad bytes between payload and ICRC.
    pub fn pad(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[UD_SEND_IMM_HEADER_LEN + self.payload_len()..b.len() - ICRC_LEN]
    }

    /// The ICRC as a number (it travels least-significant byte first).
    pub fn icrc(&self) -> u32 {
        let b = self.buffer.as_ref();
        let t = &b[b.len() - ICRC_LEN..];
        u32::from_le_bytes([t[0], t[1], t[2], t[3]])
    }
}

/// Setters.
impl<T: AsRef<[u8]> + AsMut<[u8]>> UdSendImmPacket<T> {
    /// The payload, to copy the chunk into after [`UdSendImmRepr::emit`].
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = UD_SEND_IMM_HEADER_LEN + self.payload_len();
        &mut self.buffer.as_mut()[UD_SEND_IMM_HEADER_LEN..end]
    }

    /// Writes the ICRC, least-significant byte first.
    pub fn set_icrc(&mut self, crc: u32) {
        let b = self.buffer.as_mut();
        let at = b.len() - ICRC_LEN;
        b[at..].copy_from_slice(&crc.to_le_bytes());
    }
}

/// The headers of a UD SEND_ONLY_WITH_IMMEDIATE packet, and its payload length.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UdSendImmRepr {
    /// Base transport header; its pad count matches `payload_len`.
    pub bth: BthRepr,
    /// Datagram header: queue key and source QP.
    pub deth: DethRepr,
    /// The immediate (see [`crate::wire::ImmLayout`]).
    pub imm: u32,
    /// Bytes of payload.
    pub payload_len: usize,
}

impl UdSendImmRepr {
    /// A packet to send with `keys`: no flags set, the pad count `payload_len` needs.
    ///
    /// ```
    /// # use ringcast_core::wire::{UdKeys, UdSendImmPacket, UdSendImmRepr};
    /// let repr = UdSendImmRepr::new(&UdKeys::multicast(0x1dea_cafe), 42, 7, 0xabc1_2345, 5);
    /// let mut buf = [0u8; 64];
    /// let n = repr.emit(&mut buf).unwrap();
    /// assert_eq!(n, 36); // 24 bytes of headers, 5 of payload, 3 of pad, 4 of ICRC
    /// let mut packet = UdSendImmPacket::new_unchecked(&mut buf[..n]);
    /// packet.payload_mut().copy_from_slice(b"hello");
    /// ```
    pub const fn new(keys: &UdKeys, src_qp: u32, psn: u32, imm: u32, payload_len: usize) -> Self {
        UdSendImmRepr {
            bth: BthRepr {
                opcode: Opcode::UD_SEND_ONLY_WITH_IMMEDIATE,
                solicited: false,
                mig_req: false,
                pad_count: pad_for(payload_len),
                p_key: keys.p_key,
                fecn: false,
                becn: false,
                dest_qp: keys.dest_qp,
                ack_req: false,
                psn,
            },
            deth: DethRepr {
                q_key: keys.q_key,
                src_qp,
            },
            imm,
            payload_len,
        }
    }

    /// Checks a received datagram: length, opcode, P_Key, DestQP and Q_Key against `keys` (in
    /// that order), then the header version and the reserved bits.
    pub fn parse<T: AsRef<[u8]>>(
        packet: &UdSendImmPacket<T>,
        keys: &UdKeys,
    ) -> core::result::Result<Self, RoceDrop> {
        packet.check_len().map_err(|_| RoceDrop::Truncated)?;
        let bth = packet.bth();
        let deth = packet.deth();
        if bth.opcode() != Opcode::UD_SEND_ONLY_WITH_IMMEDIATE {
            return Err(RoceDrop::Opcode);
        }
        if bth.p_key() != keys.p_key {
            return Err(RoceDrop::PKey);
        }
        if bth.dest_qp() != keys.dest_qp {
            return Err(RoceDrop::DestQp);
        }
        if deth.q_key() != keys.q_key {
            return Err(RoceDrop::QKey);
        }
        if bth.tver() != 0 {
            return Err(RoceDrop::Version);
        }
        let bth = BthRepr::parse(&bth).map_err(|_| RoceDrop::Malformed)?;
        let deth = DethRepr::parse(&deth).map_err(|_| RoceDrop::Malformed)?;
        let payload_len = packet.payload_len();
        if pad_for(payload_len) != bth.pad_count || packet.pad().iter().any(|&b| b != 0) {
            return Err(RoceDrop::Malformed);
        }
        Ok(UdSendImmRepr {
            bth,
            deth,
            imm: packet.imm(),
            payload_len,
        })
    }

    /// Bytes of the whole packet: headers, payload, pad and ICRC (`None` if it overflows).
    pub const fn packet_len(&self) -> Option<usize> {
        match self.payload_len.checked_add(UD_SEND_IMM_OVERHEAD) {
            Some(n) => n.checked_add(self.bth.pad_count as usize),
            None => None,
        }
    }

    /// Bytes [`Self::emit`] needs: the whole packet (saturating).
    pub const fn buffer_len(&self) -> usize {
        match self.packet_len() {
            Some(n) => n,
            None => usize::MAX,
        }
    }

    /// Writes BTH, DETH, ImmDt and zero pad bytes into the first [`Self::buffer_len`] bytes of
    /// `buf` and returns that length. The payload and the ICRC are left for the caller
    /// ([`UdSendImmPacket::payload_mut`], [`UdSendImmPacket::set_icrc`]).
    ///
    /// Fails with [`EmitError::NotCanonical`] if the opcode is not SEND_ONLY_WITH_IMMEDIATE, the
    /// pad count does not round the payload to 4 bytes, or a 24-bit field overflows.
    pub fn emit(&self, buf: &mut [u8]) -> core::result::Result<usize, EmitError> {
        let len = self.canonical_len()?;
        let buf = emit_buf(buf, len)?;
        self.emit_headers(buf)?;
        let pad_at = UD_SEND_IMM_HEADER_LEN + self.payload_len;
        buf[pad_at..len - ICRC_LEN].fill(0);
        Ok(len)
    }

    /// Writes only BTH, DETH and ImmDt into the first [`UD_SEND_IMM_HEADER_LEN`] bytes of
    /// `buf` and returns that length, checked as [`Self::emit`] checks: for a sender that
    /// gathers a packet from its headers, its payload where it lies, and a trailer of
    /// [`BthRepr::pad_count`] zero bytes and the ICRC.
    pub fn emit_headers(&self, buf: &mut [u8]) -> core::result::Result<usize, EmitError> {
        self.canonical_len()?;
        let buf = emit_buf(buf, UD_SEND_IMM_HEADER_LEN)?;
        self.bth.emit(&mut buf[..BTH_LEN])?;
        self.deth.emit(&mut buf[BTH_LEN..BTH_LEN + DETH_LEN])?;
        ImmDtPacket::new_unchecked(&mut buf[BTH_LEN + DETH_LEN..UD_SEND_IMM_HEADER_LEN])
            .set_imm(self.imm);
        Ok(UD_SEND_IMM_HEADER_LEN)
    }

    /// The packet's length if it is one [`Self::emit`] writes.
    fn canonical_len(&self) -> core::result::Result<usize, EmitError> {
        let len = self.packet_len().ok_or(EmitError::NotCanonical)?;
        if self.bth.opcode != Opcode::UD_SEND_ONLY_WITH_IMMEDIATE
            || self.bth.pad_count != pad_for(self.payload_len)
            || self.bth.dest_qp > U24_MAX
            || self.bth.psn > U24_MAX
            || self.deth.src_qp > U24_MAX
        {
            return Err(EmitError::NotCanonical);
        }
        Ok(len)
    }
}

/// What the ICRC covers of a lane's IPv4 and UDP headers that is the same for every packet.
///
/// The kernel writes the real headers; the ICRC needs their bytes, with TOS, TTL and both
/// checksums masked. IP options are not supported (the kernel sends none on these sockets).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RoceFlow {
    /// IPv4 source address.
    pub src_addr: [u8; 4],
    /// IPv4 destination address (the lane's group).
    pub dst_addr: [u8; 4],
    /// UDP source port.
    pub src_port: u16,
    /// UDP destination port, normally [`ROCEV2_UDP_PORT`].
    pub dst_port: u16,
    /// Whether the DF bit is set (it is on sockets with `IP_PMTUDISC_DO` or `_PROBE`).
    pub dont_fragment: bool,
}

impl RoceFlow {
    /// The start of the bytes the ICRC covers, masked: [`ICRC_SEED`], the IPv4 header with IP ID
    /// `ip_id`, the UDP header, and BTH bytes 0-7. The CRC continues over
    /// [`icrc_rest`]`(udp_payload)`.
    ///
    /// `udp_payload` is the whole UDP payload, ICRC included (its length sets the IP and UDP
    /// lengths). The result depends only on the flow, `ip_id`, the length and BTH bytes 0-7
    /// (opcode, flags and pad count, P_Key, DestQP); PSN, DETH, immediate and payload come
    /// after it. A lane whose chunks have one size therefore sees one prefix per IP ID (ID 0
    /// without GSO, ID `i` for the `i`th GSO segment): a transport can hash each once and
    /// resume from a copy of that CRC state per packet.
    ///
    /// Fails if `udp_payload` is shorter than a BTH and an ICRC, or too long for IPv4.
    pub fn icrc_prefix(&self, ip_id: u16, udp_payload: &[u8]) -> Result<[u8; ICRC_PREFIX_LEN]> {
        self.icrc_prefix_of(ip_id, udp_payload.len(), udp_payload)
    }

    /// [`icrc_prefix`](Self::icrc_prefix) of a UDP payload `udp_payload_len` bytes long that
    /// starts with `head` (at least BTH bytes 0-7; nothing after them is read): for a sender
    /// that gathers a datagram from its headers and its payload's place instead of laying it
    /// out in one buffer.
    ///
    /// Fails if the length is shorter than a BTH and an ICRC or too long for IPv4, or if
    /// `head` is shorter than 8 bytes.
    pub fn icrc_prefix_of(
        &self,
        ip_id: u16,
        udp_payload_len: usize,
        head: &[u8],
    ) -> Result<[u8; ICRC_PREFIX_LEN]> {
        if udp_payload_len < BTH_LEN + ICRC_LEN || head.len() < ICRC_BTH {
            return Err(Error);
        }
        let udp_len = u16::try_from(UDP_HEADER_LEN + udp_payload_len).map_err(|_| Error)?;
        let total_len = u16::try_from(IPV4_HEADER_LEN + usize::from(udp_len)).map_err(|_| Error)?;
        let mut out = [0u8; ICRC_PREFIX_LEN];
        let (seed, rest) = out.split_at_mut(ICRC_SEED.len());
        seed.copy_from_slice(&ICRC_SEED);
        let (ip, rest) = rest.split_at_mut(IPV4_HEADER_LEN);
        let (udp, bth) = rest.split_at_mut(UDP_HEADER_LEN);

        ip[field::IP_VER_IHL] = 0x45;
        ip[field::IP_TOS] = 0xff;
        ip[field::IP_TOTAL_LEN].copy_from_slice(&total_len.to_be_bytes());
        ip[field::IP_ID].copy_from_slice(&ip_id.to_be_bytes());
        let flags: u16 = if self.dont_fragment { 0x4000 } else { 0 };
        ip[field::IP_FLAGS_FRAG].copy_from_slice(&flags.to_be_bytes());
        ip[field::IP_TTL] = 0xff;
        ip[field::IP_PROTOCOL] = 17;
        ip[field::IP_CHECKSUM].fill(0xff);
        ip[field::IP_SRC].copy_from_slice(&self.src_addr);
        ip[field::IP_DST].copy_from_slice(&self.dst_addr);

        udp[field::UDP_SRC_PORT].copy_from_slice(&self.src_port.to_be_bytes());
        udp[field::UDP_DST_PORT].copy_from_slice(&self.dst_port.to_be_bytes());
        udp[field::UDP_LEN].copy_from_slice(&udp_len.to_be_bytes());
        udp[field::UDP_CHECKSUM].fill(0xff);

        bth.copy_from_slice(&head[..ICRC_BTH]);
        bth[field::ECN] = 0xff;
        Ok(out)
    }
}

/// The bytes the ICRC covers after [`RoceFlow::icrc_prefix`]: the UDP payload from BTH byte 8
/// (AckReq, PSN) to the end of the pad, unmasked. Fails if shorter than a BTH and an ICRC.
pub fn icrc_rest(udp_payload: &[u8]) -> Result<&[u8]> {
    if udp_payload.len() < BTH_LEN + ICRC_LEN {
        return Err(Error);
    }
    Ok(&udp_payload[ICRC_BTH..udp_payload.len() - ICRC_LEN])
}

/// Masks, in place, a copy of a whole RoCEv2 IPv4 packet (from the IPv4 header on, ICRC
/// included or not): TOS, TTL, IP checksum, UDP checksum and BTH byte 4 become all-ones.
/// The ICRC is then the CRC-32 of [`ICRC_SEED`] followed by the masked bytes up to the ICRC.
///
/// The general recipe, for checking captures; the send path uses [`RoceFlow::icrc_prefix`].
/// Fails unless the bytes start with an IPv4 header (options allowed) carrying UDP and hold
/// at least a BTH after the UDP header.
pub fn icrc_mask_ipv4(packet: &mut [u8]) -> Result<()> {
    let first = *packet.first().ok_or(Error)?;
    let ihl = usize::from(first & 0x0f) * 4;
    if first >> 4 != 4 || ihl < IPV4_HEADER_LEN {
        return Err(Error);
    }
    let bth = ihl + UDP_HEADER_LEN;
    if packet.len() < bth + BTH_LEN || packet[field::IP_PROTOCOL] != 17 {
        return Err(Error);
    }
    packet[field::IP_TOS] = 0xff;
    packet[field::IP_TTL] = 0xff;
    packet[field::IP_CHECKSUM].fill(0xff);
    let udp = &mut packet[ihl..bth];
    udp[field::UDP_CHECKSUM].fill(0xff);
    packet[bth + field::ECN] = 0xff;
    Ok(())
}

#[cfg(test)]
mod tests;
