//! Queue counts as hypervisors ask for them: a device offers up to
//! [`MAX_QUEUES`] queues (all of them by default) and serves whichever the
//! guest enables. qemu's `vhost-user-blk-pci` without `num-queues` asks
//! for one queue per vCPU and refuses a backend whose GET_QUEUE_NUM
//! answers fewer; `--num-queues N` still caps what is offered.
//!
//! Three hypervisors play the guest: the raw master (enables one or two
//! queues of 64, with indices that land on the same and on different
//! queue threads), libblkio (asks for 1 and 4 queues), and a real
//! qemu-system-x86_64 attaching a default `vhost-user-blk-pci` to 2- and
//! 4-vCPU machines (it negotiates the device when it realizes it, before
//! any guest runs; `-S` keeps the guest stopped).

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use backend::MemBackend;
use datapath::{CryptMode, Engine, EngineConfig, Volume};
use ucrypt_vhost::{Options, Server, MAX_QUEUES};
use vhost::vhost_user::VhostUserFrontend;
use virtio_bindings::virtio_blk::{VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

mod common;
use common::master::{self, Mem};

const QSIZE: u16 = 16;
const HDR: u64 = 0x10_0000;
const DATA: u64 = 0x10_1000;
const STATUS: u64 = 0x12_0000;

fn serve(dir: &testutil::TempDir, queues: Option<u16>) -> (Server, Arc<Engine>) {
    let vol = Volume {
        backend: Arc::new(MemBackend::new(1 << 20).unwrap()),
        crypt: None,
        data_offset: 0,
        size: 1 << 20,
        sector_size: 512,
    };
    let cfg = EngineConfig {
        mode: CryptMode::Classic,
        ..EngineConfig::default()
    };
    let engine = Arc::new(Engine::new(vol, cfg).unwrap());
    let mut opts = Options::new(dir.join("vhost.sock"));
    if let Some(n) = queues {
        opts.num_queues = n;
    }
    (Server::start(Arc::clone(&engine), &opts).unwrap(), engine)
}

/// One request on queue `q`; waits for the used ring to move and returns
/// the status byte.
fn request(mem: &Mem, q: usize, kick: &EventFd, typ: u32, sector: u64, len: u32) -> u8 {
    let ring = master::ring(q, QSIZE);
    master::header(mem, HDR, typ, sector);
    mem.write_obj(0xEEu8, GuestAddress(STATUS)).unwrap();
    let descs = master::chain(0, HDR, DATA, len, typ == VIRTIO_BLK_T_IN, STATUS);
    let before = ring.used_index(mem);
    ring.add_chains(mem, &descs, 0);
    kick.write(1).unwrap();
    assert!(
        ring.wait_used(mem, before.wrapping_add(1), Duration::from_secs(30)),
        "queue {q}: no completion"
    );
    mem.read_obj(GuestAddress(STATUS)).unwrap()
}

#[test]
fn offers_max_queues_by_default_and_serves_the_ones_enabled() {
    let dir = testutil::TempDir::new("vhost-queues");
    let (server, engine) = serve(&dir, None);
    let mem = master::guest_memory(&dir.join("guest.mem"), 4 << 20);
    let mut m = master::connect(server.socket(), &mem, u64::from(MAX_QUEUES));
    assert_eq!(m.get_queue_num().unwrap(), u64::from(MAX_QUEUES));

    // Only queue 3 of 64: on a 2-CPU host it is the second queue of
    // thread 1 (local index 1), on a 4-CPU host thread 3's first.
    let (_r, kick3, _c3) = master::start_queue(&mut m, &mem, 3, QSIZE);
    mem.write_slice(&[0x5Au8; 4096], GuestAddress(DATA))
        .unwrap();
    assert_eq!(request(&mem, 3, &kick3, VIRTIO_BLK_T_OUT, 16, 4096), 0);
    assert_eq!(engine.read(16 * 512, 4096).unwrap(), vec![0x5A; 4096]);

    // Queue 2 as well, read back there.
    let (_r, kick2, _c2) = master::start_queue(&mut m, &mem, 2, QSIZE);
    mem.write_slice(&[0u8; 4096], GuestAddress(DATA)).unwrap();
    assert_eq!(request(&mem, 2, &kick2, VIRTIO_BLK_T_IN, 16, 4096), 0);
    let mut back = vec![0u8; 4096];
    mem.read_slice(&mut back, GuestAddress(DATA)).unwrap();
    assert!(back.iter().all(|&b| b == 0x5A), "queue 2 read wrong data");

    let s = server.stats();
    assert_eq!(s.queues.len(), usize::from(MAX_QUEUES));
    assert_eq!((s.queues[3].writes, s.queues[3].reads), (1, 0));
    assert_eq!((s.queues[2].writes, s.queues[2].reads), (0, 1));
    let others: u64 = s
        .queues
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 2 && *i != 3)
        .map(|(_, q)| q.reads + q.writes)
        .sum();
    assert_eq!(others, 0, "requests counted on queues never enabled");
    drop(m);
    server.shutdown();
}

