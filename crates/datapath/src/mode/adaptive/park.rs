//! How an idle helper parks and is woken.
//!
//! A submitter that queues work (or wants a warm helper for what follows)
//! nudges one parked helper: `nudged` tells a helper woken with nothing to
//! do that the wake-up was meant (then it spins a full window, `spin.rs`)
//! and not spurious. A wake-up consumes the nudge whether or not work came
//! with it. A nudge left set by a helper that found work made its next park
//! return at once and spin a full [`super::SPIN_WINDOW`] as if asked to be
//! warm: on a 4M QD64 NBD read (one connection, the completion thread
//! decrypting every other read itself), the helper spun ~45% of its CPU
//! samples, a core's share taken from the io-wq copy and the client.

use std::sync::atomic::Ordering::SeqCst;

use super::Board;

impl Board {
    /// Wakes one parked helper, if any.
    pub(super) fn nudge(&self) {
        let g = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        if *g > 0 {
            self.nudged.store(true, SeqCst);
            self.wake.notify_one();
        }
    }

    /// Parks the calling helper until there is work, the board closes, or
    /// a submitter nudges it; consumes the nudge either way.
    pub(super) fn park(&self) {
        let mut g = self.parked.lock().unwrap_or_else(|e| e.into_inner());
        *g += 1;
        while self.idle() && !self.closed.load(SeqCst) && !self.nudged.load(SeqCst) {
            g = self.wake.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        // Under the lock: a nudge is only set while a helper is parked.
        self.nudged.store(false, SeqCst);
        *g -= 1;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::SeqCst;
    use std::sync::Arc;
    use std::time::Duration;

    use super::super::{Board, Task};

    /// Parks a helper on another thread; returns its handle once it is
    /// parked.
    fn parked(b: &Arc<Board>) -> std::thread::JoinHandle<()> {
        let before = *b.parked.lock().unwrap();
        let b2 = b.clone();
        let h = std::thread::spawn(move || b2.park());
        while *b.parked.lock().unwrap() == before && !h.is_finished() {
            std::thread::yield_now();
        }
        h
    }

    #[test]
    fn a_nudge_that_brought_work_is_spent() {
        let b = Arc::new(Board::new());
        // Parked, then woken for work: the submitter queues, then nudges.
        let h = parked(&b);
        b.handoff
            .lock()
            .unwrap()
            .push_back(Task::Crypto(None, Box::new(|| ())));
        b.handoff_len.fetch_add(1, SeqCst);
        b.nudge();
        h.join().unwrap();
        assert!(b.take_handoff().is_some());
        // Idle again: the next park must wait, not return on the old nudge.
        let h = parked(&b);
        std::thread::sleep(Duration::from_millis(30));
        assert!(!h.is_finished(), "park returned on a spent nudge");
        // A fresh nudge with no work still wakes it (asked to be warm).
        b.nudge();
        h.join().unwrap();
        assert!(!b.nudged.load(SeqCst));
    }
}
