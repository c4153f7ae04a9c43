//! The start-up check: does multicast actually arrive?
//!
//! Run by [`CommBuilder::build`](super::CommBuilder::build) after the control mesh is up and
//! every lane's data sockets joined their groups, before the engine starts.
//!
//! ## Protocol
//! 1. Every rank multicasts two **probe datagrams** on every lane, again every
//!    [`PROBE_INTERVAL`], from the lane's own send socket (same interface, TTL and loop
//!    settings as the data): a small one, and one as large as a chunk (the data's datagram
//!    size; in large jobs every few rounds, [`full_every`]). It reads its own lane sockets, noting which ranks it heard on which lane, in
//!    small datagrams and in chunk-sized ones.
//! 2. Once it heard every other rank on every lane in both sizes, or once the window (default 2 s,
//!    [`CommBuilder::startup_check`](super::CommBuilder::startup_check)) is over, it stops
//!    reading its data sockets and sends a **report** to every peer over the TCP control mesh:
//!    what it heard, its interface, UDP port and groups, its fallback setting (and, with
//!    `fallback = tcp`, the address of its fallback listener). It keeps sending probes until
//!    every report is in, so a late joiner still hears it.
//! 3. With every report in, every rank judges the same matrix the same way
//!    ([`judge`]): all heard → multicast is fine; otherwise a [`ProbeFailure`] naming who did
//!    not hear whom, where, and what to check. A sender heard in small datagrams but not in
//!    chunk-sized ones is a path whose MTU is below the hosts' (a switch port, a link, a
//!    bridge): the data would never arrive, and the failure says so. No coordinator is needed and every rank reaches
//!    the same verdict.
//!
//! A rank starts its engine only after every report is in, i.e. after every rank stopped
//! reading its data sockets: no real chunk is ever consumed by the check. Control messages of
//! a peer whose engine (or TCP dispatcher) already started are put back on the mesh, in
//! order, in front of what came after them ([`TcpControl::unread`]): whoever owns the mesh
//! next reads them first.
//!
//! ## The probe datagram (what the core sees of a late one)
//! A valid RoCEv2 UD `SEND_ONLY_WITH_IMMEDIATE` of the job (its P_Key, Q_Key, DestQP), so that
//! it crosses exactly the filters the data crosses, with **ImmDt `0xFFFF_FFFF`**
//! ([`PROBE_IMM`]) and a payload `"RCPROBE1" | rank u32 | lane u16 | round u16` (16 bytes),
//! or `"RCPROBE2"` and the same fields, zero-padded to the chunk size.
//! Probes still queued when the engine starts reach the core's receive path, which drops them
//! cleanly: the op tag is all ones, so no operation is open for it until the 4095th one
//! (default layout) and the chunk is counted **stale**; should a late probe ever meet an open
//! operation with that tag, its chunk index (all ones, `2^chunk_bits - 1`) is never a chunk's
//! (the core refuses operations of `2^chunk_bits` chunks), so it is dropped (out of range; as
//! another rank's on an empty block, or as its own at the sender). It is never placed.
//!
//! ## Reports on the control mesh
//! A control message whose first byte is [`REPORT_KIND`] (`0xF0`; the core's kinds are small
//! integers, 1 to 9 today, so the core would reject one as malformed): `kind, version, flags,
//! 0, rank u32, ranks u32, tcp_threshold u64, chunk_size u32, chains u32, lanes u16, port u16,
//! interface
//! [4], groups [4] x lanes, heard bitmap (lane-major, ceil(lanes x ranks / 8) bytes), the
//! same bitmap for chunk-sized probes, extra_len u16, extra`.
//!
//! A rank whose check fails because a peer's connection closed says which peer in its
//! goodbye ([`TcpControl::close_blaming`]): the others then name that peer, not the rank that
//! left over it, whose connection they may see close first.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddrV4};
use std::thread;
use std::time::{Duration, Instant};

use ringcast_core::lane::Multicast;
use ringcast_core::port::{ControlInput, ControlPort, LaneRxPort, LaneTxPort, RxToken};
use ringcast_core::{DropReason, OpId, Placement, Rank};
use ringcast_transport_rocev2_udp::{OpBuffer, Registry, TcpControl, UdpRx, UdpTx, datagram_len};

use super::error::BuildError;

/// The immediate every probe datagram carries (see the module docs).
pub(crate) const PROBE_IMM: u32 = u32::MAX;
/// Probe payload: magic, rank, lane, round.
const PROBE_MAGIC: [u8; 8] = *b"RCPROBE1";
/// A chunk-sized probe's payload starts with this, then rank, lane and round as a small one's.
const FULL_MAGIC: [u8; 8] = *b"RCPROBE2";
pub(crate) const PROBE_LEN: usize = 16;
/// Registry ids of the probe's send and receive scratch buffers (no operation gets near them).
const PROBE_TX_OP: OpId = OpId(u64::MAX);
const PROBE_RX_OP: OpId = OpId(u64::MAX - 1);
/// First byte of a report on the control mesh.
pub(crate) const REPORT_KIND: u8 = 0xF0;
const REPORT_VERSION: u8 = 5;
const FLAG_CHECKED: u8 = 1;
const FLAG_FALLBACK_TCP: u8 = 2;
/// How often a rank multicasts its probes.
pub(crate) const PROBE_INTERVAL: Duration = Duration::from_millis(20);
/// Chunk-sized probe bytes per second a rank may take in on one lane, from all senders
/// together (at 4 ranks, far more than they send, with 4 KiB chunks or loopback's 32 640-byte
/// ones; at 1024 ranks, each
/// sender's chunk-sized probes go out every few rounds, see [`full_every`]).
const FULL_PROBE_BUDGET: u64 = 8 << 20;
/// Sleep between polls of the sockets and the control mesh.
const POLL: Duration = Duration::from_millis(1);

