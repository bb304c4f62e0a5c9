//! The fuzz targets' entry points (`nbd::internal::fuzzing`) on stable
//! Rust: every seed under `fuzz/seeds/nbd_*` runs through them, and the
//! sessions they play reach the server's option and transmission phases.

use std::sync::Arc;

use backend::MemBackend;
use datapath::{Engine, EngineConfig, Volume};
use nbd::internal::fuzzing;
use nbd::proto;
use nbd::{TlsConfig, TlsMode};
use ucrypt_nbd as nbd;

fn engine() -> Arc<Engine> {
    let size = 1 << 20;
    let vol = Volume {
        backend: Arc::new(MemBackend::new(size).unwrap()),
        crypt: None,
        data_offset: 0,
        size,
        sector_size: 512,
    };
    Arc::new(Engine::new(vol, EngineConfig::default()).unwrap())
}

fn seeds(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/seeds")
        .join(target);
    let mut v: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let p = e.unwrap().path();
            (p.display().to_string(), std::fs::read(&p).unwrap())
        })
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no seeds in {}", dir.display());
    v
}

#[test]
fn option_seeds_run_and_are_answered() {
    let e = engine();
    let psk = testutil::TempDir::new("nbd-fuzz-entry");
    let f = psk.join("k.psk");
    std::fs::write(&f, "fuzz:000102030405060708090a0b0c0d0e0f\n").unwrap();
    let tls = TlsConfig::psk(TlsMode::Require, &f).unwrap();
    for (name, data) in seeds("nbd_options") {
        let out = fuzzing::session(&e, &tls, &data);
        assert!(out.starts_with(b"NBDMAGIC"), "{name}: no greeting");
        assert!(out.len() > 18, "{name}: no option answered");
    }
    // Under require, the seed's LIST is refused with TLS_REQD.
    let out = fuzzing::session(
        &e,
        &tls,
        &std::fs::read(seeds_dir().join("nbd_options/require")).unwrap(),
    );
    let rep = u32::from_be_bytes(out[18 + 12..18 + 16].try_into().unwrap());
    assert_eq!(rep, proto::REP_ERR_TLS_REQD);
    assert!(fuzzing::session(&e, &tls, &[]).is_empty());
}

fn seeds_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds")
}

#[test]
fn transmission_seeds_reach_the_engine() {
    let e = engine();
    for (name, data) in seeds("nbd_transmission") {
        let out = fuzzing::transmission(&e, &data);
        assert!(!out.is_empty(), "{name}: nothing sent");
    }
    // The write seed: its write, flush and read are answered with success
    // (in order: without a cipher the engine completes inline) and the
    // read returns what was written.
    let data = std::fs::read(seeds_dir().join("nbd_transmission/write_fua_flush")).unwrap();
    let out = fuzzing::transmission(&e, &data);
    let mut want = Vec::new();
    for cookie in 1..=3 {
        want.extend_from_slice(&proto::simple_reply(0, cookie));
    }
    want.extend_from_slice(&[0xaa; 512]);
    assert!(out.ends_with(&want), "replies to the write seed");
}

/// A request header as the client sends it.
fn request(kind: u16, cookie: u64, offset: u64, len: u32) -> [u8; proto::REQUEST_LEN] {
    proto::RequestHeader {
        flags: 0,
        kind,
        cookie,
        offset,
        len,
    }
    .encode()
}

#[test]
fn sessions_larger_than_the_socket_come_back_whole() {
    // Replies (16 MiB of reads) and, in the second input, a request (a
    // 1 MiB write) far larger than any socket buffer: the entry point must
    // drain replies while the server sends and feed what did not fit up
    // front, from several sessions at once, and lose nothing.
    let e = engine();
    let reads = 16u64;
    let mut big_replies = vec![0u8];
    for cookie in 1..=reads {
        big_replies.extend_from_slice(&request(proto::CMD_READ, cookie, 0, 1 << 20));
    }
    let mut big_request = vec![0u8];
    big_request.extend_from_slice(&request(proto::CMD_WRITE, 1, 0, 1 << 20));
    big_request.extend_from_slice(&[0x5a; 1 << 20]);
    big_request.extend_from_slice(&request(proto::CMD_READ, 2, 4096, 512));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (e, a, b) = (Arc::clone(&e), big_replies.clone(), big_request.clone());
            std::thread::spawn(move || {
                (fuzzing::transmission(&e, &a), fuzzing::transmission(&e, &b))
            })
        })
        .collect();
    for t in threads {
        let (a, b) = t.join().unwrap();
        let each = 16 + (1 << 20);
        let tail = &a[a.len() - reads as usize * each..];
        for (i, rep) in tail.chunks(each).enumerate() {
            assert_eq!(
                &rep[..4],
                &proto::SIMPLE_REPLY_MAGIC.to_be_bytes(),
                "reply {i}"
            );
            assert_eq!(&rep[4..8], &[0; 4], "reply {i} failed");
        }
        let mut want = proto::simple_reply(0, 1).to_vec();
        want.extend_from_slice(&proto::simple_reply(0, 2));
        want.extend_from_slice(&[0x5a; 512]);
        assert!(b.ends_with(&want), "the write's and the read's replies");
    }
}
