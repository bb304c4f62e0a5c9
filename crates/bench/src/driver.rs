//! The in-process workload driver (hand-written; fio's job model over
//! `datapath::Engine::submit`).
//!
//! ```text
//!   job 0 ──┐  slots: Mutex<JobState> + Condvar, at most `qd` in flight
//!   job 1 ──┼─ submit(Request, cb) ──► Engine (classic | inline | adaptive)
//!   job n ──┘        ▲                          │
//!                    └──── cb: latency, bytes, free a slot ◄─┘
//! ```
//!
//! Each job is one submitting thread. It keeps `qd` requests in flight,
//! submitting until the run time is up, then drains. Sequential jobs each
//! walk their own slice of the device (fio's `offset_increment`) and wrap;
//! random jobs pick block-aligned offsets uniformly over the whole device.
//! Writes copy a pattern block into a fresh buffer per request (what a
//! frontend does when it receives data); reads hand the returned buffer
//! back to [`datapath::bufpool`], as the NBD and vhost-user-blk frontends
//! do once their reply has left (dropping it made every large read fault
//! in and zero a fresh buffer, a cost no frontend pays).
//! Throughput counts completed bytes over the wall time from the common
//! start to the last completion; CPU time is the whole process's
//! `getrusage` user + system time over the same span (so engine workers
//! count).

use std::sync::{Arc, Barrier, Condvar, Mutex};
use std::time::{Duration, Instant};

use datapath::{Engine, Hint, Op, Plug, Request};

/// Direction and access pattern, named as fio's `--rw`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
#[non_exhaustive]
pub enum Rw {
    /// Sequential read.
    Read,
    /// Sequential write.
    Write,
    /// Random read.
    RandRead,
    /// Random write.
    RandWrite,
}

impl Rw {
    /// fio's name.
    pub fn name(self) -> &'static str {
        match self {
            Rw::Read => "read",
            Rw::Write => "write",
            Rw::RandRead => "randread",
            Rw::RandWrite => "randwrite",
        }
    }

    /// Parses fio's name.
    pub fn parse(s: &str) -> Option<Self> {
        [Rw::Read, Rw::Write, Rw::RandRead, Rw::RandWrite]
            .into_iter()
            .find(|r| r.name() == s)
    }

    /// True for writes.
    pub fn is_write(self) -> bool {
        matches!(self, Rw::Write | Rw::RandWrite)
    }

    /// True for random access.
    pub fn is_random(self) -> bool {
        matches!(self, Rw::RandRead | Rw::RandWrite)
    }
}

/// One workload: what fio would call a job file with `numjobs`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Workload {
    /// Direction and pattern.
    pub rw: Rw,
    /// Block size in bytes (multiple of 512).
    pub bs: u32,
    /// Requests in flight per job.
    pub qd: usize,
    /// Submitting threads.
    pub jobs: usize,
    /// How long each job keeps submitting.
    pub runtime: Duration,
}

/// The raw outcome of one repetition.
#[derive(Debug, Clone, Default)]
pub struct RepResult {
    /// Bytes completed successfully.
    pub bytes: u64,
    /// Requests completed successfully.
    pub ops: u64,
    /// Requests that failed.
    pub errors: u64,
    /// The first error message seen.
    pub first_error: Option<String>,
    /// Wall time from start to the last completion.
    pub elapsed: Duration,
    /// Process user + system CPU time over the run.
    pub cpu: Duration,
    /// Per-request latency (submit to completion callback) in nanoseconds.
    pub lat_ns: Vec<u64>,
}

impl RepResult {
    /// Throughput in bytes per second.
    pub fn bytes_per_s(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            self.bytes as f64 / s
        } else {
            0.0
        }
    }
    /// Requests per second.
    pub fn iops(&self) -> f64 {
        let s = self.elapsed.as_secs_f64();
        if s > 0.0 {
            self.ops as f64 / s
        } else {
            0.0
        }
    }
    /// CPU seconds spent per GiB moved (None when nothing moved).
    pub fn cpu_s_per_gib(&self) -> Option<f64> {
        (self.bytes > 0).then(|| self.cpu.as_secs_f64() / (self.bytes as f64 / crate::stats::GIB))
    }
}

#[derive(Default)]
struct JobState {
    in_flight: usize,
    bytes: u64,
    ops: u64,
    errors: u64,
    first_error: Option<String>,
    lat_ns: Vec<u64>,
    started: Option<Instant>,
    last_done: Option<Instant>,
    /// The job sleeps on `freed` (a callback must notify it).
    waiting: bool,
}

