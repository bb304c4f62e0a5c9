//! A guest that queues many maximum-size requests at once: the server
//! holds at most `request::MAX_INFLIGHT_BYTES` of their payloads (the
//! queue thread stops starting chains past it), answers every one of them
//! correctly, and serves on afterwards. Without the cap, every chain's
//! payload would be allocated as it was popped, and the engine admits 128
//! of them: ~4 GiB for one guest.

use std::sync::Arc;
use std::time::Duration;

use backend::{Backend, MemBackend};
use datapath::{CryptMode, Engine, EngineConfig, Volume, MAX_REQUEST_BYTES};
use ucrypt_vhost::request::MAX_INFLIGHT_BYTES;
use ucrypt_vhost::{Options, Server};
use virtio_bindings::virtio_blk::{VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT};
use vm_memory::{Bytes, GuestAddress};

mod common;
use common::master;

/// Every request moves this much: the largest the engine takes.
const LEN: u32 = MAX_REQUEST_BYTES as u32;
/// Chains queued at once: their payloads are 12 × 32 MiB = 384 MiB, six
/// times the cap.
const N: u16 = 12;
const QSIZE: u16 = 64;
/// Headers, then status bytes, then the one data buffer every chain uses.
const HDR: u64 = 0x10_0000;
const STATUS: u64 = 0x11_0000;
const DATA: u64 = 0x20_0000;
const MEM_SIZE: usize = DATA as usize + LEN as usize;

fn run(mode: CryptMode) {
    let dir = testutil::TempDir::new("vhost-cap");
    let size = u64::from(LEN);
    let mem_backend = Arc::new(MemBackend::new(size).unwrap());
    let vol = Volume {
        backend: mem_backend.clone(),
        crypt: None,
        data_offset: 0,
        size,
        sector_size: 512,
    };
    let cfg = EngineConfig {
        mode,
        ..EngineConfig::default()
    };
    let engine = Arc::new(Engine::new(vol, cfg).unwrap());
    let server = Server::start(Arc::clone(&engine), &Options::new(dir.join("vhost.sock"))).unwrap();
    let mem = master::guest_memory(&dir.join("guest.mem"), MEM_SIZE);
    let mut m = master::connect(server.socket(), &mem, 1);
    let (ring, kick, _call) = master::start_queue(&mut m, &mem, 0, QSIZE);

    // N writes of the whole device, all from one guest buffer (a guest
    // needs no memory of its own to make the device hold N payloads).
    let pattern: Vec<u8> = (0..LEN).map(|i| (i / 512) as u8 ^ 0x5a).collect();
    mem.write_slice(&pattern, GuestAddress(DATA)).unwrap();
    master::header(&mem, HDR, VIRTIO_BLK_T_OUT, 0);
    let mut descs = Vec::new();
    for i in 0..N {
        let status = STATUS + u64::from(i);
        mem.write_obj(0xEEu8, GuestAddress(status)).unwrap();
        descs.extend(master::chain(3 * i, HDR, DATA, LEN, false, status));
    }
    ring.add_chains(&mem, &descs, 0);
    kick.write(1).unwrap();
    assert!(
        ring.wait_used(&mem, N, Duration::from_secs(120)),
        "{mode:?}: the capped queue did not drain"
    );
    let statuses: Vec<u8> = (0..N)
        .map(|i| mem.read_obj(GuestAddress(STATUS + u64::from(i))).unwrap())
        .collect();
    assert!(statuses.iter().all(|&s| s == 0), "{mode:?}: {statuses:?}");
    let mut back = vec![0u8; LEN as usize];
    mem_backend.read_at(&mut back, 0).unwrap();
    assert!(
        back == pattern,
        "{mode:?}: the device lacks what was written"
    );

    // N reads of the whole device into that buffer: read buffers count
    // the same way.
    mem.write_slice(&vec![0u8; LEN as usize], GuestAddress(DATA))
        .unwrap();
    master::header(&mem, HDR, VIRTIO_BLK_T_IN, 0);
    let mut descs = Vec::new();
    for i in 0..N {
        let status = STATUS + u64::from(i);
        mem.write_obj(0xEEu8, GuestAddress(status)).unwrap();
        descs.extend(master::chain(3 * i, HDR, DATA, LEN, true, status));
    }
    ring.add_chains(&mem, &descs, 0);
    kick.write(1).unwrap();
    assert!(
        ring.wait_used(&mem, 2 * N, Duration::from_secs(120)),
        "{mode:?}: the capped reads did not drain"
    );
    for i in 0..N {
        let s: u8 = mem.read_obj(GuestAddress(STATUS + u64::from(i))).unwrap();
        assert_eq!(s, 0, "{mode:?}: read {i} failed");
    }
    let mut got = vec![0u8; LEN as usize];
    mem.read_slice(&mut got, GuestAddress(DATA)).unwrap();
    assert!(got == pattern, "{mode:?}: reads returned the wrong data");

    let stats = server.stats();
    assert!(
        stats.inflight_bytes_peak <= MAX_INFLIGHT_BYTES,
        "{mode:?}: {} bytes in flight at once, cap {MAX_INFLIGHT_BYTES}",
        stats.inflight_bytes_peak
    );
    assert_eq!(stats.inflight_bytes, 0, "{mode:?}: bytes still held");
    assert_eq!(stats.queues[0].writes, u64::from(N));
    assert_eq!(stats.queues[0].reads, u64::from(N));
    drop(m);
    server.shutdown();
}

#[test]
fn many_maximum_size_chains_hold_at_most_the_cap_adaptive() {
    run(CryptMode::Adaptive);
}

#[test]
fn many_maximum_size_chains_hold_at_most_the_cap_classic() {
    run(CryptMode::Classic);
}

#[test]
fn many_maximum_size_chains_hold_at_most_the_cap_inline() {
    run(CryptMode::Inline);
}
