//! The transmission phase: read a request (and its payload), check its
//! framing, submit it to the engine, reply from the completion. Requests
//! are pipelined; replies go out in completion order.

use std::io::{self, BufReader, IoSlice, Read, Write};
use std::net::Shutdown;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use datapath::{Op, OpKind, Request};

use crate::handshake::{read_exact, Negotiated};
use crate::proto::{self, RequestHeader};
use crate::server::{lock, Shared};
use crate::stream::{Deadline, Stream};
use crate::{nbd_errno, Error};

/// How long a reply may wait for a client that does not read.
pub(crate) const REPLY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

#[derive(Default)]
struct Inflight {
    requests: u64,
    bytes: u64,
}

/// Per-connection state shared with completion callbacks.
pub(crate) struct Conn {
    pub(crate) writer: Arc<Mutex<Stream>>,
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
    pub(crate) fn new(
        writer: Arc<Mutex<Stream>>,
        max_inflight: u64,
        total: Arc<AtomicU64>,
    ) -> Self {
        Self {
            writer,
            inflight: Mutex::new(Inflight::default()),
            max_inflight,
            total,
            idle: Condvar::new(),
            dead: AtomicBool::new(false),
        }
    }

    /// Accounts a request of `bytes` payload (read or write), first waiting
    /// while the connection already has too much in flight.
    fn begin(&self, bytes: u64) {
        let mut n = lock(&self.inflight);
        while n.requests > 0 && n.bytes + bytes > self.max_inflight {
            n = self.idle.wait(n).unwrap_or_else(|e| e.into_inner());
        }
        n.requests += 1;
        n.bytes += bytes;
        self.total.fetch_add(bytes, Ordering::Relaxed);
    }

    fn end(&self, bytes: u64) {
        let mut n = lock(&self.inflight);
        n.requests -= 1;
        n.bytes -= bytes;
        self.total.fetch_sub(bytes, Ordering::Relaxed);
        self.idle.notify_all();
    }

