//! FileBackend 4 KiB random-read latency per IO engine and O_DIRECT policy,
//! one and two threads: what a synchronous `read_at` costs on each path.
//! Run with `cargo run --release -p ucrypt-backend --example filespeed [DIR]`
//! (DIR defaults to the temp dir; the 64 MiB test file is removed after).

use std::time::Instant;

use ucrypt_backend::{Backend, DirectIo, FileBackend, FileOptions, IoEngine};

const SIZE: u64 = 64 << 20;
const OPS: u64 = 20_000;

fn main() {
    let dir = std::env::args()
        .nth(1)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(std::env::temp_dir);
    let path = dir.join(format!("ucrypt-filespeed-{}.img", std::process::id()));
    std::fs::write(&path, vec![0xA5u8; SIZE as usize]).expect("create test file");
    println!(
        "{:>9} {:>9} {:>7} {:>10} {:>9}",
        "engine", "direct", "threads", "kIOPS", "us/op"
    );
    for engine in [IoEngine::Uring, IoEngine::Syscalls] {
        for direct in [DirectIo::Never, DirectIo::Required] {
            let o = FileOptions {
                engine: Some(engine),
                direct,
                ..FileOptions::default()
            };
            let b = match FileBackend::open(&path, &o) {
                Ok(b) => b,
                Err(e) => {
                    println!("{engine:?} {direct:?}: {e}");
                    continue;
                }
            };
            for threads in [1u64, 2] {
                let t0 = Instant::now();
                std::thread::scope(|s| {
                    for t in 0..threads {
                        let b = &b;
                        s.spawn(move || {
                            let mut buf = vec![0u8; 4096];
                            for i in 0..OPS / threads {
                                let off = ((i * 7919 + t * 104_729) % (SIZE / 4096)) * 4096;
                                b.read_at(&mut buf, off).unwrap();
                            }
                        });
                    }
                });
                let secs = t0.elapsed().as_secs_f64();
                let e = format!("{engine:?}");
                let d = format!("{direct:?}");
                println!(
                    "{e:>9} {d:>9} {threads:>7} {:>10.1} {:>9.2}",
                    OPS as f64 / secs / 1e3,
                    secs * 1e6 * threads as f64 / OPS as f64
                );
            }
        }
    }
    let _ = std::fs::remove_file(&path);
}
