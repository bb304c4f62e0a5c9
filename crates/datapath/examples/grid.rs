//! In-process microbenchmark of the engine modes on the `mem` backend: the
//! grid bs {4k, 64k, 1M, 4M} × QD {1, 16} × jobs {1, 2}, null cipher and
//! aes-xts-plain64, read and write, for raw (no cipher), classic, inline
//! and adaptive. Prints MiB/s per mode and whether adaptive ≥ max(classic,
//! inline) in each cell.
//!
//! ```text
//! cargo run --release -p ucrypt-datapath --example grid -- [secs-per-run] [rounds] [filter...]
//! ```
//! Filters are substrings matched against the cell name, e.g. `xts read 4M`.
//! `GRID_BS`, `GRID_QD` (comma lists like `256k,1M` and `4,16`) and
//! `GRID_SECTOR` (default 4096) replace the grid's sizes, depths and
//! sector size.
//! Each cell runs every mode `rounds` times, interleaved in an order that
//! rotates per round, and keeps each mode's best run: on a shared machine
//! the best run is the one least disturbed by other processes.
//! Each job is a thread that keeps QD requests in flight with
//! `Engine::submit`, sequentially through its own region of the device.

use std::sync::atomic::{AtomicUsize, Ordering::*};
use std::sync::Arc;
use std::time::{Duration, Instant};

use backend::{Backend, MemBackend};
use crypto::{CryptConfig, SectorCrypt};
use ucrypt_datapath::{CryptMode, Engine, EngineConfig, Op, Request, Volume};

const DEV: u64 = 512 << 20;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let secs: f64 = args.first().and_then(|a| a.parse().ok()).unwrap_or(0.25);
    let rounds: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(3);
    let filters: Vec<&str> = args.iter().skip(2).map(String::as_str).collect();
    let mem: Arc<dyn Backend> = Arc::new(MemBackend::new(DEV).expect("mem backend"));
    // Fill the device so reads touch real memory, not the zero page.
    let fill = vec![0x5au8; 4 << 20];
    for off in (0..DEV).step_by(fill.len()) {
        mem.write_at(&fill, off, false).expect("fill");
    }
    // GRID_BS / GRID_QD / GRID_SECTOR override the issue's grid (e.g. to
    // look at the bench sweep's cells: GRID_BS=256k,1M GRID_QD=4,16
    // GRID_SECTOR=512).
    let list = |var: &str, default: &[u64]| -> Vec<u64> {
        std::env::var(var).map_or_else(
            |_| default.to_vec(),
            |v| v.split(',').filter_map(parse_size).collect(),
        )
    };
    let sizes = list("GRID_BS", &[4 << 10, 64 << 10, 1 << 20, 4 << 20]);
    let depths = list("GRID_QD", &[1, 16]);
    let sector_size = list("GRID_SECTOR", &[4096])[0] as u32;
    let ciphers = [
        ("null", "cipher_null-ecb", 0usize),
        ("xts", "aes-xts-plain64", 64),
    ];
    let modes = [
        ("classic", CryptMode::Classic),
        ("inline", CryptMode::Inline),
        ("adaptive", CryptMode::Adaptive),
    ];
    println!(
        "{:<28} {:>9} {:>9} {:>9} {:>9}  adaptive/best",
        "cell (MiB/s)", "raw", "classic", "inline", "adaptive"
    );
    let (mut cells, mut wins) = (0, 0);
    for (cname, spec, klen) in ciphers {
        let crypt = Arc::new(
            SectorCrypt::new(&CryptConfig {
                cipher: spec.into(),
                key: zeroize::Zeroizing::new((0..klen as u8).collect()),
                iv_offset: 0,
                sector_size,
                iv_large_sectors: false,
            })
            .expect("cipher"),
        );
        for write in [false, true] {
            for &bs in &sizes {
                for qd in depths.iter().map(|&q| q as usize) {
                    for jobs in [1usize, 2] {
                        let name = format!(
                            "{cname} {} {:>4} qd{qd:<2} j{jobs}",
                            if write { "write" } else { "read " },
                            human(bs)
                        );
                        if !filters.iter().all(|f| name.contains(f)) {
                            continue;
                        }
                        let vol = |c: Option<Arc<SectorCrypt>>| Volume {
                            backend: mem.clone(),
                            crypt: c,
                            data_offset: 0,
                            size: DEV,
                            sector_size,
                        };
                        let mut raw = 0f64;
                        let mut r = vec![0f64; modes.len()];
                        let only = std::env::var("GRID_MODES").unwrap_or_default();
                        for round in 0..rounds {
                            // Raw (slot 0) and the modes in an order that
                            // rotates per round: on the dev VM a run can be
                            // slowed by the ones before it (null writes
                            // halve after ~0.5 s of back-to-back memcpy),
                            // so no mode may always go last.
                            let slots = modes.len() + 1;
                            for k in 0..slots {
                                let slot = (k + round) % slots;
                                if slot == 0 {
                                    raw = raw.max(run(
                                        vol(None),
                                        CryptMode::Inline,
                                        write,
                                        bs,
                                        qd,
                                        jobs,
                                        secs,
                                    ));
                                    continue;
                                }
                                let (mname, m) = modes[slot - 1];
                                if !only.is_empty() && !only.contains(mname) {
                                    continue;
                                }
                                r[slot - 1] = r[slot - 1].max(run(
                                    vol(Some(crypt.clone())),
                                    m,
                                    write,
                                    bs,
                                    qd,
                                    jobs,
                                    secs,
                                ));
                            }
                        }
                        let best = r[0].max(r[1]);
                        cells += 1;
                        if r[2] >= best {
                            wins += 1;
                        }
                        let extra = if bs == 4096 && qd == 1 && jobs == 1 {
                            format!(
                                "  inline/raw {:.2}, classic/raw {:.2}",
                                r[1] / raw,
                                r[0] / raw
                            )
                        } else {
                            String::new()
                        };
                        println!(
                            "{name:<28} {raw:>9.0} {:>9.0} {:>9.0} {:>9.0}  {:.2}{}{extra}",
                            r[0],
                            r[1],
                            r[2],
                            r[2] / best,
                            if r[2] >= best { "" } else { "  <" }
                        );
                    }
                }
            }
        }
    }
    println!("adaptive >= max(classic, inline) in {wins}/{cells} cells");
}

