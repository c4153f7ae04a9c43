//! Session configuration, hard limits and their validation.

use crate::wire::ImmLayout;
use core::fmt;
use core::time::Duration;

/// The longest `peer_timeout`, `post_timeout`, `cutoff_alpha` or `cutoff_extension` a
/// [`Config`] takes (a week): sums and multiples of them then never overflow a `Duration` or
/// an [`Instant`].
///
/// [`Instant`]: crate::Instant
pub const MAX_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);

/// A rank: a process's index in the communicator, `0..ranks`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Rank(pub u32);

impl Rank {
    /// The index as `usize`.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl fmt::Display for Rank {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "rank {}", self.0)
    }
}

/// Hard limits: what a hostile or corrupt input may cost is bounded by these.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most ranks a session accepts.
    pub max_ranks: u32,
    /// Most operations in flight at once on one session.
    pub max_inflight_ops: u32,
    /// Most chunks one operation may have, at most `2^chunk_bits` (checked by
    /// [`Config::validate`]); an operation of `2^chunk_bits` chunks is refused all the same,
    /// as the all-ones index is never a chunk's (an engine's start-up probes carry it, and
    /// every operation's receive path drops it, never placing it).
    pub max_chunks_per_op: u32,
    /// Longest control message accepted or sent, in bytes.
    pub max_control_len: usize,
    /// Longest single read the transport takes, in bytes (its
    /// [`Capabilities::max_read`](crate::port::Capabilities::max_read)): a recovery read of
    /// more is split into reads of at most this many (whole chunks, at least one). At least
    /// `chunk_size`.
    pub max_read: u64,
    /// Most lanes: each costs receive state per rank for every operation in flight (about
    /// 70 bytes per lane and rank for each), and a worker pair in an engine.
    pub max_lanes: u16,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_ranks: 1 << 16,
            max_inflight_ops: 64,
            max_chunks_per_op: (1 << 20) - 1,
            max_control_len: 16 + 8 * 512,
            max_read: u64::MAX,
            max_lanes: 256,
        }
    }
}

/// Configuration of one rank's [`Session`](crate::Session).
///
/// The core takes no randomness: given the same inputs at the same times it produces the same
/// outputs, so no seed is needed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// This rank.
    pub rank: Rank,
    /// Number of ranks in the communicator.
    pub ranks: u32,
    /// Payload bytes per chunk (the last chunk of a buffer may be shorter).
    pub chunk_size: u32,
    /// Split of the 32-bit immediate.
    pub imm: ImmLayout,
    /// Number of multicast subgroups (lanes); contiguous blocks of a buffer map to lanes.
    pub lanes: u16,
    /// Bandwidth of one link in bytes per second: the cutoff timer is `N / B + alpha`.
    pub link_bandwidth: u64,
    /// The `alpha` of the cutoff timer: slack for latency and jitter.
    pub cutoff_alpha: Duration,
    /// How long to wait for a peer that owes an answer before failing the operation.
    pub peer_timeout: Duration,
    /// How long an operation's barrier waits for ranks that are alive (they answer when
    /// asked, within the peer timeout) but have not posted the operation yet: an
    /// application that loads a checkpoint on one rank before a Broadcast. Past it, the
    /// operation fails with [`OpError::NotPosted`](crate::OpError::NotPosted). At least
    /// `peer_timeout`.
    pub post_timeout: Duration,
    /// `Some(d)`: when the cutoff fires while the lanes are still receiving (more chunks
    /// written than at the last look), the fast path goes on for `d` more instead of ending.
    /// For transports whose real rate is below `link_bandwidth` (kernel UDP on busy cores):
    /// the cutoff then only ends a fast path that has stalled. `None` (the default): the
    /// cutoff ends it, as on a hardware fabric.
    pub cutoff_extension: Option<Duration>,
    /// Most multicast chunks handed to the transport and not yet reported sent.
    pub send_window: u32,
    /// Allgather broadcast chains `M`: how many roots multicast at once.
    pub chains: u32,
    /// Hard limits.
    pub limits: Limits,
}

