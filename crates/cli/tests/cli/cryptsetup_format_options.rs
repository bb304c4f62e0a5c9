//! Side by side with cryptsetup 2.6: format's layout options
//! (`--align-payload`, `--luks2-metadata-size`, `--luks2-keyslots-size`,
//! `--offset`), keyslot encryption (`--keyslot-cipher`,
//! `--keyslot-key-size` on format, add-key and change-key), and key-file
//! ranges where cryptsetup takes them (kill-slot, a piped passphrase,
//! `--new-keyfile-offset/-size`).
//!
//! Each case runs the same command line through both tools on twin
//! images and checks: the same exit code and warnings, the same
//! `cryptsetup luksDump` (salts, digests, UUID-free: both get one
//! `--uuid`), each tool opens the other's volume, `cryptsetup repair`
//! finds nothing on ucrypt's. Refused values leave ucrypt's image as it
//! was: nothing is written before every option is checked.

use std::path::{Path, PathBuf};
use std::process::Output;

use testutil::TempDir;

const FAST: &[&str] = &["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
const UUID: &str = "6f5a5c3e-9c1d-4b53-8a0e-2f6c1d3b7a90";

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

fn text(o: &Output) -> String {
    format!(
        "exit {}\nstdout: {}\nstderr: {}",
        code(o),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn need(test: &str) -> bool {
    testutil::require_tool(test, "cryptsetup")
}

fn file(dir: &TempDir, name: &str, content: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, content).unwrap();
    p
}

fn image(dir: &TempDir, name: &str, mib: u64) -> PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p)
        .unwrap()
        .set_len(mib << 20)
        .unwrap();
    p
}

