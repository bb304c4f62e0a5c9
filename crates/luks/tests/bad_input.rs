//! Hostile and damaged volumes: wrong passphrases change nothing, a
//! corrupted primary LUKS2 header falls back to the secondary (with a
//! warning), both corrupted or truncated images fail cleanly, and JSON that
//! lies (with valid checksums) is refused before anything is allocated;
//! a header written by another process since it was loaded is not
//! overwritten, and a header write waits for the metadata lock.
//! Pure library tests: no external tools.

use std::path::{Path, PathBuf};

use luks::{ErrorKind, FormatOptions, KdfRequest, Volume};
use serde_json::Value;
use testutil::TempDir;
use ucrypt_luks as luks;

const PASS: &[u8] = b"hunter2";

fn fast(version: u32) -> FormatOptions {
    FormatOptions {
        version,
        kdf: KdfRequest {
            kind: "pbkdf2".into(),
            force_iterations: Some(1000),
            ..KdfRequest::default()
        },
        ..FormatOptions::default()
    }
}

fn image(dir: &TempDir, version: u32) -> PathBuf {
    let p = dir.join(&format!("v{version}.img"));
    std::fs::File::create(&p)
        .unwrap()
        .set_len(17 << 20)
        .unwrap();
    luks::format(&p, None, &fast(version), PASS).unwrap();
    p
}

fn digest(p: &Path) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(std::fs::read(p).unwrap()).to_vec()
}

/// Edits the JSON of both LUKS2 copies and re-seals their checksums, so
/// only the JSON validator stands between the lie and the code.
fn rewrite_json(p: &Path, edit: impl Fn(&mut Value)) {
    let mut img = std::fs::read(p).unwrap();
    for off in [0usize, 16384] {
        let area = &mut img[off..off + 16384];
        let end = area[4096..].iter().position(|&b| b == 0).unwrap();
        let mut v: Value = serde_json::from_slice(&area[4096..4096 + end]).unwrap();
        edit(&mut v);
        let text = serde_json::to_vec(&v).unwrap();
        area[4096..].fill(0);
        area[4096..4096 + text.len()].copy_from_slice(&text);
        luks::luks2::binary::seal(area);
    }
    std::fs::write(p, img).unwrap();
}

#[test]
fn wrong_passphrase_changes_nothing() {
    let dir = TempDir::new("luks-bad-pass");
    for v in [1, 2] {
        let p = image(&dir, v);
        let before = digest(&p);
        let e = luks::open(&p, None, &luks::DeviceAccess::default(), b"wrong", None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WrongPassphrase);
        let mut vol = Volume::load(&p, None, &luks::DeviceAccess::default()).unwrap();
        let e = vol.unlock_key(b"wrong", None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WrongPassphrase);
        // add_key with a key that is not the volume key is refused.
        let e = vol
            .add_key(&[0u8; 64], b"new", None, &fast(v).kdf)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::WrongPassphrase);
        assert_eq!(
            digest(&p),
            before,
            "LUKS{v}: a failed unlock must not write"
        );
        assert!(!format!("{e}").is_empty());
    }
}

#[test]
fn corrupted_primary_opens_from_secondary_with_warning() {
    let dir = TempDir::new("luks-bad-primary");
    let p = image(&dir, 2);
    let good = luks::open(&p, None, &luks::DeviceAccess::default(), PASS, None).unwrap();
    let mut img = std::fs::read(&p).unwrap();
    img[4096 + 10] ^= 0x55; // JSON byte: checksum no longer matches
    std::fs::write(&p, &img).unwrap();
    let vol = Volume::load(&p, None, &luks::DeviceAccess::default()).unwrap();
    assert!(
        vol.header()
            .warnings()
            .iter()
            .any(|w| w.contains("Primary")),
        "{:?}",
        vol.header().warnings()
    );
    let o = vol.unlock(PASS, None).unwrap();
    assert_eq!(o.volume_key, good.volume_key);
    // Magic gone too: found by scanning the secondary offsets.
    img[..4096].fill(0);
    std::fs::write(&p, &img).unwrap();
    let o = luks::open(&p, None, &luks::DeviceAccess::default(), PASS, None).unwrap();
    assert_eq!(o.volume_key, good.volume_key);
}

