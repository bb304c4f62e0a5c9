//! FileBackend: buffered and O_DIRECT files, both IO engines, durability
//! counters, discard/zeroes, errors, and a loop block device when possible.

mod common;

use std::io;
use std::path::Path;
use std::sync::Arc;

use testutil::{Capability, TempDir};
use ucrypt_backend::{
    Backend, Claim, DirectIo, ErrorKind, FileBackend, FileOptions, FuaMode, IoEngine,
};

fn make_file(dir: &TempDir, name: &str, size: u64) -> std::path::PathBuf {
    let p = dir.join(name);
    let f = std::fs::File::create(&p).unwrap();
    f.set_len(size).unwrap();
    p
}

fn opts(direct: DirectIo, engine: Option<IoEngine>) -> FileOptions {
    FileOptions {
        direct,
        engine,
        ..FileOptions::default()
    }
}

/// Opens with the requested engine, or skips when this kernel refuses
/// io_uring (the syscall engine is tested separately).
fn open(path: &Path, o: &FileOptions, test: &str) -> Option<FileBackend> {
    if o.engine == Some(IoEngine::Uring) && !testutil::require(test, Capability::IoUring) {
        return None;
    }
    match FileBackend::open(path, o) {
        Ok(b) => Some(b),
        Err(e) => panic!("{test}: open failed: {e}"),
    }
}

const ENGINES: [IoEngine; 2] = [IoEngine::Uring, IoEngine::Syscalls];

#[test]
fn buffered_byte_granular_workload() {
    let dir = TempDir::new("be-file");
    for engine in ENGINES {
        let p = make_file(&dir, "buf.img", 512 * 1024 + 77);
        let Some(b) = open(
            &p,
            &opts(DirectIo::Never, Some(engine)),
            "buffered_byte_granular_workload",
        ) else {
            continue;
        };
        assert_eq!(b.io_engine(), engine);
        assert_eq!(b.direct_alignment(), None);
        common::random_workload(&b, 11, 1500, 1, 40_000);
        let s = b.stats();
        assert!(s.buffered_ops > 0 && s.direct_ops == 0, "{s:?}");
        // Single operations are syscalls on both engines; the ring carries
        // batches (tests/batch.rs).
        assert!(s.uring_ops == 0 && s.syscall_ops > 0, "{s:?}");
    }
}

#[test]
fn direct_aligned_workload_uses_o_direct() {
    let dir = TempDir::new("be-file");
    for engine in ENGINES {
        let p = make_file(&dir, "dio.img", 4 << 20);
        let Some(b) = open(
            &p,
            &opts(DirectIo::Required, Some(engine)),
            "direct_aligned_workload",
        ) else {
            continue;
        };
        let a = b.direct_alignment().expect("O_DIRECT in use");
        assert!(a.is_power_of_two() && a <= 4096, "alignment {a}");
        common::random_workload(&b, 12, 600, 4096, 256 * 1024);
        let s = b.stats();
        assert!(s.uring_ops == 0 && s.syscall_ops > 0, "{s:?}");
        assert!(s.direct_ops > 0 && s.buffered_ops == 0, "{s:?}");
        // Vec buffers are rarely 4096-aligned: those go through the bounce buffer.
        assert!(s.bounced_ops > 0, "{s:?}");
    }
}

#[test]
fn auto_mode_mixes_direct_and_buffered_coherently() {
    let dir = TempDir::new("be-file");
    let p = make_file(&dir, "mix.img", 2 << 20);
    let b = FileBackend::open(&p, &FileOptions::default()).unwrap();
    // Byte-granular workload: aligned requests go O_DIRECT, the rest through
    // the page cache; the model check proves the two views stay coherent.
    common::random_workload(&b, 13, 1500, 512, 64 * 1024);
    common::random_workload(&b, 14, 1500, 1, 64 * 1024);
    let s = b.stats();
    assert!(s.direct_ops > 0 && s.buffered_ops > 0, "{s:?}");
}

#[test]
fn required_direct_rejects_unaligned_requests() {
    let dir = TempDir::new("be-file");
    let p = make_file(&dir, "req.img", 1 << 20);
    let b = FileBackend::open(&p, &opts(DirectIo::Required, None)).unwrap();
    let err = b.read_at(&mut [0u8; 100], 0).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    assert!(err.to_string().contains("O_DIRECT alignment"), "{err}");
    assert!(matches!(
        ucrypt_backend::Error::kind_of(&err),
        Some(ErrorKind::Unaligned { len: 100, .. })
    ));
    let err = b.write_at(&[1u8; 4096], 1, false).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    // Aligned offset/len with a deliberately misaligned memory address works.
    let mut big = vec![0u8; 8192 + 1];
    big[1..].fill(0x3C);
    b.write_at(&big[1..4097], 4096, false).unwrap();
    let mut back = vec![0u8; 4097];
    b.read_at(&mut back[1..], 4096).unwrap();
    assert!(back[1..].iter().all(|&x| x == 0x3C));
    assert!(b.stats().bounced_ops >= 2);
}

