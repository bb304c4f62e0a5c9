//! End to end through the kernel: needs ublk_drv (`/dev/ublk-control`).
//!
//! Without it the test skips as a kernel limit (testutil::skip_kernel), even
//! in CI: the missing piece is a kernel feature, not a tool CI could install.
//! The no-driver error path can only be seen where the driver is absent, so
//! that test skips (as a kernel condition) where it is loaded.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::sync::{mpsc, Arc};
use std::time::Duration;

use backend::MemBackend;
use datapath::{Engine, EngineConfig, Volume};
use ucrypt_ublk::{serve_with, stop, Options, CONTROL_PATH};

#[test]
fn serves_engine_as_block_device() {
    const T: &str = "serves_engine_as_block_device";
    if !testutil::require(T, testutil::Capability::UblkDriver) {
        return;
    }
    let size = 16u64 << 20;
    let vol = Volume {
        backend: Arc::new(MemBackend::new(size).unwrap()),
        crypt: None,
        data_offset: 0,
        size,
        sector_size: 512,
    };
    let engine = Arc::new(Engine::new(vol, EngineConfig::default()).unwrap());
    let (tx, rx) = mpsc::channel();
    let e2 = engine.clone();
    let server = std::thread::spawn(move || {
        serve_with(e2, &Options::default(), move |d| tx.send(d).unwrap())
    });
    let dev = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("device did not come up");

    let data: Vec<u8> = (0..1u32 << 20).map(|i| (i * 7 + 3) as u8).collect();
    {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(&dev.path)
            .unwrap();
        f.write_all_at(&data, 4096).unwrap();
        f.sync_all().unwrap();
    }
    // What the kernel wrote reached the engine...
    assert_eq!(engine.read(4096, data.len() as u32).unwrap(), data);
    // ...and what the engine holds is what the device reads.
    engine.write(8 << 20, vec![0x5A; 65536], false).unwrap();
    let f = OpenOptions::new().read(true).open(&dev.path).unwrap();
    let mut back = vec![0u8; 65536];
    f.read_exact_at(&mut back, 8 << 20).unwrap();
    assert!(back.iter().all(|&b| b == 0x5A));
    drop(f);

    stop(dev.id).unwrap();
    server.join().unwrap().unwrap();
}

fn small_engine() -> Arc<Engine> {
    let size = 1u64 << 20;
    let vol = Volume {
        backend: Arc::new(MemBackend::new(size).unwrap()),
        crypt: None,
        data_offset: 0,
        size,
        sector_size: 512,
    };
    Arc::new(Engine::new(vol, EngineConfig::default()).unwrap())
}

#[test]
fn bad_options_are_refused_before_the_kernel_is_asked() {
    use ucrypt_ublk::{serve, ErrorKind};
    let bad = Options {
        max_io_bytes: 1000,
        ..Options::default()
    };
    let e = serve(small_engine(), &bad).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::InvalidOptions(_)), "{e}");
    assert!(e.to_string().starts_with("Invalid ublk options"), "{e}");
}

#[test]
fn without_driver_serve_fails_clearly() {
    use ucrypt_ublk::{serve, ErrorKind};
    const T: &str = "without_driver_serve_fails_clearly";
    if ucrypt_ublk::available() {
        testutil::skip_kernel(
            T,
            "ublk_drv is loaded here, so the no-driver error cannot occur",
        );
        return;
    }
    let engine = small_engine();
    let e = serve(engine.clone(), &Options::default()).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Unavailable(CONTROL_PATH));
    assert!(
        e.to_string()
            .starts_with("Cannot serve ublk: /dev/ublk-control not found"),
        "{e}"
    );
    assert!(matches!(
        stop(0).unwrap_err().kind(),
        ErrorKind::Unavailable(_)
    ));
}

#[test]
fn stop_if_idle_refuses_a_device_in_use() {
    use std::os::unix::fs::OpenOptionsExt;
    use ucrypt_ublk::{stop_if_idle, ErrorKind};
    const T: &str = "stop_if_idle_refuses_a_device_in_use";
    if !testutil::require(T, testutil::Capability::UblkDriver) {
        return;
    }
    let size = 4u64 << 20;
    let vol = Volume {
        backend: Arc::new(MemBackend::new(size).unwrap()),
        crypt: None,
        data_offset: 0,
        size,
        sector_size: 512,
    };
    let engine = Arc::new(Engine::new(vol, EngineConfig::default()).unwrap());
    let (tx, rx) = mpsc::channel();
    let server = std::thread::spawn(move || {
        serve_with(engine, &Options::default(), move |d| tx.send(d).unwrap())
    });
    let dev = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("device did not come up");
    // An exclusive open is what a mount holds.
    let held = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(&dev.path)
        .unwrap();
    let e = stop_if_idle(dev.id).unwrap_err();
    assert_eq!(e.kind(), &ErrorKind::Busy(dev.path.clone()), "{e}");
    // Still serving: the device reads.
    let mut b = [0u8; 512];
    held.read_exact_at(&mut b, 0).unwrap();
    drop(held);
    stop_if_idle(dev.id).unwrap();
    server.join().unwrap().unwrap();
    assert!(!dev.path.exists() || std::fs::File::open(&dev.path).is_err());
}
