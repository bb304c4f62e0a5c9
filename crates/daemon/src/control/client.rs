//! The client side of the control socket: [`call`] and one typed wrapper
//! per request.

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use crypto::Secret;
use datapath::CryptMode;

use super::{
    decode_reply, encode_request_into, read_line, Flags, Ping, ReencryptAction, ReencryptStart,
    Reencryption, Reply, Request, Status,
};
use crate::error::{Error, ErrorKind, Result};
use crate::runtime::{self, Paths};

/// Longest reply line the client reads.
const MAX_REPLY: u64 = 1 << 20;

/// Sends `req` to volume `name`'s daemon and returns its reply.
///
/// Fails with [`ErrorKind::NotActive`] when nothing serves `name`,
/// [`ErrorKind::Busy`] when a live daemon does not accept yet,
/// [`ErrorKind::Protocol`] when the exchange breaks, and with the daemon's
/// own kind and message when it answers [`Reply::Failed`].
pub fn call(name: &str, req: &Request, timeout: Duration) -> Result<Reply> {
    let not_active = || {
        Error::new(
            ErrorKind::NotActive,
            format!("Device {name} is not active."),
        )
    };
    let Some(dir) = runtime::verified_dir()? else {
        return Err(not_active());
    };
    let paths = Paths::new(&dir, name);
    let mut s = UnixStream::connect(&paths.ctl).map_err(|_| {
        if runtime::is_live(&paths) {
            Error::new(
                ErrorKind::Busy,
                format!(
                    "Device {name} is starting or not answering on {}",
                    paths.ctl.display()
                ),
            )
        } else {
            not_active()
        }
    })?;
    check_peer(&s, name, &paths)?;
    let _ = s.set_read_timeout(Some(timeout));
    // `resume` carries a key: the line is built in locked memory.
    let mut line = Secret::with_capacity(4096);
    encode_request_into(req, &mut line);
    s.write_all(&line).map_err(|e| {
        Error::new(
            ErrorKind::Protocol,
            format!("Cannot talk to the {name} daemon"),
        )
        .with_source(e)
    })?;
    // The reply to `table --showkeys` holds the key: read straight into
    // locked memory (no BufReader, whose heap buffer would keep a copy).
    let reply = read_line(s.take(MAX_REPLY)).map_err(|e| {
        Error::new(
            ErrorKind::Protocol,
            format!("No reply from the {name} daemon"),
        )
        .with_source(e)
    })?;
    let reply = reply.as_str().ok_or_else(|| {
        Error::new(
            ErrorKind::Protocol,
            format!("Malformed reply from the {name} daemon (not UTF-8)"),
        )
    })?;
    match decode_reply(reply) {
        Ok(Reply::Failed { kind, message }) => Err(Error::new(kind, message)),
        Ok(r) => Ok(r),
        Err(e) if e.kind() == ErrorKind::Protocol && reply.is_empty() => Err(Error::new(
            ErrorKind::Protocol,
            format!("No reply from the {name} daemon"),
        )),
        Err(e) => Err(e),
    }
}

/// Refuses to talk to a control socket served by anyone but us (or root):
/// checked with `SO_PEERCRED` before a single byte is sent.
fn check_peer(s: &UnixStream, name: &str, paths: &Paths) -> Result<()> {
    let uid = peer_uid(s).map_err(|e| {
        Error::new(
            ErrorKind::Protocol,
            format!("Cannot identify the {name} daemon"),
        )
        .with_source(e)
    })?;
    let me = runtime::euid();
    if uid == me || uid == 0 {
        return Ok(());
    }
    Err(Error::new(
        ErrorKind::PermissionDenied,
        format!(
            "Refusing to talk to {}: it is served by uid {uid}, not by uid {me}",
            paths.ctl.display()
        ),
    ))
}

/// The uid of the process at the other end of `s` (`SO_PEERCRED`).
pub(crate) fn peer_uid(s: &UnixStream) -> std::io::Result<u32> {
    nix::sys::socket::getsockopt(s, nix::sys::socket::sockopt::PeerCredentials)
        .map(|c| c.uid())
        .map_err(std::io::Error::from)
}

fn unexpected(name: &str, r: &Reply) -> Error {
    let what = match r {
        Reply::Ping(_) => "ping",
        Reply::Status(_) => "status",
        Reply::Table { .. } => "table",
        Reply::Refreshed { .. } => "refreshed",
        Reply::Closed => "closed",
        Reply::Resized { .. } => "resized",
        Reply::Suspended => "suspended",
        Reply::Resumed => "resumed",
        Reply::Reloaded { .. } => "reloaded",
        Reply::Reencryption(_) => "reencryption",
        Reply::Failed { .. } => "failed",
    };
    Error::new(
        ErrorKind::Protocol,
        format!("Unexpected {what:?} reply from the {name} daemon"),
    )
}

/// [`Request::Ping`].
pub fn ping(name: &str, timeout: Duration) -> Result<Ping> {
    match call(name, &Request::Ping, timeout)? {
        Reply::Ping(p) => Ok(p),
        r => Err(unexpected(name, &r)),
    }
}

/// [`Request::Status`].
pub fn status(name: &str, timeout: Duration) -> Result<Status> {
    match call(name, &Request::Status, timeout)? {
        Reply::Status(s) => Ok(*s),
        r => Err(unexpected(name, &r)),
    }
}

