//! [`EnvError`]: a missing or inconsistent launcher variable, named in the message.

use super::env::{Launcher, MAX_WORLD_SIZE};
use super::hostlist::HostlistError;
use super::iface::IfnameSyntaxError;

/// A missing or inconsistent setting. Every message names the variable to set;
/// [`EnvError::variable`] returns it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum EnvError {
    /// No launcher's variables at all.
    #[error(
        "no rank in the environment: set RINGCAST_RANK and RINGCAST_WORLD_SIZE (and \
         RINGCAST_BOOTSTRAP=host:port), or start the ranks with mpirun, srun or torchrun"
    )]
    NoLauncher,
    /// One variable of a pair is set, the other is not.
    #[error("{present} is set but {var} is not: set {var} (or unset {present})")]
    Missing {
        /// The variable to set.
        var: &'static str,
        /// The variable that is set.
        present: &'static str,
    },
    /// A variable that must be a number is not.
    #[error("{var}={value:?} is not a non-negative integer: set {var} to a number")]
    NotANumber {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// A world (or local) size of 0.
    #[error("{var}=0: set {var} to the number of ranks (at least 1)")]
    ZeroSize {
        /// The variable.
        var: &'static str,
    },
    /// A world size over [`MAX_WORLD_SIZE`].
    #[error(
        "{var}={size} is over ringcast's limit of {MAX_WORLD_SIZE} ranks: set {var} to the \
         number of ranks"
    )]
    TooManyRanks {
        /// The size variable.
        var: &'static str,
        /// Its value.
        size: u32,
    },
    /// A rank not below its size.
    #[error("{var}={rank} is not below {size_var}={size}: set {var} to a rank in 0..{size}")]
    RankOutOfRange {
        /// The rank variable.
        var: &'static str,
        /// Its value.
        rank: u32,
        /// The size variable.
        size_var: &'static str,
        /// Its value.
        size: u32,
    },
    /// Two variables that must agree do not.
    #[error("{var}={value} disagrees with {other}={other_value}: set {var} to match")]
    Mismatch {
        /// The variable to fix.
        var: &'static str,
        /// Its value.
        value: u32,
        /// The variable it disagrees with.
        other: &'static str,
        /// That one's value.
        other_value: u32,
    },
    /// The launcher gives no rendezvous address and none can be derived.
    #[error(
        "no rendezvous address for this {launcher} job ({why}): set RINGCAST_BOOTSTRAP=host:port \
         to an address of rank 0's host and a free port, the same in every rank"
    )]
    NoRendezvous {
        /// The launcher found.
        launcher: Launcher,
        /// What was missing.
        why: &'static str,
    },
    /// An address variable that is not `host:port`.
    #[error("{var}={value:?} is not usable ({why}): set {var} like 10.0.0.1:29500")]
    BadAddress {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// `MASTER_PORT` is so high that no port is left above it.
    #[error(
        "MASTER_PORT={0} leaves no port at MASTER_PORT+1 for ringcast: set RINGCAST_BOOTSTRAP=host:port"
    )]
    PortOverflow(u16),
    /// A port variable that is not a port number.
    #[error("{var}={value:?} is not a TCP port (1-65535): set {var} to a port number")]
    BadPort {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// An unreadable Slurm hostlist.
    #[error("{var}={value:?} is not a Slurm hostlist ({source}): set RINGCAST_BOOTSTRAP=host:port")]
    BadHostlist {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        source: HostlistError,
    },
    /// An unreadable `RINGCAST_IFNAME`.
    #[error("RINGCAST_IFNAME: {0}; set RINGCAST_IFNAME like eth0, ^docker,lo or =eth0")]
    BadIfname(#[source] IfnameSyntaxError),
    /// An unreadable `RINGCAST_BOOTSTRAP_TIMEOUT`.
    #[error(
        "RINGCAST_BOOTSTRAP_TIMEOUT={0:?} is not a positive duration up to a week: set \
         RINGCAST_BOOTSTRAP_TIMEOUT like 30 or 2.5 (seconds), or 500ms, 3s, 2min"
    )]
    BadTimeout(String),
}

impl EnvError {
    /// The variable to set to fix this.
    pub fn variable(&self) -> &'static str {
        match self {
            EnvError::NoLauncher => "RINGCAST_RANK",
            EnvError::Missing { var, .. }
            | EnvError::NotANumber { var, .. }
            | EnvError::ZeroSize { var }
            | EnvError::TooManyRanks { var, .. }
            | EnvError::RankOutOfRange { var, .. }
            | EnvError::Mismatch { var, .. }
            | EnvError::BadAddress { var, .. }
            | EnvError::BadPort { var, .. } => var,
            EnvError::NoRendezvous { .. }
            | EnvError::PortOverflow(_)
            | EnvError::BadHostlist { .. } => "RINGCAST_BOOTSTRAP",
            EnvError::BadIfname(_) => "RINGCAST_IFNAME",
            EnvError::BadTimeout(_) => "RINGCAST_BOOTSTRAP_TIMEOUT",
        }
    }
}
