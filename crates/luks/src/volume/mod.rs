//! Operations on a LUKS volume stored in files or block devices: load,
//! unlock ([`open`]), [`format`], add/remove/change keys, kill slots,
//! header backup/restore.
//!
//! Write ordering (crash safety): new keyslot material is written and
//! synced before the header that points at it; a removed keyslot leaves the
//! header first and is wiped afterwards; LUKS2 header updates write the
//! secondary copy, sync, then the primary, sync, so a crash at any point
//! leaves at least one valid copy (the reader takes the highest seqid).

//!
//! ```text
//!   mod.rs      Volume (load, checks, accessors), Opened, open()
//!   unlock.rs   keyslot try order, passphrase -> volume key, Opened
//!   keyslots.rs add_key, kill_slot, set_uuid, LUKS2 area allocation
//!   backup.rs   header_backup, header_restore
//!   format.rs   FormatOptions, format() as named steps
//!   layout.rs   data offset, alignment, LUKS2 area sizes, sector size
//!   io.rs       positioned reads/writes, syncs, the LUKS2 two-copy write
//! ```

use std::path::{Path, PathBuf};

use crypto::Secret;
use zeroize::Zeroizing;

use crate::error::{corrupt, Error, ErrorKind, Result};
use crate::Header;

mod backup;
mod config;
mod convert;
mod format;
pub(crate) mod io;
pub(crate) mod keyslots;
mod layout;
mod token;
mod unlock;

pub use config::{Priority, Repair, MAX_LABEL_LEN};
pub use format::{format, FormatOptions};
pub use io::DeviceAccess;
pub(crate) use io::{claim, device_size, open_ro, Claim};
pub use token::{token_text, TokenPlacement, KEYRING_TOKEN};

/// An unlocked volume: everything the data path needs.
pub struct Opened {
    /// The volume key (locked memory, zeroized on drop, never printed).
    pub volume_key: Secret,
    /// Keyslot that opened it.
    pub keyslot: u32,
    /// dm-crypt cipher spec, e.g. `aes-xts-plain64`.
    pub cipher: String,
    /// Encryption sector size in bytes.
    pub sector_size: u32,
    /// IV offset in 512-byte sectors (LUKS2 `iv_tweak`; 0 for LUKS1).
    pub iv_offset: u64,
    /// IVs count in 512-byte units (cryptsetup never sets
    /// `iv_large_sectors` for LUKS), so always false.
    pub iv_large_sectors: bool,
    /// Data start on the data device, bytes.
    pub payload_offset: u64,
    /// Data size in bytes (a multiple of `sector_size`).
    pub size: u64,
    /// Volume UUID.
    pub uuid: String,
}

impl std::fmt::Debug for Opened {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Opened")
            .field("volume_key", &"<redacted>")
            .field("keyslot", &self.keyslot)
            .field("cipher", &self.cipher)
            .field("sector_size", &self.sector_size)
            .field("iv_offset", &self.iv_offset)
            .field("payload_offset", &self.payload_offset)
            .field("size", &self.size)
            .field("uuid", &self.uuid)
            .finish()
    }
}

impl Opened {
    /// The sector-cipher configuration dm-crypt would use.
    pub fn crypt_config(&self) -> crypto::CryptConfig {
        crypto::CryptConfig {
            cipher: self.cipher.clone(),
            key: Zeroizing::new(self.volume_key.to_vec()),
            iv_offset: self.iv_offset,
            sector_size: self.sector_size,
            iv_large_sectors: self.iv_large_sectors,
        }
    }

    /// The dm table line cryptsetup loads for this volume (contains the key
    /// in hex: treat as secret):
    /// `0 <sectors> crypt <cipher> <key> <iv_offset> <dev> <offset> [1 sector_size:N]`.
    pub fn table_line(&self, device: &Path) -> Zeroizing<String> {
        Zeroizing::new(
            self.table_text(device)
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        )
    }

    /// [`Opened::table_line`] in locked memory, the key's hex written
    /// digit by digit (no `String` ever holds it).
    fn table_text(&self, device: &Path) -> Secret {
        use std::fmt::Write as _;
        let mut line =
            Secret::with_capacity(256 + device.as_os_str().len() + self.volume_key.len() * 2);
        // fmt::Write on a Secret appends in place and cannot fail.
        let _ = write!(line, "0 {} crypt {} ", self.size / 512, self.cipher);
        line.push_hex(&self.volume_key);
        let _ = write!(
            line,
            " {} {} {}",
            self.iv_offset,
            device.display(),
            self.payload_offset / 512
        );
        if self.sector_size != 512 {
            let _ = write!(line, " 1 sector_size:{}", self.sector_size);
        }
        line
    }
}

impl Opened {
    /// The dm-crypt table cryptsetup would load, as a parsed
    /// [`crypto::table::Table`] for the data path.
    pub fn to_table(&self, device: &Path) -> Result<crypto::table::Table> {
        let line = self.table_text(device);
        // Always UTF-8: the device is written through `display()`.
        crypto::table::Table::parse(line.as_str().unwrap_or_default()).map_err(|e| {
            Error::crypto(
                ErrorKind::InvalidArgument,
                "Cannot build the dm-crypt table",
                e,
            )
        })
    }
}

/// Unlocks the volume on `device` (header on `device` or the detached
/// `header`, reached as `access` says) with `passphrase`, trying
/// `key_slot` only if given.
pub fn open(
    device: &Path,
    header: Option<&Path>,
    access: &DeviceAccess,
    passphrase: &[u8],
    key_slot: Option<u32>,
) -> Result<Opened> {
    let vol = Volume::load(device, header, access)?;
    vol.unlock(passphrase, key_slot)
}

