//! Multicast groups and Q_Key of a job, derived from the per-job nonce agreed at bootstrap.
//!
//! Every rank derives the same values from the same nonce, with no further coordination; two
//! jobs (two nonces) on one network land on different groups with overwhelming probability
//! (see [`JobAddrs::derive`]) and, should two groups ever meet, still differ in Q_Key.
//!
//! ```
//! use ringcast_transport_rocev2_udp::addr::{AddrConfig, JobAddrs};
//! let a = JobAddrs::derive(0x1234, 4, &AddrConfig::default()).unwrap();
//! assert_eq!(a, JobAddrs::derive(0x1234, 4, &AddrConfig::default()).unwrap());
//! assert_eq!(a.group(0).unwrap().port(), 4791);
//! assert_eq!(a.group(3).unwrap().ip().octets()[0], 239);
//! ```

use std::net::{Ipv4Addr, SocketAddrV4};

/// IANA's UDP port for RoCEv2.
pub const ROCEV2_PORT: u16 = 4791;

/// An IPv4 multicast prefix the groups are drawn from, e.g. `239.0.0.0/8`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct McastPrefix {
    network: Ipv4Addr,
    len: u8,
}

/// Why a prefix or a derivation was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AddrError {
    /// The prefix is not inside 224.0.0.0/4, has host bits set, or is longer than /28.
    #[error(
        "{network}/{len} is not a usable IPv4 multicast prefix (inside 224.0.0.0/4, no host bits, /4 to /28)"
    )]
    BadPrefix {
        /// Network address given.
        network: Ipv4Addr,
        /// Prefix length given.
        len: u8,
    },
    /// The prefix has too few usable groups for this many lanes.
    #[error("prefix {network}/{len} has too few usable groups for {lanes} lanes")]
    PrefixTooSmall {
        /// Network address.
        network: Ipv4Addr,
        /// Prefix length.
        len: u8,
        /// Lanes asked for.
        lanes: usize,
    },
}

impl McastPrefix {
    /// Administratively scoped (RFC 2365) `239.0.0.0/8`: the default.
    pub const ADMIN_SCOPED: McastPrefix = McastPrefix {
        network: Ipv4Addr::new(239, 0, 0, 0),
        len: 8,
    };

    /// `network/len`, validated.
    pub fn new(network: Ipv4Addr, len: u8) -> Result<Self, AddrError> {
        let bad = AddrError::BadPrefix { network, len };
        if !(4..=28).contains(&len) || !network.is_multicast() {
            return Err(bad);
        }
        if u32::from(network) & !mask(len) != 0 {
            return Err(bad);
        }
        Ok(McastPrefix { network, len })
    }

    /// Network address.
    pub const fn network(self) -> Ipv4Addr {
        self.network
    }

    /// Prefix length in bits.
    pub const fn prefix_len(self) -> u8 {
        self.len
    }

    /// Whether `ip` is inside the prefix.
    pub fn contains(self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & mask(self.len) == u32::from(self.network)
    }
}

impl Default for McastPrefix {
    fn default() -> Self {
        Self::ADMIN_SCOPED
    }
}

const fn mask(len: u8) -> u32 {
    if len == 0 { 0 } else { u32::MAX << (32 - len) }
}

/// Where a job's multicast goes: the prefix and the UDP port.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddrConfig {
    /// Prefix the groups are drawn from (default `239.0.0.0/8`).
    pub prefix: McastPrefix,
    /// UDP destination port of every lane (default 4791, which Soft-RoCE may hold).
    pub port: u16,
}

impl Default for AddrConfig {
    fn default() -> Self {
        AddrConfig {
            prefix: McastPrefix::ADMIN_SCOPED,
            port: ROCEV2_PORT,
        }
    }
}

/// A job's groups (one per lane) and Q_Key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobAddrs {
    groups: Vec<Ipv4Addr>,
    qkey: u32,
    port: u16,
}

