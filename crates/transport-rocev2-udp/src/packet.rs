//! RoCEv2 UD `SEND_ONLY_WITH_IMMEDIATE` build and parse, on core's `wire` codecs.
//!
//! A thin adapter: the layout, the checks and their order are core's
//! ([`ringcast_core::wire::UdSendImmRepr`]); this module adds the receiver's own size limit
//! and names the few calls the send and receive paths make.
//!
//! ```text
//! BTH   0 opcode | 1 SE M PadCnt(2) TVer(4) | 2-3 P_Key | 4 reserved (FECN/BECN) | 5-7 DestQP
//!       8 AckReq + reserved | 9-11 PSN
//! DETH 12-15 Q_Key | 16 reserved | 17-19 SrcQP
//! ImmDt 20-23
//! payload, 0-3 pad bytes (PadCnt), ICRC 4 bytes (least-significant byte first)
//! ```

use ringcast_core::wire::{
    MULTICAST_QPN, RoceDrop, UD_SEND_IMM_HEADER_LEN, UD_SEND_IMM_OVERHEAD, UdKeys, UdSendImmPacket,
    UdSendImmRepr,
};

/// BTH + DETH + ImmDt.
pub(crate) const HEADER_LEN: usize = UD_SEND_IMM_HEADER_LEN;
/// Invariant CRC trailer.
pub(crate) const ICRC_LEN: usize = ringcast_core::wire::ICRC_LEN;
/// Bytes around the payload in every datagram.
pub(crate) const OVERHEAD: usize = UD_SEND_IMM_OVERHEAD;
/// A 24-bit field's mask (PSN, QPNs).
pub(crate) const MASK_24: u32 = 0x00FF_FFFF;
/// The payload starts right after the headers.
pub(crate) const PAYLOAD_AT: usize = HEADER_LEN;

/// Pad bytes that round `payload_len` up to a multiple of 4 (IBA PadCnt).
pub(crate) const fn pad_len(payload_len: usize) -> usize {
    (4 - payload_len % 4) % 4
}

/// Length of the UDP payload (headers, payload, pad and ICRC) of a chunk of `payload_len` bytes.
pub(crate) const fn datagram_len(payload_len: usize) -> usize {
    OVERHEAD + payload_len + pad_len(payload_len)
}

/// The per-lane constant header fields.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HeaderFields {
    pub(crate) pkey: u16,
    pub(crate) qkey: u32,
    /// Below 2^24 (the sender checks it once).
    pub(crate) src_qp: u32,
}

impl HeaderFields {
    fn keys(self) -> UdKeys {
        UdKeys {
            p_key: self.pkey,
            dest_qp: MULTICAST_QPN,
            q_key: self.qkey,
        }
    }
}

/// Writes BTH, DETH, ImmDt and the zero pad of a chunk of `payload_len` bytes into `out`,
/// which is exactly [`datagram_len`]`(payload_len)` long; payload and ICRC are left to the
/// caller.
pub(crate) fn emit_headers(
    out: &mut [u8],
    fields: HeaderFields,
    psn: u32,
    imm: u32,
    payload_len: usize,
) {
    // Cannot fail: PSN masked, SrcQP checked by the sender, `out` sized by `datagram_len`.
    repr(fields, psn, imm, payload_len)
        .emit(out)
        .expect("UD SEND_ONLY_WITH_IMMEDIATE headers fit their staging slot");
}

/// Writes only BTH, DETH and ImmDt of a chunk of `payload_len` bytes: for a datagram gathered
/// from these headers, the payload where it lies, and a trailer of [`pad_len`] zero bytes and
/// the ICRC.
pub(crate) fn emit_header_only(
    out: &mut [u8; HEADER_LEN],
    fields: HeaderFields,
    psn: u32,
    imm: u32,
    payload_len: usize,
) {
    // Cannot fail: PSN masked, SrcQP checked by the sender, `out` exactly the headers' size,
    // and the payload at most the sender's maximum.
    repr(fields, psn, imm, payload_len)
        .emit_headers(out)
        .expect("UD SEND_ONLY_WITH_IMMEDIATE headers fit their slot");
}

/// The headers of a chunk of `payload_len` bytes with this PSN and immediate.
fn repr(fields: HeaderFields, psn: u32, imm: u32, payload_len: usize) -> UdSendImmRepr {
    UdSendImmRepr::new(
        &fields.keys(),
        fields.src_qp,
        psn & MASK_24,
        imm,
        payload_len,
    )
}

/// The DETH SrcQP and the immediate of a datagram's headers (`h` holds at least
/// [`HEADER_LEN`] bytes; nothing is checked).
pub(crate) fn src_and_imm(h: &[u8]) -> (u32, u32) {
    let p = UdSendImmPacket::new_unchecked(&h[..HEADER_LEN]);
    (p.deth().src_qp(), p.imm())
}

/// The BTH PadCnt of a datagram's headers (`h` holds at least the BTH).
pub(crate) fn pad_count(h: &[u8]) -> u8 {
    UdSendImmPacket::new_unchecked(h).bth().pad_count()
}

/// Why a datagram was dropped, in the order the receiver checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reject {
    /// One of core's header checks (length, opcode, P_Key, DestQP, Q_Key, version, reserved).
    Header(RoceDrop),
    /// Payload longer than the receiver's maximum.
    Oversize,
}

