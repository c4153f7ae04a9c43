//! What `demo` and `bench` ranks share: connecting, test data, verification, a barrier, and
//! the bytes a rank injected.

use crate::CmdError;
use crate::args::NetArgs;
use crate::units::{MAX_SIZE, human};
use bytemuck::Pod;
use ringcast::comm::{CommBuilder, CommStats};
// SplitMix64's step: the patterns' generator.
use ringcast::core::port::splitmix64 as splitmix;
use ringcast::{BuildError, CommError, Communicator};
use std::net::Ipv4Addr;

/// IPv4 (20) and UDP (8) headers: on the wire with every datagram, not in the UDP payload.
pub(crate) const IP_UDP_HEADERS: u64 = 28;

/// Joins the job: the launcher's environment (or a local run's `RINGCAST_*`), with the flags
/// given on top; `tcp_threshold` when `--tcp-threshold` is not given (`None`: the library's).
pub(crate) fn connect(net: &NetArgs, tcp_threshold: Option<u64>) -> Result<Communicator, String> {
    if net.child {
        crate::local::exit_with_parent();
    }
    let mut b = CommBuilder::from_env().map_err(|e| e.to_string())?;
    if net.child {
        // A local run: loopback multicast works without root.
        b = b.interface(Ipv4Addr::LOCALHOST);
    }
    if let Some(l) = net.lanes {
        b = b.lanes(l);
    }
    if let Some(c) = net.chunk {
        b = b.chunk_size(chunk(c)?);
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
    b.build().map_err(|e| match e {
        // The builder names the variable; the value came from the flag.
        BuildError::Invalid { setting, why } => {
            let flag = [
                (net.chunk.is_some(), "RINGCAST_CHUNK_SIZE", "--chunk"),
                (net.lanes.is_some(), "RINGCAST_LANES", "--lanes"),
                (
                    net.peer_timeout.is_some(),
                    "RINGCAST_PEER_TIMEOUT",
                    "--peer-timeout",
                ),
            ]
            .into_iter()
            .find(|&(given, var, _)| given && setting.contains(var));
            match flag {
                Some((_, _, flag)) => format!("{flag}: {why}"),
                None => BuildError::Invalid { setting, why }.to_string(),
            }
        }
        e => e.to_string(),
    })
}

/// What is wrong with the flags every rank would refuse alike (checked before any rank
/// starts): `--chunk`, `--lanes`, `--peer-timeout`.
pub(crate) fn check_flags(net: &NetArgs) -> Result<(), String> {
    if let Some(c) = net.chunk {
        chunk(c)?;
    }
    if let Some(l) = net.lanes
        && !(1..=ringcast::comm::MAX_LANES).contains(&l)
    {
        return Err(format!(
            "--lanes {l} must be between 1 and {}",
            ringcast::comm::MAX_LANES
        ));
    }
    if let Some(t) = net.peer_timeout
        && (t.is_zero() || t > ringcast::core::MAX_TIMEOUT)
    {
        // Zero as the user may have written it (`0s`, `0ms`): not echoed as `0ns`.
        let given = if t.is_zero() {
            String::new()
        } else {
            format!(" {t:?}")
        };
        return Err(format!(
            "--peer-timeout{given} must be positive and at most {:?}",
            ringcast::core::MAX_TIMEOUT
        ));
    }
    Ok(())
}

/// What is wrong with `--sizes` `size` on `ranks` local ranks (all of them for a gather; on
/// loopback, whose chunks are [`LOOPBACK_CHUNK`](ringcast::comm::LOOPBACK_CHUNK) bytes unless
/// `--chunk`, or else `RINGCAST_CHUNK_SIZE`, which the ranks inherit, says): a buffer too
/// large (see [`held_bytes`]), or more chunks than an operation may have.
pub(crate) fn check_chunks(
    net: &NetArgs,
    size: u64,
    ranks: u32,
    gather: bool,
) -> Result<(), String> {
    let bytes = held_bytes(size, ranks, gather)?;
    let env = std::env::var("RINGCAST_CHUNK_SIZE").ok();
    let chunk = local_chunk(net.chunk, env.as_deref());
    let most = u64::from(ringcast::core::Limits::default().max_chunks_per_op);
    let chunks = bytes.div_ceil(chunk);
    if chunks > most {
        return Err(format!(
            "--sizes {size}: {chunks} chunks of {chunk} B in one operation, more than the {most} it \
             may have; use a larger --chunk or smaller --sizes"
        ));
    }
    Ok(())
}

/// The chunk local ranks run with: `--chunk`, else `inherited` (their `RINGCAST_CHUNK_SIZE`,
/// as the builder parses it), else loopback's default.
fn local_chunk(flag: Option<u64>, inherited: Option<&str>) -> u64 {
    flag.or_else(|| inherited?.trim().parse::<u32>().ok().map(u64::from))
        .unwrap_or(u64::from(ringcast::comm::LOOPBACK_CHUNK))
        .max(1)
}

/// The shortest chunk a communicator takes: the start-up check's probe.
const MIN_CHUNK: u64 = 16;

/// `--chunk` as the builder takes it, or what is wrong with it (checked before any rank
/// starts, where the builder would refuse it in every rank).
pub(crate) fn chunk(c: u64) -> Result<u32, String> {
    let max = ringcast_transport_rocev2_udp::MAX_CHUNK_PAYLOAD as u64;
    u32::try_from(c)
        .ok()
        .filter(|_| (MIN_CHUNK..=max).contains(&c))
        .ok_or_else(|| {
            format!(
                "--chunk {c} must be between {MIN_CHUNK} B and {max} B (a chunk and its \
                 headers fit one UDP datagram)"
            )
        })
}

/// Why one collective of `demo` or `bench` stopped on a rank.
pub(crate) enum Step {
    /// The communicator failed it.
    Comm(CommError),
    /// Anything else: a buffer that could not be allocated, a closed output.
    Cmd(CmdError),
}

impl From<CommError> for Step {
    fn from(e: CommError) -> Self {
        Step::Comm(e)
    }
}

impl From<CmdError> for Step {
    fn from(e: CmdError) -> Self {
        Step::Cmd(e)
    }
}

impl From<String> for Step {
    fn from(e: String) -> Self {
        Step::Cmd(CmdError::Msg(e))
    }
}

/// `len` copies of `fill`, or `None` where this process cannot allocate them (an infallible
/// allocation would abort it instead).
pub(crate) fn try_filled<T: Clone>(len: u64, fill: T) -> Option<Vec<T>> {
    let n = usize::try_from(len).ok()?;
    let mut v = Vec::new();
    v.try_reserve_exact(n).ok()?;
    v.resize(n, fill);
    Some(v)
}

/// A buffer of `len` bytes of `fill`, or an error naming `--sizes` where memory is short.
pub(crate) fn buffer(len: u64, fill: u8) -> Result<Vec<u8>, String> {
    filled(len, len, fill)
}

/// A zeroed buffer of `len` bytes (a multiple of `T`'s size) as `T`s, or an error naming
/// `--sizes` where memory is short.
pub(crate) fn zeroed<T: Pod>(len: u64) -> Result<Vec<T>, String> {
    filled(len, len / std::mem::size_of::<T>() as u64, T::zeroed())
}

/// `n` copies of `fill`, `len` bytes in all, or the error of [`buffer`].
fn filled<T: Clone>(len: u64, n: u64, fill: T) -> Result<Vec<T>, String> {
    try_filled(n, fill).ok_or_else(|| {
        format!(
            "cannot allocate a buffer of {} ({len} B) on this rank: use smaller --sizes",
            human(len)
        )
    })
}

/// The bytes one rank holds for an operation on blocks of `size` bytes: one block (a
/// Broadcast) or one per rank (an Allgather), or an error naming `--sizes` where that does
/// not fit in a buffer (at most 2^63 - 1 bytes).
pub(crate) fn held_bytes(size: u64, ranks: u32, gather: bool) -> Result<u64, String> {
    let per = if gather { u64::from(ranks) } else { 1 };
    size.checked_mul(per)
        .filter(|b| *b <= MAX_SIZE)
        .ok_or_else(|| {
            format!(
                "--sizes {size}: {ranks} ranks x {size} B is more than a buffer can hold \
                 ({MAX_SIZE} B)"
            )
        })
}

/// Rank `rank`'s data for `salt`: every 8-byte word differs, so a chunk placed at the wrong
/// offset or taken from the wrong rank is caught. Allocated fallibly (see [`buffer`]), as
/// `T`s (`len` a multiple of their size).
pub(crate) fn pattern<T: Pod>(salt: u64, rank: u32, len: u64) -> Result<Vec<T>, String> {
    let mut v = zeroed::<T>(len)?;
    pattern_into(salt, rank, bytemuck::cast_slice_mut(&mut v));
    Ok(v)
}

/// [`pattern`] written into `v`.
pub(crate) fn pattern_into(salt: u64, rank: u32, v: &mut [u8]) {
    let seed = salt.rotate_left(17) ^ (u64::from(rank) << 40);
    let mut words = v.chunks_exact_mut(8);
    for (i, w) in (&mut words).enumerate() {
        w.copy_from_slice(&splitmix(seed ^ i as u64).to_le_bytes());
    }
    let tail = words.into_remainder();
    let last = splitmix(seed ^ u64::MAX).to_le_bytes();
    let n = tail.len();
    tail.copy_from_slice(&last[..n]);
}

/// The patterns of every rank, block after block: what an Allgather(v) of `blocks` gathers
/// (the tests' reference for [`verify_gathered`]).
#[cfg(test)]
pub(crate) fn gathered(salt: u64, blocks: &[u64]) -> Result<Vec<u8>, String> {
    let total = blocks.iter().try_fold(0u64, |t, b| t.checked_add(*b));
    let mut v = buffer(total.unwrap_or(u64::MAX), 0)?;
    let mut at = 0;
    for (r, &b) in blocks.iter().enumerate() {
        // Every block fits: their sum does.
        let b = b as usize;
        pattern_into(salt, r as u32, &mut v[at..at + b]);
        at += b;
    }
    Ok(v)
}

/// [`verify`] of an Allgather(v) of `blocks` against every rank's pattern ([`pattern`]),
/// computed one block at a time: the expected bytes take one block's memory, not the whole
/// buffer's (every local rank holds its own receive buffer already).
pub(crate) fn verify_gathered(
    what: &str,
    got: &[u8],
    salt: u64,
    blocks: &[usize],
) -> Result<(), String> {
    let total = blocks.iter().try_fold(0usize, |t, b| t.checked_add(*b));
    if total != Some(got.len()) {
        return Err(format!(
            "{what}: {} bytes, want {}",
            got.len(),
            total.map_or_else(|| "more than memory".into(), |t| t.to_string())
        ));
    }
    let mut want = buffer(blocks.iter().copied().max().unwrap_or(0) as u64, 0)?;
    let mut at = 0;
    for (r, &b) in blocks.iter().enumerate() {
        let want = &mut want[..b];
        pattern_into(salt, r as u32, want);
        let got = &got[at..at + b];
        if let Some(i) = got.iter().zip(&*want).position(|(a, b)| a != b) {
            return Err(format!(
                "{what}: byte {} (offset {i} in rank {r}'s block) is {:#04x}, want {:#04x}",
                at + i,
                got[i],
                want[i]
            ));
        }
        at += b;
    }
    Ok(())
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
/// rank the rounding. `None` where the P blocks add up to more than 2^64 - 1 bytes.
pub(crate) fn uneven_blocks(ranks: u32, size: u64) -> Option<Vec<u64>> {
    let p = u128::from(ranks);
    let total = u64::try_from(p * u128::from(size)).ok()?;
    // Below 2 * size (r < p): fits.
    let mut v: Vec<u64> = (0..p)
        .map(|r| (2 * u128::from(size) * (r + 1) / (p + 1)) as u64)
        .collect();
    let sum: u64 = v.iter().sum();
    if let Some(last) = v.last_mut() {
        *last += total - sum;
    }
    Some(v)
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

    /// The chunk-count check counts the chunks the local ranks will run with: the flag, else
    /// the variable they inherit, else loopback's default.
    #[test]
    fn local_ranks_chunk_by_flag_then_variable_then_loopback() {
        let lo = u64::from(ringcast::comm::LOOPBACK_CHUNK);
        assert_eq!(local_chunk(None, None), lo);
        assert_eq!(local_chunk(None, Some("4096")), 4096);
        assert_eq!(local_chunk(Some(1024), Some("4096")), 1024);
        assert_eq!(local_chunk(None, Some("4KiB")), lo);
    }

    #[test]
    fn uneven_blocks_keep_the_mean() {
        assert_eq!(uneven_blocks(4, 10), Some(vec![4, 8, 12, 16]));
        assert_eq!(uneven_blocks(3, 7).map(|v| v.iter().sum::<u64>()), Some(21));
        assert_eq!(uneven_blocks(1, 5), Some(vec![5]));
        // 2 * size * (r + 1) overflowed u64 before the total did.
        let big = u64::MAX / 4;
        assert_eq!(
            uneven_blocks(2, big).map(|v| v.iter().map(|b| u128::from(*b)).sum::<u128>()),
            Some(2 * u128::from(big))
        );
        assert_eq!(uneven_blocks(3, u64::MAX / 2), None);
    }

    #[test]
    fn sizes_too_large_for_memory_are_errors_not_aborts() {
        // Refused without touching memory: no process gets 2^62 bytes.
        let e = buffer(1 << 62, 0).expect_err("2^62 B");
        assert!(e.contains("--sizes"), "{e}");
        assert!(pattern::<u8>(0, 0, u64::MAX).is_err());
        assert!(try_filled(u64::MAX / 2, 0f64).is_none());
        assert_eq!(buffer(3, 7), Ok(vec![7; 3]));
        assert_eq!(held_bytes(1 << 20, 4, true), Ok(4 << 20));
        assert_eq!(held_bytes(1 << 62, 4, false), Ok(1 << 62));
        let e = held_bytes(1 << 62, 2, true).expect_err("2^63 B");
        assert!(e.contains("--sizes"), "{e}");
        assert!(held_bytes(u64::MAX, 3, true).is_err());
        let e = chunk(0).expect_err("zero");
        assert!(e.contains("--chunk"), "{e}");
        assert!(chunk(1 << 32).is_err());
        assert_eq!(chunk(4096), Ok(4096));
    }

    /// Block by block, the same verdicts as against the whole expected buffer.
    #[test]
    fn verifying_block_by_block_is_verifying_the_whole() {
        let blocks = [5usize, 0, 9, 16];
        let sizes: Vec<u64> = blocks.iter().map(|&b| b as u64).collect();
        let want = gathered(3, &sizes).expect("small");
        assert_eq!(verify_gathered("ag", &want, 3, &blocks), Ok(()));
        for i in 0..want.len() {
            let mut got = want.clone();
            got[i] ^= 0x40;
            let whole = verify("ag", &got, &want, &blocks);
            assert!(whole.is_err());
            assert_eq!(verify_gathered("ag", &got, 3, &blocks), whole, "byte {i}");
        }
        assert!(verify_gathered("ag", &want[1..], 3, &blocks).is_err());
        assert!(verify_gathered("ag", &want, 4, &blocks).is_err());
    }

    #[test]
    fn gathered_is_the_patterns_in_order() {
        let g = gathered(3, &[5, 0, 9]).expect("small");
        assert_eq!(g.len(), 14);
        assert_eq!(&g[..5], &pattern::<u8>(3, 0, 5).expect("small")[..]);
        assert_eq!(&g[5..], &pattern::<u8>(3, 2, 9).expect("small")[..]);
        assert!(gathered(3, &[u64::MAX, 1]).is_err());
    }

    #[test]
    fn patterns_differ_and_verify_names_the_block() {
        let p = |salt, rank, len| pattern(salt, rank, len).expect("small");
        let a = p(1, 0, 100);
        assert_ne!(a, p(1, 1, 100));
        assert_ne!(a, p(2, 0, 100));
        assert_eq!(a, p(1, 0, 100));
        let mut b = a.clone();
        b[70] ^= 1;
        let e = verify("x", &b, &a, &[50, 50]).expect_err("differs");
        assert!(e.contains("byte 70 (offset 20 in rank 1's block)"), "{e}");
        assert!(verify("x", &a, &a, &[100]).is_ok());
    }
}
