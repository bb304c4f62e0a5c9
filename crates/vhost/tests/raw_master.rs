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

use std::fs::File;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backend::MemBackend;
use datapath::{CryptMode, Engine, EngineConfig, Volume};
use ucrypt_vhost::{Options, Server};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_bindings::virtio_blk::{VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::{split::Descriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Address, Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::EventFd;

type Mem = GuestMemoryMmap<()>;

const MEM_SIZE: usize = 4 << 20;
const QSIZE: u16 = 16;
/// Rings of queue `q` start at `q * RINGS`.
const RINGS: u64 = 0x1_0000;
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

/// Shared guest memory: a file both sides map.
fn guest_memory(dir: &testutil::TempDir) -> Mem {
    let f = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(dir.join("guest.mem"))
        .unwrap();
    f.set_len(MEM_SIZE as u64).unwrap();
    GuestMemoryMmap::from_ranges_with_files(&[(
        GuestAddress(0),
        MEM_SIZE,
        Some(FileOffset::new(f, 0)),
    )])
    .unwrap()
}

/// A connected master with REPLY_ACK on and the memory table sent.
fn connect(sock: &std::path::Path, mem: &Mem) -> Frontend {
    // Tell the master there are 8 queues, so that it does not refuse the
    // bad index itself before the server sees it.
    let mut m = Frontend::connect(sock, 8).unwrap();
    m.set_owner().unwrap();
    let offered = m.get_features().unwrap();
    let want = (1u64 << VIRTIO_F_VERSION_1) | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
    assert_eq!(offered & want, want);
    m.set_features(want).unwrap();
    let pf = m.get_protocol_features().unwrap();
    assert!(pf.contains(VhostUserProtocolFeatures::REPLY_ACK));
    m.set_protocol_features(
        VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::CONFIG,
    )
    .unwrap();
    m.set_hdr_flags(vhost::vhost_user::message::VhostUserHeaderFlag::NEED_REPLY);
    let regions: Vec<_> = mem
        .iter()
        .map(|r| VhostUserMemoryRegionInfo::from_guest_region(r).unwrap())
        .collect();
    m.set_mem_table(&regions).unwrap();
    m
}

/// The master's virtual address of guest address `gpa`.
fn va(mem: &Mem, gpa: u64) -> u64 {
    mem.get_host_address(GuestAddress(gpa)).unwrap() as u64
}

/// Sets up queue `q` with fresh eventfds; returns (kick, call).
fn start_queue(m: &mut Frontend, mem: &Mem, q: usize) -> (EventFd, EventFd) {
    let mq = MockSplitQueue::create(mem, GuestAddress(q as u64 * RINGS), QSIZE);
    let cfg = VringConfigData {
        queue_max_size: QSIZE,
        queue_size: QSIZE,
        flags: 0,
        desc_table_addr: va(mem, mq.desc_table_addr().0),
        used_ring_addr: va(mem, mq.used_addr().0),
        avail_ring_addr: va(mem, mq.avail_addr().0),
        log_addr: None,
    };
    let kick = EventFd::new(0).unwrap();
    let call = EventFd::new(libc::EFD_NONBLOCK).unwrap();
    m.set_vring_num(q, QSIZE).unwrap();
    m.set_vring_addr(q, &cfg).unwrap();
    m.set_vring_base(q, 0).unwrap();
    m.set_vring_call(q, &call).unwrap();
    m.set_vring_kick(q, &kick).unwrap();
    m.set_vring_enable(q, true).unwrap();
    (kick, call)
}

/// Puts one request (header, data, status) on queue `q`, kicks, and
/// waits (generously) for the used ring to move; returns the status.
fn request(mem: &Mem, q: usize, kick: &EventFd, typ: u32, sector: u64, len: u32) -> u8 {
    let mq = MockSplitQueue::create(mem, GuestAddress(q as u64 * RINGS), QSIZE);
    let mut h = [0u8; 16];
    h[..4].copy_from_slice(&typ.to_le_bytes());
    h[8..].copy_from_slice(&sector.to_le_bytes());
    mem.write_slice(&h, GuestAddress(HDR)).unwrap();
    mem.write_obj(0xEEu8, GuestAddress(STATUS)).unwrap();
    let data_flags = if typ == VIRTIO_BLK_T_IN {
        VRING_DESC_F_WRITE
    } else {
        0
    };
    let next = VRING_DESC_F_NEXT as u16;
    let descs = [
        RawDescriptor::from(Descriptor::new(HDR, 16, next, 1)),
        RawDescriptor::from(Descriptor::new(DATA, len, data_flags as u16 | next, 2)),
        RawDescriptor::from(Descriptor::new(STATUS, 1, VRING_DESC_F_WRITE as u16, 0)),
    ];
    let used_before: u16 = mem.read_obj(mq.used_addr().unchecked_add(2)).unwrap();
    // The avail ring's index is the mock's: it starts from what is in
    // guest memory, so successive requests append.
    mq.add_desc_chains(&descs, 0).unwrap();
    kick.write(1).unwrap();
    let t0 = Instant::now();
    loop {
        let used: u16 = mem.read_obj(mq.used_addr().unchecked_add(2)).unwrap();
        if used != used_before {
            break;
        }
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
    let mq = MockSplitQueue::create(&mem, GuestAddress(0), QSIZE);
    let next = VRING_DESC_F_NEXT as u16;
    let write = VRING_DESC_F_WRITE as u16;
    let mut descs = Vec::new();
    for i in 0..N {
        let (hdr, status) = (HDR + u64::from(i) * 16, STATUS + u64::from(i));
        let mut h = [0u8; 16];
        h[..4].copy_from_slice(&VIRTIO_BLK_T_IN.to_le_bytes());
        h[8..].copy_from_slice(&(u64::from(i) * u64::from(len) / 512).to_le_bytes());
        mem.write_slice(&h, GuestAddress(hdr)).unwrap();
        mem.write_obj(0xEEu8, GuestAddress(status)).unwrap();
        let (d, data) = (3 * i, BATCH_DATA + u64::from(i) * u64::from(len));
        descs.extend([
            RawDescriptor::from(Descriptor::new(hdr, 16, next, d + 1)),
            RawDescriptor::from(Descriptor::new(data, len, write | next, d + 2)),
            RawDescriptor::from(Descriptor::new(status, 1, write, 0)),
        ]);
    }
    mq.add_desc_chains(&descs, 0).unwrap();
    kick.write(1).unwrap();
    let t0 = Instant::now();
    while mem
        .read_obj::<u16>(mq.used_addr().unchecked_add(2))
        .unwrap()
        != N
    {
        assert!(t0.elapsed() < Duration::from_secs(30), "no completion");
        std::thread::sleep(Duration::from_millis(1));
    }
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
