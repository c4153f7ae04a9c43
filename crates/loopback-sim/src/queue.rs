//! The event queue: a binary min-heap of `(time, seq)` keys with compact payloads.
//!
//! `seq` breaks ties in insertion order, so events at the same virtual time run first-in
//! first-out and a run is reproducible. Payloads are small `Copy` values: no allocation per event.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// Virtual time in picoseconds (the core's clock is nanoseconds; links need finer steps so
/// that serialization times do not accumulate rounding error).
pub(crate) type Ps = u64;

/// Picoseconds per nanosecond.
pub(crate) const PS_PER_NS: u64 = 1_000;

#[derive(Clone, Copy, Debug)]
struct Entry<E> {
    time: Ps,
    seq: u64,
    ev: E,
}

impl<E> PartialEq for Entry<E> {
    fn eq(&self, other: &Self) -> bool {
        (self.time, self.seq) == (other.time, other.seq)
    }
}
impl<E> Eq for Entry<E> {}
impl<E> PartialOrd for Entry<E> {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl<E> Ord for Entry<E> {
    /// Reversed: `BinaryHeap` is a max-heap and we want the earliest event first.
    fn cmp(&self, other: &Self) -> Ordering {
        (other.time, other.seq).cmp(&(self.time, self.seq))
    }
}

/// A time-ordered queue of events.
#[derive(Debug)]
pub(crate) struct EventQueue<E> {
    heap: BinaryHeap<Entry<E>>,
    seq: u64,
}

impl<E: Copy> EventQueue<E> {
    /// An empty queue.
    pub(crate) fn new() -> Self {
        EventQueue {
            heap: BinaryHeap::with_capacity(1 << 12),
            seq: 0,
        }
    }

    /// Schedules `ev` at `time`.
    #[inline]
    pub(crate) fn push(&mut self, time: Ps, ev: E) {
        self.seq += 1;
        self.heap.push(Entry {
            time,
            seq: self.seq,
            ev,
        });
    }

    /// The earliest event, ties in insertion order.
    #[inline]
    pub(crate) fn pop(&mut self) -> Option<(Ps, E)> {
        self.heap.pop().map(|e| (e.time, e.ev))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