#[test]
fn num_queues_caps_what_is_offered() {
    let dir = testutil::TempDir::new("vhost-queues-cap");
    let (server, _engine) = serve(&dir, Some(3));
    let mem = master::guest_memory(&dir.join("guest.mem"), 4 << 20);
    let mut m = master::connect(server.socket(), &mem, 3);
    assert_eq!(m.get_queue_num().unwrap(), 3);
    let (_r, kick, _c) = master::start_queue(&mut m, &mem, 2, QSIZE);
    assert_eq!(request(&mem, 2, &kick, VIRTIO_BLK_T_IN, 0, 512), 0);
    drop(m);
    server.shutdown();
}

/// libblkio asks for `asked` queues of a default device; a write on the
/// last queue reads back on the first.
fn blkio_uses(asked: i32) {
    use blkio::{Blkio, Completion, ReqFlags};
    use std::mem::MaybeUninit;
    let dir = testutil::TempDir::new("vhost-queues-blkio");
    let (server, engine) = serve(&dir, None);
    let mut b = Blkio::new("virtio-blk-vhost-user").unwrap();
    b.set_str("path", server.socket().to_str().unwrap())
        .unwrap();
    b.connect().unwrap();
    assert_eq!(
        b.get_i32("max-queues").unwrap(),
        i32::from(MAX_QUEUES),
        "GET_QUEUE_NUM as libblkio reads it"
    );
    b.set_i32("num-queues", asked).unwrap();
    let mut out = b.start().unwrap();
    assert_eq!(out.queues.len(), asked as usize);
    let region = b.alloc_mem_region(1 << 20).unwrap();
    b.map_mem_region(&region).unwrap();
    // SAFETY: the region is a live mapping of `len` bytes owned by `b`,
    // which outlives this slice; only this test touches it.
    let buf = unsafe { std::slice::from_raw_parts_mut(region.addr as *mut u8, region.len) };
    buf[..4096].fill(0xC3);
    let mut run = |q: usize, write: bool| {
        let queue = &mut out.queues[q];
        if write {
            queue.write(4096, region.addr as *const u8, 4096, 0, ReqFlags::empty());
        } else {
            queue.read(4096, region.addr as *mut u8, 4096, 0, ReqFlags::empty());
        }
        let mut c = [MaybeUninit::<Completion>::uninit()];
        let n = queue.do_io(&mut c, 1, None, None).unwrap();
        assert_eq!(n, 1);
        // SAFETY: do_io filled the first `n` entries.
        let c = unsafe { c[0].assume_init_ref() };
        assert_eq!(c.ret, 0, "queue {q}");
    };
    run(asked as usize - 1, true);
    assert_eq!(engine.read(4096, 4096).unwrap(), vec![0xC3; 4096]);
    buf[..4096].fill(0);
    run(0, false);
    assert!(buf[..4096].iter().all(|&x| x == 0xC3));
    let s = server.stats();
    assert_eq!(s.queues[asked as usize - 1].writes, 1);
    assert_eq!(s.queues[0].reads, 1);
    drop(out);
    drop(b);
    server.shutdown();
}

