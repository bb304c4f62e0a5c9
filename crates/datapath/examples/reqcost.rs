//! CPU per request: a fixed number of requests through the engine over the
//! ramdisk, each job one at a time (queue depth 1, the completion runs
//! inside `submit`), so `perf stat -e task-clock,cycles` over two counts
//! gives the cost of one request by difference, without the set-up.
//!
//! ```text
//! reqcost TARGET RW BS COUNT [JOBS]
//!   TARGET  raw | inline | adaptive     RW  read | write
//! ```
//!
//! COUNT requests per job (JOBS threads, default 1) over a 256 MiB
//! ramdisk, AES-XTS with 4096-byte sectors. Prints the target, the
//! requests run and the process CPU time (user + system, every thread,
//! the engine's helpers included) per request over the timed loop alone.

use std::sync::Arc;
use std::time::{Duration, Instant};

use backend::{Backend, MemBackend};
use crypto::{CryptConfig, SectorCrypt};
use ucrypt_datapath::{CryptMode, Engine, EngineConfig, Op, Request, Volume};

/// Ramdisk size.
const SIZE: u64 = 256 << 20;

fn cipher() -> Arc<SectorCrypt> {
    let key: Vec<u8> = (0..64).map(|i| (i * 13 + 1) as u8).collect();
    Arc::new(
        SectorCrypt::new(&CryptConfig {
            cipher: "aes-xts-plain64".into(),
            key: zeroize::Zeroizing::new(key),
            iv_offset: 0,
            sector_size: 4096,
            iv_large_sectors: true,
        })
        .expect("cipher builds"),
    )
}

/// CPU time of the whole process (every thread).
fn process_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the call's duration.
    unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    if a.len() < 4 {
        eprintln!("usage: reqcost TARGET RW BS COUNT [JOBS]");
        std::process::exit(2);
    }
    let (target, write) = (a[0].as_str(), a[1] == "write");
    let bs: usize = a[2].parse().expect("BS");
    let count: u64 = a[3].parse().expect("COUNT");
    let jobs: usize = a.get(4).map(|j| j.parse().expect("JOBS")).unwrap_or(1);

    let mem = MemBackend::new(SIZE).expect("ramdisk");
    let fill = vec![0x3cu8; 1 << 20];
    for off in (0..SIZE).step_by(fill.len()) {
        mem.write_at(&fill, off, false).expect("prefill");
    }
    let (crypt, mode) = match target {
        "raw" => (None, CryptMode::Inline),
        "inline" => (Some(cipher()), CryptMode::Inline),
        "adaptive" => (Some(cipher()), CryptMode::Adaptive),
        t => {
            // Classic completes on its workers: not a one-at-a-time loop.
            eprintln!("reqcost: unknown target {t} (raw, inline or adaptive)");
            std::process::exit(2);
        }
    };
    let vol = Volume {
        backend: Arc::new(mem),
        crypt,
        data_offset: 0,
        size: SIZE,
        sector_size: 4096,
    };
    let cfg = EngineConfig {
        mode,
        queue_depth: jobs.max(1),
        ..EngineConfig::default()
    };
    let eng = Arc::new(Engine::new(vol, cfg).expect("engine"));
    let blocks = SIZE / bs as u64;
    let (cpu0, t0) = (process_cpu(), Instant::now());
    let threads: Vec<_> = (0..jobs)
        .map(|j| {
            let eng = eng.clone();
            std::thread::spawn(move || {
                let data = vec![0x5au8; bs];
                // Each job walks its own slice, sequentially.
                let first = j as u64 * (blocks / jobs as u64);
                for i in 0..count {
                    let offset = (first + i % (blocks / jobs as u64)) * bs as u64;
                    let op = if write {
                        Op::Write { data: data.clone() }
                    } else {
                        Op::Read { len: bs as u32 }
                    };
                    let req = Request {
                        op,
                        offset,
                        fua: false,
                    };
                    eng.submit(req, |r| {
                        r.expect("request failed");
                    });
                }
            })
        })
        .collect();
    for h in threads {
        h.join().expect("submitter");
    }
    let (cpu, wall) = (process_cpu() - cpu0, t0.elapsed());
    let n = count * jobs as u64;
    println!(
        "{target} {} bs={bs} jobs={jobs} requests={n} cpu_ns_per_req={:.0} wall_ns_per_req={:.0}",
        a[1],
        cpu.as_nanos() as f64 / n as f64,
        wall.as_nanos() as f64 / n as f64
    );
    eng.shutdown().expect("shutdown");
}
