//! Misuse rows: LUKS headers that lie (a digest cut short, KDF costs
//! beyond cryptsetup's limits or merely enormous, terminal escapes in
//! header strings) and KDF options beyond cryptsetup's limits.

use std::io::{BufRead, BufReader};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::harness::{Case, Expect, Outcome, Row};

/// SIGINT's number on Linux.
const SIGINT: i32 = 2;

/// The passphrase of every volume here.
const PASS: &str = "correct horse";

/// Edits the JSON of both LUKS2 header copies of `img` and re-seals their
/// checksums, so only ucrypt's validation stands between the lie and
/// the code.
pub(crate) fn rewrite_json(img: &Path, edit: impl Fn(&mut Value)) {
    let mut bytes = std::fs::read(img).expect("read image");
    let hdr = u64::from_be_bytes(bytes[8..16].try_into().unwrap()) as usize;
    for off in [0, hdr] {
        let area = &mut bytes[off..off + hdr];
        let end = area[4096..].iter().position(|&b| b == 0).unwrap();
        let mut v: Value = serde_json::from_slice(&area[4096..4096 + end]).unwrap();
        edit(&mut v);
        let text = serde_json::to_vec(&v).unwrap();
        area[4096..].fill(0);
        area[4096..4096 + text.len()].copy_from_slice(&text);
        luks::luks2::binary::seal(area);
    }
    std::fs::write(img, bytes).expect("write image");
}

/// A fast LUKS2 image whose JSON `edit` rewrote; watched. Returns the
/// image and its key file.
fn crafted(c: &mut Case, edit: impl Fn(&mut Value)) -> (String, String) {
    let (img, key) = c.luks2("v.img", 32 << 20, PASS);
    rewrite_json(&img, edit);
    c.watch(&img);
    c.watch(&key);
    (
        img.to_str().unwrap().to_owned(),
        key.to_str().unwrap().to_owned(),
    )
}

/// The volume key digest cut to its first byte: the right passphrase
/// still matches it, and one wrong passphrase in 256 does too.
fn short_digest(v: &mut Value) {
    let d = &mut v["digests"]["0"]["digest"];
    let full = luks::luks2::json::b64_decode(d.as_str().unwrap(), "digest").unwrap();
    *d = luks::luks2::json::b64_encode(&full[..1]).into();
}

/// Keyslot 0's KDF replaced by `kdf` (its salt kept).
fn set_kdf(v: &mut Value, mut kdf: Value) {
    kdf["salt"] = v["keyslots"]["0"]["kdf"]["salt"].clone();
    v["keyslots"]["0"]["kdf"] = kdf;
}

/// A label that clears the screen and retitles the terminal.
const EVIL: &str = "\x1b]0;owned\x07\x1b[2J\x1b[31mred\u{9b}0m";

/// `luksDump` of a volume whose header holds [`EVIL`] somewhere.
fn dump_escaped(c: &mut Case, img: &str) -> Outcome {
    let o = c.ucrypt(&["luksDump", img]);
    let out = super::harness::text(&o);
    assert!(
        !out.contains('\x1b') && !out.contains('\u{9b}') && !out.contains('\x07'),
        "raw control characters in the dump: {out:?}"
    );
    o.into()
}