#[test]
fn out_of_range_rejected() {
    let dir = TempDir::new("be-file");
    for direct in [DirectIo::Never, DirectIo::Auto] {
        let p = make_file(&dir, "oor.img", 1 << 20);
        let b = FileBackend::open(&p, &opts(direct, None)).unwrap();
        common::out_of_range_rejected(&b);
    }
}

#[test]
fn discard_and_zeroes_read_back_zero_natively() {
    let dir = TempDir::new("be-file");
    for (direct, align) in [(DirectIo::Never, 1), (DirectIo::Auto, 512)] {
        let p = make_file(&dir, "z.img", 1 << 20);
        let b = FileBackend::open(&p, &opts(direct, None)).unwrap();
        assert!(b.caps().can_discard && b.caps().can_write_zeroes);
        common::zeroes_read_back(&b, align);
        let s = b.stats();
        assert!(
            s.discards >= 1 && s.zeroes >= 1,
            "native ops not used: {s:?}"
        );
    }
    // Punching a hole really frees blocks on the file.
    let p = make_file(&dir, "hole.img", 8 << 20);
    let b = FileBackend::open(&p, &FileOptions::default()).unwrap();
    b.write_at(&vec![9u8; 8 << 20], 0, false).unwrap();
    b.flush().unwrap();
    let blocks = |p: &Path| std::os::unix::fs::MetadataExt::blocks(&std::fs::metadata(p).unwrap());
    let before = blocks(&p);
    b.discard(0, 8 << 20).unwrap();
    assert!(blocks(&p) < before, "punch hole freed nothing");
    assert_eq!(
        std::fs::metadata(&p).unwrap().len(),
        8 << 20,
        "discard changed the size"
    );
}

#[test]
fn discard_not_allowed_is_emulated_by_zeroing() {
    let dir = TempDir::new("be-file");
    let p = make_file(&dir, "nd.img", 1 << 20);
    let o = FileOptions {
        allow_discard: false,
        ..FileOptions::default()
    };
    let b = FileBackend::open(&p, &o).unwrap();
    assert!(!b.caps().can_discard);
    b.write_at(&[0xEE; 8192], 4096, false).unwrap();
    b.discard(4096, 8192).unwrap();
    let mut got = [1u8; 8192];
    b.read_at(&mut got, 4096).unwrap();
    assert!(got.iter().all(|&x| x == 0));
    assert_eq!(b.stats().discards, 0);
}

#[test]
fn flush_and_fua_reach_fdatasync() {
    let dir = TempDir::new("be-file");
    for engine in ENGINES {
        let p = make_file(&dir, "sync.img", 1 << 20);
        let Some(b) = open(
            &p,
            &opts(DirectIo::Auto, Some(engine)),
            "flush_and_fua_reach_fdatasync",
        ) else {
            continue;
        };
        assert!(b.caps().can_fua);
        b.write_at(&[1u8; 4096], 0, false).unwrap();
        assert_eq!((b.stats().syncs, b.stats().dsync_writes), (0, 0));
        b.flush().unwrap();
        assert_eq!(b.stats().syncs, 1);
        b.write_at(&[2u8; 4096], 4096, true).unwrap();
        b.write_at(&[3u8; 100], 8192 + 1, true).unwrap();
        assert_eq!((b.stats().syncs, b.stats().dsync_writes), (1, 2));

        let p = make_file(&dir, "sync2.img", 1 << 20);
        let o = FileOptions {
            fua: FuaMode::WriteThenFlush,
            engine: Some(engine),
            ..FileOptions::default()
        };
        let Some(b) = open(&p, &o, "flush_and_fua_reach_fdatasync") else {
            continue;
        };
        assert!(!b.caps().can_fua);
        b.write_at(&[2u8; 4096], 4096, true).unwrap();
        b.write_at(&[2u8; 4096], 0, false).unwrap();
        assert_eq!((b.stats().syncs, b.stats().dsync_writes), (1, 0));
        let mut back = [0u8; 4096];
        b.read_at(&mut back, 4096).unwrap();
        assert_eq!(back, [2u8; 4096]);
    }
}