#[test]
fn both_copies_corrupted_or_truncated_fail_cleanly() {
    let dir = TempDir::new("luks-bad-both");
    let p = image(&dir, 2);
    let mut img = std::fs::read(&p).unwrap();
    img[4096 + 10] ^= 0x55;
    img[16384 + 4096 + 10] ^= 0x55;
    std::fs::write(&p, &img).unwrap();
    let e = Volume::load(&p, None, &luks::DeviceAccess::default()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    assert!(e.to_string().contains("Both"), "{e}");

    for v in [1, 2] {
        let p = image(&dir, v);
        let full = std::fs::read(&p).unwrap();
        for len in [0usize, 7, 600, 5000, 20000, 40000, 1 << 20] {
            std::fs::write(&p, &full[..len]).unwrap();
            let e = Volume::load(&p, None, &luks::DeviceAccess::default()).unwrap_err();
            assert!(
                matches!(
                    e.kind(),
                    ErrorKind::Corrupt | ErrorKind::NotLuks | ErrorKind::DeviceSize
                ),
                "LUKS{v} truncated to {len}: {e:?}"
            );
        }
    }
}

#[test]
fn lying_json_is_refused() {
    let dir = TempDir::new("luks-lies");
    type Edit = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(&str, Edit, ErrorKind)> = vec![
        (
            "area beyond keyslots",
            Box::new(|v| v["keyslots"]["0"]["area"]["offset"] = "999999999999".into()),
            ErrorKind::Corrupt,
        ),
        (
            "area too small",
            Box::new(|v| v["keyslots"]["0"]["area"]["size"] = "4096".into()),
            ErrorKind::Corrupt,
        ),
        (
            "overlapping areas",
            Box::new(|v| {
                let ks = v["keyslots"]["0"].clone();
                v["keyslots"]["1"] = ks;
            }),
            ErrorKind::Corrupt,
        ),
        (
            "absurd argon2 memory",
            Box::new(|v| {
                v["keyslots"]["0"]["kdf"] = serde_json::json!({
                    "type": "argon2id", "time": 4, "memory": 4294967295u32, "cpus": 4,
                    "salt": v["keyslots"]["0"]["kdf"]["salt"].clone()
                })
            }),
            ErrorKind::Corrupt,
        ),
        (
            "absurd argon2 lanes",
            Box::new(|v| {
                v["keyslots"]["0"]["kdf"] = serde_json::json!({
                    "type": "argon2i", "time": 4, "memory": 1024, "cpus": 100000,
                    "salt": v["keyslots"]["0"]["kdf"]["salt"].clone()
                })
            }),
            ErrorKind::Corrupt,
        ),
        (
            "segment beyond device",
            Box::new(|v| v["segments"]["0"]["offset"] = "1099511627776".into()),
            ErrorKind::DeviceSize,
        ),
        (
            "segment size beyond device",
            Box::new(|v| v["segments"]["0"]["size"] = "1099511627776".into()),
            ErrorKind::DeviceSize,
        ),
        (
            "segment over metadata",
            Box::new(|v| v["segments"]["0"]["offset"] = "32768".into()),
            ErrorKind::Corrupt,
        ),
        (
            "keyslots_size huge",
            Box::new(|v| v["config"]["keyslots_size"] = "17179869184".into()),
            ErrorKind::Corrupt,
        ),
        (
            "stripes",
            Box::new(|v| v["keyslots"]["0"]["af"]["stripes"] = 4294967295u32.into()),
            ErrorKind::Corrupt,
        ),
        (
            "key size",
            Box::new(|v| v["keyslots"]["0"]["key_size"] = 1000000.into()),
            ErrorKind::Corrupt,
        ),
        (
            "digest cut to one byte",
            Box::new(|v| v["digests"]["0"]["digest"] = "AA==".into()),
            ErrorKind::Corrupt,
        ),
        (
            "argon2 time cost zero",
            Box::new(|v| {
                v["keyslots"]["0"]["kdf"] = serde_json::json!({
                    "type": "argon2id", "time": 0, "memory": 1024, "cpus": 1,
                    "salt": v["keyslots"]["0"]["kdf"]["salt"].clone()
                })
            }),
            ErrorKind::Corrupt,
        ),
        (
            "pbkdf2 zero iterations",
            Box::new(|v| v["keyslots"]["0"]["kdf"]["iterations"] = 0.into()),
            ErrorKind::Corrupt,
        ),
        (
            "digest names ghost slot",
            Box::new(|v| v["digests"]["0"]["keyslots"] = serde_json::json!(["7"])),
            ErrorKind::Corrupt,
        ),
        (
            "mandatory requirement",
            Box::new(|v| {
                v["config"]["requirements"] =
                    serde_json::json!({"mandatory": ["online-reencrypt-v2"]})
            }),
            ErrorKind::Unsupported,
        ),
        (
            "integrity",
            Box::new(|v| {
                v["segments"]["0"]["integrity"] = serde_json::json!({"type": "hmac(sha256)"})
            }),
            ErrorKind::Unsupported,
        ),
    ];
    for (name, edit, kind) in cases {
        let p = image(&dir, 2);
        rewrite_json(&p, edit);
        let e = refusal(&p);
        assert_eq!(e.kind(), kind, "{name}: {e}");
    }
}

/// Why a lying volume is refused: by the header load, or (for what
/// cryptsetup too leaves to activation: KDF costs, sizes against the
/// device) by the unlock, before any key material is used.
fn refusal(p: &std::path::Path) -> luks::Error {
    match Volume::load(p, None, &luks::DeviceAccess::default()) {
        Err(e) => e,
        Ok(v) => v.unlock(PASS, None).expect_err("lying volume unlocked"),
    }
}

#[test]
fn luks1_lies_are_refused() {
    let dir = TempDir::new("luks1-lies");
    let p = image(&dir, 1);
    let orig = std::fs::read(&p).unwrap();
    // keyMaterialOffset of slot 7 (offset 208 + 7*48 + 40) far beyond the device.
    let mut img = orig.clone();
    img[208 + 7 * 48 + 40..208 + 7 * 48 + 44].copy_from_slice(&0x7fff_0000u32.to_be_bytes());
    std::fs::write(&p, &img).unwrap();
    assert!(Volume::load(&p, None, &luks::DeviceAccess::default()).is_err());
    // key bytes absurd.
    let mut img = orig.clone();
    img[108..112].copy_from_slice(&u32::MAX.to_be_bytes());
    std::fs::write(&p, &img).unwrap();
    assert_eq!(
        Volume::load(&p, None, &luks::DeviceAccess::default())
            .unwrap_err()
            .kind(),
        ErrorKind::Corrupt
    );
    // payload offset beyond the device.
    let mut img = orig;
    img[104..108].copy_from_slice(&0x7fff_ffffu32.to_be_bytes());
    std::fs::write(&p, &img).unwrap();
    assert_eq!(refusal(&p).kind(), ErrorKind::DeviceSize);
}

/// A crash between the two LUKS2 header writes leaves one valid copy: the
/// new secondary with the old primary opens (newer seqid wins, warned).
#[test]
fn crash_between_header_copies_leaves_a_valid_header() {
    let dir = TempDir::new("luks-crash");
    let p = image(&dir, 2);
    let before = std::fs::read(&p).unwrap();
    let mut vol = Volume::load(&p, None, &luks::DeviceAccess::default()).unwrap();
    let (_, vk) = vol.unlock_key(PASS, None).unwrap();
    let slot = vol.add_key(&vk, b"new pass", None, &fast(2).kdf).unwrap();
    let after = std::fs::read(&p).unwrap();
    // State after "secondary written, crash before primary".
    let mut crashed = after.clone();
    crashed[..16384].copy_from_slice(&before[..16384]);
    std::fs::write(&p, &crashed).unwrap();
    let v = Volume::load(&p, None, &luks::DeviceAccess::default()).unwrap();
    assert!(
        v.header()
            .warnings()
            .iter()
            .any(|w| w.contains("secondary")),
        "{:?}",
        v.header().warnings()
    );
    assert_eq!(v.unlock(b"new pass", None).unwrap().keyslot, slot);
    assert_eq!(v.unlock(PASS, None).unwrap().keyslot, 0);
    // State after "keyslot material written, crash before any header".
    let mut early = before.clone();
    early[32768..].copy_from_slice(&after[32768..]);
    std::fs::write(&p, &early).unwrap();
    let v = Volume::load(&p, None, &luks::DeviceAccess::default()).unwrap();
    assert!(v.header().warnings().is_empty());
    assert_eq!(v.unlock(PASS, None).unwrap().keyslot, 0);
}

#[test]
fn format_refuses_existing_header_without_force() {
    let dir = TempDir::new("luks-force");
    let p = image(&dir, 2);
    let before = digest(&p);
    let e = luks::format(&p, None, &fast(2), b"other").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::AlreadyLuks);
    assert_eq!(digest(&p), before);
    let forced = FormatOptions {
        force: true,
        ..fast(1)
    };
    luks::format(&p, None, &forced, b"other").unwrap();
    assert_eq!(
        luks::open(&p, None, &luks::DeviceAccess::default(), b"other", None)
            .unwrap()
            .sector_size,
        512
    );
}

