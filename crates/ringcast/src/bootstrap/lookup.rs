//! Host name lookups bounded by the rendezvous timeout.
//!
//! The system resolver (`getaddrinfo`, behind [`ToSocketAddrs`]) has no timeout of its own: on
//! a broken resolver it can block for minutes, far past `RINGCAST_BOOTSTRAP_TIMEOUT`. So a
//! name is looked up on a helper thread while the caller waits on a channel for the time it
//! has; an IP address needs no lookup and no thread.

use super::env::RendezvousAddr;
use std::io;
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::sync::mpsc;
use std::time::Duration;

/// The rendezvous host's name did not resolve within the rendezvous timeout.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "looking up the rendezvous host {host:?} (from {origin}) got no answer within {:.1} s; check \
     this host's resolver, or name rank 0's host by its IP address (RINGCAST_BOOTSTRAP=ip:port, \
     or MASTER_ADDR under torchrun)",
    waited.as_secs_f64()
)]
pub struct LookupTimeout {
    /// The host name.
    pub host: String,
    /// The variables it came from.
    pub origin: &'static str,
    /// How long the lookup was given.
    pub waited: Duration,
}

/// Why a lookup gave no addresses.
#[derive(Debug)]
pub(super) enum LookupError {
    /// The resolver answered with an error.
    Failed(io::Error),
    /// It did not answer in time.
    TimedOut(LookupTimeout),
}

/// `addr`'s socket addresses, waiting at most `within` for the system resolver.
pub(super) fn lookup(
    addr: &RendezvousAddr,
    within: Duration,
) -> Result<Vec<SocketAddr>, LookupError> {
    if let Ok(ip) = addr.host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, addr.port)]);
    }
    lookup_with(addr, within, |host, port| {
        (host.as_str(), port)
            .to_socket_addrs()
            .map(Iterator::collect)
    })
}

/// [`lookup`] with the resolver `resolve` (tests inject a slow one): runs it on a helper
/// thread and waits at most `within` for its answer.
pub(super) fn lookup_with<F>(
    addr: &RendezvousAddr,
    within: Duration,
    resolve: F,
) -> Result<Vec<SocketAddr>, LookupError>
where
    F: FnOnce(String, u16) -> io::Result<Vec<SocketAddr>> + Send + 'static,
{
    let (tx, rx) = mpsc::sync_channel(1);
    let (host, port) = (addr.host.clone(), addr.port);
    std::thread::Builder::new()
        .name("ringcast-lookup".into())
        .spawn(move || {
            // The caller may have stopped waiting: then nobody hears the answer.
            let _ = tx.send(resolve(host, port));
        })
        .map_err(LookupError::Failed)?;
    match rx.recv_timeout(within) {
        Ok(answer) => answer.map_err(LookupError::Failed),
        // A blocked getaddrinfo cannot be cancelled: the thread is left to finish on its own
        // (it holds nothing but its answer, which it drops once it sees nobody waits).
        Err(mpsc::RecvTimeoutError::Timeout) => Err(LookupError::TimedOut(LookupTimeout {
            host: addr.host.clone(),
            origin: addr.origin,
            waited: within,
        })),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(LookupError::Failed(io::Error::other(
            "the lookup thread ended without an answer",
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    fn at(host: &str) -> RendezvousAddr {
        RendezvousAddr {
            host: host.to_owned(),
            port: 29500,
            origin: "RINGCAST_BOOTSTRAP",
        }
    }

    /// A name the system resolves at once still resolves, an address needs no lookup, and a
    /// resolver's own error comes back as it.
    #[test]
    fn names_and_addresses_resolve_within_the_timeout() {
        let generous = Duration::from_secs(30);
        let local = lookup(&at("localhost"), generous).expect("localhost resolves");
        assert!(
            local
                .iter()
                .all(|a| a.ip().is_loopback() && a.port() == 29500)
        );
        assert!(!local.is_empty());
        let ip = lookup(&at("10.1.2.3"), Duration::ZERO).expect("no lookup");
        assert_eq!(ip, [SocketAddr::from((Ipv4Addr::new(10, 1, 2, 3), 29500))]);
        let refused = lookup_with(&at("node0"), generous, |_, _| {
            Err(io::Error::other("no such host"))
        });
        assert!(
            matches!(refused, Err(LookupError::Failed(_))),
            "{refused:?}"
        );
    }

    /// A resolver that hangs costs the caller its timeout, not the resolver's: the error names
    /// the host, where it came from and what to set.
    #[test]
    fn a_resolver_that_hangs_is_given_up_on() {
        let (release, hung) = mpsc::channel::<()>();
        let slow = move |_: String, _: u16| {
            // Hangs until the test is done with it (or 10 s pass).
            let _ = hung.recv_timeout(Duration::from_secs(10));
            Ok(vec![SocketAddr::from((Ipv4Addr::LOCALHOST, 1))])
        };
        let mut addr = at("node0");
        addr.origin = "MASTER_ADDR and MASTER_PORT";
        let within = Duration::from_millis(50);
        let e = match lookup_with(&addr, within, slow) {
            Err(LookupError::TimedOut(e)) => e,
            other => panic!("{other:?}"),
        };
        drop(release);
        assert_eq!(
            e,
            LookupTimeout {
                host: "node0".into(),
                origin: "MASTER_ADDR and MASTER_PORT",
                waited: within,
            }
        );
        let text = e.to_string();
        assert!(
            text.contains("\"node0\" (from MASTER_ADDR and MASTER_PORT)"),
            "{text}"
        );
        assert!(text.contains("RINGCAST_BOOTSTRAP=ip:port"), "{text}");
    }
}
