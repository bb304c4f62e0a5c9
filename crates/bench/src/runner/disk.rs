//! The block device under `--via file`'s file, and the requests it
//! completes around each repetition: `/sys/block/DEV/stat` before and
//! after, so a row shows the average request size the device saw (a 1 MiB
//! O_DIRECT read into scattered pages reaches a virtio disk as two 512 KiB
//! requests: `max_segments` is 254 there). The counters are the whole
//! device's, so other IO on it during a row counts too.
//!
//! ```text
//!   stat(file).st_dev ─► /sys/dev/block/MAJ:MIN ─(partition? parent)─► DEV/stat
//! ```

use std::path::{Path, PathBuf};

use super::DiskReqs;

/// The counters of one `stat` line this module uses (see the kernel's
/// Documentation/block/stat.rst: fields 1, 3, 5 and 7).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct DiskStat {
    /// Read requests completed.
    reads: u64,
    /// 512-byte sectors read.
    read_sectors: u64,
    /// Write requests completed.
    writes: u64,
    /// 512-byte sectors written.
    write_sectors: u64,
}

/// Parses a `/sys/block/DEV/stat` line (None: fewer than 7 numbers).
pub(super) fn parse_stat(line: &str) -> Option<DiskStat> {
    let f: Vec<u64> = line
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()
        .ok()?;
    (f.len() >= 7).then(|| DiskStat {
        reads: f[0],
        read_sectors: f[2],
        writes: f[4],
        write_sectors: f[6],
    })
}

impl DiskStat {
    /// Average KiB per request from `before` to `self`.
    pub(super) fn since(&self, before: &DiskStat) -> DiskReqs {
        let kib = |n: u64, sectors: u64| (n > 0).then(|| sectors as f64 / 2.0 / n as f64);
        DiskReqs {
            read_kib: kib(
                self.reads.saturating_sub(before.reads),
                self.read_sectors.saturating_sub(before.read_sectors),
            ),
            write_kib: kib(
                self.writes.saturating_sub(before.writes),
                self.write_sectors.saturating_sub(before.write_sectors),
            ),
        }
    }
}

/// glibc's `major` and `minor` of a `dev_t`.
fn major_minor(dev: u64) -> (u64, u64) {
    (
        ((dev >> 8) & 0xfff) | ((dev >> 32) & 0xffff_f000),
        (dev & 0xff) | ((dev >> 12) & 0xffff_ff00),
    )
}

/// The whole disk holding a file.
#[derive(Debug, Clone)]
pub(super) struct Disk {
    /// Its `stat` file.
    stat: PathBuf,
    /// Its name (`vda`).
    pub(super) name: String,
}

impl Disk {
    /// The disk under `path` (its parent disk for a partition); None on
    /// tmpfs, btrfs' anonymous devices and anything without a sysfs entry.
    pub(super) fn of(path: &Path) -> Option<Disk> {
        use std::os::unix::fs::MetadataExt;
        let (maj, min) = major_minor(std::fs::metadata(path).ok()?.dev());
        let mut dir = std::fs::canonicalize(format!("/sys/dev/block/{maj}:{min}")).ok()?;
        if dir.join("partition").exists() {
            dir = dir.parent()?.to_path_buf();
        }
        let stat = dir.join("stat");
        parse_stat(&std::fs::read_to_string(&stat).ok()?)?;
        Some(Disk {
            name: dir.file_name()?.to_string_lossy().into_owned(),
            stat,
        })
    }

    /// Its counters now (None: unreadable).
    pub(super) fn sample(&self) -> Option<DiskStat> {
        parse_stat(&std::fs::read_to_string(&self.stat).ok()?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_gives_request_sizes() {
        // A kernel 6.x line: 17 fields.
        let a = parse_stat(
            "   79615170   155122 2117636815 134844401 24918337   677702 2592211666 \
             11052951        0  3050652 146028549   366154       25 344803632   119827   153704    11369\n",
        )
        .unwrap();
        assert_eq!(
            a,
            DiskStat {
                reads: 79615170,
                read_sectors: 2117636815,
                writes: 24918337,
                write_sectors: 2592211666
            }
        );
        // 10 reads of 1 MiB (2048 sectors), 4 writes of 4 KiB, later.
        let b = DiskStat {
            reads: a.reads + 10,
            read_sectors: a.read_sectors + 10 * 2048,
            writes: a.writes + 4,
            write_sectors: a.write_sectors + 4 * 8,
        };
        assert_eq!(
            b.since(&a),
            DiskReqs {
                read_kib: Some(1024.0),
                write_kib: Some(4.0)
            }
        );
        assert_eq!(a.since(&a), DiskReqs::default(), "no requests: no size");
        assert_eq!(parse_stat("1 2 3"), None);
        assert_eq!(parse_stat("1 2 x 4 5 6 7"), None);
        // An 11-field line (kernels before 4.18).
        assert!(parse_stat("1 2 3 4 5 6 7 8 9 10 11").is_some());
        assert_eq!(major_minor(0xfe00), (254, 0));
        assert_eq!(major_minor(0x0803), (8, 3));
        // glibc's makedev for numbers past 12 and 8 bits.
        let (maj, min) = (0x1234u64, 0x56789u64);
        let dev =
            ((maj & 0xfff) << 8) | ((maj & !0xfff) << 32) | (min & 0xff) | ((min & !0xff) << 12);
        assert_eq!(major_minor(dev), (maj, min));
    }

    #[test]
    fn a_synced_write_shows_on_the_disk_under_the_file() {
        let dir = std::env::temp_dir();
        let path = dir.join(format!("ucrypt-disk-test-{}.img", std::process::id()));
        std::fs::write(&path, b"x").unwrap();
        let Some(disk) = Disk::of(&path) else {
            let _ = std::fs::remove_file(&path);
            let why = format!("{} is on no block device (tmpfs?)", dir.display());
            testutil::skip_kernel("a_synced_write_shows_on_the_disk_under_the_file", &why);
            return;
        };
        let before = disk.sample().unwrap();
        std::fs::write(&path, vec![0x5a; 4 << 20]).unwrap();
        std::fs::File::open(&path).unwrap().sync_all().unwrap();
        let d = disk.sample().unwrap().since(&before);
        std::fs::remove_file(&path).unwrap();
        let kib = d.write_kib.expect("the sync wrote to the disk");
        assert!(kib > 0.0 && kib <= 4096.0 * 4.0, "{} {kib}", disk.name);
    }
}
