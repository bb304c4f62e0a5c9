//! `luksSuspend` / `luksResume` and `resize` on a live engine: while
//! suspended requests wait (none fails, none runs), the engine lets go of
//! its cipher (the key), and after resume every waiting request completes
//! with the right data; a resize moves the choke point's end.

mod common;

use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use common::*;
use ucrypt_datapath::{Engine, Error};

const SIZE: u64 = 1 << 20;

/// Polls `f` until it holds (bounded by [`HANG`]).
fn eventually(what: &str, f: impl Fn() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < HANG, "{what}: never happened");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn suspend_resume(store: Store, c: Cipher) {
    for (what, cfg, _) in configs() {
        let b = backing(store, SIZE + DATA_OFFSET);
        let crypt = sector_crypt(c);
        let vol = ucrypt_datapath::Volume {
            crypt: Some(crypt.clone()),
            ..volume(b.backend.clone(), c, SIZE)
        };
        let e = Arc::new(Engine::new(vol, cfg).expect("engine"));
        let data: Vec<u8> = (0..8192u32).map(|i| (i * 13 % 251) as u8).collect();
        e.write(4096, data.clone(), false).expect("write");

        assert!(!e.requests_waiting(), "{what}: nobody waits yet");
        e.suspend().expect("suspend");
        assert!(e.is_suspended(), "{what}");
        assert!(!e.requests_waiting(), "{what}: nobody waits yet");
        // The engine holds no reference to the cipher any more: the key is
        // wiped with its last owner (here, this test).
        eventually(what, || Arc::strong_count(&crypt) == 1);
        // Requests submitted now wait; none fails.
        let (tx, rx) = mpsc::channel();
        let waiting: Vec<_> = (0..3)
            .map(|i| {
                let (e, tx) = (e.clone(), tx.clone());
                std::thread::spawn(move || {
                    let r = e.read(4096, 8192);
                    tx.send((i, r)).expect("send");
                })
            })
            .collect();
        eventually(what, || e.stats().in_flight == 0);
        // The online reencryption's fence asks this to give clients a turn.
        eventually(what, || e.requests_waiting());
        assert!(
            rx.recv_timeout(Duration::from_millis(100)).is_err(),
            "{what}: a request completed while suspended"
        );
        // A resume needs a suspended engine: a second resume is refused.
        e.resume(sector_crypt(c)).expect("resume");
        assert!(!e.is_suspended());
        for _ in 0..3 {
            let (i, r) = rx
                .recv_timeout(HANG)
                .expect("request completes after resume");
            assert_eq!(r.expect("read after resume"), data, "{what} reader {i}");
        }
        for t in waiting {
            t.join().expect("reader thread");
        }
        assert!(!e.requests_waiting(), "{what}: every waiter admitted");
        assert!(matches!(e.resume(sector_crypt(c)), Err(Error::Invalid(_))));
        e.shutdown().expect("shutdown");
    }
}

#[test]
fn suspend_blocks_io_and_resume_completes_it_mem_xts() {
    suspend_resume(Store::Mem, XTS);
}

#[test]
fn suspend_blocks_io_and_resume_completes_it_file_xts_4k() {
    suspend_resume(Store::File, XTS_4K);
}

#[test]
fn shutdown_fails_requests_waiting_on_a_suspended_engine() {
    let b = backing(Store::Mem, SIZE + DATA_OFFSET);
    let e = Arc::new(
        Engine::new(volume(b.backend.clone(), XTS, SIZE), Default::default()).expect("engine"),
    );
    e.suspend().expect("suspend");
    let (tx, rx) = mpsc::channel();
    let e2 = e.clone();
    let t = std::thread::spawn(move || tx.send(e2.write(0, vec![7; 4096], false)));
    std::thread::sleep(Duration::from_millis(20));
    e.shutdown().expect("shutdown");
    let r = rx
        .recv_timeout(HANG)
        .expect("the waiting write is answered");
    assert!(matches!(r, Err(Error::Shutdown)), "{r:?}");
    t.join().expect("writer").expect("send");
}

#[test]
fn resize_moves_the_end_of_the_device() {
    let b = backing(Store::Mem, SIZE + DATA_OFFSET);
    let e =
        Engine::new(volume(b.backend.clone(), XTS, SIZE / 2), Default::default()).expect("engine");
    e.write(0, vec![9; 4096], false).expect("write");
    assert!(e.read(SIZE / 2, 4096).is_err(), "past the end before grow");
    e.resize(SIZE).expect("grow");
    assert_eq!(e.size(), SIZE);
    e.write(SIZE - 4096, vec![5; 4096], false)
        .expect("write at the new end");
    assert_eq!(e.read(0, 4096).expect("read"), vec![9; 4096]);
    e.resize(8192).expect("shrink");
    let r = e.write(8192, vec![1; 4096], false);
    assert!(r.is_err(), "a write past the shrunk end is refused: {r:?}");
    assert!(e.resize(SIZE * 2).is_err(), "larger than the backend");
    assert_eq!(e.size(), 8192);
}