/// `4k`, `1M`, `512` → bytes.
fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mul) = match s.as_bytes().last()? {
        b'k' | b'K' => (&s[..s.len() - 1], 1 << 10),
        b'm' | b'M' => (&s[..s.len() - 1], 1 << 20),
        _ => (s, 1),
    };
    num.parse::<u64>().ok().map(|n| n * mul)
}

fn human(b: u64) -> String {
    if b >= 1 << 20 {
        format!("{}M", b >> 20)
    } else {
        format!("{}k", b >> 10)
    }
}

/// One measurement: MiB/s over `secs` after a short warm-up.
fn run(
    vol: Volume,
    mode: CryptMode,
    write: bool,
    bs: u64,
    qd: usize,
    jobs: usize,
    secs: f64,
) -> f64 {
    let cfg = EngineConfig {
        mode,
        queue_depth: qd * jobs,
        ..EngineConfig::default()
    };
    let engine = Arc::new(Engine::new(vol, cfg).expect("engine"));
    // GRID_FORCE_SPLIT=1: adaptive splits whatever the load (to measure
    // what splitting would give on an idle machine).
    engine
        .force_split(mode == CryptMode::Adaptive && std::env::var_os("GRID_FORCE_SPLIT").is_some());
    // GRID_NOFUSE=1: adaptive moves bytes as inline does (copy + crypto
    // pass), to tell what fusing is worth from what scheduling is.
    engine.fuse(std::env::var_os("GRID_NOFUSE").is_none());
    let region = DEV / jobs as u64;
    let warm = Duration::from_secs_f64(secs / 4.0);
    let dur = Duration::from_secs_f64(secs);
    let threads: Vec<_> = (0..jobs)
        .map(|j| {
            let e = engine.clone();
            std::thread::spawn(move || job(&e, write, bs, qd, j as u64 * region, region, warm, dur))
        })
        .collect();
    let rate: f64 = threads.into_iter().map(|t| t.join().expect("job")).sum();
    if std::env::var_os("GRID_STATS").is_some() {
        eprintln!(
            "{mode:?} {:?}",
            if write {
                engine.stats().write
            } else {
                engine.stats().read
            }
        );
    }
    engine.shutdown().expect("shutdown");
    rate / (1 << 20) as f64
}

/// Keeps `qd` requests in flight; returns bytes/s over the timed part.
#[allow(clippy::too_many_arguments)]
fn job(
    e: &Engine,
    write: bool,
    bs: u64,
    qd: usize,
    base: u64,
    region: u64,
    warm: Duration,
    dur: Duration,
) -> f64 {
    let done = Arc::new(AtomicUsize::new(0));
    let me = std::thread::current();
    let (mut submitted, mut seen, mut off) = (0usize, 0usize, 0u64);
    let start = Instant::now();
    let (mut t_begin, mut n_begin) = (None, 0usize);
    let (t_end, seen_end) = loop {
        let now = Instant::now();
        if t_begin.is_none() && now - start >= warm {
            t_begin = Some(now);
            n_begin = done.load(Acquire);
        }
        if let Some(t) = t_begin {
            if now - t >= dur {
                break (now, done.load(Acquire));
            }
        }
        while submitted - seen < qd {
            let op = if write {
                Op::Write {
                    data: vec![0xa5; bs as usize],
                }
            } else {
                Op::Read { len: bs as u32 }
            };
            let (d, w) = (done.clone(), me.clone());
            e.submit(
                Request {
                    op,
                    offset: base + off,
                    fua: false,
                },
                move |c| {
                    c.expect("request failed");
                    d.fetch_add(1, Release);
                    w.unpark();
                },
            );
            submitted += 1;
            off = (off + bs) % (region - region % bs);
        }
        while done.load(Acquire) == seen {
            std::thread::park();
        }
        seen = done.load(Acquire);
    };
    // Drain before reporting.
    while done.load(Acquire) < submitted {
        std::thread::park_timeout(Duration::from_millis(1));
    }
    let elapsed = t_end.duration_since(t_begin.unwrap_or(start)).as_secs_f64();
    ((seen_end - n_begin) as u64 * bs) as f64 / elapsed
}
