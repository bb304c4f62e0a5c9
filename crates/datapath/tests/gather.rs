//! Gathering (mode/gather.rs): reads and writes a frontend says are
//! followed by more (`Hint::ready`) wait in its `Plug` for the last one and
//! go to the backend as one batch; a flush through the plug, a full queue,
//! `Plug::flush`, `Plug::settle` and dropping the plug run the batch first.
//! Every check here is an ordering or a count, never a time.

mod common;

use std::sync::mpsc;
use std::sync::Arc;

use backend::{Backend, FileBackend};
use common::*;
use ucrypt_datapath::{Completion, CryptMode, Engine, EngineConfig, Hint, Op, Plug, Request};

const SIZE: u64 = 4 << 20;

/// An engine in `mode` over a file on io_uring; `None` (logged skip)
/// without io_uring.
fn engine(
    test: &str,
    mode: CryptMode,
    queue_depth: usize,
) -> Option<(Engine, Arc<FileBackend>, testutil::TempDir)> {
    let (fb, _path, dir) = uring_image(test, SIZE + DATA_OFFSET)?;
    let cfg = EngineConfig {
        mode,
        queue_depth,
        ..EngineConfig::default()
    };
    let e = Engine::new(volume(fb.clone(), XTS, SIZE), cfg).expect("engine");
    Some((e, fb, dir))
}

fn pattern(i: u64) -> Vec<u8> {
    (0..4096u64).map(|k| (k * 31 + i * 7 + 1) as u8).collect()
}

type Done = (usize, Completion);

fn submit(
    e: &Engine,
    plug: &mut Plug,
    tx: &mpsc::Sender<Done>,
    tag: usize,
    req: Request,
    ready: u32,
) {
    let tx = tx.clone();
    let hint = Hint {
        behind: ready,
        ready,
    };
    e.submit_plugged(plug, req, hint, move |c| {
        tx.send((tag, c)).expect("receiver")
    });
}

fn write(i: u64, fua: bool) -> Request {
    Request {
        op: Op::Write { data: pattern(i) },
        offset: i * 8192,
        fua,
    }
}

fn read(i: u64) -> Request {
    Request {
        op: Op::Read { len: 4096 },
        offset: i * 8192,
        fua: false,
    }
}

#[test]
fn ready_requests_wait_for_the_last_and_run_as_one_batch() {
    for mode in [CryptMode::Inline, CryptMode::Adaptive] {
        let Some((e, fb, _dir)) = engine("gather_batch", mode, 64) else {
            return;
        };
        let (tx, rx) = mpsc::channel();
        let mut plug = Plug::new();
        let n = 8u64;
        let before = fb.stats();
        for i in 0..n {
            // One FUA write in the batch: it must reach the disk durably.
            let ready = (n - 1 - i) as u32;
            submit(&e, &mut plug, &tx, i as usize, write(i, i == 3), ready);
            if i + 1 < n {
                assert!(rx.try_recv().is_err(), "{mode:?}: write {i} ran alone");
            }
        }
        // On io_uring the batch completes as its IO completes (on the
        // backend's completion thread): wait for every completion.
        let mut done: Vec<usize> = (0..n)
            .map(|_| rx.recv().expect("completion"))
            .map(|(t, c)| c.map(|_| t).expect("write"))
            .collect();
        done.sort_unstable();
        assert_eq!(done, (0..n as usize).collect::<Vec<_>>(), "{mode:?}");
        let after = fb.stats();
        assert!(
            after.uring_batches > before.uring_batches,
            "{mode:?}: no batch"
        );
        assert!(after.uring_ops >= before.uring_ops + n, "{mode:?}");
        assert!(
            after.dsync_writes > before.dsync_writes,
            "{mode:?}: FUA lost"
        );

        for i in 0..n {
            submit(&e, &mut plug, &tx, i as usize, read(i), (n - 1 - i) as u32);
        }
        let mut got = 0;
        for (tag, c) in (0..n).map(|_| rx.recv().expect("completion")) {
            let data = c.expect("read").expect("read data");
            assert_eq!(data, pattern(tag as u64), "{mode:?}: read {tag}");
            got += 1;
        }
        assert_eq!(got, n, "{mode:?}: reads not all completed");
        assert!(fb.stats().uring_batches > after.uring_batches, "{mode:?}");
        // Stored encrypted: the raw bytes are not the plaintext.
        let mut raw = vec![0u8; 4096];
        fb.read_at(&mut raw, DATA_OFFSET).expect("raw read");
        assert_ne!(raw, pattern(0), "{mode:?}");
    }
}

#[test]
fn flush_and_blocking_calls_run_the_gathered_first() {
    let Some((e, _fb, _dir)) = engine("gather_flush", CryptMode::Inline, 64) else {
        return;
    };
    let (tx, rx) = mpsc::channel();
    let mut plug = Plug::new();
    for i in 0..3 {
        submit(&e, &mut plug, &tx, i, write(i as u64, false), 5);
    }
    assert!(rx.try_recv().is_err(), "gathered writes ran early");
    assert_eq!(plug.gathered(), 3);
    let flush = Request {
        op: Op::Flush,
        offset: 0,
        fua: false,
    };
    submit(&e, &mut plug, &tx, 99, flush, 0);
    assert_eq!(plug.gathered(), 0);
    let order: Vec<usize> = rx
        .try_iter()
        .map(|(t, c)| c.map(|_| t).expect("ok"))
        .collect();
    assert_eq!(order.len(), 4, "{order:?}");
    assert_eq!(order[3], 99, "flush completed before the writes: {order:?}");

    // A blocking read after the plug is settled sees a write gathered just
    // before it.
    submit(&e, &mut plug, &tx, 7, write(7, false), 3);
    assert!(rx.try_recv().is_err(), "gathered write ran early");
    plug.settle();
    assert_eq!(e.read(7 * 8192, 4096).expect("read"), pattern(7));
    assert_eq!(rx.try_iter().count(), 1);
}

#[test]
fn a_full_queue_and_a_flush_of_the_plug_run_the_batch() {
    let Some((e, _fb, _dir)) = engine("gather_full", CryptMode::Adaptive, 4) else {
        return;
    };
    let (tx, rx) = mpsc::channel();
    let mut plug = Plug::new();
    // Always "more ready": the fifth admission would wait for a slot the
    // gathered four hold, so they must run first (no deadlock).
    for i in 0..10 {
        submit(&e, &mut plug, &tx, i, write(i as u64, false), 1);
    }
    // At most a queue's worth is left gathered (the last run's).
    assert!((1..=4).contains(&plug.gathered()), "{plug:?}");
    plug.flush();
    assert_eq!(plug.gathered(), 0);
    // Every write completes (on the completion thread as its IO does).
    for _ in 0..10 {
        rx.recv().expect("completion").1.expect("write");
    }
    for i in 0..10u64 {
        assert_eq!(e.read(i * 8192, 4096).expect("read"), pattern(i), "{i}");
    }
}

#[test]
fn backends_without_queued_batches_are_not_gathered() {
    let b = backing(Store::Mem, SIZE + DATA_OFFSET);
    let cfg = EngineConfig {
        mode: CryptMode::Inline,
        queue_depth: 64,
        ..EngineConfig::default()
    };
    let e = Engine::new(volume(b.backend.clone(), XTS, SIZE), cfg).expect("engine");
    let (tx, rx) = mpsc::channel();
    let mut plug = Plug::new();
    submit(&e, &mut plug, &tx, 0, write(0, false), 4);
    assert_eq!(plug.gathered(), 0);
    assert_eq!(rx.try_iter().count(), 1, "ramdisk request held back");
}
