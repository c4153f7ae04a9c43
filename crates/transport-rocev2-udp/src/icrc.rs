//! The RoCEv2 invariant CRC (ICRC), with crc32fast.
//!
//! Recipe (DESIGN.md §6, IBA Annex A17): CRC-32 (zlib) over 8 bytes of `0xFF`, then the IPv4
//! header, the UDP header and the RoCE packet from the BTH to the end of the pad, with the
//! variant fields set to all-ones: IP TOS, TTL and header checksum, the UDP checksum, and BTH
//! byte 4 (FECN/BECN). The 4-byte result goes on the wire least-significant byte first.
//!
//! A sender cannot read the IP header the kernel writes, so it rebuilds it: version 4, IHL 5,
//! DF set and IP ID 0 (an *unconnected* socket with DF, which quinn-udp's `IP_PMTUDISC_PROBE`
//! sets), or ID `i` for segment `i` of a software GSO batch; lengths follow from the payload.
//!
//! ```
//! use ringcast_transport_rocev2_udp::icrc::icrc_ipv4;
//! let mut pkt = Vec::new();
//! for h in ["45c2003c718c4000401191610a0011010a001201", "000012b700280000",
//!           "8100ffff4000011800000000"] {
//!     pkt.extend((0..h.len()).step_by(2).map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap()));
//! }
//! pkt.extend([0u8; 16]);
//! assert_eq!(icrc_ipv4(&pkt).unwrap().to_le_bytes(), [0x82, 0xfd, 0x00, 0x2a]);
//! ```

use std::net::SocketAddrV4;

use crc32fast::Hasher;
use ringcast_core::wire::{ICRC_LEN, ICRC_SEED, RoceFlow, icrc_mask_ipv4, icrc_rest};

/// UDP header length.
const UDP_HEADER_LEN: usize = 8;
/// BTH length.
const BTH_LEN: usize = 12;
/// IP IDs a receiver tries when checking an ICRC: one per possible GSO segment (64 in Linux).
pub const MAX_IP_IDS: usize = 64;

/// Why an ICRC could not be computed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IcrcError {
    /// Not an IPv4 header, or one too short for its IHL, a UDP header and a BTH.
    #[error("not an IPv4/UDP packet carrying at least a BTH")]
    NotIpv4Udp,
    /// A UDP payload shorter than a BTH and an ICRC, or too long for IPv4.
    #[error("UDP payload of {0} bytes cannot carry a RoCEv2 packet")]
    BadLength(usize),
}

/// ICRC of an IPv4 packet given from its IP header up to the end of the pad (without the ICRC
/// itself), as the `u32` whose little-endian bytes go on the wire. The general recipe (core's
/// `icrc_mask_ipv4`), for captures and tests; the send path uses [`FlowIcrc`].
pub fn icrc_ipv4(packet: &[u8]) -> Result<u32, IcrcError> {
    let ihl = usize::from(packet.first().ok_or(IcrcError::NotIpv4Udp)? & 0x0F) * 4;
    let head_len = (ihl + UDP_HEADER_LEN + BTH_LEN).min(packet.len());
    // Only the headers are masked: copy them (at most 60 + 8 + 12 bytes) to the stack.
    let mut head = [0u8; 80];
    let head = &mut head[..head_len];
    head.copy_from_slice(&packet[..head_len]);
    icrc_mask_ipv4(head).map_err(|_| IcrcError::NotIpv4Udp)?;
    let mut h = Hasher::new();
    h.update(&ICRC_SEED);
    h.update(head);
    h.update(&packet[head_len..]);
    Ok(h.finalize())
}

/// The ICRC of one flow (sender `IP:port` to group `IP:port`), the IP and UDP headers rebuilt
/// (core's `RoceFlow`) as the kernel sends them: DF set, no options.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowIcrc {
    flow: RoceFlow,
}

impl FlowIcrc {
    /// The flow from `src` (the sending socket's bound address) to `dst` (group and port).
    pub const fn new(src: SocketAddrV4, dst: SocketAddrV4) -> Self {
        FlowIcrc {
            flow: RoceFlow {
                src_addr: src.ip().octets(),
                dst_addr: dst.ip().octets(),
                src_port: src.port(),
                dst_port: dst.port(),
                dont_fragment: true,
            },
        }
    }

