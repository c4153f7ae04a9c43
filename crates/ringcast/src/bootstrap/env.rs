//! Rank, world size, local rank and rendezvous address from the launcher's environment.
//!
//! A pure function over an environment lookup ([`JobEnv::from_lookup`]); [`JobEnv::from_env`]
//! reads the process environment. Variables set to an empty string count as unset.

pub use super::env_error::EnvError;
use super::hostlist;
use super::iface::IfnameFilter;
use std::time::Duration;

/// Derived rendezvous ports (from a launcher's job id) lie in
/// `DERIVED_PORT_BASE .. DERIVED_PORT_BASE + DERIVED_PORT_SPAN`, below Linux's ephemeral range.
pub const DERIVED_PORT_BASE: u16 = 12_000;
/// Width of the derived port range.
pub const DERIVED_PORT_SPAN: u16 = 16_000;
/// Under torchrun, ringcast's rendezvous listens on `MASTER_PORT + TORCHRUN_PORT_OFFSET` on
/// `MASTER_ADDR` (torch's TCPStore already listens on `MASTER_PORT`).
pub const TORCHRUN_PORT_OFFSET: u16 = 1;
/// Most ranks a job may have. It bounds what rank 0 holds for the ranks it waits for (a
/// mistyped `WORLD_SIZE=4294967295` is an error, not an allocation that aborts), and lies well
/// above the core's default limit (`ringcast_core::Limits::max_ranks`, 2^16), so that the
/// bootstrap is never the tighter one.
pub const MAX_WORLD_SIZE: u32 = 1 << 20;
/// How long the rendezvous waits for every rank unless `RINGCAST_BOOTSTRAP_TIMEOUT` says.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// The variables that set a rank, for messages: `RINGCAST_RANK` and each launcher's.
pub(super) const RANK_VARIABLES: &str = "RINGCAST_RANK, or the launcher's RANK / \
     OMPI_COMM_WORLD_RANK / PMI_RANK / MV2_COMM_WORLD_RANK / SLURM_PROCID";
/// The variables that set the world size, for messages.
pub(super) const SIZE_VARIABLES: &str = "RINGCAST_WORLD_SIZE, or the launcher's WORLD_SIZE / \
     OMPI_COMM_WORLD_SIZE / PMI_SIZE / MV2_COMM_WORLD_SIZE / SLURM_NTASKS";

/// The source the ranks were read from, in the order they are tried.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Launcher {
    /// `RINGCAST_RANK`, `RINGCAST_WORLD_SIZE`, `RINGCAST_LOCAL_RANK`.
    Explicit,
    /// torchrun / torch.distributed.elastic: `RANK`, `WORLD_SIZE`, `LOCAL_RANK`.
    Torchrun,
    /// Open MPI's mpirun: `OMPI_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`.
    OpenMpi,
    /// MPICH / Hydra / Intel MPI: `PMI_RANK`, `PMI_SIZE`, `MPI_LOCALRANKID`.
    Mpich,
    /// MVAPICH2: `MV2_COMM_WORLD_RANK`, `_SIZE`, `_LOCAL_RANK`.
    Mvapich,
    /// Slurm's srun: `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`.
    Slurm,
}

impl Launcher {
    /// A short lower-case name (`torchrun`, `openmpi`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Launcher::Explicit => "ringcast",
            Launcher::Torchrun => "torchrun",
            Launcher::OpenMpi => "openmpi",
            Launcher::Mpich => "mpich",
            Launcher::Mvapich => "mvapich",
            Launcher::Slurm => "slurm",
        }
    }
}

impl std::fmt::Display for Launcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Where the ranks meet: rank 0 listens on `port` (all addresses), the others connect to
/// `host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RendezvousAddr {
    /// Host name or IP address of rank 0's host (IPv6 without brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// The variables it came from, for error messages (`"RINGCAST_BOOTSTRAP"`).
    pub origin: &'static str,
}

