//! A raw vhost-user master for tests: guest memory in a file both sides
//! map, the `vhost` crate's `Frontend` sending messages one by one, and
//! split virtqueues written by hand, so a test plays a hypervisor and its
//! guest (well-behaved or not) against a real server.
//!
//! Shared by this crate's tests and the cli's misuse matrix (which
//! includes this file by path and drives a `ucrypt open` daemon with it).
#![allow(dead_code)]

use std::fs::File;
use std::path::Path;
use std::time::{Duration, Instant};

use vhost::vhost_user::message::{
    VhostUserHeaderFlag, VhostUserProtocolFeatures, VhostUserVirtioFeatures,
};
use vhost::vhost_user::{Frontend, VhostUserFrontend};
use vhost::{VhostBackend, VhostUserMemoryRegionInfo, VringConfigData};
use virtio_bindings::virtio_config::VIRTIO_F_VERSION_1;
use virtio_bindings::virtio_ring::{VRING_DESC_F_NEXT, VRING_DESC_F_WRITE};
use virtio_queue::desc::{split::Descriptor, RawDescriptor};
use vm_memory::{Bytes, FileOffset, GuestAddress, GuestMemoryBackend, GuestMemoryMmap};
use vmm_sys_util::eventfd::{EventFd, EFD_NONBLOCK};

/// Guest memory as both sides map it.
pub type Mem = GuestMemoryMmap<()>;

/// The rings of queue `q` start at `q * RINGS` (room for 1024 entries).
pub const RINGS: u64 = 0x1_0000;

/// `size` bytes of shared guest memory at guest address 0: a file at
/// `path` both sides map.
pub fn guest_memory(path: &Path, size: usize) -> Mem {
    let f = File::options()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .expect("guest memory file");
    f.set_len(size as u64).expect("guest memory size");
    GuestMemoryMmap::from_ranges_with_files(&[(GuestAddress(0), size, Some(FileOffset::new(f, 0)))])
        .expect("map guest memory")
}

/// A master connected to `sock` with VERSION_1, REPLY_ACK, MQ and CONFIG
/// negotiated and the memory table sent. `queues`: how many queues the
/// master believes the device has (more than it has lets a test send a
/// bad index the master would otherwise refuse itself).
pub fn connect(sock: &Path, mem: &Mem, queues: u64) -> Frontend {
    let mut m = Frontend::connect(sock, queues).expect("connect to the vhost-user socket");
    m.set_owner().expect("SET_OWNER");
    let offered = m.get_features().expect("GET_FEATURES");
    let want = (1u64 << VIRTIO_F_VERSION_1) | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits();
    assert_eq!(offered & want, want);
    m.set_features(want).expect("SET_FEATURES");
    let pf = m.get_protocol_features().expect("GET_PROTOCOL_FEATURES");
    assert!(pf.contains(VhostUserProtocolFeatures::REPLY_ACK));
    m.set_protocol_features(
        VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::CONFIG,
    )
    .expect("SET_PROTOCOL_FEATURES");
    m.set_hdr_flags(VhostUserHeaderFlag::NEED_REPLY);
    let regions: Vec<_> = mem
        .iter()
        .map(|r| VhostUserMemoryRegionInfo::from_guest_region(r).expect("region"))
        .collect();
    m.set_mem_table(&regions).expect("SET_MEM_TABLE");
    m
}

/// The master's virtual address of guest address `gpa`.
pub fn va(mem: &Mem, gpa: u64) -> u64 {
    mem.get_host_address(GuestAddress(gpa))
        .expect("guest address") as u64
}

/// A split virtqueue in guest memory, laid out as virtio-queue's mock
/// lays it out (descriptor table, then the avail ring, then the used ring
/// 4-aligned), at `q * RINGS`. Unlike the mock, it keeps the rings'
/// indices as they are in guest memory (`MockSplitQueue::create` resets
/// them to 0), so chains added one after another append.
#[derive(Debug, Clone, Copy)]
pub struct Ring {
    /// Guest address of the descriptor table.
    pub desc: u64,
    /// Guest address of the avail ring.
    pub avail: u64,
    /// Guest address of the used ring.
    pub used: u64,
    /// Entries.
    pub size: u16,
}

/// Queue `q`'s ring of `size` entries (nothing is written).
pub fn ring(q: usize, size: u16) -> Ring {
    let desc = q as u64 * RINGS;
    let avail = desc + 16 * u64::from(size);
    // flags, idx, ring[size], used_event; then 4-aligned.
    let used = (avail + 4 + 2 * u64::from(size) + 2 + 3) & !3;
    Ring {
        desc,
        avail,
        used,
        size,
    }
}

