//! Misuse rows: devices, and header verbs under a live volume.
//!
//! A block device in use (mounted, mapped, served by a ucrypt daemon) is
//! refused as dm-crypt's table load refuses it: `open` (read-only too),
//! `map --write` and the header-replacing verbs claim it exclusively and
//! get cryptsetup's "Cannot use device … which is in use (already mapped
//! or mounted).", exit 5. A file a daemon serves is refused to those
//! verbs through the daemon's lock. Keyslot verbs still work on a volume
//! in use, as cryptsetup's do.

use std::path::{Path, PathBuf};
use std::process::Command;

use testutil::Capability::{LoopDevices, Root, Tool};
use testutil::{Capability, LoopDevice};

use super::harness::{text, Case, Expect, Outcome, Row};

/// Size of the loop devices' backing files.
const DISK: u64 = 32 << 20;

/// What the block-device rows need.
const LOOP: &[Capability<'static>] = &[Root, LoopDevices, Tool("losetup")];

/// What the rows with a mounted ext4 need.
const MOUNTED: &[Capability<'static>] = &[
    Root,
    LoopDevices,
    Tool("losetup"),
    Tool("mkfs.ext4"),
    Tool("mount"),
    Tool("umount"),
];

/// cryptsetup's refusal of a device in use.
const IN_USE: &str = "which is in use (already mapped or mounted).";

/// A plain table over the first MiB of `dev`, its key taken from
/// `--key-file` (so no key warning hides the refusal in the report).
fn table(dev: &str) -> String {
    format!("0 2048 crypt aes-xts-plain64 - 0 {dev} 0")
}

/// The raw 64-byte key file for [`table`], in the case's directory.
fn key_file(c: &Case) -> String {
    let p = c.path("plain.key");
    let key: Vec<u8> = (0..64u8).map(|i| i.wrapping_mul(37) ^ 0x5c).collect();
    std::fs::write(&p, key).expect("key file");
    p.to_str().expect("UTF-8 path").to_owned()
}

/// `open --type plain --table` arguments for `dev` as `name`.
fn plain_open(c: &Case, dev: &str, name: &str, extra: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = ["open", "--type", "plain", "--table", &table(dev)]
        .iter()
        .map(|s| s.to_string())
        .collect();
    a.extend(["--key-file".to_owned(), key_file(c)]);
    a.extend(extra.iter().map(|s| s.to_string()));
    a.extend([dev.to_owned(), name.to_owned()]);
    a
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// Unmounts its mountpoint when dropped (the row's end).
struct Mount(PathBuf);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A loop device over a patterned `DISK`-byte file of the case (kept
/// until the row ends); `None` when losetup cannot attach here.
fn loop_device(c: &mut Case, name: &str) -> Option<(PathBuf, String)> {
    let img = c.image(name, DISK);
    let lo = LoopDevice::attach("misuse::devices", &img, &[])?;
    let dev = lo.path().to_owned();
    c.keep(lo);
    Some((img, dev))
}

/// A loop device holding a mounted ext4 (unmounted, then detached, when
/// the row ends): its backing file and device. Made with no lazy
/// initialisation and synced, so nothing writes to it while it sits.
fn mounted_ext4(c: &mut Case) -> Option<(PathBuf, String)> {
    let img = c.image("disk.img", DISK);
    let lo = LoopDevice::attach("misuse::devices", &img, &[])?;
    let dev = lo.path().to_owned();
    let mkfs = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-E", "lazy_itable_init=0,lazy_journal_init=0"])
        .arg(&dev)
        .output()
        .expect("run mkfs.ext4");
    assert!(mkfs.status.success(), "mkfs.ext4: {}", text(&mkfs));
    let mnt = c.path("mnt");
    std::fs::create_dir_all(&mnt).expect("mountpoint");
    let m = Command::new("mount")
        .arg(&dev)
        .arg(&mnt)
        .output()
        .expect("run mount");
    assert!(m.status.success(), "mount: {}", text(&m));
    std::fs::write(mnt.join("precious.txt"), b"data a user keeps here\n").expect("write");
    let sync = Command::new("sync").status().expect("run sync");
    assert!(sync.success());
    // Dropped in this order: unmounted first, then detached.
    c.keep(Mount(mnt));
    c.keep(lo);
    Some((img, dev))
}

/// A LUKS image of `size` bytes (type `luks1` or `luks2`, fast pbkdf2)
/// and its passphrase file.
fn luks(c: &Case, name: &str, size: u64, luks_type: &str) -> (PathBuf, PathBuf) {
    let img = c.image(name, size);
    let key = c.path(&format!("{name}.key"));
    std::fs::write(&key, "correct horse").expect("key file");
    let o = c.ucrypt(&[
        "luksFormat",
        "-q",
        "--type",
        luks_type,
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        "--key-file",
        s(&key),
        s(&img),
    ]);
    assert!(o.status.success(), "luksFormat: {}", text(&o));
    (img, key)
}

/// `luks(...)` served by a daemon as `v` (read-write, the default
/// export), watched.
fn served(c: &mut Case, luks_type: &str) -> (PathBuf, PathBuf) {
    let (img, key) = luks(c, "vol.img", 20 << 20, luks_type);
    c.open_ok(&["open", "--key-file", s(&key), s(&img), "v"], "v");
    c.watch(&img);
    (img, key)
}

/// A patterned MiB of plaintext.
fn plaintext() -> Vec<u8> {
    let mut b = vec![0u8; 1 << 20];
    testutil::Rng::new(0xda7a).fill(&mut b);
    b
}

/// This area's rows.
pub fn rows() -> Vec<Row> {
    vec![
        Row {
            what: "open of a mounted block device",
            needs: MOUNTED,
            expect: Expect::Exit(5, IN_USE),
            case: |c: &mut Case| {
                let Some((img, dev)) = mounted_ext4(c) else {
                    return Outcome::skipped("losetup cannot attach here");
                };
                c.watch(&img);
                c.served("v");
                c.ucrypt(&args(&plain_open(c, &dev, "v", &[]))).into()
            },
        },
        Row {
            what: "read-only open of a mounted block device (cryptsetup refuses it too)",
            needs: MOUNTED,
            expect: Expect::Exit(5, IN_USE),
            case: |c: &mut Case| {
                let Some((img, dev)) = mounted_ext4(c) else {
                    return Outcome::skipped("losetup cannot attach here");
                };
                c.watch(&img);
                c.served("v");
                c.ucrypt(&args(&plain_open(c, &dev, "v", &["--readonly"])))
                    .into()
            },
        },
        Row {
            what: "map --write onto a mounted block device",
            needs: MOUNTED,
            expect: Expect::Exit(5, IN_USE),
            case: |c: &mut Case| {
                let Some((img, dev)) = mounted_ext4(c) else {
                    return Outcome::skipped("losetup cannot attach here");
                };
                c.watch(&img);
                let (t, k) = (table(&dev), key_file(c));
                c.ucrypt_in(
                    &["map", "--write", "--table", &t, "--key-file", &k],
                    Some(&plaintext()),
                )
                .into()
            },
        },
        Row {
            what: "one block device opened under two names",
            needs: LOOP,
            expect: Expect::Exit(5, IN_USE),
            case: |c: &mut Case| {
                let Some((img, dev)) = loop_device(c, "disk.img") else {
                    return Outcome::skipped("losetup cannot attach here");
                };
                c.open_ok(&args(&plain_open(c, &dev, "v1", &[])), "v1");
                c.watch(&img);
                c.served("v2");
                c.ucrypt(&args(&plain_open(c, &dev, "v2", &[]))).into()
            },
        },
        Row {
            what: "luksFormat of a mounted block device",
            needs: MOUNTED,
            expect: Expect::Exit(5, IN_USE),
            case: |c: &mut Case| {
                let Some((img, dev)) = mounted_ext4(c) else {
                    return Outcome::skipped("losetup cannot attach here");
                };
                c.watch(&img);
                let key = c.path("new.key");
                std::fs::write(&key, "new").expect("key file");
                let mut a: Vec<&str> = testutil::FAST_LUKS2_FORMAT.to_vec();
                a.extend(["--key-file", s(&key), &dev]);
                c.ucrypt(&a).into()
            },
        },
        Row {
            what: "luksFormat --force of a block device a daemon serves",
            needs: LOOP,
            expect: Expect::Exit(5, IN_USE),
            case: |c: &mut Case| {
                let Some((img, dev)) = loop_device(c, "disk.img") else {
                    return Outcome::skipped("losetup cannot attach here");
                };
                let key = c.path("disk.key");
                std::fs::write(&key, "old").expect("key file");
                let mut a: Vec<&str> = testutil::FAST_LUKS2_FORMAT.to_vec();
                a.extend(["--key-file", s(&key), &dev]);
                let o = c.ucrypt(&a);
                assert!(o.status.success(), "luksFormat: {}", text(&o));
                c.open_ok(&["open", "--key-file", s(&key), &dev, "v"], "v");
                c.watch(&img);
                let mut a: Vec<&str> = testutil::FAST_LUKS2_FORMAT.to_vec();
                a.extend(["--force", "--key-file", s(&key), &dev]);
                c.ucrypt(&a).into()
            },
        },
        Row {
            what: "luksFormat --force of a file a daemon serves",
            needs: &[],
            expect: Expect::Exit(5, IN_USE),
            case: |c: &mut Case| {
                let (img, key) = served(c, "luks2");
                let mut a: Vec<&str> = testutil::FAST_LUKS2_FORMAT.to_vec();
                a.extend(["--force", "--key-file", s(&key), s(&img)]);
                c.ucrypt(&a).into()
            },
        },
        Row {
            what: "luksHeaderRestore of another volume's header onto a served volume",
            needs: &[],
            expect: Expect::Exit(5, IN_USE),
            case: |c: &mut Case| {
                let (other, _) = luks(c, "other.img", 20 << 20, "luks2");
                let backup = c.path("other.hdr");
                let o = c.ucrypt(&[
                    "luksHeaderBackup",
                    s(&other),
                    "--header-backup-file",
                    s(&backup),
                ]);
                assert!(o.status.success(), "luksHeaderBackup: {}", text(&o));
                let (img, _) = served(c, "luks2");
                c.ucrypt(&[
                    "luksHeaderRestore",
                    "-q",
                    s(&img),
                    "--header-backup-file",
                    s(&backup),
                ])
                .into()
            },
        },
        Row {
            what: "erase of a served volume",
            needs: &[],
            expect: Expect::Exit(5, IN_USE),
            case: |c: &mut Case| {
                let (img, _) = served(c, "luks2");
                c.ucrypt(&["erase", "-q", s(&img)]).into()
            },
        },
        Row {
            what: "convert of a served volume",
            needs: &[],
            expect: Expect::Exit(5, "Cannot convert device"),
            case: |c: &mut Case| {
                let (img, _) = served(c, "luks1");
                c.ucrypt(&["convert", "-q", "--type", "luks2", s(&img)])
                    .into()
            },
        },
        Row {
            what: "luksAddKey on a served volume still works and loses nothing",
            needs: &[],
            expect: Expect::Survives,
            case: added_key_on_a_served_volume,
        },
    ]
}

/// luksAddKey on a volume a daemon serves read-write: it works (exit 0,
/// as cryptsetup on an active device), the data area is untouched, and
/// the new passphrase decrypts the data written before.
fn added_key_on_a_served_volume(c: &mut Case) -> Outcome {
    let (img, key) = luks(c, "vol.img", 20 << 20, "luks2");
    let plain = plaintext();
    let w = c.ucrypt_in(
        &["map", "--write", "--luks", s(&img), "--key-file", s(&key)],
        Some(&plain),
    );
    assert!(w.status.success(), "map --write: {}", text(&w));
    // The header's keyslot area changes; the data area must not.
    let data_at = |img: &Path| std::fs::read(img).expect("read image")[16 << 20..].to_vec();
    let before = data_at(&img);
    c.open_ok(&["open", "--key-file", s(&key), s(&img), "v"], "v");
    let new_key = c.path("new.key");
    std::fs::write(&new_key, "battery staple").expect("key file");
    let add = c.ucrypt(&["luksAddKey", "-q", s(&img), "-d", s(&key), s(&new_key)]);
    assert_eq!(add.status.code(), Some(0), "luksAddKey: {}", text(&add));
    let close = c.ucrypt(&["close", "v"]);
    assert!(close.status.success(), "close: {}", text(&close));
    assert!(data_at(&img) == before, "the data area changed");
    let r = c.ucrypt(&[
        "map",
        "--read",
        "--luks",
        s(&img),
        "--key-file",
        s(&new_key),
    ]);
    assert!(r.status.success(), "map --read: {}", text(&r));
    assert!(
        r.stdout[..plain.len()] == plain[..],
        "the new passphrase does not decrypt what was written"
    );
    add.into()
}
