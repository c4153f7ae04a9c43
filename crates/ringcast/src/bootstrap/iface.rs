//! Which local IPv4 interface a rank uses: `RINGCAST_IFNAME` in `NCCL_SOCKET_IFNAME` syntax,
//! or by default the interface the kernel routes toward the rendezvous host.

use super::lookup::LookupTimeout;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, UdpSocket};

/// A parsed `RINGCAST_IFNAME` value, in `NCCL_SOCKET_IFNAME` syntax: a comma-separated list of
/// name prefixes (`eth` matches `eth0`, `eth1`); a leading `^` turns it into a list to exclude;
/// a leading `=` (after any `^`) asks for exact names instead of prefixes.
///
/// ```
/// use ringcast::bootstrap::IfnameFilter;
/// let f: IfnameFilter = "^docker,lo".parse().unwrap();
/// assert!(f.matches("eth0") && !f.matches("docker0") && !f.matches("lo"));
/// let f: IfnameFilter = "=eth0".parse().unwrap();
/// assert!(f.matches("eth0") && !f.matches("eth01"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IfnameFilter {
    exclude: bool,
    exact: bool,
    names: Vec<String>,
}

/// A `RINGCAST_IFNAME` value that names no interface (empty list).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` names no interface (want e.g. `eth0`, `eth`, `^docker,lo` or `=eth0`)")]
pub struct IfnameSyntaxError(pub String);

impl std::str::FromStr for IfnameFilter {
    type Err = IfnameSyntaxError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (exclude, rest) = match s.trim().strip_prefix('^') {
            Some(r) => (true, r),
            None => (false, s.trim()),
        };
        let (exact, rest) = match rest.strip_prefix('=') {
            Some(r) => (true, r),
            None => (false, rest),
        };
        let names: Vec<String> = rest
            .split(',')
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_owned)
            .collect();
        if names.is_empty() {
            return Err(IfnameSyntaxError(s.to_owned()));
        }
        Ok(Self {
            exclude,
            exact,
            names,
        })
    }
}

impl IfnameFilter {
    /// Whether the filter lets interface `name` through.
    pub fn matches(&self, name: &str) -> bool {
        let listed = self.names.iter().any(|n| {
            if self.exact {
                n == name
            } else {
                name.starts_with(n.as_str())
            }
        });
        listed != self.exclude
    }
}

/// A local interface and the IPv4 address ringcast uses on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetInterface {
    /// Interface name (`eth0`, `lo`); `?` when the routed address belongs to no listed
    /// interface.
    pub name: String,
    /// Its IPv4 address.
    pub addr: Ipv4Addr,
}

/// Why no interface could be chosen.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InterfaceError {
    /// `RINGCAST_IFNAME` lets no IPv4 interface through.
    #[error(
        "RINGCAST_IFNAME={filter} matches no interface with an IPv4 address; set RINGCAST_IFNAME \
         to one of: {available}"
    )]
    NoMatch {
        /// The variable's value.
        filter: String,
        /// The IPv4 interfaces there are, as `name (addr)`.
        available: String,
    },
    /// The interfaces could not be listed.
    #[error("listing network interfaces: {0}")]
    List(#[source] std::io::Error),
    /// The rendezvous host name does not resolve to an address.
    #[error(
        "cannot resolve the rendezvous host {host:?} (from {origin}): {detail}; set \
         RINGCAST_BOOTSTRAP=ip:port or RINGCAST_IFNAME"
    )]
    Resolve {
        /// The host.
        host: String,
        /// The variables it came from.
        origin: &'static str,
        /// What the resolver said.
        detail: String,
    },
    /// Looking up the rendezvous host's name took the whole rendezvous timeout.
    #[error(transparent)]
    Lookup(#[from] LookupTimeout),
    /// The rendezvous host resolves to a loopback address here although it was not written
    /// as one, and nothing says which other interface to use.
    #[error(
        "the rendezvous host {host:?} resolves to {loopback} here, a loopback address other \
         hosts cannot reach, and no multicast route says which of {candidates} to use instead; \
         set RINGCAST_IFNAME to one of them (or give the rendezvous host as an address the \
         other hosts reach it by)"
    )]
    LoopbackRendezvous {
        /// The rendezvous host, as written.
        host: String,
        /// The loopback address the kernel routes toward it from.
        loopback: Ipv4Addr,
        /// The interfaces it could be, as `name (addr)`.
        candidates: String,
    },
    /// No route toward the rendezvous host to pick the default interface from.
    #[error("no route toward {toward} to pick an interface from ({source}); set RINGCAST_IFNAME")]
    NoRoute {
        /// The rendezvous address.
        toward: IpAddr,
        /// What the kernel said.
        #[source]
        source: std::io::Error,
    },
}

