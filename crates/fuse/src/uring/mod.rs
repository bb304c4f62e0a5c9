//! The FUSE-over-io_uring transport (Linux 6.14+,
//! `Documentation/filesystems/fuse-io-uring.rst`).
//!
//! ```text
//!   client on CPU q ──► kernel FUSE queue q ──CQE──► queue thread q (pinned to q)
//!                                                     │ Ops (answers from the engine's completion)
//!                     ◄── COMMIT_AND_FETCH SQE ───────┘ (woken through an eventfd)
//! ```
//!
//! The kernel has one queue per possible CPU and sends a request to the
//! queue of the CPU its client runs on; the ring is used only once every
//! queue holds an entry. Each queue here is one thread with its own
//! io_uring (128-byte SQEs), registering `depth` entries of a header
//! buffer and a payload buffer with `FUSE_IO_URING_CMD_REGISTER`. A
//! request arrives as the CQE of its entry's command; the answer is
//! written into the same buffers and sent with
//! `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`, which also hands the entry back
//! for the next request. Reads, writes and flushes are answered from the
//! engine's completion callback: it posts the answer on the queue's
//! channel and writes the queue's eventfd, whose read the thread keeps
//! in flight; so several requests per queue run at once and the thread
//! never waits for IO.
//!
//! The rings and buffers are made before the mount ([`prepare`]), so
//! INIT asks for `FUSE_OVER_IO_URING` only when they exist (once agreed,
//! the kernel holds requests back until the queues register). A refused
//! registration turns the connection back to /dev/fuse (the kernel clears
//! its `io_uring` flag), which fuser's threads keep serving. An answer
//! that cannot be made is `EIO`; entries the kernel tears down (unmount,
//! abort) complete with an error and the thread ends once all have.
//!
//! Buffer ownership: an entry's buffers belong to the kernel from the
//! submission of its command until that command's CQE, and to this
//! thread between the CQE and the next submission; they are freed only
//! after every command of the ring has completed and the ring is closed.
#![allow(unsafe_code)]

pub(crate) mod abi;

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use fuser::{Errno, INodeNo};
use io_uring::{cqueue, opcode, squeue, types, IoUring};

use crate::ops::{Ops, TTL};

/// The module parameter that lets the kernel offer the ring.
pub(crate) const ENABLE_PARAM: &str = "/sys/module/fuse/parameters/enable_uring";

/// `user_data` of the eventfd read; entries use their index.
const WAKE: u64 = u64::MAX;
/// Entries across all queues at most (each holds a `max_write` payload).
const MAX_ENTRIES: usize = 64;
/// Entries per queue at most.
const MAX_DEPTH: usize = 8;

/// How many requests the queues answered (for `status` and tests).
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) requests: AtomicU64,
}

/// Whether the module parameter is on (`Y`); `None` if it is absent.
pub(crate) fn enabled() -> Option<bool> {
    std::fs::read_to_string(ENABLE_PARAM)
        .ok()
        .map(|s| s.trim() == "Y" || s.trim() == "1")
}

/// The kernel's queue count: its possible CPUs (`0-3,6`).
fn possible_cpus() -> io::Result<usize> {
    let s = std::fs::read_to_string("/sys/devices/system/cpu/possible")?;
    let bad = || io::Error::new(io::ErrorKind::InvalidData, "Unreadable CPU list");
    let mut n = 0;
    for part in s.trim().split(',') {
        let (a, b) = match part.split_once('-') {
            Some((a, b)) => (a, b),
            None => (part, part),
        };
        let a: usize = a.parse().map_err(|_| bad())?;
        let b: usize = b.parse().map_err(|_| bad())?;
        n += b.checked_sub(a).ok_or_else(bad)? + 1;
    }
    if n == 0 || n > usize::from(u16::MAX) {
        return Err(bad());
    }
    Ok(n)
}

/// A heap buffer whose address is handed to the kernel; freed on drop.
struct Buf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: `Buf` owns its allocation exactly as a `Box<[u8]>` does; the
// only other user is the kernel, through the queue that owns the `Buf`
// (see "Buffer ownership" above), so moving it to the queue's thread
// moves the whole ownership.
unsafe impl Send for Buf {}

