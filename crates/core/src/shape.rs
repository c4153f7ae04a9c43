//! An operation's shape in 32 bits: what every rank must agree on for a collective to line
//! up (its kind, its root, every block's size).
//!
//! Collectives match by order: the `n`-th operation a rank posts meets every other rank's
//! `n`-th. A program that posts them with different roots or sizes is erroneous; MPI leaves
//! it undefined and NCCL hangs. ringcast's barrier compares the fingerprints instead (every
//! `Ready` carries its sender's, the hub checks it against its own) and fails the operation
//! at every rank with [`OpError::ShapeMismatch`](crate::OpError::ShapeMismatch) before any
//! byte moves. The TCP paths of the `ringcast` crate carry the same fingerprint in their
//! pieces.
//!
//! A fingerprint is a hash: two different shapes collide with probability about 2^-32.

use crate::Rank;
use crate::port::mix;

const BROADCAST: u64 = 1;
const ALLGATHER: u64 = 2;
const TAGGED: u64 = 3;

/// The fingerprint of a Broadcast of `len` bytes from `root`.
pub fn broadcast_shape(root: Rank, len: u64) -> u32 {
    fold([BROADCAST, u64::from(root.0), len].into_iter())
}

/// The fingerprint of an Allgather(v) whose block `r` is `sizes[r]` bytes.
pub fn allgather_shape(sizes: &[u64]) -> u32 {
    fold(
        [ALLGATHER, sizes.len() as u64]
            .into_iter()
            .chain(sizes.iter().copied()),
    )
}

/// The fingerprint of an Allgather(v) of `sizes` that a library runs for itself under `tag`
/// (its own kind of collective: a `ringcast` split's exchange): a user's Allgather of the same
/// sizes, posted by mistake in its place, fails with a `ShapeMismatch` instead of matching
/// it. Tag 0 is [`allgather_shape`].
pub fn allgather_shape_tagged(sizes: &[u64], tag: u32) -> u32 {
    if tag == 0 {
        return allgather_shape(sizes);
    }
    fold(
        [TAGGED, u64::from(tag), sizes.len() as u64]
            .into_iter()
            .chain(sizes.iter().copied()),
    )
}

/// Folds the words through the splitmix64 finaliser, one at a time, so that their order
/// counts.
fn fold(words: impl Iterator<Item = u64>) -> u32 {
    let h = words.fold(0x5249_4e47_4341_5354_u64, |h, w| {
        mix(h.wrapping_add(0x9E37_79B9_7F4A_7C15) ^ w)
    });
    (h ^ (h >> 32)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    #[test]
    fn every_part_of_the_shape_counts() {
        let base = broadcast_shape(Rank(0), 1 << 20);
        assert_eq!(base, broadcast_shape(Rank(0), 1 << 20));
        assert_ne!(base, broadcast_shape(Rank(1), 1 << 20));
        assert_ne!(base, broadcast_shape(Rank(0), (1 << 20) + 1));
        // A Broadcast is not the Allgatherv that moves the same bytes.
        assert_ne!(base, allgather_shape(&[1 << 20, 0, 0, 0]));
        let sizes = [4096u64, 0, 8192, 4096];
        let ag = allgather_shape(&sizes);
        assert_eq!(ag, allgather_shape(&sizes));
        // Swapped blocks, a block moved to another rank, one rank more.
        assert_ne!(ag, allgather_shape(&[4096, 8192, 0, 4096]));
        assert_ne!(ag, allgather_shape(&[4096, 0, 8192, 4096, 0]));
        assert_ne!(ag, allgather_shape(&[4096, 0, 8192]));
        // A tag makes it another collective; tag 0 is none.
        assert_eq!(allgather_shape_tagged(&sizes, 0), ag);
        assert_ne!(allgather_shape_tagged(&sizes, 1), ag);
        assert_ne!(
            allgather_shape_tagged(&sizes, 1),
            allgather_shape_tagged(&sizes, 2)
        );
    }

    #[test]
    fn nearby_shapes_do_not_collide() {
        // Lengths one apart, roots and sizes of a thousand ranks: all distinct.
        let mut seen: Vec<u32> = (0..=4096u64)
            .map(|len| broadcast_shape(Rank(0), len))
            .chain((0..1024).map(|r| broadcast_shape(Rank(r), 4096)))
            .chain((0..1024u64).map(|n| allgather_shape(&[n, 4096, 4096])))
            .collect();
        let n = seen.len();
        seen.sort_unstable();
        seen.dedup();
        // broadcast_shape(Rank(0), 4096) is in the first two lists.
        assert_eq!(seen.len(), n - 1);
    }
}
