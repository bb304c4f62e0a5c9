//! Device helpers shared by the volume operations: open, size, positioned
//! read/write, sync, zeroing, and the crash-safe LUKS2 header write.
//!
//! A header lives on a [`Device`]: a file or block device, or an RBD image
//! named `rbd:POOL/IMAGE[@SNAP]` (read and written through
//! `backend::RbdBackend`; a read-write open holds the image's exclusive
//! lock, so a volume in use elsewhere is [`ErrorKind::Busy`]).
//!
//! Metadata locking, as cryptsetup's on a header file: a BSD `flock` on
//! the file itself, shared while headers are read ([`open_ro`]),
//! exclusive while they are written ([`open_rw`]), waited for. So ucrypt
//! and cryptsetup (2.x locks a LUKS2 header file the same way) never
//! write one header at once, nor read one half written. On a block device
//! the lock is cryptsetup's lock file, `/run/cryptsetup/L_MAJOR:MINOR`
//! ([`crate::lockfile`]), or the device node where that directory cannot be
//! used. `--disable-locks` turns it off ([`DeviceAccess::locking`]). The
//! daemon's data path holds its own, separate lock (backend's OFD `fcntl`
//! lock), which `flock` does not see on a local file system, so a key can
//! be added to a volume being served, as with cryptsetup. (NFS emulates
//! `flock` with `fcntl` locks, so there the two would conflict.)
//!
//! The verbs that replace a header rather than update it (format, header
//! restore, erase, convert) first [`claim`] the header and data devices
//! as cryptsetup's `DEV_EXCL` check does: a block device exclusively
//! (`O_EXCL`: refused while mounted, mapped or served by a ucrypt daemon,
//! whose backend claims it the same way), a regular file under an OFD
//! write lock (refused while a daemon or `map` has it open, read-only or
//! not). The claim is held until the verb is done, so a daemon started
//! meanwhile is refused in turn. Keyslot, token and config verbs take no
//! claim: they work on a volume in use, as cryptsetup's do.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use rustix::fs::FlockOperation;

use crate::lockfile::{flock_waiting, LockFile};

use backend::rbd::{RbdBackend, RbdConfig, RbdOptions, RbdSpec};
use backend::Backend;

use crate::error::{Error, ErrorKind, Result};
use crate::luks2;

/// How headers are reached: the metadata lock taken on them and the Ceph
/// cluster of an `rbd:` header. The cli builds it once from its options
/// (`--disable-locks`, `--ceph-conf`, `--ceph-id`, `--keyring`) and passes
/// it to every verb that opens a header; a [`Volume`](super::Volume)
/// keeps the one it was loaded with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceAccess {
    /// Lock headers while they are read and written (see the module
    /// doc); `false` with `--disable-locks`, which also turns off
    /// cryptsetup's reencryption lock, as `crypt_metadata_locking_enabled`
    /// turns off both.
    pub locking: bool,
    /// How an `rbd:` header reaches its cluster.
    pub ceph: RbdConfig,
}

impl Default for DeviceAccess {
    /// Locking on, librados's default cluster settings.
    fn default() -> Self {
        Self {
            locking: true,
            ceph: RbdConfig::default(),
        }
    }
}

/// What the volume operations read and write headers on.
pub(crate) trait Device: Read + Write + Seek {
    /// Makes every completed write durable.
    fn sync_dev(&self) -> std::io::Result<()>;
}