/// Domain tags so that groups and Q_Key use independent hashes of the nonce.
const DOMAIN_GROUP: u64 = 0x6772_6f75_7073_0001;
const DOMAIN_QKEY: u64 = 0x716b_6579_0000_0001;
/// Candidates tried per lane before giving up on a (tiny) prefix.
const ATTEMPTS: u32 = 4096;

impl JobAddrs {
    /// Derives `lanes` groups and the Q_Key from `nonce`. Deterministic across platforms and
    /// releases (splitmix64, not std's hasher).
    ///
    /// Groups are distinct per lane and skip addresses that share an Ethernet MAC with
    /// 224.0.0.x (see [`aliases_link_local`]). In 239.0.0.0/8 about 2^23 groups remain, so two
    /// jobs of `L` lanes each share some group with probability about `L² / 2^23` (4 lanes:
    /// 2e-6); the Q_Key (31 random bits) still tells their packets apart.
    pub fn derive(nonce: u64, lanes: usize, cfg: &AddrConfig) -> Result<Self, AddrError> {
        let prefix = cfg.prefix;
        let host_mask = !mask(prefix.len);
        let mut groups: Vec<Ipv4Addr> = Vec::with_capacity(lanes);
        for lane in 0..lanes {
            let pick = (0..ATTEMPTS).find_map(|attempt| {
                let h = mix(
                    nonce,
                    DOMAIN_GROUP,
                    (lane as u64) << 32 | u64::from(attempt),
                );
                let ip = Ipv4Addr::from(u32::from(prefix.network) | (h as u32 & host_mask));
                let clash = groups.iter().any(|g| mac_bits(*g) == mac_bits(ip));
                (!aliases_link_local(ip) && !clash).then_some(ip)
            });
            match pick {
                Some(ip) => groups.push(ip),
                None => {
                    return Err(AddrError::PrefixTooSmall {
                        network: prefix.network,
                        len: prefix.len,
                        lanes,
                    });
                }
            }
        }
        // Q_Keys with the high bit set are "controlled" (IBA 10.2.5): only privileged
        // consumers may send them on real RDMA devices, so keep it clear.
        let qkey = mix(nonce, DOMAIN_QKEY, 0) as u32 & 0x7FFF_FFFF;
        Ok(JobAddrs {
            groups,
            qkey,
            port: cfg.port,
        })
    }

    /// Group address and port of `lane`, if the job has that lane.
    pub fn group(&self, lane: usize) -> Option<SocketAddrV4> {
        self.groups
            .get(lane)
            .map(|ip| SocketAddrV4::new(*ip, self.port))
    }

    /// All group addresses, indexed by lane.
    pub fn groups(&self) -> &[Ipv4Addr] {
        &self.groups
    }

    /// The job's Q_Key (high bit clear).
    pub fn qkey(&self) -> u32 {
        self.qkey
    }

    /// UDP port of every lane.
    pub fn port(&self) -> u16 {
        self.port
    }
}

/// The 23 low bits of a group: what its Ethernet MAC (`01:00:5e:xx:xx:xx`) carries.
fn mac_bits(ip: Ipv4Addr) -> u32 {
    u32::from(ip) & 0x007F_FFFF
}

/// Whether `ip` maps to the same Ethernet MAC as a group in 224.0.0.0/24 (`x.0.0.y` and
/// `x.128.0.y`, e.g. 239.0.0.y and 239.128.0.y).
///
/// 224.0.0.0/24 is link-local control traffic (OSPF, IGMP, mDNS...) that switches flood to every
/// port whatever IGMP snooping learnt, and many filter by MAC rather than IP: a data group on
/// such a MAC is flooded everywhere and every host's NIC lets it through to the kernel.
pub fn aliases_link_local(ip: Ipv4Addr) -> bool {
    mac_bits(ip) & 0x007F_FF00 == 0
}

/// splitmix64 of `nonce` under a domain tag and an index.
fn mix(nonce: u64, domain: u64, i: u64) -> u64 {
    splitmix(splitmix(nonce ^ domain) ^ i)
}

