//! The adaptive mode's split on a backend that does not keep its bytes in
//! memory (a file here): one backend IO per request, only the crypto cut
//! into chunks (mode/adaptive/split.rs).
//!
//! Every engine here runs adaptive with the test hook `force_split`, which
//! splits requests above 4 KiB into chunks of at least 4 KiB (or hands one
//! off whole, which is one IO as well); the file sits under a
//! `FaultBackend`, which counts what reaches it and injects errors. The
//! reference is an inline engine over its own file with the same key: both
//! images must hold the same ciphertext, and every read the same plaintext.

mod common;

use std::sync::Arc;

use backend::{Backend, FaultBackend, FaultRule, FileBackend, FileOptions, OpKinds};
use common::*;
use ucrypt_datapath::{CryptMode, Engine, EngineConfig, Error};

const SIZE: u64 = 16 << 20;

/// A file backend under a counting, fault-injecting wrapper, and the temp
/// dir holding the file.
fn faulty_file(name: &str) -> (Arc<FaultBackend<FileBackend>>, testutil::TempDir) {
    let dir = testutil::TempDir::new(name);
    let path = dir.join("disk.img");
    std::fs::File::create(&path)
        .and_then(|f| f.set_len(SIZE + DATA_OFFSET))
        .expect("create image");
    let fb = FileBackend::open(&path, &FileOptions::default()).expect("open file backend");
    (Arc::new(FaultBackend::new(fb)), dir)
}

fn engine(b: Arc<dyn Backend>, c: Cipher, mode: CryptMode) -> Engine {
    let cfg = EngineConfig {
        mode,
        queue_depth: 16,
        workers: 2,
        ..EngineConfig::default()
    };
    let e = Engine::new(volume(b, c, SIZE), cfg).expect("engine");
    e.force_split(mode == CryptMode::Adaptive);
    e
}

/// Request sizes around the chunk sizes the split cuts (4 KiB chunks under
/// the hook, 64 KiB the smallest otherwise, 1 MiB / 8 the usual), with
/// tails that leave a short last chunk; multiples of `ss`.
fn sizes(ss: u64) -> Vec<u64> {
    let mut v = vec![
        8 << 10,
        (8 << 10) + 512,
        (64 << 10) - 512,
        64 << 10,
        (64 << 10) + 512,
        (128 << 10) - 4096,
        128 << 10,
        (128 << 10) + 512,
        (1 << 20) - 512,
        1 << 20,
        (1 << 20) + 4096 + 512,
        4 << 20,
    ];
    v.retain(|n| n % ss == 0);
    v
}

fn pattern(seed: u64, len: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let mut v = vec![0u8; len as usize];
    rng.fill(&mut v);
    v
}

/// The raw bytes of a backend (ciphertext and header gap alike).
fn image(b: &dyn Backend) -> Vec<u8> {
    let mut v = vec![0u8; b.size() as usize];
    b.read_at(&mut v, 0).expect("read image");
    v
}

#[test]
fn a_split_request_on_a_file_is_one_backend_io() {
    let (fb, _dir) = faulty_file("split_io_count");
    let e = engine(fb.clone(), XTS, CryptMode::Adaptive);
    let n = 24u64;
    for i in 0..n {
        let data = pattern(i, 1 << 20);
        e.write((i << 20) % SIZE, data, i % 2 == 1).expect("write");
    }
    for i in 0..n {
        e.read((i << 20) % SIZE, 1 << 20).expect("read");
    }
    let (st, c) = (e.stats(), fb.counts());
    assert!(
        st.read.split > 0 && st.write.split > 0,
        "the hook split nothing: {st:?}"
    );
    // Before: each of a split request's chunks (4 KiB under the hook) was
    // a backend IO of its own.
    assert_eq!(
        (c.reads, c.writes, c.fua_writes),
        (n, n, n / 2),
        "backend IOs for {n} reads and {n} writes ({} and {} split): {c:?}",
        st.read.split,
        st.write.split
    );
    e.shutdown().expect("shutdown");
}

