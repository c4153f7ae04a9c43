//! Received-chunk tracking.

use crate::wire::ChunkRun;
use bitvec::prelude::*;

/// One bit per chunk of an operation (or of one lane of it), sized once when the operation
/// starts and never grown afterwards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkBitmap {
    bits: BitVec<u64, Lsb0>,
    set: u32,
}

impl ChunkBitmap {
    /// An empty bitmap for `len` chunks.
    pub fn new(len: u32) -> Self {
        ChunkBitmap {
            bits: bitvec![u64, Lsb0; 0; len as usize],
            set: 0,
        }
    }

    /// Number of chunks tracked.
    pub fn len(&self) -> u32 {
        self.bits.len() as u32
    }

    /// True when no chunks are tracked.
    pub fn is_empty(&self) -> bool {
        self.bits.is_empty()
    }

    /// Number of chunks present.
    pub fn count(&self) -> u32 {
        self.set
    }

    /// Number of chunks missing.
    pub fn missing(&self) -> u32 {
        self.len() - self.set
    }

    /// True when every chunk is present.
    pub fn is_full(&self) -> bool {
        self.set == self.len()
    }

    /// Marks chunk `i` present. Returns true if it was missing; false if it was present
    /// already or is out of range.
    #[inline]
    pub fn insert(&mut self, i: u32) -> bool {
        if i as usize >= self.bits.len() {
            return false;
        }
        // The hot path: one word test-and-set on the bitvec's storage (Lsb0 order).
        let (w, m) = ((i / 64) as usize, 1u64 << (i % 64));
        match self.bits.as_raw_mut_slice().get_mut(w) {
            Some(word) if *word & m == 0 => {
                *word |= m;
                self.set += 1;
                true
            }
            _ => false,
        }
    }

    /// Marks every chunk of `run` (clipped to the bitmap) present; returns how many were new.
    pub fn insert_run(&mut self, run: ChunkRun) -> u32 {
        let Some(slice) = self.slice_mut(run) else {
            return 0;
        };
        let new = slice.count_zeros() as u32;
        slice.fill(true);
        self.set += new;
        new
    }

    /// Whether every chunk of `run` is present (false if the run leaves the bitmap).
    pub fn contains_run(&self, run: ChunkRun) -> bool {
        let (s, e) = (run.start as usize, run.end() as usize);
        e <= self.bits.len() && s <= e && self.bits[s..e].all()
    }

    fn slice_mut(&mut self, run: ChunkRun) -> Option<&mut BitSlice<u64, Lsb0>> {
        let e = (run.end() as usize).min(self.bits.len());
        let s = run.start as usize;
        (s < e).then(|| &mut self.bits[s..e])
    }

    /// Present (`present`) or missing chunks within `within` as maximal runs, in order.
    pub fn runs(&self, within: ChunkRun, present: bool) -> Runs<'_> {
        let e = (within.end() as usize).min(self.bits.len());
        let s = (within.start as usize).min(e);
        Runs {
            bits: &self.bits[s..e],
            base: s as u32,
            pos: 0,
            present,
        }
    }
}

/// Iterator over maximal runs of missing (or present) chunks, in order.
#[derive(Debug)]
pub struct Runs<'a> {
    bits: &'a BitSlice<u64, Lsb0>,
    base: u32,
    pos: usize,
    present: bool,
}

impl Iterator for Runs<'_> {
    type Item = ChunkRun;

    fn next(&mut self) -> Option<ChunkRun> {
        let rest = &self.bits[self.pos..];
        let first = if self.present {
            rest.first_one()
        } else {
            rest.first_zero()
        }?;
        let after = &rest[first..];
        let end = if self.present {
            after.first_zero()
        } else {
            after.first_one()
        };
        let len = end.unwrap_or(after.len());
        let start = self.pos + first;
        self.pos = start + len;
        Some(ChunkRun {
            start: self.base + start as u32,
            len: len as u32,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use alloc::vec;
    use alloc::vec::Vec;

    #[test]
    fn runs_of_missing_chunks() {
        let mut b = ChunkBitmap::new(10);
        for i in [0, 1, 4, 9] {
            assert!(b.insert(i));
        }
        assert!(!b.insert(4));
        assert!(!b.insert(10));
        let all = ChunkRun { start: 0, len: 10 };
        let runs: Vec<_> = b.runs(all, false).collect();
        assert_eq!(
            runs,
            vec![ChunkRun { start: 2, len: 2 }, ChunkRun { start: 5, len: 4 }]
        );
        let within: Vec<_> = b.runs(ChunkRun { start: 3, len: 3 }, false).collect();
        let held: Vec<_> = b.runs(ChunkRun { start: 3, len: 3 }, true).collect();
        assert_eq!(held, vec![ChunkRun { start: 4, len: 1 }]);
        assert_eq!(
            within,
            vec![ChunkRun { start: 3, len: 1 }, ChunkRun { start: 5, len: 1 }]
        );
        assert_eq!(b.insert_run(ChunkRun { start: 3, len: 10 }), 5);
        assert_eq!(b.missing(), 1);
        assert!(b.contains_run(ChunkRun { start: 3, len: 7 }));
        assert!(!b.contains_run(ChunkRun { start: 2, len: 2 }));
        assert!(!b.contains_run(ChunkRun { start: 9, len: 2 }));
    }

    #[test]
    fn empty_bitmap_has_no_runs() {
        let b = ChunkBitmap::new(0);
        let all = ChunkRun { start: 0, len: 5 };
        assert_eq!(b.runs(all, false).count(), 0);
        assert!(b.is_full());
    }
}
