//! NBD over TLS: `NBD_OPT_STARTTLS` with X.509 certificates or pre-shared
//! keys, as nbdkit and qemu-nbd offer it.
//!
//! * **Credentials** follow the layout qemu, nbdkit and libnbd share: a
//!   directory with `ca-cert.pem`, `server-cert.pem`, `server-key.pem`
//!   ([`TlsConfig::x509`], client certificates checked against
//!   `ca-cert.pem` with `verify_peer`), or a `psktool` key file of
//!   `identity:hexkey` lines ([`TlsConfig::psk`]).
//! * **Modes** are nbdkit's `--tls`: [`TlsMode::Off`] refuses STARTTLS,
//!   [`TlsMode::On`] offers it, [`TlsMode::Require`] answers every option
//!   but `STARTTLS` and `ABORT` with `NBD_REP_ERR_TLS_REQD` (and closes on
//!   `NBD_OPT_EXPORT_NAME`), so a plaintext client is refused before any
//!   data moves.
//!
//! The TLS stack is OpenSSL (the vendored build the crypto crate already
//! links), not rustls: rustls has no external-PSK support (rustls issue
//! #174), and PSK files are what nbdkit, qemu-nbd and libnbd users have.
//! One stack for both credential kinds keeps one code path to test.
//!
//! ```text
//!   client ══TLS══ socket ◄─► pump thread ◄─► unix socketpair ◄─► reader / replies
//! ```
//!
//! After the handshake a pump thread owns the `SslStream` (OpenSSL's
//! connection object may not be read and written from two threads at once)
//! and relays plaintext through a socketpair, so the option loop, the
//! pipelined reader and the reply path (`Conn::reply`, the writer thread) run unchanged on
//! an ordinary socket. The pump waits in `poll(2)` on both sides with
//! non-blocking IO; a client that stops reading stalls only its own pump,
//! which gives up after the reply timeout.

use std::fmt;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use openssl::ssl::{
    ErrorCode, Ssl, SslContext, SslContextBuilder, SslFiletype, SslMethod, SslMode, SslOptions,
    SslSessionCacheMode, SslStream, SslVerifyMode, SslVersion,
};
use openssl::x509::X509Name;
use zeroize::Zeroizing;

use crate::stream::{poll, Deadline};
use crate::Error;

/// When the server offers or demands TLS (nbdkit's `--tls`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum TlsMode {
    /// No TLS: `NBD_OPT_STARTTLS` is refused.
    #[default]
    Off,
    /// TLS offered; plaintext clients are still served (so it keeps no
    /// stranger out: the daemon refuses it over TCP).
    On,
    /// TLS required before any option but `STARTTLS` and `ABORT`.
    Require,
}

impl FromStr for TlsMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" => Ok(Self::Off),
            "on" => Ok(Self::On),
            "require" => Ok(Self::Require),
            _ => Err(format!("Unknown TLS mode {s:?} (off, on, require)")),
        }
    }
}

impl fmt::Display for TlsMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Off => "off",
            Self::On => "on",
            Self::Require => "require",
        })
    }
}

/// TLS settings for a [`crate::Server`]: the mode and the loaded
/// credentials. Cheap to clone (the OpenSSL context is shared).
#[derive(Clone, Default)]
pub struct TlsConfig {
    mode: TlsMode,
    ctx: Option<Arc<SslContext>>,
}

impl fmt::Debug for TlsConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConfig")
            .field("mode", &self.mode())
            .finish_non_exhaustive()
    }
}

/// Lengths OpenSSL accepts for a pre-shared key (`PSK_MAX_PSK_LEN`).
const MAX_PSK_LEN: usize = 512;

impl TlsConfig {
    /// No TLS (the default).
    pub fn off() -> Self {
        Self::default()
    }