#[test]
fn keyslot_lifecycle_and_backup() {
    let dir = TempDir::new("luks-life");
    for v in [1, 2] {
        let p = image(&dir, v);
        let mut vol = Volume::load(&p, None, &luks::DeviceAccess::default()).unwrap();
        let (_, vk) = vol.unlock_key(PASS, None).unwrap();
        let s1 = vol.add_key(&vk, b"two", None, &fast(v).kdf).unwrap();
        let s5 = vol.add_key(&vk, b"five", Some(5), &fast(v).kdf).unwrap();
        assert_eq!((s1, s5), (1, 5));
        assert_eq!(
            vol.add_key(&vk, b"x", Some(5), &fast(v).kdf)
                .unwrap_err()
                .kind(),
            ErrorKind::SlotBusy
        );
        assert_eq!(
            luks::open(&p, None, &luks::DeviceAccess::default(), b"five", Some(5))
                .unwrap()
                .keyslot,
            5
        );
        assert_eq!(
            luks::open(&p, None, &luks::DeviceAccess::default(), b"five", Some(1))
                .unwrap_err()
                .kind(),
            ErrorKind::WrongPassphrase
        );
        vol.kill_slot(1, false).unwrap();
        assert_eq!(
            luks::open(&p, None, &luks::DeviceAccess::default(), b"two", None)
                .unwrap_err()
                .kind(),
            ErrorKind::WrongPassphrase
        );
        // Backup, clobber, restore.
        let bak = dir.join(&format!("v{v}.bak"));
        let _ = std::fs::remove_file(&bak);
        vol.header_backup(&bak).unwrap();
        assert!(
            vol.header_backup(&bak).is_err(),
            "never overwrites a backup"
        );
        let mut img = std::fs::read(&p).unwrap();
        img[..40000].fill(0);
        std::fs::write(&p, &img).unwrap();
        assert!(luks::open(&p, None, &luks::DeviceAccess::default(), PASS, None).is_err());
        Volume::header_restore(&p, None, &bak, false, &luks::DeviceAccess::default()).unwrap();
        assert_eq!(
            luks::open(&p, None, &luks::DeviceAccess::default(), b"five", None)
                .unwrap()
                .volume_key,
            vk
        );
        // Last slot needs allow_last.
        let mut vol = Volume::load(&p, None, &luks::DeviceAccess::default()).unwrap();
        vol.kill_slot(5, false).unwrap();
        assert_eq!(
            vol.kill_slot(0, false).unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
        let old = vol.header().uuid().to_string();
        let new = vol.set_uuid(None).unwrap();
        assert_ne!(old, new);
        assert_eq!(
            Volume::load(&p, None, &luks::DeviceAccess::default())
                .unwrap()
                .header()
                .uuid(),
            new
        );
    }
}

#[test]
fn a_header_another_process_wrote_since_loading_is_not_overwritten() {
    let dir = TempDir::new("stale-header");
    for version in [1, 2] {
        let img = image(&dir, version);
        let mut current = Volume::load(&img, None, &luks::DeviceAccess::default()).unwrap();
        let mut stale = Volume::load(&img, None, &luks::DeviceAccess::default()).unwrap();
        let uuid = current.set_uuid(None).unwrap();
        let before = digest(&img);
        let e = stale.set_uuid(None).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Busy, "LUKS{version}: {e}");
        assert!(e.to_string().contains("changed since it was read"), "{e}");
        let e = stale.kill_slot(0, true).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Busy, "LUKS{version}: {e}");
        assert_eq!(
            digest(&img),
            before,
            "LUKS{version}: the stale header was written"
        );
        assert_eq!(
            Volume::load(&img, None, &luks::DeviceAccess::default())
                .unwrap()
                .header()
                .uuid(),
            uuid
        );
        // The volume that wrote last is current and writes on.
        current.set_uuid(None).unwrap();
        assert_ne!(
            Volume::load(&img, None, &luks::DeviceAccess::default())
                .unwrap()
                .header()
                .uuid(),
            uuid
        );
    }
}

