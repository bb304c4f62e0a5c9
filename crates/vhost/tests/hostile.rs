//! A hostile guest, built with virtio-queue's mock split queue over real
//! guest memory: chains that point outside guest memory, headers shorter
//! than 16 bytes, a status byte the device may not write, requests past
//! the end, writes to a read-only export and unknown request types each
//! get an error status (or no answer at all when there is nowhere to put
//! one), and nothing outside the shared regions is touched (every access
//! goes through vm-memory's checked calls, which these chains probe).
//!
//! A bad queue index never reaches the device: rust-vmm refuses vring
//! messages for queues it does not have (`InvalidParam`); `raw_master.rs`
//! sends one over a real socket.

use std::sync::{mpsc, Arc};

use backend::MemBackend;
use datapath::{Engine, EngineConfig, Volume};
use ucrypt_vhost::request::{self, Action, Ctx, Kind, Mem, S_IOERR, S_OK, S_UNSUPP};
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT,
};
use virtio_bindings::virtio_ring::VRING_DESC_F_WRITE;
use virtio_queue::desc::{split::Descriptor, RawDescriptor};
use virtio_queue::mock::MockSplitQueue;
use vm_memory::{Bytes, GuestAddress};

const MEM: u64 = 0x20_0000;
const HDR: u64 = 0x10_0000;
const DATA: u64 = 0x10_1000;
const STATUS: u64 = 0x11_0000;
const SIZE: u64 = 1 << 20;

fn memory() -> Mem {
    Mem::from_ranges(&[(GuestAddress(0), MEM as usize)]).unwrap()
}

fn engine(read_only: bool) -> Arc<Engine> {
    let vol = Volume {
        backend: Arc::new(MemBackend::new(SIZE).unwrap()),
        crypt: None,
        data_offset: 0,
        size: SIZE,
        sector_size: 512,
    };
    let cfg = EngineConfig {
        read_only,
        ..EngineConfig::default()
    };
    Arc::new(Engine::new(vol, cfg).unwrap())
}

fn ctx() -> Ctx {
    let mut serial = [0u8; 20];
    serial[..8].copy_from_slice(b"0123abcd");
    Ctx {
        serial,
        write_through: false,
    }
}

fn readable(addr: u64, len: u32) -> RawDescriptor {
    RawDescriptor::from(Descriptor::new(addr, len, 0, 0))
}

fn writable(addr: u64, len: u32) -> RawDescriptor {
    RawDescriptor::from(Descriptor::new(addr, len, VRING_DESC_F_WRITE as u16, 0))
}

fn header(mem: &Mem, typ: u32, sector: u64) {
    let mut h = [0u8; 16];
    h[..4].copy_from_slice(&typ.to_le_bytes());
    h[8..].copy_from_slice(&sector.to_le_bytes());
    mem.write_slice(&h, GuestAddress(HDR)).unwrap();
}

/// Parses the chain `descs`, runs it (through `engine` if it gets that
/// far) and returns (kind, used length, status byte in guest memory).
fn run(mem: &Mem, engine: &Engine, descs: &[RawDescriptor]) -> (Kind, u32, u8) {
    mem.write_obj(0xEEu8, GuestAddress(STATUS)).unwrap();
    let q = MockSplitQueue::new(mem, 16);
    let chain = q.build_desc_chain(descs).unwrap();
    let mut p = request::parse(chain, mem, &ctx());
    // The server admits the payload first; here nothing else is in flight.
    p.load(mem);
    let (status, data) = match std::mem::replace(&mut p.action, Action::Reply(0, Vec::new())) {
        Action::Reply(s, d) => (s, d),
        Action::Engine(req) => {
            let (tx, rx) = mpsc::channel();
            engine.submit(req, move |c| tx.send(c).unwrap());
            let c = rx.recv().unwrap();
            (request::status_of(&c), c.ok().flatten().unwrap_or_default())
        }
        Action::Write { .. } => unreachable!("load makes a write a request or a reply"),
    };
    let used = request::answer(mem, &p, status, &data);
    (
        p.kind,
        used,
        mem.read_obj::<u8>(GuestAddress(STATUS)).unwrap(),
    )
}

#[test]
fn well_formed_requests_round_trip() {
    let (mem, e) = (memory(), engine(false));
    mem.write_slice(&[0x5Au8; 4096], GuestAddress(DATA))
        .unwrap();
    header(&mem, VIRTIO_BLK_T_OUT, 8);
    let w = [readable(HDR, 16), readable(DATA, 4096), writable(STATUS, 1)];
    assert_eq!(run(&mem, &e, &w), (Kind::Write, 1, S_OK));
    assert_eq!(e.read(4096, 4096).unwrap(), vec![0x5A; 4096]);
    mem.write_slice(&[0u8; 4096], GuestAddress(DATA)).unwrap();
    header(&mem, VIRTIO_BLK_T_IN, 8);
    // The read data spread over two descriptors, status in a third.
    let r = [
        readable(HDR, 16),
        writable(DATA, 1024),
        writable(DATA + 1024, 3072),
        writable(STATUS, 1),
    ];
    assert_eq!(run(&mem, &e, &r), (Kind::Read, 4097, S_OK));
    let mut back = [0u8; 4096];
    mem.read_slice(&mut back, GuestAddress(DATA)).unwrap();
    assert!(back.iter().all(|&b| b == 0x5A));
    header(&mem, VIRTIO_BLK_T_GET_ID, 0);
    let id = [readable(HDR, 16), writable(DATA, 20), writable(STATUS, 1)];
    assert_eq!(run(&mem, &e, &id), (Kind::GetId, 21, S_OK));
    let mut serial = [0u8; 20];
    mem.read_slice(&mut serial, GuestAddress(DATA)).unwrap();
    assert_eq!(&serial[..8], b"0123abcd");
}

