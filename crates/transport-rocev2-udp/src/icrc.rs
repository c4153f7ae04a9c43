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

/// IPv4 header length without options (IHL 5).
pub const IPV4_HEADER_LEN: usize = 20;
/// UDP header length.
pub const UDP_HEADER_LEN: usize = 8;
/// The BTH bytes the ICRC's per-flow header state covers (byte 4 is masked among them).
const BTH_FIXED: usize = 8;
/// 8 bytes of `0xFF` (the masked LRH stand-in) + IPv4 + UDP + the first 8 BTH bytes.
const HEADERS_LEN: usize = 8 + IPV4_HEADER_LEN + UDP_HEADER_LEN + BTH_FIXED;
/// IP IDs a receiver tries when checking an ICRC: one per possible GSO segment (64 in Linux).
pub const MAX_IP_IDS: usize = 64;

/// Why [`icrc_ipv4`] could not compute an ICRC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum IcrcError {
    /// Not an IPv4 header, or one too short for its IHL, a UDP header and a BTH.
    #[error("not an IPv4/UDP packet carrying at least a BTH")]
    NotIpv4Udp,
}

/// ICRC of an IPv4 packet given from its IP header up to the end of the pad (without the ICRC
/// itself), as the `u32` whose little-endian bytes go on the wire.
pub fn icrc_ipv4(packet: &[u8]) -> Result<u32, IcrcError> {
    let ihl = usize::from(packet.first().ok_or(IcrcError::NotIpv4Udp)? & 0x0F) * 4;
    let fixed = ihl + UDP_HEADER_LEN + BTH_FIXED;
    if packet[0] >> 4 != 4 || ihl < IPV4_HEADER_LEN || packet.len() < fixed + 4 {
        return Err(IcrcError::NotIpv4Udp);
    }
    // At most 60 + 8 + 8 bytes of headers, masked on the stack.
    let mut head = [0u8; 76];
    let head = &mut head[..fixed];
    head.copy_from_slice(&packet[..fixed]);
    head[1] = 0xFF; // TOS
    head[8] = 0xFF; // TTL
    head[10..12].fill(0xFF); // header checksum
    head[ihl + 6..ihl + 8].fill(0xFF); // UDP checksum
    head[ihl + UDP_HEADER_LEN + 4] = 0xFF; // BTH byte 4
    let mut h = Hasher::new();
    h.update(&[0xFF; 8]);
    h.update(head);
    h.update(&packet[fixed..]);
    Ok(h.finalize())
}

/// The ICRC of one flow (sender `IP:port` to group `IP:port`), the IP and UDP headers rebuilt
/// as the kernel sends them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlowIcrc {
    src: SocketAddrV4,
    dst: SocketAddrV4,
}

impl FlowIcrc {
    /// The flow from `src` (the sending socket's bound address) to `dst` (group and port).
    pub const fn new(src: SocketAddrV4, dst: SocketAddrV4) -> Self {
        FlowIcrc { src, dst }
    }

    /// ICRC of the RoCE packet `roce` (BTH through pad, without the ICRC) sent with `ip_id`.
    ///
    /// `roce` shorter than 12 bytes (a BTH) is hashed as given; senders never build one.
    pub fn compute(&self, ip_id: u16, roce: &[u8]) -> u32 {
        let fixed = roce.len().min(BTH_FIXED);
        let state = self.header_state(ip_id, roce.len() + 4, &roce[..fixed]);
        let mut h = Hasher::new_with_initial(state);
        h.update(&roce[fixed..]);
        h.finalize()
    }

    /// The CRC state after the masked headers of a datagram whose UDP payload (ICRC
    /// included) is `udp_payload_len` bytes and whose first BTH bytes are `bth`.
    fn header_state(&self, ip_id: u16, udp_payload_len: usize, bth: &[u8]) -> u32 {
        let udp_len = (UDP_HEADER_LEN + udp_payload_len) as u16;
        let total_len = (IPV4_HEADER_LEN + UDP_HEADER_LEN + udp_payload_len) as u16;
        let mut b = [0xFFu8; HEADERS_LEN];
        let ip = &mut b[8..8 + IPV4_HEADER_LEN];
        ip[0] = 0x45;
        // ip[1] TOS masked.
        ip[2..4].copy_from_slice(&total_len.to_be_bytes());
        ip[4..6].copy_from_slice(&ip_id.to_be_bytes());
        ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes()); // DF, offset 0
        // ip[8] TTL masked.
        ip[9] = 17; // UDP
        // ip[10..12] checksum masked.
        ip[12..16].copy_from_slice(&self.src.ip().octets());
        ip[16..20].copy_from_slice(&self.dst.ip().octets());
        let udp = &mut b[8 + IPV4_HEADER_LEN..8 + IPV4_HEADER_LEN + UDP_HEADER_LEN];
        udp[0..2].copy_from_slice(&self.src.port().to_be_bytes());
        udp[2..4].copy_from_slice(&self.dst.port().to_be_bytes());
        udp[4..6].copy_from_slice(&udp_len.to_be_bytes());
        // udp[6..8] checksum masked.
        let at = 8 + IPV4_HEADER_LEN + UDP_HEADER_LEN;
        b[at..at + bth.len()].copy_from_slice(bth);
        b[at + 4] = 0xFF; // BTH byte 4 masked
        let mut h = Hasher::new();
        h.update(&b[..at + bth.len()]);
        h.finalize()
    }
}

