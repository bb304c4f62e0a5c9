//! Deterministic crash injection for the crash-safety tests: with
//! `UCRYPT_REENCRYPT_CRASH_AFTER=N` in the environment the process
//! aborts right after its N-th write (a piece of hotzone data, a
//! resilience area write, one header copy). Unset, [`point`] only counts.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

static WRITES: AtomicU64 = AtomicU64::new(0);

/// Counts one write; aborts the process at the configured count.
pub(crate) fn point() {
    static LIMIT: OnceLock<Option<u64>> = OnceLock::new();
    let limit = LIMIT.get_or_init(|| {
        std::env::var("UCRYPT_REENCRYPT_CRASH_AFTER")
            .ok()
            .and_then(|v| v.parse().ok())
    });
    let n = WRITES.fetch_add(1, Ordering::Relaxed) + 1;
    if *limit == Some(n) {
        std::process::abort();
    }
}
