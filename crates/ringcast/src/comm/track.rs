//! Port wrappers that count, per operation, the multicasts and reads the transport still has
//! in flight: a failed operation's buffer is released only once they drained
//! ([`Event::Failed`](ringcast_core::Event::Failed)).

use std::collections::HashMap;

use ringcast_core::lane::Multicast;
use ringcast_core::port::{ControlInput, ControlPort, LaneTxPort, ReadRequest};
use ringcast_core::{OpId, Rank};
use ringcast_transport_rocev2_udp::{TcpControl, UdpTx};

/// Per-operation counts, linear: few operations are in flight at once.
#[derive(Debug, Default)]
struct Counts(Vec<(OpId, u64)>);

impl Counts {
    fn add(&mut self, op: OpId, n: u64) {
        match self.0.iter_mut().find(|(o, _)| *o == op) {
            Some((_, c)) => *c += n,
            None => self.0.push((op, n)),
        }
    }

    fn sub(&mut self, op: OpId, n: u64) {
        if let Some(i) = self.0.iter().position(|(o, _)| *o == op) {
            let c = &mut self.0[i].1;
            *c = c.saturating_sub(n);
            if *c == 0 {
                self.0.swap_remove(i);
            }
        }
    }

    fn get(&self, op: OpId) -> u64 {
        self.0.iter().find(|(o, _)| *o == op).map_or(0, |&(_, c)| c)
    }
}

/// A lane's send half, counting posted multicasts not yet reported sent.
#[derive(Debug)]
pub(crate) struct TrackedTx {
    pub(crate) inner: UdpTx,
    posted: Counts,
}

impl TrackedTx {
    pub(crate) fn new(inner: UdpTx) -> Self {
        TrackedTx {
            inner,
            posted: Counts::default(),
        }
    }

    // The threaded engine hands the inner port to the lane's send worker (which drops a
    // failed operation's queued multicasts itself); kept for a single-threaded driver.
    #[allow(dead_code)]
    pub(crate) fn in_flight(&self, op: OpId) -> u64 {
        self.posted.get(op)
    }
}

impl LaneTxPort for TrackedTx {
    fn post_multicast(&mut self, m: &Multicast) {
        self.posted.add(m.op, 1);
        self.inner.post_multicast(m);
    }

    fn poll_send_done(&mut self) -> Option<(OpId, u32)> {
        let (op, n) = self.inner.poll_send_done()?;
        self.posted.sub(op, u64::from(n));
        Some((op, n))
    }
}

/// The control path, counting reads not yet completed.
#[derive(Debug)]
pub(crate) struct TrackedControl {
    pub(crate) inner: TcpControl,
    reads: HashMap<u64, OpId>,
    per_op: Counts,
}

impl TrackedControl {
    pub(crate) fn new(inner: TcpControl) -> Self {
        TrackedControl {
            inner,
            reads: HashMap::new(),
            per_op: Counts::default(),
        }
    }

    pub(crate) fn in_flight(&self, op: OpId) -> u64 {
        self.per_op.get(op)
    }
}

impl ControlPort for TrackedControl {
    fn send_control(&mut self, to: Rank, bytes: &[u8]) {
        self.inner.send_control(to, bytes);
    }

    fn read(&mut self, req: &ReadRequest) {
        if self.reads.insert(req.id.0, req.op).is_none() {
            self.per_op.add(req.op, 1);
        }
        self.inner.read(req);
    }

    fn poll_control(&mut self, buf: &mut Vec<u8>) -> Option<ControlInput> {
        let input = self.inner.poll_control(buf)?;
        if let ControlInput::ReadDone { id, .. } = input
            && let Some(op) = self.reads.remove(&id.0)
        {
            self.per_op.sub(op, 1);
        }
        Some(input)
    }
}
