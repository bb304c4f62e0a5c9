//! FileVault 2 volumes (`--type fvault2`) as cryptsetup 2.6.1 opens them
//! (`lib/fvault2/fvault2.c`): read-only, passphrase protector only.
//!
//! ```text
//!  volume header (512 B, CRC32C)  → block size, disk label block, the
//!                                   metadata key: key data ‖ physical UUID
//!  disk label (8 KiB, CRC32C)     → volume groups descriptor: where the
//!                                   encrypted metadata is, how many blocks
//!  encrypted metadata (AES-XTS-128, tweak = block index; CRC32C each):
//!    0x0019  XML: PassphraseWrappedKEKStruct, KEKWrappedVolumeKeyStruct
//!    0x001a  XML: logical volume size, family UUID
//!    0x0305  logical volume block offset
//!  passphrase ─PBKDF2-SHA256→ KEK unwraps (AES-KW) → volume key; the
//!  tweak key is SHA-256(volume key ‖ family UUID)[..16]
//!  table: 0 <lv size> crypt aes-xts-plain64 <vk‖tweak> 0 <dev> <lv offset>
//! ```
//!
//! Hand-written parsing (a bounds-checked reader; the XML is searched as
//! cryptsetup's regular expression does, not parsed) and CRC32C
//! (Castagnoli, seed 0xffffffff, no final inversion, as cryptsetup's
//! `crypt_crc32c` is called here); the crypto is RustCrypto's (`pbkdf2`,
//! `sha2`, `aes-kw`) and `crypto`'s XTS.

mod metadata;

pub use metadata::{Error, ErrorKind, Metadata};

/// Bytes of the volume key (AES-128-XTS: data key and tweak key), as
/// `--dump-volume-key` prints it and `--volume-key-file` holds it.
pub const VOLUME_KEY_LEN: usize = 32;

/// Result type of this crate.
pub type Result<T> = std::result::Result<T, Error>;