/// What the check needs from the builder.
#[derive(Clone, Debug)]
pub(crate) struct ProbeSetup {
    pub(crate) rank: u32,
    pub(crate) ranks: u32,
    pub(crate) lanes: u16,
    /// This rank's lane groups (address and port).
    pub(crate) groups: Vec<SocketAddrV4>,
    pub(crate) interface: Ipv4Addr,
    /// How long to listen for probes; zero skips the multicast check (reports still go out).
    pub(crate) window: Duration,
    /// How long after the window a missing report is waited for.
    pub(crate) report_wait: Duration,
    pub(crate) fallback_tcp: bool,
    /// Operations up to this many bytes run over TCP (every rank must agree).
    pub(crate) tcp_threshold: u64,
    /// Payload bytes per datagram (every rank must agree: a chunk's index says where it goes
    /// only for one size).
    pub(crate) chunk_size: u32,
    /// Allgather chains (every rank must agree: they order the roots).
    pub(crate) chains: u32,
    /// Opaque bytes handed to every peer (the fallback listener's address).
    pub(crate) extra: Vec<u8>,
    /// Set by another thread to give the check up (a split's parent aborted).
    pub(crate) cancel: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// What the start-up exchange produced.
#[derive(Debug, Default)]
pub(crate) struct Exchange {
    /// `Some` when multicast does not reach every rank.
    pub(crate) failure: Option<ProbeFailure>,
    /// Every rank's extra bytes, by rank.
    pub(crate) extras: Vec<Vec<u8>>,
    /// How long the check took.
    pub(crate) elapsed: Duration,
}

/// One rank's report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Report {
    pub(crate) rank: u32,
    pub(crate) ranks: u32,
    pub(crate) checked: bool,
    pub(crate) fallback_tcp: bool,
    pub(crate) tcp_threshold: u64,
    pub(crate) chunk_size: u32,
    pub(crate) chains: u32,
    pub(crate) interface: Ipv4Addr,
    pub(crate) port: u16,
    pub(crate) groups: Vec<Ipv4Addr>,
    /// `heard[lane * ranks + sender]`: its small probes arrived.
    pub(crate) heard: Vec<bool>,
    /// The same, for its chunk-sized probes.
    pub(crate) heard_full: Vec<bool>,
    pub(crate) extra: Vec<u8>,
}

impl Report {
    /// Bytes of the longest report of a job of `ranks` ranks on `lanes` lanes (its extra
    /// bytes as long as their 16-bit length allows).
    pub(crate) fn max_len(lanes: usize, ranks: usize) -> usize {
        36 + 4 * lanes + 2 * lanes.saturating_mul(ranks).div_ceil(8) + 2 + usize::from(u16::MAX)
    }

    fn lanes(&self) -> usize {
        self.groups.len()
    }

    fn heard(&self, lane: usize, from: u32) -> bool {
        self.heard
            .get(lane * self.ranks as usize + from as usize)
            .copied()
            .unwrap_or(false)
    }

    fn heard_full(&self, lane: usize, from: u32) -> bool {
        self.heard_full
            .get(lane * self.ranks as usize + from as usize)
            .copied()
            .unwrap_or(false)
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let bits = self.heard.len();
        let mut b =
            Vec::with_capacity(40 + 4 * self.lanes() + 2 * bits.div_ceil(8) + self.extra.len());
        let flags = if self.checked { FLAG_CHECKED } else { 0 }
            | if self.fallback_tcp {
                FLAG_FALLBACK_TCP
            } else {
                0
            };
        b.extend_from_slice(&[REPORT_KIND, REPORT_VERSION, flags, 0]);
        b.extend_from_slice(&self.rank.to_be_bytes());
        b.extend_from_slice(&self.ranks.to_be_bytes());
        b.extend_from_slice(&self.tcp_threshold.to_be_bytes());
        b.extend_from_slice(&self.chunk_size.to_be_bytes());
        b.extend_from_slice(&self.chains.to_be_bytes());
        b.extend_from_slice(&(self.lanes() as u16).to_be_bytes());
        b.extend_from_slice(&self.port.to_be_bytes());
        b.extend_from_slice(&self.interface.octets());
        for g in &self.groups {
            b.extend_from_slice(&g.octets());
        }
        for heard in [&self.heard, &self.heard_full] {
            let mut map = vec![0u8; bits.div_ceil(8)];
            for (i, _) in heard.iter().enumerate().filter(|(i, h)| **h && *i < bits) {
                map[i / 8] |= 1 << (i % 8);
            }
            b.extend_from_slice(&map);
        }
        b.extend_from_slice(&(self.extra.len() as u16).to_be_bytes());
        b.extend_from_slice(&self.extra);
        b
    }

