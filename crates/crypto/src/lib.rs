//! Sector crypto compatible with Linux dm-crypt, byte for byte.
//!
//! The public seam is [`SectorCrypt`]: built once from a [`CryptConfig`]
//! (cipher spec, key, sector size, IV offset, `iv_large_sectors`), then
//! shared by every data-path thread. The sector number is the whole IV input.
//!
//! SKELETON: only `cipher_null` works here; the crypto owner replaces this.
#![forbid(unsafe_code)]

use zeroize::Zeroizing;

/// Errors from parsing specs and building ciphers.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A cipher spec, table field or option is malformed or unsupported.
    #[error("{0}")]
    Invalid(String),
}

/// Everything needed to build a [`SectorCrypt`].
#[derive(Clone)]
pub struct CryptConfig {
    /// dm-crypt cipher spec, e.g. `aes-xts-plain64` or `capi:ecb(cipher_null)`.
    pub cipher: String,
    /// Raw key bytes (empty for `cipher_null`).
    pub key: Zeroizing<Vec<u8>>,
    /// IV offset in 512-byte sectors (table field `<iv_offset>`).
    pub iv_offset: u64,
    /// Encryption sector size in bytes (512..=4096, power of two).
    pub sector_size: u32,
    /// IV counts in `sector_size` units instead of 512-byte units.
    pub iv_large_sectors: bool,
}

/// A ready-to-use sector cipher. `Send + Sync`; share it via `Arc`.
pub struct SectorCrypt {
    sector_size: usize,
    null: bool,
}

impl SectorCrypt {
    /// Builds the cipher, checking key length and options as dm-crypt does.
    pub fn new(cfg: &CryptConfig) -> Result<Self, Error> {
        let null = cfg.cipher.contains("cipher_null");
        if !null {
            return Err(Error::Invalid(format!("cipher {} not supported yet", cfg.cipher)));
        }
        Ok(Self { sector_size: cfg.sector_size as usize, null })
    }

    /// Encryption sector size in bytes.
    pub fn sector_size(&self) -> usize {
        self.sector_size
    }

    /// True for `cipher_null` (encryption is a no-op copy).
    pub fn is_null(&self) -> bool {
        self.null
    }

    /// Encrypts `buf` in place. `sector` is the 512-byte sector number of
    /// `buf[0]` relative to the start of the mapping (dm's target offset);
    /// `buf.len()` must be a multiple of the sector size and `sector` aligned
    /// to it. Panics otherwise: callers validate requests first.
    pub fn encrypt(&self, sector: u64, buf: &mut [u8]) {
        assert!(buf.len() % self.sector_size == 0 && sector % (self.sector_size as u64 / 512) == 0);
    }

    /// Decrypts `buf` in place; same contract as [`SectorCrypt::encrypt`].
    pub fn decrypt(&self, sector: u64, buf: &mut [u8]) {
        assert!(buf.len() % self.sector_size == 0 && sector % (self.sector_size as u64 / 512) == 0);
    }
}
