//! The crate's one error type, in the workspace's shape
//! (docs/ARCHITECTURE.md, "Errors"): a message, a stable [`ErrorKind`]
//! callers match on, and the cause as `#[source]`.
//!
//! Messages start with a capital letter and do not repeat their source;
//! print an error with [`Error::chain`] (or walk `source()`) to get the
//! whole story ("Cannot create X: Permission denied"). The kind is what a
//! caller maps to its own outcome (the `ucrypt` binary maps it to
//! cryptsetup's exit codes); it also crosses the control socket, so a
//! client sees the kind the daemon reported.

use serde::{Deserialize, Serialize};

/// Result type of this crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What kind of failure; stable across releases and across the control
/// socket (serialised in `snake_case`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ErrorKind {
    /// Bad input: a volume name, table line, mode, export, size or a
    /// malformed control request.
    InvalidInput,
    /// The passphrase opens no keyslot.
    WrongPassphrase,
    /// A file or directory could not be created or restricted.
    PermissionDenied,
    /// No daemon serves the named volume.
    NotActive,
    /// The backing device or a file it needs is missing, unusable or too
    /// small, or a kernel facility (ublk) is not there.
    NoDevice,
    /// Reading, writing or flushing data failed, or a thread could not start.
    Io,
    /// The volume already exists, is in use or does not answer yet.
    Busy,
    /// The control channel failed: no reply, a malformed reply, or a peer
    /// speaking another protocol version.
    Protocol,
    /// A detached daemon exited during start-up (see [`Error::exit_code`]).
    DaemonExited,
}

/// An error of this crate.
///
/// Either a message of its own with an optional cause, or (for errors that
/// are passed through whole, like a [`luks::Error`]) transparent: then it
/// displays as its cause and `source()` continues with the cause's source.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    /// Empty for a transparent error.
    message: String,
    exit_code: Option<u8>,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.source, self.message.is_empty()) {
            (Some(s), true) => s.fmt(f),
            _ => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        let s = self.source.as_deref()?;
        if self.message.is_empty() {
            s.source()
        } else {
            Some(s)
        }
    }
}

impl Error {
    /// A new error of `kind` with `message` (capitalised; it does not
    /// repeat the source attached with [`Error::with_source`]).
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            exit_code: None,
            source: None,
        }
    }

    /// Attaches the cause.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// `source` passed through whole under `kind`: displayed as itself.
    pub fn transparent(
        kind: ErrorKind,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self::new(kind, "").with_source(source)
    }

    /// A detached daemon that exited with `code` during start-up; `message`
    /// is the last error it logged.
    pub fn daemon_exited(code: u8, message: impl Into<String>) -> Self {
        Self {
            exit_code: Some(code),
            ..Self::new(ErrorKind::DaemonExited, message)
        }
    }

    /// The kind, for callers to match on.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// For [`ErrorKind::DaemonExited`]: the daemon's own exit status (the
    /// daemon is the caller's executable, so the code is in its terms).
    pub fn exit_code(&self) -> Option<u8> {
        self.exit_code
    }

    /// The [`luks::Error`] behind this error, if it came from there.
    pub fn luks(&self) -> Option<&luks::Error> {
        self.source.as_deref()?.downcast_ref::<luks::Error>()
    }

    /// The message followed by every source, `": "`-separated.
    pub fn chain(&self) -> String {
        chain(self)
    }
}

/// `e` and its sources, one level each (`"A: B: C"`). A source whose text
/// the line already ends with is not repeated (some errors, such as
/// [`luks::Error`], print their source in their own message too).
pub fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let text = c.to_string();
        if !text.is_empty() && !s.ends_with(&text) {
            s.push_str(": ");
            s.push_str(&text);
        }
        cur = c.source();
    }
    s
}

/// An [`ErrorKind::InvalidInput`] error.
pub(crate) fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidInput, msg)
}

/// An error of `kind` whose text is `e` with its sources, flattened: for
/// causes that are not `Send + Sync + 'static` or must cross a thread.
pub(crate) fn flat(kind: ErrorKind, e: &dyn std::error::Error) -> Error {
    Error::new(kind, chain(e))
}

impl From<luks::Error> for Error {
    /// A LUKS failure keeps its kind: a wrong passphrase stays one, I/O is
    /// a device problem, anything else is bad input (header or request).
    fn from(e: luks::Error) -> Self {
        let kind = match e.kind() {
            luks::ErrorKind::WrongPassphrase => ErrorKind::WrongPassphrase,
            luks::ErrorKind::Io => ErrorKind::NoDevice,
            luks::ErrorKind::Busy => ErrorKind::Busy,
            _ => ErrorKind::InvalidInput,
        };
        Self::transparent(kind, e)
    }
}

impl From<plain::Error> for Error {
    /// A plain-mode failure keeps its text and cause; one that is a LUKS
    /// (key reading) or backend (`rbd:` image) error converts as those do.
    fn from(e: plain::Error) -> Self {
        let (kind, message, source) = e.into_parts();
        let source = match source.map(|s| s.downcast::<luks::Error>()) {
            Some(Ok(l)) => return Self::from(*l),
            Some(Err(s)) => match s.downcast::<backend::Error>() {
                Ok(b) => return backend_error(*b),
                Err(s) => Some(s),
            },
            None => None,
        };
        let kind = match kind {
            plain::ErrorKind::NoDevice => ErrorKind::NoDevice,
            _ => ErrorKind::InvalidInput,
        };
        Self {
            kind,
            message,
            exit_code: None,
            source,
        }
    }
}

/// A backend's failure to open a device: [`ErrorKind::Busy`] when someone
/// else uses it (a regular file's lock, a block device's exclusive claim),
/// else [`ErrorKind::NoDevice`]; shown as itself.
pub fn backend_error(e: backend::Error) -> Error {
    let kind = if matches!(
        e.kind(),
        backend::ErrorKind::Locked { .. } | backend::ErrorKind::InUse { .. }
    ) {
        ErrorKind::Busy
    } else {
        ErrorKind::NoDevice
    };
    Error::transparent(kind, e)
}
