//! What a frontend hands the engine: a [`Request`] (an [`Op`] at a byte
//! offset) and what it gets back, a [`Completion`].

pub use backend::OpKind;

use crate::Error;

/// What a request does (an open set: frontends grow operations).
#[derive(Debug)]
#[non_exhaustive]
pub enum Op {
    /// Read `len` bytes.
    Read {
        /// Bytes to read.
        len: u32,
    },
    /// Write `data` (ownership passes to the engine).
    Write {
        /// Plaintext.
        data: Vec<u8>,
    },
    /// Make all completed writes durable.
    Flush,
    /// Discard `len` bytes.
    Discard {
        /// Bytes.
        len: u32,
    },
    /// Write `len` zero bytes (plaintext zeroes).
    WriteZeroes {
        /// Bytes.
        len: u32,
    },
}

impl Op {
    /// The kind of operation, without its payload.
    pub fn kind(&self) -> OpKind {
        match self {
            Op::Read { .. } => OpKind::Read,
            Op::Write { .. } => OpKind::Write,
            Op::Flush => OpKind::Flush,
            Op::Discard { .. } => OpKind::Discard,
            Op::WriteZeroes { .. } => OpKind::WriteZeroes,
        }
    }
}

/// One request, byte-addressed on the decrypted device.
#[derive(Debug)]
pub struct Request {
    /// The operation.
    pub op: Op,
    /// Byte offset on the decrypted device.
    pub offset: u64,
    /// Forced unit access: durable before completion.
    pub fua: bool,
}

/// What a frontend knows about its caller's queue and the engine cannot
/// see: an inline request completes before the caller's next one is
/// submitted, so the engine alone never observes a queue depth above one.
/// Passed with [`crate::Engine::submit_plugged`] (or
/// [`crate::Engine::submit_hinted`]); the adaptive mode uses it
/// to hand a large request to a helper (the submitter goes back to the
/// caller's next request) instead of learning the depth from misses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Hint {
    /// Requests of the same caller in flight or already waiting to be read
    /// besides this one (0: the caller waits for this completion).
    pub behind: u32,
    /// Of those, requests already received (or arriving) that the caller
    /// submits right after this one, without waiting for any completion.
    /// While it is above 0 the caller's [`crate::Plug`] may hold this read
    /// or write to run it in one backend batch with the ones that follow
    /// (see [`crate::Plug::flush`], which the frontend must call before it
    /// blocks).
    pub ready: u32,
}

/// The result of a request: read data for reads, `None` otherwise.
pub type Completion = Result<Option<Vec<u8>>, Error>;
