//! Fuzz target: arbitrary bytes as the log of a LUKS1 reencryption
//! (`LUKS-<uuid>.log`, cryptsetup's text sector).
//! Thin by design; all logic is in `luks::internal::fuzzing::reencrypt_luks1_log`.
#![no_main]
#![forbid(unsafe_code)]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    luks::internal::fuzzing::reencrypt_luks1_log(data);
});
