//! The adaptive mode's fused crypto (straight into and out of the
//! ramdisk's pages, `backend::Direct`) writes byte for byte what inline's
//! two passes write, and reads either one back: for both sector sizes,
//! requests that the ramdisk lends in several pieces (over its 2 MiB lock
//! batch), and a data offset that is not a whole number of 4 KiB sectors
//! (where adaptive must fall back to two passes). A file on tmpfs lends
//! its pages the same way (mapped), and the same holds there.

mod common;

use std::sync::Arc;

use backend::{Backend, MemBackend};
use common::*;
use ucrypt_datapath::{CryptMode, Engine, EngineConfig, Volume};

const SIZE: u64 = 12 << 20;

/// `workers: 1` leaves adaptive no helper, so every request runs whole in
/// the submitter (not split into chunks smaller than a lock batch).
fn engine(
    b: &Arc<MemBackend>,
    c: Cipher,
    data_offset: u64,
    mode: CryptMode,
    workers: usize,
) -> Engine {
    engine_on(b.clone(), c, data_offset, mode, workers)
}

fn engine_on(
    backend: Arc<dyn Backend>,
    c: Cipher,
    data_offset: u64,
    mode: CryptMode,
    workers: usize,
) -> Engine {
    let vol = Volume {
        backend,
        crypt: Some(sector_crypt(c)),
        data_offset,
        size: SIZE,
        sector_size: c.sector_size,
    };
    let cfg = EngineConfig {
        mode,
        queue_depth: 4,
        workers,
        ..EngineConfig::default()
    };
    Engine::new(vol, cfg).expect("engine")
}

/// Writes the same `len` random bytes at `off` through both engines;
/// returns them.
fn write_both(inline: &Engine, adaptive: &Engine, rng: &mut Rng, off: u64, len: u64) -> Vec<u8> {
    let mut d = vec![0u8; len as usize];
    rng.fill(&mut d);
    inline.write(off, d.clone(), false).expect("inline write");
    adaptive
        .write(off, d.clone(), false)
        .expect("adaptive write");
    d
}

fn raw(b: &MemBackend) -> Vec<u8> {
    let mut v = vec![0u8; b.size() as usize];
    b.read_at(&mut v, 0).expect("raw read");
    v
}

#[test]
fn fused_and_two_pass_write_the_same_ciphertext() {
    for (c, data_offset, workers) in [
        (XTS, DATA_OFFSET, 1),
        (XTS_4K, DATA_OFFSET, 1),
        (XTS_4K, DATA_OFFSET + 512, 1),
        (XTS, DATA_OFFSET + 512, 0),
        (XTS_4K, DATA_OFFSET, 0),
    ] {
        {
            let what = format!(
                "{} {} offset {data_offset} workers {workers}",
                c.spec, c.sector_size
            );
            let mk = || Arc::new(MemBackend::new(SIZE + DATA_OFFSET + 4096).expect("mem"));
            let (a, b) = (mk(), mk());
            let inline = engine(&a, c, data_offset, CryptMode::Inline, 0);
            let adaptive = engine(&b, c, data_offset, CryptMode::Adaptive, workers);
            let ss = u64::from(c.sector_size);
            let mut rng = Rng::new(data_offset + ss);
            // (offset, length): one sector, a page run, several lock
            // batches from an offset that is not page aligned.
            let reqs = [
                (0, ss),
                (ss * 3, 64 << 10),
                (ss * 5, (5 << 20) + ss * 3),
                (7 << 20, (3 << 20) + ss),
            ];
            for &(off, len) in &reqs {
                let d = write_both(&inline, &adaptive, &mut rng, off, len);
                assert!(
                    raw(&a) == raw(&b),
                    "{what}: ciphertext differs after {len} bytes at {off}"
                );
                // Each reads what the other wrote.
                let from_a = engine(&a, c, data_offset, CryptMode::Adaptive, workers);
                assert!(
                    from_a.read(off, len as u32).expect("read") == d,
                    "{what}: adaptive reads inline's"
                );
                from_a.shutdown().expect("shutdown");
                assert!(
                    inline.read(off, len as u32).expect("read") == d,
                    "{what}: inline reads its own"
                );
                assert!(
                    adaptive.read(off, len as u32).expect("read") == d,
                    "{what}: adaptive reads its own"
                );
            }
            inline.shutdown().expect("shutdown");
            adaptive.shutdown().expect("shutdown");
        }
    }
}

/// A file on tmpfs, opened with the automatic engine, is lent (mapped):
/// adaptive fuses there too, writes what inline writes on the ramdisk, and
/// reads it back, through the same pieces; the backend's `lent` counter
/// proves the fused path ran.
#[test]
fn a_file_on_tmpfs_is_fused_as_the_ramdisk_is() {
    let test = "a_file_on_tmpfs_is_fused_as_the_ramdisk_is";
    if !testutil::require(test, testutil::Capability::ShmTmpfs) {
        return;
    }
    let dir = testutil::TempDir::new_in(std::path::Path::new("/dev/shm"), test);
    let total = SIZE + DATA_OFFSET + 4096;
    for (c, workers) in [(XTS, 1), (XTS_4K, 0)] {
        let path = dir.join(&format!("img-{}", c.sector_size));
        std::fs::File::create(&path)
            .unwrap()
            .set_len(total)
            .unwrap();
        let file = Arc::new(backend::FileBackend::open(&path, &Default::default()).unwrap());
        assert!(file.is_mapped(), "a file on tmpfs is mapped");
        let mem = Arc::new(MemBackend::new(total).expect("mem"));
        let inline = engine(&mem, c, DATA_OFFSET, CryptMode::Inline, 0);
        let adaptive = engine_on(file.clone(), c, DATA_OFFSET, CryptMode::Adaptive, workers);
        let ss = u64::from(c.sector_size);
        let mut rng = Rng::new(ss + 7);
        for &(off, len) in &[
            (0, ss),
            (ss * 5, (5 << 20) + ss * 3),
            (7 << 20, (3 << 20) + ss),
        ] {
            let d = write_both(&inline, &adaptive, &mut rng, off, len);
            let mut on_file = vec![0u8; total as usize];
            file.read_at(&mut on_file, 0).expect("raw read");
            assert!(
                raw(&mem) == on_file,
                "{}: ciphertext differs after {len} bytes at {off}",
                c.sector_size
            );
            assert!(
                adaptive.read(off, len as u32).expect("read") == d,
                "adaptive reads its own"
            );
        }
        let lent = file
            .io_path()
            .counters
            .iter()
            .find(|(n, _)| *n == "lent")
            .map_or(0, |x| x.1);
        assert!(
            lent >= 6,
            "{}: every request went through the lent pages ({lent})",
            c.sector_size
        );
        inline.shutdown().expect("shutdown");
        adaptive.shutdown().expect("shutdown");
    }
}