impl Config {
    /// A configuration for `rank` of `ranks` with defaults for everything else:
    /// 4 KiB chunks, one lane, four Allgather chains, 100 Gbit/s links, 20 us alpha, 1 s peer
    /// timeout, 10 min post timeout (torch's default for NCCL's collectives).
    pub fn new(rank: u32, ranks: u32) -> Self {
        Config {
            rank: Rank(rank),
            ranks,
            chunk_size: 4096,
            imm: ImmLayout::default(),
            lanes: 1,
            link_bandwidth: 100_000_000_000 / 8,
            cutoff_alpha: Duration::from_micros(20),
            peer_timeout: Duration::from_secs(1),
            post_timeout: Duration::from_secs(600),
            cutoff_extension: None,
            send_window: 64,
            chains: 4,
            limits: Limits::default(),
        }
    }

    /// Checks every field against the others and the limits.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let l = &self.limits;
        if self.ranks == 0 || self.ranks > l.max_ranks {
            return Err(ConfigError::Ranks);
        }
        if self.rank.0 >= self.ranks {
            return Err(ConfigError::RankOutOfRange);
        }
        if self.chunk_size == 0 {
            return Err(ConfigError::ChunkSize);
        }
        if self.lanes == 0 || self.lanes > l.max_lanes {
            return Err(ConfigError::Lanes);
        }
        if self.link_bandwidth == 0 {
            return Err(ConfigError::Bandwidth);
        }
        if self.peer_timeout.is_zero() || self.peer_timeout > MAX_TIMEOUT {
            return Err(ConfigError::PeerTimeout);
        }
        if self.post_timeout < self.peer_timeout || self.post_timeout > MAX_TIMEOUT {
            return Err(ConfigError::PostTimeout);
        }
        if self
            .cutoff_extension
            .is_some_and(|d| d.is_zero() || d > MAX_TIMEOUT)
        {
            return Err(ConfigError::CutoffExtension);
        }
        if self.cutoff_alpha > MAX_TIMEOUT {
            return Err(ConfigError::CutoffAlpha);
        }
        if self.send_window == 0 {
            return Err(ConfigError::SendWindow);
        }
        if self.chains == 0 {
            return Err(ConfigError::Chains);
        }
        // In-flight operations must have distinct immediate tags with a wide margin.
        if l.max_inflight_ops == 0 || u64::from(l.max_inflight_ops) * 4 > self.imm.op_tags() {
            return Err(ConfigError::InflightOps);
        }
        if l.max_chunks_per_op == 0 || u64::from(l.max_chunks_per_op) > self.imm.max_chunks() {
            return Err(ConfigError::ChunksPerOp);
        }
        if l.max_read < u64::from(self.chunk_size) {
            return Err(ConfigError::MaxRead);
        }
        if l.max_control_len < crate::wire::CONTROL_HEADER_LEN + 8 {
            return Err(ConfigError::ControlLen);
        }
        Ok(())
    }

    /// Most chunks one recovery read may carry under `limits.max_read` (at least one).
    pub(crate) fn max_read_chunks(&self) -> u32 {
        let chunks = self.limits.max_read / u64::from(self.chunk_size.max(1));
        u32::try_from(chunks).unwrap_or(u32::MAX).max(1)
    }

    /// Most chunk runs one fetch message may carry under `max_control_len`.
    pub fn max_fetch_runs(&self) -> usize {
        ((self.limits.max_control_len - crate::wire::CONTROL_HEADER_LEN) / 8).min(u16::MAX.into())
    }
}

