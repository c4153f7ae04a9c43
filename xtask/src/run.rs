//! Running child processes with a deadline, and killing them (and what they spawned) when the
//! deadline passes or the guard is dropped.
//!
//! Children stay in xtask's process group so that Ctrl-C in a terminal reaches all of them. On a
//! timeout or an early return we kill the child's whole tree of descendants, found through
//! `/proc` (Linux); elsewhere only the direct child is killed.

use std::fmt;
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// Why a step failed.
#[derive(Debug)]
pub(crate) enum StepError {
    /// The program could not be started at all.
    Spawn { what: String, err: std::io::Error },
    /// It ran past its deadline and was killed.
    Timeout { what: String, limit: Duration },
    /// It exited unsuccessfully.
    Failed { what: String, status: ExitStatus },
    /// Anything else, with a message for the user.
    Other(String),
}

impl fmt::Display for StepError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StepError::Spawn { what, err } => write!(f, "could not start `{what}`: {err}"),
            StepError::Timeout { what, limit } => {
                write!(
                    f,
                    "`{what}` ran longer than {}s and was killed",
                    limit.as_secs()
                )
            }
            StepError::Failed { what, status } => write!(f, "`{what}` failed ({status})"),
            StepError::Other(msg) => f.write_str(msg),
        }
    }
}

impl std::error::Error for StepError {}

/// A spawned child that is killed, with its descendants, when dropped before it was reaped.
struct ChildGuard {
    child: Child,
    reaped: bool,
}

impl ChildGuard {
    fn kill_tree(&mut self) {
        let root = self.child.id();
        let pids = descendants(root);
        if !pids.is_empty() {
            // The shell's builtin `kill` exists even where procps is not installed.
            let list: Vec<String> = pids.iter().map(u32::to_string).collect();
            let _ = Command::new("sh")
                .arg("-c")
                .arg(format!("kill -KILL {} 2>/dev/null", list.join(" ")))
                .stdin(Stdio::null())
                .status();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.reaped = true;
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if !self.reaped {
            self.kill_tree();
        }
    }
}

/// All descendants of `root` (not `root` itself), children first, from `/proc/*/stat`.
fn descendants(root: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut parent_of: Vec<(u32, u32)> = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // Format: "pid (comm) state ppid ..."; comm may contain spaces and parentheses.
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
            continue;
        };
        if let Some(ppid) = rest.split_whitespace().nth(1).and_then(|s| s.parse().ok()) {
            parent_of.push((pid, ppid));
        }
    }
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(
            parent_of
                .iter()
                .filter(|&&(_, pp)| pp == p)
                .map(|&(c, _)| c),
        );
        i += 1;
    }
    found.remove(0);
    found
}

/// A command line to run as one step of a task.
pub(crate) struct Step {
    cmd: Command,
    what: String,
    limit: Duration,
}

impl Step {
    /// `program args...`, run in `dir`, killed after `limit`.
    pub(crate) fn new(dir: &Path, program: &str, args: &[&str], limit: Duration) -> Self {
        let mut cmd = Command::new(program);
        cmd.args(args).current_dir(dir).stdin(Stdio::null());
        let what = std::iter::once(program)
            .chain(args.iter().copied())
            .collect::<Vec<_>>()
            .join(" ");
        Step { cmd, what, limit }
    }

    /// Sets an environment variable for the child (shown in messages).
    pub(crate) fn env(mut self, key: &str, value: &str) -> Self {
        self.cmd.env(key, value);
        self.what = format!("{key}={value} {}", self.what);
        self
    }

    /// The command line, for messages.
    pub(crate) fn what(&self) -> &str {
        &self.what
    }

    /// Runs with inherited stdout/stderr; errors unless it exits successfully in time.
    pub(crate) fn run(mut self) -> Result<(), StepError> {
        eprintln!("$ {}", self.what);
        let start = Instant::now();
        let status = wait_deadline(&mut self.cmd, &self.what, self.limit)?;
        eprintln!("  ({:.1}s)", start.elapsed().as_secs_f64());
        if status.success() {
            Ok(())
        } else {
            Err(StepError::Failed {
                what: self.what,
                status,
            })
        }
    }

    /// Runs with stdout captured into `file` (then read back); errors like [`Step::run`].
    pub(crate) fn capture(mut self, file: &Path) -> Result<String, StepError> {
        let io = |e: std::io::Error| StepError::Other(format!("{}: {e}", file.display()));
        self.cmd.stdout(std::fs::File::create(file).map_err(io)?);
        let status = wait_deadline(&mut self.cmd, &self.what, self.limit)?;
        if !status.success() {
            return Err(StepError::Failed {
                what: self.what,
                status,
            });
        }
        std::fs::read_to_string(file).map_err(io)
    }

    /// Runs silently; true if it started and exited successfully in time. For probes.
    pub(crate) fn probe(mut self) -> bool {
        self.cmd.stdout(Stdio::null()).stderr(Stdio::null());
        matches!(wait_deadline(&mut self.cmd, &self.what, self.limit), Ok(s) if s.success())
    }
}

fn wait_deadline(cmd: &mut Command, what: &str, limit: Duration) -> Result<ExitStatus, StepError> {
    let child = cmd.spawn().map_err(|err| StepError::Spawn {
        what: what.to_owned(),
        err,
    })?;
    let mut guard = ChildGuard {
        child,
        reaped: false,
    };
    let deadline = Instant::now() + limit;
    loop {
        match guard.child.try_wait() {
            Ok(Some(status)) => {
                guard.reaped = true;
                return Ok(status);
            }
            Ok(None) => {}
            Err(e) => return Err(StepError::Other(format!("waiting for `{what}`: {e}"))),
        }
        if Instant::now() >= deadline {
            guard.kill_tree();
            return Err(StepError::Timeout {
                what: what.to_owned(),
                limit,
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}