#[test]
fn a_header_write_waits_for_the_metadata_lock() {
    use rustix::fs::{flock, FlockOperation};
    use std::sync::mpsc;
    use std::time::Duration;

    let dir = TempDir::new("header-lock");
    let img = image(&dir, 2);
    // A reader holds the lock, as cryptsetup luksDump does while it reads
    // (another open file description: flock conflicts within a process).
    let reader = std::fs::File::open(&img).unwrap();
    flock(&reader, FlockOperation::LockShared).unwrap();
    let (tx, rx) = mpsc::channel();
    let path = img.clone();
    let writer = std::thread::spawn(move || {
        // Loading reads under a shared lock: it does not wait.
        let mut v = Volume::load(&path, None, &luks::DeviceAccess::default()).unwrap();
        tx.send("loaded").unwrap();
        tx.send(match v.set_uuid(None) {
            Ok(_) => "written",
            Err(_) => "failed",
        })
        .unwrap();
    });
    assert_eq!(rx.recv_timeout(Duration::from_secs(60)), Ok("loaded"));
    let before = digest(&img);
    assert!(
        rx.recv_timeout(Duration::from_millis(500)).is_err(),
        "the header was written under a reader's lock"
    );
    assert_eq!(digest(&img), before);
    drop(reader);
    assert_eq!(rx.recv_timeout(Duration::from_secs(60)), Ok("written"));
    writer.join().unwrap();
    assert_ne!(digest(&img), before);
}

