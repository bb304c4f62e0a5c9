//! A file on tmpfs lends its pages (`Backend::direct`) through a shared
//! mapping: what is lent is the file (both ways, coherent with `pread` and
//! with another open of the file), only tmpfs and the automatic engine
//! lend, and a mapping that faults (the file truncated under it, a full
//! tmpfs) fails the request with an error instead of killing the process,
//! after which the syscalls report the real error.

use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use testutil::{Capability, Rng, TempDir};
use ucrypt_backend::{Backend, Direct, FileBackend, FileOptions, IoEngine};

fn file_with(dir: &TempDir, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

fn shm(test: &str) -> Option<TempDir> {
    testutil::require(test, Capability::ShmTmpfs)
        .then(|| TempDir::new_in(Path::new("/dev/shm"), test))
}

fn lent(b: &FileBackend) -> u64 {
    let p = b.io_path();
    p.counters
        .iter()
        .find(|(n, _)| *n == "lent")
        .map_or(0, |c| c.1)
}

fn direct(b: &FileBackend) -> &dyn Direct {
    b.direct().expect("a file on tmpfs lends its pages")
}

/// Reads `offset..offset+len` through `read_with`, checking the pieces
/// come in order and cover the range.
fn read_lent(b: &FileBackend, offset: u64, len: u64) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    direct(b).read_with(offset, len, &mut |at, piece| {
        assert_eq!(at, out.len(), "pieces in order");
        out.extend_from_slice(piece);
    })?;
    assert_eq!(out.len() as u64, len);
    Ok(out)
}

fn write_lent(b: &FileBackend, offset: u64, data: &[u8]) -> io::Result<()> {
    direct(b).write_with(offset, data.len() as u64, false, &mut |at, piece| {
        let n = piece.len();
        piece.copy_from_slice(&data[at..at + n]);
    })
}

#[test]
fn a_file_on_tmpfs_lends_its_own_pages() {
    let test = "a_file_on_tmpfs_lends_its_own_pages";
    let Some(dir) = shm(test) else { return };
    let mut rng = Rng::new(14);
    let mut content = vec![0u8; 6 << 20];
    rng.fill(&mut content);
    let path = file_with(&dir, "img", &content);
    let b = FileBackend::open(&path, &FileOptions::default()).unwrap();
    assert!(b.is_mapped());

    // Read: the file's bytes, lent in pieces over the 2 MiB lock batch.
    assert_eq!(read_lent(&b, 0, content.len() as u64).unwrap(), content);
    assert_eq!(
        read_lent(&b, 4096 * 3 + 512, 5000).unwrap(),
        &content[12800..17800]
    );

    // Write 3 MiB + 1 KiB at an unaligned offset: pread, the file through
    // another open, and a later lend all see it.
    let mut new = vec![0u8; (3 << 20) + 1024];
    rng.fill(&mut new);
    let at = 4096 * 100 + 1536;
    write_lent(&b, at, &new).unwrap();
    content[at as usize..at as usize + new.len()].copy_from_slice(&new);
    let mut back = vec![0u8; content.len()];
    b.read_at(&mut back, 0).unwrap();
    assert!(back == content, "pread sees the lent write");
    assert!(
        std::fs::read(&path).unwrap() == content,
        "the file holds the lent write"
    );
    // And a pwrite is seen through the mapping.
    b.write_at(&[0x5a; 4096], 8192, false).unwrap();
    assert_eq!(read_lent(&b, 8192, 4096).unwrap(), vec![0x5a; 4096]);
    assert!(lent(&b) >= 4, "lent requests counted: {}", lent(&b));

    // Outside the device: refused before anything is lent.
    let e = direct(&b)
        .read_with(content.len() as u64 - 512, 1024, &mut |_, _| {
            panic!("lent out of range")
        })
        .unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);

    // Read-only: lends to read, refuses to write.
    drop(b);
    let ro = FileBackend::open(
        &path,
        &FileOptions {
            read_only: true,
            ..FileOptions::default()
        },
    )
    .unwrap();
    assert_eq!(read_lent(&ro, 8192, 4096).unwrap(), vec![0x5a; 4096]);
    let e = write_lent(&ro, 0, &[1; 512]).unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
}

/// Bytes the file holds in memory (`st_blocks`).
fn allocated(path: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).unwrap().blocks() * 512
}

#[test]
fn holes_are_read_without_filling_them() {
    let test = "holes_are_read_without_filling_them";
    let Some(dir) = shm(test) else { return };
    let path = dir.join("sparse");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let b = FileBackend::open(&path, &FileOptions::default()).unwrap();
    assert!(b.is_mapped());
    // A read of the whole sparse file: zeroes, through pread, nothing
    // allocated (a fault on the mapping would fill every hole).
    assert!(read_lent(&b, 0, 64 << 20).unwrap().iter().all(|&x| x == 0));
    assert_eq!(allocated(&path), 0, "a read filled holes");
    assert_eq!(lent(&b), 0, "a hole was lent");

    // Written through the mapping: lent again, to read as well.
    write_lent(&b, 1 << 20, &[4u8; 256 << 10]).unwrap();
    assert_eq!(lent(&b), 1);
    assert_eq!(
        read_lent(&b, 1 << 20, 256 << 10).unwrap(),
        vec![4u8; 256 << 10]
    );
    assert_eq!(lent(&b), 2);
    // Half data, half hole: pread.
    assert!(read_lent(&b, (1 << 20) + (128 << 10), 256 << 10).is_ok());
    assert_eq!(lent(&b), 2);
    assert_eq!(
        allocated(&path),
        256 << 10,
        "only the written pages are allocated"
    );

    // Data that another writer put there is found by a probe.
    b.write_at(&[6u8; 8192], 8 << 20, false).unwrap();
    assert_eq!(read_lent(&b, 8 << 20, 8192).unwrap(), vec![6u8; 8192]);
    assert_eq!(lent(&b), 3);

    // A discard punches the pages out: they are read with pread again.
    b.discard(1 << 20, 256 << 10).unwrap();
    assert!(read_lent(&b, 1 << 20, 256 << 10)
        .unwrap()
        .iter()
        .all(|&x| x == 0));
    assert_eq!(lent(&b), 3);
    assert_eq!(allocated(&path), 8192);
}

