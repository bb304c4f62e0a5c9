//! Multi-target mappings (several dm targets in one device) in every mode:
//! reads, writes, write-zeroes, discards and flushes straddling one and
//! two target boundaries, mixed 512/4096-byte sectors, linear beside
//! crypt, targets at the same and at different distances on the device
//! (data shift); checked against a reference computed per target with
//! separate `SectorCrypt`s over the raw backend. Then a live reload that
//! moves a boundary under concurrent IO, as a reencryption step does.
//! Zero targets (dm-zero, as BitLocker's table has them) read zeros and
//! drop writes without touching the backend.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use backend::Backend;
use common::{backing, configs, Rng, Store};
use crypto::{CryptConfig, SectorCrypt};
use ucrypt_datapath::{Engine, Error, Mapping, Op, Request, Target};

/// One target of a test layout, in 512-byte sectors.
#[derive(Clone, Copy, Debug)]
struct T {
    len: u64,
    offset: u64,
    /// `None`: linear. Else (key seed, sector size, iv_offset, large IVs).
    crypt: Option<(u8, u32, u64, bool)>,
}

/// `T::offset` of a zero target (its offset is unused).
const ZERO: u64 = u64::MAX / 1024;

fn cipher(seed: u8, ss: u32, iv_offset: u64, large: bool) -> Arc<SectorCrypt> {
    Arc::new(
        SectorCrypt::new(&CryptConfig {
            cipher: "aes-xts-plain64".into(),
            key: zeroize::Zeroizing::new((0..64u8).map(|i| i.wrapping_mul(seed) ^ seed).collect()),
            iv_offset,
            sector_size: ss,
            iv_large_sectors: large,
        })
        .expect("cipher builds"),
    )
}

fn mapping(b: &Arc<dyn Backend>, ts: &[T]) -> Mapping {
    Mapping {
        backend: b.clone(),
        targets: ts
            .iter()
            .map(|t| Target {
                len: t.len * 512,
                offset: t.offset * 512,
                crypt: t.crypt.map(|(k, ss, iv, l)| cipher(k, ss, iv, l)),
                zero: t.offset == ZERO,
            })
            .collect(),
    }
}

/// The layouts under test: name, targets, backend size in sectors.
fn layouts() -> Vec<(&'static str, Vec<T>)> {
    vec![
        (
            // A reencryption without data shift: new key (4096-byte
            // sectors) below, old key (512-byte) above, then plaintext.
            "uniform 4096/512/linear",
            vec![
                T {
                    len: 2048,
                    offset: 64,
                    crypt: Some((3, 4096, 0, false)),
                },
                T {
                    len: 1024,
                    offset: 64 + 2048,
                    crypt: Some((5, 512, 2048, false)),
                },
                T {
                    len: 1024,
                    offset: 64 + 3072,
                    crypt: None,
                },
            ],
        ),
        (
            // Data shift: each target somewhere else on the device, IV
            // offsets of their own, large IVs on one.
            "shifted",
            vec![
                T {
                    len: 1024,
                    offset: 8192,
                    crypt: Some((7, 4096, 0, true)),
                },
                T {
                    len: 2048,
                    offset: 16,
                    crypt: Some((9, 512, 1024, false)),
                },
                T {
                    len: 1024,
                    offset: 4096,
                    crypt: None,
                },
                T {
                    len: 512,
                    offset: 6000,
                    crypt: Some((11, 4096, 8, false)),
                },
            ],
        ),
    ]
}

/// The reference: the plaintext of mapping bytes `at..at+len` read from
/// the raw backend, target by target, with each target's own cipher.
fn reference_read(b: &dyn Backend, ts: &[T], at: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let mut start = 0u64;
    for t in ts {
        let (s, e) = (start * 512, (start + t.len) * 512);
        let lo = at.max(s);
        let hi = (at + len as u64).min(e);
        if lo < hi {
            let buf = &mut out[(lo - at) as usize..(hi - at) as usize];
            b.read_at(buf, t.offset * 512 + (lo - s)).unwrap();
            if let Some((k, ss, iv, l)) = t.crypt {
                cipher(k, ss, iv, l).decrypt((lo - s) / 512, buf);
            }
        }
        start += t.len;
    }
    out
}

fn total(ts: &[T]) -> u64 {
    ts.iter().map(|t| t.len).sum::<u64>() * 512
}

fn boundaries(ts: &[T]) -> Vec<u64> {
    let mut v = Vec::new();
    let mut at = 0;
    for t in &ts[..ts.len() - 1] {
        at += t.len * 512;
        v.push(at);
    }
    v
}

