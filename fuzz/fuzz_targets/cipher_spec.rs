//! Fuzz target: arbitrary text as a dm-crypt cipher spec. A spec that
//! parses gives back its text and parses again to the same value. Thin by
//! design; the parser is `crypto::CipherSpec::parse`.
#![no_main]
#![forbid(unsafe_code)]

use crypto::CipherSpec;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(s) = CipherSpec::parse(text) {
        assert_eq!(s.as_str(), text);
        assert_eq!(CipherSpec::parse(s.as_str()).expect("reparses"), s);
        for len in [0, 16, 32, 64] {
            let _ = s.check_key_len(len);
        }
        let _ = (s.iv_size(), s.subkey_sizes());
    }
});
