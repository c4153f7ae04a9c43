//! `ringcast sim bcast|allgather`: build a simulation from the flags, run it with a progress
//! bar, print the report.

use crate::CmdError;
use crate::args::{AllgatherArgs, BcastArgs, SimArgs, Topology};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use ringcast::core::Limits;
use ringcast::sim::{
    Crash, Faults, GilbertElliott, Reorder, RxSlots, Sim, SimConfig, TopologySpec, Workload,
};
use std::io::{BufWriter, IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

/// Events between progress-bar updates.
const STEP: u64 = 1 << 18;

/// Most multicast lanes: each is a multicast tree per root and receive state per rank.
const MAX_LANES: u16 = 256;
/// Most ranks one simulation holds: every rank's session lives in this process, and each
/// keeps state per peer (and per lane), so memory grows as the square of the ranks: about
/// 8 GB at 8 192 with one lane (see [`sim_memory`]), some 530 GB at the core's 65 536.
const MAX_SIM_RANKS: u32 = 8192;

/// Bytes a simulation of `ranks` ranks on `lanes` lanes holds, about: per pair of ranks, 50
/// bytes and 73 per lane (measured with `/usr/bin/time` on 4 KiB Broadcasts: 8.25 GB at
/// 8 192 ranks and one lane, 1.26 GB at 1 024 and 16 lanes, 19.2 GB at 1 024 and 256).
fn sim_memory(ranks: u32, lanes: u16) -> u128 {
    u128::from(ranks).pow(2) * (50 + 73 * u128::from(lanes))
}

/// The fabric the flags describe.
fn topology(a: &SimArgs) -> Result<TopologySpec, String> {
    Ok(match a.topology {
        Topology::Star => TopologySpec::Star { hosts: a.ranks },
        Topology::LeafSpine => {
            if a.hosts_per_leaf == 0 || a.spines == 0 {
                return Err("--hosts-per-leaf and --spines must be at least 1".into());
            }
            let most = TopologySpec::MAX_HOSTS;
            for (flag, n) in [
                ("--hosts-per-leaf", a.hosts_per_leaf),
                ("--spines", a.spines),
            ] {
                if n > most {
                    return Err(format!("{flag} {n} is more than {most}"));
                }
            }
            let leaves = a.ranks.div_ceil(a.hosts_per_leaf);
            let cables = u64::from(leaves) * u64::from(a.spines);
            if cables > TopologySpec::MAX_SWITCH_CABLES {
                return Err(format!(
                    "--spines {} x {leaves} leaves (--ranks / --hosts-per-leaf) is {cables} \
                     leaf-spine cables, more than {}; use fewer --spines",
                    a.spines,
                    TopologySpec::MAX_SWITCH_CABLES
                ));
            }
            TopologySpec::LeafSpine {
                hosts: a.ranks,
                hosts_per_leaf: a.hosts_per_leaf,
                spines: a.spines,
            }
        }
        Topology::FatTree => {
            let most = TopologySpec::MAX_RADIX;
            if !(2..=most).contains(&a.radix) || !a.radix.is_multiple_of(2) {
                return Err(format!(
                    "--radix {} must be even, at least 2 and at most {most}",
                    a.radix
                ));
            }
            // At most 1024^3 / 4: no overflow.
            let cap = u64::from(a.radix).pow(3) / 4;
            if u64::from(a.ranks) > cap {
                return Err(format!(
                    "--ranks {} is more than --radix {} seats (radix^3/4 = {cap})",
                    a.ranks, a.radix
                ));
            }
            TopologySpec::FatTree {
                radix: a.radix,
                hosts: a.ranks,
            }
        }
        Topology::Testbed => TopologySpec::testbed(),
    })
}

/// The ranks the flags describe (the testbed fixes them).
pub(crate) fn ranks(a: &SimArgs) -> u32 {
    match a.topology {
        Topology::Testbed => TopologySpec::testbed().hosts(),
        _ => a.ranks,
    }
}

/// The ranks the flags describe, or what is wrong with them: checked before anything is
/// allocated per rank.
fn checked_ranks(a: &SimArgs) -> Result<u32, String> {
    let ranks = ranks(a);
    let most = Limits::default().max_ranks.min(MAX_SIM_RANKS);
    if ranks == 0 {
        return Err("--ranks must be at least 1".into());
    }
    if ranks > most {
        return Err(format!(
            "--ranks {ranks} is more than {most}, the most ranks one simulation holds in \
             memory (every rank's state grows with the number of ranks)"
        ));
    }
    Ok(ranks)
}

/// The simulation the common flags describe, running `workload`, or what is wrong with them.
/// `buffer` is the largest operation buffer in bytes.
fn config(a: &SimArgs, workload: Workload, buffer: u64) -> Result<SimConfig, String> {
    let ranks = checked_ranks(a)?;
    let chunk = u32::try_from(a.chunk)
        .ok()
        .filter(|c| *c > 0)
        .ok_or("--chunk must be between 1 B and 4 294 967 295 B (4 GiB less one byte)")?;
    if buffer.div_ceil(a.chunk) > 1 << 22 {
        return Err(format!(
            "a buffer of {buffer} B in --chunk {} is more than 4Mi chunks; use a larger --chunk",
            a.chunk
        ));
    }
    if let Some((r, _)) = a.crash.iter().find(|(r, _)| *r >= ranks) {
        return Err(format!(
            "--crash {r}@...: rank {r} is not below --ranks {ranks}"
        ));
    }
    if a.lanes == 0 || a.window == 0 || a.chains == 0 {
        return Err("--lanes, --window and --chains must be at least 1".into());
    }
    if a.lanes > MAX_LANES {
        return Err(format!("--lanes {} is more than {MAX_LANES}", a.lanes));
    }
    let need = sim_memory(ranks, a.lanes);
    if let Some(available) = crate::local::mem_available()
        && need > u128::from(available)
    {
        return Err(format!(
            "--ranks {ranks} on --lanes {}: the simulation would hold about {} MiB, more than \
             the {} MiB this host has available; use fewer ranks or lanes",
            a.lanes,
            need >> 20,
            available >> 20
        ));
    }
    if a.peer_timeout.is_zero() {
        return Err("--peer-timeout must be positive".into());
    }
    // A peer that cannot answer within the peer timeout, however well the run goes, would be
    // reported unresponsive: a configuration error, not a fault to simulate.
    let chunk_time = Duration::from_secs_f64(a.chunk as f64 / a.bandwidth.max(1) as f64);
    let round_trip = a.latency.saturating_mul(2);
    if chunk_time >= a.peer_timeout || round_trip >= a.peer_timeout {
        return Err(format!(
            "--peer-timeout {:?} is too short for this fabric: a chunk takes {chunk_time:?} to \
             send at --bandwidth, a round trip over one link {round_trip:?} (--latency); \
             every rank would be reported unresponsive. Raise --peer-timeout well above both",
            a.peer_timeout
        ));
    }
    if a.rx_slots.is_some_and(|(_, d)| d.is_zero()) {
        return Err("--rx-slots service time must be positive".into());
    }
    let mut cfg = SimConfig::new(topology(a)?, workload);
    cfg.seed = a.seed;
    cfg.bandwidth = a.bandwidth;
    cfg.latency = a.latency;
    cfg.chunk_size = chunk;
    cfg.lanes = a.lanes;
    cfg.chains = a.chains;
    cfg.send_window = a.window;
    cfg.peer_timeout = a.peer_timeout;
    cfg.read_timeout = a.peer_timeout;
    cfg.time_limit = a.time_limit;
    cfg.faults = Faults {
        loss: a.loss,
        burst: a.burst.map(|(enter_bad, exit_bad)| GilbertElliott {
            enter_bad,
            exit_bad,
        }),
        duplicate: a.dup,
        reorder: a.reorder.map(|(probability, max_delay)| Reorder {
            probability,
            max_delay,
        }),
        corrupt_payload: a.corrupt,
        corrupt_imm: a.corrupt_imm,
        corrupt_escaping: a.corrupt_escaping,
        copy_fail: a.copy_fail,
        rx_slots: a
            .rx_slots
            .map(|(slots, service)| RxSlots { slots, service }),
        crashes: a
            .crash
            .iter()
            .map(|&(rank, at)| Crash { rank, at })
            .collect(),
        // No flag for link outages yet: the property tests and campaigns set them.
        links_down: Vec::new(),
    };
    if a.time_limit > ringcast_loopback_sim::MAX_TIME_LIMIT {
        return Err(format!(
            "--time-limit {:?} is past the simulator's clock, which ends after {:?} (about 53 \
             days) of virtual time",
            a.time_limit,
            ringcast_loopback_sim::MAX_TIME_LIMIT
        ));
    }
    // The core's bounds, named by the flags they come from (it would name its own fields).
    let week = ringcast_core::MAX_TIMEOUT;
    if a.peer_timeout > week {
        return Err(format!(
            "--peer-timeout {:?} is more than a week",
            a.peer_timeout
        ));
    }
    if cfg.effective_cutoff_alpha() > week {
        return Err(format!(
            "--latency {:?}: the cutoff slack it sets (32 x the latency and more) would be \
             more than a week",
            a.latency
        ));
    }
    Ok(cfg)
}

/// Runs `ringcast sim bcast`.
pub(crate) fn bcast(a: &BcastArgs) -> Result<ExitCode, CmdError> {
    let ranks = checked_ranks(&a.sim)?;
    // Every root broadcasts at once, and a rank has a bounded number in flight.
    let most = Limits::default().max_inflight_ops;
    if a.root.len() > most as usize {
        return Err(format!(
            "--root names {} roots; at most {most} broadcasts may run at once",
            a.root.len()
        )
        .into());
    }
    if let Some(r) = a.root.iter().find(|r| **r >= ranks) {
        return Err(format!("--root {r} is not below --ranks {ranks}").into());
    }
    let workload = a.root.iter().fold(Workload::new(), |w, root| {
        w.broadcast(Duration::ZERO, *root, a.size)
    });
    run(&a.sim, config(&a.sim, workload, a.size)?)
}

/// Runs `ringcast sim allgather`.
pub(crate) fn allgather(a: &AllgatherArgs) -> Result<ExitCode, CmdError> {
    let ranks = checked_ranks(&a.sim)?;
    let sizes = match &a.sizes {
        Some(s) if s.len() != ranks as usize => {
            return Err(format!(
                "--sizes has {} entries; expected one per rank ({ranks})",
                s.len()
            )
            .into());
        }
        Some(s) => s.clone(),
        None => vec![a.size; ranks as usize],
    };
    let total = sizes
        .iter()
        .try_fold(0u64, |t, s| t.checked_add(*s))
        .ok_or("--sizes add up to more than 2^64 bytes")?;
    let workload = Workload::new().allgather(Duration::ZERO, &sizes);
    run(&a.sim, config(&a.sim, workload, total)?)
}

fn progress_bar(hidden: bool, total: u64) -> ProgressBar {
    let target = if hidden || !std::io::stderr().is_terminal() {
        ProgressDrawTarget::hidden()
    } else {
        ProgressDrawTarget::stderr()
    };
    let bar = ProgressBar::with_draw_target(Some(total), target);
    if let Ok(style) = ProgressStyle::with_template(
        "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} chunk deliveries ({per_sec}) {msg}",
    ) {
        bar.set_style(style);
    }
    bar
}

/// Runs a simulation with a progress bar and prints its report. Exit status 0: verified and
/// every rank completed; 1: the run finished but some rank failed, hung or holds wrong data.
fn run(a: &SimArgs, cfg: SimConfig) -> Result<ExitCode, CmdError> {
    let mut sim = Sim::new(cfg).map_err(|e| e.to_string())?;
    let bar = progress_bar(a.json, sim.progress().expected_deliveries);
    while !sim.run_for(STEP) {
        let p = sim.progress();
        bar.set_position(p.deliveries.min(p.expected_deliveries));
        bar.set_message(format!("virtual {:?}", p.now));
    }
    bar.finish_and_clear();
    let report = sim.report();
    let mut out = BufWriter::new(std::io::stdout().lock());
    let written = if a.json {
        // serde_json hands an I/O error back unchanged, so a closed pipe stays one.
        serde_json::to_writer_pretty(&mut out, &report)
            .map_err(std::io::Error::from)
            .and_then(|()| writeln!(out))
    } else {
        write!(out, "{report}")
    };
    written
        .and_then(|()| out.flush())
        .map_err(CmdError::Output)?;
    Ok(if report.all_completed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
