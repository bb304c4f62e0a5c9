//! The crate's one error type, in the workspace's shape
//! (docs/ARCHITECTURE.md, "Errors"; it has no source): a kind callers
//! match on (and the cli maps to cryptsetup's exit codes) and
//! cryptsetup's message.

/// What went wrong, in cryptsetup's errno terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// No BitLocker signature (cryptsetup: "not a valid BITLK device").
    NotBitlk,
    /// Malformed metadata or a key that does not unwrap (`-EINVAL`).
    Invalid,
    /// Valid but unsupported: version 1, a state, type or protector that
    /// cryptsetup refuses to activate (`-ENOTSUP`).
    Unsupported,
    /// No protector took the passphrase or key file (`-EPERM`).
    WrongKey,
    /// Reading the device failed.
    Io,
}

/// An error with cryptsetup's message (empty where cryptsetup prints none).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
}

impl Error {
    pub(crate) fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// The kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// cryptsetup's message (may be empty: cryptsetup says nothing for a
    /// key that fails to unwrap).
    pub fn message(&self) -> &str {
        &self.message
    }
}

pub(crate) fn invalid(m: impl Into<String>) -> Error {
    Error::new(ErrorKind::Invalid, m)
}

pub(crate) fn unsupported(m: impl Into<String>) -> Error {
    Error::new(ErrorKind::Unsupported, m)
}
