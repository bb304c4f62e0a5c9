//! The adaptive mode's crypto hand-off on the gather path (mode/gather.rs
//! on a completion-driven backend, mode/adaptive/crypto.rs): a large
//! hinted write is encrypted, and a large hinted read decrypted, by a free
//! helper instead of the connection or completion thread; 4 KiB requests
//! and the inline mode never move. Every check is a count of hand-offs
//! (the `offloaded` counters) or the bytes on disk, never a time.

mod common;

use std::sync::mpsc;
use std::sync::Arc;

use backend::FileBackend;
use common::*;
use ucrypt_datapath::{Completion, CryptMode, Engine, EngineConfig, Hint, Op, Plug, Request};

const SIZE: u64 = 16 << 20;
const BIG: usize = 1 << 20;
/// Requests per run, all in flight together (the caller's queue depth).
const N: u64 = 8;

/// An engine in `mode` with one helper (two workers), whatever the
/// machine's CPU count.
fn engine(fb: &Arc<FileBackend>, mode: CryptMode) -> Engine {
    let cfg = EngineConfig {
        mode,
        queue_depth: 64,
        workers: 2,
        ..EngineConfig::default()
    };
    Engine::new(volume(fb.clone(), XTS, SIZE), cfg).expect("engine")
}

fn pattern(i: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|k| (k * 13 + i * 101 + 5) as u8)
        .collect()
}

/// Submits `reqs` as a caller with all of them in flight: each hinted with
/// the rest behind it and none ready, so each goes to the backend at once
/// (the NBD server's deep path); returns the completions in request order.
fn run_deep(e: &Engine, reqs: Vec<Request>) -> Vec<Completion> {
    let n = reqs.len();
    run_with(e, reqs, |i| (n - 1 - i) as u32)
}

/// Submits `reqs` back to back, request `i` hinted with `behind(i)`
/// requests behind it and none ready; returns the completions in request
/// order.
fn run_with(e: &Engine, reqs: Vec<Request>, behind: impl Fn(usize) -> u32) -> Vec<Completion> {
    let (tx, rx) = mpsc::channel();
    let n = reqs.len();
    let mut plug = Plug::new();
    for (i, req) in reqs.into_iter().enumerate() {
        let tx = tx.clone();
        let hint = Hint {
            behind: behind(i),
            ready: 0,
        };
        e.submit_plugged(&mut plug, req, hint, move |c| {
            tx.send((i, c)).expect("receiver")
        });
    }
    let mut out: Vec<Option<Completion>> = (0..n).map(|_| None).collect();
    for _ in 0..n {
        let (i, c) = rx.recv_timeout(HANG).expect("completion");
        out[i] = Some(c);
    }
    out.into_iter().map(|c| c.expect("every request")).collect()
}

fn writes(len: usize) -> Vec<Request> {
    (0..N)
        .map(|i| Request {
            op: Op::Write {
                data: pattern(i, len),
            },
            offset: i * BIG as u64,
            fua: false,
        })
        .collect()
}

fn reads(len: usize) -> Vec<Request> {
    (0..N)
        .map(|i| Request {
            op: Op::Read { len: len as u32 },
            offset: i * BIG as u64,
            fua: false,
        })
        .collect()
}

/// Checks every read came back as `pattern(i, len)`.
fn check_reads(got: Vec<Completion>, len: usize, what: &str) {
    for (i, c) in got.into_iter().enumerate() {
        let data = c.expect("read").expect("read data");
        assert!(data == pattern(i as u64, len), "{what}: read {i} differs");
    }
}

#[test]
fn large_deep_requests_hand_their_crypto_to_a_free_helper() {
    let Some((fb, path, _dir)) = uring_image("gather_crypto_large", SIZE + DATA_OFFSET) else {
        return;
    };
    let e = engine(&fb, CryptMode::Adaptive);
    for c in run_deep(&e, writes(BIG)) {
        c.expect("write");
    }
    // The first write found the helper free: its crypto moved.
    let st = e.stats();
    assert!(st.write.offloaded >= 1, "no write handed off: {st:?}");
    assert!(st.write.offloaded <= N);
    // Encrypted exactly once, wherever: the disk holds the ciphertext.
    let disk = std::fs::read(&path).expect("read image");
    let xts = sector_crypt(XTS);
    for i in 0..N {
        let at = i * BIG as u64;
        let mut want = pattern(i, BIG);
        xts.encrypt(at / 512, &mut want);
        let got = &disk[(DATA_OFFSET + at) as usize..][..BIG];
        assert!(got == &want[..], "write {i}: not the ciphertext on disk");
    }
    drop(e);

    // A fresh engine (no back-off from the writes' helper starts): the
    // first 4 MiB read completion (big enough to wake a parked helper)
    // finds the helper free and hands it the decryption; every read still
    // returns the plaintext.
    let e = engine(&fb, CryptMode::Adaptive);
    let quad = 4 * BIG;
    let reqs = (0..2u64)
        .map(|k| Request {
            op: Op::Read { len: quad as u32 },
            offset: k * quad as u64,
            fua: false,
        })
        .collect();
    for (k, c) in run_deep(&e, reqs).into_iter().enumerate() {
        let data = c.expect("read").expect("read data");
        let want: Vec<u8> = (0..4)
            .flat_map(|j| pattern(4 * k as u64 + j, BIG))
            .collect();
        assert!(data == want, "4 MiB read {k} differs");
    }
    let st = e.stats();
    assert!(st.read.offloaded >= 1, "no read handed off: {st:?}");
    assert!(st.read.offloaded <= 2);
    drop(e);

    // 1 MiB reads move only to a helper already spinning (timing): the
    // count is not fixed, the bytes are.
    let e = engine(&fb, CryptMode::Adaptive);
    check_reads(run_deep(&e, reads(BIG)), BIG, "adaptive");
}

