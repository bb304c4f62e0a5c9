//! `luks2-reencryption-mangle-test` [1]–[6]: reencryption metadata of
//! cryptsetup before 2.4 (the requirement `online-reencrypt`, no
//! verification digest) made from a cryptsetup `--init-only` as the
//! script's `img_prepare`/`img_update_json` make it, and the requirement
//! flags of [1]. Before `repair`, ucrypt answers each header as
//! cryptsetup 2.6.1 does (exit code and message, every file unchanged);
//! `ucrypt repair` with the passphrase upgrades it so that cryptsetup
//! opens and resumes it, and after `cryptsetup repair` ucrypt does; the
//! plaintext both ways is the same.

use std::path::Path;

use serde_json::{json, Value};
use testutil::{require_tool, Rng, TempDir};

use super::reencrypt::ok;
use super::reencrypt_compat::{fill_with, json, mangle, run, s, FAST_PBKDF2};

/// One image of the script: 32 MiB, 16 KiB metadata, data at 16 MiB.
struct Img {
    img: std::path::PathBuf,
    key: std::path::PathBuf,
    wrong: std::path::PathBuf,
}

const DATA_OFFSET: usize = 16 << 20;

impl Img {
    fn new(dir: &TempDir) -> Self {
        let key = dir.join("key1");
        std::fs::write(&key, b"old metadata key file").unwrap();
        let wrong = dir.join("wrong");
        std::fs::write(&wrong, b"not the key").unwrap();
        Img {
            img: dir.join("img"),
            key,
            wrong,
        }
    }

    /// img_prepare: formatted, filled with seeded plaintext, cryptsetup's
    /// `--init-only --resilience none`; the JSON it left.
    fn prepare(&self) -> Value {
        let f = std::fs::File::create(&self.img).unwrap();
        f.set_len(32 << 20).unwrap();
        let mut a = vec!["luksFormat", "--type", "luks2", "-q"];
        a.extend_from_slice(FAST_PBKDF2);
        a.extend([
            "--key-file",
            s(&self.key),
            "--luks2-metadata-size",
            "16384",
            s(&self.img),
        ]);
        ok(run("cryptsetup", &a, b""), "luksFormat");
        fill_with(&self.img, None, &self.key, 81);
        let a = [
            "reencrypt",
            s(&self.img),
            "-q",
            "--key-file",
            s(&self.key),
            "--init-only",
            "--resilience",
            "none",
        ];
        ok(run("cryptsetup", &a, b""), "reencrypt --init-only");
        json(&self.img)
    }

    fn bytes(&self) -> Vec<u8> {
        std::fs::read(&self.img).unwrap()
    }

    /// `tool ARGS` with the key file `key` (the image last).
    fn with(&self, tool: &str, a: &[&str], key: &Path) -> std::process::Output {
        let mut v = a.to_vec();
        v.extend(["--key-file", s(key), s(&self.img)]);
        run(tool, &v, b"")
    }
}

/// What fill_with wrote (the same seed gives the same data).
fn plain() -> Vec<u8> {
    let mut p = vec![0u8; 16 << 20];
    Rng::new(81).fill(&mut p);
    p
}

fn stderr(o: &std::process::Output) -> String {
    let e = String::from_utf8_lossy(&o.stderr);
    e.strip_prefix("ucrypt: ")
        .unwrap_or(&e)
        .trim_end()
        .to_string()
}

/// Both tools' `verb` of the image, each leaving it unchanged; their
/// exit codes equal. Returns (ucrypt's, cryptsetup's) stderr.
fn both(im: &Img, ucrypt: &[&str], cs: &[&str], key: &Path, what: &str) -> (String, String) {
    let before = im.bytes();
    let c = im.with("cryptsetup", cs, key);
    assert!(im.bytes() == before, "{what}: cryptsetup {cs:?} wrote");
    let u = im.with("ucrypt", ucrypt, key);
    assert!(im.bytes() == before, "{what}: ucrypt {ucrypt:?} wrote");
    assert!(!u.status.success(), "{what}: ucrypt {ucrypt:?} passed");
    assert_eq!(
        u.status.code(),
        c.status.code(),
        "{what}: {ucrypt:?}: ucrypt {} / cryptsetup {}",
        stderr(&u),
        stderr(&c)
    );
    (stderr(&u), stderr(&c))
}

/// ucrypt's `verb` of the image refused, the image unchanged; its stderr.
fn ucrypt_refuses(im: &Img, verb: &[&str], what: &str) -> String {
    let before = im.bytes();
    let u = im.with("ucrypt", verb, &im.key);
    assert!(!u.status.success(), "{what}: ucrypt {verb:?} passed");
    assert!(im.bytes() == before, "{what}: ucrypt {verb:?} wrote");
    stderr(&u)
}

