//! The adaptive mode's hand-off learning: a caller that waits for each
//! completion (queue depth 1) must stay on the inline path. A wrong
//! hand-off costs that caller a cross-core wake-up, so the mode may only
//! probe, with exponential back-off. (The opposite direction, that a
//! pipelining caller gets hand-offs, depends on an idle core and is
//! measured by `examples/grid.rs`, not asserted here.)

mod common;

use std::time::{Duration, Instant};

use common::*;
use ucrypt_datapath::{CryptMode, Engine, EngineConfig};

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
    let mut n = 0u64;
    while start.elapsed() < Duration::from_millis(300) {
        e.write(off, data.clone(), false).expect("write");
        assert_eq!(e.read(off, data.len() as u32).expect("read"), data);
        off = (off + data.len() as u64) % (64 << 20);
        n += 2;
    }
    let st = e.stats();
    let handed = st.read.offloaded + st.write.offloaded;
    // Back-off starts at 5 ms and doubles: over 300 ms at most a few dozen
    // probes, whatever the machine's speed.
    assert!(
        handed <= 40,
        "{handed} of {n} requests handed off to a helper although the caller waits for each"
    );
    assert_eq!(st.read.requests + st.write.requests, n);
    e.shutdown().expect("shutdown");
}
