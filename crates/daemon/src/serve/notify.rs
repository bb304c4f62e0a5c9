//! systemd's readiness protocol (sd_notify(3)) for a daemon started as a
//! `Type=notify` service: datagrams of `KEY=VALUE` lines to the unix
//! socket named by `$NOTIFY_SOCKET` (a path, or `@name` in the abstract
//! namespace). `READY=1` goes once the export accepts clients, `STOPPING=1`
//! when a close or a signal begins the shutdown, `STATUS=` says what the
//! daemon does. Without `$NOTIFY_SOCKET` nothing is sent.
//!
//! Hand-written over std's `UnixDatagram`: the protocol is one datagram
//! per state change, and std reaches abstract sockets too.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};

/// Sends `state` (newline-separated assignments) to `$NOTIFY_SOCKET`, if
/// set. A failure is reported on stderr (the daemon's log), not fatal.
pub fn notify(state: &str) {
    let Some(target) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let target = target.to_string_lossy().into_owned();
    if let Err(e) = send(&target, state) {
        eprintln!("ucrypt: cannot notify the service manager at {target}: {e}");
    }
}

fn send(target: &str, state: &str) -> std::io::Result<()> {
    let sock = UnixDatagram::unbound()?;
    let addr = match target.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes())?,
        None => SocketAddr::from_pathname(target)?,
    };
    sock.send_to_addr(state.as_bytes(), &addr)?;
    Ok(())
}