    pub(crate) fn wait_idle(&self) {
        let mut n = lock(&self.inflight);
        while n.requests > 0 {
            n = self.idle.wait(n).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Sends one simple reply, with `data` for successful reads.
    fn reply(&self, error: u32, cookie: u64, data: &[u8]) {
        if self.dead.load(Ordering::Relaxed) {
            return;
        }
        let hdr = proto::simple_reply(error, cookie);
        let mut w = lock(&self.writer);
        if write_all_vectored(&mut w, &hdr, data).is_err() {
            self.dead.store(true, Ordering::Relaxed);
            w.shutdown(Shutdown::Both);
        }
    }
}

fn write_all_vectored(w: &mut Stream, a: &[u8], b: &[u8]) -> io::Result<()> {
    let mut bufs = [IoSlice::new(a), IoSlice::new(b)];
    let mut bufs: &mut [IoSlice<'_>] = &mut bufs;
    IoSlice::advance_slices(&mut bufs, 0);
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

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

/// The transmission phase: read, check framing, submit, repeat.
pub(crate) fn transmit(
    r: &mut BufReader<Deadline>,
    conn: &Arc<Conn>,
    shared: &Shared,
    neg: Negotiated,
) -> Result<(), Error> {
    let read_only = neg.flags & proto::FLAG_READ_ONLY != 0;
    let trim = neg.flags & proto::FLAG_SEND_TRIM != 0;
    let known_flags = proto::CMD_FLAG_FUA | proto::CMD_FLAG_NO_HOLE;
    let mut poller = Poller::new();
    loop {
        if r.buffer().is_empty() {
            poller.wait(&r.get_ref().s);
        }
        let mut raw = [0u8; proto::REQUEST_LEN];
        // EOF exactly at a request boundary is a hard disconnect by the
        // client (allowed); EOF inside a header is a truncated request.
        let mut got = 0;
        while got < raw.len() {
            match r.read(&mut raw[got..]) {
                Ok(0) if got == 0 => return Ok(()),
                Ok(0) => return Err(Error::Protocol("Truncated request header".into())),
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(Error::Io(e)),
            }
        }
        let Some(h) = RequestHeader::decode(&raw) else {
            return Err(Error::Protocol("Bad request magic".into()));
        };
        let fua = h.flags & proto::CMD_FLAG_FUA != 0;

        // Commands with a payload must have it consumed before any reply, or
        // framing is lost: read it first, decide afterwards.
        let payload = if h.kind == proto::CMD_WRITE {
            if h.len > proto::MAX_PAYLOAD {
                return Err(Error::Protocol(format!(
                    "Write payload of {} bytes exceeds the maximum",
                    h.len
                )));
            }
            let mut data = vec![0u8; h.len as usize];
            read_exact(r, &mut data, "write payload")?;
            Some(data)
        } else {
            None
        };

        // Well-framed but invalid requests: unknown flags and commands are
        // protocol errors (EINVAL); the rest are refused as the engine
        // would refuse them, so they answer through the one mapping.
        let err = |e: u32| conn.reply(e, h.cookie, &[]);
        let refuse = |e: datapath::Error| conn.reply(nbd_errno(&e), h.cookie, &[]);
        if h.flags & !known_flags != 0 {
            err(proto::EINVAL);
            continue;
        }
        let op = match h.kind {
            proto::CMD_READ => {
                if h.len > proto::MAX_PAYLOAD {
                    refuse(datapath::Error::TooLarge {
                        op: OpKind::Read,
                        len: h.len.into(),
                        max: proto::MAX_PAYLOAD.into(),
                    });
                    continue;
                }
                Op::Read { len: h.len }
            }
            proto::CMD_WRITE | proto::CMD_WRITE_ZEROES | proto::CMD_TRIM if read_only => {
                let op = match h.kind {
                    proto::CMD_WRITE => OpKind::Write,
                    proto::CMD_WRITE_ZEROES => OpKind::WriteZeroes,
                    _ => OpKind::Discard,
                };
                refuse(datapath::Error::ReadOnly { op });
                continue;
            }
            proto::CMD_WRITE => Op::Write {
                data: payload.unwrap_or_default(),
            },
            proto::CMD_WRITE_ZEROES => Op::WriteZeroes { len: h.len },
            proto::CMD_TRIM if trim => Op::Discard { len: h.len },
            // TRIM not advertised (the volume does not allow discards).
            proto::CMD_TRIM => {
                refuse(datapath::Error::DiscardDisabled);
                continue;
            }
            proto::CMD_FLUSH => Op::Flush,
            proto::CMD_DISC => return Ok(()),
            // CACHE, BLOCK_STATUS, unknown types.
            _ => {
                err(proto::EINVAL);
                continue;
            }
        };
        if shared.stopping.load(Ordering::Relaxed) {
            refuse(datapath::Error::Shutdown);
            continue;
        }
        let bytes = match &op {
            Op::Read { len } => u64::from(*len),
            Op::Write { data } => data.len() as u64,
            _ => 0,
        };
        conn.begin(bytes);
        let c = Arc::clone(conn);

        let (cookie, kind) = (h.cookie, h.kind);
        let offset = if kind == proto::CMD_FLUSH {
            0
        } else {
            h.offset
        };
        shared
            .engine
            .submit(Request { op, offset, fua }, move |res| {
                match res {
                    Ok(Some(data)) if kind == proto::CMD_READ => c.reply(0, cookie, &data),
                    // A read without data would desynchronise the stream.
                    Ok(_) if kind == proto::CMD_READ => c.reply(proto::EIO, cookie, &[]),
                    Ok(_) => c.reply(0, cookie, &[]),
                    Err(e) => c.reply(nbd_errno(&e), cookie, &[]),
                }
                c.end(bytes);
            });
    }
}