struct Job {
    state: Mutex<JobState>,
    freed: Condvar,
}

/// Runs one repetition of `w` against `engine` (a device of `size` bytes).
pub fn run(engine: &Arc<Engine>, w: &Workload, size: u64) -> RepResult {
    run_with(engine, w, size, false)
}

/// [`run`], each job submitting as a frontend with a deep queue does
/// (`Engine::submit_plugged` through the job's own plug, `behind` = QD - 1:
/// the job never waits for a completion before its next submission; only
/// its QD stops it).
pub fn run_hinted(engine: &Arc<Engine>, w: &Workload, size: u64) -> RepResult {
    run_with(engine, w, size, true)
}

fn run_with(engine: &Arc<Engine>, w: &Workload, size: u64, hinted: bool) -> RepResult {
    let bs = u64::from(w.bs);
    let jobs = w.jobs.max(1);
    let qd = w.qd.max(1);
    let blocks = size / bs;
    let barrier = Barrier::new(jobs + 1);
    let cpu0 = cpu_time();
    let shared: Vec<Arc<Job>> = (0..jobs)
        .map(|_| {
            Arc::new(Job {
                state: Mutex::new(JobState::default()),
                freed: Condvar::new(),
            })
        })
        .collect();
    std::thread::scope(|s| {
        for (j, job) in shared.iter().enumerate() {
            let job = Arc::clone(job);
            let barrier = &barrier;
            s.spawn(move || {
                barrier.wait();
                let start = Instant::now();
                job.state.lock().unwrap_or_else(|p| p.into_inner()).started = Some(start);
                let shape = (j as u64, jobs as u64, blocks, qd);
                run_job(engine, &job, w, shape, start, hinted);
            });
        }
        barrier.wait();
    });
    let cpu = cpu_time().saturating_sub(cpu0);
    let mut out = RepResult {
        cpu,
        ..RepResult::default()
    };
    let mut start: Option<Instant> = None;
    let mut end: Option<Instant> = None;
    for job in shared {
        let mut st = job.state.lock().unwrap_or_else(|p| p.into_inner());
        out.bytes += st.bytes;
        out.ops += st.ops;
        out.errors += st.errors;
        if out.first_error.is_none() {
            out.first_error = st.first_error.take();
        }
        out.lat_ns.append(&mut st.lat_ns);
        start = match (start, st.started) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        end = end.max(st.last_done);
    }
    if let (Some(s), Some(e)) = (start, end) {
        out.elapsed = e.saturating_duration_since(s);
    }
    out
}

/// Job `j` of `jobs` keeping `qd` requests in flight on a device of
/// `blocks` blocks (`shape` = (j, jobs, blocks, qd)).
fn run_job(
    engine: &Arc<Engine>,
    job: &Arc<Job>,
    w: &Workload,
    (j, jobs, blocks, qd): (u64, u64, u64, usize),
    start: Instant,
    hinted: bool,
) {
    let bs = u64::from(w.bs);
    // Sequential: this job's slice [first, first + span) in blocks.
    let span = (blocks / jobs).max(1);
    let first = if blocks / jobs == 0 { 0 } else { j * span };
    let mut next = 0u64;
    // Offsets only (not keys): a seeded generator per job, so runs repeat.
    let mut rng = fastrand::Rng::with_seed(0x9E37_79B9_7F4A_7C15 ^ (j + 1));
    let pattern: Vec<u8> = (0..w.bs)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(7))
        .collect();
    let deadline = start + w.runtime;
    let mut submitted = false;
    // The job's gathering, as a frontend's submitting context has one.
    let mut plug = Plug::new();
    loop {
        // At least one request per job, even when the thread was not
        // scheduled before its deadline (a busy machine, a short run).
        if submitted && Instant::now() >= deadline {
            break;
        }
        submitted = true;
        take_slot(engine, &mut plug, job, qd);
        let block = if w.rw.is_random() {
            rng.u64(..blocks.max(1))
        } else {
            let b = first + next;
            next = (next + 1) % span;
            b
        };
        let op = if w.rw.is_write() {
            let mut data = Vec::with_capacity(pattern.len());
            data.extend_from_slice(&pattern);
            Op::Write { data }
        } else {
            Op::Read { len: w.bs }
        };
        let req = Request {
            op,
            offset: block * bs,
            fua: false,
        };
        let job2 = Arc::clone(job);
        let t = Instant::now();
        let done = move |res: datapath::Completion| {
            let now = Instant::now();
            let mut st = job2.state.lock().unwrap_or_else(|p| p.into_inner());
            st.in_flight -= 1;
            let mut back = None;
            match res {
                Ok(data) => {
                    back = data;
                    st.ops += 1;
                    st.bytes += bs;
                    st.lat_ns
                        .push(now.saturating_duration_since(t).as_nanos() as u64);
                }
                Err(e) => {
                    st.errors += 1;
                    if st.first_error.is_none() {
                        st.first_error = Some(e.to_string());
                    }
                }
            }
            st.last_done = Some(now);
            // A condvar's notify is a futex syscall even with no waiter:
            // only when the job sleeps (not while it reaps).
            let wake = st.waiting;
            drop(st);
            if wake {
                job2.freed.notify_one();
            }
            if let Some(buf) = back {
                datapath::bufpool::give(buf);
            }
        };
        if hinted {
            let behind = u32::try_from(qd - 1).unwrap_or(u32::MAX);
            engine.submit_plugged(&mut plug, req, Hint { behind, ready: 0 }, done);
        } else {
            engine.submit(req, done);
        }
    }
    // Drain: wait for every request of this job.
    let mut st = job.state.lock().unwrap_or_else(|p| p.into_inner());
    while st.in_flight > 0 {
        st.waiting = true;
        st = job.freed.wait(st).unwrap_or_else(|p| p.into_inner());
        st.waiting = false;
    }
}