impl Buf {
    fn new(len: usize) -> Self {
        let b: Box<[u8]> = vec![0u8; len].into_boxed_slice();
        let ptr = NonNull::new(Box::into_raw(b).cast::<u8>()).unwrap_or(NonNull::dangling());
        Self { ptr, len }
    }

    fn addr(&self) -> usize {
        self.ptr.as_ptr() as usize
    }

    /// # Safety
    /// The kernel must not own the buffer now: no command of its entry is
    /// in flight.
    unsafe fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` is a live allocation of `len` bytes (made in
        // `new`, freed only in `drop`); `&mut self` makes this the only
        // Rust reference, and the caller guarantees the kernel is not
        // writing it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` came from `Box::into_raw` of a boxed slice
        // of `len` bytes in `new`, and are freed only here.
        drop(unsafe {
            Box::from_raw(std::ptr::slice_from_raw_parts_mut(
                self.ptr.as_ptr(),
                self.len,
            ))
        });
    }
}

/// `struct iovec` (`{ void *, size_t }`) with integer fields, so it is
/// `Send`.
#[repr(C)]
struct Iov {
    base: usize,
    len: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Not yet registered.
    Idle,
    /// Its command is in flight: the kernel owns the buffers.
    Kernel,
    /// Holds a request being answered.
    User,
    /// The kernel tore it down or refused it.
    Dead,
}

struct Ent {
    header: Buf,
    payload: Buf,
    /// Read by the kernel at registration; kept for the entry's life.
    iov: Box<[Iov; 2]>,
    state: State,
    unique: u64,
    commit_id: u64,
}

/// One kernel queue's ring and entries, made before the mount.
struct Queue {
    qid: u16,
    ring: IoUring<squeue::Entry128, cqueue::Entry>,
    ents: Vec<Ent>,
    wake: Arc<File>,
    /// The eventfd read's 8 bytes (the kernel's while the read is in
    /// flight).
    wake_buf: Buf,
    wake_armed: bool,
}

/// The rings and buffers of every queue, ready to register.
pub(crate) struct Prepared {
    queues: Vec<Queue>,
}

/// The running queue threads.
pub(crate) struct Running {
    threads: Vec<JoinHandle<()>>,
}

impl Running {
    /// Waits for the queue threads (they end when the connection does).
    pub(crate) fn join(self) {
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// Makes one ring per kernel queue with `payload`-byte entries, or says
/// why not (the caller then serves /dev/fuse only).
pub(crate) fn prepare(payload: usize) -> io::Result<Prepared> {
    let nq = possible_cpus()?;
    let depth = (MAX_ENTRIES / nq).clamp(1, MAX_DEPTH);
    let payload = payload.max(abi::MIN_PAYLOAD);
    let mut queues = Vec::with_capacity(nq);
    for qid in 0..nq {
        let ring = IoUring::<squeue::Entry128, cqueue::Entry>::builder()
            .build((depth as u32 + 1).next_power_of_two())?;
        let ents = (0..depth)
            .map(|_| {
                let header = Buf::new(abi::HEADER_LEN);
                let payload = Buf::new(payload);
                let iov = Box::new([
                    Iov {
                        base: header.addr(),
                        len: header.len,
                    },
                    Iov {
                        base: payload.addr(),
                        len: payload.len,
                    },
                ]);
                Ent {
                    header,
                    payload,
                    iov,
                    state: State::Idle,
                    unique: 0,
                    commit_id: 0,
                }
            })
            .collect();
        queues.push(Queue {
            qid: qid as u16,
            ring,
            ents,
            wake: Arc::new(eventfd()?),
            wake_buf: Buf::new(8),
            wake_armed: false,
        });
    }
    Ok(Prepared { queues })
}

fn eventfd() -> io::Result<File> {
    // SAFETY: plain syscall with no pointer arguments.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh descriptor nothing else owns.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

impl Prepared {
    /// Registers every queue's entries on `dev` (a /dev/fuse descriptor of
    /// the connection, after INIT agreed to `FUSE_OVER_IO_URING`) and
    /// serves them. `Err` if the kernel refused a registration (it then
    /// sends requests over /dev/fuse); the threads still serve whatever
    /// entries it took, until the connection ends.
    pub(crate) fn start(
        self,
        dev: OwnedFd,
        ops: Arc<Ops>,
        stats: Arc<Stats>,
    ) -> (Running, io::Result<()>) {
        let dev = Arc::new(dev);
        let (tx, rx) = mpsc::sync_channel(self.queues.len());
        let mut threads = Vec::new();
        let mut result = Ok(());
        let n = self.queues.len();
        let mut started = 0;
        for q in self.queues {
            let qid = q.qid;
            let dev2 = Arc::clone(&dev);
            let ops = Arc::clone(&ops);
            let stats = Arc::clone(&stats);
            let tx = tx.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("ucrypt-fuse-q{qid}"))
                .spawn(move || run(q, &dev2, &ops, &stats, &tx));
            match spawned {
                Ok(t) => {
                    threads.push(t);
                    started += 1;
                }
                Err(e) => {
                    // The kernel holds requests until every queue
                    // registers: make it give up on the ring instead.
                    refuse(dev.as_raw_fd());
                    result = Err(e);
                    break;
                }
            }
        }
        drop(tx);
        for _ in 0..started {
            match rx.recv() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    if result.is_ok() {
                        result = Err(e);
                    }
                }
                Err(_) => {
                    if result.is_ok() {
                        result = Err(io::Error::other("A FUSE queue thread ended early"));
                    }
                }
            }
        }
        if started < n && result.is_ok() {
            result = Err(io::Error::other("Not every FUSE queue started"));
        }
        (Running { threads }, result)
    }
}

