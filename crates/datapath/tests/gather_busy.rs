//! The adaptive mode keeps a large read's decryption on the backend's
//! completion thread when no core is idle (mode/adaptive/crypto.rs): with
//! every core busy, a helper would only take CPU from the threads the
//! read still needs. Its own test binary, so the threads that keep every
//! core busy here do not run beside other tests. Checked by counting
//! hand-offs (the `offloaded` counter), never by a time.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};

use backend::FileBackend;
use common::*;
use ucrypt_datapath::{Completion, CryptMode, Engine, EngineConfig, Hint, Op, Request};

const SIZE: u64 = 16 << 20;
const QUAD: usize = 4 << 20;

/// An adaptive engine with one helper (two workers).
fn engine(fb: &Arc<FileBackend>, mode: CryptMode) -> Engine {
    let cfg = EngineConfig {
        mode,
        queue_depth: 64,
        workers: 2,
        ..EngineConfig::default()
    };
    Engine::new(volume(fb.clone(), XTS, SIZE), cfg).expect("engine")
}

fn pattern(k: u64) -> Vec<u8> {
    (0..QUAD as u64)
        .map(|i| (i * 7 + k * 31 + 3) as u8)
        .collect()
}

/// Submits `reqs` with all of them in flight (each hinted with the rest
/// behind it, the NBD server's deep path); completions in request order.
fn run_deep(e: &Engine, reqs: Vec<Request>) -> Vec<Completion> {
    let (tx, rx) = mpsc::channel();
    let n = reqs.len();
    for (i, req) in reqs.into_iter().enumerate() {
        let tx = tx.clone();
        let hint = Hint {
            behind: (n - 1 - i) as u32,
            ready: 0,
        };
        e.submit_hinted(req, hint, move |c| tx.send((i, c)).expect("receiver"));
    }
    let mut out: Vec<Option<Completion>> = (0..n).map(|_| None).collect();
    for _ in 0..n {
        let (i, c) = rx.recv_timeout(HANG).expect("completion");
        out[i] = Some(c);
    }
    out.into_iter().map(|c| c.expect("every request")).collect()
}

fn reads() -> Vec<Request> {
    (0..2u64)
        .map(|k| Request {
            op: Op::Read { len: QUAD as u32 },
            offset: k * QUAD as u64,
            fua: false,
        })
        .collect()
}

/// Reads the two 4 MiB pieces through a fresh adaptive engine (`forced`:
/// its load-blind test hook) and returns how many reads were handed off.
fn read_offloaded(fb: &Arc<FileBackend>, forced: bool) -> u64 {
    let e = engine(fb, CryptMode::Adaptive);
    e.force_split(forced);
    for (k, c) in run_deep(&e, reads()).into_iter().enumerate() {
        let data = c.expect("read").expect("read data");
        assert!(data == pattern(k as u64), "4 MiB read {k} differs");
    }
    e.stats().read.offloaded
}

/// Runs `f` while one spinning thread per CPU keeps every core busy.
fn with_every_core_busy<T>(f: impl FnOnce() -> T) -> T {
    let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get());
    let stop = Arc::new(AtomicBool::new(false));
    let spinners: Vec<_> = (0..ncpu)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::hint::spin_loop();
                }
            })
        })
        .collect();
    let out = f();
    stop.store(true, Ordering::Relaxed);
    for s in spinners {
        s.join().expect("spinner");
    }
    out
}

#[test]
fn a_large_read_keeps_its_decryption_when_no_core_is_idle() {
    let Some((fb, _path, _dir)) = uring_image("gather_busy", SIZE + DATA_OFFSET) else {
        return;
    };
    // The data, written through the inline mode (no hand-offs at all).
    let e = engine(&fb, CryptMode::Inline);
    for k in 0..2u64 {
        let req = Request {
            op: Op::Write { data: pattern(k) },
            offset: k * QUAD as u64,
            fua: false,
        };
        run(&e, req).expect("write");
    }
    drop(e);

    let (busy, forced) = with_every_core_busy(|| {
        // Every core has a runnable spinner: the completion thread
        // decrypts both reads itself, though the helper is free and a
        // 4 MiB read is big enough to wake it.
        let busy = read_offloaded(&fb, false);
        // The same load with the load-blind hook: the first read's
        // decryption moves (so the count above is not zero for want of a
        // free helper).
        (busy, read_offloaded(&fb, true))
    });
    assert_eq!(busy, 0, "a read handed off with every core busy");
    assert!(forced >= 1, "no read handed off even when forced");
}
