#![allow(missing_docs, clippy::print_stdout)]
use ringcast_loopback_sim::baselines::{self, Baseline, BaselineConfig};
use ringcast_loopback_sim::{Faults, TopologySpec};
fn main() {
    let ft = TopologySpec::FatTree { radix: 32, hosts: 1024 };
    let cases: Vec<(TopologySpec, Baseline, f64)> = vec![
        (ft, Baseline::RingAllgather { len: 64 << 10 }, 0.0),
        (ft, Baseline::Binomial { root: 0, len: 64 << 10, forwarding: baselines::Forwarding::StoreAndForward }, 0.0),
        (TopologySpec::FatTree { radix: 32, hosts: 512 }, Baseline::GoBackNMulticast { root: 0, len: 128 << 20 }, 0.0),
        (TopologySpec::FatTree { radix: 32, hosts: 512 }, Baseline::GoBackNMulticast { root: 0, len: 128 << 20 }, 1e-4),
        (TopologySpec::FatTree { radix: 32, hosts: 512 }, Baseline::Chain { root: 0, len: 128 << 20 }, 1e-4),
    ];
    for (t, a, loss) in cases {
        let mut cfg = BaselineConfig::one(t, a);
        cfg.faults = Faults { loss, ..Faults::default() };
        let w = std::time::Instant::now();
        let r = baselines::run(&cfg).unwrap();
        let r = &r[0];
        println!("{a} loss {loss}: {:.2}s wall, completion {} us, bytes {} levels {:?} lost {} retx {} to {} ctl {}", w.elapsed().as_secs_f64(), r.completion_ns/1000, r.total_link_bytes, r.levels.iter().map(|l| l.bytes).collect::<Vec<_>>(), r.lost, r.retransmissions, r.timeouts, r.control_messages);
    }
}
