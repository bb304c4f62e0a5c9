//! `Backend::reap` on the io_uring file backend: a submitter that reaps
//! runs completed entries' callbacks on its own thread, each entry exactly
//! once (whether it or the completion thread got its CQE) with the bytes a
//! synchronous call gives; what a reaper leaves when it stops reaping the
//! completion thread still runs; with nothing in flight `reap` returns 0
//! at once; backends without a ring reap nothing. Every check is a count
//! or a value, never a time (a bound only turns a hang into a failure).

use std::cell::Cell;
use std::io;
use std::sync::mpsc;

use testutil::{Capability, Rng, TempDir};
use ucrypt_backend::{AsyncKind, AsyncOp, Backend, FileBackend, FileOptions, IoEngine, MemBackend};

const SIZE: u64 = 4 << 20;
const N: usize = 48;

fn backend(dir: &TempDir, engine: IoEngine, test: &str) -> Option<FileBackend> {
    if engine == IoEngine::Uring && !testutil::require(test, Capability::IoUring) {
        return None;
    }
    let p = dir.join("disk");
    std::fs::File::create(&p).unwrap().set_len(SIZE).unwrap();
    let o = FileOptions {
        engine: Some(engine),
        ..FileOptions::default()
    };
    Some(FileBackend::open(&p, &o).unwrap_or_else(|e| panic!("{test}: open: {e}")))
}

thread_local! {
    /// Set on the test thread while it is inside `reap`.
    static IN_REAP: Cell<bool> = const { Cell::new(false) };
}

/// What an entry's callback reports: its tag, buffer, result, and whether
/// it ran inside the test thread's `reap`.
type Event = (usize, Vec<u8>, io::Result<()>, bool);

fn op(tx: &mpsc::Sender<Event>, tag: usize, kind: AsyncKind, offset: u64, buf: Vec<u8>) -> AsyncOp {
    let tx = tx.clone();
    AsyncOp {
        kind,
        offset,
        buf,
        done: Box::new(move |buf, res| {
            let _ = tx.send((tag, buf, res, IN_REAP.with(Cell::get)));
        }),
    }
}

fn reap(fb: &FileBackend) -> usize {
    IN_REAP.with(|r| r.set(true));
    let n = fb.reap();
    IN_REAP.with(|r| r.set(false));
    n
}

/// Reaps until `n` callbacks have reported; returns their events (sorted
/// by tag) and the sum of what `reap` returned.
fn reap_all(fb: &FileBackend, rx: &mpsc::Receiver<Event>, n: usize) -> (Vec<Event>, usize) {
    let mut got = Vec::with_capacity(n);
    let mut reaped = 0;
    // Each turn either reaps or waits for the completion thread's events;
    // the bound only turns a lost entry into a failure.
    for _ in 0..100_000 {
        reaped += reap(fb);
        while let Ok(e) = rx.try_recv() {
            got.push(e);
        }
        if got.len() >= n {
            break;
        }
        if let Ok(e) = rx.recv_timeout(std::time::Duration::from_millis(1)) {
            got.push(e);
        }
    }
    assert_eq!(got.len(), n, "entries lost");
    got.sort_by_key(|e| e.0);
    (got, reaped)
}