    /// Decodes a report; `None` when it is not one this version understands.
    pub(crate) fn decode(b: &[u8]) -> Option<Report> {
        let take = |at: &mut usize, n: usize| -> Option<&[u8]> {
            let s = b.get(*at..at.checked_add(n)?)?;
            *at += n;
            Some(s)
        };
        let mut at = 0;
        let head = take(&mut at, 4)?;
        if head[0] != REPORT_KIND || head[1] != REPORT_VERSION {
            return None;
        }
        let flags = head[2];
        let u32_ = |s: &[u8]| u32::from_be_bytes([s[0], s[1], s[2], s[3]]);
        let u16_ = |s: &[u8]| u16::from_be_bytes([s[0], s[1]]);
        let rank = u32_(take(&mut at, 4)?);
        let ranks = u32_(take(&mut at, 4)?);
        let tcp_threshold = u64::from_be_bytes(take(&mut at, 8)?.try_into().ok()?);
        let chunk_size = u32_(take(&mut at, 4)?);
        let chains = u32_(take(&mut at, 4)?);
        let lanes = usize::from(u16_(take(&mut at, 2)?));
        let port = u16_(take(&mut at, 2)?);
        let i = take(&mut at, 4)?;
        let interface = Ipv4Addr::new(i[0], i[1], i[2], i[3]);
        let mut groups = Vec::with_capacity(lanes);
        for _ in 0..lanes {
            let g = take(&mut at, 4)?;
            groups.push(Ipv4Addr::new(g[0], g[1], g[2], g[3]));
        }
        let bits = lanes.checked_mul(ranks as usize)?;
        if rank >= ranks || bits > 1 << 24 {
            return None;
        }
        let mut bitmap = || -> Option<Vec<bool>> {
            let map = take(&mut at, bits.div_ceil(8))?;
            Some(
                (0..bits)
                    .map(|i| map[i / 8] & (1 << (i % 8)) != 0)
                    .collect(),
            )
        };
        let heard = bitmap()?;
        let heard_full = bitmap()?;
        let n = usize::from(u16_(take(&mut at, 2)?));
        let extra = take(&mut at, n)?.to_vec();
        if at != b.len() {
            return None;
        }
        Some(Report {
            rank,
            ranks,
            checked: flags & FLAG_CHECKED != 0,
            fallback_tcp: flags & FLAG_FALLBACK_TCP != 0,
            tcp_threshold,
            chunk_size,
            chains,
            interface,
            port,
            groups,
            heard,
            heard_full,
            extra,
        })
    }
}

/// One receiver that did not hear some senders on one lane.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Unheard {
    /// The rank that listened.
    pub rank: u32,
    /// The interface it joined on.
    pub interface: Ipv4Addr,
    /// The lane.
    pub lane: u16,
    /// The group and port it listened on.
    pub group: SocketAddrV4,
    /// The ranks it heard nothing from, ascending.
    pub from: Vec<u32>,
}

/// Multicast does not reach every rank, or not in datagrams as large as the data's: who did
/// not hear whom, and where. Its `Display` says what to check (route, IGMP snooping querier,
/// firewall; the path's MTU) and how to fall back to TCP.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProbeFailure {
    /// How long the ranks listened.
    pub window: Duration,
    /// Every (receiver, lane) that missed some sender.
    pub unheard: Vec<Unheard>,
    /// Ranks no other rank heard on any lane (their multicast does not leave, or goes out the
    /// wrong interface).
    pub unheard_by_all: Vec<u32>,
    /// Ranks that heard no other rank on any lane (they do not receive).
    pub deaf: Vec<u32>,
    /// UDP port by rank, when the ranks disagree on it (a configuration mismatch).
    pub port_mismatch: Vec<(u32, u16)>,
    /// Every (receiver, lane) that heard some senders' small probes but not their
    /// chunk-sized ones (`from`): the path between them does not carry datagrams as large as
    /// the data's (an MTU on the way below the hosts').
    pub too_large: Vec<Unheard>,
    /// The chunk size the ranks agreed on (payload bytes per data datagram).
    pub chunk_size: u32,
}

impl ProbeFailure {
    /// Every rank named given by `f` (see [`BuildError::renumbered`]), the rows and lists
    /// sorted again.
    pub(crate) fn renumber(&mut self, f: &dyn Fn(u32) -> u32) {
        for rows in [&mut self.unheard, &mut self.too_large] {
            for u in rows.iter_mut() {
                u.rank = f(u.rank);
                u.from.iter_mut().for_each(|r| *r = f(*r));
                u.from.sort_unstable();
            }
            rows.sort_by_key(|u| (u.rank, u.lane));
        }
        for list in [&mut self.unheard_by_all, &mut self.deaf] {
            list.iter_mut().for_each(|r| *r = f(*r));
            list.sort_unstable();
        }
        self.port_mismatch.iter_mut().for_each(|(r, _)| *r = f(*r));
        self.port_mismatch.sort_unstable();
    }
}

pub(crate) fn list(r: &[u32]) -> String {
    let v: Vec<String> = r.iter().map(u32::to_string).collect();
    v.join(", ")
}

pub(crate) fn ranks_word(n: usize) -> &'static str {
    if n == 1 { "rank" } else { "ranks" }
}

