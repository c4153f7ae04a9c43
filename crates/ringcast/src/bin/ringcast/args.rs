//! Command-line arguments (clap derive).

use crate::units;
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::time::Duration;

/// ringcast: reliable, bandwidth-optimal multicast Broadcast and Allgather.
#[derive(Debug, Parser)]
#[command(name = "ringcast", version, about)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Run collectives on the deterministic fabric simulator.
    #[command(subcommand)]
    Sim(SimCommand),
    /// Bootstrap from the launcher's variables (mpirun, srun, torchrun or RINGCAST_*), meet the
    /// other ranks over TCP and print the peer table: checks a launch before a real run.
    Bootstrap(BootstrapArgs),
    /// Run Broadcast and Allgather for real: 4 local rank processes on loopback multicast,
    /// every buffer verified byte for byte; prints throughput and the bytes each rank injected
    /// next to what a ring or a binomial tree would have.
    Demo(DemoArgs),
    /// Time a collective, OSU-style (latency table) with nccl-tests' algbw/busbw, under a
    /// launcher (mpirun, srun, torchrun) or with `--local N` rank processes.
    Bench(BenchArgs),
}

/// `ringcast bootstrap`.
#[derive(Debug, Args)]
pub(crate) struct BootstrapArgs {
    /// Print JSON instead of a line of text.
    #[arg(long)]
    pub(crate) json: bool,
}

#[derive(Debug, Subcommand)]
pub(crate) enum SimCommand {
    /// Broadcast a buffer from one (or several concurrent) roots and verify every rank's copy.
    Bcast(BcastArgs),
    /// Allgather(v): every rank contributes a block, every rank ends with all of them
    /// (a composition of broadcasts in `--chains` chains); verify every rank's buffer.
    Allgather(AllgatherArgs),
}

/// Fabric shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Topology {
    /// All hosts on one switch.
    Star,
    /// Hosts under leaf switches, every leaf cabled to every spine (`--hosts-per-leaf`,
    /// `--spines`).
    LeafSpine,
    /// Three-level k-ary fat tree of `--radix`-port switches, filled in host order.
    FatTree,
    /// The 188-host testbed: 12 leaves of 16 hosts (the last of 12) and 6 spines.
    Testbed,
}

/// `ringcast sim bcast`.
#[derive(Debug, Args)]
pub(crate) struct BcastArgs {
    /// Bytes to broadcast (binary suffixes: KiB, MiB, GiB).
    #[arg(long, default_value = "1MiB", value_parser = units::size)]
    pub(crate) size: u64,
    /// Root rank(s); several roots (at most 64) broadcast concurrently (comma-separated).
    #[arg(long, default_value = "0", value_delimiter = ',')]
    pub(crate) root: Vec<u32>,
    #[command(flatten)]
    pub(crate) sim: SimArgs,
}

/// `ringcast sim allgather`.
#[derive(Debug, Args)]
pub(crate) struct AllgatherArgs {
    /// Bytes each rank contributes (binary suffixes: KiB, MiB, GiB).
    #[arg(long, default_value = "1MiB", value_parser = units::size)]
    pub(crate) size: u64,
    /// Allgatherv: bytes per rank, comma-separated, one per rank (overrides `--size`;
    /// zeros allowed).
    #[arg(long, value_delimiter = ',', value_parser = units::size)]
    pub(crate) sizes: Option<Vec<u64>>,
    #[command(flatten)]
    pub(crate) sim: SimArgs,
}

