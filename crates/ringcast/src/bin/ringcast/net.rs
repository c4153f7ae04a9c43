//! What `demo` and `bench` ranks share: connecting, test data, verification, a barrier, and
//! the bytes a rank injected.

use crate::args::NetArgs;
use ringcast::Communicator;
use ringcast::comm::{CommBuilder, CommStats};
use std::net::Ipv4Addr;

/// IPv4 (20) and UDP (8) headers: on the wire with every datagram, not in the UDP payload.
pub(crate) const IP_UDP_HEADERS: u64 = 28;

/// Joins the job: the launcher's environment (or a local run's `RINGCAST_*`), with the flags
/// given on top; `tcp_threshold` when `--tcp-threshold` is not given (`None`: the library's).
pub(crate) fn connect(net: &NetArgs, tcp_threshold: Option<u64>) -> Result<Communicator, String> {
    let mut b = CommBuilder::from_env().map_err(|e| e.to_string())?;
    if net.child {
        // A local run: loopback multicast works without root.
        b = b.interface(Ipv4Addr::LOCALHOST);
    }
    if let Some(l) = net.lanes {
        b = b.lanes(l);
    }
    if let Some(c) = net.chunk {
        let c = u32::try_from(c).map_err(|_| format!("--chunk {c} is too large"))?;
        b = b.chunk_size(c);
    }
    if let Some(bw) = net.link_bandwidth {
        b = b.link_bandwidth(bw);
    }
    if let Some(t) = net.peer_timeout {
        b = b.peer_timeout(t);
    }
    if let Some(t) = net.tcp_threshold.or(tcp_threshold) {
        b = b.tcp_threshold(t);
    }
    b.build().map_err(|e| e.to_string())
}

/// Rank `rank`'s data for `salt`: every 8-byte word differs, so a chunk placed at the wrong
/// offset or taken from the wrong rank is caught.
pub(crate) fn pattern(salt: u64, rank: u32, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; len];
    let seed = salt.rotate_left(17) ^ (u64::from(rank) << 40);
    let mut words = v.chunks_exact_mut(8);
    for (i, w) in (&mut words).enumerate() {
        w.copy_from_slice(&splitmix(seed ^ i as u64).to_le_bytes());
    }
    let tail = words.into_remainder();
    let last = splitmix(seed ^ u64::MAX).to_le_bytes();
    let n = tail.len();
    tail.copy_from_slice(&last[..n]);
    v
}

fn splitmix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `Err` naming the first byte that differs, and whose block it lies in.
pub(crate) fn verify(what: &str, got: &[u8], want: &[u8], blocks: &[usize]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!("{what}: {} bytes, want {}", got.len(), want.len()));
    }
    let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) else {
        return Ok(());
    };
    let mut start = 0;
    let mut owner = 0;
    for (r, &b) in blocks.iter().enumerate() {
        if i < start + b {
            owner = r;
            break;
        }
        start += b;
    }
    Err(format!(
        "{what}: byte {i} (offset {} in rank {owner}'s block) is {:#04x}, want {:#04x}",
        i - start,
        got[i],
        want[i]
    ))
}

/// What a rank put on the network during an operation (from [`CommStats`] before and after).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Injected {
    /// Multicast datagrams sent.
    pub(crate) datagrams: u64,
    /// Chunk payload bytes multicast.
    pub(crate) payload: u64,
    /// Bytes on the wire: UDP payload (RoCEv2 headers, payload, ICRC) plus IP and UDP headers,
    /// and the data of operations run over TCP (small ones, or after a fallback).
    pub(crate) wire: u64,
    /// Data bytes sent over TCP by operations run there (headers not counted).
    pub(crate) tcp: u64,
    /// Recovery bytes this rank served to peers over TCP (slow path).
    pub(crate) served: u64,
    /// Recovery bytes this rank fetched.
    pub(crate) fetched: u64,
}