    /// ICRC of the datagram whose whole UDP payload is `udp_payload` (BTH to ICRC; the ICRC
    /// bytes themselves are not read) sent with `ip_id`.
    pub fn compute(&self, ip_id: u16, udp_payload: &[u8]) -> Result<u32, IcrcError> {
        let state = self.prefix_state(ip_id, udp_payload.len(), udp_payload)?;
        Ok(resume(state, udp_payload))
    }

    /// CRC state after the masked prefix (seed, IPv4, UDP, BTH bytes 0-7) of a UDP payload
    /// `len` bytes long starting with `head`.
    fn prefix_state(&self, ip_id: u16, len: usize, head: &[u8]) -> Result<u32, IcrcError> {
        let prefix = self
            .flow
            .icrc_prefix_of(ip_id, len, head)
            .map_err(|_| IcrcError::BadLength(len))?;
        let mut h = Hasher::new();
        h.update(&prefix);
        Ok(h.finalize())
    }
}

/// Continues from a prefix state over the rest (BTH byte 8 to the end of the pad).
fn resume(state: u32, udp_payload: &[u8]) -> u32 {
    let mut h = Hasher::new_with_initial(state);
    // The caller's prefix already checked the length.
    h.update(icrc_rest(udp_payload).unwrap_or_default());
    h.finalize()
}

/// A sender lane's ICRC with the constant prefix precomputed: for full-size segments of one
/// length, the CRC state after the prefix is kept per IP ID (one per GSO segment index), so a
/// packet costs only its PSN, DETH, ImmDt and payload bytes.
#[derive(Clone, Debug)]
pub(crate) struct LaneIcrc {
    flow: FlowIcrc,
    /// `(udp_payload length, first 8 BTH bytes)` the cached states are valid for.
    key: Option<(usize, [u8; 8])>,
    states: Vec<u32>,
}

impl LaneIcrc {
    pub(crate) fn new(flow: FlowIcrc, ids: usize) -> Self {
        LaneIcrc {
            flow,
            key: None,
            states: Vec::with_capacity(ids.max(1)),
        }
    }

    /// Same value as [`FlowIcrc::compute`] for a datagram the sender built (at least a BTH
    /// and an ICRC long); 0 for anything shorter, which the sender never builds.
    pub(crate) fn compute(&mut self, ip_id: u16, udp_payload: &[u8]) -> u32 {
        let covered = udp_payload.len().saturating_sub(ICRC_LEN);
        self.compute_gathered(ip_id, udp_payload.len(), &[&udp_payload[..covered]])
    }

    /// The same for a datagram `len` bytes long (ICRC included) given as `parts`: their
    /// concatenation is the datagram from the BTH to the end of the pad, and the first holds
    /// at least BTH bytes 0-7. 0 when `len` or the parts do not fit that, which the sender
    /// never gives.
    pub(crate) fn compute_gathered(&mut self, ip_id: u16, len: usize, parts: &[&[u8]]) -> u32 {
        let Some((first, rest)) = parts.split_first() else {
            return 0;
        };
        let Some(bth) = first.get(..8).filter(|_| len >= BTH_LEN + ICRC_LEN) else {
            return 0;
        };
        if parts.iter().map(|p| p.len()).sum::<usize>() != len - ICRC_LEN {
            return 0;
        }
        let mut fixed = [0u8; 8];
        fixed.copy_from_slice(bth);
        let key = (len, fixed);
        let id = usize::from(ip_id);
        let cached = if self.key == Some(key) {
            self.states.get(id).copied()
        } else if ip_id == 0 {
            // A batch's first segment sets the length the cache serves; a shorter tail
            // segment (ID > 0) is computed without evicting it.
            self.key = Some(key);
            self.states.clear();
            None
        } else {
            None
        };
        let state = match cached {
            Some(s) => s,
            None => {
                let Ok(s) = self.flow.prefix_state(ip_id, len, first) else {
                    return 0;
                };
                if self.key == Some(key) && id == self.states.len() && id < self.states.capacity() {
                    self.states.push(s);
                }
                s
            }
        };
        let mut h = Hasher::new_with_initial(state);
        h.update(&first[8..]);
        for p in rest {
            h.update(p);
        }
        h.finalize()
    }
}