#[test]
fn reaped_entries_complete_once_with_their_bytes() {
    let dir = TempDir::new("reap");
    let Some(fb) = backend(&dir, IoEngine::Uring, "reap_bytes") else {
        return;
    };
    let mut rng = Rng::new(41);
    // Mixed sizes, some unaligned (bounced or buffered), not overlapping.
    let plan: Vec<(u64, usize)> = (0..N)
        .map(|i| {
            let base = i as u64 * (SIZE / N as u64);
            match i % 3 {
                0 => (base, 4096),
                1 => (base + 512, 64 << 10),
                _ => (base + 1 + rng.below(511), 1 + rng.below(9000) as usize),
            }
        })
        .collect();
    let datas: Vec<Vec<u8>> = plan.iter().map(|&(_, l)| rng.bytes(l)).collect();
    let (tx, rx) = mpsc::channel();
    let mut total = 0;
    // Submits `ops`, reaps them all and checks every entry against
    // `datas`; `what` names the pass in failures.
    let mut pass = |ops: Vec<AsyncOp>, what: &str| {
        fb.submit_async(ops);
        let (events, reaped) = reap_all(&fb, &rx, N);
        total += reaped;
        let mut in_reap = 0;
        for (i, buf, res, reaped) in events {
            res.unwrap_or_else(|e| panic!("{what} {i}: {e}"));
            assert_eq!(buf, datas[i], "{what} {i}");
            in_reap += usize::from(reaped);
        }
        assert_eq!(in_reap, reaped, "{what}s: reap's count vs callbacks it ran");
    };
    let writes = plan
        .iter()
        .zip(&datas)
        .enumerate()
        .map(|(i, (&(off, _), d))| op(&tx, i, AsyncKind::Write { fua: i % 7 == 0 }, off, d.clone()))
        .collect();
    pass(writes, "write");
    let reads = plan
        .iter()
        .enumerate()
        .map(|(i, &(off, l))| op(&tx, i, AsyncKind::Read, off, vec![0x5a; l]))
        .collect();
    pass(reads, "read");
    assert!(rx.try_recv().is_err(), "an entry completed twice");
    assert_eq!(fb.stats().reaped_ops, total as u64);
    // Nothing in flight: returns at once, reaps nothing.
    assert_eq!(reap(&fb), 0);
}

#[test]
fn nothing_to_reap_without_a_ring_or_entries() {
    let dir = TempDir::new("reap-none");
    // The ring starts with the first submit_async: nothing before it.
    if let Some(fb) = backend(&dir, IoEngine::Uring, "reap_none") {
        assert_eq!(fb.reap(), 0);
        let (tx, rx) = mpsc::channel();
        fb.submit_async(vec![op(&tx, 0, AsyncKind::Read, 0, vec![0; 4096])]);
        let (_, res, _) = rx.recv().map(|e| (e.0, e.2, e.3)).expect("callback");
        res.expect("read");
        // The callback has run, so its entry has left the ring.
        assert_eq!(fb.reap(), 0);
    }
    let dir = TempDir::new("reap-sync");
    let fb = backend(&dir, IoEngine::Syscalls, "reap_sync").expect("syscalls engine");
    let (tx, rx) = mpsc::channel();
    fb.submit_async(vec![op(&tx, 0, AsyncKind::Read, 0, vec![0; 4096])]);
    rx.recv().expect("callback").2.expect("read");
    assert_eq!(fb.reap(), 0);
    assert_eq!(fb.stats().reaped_ops, 0);
    let mem = MemBackend::new(1 << 20).expect("ramdisk");
    assert_eq!(mem.reap(), 0, "the provided reap has nothing to reap");
}

#[test]
fn entries_left_by_a_reaper_that_stopped_still_complete() {
    let dir = TempDir::new("reap-left");
    let Some(fb) = backend(&dir, IoEngine::Uring, "reap_left") else {
        return;
    };
    let (tx, rx) = mpsc::channel();
    for round in 0..4 {
        let ops = (0..N)
            .map(|i| op(&tx, i, AsyncKind::Read, i as u64 * 65536, vec![0; 4096]))
            .collect();
        fb.submit_async(ops);
        // One reap (the completion thread then stands back), never another:
        // the completion thread must still run every entry it left.
        let reaped = reap(&fb);
        let mut got = 0;
        while got < N {
            let (i, _, res, _) = rx
                .recv_timeout(std::time::Duration::from_secs(60))
                .unwrap_or_else(|_| panic!("round {round}: {got} of {N} entries completed"));
            res.unwrap_or_else(|e| panic!("round {round}: read {i}: {e}"));
            got += 1;
        }
        assert!(reaped <= N, "round {round}: reaped {reaped}");
        assert!(
            rx.try_recv().is_err(),
            "round {round}: an entry completed twice"
        );
    }
}