/// A LUKS volume: its header and where header and data live.
#[derive(Debug)]
pub struct Volume {
    header: Header,
    meta_path: PathBuf,
    detached: bool,
    meta_size: u64,
    data_size: u64,
    /// Cipher and key length new LUKS2 keyslots are sealed with, when
    /// set ([`Volume::set_keyslot_encryption`]); else cryptsetup's choice.
    keyslot_encryption: Option<(String, usize)>,
    /// How the header device is opened again to write it.
    access: DeviceAccess,
}

impl Volume {
    /// Reads the header of `device` (or of the detached `header` file),
    /// both reached as `access` says (which the volume keeps for its
    /// writes).
    pub fn load(device: &Path, header: Option<&Path>, access: &DeviceAccess) -> Result<Self> {
        let vol = Self::load_header_only(device, header, access)?;
        vol.check_data_device(false)?;
        Ok(vol)
    }

    /// Reads the header as [`Volume::load`] does, without checking the
    /// data area against it: cryptsetup's `open --test-passphrase` checks
    /// keyslots only, so a detached header with data offset 0 named as the
    /// device, or a data offset past the data device's end, still answers
    /// it ([`Volume::unlock_key`]; [`Volume::check_mapping`] says whether
    /// the data could be mapped).
    pub fn load_header_only(
        device: &Path,
        header: Option<&Path>,
        access: &DeviceAccess,
    ) -> Result<Self> {
        let meta_path = header.unwrap_or(device).to_path_buf();
        let mut data = open_ro(device, access)?;
        let data_size = device_size(&mut data, device)?;
        let (mut meta, meta_size) = if header.is_some() {
            let mut m = open_ro(&meta_path, access)?;
            let s = device_size(&mut m, &meta_path)?;
            (m, s)
        } else {
            (data, data_size)
        };
        let h = Header::read(&mut meta, meta_size)?;
        Ok(Volume {
            header: h,
            meta_path,
            detached: header.is_some(),
            meta_size,
            data_size,
            keyslot_encryption: None,
            access: access.clone(),
        })
    }

    /// Whether the header and the data device allow mapping the data
    /// (what [`Volume::load`] and an unlock check).
    pub fn check_mapping(&self) -> Result<()> {
        self.check_data_device(true)?;
        let (ss, fixed) = match &self.header {
            Header::V1(_) => (512, None),
            Header::V2(h) => (
                u64::from(self.header.sector_size()),
                h.meta.segment().1.fixed_size()?,
            ),
        };
        let rest = self.data_size.saturating_sub(self.header.payload_offset());
        if fixed.is_none() && rest / ss == 0 {
            return Err(Error::new(
                ErrorKind::DeviceSize,
                "The LUKS data area is empty (device too small)",
            ));
        }
        Ok(())
    }

    /// Opens the header device to write this volume's header, under the
    /// exclusive metadata lock (`io.rs`), and checks that the header on
    /// it is still the one loaded: a header another process wrote since
    /// (a cryptsetup or ucrypt adding a key meanwhile) is refused, and
    /// nothing is written, rather than overwritten with the stale copy.
    pub(super) fn open_update(&self) -> Result<io::Dev> {
        let mut f = io::open_rw(&self.meta_path, &self.access)?;
        let size = device_size(&mut f, &self.meta_path)?;
        let same = match (Header::read(&mut f, size), &self.header) {
            // LUKS2 counts its writes: seqid is what cryptsetup checks too.
            (Ok(Header::V2(now)), Header::V2(was)) => {
                (now.bin.seqid, &now.bin.uuid) == (was.bin.seqid, &was.bin.uuid)
            }
            (Ok(Header::V1(now)), Header::V1(was)) => now.to_bytes() == was.to_bytes(),
            _ => false,
        };
        if !same {
            return Err(Error::new(
                ErrorKind::Busy,
                format!(
                    "The LUKS header of {} changed since it was read (another process wrote it); \
                     nothing was written, run the command again",
                    self.meta_path.display()
                ),
            ));
        }
        Ok(f)
    }

    /// Checks the data area against the header and the data device. On
    /// load (`mapping` false) only what makes the header itself
    /// inconsistent fails; the data device's size matters when the data
    /// is mapped (cryptsetup's luksDump shows such a header, its open
    /// refuses it).
    pub(crate) fn check_data_device(&self, mapping: bool) -> Result<()> {
        let off = self.header.payload_offset();
        if !self.detached && off != 0 && off < self.header.metadata_end() {
            return Err(corrupt("Data offset lies inside the LUKS metadata"));
        }
        if !self.detached && off == 0 {
            return Err(corrupt(
                "Data offset 0 on a device that holds its own header",
            ));
        }
        if !mapping {
            return Ok(());
        }
        if let Header::V2(h) = &self.header {
            if let Some(why) = h.meta.unmappable() {
                return Err(Error::new(ErrorKind::Unsupported, why));
            }
        }
        if off > self.data_size {
            return Err(Error::new(
                ErrorKind::DeviceSize,
                format!(
                    "Data offset {off} lies beyond the device size {}",
                    self.data_size
                ),
            ));
        }
        if let Header::V2(h) = &self.header {
            if let Some(sz) = h.meta.segment().1.fixed_size()? {
                if off.saturating_add(sz) > self.data_size {
                    return Err(Error::new(
                        ErrorKind::DeviceSize,
                        "LUKS2 segment extends beyond the device",
                    ));
                }
            }
        }
        Ok(())
    }

    /// The parsed header.
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// How the volume's devices are opened (the settings it was loaded
    /// with).
    pub fn access(&self) -> &DeviceAccess {
        &self.access
    }

    /// Where the header lives.
    pub fn header_path(&self) -> &Path {
        &self.meta_path
    }

    /// Size of the data device in bytes.
    pub fn data_size(&self) -> u64 {
        self.data_size
    }
}
