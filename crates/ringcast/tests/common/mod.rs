//! Helpers the Communicator test binaries share: ports, nonces, data patterns, checks.
// Each test binary uses its own subset.
#![allow(dead_code)]

use ringcast::comm::OpStats;
use ringcast::{CommError, Communicator};
use std::net::{TcpListener, UdpSocket};

/// A UDP port nobody holds now.
pub(crate) fn free_udp_port() -> u16 {
    UdpSocket::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// A TCP port nobody holds now.
pub(crate) fn free_tcp_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// One splitmix64 step (the core's mixer).
pub(crate) fn splitmix(z: u64) -> u64 {
    ringcast::core::port::mix(z.wrapping_add(0x9E37_79B9_7F4A_7C15))
}

/// A job nonce no other test run draws.
pub(crate) fn nonce(salt: u64) -> u64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    splitmix(t ^ (u64::from(std::process::id()) << 32) ^ salt)
}

/// Rank `r`'s data for operation `salt`: differs per 256-byte step, so a chunk at the wrong
/// offset is caught.
pub(crate) fn pattern(salt: u64, r: u32, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (splitmix(salt ^ (u64::from(r) << 40) ^ (i as u64 >> 8)) as u8) ^ (i as u8))
        .collect()
}

/// `got` equals `want`, or where they first differ.
pub(crate) fn check<T: PartialEq + std::fmt::Debug>(
    what: &str,
    got: &[T],
    want: &[T],
) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} elements, want {}",
            got.len(),
            want.len()
        ));
    }
    match got.iter().zip(want).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what}: element {i} is {:?}, want {:?}",
            got[i], want[i]
        )),
    }
}

/// A Broadcast from `root` of `pattern(salt, root, len)`, checked byte for byte on every rank
/// (`what` names it in an error); its stats.
pub(crate) fn broadcast_checked(
    comm: &Communicator,
    what: &str,
    salt: u64,
    root: u32,
    len: usize,
) -> Result<OpStats, String> {
    let want = pattern(salt, root, len);
    let mut buf = if comm.rank() == root {
        want.clone()
    } else {
        vec![0; len]
    };
    let st = comm.broadcast(root, &mut buf).map_err(e)?;
    check(what, &buf, &want)?;
    Ok(st)
}

/// An error as the tests report it.
pub(crate) fn e(x: CommError) -> String {
    x.to_string()
}
