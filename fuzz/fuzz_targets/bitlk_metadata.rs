//! Fuzz target: arbitrary bytes as a BitLocker device image: the
//! metadata parser, the dump text, the activation checks and the table
//! (unlocking is left out: each try is a 2^20-round KDF). The
//! stable-Rust stand-in is the `bitlk` crate's
//! `never_panics_on_random_or_truncated_bytes` test.
#![no_main]
#![forbid(unsafe_code)]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(m) = bitlk::Metadata::read(data, "fuzz") {
        let _ = m.dump("fuzz");
        let _ = m.activate_check();
        let key = crypto::Secret::from_slice(&vec![7u8; m.key_len()]);
        let _ = m.targets("/dev/fuzz", data.len() as u64, &key);
    }
});
