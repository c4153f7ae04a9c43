//! Bootstrap: who this process is in its job, and where the job's ranks meet.
//!
//! 1. [`JobEnv::from_env`] reads rank, world size, local rank and the rendezvous address from
//!    the launcher's variables, trying sources in this order (the first whose rank or size
//!    variable is set wins and the rest are ignored, except that MPICH's `PMI_*` beside
//!    Slurm variables that agree with them and a `SLURM_STEP_NODELIST`, as
//!    `srun --mpi=pmi2` sets them, are taken as Slurm):
//!
//!    | source | rank / size | local rank / size | rendezvous when `RINGCAST_BOOTSTRAP` is unset |
//!    |---|---|---|---|
//!    | explicit | `RINGCAST_RANK` / `RINGCAST_WORLD_SIZE` | `RINGCAST_LOCAL_RANK` | none: `RINGCAST_BOOTSTRAP` required |
//!    | torchrun | `RANK` / `WORLD_SIZE` | `LOCAL_RANK` / `LOCAL_WORLD_SIZE` | `MASTER_ADDR` : `MASTER_PORT` + 1 (torch's store owns `MASTER_PORT`) |
//!    | Open MPI | `OMPI_COMM_WORLD_RANK` / `_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` / `_LOCAL_SIZE` | single host only: 127.0.0.1 : port derived from `OMPI_MCA_ess_base_jobid` (or `PMIX_NAMESPACE`) |
//!    | MPICH / Hydra / Intel MPI | `PMI_RANK` / `PMI_SIZE` | `MPI_LOCALRANKID` / `MPI_LOCALNRANKS` | single host with `RINGCAST_JOB_ID`: 127.0.0.1 : port derived from it; else `RINGCAST_BOOTSTRAP` required |
//!    | MVAPICH2 | `MV2_COMM_WORLD_RANK` / `_SIZE` | `MV2_COMM_WORLD_LOCAL_RANK` / `_LOCAL_SIZE` | single host with `RINGCAST_JOB_ID`: 127.0.0.1 : port derived from it; else `RINGCAST_BOOTSTRAP` required |
//!    | Slurm srun | `SLURM_PROCID` / `SLURM_NTASKS` | `SLURM_LOCALID` | first host of `SLURM_STEP_NODELIST` : port derived from `SLURM_JOB_ID`, `SLURM_STEP_ID` |
//!
//!    Slurm comes last because mpirun inside an allocation inherits `SLURM_PROCID=0` in every
//!    rank. `RINGCAST_BOOTSTRAP=host:port` overrides any derived address. Derived ports lie in
//!    [`DERIVED_PORT_BASE`]`..+`[`DERIVED_PORT_SPAN`] (a Slurm step's at
//!    `(SLURM_JOB_ID * 67 + SLURM_STEP_ID) % DERIVED_PORT_SPAN` into the range for numeric
//!    ids, a hash of the job id otherwise: one step of jobs fewer than the span apart gets
//!    different ports). A single-rank job needs no
//!    rendezvous.
//!    Also read: `RINGCAST_IFNAME` (`NCCL_SOCKET_IFNAME` syntax, see [`IfnameFilter`]),
//!    `RINGCAST_BOOTSTRAP_TIMEOUT` (seconds, default 30) and `RINGCAST_JOB_ID` (a job id: ranks
//!    of jobs with different ids refuse each other; the only one where the launcher gives none,
//!    as with `RINGCAST_*` alone or Hydra, else added to the launcher's). Every missing or
//!    inconsistent setting is an [`EnvError`] whose message names the variable to set.
//! 2. [`JobEnv::interface`] picks the local IPv4 interface ([`select_interface`]): per
//!    `RINGCAST_IFNAME`, else the one the kernel routes toward the rendezvous host. A job that
//!    spans hosts (not [`JobEnv::single_host`]) is not left on loopback when the rendezvous
//!    host was not written as loopback (a loopback address, `localhost`) but resolves to it
//!    here, as Debian's /etc/hosts maps a host's own name to 127.0.1.1: it uses the interface
//!    `RINGCAST_IFNAME` picks among those up, else the one multicast is routed through, else
//!    the only other one up, else (none) loopback; where several remain it fails with
//!    [`InterfaceError::LoopbackRendezvous`], listing them and saying to set
//!    `RINGCAST_IFNAME`. [`crate::comm::CommBuilder::rendezvous`] decides alike. A job on one host
//!    keeps the route's choice, loopback included.
//! 3. [`JobEnv::exchange`] runs the TCP [`Rendezvous`]: rank 0 listens on the port, the others
//!    connect with retries and send their control addresses; everyone gets the same
//!    [`PeerTable`] and 64-bit job nonce, or an error naming what went wrong (the missing ranks
//!    on a timeout). A process whose hello does not fit the job (another job's, another world
//!    size, a rank outside the world or already joined) is refused alone and told why; rank 0
//!    goes on waiting for the job's own ranks. A rank of this job (the same non-zero job key)
//!    with another world size fails the rendezvous at once instead: the job as started cannot
//!    meet, and every rank waiting is told why.
//!
//! Steps 2 and 3 look the rendezvous host's name up within the rendezvous timeout (the
//! system resolver has no timeout of its own): a lookup that gets no answer in time is a
//! [`LookupTimeout`] naming the host and the variables it came from.

