//! The `VhostUserBackend` of one connection: feature negotiation and the
//! config space for the protocol crates, and the queue threads' work (pop
//! chains, parse, submit to the engine; completions add to the used ring
//! from whatever engine thread finishes them).
//!
//! Interrupts are coalesced per batch of chains: a request that completes
//! on its own queue thread while that thread is starting a batch (inline
//! and adaptive modes run small requests there) only goes on the used
//! ring, and the thread signals the guest once when the batch is started.
//! Signalling each of them woke the guest's thread once per request, and
//! on a machine with as many busy threads as cores the woken thread
//! preempted the queue thread every time (perf, 4k QD16 x 2 queues on 2
//! CPUs: 41% of the adaptive server's samples in the eventfd write and
//! the switch it caused). Completions on other threads signal at once, and
//! so do requests of [`COALESCE_BELOW`] or more: they take long enough
//! (1M: ~100 µs) that an interrupt each costs little and lets the guest
//! refill its queue while the batch goes on.
//!
//! A chain's payload counts against the server's in-flight cap
//! ([`request::MAX_INFLIGHT_BYTES`], the [`crate::stats::Budget`]) before
//! anything is allocated for it: past the cap the queue thread signals
//! what its batch completed so far and waits, starting no more chains,
//! until completions on engine threads give room back. No chain is
//! dropped or failed for it; the guest just sees its queue drain slower.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use datapath::{Engine, Hint, Plug};
use vhost::vhost_user::message::{VhostUserProtocolFeatures, VhostUserVirtioFeatures};
use vhost_user_backend::{VhostUserBackend, VringRwLock, VringT};
use virtio_queue::{QueueOwnedT, QueueT};
use vm_memory::{GuestAddressSpace, GuestMemoryAtomic};
use vmm_sys_util::epoll::EventSet;
use vmm_sys_util::event::{
    new_event_consumer_and_notifier, EventConsumer, EventFlag, EventNotifier,
};

use crate::config::{DeviceConfig, CONFIG_LEN, WCE_OFFSET};
use crate::request::{self, Action, Ctx, Parsed};
use crate::stats::Shared;

pub use crate::request::Mem;
/// The vring type the daemon creates.
pub type Vring = VringRwLock<GuestMemoryAtomic<Mem>>;

/// Everything a connection shares with the server: engine, device facts,
/// counters, the write-cache mode.
pub struct Device {
    pub(crate) engine: Arc<Engine>,
    pub(crate) config: DeviceConfig,
    pub(crate) serial: [u8; 20],
    pub(crate) queue_size: u16,
    pub(crate) shared: Arc<Shared>,
    /// Queue threads per connection ([`threads_for`]).
    pub(crate) threads: usize,
}

/// How many queue threads serve `queues` offered queues: one per queue,
/// but no more than the host has CPUs. vhost-user-backend starts every
/// thread when the connection is set up, before the guest says which
/// queues it enables, so threads beyond the CPUs would only ever sit idle
/// or take turns on a CPU another queue thread needs. Queue `q` is served
/// by thread `q % threads`.
pub(crate) fn threads_for(queues: u16) -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    usize::from(queues).clamp(1, cpus.max(1))
}

/// The queue masks of [`VhostUserBackend::queues_per_thread`]: thread `t`
/// serves queues `t`, `t + threads`, `t + 2 * threads`, … below `queues`.
pub(crate) fn queue_masks(queues: u16, threads: usize) -> Vec<u64> {
    let threads = threads.max(1);
    (0..threads)
        .map(|t| {
            (t..usize::from(queues).min(64))
                .step_by(threads)
                .fold(0u64, |m, q| m | 1u64 << q)
        })
        .collect()
}

/// One hypervisor connection's backend (a new one per connection, so a
/// reconnecting hypervisor starts from a clean device).
pub struct Conn {
    dev: Arc<Device>,
    mem: Mutex<GuestMemoryAtomic<Mem>>,
    event_idx: AtomicBool,
    /// Tells this connection's queues from any other's ([`Batch`]).
    id: u64,
    /// Each queue thread's gathering, by thread index: it counts the
    /// reads and writes the thread submitted asynchronously, so a flush
    /// it submits later, in this kick or the next, runs after them. Only
    /// that thread locks its own.
    plugs: Vec<Mutex<Plug>>,
}