#[test]
fn read_only_refuses_writes() {
    let dir = TempDir::new("be-file");
    let p = make_file(&dir, "ro.img", 64 * 1024);
    std::fs::write(&p, vec![0x42u8; 64 * 1024]).unwrap();
    let b = FileBackend::open(
        &p,
        &FileOptions {
            read_only: true,
            ..FileOptions::default()
        },
    )
    .unwrap();
    let mut buf = [0u8; 512];
    b.read_at(&mut buf, 512).unwrap();
    assert_eq!(buf, [0x42; 512]);
    for r in [
        b.write_at(&[0u8; 512], 0, false),
        b.discard(0, 512),
        b.write_zeroes(0, 512),
    ] {
        let e = r.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().starts_with("Backend is read-only"), "{e}");
    }
    b.flush().unwrap();
    assert_eq!(std::fs::read(&p).unwrap(), vec![0x42u8; 64 * 1024]);
}

#[test]
fn open_errors_are_clear() {
    let dir = TempDir::new("be-file");
    let e = FileBackend::open(dir.join("missing.img"), &FileOptions::default()).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Open { .. }));
    assert!(
        e.to_string().starts_with("Cannot open backing device"),
        "{e}"
    );
    let io: io::Error = e.into();
    assert_eq!(io.kind(), io::ErrorKind::NotFound);

    let p = make_file(&dir, "small.img", 1000);
    let o = FileOptions {
        min_size: 4096,
        ..FileOptions::default()
    };
    let e = FileBackend::open(&p, &o).unwrap_err();
    assert!(
        matches!(
            e.kind(),
            ErrorKind::TooSmall {
                size: 1000,
                required: 4096,
                ..
            }
        ),
        "{e}"
    );
    assert!(e.to_string().contains("too small"), "{e}");

    let ro = FileOptions {
        read_only: true,
        ..FileOptions::default()
    };
    let e = FileBackend::open(dir.path(), &ro).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::NotABlockDevice { .. }), "{e}");
}

#[test]
fn concurrent_threads_each_with_own_ring() {
    let dir = TempDir::new("be-file");
    for direct in [DirectIo::Never, DirectIo::Auto] {
        let p = make_file(&dir, "conc.img", 1 << 20);
        let b: Arc<dyn Backend> = Arc::new(FileBackend::open(&p, &opts(direct, None)).unwrap());
        common::concurrent_threads(&*b, 6, 100, false);
    }
}

#[test]
fn loop_block_device() {
    const T: &str = "loop_block_device";
    if !testutil::require_all(
        T,
        &[
            Capability::Tool("losetup"),
            Capability::LoopDevices,
            Capability::Root,
        ],
    ) {
        return;
    }
    let dir = TempDir::new("be-loop");
    let img = make_file(&dir, "loop.img", 4 << 20);
    let Some(lo) = testutil::LoopDevice::attach(T, &img, &[]) else {
        return;
    };
    let dev = lo.path();
    let b = FileBackend::open(dev, &FileOptions::default()).unwrap();
    assert!(b.is_block_device());
    assert_eq!(b.size(), 4 << 20);
    common::random_workload(&b, 21, 400, 512, 128 * 1024);
    common::out_of_range_rejected(&b);
    common::zeroes_read_back(&b, 512);
    drop(b);
    let o = FileOptions {
        min_size: 8 << 20,
        ..FileOptions::default()
    };
    let e = FileBackend::open(dev, &o).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::TooSmall { .. }), "{e}");
}

#[test]
fn a_block_device_is_claimed_exclusively_read_only_or_not() {
    const T: &str = "a_block_device_is_claimed_exclusively_read_only_or_not";
    if !testutil::require_all(
        T,
        &[
            Capability::Tool("losetup"),
            Capability::LoopDevices,
            Capability::Root,
        ],
    ) {
        return;
    }
    let dir = TempDir::new("be-claim");
    let img = make_file(&dir, "loop.img", 4 << 20);
    let Some(lo) = testutil::LoopDevice::attach(T, &img, &[]) else {
        return;
    };
    let dev = lo.path();
    let in_use = |e: ucrypt_backend::Error| {
        assert!(matches!(e.kind(), ErrorKind::InUse { .. }), "{e}");
        assert_eq!(
            e.to_string(),
            format!("Cannot use device {dev} which is in use (already mapped or mounted).")
        );
        assert_eq!(io::Error::from(e).kind(), io::ErrorKind::ResourceBusy);
    };
    let ro = FileOptions {
        read_only: true,
        ..FileOptions::default()
    };
    let shared = FileOptions {
        read_only: true,
        exclusive: false,
        ..FileOptions::default()
    };
    // A backend claims the device (O_EXCL, as a dm table load): every
    // other claim is refused, read-only or not; a sharing reader is not.
    let first = FileBackend::open(dev, &FileOptions::default()).unwrap();
    first.write_at(&[7u8; 4096], 0, true).unwrap();
    in_use(FileBackend::open(dev, &FileOptions::default()).unwrap_err());
    in_use(FileBackend::open(dev, &ro).unwrap_err());
    in_use(Claim::take(Path::new(dev)).unwrap_err());
    let reader = FileBackend::open(dev, &shared).unwrap();
    let mut buf = [0u8; 4096];
    reader.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [7u8; 4096]);
    drop(reader);
    drop(first);
    // A read-only backend claims it too.
    let first = FileBackend::open(dev, &ro).unwrap();
    in_use(FileBackend::open(dev, &FileOptions::default()).unwrap_err());
    drop(first);
    // A header verb's claim keeps backends out while it is held.
    let claim = Claim::take(Path::new(dev)).unwrap();
    in_use(FileBackend::open(dev, &FileOptions::default()).unwrap_err());
    in_use(Claim::take(Path::new(dev)).unwrap_err());
    drop(claim);
    drop(FileBackend::open(dev, &FileOptions::default()).unwrap());
}