mod env;
mod env_error;
mod hostlist;
mod iface;
mod local_port;
mod lookup;
mod rendezvous;
mod server;
mod wire;

/// See [`crate::fuzzing::bootstrap_wire`].
pub(crate) fn fuzz_wire(b: &[u8], world: u32) -> (bool, bool) {
    wire::fuzz(b, world)
}

pub use env::{
    DEFAULT_TIMEOUT, DERIVED_PORT_BASE, DERIVED_PORT_SPAN, EnvError, JobEnv, Launcher,
    MAX_WORLD_SIZE, RendezvousAddr, TORCHRUN_PORT_OFFSET, parse_rendezvous,
};
pub(crate) use env::{env_var, job_key_of, parse_seconds};
pub use hostlist::{HostlistError, first_host, host_count};
pub use iface::{
    IfnameFilter, IfnameSyntaxError, InterfaceError, NetInterface, choose_interface,
    select_interface,
};
pub use local_port::{LOCAL_PORTS_FROM, PortKind, free_local_port};
pub use lookup::LookupTimeout;
pub(crate) use rendezvous::random_u64;
pub use rendezvous::{Peer, PeerTable, Rendezvous, RendezvousError, single_rank_table};
pub use wire::MAX_CONTROL_LEN;

use lookup::{LookupError, lookup};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

/// An administratively scoped group address, only routed to learn which interface the host
/// sends multicast from.
const MULTICAST_PROBE: Ipv4Addr = Ipv4Addr::new(239, 255, 0, 1);

