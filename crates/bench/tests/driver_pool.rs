//! The in-process driver hands read results back to the buffer pool, as
//! the NBD and vhost-user-blk frontends do after their reply: otherwise
//! every large read of a run takes a fresh, never-touched buffer (page
//! faults and zeroing per request, which fio with its reused buffers does
//! not pay), and `--via file`'s 1M rows measure that instead of the IO
//! path. Own test binary: the pool is process-wide.

use std::sync::Arc;
use std::time::Duration;

use ucrypt_bench::driver::{run_hinted, Rw, Workload};
use ucrypt_bench::target::Target;

#[test]
fn large_read_results_go_back_to_the_pool() {
    let size = 16 << 20;
    let be: Arc<dyn backend::Backend> = Arc::new(backend::MemBackend::new(size).unwrap());
    let engine = Arc::new(Target::RAW.engine(be, 4, 4096).unwrap());
    assert_eq!(datapath::bufpool::held(), 0, "nothing pooled yet");
    let w = Workload {
        rw: Rw::RandRead,
        bs: 1 << 20,
        qd: 4,
        jobs: 1,
        runtime: Duration::from_millis(30),
    };
    let r = run_hinted(&engine, &w, size);
    assert_eq!(r.errors, 0, "{:?}", r.first_error);
    assert!(r.ops > 0);
    // Every request has completed (the driver drains), so each read's
    // buffer has been handed back (up to the pool's cap).
    let held = datapath::bufpool::held();
    assert!(
        held >= 1 << 20,
        "{} reads completed, the pool holds {held} bytes",
        r.ops
    );
    engine.shutdown().unwrap();
}