/// The interface to use. With `filter`, the first listed IPv4 interface it lets through,
/// preferring the one routed toward `toward`, then any non-loopback one; without, the interface
/// the kernel routes toward `toward` (the rendezvous host), or loopback when `toward` is `None`
/// (a single-rank job).
pub fn select_interface(
    filter: Option<&IfnameFilter>,
    toward: Option<IpAddr>,
) -> Result<NetInterface, InterfaceError> {
    let listed: Vec<NetInterface> = if_addrs::get_if_addrs()
        .map_err(InterfaceError::List)?
        .into_iter()
        .filter_map(|i| match i.addr {
            if_addrs::IfAddr::V4(a) => Some(NetInterface {
                name: i.name,
                addr: a.ip,
            }),
            if_addrs::IfAddr::V6(_) => None,
        })
        .collect();
    let routed = match toward {
        Some(t) => match route_source(t) {
            Ok(a) => Some(a),
            Err(source) if filter.is_none() => {
                return Err(InterfaceError::NoRoute { toward: t, source });
            }
            Err(_) => None,
        },
        None => None,
    };
    choose_interface(filter, &listed, routed)
}

/// The pure part of [`select_interface`], over a given interface list and routed address.
pub fn choose_interface(
    filter: Option<&IfnameFilter>,
    listed: &[NetInterface],
    routed: Option<Ipv4Addr>,
) -> Result<NetInterface, InterfaceError> {
    let Some(filter) = filter else {
        let addr = routed.unwrap_or(Ipv4Addr::LOCALHOST);
        let name = listed
            .iter()
            .find(|i| i.addr == addr)
            .map_or_else(|| "?".to_owned(), |i| i.name.clone());
        return Ok(NetInterface { name, addr });
    };
    let allowed: Vec<&NetInterface> = listed.iter().filter(|i| filter.matches(&i.name)).collect();
    allowed
        .iter()
        .find(|i| Some(i.addr) == routed)
        .or_else(|| allowed.iter().find(|i| !i.addr.is_loopback()))
        .or_else(|| allowed.first())
        .map(|i| (*i).clone())
        .ok_or_else(|| InterfaceError::NoMatch {
            filter: filter.to_string(),
            available: listed
                .iter()
                .map(|i| format!("{} ({})", i.name, i.addr))
                .collect::<Vec<_>>()
                .join(", "),
        })
}

/// Whether a rendezvous host, as written, asks for loopback: a loopback address (`127.0.0.1`,
/// `::1`) or `localhost` (also `*.localhost`, RFC 6761, and `localhost.localdomain`).
pub(crate) fn names_loopback(host: &str) -> bool {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return ip.to_canonical().is_loopback();
    }
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    host == "localhost" || host.ends_with(".localhost") || host == "localhost.localdomain"
}

