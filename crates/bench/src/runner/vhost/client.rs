//! The load generator of `--via vhost`: libblkio (the `blkio` crate,
//! driver `virtio-blk-vhost-user`) in this process, the same client for
//! every server (ucrypt and qemu-storage-daemon).
//!
//! One connection per repetition; `queues` virtqueues, one thread each,
//! `qd` requests in flight on each. Like fio with `numjobs`, queue `q`
//! works in its own slice of the device (sequential: from the slice's
//! start, wrapping; random: seeded aligned offsets within it). Request
//! buffers live in one memory region libblkio shares with the server;
//! their contents are whatever the region holds (the bench measures
//! movement, not data).
//!
//! The only unsafe code of the bench crate is here, fenced: reading the
//! completions libblkio wrote into `MaybeUninit` slots.
#![allow(unsafe_code)]

use std::mem::MaybeUninit;
use std::path::Path;
use std::time::{Duration, Instant};

use blkio::{Blkio, Blkioq, Completion, ReqFlags};

use crate::driver::Rw;

/// How long a queue waits for any completion before it gives up.
const STALL: Duration = Duration::from_secs(30);

/// One client run.
#[derive(Debug, Clone, Copy)]
pub struct Job {
    /// Direction and pattern.
    pub rw: Rw,
    /// Request size in bytes.
    pub bs: u32,
    /// Requests in flight per queue.
    pub qd: usize,
    /// Virtqueues (threads).
    pub queues: usize,
    /// How long to submit.
    pub runtime: Duration,
    /// Stop once each queue has covered its slice once (a fill pass).
    pub once: bool,
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// Requests completed successfully.
    pub ops: u64,
    /// Wall time from the first submission to the last completion.
    pub elapsed: Duration,
    /// Completion latency of every successful request, ns.
    pub lat_ns: Vec<u64>,
    /// Failed requests.
    pub errors: u64,
    /// The first failure.
    pub error: Option<String>,
}

/// A libblkio failure, with the step that failed.
#[derive(Debug, thiserror::Error)]
#[error("libblkio virtio-blk-vhost-user: {step}")]
pub struct ClientError {
    step: &'static str,
    #[source]
    source: blkio::Error,
}

fn at(step: &'static str) -> impl FnOnce(blkio::Error) -> ClientError {
    move |source| ClientError { step, source }
}

/// Connects to the vhost-user-blk socket `sock`, runs `job` and
/// disconnects.
pub fn run(sock: &Path, job: &Job) -> Result<Outcome, ClientError> {
    let bs = job.bs as usize;
    let (qd, nq) = (job.qd.max(1), job.queues.max(1));
    let mut b = Blkio::new("virtio-blk-vhost-user").map_err(at("new"))?;
    b.set_str("path", &sock.to_string_lossy())
        .map_err(at("path"))?;
    b.connect().map_err(at("connect"))?;
    b.set_i32("num-queues", nq as i32)
        .map_err(at("num-queues"))?;
    let started = b.start().map_err(at("start"))?;
    let cap = b.get_u64("capacity").map_err(at("capacity"))?;
    let len = (bs * qd * nq).next_multiple_of(2 << 20);
    let region = b.alloc_mem_region(len).map_err(at("alloc_mem_region"))?;
    b.map_mem_region(&region).map_err(at("map_mem_region"))?;
    // Each queue's slice of the device, in whole requests.
    let per_queue = cap / nq as u64 / bs as u64;
    let base = region.addr;
    let t0 = Instant::now();
    let outs: Vec<Outcome> = std::thread::scope(|s| {
        let hs: Vec<_> = started
            .queues
            .into_iter()
            .take(nq)
            .enumerate()
            .map(|(qi, q)| {
                let slice = Slice {
                    first: qi as u64 * per_queue,
                    blocks: per_queue,
                };
                let bufs = base + qi * qd * bs;
                s.spawn(move || queue_loop(q, job, slice, bufs, t0))
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| Outcome {
                    errors: 1,
                    error: Some("a client queue thread panicked".into()),
                    ..Outcome::default()
                })
            })
            .collect()
    });
    let elapsed = t0.elapsed();
    b.unmap_mem_region(&region);
    b.free_mem_region(&region);
    let mut all = Outcome {
        elapsed,
        ..Outcome::default()
    };
    for o in outs {
        all.ops += o.ops;
        all.errors += o.errors;
        all.lat_ns.extend(o.lat_ns);
        if all.error.is_none() {
            all.error = o.error;
        }
    }
    Ok(all)
}

/// A queue's part of the device, in requests.
#[derive(Clone, Copy)]
struct Slice {
    first: u64,
    blocks: u64,
}

/// Keeps `qd` requests in flight on `q` until the run time is over (or,
/// for `once`, the slice is covered), then drains.
fn queue_loop(mut q: Blkioq, job: &Job, slice: Slice, bufs: usize, t0: Instant) -> Outcome {
    let bs = job.bs as usize;
    let qd = job.qd.max(1);
    let mut out = Outcome::default();
    if slice.blocks == 0 {
        out.errors = 1;
        out.error = Some("the device is smaller than one request per queue".into());
        return out;
    }
    // Seeded per slice, so every server gets the same offsets.
    let mut rng = fastrand::Rng::with_seed(slice.first + 1);
    let mut seq = 0u64;
    let mut next = || {
        let b = if job.rw.is_random() {
            rng.u64(..slice.blocks)
        } else {
            let b = seq % slice.blocks;
            seq += 1;
            b
        };
        (slice.first + b) * bs as u64
    };
    let submit = |q: &mut Blkioq, slot: usize, off: u64| {
        let buf = (bufs + slot * bs) as *mut u8;
        if job.rw.is_write() {
            q.write(off, buf, bs, slot, ReqFlags::empty());
        } else {
            q.read(off, buf, bs, slot, ReqFlags::empty());
        }
    };
    let mut issued = vec![t0; qd];
    let mut in_flight = 0;
    let mut submitted = 0u64;
    for (slot, t) in issued.iter_mut().enumerate() {
        if job.once && submitted >= slice.blocks {
            break;
        }
        *t = Instant::now();
        submit(&mut q, slot, next());
        submitted += 1;
        in_flight += 1;
    }
    let mut comps: Vec<MaybeUninit<Completion>> = (0..qd).map(|_| MaybeUninit::uninit()).collect();
    while in_flight > 0 {
        // Bounded: a server that died must fail the run, not hang it.
        let mut timeout = STALL;
        let n = match q.do_io(&mut comps, 1, Some(&mut timeout), None) {
            Ok(n) => n.min(comps.len()),
            Err(e) => {
                out.errors += in_flight as u64;
                out.error.get_or_insert_with(|| format!("do_io: {e}"));
                break;
            }
        };
        let now = Instant::now();
        let stop = now.duration_since(t0) >= job.runtime || (job.once && submitted >= slice.blocks);
        for c in &comps[..n] {
            // SAFETY: do_io returned `n`: it initialised the first `n`
            // completions (blkioq_do_io's contract).
            let c = unsafe { c.assume_init_ref() };
            let slot = c.user_data;
            if c.ret == 0 {
                out.ops += 1;
                if let Some(t) = issued.get(slot) {
                    out.lat_ns.push(now.duration_since(*t).as_nanos() as u64);
                }
            } else {
                out.errors += 1;
                out.error
                    .get_or_insert_with(|| format!("request failed: errno {}", -c.ret));
            }
            if stop || slot >= qd {
                in_flight -= 1;
            } else {
                issued[slot] = Instant::now();
                submit(&mut q, slot, next());
                submitted += 1;
            }
        }
    }
    out
}
