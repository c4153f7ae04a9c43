//! RoCEv2 packets from the network: the header views and Reprs (BTH, DETH, ImmDt, RETH,
//! AETH), the UD SEND_ONLY_WITH_IMMEDIATE receive check and the ICRC masking never panic;
//! whatever parses emits back to the identical bytes; a drop reason agrees with the fields.
//!
//! Input: one UDP payload (as a transport receives it). The same bytes are also read as a
//! whole IPv4 packet for `icrc_mask_ipv4`. Seeds under `fuzz/corpus/roce/` are valid UD packets
//! with Q_Key [`SEED_Q_KEY`], a CNP, and a CNP as a whole IPv4 packet.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringcast_core::wire::{
    AETH_LEN, AethPacket, AethRepr, BTH_LEN, BthPacket, BthRepr, DETH_LEN, DethPacket, DethRepr,
    EmitError, ICRC_PREFIX_LEN, ICRC_SEED, IMMDT_LEN, ImmDtPacket, RETH_LEN, ROCEV2_UDP_PORT,
    RethPacket, RethRepr, RoceDrop, RoceFlow, UD_SEND_IMM_HEADER_LEN, UD_SEND_IMM_OVERHEAD, UdKeys,
    UdSendImmPacket, UdSendImmRepr, icrc_mask_ipv4, icrc_rest,
};

/// The Q_Key of the hand-made seeds.
const SEED_Q_KEY: u32 = 0x1dea_cafe;

fuzz_target!(|data: &[u8]| {
    // Each header at the start of the datagram and where it sits in a UD packet.
    for at in [0, BTH_LEN, BTH_LEN + DETH_LEN] {
        let Some(bytes) = data.get(at..) else {
            continue;
        };
        bth(bytes);
        deth(bytes);
        immdt(bytes);
        reth(bytes);
        aeth(bytes);
    }
    // The receive check with the seeds' keys, and with the packet's own keys (so that the key
    // checks pass and the checks after them run).
    ud(data, &UdKeys::multicast(SEED_Q_KEY));
    if data.len() >= UD_SEND_IMM_OVERHEAD {
        let p = UdSendImmPacket::new_unchecked(data);
        let own = UdKeys {
            p_key: p.bth().p_key(),
            dest_qp: p.bth().dest_qp(),
            q_key: p.deth().q_key(),
        };
        let reason = ud(data, &own);
        assert!(
            !matches!(
                reason,
                Some(RoceDrop::PKey | RoceDrop::DestQp | RoceDrop::QKey)
            ),
            "own keys rejected: {reason:?}"
        );
    }
    icrc(data);
});

/// Emits through `emit` into a buffer one byte short, then into one `want.len() + 3` long,
/// and checks the size reported and the bytes written.
fn emits_exactly(want: &[u8], emit: impl Fn(&mut [u8]) -> Result<usize, EmitError>) {
    let mut short = vec![0u8; want.len() - 1];
    assert_eq!(
        emit(&mut short),
        Err(EmitError::BufferTooSmall {
            required: want.len()
        })
    );
    let mut out = vec![0x5au8; want.len() + 3];
    assert_eq!(emit(&mut out), Ok(want.len()));
    assert_eq!(&out[..want.len()], want, "re-encoding changed the bytes");
    assert_eq!(&out[want.len()..], [0x5a; 3], "emit wrote past its length");
}

fn bth(data: &[u8]) {
    let Ok(p) = BthPacket::new_checked(data) else {
        assert!(data.len() < BTH_LEN);
        return;
    };
    // Every accessor is safe once check_len passed.
    let _ = (
        p.opcode(),
        p.solicited(),
        p.mig_req(),
        p.pad_count(),
        p.tver(),
    );
    let _ = (
        p.p_key(),
        p.fecn(),
        p.becn(),
        p.dest_qp(),
        p.ack_req(),
        p.psn(),
    );
    match BthRepr::parse(&p) {
        Ok(repr) => emits_exactly(&data[..BTH_LEN], |b| repr.emit(b)),
        Err(_) => assert!(p.tver() != 0 || p.reserved_set()),
    }
}

fn deth(data: &[u8]) {
    let Ok(p) = DethPacket::new_checked(data) else {
        return;
    };
    let _ = (p.q_key(), p.src_qp());
    match DethRepr::parse(&p) {
        Ok(repr) => emits_exactly(&data[..DETH_LEN], |b| repr.emit(b)),
        Err(_) => assert_ne!(p.reserved(), 0),
    }
}

fn immdt(data: &[u8]) {
    let Ok(p) = ImmDtPacket::new_checked(data) else {
        return;
    };
    let mut out = [0u8; IMMDT_LEN];
    ImmDtPacket::new_unchecked(&mut out[..]).set_imm(p.imm());
    assert_eq!(out, data[..IMMDT_LEN]);
}

