//! Shared test harness: volumes, a seeded PRNG, and a randomized workload
//! checked against a model of the plaintext device.
#![allow(dead_code)]

use std::collections::HashMap;
use std::ops::Range;
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use backend::{Backend, FileBackend, FileOptions, MemBackend};
use crypto::{CryptConfig, SectorCrypt};
use ucrypt_datapath::{
    Completion, CryptMode, Engine, EngineConfig, Error, Op, PerfFlags, Request, Volume,
};

/// Longest a test waits for any single completion before failing.
pub const HANG: Duration = Duration::from_secs(60);

/// The shared seeded PRNG (testutil), so failures reproduce.
pub use testutil::Rng;

/// A cipher under test.
#[derive(Clone, Copy, Debug)]
pub struct Cipher {
    pub spec: &'static str,
    pub key_len: usize,
    pub sector_size: u32,
    pub iv_large_sectors: bool,
}

pub const NULL: Cipher = Cipher {
    spec: "cipher_null-ecb",
    key_len: 0,
    sector_size: 512,
    iv_large_sectors: false,
};
pub const XTS: Cipher = Cipher {
    spec: "aes-xts-plain64",
    key_len: 64,
    sector_size: 512,
    iv_large_sectors: false,
};
pub const XTS_4K: Cipher = Cipher {
    spec: "aes-xts-plain64",
    key_len: 32,
    sector_size: 4096,
    iv_large_sectors: true,
};

pub fn sector_crypt(c: Cipher) -> Arc<SectorCrypt> {
    Arc::new(
        SectorCrypt::new(&CryptConfig {
            cipher: c.spec.into(),
            key: zeroize::Zeroizing::new((0..c.key_len).map(|i| (i * 7 + 3) as u8).collect()),
            iv_offset: 0,
            sector_size: c.sector_size,
            iv_large_sectors: c.iv_large_sectors,
        })
        .expect("cipher builds"),
    )
}

/// Which backend a test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Store {
    Mem,
    File,
}

/// Keeps a temp dir alive as long as the backend.
pub struct Backing {
    pub backend: Arc<dyn Backend>,
    _dir: Option<testutil::TempDir>,
}

pub fn backing(store: Store, size: u64) -> Backing {
    match store {
        Store::Mem => Backing {
            backend: Arc::new(MemBackend::new(size).expect("mem")),
            _dir: None,
        },
        Store::File => {
            let dir = testutil::TempDir::new("datapath");
            let path = dir.join("disk.img");
            std::fs::File::create(&path)
                .and_then(|f| f.set_len(size))
                .expect("create image");
            let b = FileBackend::open(&path, &FileOptions::default()).expect("open file backend");
            Backing {
                backend: Arc::new(b),
                _dir: Some(dir),
            }
        }
    }
}

/// Data starts this far into the backend (a LUKS-like header gap).
pub const DATA_OFFSET: u64 = 8192;

/// A `len`-byte image file on io_uring (O_DIRECT where the file allows it),
/// with its path and the temp dir that holds it; `None` (a logged skip)
/// without io_uring.
pub fn uring_image(
    test: &str,
    len: u64,
) -> Option<(Arc<FileBackend>, std::path::PathBuf, testutil::TempDir)> {
    if !testutil::require(test, testutil::Capability::IoUring) {
        return None;
    }
    let dir = testutil::TempDir::new(test);
    let path = dir.join("disk.img");
    std::fs::File::create(&path)
        .and_then(|f| f.set_len(len))
        .expect("create image");
    let opts = FileOptions {
        engine: Some(backend::IoEngine::Uring),
        direct: backend::DirectIo::Auto,
        ..FileOptions::default()
    };
    let fb = Arc::new(FileBackend::open(&path, &opts).expect("open"));
    Some((fb, path, dir))
}

pub fn volume(backend: Arc<dyn Backend>, c: Cipher, size: u64) -> Volume {
    Volume {
        backend,
        crypt: Some(sector_crypt(c)),
        data_offset: DATA_OFFSET,
        size,
        sector_size: c.sector_size,
    }
}

