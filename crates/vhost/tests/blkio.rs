//! An independent client: libblkio's `virtio-blk-vhost-user` driver (the
//! `blkio` crate, pure Rust) talks to the server over a real vhost-user
//! socket with its own shared memory, virtqueues and eventfds.

use std::mem::MaybeUninit;
use std::sync::Arc;

use backend::MemBackend;
use blkio::{Blkio, Blkioq, Completion, MemoryRegion, ReqFlags};
use crypto::{CryptConfig, SectorCrypt};
use datapath::{CryptMode, Engine, EngineConfig, Volume};
use ucrypt_vhost::{Options, Server};

const SIZE: u64 = 64 << 20;

fn engine(cfg: EngineConfig) -> Arc<Engine> {
    let crypt = SectorCrypt::new(&CryptConfig {
        cipher: "aes-xts-plain64".into(),
        key: zeroize::Zeroizing::new((0..64u8).collect()),
        iv_offset: 0,
        sector_size: 512,
        iv_large_sectors: true,
    })
    .unwrap();
    let vol = Volume {
        backend: Arc::new(MemBackend::new(SIZE).unwrap()),
        crypt: Some(Arc::new(crypt)),
        data_offset: 0,
        size: SIZE,
        sector_size: 512,
    };
    Arc::new(Engine::new(vol, cfg).unwrap())
}

struct Fixture {
    server: Server,
    engine: Arc<Engine>,
    _dir: testutil::TempDir,
}

fn serve(cfg: EngineConfig, queues: u16) -> Fixture {
    let dir = testutil::TempDir::new("vhost-blkio");
    let engine = engine(cfg);
    let mut opts = Options::new(dir.join("vhost.sock"));
    opts.num_queues = queues;
    let server = Server::start(Arc::clone(&engine), &opts).unwrap();
    Fixture {
        _dir: dir,
        engine,
        server,
    }
}

/// A connected libblkio instance with one mapped buffer region.
struct Client {
    queues: Vec<Blkioq>,
    region: MemoryRegion,
    _b: Blkio,
}

impl Client {
    fn connect(f: &Fixture, queues: i32, read_only: bool) -> blkio::Result<Self> {
        let mut b = Blkio::new("virtio-blk-vhost-user")?;
        b.set_str("path", f.server.socket().to_str().unwrap())?;
        b.set_bool("read-only", read_only)?;
        b.connect()?;
        b.set_i32("num-queues", queues)?;
        let out = b.start()?;
        let region = b.alloc_mem_region(32 << 20)?;
        b.map_mem_region(&region)?;
        Ok(Self {
            queues: out.queues,
            region,
            _b: b,
        })
    }

    fn buf(&mut self) -> &mut [u8] {
        // SAFETY: the region is a live mapping of `len` bytes owned by
        // `self._b` for as long as `self` lives; only this test touches it
        // while no request is in flight.
        unsafe { std::slice::from_raw_parts_mut(self.region.addr as *mut u8, self.region.len) }
    }

