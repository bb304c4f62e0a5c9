//! Servers go when the bench goes. A `ucrypt bench` killed by SIGKILL (or
//! the OOM killer) runs no `Drop`, so the servers it started (ucrypt,
//! nbdkit, qemu-storage-daemon) would serve on with nobody to stop them.
//! Each is started with the kernel's parent-death signal (`PR_SET_PDEATHSIG`,
//! set in the child between fork and exec, kept across exec): SIGTERM when
//! the bench's thread that started it ends, which is the main thread for
//! every server here. They then shut down as on `close`.
//!
//! Fenced unsafe: `CommandExt::pre_exec` is unsafe because the closure runs
//! in the forked child; this one only makes two syscalls.
#![allow(unsafe_code)]

use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;

use nix::sys::signal::Signal;
use nix::unistd::{getppid, Pid};

/// Makes `cmd`'s process receive SIGTERM when this thread ends.
pub(in crate::runner) fn die_with_bench(cmd: &mut Command) -> &mut Command {
    let bench = Pid::this();
    // SAFETY: the closure runs in the child after fork and before exec; it
    // allocates nothing, takes no lock and makes only the async-signal-safe
    // prctl and getppid syscalls.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(io::Error::from)?;
            // The bench died between fork and prctl: the signal will never
            // come, so do not start at all.
            if getppid() != bench {
                return Err(io::Error::other("ucrypt bench is gone"));
            }
            Ok(())
        })
    }
}
