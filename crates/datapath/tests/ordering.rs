//! FLUSH and FUA semantics in every mode: a flush completes only after every
//! write that completed before it was submitted is durable, and a FUA write
//! is durable when it completes. A test backend tracks durability per
//! write (written data is volatile until a flush, or durable at once with
//! FUA) and delays writes a little so an early completion would show.

mod common;

use std::collections::HashSet;
use std::io;
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use backend::{Backend, Caps, MemBackend};
use common::*;
use ucrypt_datapath::{Engine, Op, Request};

/// Durability model: byte offset of each write -> durable?
struct Durability {
    inner: MemBackend,
    volatile: Mutex<HashSet<u64>>,
    durable: Mutex<HashSet<u64>>,
}

impl Backend for Durability {
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
        std::thread::sleep(Duration::from_micros(50 + offset % 7 * 30));
        self.inner.write_at(buf, offset, fua)?;
        // Record every 4 KiB block the write covers.
        for b in (offset..offset + buf.len() as u64).step_by(4096) {
            if fua {
                self.durable.lock().unwrap().insert(b);
            } else {
                self.volatile.lock().unwrap().insert(b);
            }
        }
        Ok(())
    }
    fn flush(&self) -> io::Result<()> {
        let v: Vec<u64> = self.volatile.lock().unwrap().drain().collect();
        self.durable.lock().unwrap().extend(v);
        Ok(())
    }
}

#[test]
fn flush_and_fua_make_completed_writes_durable() {
    for (name, cfg, force) in configs() {
        let be = Arc::new(Durability {
            inner: MemBackend::new(8 << 20).expect("mem"),
            volatile: Mutex::default(),
            durable: Mutex::default(),
        });
        let e = Arc::new(Engine::new(volume(be.clone(), XTS, 4 << 20), cfg).expect("engine"));
        e.force_split(force);
        let completed = Arc::new(Mutex::new(Vec::<u64>::new()));
        let (tx, rx) = mpsc::channel::<()>();
        let mut rng = Rng::new(11);
        let mut outstanding = 0;
        for i in 0..300u64 {
            if i % 25 == 24 {
                // Snapshot of writes completed before the flush is submitted.
                let before: Vec<u64> = completed.lock().unwrap().clone();
                let (be2, tx2) = (be.clone(), tx.clone());
                let name = name.to_string();
                e.submit(Request { op: Op::Flush, offset: 0, fua: false }, move |c| {
                    c.expect("flush");
                    let d = be2.durable.lock().unwrap();
                    for b in before {
                        assert!(d.contains(&(DATA_OFFSET + b)), "{name}: write at {b} completed before a flush is not durable after it");
                    }
                    let _ = tx2.send(());
                });
            } else {
                let off = 4096 * rng.below(1000);
                let fua = rng.below(4) == 0;
                let len = 4096 * (1 + rng.below(8) as usize);
                let (done, be2, tx2) = (completed.clone(), be.clone(), tx.clone());
                let name = name.to_string();
                e.submit(
                    Request {
                        op: Op::Write {
                            data: vec![i as u8; len],
                        },
                        offset: off,
                        fua,
                    },
                    move |c| {
                        c.expect("write");
                        if fua {
                            let d = be2.durable.lock().unwrap();
                            for b in (off..off + len as u64).step_by(4096) {
                                assert!(
                                    d.contains(&(DATA_OFFSET + b)),
                                    "{name}: FUA write at {b} completed before it was durable"
                                );
                            }
                        }
                        done.lock()
                            .unwrap()
                            .extend((off..off + len as u64).step_by(4096));
                        let _ = tx2.send(());
                    },
                );
            }
            outstanding += 1;
        }
        for _ in 0..outstanding {
            rx.recv_timeout(HANG)
                .expect("completion (assertions run in callbacks)");
        }
        e.shutdown().expect("shutdown");
    }
}
