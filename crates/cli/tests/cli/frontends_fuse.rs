//! `ucrypt open --export fuse`: the exported file as a loop device's backing
//! file with direct IO, an ext4 filesystem made and used through it, and
//! the result checked after close/reopen (fsck, checksums, ciphertext).

use crate::frontends_common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use frontends_common::{random_bytes, run, Vol};
use testutil::Capability::{DevFuse, LoopDevices, Root, Tool};
use testutil::LoopDevice;

const MIB: u64 = 1 << 20;

fn sha_tree(root: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            if rel == "lost+found" {
                continue;
            }
            if e.file_type().unwrap().is_dir() {
                stack.push(p);
            } else {
                // The content itself is the checksum input; compare whole.
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    out
}

struct Mount(std::path::PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

#[test]
fn loop_direct_io_ext4_survives_close_and_reopen() {
    let needs = [
        Tool("losetup"),
        Tool("mkfs.ext4"),
        Tool("fsck.ext4"),
        Tool("mount"),
        Tool("umount"),
        Tool("fusermount3"),
        DevFuse,
        LoopDevices,
        Root,
    ];
    const T: &str = "loop_direct_io_ext4_survives_close_and_reopen";
    if !testutil::require_all(T, &needs) {
        return;
    }
    let mut vol = Vol::new("fe-fuse", 128 * MIB, 512);
    let out = vol.open(&["--export", "fuse"]);
    let file = vol.fuse_file();
    assert!(out.contains(&file.display().to_string()), "{out}");
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 128 * MIB);

    let mnt = vol.dir.join("mnt");
    std::fs::create_dir_all(&mnt).unwrap();
    let marker = b"UCRYPT-PLAINTEXT-MARKER-".repeat(200);
    let written;
    {
        let Some(lo) = LoopDevice::attach(T, &file, &["--direct-io=on"]) else {
            return;
        };
        // DIO column of `losetup -l`: direct IO really is on.
        let o = run(Command::new("losetup").args(["-l", "-n", "-O", "DIO", lo.path()]));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout).trim(),
            "1",
            "loop device is not using direct IO"
        );
        run(Command::new("mkfs.ext4").args(["-q", "-F", lo.path()]));
        run(Command::new("mount").arg(lo.path()).arg(&mnt));
        let m = Mount(mnt.clone());
        // A tree of files: nested dirs, small and large, random and marker.
        for d in 0..4 {
            let dir = mnt.join(format!("dir{d}/sub{d}"));
            std::fs::create_dir_all(&dir).unwrap();
            for f in 0..8 {
                let len = 1usize << (9 + (d * 8 + f) % 12);
                std::fs::write(
                    dir.join(format!("f{f}.bin")),
                    random_bytes(len + f, (d * 100 + f) as u64),
                )
                .unwrap();
            }
        }
        std::fs::write(mnt.join("big.bin"), random_bytes(8 << 20, 42)).unwrap();
        std::fs::write(mnt.join("marker.txt"), &marker).unwrap();
        run(&mut Command::new("sync"));
        written = sha_tree(&mnt);
        // close while the loop device holds the file: refused, still serving.
        let o = vol.ucrypt(&["close", &vol.name.clone()]);
        assert_eq!(o.status.code(), Some(5), "close of a busy export must fail");
        assert!(std::fs::metadata(mnt.join("big.bin")).is_ok());
        drop(m);
        drop(lo);
    }
    vol.close();
    assert!(!file.exists(), "close left the FUSE file mounted");

    // Ciphertext at rest: the marker text appears nowhere in the backing file.
    let raw = std::fs::read(&vol.image).unwrap();
    assert!(
        !raw.windows(24).any(|w| w == &marker[..24]),
        "plaintext found in the backing file"
    );

    vol.open(&["--export", "fuse"]);
    let o = run(Command::new("fsck.ext4").arg("-fn").arg(&file));
    assert!(
        o.status.success(),
        "fsck: {}",
        String::from_utf8_lossy(&o.stdout)
    );
    {
        let Some(lo) = LoopDevice::attach(T, &file, &["--direct-io=on", "--read-only"]) else {
            return;
        };
        run(Command::new("mount")
            .args(["-o", "ro"])
            .arg(lo.path())
            .arg(&mnt));
        let m = Mount(mnt.clone());
        let read = sha_tree(&mnt);
        assert_eq!(read.len(), written.len());
        for (k, v) in &written {
            assert!(
                read.get(k) == Some(v),
                "file {k} changed across close/reopen"
            );
        }
        drop(m);
        drop(lo);
    }
    // The decrypted export (and the oracle's decryption of the backing
    // file, when available) hold the same ext4 image.
    let plain = std::fs::read(&file).unwrap();
    assert_eq!(
        &plain[1024 + 56..1024 + 58],
        &[0x53, 0xef],
        "no ext4 superblock magic"
    );
    vol.close();
    if testutil::require_python_module("loop_direct_io_ext4_oracle", "cryptography") {
        assert!(
            vol.oracle_decrypt() == plain,
            "oracle decryption differs from the FUSE export"
        );
    }
}

