//! The crate's one error type. Each variant is a kind a caller can match
//! on (a bad spec, a bad key, a bad sector size, …) and carries the message,
//! which starts with a capital letter, names the field and, where the
//! kernel has one, gives the kernel's reason text. Messages never contain
//! key material.

/// Errors from parsing specs and table lines and building ciphers.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The cipher spec is malformed, or names a cipher, chain mode, IV mode
    /// or ESSIV hash the kernel would not build.
    #[error("{0}")]
    Spec(String),
    /// The key does not fit the cipher (length, hex encoding), or the
    /// cipher refuses it.
    #[error("{0}")]
    Key(String),
    /// The encryption sector size is not a power of two in 512..=4096, or
    /// the IV mode needs 512-byte sectors.
    #[error("{0}")]
    SectorSize(String),
    /// An offset or length is not a multiple of the encryption sector size.
    #[error("{0}")]
    Misaligned(String),
    /// A dm table line is malformed: a missing or non-numeric field, an
    /// unknown target or option, a bad option count.
    #[error("{0}")]
    Table(String),
    /// Valid for the kernel but not implemented by ucrypt yet.
    #[error("{0}")]
    Unsupported(String),
}

impl Error {
    /// The message (what `Display` shows).
    pub fn message(&self) -> &str {
        match self {
            Error::Spec(m)
            | Error::Key(m)
            | Error::SectorSize(m)
            | Error::Misaligned(m)
            | Error::Table(m)
            | Error::Unsupported(m) => m,
        }
    }

    /// The same kind with `f` applied to the message.
    pub(crate) fn map_message(self, f: impl FnOnce(String) -> String) -> Self {
        match self {
            Error::Spec(m) => Error::Spec(f(m)),
            Error::Key(m) => Error::Key(f(m)),
            Error::SectorSize(m) => Error::SectorSize(f(m)),
            Error::Misaligned(m) => Error::Misaligned(f(m)),
            Error::Table(m) => Error::Table(f(m)),
            Error::Unsupported(m) => Error::Unsupported(f(m)),
        }
    }
}

/// [`Error::Spec`].
pub(crate) fn spec(msg: impl Into<String>) -> Error {
    Error::Spec(msg.into())
}

/// [`Error::Key`].
pub(crate) fn key(msg: impl Into<String>) -> Error {
    Error::Key(msg.into())
}

/// [`Error::SectorSize`].
pub(crate) fn sector_size(msg: impl Into<String>) -> Error {
    Error::SectorSize(msg.into())
}

/// [`Error::Misaligned`].
pub(crate) fn misaligned(msg: impl Into<String>) -> Error {
    Error::Misaligned(msg.into())
}

/// [`Error::Table`].
pub(crate) fn table(msg: impl Into<String>) -> Error {
    Error::Table(msg.into())
}

/// [`Error::Unsupported`].
pub(crate) fn unsupported(msg: impl Into<String>) -> Error {
    Error::Unsupported(msg.into())
}

impl Error {
    /// [`Error::Unsupported`].
    pub(crate) fn unsupported(msg: impl Into<String>) -> Self {
        unsupported(msg)
    }
}