/// Connection ids, unique for the process's life.
static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

/// A queue of a connection: (connection id, queue index).
type QueueKey = (u64, usize);

thread_local! {
    /// The queue whose batch this thread is starting, if any.
    static BATCH: Cell<Option<QueueKey>> = const { Cell::new(None) };
    /// Completions of that batch put on the used ring without a signal.
    static DEFERRED: Cell<bool> = const { Cell::new(false) };
}

/// Requests this large or larger signal their completion at once even
/// on their queue thread: their own run (~10 µs at 64 KiB) is then well
/// above the guest wake-up an interrupt costs.
const COALESCE_BELOW: u64 = 64 << 10;

/// The batch a queue thread is starting: completions of this queue on this
/// thread defer their signal to [`Batch::flush`] (and the drop, for any
/// way out).
struct Batch<'a> {
    vring: &'a Vring,
}

impl<'a> Batch<'a> {
    fn begin(key: QueueKey, vring: &'a Vring) -> Self {
        BATCH.with(|b| b.set(Some(key)));
        Self { vring }
    }

    /// Signals the guest once for the completions deferred so far, if
    /// it wants an interrupt.
    fn flush(&self) {
        if DEFERRED.with(|d| d.replace(false)) {
            let mut g = self.vring.get_mut();
            if g.needs_notification().unwrap_or(true) {
                let _ = g.signal_used_queue();
            }
        }
    }
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        self.flush();
        BATCH.with(|b| b.set(None));
    }
}

impl Conn {
    pub(crate) fn new(dev: Arc<Device>, mem: GuestMemoryAtomic<Mem>) -> Self {
        let plugs = (0..dev.threads.max(1))
            .map(|_| Mutex::new(Plug::new()))
            .collect();
        Self {
            dev,
            mem: Mutex::new(mem),
            event_idx: AtomicBool::new(false),
            id: NEXT_CONN.fetch_add(1, Ordering::Relaxed),
            plugs,
        }
    }

    fn ctx(&self) -> Ctx {
        Ctx {
            serial: self.dev.serial,
            write_through: self.dev.shared.wce.load(Ordering::Relaxed) == 0,
        }
    }

    /// Pops every available chain of queue `qi` and starts it, on queue
    /// thread `thread`.
    fn process_queue(&self, qi: usize, vring: &Vring, thread: usize) {
        let mem = self
            .mem
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .memory()
            .into_inner();
        let event_idx = self.event_idx.load(Ordering::Relaxed);
        let ctx = self.ctx();
        let batch = Batch::begin((self.id, qi), vring);
        // vhost-user-backend's thread indexes are below `threads`, the
        // plugs' count (which is never 0).
        let mut plug = self.plugs[thread % self.plugs.len()]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        loop {
            if event_idx {
                let _ = vring.disable_notification();
            }
            // Collect first, then submit: an inline engine completes on
            // this thread, and its completion takes the vring lock.
            let chains: Vec<_> = {
                let mut g = vring.get_mut();
                match g.get_queue_mut().iter(Arc::clone(&mem)) {
                    Ok(it) => it.collect(),
                    Err(_) => {
                        // A corrupt avail ring: stop serving this queue
                        // until the guest resets it; other queues go on.
                        self.dev.shared.queue(qi).malformed_ring();
                        g.get_queue_mut().set_ready(false);
                        return;
                    }
                }
            };
            let mut left = chains.len();
            let budget = &self.dev.shared.inflight;
            for chain in chains {
                left -= 1;
                let mut p = request::parse(chain, &mem, &ctx);
                let held = p.payload();
                if !budget.try_take(held) {
                    // Room comes from completions on engine threads; the
                    // guest hears of this batch's finished requests first.
                    batch.flush();
                    budget.take(held);
                }
                p.load(&mem);
                self.start(&mut plug, qi, vring, &mem, p, left, held);
            }
            batch.flush();
            if !event_idx {
                return;
            }
            match vring.enable_notification() {
                Ok(true) => continue,
                _ => return,
            }
        }
    }

