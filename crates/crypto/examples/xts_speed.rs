//! Compares the XTS implementations on this machine (512- and 4096-byte
//! sectors, one thread, one call per 4 KiB or per 1 MiB), next to the
//! system `openssl speed -evp aes-256-xts -bytes 4096` figure when available.
//!
//! `cargo run --release -p ucrypt-crypto --example xts_speed`

use std::time::Duration;

use ucrypt_crypto as crypto;
use zeroize::Zeroizing;

use crypto::{speed, CryptConfig, Provider, SectorCrypt};

fn main() {
    let dur = Duration::from_millis(400);
    for (bits, ss) in [(256usize, 512u32), (256, 4096), (512, 512), (512, 4096)] {
        for imp in [
            Provider::Vaes,
            Provider::AesNi,
            Provider::OpenSsl,
            Provider::Rust,
        ] {
            let cfg = CryptConfig {
                cipher: "aes-xts-plain64".into(),
                key: Zeroizing::new((0..bits / 8).map(|i| i as u8).collect()),
                iv_offset: 0,
                sector_size: ss,
                iv_large_sectors: false,
            };
            let c = SectorCrypt::with_provider(&cfg, imp).expect("cipher");
            for per_call in [4096usize, 1 << 20] {
                let t = speed::throughput(&c, per_call, dur);
                println!(
                    "aes-xts {bits}b ss {ss:>4} {:<60.60} {:>8} B/call  enc {:>7.0} MB/s  dec {:>7.0} MB/s",
                    c.implementation(),
                    per_call,
                    t.encrypt_bytes_per_sec / 1e6,
                    t.decrypt_bytes_per_sec / 1e6
                );
            }
        }
    }
    for spec in ["aes-ecb", "aes-cbc-essiv:sha256"] {
        let cfg = CryptConfig {
            cipher: spec.into(),
            key: Zeroizing::new(vec![7; 32]),
            iv_offset: 0,
            sector_size: 4096,
            iv_large_sectors: false,
        };
        let c = SectorCrypt::new(&cfg).expect("cipher");
        let t = speed::throughput(&c, 1 << 20, dur);
        println!(
            "{spec} 256b enc {:>7.0} MB/s  dec {:>7.0} MB/s",
            t.encrypt_bytes_per_sec / 1e6,
            t.decrypt_bytes_per_sec / 1e6
        );
    }
    match speed::system_openssl_xts(Duration::from_secs(1)) {
        Ok(bps) => println!(
            "system openssl speed -evp aes-256-xts -bytes 4096: {:.0} MB/s",
            bps / 1e6
        ),
        Err(e) => println!("system openssl speed unavailable: {e}"),
    }
}