    /// X.509 credentials from `dir` in the qemu/nbdkit layout:
    /// `server-cert.pem` (the chain), `server-key.pem`, and with
    /// `verify_peer` `ca-cert.pem`, against which clients must present a
    /// certificate. Without `verify_peer` any client that completes the
    /// handshake is served: the certificate only proves the server to the
    /// client (the daemon turns `verify_peer` on for TCP by default).
    pub fn x509(mode: TlsMode, dir: &Path, verify_peer: bool) -> Result<Self, Error> {
        let setup = |what: &str, e: openssl::error::ErrorStack| {
            Error::tls_setup(format!("{what} in {}: {e}", dir.display()))
        };
        let mut b = base_context().map_err(|e| setup("OpenSSL context", e))?;
        let cert = dir.join("server-cert.pem");
        let key = dir.join("server-key.pem");
        for f in [&cert, &key] {
            if !f.is_file() {
                return Err(Error::tls_setup(format!("Missing {}", f.display())));
            }
        }
        b.set_certificate_chain_file(&cert)
            .map_err(|e| setup("Bad server-cert.pem", e))?;
        b.set_private_key_file(&key, SslFiletype::PEM)
            .map_err(|e| setup("Bad server-key.pem", e))?;
        b.check_private_key()
            .map_err(|e| setup("server-key.pem does not match server-cert.pem", e))?;
        if verify_peer {
            let ca = dir.join("ca-cert.pem");
            if !ca.is_file() {
                return Err(Error::tls_setup(format!(
                    "Missing {} (needed to verify clients)",
                    ca.display()
                )));
            }
            b.set_ca_file(&ca)
                .map_err(|e| setup("Bad ca-cert.pem", e))?;
            let names =
                X509Name::load_client_ca_file(&ca).map_err(|e| setup("Bad ca-cert.pem", e))?;
            b.set_client_ca_list(names);
            b.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
        }
        Ok(Self {
            mode,
            ctx: Some(Arc::new(b.build())),
        })
    }

    /// Pre-shared keys from a `psktool` file: `identity:hexkey` lines.
    /// A client whose identity is not in the file fails the handshake.
    pub fn psk(mode: TlsMode, file: &Path) -> Result<Self, Error> {
        let text = Zeroizing::new(std::fs::read_to_string(file).map_err(|e| {
            Error::tls_setup(format!("Cannot read PSK file {}: {e}", file.display()))
        })?);
        let keys = parse_psk_file(&text)
            .map_err(|why| Error::tls_setup(format!("{}: {why}", file.display())))?;
        let setup = |what: &str, e: openssl::error::ErrorStack| {
            Error::tls_setup(format!("{what} for {}: {e}", file.display()))
        };
        let mut b = base_context().map_err(|e| setup("OpenSSL context", e))?;
        // TLS 1.2 suites with PSK key exchange; TLS 1.3 uses the key with
        // its SHA-256 suites through the same callback.
        b.set_cipher_list("ECDHEPSK:DHEPSK:PSK:!eNULL:!3DES:!RC4")
            .map_err(|e| setup("PSK cipher list", e))?;
        b.set_psk_server_callback(move |_ssl, identity, out| {
            let found = identity
                .and_then(|id| keys.iter().find(|(i, _)| i.as_bytes() == id))
                .map(|(_, k)| k);
            match found {
                Some(k) if k.len() <= out.len() => {
                    out[..k.len()].copy_from_slice(k);
                    Ok(k.len())
                }
                // Unknown identity: 0 makes OpenSSL fail the handshake.
                _ => Ok(0),
            }
        });
        Ok(Self {
            mode,
            ctx: Some(Arc::new(b.build())),
        })
    }

    /// The effective mode: [`TlsMode::Off`] without credentials.
    pub fn mode(&self) -> TlsMode {
        if self.ctx.is_some() {
            self.mode
        } else {
            TlsMode::Off
        }
    }

    pub(crate) fn context(&self) -> Option<&SslContext> {
        self.ctx.as_deref()
    }
}

/// Settings both credential kinds share: TLS 1.2 or later, no
/// renegotiation, no session resumption, partial non-blocking writes.
fn base_context() -> Result<SslContextBuilder, openssl::error::ErrorStack> {
    let mut b = SslContextBuilder::new(SslMethod::tls_server())?;
    b.set_min_proto_version(Some(SslVersion::TLS1_2))?;
    b.set_options(
        SslOptions::NO_RENEGOTIATION
            | SslOptions::CIPHER_SERVER_PREFERENCE
            | SslOptions::IGNORE_UNEXPECTED_EOF,
    );
    b.set_mode(SslMode::ENABLE_PARTIAL_WRITE | SslMode::ACCEPT_MOVING_WRITE_BUFFER);
    b.set_session_cache_mode(SslSessionCacheMode::OFF);
    b.set_num_tickets(0)?;
    Ok(b)
}

