//! Binomial and k-nomial broadcast trees.
//!
//! Ranks are numbered relative to the root (`v = (r - root) mod P`). In a k-nomial tree,
//! rank `v`'s children are `v + j * k^i` for `j` in `1..k` and every `k^i` below the lowest
//! nonzero base-k digit of `v` (all of them for the root), sent to largest subtree first. A
//! binomial tree is the 2-nomial one: store-and-forward it takes ceil(log2 P) rounds, a
//! k-nomial one (k - 1) * ceil(log_k P).

/// Children of every rank (absolute ranks, in send order) of the `k`-nomial tree over
/// `ranks` ranks rooted at `root`.
pub(crate) fn knomial_children(ranks: u32, root: u32, k: u32) -> Vec<Vec<u32>> {
    let k = u64::from(k.max(2));
    let p = u64::from(ranks);
    (0..ranks)
        .map(|r| {
            let v = (u64::from(r) + p - u64::from(root) % p.max(1)) % p.max(1);
            // The span of v's subtree: the lowest power of k at which v has a nonzero digit.
            let mut span = 1u64;
            while span < p && v % (span * k) == 0 {
                span *= k;
            }
            let mut kids = Vec::new();
            let mut m = span / k;
            while m >= 1 {
                for j in (1..k).rev() {
                    let c = v + j * m;
                    if c < p {
                        kids.push(((c + u64::from(root)) % p) as u32);
                    }
                }
                m /= k;
            }
            kids
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binomial_of_8() {
        let c = knomial_children(8, 0, 2);
        assert_eq!(c[0], [4, 2, 1]);
        assert_eq!(c[4], [6, 5]);
        assert_eq!(c[2], [3]);
        assert!(c[7].is_empty());
    }

    #[test]
    fn every_rank_has_one_parent() {
        for (p, root, k) in [(1, 0, 2), (13, 5, 2), (30, 7, 3), (64, 63, 4), (100, 1, 8)] {
            let c = knomial_children(p, root, k);
            let mut parents = vec![0u32; p as usize];
            for kids in &c {
                for &x in kids {
                    parents[x as usize] += 1;
                }
            }
            for (r, n) in parents.iter().enumerate() {
                assert_eq!(
                    *n,
                    u32::from(r as u32 != root),
                    "p {p} root {root} k {k} rank {r}"
                );
            }
        }
    }
}