#[test]
fn fuse_file_semantics() {
    if !testutil::require_all("fuse_file_semantics", &[Tool("fusermount3"), DevFuse]) {
        return;
    }
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut vol = Vol::new("fe-fsem", 4 * MIB, 4096);
    vol.open(&["--export", "fuse"]);
    let file = vol.fuse_file();
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&file)
        .unwrap();
    // Unaligned write/read (read-modify-write of 4096-byte sectors).
    f.seek(SeekFrom::Start(4093)).unwrap();
    f.write_all(b"hello, sectors").unwrap();
    f.sync_all().unwrap();
    let mut b = [0u8; 14];
    f.seek(SeekFrom::Start(4093)).unwrap();
    f.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"hello, sectors");
    // Writes at the end are short, past the end fail; the size never changes.
    f.seek(SeekFrom::Start(4 * MIB - 3)).unwrap();
    assert_eq!(f.write(b"abcdef").unwrap(), 3);
    f.seek(SeekFrom::Start(4 * MIB)).unwrap();
    assert!(f.write(b"x").is_err());
    assert!(f.set_len(MIB).is_err(), "truncate must be refused");
    assert_eq!(std::fs::metadata(&file).unwrap().len(), 4 * MIB);
    drop(f);
    // SIGTERM: flush, unmount, remove the mountpoint, socket and pid file.
    let pid = vol.pid().unwrap();
    run(Command::new("kill").args(["-TERM", &pid.to_string()]));
    // The pid file goes before the mountpoint: wait for both.
    let mnt = file.parent().unwrap();
    testutil::wait_until(
        std::time::Duration::from_secs(60),
        "SIGTERM to stop the daemon and remove its mountpoint",
        || vol.pid().is_none() && !mnt.exists(),
    );
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    assert!(
        !mounts.contains(&mnt.display().to_string()),
        "still mounted after SIGTERM"
    );
    // What was written before the signal is on disk: reopen and read back.
    vol.open(&["--export", "fuse"]);
    let mut b = [0u8; 14];
    let mut f = std::fs::File::open(&file).unwrap();
    f.seek(SeekFrom::Start(4093)).unwrap();
    f.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"hello, sectors");
    drop(f);
    vol.close();
}

/// Sets the fuse module's `enable_uring` for one test and puts the old
/// value back; the tests that touch it run one at a time.
struct UringParam {
    old: String,
    _one: std::sync::MutexGuard<'static, ()>,
}

const URING_PARAM: &str = "/sys/module/fuse/parameters/enable_uring";
static URING_ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

impl UringParam {
    /// `None` (the test skips) when the parameter cannot be set.
    fn set(test: &str, on: bool) -> Option<Self> {
        let one = URING_ONE.lock().unwrap_or_else(|e| e.into_inner());
        let needs = [Tool("fusermount3"), DevFuse, testutil::Capability::IoUring];
        if !testutil::require_all(test, &needs) {
            return None;
        }
        let Ok(old) = std::fs::read_to_string(URING_PARAM) else {
            testutil::skip_kernel(test, "the fuse module has no enable_uring parameter");
            return None;
        };
        if std::fs::write(URING_PARAM, if on { "1" } else { "0" }).is_err() {
            testutil::skip(test, "cannot set enable_uring (needs root)");
            return None;
        }
        Some(Self {
            old: old.trim().to_owned(),
            _one: one,
        })
    }
}

impl Drop for UringParam {
    fn drop(&mut self) {
        let v = if self.old == "Y" { "1" } else { "0" };
        std::fs::write(URING_PARAM, v).expect("restore enable_uring");
    }
}

/// `status`'s FUSE line: (transport, requests over the ring).
fn fuse_status(vol: &Vol) -> (String, u64) {
    let o = vol.ucrypt(&["status", &vol.name]);
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(o.status.success(), "status: {text}");
    let line = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("fuse:"))
        .unwrap_or_else(|| panic!("no fuse line in status: {text}"))
        .trim()
        .to_owned();
    // "transport io_uring, 12 requests over the ring"
    let (t, rest) = line
        .strip_prefix("transport ")
        .and_then(|l| l.split_once(", "))
        .unwrap_or_else(|| panic!("bad fuse line: {line}"));
    let n = rest.split(' ').next().unwrap().parse().unwrap();
    (t.to_owned(), n)
}