/// A reap that returned empty-handed after this long waited on the
/// backend's ring (the file backend waits up to 1 ms); one that returned
/// sooner had nothing in flight to wait for.
const REAP_WAITED: Duration = Duration::from_micros(250);

/// Takes one of the job's `qd` slots. With all of them in flight the job
/// reaps as fio's job thread does: it runs the backend's completions on
/// its own thread ([`Engine::reap`]), so a request's slot comes back to
/// the thread that refills it without a wake-up by the backend's
/// completion thread (4k QD32 random reads on a virtio disk: that hop per
/// request kept the engine without a cipher at ~0.85 of fio's io_uring
/// engine). A reap that found nothing after waiting its while on the
/// backend (IO slower than that wait) is tried again, so the job stays
/// the one waiting on the ring; one that found nothing at once (no such
/// backend, nothing in flight there: its callbacks run elsewhere) sleeps
/// until a callback frees a slot.
fn take_slot(engine: &Engine, plug: &mut Plug, job: &Job, qd: usize) {
    let lock = || job.state.lock().unwrap_or_else(|p| p.into_inner());
    let mut st = lock();
    while st.in_flight >= qd {
        drop(st);
        let t = Instant::now();
        let reaped = engine.reap(plug);
        let waited = t.elapsed() >= REAP_WAITED;
        st = lock();
        if reaped == 0 && !waited && st.in_flight >= qd {
            st.waiting = true;
            st = job.freed.wait(st).unwrap_or_else(|p| p.into_inner());
            st.waiting = false;
        }
    }
    st.in_flight += 1;
}

