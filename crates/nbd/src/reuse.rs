//! Where a connection's reply writer thread runs: a thread of its own (every
//! real server), or a parked thread the process keeps and hands the next
//! connection (`internal::fuzzing`, the `fuzzing` feature, whose sessions are so short
//! that spawning and joining a thread per session cost more than the
//! session itself). Either way the same [`crate::transmit::Conn::run_writer`]
//! runs; only the thread's birth and death differ.

use std::io;
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Mutex;
use std::thread::JoinHandle;

use crate::session::lock;

type Job = Box<dyn FnOnce() + Send>;
/// A job and where to report that it returned.
type Msg = (Job, Sender<()>);

/// Parked threads, each waiting on its own job channel.
static PARKED: Mutex<Vec<Sender<Msg>>> = Mutex::new(Vec::new());

/// A started writer, to wait for with [`Writer::join`].
pub(crate) enum Writer {
    Own(JoinHandle<()>),
    Reused(Receiver<()>),
}

impl Writer {
    /// Starts `job` on a new thread named `name`, or with `reuse` on a
    /// parked thread (a new one if none is idle), which parks again after.
    pub(crate) fn start(
        name: String,
        reuse: bool,
        job: impl FnOnce() + Send + 'static,
    ) -> io::Result<Self> {
        if !reuse {
            return std::thread::Builder::new()
                .name(name)
                .spawn(job)
                .map(Writer::Own);
        }
        let (done_tx, done) = mpsc::channel();
        let mut msg: Msg = (Box::new(job), done_tx);
        // An idle thread takes it; one whose channel is gone (it died
        // with a panic) is dropped and the next one tried.
        while let Some(t) = lock(&PARKED).pop() {
            match t.send(msg) {
                Ok(()) => return Ok(Writer::Reused(done)),
                Err(mpsc::SendError(m)) => msg = m,
            }
        }
        let (tx, rx) = mpsc::channel::<Msg>();
        let back = tx.clone();
        tx.send(msg).expect("own channel");
        std::thread::Builder::new()
            .name("nbd-reply-reused".into())
            .spawn(move || {
                for (job, done) in rx {
                    job();
                    // Park before reporting, so a caller that starts the
                    // next session right after `join` finds this thread.
                    lock(&PARKED).push(back.clone());
                    let _ = done.send(());
                }
            })?;
        Ok(Writer::Reused(done))
    }

    /// Waits until the job has returned (or panicked).
    pub(crate) fn join(self) {
        match self {
            Writer::Own(h) => {
                let _ = h.join();
            }
            Writer::Reused(done) => {
                let _ = done.recv();
            }
        }
    }
}
