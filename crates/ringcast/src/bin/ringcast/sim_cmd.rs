//! `ringcast sim bcast`: build a simulation from the flags, run it with a progress bar, print.

use crate::args::{BcastArgs, ImmBitsArg, Topology};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use ringcast::sim::{
    Crash, Faults, GilbertElliott, ImmBits, Reorder, RxSlots, Sim, SimConfig, TopologySpec,
    Workload,
};
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

/// Events between progress-bar updates.
const STEP: u64 = 1 << 18;

/// The simulation the flags describe, or what is wrong with them.
fn config(a: &BcastArgs) -> Result<SimConfig, String> {
    if a.ranks == 0 {
        return Err("--ranks must be at least 1".into());
    }
    let chunk = u32::try_from(a.chunk)
        .ok()
        .filter(|c| *c > 0)
        .ok_or("--chunk must be between 1 B and 4 GiB")?;
    if a.size.div_ceil(a.chunk) > 1 << 22 {
        return Err(format!(
            "--size {} in --chunk {} is more than 4Mi chunks; use a larger --chunk",
            a.size, a.chunk
        ));
    }
    if let Some(r) = a.root.iter().find(|r| **r >= a.ranks) {
        return Err(format!("--root {r} is not below --ranks {}", a.ranks));
    }
    if let Some((r, _)) = a.crash.iter().find(|(r, _)| *r >= a.ranks) {
        return Err(format!(
            "--crash {r}@...: rank {r} is not below --ranks {}",
            a.ranks
        ));
    }
    if a.lanes == 0 || a.window == 0 {
        return Err("--lanes and --window must be at least 1".into());
    }
    if a.topology == Topology::LeafSpine && (a.hosts_per_leaf == 0 || a.spines == 0) {
        return Err("--hosts-per-leaf and --spines must be at least 1".into());
    }
    if a.rx_slots.is_some_and(|(_, d)| d.is_zero()) {
        return Err("--rx-slots service time must be positive".into());
    }
    let topology = match a.topology {
        Topology::Star => TopologySpec::Star { hosts: a.ranks },
        Topology::LeafSpine => TopologySpec::LeafSpine {
            hosts: a.ranks,
            hosts_per_leaf: a.hosts_per_leaf,
            spines: a.spines,
        },
    };
    let workload = a.root.iter().fold(Workload::new(), |w, root| {
        w.broadcast(Duration::ZERO, *root, a.size)
    });
    let mut cfg = SimConfig::new(topology, workload);
    cfg.seed = a.seed;
    cfg.bandwidth = a.bandwidth;
    cfg.latency = a.latency;
    cfg.chunk_size = chunk;
    cfg.lanes = a.lanes;
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
        corrupt_imm_bits: match a.corrupt_imm_bits {
            ImmBitsArg::Any => ImmBits::Any,
            ImmBitsArg::OpTag => ImmBits::OpTag,
            ImmBitsArg::Chunk => ImmBits::Chunk,
        },
        rx_slots: a
            .rx_slots
            .map(|(slots, service)| RxSlots { slots, service }),
        crashes: a
            .crash
            .iter()
            .map(|&(rank, at)| Crash { rank, at })
            .collect(),
    };
    Ok(cfg)
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

/// Runs the broadcast simulation. Exit status 0: verified and every rank completed; 1: the
/// run finished but some rank failed, hung or holds wrong data.
pub(crate) fn bcast(a: &BcastArgs) -> Result<ExitCode, String> {
    let cfg = config(a)?;
    let mut sim = Sim::new(cfg).map_err(|e| e.to_string())?;
    let bar = progress_bar(a.json, sim.progress().expected_deliveries);
    while !sim.run_for(STEP) {
        let p = sim.progress();
        bar.set_position(p.deliveries.min(p.expected_deliveries));
        bar.set_message(format!("virtual {:?}", p.now));
    }
    bar.finish_and_clear();
    let report = sim.report();
    let mut out = std::io::stdout().lock();
    let written = if a.json {
        serde_json::to_writer_pretty(&mut out, &report)
            .map_err(|e| e.to_string())
            .and_then(|()| writeln!(out).map_err(|e| e.to_string()))
    } else {
        write!(out, "{report}").map_err(|e| e.to_string())
    };
    written.map_err(|e| format!("writing the report: {e}"))?;
    Ok(if report.all_completed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
