//! What io_uring carries, per file: on a file whose descriptors take
//! nowait IO every read and write of a batch or of `submit_async` goes to
//! the ring; on one that does not (tmpfs), where io_uring would hand each
//! to an io-wq worker thread, transfers under `HOP_MIN` take the syscalls
//! on the calling thread, and larger ones the ring. The oracle is the
//! kernel's own answer, asked here directly: a `preadv2` with `RWF_NOWAIT`
//! on the file (buffered, and O_DIRECT when the backend uses it). Every
//! check is a count or a value, never a time.

mod common;

use common::op;
use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use testutil::{Capability, TempDir};
use ucrypt_backend::{
    AsyncKind, Backend, DirectIo, FileBackend, FileOptions, IoEngine, ReadOp, HOP_MIN,
};

/// The kernel's answer for `path` opened with `flags`: false only when it
/// refuses `RWF_NOWAIT` with `EOPNOTSUPP`.
fn kernel_nowait(path: &Path, flags: i32, align: usize) -> bool {
    let f = OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
        .expect("open for the probe");
    let layout = std::alloc::Layout::from_size_align(align, align).expect("layout");
    // SAFETY: the layout has a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    assert!(!p.is_null());
    let iov = libc::iovec {
        iov_base: p.cast(),
        iov_len: align,
    };
    // SAFETY: the iovec describes `align` writable bytes at `p`, alive
    // until the dealloc below.
    let r = unsafe { libc::preadv2(f.as_raw_fd(), &iov, 1, 0, libc::RWF_NOWAIT) };
    let err = std::io::Error::last_os_error();
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(p, layout) };
    r >= 0 || err.raw_os_error() != Some(libc::EOPNOTSUPP)
}

const SIZE: u64 = 4 << 20;

fn make_file(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p).unwrap().set_len(SIZE).unwrap();
    p
}

fn opts(direct: DirectIo, engine: Option<IoEngine>) -> FileOptions {
    FileOptions {
        direct,
        engine,
        ..FileOptions::default()
    }
}

/// A directory on the test temp dir's filesystem and one on tmpfs (when
/// /dev/shm is there), removed on drop.
struct Dirs {
    tmp: TempDir,
    shm: Option<PathBuf>,
}

impl Dirs {
    fn new(tag: &str) -> Self {
        let shm = Path::new("/dev/shm")
            .is_dir()
            .then(|| Path::new("/dev/shm").join(format!("ucrypt-{tag}-{}", std::process::id())));
        if let Some(s) = &shm {
            std::fs::create_dir_all(s).expect("dir on /dev/shm");
        }
        Self {
            tmp: TempDir::new(tag),
            shm,
        }
    }

    fn all(&self) -> Vec<PathBuf> {
        let mut v = vec![self.tmp.path().to_path_buf()];
        v.extend(self.shm.clone());
        v
    }
}

impl Drop for Dirs {
    fn drop(&mut self) {
        if let Some(s) = &self.shm {
            let _ = std::fs::remove_dir_all(s);
        }
    }
}

/// The kernel's answer for the descriptors `b` uses.
fn file_nowait(b: &FileBackend, path: &Path) -> bool {
    let mut nowait = kernel_nowait(path, 0, 1);
    if let Some(a) = b.direct_alignment() {
        nowait &= kernel_nowait(path, libc::O_DIRECT, a.max(512) as usize);
    }
    nowait
}

#[test]
fn takes_nowait_is_the_kernels_answer_and_auto_keeps_io_uring() {
    let test = "nowait_per_file";
    if !testutil::require(test, Capability::IoUring) {
        return;
    }
    let dirs = Dirs::new("engine-nowait");
    for dir in dirs.all() {
        let path = make_file(&dir, "disk");
        for direct in [DirectIo::Auto, DirectIo::Never] {
            for engine in [None, Some(IoEngine::Auto)] {
                let b = FileBackend::open(&path, &opts(direct, engine))
                    .unwrap_or_else(|e| panic!("{test}: open {}: {e}", path.display()));
                let nowait = file_nowait(&b, &path);
                eprintln!("{}: {direct:?}: nowait {nowait}", dir.display());
                assert_eq!(b.takes_nowait(), nowait, "{} {direct:?}", dir.display());
                assert_eq!(b.io_engine(), IoEngine::Uring);
                assert!(b.batches() && b.completes_async());
            }
        }
    }
}

