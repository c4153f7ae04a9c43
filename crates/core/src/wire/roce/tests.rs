//! Fixed byte vectors for the RoCEv2 headers and the ICRC recipe.

use super::*;
use alloc::vec::Vec;

/// CRC-32 as zlib computes it (reflected, polynomial 0xEDB88320), bit by bit: test-only, so
/// that core takes no dependency; transports use crc32fast.
fn crc32(parts: &[&[u8]]) -> u32 {
    let mut crc = !0u32;
    for &byte in parts.iter().flat_map(|p| p.iter()) {
        crc ^= u32::from(byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xedb8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn crc32_check_value() {
    // The standard check value of CRC-32/ISO-HDLC (zlib's crc32).
    assert_eq!(crc32(&[b"123456789"]), 0xcbf4_3926);
}

// --- BTH ---

/// The BTH of the DESIGN.md section 6 CNP: opcode 0x81, P_Key 0xffff, BECN, DestQP 0x118.
const BTH_CNP: [u8; 12] = [
    0x81, 0x00, 0xff, 0xff, 0x40, 0x00, 0x01, 0x18, 0x00, 0x00, 0x00, 0x00,
];
/// Every flag set: SE, MigReq, pad 2, P_Key 0x8001, FECN, DestQP 0xffffff, AckReq, PSN 0x123456.
const BTH_FLAGS: [u8; 12] = [
    0x65, 0xe0, 0x80, 0x01, 0x80, 0xff, 0xff, 0xff, 0x80, 0x12, 0x34, 0x56,
];

fn bth_cnp() -> BthRepr {
    BthRepr {
        opcode: Opcode::CNP,
        solicited: false,
        mig_req: false,
        pad_count: 0,
        p_key: 0xffff,
        fecn: false,
        becn: true,
        dest_qp: 0x118,
        ack_req: false,
        psn: 0,
    }
}

fn bth_flags() -> BthRepr {
    BthRepr {
        opcode: Opcode::UD_SEND_ONLY_WITH_IMMEDIATE,
        solicited: true,
        mig_req: true,
        pad_count: 2,
        p_key: 0x8001,
        fecn: true,
        becn: false,
        dest_qp: MULTICAST_QPN,
        ack_req: true,
        psn: 0x12_3456,
    }
}

#[test]
fn bth_fixed_vectors() {
    for (bytes, repr) in [(BTH_CNP, bth_cnp()), (BTH_FLAGS, bth_flags())] {
        let p = BthPacket::new_checked(&bytes[..]).unwrap();
        assert_eq!(BthRepr::parse(&p), Ok(repr));
        let mut out = [0xaau8; BTH_LEN + 2];
        assert_eq!(repr.emit(&mut out), Ok(BTH_LEN));
        assert_eq!(out[..BTH_LEN], bytes);
        assert_eq!(out[BTH_LEN..], [0xaa, 0xaa], "emit wrote past the header");
    }
    let p = BthPacket::new_checked(&BTH_FLAGS[..]).unwrap();
    assert_eq!(p.tver(), 0);
    assert!(!p.becn() && !p.reserved_set());
}

#[test]
fn bth_setters_write_single_fields() {
    let mut b = [0u8; BTH_LEN];
    let mut p = BthPacket::new_unchecked(&mut b[..]);
    p.set_opcode(Opcode(0x65));
    p.set_solicited(true);
    p.set_mig_req(true);
    p.set_pad_count(2);
    p.set_p_key(0x8001);
    p.set_fecn(true);
    p.set_dest_qp(0xff_ffff);
    p.set_ack_req(true);
    p.set_psn(0x12_3456);
    assert_eq!(b, BTH_FLAGS);
    let mut p = BthPacket::new_unchecked(&mut b[..]);
    p.set_tver(0xf);
    p.set_solicited(false);
    p.set_psn(0xff12_3456); // only the low 24 bits
    assert_eq!(p.tver(), 0xf);
    assert_eq!(p.pad_count(), 2);
    assert_eq!(b[1], 0x6f);
    assert_eq!(b[8..], [0x80, 0x12, 0x34, 0x56]);
}

#[test]
fn bth_rejects() {
    assert_eq!(BthPacket::new_checked(&BTH_CNP[..11]).err(), Some(Error));
    let cases: [(usize, u8, &str); 4] = [
        (1, 0x01, "TVer 1"),
        (4, 0x41, "reserved bit in byte 4"),
        (8, 0x01, "reserved bit in byte 8"),
        (8, 0x40, "reserved bit in byte 8"),
    ];
    for (at, v, why) in cases {
        let mut b = BTH_CNP;
        b[at] = v;
        assert_eq!(
            BthRepr::parse(&BthPacket::new_unchecked(&b)),
            Err(Error),
            "{why}"
        );
    }
    let mut short = [0u8; BTH_LEN - 1];
    assert_eq!(
        bth_cnp().emit(&mut short),
        Err(EmitError::BufferTooSmall { required: BTH_LEN })
    );
    let mut buf = [0u8; BTH_LEN];
    for bad in [
        BthRepr {
            pad_count: 4,
            ..bth_cnp()
        },
        BthRepr {
            dest_qp: 1 << 24,
            ..bth_cnp()
        },
        BthRepr {
            psn: 1 << 24,
            ..bth_cnp()
        },
    ] {
        assert_eq!(bad.emit(&mut buf), Err(EmitError::NotCanonical), "{bad:?}");
    }
}

// --- DETH, ImmDt, RETH, AETH ---

const DETH: [u8; 8] = [0x1d, 0xea, 0xca, 0xfe, 0x00, 0x00, 0x00, 0x2a];
const DETH_MAX_QP: [u8; 8] = [0xff, 0xff, 0xff, 0xff, 0x00, 0xff, 0xff, 0xfe];

#[test]
fn deth_fixed_vectors() {
    let cases = [
        (
            DETH,
            DethRepr {
                q_key: 0x1dea_cafe,
                src_qp: 42,
            },
        ),
        (
            DETH_MAX_QP,
            DethRepr {
                q_key: u32::MAX,
                src_qp: 0xff_fffe,
            },
        ),
    ];
    for (bytes, repr) in cases {
        assert_eq!(
            DethRepr::parse(&DethPacket::new_checked(&bytes).unwrap()),
            Ok(repr)
        );
        let mut out = [0xaau8; DETH_LEN];
        assert_eq!(repr.emit(&mut out), Ok(DETH_LEN));
        assert_eq!(out, bytes);
    }
    let mut bad = DETH;
    bad[4] = 1;
    assert_eq!(
        DethRepr::parse(&DethPacket::new_unchecked(&bad)),
        Err(Error)
    );
    assert!(DethPacket::new_checked(&DETH[..7]).is_err());
    let mut out = [0u8; DETH_LEN];
    let too_wide = DethRepr {
        q_key: 0,
        src_qp: 1 << 24,
    };
    assert_eq!(too_wide.emit(&mut out), Err(EmitError::NotCanonical));
    assert_eq!(
        DethRepr {
            q_key: 0,
            src_qp: 0
        }
        .emit(&mut out[..3]),
        Err(EmitError::BufferTooSmall { required: DETH_LEN })
    );
}

#[test]
fn immdt_fixed_vector() {
    let bytes = [0xab, 0xc1, 0x23, 0x45];
    assert_eq!(ImmDtPacket::new_checked(&bytes).unwrap().imm(), 0xabc1_2345);
    let mut out = [0u8; 4];
    ImmDtPacket::new_checked(&mut out)
        .unwrap()
        .set_imm(0xabc1_2345);
    assert_eq!(out, bytes);
    assert!(ImmDtPacket::new_checked(&bytes[..3]).is_err());
}

const RETH: [u8; 16] = [
    0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07, 0x08, // VA
    0xde, 0xad, 0xbe, 0xef, // R_Key
    0x00, 0x00, 0x10, 0x00, // 4096 bytes
];

#[test]
fn reth_fixed_vector() {
    let repr = RethRepr {
        va: 0x0102_0304_0506_0708,
        r_key: 0xdead_beef,
        dma_len: 4096,
    };
    assert_eq!(
        RethRepr::parse(&RethPacket::new_checked(&RETH).unwrap()),
        Ok(repr)
    );
    let mut out = [0u8; RETH_LEN];
    assert_eq!(repr.emit(&mut out), Ok(RETH_LEN));
    assert_eq!(out, RETH);
    assert!(RethPacket::new_checked(&RETH[..15]).is_err());
    assert_eq!(
        repr.emit(&mut out[..8]),
        Err(EmitError::BufferTooSmall { required: RETH_LEN })
    );
}

#[test]
fn aeth_fixed_vectors() {
    // An ACK with MSN 7; an RNR NAK (syndrome 0x2_) with the largest MSN.
    let cases = [
        (
            [0x00, 0x00, 0x00, 0x07],
            AethRepr {
                syndrome: 0,
                msn: 7,
            },
        ),
        (
            [0x2e, 0xff, 0xff, 0xff],
            AethRepr {
                syndrome: 0x2e,
                msn: 0xff_ffff,
            },
        ),
    ];
    for (bytes, repr) in cases {
        assert_eq!(
            AethRepr::parse(&AethPacket::new_checked(&bytes).unwrap()),
            Ok(repr)
        );
        let mut out = [0u8; AETH_LEN];
        assert_eq!(repr.emit(&mut out), Ok(AETH_LEN));
        assert_eq!(out, bytes);
    }
    let mut out = [0u8; AETH_LEN];
    let bad = AethRepr {
        syndrome: 0,
        msn: 1 << 24,
    };
    assert_eq!(bad.emit(&mut out), Err(EmitError::NotCanonical));
}

// --- UD SEND_ONLY_WITH_IMMEDIATE ---

const Q_KEY: u32 = 0x1dea_cafe;

/// A UD packet of 5 payload bytes ("hello"), pad 3, sent from 10.0.0.1:50000 to
/// 239.1.2.3:4791 with DF. The ICRC was computed by scapy 2.5 (`scapy.contrib.roce.BTH`), an
/// implementation independent of this one, for IP ID 0.
const UD_HELLO: [u8; 36] = [
    0x65, 0x30, 0xff, 0xff, 0x00, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00,
    0x07, // BTH, pad 3, PSN 7
    0x1d, 0xea, 0xca, 0xfe, 0x00, 0x00, 0x00, 0x2a, // DETH: Q_Key, SrcQP 42
    0xab, 0xc1, 0x23, 0x45, // ImmDt
    0x68, 0x65, 0x6c, 0x6c, 0x6f, // "hello"
    0x00, 0x00, 0x00, // pad
    0xf7, 0x51, 0x16, 0x79, // ICRC
];
/// scapy's ICRC for the same packet sent with IP ID 5 (the sixth GSO segment).
const UD_HELLO_ICRC_ID5: [u8; 4] = [0xa7, 0x2e, 0x1b, 0xd3];

const HELLO_FLOW: RoceFlow = RoceFlow {
    src_addr: [10, 0, 0, 1],
    dst_addr: [239, 1, 2, 3],
    src_port: 50000,
    dst_port: ROCEV2_UDP_PORT,
    dont_fragment: true,
};

fn hello_repr() -> UdSendImmRepr {
    UdSendImmRepr::new(&UdKeys::multicast(Q_KEY), 42, 7, 0xabc1_2345, 5)
}

#[test]
fn ud_send_imm_parses_fixed_vector() {
    let p = UdSendImmPacket::new_checked(&UD_HELLO[..]).unwrap();
    let repr = UdSendImmRepr::parse(&p, &UdKeys::multicast(Q_KEY)).unwrap();
    assert_eq!(repr, hello_repr());
    assert_eq!(repr.bth.pad_count, 3);
    assert_eq!(repr.bth.psn, 7);
    assert_eq!(repr.deth.src_qp, 42);
    assert_eq!(p.payload(), b"hello");
    assert_eq!(p.pad(), [0, 0, 0]);
    assert_eq!(p.imm(), 0xabc1_2345);
    assert_eq!(p.icrc(), 0x7916_51f7);
}

#[test]
fn ud_send_imm_emits_fixed_vector() {
    let repr = hello_repr();
    assert_eq!(repr.buffer_len(), UD_HELLO.len());
    let mut buf = [0xaau8; 40];
    assert_eq!(repr.emit(&mut buf), Ok(UD_HELLO.len()));
    let mut p = UdSendImmPacket::new_checked(&mut buf[..UD_HELLO.len()]).unwrap();
    p.payload_mut().copy_from_slice(b"hello");
    p.set_icrc(0x7916_51f7);
    assert_eq!(buf[..UD_HELLO.len()], UD_HELLO);
    assert_eq!(
        buf[UD_HELLO.len()..],
        [0xaa; 4],
        "emit wrote past the packet"
    );
}

#[test]
fn ud_send_imm_emit_reports_size_and_refuses_bad_headers() {
    let repr = hello_repr();
    let mut buf = [0u8; 64];
    for short in [0, 24, 35] {
        assert_eq!(
            repr.emit(&mut buf[..short]),
            Err(EmitError::BufferTooSmall { required: 36 })
        );
    }
    let bad = [
        UdSendImmRepr {
            bth: BthRepr {
                opcode: Opcode::UD_SEND_ONLY,
                ..repr.bth
            },
            ..repr
        },
        UdSendImmRepr {
            payload_len: 4,
            ..repr
        },
        UdSendImmRepr {
            bth: BthRepr {
                psn: 1 << 24,
                ..repr.bth
            },
            ..repr
        },
        UdSendImmRepr {
            deth: DethRepr {
                src_qp: 1 << 24,
                ..repr.deth
            },
            ..repr
        },
        UdSendImmRepr {
            payload_len: usize::MAX,
            ..repr
        },
    ];
    for r in bad {
        assert_eq!(r.emit(&mut buf), Err(EmitError::NotCanonical), "{r:?}");
        assert_eq!(
            r.emit_headers(&mut buf),
            Err(EmitError::NotCanonical),
            "{r:?}"
        );
    }
    // Aligned payloads need no pad.
    let r = UdSendImmRepr::new(&UdKeys::multicast(Q_KEY), 1, 0, 0, 4096);
    assert_eq!(r.bth.pad_count, 0);
    assert_eq!(r.buffer_len(), 4096 + UD_SEND_IMM_OVERHEAD);
}

#[test]
fn ud_send_imm_emit_headers_writes_the_headers_emit_writes_and_nothing_after() {
    let repr = hello_repr();
    let mut head = [0xaau8; 30];
    assert_eq!(repr.emit_headers(&mut head), Ok(UD_SEND_IMM_HEADER_LEN));
    assert_eq!(
        head[..UD_SEND_IMM_HEADER_LEN],
        UD_HELLO[..UD_SEND_IMM_HEADER_LEN]
    );
    assert_eq!(head[UD_SEND_IMM_HEADER_LEN..], [0xaa; 6]);
    assert_eq!(
        repr.emit_headers(&mut head[..23]),
        Err(EmitError::BufferTooSmall { required: 24 })
    );
}

/// `UD_HELLO` with byte `at` replaced by `v`.
fn hello_with(at: usize, v: u8) -> [u8; 36] {
    let mut b = UD_HELLO;
    b[at] = v;
    b
}

#[test]
fn ud_send_imm_drop_reasons() {
    let keys = UdKeys::multicast(Q_KEY);
    let parse = |b: &[u8]| UdSendImmRepr::parse(&UdSendImmPacket::new_unchecked(b), &keys);
    let cases: [(&[u8], RoceDrop); 15] = [
        (&UD_HELLO[..27], RoceDrop::Truncated),
        (&[], RoceDrop::Truncated),
        // 28 bytes with pad count 3: the pad does not fit.
        (&hello_with(1, 0x30)[..28], RoceDrop::Truncated),
        (&hello_with(0, 0x64), RoceDrop::Opcode),
        (&hello_with(0, 0x2b), RoceDrop::Opcode),
        (&hello_with(3, 0xfe), RoceDrop::PKey),
        (&hello_with(7, 0xfe), RoceDrop::DestQp),
        (&hello_with(15, 0xff), RoceDrop::QKey),
        (&hello_with(1, 0x31), RoceDrop::Version),
        (&hello_with(4, 0x01), RoceDrop::Malformed),
        (&hello_with(8, 0x01), RoceDrop::Malformed),
        (&hello_with(16, 0x01), RoceDrop::Malformed),
        // A non-zero pad byte.
        (&hello_with(31, 0x01), RoceDrop::Malformed),
        // 33 bytes with pad count 3: payload 2 + pad 3 is not a multiple of 4.
        (&UD_HELLO[..33], RoceDrop::Malformed),
        // One byte short of alignment.
        (&UD_HELLO[..35], RoceDrop::Malformed),
    ];
    for (bytes, why) in cases {
        assert_eq!(parse(bytes), Err(why), "{bytes:02x?}");
    }
    // Pad count 2 reads the same bytes as a 6-byte payload ending in a zero: valid.
    let six = parse(&hello_with(1, 0x20)).unwrap();
    assert_eq!((six.payload_len, six.bth.pad_count), (6, 2));
    // The first failing check decides: wrong opcode and wrong Q_Key is an opcode drop.
    let mut b = hello_with(0, 0x64);
    b[15] = 0xff;
    assert_eq!(parse(&b), Err(RoceDrop::Opcode));
    // Expected keys other than the defaults.
    let other = UdKeys {
        p_key: 0x8001,
        dest_qp: 5,
        q_key: Q_KEY,
    };
    let p = UdSendImmPacket::new_unchecked(&UD_HELLO[..]);
    assert_eq!(UdSendImmRepr::parse(&p, &other), Err(RoceDrop::PKey));
    let other = UdKeys {
        p_key: DEFAULT_P_KEY,
        ..other
    };
    assert_eq!(UdSendImmRepr::parse(&p, &other), Err(RoceDrop::DestQp));
}

#[test]
fn drop_reasons_index_densely() {
    for (i, r) in RoceDrop::ALL.iter().enumerate() {
        assert_eq!(r.index(), i);
    }
    let names: Vec<&str> = RoceDrop::ALL.iter().map(|r| r.as_str()).collect();
    assert_eq!(
        names,
        [
            "truncated",
            "opcode",
            "p_key",
            "dest_qp",
            "q_key",
            "version",
            "malformed"
        ]
    );
}

// --- ICRC ---

/// DESIGN.md section 6: a ConnectX-4 Lx CNP (IPv4, no Ethernet), ICRC excluded.
const CNP_IPV4: [u8; 56] = [
    0x45, 0xc2, 0x00, 0x3c, 0x71, 0x8c, 0x40, 0x00, 0x40, 0x11, 0x91, 0x61, 0x0a, 0x00, 0x11, 0x01,
    0x0a, 0x00, 0x12, 0x01, // IPv4: TOS 0xc2, ID 0x718c, DF, TTL 64, 10.0.17.1 -> 10.0.18.1
    0x00, 0x00, 0x12, 0xb7, 0x00, 0x28, 0x00, 0x00, // UDP: 0 -> 4791, length 40
    0x81, 0x00, 0xff, 0xff, 0x40, 0x00, 0x01, 0x18, 0x00, 0x00, 0x00, 0x00, // BTH
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // CNP padding
];
/// Its ICRC as sent on the wire.
const CNP_ICRC: [u8; 4] = [0x82, 0xfd, 0x00, 0x2a];

#[test]
fn icrc_known_answer_by_masking_the_packet() {
    let mut copy = CNP_IPV4;
    icrc_mask_ipv4(&mut copy).unwrap();
    assert_eq!(crc32(&[&ICRC_SEED, &copy]).to_le_bytes(), CNP_ICRC);
    // The mask touched exactly TOS, TTL, IP checksum, UDP checksum and BTH byte 4.
    let changed: Vec<usize> = (0..copy.len())
        .filter(|&i| copy[i] != CNP_IPV4[i])
        .collect();
    assert_eq!(changed, [1, 8, 10, 11, 26, 27, 32]);
}

#[test]
fn icrc_known_answer_from_the_flow() {
    let flow = RoceFlow {
        src_addr: [10, 0, 17, 1],
        dst_addr: [10, 0, 18, 1],
        src_port: 0,
        dst_port: ROCEV2_UDP_PORT,
        dont_fragment: true,
    };
    let mut udp_payload = CNP_IPV4[28..].to_vec();
    udp_payload.extend_from_slice(&CNP_ICRC);
    let prefix = flow.icrc_prefix(0x718c, &udp_payload).unwrap();
    let rest = icrc_rest(&udp_payload).unwrap();
    assert_eq!(crc32(&[&prefix, rest]).to_le_bytes(), CNP_ICRC);
    // The prefix is the masked packet's start, seed first.
    let mut masked = CNP_IPV4;
    icrc_mask_ipv4(&mut masked).unwrap();
    assert_eq!(prefix[..8], ICRC_SEED);
    assert_eq!(prefix[8..], masked[..ICRC_PREFIX_LEN - 8]);
    assert_eq!(rest, &masked[ICRC_PREFIX_LEN - 8..]);
}

#[test]
fn icrc_of_our_packet_matches_scapy() {
    let prefix = HELLO_FLOW.icrc_prefix(0, &UD_HELLO).unwrap();
    let rest = icrc_rest(&UD_HELLO).unwrap();
    let crc = crc32(&[&prefix, rest]);
    assert_eq!(crc.to_le_bytes(), UD_HELLO[32..]);
    assert_eq!(crc, UdSendImmPacket::new_unchecked(&UD_HELLO[..]).icrc());
    // GSO segment 5 leaves with IP ID 5: another prefix, another ICRC.
    let prefix5 = HELLO_FLOW.icrc_prefix(5, &UD_HELLO).unwrap();
    assert_eq!(crc32(&[&prefix5, rest]).to_le_bytes(), UD_HELLO_ICRC_ID5);
}

#[test]
fn icrc_prefix_is_invariant_across_psn_imm_and_payload() {
    // The precomputation a lane does: one prefix for every packet of one length and IP ID.
    let mut other = UD_HELLO;
    BthPacket::new_unchecked(&mut other[..BTH_LEN]).set_psn(0xab_cdef);
    BthPacket::new_unchecked(&mut other[..BTH_LEN]).set_ack_req(true);
    ImmDtPacket::new_unchecked(&mut other[20..24]).set_imm(1);
    other[24..29].copy_from_slice(b"world");
    let a = HELLO_FLOW.icrc_prefix(0, &UD_HELLO).unwrap();
    let b = HELLO_FLOW.icrc_prefix(0, &other).unwrap();
    assert_eq!(a, b);
    assert_ne!(icrc_rest(&UD_HELLO), icrc_rest(&other));
}

#[test]
fn icrc_prefix_of_a_head_and_a_length_equals_the_whole_datagrams() {
    for id in [0, 5] {
        let whole = HELLO_FLOW.icrc_prefix(id, &UD_HELLO).unwrap();
        let head = HELLO_FLOW.icrc_prefix_of(id, UD_HELLO.len(), &UD_HELLO[..8]);
        assert_eq!(head, Ok(whole));
    }
    // Another length changes the IP and UDP lengths in the prefix.
    let longer = HELLO_FLOW.icrc_prefix_of(0, UD_HELLO.len() + 4, &UD_HELLO[..8]);
    assert_ne!(longer, HELLO_FLOW.icrc_prefix(0, &UD_HELLO));
    assert_eq!(
        HELLO_FLOW.icrc_prefix_of(0, UD_HELLO.len(), &UD_HELLO[..7]),
        Err(Error)
    );
    assert_eq!(HELLO_FLOW.icrc_prefix_of(0, 15, &UD_HELLO), Err(Error));
}

#[test]
fn icrc_rejects_what_is_not_a_roce_packet() {
    assert_eq!(HELLO_FLOW.icrc_prefix(0, &UD_HELLO[..15]), Err(Error));
    assert_eq!(icrc_rest(&UD_HELLO[..15]), Err(Error));
    let huge = alloc::vec![0u8; 65536 - 28];
    assert_eq!(HELLO_FLOW.icrc_prefix(0, &huge), Err(Error));
    assert!(HELLO_FLOW.icrc_prefix(0, &huge[..65535 - 28]).is_ok());
    let mut cut = CNP_IPV4;
    let bad: [&mut [u8]; 5] = [
        &mut cut[..39],         // BTH cut short
        &mut [0x46u8, 0, 0, 0], // options, but no room for them
        &mut [0x65u8; 56],      // IPv6's version
        &mut [0x44u8; 56],      // IHL below 5
        &mut [],                // nothing
    ];
    for b in bad {
        assert_eq!(icrc_mask_ipv4(b), Err(Error));
    }
    let mut tcp = CNP_IPV4;
    tcp[9] = 6;
    assert_eq!(icrc_mask_ipv4(&mut tcp), Err(Error));
}