    /// Starts one parsed (and loaded) chain through the queue thread's
    /// `plug`; `left`: chains of this batch still to start after it;
    /// `held`: its payload bytes taken from the in-flight budget, given
    /// back once it is answered.
    #[allow(clippy::too_many_arguments)]
    fn start(
        &self,
        plug: &mut Plug,
        qi: usize,
        vring: &Vring,
        mem: &Arc<Mem>,
        mut p: Parsed,
        left: usize,
        held: u64,
    ) {
        let counters = self.dev.shared.queue(qi);
        let key = (self.id, qi);
        counters.started(p.kind);
        let action = std::mem::replace(&mut p.action, Action::Reply(0, Vec::new()));
        let req = match action {
            Action::Engine(req) => req,
            answer => {
                // `load` turned every write into a request or a reply.
                let (status, data) = match answer {
                    Action::Reply(status, data) => (status, data),
                    _ => (request::S_IOERR, Vec::new()),
                };
                let used = request::answer(mem, &p, status, &data);
                counters.finished(p.kind, status, 0);
                self.dev.shared.inflight.give(held);
                complete(vring, p.head, used, key, 0);
                counters.done();
                return;
            }
        };
        let bytes = held;
        // Tell the engine what it cannot see: the guest's queue (requests
        // of this queue in flight besides this one, and the rest of this
        // batch), so adaptive hands a large request to a helper and this
        // thread goes on with the next chain.
        let behind = counters.in_flight().saturating_sub(1) + left as u64;
        let hint = Hint {
            behind: behind.min(u64::from(u32::MAX)) as u32,
            // Nothing held for a batch: this thread never flushes its
            // plug before it waits for the next kick.
            ready: 0,
        };
        let vring = vring.clone();
        let mem = Arc::clone(mem);
        let shared = Arc::clone(&self.dev.shared);
        self.dev.engine.submit_plugged(plug, req, hint, move |c| {
            let status = request::status_of(&c);
            let data = match c {
                Ok(Some(d)) => d,
                _ => Vec::new(),
            };
            let used = request::answer(&mem, &p, status, &data);
            // The read buffer serves the next request.
            datapath::bufpool::give(data);
            let counters = shared.queue(qi);
            counters.finished(p.kind, status, bytes);
            // The request's buffers are gone (or pooled): room for the
            // next chain.
            shared.inflight.give(bytes);
            complete(&vring, p.head, used, key, bytes);
            counters.done();
        });
    }
}

/// Puts `head` on the used ring and interrupts the guest if it wants one;
/// for a request of fewer than [`COALESCE_BELOW`] `bytes` on the thread
/// starting a batch of queue `key`, leaves the interrupt to the batch's
/// end ([`Batch::flush`]).
fn complete(vring: &Vring, head: u16, used: u32, key: QueueKey, bytes: u64) {
    let mut g = vring.get_mut();
    if g.add_used(head, used).is_err() {
        return;
    }
    if bytes < COALESCE_BELOW && BATCH.with(|b| b.get()) == Some(key) {
        DEFERRED.with(|d| d.set(true));
        return;
    }
    if g.needs_notification().unwrap_or(true) {
        let _ = g.signal_used_queue();
    }
}

impl VhostUserBackend for Conn {
    type Bitmap = ();
    type Vring = Vring;

    fn num_queues(&self) -> usize {
        usize::from(self.dev.config.num_queues)
    }

    fn max_queue_size(&self) -> usize {
        usize::from(self.dev.queue_size)
    }

    fn features(&self) -> u64 {
        self.dev.config.features() | VhostUserVirtioFeatures::PROTOCOL_FEATURES.bits()
    }

    fn protocol_features(&self) -> VhostUserProtocolFeatures {
        VhostUserProtocolFeatures::CONFIG
            | VhostUserProtocolFeatures::REPLY_ACK
            | VhostUserProtocolFeatures::MQ
            | VhostUserProtocolFeatures::CONFIGURE_MEM_SLOTS
    }

    fn set_event_idx(&self, enabled: bool) {
        self.event_idx.store(enabled, Ordering::Relaxed);
    }