impl fmt::Display for ProbeFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "multicast start-up check failed (listened {:.1} s): ",
            self.window.as_secs_f64()
        )?;
        // IPv4, UDP and the RoCE headers, pad and trailer around a chunk.
        let packet = 28 + datagram_len(self.chunk_size as usize);
        let large = format!("multicast of the data's size ({packet}-byte IP packets)");
        let mut first = true;
        for (rows, what) in [
            (&self.unheard, "no multicast".to_owned()),
            (&self.too_large, format!("small multicast but no {large}")),
        ] {
            // One line per receiver: lanes with the same missing senders are merged.
            let mut i = 0;
            while i < rows.len() {
                let u = &rows[i];
                let mut j = i + 1;
                while j < rows.len() && rows[j].rank == u.rank && rows[j].from == u.from {
                    j += 1;
                }
                let groups: Vec<String> = rows[i..j].iter().map(|x| x.group.to_string()).collect();
                if !first {
                    f.write_str("; ")?;
                }
                first = false;
                write!(
                    f,
                    "rank {} heard {what} from {} {} on {} via {}",
                    u.rank,
                    ranks_word(u.from.len()),
                    list(&u.from),
                    groups.join(", "),
                    u.interface
                )?;
                i = j;
            }
        }
        f.write_str(".")?;
        if !self.port_mismatch.is_empty() {
            let v: Vec<String> = self
                .port_mismatch
                .iter()
                .map(|(r, p)| format!("rank {r}: {p}"))
                .collect();
            write!(
                f,
                " The ranks use different UDP ports ({}): set RINGCAST_PORT \
                 (CommBuilder::udp_port) the same on every rank.",
                v.join(", ")
            )?;
        }
        if !self.unheard_by_all.is_empty() {
            write!(
                f,
                " Nobody heard {} {}: their multicast does not leave the host or goes out \
                 the wrong interface (set RINGCAST_IFNAME to the interface that reaches the \
                 peers; check `ip route get <group>` and an output firewall).",
                ranks_word(self.unheard_by_all.len()),
                list(&self.unheard_by_all)
            )?;
        }
        if !self.deaf.is_empty() {
            write!(
                f,
                " {} {} heard nobody: multicast does not reach {} (joined on the wrong \
                 interface, a snooping switch that never learnt the membership, or an input \
                 firewall).",
                if self.deaf.len() == 1 {
                    "Rank"
                } else {
                    "Ranks"
                },
                list(&self.deaf),
                if self.deaf.len() == 1 { "it" } else { "them" }
            )?;
        }
        if !self.too_large.is_empty() {
            write!(
                f,
                " A link, switch port or bridge on the way has a smaller MTU than the hosts' \
                 interfaces (each host sizes its chunks, {} bytes here, from its interface's \
                 MTU, or larger on a loopback): raise the MTU along the whole path, or set RINGCAST_CHUNK_SIZE \
                 (CommBuilder::chunk_size) to what the path carries (its MTU less 56 bytes, \
                 rounded down to a multiple of 4: 1444 for 1500, 1392 for 1450). TCP \
                 through that path may stall too, where nothing reports the smaller MTU.",
                self.chunk_size
            )?;
        }
        if let Some(u) = self.unheard.first() {
            let port = u.group.port();
            write!(
                f,
                " Check: no multicast route on the chosen interface (set RINGCAST_IFNAME, or \
                 `ip route add 224.0.0.0/4 dev <if>`); an IGMP-snooping switch or bridge \
                 without a querier (enable one, e.g. `ip link set <bridge> type bridge \
                 mcast_querier 1`, or turn snooping off); a firewall dropping UDP port {port} \
                 (allow it, e.g. `nft add rule inet filter input udp dport {port} accept`)."
            )?;
        }
        f.write_str(
            " To run over TCP instead, set RINGCAST_FALLBACK=tcp \
             (CommBuilder::fallback(Fallback::Tcp)).",
        )
    }
}

impl std::error::Error for ProbeFailure {}

/// Decodes `b` as a start-up report: what decodes must encode to what decodes the same, and
/// be judged without a panic. Whether it decoded. For the fuzz target.
pub(crate) fn fuzz_report(b: &[u8]) -> bool {
    let Some(r) = Report::decode(b) else {
        return false;
    };
    assert_eq!(
        Report::decode(&r.encode()).as_ref(),
        Some(&r),
        "a report reads back"
    );
    let _ = judge(std::slice::from_ref(&r), Duration::ZERO);
    // Beside a second rank's report, built from this one.
    if r.ranks == 2 {
        let mut other = r.clone();
        other.rank = 1 - r.rank;
        let _ = judge(&[r, other], Duration::from_secs(1));
    }
    true
}

