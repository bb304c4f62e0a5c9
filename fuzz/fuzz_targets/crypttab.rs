//! Fuzz target: arbitrary text as /etc/crypttab (`daemon::crypttab::parse`,
//! what `open --crypttab` reads). Thin by design.
#![no_main]
#![forbid(unsafe_code)]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = daemon::crypttab::parse(text, "crypttab");
    }
});
