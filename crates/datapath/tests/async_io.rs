//! Requests completing as their IO completes (mode/gather.rs over a
//! backend that `completes_async`): a test backend holds every entry until
//! the test releases them, in reverse order, from its own completion
//! thread. Completion order then follows the IO, not the submission; a
//! failed entry fails only its request; a flush waits for the async writes
//! its plug submitted before it; reconfigure and shutdown drain entries
//! in flight. Every check is an order or a count, never a time.

mod common;

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use backend::{AsyncOp, Backend, Caps, MemBackend};
use common::*;
use ucrypt_datapath::{Completion, CryptMode, Engine, EngineConfig, Hint, Op, Plug, Request};

const SIZE: u64 = 1 << 20;

/// A ramdisk whose asynchronous entries wait for [`Held::release`].
struct Held {
    inner: MemBackend,
    queue: Mutex<Vec<AsyncOp>>,
    /// Entries at this device offset fail with EIO.
    fail_at: Option<u64>,
    flushes: AtomicUsize,
    /// Entries whose IO is done (counted before their callback runs).
    completed: AtomicUsize,
}

impl Held {
    fn new(fail_at: Option<u64>) -> Arc<Self> {
        Arc::new(Self {
            inner: MemBackend::new(SIZE + DATA_OFFSET).expect("ramdisk"),
            queue: Mutex::new(Vec::new()),
            fail_at,
            flushes: AtomicUsize::new(0),
            completed: AtomicUsize::new(0),
        })
    }

    fn held(&self) -> usize {
        self.queue.lock().unwrap().len()
    }