/// An image in memory (the fuzzing entry points).
impl Device for std::io::Cursor<Vec<u8>> {
    fn sync_dev(&self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Device for File {
    fn sync_dev(&self) -> std::io::Result<()> {
        self.sync_all()
    }
}

/// An open header device.
pub(crate) type Dev = Box<dyn Device>;

impl Device for Dev {
    fn sync_dev(&self) -> std::io::Result<()> {
        (**self).sync_dev()
    }
}

/// An RBD image as a positioned stream.
struct Rbd {
    image: RbdBackend,
    pos: u64,
}

impl Read for Rbd {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (self.image.size().saturating_sub(self.pos)).min(buf.len() as u64) as usize;
        self.image.read_at(&mut buf[..n], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Write for Rbd {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.image.write_at(buf, self.pos, false)?;
        self.pos += buf.len() as u64;
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.image.flush()
    }
}

impl Seek for Rbd {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        let base = match to {
            SeekFrom::Start(n) => Some(n),
            SeekFrom::End(d) => self.image.size().checked_add_signed(d),
            SeekFrom::Current(d) => self.pos.checked_add_signed(d),
        };
        self.pos = base.ok_or_else(|| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
        Ok(self.pos)
    }
}

impl Device for Rbd {
    fn sync_dev(&self) -> std::io::Result<()> {
        self.image.flush()
    }
}

/// Opens an `rbd:` name; `None` for a path.
fn open_rbd(path: &Path, read_only: bool, ceph: &RbdConfig) -> Option<Result<Dev>> {
    let spec = RbdSpec::of_path(path)?;
    let shown = path.display();
    let opts = RbdOptions {
        read_only,
        ..RbdOptions::default()
    };
    Some(
        spec.and_then(|s| RbdBackend::open_with(&s, &opts, ceph))
            .map(|image| Box::new(Rbd { image, pos: 0 }) as Dev)
            .map_err(|e| {
                let busy = matches!(e.kind(), backend::ErrorKind::Locked { .. });
                let msg = if busy {
                    format!("Device {shown} is in use by another Ceph client")
                } else if read_only {
                    format!("Cannot open {shown}")
                } else {
                    format!("Cannot open {shown} for writing")
                };
                let kind = if busy { ErrorKind::Busy } else { ErrorKind::Io };
                Error::io_as(kind, msg, e.into())
            }),
    )
}

/// The devices a header-replacing verb holds while it runs (see the
/// module doc); released on drop.
#[derive(Debug)]
#[must_use = "the devices are held only while the claim lives"]
pub(crate) struct Claim {
    _held: Vec<(PathBuf, backend::Claim)>,
}

/// Claims each of `paths` (the header and the data device) for a verb
/// that replaces the header: [`ErrorKind::Busy`] with cryptsetup's
/// message when one is mounted, mapped or served. `rbd:` images are
/// skipped (their read-write open takes the image's exclusive lock), and
/// so are paths that cannot be opened (the verb's own open says why).
pub(crate) fn claim(paths: &[&Path]) -> Result<Claim> {
    let mut held = Vec::new();
    for path in paths {
        if RbdSpec::of_path(path).is_some() || held_already(&held, path) {
            continue;
        }
        match backend::Claim::take(path) {
            Ok(c) => held.push((path.to_path_buf(), c)),
            Err(e) => match e.kind() {
                backend::ErrorKind::InUse { .. } | backend::ErrorKind::Locked { .. } => {
                    return Err(Error::new(
                        ErrorKind::Busy,
                        format!(
                            "Cannot use device {} which is in use (already mapped or mounted).",
                            path.display()
                        ),
                    ))
                }
                _ => {}
            },
        }
    }
    Ok(Claim { _held: held })
}

/// Whether `path` names a file already claimed (the same path given as
/// header and device: a second claim would conflict with the first).
fn held_already(held: &[(PathBuf, backend::Claim)], path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let id = |p: &Path| {
        std::fs::metadata(p)
            .ok()
            .map(|m| (m.dev(), m.ino(), m.rdev()))
    };
    let this = id(path);
    this.is_some() && held.iter().any(|(p, _)| id(p) == this)
}

pub(crate) fn device_size(f: &mut dyn Device, path: &Path) -> Result<u64> {
    f.seek(SeekFrom::End(0))
        .map_err(|e| Error::io(format!("Cannot size {}", path.display()), e))
}

/// Opens `path` to read headers, under a shared lock (unless `access`
/// turns locking off).
pub(crate) fn open_ro(path: &Path, access: &DeviceAccess) -> Result<Dev> {
    if let Some(r) = open_rbd(path, true, &access.ceph) {
        return r;
    }
    let f =
        File::open(path).map_err(|e| Error::io(format!("Cannot open {}", path.display()), e))?;
    locked(f, path, FlockOperation::LockShared, access)
}

/// Opens `path` to write headers, under an exclusive lock (unless
/// `access` turns locking off).
pub(crate) fn open_rw(path: &Path, access: &DeviceAccess) -> Result<Dev> {
    open_rw_with(path, OpenOptions::new().read(true).write(true), access)
}

/// [`open_rw`] with `opts` (say, creating a detached header file).
pub(super) fn open_rw_with(path: &Path, opts: &OpenOptions, access: &DeviceAccess) -> Result<Dev> {
    if let Some(r) = open_rbd(path, false, &access.ceph) {
        return r;
    }
    let f = opts
        .open(path)
        .map_err(|e| Error::io(format!("Cannot open {} for writing", path.display()), e))?;
    locked(f, path, FlockOperation::LockExclusive, access)
}

/// `f` (opened from `path`) under the metadata lock `op`: on a block
/// device cryptsetup's lock file when it can be used, else `f` itself;
/// as it is when `access` turns locking off.
fn locked(f: File, path: &Path, op: FlockOperation, access: &DeviceAccess) -> Result<Dev> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    if !access.locking {
        return Ok(Box::new(f));
    }
    if let Ok(m) = f.metadata() {
        if m.file_type().is_block_device() {
            match LockFile::bdev(m.rdev(), op) {
                Ok(Some(lock)) => return Ok(Box::new(BdevLocked { f, _lock: lock })),
                Ok(None) => {}
                Err(e) => {
                    return Err(Error::io(
                        format!("Cannot lock the metadata of {}", path.display()),
                        e,
                    ))
                }
            }
        }
    }
    lock(&f, path, op)?;
    Ok(Box::new(f))
}

/// A block device whose metadata lock is a lock file, held until dropped.
struct BdevLocked {
    f: File,
    _lock: LockFile,
}

impl Read for BdevLocked {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.f.read(buf)
    }
}

impl Write for BdevLocked {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.f.write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.f.flush()
    }
}

