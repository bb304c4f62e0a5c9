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
