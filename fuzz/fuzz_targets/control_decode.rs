//! Fuzz target: arbitrary text as a control-socket line, decoded both as a
//! request (the daemon's side) and as a reply (the client's side). A line
//! that decodes re-encodes to a line that decodes again (requests to the
//! same value). Thin by design; the decoders are
//! `daemon::control::decode_request` / `decode_reply`.
#![no_main]
#![forbid(unsafe_code)]

use daemon::control::{decode_reply, decode_request, encode_reply, encode_request};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(r) = decode_request(line) {
        let again = decode_request(&encode_request(&r)).expect("an encoded request decodes");
        assert_eq!(again, r);
    }
    if let Ok(r) = decode_reply(line) {
        decode_reply(&encode_reply(&r)).expect("an encoded reply decodes");
    }
});