    /// Waits (polling, generous bound) until `n` entries are held.
    fn wait_held(&self, n: usize) {
        for _ in 0..60_000 {
            if self.held() >= n {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        panic!("{} entries held, expected {n}", self.held());
    }

    /// Completes every held entry, last submitted first, on a thread of
    /// its own marked as the backend's completion thread.
    fn release(self: &Arc<Self>) {
        let ops = std::mem::take(&mut *self.queue.lock().unwrap());
        let me = self.clone();
        std::thread::spawn(move || {
            backend::mark_completion_thread();
            for mut op in ops.into_iter().rev() {
                let res = if Some(op.offset) == me.fail_at {
                    Err(io::Error::other("injected EIO"))
                } else {
                    match op.kind {
                        backend::AsyncKind::Read => me.inner.read_at(&mut op.buf, op.offset),
                        backend::AsyncKind::Write { fua } => {
                            me.inner.write_at(&op.buf, op.offset, fua)
                        }
                        other => Err(io::Error::other(format!("{other:?}: not in this fake"))),
                    }
                };
                me.completed.fetch_add(1, Ordering::SeqCst);
                drop(op.finish(res));
            }
        })
        .join()
        .expect("completion thread");
    }
}

impl Backend for Held {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn caps(&self) -> Caps {
        self.inner.caps()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.inner.write_at(buf, offset, fua)
    }
    fn flush(&self) -> io::Result<()> {
        self.flushes.fetch_add(1, Ordering::SeqCst);
        self.inner.flush()
    }
    fn completes_async(&self) -> bool {
        true
    }
    fn submit_async(&self, ops: Vec<AsyncOp>) {
        self.queue.lock().unwrap().extend(ops);
    }
}

fn engine(b: &Arc<Held>, mode: CryptMode) -> Engine {
    let cfg = EngineConfig {
        mode,
        queue_depth: 64,
        ..EngineConfig::default()
    };
    Engine::new(volume(b.clone(), XTS, SIZE), cfg).expect("engine")
}

fn pattern(i: u64) -> Vec<u8> {
    (0..4096u64).map(|k| (k * 13 + i * 5 + 3) as u8).collect()
}

type Done = (u64, Completion);

/// Submits through `plug` as a frontend with other requests of its caller
/// in flight.
fn deep(e: &Engine, plug: &mut Plug, tx: &mpsc::Sender<Done>, tag: u64, op: Op) {
    let tx = tx.clone();
    let req = Request {
        op,
        offset: tag * 8192,
        fua: false,
    };
    let hint = Hint {
        behind: 1,
        ready: 0,
    };
    e.submit_plugged(plug, req, hint, move |c| {
        tx.send((tag, c)).expect("receiver")
    });
}

#[test]
fn completions_follow_the_io_not_the_submission() {
    for mode in [CryptMode::Inline, CryptMode::Adaptive] {
        let b = Held::new(None);
        let e = engine(&b, mode);
        for i in 0..4 {
            e.write(i * 8192, pattern(i), false).expect("write");
        }
        let (tx, rx) = mpsc::channel();
        let mut plug = Plug::new();
        for i in 0..4 {
            deep(&e, &mut plug, &tx, i, Op::Read { len: 4096 });
        }
        assert_eq!(b.held(), 4, "{mode:?}: reads not submitted asynchronously");
        assert!(rx.try_recv().is_err(), "{mode:?}: completed before its IO");
        b.release();
        let got: Vec<Done> = (0..4).map(|_| rx.recv().expect("completion")).collect();
        let order: Vec<u64> = got.iter().map(|d| d.0).collect();
        assert_eq!(order, [3, 2, 1, 0], "{mode:?}");
        for (tag, c) in got {
            let data = c.expect("read").expect("data");
            assert_eq!(data, pattern(tag), "{mode:?}: read {tag} (decrypted)");
        }
        // Stored encrypted.
        let mut raw = vec![0u8; 4096];
        b.read_at(&mut raw, DATA_OFFSET).unwrap();
        assert_ne!(raw, pattern(0));
        assert_eq!(e.stats().in_flight, 0, "{mode:?}");
    }
}

#[test]
fn a_failed_entry_fails_only_its_request() {
    let b = Held::new(Some(DATA_OFFSET + 2 * 8192));
    let e = engine(&b, CryptMode::Inline);
    let (tx, rx) = mpsc::channel();
    let mut plug = Plug::new();
    for i in 0..4 {
        deep(&e, &mut plug, &tx, i, Op::Write { data: pattern(i) });
    }
    b.release();
    for _ in 0..4 {
        let (tag, c) = rx.recv().expect("completion");
        match tag {
            2 => assert!(c.is_err(), "write 2 should fail"),
            _ => assert!(c.is_ok(), "write {tag}: {c:?}"),
        }
    }
    for i in [0u64, 1, 3] {
        assert_eq!(e.read(i * 8192, 4096).expect("read"), pattern(i), "{i}");
    }
}

#[test]
fn a_flush_waits_for_the_writes_submitted_before_it() {
    let b = Held::new(None);
    let e = Arc::new(engine(&b, CryptMode::Inline));
    let (tx, rx) = mpsc::channel();
    let writes = Arc::new(AtomicUsize::new(0));
    let t = {
        let (e, writes) = (e.clone(), writes.clone());
        std::thread::spawn(move || {
            let mut plug = Plug::new();
            for i in 0..3 {
                let w = writes.clone();
                let req = Request {
                    op: Op::Write { data: pattern(i) },
                    offset: i * 8192,
                    fua: false,
                };
                let hint = Hint {
                    behind: 1,
                    ready: 0,
                };
                e.submit_plugged(&mut plug, req, hint, move |c| {
                    c.expect("write");
                    w.fetch_add(1, Ordering::SeqCst);
                });
            }
            let tx = tx.clone();
            let flush = Request {
                op: Op::Flush,
                offset: 0,
                fua: false,
            };
            let hint = Hint {
                behind: 1,
                ready: 0,
            };
            e.submit_plugged(&mut plug, flush, hint, move |c| {
                tx.send(c).expect("receiver")
            });
            writes.load(Ordering::SeqCst)
        })
    };
    b.wait_held(3);
    assert_eq!(b.flushes.load(Ordering::SeqCst), 0, "flush ran past writes");
    b.release();
    assert_eq!(t.join().expect("submitter"), 3, "flush before its writes");
    rx.recv().expect("flush").expect("flush ok");
    assert_eq!(b.flushes.load(Ordering::SeqCst), 1);
}

#[test]
fn reconfigure_and_shutdown_drain_io_in_flight() {
    let b = Held::new(None);
    let e = Arc::new(engine(&b, CryptMode::Inline));
    let done = Arc::new(AtomicUsize::new(0));
    let mut plug = Plug::new();
    let mut submit = |n: u64| {
        for i in 0..n {
            let d = done.clone();
            let req = Request {
                op: Op::Write { data: pattern(i) },
                offset: i * 8192,
                fua: false,
            };
            let hint = Hint {
                behind: 1,
                ready: 0,
            };
            e.submit_plugged(&mut plug, req, hint, move |c| {
                c.expect("write");
                d.fetch_add(1, Ordering::SeqCst);
            });
        }
    };
    submit(4);
    assert_eq!(b.held(), 4);
    let (go, started) = mpsc::channel();
    let t = {
        let (e, b) = (e.clone(), b.clone());
        std::thread::spawn(move || {
            go.send(()).expect("receiver");
            let cfg = EngineConfig {
                mode: CryptMode::Adaptive,
                queue_depth: 64,
                ..EngineConfig::default()
            };
            e.reconfigure(cfg).expect("reconfigure");
            // A drained request released its slot: its IO is done (its
            // callback may still be running).
            b.completed.load(Ordering::SeqCst)
        })
    };
    // Give the swap a head start into its drain (it may also be later:
    // either way it must not return before the writes completed).
    started.recv().expect("started");
    for _ in 0..10_000 {
        std::thread::yield_now();
    }
    b.release();
    assert_eq!(
        t.join().expect("reconfigure"),
        4,
        "swapped with IO in flight"
    );
    assert_eq!(e.config().mode, CryptMode::Adaptive);

    submit(3);
    assert_eq!(b.held(), 3);
    let (go, started) = mpsc::channel();
    let t = {
        let (e, b) = (e.clone(), b.clone());
        std::thread::spawn(move || {
            go.send(()).expect("receiver");
            e.shutdown().expect("shutdown");
            b.completed.load(Ordering::SeqCst)
        })
    };
    started.recv().expect("started");
    for _ in 0..10_000 {
        std::thread::yield_now();
    }
    b.release();
    assert_eq!(
        t.join().expect("shutdown"),
        7,
        "shut down with IO in flight"
    );
}

/// A write through `plug` with another ready behind it: gathered.
fn gathered_write(e: &Engine, plug: &mut Plug, tx: &mpsc::Sender<Done>, i: u64, ready: u32) {
    let tx = tx.clone();
    let req = Request {
        op: Op::Write { data: pattern(i) },
        offset: i * 8192,
        fua: false,
    };
    let hint = Hint {
        behind: ready,
        ready,
    };
    e.submit_plugged(plug, req, hint, move |c| tx.send((i, c)).expect("receiver"));
}

#[test]
fn a_dropped_plug_runs_what_it_gathered() {
    for mode in [CryptMode::Inline, CryptMode::Adaptive] {
        let b = Held::new(None);
        let e = engine(&b, mode);
        let (tx, rx) = mpsc::channel();
        {
            let mut plug = Plug::new();
            for i in 0..3 {
                gathered_write(&e, &mut plug, &tx, i, 1);
            }
            assert_eq!(plug.gathered(), 3, "{mode:?}: {plug:?}");
            assert_eq!(b.held(), 0, "{mode:?}: ran before the plug said so");
            assert!(rx.try_recv().is_err(), "{mode:?}");
        }
        // The drop ran them: every one reached the backend.
        let held = b.held();
        if held != 3 {
            // Lost requests keep their queue slots: the engine's drop
            // would wait for them forever.
            std::mem::forget(e);
            panic!("{mode:?}: a dropped plug lost its requests ({held} of 3 ran)");
        }
        b.release();
        for _ in 0..3 {
            let (tag, c) = rx.recv().expect("completion");
            c.unwrap_or_else(|err| panic!("{mode:?}: write {tag}: {err}"));
        }
        for i in 0..3 {
            assert_eq!(
                e.read(i * 8192, 4096).expect("read"),
                pattern(i),
                "{mode:?}"
            );
        }
        assert_eq!(e.stats().in_flight, 0, "{mode:?}");
    }
}

#[test]
fn a_drain_waits_for_a_pending_plug_and_its_owner_runs_it() {
    let b = Held::new(None);
    let e = Arc::new(engine(&b, CryptMode::Inline));
    let (tx, rx) = mpsc::channel();
    let (gathered, was_gathered) = mpsc::channel();
    let (go, on) = mpsc::channel::<()>();
    // A frontend thread: two writes gathered, then (while a reconfigure
    // may be draining) a third with nothing more ready.
    let owner = {
        let e = e.clone();
        std::thread::spawn(move || {
            let mut plug = Plug::new();
            gathered_write(&e, &mut plug, &tx, 0, 1);
            gathered_write(&e, &mut plug, &tx, 1, 1);
            gathered.send(plug.gathered()).expect("receiver");
            on.recv().expect("go");
            gathered_write(&e, &mut plug, &tx, 2, 0);
            plug.gathered()
        })
    };
    assert_eq!(was_gathered.recv().expect("gathered"), 2);
    assert_eq!(b.held(), 0, "gathered writes ran early");
    let swap = {
        let (e, b) = (e.clone(), b.clone());
        std::thread::spawn(move || {
            let cfg = EngineConfig {
                mode: CryptMode::Adaptive,
                queue_depth: 64,
                ..EngineConfig::default()
            };
            e.reconfigure(cfg).expect("reconfigure");
            b.completed.load(Ordering::SeqCst)
        })
    };
    // Give the swap a head start into its drain (it may also be later:
    // either way the plug's writes must complete before it swaps).
    for _ in 0..10_000 {
        std::thread::yield_now();
    }
    go.send(()).expect("owner");
    // The owner ran its plug: waiting for a slot while the drain holds
    // admission, or with its third write (nothing more ready).
    b.wait_held(2);
    b.release();
    assert!(
        swap.join().expect("reconfigure") >= 2,
        "swapped with the plug's writes not completed"
    );
    assert_eq!(
        owner.join().expect("owner"),
        0,
        "owner left requests gathered"
    );
    // The third write: completed with the others, or admitted under the
    // new generation and held.
    if b.held() > 0 {
        b.release();
    }
    let mut tags: Vec<u64> = (0..3)
        .map(|_| rx.recv().expect("completion"))
        .map(|(t, c)| c.map(|_| t).expect("write"))
        .collect();
    tags.sort_unstable();
    assert_eq!(tags, [0, 1, 2]);
    assert_eq!(e.config().mode, CryptMode::Adaptive);
    for i in 0..3 {
        assert_eq!(e.read(i * 8192, 4096).expect("read"), pattern(i), "{i}");
    }
}
