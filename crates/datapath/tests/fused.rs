//! The adaptive mode's fused crypto (straight into and out of the
//! ramdisk's pages, `backend::Direct`) writes byte for byte what inline's
//! two passes write, and reads either one back: for both sector sizes,
//! requests that the ramdisk lends in several pieces (over its 2 MiB lock
//! batch), and a data offset that is not a whole number of 4 KiB sectors
//! (where adaptive must fall back to two passes).

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
    let backend: Arc<dyn Backend> = b.clone();
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
                let mut d = vec![0u8; len as usize];
                rng.fill(&mut d);
                inline.write(off, d.clone(), false).expect("inline write");
                adaptive
                    .write(off, d.clone(), false)
                    .expect("adaptive write");
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
