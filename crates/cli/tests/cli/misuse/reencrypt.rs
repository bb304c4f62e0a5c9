//! Misuse rows: `ucrypt reencrypt` refusals (a wrong passphrase, metadata
//! changed without the keys, resuming what was never started, starting
//! twice, a reencryption mode ucrypt does not do, a volume a daemon
//! serves; `--decrypt` with a wrong passphrase, without a detached
//! header or with a data offset), each with cryptsetup's exit code and
//! nothing written.

use std::path::{Path, PathBuf};

use serde_json::Value;

use super::harness::{text, Case, Expect, Row};
use super::luks::rewrite_json;

const PASS: &str = "correct horse";

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// A fast LUKS2 volume (`init`: with its reencryption initialized),
/// watched with its key file.
fn volume(c: &mut Case, init: bool) -> (PathBuf, PathBuf) {
    let (img, key) = c.luks2("v.img", 32 << 20, PASS);
    if init {
        let o = c.ucrypt(&[
            "reencrypt",
            "-q",
            "--init-only",
            "--key-file",
            s(&key),
            s(&img),
        ]);
        assert!(o.status.success(), "init: {}", text(&o));
    }
    (img, key)
}

/// The reencrypt keyslot of `v`.
fn reencrypt_keyslot(v: &mut Value) -> &mut Value {
    v["keyslots"]
        .as_object_mut()
        .unwrap()
        .values_mut()
        .find(|k| k["type"] == "reencrypt")
        .unwrap()
}