/// Process user + system CPU time (`getrusage(RUSAGE_SELF)`).
pub fn cpu_time() -> Duration {
    use nix::sys::resource::{getrusage, UsageWho};
    let Ok(ru) = getrusage(UsageWho::RUSAGE_SELF) else {
        return Duration::ZERO;
    };
    let tv = |t: nix::sys::time::TimeVal| {
        Duration::new(
            t.tv_sec().max(0) as u64,
            (t.tv_usec().clamp(0, 999_999) as u32) * 1000,
        )
    };
    tv(ru.user_time()) + tv(ru.system_time())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::Target;

    #[test]
    fn drives_requests_and_counts_them() {
        let be: Arc<dyn backend::Backend> = Arc::new(backend::MemBackend::new(1 << 20).unwrap());
        let engine = Arc::new(Target::RAW.engine(be, 8, 512).unwrap());
        for rw in [Rw::Write, Rw::Read, Rw::RandRead, Rw::RandWrite] {
            let w = Workload {
                rw,
                bs: 4096,
                qd: 4,
                jobs: 2,
                runtime: Duration::from_millis(20),
            };
            for r in [run(&engine, &w, 1 << 20), run_hinted(&engine, &w, 1 << 20)] {
                assert_eq!(r.errors, 0, "{:?}", r.first_error);
                assert!(r.ops > 0);
                assert_eq!(r.bytes, r.ops * 4096);
                assert_eq!(r.lat_ns.len() as u64, r.ops);
                assert!(r.elapsed > Duration::ZERO);
                assert!(r.bytes_per_s() > 0.0 && r.iops() > 0.0);
            }
        }
    }

    #[test]
    fn a_full_queue_reaps_on_the_job_thread() {
        // The file backend on io_uring at QD8, an engine queue deeper than
        // that (its own full-queue reap never triggers): the job, at its
        // QD, runs the completions itself instead of sleeping until the
        // completion thread's callback wakes it. 128 KiB reads go to the
        // ring even on a file without nowait IO (tmpfs).
        let dir = std::env::temp_dir().join(format!("ucrypt-driver-reap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("f.img");
        std::fs::write(&path, vec![7u8; 8 << 20]).unwrap();
        // Buffered: reads from the page cache complete at once, so the
        // job always finds CQEs to reap however loaded the machine is.
        let opts = backend::FileOptions {
            engine: Some(backend::IoEngine::Uring),
            direct: backend::DirectIo::Never,
            ..backend::FileOptions::default()
        };
        let fb = Arc::new(backend::FileBackend::open(&path, &opts).unwrap());
        if fb.io_engine() != backend::IoEngine::Uring {
            eprintln!("no io_uring here: nothing to measure");
            let _ = std::fs::remove_dir_all(&dir);
            return;
        }
        let be: Arc<dyn backend::Backend> = fb.clone();
        let engine = Arc::new(Target::RAW.engine(be, 64, 512).unwrap());
        let w = Workload {
            rw: Rw::RandRead,
            bs: 128 << 10,
            qd: 8,
            jobs: 1,
            runtime: Duration::from_millis(300),
        };
        let r = run_hinted(&engine, &w, 8 << 20);
        engine.shutdown().unwrap();
        let st = fb.stats();
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(r.errors, 0, "{:?}", r.first_error);
        assert!(st.uring_ops >= 20, "{st:?} {} ops", r.ops);
        // Completions ran on the job's thread: most of them on an idle
        // machine; a loaded one preempts the job for more than the
        // completion thread's standby (1 ms) now and then, and that
        // thread reaps meanwhile, so only a tenth is asserted.
        assert!(
            st.reaped_ops * 10 >= st.uring_ops,
            "reaped {} of {} ring transfers",
            st.reaped_ops,
            st.uring_ops
        );
    }

    #[test]
    fn every_job_submits_at_least_once() {
        // A deadline already past when the jobs start: each still measures.
        let be: Arc<dyn backend::Backend> = Arc::new(backend::MemBackend::new(1 << 20).unwrap());
        let engine = Arc::new(Target::RAW.engine(be, 4, 512).unwrap());
        let w = Workload {
            rw: Rw::Read,
            bs: 4096,
            qd: 2,
            jobs: 3,
            runtime: Duration::ZERO,
        };
        let r = run(&engine, &w, 1 << 20);
        assert!(r.ops >= 3, "{r:?}");
        assert_eq!(r.errors, 0);
    }

    #[test]
    fn errors_are_counted_not_hidden() {
        // 8 KiB blocks on a device of 4 KiB: every request (offset 0,
        // 8 KiB long) is out of range and must be counted as an error.
        let be: Arc<dyn backend::Backend> = Arc::new(backend::MemBackend::new(4096).unwrap());
        let engine = Arc::new(Target::RAW.engine(be, 1, 512).unwrap());
        let w = Workload {
            rw: Rw::Read,
            bs: 8192,
            qd: 1,
            jobs: 1,
            runtime: Duration::from_millis(5),
        };
        let r = run(&engine, &w, 4096);
        assert_eq!(r.ops, 0);
        assert!(r.errors > 0);
        assert!(r.first_error.is_some());
        assert_eq!(r.bytes_per_s(), 0.0);
    }

    #[test]
    fn rw_names() {
        for r in [Rw::Read, Rw::Write, Rw::RandRead, Rw::RandWrite] {
            assert_eq!(Rw::parse(r.name()), Some(r));
        }
        assert_eq!(Rw::parse("rw"), None);
        assert!(Rw::RandWrite.is_write() && Rw::RandWrite.is_random() && !Rw::Read.is_write());
    }
}
