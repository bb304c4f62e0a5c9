//! Counters shared by every connection of one server: per queue, what
//! was asked and how it ended; `status` shows them.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use crate::request::{Kind, S_IOERR, S_OK, S_UNSUPP};

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

/// State shared by the server and all its connections.
#[derive(Debug)]
pub(crate) struct Shared {
    /// `wce` of the config space: 1 = writeback (default), 0 = write-through.
    pub(crate) wce: AtomicU8,
    pub(crate) connections: AtomicU64,
    queues: Vec<QueueCounters>,
    /// Counts events for a queue index the device does not have.
    spare: QueueCounters,
}

impl Shared {
    pub(crate) fn new(queues: u16) -> Self {
        Self {
            wce: AtomicU8::new(1),
            connections: AtomicU64::new(0),
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
    /// Per queue.
    pub queues: Vec<QueueStats>,
}
