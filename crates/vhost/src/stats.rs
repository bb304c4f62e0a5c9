//! Counters shared by every connection of one server: per queue, what
//! was asked and how it ended; `status` shows them. Also the server's
//! in-flight payload [`Budget`].

use std::sync::atomic::{AtomicU64, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use crate::request::{Kind, MAX_INFLIGHT_BYTES, S_IOERR, S_OK, S_UNSUPP};

/// One queue's counters (live).
#[derive(Debug, Default)]
pub(crate) struct QueueCounters {
    reads: AtomicU64,
    writes: AtomicU64,
    flushes: AtomicU64,
    discards: AtomicU64,
    write_zeroes: AtomicU64,
    get_id: AtomicU64,
    read_bytes: AtomicU64,
    write_bytes: AtomicU64,
    io_errors: AtomicU64,
    unsupported: AtomicU64,
    malformed: AtomicU64,
    started: AtomicU64,
    done: AtomicU64,
}

impl QueueCounters {
    pub(crate) fn started(&self, kind: Kind) {
        self.started.fetch_add(1, Ordering::Relaxed);
        let c = match kind {
            Kind::Read => &self.reads,
            Kind::Write => &self.writes,
            Kind::Flush => &self.flushes,
            Kind::Discard => &self.discards,
            Kind::WriteZeroes => &self.write_zeroes,
            Kind::GetId => &self.get_id,
            Kind::Malformed => &self.malformed,
            Kind::Unsupported => return,
        };
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// `bytes`: the request's data length (reads and writes).
    pub(crate) fn finished(&self, kind: Kind, status: u8, bytes: u64) {
        match status {
            S_OK => match kind {
                Kind::Read => {
                    self.read_bytes.fetch_add(bytes, Ordering::Relaxed);
                }
                Kind::Write => {
                    self.write_bytes.fetch_add(bytes, Ordering::Relaxed);
                }
                _ => {}
            },
            S_UNSUPP => {
                self.unsupported.fetch_add(1, Ordering::Relaxed);
            }
            S_IOERR => {
                self.io_errors.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
    }

    pub(crate) fn done(&self) {
        self.done.fetch_add(1, Ordering::Release);
    }

    /// A corrupt avail ring (counted as malformed; the queue stops).
    pub(crate) fn malformed_ring(&self) {
        self.malformed.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn in_flight(&self) -> u64 {
        let done = self.done.load(Ordering::Acquire);
        self.started.load(Ordering::Relaxed).saturating_sub(done)
    }

    fn snapshot(&self) -> QueueStats {
        let l = |c: &AtomicU64| c.load(Ordering::Relaxed);
        QueueStats {
            reads: l(&self.reads),
            writes: l(&self.writes),
            flushes: l(&self.flushes),
            discards: l(&self.discards),
            write_zeroes: l(&self.write_zeroes),
            get_id: l(&self.get_id),
            read_bytes: l(&self.read_bytes),
            write_bytes: l(&self.write_bytes),
            io_errors: l(&self.io_errors),
            unsupported: l(&self.unsupported),
            malformed: l(&self.malformed),
            in_flight: self.in_flight(),
        }
    }
}

/// Payload bytes (read buffers and write payloads) held by requests in
/// flight, bounded by a cap: what a guest can make the daemon allocate.
///
/// A queue thread [`Budget::take`]s a request's bytes before it allocates
/// anything for it, and the request's completion (on whatever engine
/// thread ends it) [`Budget::give`]s them back once its buffers are gone.
/// The hot path is one compare-and-swap and one atomic add; the lock and
/// condition variable are touched only while a queue thread waits for
/// room, which completions free (they never wait on a queue thread, so
/// the wait always ends).
#[derive(Debug)]
pub(crate) struct Budget {
    cap: u64,
    held: AtomicU64,
    /// Highest `held` seen (for tests and `status`).
    peak: AtomicU64,
    /// Queue threads waiting for room.
    waiting: AtomicUsize,
    lock: Mutex<()>,
    room: Condvar,
}

impl Budget {
    pub(crate) fn new(cap: u64) -> Self {
        Self {
            cap,
            held: AtomicU64::new(0),
            peak: AtomicU64::new(0),
            waiting: AtomicUsize::new(0),
            lock: Mutex::new(()),
            room: Condvar::new(),
        }
    }

    /// Takes `bytes` if they fit under the cap now (a request larger than
    /// the cap fits when nothing else is held, and then runs alone).
    pub(crate) fn try_take(&self, bytes: u64) -> bool {
        if bytes == 0 {
            return true;
        }
        let mut held = self.held.load(Ordering::SeqCst);
        loop {
            if held != 0 && held.saturating_add(bytes) > self.cap {
                return false;
            }
            let now = held + bytes;
            match self
                .held
                .compare_exchange_weak(held, now, Ordering::SeqCst, Ordering::SeqCst)
            {
                Ok(_) => {
                    if now > self.peak.load(Ordering::Relaxed) {
                        self.peak.fetch_max(now, Ordering::Relaxed);
                    }
                    return true;
                }
                Err(h) => held = h,
            }
        }
    }

    /// Takes `bytes`, waiting until completions leave room for them.
    pub(crate) fn take(&self, bytes: u64) {
        if self.try_take(bytes) {
            return;
        }
        // Announce the wait before the last look, so a completion that
        // frees room after it sees `waiting` and notifies under the lock
        // (both SeqCst: one of the two sees the other's change).
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let mut g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        while !self.try_take(bytes) {
            // The timeout only bounds a wake-up lost to a bug; room is
            // announced by `give`.
            g = self
                .room
                .wait_timeout(g, Duration::from_millis(100))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        drop(g);
        self.waiting.fetch_sub(1, Ordering::SeqCst);
    }

    /// Gives back `bytes` taken earlier, waking waiting queue threads.
    pub(crate) fn give(&self, bytes: u64) {
        if bytes == 0 {
            return;
        }
        self.held.fetch_sub(bytes, Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) > 0 {
            let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.room.notify_all();
        }
    }

    /// Bytes held now.
    pub(crate) fn held(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// The most bytes held at once so far.
    pub(crate) fn peak(&self) -> u64 {
        self.peak.load(Ordering::Relaxed)
    }
}

/// State shared by the server and all its connections.
#[derive(Debug)]
pub(crate) struct Shared {
    /// `wce` of the config space: 1 = writeback (default), 0 = write-through.
    pub(crate) wce: AtomicU8,
    pub(crate) connections: AtomicU64,
    /// Payload bytes in flight, capped at [`MAX_INFLIGHT_BYTES`]. The
    /// server serves one connection at a time, so this is that
    /// connection's cap (requests of an earlier connection still
    /// finishing count too, until they have).
    pub(crate) inflight: Budget,
    queues: Vec<QueueCounters>,
    /// Counts events for a queue index the device does not have.
    spare: QueueCounters,
}

impl Shared {
    pub(crate) fn new(queues: u16) -> Self {
        Self {
            wce: AtomicU8::new(1),
            connections: AtomicU64::new(0),
            inflight: Budget::new(MAX_INFLIGHT_BYTES),
            queues: (0..queues).map(|_| QueueCounters::default()).collect(),
            spare: QueueCounters::default(),
        }
    }

    pub(crate) fn queue(&self, i: usize) -> &QueueCounters {
        self.queues.get(i).unwrap_or(&self.spare)
    }

    pub(crate) fn snapshot(&self) -> Stats {
        Stats {
            connections: self.connections.load(Ordering::Relaxed),
            write_cache: self.wce.load(Ordering::Relaxed) != 0,
            inflight_bytes: self.inflight.held(),
            inflight_bytes_peak: self.inflight.peak(),
            queues: self.queues.iter().map(QueueCounters::snapshot).collect(),
        }
    }
}

/// A snapshot of one queue's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueStats {
    /// `VIRTIO_BLK_T_IN` requests.
    pub reads: u64,
    /// `VIRTIO_BLK_T_OUT` requests.
    pub writes: u64,
    /// Flushes.
    pub flushes: u64,
    /// Discards.
    pub discards: u64,
    /// Write-zeroes.
    pub write_zeroes: u64,
    /// GET_ID requests.
    pub get_id: u64,
    /// Bytes read successfully.
    pub read_bytes: u64,
    /// Bytes written successfully.
    pub write_bytes: u64,
    /// Requests answered `VIRTIO_BLK_S_IOERR` (malformed ones included).
    pub io_errors: u64,
    /// Requests answered `VIRTIO_BLK_S_UNSUPP`.
    pub unsupported: u64,
    /// Chains that broke the rules (outside guest memory, short header,
    /// no writable status byte, a corrupt ring).
    pub malformed: u64,
    /// Requests inside the engine now.
    pub in_flight: u64,
}

/// A snapshot of a server's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Hypervisor connections accepted so far.
    pub connections: u64,
    /// The guest's cache mode: writeback (true) or write-through.
    pub write_cache: bool,
    /// Payload bytes (read buffers, write payloads) of requests in flight
    /// now, at most [`MAX_INFLIGHT_BYTES`].
    pub inflight_bytes: u64,
    /// The most payload bytes in flight at once so far.
    pub inflight_bytes_peak: u64,
    /// Per queue.
    pub queues: Vec<QueueStats>,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn budget_admits_up_to_its_cap_and_one_oversized_request_alone() {
        let b = Budget::new(100);
        assert!(b.try_take(60) && b.try_take(40));
        assert!(!b.try_take(1), "past the cap");
        assert!(b.try_take(0), "no payload, no limit");
        b.give(60);
        assert!(!b.try_take(61));
        assert!(b.try_take(60));
        b.give(100);
        assert_eq!(b.held(), 0);
        assert!(b.try_take(250), "larger than the cap, alone");
        assert!(!b.try_take(1));
        b.give(250);
        assert_eq!(b.peak(), 250);
    }

    #[test]
    fn a_waiting_taker_is_woken_by_give() {
        let b = Arc::new(Budget::new(10));
        assert!(b.try_take(10));
        let (tx, rx) = std::sync::mpsc::channel();
        let b2 = Arc::clone(&b);
        let t = std::thread::spawn(move || {
            b2.take(5);
            tx.send(()).unwrap();
        });
        // Not admitted while the budget is full...
        assert!(rx.recv_timeout(Duration::from_millis(50)).is_err());
        // ...and admitted once a completion gives room back.
        b.give(10);
        rx.recv().unwrap();
        t.join().unwrap();
        assert_eq!(b.held(), 5);
    }
}