    /// Runs `reqs` (op, device offset, buffer offset, len) on queue `q`
    /// with all of them in flight at once; returns each request's result.
    fn run(&mut self, q: usize, reqs: &[(Op, u64, usize, usize)]) -> Vec<i32> {
        let base = self.region.addr;
        let queue = &mut self.queues[q];
        for (i, &(op, off, boff, len)) in reqs.iter().enumerate() {
            let p = (base + boff) as *mut u8;
            match op {
                Op::Read => queue.read(off, p, len, i, ReqFlags::empty()),
                Op::Write => queue.write(off, p, len, i, ReqFlags::empty()),
                Op::Fua => queue.write(off, p, len, i, ReqFlags::FUA),
                Op::Flush => queue.flush(i, ReqFlags::empty()),
                Op::Discard => queue.discard(off, len as u64, i, ReqFlags::empty()),
                Op::Zeroes => queue.write_zeroes(off, len as u64, i, ReqFlags::empty()),
            }
        }
        let mut res = vec![i32::MIN; reqs.len()];
        let mut got = 0;
        let mut comps: Vec<MaybeUninit<Completion>> =
            (0..reqs.len()).map(|_| MaybeUninit::uninit()).collect();
        while got < reqs.len() {
            let n = queue.do_io(&mut comps, 1, None, None).unwrap();
            for c in &comps[..n] {
                // SAFETY: do_io initialised the first `n` completions.
                let c = unsafe { c.assume_init_ref() };
                res[c.user_data] = c.ret;
            }
            got += n;
        }
        res
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Op {
    Read,
    Write,
    Fua,
    Flush,
    Discard,
    Zeroes,
}

#[test]
fn write_read_verify_across_sizes_depths_and_two_queues() {
    let f = serve(
        EngineConfig {
            mode: CryptMode::Adaptive,
            ..EngineConfig::default()
        },
        2,
    );
    let mut c = Client::connect(&f, 2, false).unwrap();
    let mut rng = testutil::Rng::new(12);
    let mut dev_off = 0u64;
    for &size in &[512usize, 4096, 65536, 1 << 20] {
        for &qd in &[1usize, 8, 32] {
            if size * qd > 16 << 20 {
                continue;
            }
            for q in 0..2 {
                let data = rng.bytes(size * qd);
                c.buf()[..data.len()].copy_from_slice(&data);
                let op = if qd == 8 { Op::Fua } else { Op::Write };
                let writes: Vec<_> = (0..qd)
                    .map(|i| (op, dev_off + (i * size) as u64, i * size, size))
                    .collect();
                assert!(
                    c.run(q, &writes).iter().all(|&r| r == 0),
                    "write {size} x{qd}"
                );
                let half = 16 << 20;
                let reads: Vec<_> = (0..qd)
                    .map(|i| (Op::Read, dev_off + (i * size) as u64, half + i * size, size))
                    .collect();
                assert!(
                    c.run(1 - q, &reads).iter().all(|&r| r == 0),
                    "read {size} x{qd}"
                );
                assert!(
                    c.buf()[half..half + data.len()] == data[..],
                    "readback {size} x{qd} q{q}"
                );
                // The host-side engine sees the same plaintext.
                let n = data.len().min(1 << 20);
                assert_eq!(f.engine.read(dev_off, n as u32).unwrap(), data[..n]);
                dev_off += data.len() as u64;
            }
        }
    }
    let last = vec![(Op::Write, SIZE - 4096, 0, 4096)];
    assert_eq!(c.run(0, &last), [0]);
    let past = vec![(Op::Read, SIZE - 512, 0, 1024)];
    assert!(c.run(0, &past)[0] < 0, "read past the end must fail");
    // A request counts as done only after its used-ring entry is written
    // (stop_vring relies on that), so the client can see the last
    // completion a moment before the counter moves: wait for it.
    let mut s = f.server.stats();
    for _ in 0..3000 {
        if s.queues.iter().all(|q| q.in_flight == 0) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        s = f.server.stats();
    }
    assert_eq!(s.connections, 1);
    assert_eq!(s.queues.len(), 2);
    for q in &s.queues {
        assert!(q.reads > 0 && q.writes > 0 && q.read_bytes > 0 && q.write_bytes > 0);
        assert_eq!(q.in_flight, 0, "a request never finished");
    }
    assert_eq!(s.queues.iter().map(|q| q.io_errors).sum::<u64>(), 1);
}

#[test]
fn flush_discard_and_write_zeroes() {
    let f = serve(
        EngineConfig {
            allow_discards: true,
            ..EngineConfig::default()
        },
        1,
    );
    let mut c = Client::connect(&f, 1, false).unwrap();
    c.buf()[..1 << 20].fill(0xA5);
    assert_eq!(c.run(0, &[(Op::Write, 0, 0, 1 << 20)]), [0]);
    assert_eq!(c.run(0, &[(Op::Flush, 0, 0, 0)]), [0]);
    assert_eq!(c.run(0, &[(Op::Zeroes, 4096, 0, 65536)]), [0]);
    assert_eq!(c.run(0, &[(Op::Read, 0, 0, 1 << 20)]), [0]);
    let b = c.buf();
    assert!(b[..4096].iter().all(|&x| x == 0xA5));
    assert!(b[4096..69632].iter().all(|&x| x == 0));
    assert!(b[69632..1 << 20].iter().all(|&x| x == 0xA5));
    assert_eq!(c.run(0, &[(Op::Discard, 1 << 19, 0, 1 << 19)]), [0]);
    let s = f.server.stats();
    let q = &s.queues[0];
    assert_eq!((q.flushes, q.write_zeroes, q.discards), (1, 1, 1));
    drop(c);

    // Without --allow-discards the device does not offer discard; a
    // client that sends one anyway is refused, and writes still work.
    let f = serve(EngineConfig::default(), 1);
    let mut c = Client::connect(&f, 1, false).unwrap();
    assert!(c.run(0, &[(Op::Discard, 0, 0, 4096)])[0] < 0);
    assert_eq!(c.run(0, &[(Op::Write, 0, 0, 4096)]), [0]);
}

#[test]
fn read_only_export_refuses_writers() {
    let f = serve(
        EngineConfig {
            read_only: true,
            ..EngineConfig::default()
        },
        1,
    );
    f.engine.read(0, 512).unwrap();
    // The device says VIRTIO_BLK_F_RO: a read-write client cannot start.
    let e = Client::connect(&f, 1, false)
        .err()
        .expect("read-write start must fail");
    assert_eq!(e.errno(), blkio::Errno::ROFS);
    let mut c = Client::connect(&f, 1, true).unwrap();
    assert_eq!(c.run(0, &[(Op::Read, 0, 0, 65536)]), [0]);
    assert_eq!(c.run(0, &[(Op::Flush, 0, 0, 0)]), [0]);
    assert!(c.run(0, &[(Op::Write, 0, 0, 4096)])[0] < 0);
}

#[test]
fn serves_again_after_the_client_disconnects() {
    let f = serve(EngineConfig::default(), 2);
    let mut rng = testutil::Rng::new(7);
    let mut expect = Vec::new();
    for round in 0..3u64 {
        let mut c = Client::connect(&f, 2, false).unwrap();
        // What the previous connection wrote is there.
        for (off, data) in &expect {
            let data: &Vec<u8> = data;
            assert_eq!(c.run(0, &[(Op::Read, *off, 0, data.len())]), [0]);
            assert!(c.buf()[..data.len()] == data[..], "round {round}");
        }
        let data = rng.bytes(65536);
        c.buf()[..65536].copy_from_slice(&data);
        let off = round * (1 << 20);
        assert_eq!(
            c.run((round % 2) as usize, &[(Op::Write, off, 0, 65536)]),
            [0]
        );
        expect.push((off, data));
        drop(c);
    }
    assert_eq!(f.server.stats().connections, 3);
}