/// [`Request::Table`]; the line is in locked memory, wiped when dropped.
pub fn table(name: &str, showkeys: bool, timeout: Duration) -> Result<Secret> {
    match call(name, &Request::Table { showkeys }, timeout)? {
        Reply::Table { line } => Ok(line),
        r => Err(unexpected(name, &r)),
    }
}

/// `ucrypt table`: asks for the line and writes it, newline included, to
/// standard output in one `write` from locked memory (past stdout's
/// buffer, which would keep a heap copy of the key).
pub fn print_table(name: &str, showkeys: bool, timeout: Duration) -> Result<()> {
    let mut line = table(name, showkeys, timeout)?;
    line.push(b'\n');
    let out = std::io::stdout();
    let mut out = out.lock();
    let io = |e| Error::new(ErrorKind::Io, "Cannot write to standard output").with_source(e);
    out.flush().map_err(io)?;
    let fd = out.as_fd().try_clone_to_owned().map_err(io)?;
    std::fs::File::from(fd).write_all(&line).map_err(io)
}

/// The configuration after a [`Request::Refresh`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refreshed {
    /// Data-path mode in effect.
    pub mode: CryptMode,
    /// Performance flags in effect.
    pub flags: Flags,
    /// Whether discards are passed down.
    pub allow_discards: bool,
}

impl Refreshed {
    /// `refresh`'s answer line for volume `name`: the data path and the
    /// flags now in effect (`(none)` when no flag is set).
    pub fn line(&self, name: &str) -> String {
        let flags = super::flag_words(self.allow_discards, &self.flags);
        let flags = if flags.is_empty() {
            "(none)".to_owned()
        } else {
            flags.join(" ")
        };
        let mode = super::mode_name(self.mode);
        format!("{name}: data path {mode}, flags: {flags}")
    }
}

/// [`Request::Refresh`].
pub fn refresh(
    name: &str,
    mode: Option<CryptMode>,
    flags: Flags,
    timeout: Duration,
) -> Result<Refreshed> {
    match call(name, &Request::Refresh { mode, flags }, timeout)? {
        Reply::Refreshed {
            mode,
            flags,
            allow_discards,
        } => Ok(Refreshed {
            mode,
            flags,
            allow_discards,
        }),
        r => Err(unexpected(name, &r)),
    }
}

/// [`Request::Close`]: returns once the daemon has flushed.
pub fn close(name: &str, timeout: Duration) -> Result<()> {
    match call(name, &Request::Close, timeout)? {
        Reply::Closed => Ok(()),
        r => Err(unexpected(name, &r)),
    }
}

/// The size after a [`Request::Resize`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resized {
    /// The size now, in 512-byte sectors.
    pub size_sectors: u64,
    /// What the export could not pass on to its clients.
    pub notes: Vec<String>,
}

/// [`Request::Resize`]: `size_sectors` or, with `None`, all the device
/// holds past the data offset.
pub fn resize(name: &str, size_sectors: Option<u64>, timeout: Duration) -> Result<Resized> {
    match call(name, &Request::Resize { size_sectors }, timeout)? {
        Reply::Resized {
            size_sectors,
            notes,
        } => Ok(Resized {
            size_sectors,
            notes,
        }),
        r => Err(unexpected(name, &r)),
    }
}

/// [`Request::Suspend`]: returns once IO is blocked and the key wiped.
pub fn suspend(name: &str, timeout: Duration) -> Result<()> {
    match call(name, &Request::Suspend, timeout)? {
        Reply::Suspended => Ok(()),
        r => Err(unexpected(name, &r)),
    }
}

/// [`Request::Resume`] with the unlocked table `line` (key shown).
pub fn resume(name: &str, line: Secret, timeout: Duration) -> Result<()> {
    match call(name, &Request::Resume { line }, timeout)? {
        Reply::Resumed => Ok(()),
        r => Err(unexpected(name, &r)),
    }
}

/// [`Request::Reload`] with the new `table` (keys shown, in locked
/// memory): returns the number of targets and the size in 512-byte
/// sectors now served.
pub fn reload(name: &str, table: Secret, timeout: Duration) -> Result<(usize, u64)> {
    match call(name, &Request::Reload { table }, timeout)? {
        Reply::Reloaded {
            targets,
            size_sectors,
        } => Ok((targets, size_sectors)),
        r => Err(unexpected(name, &r)),
    }
}

/// [`Request::Reencrypt`]: starts (or resumes) the online reencryption;
/// the answer comes once the keys are unlocked and the data moves.
pub fn reencrypt(name: &str, start: ReencryptStart, timeout: Duration) -> Result<Reencryption> {
    match call(name, &Request::Reencrypt(Box::new(start)), timeout)? {
        Reply::Reencryption(r) => Ok(r),
        r => Err(unexpected(name, &r)),
    }
}

/// [`Request::ReencryptSet`]: pause, resume or a new rate.
pub fn reencrypt_set(
    name: &str,
    action: ReencryptAction,
    timeout: Duration,
) -> Result<Reencryption> {
    match call(name, &Request::ReencryptSet { action }, timeout)? {
        Reply::Reencryption(r) => Ok(r),
        r => Err(unexpected(name, &r)),
    }
}
