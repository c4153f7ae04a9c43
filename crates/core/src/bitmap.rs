//! Received-chunk tracking.

use crate::wire::ChunkRun;
use alloc::vec;
use alloc::vec::Vec;
use bitvec::prelude::*;

/// One bit per chunk of an operation (or of one lane of it), sized once when the operation
/// starts and never grown afterwards.
///
/// Stored as plain words (bit `i` is bit `i % 64` of word `i / 64`), so the receive fast path
/// can test-and-set a word directly; bitvec is only a view for runs and ranges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChunkBitmap {
    words: Vec<u64>,
    len: u32,
    set: u32,
}

/// Words needed for `len` bits.
pub(crate) fn words_for(len: u32) -> usize {
    (len as usize).div_ceil(64)
}

impl ChunkBitmap {
    /// An empty bitmap for `len` chunks.
    pub fn new(len: u32) -> Self {
        ChunkBitmap {
            words: vec![0; words_for(len)],
            len,
            set: 0,
        }
    }

    /// A bitmap over `words` (bits at and beyond `len` are cleared).
    pub(crate) fn from_words(mut words: Vec<u64>, len: u32) -> Self {
        words.resize(words_for(len), 0);
        if !len.is_multiple_of(64)
            && let Some(last) = words.last_mut()
        {
            *last &= (1u64 << (len % 64)) - 1;
        }
        let set = words.iter().map(|w| w.count_ones()).sum();
        ChunkBitmap { words, len, set }
    }

    /// The words, for a lane's fast path.
    pub(crate) fn into_words(self) -> Vec<u64> {
        self.words
    }

    fn bits(&self) -> &BitSlice<u64, Lsb0> {
        &self.words.view_bits::<Lsb0>()[..self.len as usize]
    }

    fn bits_mut(&mut self) -> &mut BitSlice<u64, Lsb0> {
        let len = self.len as usize;
        &mut self.words.view_bits_mut::<Lsb0>()[..len]
    }

    /// Number of chunks tracked.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// True when no chunks are tracked.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of chunks present.
    pub fn count(&self) -> u32 {
        self.set
    }

    /// Number of chunks missing.
    pub fn missing(&self) -> u32 {
        self.len - self.set
    }

    /// True when every chunk is present.
    pub fn is_full(&self) -> bool {
        self.set == self.len
    }

    /// Marks chunk `i` present. Returns true if it was missing; false if it was present
    /// already or is out of range.
    #[inline]
    pub fn insert(&mut self, i: u32) -> bool {
        if i >= self.len {
            return false;
        }
        let (w, m) = ((i / 64) as usize, 1u64 << (i % 64));
        match self.words.get_mut(w) {
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
        let e = run.end().min(self.len) as usize;
        let s = run.start as usize;
        if s >= e {
            return 0;
        }
        let slice = &mut self.bits_mut()[s..e];
        let new = slice.count_zeros() as u32;
        slice.fill(true);
        self.set += new;
        new
    }

    /// Whether every chunk of `run` is present (false if the run leaves the bitmap).
    pub fn contains_run(&self, run: ChunkRun) -> bool {
        let (s, e) = (run.start as usize, run.end() as usize);
        e <= self.len as usize && s <= e && self.bits()[s..e].all()
    }

    /// Present (`present`) or missing chunks within `within` as maximal runs, in order.
    pub fn runs(&self, within: ChunkRun, present: bool) -> Runs<'_> {
        let e = (within.end() as usize).min(self.len as usize);
        let s = (within.start as usize).min(e);
        Runs {
            bits: &self.bits()[s..e],
            base: s as u32,
            pos: 0,
            present,
        }
    }
}

/// Present (`present`) or missing bits of `words` within `within` (clipped to the words), as
/// maximal runs: the lanes' fast-path bitmaps are plain words.
pub(crate) fn runs_in(words: &[u64], within: ChunkRun, present: bool) -> Runs<'_> {
    let bits = words.view_bits::<Lsb0>();
    let e = (within.end() as usize).min(bits.len());
    let s = (within.start as usize).min(e);
    Runs {
        bits: &bits[s..e],
        base: s as u32,
        pos: 0,
        present,
    }
}

/// Whether any bit of `words` within `within` (clipped to the words) is set.
pub(crate) fn any_in(words: &[u64], within: ChunkRun) -> bool {
    let bits = words.view_bits::<Lsb0>();
    let e = (within.end() as usize).min(bits.len());
    let s = (within.start as usize).min(e);
    bits[s..e].any()
}

/// Set bits of `words` within `within` (clipped to the words).
pub(crate) fn ones_in(words: &[u64], within: ChunkRun) -> u32 {
    let bits = words.view_bits::<Lsb0>();
    let e = (within.end() as usize).min(bits.len());
    let s = (within.start as usize).min(e);
    bits[s..e].count_ones() as u32
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
