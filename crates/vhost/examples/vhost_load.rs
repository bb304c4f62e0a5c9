//! A small vhost-user-blk load generator on libblkio (the `blkio` crate,
//! driver `virtio-blk-vhost-user`): the same client for every server in
//! `scripts/vhost-bench.sh` (ucrypt and qemu-storage-daemon).
//!
//! ```text
//! vhost_load SOCKET BS QD QUEUES SECONDS [read|write]
//! ```
//! Random aligned offsets over the device, `QD` requests in flight on each
//! of `QUEUES` queues (one thread each). Prints one line:
//! `iops=… mbps=…`.

use std::mem::MaybeUninit;
use std::time::{Duration, Instant};

use blkio::{Blkio, Completion, ReqFlags};

fn arg<T: std::str::FromStr>(a: &[String], i: usize, what: &str) -> T {
    a.get(i).and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        panic!("usage: vhost_load SOCKET BS QD QUEUES SECONDS [read|write] ({what})")
    })
}

fn main() -> blkio::Result<()> {
    let a: Vec<String> = std::env::args().collect();
    let sock: String = arg(&a, 1, "socket");
    let bs: usize = arg(&a, 2, "block size");
    let qd: usize = arg(&a, 3, "queue depth");
    let nq: usize = arg(&a, 4, "queues");
    let secs: f64 = arg(&a, 5, "seconds");
    let write = a.get(6).is_some_and(|s| s == "write");

    let mut b = Blkio::new("virtio-blk-vhost-user")?;
    b.set_str("path", &sock)?;
    b.set_bool("read-only", !write)?;
    b.connect()?;
    b.set_i32("num-queues", nq as i32)?;
    let out = b.start()?;
    let cap = b.get_u64("capacity")?;
    let len = (bs * qd * nq).next_multiple_of(2 << 20);
    let region = b.alloc_mem_region(len)?;
    b.map_mem_region(&region)?;
    let base = region.addr;
    let blocks = cap / bs as u64;
    let dur = Duration::from_secs_f64(secs);

    let t0 = Instant::now();
    let done: u64 = std::thread::scope(|s| {
        let hs: Vec<_> = out
            .queues
            .into_iter()
            .enumerate()
            .map(|(qi, mut q)| {
                s.spawn(move || {
                    // Seeded per queue, so runs offer the same offsets.
                    let mut rng = fastrand::Rng::with_seed(qi as u64 + 1);
                    let mut next = || rng.u64(..blocks) * bs as u64;
                    let submit = |q: &mut blkio::Blkioq, slot: usize, off: u64| {
                        let p = (base + (qi * qd + slot) * bs) as *mut u8;
                        if write {
                            q.write(off, p, bs, slot, ReqFlags::empty());
                        } else {
                            q.read(off, p, bs, slot, ReqFlags::empty());
                        }
                    };
                    for slot in 0..qd {
                        submit(&mut q, slot, next());
                    }
                    let mut comps: Vec<MaybeUninit<Completion>> =
                        (0..qd).map(|_| MaybeUninit::uninit()).collect();
                    let mut n_done = 0u64;
                    let mut in_flight = qd;
                    while in_flight > 0 {
                        let n = q.do_io(&mut comps, 1, None, None).expect("do_io");
                        let stop = t0.elapsed() >= dur;
                        for c in &comps[..n] {
                            // SAFETY: do_io initialised the first `n` completions.
                            let c = unsafe { c.assume_init_ref() };
                            assert!(c.ret == 0, "request failed: {}", c.ret);
                            n_done += 1;
                            if stop {
                                in_flight -= 1;
                            } else {
                                submit(&mut q, c.user_data, next());
                            }
                        }
                    }
                    n_done
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).sum()
    });
    let el = t0.elapsed().as_secs_f64();
    let iops = done as f64 / el;
    println!("iops={:.0} mbps={:.1}", iops, iops * bs as f64 / 1e6);
    Ok(())
}