/// The verdict on every rank's report (the same on every rank: the same reports in).
/// `Err` (for [`BuildError::StartupCheck`]) when the ranks disagree on settings that must
/// match.
pub(crate) fn judge(reports: &[Report], window: Duration) -> Result<Option<ProbeFailure>, String> {
    let Some(first) = reports.first() else {
        return Ok(None);
    };
    let ranks = reports.len() as u32;
    for r in reports {
        if r.ranks != ranks || r.lanes() != first.lanes() {
            return Err(format!(
                "rank {} runs {} ranks with {} lanes, rank {} runs {} ranks with {} lanes: \
                 set RINGCAST_WORLD_SIZE and RINGCAST_LANES the same on every rank",
                first.rank,
                first.ranks,
                first.lanes(),
                r.rank,
                r.ranks,
                r.lanes()
            ));
        }
        if r.fallback_tcp != first.fallback_tcp {
            let name = |t: bool| if t { "tcp" } else { "off" };
            return Err(format!(
                "rank {} has fallback = {}, rank {} has fallback = {}: set RINGCAST_FALLBACK \
                 the same on every rank",
                first.rank,
                name(first.fallback_tcp),
                r.rank,
                name(r.fallback_tcp)
            ));
        }
        if r.tcp_threshold != first.tcp_threshold {
            return Err(format!(
                "rank {} runs operations of up to {} bytes over TCP, rank {} up to {}: set \
                 RINGCAST_TCP_THRESHOLD the same on every rank",
                first.rank, first.tcp_threshold, r.rank, r.tcp_threshold
            ));
        }
        if r.chunk_size != first.chunk_size {
            return Err(format!(
                "rank {} sends {}-byte chunks, rank {} {}-byte ones (without RINGCAST_CHUNK_SIZE, \
                 each host's MTU decides, and whether its interface is a loopback): set RINGCAST_CHUNK_SIZE the same on every rank, at \
                 most the smallest",
                first.rank, first.chunk_size, r.rank, r.chunk_size
            ));
        }
        if r.chains != first.chains {
            return Err(format!(
                "rank {} runs Allgathers on {} chains, rank {} on {} (without RINGCAST_CHAINS, \
                 the cores of the ranks' hosts decide): set RINGCAST_CHAINS the same on every \
                 rank",
                first.rank, first.chains, r.rank, r.chains
            ));
        }
    }
    if reports.iter().any(|r| !r.checked) {
        return Ok(None);
    }
    let lanes = first.lanes();
    // Per (receiver, lane), the senders `missed` says it missed.
    let missing = |missed: &dyn Fn(&Report, usize, u32) -> bool| {
        let mut rows = Vec::new();
        for r in reports {
            for lane in 0..lanes {
                let from: Vec<u32> = (0..ranks)
                    .filter(|&s| s != r.rank && missed(r, lane, s))
                    .collect();
                if !from.is_empty() {
                    rows.push(Unheard {
                        rank: r.rank,
                        interface: r.interface,
                        lane: lane as u16,
                        group: SocketAddrV4::new(r.groups[lane], r.port),
                        from,
                    });
                }
            }
        }
        rows
    };
    let unheard = missing(&|r, lane, s| !r.heard(lane, s));
    // Heard in small datagrams, not in chunk-sized ones.
    let too_large = missing(&|r, lane, s| r.heard(lane, s) && !r.heard_full(lane, s));
    if unheard.is_empty() && too_large.is_empty() {
        return Ok(None);
    }
    let heard_any = |r: &Report, s: u32| (0..lanes).any(|l| r.heard(l, s));
    let unheard_by_all = if ranks > 2 {
        (0..ranks)
            .filter(|&s| {
                reports
                    .iter()
                    .filter(|r| r.rank != s)
                    .all(|r| !heard_any(r, s))
            })
            .collect()
    } else {
        Vec::new()
    };
    let deaf = if ranks > 2 {
        reports
            .iter()
            .filter(|r| {
                (0..ranks)
                    .filter(|&s| s != r.rank)
                    .all(|s| !heard_any(r, s))
            })
            .map(|r| r.rank)
            .collect()
    } else {
        Vec::new()
    };
    let port_mismatch = if reports.iter().any(|r| r.port != first.port) {
        reports.iter().map(|r| (r.rank, r.port)).collect()
    } else {
        Vec::new()
    };
    Ok(Some(ProbeFailure {
        window,
        unheard,
        unheard_by_all,
        deaf,
        port_mismatch,
        too_large,
        chunk_size: first.chunk_size,
    }))
}

/// Why the check failed, and the rank it failed over (named in this rank's goodbye).
#[derive(Debug)]
pub(crate) struct Failed {
    pub(crate) error: BuildError,
    pub(crate) culprit: Option<Rank>,
}

impl From<BuildError> for Failed {
    fn from(error: BuildError) -> Self {
        Failed {
            error,
            culprit: None,
        }
    }
}

fn startup(why: String) -> BuildError {
    BuildError::StartupCheck(why)
}

/// Runs the check (see the module docs) on the lanes' own sockets and the control mesh.
pub(crate) fn run(
    s: &ProbeSetup,
    rx: &mut [UdpRx],
    tx: &mut [UdpTx],
    control: &mut TcpControl,
) -> Result<Exchange, Failed> {
    let started = Instant::now();
    let n = s.ranks as usize;
    let lanes = usize::from(s.lanes);
    let mut heard = Heard {
        small: vec![false; lanes * n],
        full: vec![false; lanes * n],
    };
    let mut ex = Exchange::default();
    if n <= 1 {
        ex.extras = vec![s.extra.clone()];
        return Ok(ex);
    }
    let registry: Registry = control.registry().clone();
    // Per lane a small probe, then (from `PROBE_LEN * lanes` on) a chunk-sized one.
    let full = s.chunk_size as usize;
    let out = OpBuffer::zeroed((PROBE_LEN + full) * lanes);
    let inbox = OpBuffer::zeroed(full.max(PROBE_LEN));
    registry.register(PROBE_TX_OP, out.clone());
    registry.register(PROBE_RX_OP, inbox.clone());
    let mut others = Vec::new();
    let result = exchange(
        s,
        rx,
        tx,
        control,
        &out,
        &inbox,
        &mut heard,
        started,
        &mut ex,
        &mut others,
    );
    // What was not a report belongs to the mesh's next owner.
    control.unread(others);
    registry.unregister(PROBE_TX_OP);
    registry.unregister(PROBE_RX_OP);
    // Probes a stuck send path left queued are dropped, not left to the engine's workers;
    // then what the senders report done is drained.
    for t in tx.iter_mut() {
        t.cancel(PROBE_TX_OP);
        while t.take_done().is_some() {}
    }
    result?;
    ex.elapsed = started.elapsed();
    Ok(ex)
}

