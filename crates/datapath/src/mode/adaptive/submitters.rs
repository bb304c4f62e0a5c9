//! How many threads keep submitting large requests to the engine: the
//! adaptive mode's view of whether every core already has a submitter of
//! its own, counted over the last few milliseconds rather than at one
//! instant.
//!
//! [`super::Board::active`] counts threads inside `submit` right now, and
//! the gather path (mode/gather.rs) never enters it. Neither sees an NBD
//! connection thread that is receiving its next payload, yet that thread
//! keeps a core busy all the same: with 4 connections on 2 CPUs (fio
//! `--numjobs 4`), every core has a connection thread, so a request handed
//! to a helper only adds a hop (a futex wake, a queue, and a helper spinning
//! up to [`super::SPIN_WINDOW`] after it on a core the connections need);
//! perf on the NBD server, 1M QD64 writes j4: the helper was 13% of the
//! samples, 6% of them spinning, where inline has no such thread.
//!
//! ```text
//!  epoch e (EPOCH long): each thread adds 1 the first time it submits in e
//!  submitters = max(count in e, count in e-1)
//! ```
//!
//! A thread is counted from its first large submission until one to two
//! epochs after its last. Per request: a thread-local compare and two
//! loads of a line written once per epoch per thread (no shared atomic
//! written per request, no lock). A thread alternating between two
//! engines within an epoch is counted again at each switch (an
//! overestimate: requests stay inline).

use std::cell::Cell;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};
use std::time::Duration;

/// Length of one counting epoch: longer than the gap between two large
/// requests of one busy connection (1 MiB at ~500 MiB/s per connection is
/// ~2 ms), short enough that a connection going quiet stops counting
/// within a few tens of milliseconds.
pub(super) const EPOCH: Duration = Duration::from_millis(10);

thread_local! {
    /// (counter's address, epoch) this thread was last counted in.
    static SEEN: Cell<(usize, u64)> = const { Cell::new((0, 0)) };
}

/// Distinct submitting threads per epoch (see the module doc).
pub(super) struct Submitters {
    /// Current epoch (1-based: 0 is "never").
    epoch: AtomicU64,
    /// Threads counted in it.
    count: AtomicUsize,
    /// Threads counted in the epoch before it (0 if that had none).
    prev: AtomicUsize,
}

impl Submitters {
    pub(super) fn new() -> Self {
        Self {
            epoch: AtomicU64::new(0),
            count: AtomicUsize::new(0),
            prev: AtomicUsize::new(0),
        }
    }

    /// Notes the calling thread as a submitter at `now` (ns since any
    /// fixed epoch) and returns how many threads submitted in this epoch
    /// or the one before (this one included).
    pub(super) fn note(&self, now: u64) -> usize {
        let e = now / EPOCH.as_nanos() as u64 + 1;
        let cur = self.epoch.load(Acquire);
        if e > cur && self.epoch.compare_exchange(cur, e, AcqRel, Acquire).is_ok() {
            // A thread that counted itself in `e` just before this swap
            // lands in `prev`, which the answer includes.
            let last = self.count.swap(0, AcqRel);
            self.prev
                .store(if e == cur + 1 { last } else { 0 }, Release);
        }
        let me = (self as *const Self as usize, e);
        if SEEN.with(|s| s.replace(me)) != me {
            self.count.fetch_add(1, AcqRel);
        }
        self.count.load(Acquire).max(self.prev.load(Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn a_thread_counts_once_per_epoch() {
        let s = Submitters::new();
        assert_eq!(s.note(MS), 1);
        assert_eq!(s.note(2 * MS), 1);
        // The next epoch: still one thread (this one, and the one before).
        assert_eq!(s.note(12 * MS), 1);
    }

    #[test]
    fn distinct_threads_count_until_they_go_quiet() {
        let s = Submitters::new();
        s.note(MS);
        std::thread::scope(|sc| {
            for _ in 0..3 {
                sc.spawn(|| s.note(2 * MS));
            }
        });
        assert_eq!(s.note(3 * MS), 4);
        // Next epoch: only this thread so far, the previous epoch's four
        // still count.
        assert_eq!(s.note(13 * MS), 4);
        // Two epochs on: the others went quiet.
        assert_eq!(s.note(23 * MS), 1);
        // A gap of several epochs forgets everyone else.
        std::thread::scope(|sc| {
            sc.spawn(|| s.note(24 * MS));
        });
        assert_eq!(s.note(60 * MS), 1);
    }
}
