//! `--dir DIR`: where the servers' images live when not in /dev/shm, and
//! what that storage is, for the report's `storage:` line.
//!
//! ```text
//!   stat(DIR).st_dev ─► /proc/self/mountinfo line with that MAJ:MIN
//!                       (the longest mount point above DIR) ─► fstype, source
//!   open(DIR/probe, O_DIRECT) ─► does the filesystem take O_DIRECT
//! ```
//!
//! ucrypt's file backend (direct IO `auto`) opens an image with O_DIRECT
//! where the filesystem takes it, and on tmpfs lends the file's pages to
//! the crypto through a shared mapping instead; the line says which of the
//! two the servers' images got.

use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::Error;

/// The directory the images go to, and what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageDir {
    /// The directory (absolute).
    pub dir: PathBuf,
    /// Its filesystem type (`ext4`, `xfs`, `tmpfs`; `?` if unknown).
    pub fstype: String,
    /// The mount's source (`/dev/vda1`).
    pub source: String,
    /// Where that filesystem is mounted.
    pub mount_point: String,
    /// A file there opens with O_DIRECT.
    pub direct: bool,
}

/// One `/proc/self/mountinfo` mount: (mount point, fstype, source) of
/// the line whose device is `maj:min` and whose mount point is the
/// longest one above `path`. The fields are the kernel's
/// (Documentation/filesystems/proc.rst, 3.5): ID, parent, MAJ:MIN, root,
/// mount point, options, optional fields up to `-`, fstype, source.
pub fn parse_mountinfo(
    text: &str,
    maj_min: (u64, u64),
    path: &Path,
) -> Option<(String, String, String)> {
    let want = format!("{}:{}", maj_min.0, maj_min.1);
    let mut best: Option<(String, String, String)> = None;
    for line in text.lines() {
        let f: Vec<&str> = line.split(' ').collect();
        if f.len() < 7 || f[2] != want {
            continue;
        }
        let mp = unescape(f[4]);
        if !path.starts_with(&mp) {
            continue;
        }
        let Some(dash) = f.iter().skip(6).position(|&x| x == "-").map(|i| i + 6) else {
            continue;
        };
        let (Some(fstype), Some(source)) = (f.get(dash + 1), f.get(dash + 2)) else {
            continue;
        };
        if best.as_ref().is_none_or(|b| mp.len() > b.0.len()) {
            best = Some((mp, (*fstype).to_string(), unescape(source)));
        }
    }
    best
}