/// Flags every `ringcast sim` command shares: fabric, protocol, faults, output.
#[derive(Debug, Args)]
pub(crate) struct SimArgs {
    /// Number of ranks (hosts), at most 8192 (memory grows as its square times the lanes:
    /// about 8 GB at 8192 with one lane); `--topology testbed` is always 188.
    #[arg(long, default_value_t = 16)]
    pub(crate) ranks: u32,
    /// Chunk (packet payload) size.
    #[arg(long, default_value = "4KiB", value_parser = units::size)]
    pub(crate) chunk: u64,
    /// Fabric shape.
    #[arg(long, value_enum, default_value_t = Topology::Star)]
    pub(crate) topology: Topology,
    /// Hosts per leaf switch (leaf-spine), at most 65536.
    #[arg(long, default_value_t = 16)]
    pub(crate) hosts_per_leaf: u32,
    /// Spine switches (leaf-spine), at most 65536 and 2^20 leaf-spine cables.
    #[arg(long, default_value_t = 4)]
    pub(crate) spines: u32,
    /// Switch ports k (fat-tree, even, at most 1024): k/2 hosts per edge switch, k pods, up to
    /// k^3/4 hosts.
    #[arg(long, default_value_t = 32)]
    pub(crate) radix: u32,
    /// Link bandwidth: `100Gbps`, `400Gbps`, `12.5GB/s` (a bare number is Gbit/s).
    #[arg(long, default_value = "100Gbps", value_parser = units::bandwidth)]
    pub(crate) bandwidth: u64,
    /// Latency of every link: `500ns`, `1us`.
    #[arg(long, default_value = "500ns", value_parser = units::duration)]
    pub(crate) latency: Duration,
    /// Multicast subgroups (lanes), at most 256.
    #[arg(long, default_value_t = 1)]
    pub(crate) lanes: u16,
    /// Allgather broadcast chains M: roots multicasting at once.
    #[arg(long, default_value_t = 4)]
    pub(crate) chains: u32,
    /// Multicasts a root may have queued at its NIC.
    #[arg(long, default_value_t = 64)]
    pub(crate) window: u32,
    /// How long the core waits on a silent peer.
    #[arg(long, default_value = "1ms", value_parser = units::duration)]
    pub(crate) peer_timeout: Duration,
    /// Bernoulli loss probability per packet per link.
    #[arg(long, default_value = "0", value_parser = units::probability)]
    pub(crate) loss: f64,
    /// Gilbert-Elliott burst loss per link: `ENTER,EXIT` probabilities per packet.
    #[arg(long, value_parser = parse_burst)]
    pub(crate) burst: Option<(f64, f64)>,
    /// Probability that the last hop duplicates a packet.
    #[arg(long, default_value = "0", value_parser = units::probability)]
    pub(crate) dup: f64,
    /// Reordering on the last hop: `PROBABILITY[,MAX_DELAY]` (default delay 5us).
    #[arg(long, value_parser = parse_reorder)]
    pub(crate) reorder: Option<(f64, Duration)>,
    /// Probability that a payload bit flips (dropped by the receiver's transport checksum).
    #[arg(long, default_value = "0", value_parser = units::probability)]
    pub(crate) corrupt: f64,
    /// Probability that an immediate bit flips (the checksum covers the immediate too:
    /// dropped by the receiver's transport).
    #[arg(long, default_value = "0", value_parser = units::probability)]
    pub(crate) corrupt_imm: f64,
    /// Opt-in: probability that an op-tag bit flips and escapes the checksum (the core
    /// must drop the chunk as stale).
    #[arg(long, default_value = "0", value_parser = units::probability)]
    pub(crate) corrupt_escaping: f64,
    /// Probability that a receiver's copy of a placed chunk fails (its driver releases the
    /// chunk, and the ring recovers it).
    #[arg(long, default_value = "0", value_parser = units::probability)]
    pub(crate) copy_fail: f64,
    /// Crash a rank: `RANK@TIME`, e.g. `3@50us` (repeatable).
    #[arg(long, value_parser = parse_crash)]
    pub(crate) crash: Vec<(u32, Duration)>,
    /// Receiver overrun: `SLOTS[@SERVICE]` posted receives, one reposted per SERVICE
    /// (default 400ns).
    #[arg(long, value_parser = parse_rx_slots)]
    pub(crate) rx_slots: Option<(u32, Duration)>,
    /// Seed of every random choice.
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Stop the run at this virtual time.
    #[arg(long, default_value = "60s", value_parser = units::positive_duration)]
    pub(crate) time_limit: Duration,
    /// Print the report as JSON instead of a table.
    #[arg(long)]
    pub(crate) json: bool,
}

fn pair<'a>(s: &'a str, sep: char, what: &str) -> Result<(&'a str, Option<&'a str>), String> {
    let mut it = s.splitn(2, sep);
    let a = it.next().filter(|a| !a.is_empty());
    let a = a.ok_or_else(|| format!("{what}: `{s}` is empty"))?;
    Ok((a, it.next()))
}