#[test]
fn every_mode_serves_a_target_list() {
    let backend_size = 12_000 * 512;
    for (lname, ts) in layouts() {
        for store in [Store::Mem, Store::File] {
            for (cname, cfg, forced) in configs() {
                let what = format!("{lname} / {store:?} / {cname}");
                let bk = backing(store, backend_size);
                let e = Engine::with_mapping(mapping(&bk.backend, &ts), cfg).expect(&what);
                e.force_split(forced);
                assert_eq!(e.size(), total(&ts), "{what}");
                assert_eq!(e.sector_size(), 4096, "{what}: largest target sector size");
                assert_eq!(e.targets(), ts.len());
                let size = total(&ts);
                let mut model = vec![0u8; size as usize];
                // Fill the whole device first, in one write per 256 KiB.
                let mut rng = Rng::new(size ^ ts.len() as u64);
                for at in (0..size).step_by(256 << 10) {
                    let n = (size - at).min(256 << 10) as usize;
                    let d = rng.bytes(n);
                    model[at as usize..at as usize + n].copy_from_slice(&d);
                    e.write(at, d, false).expect(&what);
                }
                // Writes and reads straddling one and two boundaries.
                let bs = boundaries(&ts);
                let mut cases = Vec::new();
                for &b in &bs {
                    cases.push((b - 4096, 8192));
                    cases.push((b - 65536, 131072));
                }
                for w in bs.windows(2) {
                    cases.push((w[0] - 8192, (w[1] - w[0] + 16384) as usize));
                }
                for _ in 0..40 {
                    let at = rng.below(size / 4096) * 4096;
                    let n = ((1 + rng.below(64)) * 4096).min(size - at) as usize;
                    cases.push((at, n));
                }
                for &(at, n) in &cases {
                    let d = rng.bytes(n);
                    model[at as usize..at as usize + n].copy_from_slice(&d);
                    e.write(at, d, rng.below(4) == 0).expect(&what);
                    let got = e.read(at, n as u32).expect(&what);
                    assert!(
                        got == model[at as usize..at as usize + n],
                        "{what}: read back at {at}+{n}"
                    );
                }
                e.flush().expect(&what);
                // Everything matches the per-target reference.
                let raw = reference_read(&*bk.backend, &ts, 0, size as usize);
                assert!(
                    raw == model,
                    "{what}: ciphertext differs from the per-target reference"
                );
                for &(at, n) in &cases {
                    let got = e.read(at, n as u32).expect(&what);
                    assert!(
                        got == model[at as usize..at as usize + n],
                        "{what}: reread at {at}+{n}"
                    );
                }
                // Write-zeroes and discard across two boundaries.
                let (zat, zn) = (bs[0] - 8192, (bs[1] - bs[0] + 16384) as usize);
                common::run(
                    &e,
                    Request {
                        op: Op::WriteZeroes { len: zn as u32 },
                        offset: zat,
                        fua: false,
                    },
                )
                .expect(&what);
                model[zat as usize..zat as usize + zn].fill(0);
                assert!(
                    e.read(zat, zn as u32).unwrap().iter().all(|&x| x == 0),
                    "{what}: zeroes"
                );
                assert!(
                    reference_read(&*bk.backend, &ts, 0, size as usize) == model,
                    "{what}"
                );
                e.discard(zat, zn as u32).expect(&what);
                // The discarded device ranges read back as zero ciphertext.
                let mut start = 0;
                for t in &ts {
                    let (s, end) = (start * 512, (start + t.len) * 512);
                    let lo = zat.max(s);
                    let hi = (zat + zn as u64).min(end);
                    if lo < hi {
                        let mut buf = vec![1u8; (hi - lo) as usize];
                        bk.backend
                            .read_at(&mut buf, t.offset * 512 + lo - s)
                            .unwrap();
                        assert!(
                            buf.iter().all(|&x| x == 0),
                            "{what}: discard on target at {s}"
                        );
                    }
                    start += t.len;
                }
                e.flush().expect(&what);
                // Misaligned to the mapping's 4096-byte blocks: refused.
                assert!(matches!(
                    e.read(bs[0] - 512, 1024),
                    Err(Error::Misaligned { .. })
                ));
                e.shutdown().unwrap();
            }
        }
    }
}