/// Checks received ICRCs when the IP ID is unknown (kernel UDP sockets cannot see it): the
/// ICRC is computed with ID 0 and the difference must be the contribution of some ID below
/// [`MAX_IP_IDS`]. CRC-32 is affine, so for equal lengths `crc(a) ^ crc(b) = crc(a ^ b) ^
/// crc(0…0)`: the difference depends only on the ID and the packet length, and is kept per
/// length. Accepting 64 IDs instead of one leaves a 2^-26 chance for a random ICRC to pass.
#[derive(Clone, Debug, Default)]
pub(crate) struct IcrcChecker {
    /// `(udp_payload length, delta per IP ID)` for the most recent lengths, newest first.
    cache: Vec<(usize, [u32; MAX_IP_IDS])>,
}

/// Distinct packet lengths remembered (full chunks and a few tails).
const CHECKER_LENGTHS: usize = 4;

impl IcrcChecker {
    /// Whether `icrc` is the ICRC of the datagram `udp_payload` on `flow` for some IP ID below
    /// [`MAX_IP_IDS`].
    pub(crate) fn check(&mut self, flow: &FlowIcrc, udp_payload: &[u8], icrc: u32) -> bool {
        let Ok(at_zero) = flow.compute(0, udp_payload) else {
            return false;
        };
        let diff = at_zero ^ icrc;
        diff == 0 || self.deltas(udp_payload.len()).contains(&diff)
    }

    fn deltas(&mut self, len: usize) -> &[u32; MAX_IP_IDS] {
        if let Some(i) = self.cache.iter().position(|(l, _)| *l == len) {
            self.cache[..=i].rotate_right(1);
        } else {
            let deltas = id_deltas(len);
            if self.cache.len() == CHECKER_LENGTHS {
                self.cache.pop();
            }
            self.cache.insert(0, (len, deltas));
        }
        &self.cache[0].1
    }
}