/// This area's rows.
pub fn rows() -> Vec<Row> {
    vec![
        Row {
            what: "LUKS2 digest cut to 1 byte, wrong passphrases tested",
            needs: &[],
            expect: Expect::Exit(1, "at least 20 are needed"),
            case: |c: &mut Case| {
                let (img, _) = crafted(c, short_digest);
                // One wrong passphrase in 256 passed a 1-byte digest: try
                // enough that some would, were the header not refused.
                let mut last = None;
                for i in 0..600 {
                    let o = c.ucrypt_in(
                        &["open", "--test-passphrase", &img, "--key-file", "-"],
                        Some(format!("wrong {i}").as_bytes()),
                    );
                    assert_ne!(o.status.code(), Some(0), "wrong passphrase {i} opened it");
                    last = Some(o);
                    if i == 0 && last.as_ref().unwrap().status.code() == Some(1) {
                        break; // refused as a header: no passphrase is tried
                    }
                }
                last.unwrap().into()
            },
        },
        Row {
            what: "LUKS2 digest cut to 1 byte, right passphrase tested",
            needs: &[],
            expect: Expect::Exit(1, "at least 20 are needed"),
            case: |c: &mut Case| {
                let (img, key) = crafted(c, short_digest);
                c.ucrypt(&["open", "--test-passphrase", &img, "--key-file", &key])
                    .into()
            },
        },
        Row {
            what: "luksAddKey on a LUKS2 header with a 1-byte digest",
            needs: &[],
            expect: Expect::Exit(1, "at least 20 are needed"),
            case: |c: &mut Case| {
                let (img, key) = crafted(c, short_digest);
                let new = c.path("new.key");
                std::fs::write(&new, "another").unwrap();
                let n = new.to_str().unwrap();
                c.ucrypt(&[
                    "luksAddKey",
                    "-q",
                    "--pbkdf",
                    "pbkdf2",
                    "--pbkdf-force-iterations",
                    "1000",
                    "--key-file",
                    &key,
                    &img,
                    n,
                ])
                .into()
            },
        },
        Row {
            what: "LUKS2 keyslot asks for 64 GiB of Argon2 memory",
            needs: &[],
            expect: Expect::Exit(1, "beyond cryptsetup's limit"),
            case: |c: &mut Case| {
                let (img, _) = crafted(c, |v| {
                    set_kdf(
                        v,
                        serde_json::json!({
                            "type": "argon2id", "time": 4, "memory": 64u32 << 20, "cpus": 4
                        }),
                    )
                });
                // No key file and nothing on stdin: refused before a
                // passphrase is even asked for.
                c.ucrypt(&["open", "--test-passphrase", &img]).into()
            },
        },
        Row {
            what: "LUKS2 keyslot with 2^32-1 PBKDF2 iterations, Ctrl-C while it unlocks",
            needs: &[],
            expect: Expect::Survives,
            case: |c: &mut Case| {
                let (img, key) = crafted(c, |v| {
                    set_kdf(
                        v,
                        serde_json::json!({
                            "type": "pbkdf2", "hash": "sha256", "iterations": u32::MAX
                        }),
                    )
                });
                let mut cmd = c.command(&["open", "--test-passphrase", &img, "--key-file", &key]);
                crate::signals_common::default_interrupt(&mut cmd);
                cmd.stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped());
                let mut child = cmd.spawn().expect("spawn ucrypt");
                let stderr = child.stderr.take().unwrap();
                let (tx, rx) = std::sync::mpsc::channel();
                std::thread::spawn(move || {
                    for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                        let _ = tx.send(line);
                    }
                });
                // The notice comes before the derivation (hours of it).
                let notice = rx.recv_timeout(Duration::from_secs(120));
                let Ok(notice) = notice else {
                    let _ = child.kill();
                    let _ = child.wait();
                    panic!("no notice before the unlock: {notice:?}");
                };
                assert!(notice.contains("Keyslot 0 needs about "), "{notice}");
                let pid = child.id().to_string();
                let sent = std::process::Command::new("kill")
                    .args(["-INT", &pid])
                    .status()
                    .expect("kill");
                assert!(sent.success());
                // Promptly: far sooner than the derivation would end.
                let start = Instant::now();
                let status = loop {
                    if let Some(s) = child.try_wait().expect("wait") {
                        break s;
                    }
                    if start.elapsed() > Duration::from_secs(60) {
                        let _ = child.kill();
                        let _ = child.wait();
                        panic!("SIGINT did not end the unlock");
                    }
                    std::thread::sleep(Duration::from_millis(20));
                };
                assert_eq!(status.signal(), Some(SIGINT), "{status:?}");
                Outcome::note(None, format!("{notice} / ended by SIGINT"))
            },
        },
        Row {
            what: "luksFormat with --pbkdf-memory of 64 GiB",
            needs: &[],
            expect: Expect::Exit(1, "Requested maximum PBKDF memory cost is too high"),
            case: |c: &mut Case| {
                let img = c.image("v.img", 32 << 20);
                let key = c.path("v.key");
                std::fs::write(&key, PASS).unwrap();
                c.watch(&img);
                c.ucrypt(&[
                    "luksFormat",
                    "-q",
                    "--type",
                    "luks2",
                    "--pbkdf-memory",
                    "67108864",
                    "--key-file",
                    key.to_str().unwrap(),
                    img.to_str().unwrap(),
                ])
                .into()
            },
        },
        Row {
            what: "luksDump of a LUKS2 label holding terminal escapes",
            needs: &[],
            expect: Expect::Exit(0, "\\x1b]0;owned\\x07\\x1b[2J"),
            case: |c: &mut Case| {
                let img = c.image("v.img", 32 << 20);
                let key = c.path("v.key");
                std::fs::write(&key, PASS).unwrap();
                let mut a: Vec<&str> = testutil::FAST_LUKS2_FORMAT.to_vec();
                a.extend([
                    "--label",
                    EVIL,
                    "--key-file",
                    key.to_str().unwrap(),
                    img.to_str().unwrap(),
                ]);
                let o = c.ucrypt(&a);
                assert!(
                    o.status.success(),
                    "luksFormat: {}",
                    super::harness::text(&o)
                );
                c.watch(&img);
                dump_escaped(c, img.to_str().unwrap())
            },
        },
        Row {
            what: "luksDump of a LUKS2 token type holding terminal escapes",
            needs: &[],
            expect: Expect::Exit(0, "\\x1b[31mred\\x9b0m"),
            case: |c: &mut Case| {
                let (img, _) = crafted(c, |v| {
                    v["tokens"]["0"] = serde_json::json!({"type": EVIL, "keyslots": ["0"]});
                });
                dump_escaped(c, &img)
            },
        },
    ]
}