#[test]
fn descriptors_outside_guest_memory_are_refused() {
    let (mem, e) = (memory(), engine(false));
    header(&mem, VIRTIO_BLK_T_IN, 0);
    for bad in [
        writable(0x4000_0000, 4096),    // wholly outside
        writable(MEM - 8, 16),          // straddles the end
        writable(u64::MAX - 100, 4096), // wraps the address space
        writable(DATA, u32::MAX),       // longer than memory
    ] {
        let chain = [readable(HDR, 16), bad, writable(STATUS, 1)];
        let (kind, used, st) = run(&mem, &e, &chain);
        assert_eq!((kind, used), (Kind::Malformed, 0));
        assert_eq!(
            st, 0xEE,
            "nothing written for a chain that cannot be trusted"
        );
    }
    // The header itself outside memory.
    let chain = [readable(0x4000_0000, 16), writable(STATUS, 1)];
    assert_eq!(run(&mem, &e, &chain), (Kind::Malformed, 0, 0xEE));
    assert_eq!(e.stats().read.requests, 0, "nothing reached the engine");
}

#[test]
fn short_header_and_readable_status_get_no_io() {
    let (mem, e) = (memory(), engine(false));
    header(&mem, VIRTIO_BLK_T_OUT, 0);
    // A header of 8 bytes: IOERR into the status byte.
    let short = [readable(HDR, 8), writable(STATUS, 1)];
    assert_eq!(run(&mem, &e, &short), (Kind::Malformed, 1, S_IOERR));
    // Header split 8 + 8 over two descriptors is fine (any layout).
    mem.write_slice(&[7u8; 512], GuestAddress(DATA)).unwrap();
    let split = [
        readable(HDR, 8),
        readable(HDR + 8, 8),
        readable(DATA, 512),
        writable(STATUS, 1),
    ];
    assert_eq!(run(&mem, &e, &split), (Kind::Write, 1, S_OK));
    // Status in a device-readable buffer: no writable byte, no answer.
    let ro_status = [readable(HDR, 16), readable(DATA, 512), readable(STATUS, 1)];
    assert_eq!(run(&mem, &e, &ro_status), (Kind::Malformed, 0, 0xEE));
    // Readable after writable breaks the ordering rule.
    let mixed = [readable(HDR, 16), writable(DATA, 512), readable(STATUS, 1)];
    assert_eq!(run(&mem, &e, &mixed), (Kind::Malformed, 0, 0xEE));
    assert_eq!(e.stats().write.requests, 1);
}

#[test]
fn past_the_end_read_only_and_unknown_requests() {
    let (mem, e) = (memory(), engine(false));
    for typ in [VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT] {
        for sector in [SIZE / 512, SIZE / 512 - 1, u64::MAX / 256] {
            header(&mem, typ, sector);
            let data = if typ == VIRTIO_BLK_T_IN {
                writable(DATA, 1024)
            } else {
                readable(DATA, 1024)
            };
            let chain = [readable(HDR, 16), data, writable(STATUS, 1)];
            let (_, used, st) = run(&mem, &e, &chain);
            assert_eq!((used, st), (1, S_IOERR), "type {typ} sector {sector}");
        }
    }
    header(&mem, 0x99, 0);
    let chain = [readable(HDR, 16), writable(STATUS, 1)];
    assert_eq!(run(&mem, &e, &chain), (Kind::Unsupported, 1, S_UNSUPP));
    // Discard on an engine without discards, and with unknown flags.
    header(&mem, VIRTIO_BLK_T_DISCARD, 0);
    let mut range = [0u8; 16];
    range[8..12].copy_from_slice(&8u32.to_le_bytes());
    mem.write_slice(&range, GuestAddress(DATA)).unwrap();
    let chain = [readable(HDR, 16), readable(DATA, 16), writable(STATUS, 1)];
    assert_eq!(run(&mem, &e, &chain), (Kind::Discard, 1, S_UNSUPP));
    range[12] = 1;
    mem.write_slice(&range, GuestAddress(DATA)).unwrap();
    assert_eq!(run(&mem, &e, &chain), (Kind::Discard, 1, S_UNSUPP));

    let ro = engine(true);
    ro.read(0, 512).unwrap();
    header(&mem, VIRTIO_BLK_T_OUT, 0);
    mem.write_slice(&[9u8; 512], GuestAddress(DATA)).unwrap();
    let chain = [readable(HDR, 16), readable(DATA, 512), writable(STATUS, 1)];
    assert_eq!(run(&mem, &ro, &chain), (Kind::Write, 1, S_IOERR));
    assert_eq!(ro.read(0, 512).unwrap(), vec![0; 512]);
}
