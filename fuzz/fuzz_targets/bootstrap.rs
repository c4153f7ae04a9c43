//! What peers send before a communicator exists: the rendezvous hello and reply (the first
//! byte is the job's world size, the rest the message) and the start-up check's report on
//! the control mesh (the whole input). Whatever parses must encode back to what it was read
//! from; nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Some((&world, msg)) = data.split_first() {
        let _ = ringcast::fuzzing::bootstrap_wire(msg, u32::from(world));
    }
    let _ = ringcast::fuzzing::startup_report(data);
});
