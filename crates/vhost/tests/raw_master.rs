//! A raw vhost-user master (the `vhost` crate's `Frontend`) driving the
//! server message by message, to send what no well-behaved hypervisor
//! does: vring messages for a queue index the device does not have.
//!
//! The index comes from the hypervisor, not the guest. The server refuses
//! it (a NACK under REPLY_ACK); rust-vmm's request loop then ends that
//! connection, and the server goes on serving: the next connection gets
//! both queues, and its requests complete with the right data.
//!
//! The same master checks interrupt coalescing: a batch of requests that
//! complete on their queue's thread raises one interrupt, not one each.

use std::sync::Arc;
use std::time::{Duration, Instant};

use backend::MemBackend;
use datapath::{CryptMode, Engine, EngineConfig, Volume};
use ucrypt_vhost::{Options, Server};
use vhost::VhostBackend;
use virtio_bindings::virtio_blk::{VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

mod common;
use common::master::{self, Mem, RINGS};

const MEM_SIZE: usize = 4 << 20;
const QSIZE: u16 = 16;
const HDR: u64 = 0x10_0000;
const DATA: u64 = 0x10_1000;
const STATUS: u64 = 0x12_0000;

fn serve(dir: &testutil::TempDir, mode: CryptMode) -> (Server, Arc<Engine>) {
    let vol = Volume {
        backend: Arc::new(MemBackend::new(1 << 20).unwrap()),
        crypt: None,
        data_offset: 0,
        size: 1 << 20,
        sector_size: 512,
    };
    let cfg = EngineConfig {
        mode,
        ..EngineConfig::default()
    };
    let engine = Arc::new(Engine::new(vol, cfg).unwrap());
    let mut opts = Options::new(dir.join("vhost.sock"));
    opts.num_queues = 2;
    (Server::start(Arc::clone(&engine), &opts).unwrap(), engine)
}

fn guest_memory(dir: &testutil::TempDir) -> Mem {
    master::guest_memory(&dir.join("guest.mem"), MEM_SIZE)
}

/// A connected master. It is told there are 8 queues, so that it does not
/// refuse the bad index itself before the server sees it.
fn connect(sock: &std::path::Path, mem: &Mem) -> vhost::vhost_user::Frontend {
    master::connect(sock, mem, 8)
}

fn start_queue(m: &mut vhost::vhost_user::Frontend, mem: &Mem, q: usize) -> (EventFd, EventFd) {
    let (_ring, kick, call) = master::start_queue(m, mem, q, QSIZE);
    (kick, call)
}

/// Puts one request (header, data, status) on queue `q`, kicks, and
/// waits (generously) for the used ring to move; returns the status.
fn request(mem: &Mem, q: usize, kick: &EventFd, typ: u32, sector: u64, len: u32) -> u8 {
    let ring = master::ring(q, QSIZE);
    master::header(mem, HDR, typ, sector);
    mem.write_obj(0xEEu8, GuestAddress(STATUS)).unwrap();
    let descs = master::chain(0, HDR, DATA, len, typ == VIRTIO_BLK_T_IN, STATUS);
    let used_before = ring.used_index(mem);
    ring.add_chains(mem, &descs, 0);
    kick.write(1).unwrap();
    let t0 = Instant::now();
    while ring.used_index(mem) == used_before {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "queue {q}: no completion"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    mem.read_obj(GuestAddress(STATUS)).unwrap()
}

#[test]
fn bad_queue_index_is_refused_and_the_server_serves_on() {
    let dir = testutil::TempDir::new("vhost-raw");
    let (server, engine) = serve(&dir, CryptMode::Classic);
    let mem = guest_memory(&dir);

    // First connection: queue 0 works, then a vring message for queue 5
    // of a 2-queue device is refused.
    let mut m = connect(server.socket(), &mem);
    let (kick0, _call0) = start_queue(&mut m, &mem, 0);
    mem.write_slice(&[0xA5u8; 4096], GuestAddress(DATA))
        .unwrap();
    assert_eq!(request(&mem, 0, &kick0, VIRTIO_BLK_T_OUT, 8, 4096), 0);
    assert!(
        m.set_vring_num(5, QSIZE).is_err(),
        "SET_VRING_NUM for queue 5 of 2 must be refused"
    );
    let kick5 = EventFd::new(0).unwrap();
    // rust-vmm ends the connection after a refused message: further
    // messages fail instead of reaching a queue that does not exist.
    assert!(m.set_vring_kick(5, &kick5).is_err());
    drop(m);

    // The server is still up: a new connection serves both queues.
    // The listening socket queues the connection until the accept
    // thread takes it.
    let mut m = connect(server.socket(), &mem);
    // Fresh rings for the new connection.
    mem.write_slice(&vec![0u8; 2 * RINGS as usize], GuestAddress(0))
        .unwrap();
    let (_kick0, _c0) = start_queue(&mut m, &mem, 0);
    let (kick1, _c1) = start_queue(&mut m, &mem, 1);
    mem.write_slice(&[0u8; 4096], GuestAddress(DATA)).unwrap();
    assert_eq!(request(&mem, 1, &kick1, VIRTIO_BLK_T_IN, 8, 4096), 0);
    let mut back = vec![0u8; 4096];
    mem.read_slice(&mut back, GuestAddress(DATA)).unwrap();
    assert!(
        back.iter().all(|&b| b == 0xA5),
        "queue 1 read the wrong data"
    );
    assert_eq!(engine.read(4096, 4096).unwrap(), vec![0xA5; 4096]);
    drop(m);
    server.shutdown();
}

/// Where the coalescing test's reads land (past the other buffers).
const BATCH_DATA: u64 = 0x20_0000;

/// Makes `N` reads of `len` bytes available on a fresh queue 0 of an
/// inline engine's server (every request completes on the queue thread
/// that starts it), kicks once, so the queue thread starts them as one
/// batch, and returns the interrupts the batch raised.
fn batch_interrupts(len: u32, expected: u64) -> u64 {
    // Three descriptors each, in a 16-entry table.
    const N: u16 = 5;
    let dir = testutil::TempDir::new("vhost-coalesce");
    let (server, _engine) = serve(&dir, CryptMode::Inline);
    let mem = guest_memory(&dir);
    let mut m = connect(server.socket(), &mem);
    let (kick, call) = start_queue(&mut m, &mem, 0);
    let ring = master::ring(0, QSIZE);
    let mut descs = Vec::new();
    for i in 0..N {
        let (hdr, status) = (HDR + u64::from(i) * 16, STATUS + u64::from(i));
        master::header(
            &mem,
            hdr,
            VIRTIO_BLK_T_IN,
            u64::from(i) * u64::from(len) / 512,
        );
        mem.write_obj(0xEEu8, GuestAddress(status)).unwrap();
        let data = BATCH_DATA + u64::from(i) * u64::from(len);
        descs.extend(master::chain(3 * i, hdr, data, len, true, status));
    }
    ring.add_chains(&mem, &descs, 0);
    kick.write(1).unwrap();
    let t0 = Instant::now();
    assert!(
        ring.wait_used(&mem, N, Duration::from_secs(30)),
        "no completion"
    );
    for i in 0..N {
        let s: u8 = mem.read_obj(GuestAddress(STATUS + u64::from(i))).unwrap();
        assert_eq!(s, 0, "request {i} failed");
    }
    // The interrupt follows the used ring's update: wait for the ones
    // expected (a loaded machine may take a while), then let any extra
    // one still on its way land.
    let mut n = 0;
    while n < expected && t0.elapsed() < Duration::from_secs(30) {
        n += call.read().unwrap_or(0);
        std::thread::sleep(Duration::from_millis(1));
    }
    std::thread::sleep(Duration::from_millis(100));
    n += call.read().unwrap_or(0);
    drop(m);
    server.shutdown();
    n
}

#[test]
fn small_requests_completed_on_their_queue_thread_interrupt_once_per_batch() {
    assert_eq!(batch_interrupts(4096, 1), 1, "5 x 4 KiB in one batch");
}

#[test]
fn large_requests_interrupt_each() {
    // 64 KiB and up: the guest hears of each at once, to refill its queue.
    assert_eq!(batch_interrupts(64 << 10, 5), 5, "5 x 64 KiB in one batch");
}
