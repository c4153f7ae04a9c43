//! Ports for a job on one host, picked before its ranks start.

use std::io;
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};

/// Where [`free_local_port`] starts looking: above the ports services commonly listen on.
pub const LOCAL_PORTS_FROM: u16 = 20_000;

/// Tries before [`free_local_port`] settles for a port of the kernel's choice.
const TRIES: usize = 64;

/// A protocol's port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PortKind {
    /// A TCP port (a rendezvous, say: `RINGCAST_BOOTSTRAP=127.0.0.1:PORT`).
    Tcp,
    /// A UDP port (the multicast data's, [`crate::comm::CommBuilder::udp_port`]).
    Udp,
}

/// A port free now on 127.0.0.1, for ranks on this host that bind it a moment later: rank 0
/// its rendezvous, or every rank the multicast data. Taken at random between
/// [`LOCAL_PORTS_FROM`] and the kernel's ephemeral range (`ip_local_port_range`), from which
/// the kernel gives ports to outgoing connections and unbound sockets: a port of that range,
/// found free and let go, could be given to any of them before the rank binds it (a test run
/// beside another once lost its rendezvous port so). Below it only an explicit bind takes a
/// port, and concurrent jobs keep apart by chance. A port of the kernel's choice when none
/// there is free; the error of that bind if even that fails.
pub fn free_local_port(kind: PortKind) -> io::Result<u16> {
    let bindable = |port: u16| {
        let at = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        match kind {
            PortKind::Udp => UdpSocket::bind(at).and_then(|s| s.local_addr()),
            PortKind::Tcp => TcpListener::bind(at).and_then(|s| s.local_addr()),
        }
    };
    let first_ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let end = first_ephemeral.max(LOCAL_PORTS_FROM + 1);
    let span = u64::from(end - LOCAL_PORTS_FROM);
    // Without entropy the walk starts at the process id: still apart from most other runs.
    let mut rng = ringcast_core::port::SplitMix64::new(
        getrandom::u64().unwrap_or(u64::from(std::process::id())),
    );
    for _ in 0..TRIES {
        // Below `span` (at most 2^16), so it fits.
        let port = LOCAL_PORTS_FROM + rng.below(span) as u16;
        if bindable(port).is_ok() {
            return Ok(port);
        }
    }
    bindable(0).map(|a| a.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_ports_are_free_and_below_the_ephemeral_range() {
        let first_ephemeral = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok());
        for kind in [PortKind::Tcp, PortKind::Udp] {
            let port = free_local_port(kind).expect("a free port");
            if let Some(first) = first_ephemeral.filter(|&f| f > LOCAL_PORTS_FROM + 64) {
                assert!((LOCAL_PORTS_FROM..first).contains(&port), "{port}");
            }
            match kind {
                PortKind::Udp => drop(UdpSocket::bind(("127.0.0.1", port)).expect("still free")),
                PortKind::Tcp => drop(TcpListener::bind(("127.0.0.1", port)).expect("still free")),
            }
        }
    }
}
