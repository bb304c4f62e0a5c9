//! Completion-driven IO (`Backend::submit_async`) on the io_uring file
//! backend: every entry completes exactly once with the same bytes as a
//! synchronous call, on the completion thread; errors stay per entry
//! (refused ranges, a file shrunk under the ring, injected faults); a
//! panicking callback harms no other entry; dropping the backend waits
//! for entries in flight. Every check is a count or a value, never a time.

mod common;

use common::{op, Event};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Arc;

use testutil::{Capability, Rng, TempDir};
use ucrypt_backend::{
    AsyncKind, AsyncOp, Backend, Error, ErrorKind, FaultBackend, FaultRule, FileBackend,
    FileOptions, FuaMode, IoEngine, OpKind,
};

const SIZE: u64 = 4 << 20;

fn make_file(dir: &TempDir, name: &str, size: u64) -> PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p).unwrap().set_len(size).unwrap();
    p
}

fn open(path: &Path, fua: FuaMode, test: &str) -> Option<FileBackend> {
    if !testutil::require(test, Capability::IoUring) {
        return None;
    }
    let o = FileOptions {
        engine: Some(IoEngine::Uring),
        fua,
        ..FileOptions::default()
    };
    Some(FileBackend::open(path, &o).unwrap_or_else(|e| panic!("{test}: open: {e}")))
}

/// Waits for `n` events, sorted by tag.
fn collect(rx: &mpsc::Receiver<Event>, n: usize) -> Vec<Event> {
    let mut v: Vec<Event> = (0..n).map(|_| rx.recv().expect("callback")).collect();
    v.sort_by_key(|e| e.0);
    v
}

/// Entries of one batch: (offset, len), aligned and unaligned, not
/// overlapping.
fn plan(rng: &mut Rng, n: usize) -> Vec<(u64, usize)> {
    let slot = SIZE / n as u64;
    (0..n)
        .map(|i| {
            let base = i as u64 * slot;
            if i % 2 == 0 {
                (base, 4096 * (1 + rng.below(8) as usize))
            } else {
                (base + 1 + rng.below(511), 1 + rng.below(20000) as usize)
            }
        })
        .collect()
}

#[test]
fn entries_complete_with_the_bytes_of_synchronous_calls() {
    for fua in [FuaMode::Dsync, FuaMode::WriteThenFlush] {
        let dir = TempDir::new("aio");
        let path = make_file(&dir, "disk", SIZE);
        let Some(fb) = open(&path, fua, "aio_bytes") else {
            return;
        };
        assert!(fb.completes_async());
        let mut rng = Rng::new(7);
        let plan = plan(&mut rng, 24);
        let (tx, rx) = mpsc::channel();
        let datas: Vec<Vec<u8>> = plan.iter().map(|&(_, l)| rng.bytes(l)).collect();
        let ops = plan
            .iter()
            .zip(&datas)
            .enumerate()
            .map(|(i, (&(off, _), d))| {
                op(&tx, i, AsyncKind::Write { fua: i % 5 == 0 }, off, d.clone())
            })
            .collect();
        fb.submit_async(ops);
        for (i, buf, res, comp) in collect(&rx, plan.len()) {
            res.unwrap_or_else(|e| panic!("{fua:?}: write {i}: {e}"));
            assert_eq!(buf, datas[i], "{fua:?}: write {i} gave back another buffer");
            assert!(
                comp,
                "{fua:?}: write {i} completed off the completion thread"
            );
        }
        for (&(off, _), d) in plan.iter().zip(&datas) {
            let mut got = vec![0u8; d.len()];
            fb.read_at(&mut got, off).unwrap();
            assert_eq!(&got, d, "{fua:?}: at {off}");
        }
        let ops = plan
            .iter()
            .enumerate()
            .map(|(i, &(off, l))| op(&tx, i, AsyncKind::Read, off, vec![0xa5; l]))
            .collect();
        fb.submit_async(ops);
        for (i, buf, res, comp) in collect(&rx, plan.len()) {
            res.unwrap_or_else(|e| panic!("{fua:?}: read {i}: {e}"));
            assert_eq!(buf, datas[i], "{fua:?}: read {i}");
            assert!(comp);
        }
        let s = fb.stats();
        assert!(s.uring_ops >= 2 * plan.len() as u64, "{s:?}");
        match fua {
            FuaMode::Dsync => assert!(s.dsync_writes >= 5, "{s:?}"),
            _ => assert!(s.syncs >= 5, "{s:?}"),
        }
    }
}

#[test]
fn a_failed_entry_fails_alone() {
    let dir = TempDir::new("aio");
    let path = make_file(&dir, "disk", SIZE);
    let Some(fb) = open(&path, FuaMode::Dsync, "aio_errors") else {
        return;
    };
    fb.write_at(&[7u8; 8192], 0, false).unwrap();
    // Shrink the file under the backend: a read past the new end is still
    // inside the device's size, so the ring runs it and meets EOF.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&path)
        .unwrap()
        .set_len(SIZE / 2)
        .unwrap();
    let (tx, rx) = mpsc::channel();
    fb.submit_async(vec![
        op(&tx, 0, AsyncKind::Read, 0, vec![0; 4096]),
        op(&tx, 1, AsyncKind::Read, SIZE - 4096, vec![0; 4096]),
        op(&tx, 2, AsyncKind::Read, SIZE, vec![0; 4096]),
        op(&tx, 3, AsyncKind::Read, 4096, vec![0; 4096]),
    ]);
    let ev = collect(&rx, 4);
    assert!(
        ev[0].2.is_ok() && ev[3].2.is_ok(),
        "{:?} {:?}",
        ev[0].2,
        ev[3].2
    );
    assert_eq!(ev[0].1, vec![7u8; 4096]);
    assert_eq!(ev[3].1, vec![7u8; 4096]);
    let short = ev[1].2.as_ref().expect_err("read past EOF");
    assert!(
        matches!(Error::kind_of(short), Some(ErrorKind::ShortRead { .. })),
        "{short}"
    );
    assert!(ev[1].3, "the ring's error comes from the completion thread");
    let range = ev[2].2.as_ref().expect_err("out of range");
    assert_eq!(range.kind(), std::io::ErrorKind::InvalidInput, "{range}");
    assert!(!ev[2].3, "a refused entry completes on the submitter");
}

