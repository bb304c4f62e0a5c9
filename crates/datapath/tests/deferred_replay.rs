//! A request that `Gate::release` hands back from the front of the deferred
//! list must take the slot that release freed, not queue again behind the
//! requests deferred after it: with nothing else in flight no other release
//! would come, and every deferred request would wait forever.
//!
//! The order is forced by the queue depth, not hoped for: classic mode runs
//! reads on the engine's threads, so A's callback runs on an engine thread,
//! where the gate defers instead of blocking. With a queue of depth 1 that
//! callback's first read (R1) takes the slot A freed and the next three are
//! deferred in order; each completion must then replay the next one.

mod common;

use std::sync::mpsc::channel;
use std::sync::Arc;
use std::time::Duration;

use backend::MemBackend;
use common::*;
use ucrypt_datapath::{Completion, CryptMode, Engine, EngineConfig, Op, Request};

/// Liveness bound on each awaited completion (not a performance threshold).
const EVENT: Duration = Duration::from_secs(30);

fn read(offset: u64) -> Request {
    Request {
        op: Op::Read { len: 4096 },
        offset,
        fua: false,
    }
}

#[test]
fn deferred_requests_all_complete_at_queue_depth_one() {
    let mem = Arc::new(MemBackend::new(2 << 20).expect("mem"));
    let cfg = EngineConfig {
        mode: CryptMode::Classic,
        queue_depth: 1,
        ..EngineConfig::default()
    };
    let engine = Arc::new(Engine::new(volume(mem, XTS, 1 << 20), cfg).expect("engine"));
    let (tx, done) = channel::<(u64, Completion)>();
    let weak = Arc::downgrade(&engine);
    let tx0 = tx.clone();
    engine.submit(read(0), move |c| {
        let e = weak.upgrade().expect("engine alive");
        for i in 1..=4u64 {
            let t = tx0.clone();
            e.submit(read(i * 4096), move |c| t.send((i, c)).unwrap());
        }
        drop(e);
        tx0.send((0, c)).unwrap();
    });
    drop(tx);
    let mut seen = Vec::new();
    for _ in 0..5 {
        match done.recv_timeout(EVENT) {
            Ok((i, c)) => {
                assert!(c.is_ok(), "read {i} failed: {:?}", c.err());
                seen.push(i);
            }
            Err(_) => panic!("only {seen:?} of 5 reads completed: the deferred rest are stranded"),
        }
    }
    seen.sort_unstable();
    assert_eq!(seen, [0, 1, 2, 3, 4]);
    let s = engine.stats();
    assert!(
        s.max_in_flight <= 1,
        "queue depth 1 was exceeded: {}",
        s.max_in_flight
    );
}
