//! A completion callback that panics on a caller thread must not lose the
//! request the gate deferred behind it, nor wedge the thread's trampoline:
//! the deferred request still completes, the panicking thread can submit
//! again, and dropping the engine returns.
//!
//! The order is forced, not hoped for: a backend that holds each read and
//! write until the test hands it a permit keeps request A (a read on the
//! engine's threads) and W (a write run inline on a caller thread) in
//! flight together, filling a queue of depth 2. A's callback, on an engine
//! thread, submits R2 (admitted into A's freed slot) and R3 (deferred: the
//! queue is full). W's release then hands R3 back just before W's callback
//! panics.

mod common;

use std::io;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use backend::{Backend, Caps, MemBackend};
use common::*;
use ucrypt_datapath::{Completion, CryptMode, Engine, EngineConfig, Op, PerfFlags, Request};

/// Liveness bound on each awaited event (not a performance threshold).
const EVENT: Duration = Duration::from_secs(30);

/// A `MemBackend` whose reads and writes, while `hold` is set, announce
/// themselves and then wait for a permit of their kind.
struct Stall {
    inner: MemBackend,
    hold: AtomicBool,
    entered: Mutex<Sender<&'static str>>,
    read_permits: Mutex<Receiver<()>>,
    write_permits: Mutex<Receiver<()>>,
}

impl Stall {
    fn wait(&self, kind: &'static str, permits: &Mutex<Receiver<()>>) -> io::Result<()> {
        if !self.hold.load(SeqCst) {
            return Ok(());
        }
        let _ = self.entered.lock().unwrap().send(kind);
        permits
            .lock()
            .unwrap()
            .recv_timeout(EVENT)
            .map_err(|_| io::Error::other(format!("no {kind} permit")))
    }
}

impl Backend for Stall {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn caps(&self) -> Caps {
        self.inner.caps()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.wait("read", &self.read_permits)?;
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.wait("write", &self.write_permits)?;
        self.inner.write_at(buf, offset, fua)
    }
    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn read(offset: u64) -> Request {
    Request {
        op: Op::Read { len: 4096 },
        offset,
        fua: false,
    }
}

fn write(offset: u64) -> Request {
    Request {
        op: Op::Write {
            data: vec![7; 4096],
        },
        offset,
        fua: false,
    }
}

#[test]
fn panicking_callback_keeps_deferred_request_and_lets_drop_return() {
    let (entered_tx, entered) = channel();
    let (read_permit, read_permits) = channel();
    let (write_permit, write_permits) = channel();
    let stall = Arc::new(Stall {
        inner: MemBackend::new(2 << 20).expect("mem"),
        hold: AtomicBool::new(false),
        entered: Mutex::new(entered_tx),
        read_permits: Mutex::new(read_permits),
        write_permits: Mutex::new(write_permits),
    });
    // Classic mode: reads go through the engine's threads, writes run
    // inline on the submitting thread.
    let cfg = EngineConfig {
        mode: CryptMode::Classic,
        queue_depth: 2,
        flags: PerfFlags {
            no_write_workqueue: true,
            ..PerfFlags::default()
        },
        ..EngineConfig::default()
    };
    let engine = Arc::new(Engine::new(volume(stall.clone(), XTS, 1 << 20), cfg).expect("engine"));
    stall.hold.store(true, SeqCst);

    // A: held in the backend on an engine thread.
    let (done_tx, done) = channel::<(&'static str, Completion)>();
    let weak = Arc::downgrade(&engine);
    let tx = done_tx.clone();
    engine.submit(read(0), move |c| {
        let e = weak.upgrade().expect("engine alive");
        let (t2, t3) = (tx.clone(), tx.clone());
        e.submit(read(4096), move |c| t2.send(("R2", c)).unwrap());
        e.submit(read(8192), move |c| t3.send(("R3", c)).unwrap());
        drop(e);
        tx.send(("A", c)).unwrap();
    });
    assert_eq!(
        entered.recv_timeout(EVENT),
        Ok("read"),
        "A reached the backend"
    );

    // W: held in the backend on a caller thread; its callback panics. Then
    // the same thread submits again (W2), which must still run.
    let (caught_tx, caught) = channel();
    let w_thread = {
        let e = engine.clone();
        std::thread::spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                e.submit(write(0), |_| panic!("bad completion callback"))
            }));
            caught_tx.send(r.is_err()).unwrap();
            let (tx, rx) = channel();
            e.submit(write(12288), move |c| tx.send(c).unwrap());
            rx.recv_timeout(EVENT)
        })
    };
    assert_eq!(
        entered.recv_timeout(EVENT),
        Ok("write"),
        "W reached the backend"
    );
    assert_eq!(engine.stats().in_flight, 2, "A and W fill the queue");

    // A completes; its callback submits R2 (admitted) and R3 (deferred).
    read_permit.send(()).unwrap();
    let (name, c) = done.recv_timeout(EVENT).expect("A completes");
    assert_eq!(name, "A");
    assert!(c.is_ok(), "A: {c:?}");
    assert_eq!(
        entered.recv_timeout(EVENT),
        Ok("read"),
        "R2 reached the backend"
    );
    assert_eq!(
        engine.stats().in_flight,
        2,
        "R2 and W in flight, R3 deferred"
    );

    // W completes on its caller thread, handing R3 back, and panics.
    write_permit.send(()).unwrap();
    write_permit.send(()).unwrap(); // for W2
    assert_eq!(
        caught.recv_timeout(EVENT),
        Ok(true),
        "the callback's panic reaches the submitter"
    );
    // W2 waits for a slot held by R2 and R3 (replayed by W's thread):
    // let the reads go.
    stall.hold.store(false, SeqCst);
    read_permit.send(()).unwrap(); // R2, held
    read_permit.send(()).unwrap(); // R3, if it got held too
    let w2 = w_thread.join().expect("submitter thread");
    assert!(
        matches!(w2, Ok(Ok(_))),
        "W2 on the thread whose callback panicked: {w2:?}"
    );

    let mut seen = Vec::new();
    while seen.len() < 2 {
        let (name, c) = done
            .recv_timeout(EVENT)
            .unwrap_or_else(|e| panic!("{seen:?} completed, then {e:?}"));
        assert!(c.is_ok(), "{name}: {c:?}");
        seen.push(name);
    }
    seen.sort_unstable();
    assert_eq!(seen, ["R2", "R3"]);

    // Dropping the engine returns (on a helper thread, so a hang fails).
    let (dropped_tx, dropped) = channel();
    std::thread::spawn(move || {
        drop(engine);
        dropped_tx.send(()).unwrap();
    });
    assert_eq!(dropped.recv_timeout(EVENT), Ok(()), "engine drop returns");
    drop(done_tx);
}