#[allow(clippy::too_many_arguments)]
fn exchange(
    s: &ProbeSetup,
    rx: &mut [UdpRx],
    tx: &mut [UdpTx],
    control: &mut TcpControl,
    out: &OpBuffer,
    inbox: &OpBuffer,
    heard: &mut Heard,
    started: Instant,
    ex: &mut Exchange,
    others: &mut Vec<(Rank, Vec<u8>)>,
) -> Result<(), Failed> {
    let n = s.ranks as usize;
    let lanes = usize::from(s.lanes);
    let window_end = started + s.window;
    let deadline = window_end + s.report_wait;
    let checking = !s.window.is_zero();
    let every = full_every(s.ranks, s.chunk_size, s.window);
    let mut reports: Vec<Option<Report>> = vec![None; n];
    let mut reported = false;
    let mut round: u16 = 0;
    let mut next_probe = started;
    let mut buf = Vec::new();
    loop {
        let now = Instant::now();
        let all_in = reports
            .iter()
            .enumerate()
            .all(|(r, x)| r == s.rank as usize || x.is_some());
        // 1. Probes, until every report is in (a slow peer may still be listening).
        if checking && !all_in && now >= next_probe {
            send_probes(s, tx, out, round, every);
            round = round.wrapping_add(1);
            next_probe = now + PROBE_INTERVAL;
        }
        // 2. Listen, until this rank reports.
        if checking && !reported {
            for (lane, r) in rx.iter_mut().enumerate() {
                listen(s, lane, r, inbox, heard);
            }
        }
        // 3. Report once everything was heard in both sizes, or the window is over.
        let heard_all = (0..lanes).all(|l| {
            (0..n).all(|from| {
                from == s.rank as usize || (heard.small[l * n + from] && heard.full[l * n + from])
            })
        });
        if !reported && (!checking || heard_all || now >= window_end) {
            let me = Report {
                rank: s.rank,
                ranks: s.ranks,
                checked: checking,
                fallback_tcp: s.fallback_tcp,
                tcp_threshold: s.tcp_threshold,
                chunk_size: s.chunk_size,
                chains: s.chains,
                interface: s.interface,
                port: s.groups.first().map_or(0, SocketAddrV4::port),
                groups: s.groups.iter().map(|g| *g.ip()).collect(),
                heard: heard.small.clone(),
                heard_full: heard.full.clone(),
                extra: s.extra.clone(),
            };
            let bytes = me.encode();
            for peer in (0..s.ranks).filter(|&p| p != s.rank) {
                control.send_control(Rank(peer), &bytes);
            }
            tracing::debug!(
                rank = s.rank,
                heard_all,
                after = ?now.duration_since(started),
                "start-up check: reported"
            );
            reports[s.rank as usize] = Some(me);
            reported = true;
        }
        // 4. Peers' reports; anything else is put back on the mesh at the end.
        while let Some(input) = control.poll_control(&mut buf) {
            let ControlInput::Message { from, len } = input else {
                continue;
            };
            let bytes = &buf[..len.min(buf.len())];
            if bytes.first() != Some(&REPORT_KIND) {
                others.push((from, bytes.to_vec()));
                continue;
            }
            let rep = Report::decode(bytes).ok_or_else(|| {
                startup(format!(
                    "rank {} sent a start-up report this rank cannot read (a different \
                     ringcast version?)",
                    from.0
                ))
            })?;
            if rep.rank != from.0 {
                return Err(startup(format!(
                    "rank {} sent a start-up report in the name of rank {}",
                    from.0, rep.rank
                ))
                .into());
            }
            if let Some(slot) = reports.get_mut(from.index()) {
                slot.get_or_insert(rep);
            }
        }
        // A peer that already reported may leave once this rank reported too (its verdict,
        // this rank's as well, failed the build): otherwise a peer lost is a failure. One
        // that died after its report, while this rank still listens, would have the others
        // judge multicast from it unheard. One that left over another peer's loss said
        // which in its goodbye: that peer is named (several go at once; the first seen need
        // not be the cause), and this rank's goodbye names it too.
        let gone: Vec<u32> = control
            .lost_peers()
            .iter()
            .filter(|p| !reported || reports.get(p.index()).is_some_and(Option::is_none))
            .map(|p| p.0)
            .collect();
        if let Some(&first) = gone.first() {
            let (culprit, via) = gone
                .iter()
                .find_map(|&g| {
                    control
                        .departed_blaming(Rank(g))
                        .filter(|c| c.0 != s.rank && c.index() < n)
                        .map(|c| (c.0, Some(g)))
                })
                .unwrap_or((first, None));
            return Err(Failed {
                error: BuildError::StartupPeerLost {
                    rank: culprit,
                    seen_by: via,
                },
                culprit: Some(Rank(culprit)),
            });
        }
        if reported && reports.iter().all(Option::is_some) {
            break;
        }
        if s.cancel.load(std::sync::atomic::Ordering::Relaxed) {
            return Err(BuildError::Control(
                ringcast_transport_rocev2_udp::control::ControlError::Cancelled,
            )
            .into());
        }
        if now >= deadline {
            let missing: Vec<u32> = reports
                .iter()
                .enumerate()
                .filter(|(_, r)| r.is_none())
                .map(|(r, _)| r as u32)
                .collect();
            return Err(BuildError::StartupReportMissing {
                ranks: missing,
                waited: s.window + s.report_wait,
            }
            .into());
        }
        thread::sleep(POLL);
    }
    let reports: Vec<Report> = reports.into_iter().flatten().collect();
    ex.failure = judge(&reports, s.window).map_err(startup)?;
    ex.extras = reports.into_iter().map(|r| r.extra).collect();
    Ok(())
}

/// Every how many rounds a rank sends its chunk-sized probes: as often as a receiver's
/// [`FULL_PROBE_BUDGET`] allows with every rank sending, yet at least four times a window.
/// Ranks send them in different rounds (see [`send_probes`]).
fn full_every(ranks: u32, chunk: u32, window: Duration) -> u16 {
    let per_round = FULL_PROBE_BUDGET * PROBE_INTERVAL.as_millis() as u64 / 1000;
    let wanted = (u64::from(ranks) * u64::from(chunk)).div_ceil(per_round.max(1));
    let most = (window.as_millis() / (4 * PROBE_INTERVAL.as_millis())) as u64;
    wanted.min(most).clamp(1, u64::from(u16::MAX)) as u16
}

