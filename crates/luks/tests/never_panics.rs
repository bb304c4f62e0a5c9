//! The fuzz target's property on stable Rust: the seed corpus of real
//! cryptsetup headers (tests/data/luks) and thousands of mutations of it go
//! through `luks::internal::fuzzing::header` without a panic. The real
//! fuzzer (cargo-fuzz, nightly) runs the same entry point: scripts/fuzz.sh.

use std::path::Path;

use testutil::Rng;
use ucrypt_luks as luks;

fn seeds() -> Vec<Vec<u8>> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/data/luks");
    let mut v: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .expect("seed corpus tests/data/luks")
        .filter_map(|e| e.ok())
        .filter(|e| e.path().extension().is_some_and(|x| x == "hdr"))
        .map(|e| std::fs::read(e.path()).unwrap())
        .collect();
    v.sort();
    assert!(v.len() >= 5, "seed corpus is missing");
    v
}

/// Re-seals the LUKS2 checksum of the copy at `off` so mutations of the
/// JSON reach the JSON validator instead of stopping at the checksum.
fn reseal(buf: &mut [u8], off: usize) {
    if buf.len() < off + 4096 || (buf[off..off + 4] != *b"LUKS" && buf[off..off + 4] != *b"SKUL") {
        return;
    }
    let size = u64::from_be_bytes(buf[off + 8..off + 16].try_into().unwrap()) as usize;
    if size < 4096 || off + size > buf.len() {
        return;
    }
    luks::luks2::binary::seal(&mut buf[off..off + size]);
}

#[test]
fn seeds_parse_and_round_trip() {
    for s in seeds() {
        luks::internal::fuzzing::header(&s);
        let mut c = std::io::Cursor::new(&s[..]);
        let is_v2 = s[6..8] == [0, 2];
        if is_v2 {
            let h = luks::luks2::Header::read(&mut c, s.len() as u64)
                .expect("cryptsetup LUKS2 seed parses");
            assert!(h.warnings.is_empty(), "{:?}", h.warnings);
        } else {
            luks::luks1::Header::parse(&s).expect("cryptsetup LUKS1 seed parses");
        }
    }
}

#[test]
fn mutated_headers_never_panic() {
    let seeds = seeds();
    let mut rng = Rng::new(0x9E37_79B9_7F4A_7C15);
    for i in 0..4000 {
        let mut buf = seeds[i % seeds.len()].clone();
        let edits = 1 + rng.below_usize(8);
        for _ in 0..edits {
            match rng.below_usize(6) {
                0 => {
                    let p = rng.below_usize(buf.len());
                    buf[p] ^= 1 << rng.below_usize(8);
                }
                1 => {
                    // Mutate inside the JSON text of the primary copy.
                    let p = 4096 + rng.below_usize(600);
                    if p < buf.len() {
                        buf[p] = b"{}[]\":,0123456789-e"[rng.below_usize(19)];
                    }
                }
                2 => {
                    let p = rng.below_usize(buf.len());
                    let v = [0u8, 0xff, 0x7f, 0x80][rng.below_usize(4)];
                    let n = rng.below_usize(9);
                    for b in buf.iter_mut().skip(p).take(n) {
                        *b = v;
                    }
                }
                3 => {
                    let n = rng.below_usize(buf.len());
                    buf.truncate(n);
                }
                4 => {
                    // Big-endian size/offset fields set to extremes.
                    let fields = [8usize, 16, 104, 108, 164, 256, 212, 216, 252];
                    let p = fields[rng.below_usize(fields.len())];
                    if p + 4 <= buf.len() {
                        buf[p..p + 4].copy_from_slice(&[0xff, 0xff, 0xff, rng.next_u64() as u8]);
                    }
                }
                _ => {
                    let a = rng.below_usize(buf.len());
                    let b = rng.below_usize(buf.len());
                    buf.swap(a, b);
                }
            }
        }
        if rng.below_usize(2) == 0 {
            reseal(&mut buf, 0);
            reseal(&mut buf, 16384);
        }
        luks::internal::fuzzing::header(&buf);
    }
}

#[test]
fn arbitrary_bytes_never_panic() {
    let mut rng = Rng::new(42);
    for len in [0usize, 1, 5, 6, 8, 100, 591, 592, 593, 4095, 4096, 20000] {
        for _ in 0..20 {
            let mut buf: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
            if len >= 8 && rng.below_usize(2) == 0 {
                buf[..6].copy_from_slice(b"LUKS\xba\xbe");
                buf[6..8].copy_from_slice(&[0, 1 + rng.below_usize(2) as u8]);
            }
            luks::internal::fuzzing::header(&buf);
        }
    }
}