/// A datagram that passed the header checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Parsed {
    pub(crate) psn: u32,
    pub(crate) src_qp: u32,
    pub(crate) imm: u32,
    /// Payload bytes from [`PAYLOAD_AT`] on, pad and ICRC excluded.
    pub(crate) payload_len: usize,
    /// The ICRC as transmitted, read least-significant byte first.
    pub(crate) icrc: u32,
}

/// Checks one UDP payload with core's parser (length, opcode, P_Key, DestQP, Q_Key, then
/// version and reserved bits), then against the receiver's `max_payload`.
pub(crate) fn parse(d: &[u8], pkey: u16, qkey: u32, max_payload: usize) -> Result<Parsed, Reject> {
    let keys = UdKeys {
        p_key: pkey,
        dest_qp: MULTICAST_QPN,
        q_key: qkey,
    };
    let packet = UdSendImmPacket::new_unchecked(d);
    let repr = UdSendImmRepr::parse(&packet, &keys).map_err(Reject::Header)?;
    if repr.payload_len > max_payload {
        return Err(Reject::Oversize);
    }
    Ok(Parsed {
        psn: repr.bth.psn,
        src_qp: repr.deth.src_qp,
        imm: repr.imm,
        payload_len: repr.payload_len,
        icrc: packet.icrc(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIELDS: HeaderFields = HeaderFields {
        pkey: 0xFFFF,
        qkey: 0x1234_5678,
        src_qp: 7,
    };

    /// A fixed vector written by hand from the layout above, not by `emit_headers`.
    const PACKET: [u8; 34] = [
        0x65, 0x20, 0xFF, 0xFF, 0x00, 0xFF, 0xFF,
        0xFF, // BTH: opcode, PadCnt 2, P_Key, DestQP
        0x00, 0x00, 0x01, 0x02, // AckReq 0, PSN 0x000102
        0x12, 0x34, 0x56, 0x78, 0x00, 0x00, 0x00, 0x07, // DETH: Q_Key, SrcQP 7
        0xAA, 0xBB, 0xCC, 0xDD, // ImmDt
        1, 2, 3, 4, 5, 6, 0, 0, // 6 payload bytes, 2 pad bytes
        0x11, 0x22, // (ICRC, 4 bytes, split below)
    ];

    fn packet() -> Vec<u8> {
        let mut p = PACKET.to_vec();
        p.extend_from_slice(&[0x33, 0x44]);
        p
    }

    #[test]
    fn emit_matches_fixed_vector() {
        let mut out = [0u8; 36];
        emit_headers(&mut out, FIELDS, 0x0100_0102, 0xAABB_CCDD, 6);
        assert_eq!(out[..HEADER_LEN], PACKET[..HEADER_LEN]);
        assert_eq!(out[30..32], [0, 0]); // pad
        assert_eq!(datagram_len(6), 36);
    }

    #[test]
    fn parse_fixed_vector() {
        let p = parse(&packet(), 0xFFFF, 0x1234_5678, 4096).unwrap();
        assert_eq!(
            p,
            Parsed {
                psn: 0x102,
                src_qp: 7,
                imm: 0xAABB_CCDD,
                payload_len: 6,
                icrc: 0x4433_2211,
            }
        );
    }

    #[test]
    fn parse_rejects_in_order() {
        let good = packet();
        let with = |at: usize, v: u8| {
            let mut p = good.clone();
            p[at] = v;
            p
        };
        let parse = |d: &[u8]| parse(d, 0xFFFF, 0x1234_5678, 6);
        let drop = |r| Err(Reject::Header(r));
        assert_eq!(parse(&good[..27]), drop(RoceDrop::Truncated));
        // 30 bytes with PadCnt 3: fewer than the pad announced.
        assert_eq!(parse(&with(1, 0x30)[..30]), drop(RoceDrop::Truncated));
        assert_eq!(
            super::parse(&good, 0xFFFF, 0x1234_5678, 5),
            Err(Reject::Oversize)
        );
        assert_eq!(parse(&with(0, 0x64)), drop(RoceDrop::Opcode));
        assert_eq!(parse(&with(1, 0x21)), drop(RoceDrop::Version));
        assert_eq!(parse(&with(3, 0xFE)), drop(RoceDrop::PKey));
        assert_eq!(parse(&with(15, 0x79)), drop(RoceDrop::QKey));
        assert_eq!(parse(&with(7, 0xFE)), drop(RoceDrop::DestQp));
        assert_eq!(parse(&with(31, 0x01)), drop(RoceDrop::Malformed)); // pad byte set
        // A wrong opcode is reported before a wrong Q_Key: the first failing check wins.
        let mut both = with(0, 0x64);
        both[15] = 0;
        assert_eq!(parse(&both), drop(RoceDrop::Opcode));
    }

    #[test]
    fn parse_never_panics_on_short_input() {
        for n in 0..OVERHEAD + 8 {
            for pad in 0..4u8 {
                let mut d = vec![0u8; n];
                if n > 1 {
                    d[1] = pad << 4;
                }
                let _ = parse(&d, 0, 0, usize::MAX);
            }
        }
    }
}
