//! The simulator's events: small `Copy` values, so the queue never allocates per packet.

/// A multicast packet arriving at a host.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Delivery {
    pub(crate) dst: u32,
    pub(crate) src: u32,
    pub(crate) imm: u32,
    /// What the root's chunk slot held when it was sent (stands for the payload bytes).
    pub(crate) token: u32,
    pub(crate) len: u32,
    pub(crate) lane: u16,
    /// The packet was corrupted in flight (the transport checksum will fail).
    pub(crate) corrupt: bool,
    /// The receiver's copy of the payload will fail (it releases the chunk).
    pub(crate) copy_fails: bool,
}

/// Something that happens at a virtual time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ev {
    /// Every rank starts workload operation `op`.
    Start { op: u32 },
    /// A multicast chunk arrives.
    Chunk(Delivery),
    /// A root's multicast of operation `op` (core sequence number) on `lane` left its NIC.
    SendDone { host: u32, lane: u16, op: u64 },
    /// A control message (slot `msg` of the message store) arrives.
    Control { from: u32, to: u32, msg: u32 },
    /// A read request (slot `read` of the read store) reaches the peer that serves it.
    ReadAtPeer { read: u32 },
    /// A read completes at the reader (successfully or not, as recorded in its slot).
    ReadDone { read: u32 },
    /// A host's timer may be due.
    Timer { host: u32 },
    /// A host crashes.
    Crash { host: u32 },
}

#[cfg(test)]
mod tests {
    /// The queue holds millions of these: a growing one shows up in review.
    #[test]
    fn size_of_event() {
        let sizes = format!(
            "Ev {}\nDelivery {}\n",
            size_of::<super::Ev>(),
            size_of::<super::Delivery>()
        );
        insta::assert_snapshot!(sizes);
    }
}