/// `delta[id] = crc(m with IP ID id) ^ crc(m with IP ID 0)` for any `m` of this length.
fn id_deltas(len: usize) -> [u32; MAX_IP_IDS] {
    // Zero addresses, ports and bytes: the delta does not depend on them. Each ID bit's
    // contribution is computed once on the shortest packet, then carried over the
    // `len - SHORTEST` bytes that follow it here with CRC-32's zero-padding operator
    // (crc32fast's `combine`, logarithmic in the length), and the table filled by linearity:
    // a new length costs no pass over its bytes and no allocation.
    const SHORTEST: usize = BTH_LEN + ICRC_LEN;
    let zero = SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0);
    let flow = FlowIcrc::new(zero, zero);
    let zeros = [0u8; SHORTEST];
    let crc = |id: u16| flow.compute(id, &zeros).unwrap_or(0);
    let base = crc(0);
    let pad = len.saturating_sub(SHORTEST) as u64;
    let mut bit = [0u32; MAX_IP_IDS.trailing_zeros() as usize];
    for (j, b) in bit.iter_mut().enumerate() {
        // Both messages have equal lengths, so the padding's own CRC cancels: combining
        // with a zero CRC of `pad` bytes is the bare shift.
        let mut h = Hasher::new_with_initial_len(crc(1 << j) ^ base, 0);
        h.combine(&Hasher::new_with_initial_len(0, pad));
        *b = h.finalize();
    }
    let mut deltas = [0u32; MAX_IP_IDS];
    for (id, d) in deltas.iter_mut().enumerate() {
        *d = bit
            .iter()
            .enumerate()
            .filter(|(j, _)| id >> j & 1 == 1)
            .fold(0, |acc, (_, b)| acc ^ b);
    }
    deltas
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// DESIGN.md §6: a ConnectX-4 Lx CNP from scapy's RoCE tests.
    fn cnp() -> Vec<u8> {
        let mut p =
            hex("45c2003c718c4000401191610a0011010a001201000012b7002800008100ffff4000011800000000");
        p.extend([0u8; 16]);
        p
    }

    #[test]
    fn known_answer_vector() {
        assert_eq!(
            icrc_ipv4(&cnp()).unwrap().to_le_bytes(),
            [0x82, 0xfd, 0x00, 0x2a]
        );
    }

    #[test]
    fn flow_rebuilds_the_same_headers() {
        let p = cnp();
        let flow = FlowIcrc::new(
            SocketAddrV4::new(Ipv4Addr::new(10, 0, 17, 1), 0),
            SocketAddrV4::new(Ipv4Addr::new(10, 0, 18, 1), 4791),
        );
        // The UDP payload with room for the ICRC.
        let mut udp = p[28..].to_vec();
        udp.extend([0u8; 4]);
        assert_eq!(flow.compute(0x718c, &udp), Ok(0x2a00_fd82));
        let mut lane = LaneIcrc::new(flow, 4);
        for _ in 0..3 {
            assert_eq!(lane.compute(0x718c, &udp), 0x2a00_fd82);
        }
        assert_eq!(flow.compute(0, &udp[..15]), Err(IcrcError::BadLength(15)));
    }

    #[test]
    fn masked_fields_do_not_matter() {
        let mut p = cnp();
        let want = icrc_ipv4(&p).unwrap();
        for at in [1, 8, 10, 11, 26, 27, 32] {
            p[at] ^= 0x5A;
        }
        assert_eq!(icrc_ipv4(&p).unwrap(), want);
        p[4] ^= 1; // IP ID is covered
        assert_ne!(icrc_ipv4(&p).unwrap(), want);
    }

    #[test]
    fn rejects_non_ipv4() {
        assert_eq!(icrc_ipv4(&[]), Err(IcrcError::NotIpv4Udp));
        assert_eq!(icrc_ipv4(&cnp()[..35]), Err(IcrcError::NotIpv4Udp));
        let mut p = cnp();
        p[0] = 0x65;
        assert_eq!(icrc_ipv4(&p), Err(IcrcError::NotIpv4Udp));
    }

    #[test]
    fn lane_cache_matches_flow_for_every_id_and_length() {
        let flow = FlowIcrc::new(
            SocketAddrV4::new(Ipv4Addr::LOCALHOST, 40000),
            SocketAddrV4::new(Ipv4Addr::new(239, 1, 2, 3), 4791),
        );
        let mut lane = LaneIcrc::new(flow, 8);
        for len in [16, 44, 44, 68, 44] {
            let udp: Vec<u8> = (0..len).map(|i| i as u8).collect();
            for id in [0u16, 1, 7, 8, 63, 0] {
                assert_eq!(lane.compute(id, &udp), flow.compute(id, &udp).unwrap());
            }
        }
        assert_eq!(lane.compute(0, &[0u8; 15]), 0);
    }

    #[test]
    fn gathered_parts_give_the_laid_out_datagrams_icrc() {
        let flow = FlowIcrc::new(
            SocketAddrV4::new(Ipv4Addr::LOCALHOST, 40000),
            SocketAddrV4::new(Ipv4Addr::new(239, 1, 2, 3), 4791),
        );
        let mut lane = LaneIcrc::new(flow, 8);
        for len in [16usize, 44, 1052, 44] {
            let udp: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let covered = &udp[..len - ICRC_LEN];
            for id in [0u16, 1, 7, 8] {
                let want = flow.compute(id, &udp).unwrap();
                // Headers, payload and pad as three parts, and cut anywhere after byte 8.
                let (head, rest) = covered.split_at(8.max(len / 3).min(covered.len()));
                let (mid, tail) = rest.split_at(rest.len() / 2);
                assert_eq!(lane.compute_gathered(id, len, &[head, mid, tail]), want);
                assert_eq!(lane.compute_gathered(id, len, &[covered]), want);
            }
            // Parts that do not add up to the length, or a first part without a BTH.
            assert_eq!(lane.compute_gathered(0, len + 1, &[covered]), 0);
            assert_eq!(
                lane.compute_gathered(0, len, &[&covered[..4], &covered[4..]]),
                0
            );
            assert_eq!(lane.compute_gathered(0, len, &[]), 0);
        }
    }

    #[test]
    fn checker_accepts_every_gso_id_and_nothing_else() {
        let flow = FlowIcrc::new(
            SocketAddrV4::new(Ipv4Addr::LOCALHOST, 40000),
            SocketAddrV4::new(Ipv4Addr::new(239, 1, 2, 3), 4791),
        );
        let mut c = IcrcChecker::default();
        for len in [28, 104, 1024 + 28, 104, 32, 40, 48, 56, 16, 17, 8972] {
            let udp: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let icrc = |id| flow.compute(id, &udp).unwrap();
            for id in 0..MAX_IP_IDS as u16 {
                assert!(c.check(&flow, &udp, icrc(id)));
            }
            for id in [64u16, 65, 1000, 0xFFFF] {
                assert!(!c.check(&flow, &udp, icrc(id)));
            }
            assert!(!c.check(&flow, &udp, icrc(0) ^ 1));
        }
        assert!(!c.check(&flow, &[0u8; 15], 0));
        assert!(c.cache.len() <= CHECKER_LENGTHS);
    }
}