#[test]
fn zero_targets_read_zeros_and_drop_writes() {
    // As a BitLocker table: the header's sectors from further on the
    // device at sector 0, a zero target over the metadata, crypt around.
    let ts = [
        T {
            len: 64,
            offset: 1000,
            crypt: Some((3, 512, 1000, false)),
        },
        T {
            len: 16,
            offset: ZERO,
            crypt: None,
        },
        T {
            len: 120,
            offset: 80,
            crypt: Some((3, 512, 80, false)),
        },
        T {
            len: 8,
            offset: ZERO,
            crypt: None,
        },
    ];
    let size = total(&ts);
    for store in [Store::Mem, Store::File] {
        for (cname, cfg, forced) in configs() {
            let what = format!("{store:?} / {cname}");
            let bk = backing(store, 2048 * 512);
            bk.backend
                .write_at(&vec![0xab; 2048 * 512], 0, false)
                .expect(&what);
            let e = Engine::with_mapping(mapping(&bk.backend, &ts), cfg).expect(&what);
            e.force_split(forced);
            assert_eq!(e.size(), size, "{what}");
            let mut rng = Rng::new(size);
            let d = rng.bytes(size as usize);
            e.write(0, d.clone(), false).expect(&what);
            let got = e.read(0, size as u32).expect(&what);
            let mut want = d.clone();
            want[64 * 512..80 * 512].fill(0);
            want[200 * 512..].fill(0);
            assert!(
                got == want,
                "{what}: zeros over the zero targets, data elsewhere"
            );
            // A request inside a zero target alone, and one around it.
            assert!(e.read(66 * 512, 4096).expect(&what).iter().all(|&b| b == 0));
            e.write(66 * 512, vec![7; 4096], true).expect(&what);
            let around = e.read(60 * 512, 24 * 512).expect(&what);
            assert!(
                around == want[60 * 512..84 * 512],
                "{what}: around the zero target"
            );
            e.flush().expect(&what);
            // The zero targets' writes never reached the device: sectors
            // 64..80 and 200.. there are untouched.
            let mut raw = vec![0u8; 2048 * 512];
            bk.backend.read_at(&mut raw, 0).expect(&what);
            assert!(raw[64 * 512..80 * 512].iter().all(|&b| b == 0xab), "{what}");
            assert!(
                raw[200 * 512..1000 * 512].iter().all(|&b| b == 0xab),
                "{what}"
            );
            e.shutdown().expect(&what);
        }
    }
}

#[test]
fn mappings_the_engine_refuses() {
    let b: Arc<dyn Backend> = Arc::new(backend::MemBackend::new(1 << 20).unwrap());
    let bad = |ts: &[T]| match Engine::with_mapping(mapping(&b, ts), Default::default()) {
        Err(Error::Invalid(m)) => m,
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("accepted {ts:?}"),
    };
    let c512 = Some((1, 512, 0, false));
    let c4k = Some((1, 4096, 0, false));
    // A 512-sector-long target beside a 4096-byte one.
    let m = bad(&[
        T {
            len: 9,
            offset: 0,
            crypt: c512,
        },
        T {
            len: 8,
            offset: 16,
            crypt: c4k,
        },
    ]);
    assert!(m.contains("4096-byte blocks"), "{m}");
    // Past the backend.
    let m = bad(&[
        T {
            len: 8,
            offset: 0,
            crypt: c512,
        },
        T {
            len: 8,
            offset: 2048,
            crypt: None,
        },
    ]);
    assert!(m.contains("does not fit"), "{m}");
    assert!(matches!(
        Engine::with_mapping(
            Mapping {
                backend: b.clone(),
                targets: vec![]
            },
            Default::default()
        ),
        Err(Error::Invalid(_))
    ));
    // One target is a plain volume: resize works; two refuse it.
    let one = Engine::with_mapping(
        mapping(
            &b,
            &[T {
                len: 8,
                offset: 0,
                crypt: c512,
            }],
        ),
        Default::default(),
    )
    .unwrap();
    one.resize(2048).unwrap();
    let two = Engine::with_mapping(
        mapping(
            &b,
            &[
                T {
                    len: 8,
                    offset: 0,
                    crypt: c512,
                },
                T {
                    len: 8,
                    offset: 8,
                    crypt: None,
                },
            ],
        ),
        Default::default(),
    )
    .unwrap();
    assert!(matches!(two.resize(4096), Err(Error::Invalid(_))));
}

