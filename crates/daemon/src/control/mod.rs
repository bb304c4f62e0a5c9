//! The control socket protocol, shared by the client ([`call`] and its
//! typed wrappers) and the daemon ([`serve`]).
//!
//! One connection carries one exchange: the client writes one JSON line,
//! the daemon answers with one JSON line and closes. This module holds the
//! messages and their encoding; [`call`] and its typed wrappers are the
//! client side, [`serve`] the daemon's loop, [`Status`] the `status` answer.
//!
//! ```text
//!  client                                   daemon (NAME.ctl.sock, 0600)
//!  {"version":2,"request":{"cmd":"status"}} ──►  serve(): parse, check version
//!                                           ◄──  {"version":2,"reply":{"reply":"status",...}}
//! ```
//!
//! Both directions are serde-typed ([`Request`], [`Reply`]) and carry
//! [`PROTOCOL_VERSION`]: a peer speaking another version gets a clear
//! [`ErrorKind::Protocol`] error, and a line that is no request at all gets
//! [`ErrorKind::InvalidInput`], never a panic. Errors the daemon reports
//! keep their [`ErrorKind`] on the client side.
//!
//! The one reply that can carry a key, `table --showkeys`, holds its line
//! in a [`Secret`]: the daemon encodes the reply into locked memory
//! ([`encode_reply_into`]) and the client reads and decodes it there, so
//! neither side leaves a heap copy of the key behind.

use std::fmt;
use std::io::Read;
use std::time::Duration;

use crypto::Secret;
use datapath::{CryptMode, PerfFlags};
use serde::{Deserialize, Serialize};

use crate::error::{Error, ErrorKind, Result};

mod client;
mod reencrypt;
mod server;
mod status;

pub use client::{
    call, close, ping, print_table, reencrypt, reencrypt_set, refresh, reload, resize, resume,
    status, suspend, table, Refreshed, Resized,
};
pub use reencrypt::{
    InitParams, KdfParams, ReencryptAction, ReencryptStart, Reencryption, SlotPassphrase,
};
pub use server::{serve, Handled};
pub use status::{
    FuseStatus, IoStatus, NbdStats, Status, TargetStatus, VhostQueueStats, VhostStats, JSON_SCHEMA,
};

/// How long a client waits for a reply: a ping (`list`, start-up).
pub const PING_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a client waits for `status` or `table`.
pub const QUERY_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client waits for `refresh` (the engine drains first).
pub const REFRESH_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a client waits for `resize`, `suspend` or `resume` (the
/// engine drains first; a request stuck in the backend holds it).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a client waits for `close` (the daemon flushes first).
pub const CLOSE_TIMEOUT: Duration = Duration::from_secs(300);

/// The protocol version this build speaks. Bump it on any change to
/// [`Request`] or [`Reply`] that an older peer would misread.
pub const PROTOCOL_VERSION: u32 = 3;

/// A request to a volume's daemon.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Request {
    /// Is the daemon serving? Answered with [`Reply::Ping`].
    Ping,
    /// The mapping and live statistics ([`Reply::Status`]).
    Status,
    /// The dm table, one line per target ([`Reply::Table`]).
    Table {
        /// Print the key in clear instead of masked.
        showkeys: bool,
    },
    /// Replace the performance flags (and the mode, if given) live
    /// ([`Reply::Refreshed`]).
    Refresh {
        /// New data-path mode; unchanged when `None`.
        #[serde(with = "opt_mode")]
        mode: Option<CryptMode>,
        /// The new flags (flags not set are cleared, as in cryptsetup).
        flags: Flags,
    },
    /// Stop the frontend, flush and exit ([`Reply::Closed`], sent after the
    /// flush).
    Close,
    /// Change the decrypted device's size live ([`Reply::Resized`]).
    Resize {
        /// New size in 512-byte sectors; `None`: all the device holds.
        size_sectors: Option<u64>,
    },
    /// `luksSuspend`: block IO and wipe the key ([`Reply::Suspended`]).
    Suspend,
    /// `luksResume`: reinstate the key and let IO through
    /// ([`Reply::Resumed`]).
    Resume {
        /// The table line unlocked from the header, key shown, in locked
        /// memory (the client encodes it there: [`encode_request_into`]).
        #[serde(with = "secret_text")]
        line: Secret,
    },
    /// Replace the mapping's table live (`dmsetup reload` + `resume`):
    /// drain, swap, admit again ([`Reply::Reloaded`]).
    Reload {
        /// The new table (one or more lines, keys shown), in locked
        /// memory.
        #[serde(with = "secret_text")]
        table: Secret,
    },
    /// Start or resume the online reencryption of the volume (LUKS2 on
    /// the device itself): answered once it runs in the background (or
    /// with `init_only`, once initialized) with [`Reply::Reencryption`].
    Reencrypt(Box<ReencryptStart>),
    /// Pause, resume or rate-limit the running reencryption
    /// ([`Reply::Reencryption`]).
    ReencryptSet {
        /// What to change.
        action: ReencryptAction,
    },
}

