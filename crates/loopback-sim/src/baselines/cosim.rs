//! Baselines and ringcast on one fabric at once: a [`Sim`] (real core sessions) and the
//! baseline engine share the links, so their packets queue behind each other on every link,
//! host NICs included.
//!
//! The two event loops run in lockstep: the `Sim` handles one event, then the engine handles
//! all of its events up to that time, with the `Sim`'s links swapped in. The interleaving is
//! exact except that a `Sim` event may be handled before engine events a little earlier than
//! it (at most the gap to the previous `Sim` event): both use reservation-based links
//! (`free_at`), so that only changes which of two packets wanting one link first goes first.

use super::{BaselineConfig, BaselineOp, BaselineReport, reports};
use crate::config::{SimConfig, SimError};
use crate::report::Report;
use crate::sim::Sim;

/// Runs `sim` (ringcast) and the baseline `ops` together on one fabric (the `Sim`'s topology,
/// links, seed and faults); returns the `Sim`'s report (its link and level byte counters
/// include the baselines' traffic) and one report per baseline operation.
pub fn run_with_sim(
    sim: SimConfig,
    ops: Vec<BaselineOp>,
) -> Result<(Report, Vec<BaselineReport>), SimError> {
    let cfg = BaselineConfig::like(&sim, ops);
    let (mut engine, names) = cfg.engine()?;
    let mut sim = Sim::new(sim)?;
    let mut sim_done = false;
    loop {
        let until = if sim_done {
            u64::MAX
        } else {
            sim_done = sim.run_for(1);
            sim.now
        };
        engine.swap_links(&mut sim.fabric.links);
        engine.run_until(until);
        engine.swap_links(&mut sim.fabric.links);
        if sim_done && engine.peek().is_none() {
            break;
        }
    }
    let baselines = reports(&engine, names);
    Ok((sim.report(), baselines))
}
