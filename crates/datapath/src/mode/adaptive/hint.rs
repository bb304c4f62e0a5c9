//! The adaptive mode's hinted path: a frontend that knows its caller's
//! queue says so ([`crate::Engine::submit_hinted`]), and the request goes to
//! a helper, is split, or runs inline without the learned queue depth.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use super::{Adaptive, Board, OffloadKind, OFFLOAD_BACKOFF_MAX, OFFLOAD_BACKOFF_MIN, OFFLOAD_MIN};
use crate::check::Work;
use crate::mode::inline::{self, Pass};
use crate::{Completion, Ctx, Hint};

impl Adaptive {
    /// Runs a request of a movable size that came with a [`Hint`]: with
    /// requests behind it, handed to a helper that is not already busy;
    /// else split or inline as an unhinted request would be. Hinted
    /// hand-offs are scored only on their helper's start ([`score_start`]).
    /// `at` is the request's (length, submitters inside the engine).
    pub(super) fn submit_hinted(
        &self,
        ctx: &Ctx,
        w: Work,
        t0: Instant,
        h: Hint,
        at: (u64, usize),
        done: impl FnOnce(Completion) + Send + 'static,
    ) {
        let (len, submitters) = at;
        if h.behind > 0 && self.hinted_offload_ok(ctx, len, submitters, t0) {
            return self.offload(w, t0, Box::new(done), OffloadKind::Hinted);
        }
        if let Some((w, done)) = self.try_split(ctx, w, t0, len, submitters, done) {
            inline::run(ctx, w, t0, Pass::adaptive(ctx), done);
        }
    }

    /// Hand off a request whose caller is known (from the frontend's
    /// [`Hint`]) to have more requests behind it. The submitter does not
    /// wait for the helper, so neither a wake-up nor a helper sharing its
    /// core with other load holds the caller up: only the request's size
    /// (below [`OFFLOAD_MIN`] the hop costs more than the overlap gives),
    /// a submitter on every core already, and helpers all taken (then the
    /// submitter runs it itself, as one more worker) keep it inline.
    fn hinted_offload_ok(&self, ctx: &Ctx, len: u64, submitters: usize, t0: Instant) -> bool {
        let Some(c) = &ctx.crypt else { return false };
        if self.helpers == 0 || c.is_null() || len < OFFLOAD_MIN {
            return false;
        }
        let now = ctx.core.nanos(t0);
        if ctx.core.saturated(now, submitters) {
            return false;
        }
        if now < self.board.hinted_off_until.load(Relaxed) {
            return false;
        }
        self.board.handoff_len.load(Relaxed) + self.board.busy.load(Relaxed) < self.helpers
    }
}

/// Scores a hinted hand-off when its helper finished it: started `late`
/// when the helper began it (`start`) more than the request's own run
/// time after it was admitted (`t0`), i.e. the submitter would have been
/// done with it before the helper even began. That happens when the
/// helper had to be woken onto a core that other load keeps busy (a
/// scheduler slice, not a ~50 µs wake-up): hinted hand-offs then pause,
/// 5 ms doubling to 80 ms, as the learned ones do after a miss, and the
/// submitter runs its requests inline. A prompt start resets the pause.
pub(super) fn score_start(board: &Board, ctx: &Ctx, t0: Instant, start: Instant) {
    let end = Instant::now();
    let (waited, ran) = (
        start.saturating_duration_since(t0),
        end.saturating_duration_since(start),
    );
    if !late(waited, ran) {
        if board.hinted_late.load(Relaxed) != 0 {
            board.hinted_late.store(0, Relaxed);
        }
        return;
    }
    let late = board.hinted_late.fetch_add(1, Relaxed).min(16);
    let pause = (OFFLOAD_BACKOFF_MIN.as_nanos() as u64)
        .saturating_mul(1 << late)
        .min(OFFLOAD_BACKOFF_MAX.as_nanos() as u64);
    board
        .hinted_off_until
        .store(ctx.core.nanos(end) + pause, Relaxed);
}

/// A helper starting a request this soon is never late, however short the
/// request: a few wake-ups of a parked helper on an idle core (~80 µs
/// each), well under a scheduler slice (ms) on a busy one.
const LATE_FLOOR: Duration = Duration::from_micros(250);

/// A hand-off that `waited` for its helper and then `ran` that long was
/// late: the submitter would have finished it before the helper began.
fn late(waited: Duration, ran: Duration) -> bool {
    waited > ran.max(LATE_FLOOR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_helper_is_late_only_past_the_request_and_a_wake_up() {
        let us = Duration::from_micros;
        // A 1 MiB request (~200 µs) picked up after a wake-up: on time.
        assert!(!late(us(60), us(200)));
        // A short request after one wake-up: on time (the floor).
        assert!(!late(us(200), us(5)));
        // Woken onto a busy core: a scheduler slice later.
        assert!(late(us(3000), us(200)));
        assert!(late(us(300), us(5)));
    }
}
