//! Engine over a `FileBackend`: random reads or writes at a queue depth, to
//! set beside fio's own io_uring engine on the same file.
//!
//! ```text
//! filebench PATH TARGET ENGINE RW BS QD SECS [JOBS] [DIRECT] [HINT]
//!   TARGET  raw | classic | inline | adaptive | crypto (cipher alone, 1 thread)
//!   ENGINE  uring | syscalls | auto      RW  read | write
//!   DIRECT  auto (default) | never
//!   HINT    plain (default) | hint
//! ```
//!
//! JOBS threads submit through `Engine::submit` (default 1); the engine's
//! queue depth is QD, so `submit` blocks once QD requests are in flight.
//! With `hint` they submit as a frontend with a deep queue does
//! (`Engine::submit_hinted`, `behind` = QD - 1: a job never waits for a
//! completion before its next submission; only admission stops it).
//! Prints one line: target, MiB/s, IOPS (and, on stderr, the backend's
//! ring transfers, how many of them the submitters reaped, and how many
//! went direct, bounced or buffered).
//!
//! Issue 14's file-backend cells, interleaved in one run on a file on a
//! real disk (io = fio's figure, c = the `crypto` line at the same BS,
//! bound = io·c/(io+c)):
//!
//! ```text
//! fio --name=r --filename=PATH --size=1G --rw=randread --bs=4k --direct=1 \
//!     --ioengine=io_uring --iodepth=32 --runtime=3 --time_based
//! filebench PATH raw uring read 4096 32 3 1 auto hint        (÷ io)
//! filebench PATH adaptive uring read 4096 32 3 1 auto hint   (÷ bound)
//! filebench PATH crypto uring read 4096 1 3                  (c)
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backend::{Backend, DirectIo, FileBackend, FileOptions, IoEngine};
use crypto::{CryptConfig, SectorCrypt};
use ucrypt_datapath::{CryptMode, Engine, EngineConfig, Hint, Op, Request, Volume};

/// The `ucrypt` binary's allocator, so request buffers are page-aligned
/// here as there (O_DIRECT without a bounce copy).
#[global_allocator]
static ALLOC: backend::PageAlignLarge = backend::PageAlignLarge;

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

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    if a.len() < 7 {
        eprintln!("usage: filebench PATH TARGET ENGINE RW BS QD SECS [JOBS] [DIRECT] [HINT]");
        std::process::exit(2);
    }
    let (path, target, eng, rw) = (&a[0], a[1].as_str(), a[2].as_str(), a[3].as_str());
    let bs: usize = a[4].parse().expect("BS");
    let qd: usize = a[5].parse().expect("QD");
    let secs: f64 = a[6].parse().expect("SECS");
    let jobs: usize = a.get(7).map(|j| j.parse().expect("JOBS")).unwrap_or(1);
    let direct = match a.get(8).map(String::as_str) {
        Some("never") => DirectIo::Never,
        _ => DirectIo::Auto,
    };
    let hinted = a.get(9).is_some_and(|h| h == "hint");
    let write = rw == "write";
    let dur = Duration::from_secs_f64(secs);

    if target == "crypto" {
        let c = cipher();
        let mut buf = vec![7u8; bs];
        let t = Instant::now();
        let mut n = 0u64;
        while t.elapsed() < dur {
            c.decrypt(n * (bs as u64 / 512), &mut buf);
            n += 1;
        }
        report(target, n, bs, t.elapsed());
        return;
    }

    let engine = match eng {
        "syscalls" => IoEngine::Syscalls,
        "auto" => IoEngine::Auto,
        _ => IoEngine::Uring,
    };
    let fb = FileBackend::open(
        path,
        &FileOptions {
            direct,
            engine: Some(engine),
            ..FileOptions::default()
        },
    )
    .expect("open backing file");
    eprintln!("filebench: io engine {:?}", fb.io_engine());
    let size = fb.size() / 4096 * 4096;
    let fb = Arc::new(fb);
    let backend: Arc<dyn Backend> = fb.clone();
    let (crypt, mode) = match target {
        "raw" => (None, CryptMode::Inline),
        "classic" => (Some(cipher()), CryptMode::Classic),
        "inline" => (Some(cipher()), CryptMode::Inline),
        _ => (Some(cipher()), CryptMode::Adaptive),
    };
    let vol = Volume {
        backend,
        crypt,
        data_offset: 0,
        size,
        sector_size: 4096,
    };
    let cfg = EngineConfig {
        mode,
        queue_depth: qd,
        ..EngineConfig::default()
    };
    let eng = Arc::new(Engine::new(vol, cfg).expect("engine"));
    let blocks = size / bs as u64;
    let done = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let t = Instant::now();
    let threads: Vec<_> = (0..jobs)
        .map(|j| {
            let (eng, done, stop) = (eng.clone(), done.clone(), stop.clone());
            std::thread::spawn(move || {
                // Seeded per job, so runs replay the same offsets.
                let mut rng = testutil::Rng::new(0x9e37_79b9_7f4a_7c15 ^ (j as u64 + 1));
                let data = vec![0x5au8; bs];
                while !stop.load(Relaxed) {
                    let offset = rng.below(blocks) * bs as u64;
                    let op = if write {
                        Op::Write { data: data.clone() }
                    } else {
                        Op::Read { len: bs as u32 }
                    };
                    let d = done.clone();
                    let req = Request {
                        op,
                        offset,
                        fua: false,
                    };
                    let behind = qd.saturating_sub(1) as u32;
                    let cb = move |r: ucrypt_datapath::Completion| {
                        r.expect("request failed");
                        d.fetch_add(1, Relaxed);
                    };
                    if hinted {
                        eng.submit_hinted(req, Hint { behind, ready: 0 }, cb);
                    } else {
                        eng.submit(req, cb);
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(dur);
    stop.store(true, Relaxed);
    let n = done.load(Relaxed);
    let el = t.elapsed();
    for h in threads {
        h.join().expect("submitter");
    }
    report(target, n, bs, el);
    eng.shutdown().expect("shutdown");
    let st = fb.stats();
    eprintln!(
        "filebench: {} ring transfers ({} batches), {} reaped by submitters; \
         {} direct, {} bounced, {} buffered",
        st.uring_ops,
        st.uring_batches,
        st.reaped_ops,
        st.direct_ops,
        st.bounced_ops,
        st.buffered_ops
    );
}

fn report(target: &str, n: u64, bs: usize, el: Duration) {
    let s = el.as_secs_f64();
    println!(
        "{target} {:.0} MiB/s {:.0} IOPS",
        n as f64 * bs as f64 / s / (1 << 20) as f64,
        n as f64 / s
    );
}
