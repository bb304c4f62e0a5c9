//! The two primitives the classic pipeline is built from: a work queue (the
//! analog of a kernel workqueue feeding kthreads) and a bounded bounce
//! buffer pool (the analog of dm-crypt's `page_pool` mempool).
//!
//! Hand-written. Neither queue can grow without bound: every item in a
//! [`WorkQueue`] is an admitted request, and the admission gate caps those at
//! `queue_depth`; a [`BouncePool`] blocks allocators once its byte budget is
//! lent out, exactly as `mempool_alloc` sleeps until a buffer is freed.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};

struct QState<T> {
    items: VecDeque<T>,
    closed: bool,
    idle: usize,
}

/// A multi-producer, multi-consumer FIFO with blocking pop.
pub(crate) struct WorkQueue<T> {
    st: Mutex<QState<T>>,
    cv: Condvar,
}

fn relock<G>(r: Result<G, std::sync::PoisonError<G>>) -> G {
    // Critical sections here only move items in and out of a VecDeque; a
    // panic cannot leave it inconsistent, so poisoning is ignored.
    r.unwrap_or_else(|e| e.into_inner())
}

impl<T> WorkQueue<T> {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            st: Mutex::new(QState {
                items: VecDeque::with_capacity(capacity),
                closed: false,
                idle: 0,
            }),
            cv: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, QState<T>> {
        relock(self.st.lock())
    }

    /// Queues `item` and wakes one idle worker (`queue_work`).
    pub(crate) fn push(&self, item: T) {
        let mut g = self.lock();
        g.items.push_back(item);
        if g.idle > 0 {
            self.cv.notify_one();
        }
    }

    /// Takes the next item, sleeping while the queue is empty; `None` once
    /// the queue is closed and empty.
    pub(crate) fn pop(&self) -> Option<T> {
        let mut g = self.lock();
        loop {
            if let Some(t) = g.items.pop_front() {
                return Some(t);
            }
            if g.closed {
                return None;
            }
            g.idle += 1;
            g = relock(self.cv.wait(g));
            g.idle -= 1;
        }
    }

    /// Takes the next item like [`WorkQueue::pop`], plus up to `max - 1`
    /// more that are already queued (never waiting for them), so a worker
    /// can hand a device everything that is pending in one submission.
    pub(crate) fn pop_many(&self, max: usize, out: &mut Vec<T>) -> bool {
        let mut g = self.lock();
        loop {
            if !g.items.is_empty() {
                let n = g.items.len().min(max.max(1));
                out.extend(g.items.drain(..n));
                return true;
            }
            if g.closed {
                return false;
            }
            g.idle += 1;
            g = relock(self.cv.wait(g));
            g.idle -= 1;
        }
    }

    /// Lets workers exit once the queue is empty.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.cv.notify_all();
    }
}

struct PoolState {
    free: Vec<Vec<u8>>,
    /// Bytes lent out right now.
    lent: usize,
    /// Bytes kept in `free`.
    cached: usize,
    waiting: usize,
}

/// Bounded reusable bounce buffers for encrypted writes.
pub(crate) struct BouncePool {
    st: Mutex<PoolState>,
    cv: Condvar,
    budget: usize,
}

impl BouncePool {
    /// A pool lending at most `budget` bytes at once.
    pub(crate) fn new(budget: usize) -> Self {
        Self {
            st: Mutex::new(PoolState {
                free: Vec::new(),
                lent: 0,
                cached: 0,
                waiting: 0,
            }),
            cv: Condvar::new(),
            budget,
        }
    }

    /// An empty buffer with capacity for `len` bytes; blocks while the
    /// budget is lent out. A request larger than the whole budget is served
    /// when nothing else is lent, so any admitted request makes progress.
    pub(crate) fn alloc(&self, len: usize) -> Vec<u8> {
        let mut g = relock(self.st.lock());
        while g.lent > 0 && g.lent + len > self.budget {
            g.waiting += 1;
            g = relock(self.cv.wait(g));
            g.waiting -= 1;
        }
        g.lent += len;
        if let Some(i) = g.free.iter().position(|b| b.capacity() >= len) {
            let mut b = g.free.swap_remove(i);
            g.cached -= b.capacity();
            b.clear();
            return b;
        }
        drop(g);
        Vec::with_capacity(len)
    }

    /// Returns a buffer obtained from [`BouncePool::alloc`] for `len` bytes.
    pub(crate) fn free(&self, buf: Vec<u8>, len: usize) {
        let mut g = relock(self.st.lock());
        g.lent -= len;
        if g.cached + buf.capacity() <= self.budget {
            g.cached += buf.capacity();
            g.free.push(buf);
        }
        if g.waiting > 0 {
            self.cv.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[test]
    fn pool_blocks_at_budget_and_resumes_on_free() {
        let pool = Arc::new(BouncePool::new(8192));
        let a = pool.alloc(4096);
        let b = pool.alloc(4096);
        let (tx, rx) = std::sync::mpsc::channel();
        let p2 = pool.clone();
        let t = std::thread::spawn(move || {
            let c = p2.alloc(4096);
            tx.send(()).unwrap();
            p2.free(c, 4096);
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(50)).is_err(),
            "third alloc must wait"
        );
        pool.free(a, 4096);
        rx.recv_timeout(Duration::from_secs(10))
            .expect("alloc resumes after free");
        t.join().unwrap();
        pool.free(b, 4096);
        // Oversized requests still go through when nothing is lent.
        let big = pool.alloc(1 << 20);
        assert!(big.capacity() >= 1 << 20);
        pool.free(big, 1 << 20);
    }

    #[test]
    fn queue_drains_then_reports_closed() {
        let q = WorkQueue::new(4);
        q.push(1);
        q.push(2);
        q.close();
        assert_eq!(q.pop(), Some(1));
        assert_eq!(q.pop(), Some(2));
        assert_eq!(q.pop(), None);
    }
}
