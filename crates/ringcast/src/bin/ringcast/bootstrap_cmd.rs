//! `ringcast bootstrap`: read the launcher's variables, meet the other ranks, print the table.

use crate::CmdError;
use crate::args::BootstrapArgs;
use ringcast::bootstrap::{JobEnv, PeerTable};
use std::io::{BufWriter, Write};
use std::net::TcpListener;
use std::process::ExitCode;

/// Runs `ringcast bootstrap`. The control address each rank sends is that of a TCP listener on
/// its chosen interface, as the engine's control path will.
pub(crate) fn run(a: &BootstrapArgs) -> Result<ExitCode, CmdError> {
    let job = JobEnv::from_env().map_err(|e| e.to_string())?;
    let iface = job.interface().map_err(|e| e.to_string())?;
    let control = TcpListener::bind((iface.addr, 0))
        .and_then(|l| l.local_addr())
        .map_err(|e| format!("listening on {} ({}): {e}", iface.addr, iface.name))?;
    let table = job
        .exchange(control.to_string().as_bytes())
        .map_err(|e| e.to_string())?;
    let mut out = BufWriter::new(std::io::stdout().lock());
    let written = if a.json {
        let v = json(&job, &iface.name, &iface.addr.to_string(), &table);
        serde_json::to_writer(&mut out, &v)
            .map_err(std::io::Error::from)
            .and_then(|()| writeln!(out))
    } else {
        writeln!(
            out,
            "{}",
            text(&job, &iface.name, &iface.addr.to_string(), &table)
        )
    };
    written
        .and_then(|()| out.flush())
        .map_err(CmdError::Output)?;
    Ok(ExitCode::SUCCESS)
}

fn rendezvous(job: &JobEnv) -> String {
    job.rendezvous.as_ref().map_or_else(
        || "none (single rank)".to_owned(),
        |r| format!("{r} ({})", r.origin),
    )
}

fn text(job: &JobEnv, ifname: &str, addr: &str, table: &PeerTable) -> String {
    let local = job
        .local_rank
        .map_or_else(|| "?".to_owned(), |l| l.to_string());
    let peers: Vec<String> = table
        .peers
        .iter()
        .map(|p| format!("{}={}", p.rank, String::from_utf8_lossy(&p.control)))
        .collect();
    format!(
        "rank {}/{} (local {local}) via {}; rendezvous {}; interface {ifname} {addr}; nonce \
         {:016x}; peers {}",
        job.rank,
        job.world_size,
        job.launcher,
        rendezvous(job),
        table.nonce,
        peers.join(" ")
    )
}

fn json(job: &JobEnv, ifname: &str, addr: &str, table: &PeerTable) -> serde_json::Value {
    let peers: Vec<serde_json::Value> = table
        .peers
        .iter()
        .map(|p| {
            serde_json::json!({
                "rank": p.rank,
                "local_rank": p.local_rank,
                "control": String::from_utf8_lossy(&p.control),
            })
        })
        .collect();
    serde_json::json!({
        "rank": job.rank,
        "world_size": job.world_size,
        "local_rank": job.local_rank,
        "launcher": job.launcher.name(),
        "rendezvous": job.rendezvous.as_ref().map(|r| r.to_string()),
        "job_id": job.job_id,
        "interface": { "name": ifname, "addr": addr },
        "nonce": format!("{:016x}", table.nonce),
        "peers": peers,
    })
}
