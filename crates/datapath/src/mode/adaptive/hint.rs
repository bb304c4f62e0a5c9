//! The adaptive mode's hinted path: a frontend that knows its caller's
//! queue says so ([`crate::Engine::submit_hinted`]), and the request goes to
//! a helper, is split, or runs inline without the learned queue depth.

use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;

use super::{Adaptive, OffloadKind, OFFLOAD_MIN};
use crate::check::Work;
use crate::mode::inline::{self, Pass};
use crate::{Completion, Ctx, Hint};

impl Adaptive {
    /// Runs a request of a movable size that came with a [`Hint`]: with
    /// requests behind it, handed to a helper that is not already busy;
    /// else split or inline as an unhinted request would be. Hinted
    /// hand-offs are not scored. `at` is the request's (submission number,
    /// length, submitters inside the engine).
    pub(super) fn submit_hinted(
        &self,
        ctx: &Ctx,
        w: Work,
        t0: Instant,
        h: Hint,
        at: (u64, u64, usize),
        done: impl FnOnce(Completion) + Send + 'static,
    ) {
        let (seq, len, submitters) = at;
        if h.behind > 0 && self.hinted_offload_ok(ctx, len, submitters, t0) {
            return self.offload(w, t0, seq, Box::new(done), OffloadKind::Hinted);
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
        if submitters >= ctx.core.ncpu {
            ctx.core.contended_at.store(ctx.core.nanos(t0), Relaxed);
            return false;
        }
        self.board.handoff_len.load(Relaxed) + self.board.busy.load(Relaxed) < self.helpers
    }
}