fn pattern(tag: usize, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 31 + tag * 7 + 1) as u8).collect()
}

#[test]
fn small_transfers_skip_the_ring_only_where_it_would_hand_them_off() {
    let test = "hop_min_per_file";
    if !testutil::require(test, Capability::IoUring) {
        return;
    }
    let dirs = Dirs::new("engine-hop");
    for dir in dirs.all() {
        let path = make_file(&dir, "disk");
        let b = FileBackend::open(&path, &opts(DirectIo::Auto, Some(IoEngine::Uring)))
            .unwrap_or_else(|e| panic!("{test}: open {}: {e}", path.display()));
        let nowait = file_nowait(&b, &path);
        let where_ = format!("{} (nowait {nowait})", dir.display());
        // Tags 0..4: 4 KiB entries; tag 4: one of HOP_MIN bytes.
        let lens = [4096, 4096, 8192, 4096, HOP_MIN];
        let offs: Vec<u64> = (0..lens.len() as u64)
            .map(|i| i * (HOP_MIN as u64))
            .collect();
        let (tx, rx) = mpsc::channel();
        for (pass, kind) in [AsyncKind::Write { fua: false }, AsyncKind::Read]
            .into_iter()
            .enumerate()
        {
            let before = b.stats();
            let ops = lens
                .iter()
                .zip(&offs)
                .enumerate()
                .map(|(t, (&l, &o))| {
                    let buf = match kind {
                        AsyncKind::Read => vec![0u8; l],
                        _ => pattern(t, l),
                    };
                    op(&tx, t, kind, o, buf)
                })
                .collect();
            b.submit_async(ops);
            let mut seen = [false; 5];
            for _ in 0..lens.len() {
                let (t, buf, res, comp) = rx.recv().expect("every entry completes");
                res.unwrap_or_else(|e| panic!("{where_}: pass {pass} entry {t}: {e}"));
                assert!(!seen[t], "{where_}: entry {t} completed twice");
                seen[t] = true;
                assert_eq!(buf, pattern(t, lens[t]), "{where_}: pass {pass} entry {t}");
                // On the ring, an entry completes on the completion thread;
                // a small one on a file without nowait IO, here.
                let ring = nowait || lens[t] >= HOP_MIN;
                assert_eq!(comp, ring, "{where_}: pass {pass} entry {t}");
            }
            let s = b.stats();
            let ring_ops = if nowait { lens.len() } else { 1 };
            assert_eq!(
                s.uring_ops - before.uring_ops,
                ring_ops as u64,
                "{where_}: {s:?}"
            );
            let sys = s.syscall_ops - before.syscall_ops;
            assert_eq!(sys, (lens.len() - ring_ops) as u64, "{where_}: {s:?}");
        }
        // A batch of small reads: one ring submission only with nowait IO.
        let mut bufs: Vec<Vec<u8>> = lens[..4].iter().map(|&l| vec![0u8; l]).collect();
        let before = b.stats();
        let mut ops: Vec<ReadOp<'_>> = bufs
            .iter_mut()
            .zip(&offs)
            .map(|(buf, &offset)| ReadOp { buf, offset })
            .collect();
        for r in b.read_batch(&mut ops) {
            r.unwrap_or_else(|e| panic!("{where_}: batch: {e}"));
        }
        for (t, buf) in bufs.iter().enumerate() {
            assert_eq!(buf, &pattern(t, lens[t]), "{where_}: batch entry {t}");
        }
        let s = b.stats();
        let batches = u64::from(nowait);
        assert_eq!(
            s.uring_batches - before.uring_batches,
            batches,
            "{where_}: {s:?}"
        );
    }
}