/// The interface to advertise when the kernel routes toward the rendezvous host `host` from
/// `routed`. That is `routed`, unless it is a loopback address while `host` was not written
/// as one: Debian's /etc/hosts maps a host's own name to 127.0.1.1, so rank 0 of a job named
/// by its host would advertise an address no other host reaches. Then (for
/// [`crate::comm::CommBuilder::rendezvous`], and for a [`crate::bootstrap::JobEnv::interface`] job
/// that spans hosts): the interface `filter` (`RINGCAST_IFNAME`) picks among `up`; else the one multicast is routed through (`by_multicast`), else the only
/// non-loopback one in `up` (the IPv4 interfaces that are up); with none, `routed` (no other
/// host is reachable anyway); with several, an error naming `RINGCAST_IFNAME`.
pub(crate) fn off_loopback(
    host: &str,
    routed: NetInterface,
    filter: Option<&IfnameFilter>,
    up: &[NetInterface],
    by_multicast: Option<Ipv4Addr>,
) -> Result<NetInterface, InterfaceError> {
    if !routed.addr.is_loopback() || names_loopback(host) {
        return Ok(routed);
    }
    if let Some(filter) = filter {
        return choose_interface(Some(filter), up, None);
    }
    let others: Vec<&NetInterface> = up.iter().filter(|i| !i.addr.is_loopback()).collect();
    let by_multicast = by_multicast.and_then(|a| others.iter().find(|i| i.addr == a));
    match (by_multicast, others.as_slice()) {
        (Some(i), _) | (None, [i]) => Ok((*i).clone()),
        (None, []) => Ok(routed),
        (None, several) => Err(InterfaceError::LoopbackRendezvous {
            host: host.to_owned(),
            loopback: routed.addr,
            candidates: several
                .iter()
                .map(|i| format!("{} ({})", i.name, i.addr))
                .collect::<Vec<_>>()
                .join(", "),
        }),
    }
}

impl std::fmt::Display for IfnameFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let exclude = if self.exclude { "^" } else { "" };
        let exact = if self.exact { "=" } else { "" };
        write!(f, "{exclude}{exact}{}", self.names.join(","))
    }
}

