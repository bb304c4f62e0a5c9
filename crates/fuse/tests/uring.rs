//! The FUSE export over both transports: FUSE over io_uring (the
//! `fuse` module's `enable_uring` turned on for the test and restored)
//! and /dev/fuse. Data written through the mount (O_DIRECT, buffered,
//! unaligned, fsync) must read back from the engine byte for byte, and
//! the export must say, and count, which transport carried it.

use std::fs::OpenOptions;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use backend::MemBackend;
use datapath::{Engine, EngineConfig, Volume};
use fuse::{Export, ExportConfig, Transport, UringMode};
use testutil::{Capability, TempDir};
use ucrypt_fuse as fuse;

const PARAM: &str = "/sys/module/fuse/parameters/enable_uring";
const SIZE: u64 = 8 << 20;

/// Sets `enable_uring` for one test and puts the old value back; tests
/// that touch it run one at a time.
struct Param {
    old: String,
    _one: MutexGuard<'static, ()>,
}

static ONE: Mutex<()> = Mutex::new(());

impl Param {
    /// `None` (the test skips) when the parameter cannot be set.
    fn set(test: &str, on: bool) -> Option<Self> {
        let one = ONE.lock().unwrap_or_else(|e| e.into_inner());
        if !testutil::require_all(test, &[Capability::DevFuse, Capability::IoUring]) {
            return None;
        }
        let Ok(old) = std::fs::read_to_string(PARAM) else {
            testutil::skip_kernel(test, "the fuse module has no enable_uring parameter");
            return None;
        };
        if std::fs::write(PARAM, if on { "1" } else { "0" }).is_err() {
            testutil::skip(test, "cannot set enable_uring (needs root)");
            return None;
        }
        Some(Self {
            old: old.trim().to_owned(),
            _one: one,
        })
    }
}

impl Drop for Param {
    fn drop(&mut self) {
        let v = if self.old == "Y" { "1" } else { "0" };
        std::fs::write(PARAM, v).expect("restore enable_uring");
    }
}

fn engine() -> Arc<Engine> {
    let vol = Volume {
        backend: Arc::new(MemBackend::new(SIZE).expect("mem backend")),
        crypt: None,
        data_offset: 0,
        size: SIZE,
        sector_size: 512,
    };
    Arc::new(Engine::new(vol, EngineConfig::default()).expect("engine"))
}

fn mount(engine: &Arc<Engine>, dir: &TempDir, uring: UringMode) -> Result<Export, fuse::Error> {
    let mnt = dir.join("mnt");
    let _ = std::fs::create_dir(&mnt);
    let cfg = ExportConfig {
        file_name: "disk".into(),
        threads: 2,
        uring,
    };
    Export::mount(engine.clone(), &mnt, cfg)
}

/// A 4 KiB-aligned buffer for O_DIRECT.
fn aligned(len: usize, fill: u8) -> (Vec<u8>, usize) {
    let v = vec![fill; len + 4096];
    let at = (4096 - (v.as_ptr() as usize % 4096)) % 4096;
    (v, at)
}

/// Writes through the mount in every way the export handles and checks
/// the engine holds exactly what a model of the file holds.
fn exercise(file: &Path, engine: &Engine) {
    let mut model = vec![0u8; SIZE as usize];
    let mut rng = testutil::Rng::new(0x5eed);
    // O_DIRECT, aligned, several sizes.
    {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(file)
            .expect("open O_DIRECT");
        for (off, len) in [(0u64, 4096usize), (65536, 65536), (1 << 20, 1 << 20)] {
            let (mut buf, at) = aligned(len, 0);
            rng.fill(&mut buf[at..at + len]);
            f.write_all_at(&buf[at..at + len], off)
                .expect("direct write");
            model[off as usize..off as usize + len].copy_from_slice(&buf[at..at + len]);
            let (mut back, bt) = aligned(len, 0);
            f.read_exact_at(&mut back[bt..bt + len], off)
                .expect("direct read");
            assert_eq!(
                back[bt..bt + len],
                buf[at..at + len],
                "O_DIRECT read back at {off}"
            );
        }
        f.sync_all().expect("fsync");
    }
    // Buffered, unaligned offsets and lengths, O_SYNC, then fsync.
    {
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_SYNC)
            .open(file)
            .expect("open buffered");
        for (off, len) in [(100u64, 7usize), (4090, 300), (3 << 20 | 513, 70_000)] {
            let mut data = vec![0u8; len];
            rng.fill(&mut data);
            f.seek(SeekFrom::Start(off)).expect("seek");
            f.write_all(&data).expect("buffered write");
            model[off as usize..off as usize + len].copy_from_slice(&data);
        }
        f.sync_all().expect("fsync");
        let mut all = Vec::new();
        f.seek(SeekFrom::Start(0)).expect("seek");
        f.read_to_end(&mut all).expect("buffered read");
        if let Some(i) = (0..model.len()).find(|&i| all[i] != model[i]) {
            let stored = engine.read(0, SIZE as u32).expect("engine read");
            panic!(
                "buffered read differs from byte {i}: read {:?} model {:?} engine {:?}",
                &all[i - 4..i + 8],
                &model[i - 4..i + 8],
                &stored[i - 4..i + 8]
            );
        }
    }
    // O_DIRECT with an unaligned length (widened by the kernel or us).
    {
        let f = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(file)
            .expect("open O_DIRECT read");
        let (mut back, bt) = aligned(8192, 0);
        let n = f.read_at(&mut back[bt..bt + 8192], 4 << 20).expect("read");
        assert_eq!(back[bt..bt + n], model[4 << 20..(4 << 20) + n]);
    }
    let stored = engine.read(0, SIZE as u32).expect("engine read");
    assert!(stored == model, "the engine does not hold what was written");
}

