//! The report of a small lossy run, as reviewed YAML.

mod common;

use common::*;
use ringcast_loopback_sim::Faults;

#[test]
fn small_lossy_star_report() {
    let f = Faults {
        loss: 2e-2,
        duplicate: 1e-2,
        ..Faults::default()
    };
    let r = run(star(4), bcast(1, 64 << 10), f, 3);
    assert_all_ok(&r);
    insta::assert_yaml_snapshot!(r);
}