#[test]
fn split_reads_and_writes_match_inline_byte_for_byte() {
    for c in [XTS, XTS_4K] {
        let ss = c.sector_size as u64;
        let (fa, _da) = faulty_file("split_io_adaptive");
        let (fi, _di) = faulty_file("split_io_inline");
        let a = engine(fa.clone(), c, CryptMode::Adaptive);
        let i = engine(fi.clone(), c, CryptMode::Inline);
        let mut off = 0u64;
        let (mut placed, mut fuas) = (Vec::new(), 0);
        for (k, len) in sizes(ss).into_iter().enumerate() {
            if off + len > SIZE {
                off = 0;
            }
            // Offsets step by one sector so chunks do not fall on 4 KiB
            // boundaries of the device (512-byte sectors only).
            let at = off + if ss == 512 { 512 * (k as u64 % 8) } else { 0 };
            let at = at.min(SIZE - len);
            let data = pattern(k as u64 + 100 * ss, len);
            let fua = k % 3 == 0;
            fuas += u64::from(fua);
            a.write(at, data.clone(), fua).expect("adaptive write");
            i.write(at, data.clone(), fua).expect("inline write");
            placed.push((at, data));
            off = at + len;
        }
        for (at, data) in &placed {
            let what = format!("{}-byte sectors, {} bytes at {at}", ss, data.len());
            let len = data.len() as u32;
            assert_eq!(&a.read(*at, len).expect("adaptive read"), data, "{what}");
            assert_eq!(&i.read(*at, len).expect("inline read"), data, "{what}");
        }
        let st = a.stats();
        assert!(st.read.split > 0 && st.write.split > 0, "{st:?}");
        assert!(
            image(fa.inner()) == image(fi.inner()),
            "{ss}-byte sectors: the adaptive image's ciphertext differs from inline's"
        );
        // FUA reached the file as FUA, once per FUA request, in both.
        assert_eq!(
            (fa.counts().fua_writes, fi.counts().fua_writes),
            (fuas, fuas)
        );
        a.shutdown().expect("shutdown");
        i.shutdown().expect("shutdown");
    }
}

#[test]
fn a_failed_backend_io_fails_the_split_request_and_writes_nothing() {
    let (fb, _dir) = faulty_file("split_io_errors");
    let e = engine(fb.clone(), XTS, CryptMode::Adaptive);
    let good = pattern(1, 1 << 20);
    e.write(0, good.clone(), false).expect("write");
    let before = image(fb.inner());
    // Device range of the volume's second MiB.
    let bad = DATA_OFFSET + (1 << 20)..DATA_OFFSET + (2 << 20);
    fb.add_rule(FaultRule::error(OpKinds::READ | OpKinds::WRITE, libc::EIO).range(bad));
    // Each request twice: the hook hands every other one off whole, so one
    // of each pair is split.
    let split_before = e.stats();
    for _ in 0..2 {
        let r = e.read(1 << 20, 1 << 20);
        assert!(matches!(r, Err(Error::Io(_))), "read: {r:?}");
        let w = e.write(1 << 20, pattern(2, 1 << 20), false);
        assert!(matches!(w, Err(Error::Io(_))), "write: {w:?}");
        let w = e.write(1 << 20, pattern(3, 1 << 20), true);
        assert!(matches!(w, Err(Error::Io(_))), "FUA write: {w:?}");
    }
    let st = e.stats();
    assert!(
        st.read.split > split_before.read.split && st.write.split > split_before.write.split,
        "no failing request was split: {st:?}"
    );
    assert_eq!((st.read.errors, st.write.errors), (2, 4), "{st:?}");
    assert!(
        image(fb.inner()) == before,
        "a failed write changed the image"
    );
    // The engine keeps serving, the failing range too once the fault goes.
    fb.clear_rules();
    assert_eq!(e.read(0, 1 << 20).expect("read"), good);
    let d = pattern(4, (1 << 20) + 4096);
    e.write(1 << 20, d.clone(), true)
        .expect("write after the fault");
    assert_eq!(e.read(1 << 20, d.len() as u32).expect("read back"), d);
    e.shutdown().expect("shutdown");
}