/// A daemon's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "reply", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Reply {
    /// Answer to [`Request::Ping`].
    Ping(Ping),
    /// Answer to [`Request::Status`].
    Status(Box<Status>),
    /// Answer to [`Request::Table`].
    Table {
        /// The table line (key masked unless asked for), in locked memory.
        #[serde(with = "secret_text")]
        line: Secret,
    },
    /// Answer to [`Request::Refresh`]: the configuration now in effect.
    Refreshed {
        /// The data-path mode.
        #[serde(with = "mode")]
        mode: CryptMode,
        /// The performance flags.
        flags: Flags,
        /// Whether discards are passed down.
        allow_discards: bool,
    },
    /// Answer to [`Request::Close`]: everything is flushed.
    Closed,
    /// Answer to [`Request::Resize`].
    Resized {
        /// The size now, in 512-byte sectors.
        size_sectors: u64,
        /// What the export could not pass on (e.g. a kernel without
        /// ublk's UPDATE_SIZE), one sentence each.
        notes: Vec<String>,
    },
    /// Answer to [`Request::Suspend`]: IO is blocked, the key wiped.
    Suspended,
    /// Answer to [`Request::Resume`]: the key is back, IO flows.
    Resumed,
    /// Answer to [`Request::Reload`]: the new table is live.
    Reloaded {
        /// Targets in the table now.
        targets: usize,
        /// The mapping's size, in 512-byte sectors.
        size_sectors: u64,
    },
    /// Answer to [`Request::Reencrypt`] and [`Request::ReencryptSet`]:
    /// the reencryption's progress.
    Reencryption(Reencryption),
    /// The request failed.
    Failed {
        /// What kind of failure.
        kind: ErrorKind,
        /// The message, sources included.
        message: String,
    },
}

/// Who serves a volume, and where.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ping {
    /// Volume name.
    pub name: String,
    /// The daemon's pid.
    pub pid: u32,
    /// The frontend serving the volume.
    pub export: ExportKind,
    /// Where: an NBD URI, the FUSE file, the ublk device node or the
    /// vhost-user socket.
    pub endpoint: String,
}

/// The line `open` prints once a volume is served: where, and by which
/// pid.
impl fmt::Display for Ping {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, at, pid) = (&self.name, &self.endpoint, self.pid);
        match self.export {
            ExportKind::Fuse => write!(
                f,
                "{name}: serving the decrypted device as file {at} (pid {pid})"
            ),
            ExportKind::Ublk => write!(
                f,
                "{name}: serving the decrypted device as {at} (pid {pid})"
            ),
            ExportKind::VhostUserBlk => {
                write!(f, "{name}: serving vhost-user-blk at {at} (pid {pid})")
            }
            ExportKind::Nbd => write!(f, "{name}: serving NBD at {at} (pid {pid})"),
        }
    }
}

/// The kind of frontend serving a volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ExportKind {
    /// NBD on a unix socket or TCP.
    Nbd,
    /// A file in a FUSE mount.
    Fuse,
    /// A ublk block device.
    Ublk,
    /// A vhost-user-blk socket for virtual machines.
    VhostUserBlk,
}

impl ExportKind {
    /// `nbd`, `fuse`, `ublk` or `vhost-user-blk`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Nbd => "nbd",
            Self::Fuse => "fuse",
            Self::Ublk => "ublk",
            Self::VhostUserBlk => "vhost-user-blk",
        }
    }
}