/// Any bootstrap failure, for callers that run every step.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BootstrapError {
    /// A missing or inconsistent variable.
    #[error(transparent)]
    Env(#[from] EnvError),
    /// No usable interface.
    #[error(transparent)]
    Interface(#[from] InterfaceError),
    /// The rendezvous failed.
    #[error(transparent)]
    Rendezvous(#[from] RendezvousError),
}

impl JobEnv {
    /// The local IPv4 interface this rank uses: per `RINGCAST_IFNAME` when set, else the one
    /// the kernel routes toward the rendezvous host (loopback for a single-rank job). A job
    /// that spans hosts (not [`JobEnv::single_host`]) whose pick is a loopback address while
    /// the rendezvous host was not written as loopback (Debian's /etc/hosts maps a host's own
    /// name to 127.0.1.1) is kept off it as [`crate::comm::CommBuilder::rendezvous`] is: the
    /// interface `RINGCAST_IFNAME` picks among those up, else the one multicast is routed
    /// through, else the only other one that is up, else loopback when there is none (no other
    /// host is reachable anyway); with several, [`InterfaceError::LoopbackRendezvous`], which
    /// lists them and says to set `RINGCAST_IFNAME`. A job on one host keeps what the route
    /// gives, loopback included.
    pub fn interface(&self) -> Result<NetInterface, InterfaceError> {
        self.interface_by(lookup)
    }

    /// [`JobEnv::interface`], looking the rendezvous host up with `look` (tests inject one
    /// that does not answer).
    fn interface_by(
        &self,
        look: impl FnOnce(&RendezvousAddr, Duration) -> Result<Vec<SocketAddr>, LookupError>,
    ) -> Result<NetInterface, InterfaceError> {
        let toward = match &self.rendezvous {
            None => None,
            Some(r) => match first_ip(look(r, self.timeout)) {
                Ok(ip) => Some(ip),
                // A resolver that does not answer in time will not answer the connect either:
                // said now, rather than after a second timeout there.
                Err(LookupError::TimedOut(e)) => return Err(e.into()),
                // The route toward it only breaks a tie among the interfaces it lets through.
                Err(_) if self.ifname.is_some() => None,
                Err(LookupError::Failed(e)) => {
                    return Err(InterfaceError::Resolve {
                        host: r.host.clone(),
                        origin: r.origin,
                        detail: e.to_string(),
                    });
                }
            },
        };
        let chosen = select_interface(self.ifname.as_ref(), toward)?;
        let spans_hosts = !self.single_host();
        let host = self.rendezvous.as_ref().map(|r| r.host.as_str());
        // The other interfaces matter only to a job that spans hosts and was routed to loopback.
        let (up, by_multicast) = if spans_hosts && chosen.addr.is_loopback() {
            (up_interfaces()?, multicast_source())
        } else {
            (Vec::new(), None)
        };
        let picked = job_interface(
            spans_hosts,
            host,
            chosen.clone(),
            self.ifname.as_ref(),
            &up,
            by_multicast,
        )?;
        if picked != chosen {
            tracing::warn!(
                host = host.unwrap_or_default(),
                loopback = %chosen.addr,
                using = %picked.name,
                addr = %picked.addr,
                "the rendezvous host resolves to loopback here, but the job spans hosts, which \
                 cannot reach it there; using another interface (set RINGCAST_IFNAME to choose)"
            );
        }
        Ok(picked)
    }

    /// Runs the rendezvous (or, for a single-rank job, builds the one-entry table) and returns
    /// every rank's control addresses and the job nonce.
    pub fn exchange(&self, control: &[u8]) -> Result<PeerTable, RendezvousError> {
        match Rendezvous::for_job(self) {
            Some(r) => r.run(control),
            None => Ok(single_rank_table(self.local_rank, control, self.job_key())),
        }
    }
}

/// The interface a rank that meets the others at `addr` advertises when nothing chose one
/// ([`crate::comm::CommBuilder::rendezvous`] without [`crate::CommBuilder::interface`]): the one
/// the kernel routes toward the rendezvous host's IPv4 address (loopback when it has none),
/// kept off a loopback the host was not written as ([`iface::off_loopback`]). `ifname`
/// (`RINGCAST_IFNAME`) is read only then, so that a local job is chosen for exactly as before.
/// The host's name is looked up within `timeout` (the rendezvous timeout): a name that does
/// not resolve is left to the rendezvous to report, one that gets no answer in time is
/// [`InterfaceError::Lookup`].
pub(crate) fn interface_toward(
    addr: &RendezvousAddr,
    timeout: Duration,
    ifname: impl FnOnce() -> Result<Option<IfnameFilter>, EnvError>,
) -> Result<NetInterface, BootstrapError> {
    let ip = match lookup(addr, timeout) {
        Ok(addrs) => addrs.into_iter().find(|a| a.is_ipv4()).map(|a| a.ip()),
        Err(LookupError::Failed(_)) => None,
        Err(LookupError::TimedOut(e)) => return Err(InterfaceError::from(e).into()),
    };
    let routed = select_interface(None, ip)?;
    if !routed.addr.is_loopback() || iface::names_loopback(&addr.host) {
        return Ok(routed);
    }
    let filter = ifname()?;
    let up = up_interfaces()?;
    let by_multicast = multicast_source();
    let chosen = iface::off_loopback(
        &addr.host,
        routed.clone(),
        filter.as_ref(),
        &up,
        by_multicast,
    )?;
    if chosen != routed {
        tracing::warn!(
            host = %addr.host,
            loopback = %routed.addr,
            using = %chosen.name,
            addr = %chosen.addr,
            "the rendezvous host resolves to loopback here, which other hosts cannot reach; \
             using another interface (set RINGCAST_IFNAME to choose)"
        );
    }
    Ok(chosen)
}

/// The decision of [`JobEnv::interface`] once the kernel (or `RINGCAST_IFNAME`, `filter`) has
/// picked `chosen` for a job that meets at `host`: a job on one host (`spans_hosts` false) or
/// without a rendezvous keeps it; one that spans hosts is kept off a loopback `host` was not
/// written as, by [`iface::off_loopback`] over `up` (the IPv4 interfaces that are up) and
/// `by_multicast` (the local address multicast is routed from), as
/// [`crate::comm::CommBuilder::rendezvous`] is.
fn job_interface(
    spans_hosts: bool,
    host: Option<&str>,
    chosen: NetInterface,
    filter: Option<&IfnameFilter>,
    up: &[NetInterface],
    by_multicast: Option<Ipv4Addr>,
) -> Result<NetInterface, InterfaceError> {
    match host {
        Some(host) if spans_hosts => iface::off_loopback(host, chosen, filter, up, by_multicast),
        _ => Ok(chosen),
    }
}

/// The IPv4 interfaces that are up.
fn up_interfaces() -> Result<Vec<NetInterface>, InterfaceError> {
    Ok(if_addrs::get_if_addrs()
        .map_err(InterfaceError::List)?
        .into_iter()
        .filter(|i| i.is_oper_up())
        .filter_map(|i| match i.addr {
            if_addrs::IfAddr::V4(a) => Some(NetInterface {
                name: i.name,
                addr: a.ip,
            }),
            if_addrs::IfAddr::V6(_) => None,
        })
        .collect())
}

/// The local IPv4 address the kernel sends multicast from, when it has a route for it.
fn multicast_source() -> Option<Ipv4Addr> {
    iface::route_source(IpAddr::V4(MULTICAST_PROBE)).ok()
}

/// The first IPv4 address of a lookup's answer, else its first address.
fn first_ip(looked: Result<Vec<SocketAddr>, LookupError>) -> Result<IpAddr, LookupError> {
    let addrs = looked?;
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .map(|a| a.ip())
        .ok_or_else(|| LookupError::Failed(std::io::Error::other("no address")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(host: &str) -> RendezvousAddr {
        RendezvousAddr {
            host: host.to_owned(),
            port: 29500,
            origin: "CommBuilder::rendezvous",
        }
    }

    /// With `RINGCAST_IFNAME` set, a lookup of the rendezvous host that gets no answer in time
    /// fails the interface at once: the connect's own lookup would wait the timeout again.
    /// (A lookup that fails outright still leaves the choice to `RINGCAST_IFNAME`.)
    #[test]
    fn a_resolver_that_does_not_answer_fails_the_interface_even_with_ifname() {
        let job = JobEnv {
            launcher: Launcher::Explicit,
            rank: 0,
            world_size: 2,
            local_rank: None,
            local_size: Some(2),
            rendezvous: Some(at("node0")),
            job_id: None,
            ifname: Some("lo".parse().expect("filter")),
            timeout: Duration::from_millis(5),
        };
        let hung = |r: &RendezvousAddr, within: Duration| {
            Err(LookupError::TimedOut(LookupTimeout {
                host: r.host.clone(),
                origin: r.origin,
                waited: within,
            }))
        };
        match job.interface_by(hung) {
            Err(InterfaceError::Lookup(e)) => assert_eq!(e.host, "node0"),
            other => panic!("{other:?}"),
        }
        let failed = |_: &RendezvousAddr, _: Duration| {
            Err(LookupError::Failed(std::io::Error::other("no such host")))
        };
        let lo = job
            .interface_by(failed)
            .expect("RINGCAST_IFNAME=lo chooses");
        assert!(lo.addr.is_loopback(), "{lo:?}");
    }

    /// A local job (the rendezvous host written as loopback) keeps loopback, and does not
    /// even read `RINGCAST_IFNAME` (a bad value there cannot fail it).
    #[test]
    fn a_local_rendezvous_keeps_loopback_without_reading_ifname() {
        for host in ["127.0.0.1", "localhost"] {
            let bad = || Err(EnvError::BadIfname(IfnameSyntaxError("^".into())));
            let i = interface_toward(&at(host), DEFAULT_TIMEOUT, bad).expect(host);
            assert_eq!(i.addr, Ipv4Addr::LOCALHOST, "{host}");
        }
    }

    fn iface(name: &str, addr: [u8; 4]) -> NetInterface {
        NetInterface {
            name: name.to_owned(),
            addr: Ipv4Addr::from(addr),
        }
    }

    /// Debian's /etc/hosts maps the host's own name to 127.0.1.1, so the kernel routes a job
    /// named by it to loopback.
    fn debian_lo() -> NetInterface {
        iface("lo", [127, 0, 1, 1])
    }

    /// [`JobEnv::interface`]'s decision for `host`, routed to 127.0.1.1, over `up`.
    fn decide(
        spans_hosts: bool,
        host: &str,
        filter: Option<&str>,
        up: &[NetInterface],
        by_multicast: Option<[u8; 4]>,
    ) -> Result<NetInterface, InterfaceError> {
        let filter: Option<IfnameFilter> = filter.map(|f| f.parse().expect("filter"));
        job_interface(
            spans_hosts,
            Some(host),
            debian_lo(),
            filter.as_ref(),
            up,
            by_multicast.map(Ipv4Addr::from),
        )
    }

    /// A job across hosts named by a host that resolves to loopback here, with several other
    /// interfaces and no multicast route to choose by, fails saying to set RINGCAST_IFNAME
    /// (it kept loopback silently, where no other host hears rank 0).
    #[test]
    fn a_job_across_hosts_routed_to_loopback_among_several_asks_for_ringcast_ifname() {
        let up = [
            iface("lo", [127, 0, 0, 1]),
            iface("eth0", [10, 0, 0, 5]),
            iface("eth1", [10, 1, 0, 5]),
        ];
        let err = decide(true, "node0", None, &up, None).expect_err("ambiguous");
        assert!(
            matches!(err, InterfaceError::LoopbackRendezvous { .. }),
            "{err:?}"
        );
        let text = err.to_string();
        assert!(text.contains("set RINGCAST_IFNAME"), "{text}");
        assert!(text.contains("\"node0\" resolves to 127.0.1.1"), "{text}");
        assert!(text.contains("eth0 (10.0.0.5), eth1 (10.1.0.5)"), "{text}");
        // A route for multicast off loopback, or RINGCAST_IFNAME, decides.
        let by_group = decide(true, "node0", None, &up, Some([10, 1, 0, 5]));
        assert_eq!(by_group.expect("eth1"), up[2]);
        let named = decide(true, "node0", Some("=eth0"), &up, Some([10, 1, 0, 5]));
        assert_eq!(named.expect("eth0"), up[1]);
        // A multicast route through loopback says nothing.
        let text = decide(true, "node0", None, &up, Some([127, 0, 0, 1]))
            .expect_err("still ambiguous")
            .to_string();
        assert!(text.contains("set RINGCAST_IFNAME"), "{text}");
    }

    /// With one other interface up and no multicast route, a job across hosts uses it (it
    /// kept loopback); with none, loopback stays (no other host is reachable anyway).
    #[test]
    fn a_job_across_hosts_routed_to_loopback_uses_the_only_other_interface() {
        let eth0 = iface("eth0", [10, 0, 0, 5]);
        let up = [iface("lo", [127, 0, 0, 1]), eth0.clone()];
        assert_eq!(decide(true, "node0", None, &up, None).expect("eth0"), eth0);
        let only_lo = [iface("lo", [127, 0, 0, 1])];
        assert_eq!(
            decide(true, "node0", None, &only_lo, None).expect("lo"),
            debian_lo()
        );
    }

    /// `localhost` asks for loopback, as an IP literal does: kept even where multicast is
    /// routed elsewhere (a job across hosts meeting at `localhost` took the multicast
    /// interface).
    #[test]
    fn a_job_across_hosts_meeting_at_localhost_keeps_loopback() {
        let up = [iface("lo", [127, 0, 0, 1]), iface("eth0", [10, 0, 0, 5])];
        for host in ["localhost", "127.0.1.1", "127.0.0.1"] {
            let kept = decide(true, host, None, &up, Some([10, 0, 0, 5]));
            assert_eq!(kept.expect("loopback"), debian_lo(), "{host}");
        }
    }

    /// RINGCAST_IFNAME that lets loopback through among others picks a non-loopback one for
    /// a job across hosts routed to loopback (the route's loopback was kept); one that names
    /// only loopback gets it.
    #[test]
    fn ringcast_ifname_keeps_a_job_across_hosts_off_a_routed_loopback() {
        let up = [
            iface("lo", [127, 0, 0, 1]),
            iface("docker0", [172, 17, 0, 1]),
            iface("eth0", [10, 0, 0, 5]),
        ];
        let picked = decide(true, "node0", Some("^docker"), &up, None);
        assert_eq!(picked.expect("eth0"), up[2]);
        let lo = decide(true, "node0", Some("=lo"), &up, None);
        assert_eq!(lo.expect("lo"), up[0]);
    }

    /// A job on one host (or without a rendezvous) keeps what it was given, loopback
    /// included, whatever else is up.
    #[test]
    fn a_job_on_one_host_keeps_its_loopback() {
        let up = [
            iface("lo", [127, 0, 0, 1]),
            iface("eth0", [10, 0, 0, 5]),
            iface("eth1", [10, 1, 0, 5]),
        ];
        for mcast in [None, Some([10, 0, 0, 5])] {
            let kept = decide(false, "node0", None, &up, mcast).expect("kept");
            assert_eq!(kept, debian_lo());
        }
        let none = job_interface(true, None, debian_lo(), None, &up, None).expect("kept");
        assert_eq!(none, debian_lo());
        // Off loopback, the route is kept whatever the job.
        let eth1 = job_interface(true, Some("node0"), up[2].clone(), None, &up, None);
        assert_eq!(eth1.expect("eth1"), up[2]);
    }
}
