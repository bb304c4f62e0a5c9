//! Shutdown joins every engine thread, including those of generations
//! replaced by live reconfiguration, and dropping an engine does the same.
//! (Alone in its test binary: it counts the process's threads.)

mod common;

use std::sync::Arc;

use common::*;
use ucrypt_datapath::{Engine, Error};

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .count()
}

/// The thread count once it has settled at `want` (or the last count seen).
/// A joined thread can still be listed in /proc/self/task for a moment: the
/// kernel wakes the joiner (CLONE_CHILD_CLEARTID) before it reaps the task.
/// A thread that was never joined stays listed, so this still fails then.
fn settled_threads(want: usize) -> usize {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let n = threads();
        if n == want || std::time::Instant::now() > deadline {
            return n;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

#[test]
fn shutdown_and_drop_join_all_threads() {
    let before = threads();
    let mem: Arc<dyn backend::Backend> = Arc::new(backend::MemBackend::new(2 << 20).expect("mem"));
    for (name, cfg, force) in configs() {
        let e = Engine::new(volume(mem.clone(), XTS, 1 << 20), cfg.clone()).expect("engine");
        e.force_split(force);
        for (_, other, _) in configs().into_iter().take(3) {
            e.write(0, vec![1; 256 << 10], false).expect("write");
            e.reconfigure(other).expect("reconfigure");
        }
        e.reconfigure(cfg).expect("back");
        assert_eq!(e.read(0, 4096).expect("read"), vec![1; 4096]);
        e.shutdown().expect("shutdown");
        assert!(matches!(
            e.write(0, vec![0; 512], false),
            Err(Error::Shutdown)
        ));
        assert_eq!(
            settled_threads(before),
            before,
            "{name}: threads left after shutdown"
        );
        // Dropping without an explicit shutdown also joins.
        let e =
            Engine::new(volume(mem.clone(), XTS, 1 << 20), configs()[0].1.clone()).expect("engine");
        e.write(4096, vec![2; 8192], true).expect("write");
        drop(e);
        assert_eq!(
            settled_threads(before),
            before,
            "{name}: threads left after drop"
        );
    }
}
