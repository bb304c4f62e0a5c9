//! Pooled request buffers never show a client an earlier request's bytes.
//!
//! The pool ([`ucrypt_datapath::bufpool`]) hands out buffers that still hold
//! whatever the last request left in them. Every test here first fills the
//! pool with buffers of a marker plaintext, then reads through every mode:
//! a read that succeeds returns exactly what was written, and a read that
//! comes up short (a backend error on one piece, a file shorter than the
//! backend believes) fails instead of completing with the marker.

mod common;

use std::sync::Arc;

use backend::{Backend, FaultBackend, FaultRule, FileBackend, FileOptions, MemBackend, OpKinds};
use common::*;
use ucrypt_datapath::{bufpool, Engine, Op, Request};

const SIZE: u64 = 4 << 20;
const LEN: usize = 1 << 20;
/// The stale plaintext the pool is primed with.
const MARK: u8 = 0x5a;

/// Fills the pool with marker buffers of every size these tests read.
fn prime() {
    let bufs: Vec<Vec<u8>> = (0..8)
        .map(|_| {
            let mut b = bufpool::take(LEN);
            b.fill(MARK);
            b
        })
        .collect();
    for b in bufs {
        bufpool::give(b);
    }
}

fn read(e: &Engine, offset: u64, len: usize) -> Result<Option<Vec<u8>>, ucrypt_datapath::Error> {
    run(
        e,
        Request {
            op: Op::Read { len: len as u32 },
            offset,
            fua: false,
        },
    )
}

fn write(e: &Engine, offset: u64, data: Vec<u8>) {
    run(
        e,
        Request {
            op: Op::Write { data },
            offset,
            fua: false,
        },
    )
    .expect("write");
}

/// A plaintext with no run of the marker in it.
fn pattern(seed: u8) -> Vec<u8> {
    (0..LEN)
        .map(|i| (i as u8).wrapping_mul(7).wrapping_add(seed) | 1)
        .collect()
}

#[test]
fn reads_return_what_was_written_not_pooled_bytes() {
    for (name, cfg, force) in configs() {
        for store in [Store::Mem, Store::File] {
            let what = format!("{name} {store:?}");
            let b = backing(store, SIZE + DATA_OFFSET);
            let e = Engine::new(volume(b.backend.clone(), XTS, SIZE), cfg.clone()).expect("engine");
            e.force_split(force);
            let p = pattern(3);
            write(&e, 0, p.clone());
            for _ in 0..4 {
                prime();
                let got = read(&e, 0, LEN).expect(&what).expect("read data");
                assert!(got == p, "{what}: read returned other bytes than written");
            }
            e.shutdown().expect("shutdown");
        }
    }
}

#[test]
fn a_failed_piece_fails_the_read_instead_of_leaving_stale_bytes() {
    for (name, cfg, force) in configs() {
        let what = name.to_string();
        let fb = Arc::new(FaultBackend::new(
            MemBackend::new(SIZE + DATA_OFFSET).expect("mem"),
        ));
        let e = Engine::new(volume(fb.clone(), XTS, SIZE), cfg.clone()).expect("engine");
        e.force_split(force);
        write(&e, 0, pattern(9));
        // The second half of the request fails (a split read's later
        // chunks, or the whole read when it is one backend call).
        let half = DATA_OFFSET + LEN as u64 / 2;
        fb.add_rule(FaultRule::error(OpKinds::READ, libc::EIO).range(half..half + 4096));
        for _ in 0..4 {
            prime();
            match read(&e, 0, LEN) {
                Err(_) => {}
                Ok(d) => panic!(
                    "{what}: a failed read completed with data (marker bytes: {})",
                    d.map_or(0, |d| d.iter().filter(|&&x| x == MARK).count())
                ),
            }
        }
        e.shutdown().expect("shutdown");
    }
}

#[test]
fn a_short_file_fails_the_read() {
    for (name, cfg, force) in configs() {
        let dir = testutil::TempDir::new("bufpool");
        let path = dir.join("disk.img");
        std::fs::File::create(&path)
            .and_then(|f| f.set_len(SIZE + DATA_OFFSET))
            .expect("create image");
        let fb: Arc<dyn Backend> =
            Arc::new(FileBackend::open(&path, &FileOptions::default()).expect("open"));
        let e = Engine::new(volume(fb, XTS, SIZE), cfg.clone()).expect("engine");
        e.force_split(force);
        write(&e, 0, pattern(5));
        // Someone else cuts the file in the middle of the request: pread
        // meets end of file where the backend expects data.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .and_then(|f| f.set_len(DATA_OFFSET + LEN as u64 / 2))
            .expect("truncate");
        prime();
        assert!(
            read(&e, 0, LEN).is_err(),
            "{name}: a read past the file's end completed"
        );
        e.shutdown().expect("shutdown");
    }
}