/// The named mode/flag combinations every correctness test covers.
pub fn configs() -> Vec<(&'static str, EngineConfig, bool)> {
    let base = EngineConfig {
        queue_depth: 16,
        allow_discards: true,
        ..EngineConfig::default()
    };
    let classic = |flags: PerfFlags| EngineConfig {
        mode: CryptMode::Classic,
        flags,
        ..base.clone()
    };
    vec![
        ("classic", classic(PerfFlags::default()), false),
        (
            "classic+same_cpu_crypt",
            classic(PerfFlags {
                same_cpu_crypt: true,
                ..PerfFlags::default()
            }),
            false,
        ),
        (
            "classic+submit_from_crypt_cpus",
            classic(PerfFlags {
                submit_from_crypt_cpus: true,
                ..PerfFlags::default()
            }),
            false,
        ),
        (
            "classic+no_read_workqueue",
            classic(PerfFlags {
                no_read_workqueue: true,
                ..PerfFlags::default()
            }),
            false,
        ),
        (
            "classic+no_write_workqueue",
            classic(PerfFlags {
                no_write_workqueue: true,
                ..PerfFlags::default()
            }),
            false,
        ),
        (
            "inline",
            EngineConfig {
                mode: CryptMode::Inline,
                ..base.clone()
            },
            false,
        ),
        (
            "adaptive",
            EngineConfig {
                mode: CryptMode::Adaptive,
                ..base.clone()
            },
            false,
        ),
        (
            "adaptive+forced split",
            EngineConfig {
                mode: CryptMode::Adaptive,
                ..base.clone()
            },
            true,
        ),
    ]
}

/// The plaintext a region of the device must hold.
pub struct Model {
    pub base: u64,
    pub data: Vec<u8>,
    /// Per 512-byte sector: false after a discard (content undefined).
    pub defined: Vec<bool>,
}

impl Model {
    /// A model of `region`, whose content is not known yet.
    pub fn new(region: Range<u64>) -> Self {
        let n = (region.end - region.start) as usize;
        Self {
            base: region.start,
            data: vec![0; n],
            defined: vec![false; n / 512],
        }
    }

    fn span(&self, off: u64, len: u64) -> Range<usize> {
        let s = (off - self.base) as usize;
        s..s + len as usize
    }

    pub fn write(&mut self, off: u64, data: &[u8]) {
        let r = self.span(off, data.len() as u64);
        self.data[r.clone()].copy_from_slice(data);
        self.defined[r.start / 512..r.end / 512].fill(true);
    }

    pub fn discard(&mut self, off: u64, len: u64) {
        let r = self.span(off, len);
        self.defined[r.start / 512..r.end / 512].fill(false);
    }

    /// Panics with a useful message if `got` differs where defined.
    pub fn check(&self, what: &str, off: u64, got: &[u8]) {
        let r = self.span(off, got.len() as u64);
        for (i, sec) in got.chunks(512).enumerate() {
            let s = r.start / 512 + i;
            if self.defined[s] && sec != &self.data[s * 512..(s + 1) * 512] {
                panic!(
                    "{what}: mismatch in sector at device offset {}",
                    self.base + s as u64 * 512
                );
            }
        }
    }
}

enum Pending {
    Read {
        off: u64,
        len: u64,
        expect: Vec<u8>,
        defined: Vec<bool>,
    },
    Other,
}

/// Options for [`workload`].
#[derive(Clone, Copy)]
pub struct Load {
    pub ops: usize,
    pub qd: usize,
    /// Largest request in bytes (occasional; most are small).
    pub max_len: u64,
    pub discards: bool,
}

