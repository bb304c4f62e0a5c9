//! The crate's one error type, in the workspace's shape (docs/ARCHITECTURE.md,
//! "Errors"): a stable [`ErrorKind`] callers match on (a bad spec, a bad key,
//! a bad sector size, …), a message and an optional source. The message
//! starts with a capital letter, names the field and, where the kernel has
//! one, gives the kernel's reason text; it is what `Display` shows, and it
//! never contains key material.

/// Errors from parsing specs and table lines and building ciphers.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Error {
    kind: ErrorKind,
    message: String,
    #[source]
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

/// What went wrong; stable for callers to match on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The cipher spec is malformed, or names a cipher, chain mode, IV mode
    /// or ESSIV hash the kernel would not build.
    Spec,
    /// The key does not fit the cipher (length, hex encoding), or the
    /// cipher refuses it.
    Key,
    /// The encryption sector size is not a power of two in 512..=4096, or
    /// the IV mode needs 512-byte sectors.
    SectorSize,
    /// An offset or length is not a multiple of the encryption sector size.
    Misaligned,
    /// A dm table line is malformed: a missing or non-numeric field, an
    /// unknown target or option, a bad option count.
    Table,
    /// Valid for the kernel but not implemented by ucrypt yet.
    Unsupported,
}

impl Error {
    /// A new error of `kind`; `message` starts with a capital letter and
    /// does not repeat a source attached with [`Error::with_source`].
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// Attaches the cause.
    #[must_use]
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// The stable kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message (what `Display` shows).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The same kind and source with `f` applied to the message.
    pub(crate) fn map_message(mut self, f: impl FnOnce(String) -> String) -> Self {
        self.message = f(self.message);
        self
    }
}

/// An [`ErrorKind::Spec`] error.
pub(crate) fn spec(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Spec, msg)
}

/// An [`ErrorKind::Key`] error.
pub(crate) fn key(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Key, msg)
}

/// An [`ErrorKind::SectorSize`] error.
pub(crate) fn sector_size(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::SectorSize, msg)
}

/// An [`ErrorKind::Misaligned`] error.
pub(crate) fn misaligned(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Misaligned, msg)
}

/// An [`ErrorKind::Table`] error.
pub(crate) fn table(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Table, msg)
}

/// An [`ErrorKind::Unsupported`] error.
pub(crate) fn unsupported(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::Unsupported, msg)
}

impl Error {
    /// An [`ErrorKind::Unsupported`] error.
    pub(crate) fn unsupported(msg: impl Into<String>) -> Self {
        unsupported(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_the_message_and_the_source_is_kept_apart() {
        let e = spec("Bad cipher specification \"x\"");
        assert_eq!(e.kind(), ErrorKind::Spec);
        assert_eq!(e.to_string(), "Bad cipher specification \"x\"");
        assert!(std::error::Error::source(&e).is_none());
        let e = key("Cannot read key").with_source(std::io::Error::other("gone"));
        assert_eq!(e.to_string(), "Cannot read key");
        assert!(std::error::Error::source(&e).is_some());
        let e = e.map_message(|m| format!("Table line 2: {m}"));
        assert_eq!(e.kind(), ErrorKind::Key);
        assert_eq!(e.message(), "Table line 2: Cannot read key");
        assert!(std::error::Error::source(&e).is_some(), "source kept");
    }
}