/// `take()` (an open or a claim), retried for up to 60 s while an
/// earlier backend of this process still holds the file's lock; any other
/// error fails the test.
fn once_released<T>(take: impl Fn() -> Result<T, ucrypt_backend::Error>) -> T {
    let start = std::time::Instant::now();
    loop {
        match take() {
            Ok(t) => return t,
            Err(e) if matches!(e.kind(), ErrorKind::Locked { .. }) => {
                assert!(start.elapsed() < std::time::Duration::from_secs(60), "{e}");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            Err(e) => panic!("{e}"),
        }
    }
}

#[test]
fn a_claim_on_a_file_conflicts_with_every_backend_lock() {
    let dir = TempDir::new("be-claim-file");
    let p = make_file(&dir, "claim.img", 1 << 20);
    let locked = |e: ucrypt_backend::Error| {
        assert!(matches!(e.kind(), ErrorKind::Locked { .. }), "{e}");
    };
    let ro = FileOptions {
        read_only: true,
        ..FileOptions::default()
    };
    // A backend, writer or reader, keeps a claim out. A dropped backend's
    // io_uring workers may hold its file description (and so its lock) for
    // a moment after the drop in this process (its own `close` is
    // synchronous; the workers' last reference goes later): wait that out.
    for o in [FileOptions::default(), ro.clone()] {
        let b = once_released(|| FileBackend::open(&p, &o));
        locked(Claim::take(&p).unwrap_err());
        drop(b);
    }
    // A claim keeps every backend (and a second claim) out until dropped.
    let claim = once_released(|| Claim::take(&p));
    locked(FileBackend::open(&p, &FileOptions::default()).unwrap_err());
    locked(FileBackend::open(&p, &ro).unwrap_err());
    locked(Claim::take(&p).unwrap_err());
    // It does not stop plain IO on the file (a header write).
    std::fs::write(&p, vec![1u8; 4096]).unwrap();
    drop(claim);
    drop(once_released(|| {
        FileBackend::open(&p, &FileOptions::default())
    }));
    // A path that does not exist: the caller's own open says why.
    let e = Claim::take(&dir.join("missing")).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::Open { .. }), "{e}");
}

#[test]
fn concurrent_neighbours_sharing_pages() {
    let dir = TempDir::new("be-file");
    let p = make_file(&dir, "share.img", 64 * 1024);
    let b: Arc<dyn Backend> = Arc::new(FileBackend::open(&p, &FileOptions::default()).unwrap());
    common::concurrent_shared_pages(&*b, 4, 300);
}

#[test]
fn short_reads_continue_then_fail_cleanly_at_a_shrunken_end() {
    let dir = TempDir::new("be-file");
    for engine in ENGINES {
        let p = make_file(&dir, "shrink.img", 1 << 20);
        std::fs::write(&p, vec![0x11u8; 1 << 20]).unwrap();
        let o = opts(DirectIo::Never, Some(engine));
        let Some(b) = open(&p, &o, "short_reads_continue_then_fail_cleanly") else {
            continue;
        };
        // Someone truncates the file under us: reads past the new end must
        // fail (never return stale zeroes as success), reads before it work.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&p)
            .unwrap()
            .set_len(512 * 1024 + 100)
            .unwrap();
        let mut buf = vec![0u8; 8192];
        b.read_at(&mut buf, 512 * 1024 - 4096).unwrap_err();
        let e = b.read_at(&mut buf, 768 * 1024).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof, "{e}");
        assert!(e.to_string().starts_with("Short read at offset"), "{e}");
        b.read_at(&mut buf, 0).unwrap();
        assert!(buf.iter().all(|&x| x == 0x11));
    }
}