/// dm-crypt's performance flags, as they cross the socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Flags {
    /// The flags (`same_cpu_crypt`, …, `high_priority`), as fields of
    /// this object on the wire.
    #[serde(flatten)]
    pub perf: PerfFlags,
    /// Classic mode's read piece size (`--max-read-size`; 0: dm-crypt's
    /// default). Not a flag, but `refresh` replaces it with the flags.
    #[serde(default)]
    pub max_read_size: u32,
    /// The same for writes.
    #[serde(default)]
    pub max_write_size: u32,
}

impl From<PerfFlags> for Flags {
    fn from(perf: PerfFlags) -> Self {
        Self {
            perf,
            max_read_size: 0,
            max_write_size: 0,
        }
    }
}

impl From<Flags> for PerfFlags {
    fn from(f: Flags) -> Self {
        f.perf
    }
}

/// `cryptsetup status` flag words, in its order: `discards` (when
/// `allow_discards`), then the performance flags that are set.
pub fn flag_words(allow_discards: bool, f: &Flags) -> Vec<&'static str> {
    allow_discards
        .then_some("discards")
        .into_iter()
        .chain(f.perf.status_words())
        .collect()
}

/// The data-path mode's name: `classic`, `inline` or `adaptive`.
pub fn mode_name(m: CryptMode) -> &'static str {
    m.name()
}

/// Parses a [`mode_name`].
pub fn parse_mode(s: &str) -> Result<CryptMode> {
    match s {
        "classic" => Ok(CryptMode::Classic),
        "inline" => Ok(CryptMode::Inline),
        "adaptive" => Ok(CryptMode::Adaptive),
        _ => Err(crate::error::invalid(format!(
            "Unknown mode {s:?}: use classic, inline or adaptive"
        ))),
    }
}

/// A [`CryptMode`] on the wire: its [`mode_name`].
pub(crate) mod mode {
    use datapath::CryptMode;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(m: &CryptMode, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(super::mode_name(*m))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<CryptMode, D::Error> {
        let s = String::deserialize(d)?;
        super::parse_mode(&s).map_err(serde::de::Error::custom)
    }
}

/// An optional [`CryptMode`] on the wire: its name or `null`.
mod opt_mode {
    use datapath::CryptMode;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(m: &Option<CryptMode>, s: S) -> Result<S::Ok, S::Error> {
        match m {
            Some(m) => s.serialize_some(super::mode_name(*m)),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<CryptMode>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|s| super::parse_mode(&s).map_err(serde::de::Error::custom))
            .transpose()
    }
}

/// The request line: a version and the request.
#[derive(Serialize, Deserialize)]
struct RequestLine {
    version: u32,
    request: Request,
}

/// [`RequestLine`] for encoding, borrowing the request (no clone of a
/// key).
#[derive(Serialize)]
struct RequestLineRef<'a> {
    version: u32,
    request: &'a Request,
}

/// The reply line as read: its version is checked first (`check_version`).
#[derive(Deserialize)]
struct ReplyLine {
    reply: Reply,
}

/// [`ReplyLine`] for encoding, borrowing the reply (no clone of a key).
#[derive(Serialize)]
struct ReplyLineRef<'a> {
    version: u32,
    reply: &'a Reply,
}

/// Only the version, read before the rest so a peer of another version
/// gets a version error rather than a parse error.
#[derive(Deserialize)]
struct VersionOnly {
    version: u32,
}

/// Encodes a request as one line (newline included).
pub fn encode_request(req: &Request) -> String {
    line(&RequestLine {
        version: PROTOCOL_VERSION,
        request: req.clone(),
    })
}

/// Appends the request line (newline included) to `out`, in locked
/// memory: `resume` carries a key.
pub fn encode_request_into(req: &Request, out: &mut Secret) {
    let v = RequestLineRef {
        version: PROTOCOL_VERSION,
        request: req,
    };
    // As in `encode_reply_into`: writing into a Secret cannot fail.
    let _ = serde_json::to_writer(&mut *out, &v);
    out.push(b'\n');
}

