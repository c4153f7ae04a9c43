//! A run of consecutive chunk indices: the unit of fetch requests, acknowledgements and bitmap
//! queries.

use core::fmt;

/// A run of consecutive chunk indices `[start, start + len)`.
///
/// ```
/// # use ringcast_core::ChunkRun;
/// let r = ChunkRun { start: 3, len: 2 };
/// assert_eq!(r.end(), 5);
/// assert_eq!(r.to_string(), "3..5");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ChunkRun {
    /// First chunk.
    pub start: u32,
    /// Number of chunks, at least one in any valid message.
    pub len: u32,
}

impl ChunkRun {
    /// One past the last chunk (saturating).
    pub fn end(self) -> u32 {
        self.start.saturating_add(self.len)
    }

    /// The run `[start, end)` (empty when `end <= start`).
    pub(crate) fn span(start: u32, end: u32) -> Self {
        ChunkRun {
            start,
            len: end.saturating_sub(start),
        }
    }
}

impl fmt::Display for ChunkRun {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}..{}", self.start, self.end())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_saturates() {
        assert_eq!(ChunkRun { start: 7, len: 0 }.end(), 7);
        assert_eq!(
            ChunkRun {
                start: u32::MAX - 1,
                len: 5
            }
            .end(),
            u32::MAX
        );
    }
}
