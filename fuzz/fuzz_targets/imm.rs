//! The immediate's layout and codec: any split is accepted or rejected without panicking, every
//! 32-bit value decodes, and decoding then encoding gives the value back.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use ringcast_core::wire::{Imm, ImmLayout};

#[derive(Arbitrary, Debug)]
struct Input {
    chunk_bits: u8,
    raw: u32,
    op_tag: u32,
    chunk: u32,
}

fuzz_target!(|input: Input| {
    let valid = (1..=ImmLayout::MAX_CHUNK_BITS).contains(&input.chunk_bits);
    let Ok(layout) = ImmLayout::new(input.chunk_bits) else {
        assert!(
            !valid,
            "rejected a valid split of {} bits",
            input.chunk_bits
        );
        return;
    };
    assert!(
        valid,
        "accepted an invalid split of {} bits",
        input.chunk_bits
    );
    assert_eq!(layout.chunk_bits() + layout.op_bits(), 32);

    let imm = layout.decode(input.raw);
    assert!(u64::from(imm.chunk) < layout.max_chunks());
    assert!(u64::from(imm.op_tag) < layout.op_tags());
    assert_eq!(layout.encode(imm), Some(input.raw));

    // Encoding checks bounds instead of truncating.
    let other = Imm {
        op_tag: input.op_tag,
        chunk: input.chunk,
    };
    match layout.encode(other) {
        Some(raw) => assert_eq!(layout.decode(raw), other),
        None => assert!(
            u64::from(other.chunk) >= layout.max_chunks()
                || u64::from(other.op_tag) >= layout.op_tags()
        ),
    }
});
