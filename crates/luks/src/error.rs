//! The crate's one error type, in the workspace's shape
//! (docs/ARCHITECTURE.md, "Errors"): a stable [`ErrorKind`] callers match on, a
//! message (never containing key material) and an optional source: the I/O,
//! `crypto`, JSON or randomness error that caused it.

use std::fmt;

/// What went wrong, stable across versions; callers (the CLI) map it to
/// cryptsetup's exit codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The device or header file has no LUKS signature.
    NotLuks,
    /// A LUKS header is present but malformed, inconsistent or lies about sizes.
    Corrupt,
    /// A valid header uses a feature ucrypt does not implement (or a
    /// mandatory requirement it does not know).
    Unsupported,
    /// No keyslot accepted the passphrase (or the given slot did not).
    WrongPassphrase,
    /// A parameter given by the caller is invalid (bad slot number, cipher…).
    InvalidArgument,
    /// The requested keyslot is in use / no keyslot is free.
    SlotBusy,
    /// The requested keyslot is not active.
    SlotInactive,
    /// The device is too small or a range lies outside it.
    DeviceSize,
    /// Reading or writing the device failed.
    Io,
    /// The header already holds a LUKS volume and `force` was not given.
    AlreadyLuks,
    /// The device is held by another user (an RBD image whose exclusive
    /// lock another client holds).
    Busy,
}

/// The error of every fallible `luks` function.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    source: Option<Source>,
}

/// What caused an [`Error`].
#[derive(Debug)]
enum Source {
    /// Reading or writing a device.
    Io(std::io::Error),
    /// Building a sector cipher (keyslot area, format check, dm table).
    Crypto(crypto::Error),
    /// Parsing the LUKS2 JSON metadata.
    Json(serde_json::Error),
    /// The system's random number generator.
    Random(getrandom::Error),
}

impl Source {
    fn as_error(&self) -> &(dyn std::error::Error + 'static) {
        match self {
            Source::Io(e) => e,
            Source::Crypto(e) => e,
            Source::Json(e) => e,
            Source::Random(e) => e,
        }
    }
}

impl Error {
    /// A new error of `kind`; `message` starts with a capital letter.
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// An I/O error with context (`message` says what was being done).
    pub fn io(message: impl Into<String>, source: std::io::Error) -> Self {
        Self {
            kind: ErrorKind::Io,
            message: message.into(),
            source: Some(Source::Io(source)),
        }
    }

    /// An error of `kind` other than [`ErrorKind::Io`] caused by an I/O
    /// error: a missing key file or an existing backup target is the
    /// caller's mistake (cryptsetup exits 1), not a device failure.
    pub fn io_as(kind: ErrorKind, message: impl Into<String>, source: std::io::Error) -> Self {
        Self {
            kind,
            message: message.into(),
            source: Some(Source::Io(source)),
        }
    }

    /// An error of `kind` caused by `crypto` refusing a cipher, key or
    /// table (`message` says what was being done).
    pub fn crypto(kind: ErrorKind, message: impl Into<String>, source: crypto::Error) -> Self {
        Self {
            kind,
            message: message.into(),
            source: Some(Source::Crypto(source)),
        }
    }

    /// The stable kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message without the source.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)?;
        if let Some(s) = &self.source {
            write!(f, ": {}", s.as_error())?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_ref().map(Source::as_error)
    }
}

/// A keyslot area cipher `crypto` cannot build.
impl From<crypto::Error> for Error {
    fn from(e: crypto::Error) -> Self {
        Error::crypto(ErrorKind::Unsupported, "Keyslot cipher", e)
    }
}

/// Shorthand used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// `Error::new(ErrorKind::Corrupt, ...)`.
pub(crate) fn corrupt(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Corrupt, msg)
}

/// `Error::new(ErrorKind::Unsupported, ...)`.
pub(crate) fn unsupported(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Unsupported, msg)
}

/// `Error::new(ErrorKind::InvalidArgument, ...)`.
pub(crate) fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidArgument, msg)
}

/// An error of `kind` caused by a malformed LUKS2 JSON area.
pub(crate) fn json_error(kind: ErrorKind, msg: impl Into<String>, e: serde_json::Error) -> Error {
    Error {
        kind,
        message: msg.into(),
        source: Some(Source::Json(e)),
    }
}

/// An error of `kind` caused by the random number generator failing.
pub(crate) fn random_error(kind: ErrorKind, msg: impl Into<String>, e: getrandom::Error) -> Error {
    Error {
        kind,
        message: msg.into(),
        source: Some(Source::Random(e)),
    }
}