impl std::fmt::Display for RendezvousAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// What the environment says about this rank's job.
#[derive(Debug, Clone, PartialEq)]
pub struct JobEnv {
    /// Where rank and size came from.
    pub launcher: Launcher,
    /// This process's rank, below `world_size`.
    pub rank: u32,
    /// Number of ranks, at least 1.
    pub world_size: u32,
    /// Rank among the ranks on this host, when the launcher says.
    pub local_rank: Option<u32>,
    /// Number of ranks on this host, when the launcher says.
    pub local_size: Option<u32>,
    /// Where the ranks meet; `None` only for a single-rank job, which needs no rendezvous.
    pub rendezvous: Option<RendezvousAddr>,
    /// The job id: the launcher's (`"4242.0"` for a Slurm step), with `RINGCAST_JOB_ID`
    /// added where set (`"4242.0/mine"`; alone where the launcher gives none).
    pub job_id: Option<String>,
    /// `RINGCAST_IFNAME`, when set.
    pub ifname: Option<IfnameFilter>,
    /// How long the rendezvous waits for every rank (`RINGCAST_BOOTSTRAP_TIMEOUT`).
    pub timeout: Duration,
}

/// One launcher's variable names.
struct Vars {
    launcher: Launcher,
    rank: &'static str,
    size: &'static str,
    local_rank: &'static str,
    local_size: Option<&'static str>,
}

/// The launchers with ranks in the environment, in precedence order. Slurm comes last: mpirun
/// inside an allocation inherits `SLURM_PROCID=0` in every rank.
const LAUNCHERS: [Vars; 6] = [
    Vars {
        launcher: Launcher::Explicit,
        rank: "RINGCAST_RANK",
        size: "RINGCAST_WORLD_SIZE",
        local_rank: "RINGCAST_LOCAL_RANK",
        local_size: None,
    },
    Vars {
        launcher: Launcher::Torchrun,
        rank: "RANK",
        size: "WORLD_SIZE",
        local_rank: "LOCAL_RANK",
        local_size: Some("LOCAL_WORLD_SIZE"),
    },
    Vars {
        launcher: Launcher::OpenMpi,
        rank: "OMPI_COMM_WORLD_RANK",
        size: "OMPI_COMM_WORLD_SIZE",
        local_rank: "OMPI_COMM_WORLD_LOCAL_RANK",
        local_size: Some("OMPI_COMM_WORLD_LOCAL_SIZE"),
    },
    Vars {
        launcher: Launcher::Mpich,
        rank: "PMI_RANK",
        size: "PMI_SIZE",
        local_rank: "MPI_LOCALRANKID",
        local_size: Some("MPI_LOCALNRANKS"),
    },
    Vars {
        launcher: Launcher::Mvapich,
        rank: "MV2_COMM_WORLD_RANK",
        size: "MV2_COMM_WORLD_SIZE",
        local_rank: "MV2_COMM_WORLD_LOCAL_RANK",
        local_size: Some("MV2_COMM_WORLD_LOCAL_SIZE"),
    },
    Vars {
        launcher: Launcher::Slurm,
        rank: "SLURM_PROCID",
        size: "SLURM_NTASKS",
        local_rank: "SLURM_LOCALID",
        local_size: None,
    },
];

impl JobEnv {
    /// Reads the process environment (see [`JobEnv::from_lookup`]).
    pub fn from_env() -> Result<Self, EnvError> {
        Self::from_lookup(env_var)
    }