    fn get_config(&self, offset: u32, size: u32) -> Vec<u8> {
        // The capacity as of now: a live `resize` shows on the next read
        // (vhost 0.18 has no way to send CONFIG_CHANGE_MSG to the front).
        let config = DeviceConfig {
            size: self.dev.engine.size(),
            ..self.dev.config
        };
        let space = config.space(self.dev.shared.wce.load(Ordering::Relaxed));
        let mut out = vec![0u8; size as usize];
        let start = (offset as usize).min(CONFIG_LEN);
        let end = (offset as usize)
            .saturating_add(size as usize)
            .min(CONFIG_LEN);
        out[..end - start].copy_from_slice(&space[start..end]);
        out
    }

    fn set_config(&self, offset: u32, buf: &[u8]) -> std::io::Result<()> {
        // Only the writeback-cache byte is writable (CONFIG_WCE).
        if offset as usize == WCE_OFFSET && buf.len() == 1 && buf[0] <= 1 {
            self.dev.shared.wce.store(buf[0], Ordering::Relaxed);
            return Ok(());
        }
        Err(std::io::Error::from_raw_os_error(libc::EINVAL))
    }

    fn update_memory(&self, mem: GuestMemoryAtomic<Mem>) -> std::io::Result<()> {
        *self.mem.lock().unwrap_or_else(|e| e.into_inner()) = mem;
        Ok(())
    }

    /// Queue `q` is served by thread `q % threads` ([`queue_masks`]).
    fn queues_per_thread(&self) -> Vec<u64> {
        queue_masks(self.dev.config.num_queues, self.dev.threads)
    }

    fn exit_event(&self, _thread_index: usize) -> Option<(EventConsumer, EventNotifier)> {
        new_event_consumer_and_notifier(EventFlag::NONBLOCK).ok()
    }

    /// `GET_VRING_BASE`: the frontend is about to take the ring back, so
    /// wait for this queue's requests still inside the engine.
    fn stop_vring(&self, queue_index: u32) -> std::io::Result<()> {
        let q = self.dev.shared.queue(queue_index as usize);
        while q.in_flight() > 0 {
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }

    fn handle_event(
        &self,
        device_event: u16,
        evset: EventSet,
        vrings: &[Vring],
        thread_id: usize,
    ) -> std::io::Result<()> {
        if evset != EventSet::IN {
            return Ok(());
        }
        // Thread `t` owns queues `t`, `t + threads`, …, in that order:
        // local index `i` is queue `t + i * threads`; anything else is not
        // a queue event of ours.
        let i = usize::from(device_event);
        if let Some(vring) = vrings.get(i) {
            self.process_queue(thread_id + i * self.dev.threads.max(1), vring, thread_id);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_queue_has_exactly_one_thread() {
        for queues in [1u16, 2, 3, 4, 7, 64] {
            for threads in [1usize, 2, 3, 4, 64] {
                let masks = queue_masks(queues, threads);
                assert_eq!(masks.len(), threads);
                let all = masks.iter().fold(0u64, |a, m| {
                    assert_eq!(a & m, 0, "{queues} queues, {threads} threads: overlap");
                    a | m
                });
                let want = if queues == 64 {
                    u64::MAX
                } else {
                    (1u64 << queues) - 1
                };
                assert_eq!(all, want, "{queues} queues, {threads} threads");
            }
        }
    }

    #[test]
    fn local_index_maps_back_to_the_queue() {
        // handle_event's rule: thread t, local index i -> queue t + i * threads.
        let (queues, threads) = (10u16, 3usize);
        for (t, m) in queue_masks(queues, threads).iter().enumerate() {
            let owned: Vec<usize> = (0..64).filter(|q| m >> q & 1 == 1).collect();
            for (i, q) in owned.iter().enumerate() {
                assert_eq!(t + i * threads, *q);
            }
        }
    }

    #[test]
    fn threads_never_exceed_queues_or_cpus() {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(threads_for(1), 1);
        assert_eq!(threads_for(64), cpus.min(64));
        assert!(threads_for(2) <= 2);
    }
}
