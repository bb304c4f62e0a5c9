//! A submitter that finds the queue full reaps the backend's completions
//! itself (`Backend::reap`) before it waits in admission: a test backend
//! holds every asynchronous entry and completes the held ones only when
//! `reap` is called, so the submissions past the queue depth go through
//! only if the engine reaps on the submitter's thread. Every check is a
//! count or a value, never a time.

mod common;

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread::ThreadId;

use backend::{AsyncOp, Backend, Caps, MemBackend};
use common::*;
use ucrypt_datapath::{Completion, CryptMode, Engine, EngineConfig, Hint, Op, Plug, Request};

const SIZE: u64 = 1 << 20;
const QD: usize = 2;
const N: u64 = 10;

/// A ramdisk whose asynchronous entries complete in [`Backend::reap`]
/// (or when the test releases what is left).
struct Reaped {
    inner: MemBackend,
    queue: Mutex<Vec<AsyncOp>>,
    /// Entries completed by `reap`.
    reaped: AtomicUsize,
}

impl Reaped {
    fn complete(&self, ops: Vec<AsyncOp>) -> usize {
        let n = ops.len();
        for mut op in ops {
            let res = match op.kind {
                backend::AsyncKind::Read => self.inner.read_at(&mut op.buf, op.offset),
                backend::AsyncKind::Write { fua } => self.inner.write_at(&op.buf, op.offset, fua),
                other => Err(io::Error::other(format!("{other:?}: not in this fake"))),
            };
            drop(op.finish(res));
        }
        n
    }

    fn take(&self) -> Vec<AsyncOp> {
        std::mem::take(&mut *self.queue.lock().unwrap())
    }
}

impl Backend for Reaped {
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
        self.inner.flush()
    }
    fn completes_async(&self) -> bool {
        true
    }
    fn submit_async(&self, ops: Vec<AsyncOp>) {
        self.queue.lock().unwrap().extend(ops);
    }
    fn reap(&self) -> usize {
        let n = self.complete(self.take());
        self.reaped.fetch_add(n, Ordering::SeqCst);
        n
    }
}

fn pattern(i: u64) -> Vec<u8> {
    (0..4096u64).map(|k| (k * 7 + i * 11 + 1) as u8).collect()
}

type Done = (u64, ThreadId, Completion);

#[test]
fn a_submitter_at_a_full_queue_reaps_instead_of_waiting() {
    let b = Arc::new(Reaped {
        inner: MemBackend::new(SIZE + DATA_OFFSET).expect("ramdisk"),
        queue: Mutex::new(Vec::new()),
        reaped: AtomicUsize::new(0),
    });
    let cfg = EngineConfig {
        mode: CryptMode::Inline,
        queue_depth: QD,
        ..EngineConfig::default()
    };
    let e = Arc::new(Engine::new(volume(b.clone(), XTS, SIZE), cfg).expect("engine"));
    let (tx, rx) = mpsc::channel::<Done>();
    let submitter = {
        let e = e.clone();
        std::thread::spawn(move || {
            let mut plug = Plug::new();
            for i in 0..N {
                let tx = tx.clone();
                let req = Request {
                    op: Op::Write { data: pattern(i) },
                    offset: i * 8192,
                    fua: false,
                };
                // Others of the caller in flight: the write goes to
                // `submit_async` and is held.
                let hint = Hint {
                    behind: N as u32,
                    ready: 0,
                };
                e.submit_plugged(&mut plug, req, hint, move |c| {
                    let me = std::thread::current().id();
                    tx.send((i, me, c)).expect("receiver");
                });
            }
            std::thread::current().id()
        })
    };
    // Without the reap the submitter would wait forever at the third
    // write; the bound only turns that hang into a failure.
    let mut waited = 0;
    while !submitter.is_finished() {
        assert!(
            waited < 60_000,
            "submitter blocked: the engine did not reap"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
        waited += 1;
    }
    let me = submitter.join().expect("submitter");
    // Every submission past the queue depth found it full, reaped the
    // QD held entries and took a slot; the last QD are still held.
    let reaped = b.reaped.load(Ordering::SeqCst);
    assert_eq!(reaped, N as usize - QD, "entries reaped on the submitter");
    assert_eq!(b.queue.lock().unwrap().len(), QD);
    let mut on_submitter = 0;
    for _ in 0..reaped {
        let (tag, thread, c) = rx.try_recv().expect("a reaped write completed");
        c.unwrap_or_else(|err| panic!("write {tag}: {err}"));
        on_submitter += usize::from(thread == me);
    }
    assert_eq!(
        on_submitter, reaped,
        "reaped callbacks ran on the submitter"
    );
    assert_eq!(b.complete(b.take()), QD);
    for _ in 0..QD {
        let (tag, _, c) = rx.recv().expect("completion");
        c.unwrap_or_else(|err| panic!("write {tag}: {err}"));
    }
    for i in 0..N {
        assert_eq!(e.read(i * 8192, 4096).expect("read"), pattern(i), "{i}");
    }
    assert_eq!(e.stats().in_flight, 0);
}
