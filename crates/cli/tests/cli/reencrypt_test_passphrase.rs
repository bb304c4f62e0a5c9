//! `open --test-passphrase` of a volume in reencryption, encryption or
//! decryption answers as cryptsetup 2.6.1 answers on the same files
//! (exit code and message) and writes nothing: the keys are checked, no
//! table is resolved, so a data area of no bytes (a detached header given
//! as its own device, its data offset at or past the file's end) is no
//! error. Variants of `luks2-reencryption-test` [27]; a detached header
//! in no reencryption whose data cannot be mapped answers the same way.

use std::path::Path;

use testutil::{require_tool, TempDir};

use super::reencrypt::ok;

const PW: &[u8] = b"test passphrase 1\n";
const FAST: &[&str] = &["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn sha256(p: &Path) -> String {
    testutil::run("sha256sum", &[s(p)], None)
        .stdout
        .split(|&b| b == b' ')
        .next()
        .map(|h| String::from_utf8_lossy(h).into_owned())
        .unwrap()
}

/// `open --test-passphrase ARGS` with `pass` answers the same from both
/// tools: the same exit code, cryptsetup's error line in ucrypt's
/// stderr, every file of `files` unchanged. Returns the exit code.
fn same_answer(files: &[&Path], a: &[&str], pass: &[u8]) -> i32 {
    let before: Vec<String> = files.iter().map(|f| sha256(f)).collect();
    let mut full = vec!["open", "--test-passphrase"];
    full.extend_from_slice(a);
    let cs = testutil::run("cryptsetup", &full, Some(pass));
    let u = testutil::run("ucrypt", &full, Some(pass));
    let (cs_err, u_err) = (
        String::from_utf8_lossy(&cs.stderr),
        String::from_utf8_lossy(&u.stderr),
    );
    assert_eq!(
        u.status.code(),
        cs.status.code(),
        "{a:?}: ucrypt {u_err} / cryptsetup {cs_err}"
    );
    for line in cs_err.lines() {
        assert!(
            u_err.contains(line),
            "{a:?}: cryptsetup said {line:?}, ucrypt {u_err}"
        );
    }
    let after: Vec<String> = files.iter().map(|f| sha256(f)).collect();
    assert_eq!(before, after, "{a:?} wrote");
    cs.status.code().unwrap()
}

