//! The control mesh's TCP framing: the bytes a peer sends on its connection, decoded as the
//! I/O thread decodes them, fed in slices split where the input says. Nothing may panic; the
//! decoder holds no more than the limits allow; the same frames come out, with the same
//! verdict, whether the bytes come whole, byte by byte or in the chosen slices, and they are
//! the frames the format says; every frame re-encodes to its bytes. The same bytes read as a
//! start-up hello give the same answer however they are split, and a hello re-encodes to its
//! bytes.
//!
//! Input: `[max_message] [max_read] [step] [n] [n slice sizes] [stream]`: each limit 8 times
//! its byte (255: no limit), a read buffer of `step % 64 + 1` bytes at first, `n % 8` slice
//! sizes of their byte plus one (used in turn, cycled).
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringcast_transport_rocev2_udp::control::fuzzing::{Limits, read_hello};

fn limit(b: u8) -> u64 {
    if b == u8::MAX {
        u64::MAX
    } else {
        u64::from(b) * 8
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&[message, read, step, n], rest)) = data.split_first_chunk::<4>() else {
        return;
    };
    let (sizes, stream) = rest.split_at(usize::from(n % 8).min(rest.len()));
    let splits: Vec<usize> = sizes.iter().map(|&s| usize::from(s) + 1).collect();
    let limits = Limits {
        max_message: usize::try_from(limit(message)).unwrap_or(usize::MAX),
        max_read: limit(read),
        step: usize::from(step % 64) + 1,
    };
    let whole = limits.decode(stream, &[]);
    assert_eq!(limits.spec(stream), whole, "not what the format says");
    assert_eq!(limits.decode(stream, &[1]), whole, "byte by byte");
    assert_eq!(
        limits.decode(stream, &splits),
        whole,
        "in slices of {splits:?}"
    );
    let hello = read_hello(stream, &[]);
    assert_eq!(read_hello(stream, &[1]), hello, "a hello byte by byte");
    assert_eq!(
        read_hello(stream, &splits),
        hello,
        "a hello in slices of {splits:?}"
    );
});
