//! Raw MemBackend throughput vs a plain memcpy from a Vec, per block size and
//! thread count: how much the per-page locks cost. Run with
//! `cargo run --release -p ucrypt-backend --example memspeed`.

use std::sync::Arc;
use std::time::Instant;

use ucrypt_backend::{Backend, MemBackend};

const SIZE: u64 = 256 << 20;
const TOTAL: u64 = 1 << 30; // bytes moved per measurement

fn main() {
    let mem = Arc::new(MemBackend::new(SIZE).unwrap());
    mem.write_at(&vec![1u8; SIZE as usize], 0, false).unwrap();
    let plain = Arc::new(vec![1u8; SIZE as usize]);
    println!(
        "{:>8} {:>7} {:>6} {:>12} {:>12} {:>6}",
        "bs", "threads", "op", "mem MiB/s", "memcpy MiB/s", "ratio"
    );
    for bs in [4096usize, 65536, 1 << 20] {
        for threads in [1usize, 2] {
            for write in [false, true] {
                let m = run(
                    threads,
                    |_, buf, off| {
                        if write {
                            mem.write_at(buf, off, false).unwrap()
                        } else {
                            mem.read_at(buf, off).unwrap()
                        }
                    },
                    bs,
                );
                // Racy writes into one shared Vec would be UB, so the write
                // baseline copies into a private region per thread.
                let private: Vec<std::sync::Mutex<Vec<u8>>> = (0..threads)
                    .map(|_| std::sync::Mutex::new(vec![1u8; SIZE as usize / threads]))
                    .collect();
                let p = run(
                    threads,
                    |t, buf, off| {
                        if write {
                            let mut region = private[t].lock().unwrap();
                            let o = off as usize % (region.len() - buf.len() + 1) / buf.len()
                                * buf.len();
                            region[o..o + buf.len()].copy_from_slice(buf);
                        } else {
                            let o = off as usize;
                            buf.copy_from_slice(&plain[o..o + buf.len()]);
                        }
                    },
                    bs,
                );
                let op = if write { "write" } else { "read" };
                println!(
                    "{bs:>8} {threads:>7} {op:>6} {m:>12.0} {p:>12.0} {:>6.2}",
                    m / p
                );
            }
        }
    }
}

/// Best of three runs (the machine is shared; the best is the least disturbed).
fn run(threads: usize, f: impl Fn(usize, &mut [u8], u64) + Sync, bs: usize) -> f64 {
    (0..3)
        .map(|_| run_once(threads, &f, bs))
        .fold(0.0, f64::max)
}

fn run_once(threads: usize, f: &(impl Fn(usize, &mut [u8], u64) + Sync), bs: usize) -> f64 {
    let per = TOTAL / threads as u64 / bs as u64;
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let f = &f;
            s.spawn(move || {
                let mut buf = vec![0u8; bs];
                let slots = SIZE / bs as u64;
                for i in 0..per {
                    let off = ((i * 7919 + t as u64 * 13) % slots) * bs as u64;
                    f(t, &mut buf, off);
                }
            });
        }
    });
    TOTAL as f64 / t0.elapsed().as_secs_f64() / (1 << 20) as f64
}
