//! The one vocabulary of operations, shared by the backends, the engine
//! (`datapath` re-exports it) and the frontends.

use std::fmt;

/// What a request or backend call does, without its payload (an open set:
/// operations get added).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OpKind {
    /// Read (`read_at`).
    Read,
    /// Write, FUA or not (`write_at`).
    Write,
    /// Make completed writes durable (`flush`).
    Flush,
    /// Discard (`discard`).
    Discard,
    /// Write zeroes (`write_zeroes`).
    WriteZeroes,
}

impl OpKind {
    /// True for the operations that store data (write, write-zeroes): the
    /// ones that answer "no space" past the end of the device.
    pub fn writes_data(self) -> bool {
        matches!(self, OpKind::Write | OpKind::WriteZeroes)
    }

    /// True for the operations that change the device (refused on a
    /// read-only engine).
    pub fn modifies(self) -> bool {
        matches!(self, OpKind::Write | OpKind::WriteZeroes | OpKind::Discard)
    }

    /// The name in lower case, as in the middle of a sentence: `read`,
    /// `write`, `flush`, `discard`, `write-zeroes`.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Read => "read",
            OpKind::Write => "write",
            OpKind::Flush => "flush",
            OpKind::Discard => "discard",
            OpKind::WriteZeroes => "write-zeroes",
        }
    }
}

/// Capitalised, to start a message: `Read`, `Write`, `Flush`, `Discard`,
/// `Write-zeroes`.
impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OpKind::Read => "Read",
            OpKind::Write => "Write",
            OpKind::Flush => "Flush",
            OpKind::Discard => "Discard",
            OpKind::WriteZeroes => "Write-zeroes",
        })
    }
}