/// A registration the kernel refuses (no buffers): it then stops waiting
/// for the ring and sends requests over /dev/fuse.
fn refuse(dev: RawFd) {
    let Ok(mut ring) = IoUring::<squeue::Entry128, cqueue::Entry>::builder().build(2) else {
        return;
    };
    let sqe = opcode::UringCmd80::new(types::Fd(dev), abi::CMD_REGISTER)
        .cmd(abi::cmd_req(0, 0))
        .build()
        .user_data(0);
    // SAFETY: the SQE points at no memory (no address, length 0).
    if unsafe { ring.submission().push(&sqe) }.is_ok() {
        let _ = ring.submit_and_wait(1);
    }
}

/// A `FUSE_IO_URING_CMD_REGISTER` SQE for `ent`.
fn register_sqe(dev: RawFd, qid: u16, idx: usize, ent: &Ent) -> squeue::Entry128 {
    let sqe = opcode::UringCmd80::new(types::Fd(dev), abi::CMD_REGISTER)
        .cmd(abi::cmd_req(0, qid))
        .addr(Some(ent.iov.as_ptr() as u64))
        .build()
        .user_data(idx as u64);
    with_len(sqe, 2)
}

/// Sets the SQE's `len` field, which the io-uring crate's `UringCmd80`
/// builder has no setter for (the kernel reads the iovec count there).
fn with_len(sqe: squeue::Entry128, len: u32) -> squeue::Entry128 {
    const _: () = assert!(std::mem::size_of::<squeue::Entry128>() == 128);
    // SAFETY: `Entry128` is `#[repr(C)]` over `struct io_uring_sqe` (64
    // bytes) and 64 command bytes, all plain integers (unions of
    // integers, no padding, no pointers or references), so it and
    // `[u8; 128]` have the same size and every byte pattern is a valid
    // value of either.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(sqe) };
    // `__u32 len` sits at byte 24 of `struct io_uring_sqe`.
    raw[24..28].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: as above.
    unsafe { std::mem::transmute::<[u8; 128], squeue::Entry128>(raw) }
}

/// An engine completion for entry `idx`: the answer's payload or errno.
struct Done {
    idx: usize,
    answer: Result<Vec<u8>, Errno>,
}

/// Hands an answer to the queue thread; one dropped unanswered answers
/// `EIO`, so the kernel's request never waits forever.
struct Responder {
    idx: usize,
    tx: Sender<Done>,
    wake: Arc<File>,
    sent: bool,
}

