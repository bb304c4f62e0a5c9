//! The adaptive mode's crypto hand-off for the gather path: on a
//! completion-driven backend (mode/gather.rs, `run_async`) the IO of a
//! request is already off the submitter, but its crypto was not: every
//! write was encrypted on the frontend's connection thread and every read
//! decrypted on the backend's one completion thread, so a single
//! connection's large IO used one core for crypto while classic spreads it
//! over its workers.
//!
//! ```text
//!  connection thread: write 1M ─► helper free? ─ yes ─► queue "encrypt, submit_async" ─► next request
//!                                              └ no  ─► encrypt here, submit_async
//!  completion thread: read 1M done ─► helper free? ─ yes ─► queue "decrypt, complete" ─► next CQE
//!                                                 └ no  ─► decrypt and complete here
//! ```
//!
//! Reads below [`WAKE_MIN`] follow the policy of a hinted hand-off in
//! process (`hint.rs`): only a piece big enough to pay for the hop, only to
//! a helper that is free (no queue builds behind a busy one: the completion
//! thread is then one more worker), only to a helper already spinning, and
//! the same late-start back-off (a helper that began a piece later than the
//! piece took to run pauses these hand-offs).
//!
//! A read of [`WAKE_MIN`] and up may also wake a parked helper and queue
//! behind a busy one, up to [`READ_QUEUE`] pieces per helper, and is
//! neither stopped nor scored by the late-start back-off. The completion
//! thread is the one thread that sees every read finish, and a 1 MiB read
//! it decrypts and answers itself (the NBD reply is a 1 MiB socket write)
//! is ~0.3 ms in which it reaps nothing. Measured on a real disk (ext4 on
//! virtio, O_DIRECT through io_uring, NBD 1M QD8 reads from four
//! connections on 2 CPUs) with reads moving only to a free helper under
//! the back-off: 4% of them reached the helper (its starts were scored
//! late, which paused read hand-offs), the completion thread decrypted and
//! answered the rest alone, and adaptive ran at 0.69 of classic, whose
//! workers share that work. With the short queue the helper and the
//! completion thread share the large reads between them, the completion
//! thread taking one whenever the helper has [`READ_QUEUE`] waiting; a
//! queued piece starts "late" by design, so it is not scored. Small
//! requests (4 KiB) never move.
//!
//! Writes differ in who pays for keeping a piece: it is the connection
//! thread, the one thread that receives every payload of its client, so a
//! write it encrypts is a payload it does not receive meanwhile. Measured
//! through NBD (1M QD8 writes, one connection, perf): with writes moving
//! only to a free helper, the connection thread ran ~78% of the encryption
//! itself (the one helper was still busy with the previous piece when the
//! next arrived, or paused by the late-start back-off), and adaptive ran
//! level with inline, below classic, whose connection thread only
//! receives. So a write of [`WAKE_MIN`] and up may also queue behind a
//! busy helper, up to [`WRITE_QUEUE`] pieces per helper, and write
//! hand-offs neither consult nor feed the late-start back-off: the
//! submitter does not wait for them, and a piece queued behind another
//! starts "late" by design. A helper already spinning takes a free write
//! from [`OFFLOAD_MIN`], as before. No write moves while as many threads
//! as CPUs keep submitting large requests (`submitters.rs`: 4 NBD
//! connections on 2 CPUs): every core has a connection thread already, so
//! the hand-off gains no core, and the helpers park.

use std::sync::atomic::Ordering::{Relaxed, SeqCst};
use std::time::Instant;

use super::{hint, Adaptive, Board, Task, OFFLOAD_MIN, WAKE_MIN};
use crate::Ctx;

/// Large writes' pieces (running or queued) per helper before the
/// connection thread encrypts one itself. At 2, NBD 1M QD8 writes on one
/// connection still had the connection thread encrypt about a third of
/// them (a woken helper starts ~50-80 µs late, and two pieces queue in
/// that time), and ran at 0.84 of classic (median of 12 same-round
/// ratios); at 8, 0.94 (QD64: 0.96 -> 1.13), so a piece waits for the
/// helper rather than stop the one thread that receives.
const WRITE_QUEUE: usize = 8;

/// Large reads' pieces (running or queued) per helper before the
/// completion thread decrypts and answers one itself. Kept short: unlike a
/// connection thread, the completion thread has nothing better to do than
/// a read's crypto once its completions are reaped, so it shares the work
/// rather than wait behind a queue.
const READ_QUEUE: usize = 2;