/// A reencryption step under live IO: writers keep writing 4 KiB blocks
/// (each tagged with a sequence number) while the boundary between the
/// new key (below) and the old key (above) moves up in steps: suspend,
/// re-encrypt the step's range offline with the new key, reload. Every
/// acknowledged write must read back, no request may see two lists (a
/// read returns one block's consistent tag), and the final ciphertext
/// matches the per-target reference.
#[test]
fn reload_moves_the_boundary_under_live_io() {
    let sectors = 4096u64; // 2 MiB mapping
    let data = 64u64;
    let bk = backing(Store::Mem, (data + sectors) * 512);
    let new = (21u8, 4096u32);
    let old = (33u8, 512u32);
    let layout = |boundary: u64| -> Vec<T> {
        let mut v = Vec::new();
        if boundary > 0 {
            v.push(T {
                len: boundary,
                offset: data,
                crypt: Some((new.0, new.1, 0, false)),
            });
        }
        if boundary < sectors {
            v.push(T {
                len: sectors - boundary,
                offset: data + boundary,
                crypt: Some((old.0, old.1, boundary, false)),
            });
        }
        v
    };
    for (cname, cfg, forced) in configs() {
        let e = Arc::new(Engine::with_mapping(mapping(&bk.backend, &layout(0)), cfg).unwrap());
        e.force_split(forced);
        let blocks = sectors * 512 / 4096;
        // Initial contents: each block tagged 0.
        for blk in 0..blocks {
            e.write(blk * 4096, tagged(blk, 0), false).unwrap();
        }
        let acked: Arc<Vec<AtomicU64>> = Arc::new((0..blocks).map(|_| AtomicU64::new(0)).collect());
        let stop = Arc::new(AtomicBool::new(false));
        let bad = Arc::new(Mutex::new(Vec::<String>::new()));
        let mut writers = Vec::new();
        for w in 0..2u64 {
            let (e, acked, stop, bad) = (e.clone(), acked.clone(), stop.clone(), bad.clone());
            writers.push(std::thread::spawn(move || {
                let mut rng = Rng::new(w + 100);
                let mut seq = 1 + w;
                while !stop.load(Ordering::Relaxed) {
                    // Blocks of this writer only (even/odd); the read
                    // after spans 1-3 blocks, some across the boundary.
                    let n = 1 + rng.below(3);
                    let first = (rng.below(blocks / 2 - 3)) * 2 + w;
                    for b in (first..first + n).filter(|b| b % 2 == w) {
                        e.write(b * 4096, tagged(b, seq), false).unwrap();
                        acked[b as usize].store(seq, Ordering::SeqCst);
                    }
                    // A straddling read: every block consistent.
                    let got = e.read(first * 4096, (n * 4096) as u32).unwrap();
                    for (i, chunk) in got.chunks(4096).enumerate() {
                        if let Err(m) = check_block(first + i as u64, chunk) {
                            bad.lock().unwrap().push(m);
                        }
                    }
                    seq += 2;
                }
            }));
        }
        // Move the boundary up in 8 steps.
        let step = sectors / 8;
        for k in 1..=8u64 {
            let (lo, hi) = ((k - 1) * step, k * step);
            e.suspend().unwrap();
            // Offline: decrypt lo..hi with the old key, encrypt with the new.
            let mut buf = vec![0u8; ((hi - lo) * 512) as usize];
            bk.backend.read_at(&mut buf, (data + lo) * 512).unwrap();
            cipher(old.0, old.1, lo, false).decrypt(0, &mut buf);
            cipher(new.0, new.1, 0, false).encrypt(lo, &mut buf);
            bk.backend.write_at(&buf, (data + lo) * 512, false).unwrap();
            // Reload (resumes the suspended engine).
            e.reload_mapping(mapping(&bk.backend, &layout(hi))).unwrap();
            assert!(!e.is_suspended());
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        stop.store(true, Ordering::Relaxed);
        for w in writers {
            w.join().unwrap();
        }
        let bad = bad.lock().unwrap();
        assert!(bad.is_empty(), "{cname}: {:?}", &bad[..bad.len().min(5)]);
        for blk in 0..blocks {
            let got = e.read(blk * 4096, 4096).unwrap();
            let want = acked[blk as usize].load(Ordering::SeqCst);
            assert_eq!(
                got,
                tagged(blk, want),
                "{cname}: block {blk} lost its last acknowledged write"
            );
        }
        // All under the new key now, as the reference says.
        let ts = layout(sectors);
        let raw = reference_read(&*bk.backend, &ts, 0, (sectors * 512) as usize);
        assert_eq!(raw, e.read(0, (sectors * 512) as u32).unwrap(), "{cname}");
        assert_eq!(e.targets(), 1);
        drop(e);
    }
}

/// A 4 KiB block naming itself and its write's sequence number in every
/// 16 bytes.
fn tagged(blk: u64, seq: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(4096);
    for _ in 0..256 {
        v.extend_from_slice(&blk.to_le_bytes());
        v.extend_from_slice(&seq.to_le_bytes());
    }
    v
}

fn check_block(blk: u64, b: &[u8]) -> Result<(), String> {
    let first = &b[..16];
    if u64::from_le_bytes(first[..8].try_into().unwrap()) != blk {
        return Err(format!(
            "block {blk}: not its own bytes (decrypted with the wrong key?)"
        ));
    }
    if b.chunks(16).any(|c| c != first) {
        return Err(format!("block {blk}: torn"));
    }
    Ok(())
}
