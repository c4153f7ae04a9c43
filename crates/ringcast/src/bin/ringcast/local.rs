//! Local runs: this binary re-executed as N rank processes on loopback (`RINGCAST_RANK`,
//! `RINGCAST_WORLD_SIZE`, `RINGCAST_BOOTSTRAP`, `RINGCAST_PORT` and the hidden `--child`
//! flag). Ranks report to the parent in `@@TAG body` lines on their stdout; the parent alone
//! writes the user's output, so a closed pipe stops it (and its children) quietly. Every wait
//! has a deadline: ranks silent for too long are killed. A rank dies with its parent
//! ([`exit_with_parent`]): a parent killed by a signal aimed at it alone, which skips its
//! clean-up, takes its ranks with it, a stopped (hung) one included.

use crate::CmdError;
use ringcast::bootstrap::{PortKind, free_local_port};
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::thread;
use std::time::{Duration, Instant};

/// How long the other ranks get to report their own errors after one rank failed.
const GRACE: Duration = Duration::from_secs(15);

/// Most rank processes a local run spawns: each is a process with several threads, and
/// thousands of them exhaust the process table long before they teach anything.
pub(crate) const MAX_LOCAL_RANKS: u32 = 256;

/// `Err` naming `flag` unless `ranks` local rank processes may be spawned.
pub(crate) fn check_ranks(ranks: u32, flag: &str) -> Result<(), CmdError> {
    if ranks == 0 {
        return Err(format!("{flag} must be at least 1").into());
    }
    if ranks > MAX_LOCAL_RANKS {
        return Err(format!(
            "{flag} {ranks}: a local run spawns at most {MAX_LOCAL_RANKS} rank processes \
             (run more under a launcher: mpirun, srun, torchrun)"
        )
        .into());
    }
    Ok(())
}

/// `Err` naming `flags` when `ranks` local rank processes, each holding `per_rank` bytes at
/// once, would need more memory than this host has available (`MemAvailable` in
/// `/proc/meminfo`; unchecked where it cannot be read). Allocations past it are not refused
/// by the kernel, which overcommits: the ranks would touch their pages and be killed.
pub(crate) fn check_memory(ranks: u32, per_rank: u64, flags: &str) -> Result<(), CmdError> {
    let Some(available) = mem_available() else {
        return Ok(());
    };
    let need = u128::from(ranks) * u128::from(per_rank);
    if need <= u128::from(available) {
        return Ok(());
    }
    Err(format!(
        "{flags}: {ranks} local rank{} would hold about {} MiB at once, more than the {} MiB \
         this host has available; use smaller --sizes or fewer ranks",
        if ranks == 1 { "" } else { "s" },
        need >> 20,
        available >> 20
    )
    .into())
}

/// `MemAvailable` from `/proc/meminfo`, in bytes.
pub(crate) fn mem_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    meminfo_available(&info)
}

/// The `MemAvailable:` line of a `/proc/meminfo` text, in bytes.
fn meminfo_available(info: &str) -> Option<u64> {
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The variable that gives a rank of a local run its parent's process id
/// ([`exit_with_parent`]).
const PARENT: &str = "RINGCAST_LOCAL_PARENT";

/// In a rank of a local run: the kernel kills this process when its parent goes
/// (`PR_SET_PDEATHSIG`, `SIGKILL`: a stopped process too), however the parent went; and if it
/// went before this call, the rank leaves now. A normal run's ranks exit before their parent.
/// The signal comes when the thread that spawned the ranks ends: the parent's main thread.
pub(crate) fn exit_with_parent() {
    let Some(parent) = std::env::var(PARENT)
        .ok()
        .and_then(|p| p.parse::<i32>().ok())
    else {
        return;
    };
    use rustix::process::{Pid, Signal, getppid, set_parent_process_death_signal};
    if let Err(e) = set_parent_process_death_signal(Some(Signal::KILL)) {
        tracing::warn!(error = %e, "this rank may outlive its parent");
    }
    if Pid::as_raw(getppid()) != parent {
        std::process::exit(3);
    }
}

/// A report line from a child: `@@TAG body`.
pub(crate) fn report(tag: &str, body: &str) -> Result<(), CmdError> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "@@{tag} {body}")
        .and_then(|()| out.flush())
        .map_err(CmdError::Output)
}

