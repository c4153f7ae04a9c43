//! A simulated host: one rank's real core node (session and lanes) behind a mailbox port, its buffers as held-chunk bits, its posted
//! receives, its timer, and its counters.

use crate::faults::RxSlots;
use crate::held::Held;
use crate::queue::Ps;
use crate::report::Outcome;
use ringcast_core::Node;
use ringcast_core::port::mailbox::{Mailbox, mailbox};

/// Posted receives, reposted at a service rate.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RxQueue {
    posted: u32,
    cap: u32,
    service: Ps,
    /// Time from which the next repost is counted.
    anchor: Ps,
}

impl RxQueue {
    pub(crate) fn new(s: RxSlots) -> Self {
        let service = u64::try_from(s.service.as_nanos())
            .unwrap_or(u64::MAX / 1_000)
            .saturating_mul(1_000)
            .max(1);
        RxQueue {
            posted: s.slots,
            cap: s.slots,
            service,
            anchor: 0,
        }
    }

    /// Consumes a posted receive at `now`; `false` if none is posted (an RNR drop).
    pub(crate) fn take(&mut self, now: Ps) -> bool {
        if self.posted < self.cap {
            let k = (now.saturating_sub(self.anchor)) / self.service;
            let k32 = u32::try_from(k).unwrap_or(u32::MAX);
            self.posted = self.posted.saturating_add(k32).min(self.cap);
            self.anchor += k.saturating_mul(self.service);
        }
        if self.posted == 0 {
            return false;
        }
        if self.posted == self.cap {
            self.anchor = now; // reposting starts with the first consumed receive
        }
        self.posted -= 1;
        true
    }
}

/// Per-operation state at one host.
#[derive(Debug)]
pub(crate) struct HostOp {
    /// Which chunk slots hold their owner's data; dropped once verified.
    pub(crate) buf: Option<Held>,
    pub(crate) outcome: Outcome,
}

/// One rank.
#[derive(Debug)]
pub(crate) struct Host {
    pub(crate) node: Node,
    /// The node's port: chunks carry (token, source) as their payload.
    pub(crate) port: Mailbox<(u32, u32)>,
    pub(crate) alive: bool,
    /// The timer event scheduled, if any.
    pub(crate) timer_at: Option<Ps>,
    pub(crate) rx: Option<RxQueue>,
    /// Workload index of each core sequence number this host started.
    pub(crate) op_of_seq: Vec<u32>,
    /// Per workload operation.
    pub(crate) ops: Vec<HostOp>,
    pub(crate) bytes_sent: u64,
    pub(crate) bytes_received: u64,
    pub(crate) bytes_read: u64,
    pub(crate) bytes_served: u64,
}

impl Host {
    pub(crate) fn new(node: Node, rx: Option<RxSlots>, ops: usize) -> Self {
        let port = mailbox(node.config().lanes);
        Host {
            node,
            port,
            alive: true,
            timer_at: None,
            rx: rx.map(RxQueue::new),
            op_of_seq: Vec::new(),
            ops: (0..ops)
                .map(|_| HostOp {
                    buf: None,
                    outcome: Outcome::NotStarted,
                })
                .collect(),
            bytes_sent: 0,
            bytes_received: 0,
            bytes_read: 0,
            bytes_served: 0,
        }
    }

    /// The workload index of core sequence number `seq`.
    #[inline]
    pub(crate) fn op_index(&self, seq: u64) -> Option<usize> {
        let i = usize::try_from(seq).ok()?;
        self.op_of_seq.get(i).map(|w| *w as usize)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rx_slots_run_out_and_refill() {
        let mut rx = RxQueue::new(RxSlots {
            slots: 2,
            service: Duration::from_nanos(10),
        });
        assert!(rx.take(0));
        assert!(rx.take(1_000));
        assert!(!rx.take(2_000)); // none posted
        assert!(rx.take(10_000)); // one reposted 10 ns after the first take
        assert!(!rx.take(10_500));
        assert!(rx.take(30_000));
        assert!(rx.take(30_000));
        assert!(!rx.take(30_000));
    }
}