impl Adaptive {
    /// Whether the crypto of a `len`-byte request on the gather path goes
    /// to a helper (see the module doc). Called on the submitter for a
    /// write, on the backend's completion thread for a read (`read`: see
    /// the module doc for what it may wake a helper for).
    pub(crate) fn crypto_handoff_ok(&self, ctx: &Ctx, len: u64, read: bool) -> bool {
        let Some(c) = &ctx.crypt else { return false };
        if self.helpers == 0 || c.is_null() || len < OFFLOAD_MIN {
            return false;
        }
        let b = &self.board;
        let now = ctx.core.nanos(Instant::now());
        // Large reads are not held back by the late-start back-off: see
        // the module doc.
        if read && len < WAKE_MIN && now < b.hinted_off_until.load(Relaxed) {
            return false;
        }
        if !read {
            // Every core has a submitting thread of its own (say 4 NBD
            // connections on 2 CPUs): the hop gains no core, only costs
            // (see `submitters.rs`); helpers park (`contended_at`). A lone
            // submitter keeps its hand-offs even on one CPU, as before.
            let submitters = b.submitters.note(now);
            if submitters > 1 && ctx.core.saturated(now, submitters) {
                return false;
            }
        }
        let taken = b.handoff_len.load(Relaxed) + b.busy.load(Relaxed);
        if taken < self.helpers {
            // A spinning helper is free at once; otherwise one must be woken.
            return b.spinning.load(Relaxed) > taken || len >= WAKE_MIN;
        }
        // Every helper taken: a large request still queues behind them.
        let queue = if read { READ_QUEUE } else { WRITE_QUEUE };
        len >= WAKE_MIN && taken < queue * self.helpers
    }

    /// Queues `f` (the crypto of a `len`-byte request and what follows it)
    /// for a helper, waking one if none is spinning; the start of a read
    /// below [`WAKE_MIN`] is scored for the late-start back-off, a large
    /// read's or a write's is not (see the module doc).
    pub(crate) fn hand_crypto(&self, read: bool, len: u64, f: Box<dyn FnOnce() + Send>) {
        let b = &self.board;
        let queued = (read && len < WAKE_MIN).then(Instant::now);
        b.handoff
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push_back(Task::Crypto(queued, f));
        b.handoff_len.fetch_add(1, SeqCst);
        if b.spinning.load(SeqCst) == 0 {
            b.nudge();
        }
    }
}

/// Runs a queued crypto hand-off on a helper and, if it was `queued` for
/// scoring (a read), scores its start as a hinted hand-off is scored.
pub(super) fn run(board: &Board, ctx: &Ctx, queued: Option<Instant>, f: Box<dyn FnOnce() + Send>) {
    let start = Instant::now();
    f();
    if let Some(q) = queued {
        hint::score_start(board, ctx, q, start);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::SeqCst;
    use std::sync::mpsc;

    use super::super::test_engine;
    use super::{READ_QUEUE, WRITE_QUEUE};

    #[test]
    fn a_large_request_queues_behind_a_busy_helper_until_its_queue_is_full() {
        // Two CPUs: one helper, and this thread the one submitter.
        let e = test_engine(2);
        let g = e.current_gen().expect("a generation");
        let a = g.adaptive().expect("adaptive");
        // The helper takes a piece and stays busy with it.
        let (started_tx, started) = mpsc::channel();
        let (release, release_rx) = mpsc::channel::<()>();
        a.hand_crypto(
            false,
            1 << 20,
            Box::new(move || {
                started_tx.send(()).unwrap();
                release_rx.recv().unwrap();
            }),
        );
        started.recv().unwrap();
        assert_eq!(a.board.busy.load(SeqCst), 1);
        // A small write or read never queues behind it. A 1 MiB read does
        // until READ_QUEUE pieces per helper are taken, a 1 MiB write until
        // WRITE_QUEUE are.
        assert!(!a.crypto_handoff_ok(&g.ctx, 64 << 10, false));
        assert!(!a.crypto_handoff_ok(&g.ctx, 64 << 10, true));
        let mut queued = 0;
        while a.crypto_handoff_ok(&g.ctx, 1 << 20, true) {
            a.hand_crypto(true, 1 << 20, Box::new(|| {}));
            queued += 1;
            assert!(queued < 64, "the queue has no bound");
        }
        assert_eq!(queued + 1, READ_QUEUE * a.helpers);
        assert!(!a.crypto_handoff_ok(&g.ctx, 4 << 20, true), "a read queued");
        while a.crypto_handoff_ok(&g.ctx, 1 << 20, false) {
            a.hand_crypto(false, 1 << 20, Box::new(|| {}));
            queued += 1;
            assert!(queued < 64, "the queue has no bound");
        }
        assert_eq!(queued + 1, WRITE_QUEUE * a.helpers);
        assert!(!a.crypto_handoff_ok(&g.ctx, 4 << 20, true), "a read queued");
        release.send(()).unwrap();
    }

    #[test]
    fn the_late_start_back_off_stops_small_reads_only() {
        let e = test_engine(2);
        let g = e.current_gen().expect("a generation");
        let a = g.adaptive().expect("adaptive");
        // A read hand-off scored late pauses read hand-offs.
        let now = std::time::Instant::now();
        super::super::hint::score_start(
            &a.board,
            &g.ctx,
            now - std::time::Duration::from_millis(50),
            now,
        );
        assert!(a.board.hinted_off_until.load(SeqCst) > 0);
        // A 1 MiB read still wakes the parked helper; a 64 KiB read would
        // need a spinning one anyway, and the pause stops it whatever the
        // helper does.
        assert!(a.crypto_handoff_ok(&g.ctx, 1 << 20, true));
        a.board.spinning.fetch_add(1, SeqCst);
        assert!(!a.crypto_handoff_ok(&g.ctx, 64 << 10, true));
        a.board.spinning.fetch_sub(1, SeqCst);
    }
}
