//! Bootstrap: who this process is in its job, and where the job's ranks meet.
//!
//! 1. [`JobEnv::from_env`] reads rank, world size, local rank and the rendezvous address from
//!    the launcher's variables, trying sources in this order (the first whose rank or size
//!    variable is set wins; the rest are ignored):
//!
//!    | source | rank / size | local rank / size | rendezvous when `RINGCAST_BOOTSTRAP` is unset |
//!    |---|---|---|---|
//!    | explicit | `RINGCAST_RANK` / `RINGCAST_WORLD_SIZE` | `RINGCAST_LOCAL_RANK` | none: `RINGCAST_BOOTSTRAP` required |
//!    | torchrun | `RANK` / `WORLD_SIZE` | `LOCAL_RANK` / `LOCAL_WORLD_SIZE` | `MASTER_ADDR` : `MASTER_PORT` + 1 (torch's store owns `MASTER_PORT`) |
//!    | Open MPI | `OMPI_COMM_WORLD_RANK` / `_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` / `_LOCAL_SIZE` | single host only: 127.0.0.1 : port derived from `OMPI_MCA_ess_base_jobid` (or `PMIX_NAMESPACE`) |
//!    | MPICH / Hydra / Intel MPI | `PMI_RANK` / `PMI_SIZE` | `MPI_LOCALRANKID` / `MPI_LOCALNRANKS` | none: `RINGCAST_BOOTSTRAP` required |
//!    | MVAPICH2 | `MV2_COMM_WORLD_RANK` / `_SIZE` | `MV2_COMM_WORLD_LOCAL_RANK` / `_LOCAL_SIZE` | none: `RINGCAST_BOOTSTRAP` required |
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
//!    `RINGCAST_BOOTSTRAP_TIMEOUT` (seconds, default 30) and `RINGCAST_JOB_ID` (a job id that
//!    takes the launcher's place: ranks of jobs with different ids refuse each other; the only
//!    one where the launcher gives none, as with `RINGCAST_*` alone or Hydra). Every missing or inconsistent setting
//!    is an [`EnvError`] whose message names the variable to set.
//! 2. [`JobEnv::interface`] picks the local IPv4 interface ([`select_interface`]).
//! 3. [`JobEnv::exchange`] runs the TCP [`Rendezvous`]: rank 0 listens on the port, the others
//!    connect with retries and send their control addresses; everyone gets the same
//!    [`PeerTable`] and 64-bit job nonce, or an error naming what went wrong (the missing ranks
//!    on a timeout). A process whose hello does not fit the job (another job's, another world
//!    size, a rank outside the world or already joined) is refused alone and told why; rank 0
//!    goes on waiting for the job's own ranks.

mod env;
mod env_error;
mod hostlist;
mod iface;
mod rendezvous;
mod server;
mod wire;

/// See [`crate::fuzzing::bootstrap_wire`].
pub(crate) fn fuzz_wire(b: &[u8], world: u32) -> (bool, bool) {
    wire::fuzz(b, world)
}

pub(crate) use env::job_key_of;
pub use env::{
    DEFAULT_TIMEOUT, DERIVED_PORT_BASE, DERIVED_PORT_SPAN, EnvError, JobEnv, Launcher,
    MAX_WORLD_SIZE, RendezvousAddr, TORCHRUN_PORT_OFFSET,
};
pub use hostlist::{HostlistError, first_host, host_count};
pub use iface::{
    IfnameFilter, IfnameSyntaxError, InterfaceError, NetInterface, choose_interface,
    select_interface,
};
pub use rendezvous::{Peer, PeerTable, Rendezvous, RendezvousError, single_rank_table};
pub use wire::MAX_CONTROL_LEN;

use std::net::{IpAddr, Ipv4Addr, ToSocketAddrs};

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
    /// the kernel routes toward the rendezvous host (loopback for a single-rank job).
    pub fn interface(&self) -> Result<NetInterface, InterfaceError> {
        let toward = match &self.rendezvous {
            None => None,
            Some(r) => match resolve(r) {
                Ok(ip) => Some(ip),
                Err(_) if self.ifname.is_some() => None,
                Err(detail) => {
                    return Err(InterfaceError::Resolve {
                        host: r.host.clone(),
                        origin: r.origin,
                        detail,
                    });
                }
            },
        };
        let chosen = select_interface(self.ifname.as_ref(), toward)?;
        // Debian's /etc/hosts maps a host's own name to 127.0.1.1: rank 0 of a multi-host job
        // would then pick loopback, where no other host hears it.
        let named_host = self
            .rendezvous
            .as_ref()
            .is_some_and(|r| r.host.parse::<IpAddr>().is_err());
        if self.ifname.is_none() && chosen.addr.is_loopback() && named_host && !self.single_host() {
            let by_group = select_interface(None, Some(IpAddr::V4(MULTICAST_PROBE)))
                .ok()
                .filter(|i| !i.addr.is_loopback());
            if let Some(other) = by_group {
                tracing::warn!(
                    loopback = %chosen.addr,
                    using = %other.name,
                    "the rendezvous host name resolves to loopback here, but the job spans \
                     hosts; using the interface routed toward multicast (set RINGCAST_IFNAME \
                     to choose)"
                );
                return Ok(other);
            }
        }
        Ok(chosen)
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
/// ([`crate::CommBuilder::rendezvous`] without [`crate::CommBuilder::interface`]): the one
/// the kernel routes toward the rendezvous host's IPv4 address (loopback when it has none),
/// kept off a loopback the host was not written as ([`iface::off_loopback`]). `ifname`
/// (`RINGCAST_IFNAME`) is read only then, so that a local job is chosen for exactly as before.
pub(crate) fn interface_toward(
    addr: &RendezvousAddr,
    ifname: impl FnOnce() -> Result<Option<IfnameFilter>, EnvError>,
) -> Result<NetInterface, BootstrapError> {
    let ip = (addr.host.as_str(), addr.port)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.find(|a| a.is_ipv4()))
        .map(|a| a.ip());
    let routed = select_interface(None, ip)?;
    if !routed.addr.is_loopback() || iface::names_loopback(&addr.host) {
        return Ok(routed);
    }
    let filter = ifname()?;
    let up: Vec<NetInterface> = if_addrs::get_if_addrs()
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
        .collect();
    let by_multicast = iface::route_source(IpAddr::V4(MULTICAST_PROBE)).ok();
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

/// The first IPv4 address of the rendezvous host, else its first address.
fn resolve(r: &RendezvousAddr) -> Result<IpAddr, String> {
    let addrs: Vec<IpAddr> = (r.host.as_str(), r.port)
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .map(|a| a.ip())
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| "no address".to_owned())
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

    /// A local job (the rendezvous host written as loopback) keeps loopback, and does not
    /// even read `RINGCAST_IFNAME` (a bad value there cannot fail it).
    #[test]
    fn a_local_rendezvous_keeps_loopback_without_reading_ifname() {
        for host in ["127.0.0.1", "localhost"] {
            let bad = || Err(EnvError::BadIfname(IfnameSyntaxError("^".into())));
            let i = interface_toward(&at(host), bad).expect(host);
            assert_eq!(i.addr, Ipv4Addr::LOCALHOST, "{host}");
        }
    }
}