fn attr_and_dir(exp: &Export) {
    let meta = std::fs::metadata(exp.file()).expect("stat");
    assert_eq!(meta.len(), SIZE);
    let names: Vec<_> = std::fs::read_dir(exp.mountpoint())
        .expect("readdir")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names, ["disk"]);
    assert!(matches!(
        std::fs::metadata(exp.mountpoint().join("absent")),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound
    ));
}

#[test]
fn the_ring_carries_the_requests_and_the_data_reads_back() {
    let test = "the_ring_carries_the_requests_and_the_data_reads_back";
    let Some(_param) = Param::set(test, true) else {
        return;
    };
    let dir = TempDir::new("fuse-uring");
    let engine = engine();
    let mut exp = mount(&engine, &dir, UringMode::On).expect("mount over io_uring");
    assert_eq!(exp.transport(), Transport::Uring);
    attr_and_dir(&exp);
    let before = exp.ring_requests();
    assert!(
        before > 0,
        "lookup/getattr/readdir did not go over the ring"
    );
    exercise(exp.file(), &engine);
    assert!(
        exp.ring_requests() > before + 10,
        "reads and writes did not go over the ring"
    );
    exp.unmount().expect("unmount");
    assert!(std::fs::read_dir(dir.join("mnt"))
        .expect("mountpoint")
        .next()
        .is_none());
}

#[test]
fn dev_fuse_serves_when_the_ring_is_off() {
    let test = "dev_fuse_serves_when_the_ring_is_off";
    let Some(_param) = Param::set(test, true) else {
        return;
    };
    let dir = TempDir::new("fuse-devfuse");
    let engine = engine();
    let mut exp = mount(&engine, &dir, UringMode::Off).expect("mount over /dev/fuse");
    assert_eq!(exp.transport(), Transport::DevFuse);
    attr_and_dir(&exp);
    exercise(exp.file(), &engine);
    assert_eq!(exp.ring_requests(), 0);
    exp.unmount().expect("unmount");
}

#[test]
fn auto_falls_back_and_on_refuses_when_the_kernel_parameter_is_off() {
    let test = "auto_falls_back_and_on_refuses_when_the_kernel_parameter_is_off";
    let Some(_param) = Param::set(test, false) else {
        return;
    };
    let dir = TempDir::new("fuse-uring-off");
    let engine = engine();
    let e = mount(&engine, &dir, UringMode::On)
        .err()
        .expect("uring=on must fail without enable_uring");
    let msg = format!(
        "{e}: {}",
        std::error::Error::source(&e)
            .map(|s| s.to_string())
            .unwrap_or_default()
    );
    assert!(msg.contains("enable_uring is off"), "{msg}");
    // Nothing stays mounted: the mountpoint is still an empty directory.
    fuse::check_mountpoint(&dir.join("mnt")).expect("mountpoint left as it was");
    let mut exp = mount(&engine, &dir, UringMode::Auto).expect("auto mounts over /dev/fuse");
    assert_eq!(exp.transport(), Transport::DevFuse);
    exercise(exp.file(), &engine);
    assert_eq!(exp.ring_requests(), 0);
    exp.unmount().expect("unmount");
}