/// A PSK identity and its key.
type PskEntry = (String, Zeroizing<Vec<u8>>);

/// Parses `psktool` lines `identity:hexkey` (blank lines ignored). Errors
/// name the line, never the key.
pub(crate) fn parse_psk_file(text: &str) -> Result<Vec<PskEntry>, String> {
    let mut keys = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let n = n + 1;
        let line = line.trim_end_matches('\r');
        if line.trim().is_empty() {
            continue;
        }
        let Some((id, hex)) = line.split_once(':') else {
            return Err(format!("Line {n} is not identity:hexkey"));
        };
        if id.is_empty() {
            return Err(format!("Line {n} has an empty identity"));
        }
        let key = decode_hex(hex.trim()).ok_or(format!("Line {n} has a malformed hex key"))?;
        if key.is_empty() || key.len() > MAX_PSK_LEN {
            return Err(format!(
                "Line {n}: key must be 1 to {MAX_PSK_LEN} bytes, not {}",
                key.len()
            ));
        }
        if keys.iter().any(|(i, _): &PskEntry| i == id) {
            return Err(format!("Line {n} repeats identity {id:?}"));
        }
        keys.push((id.to_owned(), key));
    }
    if keys.is_empty() {
        return Err("No keys in the PSK file".into());
    }
    Ok(keys)
}

fn decode_hex(s: &str) -> Option<Zeroizing<Vec<u8>>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let nib = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    };
    let mut out = Zeroizing::new(Vec::with_capacity(s.len() / 2));
    for p in s.as_bytes().chunks_exact(2) {
        out.push(nib(p[0])? << 4 | nib(p[1])?);
    }
    Some(out)
}

/// Runs the server side of the TLS handshake on `raw` (bounded by
/// `timeout`) and starts the pump. Returns the plaintext end of the
/// socketpair and the pump thread.
pub(crate) fn upgrade(
    raw: Deadline,
    ctx: &SslContext,
    reply_timeout: Duration,
) -> Result<(UnixStream, JoinHandle<()>), Error> {
    let ssl = Ssl::new(ctx).map_err(|e| Error::tls_setup(e.to_string()))?;
    let mut tls = SslStream::new(ssl, raw).map_err(|e| Error::tls_setup(e.to_string()))?;
    if let Err(e) = tls.accept() {
        let timed_out = matches!(e.code(), ErrorCode::WANT_READ | ErrorCode::WANT_WRITE)
            || e.io_error()
                .is_some_and(|e| e.kind() == io::ErrorKind::TimedOut);
        let why = if timed_out {
            "timed out".to_owned()
        } else {
            e.to_string()
        };
        return Err(Error::protocol(format!("TLS handshake failed: {why}")));
    }
    let (local, remote) = UnixStream::pair()?;
    tls.get_mut().clear()?;
    tls.get_ref().s.set_nonblocking(true)?;
    remote.set_nonblocking(true)?;
    let pump = std::thread::Builder::new()
        .name("nbd-tls".into())
        .spawn(move || pump(tls, remote, reply_timeout))?;
    Ok((local, pump))
}

/// A relay buffer: `buf[at..len]` is pending.
struct Relay {
    buf: Box<[u8]>,
    at: usize,
    len: usize,
}

impl Relay {
    fn new() -> Self {
        Self {
            buf: vec![0u8; 64 << 10].into_boxed_slice(),
            at: 0,
            len: 0,
        }
    }
    fn pending(&self) -> &[u8] {
        &self.buf[self.at..self.len]
    }
    fn is_empty(&self) -> bool {
        self.at == self.len
    }
    fn consume(&mut self, n: usize) {
        self.at += n;
        if self.at == self.len {
            self.at = 0;
            self.len = 0;
        }
    }
    fn clear(&mut self) {
        self.at = 0;
        self.len = 0;
    }
}