fn reth(data: &[u8]) {
    let Ok(p) = RethPacket::new_checked(data) else {
        return;
    };
    let repr = RethRepr::parse(&p).expect("every 16 bytes are a RETH");
    emits_exactly(&data[..RETH_LEN], |b| repr.emit(b));
}

fn aeth(data: &[u8]) {
    let Ok(p) = AethPacket::new_checked(data) else {
        return;
    };
    let repr = AethRepr::parse(&p).expect("every 4 bytes are an AETH");
    emits_exactly(&data[..AETH_LEN], |b| repr.emit(b));
}

/// Runs the receive check; returns the drop reason, if any.
fn ud(data: &[u8], keys: &UdKeys) -> Option<RoceDrop> {
    let p = UdSendImmPacket::new_unchecked(data);
    let repr = match UdSendImmRepr::parse(&p, keys) {
        Ok(repr) => repr,
        Err(reason) => {
            // The reason names a field that really is wrong.
            let checked = UdSendImmPacket::new_checked(data);
            assert_eq!(reason == RoceDrop::Truncated, checked.is_err());
            match reason {
                RoceDrop::PKey => assert_ne!(p.bth().p_key(), keys.p_key),
                RoceDrop::DestQp => assert_ne!(p.bth().dest_qp(), keys.dest_qp),
                RoceDrop::QKey => assert_ne!(p.deth().q_key(), keys.q_key),
                RoceDrop::Version => assert_ne!(p.bth().tver(), 0),
                _ => {}
            }
            let _ = reason.to_string();
            assert!(reason.index() < RoceDrop::COUNT);
            return Some(reason);
        }
    };
    // Accepted: the view and the repr agree, and the parts tile the datagram.
    assert_eq!(repr.buffer_len(), data.len());
    assert_eq!(repr.payload_len, p.payload().len());
    assert_eq!((p.payload().len() + p.pad().len()) % 4, 0);
    assert!(p.pad().iter().all(|&b| b == 0));
    assert_eq!(
        UD_SEND_IMM_HEADER_LEN + p.payload().len() + p.pad().len() + 4,
        data.len()
    );
    let _ = p.icrc();
    // Emit over a copy whose headers and pad are scribbled on: the headers and pad come back
    // byte for byte, payload and ICRC are left alone.
    let mut out = data.to_vec();
    out[..UD_SEND_IMM_HEADER_LEN].fill(0xa5);
    let pad_at = UD_SEND_IMM_HEADER_LEN + repr.payload_len;
    out[pad_at..data.len() - 4].fill(0xa5);
    assert_eq!(repr.emit(&mut out), Ok(data.len()));
    assert_eq!(out, data, "re-encoding {repr:?} changed the bytes");
    assert_eq!(
        repr.emit(&mut out[..data.len() - 1]),
        Err(EmitError::BufferTooSmall {
            required: data.len()
        })
    );
    None
}

fn icrc(data: &[u8]) {
    let flow = RoceFlow {
        src_addr: [10, 0, 0, 1],
        dst_addr: [239, 1, 2, 3],
        src_port: 50000,
        dst_port: ROCEV2_UDP_PORT,
        dont_fragment: true,
    };
    let ip_id = data.first().map_or(0, |&b| u16::from(b));
    match (flow.icrc_prefix(ip_id, data), icrc_rest(data)) {
        (Ok(prefix), Ok(rest)) => {
            assert_eq!(prefix[..8], ICRC_SEED);
            // The prefix ends with BTH bytes 0-7 (byte 4 masked); the rest starts at byte 8.
            let bth = &prefix[ICRC_PREFIX_LEN - 8..];
            assert_eq!(bth[..4], data[..4]);
            assert_eq!(bth[4], 0xff);
            assert_eq!(bth[5..], data[5..8]);
            assert_eq!(rest, &data[8..data.len() - 4]);
        }
        (Err(_), Ok(_)) => assert!(data.len() + 28 > usize::from(u16::MAX)),
        (_, Err(_)) => assert!(data.len() < BTH_LEN + 4),
    }
    // The same bytes as a whole IPv4 packet: masking changes only the five masked fields.
    let mut copy = data.to_vec();
    if icrc_mask_ipv4(&mut copy).is_ok() {
        let ihl = usize::from(data[0] & 0x0f) * 4;
        let masked = [1, 8, 10, 11, ihl + 6, ihl + 7, ihl + 8 + 4];
        for (i, (&a, &b)) in data.iter().zip(&copy).enumerate() {
            if masked.contains(&i) {
                assert_eq!(b, 0xff);
            } else {
                assert_eq!(a, b, "byte {i} changed");
            }
        }
    } else {
        assert_eq!(copy, data, "a failed mask changed bytes");
    }
}
