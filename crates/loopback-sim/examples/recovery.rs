//! Recovery at scale, ringcast only: `cargo run --release -p ringcast-loopback-sim --example
//! recovery -- <hosts> <bcast|ag> <bytes> <loss>...` on a radix-32 fat tree (seed 1).
//! Prints completion, throughput normalised to the loss-free run, the deepest fetch chain and
//! the bytes the root sent (multicasts and reads it served) over its block.
#![allow(clippy::print_stdout, clippy::print_stderr)]

use ringcast_loopback_sim::{Sim, SimConfig, TopologySpec, Workload};
use std::time::{Duration, Instant};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let hosts: u32 = args.first().and_then(|a| a.parse().ok()).unwrap_or(512);
    let ag = args.get(1).is_some_and(|a| a == "ag");
    let bytes: u64 = args
        .get(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(128 << 20);
    let mut losses: Vec<f64> = args.iter().skip(3).filter_map(|a| a.parse().ok()).collect();
    losses.insert(0, 0.0);
    let spec = TopologySpec::FatTree { radix: 32, hosts };
    let mut clean = None;
    for loss in losses {
        let w = if ag {
            Workload::new().allgather_uniform(
                Duration::ZERO,
                hosts,
                (bytes / u64::from(hosts)).max(1),
            )
        } else {
            Workload::new().broadcast(Duration::ZERO, 0, bytes)
        };
        let mut cfg = SimConfig::new(spec, w);
        cfg.seed = 1;
        cfg.faults.loss = loss;
        let t = Instant::now();
        let r = Sim::new(cfg).expect("config").run();
        let done = r.all_completed() && r.verified;
        if std::env::var_os("SHOW").is_some() {
            for x in &r.per_rank {
                println!(
                    "{} {:?} fetched {} depth {}",
                    x.rank, x.outcomes, x.chunks_fetched, x.max_fetch_depth
                );
            }
        }
        if std::env::var_os("DROPS").is_some() {
            println!("{:?}", r.core);
        }
        let ns = r.ops.first().and_then(|o| o.duration_ns).unwrap_or(0);
        if loss == 0.0 {
            clean = Some(ns);
        }
        let depth = r
            .per_rank
            .iter()
            .map(|x| x.max_fetch_depth)
            .max()
            .unwrap_or(0);
        let block = if ag {
            (bytes / u64::from(hosts)).max(1)
        } else {
            bytes
        };
        let root = r
            .per_rank
            .iter()
            .map(|x| x.bytes_sent + x.bytes_served)
            .max()
            .unwrap_or(0);
        let req: u64 = r.per_rank.iter().map(|x| x.fetch_requests).sum();
        println!(
            "loss {loss:e}: ok {done} completion {:.1} us normalised {:.4} depth {depth} max root sends {:.5}x lost {} fetched {} requests {req} ({:.1}s)",
            ns as f64 / 1000.0,
            clean.map_or(0.0, |c| c as f64 / ns.max(1) as f64),
            root as f64 / block as f64,
            r.fabric.lost,
            r.chunks_fetched,
            t.elapsed().as_secs_f64()
        );
    }
}