/// Relays plaintext between the TLS connection and `local` until the
/// server side closes `local` (then sends `close_notify`) or either side
/// fails. Waiting to send to a client that does not read is bounded by
/// `reply_timeout`.
fn pump(mut tls: SslStream<Deadline>, mut local: UnixStream, reply_timeout: Duration) {
    let mut down = Relay::new(); // client → server
    let mut up = Relay::new(); // server → client
    let mut net_eof = false;
    let mut local_eof = false;
    loop {
        let mut ev_net: i16 = 0;
        let mut ev_local: i16 = 0;
        // Client → server: drain what OpenSSL has, then read more.
        loop {
            if !down.is_empty() {
                match local.write(down.pending()) {
                    Ok(n) => down.consume(n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                        ev_local |= libc::POLLOUT;
                        break;
                    }
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(_) => {
                        // The server side is gone: stop reading the client.
                        down.clear();
                        net_eof = true;
                    }
                }
                continue;
            }
            if net_eof {
                break;
            }
            match tls.ssl_read(&mut down.buf) {
                Ok(n) => {
                    down.at = 0;
                    down.len = n;
                }
                Err(e) if e.code() == ErrorCode::WANT_READ => {
                    ev_net |= libc::POLLIN;
                    break;
                }
                Err(e) if e.code() == ErrorCode::WANT_WRITE => {
                    ev_net |= libc::POLLOUT;
                    break;
                }
                Err(_) => {
                    // close_notify, EOF or a broken record: the server's
                    // reader sees EOF; replies still go out if they can.
                    net_eof = true;
                    let _ = local.shutdown(Shutdown::Write);
                    break;
                }
            }
        }
        // Server → client.
        let mut waiting_on_client = false;
        loop {
            if !up.is_empty() {
                match tls.ssl_write(up.pending()) {
                    Ok(n) => up.consume(n),
                    Err(e) if e.code() == ErrorCode::WANT_WRITE => {
                        ev_net |= libc::POLLOUT;
                        waiting_on_client = true;
                        break;
                    }
                    Err(e) if e.code() == ErrorCode::WANT_READ => {
                        ev_net |= libc::POLLIN;
                        waiting_on_client = true;
                        break;
                    }
                    Err(_) => return, // the client is gone
                }
                continue;
            }
            if local_eof {
                break;
            }
            match local.read(&mut up.buf) {
                Ok(0) => local_eof = true,
                Ok(n) => {
                    up.at = 0;
                    up.len = n;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    ev_local |= libc::POLLIN;
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => local_eof = true,
            }
        }
        if local_eof && up.is_empty() {
            // Everything the server sent is out: one try at close_notify.
            let _ = tls.shutdown();
            return;
        }
        let fd = |ev: i16, fd: i32| if ev == 0 { (-1, 0) } else { (fd, ev) };
        let fds = [
            fd(ev_net, tls.get_ref().as_raw_fd()),
            fd(ev_local, local.as_raw_fd()),
        ];
        let timeout = waiting_on_client.then_some(reply_timeout);
        match poll(&fds, timeout) {
            Ok(true) => {}
            Ok(false) | Err(_) => return, // the client stopped reading
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psk_file_lines() {
        let k = parse_psk_file("alice:00ff10\n\nbob:ABCDEF\r\n").unwrap();
        assert_eq!(k.len(), 2);
        assert_eq!(k[0].0, "alice");
        assert_eq!(&k[0].1[..], &[0x00, 0xff, 0x10]);
        assert_eq!(&k[1].1[..], &[0xab, 0xcd, 0xef]);
        for bad in [
            "",
            "alice",
            ":00ff",
            "alice:0",
            "alice:zz",
            "alice:",
            "alice:00\nalice:11",
        ] {
            let e = parse_psk_file(bad).unwrap_err();
            assert!(!e.contains("00ff"), "{e}");
        }
        let long = format!("a:{}", "00".repeat(MAX_PSK_LEN + 1));
        assert!(parse_psk_file(&long).is_err());
    }

    #[test]
    fn modes_parse() {
        for m in [TlsMode::Off, TlsMode::On, TlsMode::Require] {
            assert_eq!(m.to_string().parse::<TlsMode>(), Ok(m));
        }
        assert!("yes".parse::<TlsMode>().is_err());
    }

    #[test]
    fn missing_credentials_are_named() {
        let dir = std::env::temp_dir().join(format!("ucrypt-nbd-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let e = TlsConfig::x509(TlsMode::Require, &dir, false).unwrap_err();
        assert!(e.to_string().contains("server-cert.pem"), "{e}");
        let e = TlsConfig::psk(TlsMode::Require, &dir.join("none.psk")).unwrap_err();
        assert!(e.to_string().contains("none.psk"), "{e}");
        let _ = std::fs::remove_dir(&dir);
    }
}