/// Writes through the FUSE file with O_DIRECT (aligned), buffered
/// unaligned O_SYNC writes and fsync, reading each back through the
/// mount; `model` is the device before, and what it must hold after.
fn write_every_way(file: &Path, model: &mut [u8]) {
    use std::io::{Read, Seek, SeekFrom, Write};
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let direct = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(file)
        .unwrap();
    // A 4096-aligned window of a larger buffer, as O_DIRECT needs.
    let mut raw = vec![0u8; (1 << 20) + 4096];
    let at = (4096 - raw.as_ptr() as usize % 4096) % 4096;
    for (off, len) in [(0u64, 4096usize), (8192, 65536), (MIB, 1 << 20)] {
        let data = random_bytes(len, off ^ 0xd1);
        raw[at..at + len].copy_from_slice(&data);
        direct.write_all_at(&raw[at..at + len], off).unwrap();
        model[off as usize..off as usize + len].copy_from_slice(&data);
        raw[at..at + len].fill(0);
        direct.read_exact_at(&mut raw[at..at + len], off).unwrap();
        assert!(raw[at..at + len] == data[..], "O_DIRECT read back at {off}");
    }
    direct.sync_all().unwrap();
    drop(direct);
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_SYNC)
        .open(file)
        .unwrap();
    for (off, len) in [(100u64, 7usize), (4090, 300), (3 * MIB + 513, 70_000)] {
        let data = random_bytes(len, off ^ 0xb0);
        f.seek(SeekFrom::Start(off)).unwrap();
        f.write_all(&data).unwrap();
        model[off as usize..off as usize + len].copy_from_slice(&data);
    }
    f.sync_all().unwrap();
    let mut all = Vec::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_end(&mut all).unwrap();
    if let Some(i) = (0..model.len()).find(|&i| all.get(i) != Some(&model[i])) {
        panic!(
            "buffered read through the mount differs from byte {i}: read {:?}, written {:?}",
            &all[i.saturating_sub(4)..(i + 8).min(all.len())],
            &model[i.saturating_sub(4)..i + 8]
        );
    }
}

/// What `map --read` of the closed volume gives: the device as ucrypt
/// reads it without FUSE.
fn map_read(vol: &Vol) -> Vec<u8> {
    let o = vol.ucrypt(&["map", "--read", "--table", &vol.table()]);
    assert!(
        o.status.success(),
        "map --read: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o.stdout
}

#[test]
fn fuse_over_io_uring_carries_the_requests_and_map_reads_them_back() {
    const T: &str = "fuse_over_io_uring_carries_the_requests_and_map_reads_them_back";
    let Some(_param) = UringParam::set(T, true) else {
        return;
    };
    let size = 8 * MIB;
    let mut vol = Vol::new("fe-furing", size, 512);
    // A sparse image decrypts to noise: the model starts from it.
    let mut model = map_read(&vol);
    vol.open(&["--export", "fuse,uring=on"]);
    let (transport, before) = fuse_status(&vol);
    assert_eq!(transport, "io_uring");
    write_every_way(&vol.fuse_file(), &mut model);
    let (_, after) = fuse_status(&vol);
    assert!(
        after > before + 20,
        "the writes did not go over the ring ({before} -> {after})"
    );
    vol.close();
    assert!(
        map_read(&vol) == model,
        "map --read differs from what was written"
    );
    assert!(vol.oracle_decrypt() == model, "the oracle differs");
}

#[test]
fn fuse_over_dev_fuse_when_asked_or_when_the_kernel_says_no() {
    const T: &str = "fuse_over_dev_fuse_when_asked_or_when_the_kernel_says_no";
    let size = 8 * MIB;
    {
        let Some(_param) = UringParam::set(T, true) else {
            return;
        };
        // The default is /dev/fuse even when the kernel offers the ring.
        let mut vol = Vol::new("fe-fuoff", size, 512);
        let mut model = map_read(&vol);
        vol.open(&["--export", "fuse"]);
        assert_eq!(fuse_status(&vol), ("dev-fuse".to_owned(), 0));
        write_every_way(&vol.fuse_file(), &mut model);
        assert_eq!(fuse_status(&vol).1, 0, "the default used the ring");
        vol.close();
        assert!(
            map_read(&vol) == model,
            "map --read differs from what was written"
        );
    }
    let Some(_param) = UringParam::set(T, false) else {
        return;
    };
    let mut vol = Vol::new("fe-funo", size, 512);
    // uring=on without the kernel's consent: a clear error, nothing served.
    let table = vol.table();
    let image = vol.image.display().to_string();
    let o = vol.ucrypt(&[
        "open",
        "--type",
        "plain",
        "--table",
        &table,
        "--export",
        "fuse,uring=on",
        &image,
        &vol.name,
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "uring=on opened without enable_uring");
    assert!(err.contains("enable_uring is off"), "{err}");
    assert!(vol.pid().is_none(), "a daemon stayed behind");
    assert!(!vol.fuse_file().exists());
    // auto: served over /dev/fuse.
    let mut model = map_read(&vol);
    vol.open(&["--export", "fuse"]);
    assert_eq!(fuse_status(&vol), ("dev-fuse".to_owned(), 0));
    write_every_way(&vol.fuse_file(), &mut model);
    vol.close();
    assert!(
        map_read(&vol) == model,
        "map --read differs from what was written"
    );
}