/// A sender lane's ICRC with the constant prefix precomputed: for full-size segments of one
/// length, the CRC state after the headers is kept per IP ID (one per GSO segment index), so a
/// packet costs only its PSN, DETH, ImmDt and payload bytes.
#[derive(Clone, Debug)]
pub(crate) struct LaneIcrc {
    flow: FlowIcrc,
    /// `(roce_len, first 8 BTH bytes)` the cached states are valid for.
    key: Option<(usize, [u8; BTH_FIXED])>,
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

    /// Same value as [`FlowIcrc::compute`]; `roce` is at least a BTH long.
    pub(crate) fn compute(&mut self, ip_id: u16, roce: &[u8]) -> u32 {
        if roce.len() < BTH_FIXED {
            return self.flow.compute(ip_id, roce);
        }
        let mut bth = [0u8; BTH_FIXED];
        bth.copy_from_slice(&roce[..BTH_FIXED]);
        let key = (roce.len(), bth);
        let id = usize::from(ip_id);
        if self.key != Some(key) {
            // A batch's first segment sets the length the cache serves; a shorter tail
            // segment (ID > 0) is computed without evicting it.
            if ip_id != 0 {
                return self.flow.compute(ip_id, roce);
            }
            self.key = Some(key);
            self.states.clear();
        }
        let state = if let Some(&s) = self.states.get(id) {
            s
        } else if id == self.states.len() && id < self.states.capacity() {
            let s = self.flow.header_state(ip_id, roce.len() + 4, &bth);
            self.states.push(s);
            s
        } else {
            self.flow.header_state(ip_id, roce.len() + 4, &bth)
        };
        let mut h = Hasher::new_with_initial(state);
        h.update(&roce[BTH_FIXED..]);
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
    /// `(roce_len, delta per IP ID)` for the most recent lengths, newest first.
    cache: Vec<(usize, [u32; MAX_IP_IDS])>,
}

/// Distinct packet lengths remembered (full chunks and a few tails).
const CHECKER_LENGTHS: usize = 4;

impl IcrcChecker {
    /// Whether `icrc` is the ICRC of `roce` on `flow` for some IP ID below [`MAX_IP_IDS`].
    pub(crate) fn check(&mut self, flow: &FlowIcrc, roce: &[u8], icrc: u32) -> bool {
        let diff = flow.compute(0, roce) ^ icrc;
        if diff == 0 {
            return true;
        }
        let deltas = self.deltas(roce.len());
        deltas.contains(&diff)
    }

    fn deltas(&mut self, roce_len: usize) -> &[u32; MAX_IP_IDS] {
        if let Some(i) = self.cache.iter().position(|(len, _)| *len == roce_len) {
            self.cache[..=i].rotate_right(1);
        } else {
            let deltas = id_deltas(roce_len);
            if self.cache.len() == CHECKER_LENGTHS {
                self.cache.pop();
            }
            self.cache.insert(0, (roce_len, deltas));
        }
        &self.cache[0].1
    }
}

/// `delta[id] = crc(m with IP ID id) ^ crc(m with IP ID 0)` for any `m` of this length.
fn id_deltas(roce_len: usize) -> [u32; MAX_IP_IDS] {
    // Zero addresses and ports: the delta does not depend on them. Each bit's contribution is
    // computed once (6 bits cover 64 IDs) and the table filled by linearity.
    let zero = SocketAddrV4::new(std::net::Ipv4Addr::UNSPECIFIED, 0);
    let flow = FlowIcrc::new(zero, zero);
    let zeros = vec![0u8; roce_len];
    let base = flow.compute(0, &zeros);
    let mut bit = [0u32; MAX_IP_IDS.trailing_zeros() as usize];
    for (j, b) in bit.iter_mut().enumerate() {
        *b = flow.compute(1 << j, &zeros) ^ base;
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
        assert_eq!(flow.compute(0x718c, &p[28..]), 0x2a00_fd82);
        let mut lane = LaneIcrc::new(flow, 4);
        for _ in 0..3 {
            assert_eq!(lane.compute(0x718c, &p[28..]), 0x2a00_fd82);
        }
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
        for len in [12, 40, 40, 64, 40] {
            let roce: Vec<u8> = (0..len).map(|i| i as u8).collect();
            for id in [0u16, 1, 7, 8, 63, 0] {
                assert_eq!(lane.compute(id, &roce), flow.compute(id, &roce));
            }
        }
    }

    #[test]
    fn checker_accepts_every_gso_id_and_nothing_else() {
        let flow = FlowIcrc::new(
            SocketAddrV4::new(Ipv4Addr::LOCALHOST, 40000),
            SocketAddrV4::new(Ipv4Addr::new(239, 1, 2, 3), 4791),
        );
        let mut c = IcrcChecker::default();
        for len in [24, 100, 1024 + 24, 100, 28, 36, 44, 52] {
            let roce: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            for id in 0..MAX_IP_IDS as u16 {
                assert!(c.check(&flow, &roce, flow.compute(id, &roce)));
            }
            for id in [64u16, 65, 1000, 0xFFFF] {
                assert!(!c.check(&flow, &roce, flow.compute(id, &roce)));
            }
            assert!(!c.check(&flow, &roce, flow.compute(0, &roce) ^ 1));
        }
        assert!(c.cache.len() <= CHECKER_LENGTHS);
    }
}