#[test]
fn a_large_write_queues_behind_a_busy_helper() {
    let Some((fb, path, _dir)) = uring_image("gather_crypto_queue", SIZE + DATA_OFFSET) else {
        return;
    };
    // Two 4 MiB writes submitted back to back, each with more behind it
    // (an NBD client at queue depth 8): the first goes to the one helper;
    // the second arrives while that helper is still encrypting 4 MiB
    // (microseconds apart against hundreds) and queues behind it instead
    // of being encrypted by the submitting (connection) thread.
    let e = engine(&fb, CryptMode::Adaptive);
    let quad = 4 * BIG;
    let reqs = (0..2u64)
        .map(|k| Request {
            op: Op::Write {
                data: pattern(k, quad),
            },
            offset: k * quad as u64,
            fua: false,
        })
        .collect();
    for c in run_with(&e, reqs, |_| 7) {
        c.expect("write");
    }
    let st = e.stats();
    assert_eq!(
        st.write.offloaded, 2,
        "both writes' crypto on the helper: {st:?}"
    );
    // Each encrypted exactly once: the disk holds the ciphertext.
    let disk = std::fs::read(&path).expect("read image");
    let xts = sector_crypt(XTS);
    for k in 0..2u64 {
        let at = k * quad as u64;
        let mut want = pattern(k, quad);
        xts.encrypt(at / 512, &mut want);
        let got = &disk[(DATA_OFFSET + at) as usize..][..quad];
        assert!(got == &want[..], "write {k}: not the ciphertext on disk");
    }
}

#[test]
fn small_requests_and_the_inline_mode_keep_their_crypto() {
    let Some((fb, _path, _dir)) = uring_image("gather_crypto_small", SIZE + DATA_OFFSET) else {
        return;
    };
    // Writes then reads of `len` bytes in `mode`: none of their crypto
    // may move to a helper.
    let unmoved = |mode, len, what: &str| {
        let e = engine(&fb, mode);
        for c in run_deep(&e, writes(len)) {
            c.expect("write");
        }
        check_reads(run_deep(&e, reads(len)), len, what);
        let st = e.stats();
        assert_eq!(
            st.write.offloaded + st.read.offloaded,
            0,
            "{what} moved: {st:?}"
        );
    };
    unmoved(CryptMode::Adaptive, 4096, "adaptive 4k");
    unmoved(CryptMode::Inline, BIG, "inline");
}

#[test]
fn writes_stay_with_their_submitters_when_every_core_has_one() {
    let Some((fb, _path, _dir)) = uring_image("gather_crypto_busy", SIZE + DATA_OFFSET) else {
        return;
    };
    // As many submitting threads as the process has CPUs, at least two (fio's nbd
    // engine with --numjobs 4 on 2 CPUs: one connection thread per core
    // and more): a large write with requests behind it, which a lone
    // submitter hands to the free helper (the tests above), stays on its
    // submitting thread, since the hop would gain no core. Each thread
    // writes once (so all are seen submitting), then once more; the second
    // writes are counted. The count of submitters spans milliseconds:
    // a round where the machine stalled a thread that long may still move
    // a write, so one clean round of a few is required.
    let ncpu = std::thread::available_parallelism().map_or(1, |n| n.get().max(2));
    let e = Arc::new(engine(&fb, CryptMode::Adaptive));
    let write = |t: usize, k: u64| Request {
        op: Op::Write {
            data: pattern(k, BIG),
        },
        offset: (t as u64 % (SIZE / BIG as u64)) * BIG as u64,
        fua: false,
    };
    let mut moved = Vec::new();
    for round in 0..5u64 {
        let gate = Arc::new(std::sync::Barrier::new(ncpu + 1));
        let threads: Vec<_> = (0..ncpu)
            .map(|t| {
                let (e, gate) = (e.clone(), gate.clone());
                std::thread::spawn(move || {
                    for k in 0..2 {
                        for c in run_with(&e, vec![write(t, round * 2 + k)], |_| 7) {
                            c.expect("write");
                        }
                        if k == 0 {
                            // Every first write done; then the count taken.
                            gate.wait();
                            gate.wait();
                        }
                    }
                })
            })
            .collect();
        gate.wait();
        let before = e.stats().write.offloaded;
        gate.wait();
        threads
            .into_iter()
            .for_each(|t| t.join().expect("submitter"));
        moved.push(e.stats().write.offloaded - before);
        if moved.last() == Some(&0) {
            break;
        }
    }
    assert!(
        moved.contains(&0),
        "second writes of {ncpu} submitters handed off, per round: {moved:?}"
    );
}
