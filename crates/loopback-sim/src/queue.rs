//! The event queue: a radix heap over virtual time.
//!
//! Virtual time never goes backwards (nothing is scheduled before the event being handled),
//! which a radix heap exploits: an event goes to the bucket named by the highest bit in which
//! its time differs from the last time popped, so a push is O(1) and an event moves between
//! buckets at most 64 times over its life (in practice once or twice). Profiling showed a
//! binary heap spending most of a run in `pop`.
//!
//! Events with equal times come out in insertion order (first in, first out): buckets keep
//! insertion order when redistributed and the lowest bucket is drained from the front. That
//! keeps a reliable channel's messages in order and a run reproducible.

/// Virtual time in picoseconds (the core's clock is nanoseconds; links need finer steps so
/// that serialization times do not accumulate rounding error).
pub(crate) type Ps = u64;

/// Picoseconds per nanosecond.
pub(crate) const PS_PER_NS: u64 = 1_000;

/// A time-ordered queue of events.
#[derive(Debug)]
pub(crate) struct EventQueue<E> {
    /// Bucket `i > 0` holds events whose time first differs from `last` in bit `i - 1`;
    /// bucket 0 holds events at exactly `last`, drained from `head`.
    buckets: Vec<Vec<(Ps, E)>>,
    head: usize,
    last: Ps,
    len: usize,
}

#[inline]
fn bucket(t: Ps, last: Ps) -> usize {
    (64 - (t ^ last).leading_zeros()) as usize
}

impl<E: Copy> EventQueue<E> {
    /// An empty queue.
    pub(crate) fn new() -> Self {
        EventQueue {
            buckets: (0..65).map(|_| Vec::new()).collect(),
            head: 0,
            last: 0,
            len: 0,
        }
    }

    /// Schedules `ev` at `time`; a time before the last one popped is treated as that time.
    #[inline]
    pub(crate) fn push(&mut self, time: Ps, ev: E) {
        let time = time.max(self.last);
        self.buckets[bucket(time, self.last)].push((time, ev));
        self.len += 1;
    }

    /// The earliest event, ties in insertion order.
    #[inline]
    pub(crate) fn pop(&mut self) -> Option<(Ps, E)> {
        if self.head == self.buckets[0].len() {
            self.buckets[0].clear();
            self.head = 0;
            if self.len == 0 {
                return None;
            }
            self.refill();
        }
        let e = self.buckets[0][self.head];
        self.head += 1;
        self.len -= 1;
        Some(e)
    }

    /// Moves the lowest non-empty bucket down, making its earliest time the new `last`.
    #[cold]
    fn refill(&mut self) {
        let Some(i) = (1..self.buckets.len()).find(|i| !self.buckets[*i].is_empty()) else {
            return;
        };
        let mut b = std::mem::take(&mut self.buckets[i]);
        self.last = b.iter().map(|e| e.0).min().unwrap_or(self.last);
        for e in b.drain(..) {
            self.buckets[bucket(e.0, self.last)].push(e);
        }
        self.buckets[i] = b; // keep the allocation
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    #[test]
    fn earliest_first_ties_fifo() {
        let mut q = EventQueue::new();
        q.push(5, 'a');
        q.push(3, 'b');
        q.push(5, 'c');
        q.push(1, 'd');
        let order: Vec<char> = std::iter::from_fn(|| q.pop().map(|(_, e)| e)).collect();
        assert_eq!(order, ['d', 'b', 'a', 'c']);
    }

    /// Same order as a `(time, insertion)` sort, for a DES-like mix of pushes and pops.
    #[test]
    fn matches_sorted_reference() {
        let mut rng = Rng::new(9, 0);
        let mut q = EventQueue::new();
        let mut reference = std::collections::BTreeSet::new();
        let (mut now, mut seq) = (0u64, 0u32);
        for _ in 0..20_000 {
            if rng.below(3) > 0 || reference.is_empty() {
                let span = if rng.below(2) == 0 { 4 } else { 1 << 20 };
                let t = now + rng.below(span);
                seq += 1;
                q.push(t, seq);
                reference.insert((t, seq));
            } else {
                let want = reference.pop_first();
                let got = q.pop();
                assert_eq!(got, want);
                now = got.map_or(now, |g| g.0);
            }
        }
        while let Some(want) = reference.pop_first() {
            assert_eq!(q.pop(), Some(want));
        }
        assert_eq!(q.pop(), None);
    }
}