impl Seek for BdevLocked {
    fn seek(&mut self, to: SeekFrom) -> std::io::Result<u64> {
        self.f.seek(to)
    }
}

impl Device for BdevLocked {
    fn sync_dev(&self) -> std::io::Result<()> {
        self.f.sync_all()
    }
}

/// Takes the metadata lock `op` on `f` itself (locking is on: see
/// [`locked`]), waiting for whoever holds a conflicting one (a cryptsetup
/// or ucrypt writing the header). A file system without `flock` support
/// goes unlocked, as it must.
fn lock(f: &File, path: &Path, op: FlockOperation) -> Result<()> {
    match flock_waiting(f, op) {
        Ok(()) | Err(rustix::io::Errno::NOLCK | rustix::io::Errno::OPNOTSUPP) => Ok(()),
        Err(e) => Err(Error::io(
            format!("Cannot lock the metadata of {}", path.display()),
            e.into(),
        )),
    }
}

pub(crate) fn write_at(f: &mut dyn Device, off: u64, buf: &[u8]) -> Result<()> {
    f.seek(SeekFrom::Start(off))
        .map_err(|e| Error::io("Cannot seek the header device", e))?;
    f.write_all(buf)
        .map_err(|e| Error::io("Cannot write the header device", e))
}

pub(crate) fn read_exact_at(f: &mut dyn Device, off: u64, buf: &mut [u8]) -> Result<()> {
    f.seek(SeekFrom::Start(off))
        .map_err(|e| Error::io("Cannot seek the header device", e))?;
    f.read_exact(buf)
        .map_err(|e| Error::io("Cannot read keyslot material", e))
}

pub(crate) fn sync(f: &dyn Device) -> Result<()> {
    f.sync_dev()
        .map_err(|e| Error::io("Cannot flush the header device", e))
}

/// Overwrites `[off, off+len)` with zeros in 1 MiB chunks.
pub(crate) fn zero_range(f: &mut dyn Device, off: u64, len: u64) -> Result<()> {
    let chunk = vec![0u8; 1 << 20];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(chunk.len() as u64) as usize;
        write_at(f, off + done, &chunk[..n])?;
        done += n as u64;
    }
    Ok(())
}

/// Writes both LUKS2 copies with seqid + 1: secondary, sync, primary, sync.
pub(super) fn write_luks2(f: &mut dyn Device, h: &mut luks2::Header) -> Result<()> {
    h.bin.seqid += 1;
    h.meta.validate(h.bin.hdr_size)?;
    let (p, s) = h.to_copies()?;
    write_at(f, h.bin.hdr_size, &s)?;
    sync(f)?;
    write_at(f, 0, &p)?;
    sync(f)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_is_refused_while_a_backend_holds_the_file() {
        let dir = testutil::TempDir::new("luks-claim");
        let img = dir.join("vol.img");
        std::fs::write(&img, vec![0u8; 1 << 20]).unwrap();
        let missing = dir.join("missing");
        // Free: claimed, the same file named twice (header = device) is
        // claimed once, and a missing path is left to the verb's open.
        let held = claim(&[&img, &img, &missing]).unwrap();
        // A serving backend is refused meanwhile.
        let e = backend::FileBackend::open(&img, &backend::FileOptions::default()).unwrap_err();
        assert!(matches!(e.kind(), backend::ErrorKind::Locked { .. }), "{e}");
        drop(held);
        for read_only in [false, true] {
            let opts = backend::FileOptions {
                read_only,
                ..backend::FileOptions::default()
            };
            let served = backend::FileBackend::open(&img, &opts).unwrap();
            let e = claim(&[&img]).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Busy);
            assert_eq!(
                e.to_string(),
                format!(
                    "Cannot use device {} which is in use (already mapped or mounted).",
                    img.display()
                )
            );
            // The metadata lock is another matter: keyslot verbs go on.
            drop(open_rw(&img, &crate::DeviceAccess::default()).unwrap());
            drop(served);
        }
        drop(claim(&[&img]).unwrap());
    }
}
