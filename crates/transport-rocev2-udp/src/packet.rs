//! Interim RoCEv2 UD `SEND_ONLY_WITH_IMMEDIATE` build and parse for this transport.
//!
//! Core's `wire::roce` will own these codecs (BTH/DETH/ImmDt views with a typed drop reason);
//! until it lands this private module holds the same wire layout, behind two functions
//! ([`emit_headers`], [`parse`]) so that swapping it for core's codecs touches nothing else.
//!
//! ```text
//! BTH   0 opcode | 1 SE M PadCnt(2) TVer(4) | 2-3 P_Key | 4 reserved (FECN/BECN) | 5-7 DestQP
//!       8 AckReq + reserved | 9-11 PSN
//! DETH 12-15 Q_Key | 16 reserved | 17-19 SrcQP
//! ImmDt 20-23
//! payload, 0-3 pad bytes (PadCnt), ICRC 4 bytes (least-significant byte first)
//! ```

/// BTH opcode of a UD `SEND_ONLY_WITH_IMMEDIATE`.
pub(crate) const OPCODE_UD_SEND_ONLY_IMM: u8 = 0x65;
/// DestQP of every multicast packet (IBA: the multicast QPN).
pub(crate) const MULTICAST_QPN: u32 = 0x00FF_FFFF;
/// BTH + DETH + ImmDt.
pub(crate) const HEADER_LEN: usize = 24;
/// Invariant CRC trailer.
pub(crate) const ICRC_LEN: usize = 4;
/// Bytes around the payload in every datagram.
pub(crate) const OVERHEAD: usize = HEADER_LEN + ICRC_LEN;
/// A 24-bit field's mask (PSN, QPNs).
pub(crate) const MASK_24: u32 = 0x00FF_FFFF;

/// Byte offset of the ImmDt, which is the last header field.
const IMM_AT: usize = 20;

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
    pub(crate) src_qp: u32,
}

/// Writes BTH, DETH and ImmDt into `out[..HEADER_LEN]` for a payload of `payload_len` bytes.
///
/// `out` must be at least [`HEADER_LEN`] long (the caller sized its staging buffer).
pub(crate) fn emit_headers(
    out: &mut [u8],
    fields: HeaderFields,
    psn: u32,
    imm: u32,
    payload_len: usize,
) {
    let h = &mut out[..HEADER_LEN];
    h[0] = OPCODE_UD_SEND_ONLY_IMM;
    // SE = 0, MigReq = 0, PadCnt in bits 5:4, TVer = 0.
    h[1] = (pad_len(payload_len) as u8) << 4;
    h[2..4].copy_from_slice(&fields.pkey.to_be_bytes());
    h[4] = 0;
    h[5..8].copy_from_slice(&MULTICAST_QPN.to_be_bytes()[1..]);
    // AckReq = 0: UD never acknowledges.
    h[8..12].copy_from_slice(&(psn & MASK_24).to_be_bytes());
    h[12..16].copy_from_slice(&fields.qkey.to_be_bytes());
    h[16..20].copy_from_slice(&(fields.src_qp & MASK_24).to_be_bytes());
    h[IMM_AT..HEADER_LEN].copy_from_slice(&imm.to_be_bytes());
}

/// Why a datagram was dropped, in the order the receiver checks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Reject {
    /// Shorter than the headers and ICRC, or the pad count exceeds the bytes present.
    Truncated,
    /// Payload longer than the receiver's maximum.
    Oversize,
    /// Not `SEND_ONLY_WITH_IMMEDIATE`, or a transport header version other than 0.
    Opcode,
    /// P_Key differs from the job's.
    Pkey,
    /// Q_Key differs from the job's.
    Qkey,
    /// DestQP is not the multicast QPN.
    DestQp,
}

/// A datagram that passed the header checks; `payload` excludes pad and ICRC.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Parsed {
    pub(crate) psn: u32,
    pub(crate) src_qp: u32,
    pub(crate) imm: u32,
    /// Payload byte range within the datagram.
    pub(crate) payload_len: usize,
    /// The ICRC as transmitted, read least-significant byte first.
    pub(crate) icrc: u32,
}

/// The payload starts right after the headers.
pub(crate) const PAYLOAD_AT: usize = HEADER_LEN;

/// Checks length, opcode, P_Key, Q_Key and DestQP of one UDP payload, in that order.
pub(crate) fn parse(d: &[u8], pkey: u16, qkey: u32, max_payload: usize) -> Result<Parsed, Reject> {
    if d.len() < OVERHEAD {
        return Err(Reject::Truncated);
    }
    let pad = usize::from((d[1] >> 4) & 0x3);
    let Some(payload_len) = (d.len() - OVERHEAD).checked_sub(pad) else {
        return Err(Reject::Truncated);
    };
    if payload_len > max_payload {
        return Err(Reject::Oversize);
    }
    if d[0] != OPCODE_UD_SEND_ONLY_IMM || d[1] & 0x0F != 0 {
        return Err(Reject::Opcode);
    }
    if u16::from_be_bytes([d[2], d[3]]) != pkey {
        return Err(Reject::Pkey);
    }
    if be32(d, 12) != qkey {
        return Err(Reject::Qkey);
    }
    if be32(d, 4) & MASK_24 != MULTICAST_QPN {
        return Err(Reject::DestQp);
    }
    let n = d.len();
    Ok(Parsed {
        psn: be32(d, 8) & MASK_24,
        src_qp: be32(d, 16) & MASK_24,
        imm: be32(d, IMM_AT),
        payload_len,
        icrc: u32::from_le_bytes([d[n - 4], d[n - 3], d[n - 2], d[n - 1]]),
    })
}

/// Big-endian u32 at `at`; callers checked `d.len() >= OVERHEAD > at + 4`.
fn be32(d: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([d[at], d[at + 1], d[at + 2], d[at + 3]])
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
        let mut out = [0u8; HEADER_LEN];
        emit_headers(&mut out, FIELDS, 0x0100_0102, 0xAABB_CCDD, 6);
        assert_eq!(out[..], PACKET[..HEADER_LEN]);
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
        assert_eq!(parse(&good[..27]), Err(Reject::Truncated));
        // PadCnt 3 with 6 payload bytes present is fine; 31 bytes with PadCnt 3 is not.
        assert_eq!(parse(&with(1, 0x30)[..30]), Err(Reject::Truncated));
        assert_eq!(
            super::parse(&good, 0xFFFF, 0x1234_5678, 5),
            Err(Reject::Oversize)
        );
        assert_eq!(parse(&with(0, 0x64)), Err(Reject::Opcode));
        assert_eq!(parse(&with(1, 0x21)), Err(Reject::Opcode));
        assert_eq!(parse(&with(3, 0xFE)), Err(Reject::Pkey));
        assert_eq!(parse(&with(15, 0x79)), Err(Reject::Qkey));
        assert_eq!(parse(&with(7, 0xFE)), Err(Reject::DestQp));
        // A wrong opcode is reported before a wrong Q_Key: the first failing check wins.
        let mut both = with(0, 0x64);
        both[15] = 0;
        assert_eq!(parse(&both), Err(Reject::Opcode));
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
