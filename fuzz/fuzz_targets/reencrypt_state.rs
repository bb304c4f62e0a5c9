//! Fuzz target: arbitrary bytes as the header image of a LUKS2 volume in
//! reencryption (the reencrypt keyslot, flagged segments, a data shift).
//! Thin by design; all logic is in `luks::internal::fuzzing::reencrypt_state`.
#![no_main]
#![forbid(unsafe_code)]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    luks::internal::fuzzing::reencrypt_state(data);
});