/// `cryptsetup luksDump` with salts, digests, the epoch and the digest's
/// iteration count (benchmarked) masked, and `dev` named DEV.
fn dump(dev: &Path) -> String {
    let o = testutil::run("cryptsetup", &["luksDump", s(dev)], None);
    assert_eq!(code(&o), 0, "luksDump {}: {}", dev.display(), text(&o));
    let mut digests = false;
    String::from_utf8(o.stdout)
        .unwrap()
        .replace(s(dev), "DEV")
        .lines()
        .map(|l| {
            let t = l.trim();
            digests |= t == "Digests:";
            let hex = !t.is_empty()
                && t.split(' ')
                    .all(|w| w.len() == 2 && w.bytes().all(|b| b.is_ascii_hexdigit()));
            let masked = [
                "Salt:",
                "Digest:",
                "Epoch:",
                "MK digest:",
                "MK salt:",
                "MK iterations:",
            ];
            if hex
                || masked.iter().any(|m| t.starts_with(m))
                || (digests && t.starts_with("Iterations:"))
            {
                "<masked>".to_string()
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `cryptsetup repair` on `dev` finds nothing.
fn repair_clean(dev: &Path, header: Option<&Path>) {
    let mut a = vec!["-v", "repair", s(dev)];
    if let Some(h) = header {
        a.extend(["--header", s(h)]);
    }
    let o = testutil::run("cryptsetup", &a, None);
    assert!(
        code(&o) == 0 && String::from_utf8_lossy(&o.stdout).contains("No known problems"),
        "repair {}: {}",
        dev.display(),
        text(&o)
    );
}

/// `open --test-passphrase` of `dev` by `prog` with key file `kf`.
fn opens(prog: &str, dev: &Path, header: Option<&Path>, kf: &Path) -> i32 {
    let mut a = vec!["open", "--test-passphrase", s(dev), "-d", s(kf)];
    if let Some(h) = header {
        a.extend(["--header", s(h)]);
    }
    code(&testutil::run(prog, &a, None))
}

/// Twin images (and twin detached headers if `detached`) for one case.
struct Twins {
    dir: TempDir,
    key: PathBuf,
    detached: bool,
}

impl Twins {
    fn new(tag: &str, detached: bool) -> Self {
        let dir = TempDir::new(tag);
        let key = file(&dir, "key", b"pw");
        Twins { dir, key, detached }
    }

    /// (data image, detached header) of `tool`'s copy, made `mib` MiB.
    fn paths(&self, tool: &str) -> (PathBuf, Option<PathBuf>) {
        let dev = self.dir.join(&format!("{tool}.img"));
        let hdr = self.detached.then(|| self.dir.join(&format!("{tool}.hdr")));
        (dev, hdr)
    }

    /// Formats both copies with `args`; the exit codes and stdout (the
    /// warnings) must agree. Returns ucrypt's output.
    fn format(&self, mib: u64, args: &[&str]) -> Output {
        let mut outs = Vec::new();
        for tool in ["cryptsetup", "ucrypt"] {
            let (dev, hdr) = self.paths(tool);
            image(&self.dir, dev.file_name().unwrap().to_str().unwrap(), mib);
            if let Some(h) = &hdr {
                // Both create a missing header file (cryptsetup asks, -q says yes).
                let _ = std::fs::remove_file(h);
            }
            let verb = if tool == "ucrypt" {
                "format"
            } else {
                "luksFormat"
            };
            let mut a = vec![verb, "-q", "--uuid", UUID];
            a.extend_from_slice(FAST);
            a.extend_from_slice(args);
            if let Some(h) = &hdr {
                a.extend(["--header", s(h)]);
            }
            a.extend([s(&dev), s(&self.key)]);
            outs.push(testutil::run(tool, &a, None));
        }
        let (c, u) = (&outs[0], &outs[1]);
        assert_eq!(
            (code(c), String::from_utf8_lossy(&c.stdout)),
            (code(u), String::from_utf8_lossy(&u.stdout)),
            "format {args:?}:\ncryptsetup {}\nucrypt {}",
            text(c),
            text(u)
        );
        outs.pop().unwrap()
    }

    /// Both headers dump alike, each tool opens the other's volume and
    /// `cryptsetup repair` finds nothing on ucrypt's.
    fn agree(&self, what: &str) {
        let (cd, ch) = self.paths("cryptsetup");
        let (ud, uh) = self.paths("ucrypt");
        let meta = |d: &PathBuf, h: &Option<PathBuf>| h.clone().unwrap_or_else(|| d.clone());
        let (cm, um) = (meta(&cd, &ch), meta(&ud, &uh));
        assert_eq!(
            dump(&cm).replace("cryptsetup.", "X."),
            dump(&um).replace("ucrypt.", "X."),
            "{what}: luksDump differs"
        );
        assert_eq!(
            opens("cryptsetup", &ud, uh.as_deref(), &self.key),
            0,
            "{what}"
        );
        assert_eq!(opens("ucrypt", &cd, ch.as_deref(), &self.key), 0, "{what}");
        repair_clean(&ud, uh.as_deref());
    }
}

#[test]
fn format_layout_options_match_cryptsetup() {
    if !need("format_layout_options_match_cryptsetup") {
        return;
    }
    let cases: &[(&str, &[&str], bool)] = &[
        ("align 1", &["--align-payload", "1"], false),
        ("align 3", &["--align-payload", "3"], false),
        ("align 2 MiB", &["--align-payload", "4096"], false),
        ("metadata 64k", &["--luks2-metadata-size", "64k"], false),
        (
            "metadata 32k keyslots 1m",
            &[
                "--luks2-metadata-size",
                "32k",
                "--luks2-keyslots-size",
                "1m",
            ],
            false,
        ),
        (
            "keyslots larger than the offset",
            &["--luks2-keyslots-size", "2m", "--offset", "4096"],
            false,
        ),
        ("offset beyond 16 MiB", &["--offset", "65536"], false),
        (
            "luks1 align 1000",
            &["--type", "luks1", "--align-payload", "1000"],
            false,
        ),
        (
            "luks1 align 1",
            &["--type", "luks1", "--align-payload", "1"],
            false,
        ),
        ("detached align", &["--align-payload", "4096"], true),
        (
            "detached keyslots size",
            &["--luks2-keyslots-size", "512k"],
            true,
        ),
        (
            "luks1 detached align",
            &["--type", "luks1", "--align-payload", "8192"],
            true,
        ),
    ];
    for (what, args, detached) in cases {
        let t = Twins::new("fmt-layout", *detached);
        let u = t.format(40, args);
        assert_eq!(code(&u), 0, "{what}: {}", text(&u));
        t.agree(what);
    }
}

#[test]
fn keyslot_cipher_on_format_add_and_change_matches_cryptsetup() {
    if !need("keyslot_cipher_on_format_add_and_change_matches_cryptsetup") {
        return;
    }
    let ks = [
        "--keyslot-cipher",
        "aes-cbc-essiv:sha256",
        "--keyslot-key-size",
        "256",
    ];
    let t = Twins::new("fmt-kscipher", false);
    let u = t.format(24, &ks);
    assert_eq!(code(&u), 0, "{}", text(&u));
    t.agree("format --keyslot-cipher");
    // add-key and change-key with another keyslot cipher, on both copies.
    let k2 = file(&t.dir, "k2", b"second");
    let k3 = file(&t.dir, "k3", b"third");
    let ks2 = [
        "--keyslot-cipher",
        "aes-xts-plain64",
        "--keyslot-key-size",
        "256",
    ];
    for tool in ["cryptsetup", "ucrypt"] {
        let dev = t.paths(tool).0;
        let (add, change) = if tool == "ucrypt" {
            ("add-key", "change-key")
        } else {
            ("luksAddKey", "luksChangeKey")
        };
        let mut a = vec![add, "-q", "-d", s(&t.key), s(&dev), s(&k2)];
        a.extend(FAST);
        a.extend(ks2);
        let o = testutil::run(tool, &a, None);
        assert_eq!(code(&o), 0, "{tool} add: {}", text(&o));
        let mut a = vec![change, "-q", "-d", s(&k2), "-S", "1", s(&dev), s(&k3)];
        a.extend(FAST);
        a.extend(ks);
        let o = testutil::run(tool, &a, None);
        assert_eq!(code(&o), 0, "{tool} change: {}", text(&o));
        assert_eq!(opens("cryptsetup", &dev, None, &k3), 0, "{tool}");
    }
    t.agree("add-key and change-key --keyslot-cipher");
}

#[test]
fn invalid_format_options_are_refused_before_writing() {
    if !need("invalid_format_options_are_refused_before_writing") {
        return;
    }
    let cases: &[&[&str]] = &[
        &["--align-payload", "8", "--offset", "4096"],
        &["--offset", "3"],
        &["--luks2-metadata-size", "12k"],
        &["--luks2-metadata-size", "8m"],
        &["--luks2-keyslots-size", "4097"],
        &["--luks2-keyslots-size", "200m"],
        &["--luks2-keyslots-size", "12q"],
        &["--type", "luks1", "--luks2-metadata-size", "32k"],
        &["--type", "luks1", "--luks2-keyslots-size", "1m"],
        &["--keyslot-cipher", "aes-xts-plain64"],
        &["--keyslot-key-size", "256"],
        &[
            "--keyslot-cipher",
            "aes-xts-plain64",
            "--keyslot-key-size",
            "7",
        ],
        &[
            "--keyslot-cipher",
            "aes-xts-plain64",
            "--keyslot-key-size",
            "0",
        ],
        &[
            "--type",
            "luks1",
            "--keyslot-cipher",
            "aes-xts-plain64",
            "--keyslot-key-size",
            "512",
        ],
        &[
            "--keyslot-cipher",
            "capi:xts(aes)-plain64",
            "--keyslot-key-size",
            "512",
        ],
        &[
            "--keyslot-cipher",
            "cipher_null-ecb",
            "--keyslot-key-size",
            "256",
        ],
    ];
    let dir = TempDir::new("fmt-refused");
    let key = file(&dir, "key", b"pw");
    let seed = testutil::random_bytes(24 << 20, 1515);
    for args in cases {
        let mut codes = Vec::new();
        for tool in ["cryptsetup", "ucrypt"] {
            let dev = dir.join(&format!("{tool}.img"));
            std::fs::write(&dev, &seed).unwrap();
            let verb = if tool == "ucrypt" {
                "format"
            } else {
                "luksFormat"
            };
            let mut a = vec![verb, "-q"];
            a.extend_from_slice(FAST);
            a.extend_from_slice(args);
            a.extend([s(&dev), s(&key)]);
            let o = testutil::run(tool, &a, None);
            codes.push(code(&o));
            if tool == "ucrypt" {
                assert!(
                    std::fs::read(&dev).unwrap() == seed,
                    "{args:?}: ucrypt wrote to the device: {}",
                    text(&o)
                );
            }
        }
        assert_eq!(codes, [1, 1], "{args:?}");
    }
    // add-key: keyslot encryption only for LUKS2, both options together.
    let dev = image(&dir, "l1.img", 8);
    let new = file(&dir, "new", b"new");
    let mut f = vec!["luksFormat", "-q", "--type", "luks1", s(&dev), s(&key)];
    f.extend(FAST);
    testutil::run_ok("cryptsetup", &f);
    let before = std::fs::read(&dev).unwrap();
    for (tool, verb) in [("cryptsetup", "luksAddKey"), ("ucrypt", "add-key")] {
        for extra in [
            &[
                "--keyslot-cipher",
                "aes-xts-plain64",
                "--keyslot-key-size",
                "512",
            ][..],
            &["--keyslot-cipher", "aes-xts-plain64"],
        ] {
            let mut a = vec![verb, "-q", "-d", s(&key), s(&dev), s(&new)];
            a.extend(FAST);
            a.extend(extra);
            let o = testutil::run(tool, &a, None);
            assert_eq!(code(&o), 1, "{tool} {extra:?}: {}", text(&o));
            assert!(std::fs::read(&dev).unwrap() == before, "{tool} {extra:?}");
        }
    }
}

/// A cryptsetup LUKS2 volume with "zero" in slot 0 and "one" in slot 1,
/// copied for each tool.
fn two_slot_volumes(dir: &TempDir) -> [PathBuf; 2] {
    let base = image(dir, "base.img", 24);
    let k0 = file(dir, "k0", b"zero");
    let k1 = file(dir, "k1", b"one");
    let mut f = vec!["luksFormat", "-q", s(&base), s(&k0)];
    f.extend(FAST);
    testutil::run_ok("cryptsetup", &f);
    let mut a = vec!["luksAddKey", "-q", "-d", s(&k0), s(&base), s(&k1)];
    a.extend(FAST);
    testutil::run_ok("cryptsetup", &a);
    ["cryptsetup", "ucrypt"].map(|t| {
        let p = dir.join(&format!("{t}.img"));
        std::fs::copy(&base, &p).unwrap();
        p
    })
}

/// One tool's command line (and stdin) for a device.
type CommandFor<'a> = dyn Fn(&str, &Path) -> (Vec<String>, Option<Vec<u8>>) + 'a;

#[test]
fn key_file_ranges_where_cryptsetup_takes_them() {
    if !need("key_file_ranges_where_cryptsetup_takes_them") {
        return;
    }
    let dir = TempDir::new("fmt-ranges");
    let devs = two_slot_volumes(&dir);
    let big = file(&dir, "big", b"XXzeroYYoneZZ");
    let verbs = |tool: &str| -> (&'static str, &'static str, &'static str) {
        if tool == "ucrypt" {
            ("kill-slot", "add-key", "change-key")
        } else {
            ("luksKillSlot", "luksAddKey", "luksChangeKey")
        }
    };
    let both = |what: &str, f: &CommandFor<'_>| {
        let mut codes = Vec::new();
        for (tool, dev) in ["cryptsetup", "ucrypt"].iter().zip(&devs) {
            let (args, stdin) = f(tool, dev);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let o = testutil::run(tool, &args, stdin.as_deref());
            codes.push((code(&o), text(&o)));
        }
        assert_eq!(codes[0].0, codes[1].0, "{what}: {codes:?}");
        codes[0].0
    };
    let own = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    // kill-slot: a wrong range is a wrong passphrase; then the right one.
    let bad = both("kill-slot wrong range", &|t, d| {
        let v = verbs(t).0;
        (
            own(&[
                v,
                "-q",
                s(d),
                "0",
                "-d",
                s(&big),
                "--keyfile-offset",
                "3",
                "-l",
                "3",
            ]),
            None,
        )
    });
    assert_eq!(bad, 2);
    let good = both("kill-slot range", &|t, d| {
        let v = verbs(t).0;
        (
            own(&[
                v,
                "-q",
                s(d),
                "0",
                "-d",
                s(&big),
                "--keyfile-offset",
                "8",
                "-l",
                "3",
            ]),
            None,
        )
    });
    assert_eq!(good, 0);
    // A piped passphrase (no --key-file) takes the range too; a newline
    // before the size is too little data.
    let new = file(&dir, "new", b"fresh");
    let mut fast: Vec<&str> = FAST.to_vec();
    fast.extend(["--keyfile-offset", "2", "-l", "3"]);
    let added = both("add-key piped range", &|t, d| {
        let mut a = own(&[verbs(t).1, "-q", s(d), s(&new)]);
        a.extend(own(&fast));
        (a, Some(b"..one..\n".to_vec()))
    });
    assert_eq!(added, 0);
    let short = both("add-key piped short", &|t, d| {
        let mut a = own(&[verbs(t).1, "-q", s(d), s(&new)]);
        a.extend(own(&fast));
        (a, Some(b"..o\nne\n".to_vec()))
    });
    assert_eq!(short, 1);
    let opened = both("open piped range", &|_, d| {
        (
            own(&[
                "open",
                "--test-passphrase",
                s(d),
                "--keyfile-offset",
                "1",
                "-l",
                "5",
            ]),
            Some(b"!fresh?".to_vec()),
        )
    });
    assert_eq!(opened, 0);
    // change-key: the new passphrase's range.
    let changed = both("change-key new range", &|t, d| {
        let mut a = own(&[verbs(t).2, "-q", "-d", s(&new), s(d), s(&big)]);
        a.extend(own(&[
            "--new-keyfile-offset",
            "8",
            "--new-keyfile-size",
            "3",
        ]));
        a.extend(own(FAST));
        (a, None)
    });
    assert_eq!(changed, 0);
    let one = file(&dir, "one", b"one");
    for d in &devs {
        let o = testutil::run(
            "cryptsetup",
            &["open", "--test-passphrase", s(d), "-d", s(&one)],
            None,
        );
        assert_eq!(code(&o), 0, "{}: {}", d.display(), text(&o));
    }
    assert_eq!(
        dump(&devs[0]).replace("cryptsetup.img", "X"),
        dump(&devs[1]).replace("ucrypt.img", "X")
    );
}