impl Ring {
    /// Writes `descs` into the descriptor table from entry `first` on and
    /// makes every chain head among them available (a head: the first
    /// descriptor, or one whose predecessor has no NEXT flag).
    pub fn add_chains(&self, mem: &Mem, descs: &[RawDescriptor], first: u16) {
        let idx_at = GuestAddress(self.avail + 2);
        let mut idx: u16 = mem.read_obj(idx_at).expect("avail index");
        let mut after_next = false;
        for (i, d) in descs.iter().enumerate() {
            let n = first + i as u16;
            mem.write_obj(*d, GuestAddress(self.desc + 16 * u64::from(n)))
                .expect("descriptor");
            if !after_next {
                let slot = self.avail + 4 + 2 * u64::from(idx % self.size);
                mem.write_obj(n, GuestAddress(slot)).expect("avail entry");
                idx = idx.wrapping_add(1);
            }
            after_next = Descriptor::from(*d).flags() & VRING_DESC_F_NEXT as u16 != 0;
        }
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        mem.write_obj(idx, idx_at).expect("avail index");
    }

    /// The used ring's index: how many chains the device has answered
    /// since the queue started (mod 2^16).
    pub fn used_index(&self, mem: &Mem) -> u16 {
        mem.read_obj(GuestAddress(self.used + 2))
            .expect("used index")
    }

    /// Waits until the used index reaches `want`, at most `limit` (a
    /// liveness bound, not a speed test); false if it did not.
    pub fn wait_used(&self, mem: &Mem, want: u16, limit: Duration) -> bool {
        let t0 = Instant::now();
        while self.used_index(mem) != want {
            if t0.elapsed() > limit {
                return false;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        true
    }
}

/// Sets up queue `q` with `size` entries (its rings zeroed) and fresh
/// eventfds; returns the ring, the kick and the call eventfds.
pub fn start_queue(m: &mut Frontend, mem: &Mem, q: usize, size: u16) -> (Ring, EventFd, EventFd) {
    let r = ring(q, size);
    let len = (r.used + 4 + 8 * u64::from(size) + 2 - r.desc) as usize;
    mem.write_slice(&vec![0u8; len], GuestAddress(r.desc))
        .expect("zero the rings");
    let cfg = VringConfigData {
        queue_max_size: size,
        queue_size: size,
        flags: 0,
        desc_table_addr: va(mem, r.desc),
        used_ring_addr: va(mem, r.used),
        avail_ring_addr: va(mem, r.avail),
        log_addr: None,
    };
    let kick = EventFd::new(0).expect("kick eventfd");
    let call = EventFd::new(EFD_NONBLOCK).expect("call eventfd");
    m.set_vring_num(q, size).expect("SET_VRING_NUM");
    m.set_vring_addr(q, &cfg).expect("SET_VRING_ADDR");
    m.set_vring_base(q, 0).expect("SET_VRING_BASE");
    m.set_vring_call(q, &call).expect("SET_VRING_CALL");
    m.set_vring_kick(q, &kick).expect("SET_VRING_KICK");
    m.set_vring_enable(q, true).expect("SET_VRING_ENABLE");
    (r, kick, call)
}

/// A virtio-blk request header (type, reserved, sector) at `at`.
pub fn header(mem: &Mem, at: u64, typ: u32, sector: u64) {
    let mut h = [0u8; 16];
    h[..4].copy_from_slice(&typ.to_le_bytes());
    h[8..].copy_from_slice(&sector.to_le_bytes());
    mem.write_slice(&h, GuestAddress(at)).expect("header");
}

/// The three descriptors of a request whose header is at `hdr`, data at
/// `data` (`len` bytes; device-writable for a read) and status byte at
/// `status`; the first is descriptor `first` of the table.
pub fn chain(
    first: u16,
    hdr: u64,
    data: u64,
    len: u32,
    read: bool,
    status: u64,
) -> [RawDescriptor; 3] {
    let next = VRING_DESC_F_NEXT as u16;
    let write = VRING_DESC_F_WRITE as u16;
    let data_flags = if read { write | next } else { next };
    [
        RawDescriptor::from(Descriptor::new(hdr, 16, next, first + 1)),
        RawDescriptor::from(Descriptor::new(data, len, data_flags, first + 2)),
        RawDescriptor::from(Descriptor::new(status, 1, write, 0)),
    ]
}