fn parse_burst(s: &str) -> Result<(f64, f64), String> {
    let (a, b) = pair(s, ',', "burst")?;
    let b = b.ok_or_else(|| format!("burst `{s}`: expected ENTER,EXIT (e.g. 1e-4,0.2)"))?;
    Ok((units::probability(a)?, units::probability(b)?))
}

fn parse_reorder(s: &str) -> Result<(f64, Duration), String> {
    let (a, b) = pair(s, ',', "reorder")?;
    let d = b.map_or(Ok(Duration::from_micros(5)), units::duration)?;
    Ok((units::probability(a)?, d))
}

fn parse_crash(s: &str) -> Result<(u32, Duration), String> {
    let (a, b) = pair(s, '@', "crash")?;
    let b = b.ok_or_else(|| format!("crash `{s}`: expected RANK@TIME (e.g. 3@50us)"))?;
    let rank = a
        .trim()
        .parse()
        .map_err(|_| format!("crash `{s}`: `{a}` is not a rank"))?;
    Ok((rank, units::duration(b)?))
}

fn parse_rx_slots(s: &str) -> Result<(u32, Duration), String> {
    let (a, b) = pair(s, '@', "rx-slots")?;
    let n = a
        .trim()
        .parse()
        .map_err(|_| format!("rx-slots `{s}`: `{a}` is not a count"))?;
    let d = b.map_or(Ok(Duration::from_nanos(400)), units::duration)?;
    Ok((n, d))
}

/// `ringcast demo`.
#[derive(Debug, Args)]
pub(crate) struct DemoArgs {
    /// Local rank processes to spawn (at most 256).
    #[arg(long, default_value_t = 4)]
    pub(crate) ranks: u32,
    /// Buffer sizes: per Broadcast, and per rank for Allgather (comma-separated).
    #[arg(long, value_delimiter = ',', value_parser = units::size,
          default_value = "64KiB,1MiB,16MiB")]
    pub(crate) sizes: Vec<u64>,
    /// Small sizes only (4KiB,64KiB): a fast smoke run, as CI does.
    #[arg(long, conflicts_with = "sizes")]
    pub(crate) quick: bool,
    #[command(flatten)]
    pub(crate) net: NetArgs,
}

/// `ringcast bench`.
#[derive(Debug, Args)]
pub(crate) struct BenchArgs {
    /// The collective to time.
    #[arg(value_enum)]
    pub(crate) collective: Collective,
    /// Spawn this many local rank processes (at most 256) on loopback instead of bootstrapping
    /// from the launcher's environment (mpirun, srun, torchrun, RINGCAST_*).
    #[arg(long)]
    pub(crate) local: Option<u32>,
    /// Sizes in bytes per rank (comma-separated; default 64KiB..64MiB by powers of 4).
    #[arg(long, value_delimiter = ',', value_parser = units::size,
          default_value = "64KiB,256KiB,1MiB,4MiB,16MiB,64MiB")]
    pub(crate) sizes: Vec<u64>,
    /// Untimed iterations per size, after the verified one (at most 10^7). Above 0, the
    /// largest size also runs untimed for 100 ms before the first: the pacer's slow start.
    #[arg(long, default_value_t = 2)]
    pub(crate) warmup: u32,
    /// Timed iterations per size (1 to 10^7).
    #[arg(long, default_value_t = 10)]
    pub(crate) iters: u32,
    /// Print one JSON document instead of the table (no progress bar).
    #[arg(long)]
    pub(crate) json: bool,
    /// Time the blocking calls (`broadcast(&mut [T])`, `allgatherv(&[T], &mut [T])`, on the
    /// caller's slices) instead of the non-blocking ones on owned vectors.
    #[arg(long)]
    pub(crate) blocking: bool,
    /// Element type of the buffers (nccl-tests' `-d`): the calls take `Vec<T>` / `&mut [T]`
    /// of it. Collectives move bytes, so only its size and alignment matter; every size must
    /// be a multiple of its size.
    #[arg(long, value_enum, default_value = "u8")]
    pub(crate) dtype: Dtype,
    /// Time the in-place Allgather(v) (`iallgatherv_in_place`, `MPI_IN_PLACE`: this rank's
    /// block is already in the receive buffer, nothing is copied in); a Broadcast is always
    /// in place.
    #[arg(long, conflicts_with = "blocking")]
    pub(crate) in_place: bool,
    /// Allocate the buffers with `ringcast::alloc_buffer` (2 MiB transparent huge pages where
    /// the kernel has them: its setting `madvise` or `always`), as `MPI_Alloc_mem` or
    /// nccl-tests' `-R`, instead of a plain `Vec`.
    #[arg(long)]
    pub(crate) huge_pages: bool,
    #[command(flatten)]
    pub(crate) net: NetArgs,
}