/// Encodes a reply as one line (newline included). A reply with a key
/// goes through [`encode_reply_into`] instead.
pub fn encode_reply(reply: &Reply) -> String {
    line(&ReplyLineRef {
        version: PROTOCOL_VERSION,
        reply,
    })
}

/// Appends the reply line (newline included) to `out`, in locked memory:
/// serde_json writes the table line straight from its [`Secret`].
pub fn encode_reply_into(reply: &Reply, out: &mut Secret) {
    let v = ReplyLineRef {
        version: PROTOCOL_VERSION,
        reply,
    };
    // Writing into a Secret cannot fail, nor can serialising these types
    // (see `line`).
    let _ = serde_json::to_writer(&mut *out, &v);
    out.push(b'\n');
}

/// Serde for a [`Secret`] holding UTF-8 text: written as a JSON string
/// from the secret's bytes, read back into a new secret (serde_json hands
/// an unescaped string over borrowed from the input, so no copy is made
/// on the way).
mod secret_text {
    use std::fmt;

    use crypto::Secret;
    use serde::de::{self, Visitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Secret, s: S) -> Result<S::Ok, S::Error> {
        let text = v
            .as_str()
            .ok_or_else(|| serde::ser::Error::custom("table line is not UTF-8"))?;
        s.serialize_str(text)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Secret, D::Error> {
        struct Text;
        impl Visitor<'_> for Text {
            type Value = Secret;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Secret, E> {
                Ok(Secret::from(v))
            }
        }
        d.deserialize_str(Text)
    }
}

/// Reads until a newline (the one line of an exchange; nothing follows it) or end of input, into locked memory.
pub(crate) fn read_line(mut input: impl Read) -> std::io::Result<Secret> {
    let mut buf = Secret::with_capacity(4096);
    let mut chunk = Secret::zeroed(4096);
    loop {
        let n = match input.read(&mut chunk) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        buf.extend_from_slice(&chunk[..n]);
        if n == 0 || chunk[..n].contains(&b'\n') {
            return Ok(buf);
        }
    }
}

fn line<T: Serialize>(v: &T) -> String {
    // Serialising these types cannot fail: no maps with non-string keys,
    // no non-finite floats reach here as errors (serde_json writes null).
    let mut s = serde_json::to_string(v).unwrap_or_default();
    s.push('\n');
    s
}

/// Decodes a request line: a version other than ours is
/// [`ErrorKind::Protocol`], anything unparsable [`ErrorKind::InvalidInput`].
pub fn decode_request(line: &str) -> Result<Request> {
    check_version(line, "request").map_err(|e| e.unwrap_or_else(malformed_request))?;
    serde_json::from_str::<RequestLine>(line)
        .map(|l| l.request)
        .map_err(|e| malformed_request().with_source(e))
}

/// Decodes a reply line; errors are [`ErrorKind::Protocol`].
pub fn decode_reply(line: &str) -> Result<Reply> {
    let malformed = || Error::new(ErrorKind::Protocol, "Malformed reply from the daemon");
    check_version(line, "reply").map_err(|e| e.unwrap_or_else(malformed))?;
    serde_json::from_str::<ReplyLine>(line)
        .map(|l| l.reply)
        .map_err(|e| malformed().with_source(e))
}

fn malformed_request() -> Error {
    Error::new(
        ErrorKind::InvalidInput,
        "Malformed control request (expected one JSON object per line)",
    )
}

/// `Err(Some(_))`: another version; `Err(None)`: no version at all.
fn check_version(line: &str, what: &str) -> std::result::Result<(), Option<Error>> {
    let v = serde_json::from_str::<VersionOnly>(line).map_err(|_| None)?;
    if v.version == PROTOCOL_VERSION {
        return Ok(());
    }
    Err(Some(Error::new(
        ErrorKind::Protocol,
        format!(
            "Control protocol version mismatch: the {what} speaks version {}, this build speaks {PROTOCOL_VERSION} \
             (restart the daemon with the same ucrypt build)",
            v.version
        ),
    )))
}

impl From<Error> for Reply {
    fn from(e: Error) -> Self {
        Reply::Failed {
            kind: e.kind(),
            message: e.chain(),
        }
    }
}

#[cfg(test)]
mod tests;
