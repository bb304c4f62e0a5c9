//! Fuzz target: arbitrary bytes as the signature JSON of a signed TPM2
//! PCR policy (`tokens::signature::find`, what `systemd-measure sign`
//! writes) and as a PEM public key (`PublicKey::from_pem`). Thin by design.
#![no_main]
#![forbid(unsafe_code)]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let _ = tokens::signature::find(data, "sha256", 1 << 11, &[0xaa; 32], &[0x01; 32]);
    let _ = tokens::signature::PublicKey::from_pem(data);
});
