//! The crate's one error type, in the workspace's shape
//! (docs/ARCHITECTURE.md, "Errors"): a stable [`ErrorKind`], a message and
//! the cause. Reading a passphrase or key file fails with the luks crate's
//! error, opening an `rbd:` image with the backend's: both are kept whole
//! as the source of a message-less error ([`Error::key`],
//! [`Error::backend`]) and shown as themselves.

use std::fmt;

/// What went wrong, for callers to match on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// Bad options (cipher, key size, hash, sizes), as cryptsetup refuses
    /// them.
    InvalidInput,
    /// The device cannot be opened or sized.
    NoDevice,
    /// Reading the passphrase or key file failed: the source is a
    /// [`luks::Error`].
    Key,
    /// Opening an `rbd:` image failed: the source is a [`backend::Error`].
    Backend,
}

type Source = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An error of this crate.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    /// Empty when the error shows as its source.
    message: String,
    source: Option<Source>,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
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
    /// A new error of `kind` with `message`.
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

    /// A failure reading the key material, kept whole.
    pub fn key(e: luks::Error) -> Self {
        Self::new(ErrorKind::Key, "").with_source(e)
    }

    /// A failure opening an `rbd:` image, kept whole.
    pub fn backend(e: backend::Error) -> Self {
        Self::new(ErrorKind::Backend, "").with_source(e)
    }

    /// The kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message followed by every source, `": "`-separated (a source
    /// whose text the line already ends with is not repeated).
    pub fn chain(&self) -> String {
        let mut s = self.to_string();
        let mut cur = std::error::Error::source(self);
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

    /// The message (empty for [`ErrorKind::Key`] and
    /// [`ErrorKind::Backend`]) and the cause, for a caller that re-wraps
    /// the error in its own type.
    pub fn into_parts(self) -> (ErrorKind, String, Option<Source>) {
        (self.kind, self.message, self.source)
    }
}

/// An [`ErrorKind::InvalidInput`] error.
pub(crate) fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidInput, msg)
}

/// This crate's results.
pub(crate) type Result<T> = std::result::Result<T, Error>;