    /// Reads the job from `lookup` (a variable name to its value), trying in order: explicit
    /// `RINGCAST_*`, torchrun, Open MPI, MPICH/Hydra, MVAPICH2, Slurm. `RINGCAST_BOOTSTRAP`
    /// overrides any launcher's rendezvous address.
    ///
    /// ```
    /// use ringcast::bootstrap::{JobEnv, Launcher};
    /// let env = [("RANK", "1"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "n1"), ("MASTER_PORT", "29500")];
    /// let job = JobEnv::from_lookup(|k| {
    ///     env.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
    /// })
    /// .unwrap();
    /// assert_eq!((job.launcher, job.rank, job.world_size), (Launcher::Torchrun, 1, 2));
    /// assert_eq!(job.rendezvous.unwrap().to_string(), "n1:29501");
    /// ```
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, EnvError> {
        let get = |var: &str| lookup(var).filter(|v| !v.trim().is_empty());
        let mut found = None;
        for vars in &LAUNCHERS {
            if let Some(ranks) = ranks_of(&get, vars)? {
                found = Some((vars, ranks));
                break;
            }
        }
        let (mut vars, mut ranks) = found.ok_or(EnvError::NoLauncher)?;
        // srun with Slurm's PMI plugins (`--mpi=pmi2`) sets `PMI_RANK`/`PMI_SIZE` beside its
        // own variables: where they agree with Slurm's and the step's node list is there to
        // meet at, the job is Slurm's (Hydra's mpirun gives no node list to meet at).
        if vars.launcher == Launcher::Mpich
            && get("SLURM_STEP_NODELIST").is_some()
            && let Some(slurm) = LAUNCHERS.iter().find(|v| v.launcher == Launcher::Slurm)
            && let Ok(Some(s)) = ranks_of(&get, slurm)
            && (s.rank, s.size) == (ranks.rank, ranks.size)
        {
            (vars, ranks) = (slurm, s);
        }
        let launcher = vars.launcher;
        // A launcher further down that says otherwise is overridden, as the order says; a job
        // script that exports `RINGCAST_RANK` under mpirun makes every rank the same one,
        // though, so it is said.
        for other in LAUNCHERS
            .iter()
            .skip_while(|v| v.launcher != launcher)
            .skip(1)
        {
            if other.launcher != Launcher::Slurm
                && let Ok(Some(o)) = ranks_of(&get, other)
                && (o.rank, o.size) != (ranks.rank, ranks.size)
            {
                tracing::warn!(
                    "{}={} and {}={} override {}={} and {}={}",
                    vars.rank,
                    ranks.rank,
                    vars.size,
                    ranks.size,
                    other.rank,
                    o.rank,
                    other.size,
                    o.size
                );
            }
        }
        if launcher == Launcher::Slurm {
            slurm_size_check(&get, ranks.size)?;
            // A step on one node has every task local.
            if get("SLURM_STEP_NODELIST").is_some_and(|l| hostlist::host_count(&l) == Ok(1)) {
                ranks.local_size = Some(ranks.size);
            }
        }
        let (job_id, job_id_var) = job_id(&get, launcher).unzip();
        let rendezvous = match get("RINGCAST_BOOTSTRAP") {
            _ if ranks.size == 1 => None,
            Some(v) => Some(parse_bootstrap(&v)?),
            None => Some(launcher_rendezvous(
                &get,
                launcher,
                &ranks,
                job_id.as_deref().zip(job_id_var),
            )?),
        };
        let ifname = get("RINGCAST_IFNAME")
            .map(|v| v.parse())
            .transpose()
            .map_err(EnvError::BadIfname)?;
        let timeout = match get("RINGCAST_BOOTSTRAP_TIMEOUT") {
            None => DEFAULT_TIMEOUT,
            Some(v) => parse_seconds(&v)
                .filter(|s| *s > 0.0)
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                // A positive number can still round to no time at all (1e-10).
                .filter(|d| !d.is_zero() && *d <= ringcast_core::MAX_TIMEOUT)
                .ok_or(EnvError::BadTimeout(v))?,
        };
        Ok(JobEnv {
            launcher,
            rank: ranks.rank,
            world_size: ranks.size,
            local_rank: ranks.local_rank,
            local_size: ranks.local_size,
            rendezvous,
            job_id,
            ifname,
            timeout,
        })
    }

    /// Whether every rank is known to run on this host (one rank, or as many local ranks as
    /// ranks).
    pub fn single_host(&self) -> bool {
        self.world_size == 1 || self.local_size == Some(self.world_size)
    }

    /// A 64-bit digest of the launcher and its job id (0 when there is no job id), which ranks
    /// compare at rendezvous so that two jobs meeting on one port refuse each other.
    pub fn job_key(&self) -> u64 {
        self.job_id
            .as_deref()
            .map_or(0, |id| job_key_of(self.launcher, id))
    }
}

