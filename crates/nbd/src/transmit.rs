//! The transmission phase: read a request (and its payload), check its
//! framing, submit it to the engine, reply from the completion. Requests
//! are pipelined; replies go out in completion order.
//!
//! Replies never make a completion wait for the client. Each connection
//! has its own reply path ([`Conn::reply`]): a completion sends its reply
//! with one non-blocking `sendmsg` when nothing of this connection is
//! queued, and otherwise appends it to the connection's outbox, which the
//! connection's own writer thread ([`Conn::run_writer`]) sends in batches,
//! waiting in `poll(2)` for the client to read. So a client that stops
//! reading stalls only its own writer; the engine's threads (classic
//! workers, adaptive helpers) and every other connection go on.
//!
//! ```text
//!   reader ──submit──► engine ──completion──► Conn::reply
//!     ▲                                        │ outbox empty: sendmsg(DONTWAIT)
//!     │ begin(): waits at the cap              │ rest / behind others: outbox
//!     └──────── end(): reply sent ◄─ writer ◄──┘ (poll POLLOUT, writev batches)
//! ```
//!
//! Back-pressure stays per connection: a request counts against the
//! connection's in-flight cap ([`crate::Limits::max_inflight_bytes`], and at
//! most [`MAX_INFLIGHT_REQUESTS`] requests) from the moment it is read
//! until its reply has left, so the outbox of a stalled client holds at
//! most its cap, and only that client's reader waits. The three stages of
//! a connection (receive, the engine's crypto, the reply) overlap.

use std::collections::VecDeque;
use std::io::{self, BufRead, BufReader, IoSlice, Read};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use datapath::{Hint, Op, OpKind, Plug, Request};

use crate::handshake::{read_exact, Negotiated};
use crate::proto::{self, RequestHeader};
use crate::session::{lock, Shared};
use crate::stream::{self, Deadline, Stream};
use crate::Error;

/// How long a connection's replies may wait for a client that reads
/// nothing at all; then the connection is closed.
pub(crate) const REPLY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// Requests one connection may have between reading and replying, whatever
/// their size (flushes and refused requests carry no payload, so the byte
/// cap alone would not bound a stalled client's outbox).
pub(crate) const MAX_INFLIGHT_REQUESTS: u64 = 1024;

/// `SO_SNDBUF` asked for on a unix client socket: a 1 MiB read reply at
/// QD8 otherwise fills the default (208 KiB) and leaves in pieces through
/// the writer thread, a hop that on a loaded machine waits for a CPU
/// (1M QD8 reads: the writer thread waited 3x as long as it ran). Bytes
/// the socket holds have left the in-flight cap; the kernel caps this at
/// `net.core.wmem_max`.
pub(crate) const REPLY_SNDBUF: usize = 4 << 20;

/// Replies one `sendmsg` carries at most (two iovecs each; `IOV_MAX` is
/// 1024).
const BATCH: usize = 256;

#[derive(Default)]
struct Inflight {
    requests: u64,
    bytes: u64,
}

/// One simple reply on its way out: header, read data, and how much of the
/// two has been sent.
struct Reply {
    hdr: [u8; 16],
    data: Vec<u8>,
    sent: usize,
    /// Payload bytes it holds against the in-flight cap.
    bytes: u64,
}

impl Reply {
    fn len(&self) -> usize {
        self.hdr.len() + self.data.len()
    }

    /// The unsent part, as up to two slices appended to `out`.
    fn unsent<'a>(&'a self, out: &mut Vec<IoSlice<'a>>) {
        let h = self.hdr.len();
        if self.sent < h {
            out.push(IoSlice::new(&self.hdr[self.sent..]));
            if !self.data.is_empty() {
                out.push(IoSlice::new(&self.data));
            }
        } else if self.sent < self.len() {
            out.push(IoSlice::new(&self.data[self.sent - h..]));
        }
    }
}

/// Replies waiting for the connection's writer thread.
#[derive(Default)]
struct Outbox {
    queue: VecDeque<Reply>,
    /// The writer thread is sending a batch (outside the lock): nobody
    /// else may write to the socket.
    busy: bool,
    /// No more replies will come; the writer thread exits when idle.
    closed: bool,
}

