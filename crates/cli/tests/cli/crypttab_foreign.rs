//! crypttab(5) lines beside LUKS and plain, opened by `ucrypt open
//! --crypttab=FILE NAME` as systemd-cryptsetup reads them: `bitlk` (the key
//! file holds the passphrase, the recovery password or a `.BEK` startup
//! key), TrueCrypt (`tcrypt`: the key file field is a passphrase file of
//! which the first line counts, `tcrypt-keyfile=` names the keyfiles,
//! `tcrypt-hidden` the hidden volume, VeraCrypt only with
//! `tcrypt-veracrypt`), over cryptsetup 2.6.1's image suites (the expected
//! sha256 of a decrypted BitLocker device from its `images.conf`, the
//! filesystem UUIDs of the TrueCrypt images read by `blkid -p`); and the
//! options systemd acts on for every type: `try-empty-password` and
//! `token-timeout=`.
//!
//! The images are GPL test data, fetched at test time by
//! `scripts/fetch-cryptsetup-tests.sh` and never stored here.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use testutil::TempDir;

/// cryptsetup's suite's `NAME.tar.xz` unpacked (once) under the target's
/// temp dir: the directory it holds, or `None` (skipped).
fn images(test: &str, tarball: &str, dir: &str) -> Option<PathBuf> {
    for tool in ["apt-get", "xz", "tar", "blkid", "nbdcopy"] {
        if !testutil::require_tool(test, tool) {
            return None;
        }
    }
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cryptsetup-2.6.1");
    let suite = testutil::cryptsetup_suite(test, &cache)?;
    let out = cache.join("crypttab-cli");
    if !out.join(dir).join(".unpacked").exists() {
        std::fs::create_dir_all(&out).expect("mkdir");
        let st = Command::new("tar")
            .arg("xJf")
            .arg(suite.join(tarball))
            .arg("-C")
            .arg(&out)
            .status()
            .expect("tar runs");
        assert!(st.success(), "{tarball} unpacks");
        std::fs::write(out.join(dir).join(".unpacked"), b"").expect("stamp");
    }
    Some(out.join(dir))
}

/// `ucrypt ARGS` with `stdin` (nothing: /dev/null).
fn ucrypt(args: &[&str], stdin: Option<&[u8]>) -> Output {
    testutil::run(&testutil::ucrypt_bin().display().to_string(), args, stdin)
}

/// A crypttab file in `dir` with `lines`; the `--crypttab=` argument.
fn crypttab(dir: &TempDir, lines: &str) -> String {
    let ct = dir.join("crypttab");
    std::fs::write(&ct, lines).expect("crypttab");
    format!("--crypttab={}", ct.display())
}

/// Opens crypttab's `name` (its line exports NBD on `sock`), copies the
/// decrypted device out with nbdcopy into `out`, closes it.
fn open_and_copy(ct: &str, name: &str, sock: &Path, out: &Path) {
    let o = ucrypt(&["open", ct, name], None);
    assert!(o.status.success(), "open {name}: {o:?}");
    let copy = Command::new("nbdcopy")
        .arg(format!("nbd+unix:///?socket={}", sock.display()))
        .arg(out)
        .stdin(Stdio::null())
        .output()
        .expect("nbdcopy runs");
    let close = ucrypt(&["close", name], None);
    assert!(copy.status.success(), "nbdcopy {name}: {copy:?}");
    assert!(close.status.success(), "close {name}: {close:?}");
}

fn sha256(path: &Path) -> String {
    let out = testutil::run_ok("sha256sum", &[&path.display().to_string()]);
    out.split_whitespace().next().unwrap_or_default().to_owned()
}

fn fs_uuid(path: &Path) -> String {
    testutil::run_ok(
        "blkid",
        &[
            "-p",
            "-o",
            "value",
            "-s",
            "UUID",
            &path.display().to_string(),
        ],
    )
    .trim()
    .to_owned()
}

/// `images.conf`'s `KEY=` value in section `[image]`.
fn conf_value(dir: &Path, image: &str, key: &str) -> String {
    let text = std::fs::read_to_string(dir.join("images.conf")).expect("images.conf");
    let mut inside = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            inside = line == format!("[{image}]");
        } else if inside {
            if let Some(v) = line.strip_prefix(&format!("{key}=")) {
                return v.to_owned();
            }
        }
    }
    panic!("images.conf has no {key} for {image}");
}