/// mountinfo's octal escapes (`\040` for a space) undone.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\' && i + 4 <= b.len() {
            let oct = std::str::from_utf8(&b[i + 1..i + 4]).ok();
            if let Some(v) = oct.and_then(|o| u8::from_str_radix(o, 8).ok()) {
                out.push(v);
                i += 4;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// glibc's `major` and `minor` of a `dev_t`.
fn major_minor(dev: u64) -> (u64, u64) {
    (
        ((dev >> 8) & 0xfff) | ((dev >> 32) & 0xffff_f000),
        (dev & 0xff) | ((dev >> 12) & 0xffff_ff00),
    )
}

impl StorageDir {
    /// Looks at `dir` (which must be a directory): its mount and whether
    /// a file there takes O_DIRECT (a probe file, removed again).
    pub fn probe(dir: &Path) -> Result<Self, Error> {
        let io = |source| Error::Output {
            path: dir.to_path_buf(),
            source,
        };
        let dir = std::fs::canonicalize(dir).map_err(io)?;
        let meta = std::fs::metadata(&dir).map_err(io)?;
        if !meta.is_dir() {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "not a directory (--dir takes the directory the images go to)",
            )));
        }
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let (mount_point, fstype, source) = parse_mountinfo(&info, major_minor(meta.dev()), &dir)
            .unwrap_or_else(|| ("?".into(), "?".into(), "?".into()));
        let probe = dir.join(format!(
            "{}{}-direct-probe",
            super::servers::STEM,
            std::process::id()
        ));
        let direct = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .custom_flags(nix::fcntl::OFlag::O_DIRECT.bits())
            .open(&probe)
            .is_ok();
        let _ = std::fs::remove_file(&probe);
        Ok(Self {
            dir,
            fstype,
            source,
            mount_point,
            direct,
        })
    }

    /// tmpfs: ucrypt maps the image instead of O_DIRECT.
    pub fn tmpfs(&self) -> bool {
        self.fstype == "tmpfs"
    }

    /// The report's `storage:` line.
    pub fn describe(&self) -> String {
        let io = if self.tmpfs() {
            "ucrypt's tmpfs mapping used (adaptive encrypts into the image's pages), no O_DIRECT"
        } else if self.direct {
            "O_DIRECT (ucrypt, qemu-storage-daemon cache.direct=on aio=io_uring, fio --direct=1; \
             nbdkit cache=none), ucrypt's tmpfs mapping not used"
        } else {
            "page cache (the filesystem refuses O_DIRECT), ucrypt's tmpfs mapping not used"
        };
        format!(
            "images in {} on {} {} (mounted at {}), {io}",
            self.dir.display(),
            self.fstype,
            self.source,
            self.mount_point
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "\
22 1 254:1 / / rw,relatime shared:1 - ext4 /dev/vda1 rw,errors=remount-ro
25 22 0:21 / /proc rw,nosuid shared:12 - proc proc rw
26 22 0:23 / /dev/shm rw,nosuid,nodev shared:3 - tmpfs tmpfs rw
40 22 254:1 /srv/data /mnt/my\\040data rw,relatime - ext4 /dev/vda1 rw
41 22 8:16 / /var/lib/big rw,noatime shared:20 master:1 - xfs /dev/sdb rw,attr2
";

    #[test]
    fn the_mount_of_a_directory_is_found_by_device_and_longest_prefix() {
        let m = |maj, min, p: &str| parse_mountinfo(INFO, (maj, min), Path::new(p));
        assert_eq!(
            m(254, 1, "/var/tmp"),
            Some(("/".into(), "ext4".into(), "/dev/vda1".into()))
        );
        assert_eq!(
            m(254, 1, "/mnt/my data/x"),
            Some(("/mnt/my data".into(), "ext4".into(), "/dev/vda1".into()))
        );
        // Optional fields (shared:, master:) before the separator.
        assert_eq!(
            m(8, 16, "/var/lib/big/img"),
            Some(("/var/lib/big".into(), "xfs".into(), "/dev/sdb".into()))
        );
        assert_eq!(
            m(0, 23, "/dev/shm"),
            Some(("/dev/shm".into(), "tmpfs".into(), "tmpfs".into()))
        );
        assert_eq!(m(9, 9, "/"), None, "no mount of that device");
        assert_eq!(
            parse_mountinfo("garbage\n\n1 2", (0, 0), Path::new("/")),
            None
        );
        assert_eq!(unescape("a\\040b\\"), "a b\\");
    }

    #[test]
    fn probing_shm_and_tmp_names_their_filesystems() {
        let shm = Path::new("/dev/shm");
        if shm.is_dir() {
            let s = StorageDir::probe(shm).unwrap();
            assert_eq!(s.fstype, "tmpfs");
            assert!(s.tmpfs());
            assert!(
                s.describe().contains("tmpfs mapping used"),
                "{}",
                s.describe()
            );
        }
        let t = StorageDir::probe(&std::env::temp_dir()).unwrap();
        assert_ne!(t.fstype, "?", "{t:?}");
        assert!(t.describe().starts_with("images in /"), "{}", t.describe());
        let file = std::env::temp_dir().join(format!("ucrypt-storage-test-{}", std::process::id()));
        std::fs::write(&file, b"x").unwrap();
        let e = StorageDir::probe(&file);
        std::fs::remove_file(&file).unwrap();
        assert!(e.is_err(), "a file is not a directory");
    }
}
