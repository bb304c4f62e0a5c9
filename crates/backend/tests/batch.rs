//! Batched reads and writes (`Backend::read_batch` / `write_batch`): the
//! same results and bytes as one call per entry, on both IO engines, with
//! O_DIRECT and buffered entries, FUA, errors per entry, batches larger
//! than a ring, and short reads.

use std::path::{Path, PathBuf};

use testutil::{Capability, Rng, TempDir};
use ucrypt_backend::{
    Backend, DirectIo, Error, ErrorKind, FileBackend, FileOptions, FuaMode, IoEngine, ReadOp,
    WriteOp,
};

fn make_file(dir: &TempDir, name: &str, size: u64) -> PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p).unwrap().set_len(size).unwrap();
    p
}

fn open(path: &Path, o: FileOptions, test: &str) -> Option<FileBackend> {
    if o.engine == Some(IoEngine::Uring) && !testutil::require(test, Capability::IoUring) {
        return None;
    }
    Some(FileBackend::open(path, &o).unwrap_or_else(|e| panic!("{test}: open: {e}")))
}

/// A `len`-byte window of `v` starting at a 4096-aligned address (plus
/// `skew` bytes), so a test chooses between aligned and unaligned memory.
fn window(v: &mut [u8], len: usize, skew: usize) -> &mut [u8] {
    let pad = (4096 - (v.as_ptr() as usize) % 4096) % 4096 + skew;
    &mut v[pad..pad + len]
}

const SIZE: u64 = 4 << 20;

/// Entries of one batch: (offset, len, aligned memory). Non-overlapping.
fn plan(rng: &mut Rng, n: usize) -> Vec<(u64, usize, bool)> {
    let slot = SIZE / n as u64;
    (0..n)
        .map(|i| {
            let base = i as u64 * slot;
            let sector = rng.below(2) == 0;
            let len = if sector {
                4096 * (1 + rng.below(4) as usize)
            } else {
                1 + rng.below(9000) as usize
            };
            let off = if sector { base } else { base + rng.below(100) };
            (off, len, rng.below(3) != 0)
        })
        .collect()
}

fn check_against_model(b: &FileBackend, seed: u64, n: usize) {
    let mut rng = Rng::new(seed);
    let mut model = vec![0u8; SIZE as usize];
    for round in 0..4 {
        let p = plan(&mut rng, n);
        // Write batch; one entry out of range, one empty.
        let mut store: Vec<Vec<u8>> = p.iter().map(|&(_, len, _)| vec![0u8; len + 8192]).collect();
        let mut bufs: Vec<&mut [u8]> = Vec::new();
        for (s, &(_, len, al)) in store.iter_mut().zip(&p) {
            let w = window(s, len, if al { 0 } else { 3 });
            rng.fill(w);
            bufs.push(w);
        }
        let mut ops: Vec<WriteOp<'_>> = p
            .iter()
            .zip(&bufs)
            .map(|(&(off, _, _), buf)| WriteOp {
                buf,
                offset: off,
                fua: false,
            })
            .collect();
        let tail = [7u8; 512];
        ops.push(WriteOp {
            buf: &tail,
            offset: SIZE - 256,
            fua: false,
        });
        ops.push(WriteOp {
            buf: &[],
            offset: 12,
            fua: false,
        });
        let res = b.write_batch(&ops);
        assert_eq!(res.len(), ops.len());
        for (r, o) in res.iter().zip(&ops).take(p.len()) {
            assert!(r.is_ok(), "round {round} write at {}: {r:?}", o.offset);
            model[o.offset as usize..o.offset as usize + o.buf.len()].copy_from_slice(o.buf);
        }
        let oor = res[p.len()].as_ref().unwrap_err();
        assert!(
            matches!(Error::kind_of(oor), Some(ErrorKind::OutOfRange { .. })),
            "{oor}"
        );
        assert!(res[p.len() + 1].is_ok());
        drop(ops);

        // Read batch over another plan: every entry equals the model.
        let q = plan(&mut rng, n);
        let mut store: Vec<Vec<u8>> = q.iter().map(|&(_, len, _)| vec![0u8; len + 8192]).collect();
        let mut rops: Vec<ReadOp<'_>> = store
            .iter_mut()
            .zip(&q)
            .map(|(s, &(off, len, al))| ReadOp {
                buf: window(s, len, if al { 0 } else { 5 }),
                offset: off,
            })
            .collect();
        let res = b.read_batch(&mut rops);
        for (r, o) in res.iter().zip(&rops) {
            assert!(r.is_ok(), "round {round} read at {}: {r:?}", o.offset);
            let at = o.offset as usize;
            assert!(
                o.buf[..] == model[at..at + o.buf.len()],
                "round {round}: batched read at {at} len {} differs",
                o.buf.len()
            );
        }
    }
    // And single reads agree with what the batches wrote.
    let mut all = vec![0u8; SIZE as usize];
    b.read_at(&mut all, 0).unwrap();
    assert!(all == model, "file differs from the model");
}

