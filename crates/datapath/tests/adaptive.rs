//! The adaptive mode's hand-off learning: a caller that waits for each
//! completion (queue depth 1) must stay on the inline path. A wrong
//! hand-off costs that caller a cross-core wake-up, so the mode may only
//! probe, with exponential back-off. (The opposite direction, that a
//! pipelining caller gets hand-offs, depends on an idle core and is
//! measured by the bench, not asserted here.)
//!
//! The run is bounded by a request count, not a time window. Every
//! hand-off a queue-depth-1 caller gets is a miss (it cannot submit again
//! before the completion), and each miss pauses hand-offs for 5 ms,
//! doubling up to 80 ms. So however fast or slow the machine, the number of
//! hand-offs is bounded by how many of those pauses fit in the time the run
//! took: the bound is derived from the run, never a threshold on it.

mod common;

use std::time::{Duration, Instant};

use common::*;
use ucrypt_datapath::{CryptMode, Engine, EngineConfig};

/// Write + read pairs the caller runs, one at a time.
const PAIRS: u64 = 1000;

/// Most hand-offs a queue-depth-1 caller can get within `elapsed`: the
/// first is free, each later one waits out the back-off the previous miss
/// started (`OFFLOAD_BACKOFF_MIN` doubling to `OFFLOAD_BACKOFF_MAX` in
/// mode/adaptive.rs).
fn probes_allowed(elapsed: Duration) -> u64 {
    let (mut pause, max) = (Duration::from_millis(5), Duration::from_millis(80));
    let (mut used, mut probes) = (Duration::ZERO, 1);
    while used + pause <= elapsed {
        used += pause;
        probes += 1;
        pause = (pause * 2).min(max);
    }
    probes
}

#[test]
fn probes_allowed_follow_the_back_off() {
    assert_eq!(probes_allowed(Duration::ZERO), 1);
    assert_eq!(probes_allowed(Duration::from_millis(4)), 1);
    assert_eq!(probes_allowed(Duration::from_millis(5)), 2);
    assert_eq!(probes_allowed(Duration::from_millis(15)), 3);
    // 5 + 10 + 20 + 40 = 75, then 80 each.
    assert_eq!(probes_allowed(Duration::from_millis(75)), 5);
    assert_eq!(probes_allowed(Duration::from_millis(155)), 6);
    assert_eq!(probes_allowed(Duration::from_millis(75 + 800)), 15);
}

#[test]
fn queue_depth_one_caller_is_not_handed_off() {
    let b = backing(Store::Mem, (64 << 20) + DATA_OFFSET);
    let cfg = EngineConfig {
        mode: CryptMode::Adaptive,
        queue_depth: 16,
        ..EngineConfig::default()
    };
    let e = Engine::new(volume(b.backend.clone(), XTS, 64 << 20), cfg).expect("engine");
    let data = vec![0x3cu8; 64 << 10];
    let start = Instant::now();
    let mut off = 0u64;
    for _ in 0..PAIRS {
        e.write(off, data.clone(), false).expect("write");
        assert_eq!(e.read(off, data.len() as u32).expect("read"), data);
        off = (off + data.len() as u64) % (64 << 20);
    }
    let allowed = probes_allowed(start.elapsed());
    let st = e.stats();
    let handed = st.read.offloaded + st.write.offloaded;
    assert!(
        handed <= allowed,
        "{handed} of {} requests handed off to a helper although the caller waits for \
         each; the back-off allows at most {allowed} over this run",
        2 * PAIRS
    );
    assert_eq!(st.read.requests + st.write.requests, 2 * PAIRS);
    e.shutdown().expect("shutdown");
}

/// Runs `n` requests one at a time through `submit_hinted` with `behind`,
/// each a 1 MiB write then its read-back; returns the hand-off count.
fn hinted_pairs(behind: u32, n: u64) -> u64 {
    use ucrypt_datapath::{Hint, Op, Request};
    let b = backing(Store::Mem, (64 << 20) + DATA_OFFSET);
    let cfg = EngineConfig {
        mode: CryptMode::Adaptive,
        queue_depth: 16,
        workers: 2,
        ..EngineConfig::default()
    };
    let e = Engine::new(volume(b.backend.clone(), XTS, 64 << 20), cfg).expect("engine");
    let hint = Hint {
        behind,
        ..Hint::default()
    };
    let run = |op: Op, offset: u64| {
        let (tx, rx) = std::sync::mpsc::channel();
        let req = Request {
            op,
            offset,
            fua: false,
        };
        e.submit_hinted(req, hint, move |c| tx.send(c).expect("receiver"));
        rx.recv().expect("one completion")
    };
    for i in 0..n {
        let off = (i << 20) % (64 << 20);
        let data = vec![i as u8; 1 << 20];
        run(Op::Write { data: data.clone() }, off).expect("write");
        let back = run(Op::Read { len: 1 << 20 }, off).expect("read");
        assert_eq!(back.as_deref(), Some(&data[..]), "request {i}");
    }
    let st = e.stats();
    assert_eq!(st.read.requests + st.write.requests, 2 * n);
    e.shutdown().expect("shutdown");
    st.read.offloaded + st.write.offloaded
}

/// A frontend that says nothing is behind a request (its caller waits for
/// it) never gets a hand-off: not even the one probe the learning allows.
#[test]
fn hinted_queue_depth_one_is_never_handed_off() {
    assert_eq!(hinted_pairs(0, 50), 0);
}

/// A frontend that says more requests are behind gets its large requests
/// handed to an idle helper at once, with no learning; the very first one
/// finds the helper free. With a single CPU every core already has a
/// submitter, and nothing is handed off.
#[test]
fn hinted_queue_hands_large_requests_to_a_helper() {
    let handed = hinted_pairs(3, 50);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    if cpus >= 2 {
        assert!(
            handed >= 1,
            "no hand-off although the frontend said 3 are behind"
        );
    } else {
        assert_eq!(handed, 0);
    }
}