/// This area's rows.
pub fn rows() -> Vec<Row> {
    vec![
        Row {
            what: "reencrypt with a wrong passphrase",
            needs: &[],
            expect: Expect::Exit(2, "No key available with this passphrase"),
            case: |c: &mut Case| {
                let (img, _) = volume(c, false);
                let wrong = c.path("wrong.key");
                std::fs::write(&wrong, "wrong").unwrap();
                c.watch(&img);
                c.ucrypt(&["reencrypt", "-q", "--key-file", s(&wrong), s(&img)])
                    .into()
            },
        },
        Row {
            what: "reencrypt --resume-only with a wrong passphrase",
            needs: &[],
            expect: Expect::Exit(2, "No key available with this passphrase"),
            case: |c: &mut Case| {
                let (img, _) = volume(c, true);
                let wrong = c.path("wrong.key");
                std::fs::write(&wrong, "wrong").unwrap();
                c.watch(&img);
                c.ucrypt(&[
                    "reencrypt",
                    "-q",
                    "--resume-only",
                    "--key-file",
                    s(&wrong),
                    s(&img),
                ])
                .into()
            },
        },
        Row {
            what: "reencrypt --resume-only of a volume not in reencryption",
            needs: &[],
            expect: Expect::Exit(1, "Device reencryption not in progress."),
            case: |c: &mut Case| {
                let (img, key) = volume(c, false);
                c.watch(&img);
                c.ucrypt(&[
                    "reencrypt",
                    "-q",
                    "--resume-only",
                    "--key-file",
                    s(&key),
                    s(&img),
                ])
                .into()
            },
        },
        Row {
            what: "reencrypt --init-only of a volume already in reencryption",
            needs: &[],
            expect: Expect::Exit(
                1,
                "LUKS2 reencryption already initialized. Aborting operation.",
            ),
            case: |c: &mut Case| {
                let (img, key) = volume(c, true);
                c.watch(&img);
                c.ucrypt(&[
                    "reencrypt",
                    "-q",
                    "--init-only",
                    "--key-file",
                    s(&key),
                    s(&img),
                ])
                .into()
            },
        },
        Row {
            what: "reencrypt of a volume whose reencryption metadata was changed without the keys",
            needs: &[],
            expect: Expect::Exit(1, "verification digest does not match"),
            case: |c: &mut Case| {
                let (img, key) = volume(c, true);
                rewrite_json(&img, |v| {
                    reencrypt_keyslot(v)["area"]["hash"] = Value::String("sha1".into());
                });
                c.watch(&img);
                c.ucrypt(&[
                    "reencrypt",
                    "-q",
                    "--resume-only",
                    "--key-file",
                    s(&key),
                    s(&img),
                ])
                .into()
            },
        },
        Row {
            what: "reencrypt of a volume in LUKS2 encryption (mode ucrypt does not do)",
            needs: &[],
            expect: Expect::Exit(1, "mode encrypt is not supported"),
            case: |c: &mut Case| {
                let (img, key) = volume(c, true);
                rewrite_json(&img, |v| {
                    reencrypt_keyslot(v)["mode"] = Value::String("encrypt".into());
                });
                c.watch(&img);
                c.ucrypt(&[
                    "reencrypt",
                    "-q",
                    "--resume-only",
                    "--key-file",
                    s(&key),
                    s(&img),
                ])
                .into()
            },
        },
        Row {
            what: "open of a volume in reencryption with a wrong passphrase",
            needs: &[],
            expect: Expect::Exit(2, "No key available with this passphrase"),
            case: |c: &mut Case| {
                let (img, _) = volume(c, true);
                let wrong = c.path("wrong.key");
                std::fs::write(&wrong, "wrong").unwrap();
                c.watch(&img);
                c.ucrypt(&["open", "--key-file", s(&wrong), s(&img), "v"])
                    .into()
            },
        },
        Row {
            what: "reencrypt of a file a daemon serves",
            needs: &[],
            expect: Expect::Exit(5, "which is in use (already mapped or mounted)."),
            case: |c: &mut Case| {
                let (img, key) = volume(c, false);
                c.open_ok(&["open", "--key-file", s(&key), s(&img), "v"], "v");
                c.watch(&img);
                c.ucrypt(&["reencrypt", "-q", "--key-file", s(&key), s(&img)])
                    .into()
            },
        },
        Row {
            what: "reencrypt --decrypt with a wrong passphrase (detached header)",
            needs: &[],
            expect: Expect::Exit(2, "No key available with this passphrase"),
            case: |c: &mut Case| {
                let (hdr, data) = detached(c);
                let wrong = c.path("wrong.key");
                std::fs::write(&wrong, "wrong").unwrap();
                c.watch(&hdr);
                c.watch(&data);
                c.ucrypt(&[
                    "reencrypt",
                    "-q",
                    "--decrypt",
                    "--header",
                    s(&hdr),
                    "--key-file",
                    s(&wrong),
                    s(&data),
                ])
                .into()
            },
        },
        Row {
            what: "reencrypt --decrypt of a volume whose header is on the device",
            needs: &[],
            expect: Expect::Exit(1, "LUKS2 decryption requires --header option."),
            case: |c: &mut Case| {
                let (img, key) = volume(c, false);
                c.watch(&img);
                c.ucrypt(&[
                    "reencrypt",
                    "-q",
                    "--decrypt",
                    "--key-file",
                    s(&key),
                    s(&img),
                ])
                .into()
            },
        },
        Row {
            what: "reencrypt --decrypt with --header naming a header with a data offset",
            needs: &[],
            expect: Expect::Exit(
                1,
                "LUKS2 decryption is supported with detached header device only",
            ),
            case: |c: &mut Case| {
                let (img, key) = volume(c, false);
                c.watch(&img);
                c.ucrypt(&[
                    "reencrypt",
                    "-q",
                    "--decrypt",
                    "--header",
                    s(&img),
                    "--key-file",
                    s(&key),
                    s(&img),
                ])
                .into()
            },
        },
    ]
}

/// A LUKS2 header file and its 8 MiB data file (data offset 0).
fn detached(c: &mut Case) -> (PathBuf, PathBuf) {
    let data = c.image("data.img", 8 << 20);
    let hdr = c.path("hdr.img");
    let key = c.path("v.key");
    std::fs::write(&key, PASS).unwrap();
    let mut args: Vec<&str> = testutil::FAST_LUKS2_FORMAT.to_vec();
    args.extend(["--header", s(&hdr), "--key-file", s(&key), s(&data)]);
    let o = c.ucrypt(&args);
    assert!(o.status.success(), "luksFormat --header: {}", text(&o));
    (hdr, data)
}