#[test]
fn only_tmpfs_with_the_automatic_engine_lends() {
    let test = "only_tmpfs_with_the_automatic_engine_lends";
    let Some(dir) = shm(test) else { return };
    let path = file_with(&dir, "img", &[7u8; 1 << 20]);
    for engine in [IoEngine::Syscalls, IoEngine::Uring] {
        if engine == IoEngine::Uring && !testutil::require(test, Capability::IoUring) {
            continue;
        }
        let o = FileOptions {
            engine: Some(engine),
            ..FileOptions::default()
        };
        let b = FileBackend::open(&path, &o).unwrap();
        assert!(
            !b.is_mapped() && b.direct().is_none(),
            "{engine:?} keeps its syscalls"
        );
    }
    let auto = FileOptions {
        engine: Some(IoEngine::Auto),
        ..FileOptions::default()
    };
    assert!(FileBackend::open(&path, &auto).unwrap().is_mapped());
    // A file elsewhere (the temp dir), when that is not a tmpfs.
    let other = TempDir::new(test);
    if Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(other.path())
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() != "tmpfs")
    {
        let p = file_with(&other, "img", &[7u8; 1 << 20]);
        let b = FileBackend::open(&p, &FileOptions::default()).unwrap();
        assert!(!b.is_mapped() && b.direct().is_none(), "only tmpfs lends");
    }
}

#[test]
fn a_file_truncated_under_the_mapping_fails_the_request_not_the_process() {
    let test = "a_file_truncated_under_the_mapping_fails_the_request_not_the_process";
    let Some(dir) = shm(test) else { return };
    for faulting in ["read", "write"] {
        let path = file_with(&dir, faulting, &[3u8; 1 << 20]);
        let b = FileBackend::open(&path, &FileOptions::default()).unwrap();
        assert_eq!(read_lent(&b, 0, 4096).unwrap(), vec![3u8; 4096]);
        // Read once, so these pages are known to hold data.
        assert_eq!(read_lent(&b, 512 << 10, 8192).unwrap(), vec![3u8; 8192]);

        // Someone else cuts the file to 64 KiB: the mapping past it faults.
        std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(64 << 10)
            .unwrap();
        let e = match faulting {
            "read" => read_lent(&b, 512 << 10, 8192).unwrap_err(),
            _ => write_lent(&b, 768 << 10, &[9u8; 8192]).unwrap_err(),
        };
        assert!(e.to_string().contains("SIGBUS"), "{faulting}: {e}");
        assert_eq!(e.raw_os_error(), None);
        assert_eq!(
            ucrypt_backend::raw_os_error(&e),
            Some(libc::EIO),
            "{faulting}"
        );

        // From now on nothing is lent: the syscalls say what is wrong (the
        // device ends early), and what lies inside the file still reads.
        let before = lent(&b);
        let e = read_lent(&b, 512 << 10, 8192).unwrap_err();
        assert!(e.to_string().contains("Short read"), "{faulting}: {e}");
        assert_eq!(read_lent(&b, 0, 4096).unwrap(), vec![3u8; 4096]);
        assert_eq!(lent(&b), before, "{faulting}: nothing lent after a fault");
    }
}

#[test]
fn a_full_tmpfs_fails_the_write_not_the_process() {
    let test = "a_full_tmpfs_fails_the_write_not_the_process";
    if !testutil::require_all(test, &[Capability::Root, Capability::Tool("mount")]) {
        return;
    }
    let dir = TempDir::new(test);
    let mnt = dir.join("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let o = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
        .arg(&mnt)
        .output()
        .unwrap();
    if !o.status.success() {
        // Root without the right to mount (a container): a limit of the
        // machine, not of ucrypt.
        let why = format!(
            "cannot mount a tmpfs here: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        );
        testutil::skip_kernel(test, &why);
        return;
    }
    struct Umount(PathBuf);
    impl Drop for Umount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _u = Umount(mnt.clone());
    // A sparse 4 MiB file on a 256 KiB filesystem.
    let path = mnt.join("img");
    std::fs::File::create(&path)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    let b = FileBackend::open(&path, &FileOptions::default()).unwrap();
    assert!(b.is_mapped());
    write_lent(&b, 0, &[1u8; 64 << 10]).unwrap();
    let e = write_lent(&b, 1 << 20, &[2u8; 1 << 20]).unwrap_err();
    assert!(e.to_string().contains("SIGBUS"), "{e}");
    // The syscalls now report the filesystem's own error.
    let e = write_lent(&b, 2 << 20, &[2u8; 1 << 20]).unwrap_err();
    assert_eq!(ucrypt_backend::raw_os_error(&e), Some(libc::ENOSPC), "{e}");
    // What was written before the fault is there.
    let mut back = vec![0u8; 64 << 10];
    b.read_at(&mut back, 0).unwrap();
    assert!(back.iter().all(|&x| x == 1));
    drop(b);
}
