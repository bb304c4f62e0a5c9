//! Header backup and restore, byte-compatible with cryptsetup's
//! luksHeaderBackup / luksHeaderRestore.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

use super::io::{device_size, open_ro, open_rw, read_exact_at, sync, write_at};
use super::{DeviceAccess, Volume};
use crate::error::{corrupt, invalid, Error, ErrorKind, Result};
use crate::Header;

impl Volume {
    /// Writes a header backup file (headers and keyslot areas, byte for
    /// byte what cryptsetup's luksHeaderBackup writes). Refuses to
    /// overwrite `path`.
    pub fn header_backup(&self, path: &Path) -> Result<()> {
        // cryptsetup saves the headers and keyslot areas, not the gap
        // up to the payload.
        let len = self.header.metadata_end().min(self.meta_size);
        let mut src = open_ro(&self.meta_path, &self.access)?;
        let mut buf = vec![0u8; len as usize];
        read_exact_at(&mut src, 0, &mut buf)?;
        let mut opts = OpenOptions::new();
        opts.write(true).create_new(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o400); // read-only, as cryptsetup creates it
        }
        let mut out = opts.open(path).map_err(|e| {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                // cryptsetup: "Requested header backup file ... already
                // exists.", exit 1.
                Error::io_as(
                    ErrorKind::InvalidArgument,
                    format!(
                        "Requested header backup file {} already exists",
                        path.display()
                    ),
                    e,
                )
            } else {
                Error::io(format!("Cannot create {}", path.display()), e)
            }
        })?;
        out.write_all(&buf)
            .map_err(|e| Error::io("Cannot write the header backup", e))?;
        sync(&out)
    }

    /// Restores a backup made by [`Volume::header_backup`] (or cryptsetup)
    /// onto `device` (or the detached `header`). A different UUID on the
    /// target needs `force`; the target is opened as `access` says. Refused ([`ErrorKind::Busy`]) while the
    /// volume is in use (mounted, mapped, served by a daemon): its
    /// mapping would go on writing under a key the restored header may
    /// not hold.
    pub fn header_restore(
        device: &Path,
        header: Option<&Path>,
        backup: &Path,
        force: bool,
        access: &DeviceAccess,
    ) -> Result<Header> {
        let img = std::fs::read(backup)
            .map_err(|e| Error::io(format!("Cannot read {}", backup.display()), e))?;
        let new = Header::from_bytes(&img)?;
        let target = header.unwrap_or(device);
        let _claim = super::io::claim(&[target, device])?;
        let mut f = open_rw(target, access)?;
        let size = device_size(&mut f, target)?;
        if (img.len() as u64) > size && header.is_none() {
            return Err(Error::new(
                ErrorKind::DeviceSize,
                "The backup is larger than the device",
            ));
        }
        if header.is_none()
            && new.payload_offset() != 0
            && (img.len() as u64) > new.payload_offset()
        {
            return Err(corrupt("The backup extends into its own data area"));
        }
        match Header::read(&mut f, size) {
            Ok(old) if old.uuid() != new.uuid() && !force => {
                return Err(Error::new(
                    ErrorKind::AlreadyLuks,
                    format!(
                        "Device has a different LUKS header (UUID {}); use force to replace it",
                        old.uuid()
                    ),
                ))
            }
            Ok(old) if old.payload_offset() != new.payload_offset() && header.is_none() => {
                return Err(invalid(
                    "The backup's data offset differs from the device's header",
                ));
            }
            _ => {}
        }
        write_at(&mut f, 0, &img)?;
        sync(&f)?;
        Ok(new)
    }
}
