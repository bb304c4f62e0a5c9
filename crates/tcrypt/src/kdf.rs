//! The header key: PBKDF2-HMAC with TrueCrypt's and VeraCrypt's hashes
//! and iteration counts (cryptsetup's `tcrypt_kdf` table, in its order),
//! run on all cores.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use zeroize::Zeroizing;

use crate::{Request, HDR_KEY_LEN};

/// One KDF variant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    /// Only with legacy modes (TrueCrypt before 5.0).
    pub legacy: bool,
    /// Only with VeraCrypt modes.
    pub veracrypt: bool,
    /// The hash (`sha512`, `whirlpool`, …).
    pub hash: &'static str,
    /// Iterations without a PIM.
    pub iterations: u32,
    /// With a PIM: `pim_const + pim_mult * pim` iterations.
    pub pim_const: u32,
    /// See `pim_const`.
    pub pim_mult: u32,
}

const fn v(
    legacy: bool,
    veracrypt: bool,
    hash: &'static str,
    iterations: u32,
    pim_const: u32,
    pim_mult: u32,
) -> Variant {
    Variant {
        legacy,
        veracrypt,
        hash,
        iterations,
        pim_const,
        pim_mult,
    }
}

/// Every variant in cryptsetup 2.6.1's order.
pub static VARIANTS: &[Variant] = &[
    v(false, false, "ripemd160", 2000, 0, 0),
    v(false, false, "ripemd160", 1000, 0, 0),
    v(false, false, "sha512", 1000, 0, 0),
    v(false, false, "whirlpool", 1000, 0, 0),
    v(true, false, "sha1", 2000, 0, 0),
    v(false, true, "sha512", 500_000, 15000, 1000),
    v(false, true, "whirlpool", 500_000, 15000, 1000),
    v(false, true, "sha256", 500_000, 15000, 1000),
    // VeraCrypt system encryption (boot loader) counts.
    v(false, true, "sha256", 200_000, 0, 2048),
    v(false, true, "ripemd160", 655_331, 15000, 1000),
    v(false, true, "ripemd160", 327_661, 0, 2048),
    v(false, true, "stribog512", 500_000, 15000, 1000),
];

/// The variants `req` tries, each with its iteration count: a PIM leaves
/// only VeraCrypt's and scales them.
pub fn candidates(req: &Request) -> Vec<(Variant, u32)> {
    VARIANTS
        .iter()
        .filter(|k| req.hash.as_deref().is_none_or(|h| h == k.hash))
        .filter(|k| req.legacy || !k.legacy)
        .filter(|k| req.veracrypt || !k.veracrypt)
        .filter(|k| !(req.veracrypt && req.pim != 0 && !k.veracrypt))
        .map(|k| {
            let it = if req.veracrypt && req.pim != 0 {
                k.pim_const
                    .saturating_add(k.pim_mult.saturating_mul(req.pim))
            } else {
                k.iterations
            };
            (*k, it)
        })
        .collect()
}

/// PBKDF2-HMAC-`hash` of `password` and `salt`; `None` for an unknown hash.
pub fn derive(
    hash: &str,
    password: &[u8],
    salt: &[u8],
    iterations: u32,
) -> Option<Zeroizing<Vec<u8>>> {
    use pbkdf2::pbkdf2;
    type H<D> = hmac::Hmac<D>;
    let mut out = Zeroizing::new(vec![0u8; HDR_KEY_LEN]);
    let r = match hash {
        "sha1" => pbkdf2::<H<sha1::Sha1>>(password, salt, iterations, &mut out),
        "sha256" => pbkdf2::<H<sha2::Sha256>>(password, salt, iterations, &mut out),
        "sha512" => pbkdf2::<H<sha2::Sha512>>(password, salt, iterations, &mut out),
        "ripemd160" => pbkdf2::<H<ripemd::Ripemd160>>(password, salt, iterations, &mut out),
        "whirlpool" => pbkdf2::<H<whirlpool::Whirlpool>>(password, salt, iterations, &mut out),
        "stribog512" => pbkdf2::<H<streebog::Streebog512>>(password, salt, iterations, &mut out),
        _ => return None,
    };
    r.ok().map(|()| out)
}

/// Derives the key of each candidate, on up to as many threads as there
/// are cores, and returns the first candidate in order whose key `found`
/// accepts, with that key. A thread takes the next candidate only while
/// no earlier one has matched, so the answer is the sequential one.
pub fn derive_all(
    cands: &[(Variant, u32)],
    password: &[u8],
    salt: &[u8],
    found: impl Fn(&[u8]) -> bool + Sync,
) -> Option<(Variant, Zeroizing<Vec<u8>>)> {
    let next = AtomicUsize::new(0);
    let best = AtomicUsize::new(usize::MAX);
    let keys: Mutex<Vec<(usize, Zeroizing<Vec<u8>>)>> = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(cands.len())
        .max(1);
    let work = &|| loop {
        let i = next.fetch_add(1, Ordering::SeqCst);
        if i >= cands.len() || i > best.load(Ordering::SeqCst) {
            return;
        }
        let (k, it) = cands[i];
        let Some(key) = derive(k.hash, password, salt, it) else {
            continue;
        };
        if found(&key) {
            best.fetch_min(i, Ordering::SeqCst);
            if let Ok(mut v) = keys.lock() {
                v.push((i, key));
            }
        }
    };
    std::thread::scope(|s| {
        for _ in 1..threads {
            s.spawn(work);
        }
        work();
    });
    let i = best.load(Ordering::SeqCst);
    let mut keys = keys.into_inner().ok()?;
    let pos = keys.iter().position(|(j, _)| *j == i)?;
    let (_, key) = keys.swap_remove(pos);
    Some((cands[i].0, key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_hash_derives_and_matches_known_pbkdf2_sha256() {
        // RFC 7914 section 11: PBKDF2-HMAC-SHA256("passwd", "salt", 1).
        let k = derive("sha256", b"passwd", b"salt", 1).expect("sha256");
        assert_eq!(
            &k[..16],
            &[
                0x55, 0xac, 0x04, 0x6e, 0x56, 0xe3, 0x08, 0x9f, 0xec, 0x16, 0x91, 0xc2, 0x25, 0x44,
                0xb6, 0x05
            ]
        );
        for v in VARIANTS {
            assert!(derive(v.hash, b"p", b"s", 1).is_some(), "{}", v.hash);
        }
        assert!(derive("xxxx", b"p", b"s", 1).is_none());
    }

    #[test]
    fn pim_keeps_only_veracrypt_and_scales_iterations() {
        let req = Request {
            pim: 1234,
            hash: Some("sha512".into()),
            ..Request::default()
        };
        assert_eq!(candidates(&req), vec![(VARIANTS[5], 15000 + 1000 * 1234)]);
        let tc = Request {
            veracrypt: false,
            ..Request::default()
        };
        assert!(candidates(&tc).iter().all(|(v, _)| !v.veracrypt));
    }

    #[test]
    fn the_first_match_in_order_wins() {
        let c: Vec<_> = VARIANTS.iter().take(4).map(|v| (*v, 1)).collect();
        // Every key matches: the answer is candidate 0, whatever the threads did.
        let (v, _) = derive_all(&c, b"p", b"s", |_| true).expect("match");
        assert_eq!(v, VARIANTS[0]);
        assert!(derive_all(&c, b"p", b"s", |_| false).is_none());
    }
}