#[test]
fn a_reencryption_whose_header_is_tested_alone_answers_as_cryptsetup() {
    if !require_tool("reencrypt_test_passphrase_alone", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("retestpw-alone");
    let (dev, hdr) = (dir.join("dev"), dir.join("hdr"));
    std::fs::File::create(&dev)
        .unwrap()
        .set_len(40 << 20)
        .unwrap();
    // The data offset (32 MiB) lies past the 16 MiB header file: given
    // alone, the header is a device with no data area.
    let mut a = vec!["-q", "luksFormat", "--type", "luks2", "--offset", "65536"];
    a.extend_from_slice(FAST);
    a.extend(["--header", s(&hdr), s(&dev)]);
    ok(testutil::run("cryptsetup", &a, Some(PW)), "luksFormat");
    let init = ["reencrypt", "--init-only", "--header", s(&hdr), s(&dev)];
    ok(
        testutil::run("ucrypt", &init, Some(PW)),
        "reencrypt --init-only",
    );
    let files = [hdr.as_path(), dev.as_path()];
    let h = s(&hdr);
    assert_eq!(same_answer(&files, &[h], PW), 0);
    assert_eq!(same_answer(&files, &["--header", h, s(&dev)], PW), 0);
    // One keyslot opens one of the two keys in use: refused (exit 1).
    assert_eq!(same_answer(&files, &["-S", "0", h], PW), 1);
    assert_eq!(same_answer(&files, &["-S", "1", h], PW), 1);
    // The reencrypt keyslot and an absent one are no usable keyslot.
    assert_eq!(same_answer(&files, &["-S", "2", h], PW), 1);
    assert_eq!(same_answer(&files, &["-S", "7", h], PW), 1);
    // A wrong passphrase: "No usable keyslot" (the last keyslot tried is
    // not bound to the old key) and, in one keyslot, exit 2.
    assert_eq!(same_answer(&files, &[h], b"wrong\n"), 1);
    assert_eq!(same_answer(&files, &["-S", "0", h], b"wrong\n"), 2);
    // A data device under one sector is refused before the passphrase.
    std::fs::File::create(&dev).unwrap().set_len(0).unwrap();
    assert_eq!(same_answer(&files, &["--header", h, s(&dev)], PW), 1);
    std::fs::File::create(&dev).unwrap().set_len(512).unwrap();
    assert_eq!(same_answer(&files, &["--header", h, s(&dev)], PW), 0);
}

#[test]
fn an_encryption_with_one_key_answers_as_cryptsetup() {
    if !require_tool("reencrypt_test_passphrase_encrypt", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("retestpw-encrypt");
    let (dev, hdr) = (dir.join("dev"), dir.join("hdr"));
    std::fs::File::create(&dev)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let mut a = vec!["reencrypt", "-q", "--encrypt", "--init-only"];
    a.extend_from_slice(FAST);
    a.extend(["--header", s(&hdr), s(&dev)]);
    ok(
        testutil::run("ucrypt", &a, Some(PW)),
        "reencrypt --encrypt --init-only",
    );
    let files = [hdr.as_path(), dev.as_path()];
    let h = s(&hdr);
    assert_eq!(same_answer(&files, &[h], PW), 0);
    // Its only key is the new one: keyslot 0 alone opens it.
    assert_eq!(same_answer(&files, &["-S", "0", h], PW), 0);
    assert_eq!(same_answer(&files, &[h], b"wrong\n"), 2);
    assert_eq!(
        same_answer(&files, &["--header", h, s(&dev)], b"wrong\n"),
        2
    );
}

/// A detached LUKS2 header in no reencryption, its data offset 0 or past
/// the header file's end, given as its own device (or with a data device
/// of a sector or none): cryptsetup checks the keyslots only, and so
/// does ucrypt, with the same exit codes and nothing written.
#[test]
fn a_detached_header_whose_data_cannot_be_mapped_answers_as_cryptsetup() {
    if !require_tool("reencrypt_test_passphrase_detached", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("retestpw-detached");
    let dev = dir.join("dev");
    std::fs::File::create(&dev)
        .unwrap()
        .set_len(8 << 20)
        .unwrap();
    for (offset, name) in [("0", "hdr0"), ("65536", "hdr32m")] {
        let hdr = dir.join(name);
        let mut a = vec!["-q", "luksFormat", "--type", "luks2", "--offset", offset];
        a.extend_from_slice(FAST);
        a.extend(["--header", s(&hdr), s(&dev)]);
        ok(testutil::run("cryptsetup", &a, Some(PW)), "luksFormat");
        let files = [hdr.as_path(), dev.as_path()];
        let h = s(&hdr);
        assert_eq!(same_answer(&files, &[h], PW), 0, "{name}");
        assert_eq!(same_answer(&files, &["-S", "0", h], PW), 0, "{name}");
        assert_eq!(same_answer(&files, &[h], b"wrong\n"), 2, "{name}");
        assert_eq!(
            same_answer(&files, &["--header", h, s(&dev)], PW),
            0,
            "{name}"
        );
        let small = dir.join("small");
        for (len, code) in [(512, 0), (0, 1)] {
            std::fs::File::create(&small).unwrap().set_len(len).unwrap();
            let files = [hdr.as_path(), small.as_path()];
            assert_eq!(
                same_answer(&files, &["--header", h, s(&small)], PW),
                code,
                "{name}: a data device of {len} bytes"
            );
        }
    }
}
