//! Classic mode as Linux 6.11's dm-crypt: queued reads and writes larger
//! than `max_read_size`/`max_write_size` go through the queues as pieces
//! (what the backend sees), with the right IVs (the ciphertext is the
//! whole request's), completing once (stats, errors); and `high_priority`
//! gives the pipeline's threads nice -20.

mod common;

use std::io;
use std::sync::{Arc, Mutex};

use backend::{Backend, Caps, FaultBackend, FaultRule, MemBackend, OpKinds};
use common::*;
use ucrypt_datapath::{CryptMode, Engine, EngineConfig, Error, PerfFlags, DEFAULT_MAX_IO_SIZE};

const SIZE: u64 = 8 << 20;

/// A backend that records the length of every read and write it serves.
struct Recording {
    inner: MemBackend,
    ops: Mutex<Vec<(bool, usize)>>,
}

impl Recording {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            inner: MemBackend::new(SIZE + DATA_OFFSET).expect("mem"),
            ops: Mutex::new(Vec::new()),
        })
    }

    /// The lengths seen since the last call, writes (`true`) or reads.
    fn take(&self, write: bool) -> Vec<usize> {
        let mut g = self.ops.lock().unwrap();
        let v = g.iter().filter(|o| o.0 == write).map(|o| o.1).collect();
        g.clear();
        v
    }
}

