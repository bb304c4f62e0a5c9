//! Fuzz target: arbitrary bytes as a LUKS1/LUKS2 header image. Thin by
//! design; all logic is in `luks::internal::fuzzing::header`.
#![no_main]
#![forbid(unsafe_code)]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    luks::internal::fuzzing::header(data);
});
