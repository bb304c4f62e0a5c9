//! Fuzz target: arbitrary bytes as the transmission phase of an NBD session
//! (after `NBD_OPT_GO`), against an in-process server over the mem backend.
//! Thin by design; the logic is in `nbd::internal::fuzzing::transmission`.
#![no_main]
#![feature(cfg_sanitize)]

mod common;

#[global_allocator]
static ALLOC: common::Recycle = common::Recycle;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let (engine, _) = common::setup();
    nbd::internal::fuzzing::transmission(engine, data);
});
