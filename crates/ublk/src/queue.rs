//! The queue threads: each owns its tags' IO buffers, submits translated
//! requests to the engine without blocking, and completes the commands
//! from an eventfd-signalled mailbox the engine's callbacks fill.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd};
use std::sync::{Arc, Mutex};

use datapath::{Completion, Engine};
use libublk::io::{BufDescList, UblkDev, UblkIOCtx, UblkQueue};
use libublk::{BufDesc, UblkIORes};

use crate::translate::{completion_result, translate, IoDesc};

/// Completions handed from engine threads back to one queue thread.
struct Mailbox {
    done: Mutex<Vec<(u16, u32, Completion)>>,
    eventfd: File,
}

impl Mailbox {
    fn new() -> std::io::Result<Self> {
        // SAFETY: eventfd takes no pointers; a non-negative return is a new
        // descriptor that nothing else owns, so File may take ownership.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: see above: `fd` is fresh and owned by no one else.
        let eventfd = unsafe { File::from_raw_fd(fd) };
        Ok(Self {
            done: Mutex::new(Vec::new()),
            eventfd,
        })
    }

    /// Called on an engine thread.
    fn post(&self, tag: u16, len: u32, c: Completion) {
        self.done
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((tag, len, c));
        // The counter cannot overflow in practice (2^64-2); a failed write
        // (EAGAIN at the limit) still leaves it readable, which is all we need.
        let _ = (&self.eventfd).write(&1u64.to_ne_bytes());
    }

    /// Called on the queue thread after the eventfd poll fired.
    fn take(&self) -> Vec<(u16, u32, Completion)> {
        let mut counter = [0u8; 8];
        // Reset the counter before draining: a post racing with us either
        // lands in this drain or re-raises the counter for the next poll.
        let _ = (&self.eventfd).read(&mut counter);
        std::mem::take(&mut *self.done.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// Marks the eventfd poll among the queue's target IOs.
const POLL_TAG: u16 = 0;
const POLL_OP: u32 = 0xfe;

fn arm_poll(q: &UblkQueue, fd: i32) -> Result<(), libublk::UblkError> {
    let sqe = io_uring::opcode::PollAdd::new(io_uring::types::Fd(fd), libc::POLLIN as u32)
        .build()
        .user_data(UblkIOCtx::build_user_data(POLL_TAG, POLL_OP, 0, true));
    q.ublk_submit_sqe_sync(sqe)
}

/// Serves one hardware queue until the device stops.
pub(crate) fn serve_queue(qid: u16, dev: &UblkDev, engine: &Arc<Engine>) {
    let mailbox = match Mailbox::new() {
        Ok(m) => Arc::new(m),
        Err(e) => {
            eprintln!("ublk queue {qid}: cannot create eventfd: {e}");
            return;
        }
    };
    let mut bufs = dev.alloc_queue_io_bufs();
    let queue = match UblkQueue::new(qid, dev)
        .and_then(|q| q.submit_fetch_commands_unified(BufDescList::Slices(Some(&bufs))))
    {
        Ok(q) => q,
        Err(e) => {
            eprintln!("ublk queue {qid}: setup failed: {e}");
            return;
        }
    };
    let efd = mailbox.eventfd.as_raw_fd();
    if let Err(e) = arm_poll(&queue, efd) {
        eprintln!("ublk queue {qid}: cannot arm eventfd poll: {e}");
        return;
    }
    // `bufs` moves into the handler; the heap buffers the driver was given
    // above do not move with it.
    let handler = move |q: &UblkQueue, tag: u16, ctx: &UblkIOCtx| {
        if ctx.is_tgt_io() {
            if UblkIOCtx::user_data_to_op(ctx.user_data()) != POLL_OP {
                return;
            }
            for (tag, len, c) in mailbox.take() {
                finish(q, &mut bufs, tag, len, c);
            }
            // A failed poll (the ring is being torn down) is not re-armed, so
            // it cannot turn into a busy loop.
            if ctx.result() < 0 {
                eprintln!(
                    "ublk queue {qid}: eventfd poll failed with errno {}",
                    -ctx.result()
                );
            } else if let Err(e) = arm_poll(q, efd) {
                eprintln!("ublk queue {qid}: cannot re-arm eventfd poll: {e}");
            }
            return;
        }
        let iod = q.get_iod(tag);
        let d = IoDesc {
            op_flags: iod.op_flags,
            nr_sectors: iod.nr_sectors,
            start_sector: iod.start_sector,
        };
        let Some(buf) = bufs.get(usize::from(tag)) else {
            return;
        };
        match translate(&d, buf.as_slice()) {
            Ok(req) => {
                let len = d.nr_sectors.saturating_mul(512);
                let mb = mailbox.clone();
                engine.submit(req, move |c| mb.post(tag, len, c));
            }
            Err(errno) => complete(q, &bufs, tag, -errno),
        }
    };
    queue.wait_and_handle_io(handler);
}

/// Copies read data into the tag buffer and completes the command.
fn finish(
    q: &UblkQueue,
    bufs: &mut [libublk::helpers::IoBuf<u8>],
    tag: u16,
    len: u32,
    c: Completion,
) {
    let mut res = completion_result(len, &c);
    if let (Ok(Some(data)), Some(buf)) = (&c, bufs.get_mut(usize::from(tag))) {
        match buf.as_mut_slice().get_mut(..data.len()) {
            Some(dst) => dst.copy_from_slice(data),
            None => res = -libc::EIO,
        }
    }
    complete(q, bufs, tag, res);
}

fn complete(q: &UblkQueue, bufs: &[libublk::helpers::IoBuf<u8>], tag: u16, res: i32) {
    let Some(buf) = bufs.get(usize::from(tag)) else {
        return;
    };
    if let Err(e) = q.complete_io_cmd_unified(
        tag,
        BufDesc::Slice(buf.as_slice()),
        Ok(UblkIORes::Result(res)),
    ) {
        eprintln!(
            "ublk queue {}: completing tag {tag} failed: {e}",
            q.get_qid()
        );
    }
}