#[test]
fn libblkio_with_one_queue_of_a_default_device() {
    blkio_uses(1);
}

#[test]
fn libblkio_with_four_queues_of_a_default_device() {
    blkio_uses(4);
}

/// Starts qemu-system-x86_64 (stopped, `-S`) with `cpus` vCPUs and a
/// `vhost-user-blk-pci` on `sock` with qemu's default queue count, and
/// asks it over QMP for the device's `num-queues`. QMP answers commands
/// only once the machine is built, and building it realizes the device,
/// which negotiates with the server (GET_QUEUE_NUM among the rest); a
/// device qemu could not realize makes it exit instead. Returns the
/// queue count qemu settled on (`None` if it exited) and its stderr.
fn qemu_attaches(sock: &std::path::Path, cpus: u32) -> (Option<u64>, String) {
    let mut child = Command::new("qemu-system-x86_64")
        .args([
            "-machine",
            "q35,accel=tcg",
            "-S",
            "-nodefaults",
            "-display",
            "none",
        ])
        .args(["-smp", &cpus.to_string(), "-m", "128"])
        .args(["-object", "memory-backend-memfd,id=mem,size=128M,share=on"])
        .args(["-numa", "node,memdev=mem"])
        .arg("-chardev")
        .arg(format!("socket,id=c0,path={}", sock.display()))
        .args(["-device", "vhost-user-blk-pci,chardev=c0,id=vblk"])
        .args(["-qmp", "stdio"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start qemu-system-x86_64");
    let mut stdin = child.stdin.take().expect("qemu stdin");
    let out = BufReader::new(child.stdout.take().expect("qemu stdout"));
    let _ = stdin.write_all(
        concat!(
            r#"{"execute":"qmp_capabilities"}"#,
            "\n",
            r#"{"execute":"qom-get","arguments":{"path":"/machine/peripheral/vblk/virtio-backend","property":"num-queues"}}"#,
            "\n",
        )
        .as_bytes(),
    );
    let mut queues = None;
    // Replies in order: {"return": {}}, then {"return": N}; EOF when
    // qemu exits on a device it could not realize.
    for line in out.lines().map_while(Result::ok) {
        let Some(v) = line.strip_prefix(r#"{"return": "#) else {
            continue;
        };
        if let Ok(n) = v.trim_end_matches('}').trim().parse::<u64>() {
            queues = Some(n);
            let _ = stdin.write_all(b"{\"execute\":\"quit\"}\n");
            break;
        }
    }
    drop(stdin);
    let out = child.wait_with_output().expect("qemu exit");
    (queues, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn qemu_attaches_with_its_default_queue_count() {
    if !testutil::require_tool(
        "qemu_attaches_with_its_default_queue_count",
        "qemu-system-x86_64",
    ) {
        return;
    }
    for cpus in [2, 4] {
        let dir = testutil::TempDir::new("vhost-queues-qemu");
        let (server, _engine) = serve(&dir, None);
        let (queues, err) = qemu_attaches(server.socket(), cpus);
        assert_eq!(
            queues,
            Some(u64::from(cpus)),
            "qemu with {cpus} vCPUs: {err}"
        );
        assert!(server.stats().connections >= 1, "qemu never connected");
        server.shutdown();
    }
    // The check can fail: one queue offered, two vCPUs asking.
    let dir = testutil::TempDir::new("vhost-queues-qemu1");
    let (server, _engine) = serve(&dir, Some(1));
    let (queues, err) = qemu_attaches(server.socket(), 2);
    assert_eq!(queues, None, "qemu accepted 1 queue for 2 vCPUs");
    assert!(
        err.contains("maximum number of queues"),
        "qemu's refusal: {err}"
    );
    server.shutdown();
}
