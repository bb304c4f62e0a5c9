//! cryptsetup 2.6's header verbs side by side: `token add|remove|import|
//! export|unassign`, `config`, `erase`/`luksErase`, `repair`, `convert`
//! and `luksConvertKey`. Each case copies one volume made by cryptsetup,
//! runs the same command line through cryptsetup on one copy and ucrypt
//! on the other, and checks that the exit codes agree, that
//! `cryptsetup luksDump` shows the same header (salts, digests and the
//! epoch masked), that the data area is untouched, that the passphrases
//! that should open still open (`cryptsetup open --test-passphrase`) and
//! that `cryptsetup repair` finds nothing to repair on ucrypt's result.
//!
//! One deliberate difference: with no terminal to confirm on, cryptsetup
//! erases or converts anyway; ucrypt refuses (exit 1) unless
//! `--batch-mode`, as its `format` and `remove-key` already do.

use std::path::{Path, PathBuf};
use std::process::Output;

use testutil::TempDir;

const FAST: &[&str] = &["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

fn text(o: &Output) -> String {
    format!(
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// `cryptsetup luksDump` with what differs between two honest writers
/// masked: salts, digests, the epoch.
fn dump(dev: &Path) -> String {
    let o = testutil::run("cryptsetup", &["luksDump", s(dev)], None);
    assert_eq!(code(&o), 0, "luksDump {}: {}", dev.display(), text(&o));
    let name = s(dev).to_string();
    String::from_utf8(o.stdout)
        .unwrap()
        .replace(&name, "DEV")
        .lines()
        .map(|l| {
            let t = l.trim();
            let hex = !t.is_empty()
                && t.split(' ')
                    .all(|w| w.len() == 2 && w.bytes().all(|b| b.is_ascii_hexdigit()));
            let masked = ["Salt:", "Digest:", "Epoch:", "MK digest:", "MK salt:"];
            if hex || masked.iter().any(|m| t.starts_with(m)) {
                "<masked>".to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Two copies of one volume: cryptsetup works on `cs`, ucrypt on `uc`.
struct Pair {
    _dir: TempDir,
    cs: PathBuf,
    uc: PathBuf,
    key: PathBuf,
    data_offset: u64,
    data: Vec<u8>,
}

impl Pair {
    /// A volume formatted by cryptsetup with `args`, passphrase "pw" in
    /// slot 0 and "pw" again in slot 1, and 64 KiB of known data.
    fn new(tag: &str, args: &[&str]) -> Self {
        let dir = TempDir::new(tag);
        let key = dir.join("key");
        std::fs::write(&key, b"pw").unwrap();
        let base = dir.join("base.img");
        std::fs::File::create(&base)
            .unwrap()
            .set_len(24 << 20)
            .unwrap();
        let mut fmt = vec!["luksFormat", "-q"];
        fmt.extend_from_slice(FAST);
        fmt.extend_from_slice(args);
        fmt.extend_from_slice(&[s(&base), s(&key)]);
        testutil::run_ok("cryptsetup", &fmt);
        let mut add = vec!["luksAddKey", "-q", "-d", s(&key)];
        add.extend_from_slice(FAST);
        add.extend_from_slice(&[s(&base), s(&key)]);
        testutil::run_ok("cryptsetup", &add);
        let json = testutil::run_ok("cryptsetup", &["luksDump", s(&base)]);
        let data_offset = json
            .lines()
            .find_map(|l| {
                let l = l.trim();
                l.strip_prefix("offset: ")
                    .map(|o| o.trim_end_matches(" [bytes]").parse::<u64>().unwrap())
                    .or_else(|| {
                        l.strip_prefix("Payload offset:")
                            .map(|o| o.trim().parse::<u64>().unwrap() * 512)
                    })
            })
            .expect("data offset in luksDump");
        let data = testutil::random_bytes(64 << 10, 15);
        let mut img = std::fs::read(&base).unwrap();
        img[data_offset as usize..data_offset as usize + data.len()].copy_from_slice(&data);
        std::fs::write(&base, &img).unwrap();
        let cs = dir.join("cs.img");
        let uc = dir.join("uc.img");
        std::fs::copy(&base, &cs).unwrap();
        std::fs::copy(&base, &uc).unwrap();
        Pair {
            _dir: dir,
            cs,
            uc,
            key,
            data_offset,
            data,
        }
    }

    /// Runs `args` (DEVICE stands for the image) through both tools with
    /// the same stdin; the exit codes must agree. Returns (cryptsetup, ucrypt).
    fn both(&self, args: &[&str], stdin: Option<&[u8]>) -> (Output, Output) {
        let with = |dev: &Path| -> Vec<String> {
            args.iter()
                .map(|a| {
                    if *a == "DEVICE" {
                        s(dev).to_string()
                    } else {
                        a.to_string()
                    }
                })
                .collect()
        };
        let a: Vec<String> = with(&self.cs);
        let b: Vec<String> = with(&self.uc);
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        let b: Vec<&str> = b.iter().map(String::as_str).collect();
        let c = testutil::run("cryptsetup", &a, stdin);
        let u = testutil::run("ucrypt", &b, stdin);
        assert_eq!(
            code(&c),
            code(&u),
            "{args:?}: cryptsetup\n{}\nucrypt\n{}",
            text(&c),
            text(&u)
        );
        (c, u)
    }

    /// Both headers look the same to `cryptsetup luksDump`, ucrypt's passes
    /// `cryptsetup repair`, and neither tool touched the data.
    fn agree(&self, what: &str) {
        assert_eq!(dump(&self.cs), dump(&self.uc), "{what}: luksDump differs");
        let o = testutil::run("cryptsetup", &["-v", "repair", s(&self.uc)], None);
        assert_eq!(code(&o), 0, "{what}: repair: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("No known problems"),
            "{what}: repair found something: {}",
            text(&o)
        );
        for img in [&self.cs, &self.uc] {
            let b = std::fs::read(img).unwrap();
            let at = self.data_offset as usize;
            assert!(
                b[at..at + self.data.len()] == self.data[..],
                "{what}: data area of {} changed",
                img.display()
            );
        }
    }

    /// `cryptsetup open --test-passphrase` exit code on ucrypt's copy.
    fn opens(&self, slot: &str) -> i32 {
        let o = testutil::run(
            "cryptsetup",
            &[
                "open",
                "--test-passphrase",
                "-d",
                s(&self.key),
                "-S",
                slot,
                s(&self.uc),
            ],
            None,
        );
        code(&o)
    }
}

fn need(test: &str) -> bool {
    testutil::require_tool(test, "cryptsetup")
}

#[test]
fn token_verbs_match_cryptsetup() {
    if !need("token_verbs_match_cryptsetup") {
        return;
    }
    let p = Pair::new("tokens", &["--type", "luks2"]);
    let steps: &[(&[&str], Option<&[u8]>)] = &[
        (
            &["token", "add", "--key-description", "k:one", "DEVICE"],
            None,
        ),
        (
            &[
                "-v",
                "token",
                "add",
                "--key-description",
                "two",
                "-S",
                "1",
                "--token-id",
                "5",
                "DEVICE",
            ],
            None,
        ),
        (
            &[
                "token",
                "add",
                "--key-description",
                "again",
                "--token-id",
                "5",
                "DEVICE",
            ],
            None,
        ),
        (
            &[
                "token",
                "add",
                "--key-description",
                "over",
                "--token-id",
                "5",
                "--token-replace",
                "DEVICE",
            ],
            None,
        ),
        (
            &[
                "token",
                "add",
                "--key-description",
                "x",
                "--token-id",
                "32",
                "DEVICE",
            ],
            None,
        ),
        (
            &[
                "token",
                "add",
                "--key-description",
                "x",
                "-S",
                "6",
                "DEVICE",
            ],
            None,
        ),
        (&["token", "add", "DEVICE"], None),
        (
            &["token", "import", "--token-id", "7", "-S", "1", "DEVICE"],
            Some(br#"{"type":"x","keyslots":["0"],"k":1}"#),
        ),
        (
            &["token", "import", "--token-only", "DEVICE"],
            Some(br#"{"type":"y","keyslots":["4"]}"#),
        ),
        (&["token", "import", "DEVICE"], Some(b"garbage")),
        (
            &["token", "import", "DEVICE"],
            Some(br#"{"type":"luks2-keyring","keyslots":[]}"#),
        ),
        (
            &["token", "unassign", "--token-id", "7", "-S", "1", "DEVICE"],
            None,
        ),
        (
            &["token", "unassign", "--token-id", "7", "-S", "1", "DEVICE"],
            None,
        ),
        (&["token", "unassign", "--token-id", "7", "DEVICE"], None),
        (
            &["-v", "token", "remove", "--token-id", "0", "DEVICE"],
            None,
        ),
        (&["token", "remove", "--token-id", "0", "DEVICE"], None),
        (&["token", "remove", "DEVICE"], None),
        (&["token", "export", "--token-id", "9", "DEVICE"], None),
    ];
    for (args, stdin) in steps {
        let (c, u) = p.both(args, *stdin);
        if code(&c) == 0 {
            assert_eq!(c.stdout, u.stdout, "{args:?}: stdout");
        }
        p.agree(&format!("{args:?}"));
    }
    for id in ["5", "7"] {
        let (c, u) = p.both(&["token", "export", "--token-id", id, "DEVICE"], None);
        assert_eq!(code(&c), 0);
        assert_eq!(c.stdout, u.stdout, "export {id}");
    }
    // Tokens follow their keyslots: killing slot 1 drops it from token 5.
    p.both(&["luksKillSlot", "-q", "DEVICE", "1"], None);
    p.agree("kill slot 1");
    assert_eq!(p.opens("0"), 0);
    // LUKS1 has no tokens.
    let l1 = Pair::new("tokens1", &["--type", "luks1"]);
    let (_, u) = l1.both(&["token", "add", "--key-description", "x", "DEVICE"], None);
    assert_eq!(code(&u), 1, "{}", text(&u));
}

#[test]
fn config_matches_cryptsetup() {
    if !need("config_matches_cryptsetup") {
        return;
    }
    let p = Pair::new("config", &["--type", "luks2"]);
    let steps: &[&[&str]] = &[
        &[
            "-v",
            "config",
            "--label",
            "L1",
            "--subsystem",
            "S1",
            "DEVICE",
        ],
        &["config", "--priority", "prefer", "-S", "1", "DEVICE"],
        &["config", "--priority", "ignore", "-S", "0", "DEVICE"],
        &["config", "--priority", "prefer", "DEVICE"],
        &["config", "--priority", "bogus", "-S", "1", "DEVICE"],
        &["config", "--priority", "normal", "-S", "5", "DEVICE"],
        &["config", "--label", "", "DEVICE"],
        &["config", "--priority", "normal", "-S", "0", "DEVICE"],
    ];
    for args in steps {
        let (c, u) = p.both(args, None);
        assert_eq!(c.stdout, u.stdout, "{args:?}: stdout");
        p.agree(&format!("{args:?}"));
    }
    assert_eq!(p.opens("1"), 0);
    let l1 = Pair::new("config1", &["--type", "luks1"]);
    let (_, u) = l1.both(&["config", "--label", "x", "DEVICE"], None);
    assert_eq!(code(&u), 1);
    l1.agree("LUKS1 config refused");
}

#[test]
fn erase_matches_cryptsetup() {
    if !need("erase_matches_cryptsetup") {
        return;
    }
    for ty in ["luks1", "luks2"] {
        let p = Pair::new(&format!("erase-{ty}"), &["--type", ty]);
        if ty == "luks2" {
            p.both(&["token", "add", "--key-description", "k", "DEVICE"], None);
        }
        // Without a terminal to confirm on, cryptsetup goes ahead; ucrypt
        // refuses (exit 1) unless --batch-mode, as its format and
        // remove-key do. A deliberate difference.
        let u = testutil::run("ucrypt", &["erase", s(&p.uc)], Some(b"YES\n"));
        assert_eq!(code(&u), 1, "{}", text(&u));
        assert_eq!(p.opens("0"), 0, "{ty}: erase without confirmation");
        for verb in ["erase", "luksErase"] {
            let (c, u) = p.both(&["-q", "-v", verb, "DEVICE"], None);
            assert_eq!(code(&c), 0, "{}", text(&c));
            assert_eq!(c.stdout, u.stdout);
            p.agree(&format!("{ty} {verb}"));
        }
        assert_ne!(p.opens("0"), 0, "{ty}: erased slot still opens");
        assert_ne!(p.opens("1"), 0, "{ty}: erased slot still opens");
    }
}

#[test]
fn repair_matches_cryptsetup() {
    if !need("repair_matches_cryptsetup") {
        return;
    }
    let p = Pair::new("repair", &["--type", "luks2"]);
    let (c, u) = p.both(&["-v", "repair", "DEVICE"], None);
    assert_eq!(c.stdout, u.stdout, "clean header");
    // Damage one copy's JSON on both images: each tool rewrites it from
    // the other copy.
    for (at, what) in [(16384 + 4096 + 2, "secondary"), (4096 + 2, "primary")] {
        for img in [&p.cs, &p.uc] {
            let mut b = std::fs::read(img).unwrap();
            b[at] ^= 0x55;
            std::fs::write(img, &b).unwrap();
        }
        let (c, _) = p.both(&["-q", "repair", "DEVICE"], None);
        assert_eq!(code(&c), 0, "{what}: {}", text(&c));
        p.agree(&format!("repair of the {what} copy"));
        for img in [&p.cs, &p.uc] {
            let b = std::fs::read(img).unwrap();
            assert_eq!(
                b[4096..16384],
                b[16384 + 4096..32768],
                "{what}: copies differ in {}",
                img.display()
            );
        }
        assert_eq!(p.opens("0"), 0);
    }
}

#[test]
fn convert_matches_cryptsetup() {
    if !need("convert_matches_cryptsetup") {
        return;
    }
    let p = Pair::new("convert", &["--type", "luks1"]);
    let lu1 = std::fs::read(&p.uc).unwrap()[..592].to_vec();
    // Not confirmed (no terminal): ucrypt refuses, see erase.
    let u = testutil::run("ucrypt", &["convert", "--type", "luks2", s(&p.uc)], None);
    assert_eq!(code(&u), 1, "{}", text(&u));
    assert_eq!(std::fs::read(&p.uc).unwrap()[..592], lu1[..]);
    p.both(&["convert", "-q", "--type", "luks2", "DEVICE"], None);
    p.agree("LUKS1 -> LUKS2");
    assert_eq!(p.opens("0"), 0);
    assert_eq!(p.opens("1"), 0);
    // Already LUKS2; then back.
    p.both(&["convert", "-q", "--type", "luks2", "DEVICE"], None);
    p.both(&["convert", "-q", "--type", "luks7", "DEVICE"], None);
    p.both(&["convert", "-q", "--type", "luks1", "DEVICE"], None);
    p.agree("LUKS2 -> LUKS1");
    let back = std::fs::read(&p.uc).unwrap();
    assert_eq!(
        back[..592],
        lu1[..],
        "the round trip gives the same LUKS1 header"
    );
    assert_eq!(p.opens("1"), 0);
    // With a token, LUKS1 cannot hold the header: both refuse.
    p.both(&["convert", "-q", "--type", "luks2", "DEVICE"], None);
    p.both(&["token", "add", "--key-description", "k", "DEVICE"], None);
    let (c, _) = p.both(&["convert", "-q", "--type", "luks1", "DEVICE"], None);
    assert_eq!(code(&c), 1);
    p.agree("refused with a token");
    // A native LUKS2 volume (4096-byte sectors, a 32-byte digest) is
    // refused too.
    let n = Pair::new("convert2", &["--type", "luks2"]);
    let (c, _) = n.both(&["convert", "-q", "--type", "luks1", "DEVICE"], None);
    assert_eq!(code(&c), 1);
    n.agree("native LUKS2 refused");
}

#[test]
fn convert_key_matches_cryptsetup() {
    if !need("convert_key_matches_cryptsetup") {
        return;
    }
    let p = Pair::new("convkey", &["--type", "luks2"]);
    let key = p.key.to_str().unwrap().to_string();
    let argon = [
        "--pbkdf",
        "argon2i",
        "--pbkdf-memory",
        "32",
        "--pbkdf-force-iterations",
        "4",
        "--pbkdf-parallel",
        "1",
    ];
    let mut a = vec!["-v", "luksConvertKey", "-d", &key, "-S", "0"];
    a.extend_from_slice(&argon);
    a.push("DEVICE");
    let (c, u) = p.both(&a, None);
    assert_eq!(code(&c), 0, "{}", text(&c));
    assert_eq!(c.stdout, u.stdout);
    p.agree("slot 0 to argon2i");
    assert_eq!(p.opens("0"), 0);
    let mut a = vec!["luksConvertKey", "-d", &key, "-S", "3"];
    a.extend_from_slice(&argon);
    a.push("DEVICE");
    p.both(&a, None);
    p.agree("inactive slot refused");
    let l1 = Pair::new("convkey1", &["--type", "luks1"]);
    let (c, _) = l1.both(
        &["luksConvertKey", "-d", &key, "--pbkdf", "pbkdf2", "DEVICE"],
        None,
    );
    assert_eq!(code(&c), 1);
    l1.agree("LUKS1 refused");
}

#[test]
fn dump_json_agrees_with_cryptsetup_metadata() {
    if !need("dump_json_agrees_with_cryptsetup_metadata") {
        return;
    }
    use serde_json::Value;
    let p = Pair::new("dumpjson", &["--type", "luks2", "--label", "L"]);
    p.both(
        &[
            "token",
            "add",
            "--key-description",
            "k",
            "-S",
            "1",
            "DEVICE",
        ],
        None,
    );
    p.both(
        &["config", "--priority", "prefer", "-S", "1", "DEVICE"],
        None,
    );
    let ours: Value =
        serde_json::from_str(&testutil::run_ok("ucrypt", &["dump", "--json", s(&p.uc)])).unwrap();
    let meta: Value = serde_json::from_str(&testutil::run_ok(
        "cryptsetup",
        &["luksDump", "--dump-json-metadata", s(&p.uc)],
    ))
    .unwrap();
    let uuid = testutil::run_ok("cryptsetup", &["luksUUID", s(&p.uc)]);
    assert_eq!(ours["schema"], 1);
    assert_eq!(ours["version"], 2);
    assert_eq!(ours["uuid"], uuid.trim());
    assert_eq!(ours["label"], "L");
    assert_eq!(ours["subsystem"], Value::Null);
    let seg = &meta["segments"]["0"];
    assert_eq!(ours["cipher"], seg["encryption"]);
    assert_eq!(ours["sector_size"], seg["sector_size"]);
    assert_eq!(
        ours["data_offset"].to_string(),
        seg["offset"].as_str().unwrap()
    );
    let slots = ours["keyslots"].as_array().unwrap();
    assert_eq!(slots.len(), meta["keyslots"].as_object().unwrap().len());
    for k in slots {
        let theirs = &meta["keyslots"][k["id"].to_string()];
        assert_eq!(k["pbkdf"], theirs["kdf"]["type"]);
        assert_eq!(k["iterations"], theirs["kdf"]["iterations"]);
        assert_eq!(
            k["area_offset"].to_string(),
            theirs["area"]["offset"].as_str().unwrap()
        );
        let prio = if theirs["priority"] == 2 {
            "preferred"
        } else {
            "normal"
        };
        assert_eq!(k["priority"], prio);
    }
    assert_eq!(ours["tokens"][0]["type"], meta["tokens"]["0"]["type"]);
    assert_eq!(ours["tokens"][0]["keyslots"], serde_json::json!([1]));
    // LUKS1: the same shape.
    let l1 = Pair::new("dumpjson1", &["--type", "luks1"]);
    let ours: Value =
        serde_json::from_str(&testutil::run_ok("ucrypt", &["dump", "--json", s(&l1.uc)])).unwrap();
    assert_eq!(ours["version"], 1);
    assert_eq!(ours["data_offset"], l1.data_offset);
    assert_eq!(ours["keyslots"].as_array().unwrap().len(), 2);
    assert_eq!(ours["tokens"], serde_json::json!([]));
}

/// `luksAddKey --new-key-slot N`: the new key lands in N and `--key-slot`
/// then picks the slot to unlock with (without `--new-key-slot` it still
/// names the new key's slot); a busy, out-of-range or unlockable slot and
/// `luksChangeKey --new-key-slot` fail with cryptsetup's exit codes.
#[test]
fn add_key_new_key_slot_matches_cryptsetup() {
    if !need("add_key_new_key_slot_matches_cryptsetup") {
        return;
    }
    for (luks, past_end) in [("luks2", "32"), ("luks1", "8")] {
        let p = Pair::new("newslot", &["--type", luks]);
        let new = p.key.with_file_name("new");
        std::fs::write(&new, b"other").unwrap();
        let (key, newk) = (s(&p.key), s(&new));
        let add = |extra: &[&str]| -> Vec<String> {
            let mut v = vec!["luksAddKey", "-q", "-d"];
            v.push(key);
            v.extend_from_slice(FAST);
            v.extend_from_slice(extra);
            v.extend_from_slice(&["DEVICE", newk]);
            v.into_iter().map(String::from).collect()
        };
        let steps: Vec<(Vec<String>, i32)> = vec![
            (add(&["--new-key-slot", "5"]), 0),
            (add(&["-S", "1", "--new-key-slot", "3"]), 0),
            (add(&["-S", "5", "--new-key-slot", "4"]), 2),
            (add(&["--new-key-slot", "1"]), 1),
            (add(&["--new-key-slot", past_end]), 1),
            (add(&["-S", "6"]), 0),
            (
                ["luksChangeKey", "-q", "-d", key, "--new-key-slot", "2"]
                    .iter()
                    .chain(FAST)
                    .chain(&["DEVICE", newk])
                    .map(|a| a.to_string())
                    .collect(),
                1,
            ),
        ];
        for (args, want) in &steps {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let (c, _) = p.both(&args, None);
            assert_eq!(code(&c), *want, "{luks} {args:?}: {}", text(&c));
        }
        p.agree(&format!("{luks} luksAddKey --new-key-slot"));
        assert_eq!(p.opens("0"), 0, "{luks}: slot 0");
        assert_eq!(p.opens("5"), 2, "{luks}: slot 5 holds the new key");
    }
}