impl Backend for Recording {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn caps(&self) -> Caps {
        self.inner.caps()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.ops.lock().unwrap().push((false, buf.len()));
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.ops.lock().unwrap().push((true, buf.len()));
        self.inner.write_at(buf, offset, fua)
    }
    fn flush(&self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn classic(max_read: u32, max_write: u32) -> EngineConfig {
    EngineConfig {
        mode: CryptMode::Classic,
        max_read_size: max_read,
        max_write_size: max_write,
        ..EngineConfig::default()
    }
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

#[test]
fn large_requests_reach_the_backend_in_pieces_with_the_whole_requests_ciphertext() {
    let rec = Recording::new();
    let e = Engine::new(
        volume(rec.clone(), XTS, SIZE),
        classic(DEFAULT_MAX_IO_SIZE, DEFAULT_MAX_IO_SIZE),
    )
    .expect("engine");
    let data = pattern(1 << 20, 7);
    e.write(4096, data.clone(), false).unwrap();
    let piece = DEFAULT_MAX_IO_SIZE as usize;
    assert_eq!(
        rec.take(true),
        vec![piece; 8],
        "1 MiB write in 128 KiB pieces"
    );
    assert_eq!(e.read(4096, 1 << 20).unwrap(), data);
    assert_eq!(
        rec.take(false),
        vec![piece; 8],
        "1 MiB read in 128 KiB pieces"
    );
    let s = e.stats();
    assert_eq!(
        (s.read.requests, s.read.bytes),
        (1, 1 << 20),
        "counted once"
    );
    assert_eq!((s.write.requests, s.write.bytes), (1, 1 << 20));
    drop(e);

    // The same request unsplit (an inline engine) left the same ciphertext:
    // every piece was encrypted with its own sectors' IVs.
    let whole = Recording::new();
    let inline = EngineConfig {
        mode: CryptMode::Inline,
        ..EngineConfig::default()
    };
    let e = Engine::new(volume(whole.clone(), XTS, SIZE), inline).expect("engine");
    e.write(4096, data.clone(), false).unwrap();
    let mut a = vec![0u8; 1 << 20];
    let mut b = vec![0u8; 1 << 20];
    rec.inner.read_at(&mut a, DATA_OFFSET + 4096).unwrap();
    whole.inner.read_at(&mut b, DATA_OFFSET + 4096).unwrap();
    assert!(a == b, "split and whole writes differ on the backend");
    assert!(a != data, "the backend holds ciphertext");
}

#[test]
fn sizes_round_down_to_the_sector_and_writes_stop_at_one_mib() {
    // 100000 bytes: 195 sectors of 512 (99840), the last piece shorter.
    let rec = Recording::new();
    let e = Engine::new(volume(rec.clone(), XTS, SIZE), classic(100_000, 4 << 20)).unwrap();
    let data = pattern(2 << 20, 3);
    e.write(0, data.clone(), false).unwrap();
    assert_eq!(rec.take(true), vec![1 << 20; 2], "writes: at most 1 MiB");
    let got = e.read(0, 1 << 20).unwrap();
    assert!(got == data[..1 << 20]);
    let reads = rec.take(false);
    assert_eq!(reads.len(), 11, "{reads:?}");
    assert!(reads[..10].iter().all(|&l| l == 99_840), "{reads:?}");
    assert_eq!(reads[10], (1 << 20) - 10 * 99_840);
    drop(e);

    // 4096-byte sectors: 6000 rounds down to one sector.
    let rec = Recording::new();
    let e = Engine::new(volume(rec.clone(), XTS_4K, SIZE), classic(6000, 512)).unwrap();
    let data = pattern(64 << 10, 9);
    e.write(8192, data.clone(), false).unwrap();
    assert_eq!(rec.take(true), vec![4096; 16], "at least one sector");
    assert_eq!(e.read(8192, 64 << 10).unwrap(), data);
    assert_eq!(rec.take(false), vec![4096; 16]);
}

#[test]
fn inline_directions_and_default_sizes_are_not_cut() {
    let rec = Recording::new();
    let cfg = EngineConfig {
        flags: PerfFlags {
            no_read_workqueue: true,
            ..PerfFlags::default()
        },
        ..classic(0, 0)
    };
    let e = Engine::new(volume(rec.clone(), XTS, SIZE), cfg).unwrap();
    e.write(0, pattern(1 << 20, 1), false).unwrap();
    assert_eq!(
        rec.take(true),
        vec![1 << 20],
        "sizes 0 (the default): no cut, as before Linux 6.11"
    );
    e.read(0, 1 << 20).unwrap();
    assert_eq!(
        rec.take(false),
        vec![1 << 20],
        "no_read_workqueue reads whole"
    );
}

#[test]
fn a_failed_piece_fails_the_request_once() {
    let fb = Arc::new(FaultBackend::new(
        MemBackend::new(SIZE + DATA_OFFSET).expect("mem"),
    ));
    let e = Arc::new(
        Engine::new(
            volume(fb.clone(), XTS, SIZE),
            classic(DEFAULT_MAX_IO_SIZE, DEFAULT_MAX_IO_SIZE),
        )
        .unwrap(),
    );
    e.write(0, pattern(1 << 20, 5), false).unwrap();
    // Fail reads of the third 128 KiB piece only.
    let at = DATA_OFFSET + (256 << 10);
    fb.add_rule(FaultRule::error(OpKinds::READ, libc::EIO).range(at..at + 4096));
    let (tx, rx) = std::sync::mpsc::channel();
    e.submit(
        ucrypt_datapath::Request {
            op: ucrypt_datapath::Op::Read { len: 1 << 20 },
            offset: 0,
            fua: false,
        },
        move |c| tx.send(c).unwrap(),
    );
    let first = rx.recv_timeout(std::time::Duration::from_secs(30)).unwrap();
    assert!(matches!(first, Err(Error::Io(_))), "{first:?}");
    assert!(
        rx.recv_timeout(std::time::Duration::from_millis(200))
            .is_err(),
        "the callback ran twice"
    );
    let s = e.stats();
    assert_eq!((s.read.requests, s.read.errors), (1, 1));
    // Reads elsewhere still work.
    assert_eq!(
        e.read(512 << 10, 4096).unwrap(),
        pattern(1 << 20, 5)[512 << 10..(512 << 10) + 4096]
    );
}

/// The calling thread's name and nice value (`/proc/thread-self/stat`:
/// the name in parentheses, nice is field 19).
fn this_thread() -> (String, i64) {
    let stat = std::fs::read_to_string("/proc/thread-self/stat").unwrap();
    let (open, close) = (stat.find('(').unwrap(), stat.rfind(')').unwrap());
    // Fields after the name start at field 3 (state): nice is 19.
    let nice = stat[close + 1..].split_whitespace().nth(16).unwrap();
    (stat[open + 1..close].to_string(), nice.parse().unwrap())
}

/// The name and nice value of the threads that complete a queued read
/// (a `kcryptd` worker) and a queued write (`dmcrypt_write`) of `cfg`.
fn completing_threads(cfg: EngineConfig) -> Vec<(String, i64)> {
    let e = Engine::new(volume(Recording::new(), XTS, SIZE), cfg).unwrap();
    let mut out = Vec::new();
    // One at a time: the read must see the write.
    for op in [
        ucrypt_datapath::Op::Write {
            data: pattern(4096, 1),
        },
        ucrypt_datapath::Op::Read { len: 4096 },
    ] {
        let (tx, rx) = std::sync::mpsc::channel();
        let req = ucrypt_datapath::Request {
            op,
            offset: 0,
            fua: false,
        };
        e.submit(req, move |c| {
            let _ = tx.send((c.is_ok(), this_thread()));
        });
        let (ok, t) = rx.recv_timeout(std::time::Duration::from_secs(30)).unwrap();
        assert!(ok, "{t:?}");
        out.push(t);
    }
    out
}

#[test]
fn high_priority_runs_the_pipeline_at_nice_minus_20() {
    let own = this_thread().1;
    let high = completing_threads(EngineConfig {
        flags: PerfFlags {
            high_priority: true,
            ..PerfFlags::default()
        },
        ..classic(0, 0)
    });
    let names: Vec<&str> = high.iter().map(|t| t.0.as_str()).collect();
    assert!(names.contains(&"dmcrypt_write"), "{high:?}");
    assert!(names.iter().any(|n| n.starts_with("kcryptd/")), "{high:?}");
    let want = if has_cap_sys_nice() { -20 } else { own };
    assert!(
        high.iter().all(|t| t.1 == want),
        "{high:?}, want nice {want}"
    );
    // Without the flag they keep the process's nice value.
    let plain = completing_threads(classic(0, 0));
    assert_eq!(plain.len(), 2, "{plain:?}");
    assert!(
        plain.iter().all(|t| t.1 == own),
        "{plain:?}, want nice {own}"
    );
}

/// Whether this process may lower nice values: CAP_SYS_NICE in its
/// effective set (`/proc/self/status`, `CapEff`, bit 23).
fn has_cap_sys_nice() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        .is_some_and(|c| c & (1 << 23) != 0)
}