/// Runs a randomized verified workload on `region` of `e` (no other writer
/// touches the region). Keeps up to `qd` requests in flight with `submit`,
/// never two overlapping ones where one is a write (concurrent overlapping
/// writes have no defined result on a disk either). Returns the model.
pub fn workload(what: &str, e: &Engine, region: Range<u64>, model: &mut Model, seed: u64, l: Load) {
    let ss = e.sector_size() as u64;
    let mut rng = Rng::new(seed);
    let (tx, rx) = mpsc::channel::<(u64, Completion)>();
    let mut inflight: HashMap<u64, (Range<u64>, bool, Pending)> = HashMap::new();
    let sectors = (region.end - region.start) / ss;
    let finish =
        |id: u64, c: Completion, inflight: &mut HashMap<u64, (Range<u64>, bool, Pending)>| {
            let (_, _, p) = inflight
                .remove(&id)
                .expect("completion for a known request");
            let got = c.unwrap_or_else(|e| panic!("{what}: request failed: {e}"));
            if let Pending::Read {
                off,
                len,
                expect,
                defined,
            } = p
            {
                let got = got.expect("read returns data");
                assert_eq!(got.len() as u64, len, "{what}: read length");
                let m = Model {
                    base: off,
                    data: expect,
                    defined,
                };
                m.check(what, off, &got);
            }
        };
    for id in 0..l.ops as u64 {
        let roll = rng.below(100);
        let big = rng.below(10) == 0;
        let max = if big {
            l.max_len / ss
        } else {
            (16384 / ss).max(1)
        };
        let n = 1 + rng.below(max.min(sectors));
        let start = rng.below(sectors - n + 1);
        let (off, len) = (region.start + start * ss, n * ss);
        let (op, is_write) = match roll {
            0..=39 => {
                let mut d = vec![0u8; len as usize];
                rng.fill(&mut d);
                (Op::Write { data: d }, true)
            }
            40..=79 => (Op::Read { len: len as u32 }, false),
            80..=86 => (Op::Flush, false),
            87..=92 if l.discards => (Op::Discard { len: len as u32 }, true),
            _ => (Op::WriteZeroes { len: len as u32 }, true),
        };
        let range = if matches!(op, Op::Flush) {
            0..0
        } else {
            off..off + len
        };
        // Wait for room and for overlapping requests to finish.
        loop {
            let conflict = inflight
                .values()
                .any(|(r, w, _)| (is_write || *w) && r.start < range.end && range.start < r.end);
            if !conflict && inflight.len() < l.qd {
                break;
            }
            let (id, c) = rx
                .recv_timeout(HANG)
                .unwrap_or_else(|_| panic!("{what}: request hung"));
            finish(id, c, &mut inflight);
        }
        let fua = is_write && rng.below(8) == 0 && !matches!(op, Op::Discard { .. });
        let pending = match &op {
            Op::Write { data } => {
                model.write(off, data);
                Pending::Other
            }
            Op::WriteZeroes { len } => {
                model.write(off, &vec![0; *len as usize]);
                Pending::Other
            }
            Op::Discard { len } => {
                model.discard(off, *len as u64);
                Pending::Other
            }
            Op::Read { len } => {
                let r = model.span(off, *len as u64);
                Pending::Read {
                    off,
                    len: *len as u64,
                    expect: model.data[r.clone()].to_vec(),
                    defined: model.defined[r.start / 512..r.end / 512].to_vec(),
                }
            }
            Op::Flush => Pending::Other,
            other => unreachable!("the workload generator makes no {other:?}"),
        };
        inflight.insert(id, (range, is_write, pending));
        let tx = tx.clone();
        e.submit(
            Request {
                op,
                offset: off,
                fua,
            },
            move |c| {
                let _ = tx.send((id, c));
            },
        );
    }
    while !inflight.is_empty() {
        let (id, c) = rx
            .recv_timeout(HANG)
            .unwrap_or_else(|_| panic!("{what}: request hung at the end"));
        finish(id, c, &mut inflight);
    }
}

/// Reads `region` back (1 MiB at a time) and checks it against the model.
pub fn verify_all(what: &str, e: &Engine, region: Range<u64>, model: &Model) {
    let mut off = region.start;
    while off < region.end {
        let n = (region.end - off).min(1 << 20);
        let got = e
            .read(off, n as u32)
            .unwrap_or_else(|err| panic!("{what}: final read failed: {err}"));
        model.check(what, off, &got);
        off += n;
    }
}

/// Checks that the backend holds exactly the ciphertext SectorCrypt makes
/// of the model (every mode writes the same dm-crypt format).
pub fn verify_ciphertext(
    what: &str,
    backend: &dyn Backend,
    c: Cipher,
    region: Range<u64>,
    model: &Model,
) {
    let crypt = sector_crypt(c);
    let ss = c.sector_size as usize;
    let mut raw = vec![0u8; (region.end - region.start) as usize];
    backend
        .read_at(&mut raw, DATA_OFFSET + region.start)
        .expect("raw read");
    for (i, (cipher, plain)) in raw.chunks(ss).zip(model.data.chunks(ss)).enumerate() {
        let first = (i * ss) / 512;
        if !model.defined[first..first + ss / 512].iter().all(|d| *d) {
            continue;
        }
        let mut p = plain.to_vec();
        crypt.encrypt((region.start + (i * ss) as u64) / 512, &mut p);
        assert!(
            p == cipher,
            "{what}: ciphertext differs from SectorCrypt at device offset {}",
            region.start + (i * ss) as u64
        );
    }
}

/// Submits and waits (with a timeout) for one request.
pub fn run(e: &Engine, req: Request) -> Result<Option<Vec<u8>>, Error> {
    let (tx, rx) = mpsc::channel();
    e.submit(req, move |c| {
        let _ = tx.send(c);
    });
    rx.recv_timeout(HANG).expect("request hung")
}
