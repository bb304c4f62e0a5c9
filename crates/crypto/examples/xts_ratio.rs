//! 512- vs 4096-byte-sector AES-XTS throughput of the automatic choice,
//! per call size and key size, as ratios: the best and the median of
//! `UCRYPT_ROUNDS` interleaved rounds (default 5; CPU time per thread). On
//! a shared machine neighbours only slow a round down, so the best round
//! is the closer estimate of the idle speed.
//!
//! `cargo run --release -p ucrypt-crypto --example xts_ratio [ms]`

use std::time::Duration;

use ucrypt_crypto as crypto;
use zeroize::Zeroizing;

use crypto::{speed, CryptConfig, SectorCrypt};

/// (best, median) of `v`.
fn best_median(mut v: Vec<f64>) -> (f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() - 1], v[v.len() / 2])
}

fn main() {
    let ms: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200);
    let rounds: usize = std::env::var("UCRYPT_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(5);
    let dur = Duration::from_millis(ms);
    for bits in [256usize, 512] {
        for per_call in [4096usize, 65536] {
            let make = |ss: u32| {
                SectorCrypt::new(&CryptConfig {
                    cipher: "aes-xts-plain64".into(),
                    key: Zeroizing::new((0..bits / 8).map(|i| i as u8).collect()),
                    iv_offset: 0,
                    sector_size: ss,
                    iv_large_sectors: false,
                })
                .expect("cipher")
            };
            let (small, large) = (make(512), make(4096));
            let mut m = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
            for _ in 0..rounds {
                let s = speed::throughput(&small, per_call, dur);
                let l = speed::throughput(&large, per_call, dur);
                m[0].push(s.encrypt_bytes_per_sec / 1e6);
                m[1].push(s.decrypt_bytes_per_sec / 1e6);
                m[2].push(l.encrypt_bytes_per_sec / 1e6);
                m[3].push(l.decrypt_bytes_per_sec / 1e6);
            }
            let [se, sd, le, ld] = m.map(best_median);
            println!(
                "{bits}b {per_call:>6} B/call  best 512: {:>5.0}/{:>5.0} 4096: {:>5.0}/{:>5.0} MB/s ratio {:.2}/{:.2}  median ratio {:.2}/{:.2}  ({})",
                se.0,
                sd.0,
                le.0,
                ld.0,
                se.0 / le.0,
                sd.0 / ld.0,
                se.1 / le.1,
                sd.1 / ld.1,
                small.implementation().split(' ').next().unwrap_or("")
            );
        }
    }
}