const TEST_PASS: &[&str] = &["open", "--test-passphrase"];
const CS_RESUME: &[&str] = &[
    "reencrypt",
    "--resume-only",
    "-q",
    "--force-offline-reencrypt",
];
const RESUME: &[&str] = &["reencrypt", "--resume-only", "-q"];
const REPAIR: &[&str] = &["repair", "-q"];

/// The script's [2]–[6] edits: `hotzone_ivs` gives the segment after the
/// hotzone the IV tweak of its offset (the script keeps 0, which
/// cryptsetup accepts and which reads that segment with the wrong IVs;
/// ucrypt refuses such a layout).
fn old_layout(j: &mut Value, case: u32, hotzone_ivs: bool) {
    let digests = j["digests"].as_object_mut().unwrap();
    digests.remove("2");
    let s0 = j["segments"]["0"].clone();
    let (s1, s2) = (j["segments"]["1"].clone(), j["segments"]["2"].clone());
    let area_size: u64 = j["keyslots"]["2"]["area"]["size"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let offset: u64 = s0["offset"].as_str().unwrap().parse().unwrap();
    let merge = |base: &Value, add: Value| {
        let mut v = base.clone();
        for (k, x) in add.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    };
    let mut after = merge(&s0, json!({"offset": (offset + area_size).to_string()}));
    if hotzone_ivs {
        after["iv_tweak"] = (area_size / 512).to_string().into();
    }
    let checksum = |j: &mut Value| {
        let a = &mut j["keyslots"]["2"]["area"];
        a["type"] = "checksum".into();
        a["hash"] = "sha256".into();
        a["sector_size"] = 4096.into();
    };
    match case {
        2 | 3 => {
            if case == 2 {
                j["keyslots"]["2"]["area"]["type"] = "journal".into();
            } else {
                checksum(j);
            }
            let hot = merge(
                &s0,
                json!({"size": area_size.to_string(), "flags": ["in-reencryption"]}),
            );
            j["segments"] = json!({"0": hot, "1": after, "2": s1, "3": s2});
            j["digests"]["0"]["segments"] = json!(["1", "2"]);
            j["digests"]["1"]["segments"] = json!(["0", "3"]);
        }
        4 | 5 => {
            j["digests"].as_object_mut().unwrap().remove("1");
            j["keyslots"].as_object_mut().unwrap().remove("1");
            j["keyslots"]["2"]["mode"] = "decrypt".into();
            if case == 4 {
                j["keyslots"]["2"]["area"]["type"] = "journal".into();
            } else {
                checksum(j);
            }
            j["segments"] = json!({
                "0": {"type": "linear", "offset": offset.to_string(),
                      "size": area_size.to_string(), "flags": ["in-reencryption"]},
                "1": after,
                "2": s1,
                "3": {"type": "linear", "offset": offset.to_string(), "size": "dynamic",
                      "flags": ["backup-final"]},
            });
            j["digests"]["0"]["segments"] = json!(["1", "2"]);
        }
        6 => {
            let ks = &mut j["keyslots"]["2"];
            ks["direction"] = "backward".into();
            ks["area"]["type"] = "datashift".into();
            ks["area"]["size"] = "4096".into();
            ks["area"]["shift_size"] = (1u64 << 20).to_string().into();
            j["segments"] = json!({
                "0": merge(&s0, json!({"size": (13u64 << 20).to_string()})),
                "1": merge(&s0, json!({"offset": (30u64 << 20).to_string()})),
                "2": s1,
                "3": merge(&s2, json!({"offset": (17u64 << 20).to_string()})),
            });
            j["digests"]["0"]["segments"] = json!(["0", "2"]);
            j["digests"]["1"]["segments"] = json!(["1", "3"]);
        }
        _ => unreachable!(),
    }
    j["config"]["requirements"]["mandatory"] = json!(["online-reencrypt"]);
}

/// The plaintext after the run: through ucrypt's map while the header
/// has a key, else (a finished decryption) the raw data area.
fn read_plain(im: &Img) -> Vec<u8> {
    let j = json(&im.img);
    if j["segments"]["0"]["type"] == "linear" {
        return im.bytes()[DATA_OFFSET..].to_vec();
    }
    let a = [
        "map",
        "--read",
        "--luks",
        s(&im.img),
        "--key-file",
        s(&im.key),
    ];
    ok(run("ucrypt", &a, b""), "map --read").stdout
}

/// cryptsetup's answers to metadata that needs the upgrade are
/// ucrypt's, word for word, with the right and a wrong passphrase (a
/// `torn` hotzone: a resume names the recovery first).
fn same_refusals(im: &Img, what: &str, torn: bool) {
    let (u, c) = both(im, TEST_PASS, TEST_PASS, &im.key, what);
    assert_eq!(u, c, "{what}: --test-passphrase");
    assert_eq!(
        u,
        "Reencryption metadata is invalid.\nNo usable keyslot is available."
    );
    let (u, c) = both(im, TEST_PASS, TEST_PASS, &im.wrong, what);
    assert_eq!(u, c, "{what}: --test-passphrase, wrong passphrase");
    let (u, c) = both(im, RESUME, CS_RESUME, &im.key, what);
    assert_eq!(u, c, "{what}: resume");
    let (u, c) = both(im, RESUME, CS_RESUME, &im.wrong, what);
    if torn {
        assert_eq!(u, c, "{what}: resume, wrong passphrase");
        assert_eq!(
            u,
            "Device requires reencryption recovery. Run repair first."
        );
    } else {
        assert_eq!(u, "No usable keyslot is available.", "{what}");
        // cryptsetup says nothing here.
        assert_eq!(c, "", "{what}");
    }
    let (u, c) = both(im, REPAIR, REPAIR, &im.wrong, what);
    assert_eq!(u, c, "{what}: repair, wrong passphrase");
}

#[test]
fn old_reencryption_metadata_is_upgraded_by_either_repair() {
    if !require_tool("reencrypt_old_metadata", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("reenc-v1");
    let im = Img::new(&dir);
    let plain = plain();

    // [1]: the old flag without its digest, otherwise untouched.
    // [2]–[5]: a hotzone torn in old metadata (the script's layout, its
    // IV tweak made consistent); [6] below.
    for case in [1, 2, 3, 4, 5] {
        let what = &format!("[{case}]");
        let mut j = im.prepare();
        let hot: usize = j["keyslots"]["2"]["area"]["size"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
        if case == 1 {
            j["digests"].as_object_mut().unwrap().remove("2");
            j["config"]["requirements"]["mandatory"] = json!(["online-reencrypt"]);
        } else {
            old_layout(&mut j, case, true);
        }
        mangle(&im.img, &j);
        same_refusals(&im, what, case > 1);
        let orig = im.bytes();

        // ucrypt's repair; cryptsetup opens it, recovers the hotzone
        // (its repair again) and finishes.
        ok(im.with("ucrypt", REPAIR, &im.key), what);
        let up = json(&im.img);
        assert_eq!(
            up["config"]["requirements"]["mandatory"],
            json!(["online-reencrypt-v2"]),
            "{what}"
        );
        ok(im.with("cryptsetup", TEST_PASS, &im.key), what);
        ok(im.with("cryptsetup", REPAIR, &im.key), what);
        ok(im.with("cryptsetup", CS_RESUME, &im.key), what);
        let by_cryptsetup = read_plain(&im);

        // cryptsetup's repair; ucrypt finishes (its resume recovers the
        // hotzone) and opens the result.
        std::fs::write(&im.img, &orig).unwrap();
        ok(im.with("cryptsetup", REPAIR, &im.key), what);
        let cs = json(&im.img);
        let reenc = |j: &Value| {
            j["digests"]
                .as_object()
                .unwrap()
                .values()
                .find(|d| d["keyslots"] == json!(["2"]))
                .map(|d| (d["segments"].clone(), d["type"].clone()))
        };
        assert_eq!(reenc(&up), reenc(&cs), "{what}: the verification digest");
        assert_eq!(up["config"], cs["config"], "{what}");
        ok(im.with("ucrypt", RESUME, &im.key), what);
        if case < 4 {
            ok(im.with("ucrypt", TEST_PASS, &im.key), what);
            ok(im.with("cryptsetup", TEST_PASS, &im.key), what);
        }
        let by_ucrypt = read_plain(&im);
        assert!(by_ucrypt == by_cryptsetup, "{what}: the two ends differ");
        // A torn hotzone's data is lost (the mangled resilience area
        // holds none of it); the rest is the plaintext.
        let hot = if case == 1 { 0 } else { hot };
        assert!(by_ucrypt[hot..] == plain[hot..], "{what}: data");
    }

    // [2]–[5] verbatim: both refuse with the same exit code, nothing
    // written; ucrypt's repair is one cryptsetup goes on from, while
    // ucrypt refuses to run the layout after cryptsetup's repair.
    for case in [2, 3, 4, 5] {
        let what = &format!("[{case}] verbatim");
        let mut j = im.prepare();
        old_layout(&mut j, case, false);
        mangle(&im.img, &j);
        both(&im, TEST_PASS, TEST_PASS, &im.key, what);
        both(&im, RESUME, CS_RESUME, &im.key, what);
        let orig = im.bytes();
        ok(im.with("ucrypt", REPAIR, &im.key), what);
        ok(im.with("cryptsetup", REPAIR, &im.key), what);
        ok(im.with("cryptsetup", CS_RESUME, &im.key), what);
        std::fs::write(&im.img, &orig).unwrap();
        ok(im.with("cryptsetup", REPAIR, &im.key), what);
        let u = ucrypt_refuses(&im, RESUME, what);
        assert!(
            u.contains("does not continue the reencryption layout"),
            "{u}"
        );
    }

    // [6] a reencryption with a data shift (cryptsetup 2.2's): upgraded
    // by ucrypt for cryptsetup to finish; ucrypt does not run it.
    let what = "[6]";
    let mut j = im.prepare();
    old_layout(&mut j, 6, false);
    mangle(&im.img, &j);
    both(&im, TEST_PASS, TEST_PASS, &im.key, what);
    both(&im, RESUME, CS_RESUME, &im.key, what);
    let orig = im.bytes();
    ok(im.with("ucrypt", REPAIR, &im.key), what);
    ok(im.with("cryptsetup", TEST_PASS, &im.key), what);
    ok(im.with("cryptsetup", CS_RESUME, &im.key), what);
    ok(im.with("cryptsetup", TEST_PASS, &im.key), what);
    std::fs::write(&im.img, &orig).unwrap();
    ok(im.with("cryptsetup", REPAIR, &im.key), what);
    let u = ucrypt_refuses(&im, RESUME, what);
    assert!(u.contains("is not supported by ucrypt"), "{u}");
}

/// [1]'s requirement flags: an unknown `online-reencryptx` with the
/// reencrypt keyslot, or a second reencryption requirement, is no LUKS2
/// header to either tool (cryptsetup's wording); an unknown version
/// (`online-reencrypt-v999`) or an unknown requirement beside the
/// reencryption's, which cryptsetup only dumps, ucrypt refuses too. The
/// requirement put back makes it an ordinary reencryption again.
#[test]
fn reencryption_requirement_flags() {
    if !require_tool("reencrypt_old_flags", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("reenc-v1-flags");
    let im = Img::new(&dir);
    type Edit = fn(&mut Vec<Value>);
    let invalid: &[(&str, Edit)] = &[
        ("online-reencryptx", |m| {
            *m = vec!["online-reencryptx".into()]
        }),
        ("v2 + v999", |m| m.push("online-reencrypt-v999".into())),
        ("v2 + v1", |m| m.push("online-reencrypt".into())),
    ];
    let edit = |e: Edit| {
        let mut j = im.prepare();
        let mut m: Vec<Value> = j["config"]["requirements"]["mandatory"]
            .as_array()
            .unwrap()
            .clone();
        e(&mut m);
        j["config"]["requirements"]["mandatory"] = Value::Array(m);
        mangle(&im.img, &j);
    };
    for (what, e) in invalid {
        edit(*e);
        let (u, c) = both(&im, TEST_PASS, TEST_PASS, &im.key, what);
        assert!(c.ends_with("is not a valid LUKS device."), "{what}: {c}");
        assert!(u.contains("is not a valid LUKS device"), "{what}: {u}");
        let (u, c) = both(&im, REPAIR, REPAIR, &im.key, what);
        assert_eq!(u, c, "{what}: repair");
        both(&im, RESUME, CS_RESUME, &im.key, what);
    }
    let unknown: &[(&str, Edit)] = &[
        ("v999", |m| *m = vec!["online-reencrypt-v999".into()]),
        ("v2 + v3X", |m| m.push("online-reencrypt-v3X".into())),
    ];
    for (what, e) in unknown {
        edit(*e);
        ok(
            run("cryptsetup", &["luksDump", s(&im.img)], b""),
            "luksDump",
        );
        both(&im, REPAIR, REPAIR, &im.key, what);
        both(&im, RESUME, CS_RESUME, &im.key, what);
        ucrypt_refuses(&im, TEST_PASS, what);
    }
    edit(|m| *m = vec!["online-reencrypt-v2".into()]);
    ok(im.with("ucrypt", RESUME, &im.key), "v2 restored");
    ok(im.with("cryptsetup", TEST_PASS, &im.key), "v2 restored");
}
