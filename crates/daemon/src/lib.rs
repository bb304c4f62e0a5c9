//! Runs a ucrypt volume: everything between "the user named a volume" and
//! "a frontend serves its decrypted device", as a library the `ucrypt`
//! binary (and later frontends such as vhost-user-blk) drive.
//!
//! ```text
//!            ┌──────────── ucrypt-daemon ───────────────────────────────┐
//!  spec ───► │ resolve   plain table line | LUKS header + passphrase    │
//!            │             └─► crypto::table::Table                     │
//!            │ serve     Table ─► backend::FileBackend ─► datapath::Engine
//!            │             ─► frontend: nbd | fuse | ublk               │
//!            │ control   typed Request/Reply on NAME.ctl.sock ◄── client│
//!            │ runtime   runtime dir, pid file, sockets, stale cleanup  │
//!            │ spec      VolumeSpec: the one serde value the cli hands │
//!            │ open      options checked ─► VolumeSpec ─► serve here or │
//!            │ detach    re-exec detached, spec + table on stdin, ping  │
//!            │ volumes   close-and-wait, list (client side)             │
//!            │ targets   a table's targets as the engine serves them    │
//!            └──────────────────────────────────────────────────────────┘
//! ```
//!
//! Every fallible function returns [`Error`], whose [`ErrorKind`] is
//! stable (and survives the control socket); callers map kinds to their
//! own outcomes (the `ucrypt` binary: cryptsetup's exit codes).
//!
//! Plain mode's key derivation and table are the `plain` crate's (a
//! volume format beside `luks`); `ucrypt map`, which runs no daemon, is
//! the cli's (`cli::map`), over [`resolve`] and [`targets`].
//!
//! Keys: a [`Table`](crypto::table::Table) wipes its key on drop; lines
//! that carry a key (`table --showkeys`, the detach pipe) are held in
//! zeroizing buffers; a [`VolumeSpec`] never holds a key.
#![forbid(unsafe_code)]

pub mod control;
pub mod crypttab;
pub mod detach;
mod error;
pub mod export;
pub mod open;
pub mod resolve;
pub mod runtime;
pub mod serve;
pub mod spec;
pub mod targets;
pub mod tls;
pub mod volumes;

pub use error::{backend_error, chain, Error, ErrorKind, Result};
pub use open::OpenOptions;
pub use resolve::tcrypt;
pub use serve::{run, ExportSpec, FuseUring, Spec};
pub use spec::VolumeSpec;
pub use tls::TlsSpec;
