//! The broadcast-chain scheduler of Allgather.
//!
//! The ring of `P` ranks is cut into `M` chains of consecutive ranks, as even as possible
//! (sizes differ by at most one: chain `j` starts at `j * P / M`). At step `i` the `i`-th rank
//! of every chain multicasts its block; when its sends are done it hands an activation token
//! to the next rank of its chain over the control path. So `M` roots are active at any time,
//! and a receiver's link sees at most `M` streams.

use crate::config::Rank;

/// `M` chains over `P` ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Chains {
    ranks: u32,
    chains: u32,
}

impl Chains {
    pub(crate) fn new(ranks: u32, chains: u32) -> Self {
        Chains {
            ranks,
            chains: chains.clamp(1, ranks.max(1)),
        }
    }

    fn start(&self, j: u32) -> u32 {
        (u64::from(j) * u64::from(self.ranks) / u64::from(self.chains)) as u32
    }

    /// Index of the chain holding `r`.
    pub(crate) fn chain_of(&self, r: Rank) -> u32 {
        // The largest j with start(j) <= r.
        let (mut lo, mut hi) = (0, self.chains - 1);
        while lo < hi {
            let mid = (lo + hi).div_ceil(2);
            if self.start(mid) <= r.0 {
                lo = mid
            } else {
                hi = mid - 1
            }
        }
        lo
    }

    /// Whether `r` starts its chain (it is active from the first step).
    pub(crate) fn is_head(&self, r: Rank) -> bool {
        self.start(self.chain_of(r)) == r.0
    }

    /// The rank `r` activates when it is done, if any.
    pub(crate) fn next(&self, r: Rank) -> Option<Rank> {
        let end = self.start(self.chain_of(r) + 1);
        (r.0 + 1 < end).then_some(Rank(r.0 + 1))
    }

    /// The rank that activates `r`, if any.
    pub(crate) fn prev(&self, r: Rank) -> Option<Rank> {
        (!self.is_head(r)).then(|| Rank(r.0 - 1))
    }

    /// The longest chain: the number of steps.
    pub(crate) fn steps(&self) -> u32 {
        self.ranks.div_ceil(self.chains)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec::Vec;

    #[test]
    fn chains_are_even_and_cover_every_rank_once() {
        for p in 1..40 {
            for m in 1..=p {
                let c = Chains::new(p, m);
                let heads: Vec<u32> = (0..p).filter(|r| c.is_head(Rank(*r))).collect();
                assert_eq!(heads.len() as u32, m, "p {p} m {m}");
                let mut lens = Vec::new();
                for &h in &heads {
                    let mut n = 1;
                    let mut r = Rank(h);
                    while let Some(nx) = c.next(r) {
                        assert_eq!(c.prev(nx), Some(r));
                        r = nx;
                        n += 1;
                    }
                    lens.push(n);
                }
                assert_eq!(lens.iter().sum::<u32>(), p);
                let (lo, hi) = (lens.iter().min().unwrap(), lens.iter().max().unwrap());
                assert!(hi - lo <= 1, "p {p} m {m}: {lens:?}");
                assert_eq!(*hi, c.steps());
            }
        }
    }
}