/// Per-connection state shared with completion callbacks.
pub(crate) struct Conn {
    /// The client socket (a clone of the reader's), written only through
    /// the outbox protocol: by `reply` under the outbox lock while nothing
    /// is queued, else by the writer thread.
    pub(crate) sock: Stream,
    outbox: Mutex<Outbox>,
    /// Wakes the writer thread (a reply queued, or the outbox closed).
    queued: Condvar,
    inflight: Mutex<Inflight>,
    /// `Limits::max_inflight_bytes`.
    max_inflight: u64,
    /// The server's in-flight total over all connections (for stats).
    total: Arc<AtomicU64>,
    idle: Condvar,
    /// Set once a reply could not be sent; further replies are dropped.
    dead: AtomicBool,
}

impl Conn {
    pub(crate) fn new(sock: Stream, max_inflight: u64, total: Arc<AtomicU64>) -> Self {
        Self {
            sock,
            outbox: Mutex::new(Outbox::default()),
            queued: Condvar::new(),
            inflight: Mutex::new(Inflight::default()),
            max_inflight,
            total,
            idle: Condvar::new(),
            dead: AtomicBool::new(false),
        }
    }

    /// Accounts a request of `bytes` payload (read or write), first waiting
    /// while the connection already has too much in flight.
    fn begin(&self, bytes: u64, plug: &mut Plug) {
        let mut n = lock(&self.inflight);
        if n.requests > 0
            && (n.bytes + bytes > self.max_inflight || n.requests >= MAX_INFLIGHT_REQUESTS)
        {
            // Gathered requests hold replies this waits for: run them.
            drop(n);
            plug.flush();
            n = lock(&self.inflight);
        }
        while n.requests > 0
            && (n.bytes + bytes > self.max_inflight || n.requests >= MAX_INFLIGHT_REQUESTS)
        {
            n = self.idle.wait(n).unwrap_or_else(|e| e.into_inner());
        }
        n.requests += 1;
        n.bytes += bytes;
        self.total.fetch_add(bytes, Ordering::Relaxed);
    }

    /// Requests read and not yet answered.
    fn inflight_requests(&self) -> u64 {
        lock(&self.inflight).requests
    }

    fn end(&self, bytes: u64) {
        let mut n = lock(&self.inflight);
        n.requests -= 1;
        n.bytes -= bytes;
        self.total.fetch_sub(bytes, Ordering::Relaxed);
        self.idle.notify_all();
    }