/// A process environment variable, a value that is not UTF-8 taken lossily: it then fails
/// to parse with a message naming the variable, instead of counting as unset.
pub(crate) fn env_var(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

struct Ranks {
    rank: u32,
    size: u32,
    local_rank: Option<u32>,
    local_size: Option<u32>,
}

fn number(
    get: &impl Fn(&str) -> Option<String>,
    var: &'static str,
) -> Result<Option<u32>, EnvError> {
    get(var)
        .map(|v| {
            v.trim().parse::<u32>().map_err(|_| EnvError::NotANumber {
                var,
                value: v.clone(),
            })
        })
        .transpose()
}

/// This launcher's ranks, `None` when neither its rank nor its size variable is set.
fn ranks_of(get: &impl Fn(&str) -> Option<String>, v: &Vars) -> Result<Option<Ranks>, EnvError> {
    let (rank, size) = match (number(get, v.rank)?, number(get, v.size)?) {
        (None, None) => return Ok(None),
        (Some(_), None) => return Err(missing(v.size, v.rank)),
        (None, Some(_)) => return Err(missing(v.rank, v.size)),
        (Some(r), Some(s)) => (r, s),
    };
    in_range(v.rank, rank, v.size, size)?;
    if size > MAX_WORLD_SIZE {
        return Err(EnvError::TooManyRanks { var: v.size, size });
    }
    let local_rank = number(get, v.local_rank)?;
    if let Some(lr) = local_rank {
        // Also where no local size is given: u32::MAX is the wire's "unknown", and a local
        // rank at or past the world size is wrong anyway.
        in_range(v.local_rank, lr, v.size, size)?;
    }
    let local_size = match v.local_size {
        Some(var) => number(get, var)?,
        None => None,
    };
    if let (Some(var), Some(ls)) = (v.local_size, local_size) {
        if ls > size {
            return Err(EnvError::Mismatch {
                var,
                value: ls,
                other: v.size,
                other_value: size,
            });
        }
        if let Some(lr) = local_rank {
            in_range(v.local_rank, lr, var, ls)?;
        }
    }
    Ok(Some(Ranks {
        rank,
        size,
        local_rank,
        local_size,
    }))
}

fn missing(var: &'static str, present: &'static str) -> EnvError {
    EnvError::Missing { var, present }
}

fn in_range(
    var: &'static str,
    rank: u32,
    size_var: &'static str,
    size: u32,
) -> Result<(), EnvError> {
    if size == 0 {
        return Err(EnvError::ZeroSize { var: size_var });
    }
    if rank >= size {
        return Err(EnvError::RankOutOfRange {
            var,
            rank,
            size_var,
            size,
        });
    }
    Ok(())
}

/// srun sets the step's task count in several variables; they must agree.
fn slurm_size_check(get: &impl Fn(&str) -> Option<String>, size: u32) -> Result<(), EnvError> {
    for var in ["SLURM_NPROCS", "SLURM_STEP_NUM_TASKS"] {
        if let Some(n) = number(get, var)?
            && n != size
        {
            return Err(EnvError::Mismatch {
                var: "SLURM_NTASKS",
                value: size,
                other: var,
                other_value: n,
            });
        }
    }
    Ok(())
}

/// The job key of job `id` under `launcher` (never 0, which stands for no job id).
pub(crate) fn job_key_of(launcher: Launcher, id: &str) -> u64 {
    fnv1a(format!("{launcher}/{id}").as_bytes()).max(1)
}

/// The job id, and the variables it came from: the launcher's, and `RINGCAST_JOB_ID` where
/// set (for a launcher with no job id of its own, such as Hydra or `RINGCAST_*` alone, the
/// only one; beside the launcher's, added to it, so that two launches that export one value
/// stay apart).
fn job_id(
    get: &impl Fn(&str) -> Option<String>,
    launcher: Launcher,
) -> Option<(String, &'static str)> {
    let ours = get("RINGCAST_JOB_ID").filter(|id| !id.trim().is_empty());
    match (launcher_job_id(get, launcher), ours) {
        (Some((theirs, var)), Some(ours)) => Some((format!("{theirs}/{ours}"), var)),
        (None, Some(ours)) => Some((ours, "RINGCAST_JOB_ID")),
        (theirs, None) => theirs,
    }
}

/// The launcher's own job id, and the variables it came from.
fn launcher_job_id(
    get: &impl Fn(&str) -> Option<String>,
    launcher: Launcher,
) -> Option<(String, &'static str)> {
    let var = |var: &'static str| get(var).map(|id| (id, var));
    match launcher {
        // The run id alone: torch elastic does not synchronise TORCHELASTIC_RESTART_COUNT
        // between agents, so ranks of one round may see different counts. `none` is
        // torchrun's default `--rdzv-id`, which every such job shares: no id at all.
        Launcher::Torchrun => var("TORCHELASTIC_RUN_ID").filter(|(id, _)| id.trim() != "none"),
        // Open MPI 5 (PRRTE) sets only PMIX_NAMESPACE.
        Launcher::OpenMpi => var("OMPI_MCA_ess_base_jobid").or_else(|| var("PMIX_NAMESPACE")),
        Launcher::Slurm => get("SLURM_JOB_ID").map(|job| match get("SLURM_STEP_ID") {
            Some(step) => (format!("{job}.{step}"), "SLURM_JOB_ID and SLURM_STEP_ID"),
            None => (job, "SLURM_JOB_ID"),
        }),
        _ => None,
    }
}

/// Parses a rendezvous address as `RINGCAST_BOOTSTRAP` is read: `host:port`, IPv6 in
/// brackets, surrounding white space ignored.
pub fn parse_rendezvous(value: &str) -> Result<RendezvousAddr, EnvError> {
    parse_bootstrap(value)
}

/// Parses `RINGCAST_BOOTSTRAP`: `host:port`, IPv6 in brackets.
fn parse_bootstrap(value: &str) -> Result<RendezvousAddr, EnvError> {
    const VAR: &str = "RINGCAST_BOOTSTRAP";
    let bad = |why| EnvError::BadAddress {
        var: VAR,
        value: value.to_owned(),
        why,
    };
    let (host, port) = value.trim().rsplit_once(':').ok_or(bad("no :port"))?;
    let host = match host.strip_prefix('[') {
        Some(h) => h.strip_suffix(']').ok_or(bad("unbalanced brackets"))?,
        None if host.contains(':') => return Err(bad("write an IPv6 address in brackets")),
        None => host,
    };
    if host.is_empty() {
        return Err(bad("no host"));
    }
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p != 0)
        .ok_or(bad("the port is not a number in 1-65535"))?;
    Ok(RendezvousAddr {
        host: host.to_owned(),
        port,
        origin: VAR,
    })
}