/// Which senders a rank heard, by lane (`[lane * ranks + sender]`), in each probe size.
#[derive(Debug)]
pub(crate) struct Heard {
    small: Vec<bool>,
    full: Vec<bool>,
}

/// A small probe per lane, through the lane's own send half, and a chunk-sized one in the
/// rounds of this rank's turn (every `every` rounds, in a phase of its own: the ranks' take
/// turns, and no round carries all of them).
fn send_probes(s: &ProbeSetup, tx: &mut [UdpTx], out: &OpBuffer, round: u16, every: u16) {
    let lanes = tx.len();
    let full = s.chunk_size as usize;
    let sizes = if round % every == (s.rank % u32::from(every)) as u16 {
        2
    } else {
        1
    };
    for (lane, t) in tx.iter_mut().enumerate() {
        for (magic, offset, len) in [
            (PROBE_MAGIC, lane * PROBE_LEN, PROBE_LEN),
            (FULL_MAGIC, lanes * PROBE_LEN + lane * full, full),
        ]
        .into_iter()
        .take(sizes)
        {
            // The rest of a chunk-sized probe stays zero.
            let mut p = [0u8; PROBE_LEN];
            p[..8].copy_from_slice(&magic);
            p[8..12].copy_from_slice(&s.rank.to_be_bytes());
            p[12..14].copy_from_slice(&(lane as u16).to_be_bytes());
            p[14..16].copy_from_slice(&round.to_be_bytes());
            out.write_at(offset as u64, &p);
            t.post_multicast(&Multicast {
                op: PROBE_TX_OP,
                lane: lane as u16,
                imm: PROBE_IMM,
                chunk: 0,
                offset: offset as u64,
                len: len as u32,
            });
            // Sends the queued batch.
            while t.poll_send_done().is_some() {}
        }
    }
}

