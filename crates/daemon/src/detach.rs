//! Detaching: the caller resolves the table (prompting, KDFs) in the
//! foreground, then re-executes itself as a daemon in its own process
//! group, handing the table — key included — over a pipe on stdin, never
//! on the command line.
//!
//! ```text
//!  caller: spawn(exe, args) ──stdin: table line──► child: read_table(stdin)
//!     │  stdout+stderr ─► NAME.log                    serve::run(...)
//!     └─ polls ping on NAME.ctl.sock until it answers (or the child exits)
//! ```
//!
//! The volume's name stays held across the hand-over: the caller's
//! [`NameLock`] descriptor is inherited by the child (named in
//! [`runtime::NAME_LOCK_FD_ENV`]), which adopts it, so no second `open` of
//! the name can slip in between.
//!
//! The child's command line comes from the caller
//! ([`OpenOptions::child_args`](crate::OpenOptions::child_args)); this
//! module only knows that the child serves `name` and reads its table
//! from stdin (see [`read_table`]).

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crypto::table::Targets;
use crypto::Secret;

use crate::control::{self, Ping};
use crate::error::{invalid, Error, ErrorKind, Result};
use crate::runtime::{self, NameLock, Paths};

/// How long a detached daemon may take to answer its first ping (LUKS
/// volumes are unlocked before, so this is engine and frontend start-up).
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Largest table read from stdin (every line of a multi-target table).
const MAX_TABLE_LINE: u64 = 60 << 10;

/// Starts `exe args…` detached (own process group, working directory `/`,
/// output to `NAME.log`, the runtime dir passed on), writes `table` with
/// its key to the child's stdin and waits until the daemon answers a ping
/// for `name`. `lock` (the caller's claim on `name`) is inherited by the
/// child.
///
/// If the child exits first, the error is [`ErrorKind::DaemonExited`] with
/// the child's exit code and the last `ucrypt: ` line of its log.
pub fn spawn(
    exe: &Path,
    args: &[String],
    name: &str,
    table: &Targets,
    lock: &NameLock,
) -> Result<Ping> {
    let paths = Paths::new(&runtime::ensure_dir()?, name);
    // Never through a symlink or into an existing file someone planted.
    let log = runtime::create_file(&paths.log, 0o600).map_err(|e| {
        let kind = if e.kind() == std::io::ErrorKind::AlreadyExists {
            ErrorKind::Busy
        } else {
            ErrorKind::PermissionDenied
        };
        Error::new(kind, format!("Cannot create {}", paths.log.display())).with_source(e)
    })?;
    let log2 = log
        .try_clone()
        .map_err(|e| Error::new(ErrorKind::PermissionDenied, "Cannot create log").with_source(e))?;
    let fd = lock.share()?;
    let spawned = Command::new(exe)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(log)
        .stderr(log2)
        .process_group(0)
        // Do not pin the caller's working directory (every path is absolute).
        .current_dir("/")
        .env("UCRYPT_RUNTIME_DIR", runtime::dir())
        .env(runtime::NAME_LOCK_FD_ENV, fd.to_string())
        .spawn();
    lock.seal();
    let mut child =
        spawned.map_err(|e| Error::new(ErrorKind::Io, "Cannot start the daemon").with_source(e))?;
    {
        let line = table.line(true);
        let mut stdin = child
            .stdin
            .take()
            .ok_or_else(|| Error::new(ErrorKind::Io, "Daemon has no stdin"))?;
        stdin.write_all(&line).map_err(|e| {
            Error::new(ErrorKind::Io, "Cannot hand the table to the daemon").with_source(e)
        })?;
    }
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            let log = std::fs::read_to_string(&paths.log).unwrap_or_default();
            let msg = log
                .lines()
                .rev()
                .find_map(|l| l.strip_prefix("ucrypt: "))
                .unwrap_or("the daemon exited during start-up")
                .to_owned();
            let code = st
                .code()
                .and_then(|c| u8::try_from(c).ok())
                .filter(|&c| c != 0)
                .unwrap_or(1);
            return Err(Error::daemon_exited(code, msg));
        }
        if let Ok(p) = control::ping(name, Duration::from_secs(2)) {
            return Ok(p);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err(Error::new(
                ErrorKind::NoDevice,
                format!(
                    "The daemon did not become ready in time; see {}",
                    paths.log.display()
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The child's side: reads the table line [`spawn`] wrote, straight into
/// locked memory (a [`Secret`] wipes the old pages when it grows).
pub fn read_table(input: impl Read) -> Result<Targets> {
    let line = Secret::read_from(input.take(MAX_TABLE_LINE), MAX_TABLE_LINE as usize);
    table_from(line)
}

/// [`read_table`] from standard input, past `Stdin`'s heap buffer (which
/// would keep a copy of the key): what the detached daemon calls.
pub fn read_table_stdin() -> Result<Targets> {
    table_from(Secret::read_stdin(MAX_TABLE_LINE as usize))
}

fn table_from(line: std::io::Result<Secret>) -> Result<Targets> {
    let line = line.map_err(|e| invalid("Cannot read the table from stdin").with_source(e))?;
    let line = line
        .as_str()
        .ok_or_else(|| invalid("Invalid table: the line from stdin is not UTF-8"))?;
    crate::resolve::plain_targets(line)
}