#[test]
fn header_strings_reach_the_dump_escaped() {
    let dir = TempDir::new("luks-dump-escapes");
    let p = dir.join("v.img");
    std::fs::File::create(&p)
        .unwrap()
        .set_len(17 << 20)
        .unwrap();
    let evil = "\x1b]0;x\x07\x1b[2J\u{9b}1m\u{7f}";
    let opts = FormatOptions {
        label: Some(evil.into()),
        ..fast(2)
    };
    luks::format(&p, None, &opts, PASS).unwrap();
    rewrite_json(&p, |v| {
        v["tokens"]["0"] = serde_json::json!({"type": evil, "keyslots": ["0"]});
    });
    // The label loads as cryptsetup stores it; every form of the dump
    // escapes it.
    let vol = Volume::load(&p, None, &luks::DeviceAccess::default()).unwrap();
    let text = luks::dump::header_text(vol.header(), &p);
    let json = luks::dump::json_text(vol.header()).unwrap();
    let summary = luks::summary::Summary::of(vol.header()).to_json();
    for t in [&text, &json, &summary] {
        assert!(
            !t.chars().any(|c| c.is_control() && c != '\n' && c != '\t'),
            "{t:?}"
        );
    }
    assert!(
        text.contains("Label:         \t\\x1b]0;x\\x07\\x1b[2J\\x9b1m\\x7f"),
        "{text}"
    );
    assert!(text.contains("  0: \\x1b]0;x"), "{text}");
    assert!(json.contains("\\u001b[2J\\u009b1m\\u007f"), "{json}");
    // The volume key's text lives in locked (or at least private) pages.
    let opened = vol.unlock(PASS, None).unwrap();
    let vk = luks::dump::volume_key_text(vol.header(), &opened, &p);
    let s = vk.as_str().unwrap();
    assert!(s.contains("MK dump:\t"), "{s}");
    let hex: String = opened.volume_key[..4]
        .iter()
        .map(|b| format!("{b:02x} "))
        .collect();
    assert!(s.contains(&hex), "{s}");
}
