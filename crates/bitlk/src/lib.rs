//! BitLocker volumes (`--type bitlk`) as cryptsetup 2.6.1 opens them.
//!
//! ```text
//!  device ──read──▶ Metadata (boot sector, FVE block, entries: VMKs, FVEK,
//!                   volume header position, description)
//!  passphrase / recovery password / .BEK ──unlock──▶ VMK ──▶ FVEK (AES-CCM)
//!  FVEK ──targets──▶ crypto::table::Targets: crypt targets around dm-zero
//!                   ones over the three FVE metadata areas and the moved
//!                   volume header, the header's sectors served at sector 0
//! ```
//!
//! The on-disk format is Microsoft's and undocumented; this follows
//! cryptsetup's `lib/bitlk/bitlk.c` (its checks, messages and choices: what
//! it refuses, which protectors it tries, how it lays out the table) and
//! libbde's published description of the format. Hand-written parsing
//! (a cursor over byte slices, every length checked: no panic on any
//! bytes); the crypto is RustCrypto's (`sha2`, `aes`, `ccm`), the data
//! path's `aes-cbc-eboiv`, `aes-cbc-elephant` and `aes-xts-plain64` are
//! `crypto::SectorCrypt`'s.

mod dump;
mod error;
mod layout;
mod metadata;
mod unlock;

pub use error::{Error, ErrorKind};
pub use metadata::{EncryptionType, Guid, Metadata, Protection, Vmk};

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, Error>;
