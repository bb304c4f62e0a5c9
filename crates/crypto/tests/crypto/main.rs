//! The crypto crate's integration tests, one test binary (each file under
//! `tests/` would be a binary of its own to link): known-answer vectors
//! (IEEE 1619, the kernel's testmgr), the independent oracles (OpenSSL,
//! Python's `cryptography`, RustCrypto's ciphers), properties, and the
//! dm table seeds. One module per area, named as its file; run one with
//! `cargo test --release -p ucrypt-crypto --test crypto AREA::`.

mod cipher_refs;
mod ciphers;
mod kernel_vectors;
mod oracle;
mod props;
mod stacked;
mod table_seeds;
mod xts_openssl;
mod xts_vectors;
