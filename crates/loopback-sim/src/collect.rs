//! Builds the [`Report`] from the state of a run.

use crate::queue::PS_PER_NS;
use crate::report::{CoreDrops, LevelReport, LinkReport, OpReport, Outcome, RankReport, Report};
use crate::sim::Sim;

impl Sim {
    /// The report of the run so far (final once [`Sim::run_for`] returned `true`).
    pub fn report(&self) -> Report {
        let per_rank: Vec<RankReport> = self
            .hosts
            .iter()
            .enumerate()
            .map(|(r, h)| {
                let s = h.node.stats();
                RankReport {
                    rank: r as u32,
                    crashed: !h.alive,
                    outcomes: h
                        .ops
                        .iter()
                        .map(|o| match &o.outcome {
                            Outcome::NotStarted | Outcome::Pending if !h.alive => Outcome::Crashed,
                            other => other.clone(),
                        })
                        .collect(),
                    bytes_sent: h.bytes_sent,
                    bytes_received: h.bytes_received,
                    bytes_read: h.bytes_read,
                    bytes_served: h.bytes_served,
                    chunks_fetched: s.chunks_fetched,
                    fetch_requests: s.fetch_requests,
                    max_fetch_depth: s.max_fetch_depth,
                }
            })
            .collect();
        let ops: Vec<OpReport> = self
            .ops
            .iter()
            .enumerate()
            .map(|(w, o)| {
                let start_ns = u64::try_from(o.start.as_nanos()).unwrap_or(u64::MAX);
                let mut r = OpReport {
                    kind: o.kind.clone(),
                    start_ns,
                    completed: 0,
                    failed: 0,
                    crashed: 0,
                    unfinished: 0,
                    corrupted: 0,
                    duration_ns: None,
                };
                for rank in &per_rank {
                    match &rank.outcomes[w] {
                        Outcome::Completed { at_ns, mismatches } => {
                            if *mismatches == 0 {
                                r.completed += 1;
                            } else {
                                r.corrupted += 1;
                            }
                            let d = at_ns.saturating_sub(start_ns);
                            r.duration_ns = Some(r.duration_ns.map_or(d, |m| m.max(d)));
                        }
                        Outcome::Failed { .. } | Outcome::Rejected { .. } => r.failed += 1,
                        Outcome::Crashed => r.crashed += 1,
                        _ => r.unfinished += 1,
                    }
                }
                r
            })
            .collect();
        let mut core = CoreDrops::default();
        for h in &self.hosts {
            core.add(&h.node.stats());
        }
        let topo = &self.fabric.topo;
        let mut levels: Vec<LevelReport> = (0..topo.levels())
            .map(|level| LevelReport {
                level,
                name: topo.level_name(level).to_owned(),
                links: 0,
                up_bytes: 0,
                down_bytes: 0,
                busiest: 0,
                lost: 0,
            })
            .collect();
        for (e, l) in topo.edges.iter().zip(&self.fabric.links) {
            if let Some(v) = levels.get_mut(usize::from(e.level)) {
                v.links += 1;
                if e.up {
                    v.up_bytes += l.bytes;
                } else {
                    v.down_bytes += l.bytes;
                }
                v.busiest = v.busiest.max(l.bytes);
                v.lost += l.lost;
            }
        }
        let links = topo
            .edges
            .iter()
            .zip(&self.fabric.links)
            .map(|(e, l)| LinkReport {
                from: topo.name(e.from).to_owned(),
                to: topo.name(e.to).to_owned(),
                level: e.level,
                up: e.up,
                bytes: l.bytes,
                packets: l.packets,
                lost: l.lost,
            })
            .collect();
        let all_finished = per_rank
            .iter()
            .all(|r| r.outcomes.iter().all(Outcome::is_final));
        let makespan_ns = per_rank
            .iter()
            .flat_map(|r| &r.outcomes)
            .filter_map(|o| match o {
                Outcome::Completed { at_ns, .. } | Outcome::Failed { at_ns, .. } => Some(*at_ns),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        Report {
            makespan_ns,
            seed: self.cfg.seed,
            topology: self.cfg.topology.to_string(),
            ranks: self.hosts.len() as u32,
            verified: self.mismatches == 0 && self.reads_after_release == 0,
            mismatches: self.mismatches,
            reads_after_release: self.reads_after_release,
            all_finished,
            truncated: self.truncated,
            end_ns: self.now / PS_PER_NS,
            events: self.events,
            deliveries: self.deliveries,
            chunks_fetched: per_rank.iter().map(|r| r.chunks_fetched).sum(),
            max_fetch_depth: per_rank
                .iter()
                .map(|r| r.max_fetch_depth)
                .max()
                .unwrap_or(0),
            ops,
            per_rank,
            fabric: self.fabric.counters,
            core,
            link_bytes: levels.iter().map(LevelReport::bytes).sum(),
            levels,
            links,
        }
    }
}
