//! Misuse rows: `ucrypt reencrypt` refusals (a wrong passphrase, metadata
//! changed without the keys, resuming what was never started, starting
//! twice, a reencryption mode ucrypt does not do, a volume a daemon
//! serves; `--decrypt` with a wrong passphrase, without a detached
//! header or with a data offset; online: a name nothing serves, a plain
//! volume, a second reencryption while one runs), each with cryptsetup's
//! exit code and nothing written.

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
        Row {
            what: "reencrypt --active-name of a name nothing serves",
            needs: &[],
            expect: Expect::Exit(4, "Device nothere is not active."),
            case: |c: &mut Case| {
                let (img, key) = volume(c, false);
                c.watch(&img);
                c.ucrypt(&[
                    "reencrypt",
                    "-q",
                    "--active-name",
                    "nothere",
                    "--key-file",
                    s(&key),
                ])
                .into()
            },
        },
        Row {
            what: "reencrypt --active-name of a plain volume",
            needs: &[],
            expect: Expect::Exit(1, "is not a LUKS2 volume"),
            case: |c: &mut Case| {
                let img = c.image("p.img", 8 << 20);
                let key = c.path("p.key");
                // Plain mode reads the whole key (512 bits) from the file.
                std::fs::write(&key, [7u8; 64]).unwrap();
                c.open_ok(
                    &[
                        "open",
                        "--type",
                        "plain",
                        "--key-file",
                        s(&key),
                        s(&img),
                        "p",
                    ],
                    "p",
                );
                c.watch(&img);
                c.ucrypt(&[
                    "reencrypt",
                    "-q",
                    "--active-name",
                    "p",
                    "--key-file",
                    s(&key),
                ])
                .into()
            },
        },
        Row {
            what: "a second online reencryption while one runs",
            needs: &[],
            expect: Expect::Exit(5, "Reencryption of device v is already running."),
            case: |c: &mut Case| {
                let (img, key) = volume(c, false);
                c.open_ok(&["open", "--key-file", s(&key), s(&img), "v"], "v");
                // The first one moves one hotzone, then waits for its rate.
                let first = c
                    .command(&[
                        "reencrypt",
                        "-q",
                        "--active-name",
                        "v",
                        "--rate",
                        "0.001",
                        "--hotzone-size",
                        "1M",
                        "--key-file",
                        s(&key),
                    ])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .unwrap();
                c.keep(Reaped(first));
                testutil::wait_until(
                    std::time::Duration::from_secs(60),
                    "the first hotzone",
                    || {
                        let o = c.ucrypt(&["status", "--json", "v"]);
                        serde_json::from_slice::<Value>(&o.stdout)
                            .is_ok_and(|v| v["reencryption"]["hotzones"].as_u64() >= Some(1))
                    },
                );
                c.watch(&img);
                c.ucrypt(&[
                    "reencrypt",
                    "-q",
                    "--active-name",
                    "v",
                    "--key-file",
                    s(&key),
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

/// A child process killed and reaped when the row ends.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