fn splitmix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn default_groups_are_valid_distinct_and_deterministic() {
        let cfg = AddrConfig::default();
        for nonce in [0u64, 1, 42, u64::MAX] {
            let a = JobAddrs::derive(nonce, 16, &cfg).unwrap();
            assert_eq!(a, JobAddrs::derive(nonce, 16, &cfg).unwrap());
            assert_eq!(a.groups().len(), 16);
            let macs: HashSet<_> = a.groups().iter().map(|g| mac_bits(*g)).collect();
            assert_eq!(macs.len(), 16);
            for g in a.groups() {
                assert!(McastPrefix::ADMIN_SCOPED.contains(*g));
                assert!(!aliases_link_local(*g));
            }
            assert_eq!(a.qkey() >> 31, 0);
            assert_eq!(a.group(16), None);
        }
    }

    #[test]
    fn a_lane_keeps_its_group_when_lanes_are_added() {
        let cfg = AddrConfig::default();
        let two = JobAddrs::derive(9, 2, &cfg).unwrap();
        let eight = JobAddrs::derive(9, 8, &cfg).unwrap();
        assert_eq!(two.groups(), &eight.groups()[..2]);
    }

    #[test]
    fn neighbouring_nonces_are_disjoint() {
        let cfg = AddrConfig::default();
        for nonce in 0..1000u64 {
            let a = JobAddrs::derive(nonce, 4, &cfg).unwrap();
            let b = JobAddrs::derive(nonce + 1, 4, &cfg).unwrap();
            assert!(
                a.groups().iter().all(|g| !b.groups().contains(g)),
                "{nonce}"
            );
            assert_ne!(a.qkey(), b.qkey());
        }
    }

    #[test]
    fn aliasing() {
        for ip in [
            [239, 0, 0, 1],
            [239, 128, 0, 200],
            [224, 0, 0, 251],
            [238, 0, 0, 0],
        ] {
            assert!(aliases_link_local(Ipv4Addr::from(ip)), "{ip:?}");
        }
        for ip in [
            [239, 0, 1, 0],
            [239, 1, 0, 0],
            [239, 129, 0, 5],
            [224, 0, 1, 1],
        ] {
            assert!(!aliases_link_local(Ipv4Addr::from(ip)), "{ip:?}");
        }
    }

    #[test]
    fn custom_prefix_and_port() {
        let prefix = McastPrefix::new(Ipv4Addr::new(239, 255, 0, 0), 16).unwrap();
        let cfg = AddrConfig {
            prefix,
            port: 50000,
        };
        let a = JobAddrs::derive(5, 8, &cfg).unwrap();
        assert!(a.groups().iter().all(|g| prefix.contains(*g)));
        assert_eq!(a.group(7).unwrap().port(), 50000);
    }

    #[test]
    fn bad_prefixes() {
        for (ip, len) in [
            ([10, 0, 0, 0], 8),
            ([239, 0, 0, 1], 8),
            ([239, 0, 0, 0], 29),
            ([224, 0, 0, 0], 3),
        ] {
            assert!(
                McastPrefix::new(Ipv4Addr::from(ip), len).is_err(),
                "{ip:?}/{len}"
            );
        }
    }

    #[test]
    fn tiny_prefix_runs_out() {
        // 239.0.0.0/28 lies entirely in the aliased range.
        let prefix = McastPrefix::new(Ipv4Addr::new(239, 0, 0, 0), 28).unwrap();
        let cfg = AddrConfig { prefix, port: 1 };
        assert!(matches!(
            JobAddrs::derive(1, 1, &cfg),
            Err(AddrError::PrefixTooSmall { lanes: 1, .. })
        ));
        // 239.1.2.0/28 has 16 usable groups.
        let prefix = McastPrefix::new(Ipv4Addr::new(239, 1, 2, 0), 28).unwrap();
        let cfg = AddrConfig { prefix, port: 1 };
        assert!(JobAddrs::derive(1, 16, &cfg).is_ok());
        assert!(JobAddrs::derive(1, 17, &cfg).is_err());
    }
}