impl Responder {
    fn send(mut self, answer: Result<Vec<u8>, Errno>) {
        self.sent = true;
        self.post(answer);
    }
    fn post(&self, answer: Result<Vec<u8>, Errno>) {
        if self
            .tx
            .send(Done {
                idx: self.idx,
                answer,
            })
            .is_ok()
        {
            let _ = (&*self.wake).write(&1u64.to_ne_bytes());
        }
    }
}

impl Drop for Responder {
    fn drop(&mut self) {
        if !self.sent {
            self.post(Err(Errno::EIO));
        }
    }
}

fn pin_to_cpu(cpu: usize) {
    // SAFETY: `cpu_set_t` is a plain bit array; all zeroes is empty.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    if cpu >= 8 * std::mem::size_of::<libc::cpu_set_t>() {
        return;
    }
    // SAFETY: `cpu` is within the set's bits (checked above).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: `set` is a valid `cpu_set_t` for the call's duration; a
    // failure (CPU offline or outside our cpuset) only leaves the thread
    // unpinned.
    let _ = unsafe { libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set) };
}

/// The queue thread: registers, reports to `ready`, then serves until
/// every entry is torn down.
fn run(
    mut q: Queue,
    dev: &OwnedFd,
    ops: &Arc<Ops>,
    stats: &Stats,
    ready: &SyncSender<io::Result<()>>,
) {
    pin_to_cpu(usize::from(q.qid));
    let dev = dev.as_raw_fd();
    let (tx, rx) = mpsc::channel::<Done>();
    let mut pending = Vec::new();
    let registered = q.register(dev, &mut pending);
    let ok = registered.is_ok();
    let _ = ready.send(registered);
    // Entries the kernel took (all, unless it refused one) are served.
    q.arm_wake();
    let _ = ok;
    loop {
        for (ud, res) in pending.drain(..) {
            q.complete(dev, ud, res, ops, stats, &tx, &rx);
        }
        if q.ents
            .iter()
            .all(|e| matches!(e.state, State::Dead | State::Idle))
        {
            break;
        }
        if let Err(e) = q.ring.submit_and_wait(1) {
            match e.raw_os_error() {
                // Interrupted, or completions to reap first.
                Some(libc::EINTR | libc::EBUSY) => {}
                // Short of memory for now: try again shortly.
                Some(libc::EAGAIN | libc::ENOMEM) => {
                    std::thread::sleep(std::time::Duration::from_millis(1))
                }
                _ => {
                    // The ring itself failed: nothing more can be answered
                    // here; the kernel ends the requests these entries
                    // hold when it tears them down at unmount.
                    break;
                }
            }
        }
        pending.extend(q.ring.completion().map(|c| (c.user_data(), c.result())));
    }
    if q.ents
        .iter()
        .any(|e| !matches!(e.state, State::Dead | State::Idle))
    {
        // The kernel may still write into entries whose commands are in
        // flight: keep their buffers for the life of the process.
        std::mem::forget(std::mem::take(&mut q.ents));
        std::mem::forget(std::mem::replace(&mut q.wake_buf, Buf::new(0)));
        return;
    }
    q.disarm_wake();
}

impl Queue {
    /// Registers every entry; `Err` with the kernel's refusal.
    fn register(&mut self, dev: RawFd, pending: &mut Vec<(u64, i32)>) -> io::Result<()> {
        for (idx, ent) in self.ents.iter_mut().enumerate() {
            let sqe = register_sqe(dev, self.qid, idx, ent);
            // SAFETY: the SQE points at `ent.iov` and, through it, at the
            // entry's buffers, all owned by this queue and freed only after
            // the ring is closed with no command in flight.
            if unsafe { self.ring.submission().push(&sqe) }.is_err() {
                break;
            }
            ent.state = State::Kernel;
        }
        self.ring.submit()?;
        // A refusal completes at once; a registration that holds does not
        // complete until a request arrives (then a success, kept for the
        // loop).
        let mut refused = None;
        for c in self.ring.completion() {
            let (ud, res) = (c.user_data(), c.result());
            if res < 0 && (ud as usize) < self.ents.len() {
                self.ents[ud as usize].state = State::Dead;
                refused.get_or_insert(res);
            } else {
                pending.push((ud, res));
            }
        }
        match refused {
            Some(res) => Err(io::Error::from_raw_os_error(-res)),
            None => Ok(()),
        }
    }