/// The rendezvous address a launcher implies when `RINGCAST_BOOTSTRAP` is unset.
fn launcher_rendezvous(
    get: &impl Fn(&str) -> Option<String>,
    launcher: Launcher,
    ranks: &Ranks,
    job_id: Option<(&str, &'static str)>,
) -> Result<RendezvousAddr, EnvError> {
    let no = |why| EnvError::NoRendezvous { launcher, why };
    match launcher {
        Launcher::Explicit => Err(no("RINGCAST_BOOTSTRAP is not set")),
        Launcher::Torchrun => {
            let host = get("MASTER_ADDR").ok_or(missing("MASTER_ADDR", "RANK"))?;
            let value = get("MASTER_PORT").ok_or(missing("MASTER_PORT", "RANK"))?;
            let master = value
                .trim()
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| EnvError::BadPort {
                    var: "MASTER_PORT",
                    value: value.clone(),
                })?;
            let port = master
                .checked_add(TORCHRUN_PORT_OFFSET)
                .ok_or(EnvError::PortOverflow(master))?;
            Ok(RendezvousAddr {
                host: host.trim().to_owned(),
                port,
                origin: "MASTER_ADDR and MASTER_PORT",
            })
        }
        Launcher::Slurm => {
            const VAR: &str = "SLURM_STEP_NODELIST";
            let list = get(VAR).ok_or(no(
                "SLURM_STEP_NODELIST is not set; start the ranks with srun",
            ))?;
            let host = hostlist::first_host(&list).map_err(|source| EnvError::BadHostlist {
                var: VAR,
                value: list.clone(),
                source,
            })?;
            let job = get("SLURM_JOB_ID").ok_or(no("SLURM_JOB_ID is not set"))?;
            let step = get("SLURM_STEP_ID");
            let port = match (
                job.trim().parse::<u64>(),
                step.as_deref().map(|s| s.trim().parse::<u64>()),
            ) {
                (Ok(j), None) => derived_port(j.wrapping_mul(SLURM_JOB_MULTIPLIER)),
                (Ok(j), Some(Ok(s))) => {
                    derived_port(j.wrapping_mul(SLURM_JOB_MULTIPLIER).wrapping_add(s))
                }
                _ => derived_port(fnv1a(job_id.map_or(job.as_str(), |(id, _)| id).as_bytes())),
            };
            Ok(RendezvousAddr {
                host,
                port,
                origin: "SLURM_STEP_NODELIST, SLURM_JOB_ID and SLURM_STEP_ID",
            })
        }
        Launcher::OpenMpi | Launcher::Mpich | Launcher::Mvapich => {
            let single_host = ranks.local_size == Some(ranks.size)
                || (launcher == Launcher::OpenMpi
                    && get("OMPI_MCA_orte_num_nodes").is_some_and(|n| n.trim() == "1"));
            if !single_host {
                return Err(no(if ranks.local_size.is_some() {
                    "ranks on several hosts, and mpirun gives no rendezvous address"
                } else {
                    "no local size to tell whether the ranks share one host, and mpirun gives \
                     no rendezvous address"
                }));
            }
            let Some((id, origin)) = job_id else {
                return Err(no(
                    "single host, but the launcher gives no job id to derive a port from",
                ));
            };
            Ok(RendezvousAddr {
                host: "127.0.0.1".to_owned(),
                port: derived_port(fnv1a(id.as_bytes())),
                // The variable the id came from, so that messages name what to compare.
                origin,
            })
        }
    }
}

