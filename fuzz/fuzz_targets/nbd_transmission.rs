//! Fuzz target: arbitrary bytes as the transmission phase of an NBD session
//! (after `NBD_OPT_GO`), against an in-process server over the mem backend.
//! Thin by design; the logic is in `nbd::internal::fuzzing::transmission`.
#![no_main]
#![deny(unsafe_code)]
#![feature(cfg_sanitize)]

// The shared module holds the one unsafe: the SIGPIPE disposition and the
// poisoning allocator, each with its SAFETY note.
#[allow(unsafe_code)]
mod common;

#[global_allocator]
static ALLOC: common::Recycle = common::Recycle;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let (engine, _) = common::setup();
    nbd::internal::fuzzing::transmission(engine, data);
});
