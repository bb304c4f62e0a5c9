//! Where a daemon's files live, how to tell a live daemon from a dead one,
//! and the client side of the control channel.
//!
//! Per volume `NAME` the runtime directory holds:
//!
//! ```text
//!   NAME.pid        pid of the serving daemon (written once it is ready)
//!   NAME.ctl.sock   control socket (0600): one JSON request line, one reply line
//!   NAME.nbd.sock   default NBD socket (0600)
//!   NAME.fuse/      default FUSE mountpoint (holding the file NAME)
//!   NAME.log        the detached daemon's stdout/stderr
//! ```

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::Failure;

/// The runtime directory: `$UCRYPT_RUNTIME_DIR`, else `/run/ucrypt` as root,
/// else `$XDG_RUNTIME_DIR/ucrypt`, else `/tmp/ucrypt-$UID`.
pub fn dir() -> PathBuf {
    if let Some(d) = std::env::var_os("UCRYPT_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        // Absolute: the detached daemon runs in `/`.
        return std::path::absolute(&d).unwrap_or_else(|_| PathBuf::from(d));
    }
    let uid = euid();
    if uid == 0 {
        return PathBuf::from("/run/ucrypt");
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("ucrypt");
    }
    PathBuf::from(format!("/tmp/ucrypt-{uid}"))
}

/// Our effective uid, read from `/proc/self` (owned by the process's euid).
pub fn euid() -> u32 {
    std::fs::metadata("/proc/self")
        .map(|m| m.uid())
        .unwrap_or(u32::MAX)
}

/// Creates the runtime directory (0700) if missing.
pub fn ensure_dir() -> Result<PathBuf, Failure> {
    let d = dir();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&d)
        .map_err(|e| {
            Failure::denied(format!(
                "Cannot create runtime directory {}: {e}",
                d.display()
            ))
        })?;
    Ok(d)
}

/// Paths of one volume's runtime files.
pub struct Paths {
    /// `NAME.pid`
    pub pid: PathBuf,
    /// `NAME.ctl.sock`
    pub ctl: PathBuf,
    /// `NAME.nbd.sock`
    pub nbd: PathBuf,
    /// `NAME.fuse`
    pub fuse: PathBuf,
    /// `NAME.log`
    pub log: PathBuf,
}

impl Paths {
    /// The files of volume `name` in `dir`.
    pub fn new(dir: &Path, name: &str) -> Self {
        Self {
            pid: dir.join(format!("{name}.pid")),
            ctl: dir.join(format!("{name}.ctl.sock")),
            nbd: dir.join(format!("{name}.nbd.sock")),
            fuse: dir.join(format!("{name}.fuse")),
            log: dir.join(format!("{name}.log")),
        }
    }

    /// The files of volume `name` in the runtime directory.
    pub fn of(name: &str) -> Self {
        Self::new(&dir(), name)
    }
}

/// Volume names become file names: keep them to a safe alphabet.
pub fn check_name(name: &str) -> Result<(), Failure> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err(Failure::usage(format!(
            "Invalid volume name {name:?}: use 1-64 characters from A-Z a-z 0-9 - _ . (not starting with '.')"
        )))
    }
}

/// The pid recorded for `name` if that process is alive and is a ucrypt
/// daemon serving `name` (guards against pid reuse after a crash).
pub fn live_pid(paths: &Paths, name: &str) -> Option<u32> {
    let pid: u32 = std::fs::read_to_string(&paths.pid)
        .ok()?
        .trim()
        .parse()
        .ok()?;
    pid_serves(pid, name).then_some(pid)
}

/// True if process `pid` exists and its command line is `ucrypt … open … name`.
pub fn pid_serves(pid: u32, name: &str) -> bool {
    let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmd.split(|&b| b == 0).collect();
    // A zombie has an empty cmdline: treat it as dead.
    args.contains(&&b"open"[..]) && args.contains(&name.as_bytes())
}

/// Removes what a dead daemon left behind (pid file, sockets, dead FUSE mount).
pub fn clean_stale(paths: &Paths) {
    let _ = std::fs::remove_file(&paths.pid);
    let _ = std::fs::remove_file(&paths.ctl);
    if let Ok(m) = std::fs::symlink_metadata(&paths.nbd) {
        use std::os::unix::fs::FileTypeExt;
        if m.file_type().is_socket() {
            let _ = std::fs::remove_file(&paths.nbd);
        }
    }
    if fuse::clean_stale_mount(&paths.fuse).unwrap_or(false) {
        eprintln!(
            "ucrypt: detached a stale FUSE mount at {}",
            paths.fuse.display()
        );
    }
    let _ = std::fs::remove_dir(&paths.fuse);
}

/// Sends one control request and returns the reply object. `Err` carries a
/// user-facing failure (no daemon, daemon error).
pub fn request(name: &str, req: &Value, timeout: Duration) -> Result<Value, Failure> {
    let paths = Paths::of(name);
    let mut s = UnixStream::connect(&paths.ctl).map_err(|_| {
        if live_pid(&paths, name).is_some() {
            Failure::busy(format!(
                "Device {name} is starting or not answering on {}",
                paths.ctl.display()
            ))
        } else {
            Failure::device(format!("Device {name} is not active."))
        }
    })?;
    let _ = s.set_read_timeout(Some(timeout));
    let mut line = req.to_string();
    line.push('\n');
    s.write_all(line.as_bytes())
        .map_err(|e| Failure::device(format!("Cannot talk to the {name} daemon: {e}")))?;
    let mut reply = String::new();
    BufReader::new(s)
        .read_line(&mut reply)
        .map_err(|e| Failure::device(format!("No reply from the {name} daemon: {e}")))?;
    let v: Value = serde_json::from_str(&reply)
        .map_err(|_| Failure::device(format!("Malformed reply from the {name} daemon")))?;
    if v["ok"].as_bool() == Some(true) {
        Ok(v)
    } else {
        let msg = v["error"].as_str().unwrap_or("Request failed").to_owned();
        let code = v["code"]
            .as_u64()
            .and_then(|c| u8::try_from(c).ok())
            .unwrap_or(1);
        Err(Failure { code, message: msg })
    }
}