/// Reads what lane `lane`'s socket holds; notes every valid probe's sender, by size.
fn listen(s: &ProbeSetup, lane: usize, rx: &mut UdpRx, inbox: &OpBuffer, heard: &mut Heard) {
    let n = s.ranks as usize;
    let full = s.chunk_size as usize;
    while let Some(token) = rx.receive() {
        let m = token.meta();
        if m.imm != PROBE_IMM || (m.len != PROBE_LEN && m.len != full) {
            // Nothing else is sent before every report is in; ignore it.
            let _ = token.consume(&Placement::Drop(DropReason::Stale));
            continue;
        }
        if !token.consume(&Placement::Place {
            op: PROBE_RX_OP,
            offset: 0,
            len: m.len as u32,
        }) {
            continue;
        }
        let Some(p) = inbox.view(0, PROBE_LEN as u64, |v| {
            let mut p = [0u8; PROBE_LEN];
            p.copy_from_slice(v);
            p
        }) else {
            continue;
        };
        let rank = u32::from_be_bytes([p[8], p[9], p[10], p[11]]);
        let on = u16::from_be_bytes([p[12], p[13]]);
        if rank != m.from.0 || usize::from(on) != lane || m.from.index() >= n {
            continue;
        }
        let seen = match &p[..8] {
            x if x == PROBE_MAGIC && m.len == PROBE_LEN => &mut heard.small,
            x if x == FULL_MAGIC && m.len == full => &mut heard.full,
            _ => continue,
        };
        seen[lane * n + m.from.index()] = true;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(rank: u32, ranks: u32, heard_from: &[u32]) -> Report {
        let mut heard = vec![false; ranks as usize];
        for &h in heard_from {
            heard[h as usize] = true;
        }
        Report {
            rank,
            ranks,
            checked: true,
            fallback_tcp: false,
            tcp_threshold: 65536,
            chunk_size: 4096,
            chains: 4,
            interface: Ipv4Addr::new(10, 0, 0, 1 + rank as u8),
            port: 4791,
            groups: vec![Ipv4Addr::new(239, 1, 2, 3)],
            heard_full: heard.clone(),
            heard,
            extra: b"10.0.0.1:5555".to_vec(),
        }
    }

    #[test]
    fn report_round_trips_and_rejects_garbage() {
        let mut r = report(2, 4, &[0, 3]);
        r.fallback_tcp = true;
        r.tcp_threshold = 0x0102_0304_0506_0708;
        r.chunk_size = 0x0A0B_0C0D;
        r.chains = 0x1112_1314;
        r.groups.push(Ipv4Addr::new(239, 9, 9, 9));
        r.heard.extend([true, false, true, true]);
        r.heard_full = r.heard.clone();
        r.heard_full[0] = false;
        r.heard_full[6] = false;
        let b = r.encode();
        assert_eq!(Report::decode(&b), Some(r.clone()));
        for cut in 0..b.len() {
            assert_eq!(Report::decode(&b[..cut]), None, "{cut}");
        }
        let mut long = b.clone();
        long.push(0);
        assert_eq!(Report::decode(&long), None);
        let mut v2 = b;
        v2[1] = 1;
        assert_eq!(Report::decode(&v2), None);
        // The longest report of its job is as long as `max_len` says.
        r.extra = vec![7; usize::from(u16::MAX)];
        assert_eq!(r.encode().len(), Report::max_len(2, 4));
        assert_eq!(Report::decode(&r.encode()), Some(r));
    }

    #[test]
    fn all_heard_is_fine_and_self_is_not_required() {
        let rs: Vec<Report> = (0..3)
            .map(|r| report(r, 3, &[0, 1, 2].map(|x| (x + r + 1) % 3)[..2]))
            .collect();
        assert_eq!(judge(&rs, Duration::from_secs(2)), Ok(None));
    }

    #[test]
    fn a_deaf_rank_is_named_with_what_to_check() {
        // Rank 2 hears nobody and nobody hears rank 2.
        let mut rs = vec![report(0, 3, &[1]), report(1, 3, &[0]), report(2, 3, &[])];
        rs[2].port = 5000;
        let f = judge(&rs, Duration::from_secs(2))
            .expect("settings agree")
            .expect("a failure");
        assert_eq!(f.deaf, vec![2]);
        assert_eq!(f.unheard_by_all, vec![2]);
        assert_eq!(f.unheard.len(), 3);
        let msg = f.to_string();
        for want in [
            "rank 2 heard no multicast from ranks 0, 1 on 239.1.2.3:5000 via 10.0.0.3",
            "rank 0 heard no multicast from rank 2 on 239.1.2.3:4791 via 10.0.0.1",
            "different UDP ports",
            "RINGCAST_IFNAME",
            "querier",
            "firewall dropping UDP port",
            "RINGCAST_FALLBACK=tcp",
        ] {
            assert!(msg.contains(want), "{want:?} not in {msg}");
        }
    }

    /// Rank 1 hears everyone's small probes, but nothing chunk-sized from ranks 0 and 2 (its
    /// switch port has a smaller MTU): the failure says so, names the chunk size and
    /// RINGCAST_CHUNK_SIZE, and not the route, querier and firewall advice of a silent path.
    #[test]
    fn small_probes_heard_without_chunk_sized_ones_are_a_path_mtu() {
        let mut rs: Vec<Report> = (0..3)
            .map(|r| report(r, 3, &[0, 1, 2].map(|x| (x + r + 1) % 3)[..2]))
            .collect();
        rs[1].heard_full = vec![false; 3];
        rs[0].heard_full[1] = false;
        let f = judge(&rs, Duration::from_secs(2))
            .expect("settings agree")
            .expect("a failure");
        assert!(f.unheard.is_empty());
        let who: Vec<(u32, Vec<u32>)> = f
            .too_large
            .iter()
            .map(|u| (u.rank, u.from.clone()))
            .collect();
        assert_eq!(who, vec![(0, vec![1]), (1, vec![0, 2])]);
        let msg = f.to_string();
        for want in [
            "rank 1 heard small multicast but no multicast of the data's size (4152-byte IP \
             packets) from ranks 0, 2 on 239.1.2.3:4791 via 10.0.0.2",
            "smaller MTU",
            "4096 bytes here",
            "RINGCAST_CHUNK_SIZE",
            "RINGCAST_FALLBACK=tcp",
        ] {
            assert!(msg.contains(want), "{want:?} not in {msg}");
        }
        assert!(!msg.contains("querier"), "{msg}");
        // Chunk-sized probes heard too: fine.
        for r in &mut rs {
            r.heard_full = r.heard.clone();
        }
        assert_eq!(judge(&rs, Duration::from_secs(2)), Ok(None));
    }

    /// Chunk-sized probes every round in small jobs; in large ones as often as a
    /// receiver's budget allows, yet four times a window.
    #[test]
    fn chunk_sized_probes_are_spread_in_large_jobs() {
        let w = Duration::from_secs(2);
        assert_eq!(full_every(4, 4096, w), 1);
        assert_eq!(full_every(64, 8192, w), 4);
        assert_eq!(full_every(1024, 4096, w), 25);
        assert_eq!(full_every(1024, 4096, Duration::from_millis(200)), 2);
        assert_eq!(full_every(2, 16, Duration::ZERO), 1);
    }

    #[test]
    fn mismatched_settings_are_refused() {
        let mut rs = vec![report(0, 2, &[1]), report(1, 2, &[0])];
        rs[1].fallback_tcp = true;
        let e = judge(&rs, Duration::ZERO).expect_err("mismatch");
        assert!(e.contains("RINGCAST_FALLBACK"), "{e}");
        let mut rs = vec![report(0, 2, &[1]), report(1, 2, &[0])];
        rs[0].tcp_threshold = 0;
        let e = judge(&rs, Duration::ZERO).expect_err("mismatch");
        assert!(
            e.contains("RINGCAST_TCP_THRESHOLD") && e.contains("65536"),
            "{e}"
        );
        // Chunk sizes from hosts of different MTUs.
        let mut rs = vec![report(0, 2, &[1]), report(1, 2, &[0])];
        rs[1].chunk_size = 1024;
        let e = judge(&rs, Duration::ZERO).expect_err("mismatch");
        assert!(
            e.contains("RINGCAST_CHUNK_SIZE") && e.contains("4096") && e.contains("1024"),
            "{e}"
        );
        // Allgather chains set on one rank only.
        let mut rs = vec![report(0, 2, &[1]), report(1, 2, &[0])];
        rs[1].chains = 2;
        let e = judge(&rs, Duration::ZERO).expect_err("mismatch");
        assert!(
            e.contains("RINGCAST_CHAINS") && e.contains("4 chains") && e.contains("on 2"),
            "{e}"
        );
        // Unchecked reports (the check is off) never fail the multicast verdict.
        let mut rs = vec![report(0, 2, &[]), report(1, 2, &[])];
        rs[0].checked = false;
        assert_eq!(judge(&rs, Duration::ZERO), Ok(None));
    }
}
