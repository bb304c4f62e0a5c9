//! Fuzz target: arbitrary bytes as a FileVault 2 device image: the Core
//! Storage metadata parser (CRC32C checks, the encrypted metadata blocks,
//! the XML search), the dump text and the table (unlocking is left out:
//! PBKDF2 with the image's own iteration count). The stable-Rust stand-in
//! is the `fvault2` crate's `never_panics_on_random_or_truncated_bytes`.
#![no_main]
#![forbid(unsafe_code)]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(m) = fvault2::Metadata::read(data, "fuzz") {
        let _ = m.dump("fuzz");
        let key = crypto::Secret::from_slice(&[7u8; 32]);
        let _ = m.targets("/dev/fuzz", data.len() as u64, &key);
    }
});