/// Why a [`Config`] was rejected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// `ranks` is zero or above `limits.max_ranks`.
    Ranks,
    /// `rank >= ranks`.
    RankOutOfRange,
    /// `chunk_size` is zero.
    ChunkSize,
    /// `lanes` is zero or above `limits.max_lanes`.
    Lanes,
    /// `link_bandwidth` is zero.
    Bandwidth,
    /// `peer_timeout` is zero or longer than [`MAX_TIMEOUT`].
    PeerTimeout,
    /// `post_timeout` is shorter than `peer_timeout` or longer than [`MAX_TIMEOUT`].
    PostTimeout,
    /// `send_window` is zero.
    SendWindow,
    /// `cutoff_extension` is `Some(0)` or longer than [`MAX_TIMEOUT`].
    CutoffExtension,
    /// `cutoff_alpha` is longer than [`MAX_TIMEOUT`].
    CutoffAlpha,
    /// `chains` is zero.
    Chains,
    /// `max_inflight_ops` is zero or needs more than a quarter of the op tag space.
    InflightOps,
    /// `max_chunks_per_op` is zero or exceeds what the immediate's chunk bits can index.
    ChunksPerOp,
    /// `max_control_len` cannot hold a header and one run.
    ControlLen,
    /// `max_read` is shorter than a chunk.
    MaxRead,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = match self {
            ConfigError::Ranks => "ranks must be in 1..=limits.max_ranks",
            ConfigError::RankOutOfRange => "rank must be below ranks",
            ConfigError::ChunkSize => "chunk_size must be positive",
            ConfigError::Lanes => "lanes must be between 1 and limits.max_lanes",
            ConfigError::Bandwidth => "link_bandwidth must be positive",
            ConfigError::PeerTimeout => "peer_timeout must be positive and at most a week",
            ConfigError::PostTimeout => {
                "post_timeout must be at least peer_timeout and at most a week"
            }
            ConfigError::SendWindow => "send_window must be positive",
            ConfigError::CutoffExtension => {
                "cutoff_extension must be positive and at most a week when set"
            }
            ConfigError::CutoffAlpha => "cutoff_alpha must be at most a week",
            ConfigError::Chains => "chains must be positive",
            ConfigError::InflightOps => {
                "max_inflight_ops must be positive and at most a quarter of the op tags"
            }
            ConfigError::ChunksPerOp => {
                "max_chunks_per_op must be positive and fit the immediate's chunk bits"
            }
            ConfigError::ControlLen => "max_control_len must hold a header and one run",
            ConfigError::MaxRead => "limits.max_read must hold at least one chunk",
        };
        f.write_str(s)
    }
}

impl core::error::Error for ConfigError {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Timeouts beyond [`MAX_TIMEOUT`] are refused (their sums would overflow later, in the
    /// middle of an operation); up to it they are taken.
    #[test]
    fn timeouts_are_bounded() {
        let ok = Config::new(0, 2);
        assert_eq!(ok.validate(), Ok(()));
        let with = |f: &dyn Fn(&mut Config)| {
            let mut c = Config::new(0, 2);
            f(&mut c);
            c.validate()
        };
        assert_eq!(
            with(&|c| {
                c.peer_timeout = MAX_TIMEOUT;
                c.post_timeout = MAX_TIMEOUT;
            }),
            Ok(())
        );
        // A post timeout below the peer timeout is refused.
        assert_eq!(
            with(&|c| c.peer_timeout = MAX_TIMEOUT),
            Err(ConfigError::PostTimeout)
        );
        assert_eq!(with(&|c| c.cutoff_alpha = MAX_TIMEOUT), Ok(()));
        assert_eq!(
            with(&|c| c.peer_timeout = Duration::MAX),
            Err(ConfigError::PeerTimeout)
        );
        assert_eq!(with(&|c| c.post_timeout = MAX_TIMEOUT), Ok(()));
        assert_eq!(
            with(&|c| c.post_timeout = MAX_TIMEOUT + Duration::from_nanos(1)),
            Err(ConfigError::PostTimeout)
        );
        assert_eq!(
            with(&|c| c.post_timeout = c.peer_timeout - Duration::from_nanos(1)),
            Err(ConfigError::PostTimeout)
        );
        assert_eq!(
            with(&|c| c.cutoff_alpha = MAX_TIMEOUT + Duration::from_nanos(1)),
            Err(ConfigError::CutoffAlpha)
        );
        assert_eq!(
            with(&|c| c.cutoff_extension = Some(Duration::MAX)),
            Err(ConfigError::CutoffExtension)
        );
    }

    /// Lanes are bounded (65 535 of them took 356 MB before any operation existed).
    #[test]
    fn lanes_are_bounded() {
        let with = |lanes: u16, max: u16| {
            let mut c = Config::new(0, 2);
            c.lanes = lanes;
            c.limits.max_lanes = max;
            c.validate()
        };
        assert_eq!(with(256, 256), Ok(()));
        assert_eq!(with(257, 256), Err(ConfigError::Lanes));
        assert_eq!(with(u16::MAX, 256), Err(ConfigError::Lanes));
        assert_eq!(with(0, 256), Err(ConfigError::Lanes));
        assert_eq!(with(u16::MAX, u16::MAX), Ok(()));
    }
}