impl Injected {
    pub(crate) fn between(a: &CommStats, b: &CommStats) -> Self {
        let datagrams = b.tx.datagrams.saturating_sub(a.tx.datagrams);
        let tcp = b
            .counters
            .tcp_bytes_sent
            .saturating_sub(a.counters.tcp_bytes_sent);
        Injected {
            datagrams,
            payload: b.tx.payload_bytes.saturating_sub(a.tx.payload_bytes),
            wire: b.tx.udp_bytes.saturating_sub(a.tx.udp_bytes) + datagrams * IP_UDP_HEADERS + tcp,
            tcp,
            served: b
                .control
                .bytes_served
                .saturating_sub(a.control.bytes_served),
            fetched: b
                .counters
                .bytes_fetched
                .saturating_sub(a.counters.bytes_fetched),
        }
    }

    pub(crate) fn add(&mut self, o: &Injected) {
        self.datagrams += o.datagrams;
        self.payload += o.payload;
        self.wire += o.wire;
        self.tcp += o.tcp;
        self.served += o.served;
        self.fetched += o.fetched;
    }
}

/// Bytes each rank sends in a binomial-tree Broadcast of `n` bytes from `root` (MPICH's tree):
/// one copy per child.
pub(crate) fn binomial_bcast(ranks: u32, root: u32, n: u64) -> Vec<u64> {
    (0..ranks)
        .map(|r| {
            let v = (r + ranks - root) % ranks;
            // Children are v + m for every power of two m below v's lowest set bit (below
            // the next power of two of `ranks` for the root).
            let top = if v == 0 {
                ranks.next_power_of_two()
            } else {
                1 << v.trailing_zeros()
            };
            let mut kids = 0u64;
            let mut m = 1;
            while m < top {
                if v + m < ranks {
                    kids += 1;
                }
                m <<= 1;
            }
            kids * n
        })
        .collect()
}

/// Allgatherv block sizes with mean `size`: rank r gets about 2(r+1)/(P+1) of it, the last
/// rank the rounding.
pub(crate) fn uneven_blocks(ranks: u32, size: u64) -> Vec<u64> {
    let p = u64::from(ranks);
    let mut v: Vec<u64> = (0..p).map(|r| 2 * size * (r + 1) / (p + 1)).collect();
    let sum: u64 = v.iter().sum();
    if let Some(last) = v.last_mut() {
        *last += p * size - sum;
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binomial_tree_sends() {
        assert_eq!(binomial_bcast(4, 0, 1), [2, 0, 1, 0]);
        assert_eq!(binomial_bcast(8, 0, 1), [3, 0, 1, 0, 2, 0, 1, 0]);
        assert_eq!(binomial_bcast(5, 2, 1), [0, 0, 3, 0, 1]);
        assert_eq!(binomial_bcast(1, 0, 7), [0]);
        for p in 1..40 {
            assert_eq!(
                binomial_bcast(p, p / 2, 1).iter().sum::<u64>(),
                u64::from(p) - 1
            );
        }
    }

    #[test]
    fn uneven_blocks_keep_the_mean() {
        assert_eq!(uneven_blocks(4, 10), [4, 8, 12, 16]);
        assert_eq!(uneven_blocks(3, 7).iter().sum::<u64>(), 21);
        assert_eq!(uneven_blocks(1, 5), [5]);
    }

    #[test]
    fn patterns_differ_and_verify_names_the_block() {
        let a = pattern(1, 0, 100);
        assert_ne!(a, pattern(1, 1, 100));
        assert_ne!(a, pattern(2, 0, 100));
        assert_eq!(a, pattern(1, 0, 100));
        let mut b = a.clone();
        b[70] ^= 1;
        let e = verify("x", &b, &a, &[50, 50]).expect_err("differs");
        assert!(e.contains("byte 70 (offset 20 in rank 1's block)"), "{e}");
        assert!(verify("x", &a, &a, &[100]).is_ok());
    }
}
