//! The trace is the spec: every input and output of a 4-rank, 8-chunk Broadcast in which one
//! chunk is lost on its way to one leaf, with virtual timestamps (ns).

mod util;

use util::Net;

#[test]
fn four_ranks_eight_chunks_one_drop() {
    let mut net = Net::new(4, |_| {});
    // Chunk 3 never reaches rank 2: it recovers it from rank 1 after its cutoff.
    net.faults
        .rules
        .push(Box::new(|_, _, chunk, to| chunk == 3 && to == 2));
    net.trace = Some(String::new());
    net.broadcast_at(0, 0, 0, 8 * 4096);
    net.run(10_000);
    net.assert_all_completed();
    assert_eq!(net.sessions[2].stats().chunks_fetched, 1);
    insta::assert_snapshot!(net.trace.take().unwrap_or_default());
}