#[test]
fn crypttab_bitlk_lines_open_with_passphrase_recovery_password_and_bek() {
    let test = "crypttab_bitlk_lines_open_with_passphrase_recovery_password_and_bek";
    let Some(imgs) = images(test, "bitlk-images.tar.xz", "bitlk-images") else {
        return;
    };
    let dir = TempDir::new("crypttab-bitlk");
    let image = "bitlk-aes-xts-128";
    let img = imgs.join(format!("{image}.img"));
    let (pw, rp) = (dir.join("pw"), dir.join("rp"));
    std::fs::write(&pw, conf_value(&imgs, image, "PW")).unwrap();
    std::fs::write(&rp, conf_value(&imgs, image, "RP")).unwrap();
    let wrong = dir.join("wrong");
    std::fs::write(&wrong, "not the passphrase").unwrap();
    let bek_img = imgs.join("bitlk-aes-xts-128-startup-key.img");
    let bek = std::fs::read_dir(&imgs)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.extension().is_some_and(|x| x == "BEK")
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("4381F759"))
        })
        .expect("the startup key image's .BEK");
    let pid = std::process::id();
    let sock = dir.join("b.sock");
    let ct = crypttab(
        &dir,
        &format!(
            "ctb-pw-{pid} {img} {pw} bitlk,x-ucrypt.export=nbd={sock}\n\
             ctb-rp-{pid} {img} {rp} bitlk\n\
             ctb-bek-{pid} {bek_img} {bek} bitlk,read-only\n\
             ctb-wrong-{pid} {img} {wrong} bitlk\n\
             ctb-ask-{pid} {img} - bitlk,try-empty-password\n",
            img = img.display(),
            pw = pw.display(),
            rp = rp.display(),
            bek_img = bek_img.display(),
            bek = bek.display(),
            wrong = wrong.display(),
            sock = sock.display(),
        ),
    );

    // Served and read back: the decrypted device is the one images.conf
    // describes.
    let out = dir.join("plain.img");
    open_and_copy(&ct, &format!("ctb-pw-{pid}"), &sock, &out);
    assert_eq!(sha256(&out), conf_value(&imgs, image, "SHA256SUM"));

    for name in ["rp", "bek"] {
        let o = ucrypt(
            &[
                "open",
                "--test-passphrase",
                &ct,
                &format!("ctb-{name}-{pid}"),
            ],
            None,
        );
        assert!(o.status.success(), "{name}: {o:?}");
    }
    let o = ucrypt(
        &[
            "open",
            "--test-passphrase",
            &ct,
            &format!("ctb-wrong-{pid}"),
        ],
        None,
    );
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    // try-empty-password: the empty passphrase opens nothing here, so the
    // piped one is read and opens (the empty try is not reported).
    let o = ucrypt(
        &["open", "--test-passphrase", &ct, &format!("ctb-ask-{pid}")],
        Some(format!("{}\n", conf_value(&imgs, image, "PW")).as_bytes()),
    );
    assert!(o.status.success(), "{o:?}");
}