#[test]
fn injected_faults_fail_only_their_entries() {
    let dir = TempDir::new("aio");
    let path = make_file(&dir, "disk", SIZE);
    let Some(fb) = open(&path, FuaMode::Dsync, "aio_fault") else {
        return;
    };
    let fault = FaultBackend::new(fb);
    assert!(fault.completes_async());
    fault.add_rule(FaultRule::error(OpKind::Write.into(), libc::EIO).range(8192..12288));
    let (tx, rx) = mpsc::channel();
    let ops = (0..6u64)
        .map(|i| {
            let kind = AsyncKind::Write { fua: false };
            op(&tx, i as usize, kind, i * 4096, vec![i as u8 + 1; 4096])
        })
        .collect();
    fault.submit_async(ops);
    for (i, _, res, comp) in collect(&rx, 6) {
        if i == 2 {
            let e = res.expect_err("injected");
            assert_eq!(ucrypt_backend::raw_os_error(&e), Some(libc::EIO), "{e}");
        } else {
            res.unwrap_or_else(|e| panic!("write {i}: {e}"));
            assert!(comp, "write {i} did not go through the ring");
        }
    }
    let mut got = vec![0u8; 4096];
    for i in [0u64, 1, 3, 4, 5] {
        fault.read_at(&mut got, i * 4096).unwrap();
        assert_eq!(got, vec![i as u8 + 1; 4096], "{i}");
    }
    fault.read_at(&mut got, 2 * 4096).unwrap();
    assert_eq!(got, vec![0u8; 4096], "the failed write landed");
}

#[test]
fn a_panicking_callback_harms_no_other_entry() {
    let dir = TempDir::new("aio");
    let path = make_file(&dir, "disk", SIZE);
    let Some(fb) = open(&path, FuaMode::Dsync, "aio_panic") else {
        return;
    };
    let (tx, rx) = mpsc::channel();
    let mut ops: Vec<AsyncOp> = (0..4)
        .map(|i| op(&tx, i, AsyncKind::Read, i as u64 * 4096, vec![0; 4096]))
        .collect();
    ops.insert(
        2,
        AsyncOp {
            kind: AsyncKind::Read,
            offset: 0,
            buf: vec![0; 4096],
            done: Box::new(|_, _| panic!("callback panics on purpose")),
        },
    );
    fb.submit_async(ops);
    assert_eq!(collect(&rx, 4).len(), 4);
    // The completion thread survived it.
    fb.submit_async(vec![op(&tx, 9, AsyncKind::Read, 0, vec![0; 512])]);
    let (tag, _, res, comp) = rx.recv().unwrap();
    assert!(tag == 9 && res.is_ok() && comp);
}

#[test]
fn dropping_the_backend_waits_for_entries_in_flight() {
    let dir = TempDir::new("aio");
    let path = make_file(&dir, "disk", SIZE);
    let Some(fb) = open(&path, FuaMode::Dsync, "aio_drop") else {
        return;
    };
    let fb = Arc::new(fb);
    let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let n = 64;
    let ops = (0..n)
        .map(|i| {
            let c = count.clone();
            AsyncOp {
                kind: AsyncKind::Write { fua: i % 8 == 0 },
                offset: i as u64 * 65536,
                buf: vec![1; 65536],
                done: Box::new(move |_, res| {
                    res.expect("write");
                    c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }),
            }
        })
        .collect();
    fb.submit_async(ops);
    drop(fb);
    assert_eq!(count.load(std::sync::atomic::Ordering::SeqCst), n);
}

#[test]
fn the_last_reference_may_go_with_a_callback() {
    let dir = TempDir::new("aio");
    let path = make_file(&dir, "disk", SIZE);
    let Some(fb) = open(&path, FuaMode::Dsync, "aio_last_ref") else {
        return;
    };
    let fb = Arc::new(fb);
    let (tx, rx) = mpsc::channel();
    let keep = fb.clone();
    fb.submit_async(vec![AsyncOp {
        kind: AsyncKind::Read,
        offset: 0,
        buf: vec![0; 4096],
        done: Box::new(move |_, res| {
            // Dropped on the completion thread: its drop must not join it.
            drop(keep);
            let _ = tx.send(res.is_ok());
        }),
    }]);
    drop(fb);
    assert!(rx.recv().expect("callback ran"));
    // The file's lock goes with the completion thread, which exits right
    // after the callback: the file opens read-write again (polled, with a
    // generous bound; never a time asserted).
    let o = FileOptions {
        engine: Some(IoEngine::Uring),
        ..FileOptions::default()
    };
    let mut again = FileBackend::open(&path, &o);
    for _ in 0..5000 {
        if again.is_ok() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
        again = FileBackend::open(&path, &o);
    }
    again.expect("reopen after the last reference went");
}