/// `ringcast bench --dtype`: the element type of the buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Dtype {
    /// Bytes (`u8`).
    U8,
    /// Half precision, carried as `u16` (2 bytes, 2-aligned).
    F16,
    /// bfloat16, carried as `u16`.
    Bf16,
    /// `f32`.
    F32,
    /// `f64`.
    F64,
    /// `i32`.
    I32,
    /// `i64`.
    I64,
}

impl Dtype {
    /// Its size in bytes.
    pub(crate) fn size(self) -> u64 {
        match self {
            Dtype::U8 => 1,
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::F64 | Dtype::I64 => 8,
        }
    }

    /// Its name, as `--dtype` takes it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Dtype::U8 => "u8",
            Dtype::F16 => "f16",
            Dtype::Bf16 => "bf16",
            Dtype::F32 => "f32",
            Dtype::F64 => "f64",
            Dtype::I32 => "i32",
            Dtype::I64 => "i64",
        }
    }
}

/// What `ringcast bench` times.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Collective {
    /// Broadcast from rank 0 (`MPI_Bcast`).
    Bcast,
    /// Allgather, the same size on every rank (`MPI_Allgather`).
    Allgather,
    /// Allgatherv with uneven blocks: rank r contributes 2(r+1)/(P+1) times the size (mean:
    /// the size).
    Allgatherv,
}

/// Communicator settings shared by `demo` and `bench`; unset ones come from the environment
/// (`RINGCAST_LANES`, `RINGCAST_CHUNK_SIZE`, `RINGCAST_PEER_TIMEOUT`) or the defaults.
#[derive(Debug, Args)]
pub(crate) struct NetArgs {
    /// Multicast lanes (groups), each with a send and a receive worker per rank; default: two
    /// lanes per core each rank has to itself on its host (at most its own cores), 1 to 4, the
    /// same on every rank.
    #[arg(long)]
    pub(crate) lanes: Option<u16>,
    /// Chunk (datagram payload) size, 16 B to 65 476 B and at most the MTU less 56 B; default:
    /// on loopback (`--local`, `demo`) 32 640 B, two datagrams to a GSO send; elsewhere the
    /// largest power of two up to 4 KiB that fits the MTU.
    #[arg(long, value_parser = units::size)]
    pub(crate) chunk: Option<u64>,
    /// Link bandwidth the cutoff timer and the pacer assume: `10Gbps`, `1.25GB/s`, or a bare
    /// number of Gbit/s (default: the interface's speed as the kernel reports it; 20Gbps per
    /// lane on loopback, 10Gbps where the kernel reports none).
    #[arg(long, value_parser = units::bandwidth)]
    pub(crate) link_bandwidth: Option<u64>,
    /// How long a rank waits on a silent peer before failing the operation (a post timeout
    /// left at its default follows one past 10 minutes).
    #[arg(long, value_parser = units::duration)]
    pub(crate) peer_timeout: Option<Duration>,
    /// Operations of at most this many bytes (a Broadcast's buffer, an Allgather's blocks
    /// summed) run over TCP instead of multicast; 0 sends all to multicast. Default: the
    /// library's for `bench` (RINGCAST_TCP_THRESHOLD, or 512 KiB with every rank on one host,
    /// 64 KiB otherwise), 0 for `demo`.
    #[arg(long, value_parser = units::size)]
    pub(crate) tcp_threshold: Option<u64>,
    /// Local runs: kill every rank when none has reported for this long.
    #[arg(long, default_value = "120s", value_parser = units::positive_duration)]
    pub(crate) timeout: Duration,
    /// Internal: this process is one rank spawned by a local run.
    #[arg(long, hide = true)]
    pub(crate) child: bool,
}