#[test]
fn crypttab_tcrypt_lines_open_as_systemd_cryptsetup_reads_them() {
    let test = "crypttab_tcrypt_lines_open_as_systemd_cryptsetup_reads_them";
    let Some(imgs) = images(test, "tcrypt-images.tar.xz", "tcrypt-images") else {
        return;
    };
    let dir = TempDir::new("crypttab-tcrypt");
    // The key file field is a passphrase file: its first line counts.
    let pass = dir.join("pass");
    std::fs::write(&pass, "aaaaaaaaaaaa\nnot part of it\n").unwrap();
    let hidden_pass = dir.join("hidden");
    std::fs::write(&hidden_pass, "bbbbbbbbbbbb\n").unwrap();
    let img = |n: &str| imgs.join(n).display().to_string();
    let (k1, k2) = (img("keyfile1"), img("keyfile2"));
    let pid = std::process::id();
    let (sock, hsock) = (dir.join("t.sock"), dir.join("h.sock"));
    let ct = crypttab(
        &dir,
        &format!(
            "ctt-{pid} {outer} {pass} tcrypt,x-ucrypt.export=nbd={sock}\n\
             ctt-hidden-{pid} {outer} {hidden} tcrypt-hidden,x-ucrypt.export=nbd={hsock}\n\
             ctt-keys-{pid} {tck} {pass} tcrypt-keyfile={k1},tcrypt-keyfile={k2}\n\
             ctt-onekey-{pid} {tck} {pass} tcrypt,tcrypt-keyfile={k1}\n\
             ctt-vc-{pid} {vc} {pass} tcrypt\n\
             ctt-vera-{pid} {vc} {pass} tcrypt-veracrypt,veracrypt-pim=0\n\
             ctt-ask-{pid} {outer} - tcrypt,try-empty-password\n",
            outer = img("tc_3-sha512-xts-aes-hidden"),
            tck = img("tck_5-sha512-xts-aes"),
            vc = img("vc_1-sha256-xts-aes"),
            pass = pass.display(),
            hidden = hidden_pass.display(),
            sock = sock.display(),
            hsock = hsock.display(),
        ),
    );
    let test_pass = |name: &str, stdin: Option<&[u8]>| {
        ucrypt(
            &[
                "open",
                "--test-passphrase",
                &ct,
                &format!("ctt-{name}{pid}"),
            ],
            stdin,
        )
    };

    // The outer and the hidden volume, served: their filesystems' UUIDs.
    let out = dir.join("outer.img");
    open_and_copy(&ct, &format!("ctt-{pid}"), &sock, &out);
    assert_eq!(fs_uuid(&out), "DEAD-BABE");
    let out = dir.join("hidden.img");
    open_and_copy(&ct, &format!("ctt-hidden-{pid}"), &hsock, &out);
    assert_eq!(fs_uuid(&out), "CAFE-BABE");

    // Both keyfiles and the passphrase open; one keyfile does not (2).
    let o = test_pass("keys-", None);
    assert!(o.status.success(), "{o:?}");
    let o = test_pass("onekey-", None);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    // A VeraCrypt volume: systemd-cryptsetup tries VeraCrypt's KDFs only
    // with tcrypt-veracrypt (a PIM of 0 is the default one).
    let o = test_pass("vc-", None);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let o = test_pass("vera-", None);
    assert!(o.status.success(), "{o:?}");
    // try-empty-password: the empty passphrase finds no header, the piped
    // line then opens.
    let o = test_pass("ask-", Some(b"aaaaaaaaaaaa\n"));
    assert!(o.status.success(), "{o:?}");
}

/// try-empty-password on LUKS: a volume whose passphrase is empty opens
/// without the (wrong) piped one being needed; without the option the
/// piped one is used, and refused.
#[test]
fn crypttab_try_empty_password_opens_an_empty_passphrase_first() {
    if !testutil::require_tool("crypttab_try_empty_password", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("crypttab-empty");
    let img = dir.join("vol.img");
    let empty = dir.join("empty");
    std::fs::write(&empty, b"").unwrap();
    std::fs::File::create(&img)
        .unwrap()
        .set_len(20 << 20)
        .unwrap();
    let o = testutil::run(
        "cryptsetup",
        &[
            "luksFormat",
            "-q",
            "--type",
            "luks2",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            "--key-file",
            &empty.display().to_string(),
            &img.display().to_string(),
        ],
        None,
    );
    assert!(o.status.success(), "{o:?}");
    let pid = std::process::id();
    let ct = crypttab(
        &dir,
        &format!(
            "cte-try-{pid} {img} - try-empty-password\n\
             cte-no-{pid} {img} - try-empty-password=no\n",
            img = img.display()
        ),
    );
    let o = ucrypt(
        &["open", "--test-passphrase", &ct, &format!("cte-try-{pid}")],
        Some(b"wrong\n"),
    );
    assert!(o.status.success(), "{o:?}");
    let o = ucrypt(
        &["open", "--test-passphrase", &ct, &format!("cte-no-{pid}")],
        Some(b"wrong\n"),
    );
    assert_eq!(o.status.code(), Some(2), "{o:?}");
}
