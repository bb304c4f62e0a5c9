//! What the NBD targets share: one engine over a 1 MiB mem backend (no
//! cipher, so requests complete inline and runs are deterministic) and a
//! PSK TLS configuration for `--tls=require` sessions.

use std::sync::{Arc, OnceLock};

use backend::MemBackend;
use datapath::{Engine, EngineConfig, Volume};
use nbd::{TlsConfig, TlsMode};

pub fn setup() -> (&'static Arc<Engine>, &'static TlsConfig) {
    static STATE: OnceLock<(Arc<Engine>, TlsConfig)> = OnceLock::new();
    let (e, t) = STATE.get_or_init(|| {
        // libFuzzer's main does not ignore SIGPIPE as Rust's does; a
        // server writing to a client that already left must get EPIPE.
        // SAFETY: called once, before any thread of ours exists; SIG_IGN
        // is a valid disposition for SIGPIPE.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_IGN) };
        let size = 1 << 20;
        let vol = Volume {
            backend: Arc::new(MemBackend::new(size).expect("mem backend")),
            crypt: None,
            data_offset: 0,
            size,
            sector_size: 512,
        };
        let engine = Arc::new(Engine::new(vol, EngineConfig::default()).expect("engine"));
        let psk = std::env::temp_dir().join(format!("ucrypt-fuzz-{}.psk", std::process::id()));
        std::fs::write(&psk, "fuzz:000102030405060708090a0b0c0d0e0f\n").expect("psk file");
        let tls = TlsConfig::psk(TlsMode::Require, &psk).expect("psk config");
        let _ = std::fs::remove_file(&psk);
        (engine, tls)
    });
    (e, t)
}