    /// Waits until every request read so far has been answered (or its
    /// reply dropped because the client is gone).
    pub(crate) fn wait_idle(&self) {
        let mut n = lock(&self.inflight);
        while n.requests > 0 {
            n = self.idle.wait(n).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Sends one simple reply for a request accounted with `begin(bytes)`,
    /// with `data` for successful reads, and ends it once sent. Never waits
    /// for the client: what the socket does not take at once is queued for
    /// the writer thread.
    fn reply(&self, error: u32, cookie: u64, data: Vec<u8>, bytes: u64) {
        if self.dead.load(Ordering::Relaxed) {
            self.end(bytes);
            return;
        }
        let mut r = Reply {
            hdr: proto::simple_reply(error, cookie),
            data,
            sent: 0,
            bytes,
        };
        let mut out = lock(&self.outbox);
        if out.queue.is_empty() && !out.busy {
            // The socket is ours while we hold the lock with nothing queued.
            let mut iov = Vec::with_capacity(2);
            r.unsent(&mut iov);
            match self.sock.send_nonblocking(&iov) {
                Ok(n) => r.sent += n,
                Err(e) if is_retry(&e) => {}
                Err(_) => {
                    drop(out);
                    self.kill();
                    self.end(bytes);
                    return;
                }
            }
            if r.sent == r.len() {
                drop(out);
                self.finish(r);
                return;
            }
            out.queue.push_back(r);
            self.queued.notify_one();
        } else {
            out.queue.push_back(r);
            if !out.busy {
                self.queued.notify_one();
            }
        }
    }

    /// Ends a reply that has left (or never will) and hands its read data
    /// back to the buffer pool for the next request.
    fn finish(&self, r: Reply) {
        self.end(r.bytes);
        datapath::bufpool::give(r.data);
    }

    /// Marks the connection dead and shuts its socket, which also ends the
    /// reader's `recv`.
    fn kill(&self) {
        self.dead.store(true, Ordering::Relaxed);
        self.sock.shutdown(Shutdown::Both);
    }

    /// Lets the writer thread exit once the outbox is empty.
    pub(crate) fn close_outbox(&self) {
        lock(&self.outbox).closed = true;
        self.queued.notify_one();
    }

    /// The connection's writer thread: sends what `reply` queued, in
    /// batches, until [`Conn::close_outbox`].
    pub(crate) fn run_writer(&self) {
        let mut batch: Vec<Reply> = Vec::new();
        loop {
            {
                let mut out = lock(&self.outbox);
                out.busy = false;
                while out.queue.is_empty() {
                    if out.closed {
                        return;
                    }
                    out = self.queued.wait(out).unwrap_or_else(|e| e.into_inner());
                }
                let n = out.queue.len().min(BATCH);
                batch.extend(out.queue.drain(..n));
                out.busy = true;
            }
            if self.dead.load(Ordering::Relaxed) || self.send_batch(&mut batch).is_err() {
                self.kill();
            }
            for r in batch.drain(..) {
                self.finish(r);
            }
        }
    }

    /// Sends `batch` whole, ending each reply as it completes (those left
    /// in `batch` on error are ended by the caller). Fails once the client
    /// has read nothing for [`REPLY_TIMEOUT`], or the socket failed.
    fn send_batch(&self, batch: &mut Vec<Reply>) -> io::Result<()> {
        let mut last_progress = Instant::now();
        while !batch.is_empty() {
            let mut iov = Vec::with_capacity(2 * batch.len());
            for r in batch.iter() {
                r.unsent(&mut iov);
            }
            let res = self.sock.send_nonblocking(&iov);
            drop(iov);
            match res {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(mut n) => {
                    last_progress = Instant::now();
                    let mut done = 0;
                    for r in batch.iter_mut() {
                        let take = n.min(r.len() - r.sent);
                        r.sent += take;
                        n -= take;
                        if r.sent < r.len() {
                            break;
                        }
                        done += 1;
                    }
                    for r in batch.drain(..done) {
                        self.finish(r);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    let left = REPLY_TIMEOUT.saturating_sub(last_progress.elapsed());
                    if left.is_zero() {
                        return Err(io::ErrorKind::TimedOut.into());
                    }
                    // Woken by room in the socket, or by a shutdown of it
                    // (POLLHUP / POLLERR: the next send reports it).
                    stream::poll(&[(self.sock.as_raw_fd(), libc::POLLOUT)], Some(left))?;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

fn is_retry(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
    )
}

/// Smallest request for which the reader looks at the socket for a next
/// request to fill in the engine's [`Hint`] (a `recv(MSG_PEEK)`); smaller
/// ones always run inline in the adaptive mode, so the syscall would only
/// cost.
const HINT_PEEK_MIN: u64 = 16 << 10;

/// Longest a connection thread polls for the next request before it
/// sleeps in `recv`. At queue depth 1 the next request follows the reply
/// after one client round trip (~20 µs here); a thread that slept meanwhile
/// costs a cross-CPU wake-up on arrival (on a VM an idle exit, ~10-20 µs,
/// a third of nbdkit's whole 4k QD1 round trip). A short poll keeps the
/// CPU awake instead, like the kernel's `SO_BUSY_POLL` for sockets.
const POLL_WINDOW: std::time::Duration = std::time::Duration::from_micros(50);
/// After this many polls in a row that ran out the window (a slow or idle
/// client), polling pauses for [`POLL_PAUSE`].
const POLL_MISSES: u32 = 8;
const POLL_PAUSE: std::time::Duration = std::time::Duration::from_millis(100);
/// Connection threads polling at once, process-wide: at most one per two
/// CPUs, so polling never takes the cores the engine and clients need.
static POLLERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Busy-polls `s` for the next request (see [`POLL_WINDOW`]).
struct Poller {
    misses: u32,
    paused_until: Option<std::time::Instant>,
    max_pollers: usize,
}

impl Poller {
    fn new() -> Self {
        // Read once per process: it opens cgroup files every call.
        static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
        let cpus = *CPUS.get_or_init(|| {
            std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1)
        });
        Self {
            misses: 0,
            paused_until: None,
            max_pollers: cpus / 2,
        }
    }

    /// Returns when a request is readable, the window ran out, or polling
    /// is paused or taken; the caller then reads (blocking if need be).
    fn wait(&mut self, s: &Stream) {
        let now = std::time::Instant::now();
        if self.paused_until.is_some_and(|t| now < t) {
            return;
        }
        if POLLERS.fetch_add(1, Ordering::Relaxed) >= self.max_pollers {
            POLLERS.fetch_sub(1, Ordering::Relaxed);
            return;
        }
        let deadline = now + POLL_WINDOW;
        let mut hit = false;
        loop {
            if s.readable_now() {
                hit = true;
                break;
            }
            if std::time::Instant::now() >= deadline {
                break;
            }
            std::hint::spin_loop();
        }
        POLLERS.fetch_sub(1, Ordering::Relaxed);
        if hit {
            self.misses = 0;
        } else {
            self.misses += 1;
            if self.misses >= POLL_MISSES {
                self.misses = 0;
                self.paused_until = Some(std::time::Instant::now() + POLL_PAUSE);
            }
        }
    }
}

/// Smallest write payload received straight into its buffer, and whose
/// successor's header is read without refilling the connection's buffer.
const DIRECT_RECV_MIN: u64 = 64 << 10;

/// Reads a write payload of `len` bytes into a pooled buffer: what the
/// connection's buffer already holds, then the rest straight from the
/// socket (one copy, not two through the buffer). The pooled buffer's stale
/// bytes are all overwritten, or the receive fails and it is dropped.
fn read_payload(r: &mut BufReader<Deadline>, len: usize) -> Result<Vec<u8>, Error> {
    let mut data = datapath::bufpool::take(len);
    if (len as u64) < DIRECT_RECV_MIN {
        read_exact(r, &mut data, "write payload")?;
        return Ok(data);
    }
    let have = r.buffer().len().min(len);
    data[..have].copy_from_slice(&r.buffer()[..have]);
    r.consume(have);
    read_exact(r.get_mut(), &mut data[have..], "write payload")?;
    Ok(data)
}

/// The transmission phase: read, check framing, submit, repeat.
pub(crate) fn transmit(
    r: &mut BufReader<Deadline>,
    conn: &Arc<Conn>,
    shared: &Shared,
    neg: Negotiated,
) -> Result<(), Error> {
    // What the client was told is what the export view refuses by.
    debug_assert_eq!(
        neg.flags & proto::FLAG_READ_ONLY != 0,
        shared.view.read_only()
    );
    debug_assert_eq!(
        neg.flags & proto::FLAG_SEND_TRIM != 0,
        shared.view.allows_discards()
    );
    let known_flags = proto::CMD_FLAG_FUA | proto::CMD_FLAG_NO_HOLE;
    let mut poller = Poller::new();
    // The last request was a large write: read the next header on its own
    // (see `read_payload`).
    let mut after_large_write = false;
    // The connection's gathering (Hint::ready): what it holds runs before
    // any return, when the plug is dropped.
    let mut plug = Plug::new();
    // The last submission said more were ready (the plug may hold it).
    let mut held = false;
    loop {
        if held && r.buffer().len() < proto::REQUEST_LEN && !r.get_ref().s.readable_now() {
            // About to block on the socket: run what was gathered.
            plug.flush();
            held = false;
        }
        if r.buffer().is_empty() {
            poller.wait(&r.get_ref().s);
        }
        let mut raw = [0u8; proto::REQUEST_LEN];
        // A client streaming large writes has the next payload right behind
        // this header: refilling the buffer now would pull up to its
        // capacity of payload through it (a second copy); 28 bytes straight
        // from the socket leave the payload for `read_payload`.
        let src: &mut dyn Read = if after_large_write && r.buffer().is_empty() {
            r.get_mut()
        } else {
            r
        };
        // EOF exactly at a request boundary is a hard disconnect by the
        // client (allowed); EOF inside a header is a truncated request.
        let mut got = 0;
        while got < raw.len() {
            match src.read(&mut raw[got..]) {
                Ok(0) if got == 0 => return Ok(()),
                Ok(0) => return Err(Error::protocol("Truncated request header")),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::io(e)),
            }
        }
        let Some(h) = RequestHeader::decode(&raw) else {
            return Err(Error::protocol("Bad request magic"));
        };
        let fua = h.flags & proto::CMD_FLAG_FUA != 0;
        after_large_write = h.kind == proto::CMD_WRITE && u64::from(h.len) >= DIRECT_RECV_MIN;

        // Commands with a payload must have it consumed before any reply, or
        // framing is lost: read it first, decide afterwards.
        let payload = if h.kind == proto::CMD_WRITE {
            if h.len > proto::MAX_PAYLOAD {
                return Err(Error::protocol(format!(
                    "Write payload of {} bytes exceeds the maximum",
                    h.len
                )));
            }
            Some(read_payload(r, h.len as usize)?)
        } else {
            None
        };

        // Well-framed but invalid requests: unknown flags and commands are
        // protocol errors (EINVAL); the rest are refused by the export
        // view, as the engine would refuse them (read-only, trim not
        // advertised, too large), so they answer through the one mapping.
        // Refusals go through the same reply path (and count against the
        // cap) so they cannot interleave with, or overtake, queued replies.
        let err = |plug: &mut Plug, e: u32| {
            conn.begin(0, plug);
            conn.reply(e, h.cookie, Vec::new(), 0);
        };
        let refuse = |plug: &mut Plug, e: datapath::Error| err(plug, e.nbd_error());
        if h.flags & !known_flags != 0 {
            err(&mut plug, proto::EINVAL);
            continue;
        }
        let kind = match h.kind {
            proto::CMD_READ => OpKind::Read,
            proto::CMD_WRITE => OpKind::Write,
            proto::CMD_WRITE_ZEROES => OpKind::WriteZeroes,
            proto::CMD_TRIM => OpKind::Discard,
            proto::CMD_FLUSH => OpKind::Flush,
            proto::CMD_DISC => return Ok(()),
            // CACHE, BLOCK_STATUS, unknown types.
            _ => {
                err(&mut plug, proto::EINVAL);
                continue;
            }
        };
        if let Err(e) = shared.view.check_op(kind, h.len.into()) {
            refuse(&mut plug, e);
            continue;
        }
        let op = match kind {
            OpKind::Read => Op::Read { len: h.len },
            OpKind::Write => Op::Write {
                data: payload.unwrap_or_default(),
            },
            OpKind::WriteZeroes => Op::WriteZeroes { len: h.len },
            OpKind::Discard => Op::Discard { len: h.len },
            _ => Op::Flush,
        };
        if shared.stopping.load(Ordering::Relaxed) {
            refuse(&mut plug, datapath::Error::Shutdown);
            continue;
        }
        let bytes = match &op {
            Op::Read { len } => u64::from(*len),
            Op::Write { data } => data.len() as u64,
            _ => 0,
        };
        // Tell the engine what it cannot see: whether this client has more
        // requests behind this one (unanswered ones, or the next already
        // arriving), so a large request can go to a helper while this
        // thread reads and runs the next one.
        let mut behind = conn.inflight_requests();
        if behind == 0 && bytes >= HINT_PEEK_MIN {
            let waiting = r.buffer().len() >= proto::REQUEST_LEN || r.get_ref().s.readable_now();
            behind = u64::from(waiting);
        }
        // And whether the next request is already here: then the engine
        // may gather this one into a batch with it (run at the latest when
        // this loop would block).
        // (A caller with nothing else in flight has sent nothing more.)
        let ready =
            r.buffer().len() >= proto::REQUEST_LEN || (behind > 0 && r.get_ref().s.readable_now());
        held = ready;
        let hint = Hint {
            behind: behind.min(u64::from(u32::MAX)) as u32,
            ready: u32::from(ready),
        };
        conn.begin(bytes, &mut plug);
        let c = Arc::clone(conn);

        let (cookie, kind) = (h.cookie, h.kind);
        let offset = if kind == proto::CMD_FLUSH {
            0
        } else {
            h.offset
        };
        shared
            .engine
            .submit_plugged(&mut plug, Request { op, offset, fua }, hint, move |res| {
                let (error, data) = match res {
                    Ok(Some(data)) if kind == proto::CMD_READ => (0, data),
                    // A read without data would desynchronise the stream.
                    Ok(_) if kind == proto::CMD_READ => (proto::EIO, Vec::new()),
                    Ok(_) => (0, Vec::new()),
                    Err(e) => (e.nbd_error(), Vec::new()),
                };
                c.reply(error, cookie, data, bytes);
            });
    }
}