/// In a rank of a local run: reports its error to the parent, bad settings (`BAD`: exit
/// status 2 when every rank says so) apart from a failed run (`ERR`: 1).
pub(crate) fn report_error(e: &CmdError) -> Result<(), CmdError> {
    match e {
        CmdError::Msg(m) => report("BAD", m),
        CmdError::Run(m) => report("ERR", m),
        CmdError::Output(_) => Ok(()),
    }
}

/// N rank processes; killed when dropped, so no early return leaves one behind.
pub(crate) struct LocalRanks {
    kids: Vec<Child>,
    /// The ranks this parent killed (their exit status is its own doing).
    killed: bool,
    lines: Receiver<(u32, Option<String>)>,
    /// Ranks that failed, with what they said.
    errors: Vec<(u32, String)>,
    /// Of `errors`, those a rank reported as bad settings (`BAD`, not `ERR`).
    bad_settings: usize,
    open: usize,
}

impl LocalRanks {
    /// Re-executes this binary with its own arguments plus `--child` (right after the
    /// subcommand: after a `--` it would be taken for a positional argument), `ranks` times.
    pub(crate) fn spawn(ranks: u32) -> Result<Self, CmdError> {
        check_ranks(ranks, "the number of local ranks")?;
        let exe = std::env::current_exe().map_err(|e| format!("finding this binary: {e}"))?;
        let bootstrap = format!("127.0.0.1:{}", free_port(false)?);
        let udp = free_port(true)?.to_string();
        let (tx, lines) = mpsc::channel();
        let mut me = LocalRanks {
            kids: Vec::new(),
            killed: false,
            lines,
            errors: Vec::new(),
            bad_settings: 0,
            open: ranks as usize,
        };
        for r in 0..ranks {
            let mut args = std::env::args_os().skip(1);
            let mut child = Command::new(&exe)
                .args(args.next())
                .arg("--child")
                .args(args)
                .env("RINGCAST_RANK", r.to_string())
                .env("RINGCAST_WORLD_SIZE", ranks.to_string())
                .env("RINGCAST_BOOTSTRAP", &bootstrap)
                .env("RINGCAST_PORT", &udp)
                .env("RINGCAST_BOOTSTRAP_TIMEOUT", "30")
                .env(PARENT, std::process::id().to_string())
                .env_remove("RINGCAST_IFNAME")
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit())
                .spawn()
                .map_err(|e| format!("starting rank {r}: {e}"))?;
            let out = child.stdout.take().ok_or("a child without stdout")?;
            me.kids.push(child);
            let tx = tx.clone();
            thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    let _ = tx.send((r, Some(line)));
                }
                let _ = tx.send((r, None));
            });
        }
        Ok(me)
    }

    /// Feeds every report to `on(rank, tag, body)` until every rank closed its output, then
    /// checks their exit statuses. `ERR` and `BAD` reports are collected; the run fails with
    /// them (and with any rank that exited non-zero or stayed silent past `timeout`), as a
    /// usage error ([`CmdError::Msg`]) when every one was a `BAD`.
    pub(crate) fn drive(
        mut self,
        timeout: Duration,
        mut on: impl FnMut(u32, &str, &str) -> Result<(), CmdError>,
    ) -> Result<(), CmdError> {
        let mut wait = timeout;
        let mut closed = vec![false; self.kids.len()];
        while self.open > 0 {
            match self.lines.recv_timeout(wait) {
                Ok((r, Some(line))) => {
                    let Some(rest) = line.strip_prefix("@@") else {
                        continue;
                    };
                    let (tag, body) = rest.split_once(' ').unwrap_or((rest, ""));
                    if tag == "ERR" || tag == "BAD" {
                        self.bad_settings += usize::from(tag == "BAD");
                        self.errors.push((r, body.to_owned()));
                        // The others fail soon (the rank is gone): give them time to say how.
                        wait = GRACE.min(timeout);
                    } else {
                        on(r, tag, body)?;
                    }
                }
                Ok((r, None)) => {
                    closed[r as usize] = true;
                    self.open -= 1;
                }
                Err(RecvTimeoutError::Timeout) | Err(RecvTimeoutError::Disconnected) => {
                    let running: Vec<String> = (0..closed.len())
                        .filter(|&r| !closed[r])
                        .map(|r| r.to_string())
                        .collect();
                    self.errors.push((
                        u32::MAX,
                        format!(
                            "nothing heard from the ranks for {wait:?} (--timeout), rank(s) {} \
                             still running: killed (a hung rank is named by its peers after \
                             --peer-timeout, when that is shorter)",
                            running.join(", ")
                        ),
                    ));
                    self.kill();
                    break;
                }
            }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        for r in 0..self.kids.len() {
            match wait_until(&mut self.kids[r], deadline) {
                Some(st) if st.success() => {}
                // Killed here: said above.
                Some(_) if self.killed => {}
                Some(st) if !self.errors.iter().any(|(e, _)| *e as usize == r) => {
                    self.errors.push((r as u32, format!("exited with {st}")));
                }
                Some(_) => {}
                None => {
                    let _ = self.kids[r].kill();
                    self.errors.push((r as u32, "did not exit: killed".into()));
                }
            }
        }
        if self.errors.is_empty() {
            return Ok(());
        }
        // Every rank refused its settings (the same, from the same flags and environment):
        // a usage error, as it is without --local.
        let bad = self.bad_settings == self.errors.len();
        let lines = said(&mut self.errors).join("\n  ");
        Err(if bad {
            CmdError::Msg(lines)
        } else {
            CmdError::Run(lines)
        })
    }

    fn kill(&mut self) {
        self.killed = true;
        for c in &mut self.kids {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for LocalRanks {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The ranks' errors as lines, in rank order, one per message: ranks that said the same (a
/// setting every rank refuses) share a line (`ranks 0, 1: ...`); the parent's own last.
fn said(errors: &mut [(u32, String)]) -> Vec<String> {
    errors.sort();
    let mut lines: Vec<(Vec<u32>, &str)> = Vec::new();
    for (r, e) in errors.iter() {
        match lines.iter_mut().find(|(_, m)| *m == e.as_str()) {
            Some((ranks, _)) => ranks.push(*r),
            None => lines.push((vec![*r], e)),
        }
    }
    lines
        .into_iter()
        .map(|(ranks, e)| match ranks[..] {
            [u32::MAX] => e.to_owned(),
            [r] => format!("rank {r}: {e}"),
            _ => {
                let list: Vec<String> = ranks.iter().map(u32::to_string).collect();
                format!("ranks {}: {e}", list.join(", "))
            }
        })
        .collect()
}

fn wait_until(c: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    loop {
        match c.try_wait() {
            Ok(Some(st)) => return Some(st),
            Ok(None) if Instant::now() < deadline => thread::sleep(Duration::from_millis(10)),
            _ => return None,
        }
    }
}

/// A port free now for the local ranks ([`ringcast::bootstrap::free_local_port`]).
fn free_port(udp: bool) -> Result<u16, String> {
    let kind = if udp { PortKind::Udp } else { PortKind::Tcp };
    free_local_port(kind).map_err(|e| format!("finding a free port: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Ranks that said the same share a line; the parent's own comes last, unnamed.
    #[test]
    fn the_same_error_of_several_ranks_is_said_once() {
        let mut errors = vec![
            (2, "lanes: 0".to_owned()),
            (u32::MAX, "nothing heard".to_owned()),
            (0, "lanes: 0".to_owned()),
            (1, "PeerLost { peer: 3 }".to_owned()),
            (3, "lanes: 0".to_owned()),
        ];
        assert_eq!(
            said(&mut errors),
            [
                "ranks 0, 2, 3: lanes: 0",
                "rank 1: PeerLost { peer: 3 }",
                "nothing heard"
            ]
        );
    }

    #[test]
    fn meminfo_s_available_memory_is_read_in_bytes() {
        let info = "MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   20480 kB\n";
        assert_eq!(meminfo_available(info), Some(20 << 20));
        assert_eq!(meminfo_available("MemTotal: 5 kB\n"), None);
        assert_eq!(meminfo_available("MemAvailable: lots kB\n"), None);
    }

    #[test]
    fn memory_a_run_cannot_have_is_refused_naming_the_flags() {
        let Some(available) = mem_available() else {
            return;
        };
        assert!(check_memory(1, available / 2, "--sizes").is_ok());
        match check_memory(4, available / 2, "--sizes / --local") {
            Err(CmdError::Msg(m)) => assert!(m.contains("--sizes / --local"), "{m}"),
            _ => panic!("four ranks of half the memory each were let through"),
        }
    }
}
