//! Fuzz target: arbitrary bytes as a LUKS2 token's JSON (what
//! `tokens::parse` reads before unlocking: systemd-tpm2's blob and PCRs,
//! systemd-pkcs11's URI and key, luks2-keyring's description), and a
//! PKCS#11 URI. Thin by design.
#![no_main]
#![forbid(unsafe_code)]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = tokens::parse(0, data);
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = tokens::pkcs11::Uri::parse(text);
    }
});
