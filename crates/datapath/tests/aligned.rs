//! With the `ucrypt` binary's allocator (`backend::PageAlignLarge`), every
//! buffer the engine hands a backend for a page-multiple request is
//! page-aligned, in every mode and on every path (single, batch, async):
//! the file backend then sends 4 KiB requests to O_DIRECT without its
//! bounce copy, one page (one segment) per 4 KiB IO. Write payloads come
//! from `bufpool::take`, as the frontends' do. Every check is a count.

mod common;

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Mutex};

use backend::{AsyncOp, Backend, Caps, MemBackend, ReadOp, WriteOp};
use common::*;
use ucrypt_datapath::{bufpool, Completion, Engine, Hint, Op, Plug, Request};

#[global_allocator]
static ALLOC: backend::PageAlignLarge = backend::PageAlignLarge;

const PAGE: usize = 4096;
const SIZE: u64 = 4 << 20;

/// A ramdisk that counts the buffers it is handed and the misaligned ones.
struct Watch {
    inner: MemBackend,
    seen: AtomicUsize,
    /// (length, offset of the buffer into its page) of each misaligned one.
    off_page: Mutex<Vec<(usize, usize)>>,
}

impl Watch {
    fn look(&self, p: *const u8, len: usize) {
        self.seen.fetch_add(1, Ordering::Relaxed);
        let into = p as usize % PAGE;
        if into != 0 {
            self.off_page.lock().unwrap().push((len, into));
        }
    }
}

impl Backend for Watch {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn caps(&self) -> Caps {
        self.inner.caps()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.look(buf.as_ptr(), buf.len());
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.look(buf.as_ptr(), buf.len());
        self.inner.write_at(buf, offset, fua)
    }
    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }
    fn batches(&self) -> bool {
        true
    }
    fn read_batch(&self, ops: &mut [ReadOp<'_>]) -> Vec<io::Result<()>> {
        ops.iter_mut()
            .map(|o| self.read_at(o.buf, o.offset))
            .collect()
    }
    fn write_batch(&self, ops: &[WriteOp<'_>]) -> Vec<io::Result<()>> {
        ops.iter()
            .map(|o| self.write_at(o.buf, o.offset, o.fua))
            .collect()
    }
    fn submit_async(&self, ops: Vec<AsyncOp>) {
        // The default runs each entry through read_at / write_at: looked at.
        backend::run_async_inline(self, ops)
    }
}

/// A write payload as a frontend receives one.
fn payload(len: usize, seed: u64) -> Vec<u8> {
    let mut d = bufpool::take(len);
    for (k, b) in d.iter_mut().enumerate() {
        *b = (k as u64 * 31 + seed) as u8;
    }
    d
}

/// `n` requests in flight at once (the caller says so in the hint, so
/// inline and adaptive gather them), then waits for all.
fn burst(e: &Engine, reqs: Vec<Request>) {
    let n = reqs.len();
    let (tx, rx) = mpsc::channel::<Completion>();
    let mut plug = Plug::new();
    for (i, req) in reqs.into_iter().enumerate() {
        let tx = tx.clone();
        let hint = Hint {
            behind: (n - 1 - i) as u32,
            ready: 0,
        };
        e.submit_plugged(&mut plug, req, hint, move |c| tx.send(c).expect("receiver"));
    }
    for _ in 0..n {
        let c = rx.recv_timeout(HANG).expect("request hung");
        if let Some(data) = c.expect("request failed") {
            bufpool::give(data);
        }
    }
}

#[test]
fn request_buffers_reach_the_backend_page_aligned() {
    for (name, cfg, _) in configs() {
        let w = Arc::new(Watch {
            inner: MemBackend::new(SIZE + DATA_OFFSET).expect("ramdisk"),
            seen: AtomicUsize::new(0),
            off_page: Mutex::new(Vec::new()),
        });
        let e = Engine::new(volume(w.clone(), XTS, SIZE), cfg).expect("engine");
        let mut seed = 0;
        for len in [PAGE, 2 * PAGE, 3 * PAGE, 16 * PAGE, 64 * PAGE] {
            // One at a time, then 24 in flight.
            let mut reqs = Vec::new();
            for i in 0..25u64 {
                seed += 1;
                let offset = (i * len as u64) % (SIZE - len as u64) / 4096 * 4096;
                let op = if i % 2 == 0 {
                    Op::Write {
                        data: payload(len, seed),
                    }
                } else {
                    Op::Read { len: len as u32 }
                };
                let req = Request {
                    op,
                    offset,
                    fua: false,
                };
                if i == 0 {
                    if let Some(d) = run(&e, req).expect("request failed") {
                        bufpool::give(d);
                    }
                } else {
                    reqs.push(req);
                }
            }
            burst(&e, reqs);
        }
        e.shutdown().expect("shutdown");
        let seen = w.seen.load(Ordering::Relaxed);
        assert!(seen >= 5 * 25, "{name}: only {seen} transfers seen");
        let off = w.off_page.lock().unwrap();
        assert!(
            off.is_empty(),
            "{name}: {} of {seen} buffers off a page boundary (len, offset into page): {:?}",
            off.len(),
            &off[..off.len().min(8)]
        );
    }
}
