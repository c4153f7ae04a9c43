//! The chain: root -> root+1 -> root+2 -> ... (ranks modulo P), pipelined by chunks, so a
//! long message streams at line rate after P - 1 chunk hops of fill.

/// Children of every rank in the chain over `ranks` ranks starting at `root`.
pub(crate) fn chain_children(ranks: u32, root: u32) -> Vec<Vec<u32>> {
    (0..ranks)
        .map(|r| {
            let next = (r + 1) % ranks;
            if next == root { Vec::new() } else { vec![next] }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn chain_ends_before_the_root() {
        let c = super::chain_children(4, 2);
        assert_eq!(c, [vec![1], vec![], vec![3], vec![0]]);
    }
}