    fn arm_wake(&mut self) {
        let sqe: squeue::Entry128 = opcode::Read::new(
            types::Fd(self.wake.as_raw_fd()),
            self.wake_buf.ptr.as_ptr(),
            8,
        )
        .build()
        .user_data(WAKE)
        .into();
        // SAFETY: the read writes `wake_buf`, owned by this queue and freed
        // only after the read completed (`disarm_wake`).
        if unsafe { self.ring.submission().push(&sqe) }.is_ok() {
            self.wake_armed = true;
        }
    }

    /// Completes the eventfd read in flight, so its buffer may be freed.
    fn disarm_wake(&mut self) {
        if !self.wake_armed {
            return;
        }
        let _ = (&*self.wake).write(&1u64.to_ne_bytes());
        loop {
            if self.ring.submit_and_wait(1).is_err() {
                // Cannot see it complete: keep its buffer forever rather
                // than free memory the kernel may still write.
                std::mem::forget(std::mem::replace(&mut self.wake_buf, Buf::new(0)));
                return;
            }
            if self.ring.completion().any(|c| c.user_data() == WAKE) {
                self.wake_armed = false;
                return;
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn complete(
        &mut self,
        dev: RawFd,
        ud: u64,
        res: i32,
        ops: &Arc<Ops>,
        stats: &Stats,
        tx: &Sender<Done>,
        rx: &Receiver<Done>,
    ) {
        if ud == WAKE {
            self.wake_armed = false;
            while let Ok(d) = rx.try_recv() {
                self.answer(dev, d.idx, d.answer);
            }
            self.arm_wake();
            return;
        }
        let idx = ud as usize;
        let Some(ent) = self.ents.get_mut(idx) else {
            return;
        };
        if res < 0 {
            // Torn down (unmount, abort) or refused.
            ent.state = State::Dead;
            return;
        }
        ent.state = State::User;
        stats.requests.fetch_add(1, Ordering::Relaxed);
        let responder = Responder {
            idx,
            tx: tx.clone(),
            wake: Arc::clone(&self.wake),
            sent: false,
        };
        if let Some(answer) = self.dispatch(idx, ops, responder) {
            self.answer(dev, idx, answer);
        }
    }

    /// Answers the request in entry `idx` at once (`Some`), or hands the
    /// responder to the engine (`None`).
    fn dispatch(
        &mut self,
        idx: usize,
        ops: &Arc<Ops>,
        r: Responder,
    ) -> Option<Result<Vec<u8>, Errno>> {
        let ent = &mut self.ents[idx];
        // SAFETY: the entry's command completed (its CQE was just seen)
        // and the next is submitted only by `answer`: the kernel does not
        // own the buffers now.
        let (h, payload) = unsafe { (ent.header.bytes(), ent.payload.bytes()) };
        let inh = abi::InHeader::parse(h);
        ent.unique = inh.unique;
        ent.commit_id = inh.commit_id;
        let op = abi::op_in(h);
        let ino = INodeNo(inh.nodeid);
        let data = &payload[..inh.payload_sz.min(payload.len())];
        if inh.uid != ops.owner_uid() && !owner_free(inh.opcode) {
            // As fuser refuses other users (`SessionACL::Owner`).
            return Some(Err(Errno::EACCES));
        }
        let answer = match inh.opcode {
            abi::LOOKUP => {
                let name = data.split(|&b| b == 0).next().unwrap_or(&[]);
                ops.lookup(ino, name).map(|a| abi::entry_out(&a, TTL))
            }
            abi::GETATTR => ops.getattr(ino).map(|a| abi::attr_out(&a, TTL)),
            abi::SETATTR => ops
                .setattr(ino, abi::setattr_in(op))
                .map(|a| abi::attr_out(&a, TTL)),
            abi::OPEN => ops.open(ino, abi::open_in(op)).map(abi::open_out),
            abi::OPENDIR => Ok(abi::open_out(false)),
            abi::RELEASE | abi::RELEASEDIR | abi::FLUSH | abi::ACCESS => Ok(Vec::new()),
            abi::STATFS => {
                let s = ops.statfs();
                Ok(abi::statfs_out(s.blocks, s.files, s.bsize, s.namelen))
            }
            abi::READDIR => {
                let (offset, size) = abi::read_in(op);
                ops.readdir(ino, offset).map(|entries| {
                    let mut out = Vec::new();
                    for (ino, next, kind, name) in entries {
                        if !abi::push_dirent(
                            &mut out,
                            size as usize,
                            ino.0,
                            next,
                            kind,
                            name.as_bytes(),
                        ) {
                            break;
                        }
                    }
                    out
                })
            }
            abi::READ => {
                let (offset, size) = abi::read_in(op);
                ops.read(ino, offset, size, move |res| r.send(res));
                return None;
            }
            abi::WRITE => {
                let (offset, size, flags) = abi::write_in(op);
                let Some(bytes) = data.get(..size as usize) else {
                    return Some(Err(Errno::EINVAL));
                };
                ops.write(ino, offset, bytes, flags, move |res| {
                    r.send(res.map(abi::write_out))
                });
                return None;
            }
            abi::FSYNC | abi::FSYNCDIR => {
                ops.fsync(move |res| r.send(res.map(|()| Vec::new())));
                return None;
            }
            abi::FALLOCATE => {
                let (offset, length, mode) = abi::fallocate_in(op);
                ops.fallocate(ino, offset, length, mode, move |res| {
                    r.send(res.map(|()| Vec::new()))
                });
                return None;
            }
            _ => Err(Errno::ENOSYS),
        };
        // Answered here: the responder has nothing to send.
        let mut r = r;
        r.sent = true;
        Some(answer)
    }

    /// Writes the answer into entry `idx` and commits it, fetching the
    /// entry's next request.
    fn answer(&mut self, dev: RawFd, idx: usize, answer: Result<Vec<u8>, Errno>) {
        let qid = self.qid;
        let Some(ent) = self.ents.get_mut(idx) else {
            return;
        };
        if ent.state != State::User {
            return;
        }
        // SAFETY: the entry holds a request (`User`): its command
        // completed and the next is submitted below, after these writes.
        let (h, payload) = unsafe { (ent.header.bytes(), ent.payload.bytes()) };
        let (error, len) = match answer {
            Ok(bytes) if bytes.len() <= payload.len() => {
                payload[..bytes.len()].copy_from_slice(&bytes);
                (0, bytes.len())
            }
            Ok(_) => (-libc::EIO, 0),
            Err(e) => (-e.code(), 0),
        };
        abi::set_out_header(h, ent.unique, error, len);
        let sqe = opcode::UringCmd80::new(types::Fd(dev), abi::CMD_COMMIT_AND_FETCH)
            .cmd(abi::cmd_req(ent.commit_id, qid))
            .build()
            .user_data(idx as u64);
        // SAFETY: the command hands the entry's buffers (registered with
        // it) back to the kernel; this thread does not touch them until the
        // command's CQE.
        let pushed = unsafe { self.ring.submission().push(&sqe) };
        if pushed.is_err() {
            // The queue holds one SQE per entry plus the eventfd read, so
            // it cannot be full; if it were, submit and retry once.
            let _ = self.ring.submit();
            // SAFETY: as above.
            if unsafe { self.ring.submission().push(&sqe) }.is_err() {
                ent.state = State::Dead;
                return;
            }
        }
        ent.state = State::Kernel;
    }
}

/// Requests fuser lets other users make (the kernel may send them with
/// no uid of the file's owner).
fn owner_free(opcode: u32) -> bool {
    matches!(
        opcode,
        abi::READ
            | abi::READDIR
            | abi::WRITE
            | abi::FSYNC
            | abi::FSYNCDIR
            | abi::RELEASE
            | abi::RELEASEDIR
    )
}
