//! The library without the binary: serve a plain volume in-process, talk
//! to it through the typed control client, close it.

use std::sync::mpsc;
use std::time::Duration;

use datapath::{CryptMode, PerfFlags};
use ucrypt_daemon::control::{self, ExportKind, Flags};
use ucrypt_daemon::resolve::{self, VolumeType};
use ucrypt_daemon::{ErrorKind, ExportSpec, Spec};

const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
                   f0e1d2c3b4a5968778695a4b3c2d1e0fffeeddccbbaa99887766554433221100";
const T: Duration = Duration::from_secs(10);

#[test]
fn serve_status_refresh_table_close() {
    let dir = testutil::TempDir::new("daemon-life");
    // The only test in this binary: the runtime dir can be process-wide.
    std::env::set_var("UCRYPT_RUNTIME_DIR", dir.join("run"));
    let img = dir.join("vol.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let line = format!(
        "0 2048 crypt aes-xts-plain64 {KEY} 0 {} 0 1 no_read_workqueue",
        img.display()
    );
    let mut table = resolve::plain_targets(&line).unwrap();
    let engine = resolve::engine_config(
        &mut table,
        CryptMode::Inline,
        PerfFlags {
            same_cpu_crypt: true,
            ..PerfFlags::default()
        },
        true,
        false,
    );
    let spec = Spec {
        name: "life".into(),
        volume_type: VolumeType::Plain,
        table,
        export: ExportSpec::NbdUnix(None),
        tls: Default::default(),
        engine,
        io_engine: backend::IoEngine::Syscalls,
        direct: backend::DirectIo::Never,
        header: None,
        lock: None,
        access: luks::DeviceAccess::default(),
    };
    let (tx, rx) = mpsc::channel();
    let server =
        std::thread::spawn(move || ucrypt_daemon::run(spec, |p| tx.send(p.clone()).unwrap()));
    let ready = rx.recv_timeout(Duration::from_secs(60)).expect("ready");
    assert_eq!(ready.name, "life");
    assert_eq!(ready.export, ExportKind::Nbd);
    assert_eq!(ready.pid, std::process::id());
    assert!(
        ready.endpoint.ends_with("/run/life.nbd.sock"),
        "{}",
        ready.endpoint
    );
    assert_eq!(control::ping("life", T).unwrap(), ready);
    // The daemon holds the key: it made its process non-dumpable.
    assert!(!nix::sys::prctl::get_dumpable().unwrap());

    let s = control::status("life", T).unwrap();
    assert_eq!(s.ping, ready);
    assert_eq!(s.volume_type, VolumeType::Plain);
    assert_eq!(
        (s.keysize_bits, s.size_sectors, s.sector_size),
        (512, 2048, 512)
    );
    assert_eq!(s.mode, CryptMode::Inline);
    assert!(s.allow_discards && !s.read_only);
    assert_eq!(
        control::flag_words(s.allow_discards, &s.flags),
        ["discards", "same_cpu_crypt", "no_read_workqueue"]
    );
    assert_eq!(s.nbd.map(|n| n.connections), Some(0));

    let masked = control::table("life", false, T).unwrap();
    let masked = masked.as_str().unwrap();
    assert!(
        !masked.contains(KEY) && masked.contains(&"0".repeat(128)),
        "{masked}"
    );
    let shown = control::table("life", true, T).unwrap();
    assert!(shown.as_str().unwrap().contains(KEY));
    assert!(
        shown.is_locked(),
        "the client holds the line in locked memory"
    );

    let r = control::refresh("life", Some(CryptMode::Adaptive), Flags::default(), T).unwrap();
    assert_eq!(
        (r.mode, r.flags, r.allow_discards),
        (CryptMode::Adaptive, Flags::default(), true)
    );
    let s = control::status("life", T).unwrap();
    assert_eq!((s.mode, s.stats.reconfigurations), (CryptMode::Adaptive, 1));
    assert!(!control::table("life", false, T)
        .unwrap()
        .as_str()
        .unwrap()
        .contains("no_read_workqueue"));

    control::close("life", T).unwrap();
    server.join().unwrap().unwrap();
    let e = control::status("life", T).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotActive);
    assert_eq!(e.to_string(), "Device life is not active.");
    assert!(!dir.join("run/life.pid").exists());
    assert!(!dir.join("run/life.ctl.sock").exists());
}
