//! Fuzz target: arbitrary bytes as a TrueCrypt/VeraCrypt header sector
//! decrypted with an arbitrary key area by an arbitrary cipher chain, then
//! parsed; a header that parses is laid out as a volume on a device of
//! arbitrary size (offsets, table, dump). Nothing may panic. The PBKDF2
//! step is skipped (500,000 iterations a try); `tcrypt::kdf` has its own
//! tests. Thin by design: the parsers are `tcrypt::algs::decrypt_header`
//! and `tcrypt::Header::parse`.
#![no_main]
#![forbid(unsafe_code)]

use tcrypt::{algs, Header, Request, Volume, HDR_KEY_LEN, HDR_LEN};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let chain = &algs::CHAINS[usize::from(pick) % algs::CHAINS.len()];
    let (key, rest) = rest.split_at(rest.len().min(HDR_KEY_LEN));
    let mut key = key.to_vec();
    key.resize(HDR_KEY_LEN, 0);
    let (hdr, rest) = rest.split_at(rest.len().min(HDR_LEN));
    let mut buf = hdr.to_vec();
    buf.resize(HDR_LEN, 0);
    // Decrypted as a header, or taken as already decrypted.
    let mut dec = buf.clone();
    let _ = algs::decrypt_header(chain, &key, &mut dec);
    for d in [&dec, &buf] {
        for vera in [false, true] {
            let Some(header) = Header::parse(d, vera) else {
                continue;
            };
            let size = rest
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .map_or(1 << 20, u64::from_le_bytes);
            for (hidden, system) in [(false, false), (true, false), (false, true)] {
                let v = Volume {
                    header: header.clone(),
                    hash: "sha512",
                    chain,
                    request: Request {
                        hidden,
                        system,
                        ..Request::default()
                    },
                    device_size: size,
                };
                let _ = (v.data_offset(), v.iv_offset(), v.size_sectors());
                let _ = v.table("/dev/fuzz");
                let _ = v.dump("/dev/fuzz");
                let _ = v.dump_volume_key("/dev/fuzz");
            }
        }
    }
});