/// The local IPv4 address the kernel would send from toward `toward`: a connected UDP socket
/// sends nothing but has its source chosen by the routing table.
pub(super) fn route_source(toward: IpAddr) -> std::io::Result<Ipv4Addr> {
    let target = match toward {
        IpAddr::V4(a) => a,
        IpAddr::V6(a) => a.to_ipv4_mapped().ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "the rendezvous host has an IPv6 address; ringcast's data path is IPv4",
            )
        })?,
    };
    let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))?;
    socket.connect(SocketAddr::from((target, 9)))?;
    match socket.local_addr()?.ip() {
        IpAddr::V4(a) => Ok(a),
        IpAddr::V6(_) => Err(std::io::Error::other(
            "an IPv4 socket reported an IPv6 address",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn iface(name: &str, addr: [u8; 4]) -> NetInterface {
        NetInterface {
            name: name.to_owned(),
            addr: Ipv4Addr::from(addr),
        }
    }

    fn listed() -> Vec<NetInterface> {
        vec![
            iface("lo", [127, 0, 0, 1]),
            iface("docker0", [172, 17, 0, 1]),
            iface("eth0", [10, 0, 0, 5]),
            iface("eth1", [10, 1, 0, 5]),
            iface("ib0", [192, 168, 0, 5]),
        ]
    }

    fn pick(filter: &str, routed: Option<[u8; 4]>) -> Result<String, InterfaceError> {
        let f: IfnameFilter = filter.parse().expect("filter");
        choose_interface(Some(&f), &listed(), routed.map(Ipv4Addr::from)).map(|i| i.name)
    }

    #[test]
    fn filter_syntax() {
        let f: IfnameFilter = "eth".parse().expect("prefix");
        assert!(f.matches("eth0") && f.matches("eth") && !f.matches("ib0"));
        let f: IfnameFilter = "^docker,lo".parse().expect("exclude");
        assert!(f.matches("eth0") && !f.matches("docker0") && !f.matches("lo"));
        let f: IfnameFilter = "=eth0,ib0".parse().expect("exact");
        assert!(f.matches("eth0") && f.matches("ib0") && !f.matches("eth01"));
        let f: IfnameFilter = "^=lo".parse().expect("exact exclude");
        assert!(f.matches("lo0") && !f.matches("lo"));
        assert_eq!(f.to_string(), "^=lo");
        for bad in ["", "^", "=", "^=", " , "] {
            assert!(bad.parse::<IfnameFilter>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn filtered_choice_prefers_the_routed_then_non_loopback() {
        assert_eq!(pick("eth", Some([10, 1, 0, 5])).expect("eth1"), "eth1");
        assert_eq!(pick("eth", None).expect("eth0"), "eth0");
        assert_eq!(pick("^docker,eth", Some([1, 2, 3, 4])).expect("ib0"), "ib0");
        assert_eq!(pick("lo", Some([10, 0, 0, 5])).expect("lo"), "lo");
        let err = pick("=eth2", None).expect_err("no eth2").to_string();
        assert!(err.contains("RINGCAST_IFNAME="), "{err}");
        assert!(err.contains("eth1 (10.1.0.5)"), "{err}");
    }

    #[test]
    fn default_choice_follows_the_route() {
        let routed = choose_interface(None, &listed(), Some(Ipv4Addr::new(10, 0, 0, 5)));
        assert_eq!(routed.expect("eth0"), iface("eth0", [10, 0, 0, 5]));
        let single = choose_interface(None, &listed(), None).expect("lo");
        assert_eq!(single, iface("lo", [127, 0, 0, 1]));
    }

    /// A rendezvous host that resolves to loopback here but was written as a name other hosts
    /// use (Debian maps a host's own name to 127.0.1.1) is not advertised as loopback; one
    /// written as loopback is, as is any host routed from elsewhere.
    #[test]
    fn a_host_named_but_routed_to_loopback_is_not_advertised_as_loopback() {
        let debian = iface("lo", [127, 0, 1, 1]);
        let eth0 = iface("eth0", [10, 0, 0, 5]);
        let off =
            |host: &str, up: &[NetInterface], mcast: Option<[u8; 4]>, filter: Option<&str>| {
                let filter: Option<IfnameFilter> = filter.map(|f| f.parse().expect("filter"));
                off_loopback(
                    host,
                    debian.clone(),
                    filter.as_ref(),
                    up,
                    mcast.map(Ipv4Addr::from),
                )
            };
        let lo_eth0 = [iface("lo", [127, 0, 0, 1]), eth0.clone()];
        // The interface multicast is routed through, as JobEnv::interface picks.
        assert_eq!(
            off("node0", &listed(), Some([10, 1, 0, 5]), None)
                .expect("eth1")
                .name,
            "eth1"
        );
        // Else the only other one.
        assert_eq!(off("node0", &lo_eth0, None, None).expect("eth0"), eth0);
        assert_eq!(
            off("node0", &lo_eth0, Some([127, 0, 0, 1]), None).expect("eth0"),
            eth0
        );
        // RINGCAST_IFNAME decides over both.
        assert_eq!(
            off("node0", &listed(), Some([10, 1, 0, 5]), Some("ib"))
                .expect("ib0")
                .name,
            "ib0"
        );
        // Several and no route to choose by: an error that says what to set.
        let text = off("node0", &listed(), None, None)
            .expect_err("ambiguous")
            .to_string();
        assert!(text.contains("\"node0\" resolves to 127.0.1.1"), "{text}");
        assert!(text.contains("set RINGCAST_IFNAME"), "{text}");
        assert!(
            text.contains("docker0 (172.17.0.1), eth0 (10.0.0.5)"),
            "{text}"
        );
        // Only loopback here: nothing else reaches other hosts either.
        let only_lo = [iface("lo", [127, 0, 0, 1])];
        assert_eq!(off("node0", &only_lo, None, None).expect("lo"), debian);
        // Loopback asked for, as an address or as localhost: kept, whatever else there is.
        for host in [
            "127.0.0.1",
            "127.0.1.1",
            "::1",
            "::ffff:127.0.0.1",
            "localhost",
            "LOCALHOST.",
            "rank0.localhost",
            "localhost.localdomain",
        ] {
            assert_eq!(
                off(host, &listed(), Some([10, 0, 0, 5]), None).expect("kept"),
                debian,
                "{host}"
            );
        }
        // A route off loopback is kept.
        let routed = off_loopback(
            "node0",
            eth0.clone(),
            None,
            &listed(),
            Some(Ipv4Addr::new(10, 1, 0, 5)),
        );
        assert_eq!(routed.expect("eth0"), eth0);
    }

    #[test]
    fn loopback_routes_to_loopback() {
        let i = select_interface(None, Some(IpAddr::V4(Ipv4Addr::LOCALHOST))).expect("route");
        assert_eq!(i.addr, Ipv4Addr::LOCALHOST);
    }
}
