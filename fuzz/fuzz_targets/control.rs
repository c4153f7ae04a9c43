//! Control messages from the network: parsing never panics, and whatever parses is canonical,
//! so emitting it gives back exactly the input bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ringcast_core::wire::ControlRepr;

fuzz_target!(|data: &[u8]| {
    let Ok(repr) = ControlRepr::parse_bytes(data) else {
        return;
    };
    assert_eq!(repr.buffer_len(), data.len());
    let mut out = Vec::new();
    repr.emit_vec(&mut out)
        .expect("a parsed message must re-encode");
    assert_eq!(out, data, "re-encoding {repr:?} changed the bytes");
    assert_eq!(ControlRepr::parse_bytes(&out), Ok(repr));
});