#[test]
fn batches_match_the_model_on_both_engines() {
    let dir = TempDir::new("be-batch");
    for (k, engine) in [IoEngine::Uring, IoEngine::Syscalls]
        .into_iter()
        .enumerate()
    {
        for (j, direct) in [DirectIo::Auto, DirectIo::Never].into_iter().enumerate() {
            let p = make_file(&dir, &format!("m{k}{j}.img"), SIZE);
            let o = FileOptions {
                direct,
                engine: Some(engine),
                ..FileOptions::default()
            };
            let Some(b) = open(&p, o, "batches_match_the_model_on_both_engines") else {
                continue;
            };
            // 100 entries: more than one ring's worth, so the ring refills.
            check_against_model(&b, 40 + k as u64 * 2 + j as u64, 100);
            let s = b.stats();
            if engine == IoEngine::Uring {
                assert!(s.uring_batches >= 8 && s.uring_ops > 0, "{s:?}");
            } else {
                assert_eq!(s.uring_batches, 0, "{s:?}");
            }
            if direct == DirectIo::Auto && b.direct_alignment().is_some() {
                assert!(s.direct_ops > 0 && s.buffered_ops > 0, "{s:?}");
            }
        }
    }
}

#[test]
fn batched_fua_is_durable_by_dsync_or_one_sync() {
    let dir = TempDir::new("be-batch");
    for (k, fua) in [FuaMode::Dsync, FuaMode::WriteThenFlush]
        .into_iter()
        .enumerate()
    {
        let p = make_file(&dir, &format!("f{k}.img"), SIZE);
        let o = FileOptions {
            fua,
            engine: Some(IoEngine::Uring),
            direct: DirectIo::Never,
            ..FileOptions::default()
        };
        let Some(b) = open(&p, o, "batched_fua_is_durable_by_dsync_or_one_sync") else {
            return;
        };
        let data = vec![0xa5u8; 4096];
        let ops: Vec<WriteOp<'_>> = (0..10u64)
            .map(|i| WriteOp {
                buf: &data,
                offset: i * 8192,
                fua: i % 2 == 0,
            })
            .collect();
        let before = b.stats();
        assert!(b.write_batch(&ops).iter().all(|r| r.is_ok()));
        let s = b.stats();
        assert_eq!(s.uring_batches, before.uring_batches + 1, "{s:?}");
        match fua {
            FuaMode::Dsync => {
                assert_eq!(s.dsync_writes - before.dsync_writes, 5, "{s:?}");
                assert_eq!(s.syncs, before.syncs, "{s:?}");
            }
            _ => {
                assert_eq!(s.dsync_writes, before.dsync_writes, "{s:?}");
                assert_eq!(s.syncs - before.syncs, 1, "{s:?}");
            }
        }
        // Without FUA in the batch, nothing is synced.
        let plain: Vec<WriteOp<'_>> = ops.iter().map(|o| WriteOp { fua: false, ..*o }).collect();
        assert!(b.write_batch(&plain).iter().all(|r| r.is_ok()));
        let t = b.stats();
        assert_eq!((t.syncs, t.dsync_writes), (s.syncs, s.dsync_writes));
    }
}

#[test]
fn read_only_batches_refuse_every_write() {
    let dir = TempDir::new("be-batch");
    let p = make_file(&dir, "ro.img", SIZE);
    let o = FileOptions {
        read_only: true,
        ..FileOptions::default()
    };
    let b = FileBackend::open(&p, &o).unwrap();
    let data = [1u8; 4096];
    let ops = [0u64, 4096, 8192].map(|offset| WriteOp {
        buf: &data,
        offset,
        fua: true,
    });
    for r in b.write_batch(&ops) {
        let e = r.unwrap_err();
        assert!(
            matches!(Error::kind_of(&e), Some(ErrorKind::ReadOnly)),
            "{e}"
        );
    }
    let mut back = vec![1u8; 4096];
    b.read_at(&mut back, 0).unwrap();
    assert!(back.iter().all(|&x| x == 0));
}

#[test]
fn batched_reads_past_a_shrunken_end_fail_alone() {
    let dir = TempDir::new("be-batch");
    let p = make_file(&dir, "shrink.img", SIZE);
    let o = FileOptions {
        direct: DirectIo::Never,
        engine: Some(IoEngine::Uring),
        ..FileOptions::default()
    };
    let Some(b) = open(&p, o, "batched_reads_past_a_shrunken_end_fail_alone") else {
        return;
    };
    b.write_at(&vec![9u8; SIZE as usize], 0, false).unwrap();
    // Another opener truncates the file under us: the backend still
    // believes the old size, so the range check passes and the kernel
    // returns short (then zero-length) reads.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&p)
        .unwrap()
        .set_len(SIZE / 2)
        .unwrap();
    let mut store = vec![vec![0u8; 8192]; 3];
    let offs = [0, SIZE / 2 - 4096, SIZE - 8192];
    let mut ops: Vec<ReadOp<'_>> = store
        .iter_mut()
        .zip(offs)
        .map(|(buf, offset)| ReadOp { buf, offset })
        .collect();
    let res = b.read_batch(&mut ops);
    assert!(res[0].is_ok() && ops[0].buf.iter().all(|&x| x == 9));
    for r in &res[1..] {
        let e = r.as_ref().unwrap_err();
        assert!(
            matches!(Error::kind_of(e), Some(ErrorKind::ShortRead { .. })),
            "{e}"
        );
    }
    // The first half of the straddling read arrived before the end.
    assert!(ops[1].buf[..4096].iter().all(|&x| x == 9));
}
