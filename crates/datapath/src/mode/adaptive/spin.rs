//! How long an idle helper spins before it parks, learned per helper from
//! how soon work came back after its earlier idle spells.
//!
//! Spinning only pays when it saves a wake-up: a parked helper costs its
//! waker a futex call and the request a wake-up's latency ([`WAKE_COST`]),
//! a spinning one costs a whole core for as long as it spins, taken from
//! the caller, the frontend's threads and the client on a small machine
//! (an NBD 1M QD8 read, requests about 1 ms apart: a helper spinning its
//! full 300 µs after each was ~37% of the daemon's CPU samples). So:
//!
//! ```text
//!  idle spell ends with work after t ──► t ≤ WAKE_COST: spin at least 2t next time
//!                                        t >  WAKE_COST: halve the window
//!  window spent, no work (park)      ──► halve the window (not below SPIN_MIN)
//!  woken with no work (nudged to be warm for what follows) ──► SPIN_WINDOW
//! ```
//!
//! A caller that keeps hand-offs coming back to back keeps the window
//! (every spell ends within a few µs); one whose requests come further apart
//! than a wake-up costs brings it down to [`SPIN_MIN`] within a few
//! requests, and its helpers park almost at once.

use std::time::Duration;

use super::SPIN_WINDOW;

/// The shortest window: covers a submitter that comes straight back.
pub(super) const SPIN_MIN: Duration = Duration::from_micros(20);
/// About what waking a parked helper costs (futex wake, then the
/// scheduler running it on the other core: 30–80 µs measured on the
/// 2-vCPU dev VM). Waiting longer than this for work is not worth a core.
pub(super) const WAKE_COST: Duration = Duration::from_micros(50);

/// One helper's spin window.
pub(super) struct Spin {
    window: Duration,
}

impl Spin {
    /// A fresh helper spins the longest window.
    pub(super) fn new() -> Self {
        Self {
            window: SPIN_WINDOW,
        }
    }

    /// How long to spin in the idle spell now starting.
    pub(super) fn window(&self) -> Duration {
        self.window
    }

    /// The idle spell ended with work `after` it began (spinning or
    /// parked).
    pub(super) fn found(&mut self, after: Duration) {
        if after <= WAKE_COST {
            self.window = self.window.max(after * 2).min(SPIN_WINDOW);
        } else {
            self.shrink();
        }
    }

    /// The window passed with nothing to do: the helper parks.
    pub(super) fn missed(&mut self) {
        self.shrink();
    }

    /// Woken with nothing to do: a submitter wants a warm helper for the
    /// requests that follow.
    pub(super) fn asked(&mut self) {
        self.window = SPIN_WINDOW;
    }

    fn shrink(&mut self) {
        self.window = (self.window / 2).max(SPIN_MIN);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparse_work_brings_the_window_down_to_the_floor() {
        let mut s = Spin::new();
        for _ in 0..8 {
            s.missed();
            s.found(Duration::from_micros(900));
        }
        assert_eq!(s.window(), SPIN_MIN);
    }

    #[test]
    fn work_that_comes_back_soon_keeps_or_grows_the_window() {
        let mut s = Spin::new();
        s.found(Duration::from_micros(2));
        assert_eq!(s.window(), SPIN_WINDOW);
        for _ in 0..8 {
            s.missed();
        }
        assert_eq!(s.window(), SPIN_MIN);
        // Found 40 µs after parking: a longer spin would have caught it.
        s.found(Duration::from_micros(40));
        assert_eq!(s.window(), Duration::from_micros(80));
        s.asked();
        assert_eq!(s.window(), SPIN_WINDOW);
    }

    #[test]
    fn work_found_later_than_a_wake_up_shrinks_the_window() {
        let mut s = Spin::new();
        s.found(WAKE_COST + Duration::from_micros(1));
        assert_eq!(s.window(), SPIN_WINDOW / 2);
    }
}
