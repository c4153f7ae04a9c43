//! Local runs: this binary re-executed as N rank processes on loopback (`RINGCAST_RANK`,
//! `RINGCAST_WORLD_SIZE`, `RINGCAST_BOOTSTRAP`, `RINGCAST_PORT` and the hidden `--child`
//! flag). Ranks report to the parent in `@@TAG body` lines on their stdout; the parent alone
//! writes the user's output, so a closed pipe stops it (and its children) quietly. Every wait
//! has a deadline: ranks silent for too long are killed.

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
        "{flags}: {ranks} local ranks would hold about {} MiB at once, more than the {} MiB \
         this host has available; use smaller --sizes or fewer ranks",
        need >> 20,
        available >> 20
    )
    .into())
}

/// `MemAvailable` from `/proc/meminfo`, in bytes.
fn mem_available() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    meminfo_available(&info)
}

/// The `MemAvailable:` line of a `/proc/meminfo` text, in bytes.
fn meminfo_available(info: &str) -> Option<u64> {
    let line = info.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// A report line from a child: `@@TAG body`.
pub(crate) fn report(tag: &str, body: &str) -> Result<(), CmdError> {
    let mut out = std::io::stdout().lock();
    writeln!(out, "@@{tag} {body}")
        .and_then(|()| out.flush())
        .map_err(CmdError::Output)
}

/// N rank processes; killed when dropped, so no early return leaves one behind.
pub(crate) struct LocalRanks {
    kids: Vec<Child>,
    lines: Receiver<(u32, Option<String>)>,
    /// Ranks that failed, with what they said.
    errors: Vec<(u32, String)>,
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
            lines,
            errors: Vec::new(),
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
    /// checks their exit statuses. `ERR` reports are collected; the run fails with them (and
    /// with any rank that exited non-zero or stayed silent past `timeout`).
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
                    if tag == "ERR" {
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
                    let silent: Vec<String> = (0..closed.len())
                        .filter(|&r| !closed[r])
                        .map(|r| r.to_string())
                        .collect();
                    self.errors.push((
                        u32::MAX,
                        format!("rank(s) {} silent for {wait:?}: killed", silent.join(", ")),
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
        self.errors.sort();
        let lines: Vec<String> = self
            .errors
            .iter()
            .map(|(r, e)| match *r {
                u32::MAX => e.clone(),
                r => format!("rank {r}: {e}"),
            })
            .collect();
        Err(CmdError::Run(lines.join("\n  ")))
    }

    fn kill(&mut self) {
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