/// A Slurm step's derived port is `DERIVED_PORT_BASE + (job * 67 + step) % DERIVED_PORT_SPAN`.
/// 67 is prime and coprime to the span, so that the steps of one job (numbered from 0) get
/// neighbouring ports and the same step of two jobs shares a port only when the job ids are a
/// multiple of the span apart (a multiplier sharing a factor with the span, as 64 did, repeats
/// after span / gcd jobs: 250).
const SLURM_JOB_MULTIPLIER: u64 = 67;

/// A port in the derived range for a job's digest.
fn derived_port(digest: u64) -> u16 {
    let offset = digest % u64::from(DERIVED_PORT_SPAN);
    // offset < DERIVED_PORT_SPAN, so this neither truncates nor overflows.
    DERIVED_PORT_BASE + u16::try_from(offset).unwrap_or(0)
}

/// 64-bit FNV-1a: stable across processes and builds (std's hashers are not).
pub(super) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Seconds from a variable's value: a plain number of seconds (`2.5`), or a number with one
/// of the CLI's duration units (`ns`, `us` or `µs`, `ms`, `s`: `500ms`, `3s`) or `min` or
/// `h`. `None` when it is neither, or not finite.
pub(crate) fn parse_seconds(v: &str) -> Option<f64> {
    let v = v.trim();
    let units: [(&str, f64); 7] = [
        ("ns", 1e-9),
        ("us", 1e-6),
        ("µs", 1e-6),
        ("ms", 1e-3),
        ("min", 60.0),
        ("h", 3600.0),
        ("s", 1.0),
    ];
    let (num, scale) = units
        .iter()
        .find_map(|&(u, k)| v.strip_suffix(u).map(|n| (n.trim_end(), k)))
        .unwrap_or((v, 1.0));
    let x = num.parse::<f64>().ok()? * scale;
    x.is_finite().then_some(x)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_plain_numbers_or_numbers_with_a_unit() {
        for (v, want) in [
            ("2.5", 2.5),
            (" 30 ", 30.0),
            ("3s", 3.0),
            ("500ms", 0.5),
            ("250 us", 250e-6),
            ("2min", 120.0),
            ("1h", 3600.0),
            ("10ns", 10e-9),
            ("7µs", 7e-6),
        ] {
            let got = parse_seconds(v).unwrap_or_else(|| panic!("{v:?} refused"));
            assert!((got - want).abs() <= want * 1e-12, "{v:?}: {got}");
        }
        for v in ["", "s", "3 sec", "abc", "1e400", "inf", "3x"] {
            assert_eq!(parse_seconds(v), None, "{v:?}");
        }
    }

    fn job(vars: &[(&str, &str)]) -> Result<JobEnv, EnvError> {
        JobEnv::from_lookup(|k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    /// Messages that name "the launcher's rank variable" list every launcher's.
    #[test]
    fn the_variable_lists_name_every_launcher_s() {
        for v in &LAUNCHERS {
            assert!(RANK_VARIABLES.contains(v.rank), "{}", v.rank);
            assert!(SIZE_VARIABLES.contains(v.size), "{}", v.size);
        }
    }

    #[test]
    fn fnv_known_answers() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn derived_ports_stay_in_range() {
        for d in [0, 1, u64::MAX, 15_999, 16_000] {
            let p = derived_port(d);
            assert!((DERIVED_PORT_BASE..DERIVED_PORT_BASE + DERIVED_PORT_SPAN).contains(&p));
        }
    }

    #[test]
    fn slurm_port_from_job_and_step() {
        let j = job(&[
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_STEP_NODELIST", "n[1-2]"),
            ("SLURM_JOB_ID", "100"),
            ("SLURM_STEP_ID", "3"),
        ])
        .expect("slurm");
        let r = j.rendezvous.expect("rendezvous");
        assert_eq!(r.port, DERIVED_PORT_BASE + 6703);
        assert_eq!(j.job_id.as_deref(), Some("100.3"));
    }

    /// Jobs fewer than `DERIVED_PORT_SPAN` apart get different ports for the same step (a
    /// multiplier of 64 repeated every 250 jobs).
    #[test]
    fn slurm_jobs_get_distinct_ports_until_a_span_apart() {
        let port = |id: u64| {
            let id = id.to_string();
            job(&[
                ("SLURM_PROCID", "0"),
                ("SLURM_NTASKS", "2"),
                ("SLURM_STEP_NODELIST", "n[1-2]"),
                ("SLURM_JOB_ID", &id),
                ("SLURM_STEP_ID", "0"),
            ])
            .expect("slurm")
            .rendezvous
            .expect("rendezvous")
            .port
        };
        let first = 4242;
        let ports: std::collections::HashSet<u16> = (first..first + u64::from(DERIVED_PORT_SPAN))
            .map(port)
            .collect();
        assert_eq!(ports.len(), usize::from(DERIVED_PORT_SPAN));
        assert_eq!(port(first), port(first + u64::from(DERIVED_PORT_SPAN)));
    }

    #[test]
    fn bootstrap_values() {
        let ok = |v: &str| parse_bootstrap(v).map(|a| (a.host, a.port));
        assert_eq!(ok("10.0.0.1:29500"), Ok(("10.0.0.1".into(), 29500)));
        assert_eq!(ok("node1.example:1"), Ok(("node1.example".into(), 1)));
        assert_eq!(ok("[fe80::1]:80"), Ok(("fe80::1".into(), 80)));
        for bad in [
            "10.0.0.1",
            ":29500",
            "h:0",
            "h:65536",
            "h:x",
            "fe80::1:80",
            "[::1:80",
        ] {
            let e = parse_bootstrap(bad).expect_err(bad);
            assert_eq!(e.variable(), "RINGCAST_BOOTSTRAP", "{bad}");
        }
    }
}
