//! LUKS2 decryption of a volume whose header is inside the device
//! (`reencrypt --decrypt --header NEWFILE DEVICE`, NEWFILE not existing):
//! the header exported, the data moved down by the data offset while it
//! is decrypted, against cryptsetup 2.6.1 (`--force-offline-reencrypt`
//! on image files). Ports `luks2-reencryption-test` [32]–[34], [37] and
//! `luks2-reencryption-mangle-test` [9] (the scenario map is in
//! `reencrypt_compat.rs`): the plaintext at the device start equals the
//! original and cryptsetup's result, each tool finishes the other's
//! `--init-only`, a crash at every write of a run is finished by both,
//! the volume mid-way maps to its plaintext, and every refusal is
//! cryptsetup's with every file unchanged.

use std::path::{Path, PathBuf};
use std::process::Output;

use serde_json::Value;
use testutil::{require_tool, Rng, TempDir};

use crate::reencrypt::ok;

const PW: &[u8] = b"datashift passphrase";

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn run(prog: &str, args: &[&str], stdin: &[u8]) -> Output {
    testutil::run(prog, args, Some(stdin))
}

/// A cryptsetup LUKS2 volume of `mib` MiB with its data at `offset`
/// sectors (`extra` luksFormat options), filled with seeded plaintext
/// through `ucrypt map --write --luks`.
struct Vol {
    dir: TempDir,
    img: PathBuf,
    hdr: PathBuf,
    key: PathBuf,
    plain: Vec<u8>,
}

impl Vol {
    fn new(tag: &str, mib: u64, offset: u64, extra: &[&str], seed: u64) -> Vol {
        let dir = TempDir::new(tag);
        let img = dir.join("img");
        let key = dir.join("key");
        std::fs::write(&key, PW).unwrap();
        std::fs::File::create(&img)
            .unwrap()
            .set_len(mib << 20)
            .unwrap();
        let off = offset.to_string();
        let mut a: Vec<&str> = testutil::FAST_LUKS2_FORMAT.to_vec();
        a.extend(["--offset", &off, "--key-file", s(&key)]);
        a.extend_from_slice(extra);
        a.push(s(&img));
        ok(run("cryptsetup", &a, b""), "luksFormat");
        let mut plain = vec![0u8; ((mib << 20) - offset * 512) as usize];
        Rng::new(seed).fill(&mut plain);
        ok(
            run(
                "ucrypt",
                &["map", "--write", "--luks", s(&img), "--key-file", s(&key)],
                &plain,
            ),
            "map --write",
        );
        let hdr = dir.join("hdr");
        Vol {
            dir,
            img,
            hdr,
            key,
            plain,
        }
    }

    /// A copy of the image (and of the header file, when there is one)
    /// named `tag`.
    fn copy(&self, tag: &str) -> (PathBuf, PathBuf) {
        let img = self.dir.join(&format!("{tag}.img"));
        let hdr = self.dir.join(&format!("{tag}.hdr"));
        std::fs::copy(&self.img, &img).unwrap();
        let _ = std::fs::remove_file(&hdr);
        if self.hdr.exists() {
            std::fs::copy(&self.hdr, &hdr).unwrap();
        }
        (img, hdr)
    }

    /// The plaintext at the start of `img` equals the original.
    fn check_plain(&self, img: &Path, what: &str) {
        let got = std::fs::read(img).unwrap();
        assert!(
            got[..self.plain.len()] == self.plain[..],
            "{what}: the plaintext at the device start"
        );
    }

    /// `ucrypt map --read --luks img --header hdr` serves the plaintext.
    fn check_map(&self, img: &Path, hdr: &Path, what: &str) {
        let out = ok(
            run(
                "ucrypt",
                &[
                    "map",
                    "--read",
                    "--luks",
                    s(img),
                    "--header",
                    s(hdr),
                    "--key-file",
                    s(&self.key),
                ],
                b"",
            ),
            what,
        );
        assert!(
            out.stdout.get(..self.plain.len()) == Some(&self.plain[..]),
            "{what}: map --read serves the plaintext"
        );
    }
}

impl Vol {
    /// A copy of the volume mid-way maps to its plaintext; `map` repairs
    /// a torn hotzone first, and when that hotzone was the last (the
    /// moved segment) the repair finishes the decryption: the copy's
    /// header is then a finished one (no keyslot) and the plaintext is in
    /// place.
    fn check_mid_way(&self, img: &Path, hdr: &Path, what: &str) {
        let mi = self.dir.join("m.img");
        let mh = self.dir.join("m.hdr");
        std::fs::copy(img, &mi).unwrap();
        std::fs::copy(hdr, &mh).unwrap();
        let out = run(
            "ucrypt",
            &[
                "map",
                "--read",
                "--luks",
                s(&mi),
                "--header",
                s(&mh),
                "--key-file",
                s(&self.key),
            ],
            b"",
        );
        if out.status.success() {
            assert!(
                out.stdout.get(..self.plain.len()) == Some(&self.plain[..]),
                "{what}: map --read serves the plaintext"
            );
        } else {
            assert!(
                json(&mh)["keyslots"].as_object().unwrap().is_empty(),
                "{what}: map failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            self.check_plain(&mi, &format!("{what}: finished by map's repair"));
        }
    }
}

/// `ucrypt reencrypt -q --key-file KEY ARGS IMG`.
fn ucrypt(v: &Vol, img: &Path, a: &[&str]) -> Output {
    let mut all = vec!["reencrypt", "-q", "--key-file", s(&v.key)];
    all.extend_from_slice(a);
    all.push(s(img));
    run("ucrypt", &all, b"")
}

/// `cryptsetup reencrypt -q --force-offline-reencrypt --key-file KEY
/// ARGS IMG`.
fn cryptsetup(v: &Vol, img: &Path, a: &[&str]) -> Output {
    let mut all = vec![
        "reencrypt",
        "-q",
        "--force-offline-reencrypt",
        "--key-file",
        s(&v.key),
    ];
    all.extend_from_slice(a);
    all.push(s(img));
    run("cryptsetup", &all, b"")
}

fn json(hdr: &Path) -> Value {
    let out = ok(
        run(
            "cryptsetup",
            &["luksDump", "--dump-json-metadata", s(hdr)],
            b"",
        ),
        "luksDump --dump-json-metadata",
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn in_reencryption(hdr: &Path) -> bool {
    json(hdr)["config"]["requirements"]["mandatory"]
        .as_array()
        .is_some_and(|m| m.iter().any(|r| r == "online-reencrypt-v3"))
}

/// The metadata without salts, digests and digest iterations (cryptsetup
/// benchmarks its verification digest's; ucrypt's has 1000).
fn shape(mut v: Value) -> Value {
    fn strip(v: &mut Value) {
        match v {
            Value::Object(m) => {
                m.remove("salt");
                m.remove("digest");
                for x in m.values_mut() {
                    strip(x);
                }
            }
            Value::Array(a) => a.iter_mut().for_each(strip),
            _ => {}
        }
    }
    strip(&mut v);
    if let Some(d) = v["digests"].as_object_mut() {
        for x in d.values_mut() {
            x.as_object_mut().unwrap().remove("iterations");
        }
    }
    v
}

/// [32]: a whole run of each tool (the passphrase on stdin, as the
/// script gives it), with data offsets of 4 MiB and of 16 MiB (the data
/// as large as the header): the plaintext at the device start, and the
/// finished header the same as cryptsetup's.
#[test]
fn a_whole_run_equals_cryptsetups() {
    if !require_tool("reencrypt_dshift_whole", "cryptsetup") {
        return;
    }
    for (offset, seed) in [(8192, 1), (32768, 2)] {
        let v = Vol::new("dshift-whole", 32, offset, &[], seed);
        let (ui, uh) = v.copy("u");
        let (ci, ch) = v.copy("c");
        ok(
            run(
                "ucrypt",
                &["reencrypt", s(&ui), "-q", "--decrypt", "--header", s(&uh)],
                PW,
            ),
            "ucrypt reencrypt --decrypt --header NEW",
        );
        ok(
            run(
                "cryptsetup",
                &[
                    "reencrypt",
                    s(&ci),
                    "-q",
                    "--force-offline-reencrypt",
                    "--decrypt",
                    "--header",
                    s(&ch),
                ],
                PW,
            ),
            "cryptsetup reencrypt --decrypt --header NEW",
        );
        v.check_plain(&ui, &format!("ucrypt, offset {offset}"));
        v.check_plain(&ci, &format!("cryptsetup, offset {offset}"));
        assert!(!in_reencryption(&uh), "finished");
        assert_eq!(shape(json(&uh)), shape(json(&ch)), "offset {offset}");
        let mode = |p: &Path| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::metadata(p).unwrap().permissions().mode() & 0o777
        };
        assert_eq!(mode(&uh), mode(&ch), "the header file's mode");
    }
}

/// [32] in two steps: `--init-only` writes cryptsetup's metadata and
/// moves the same bytes (the two devices equal), the volume then maps to
/// its plaintext through the exported header, and each tool finishes
/// the other's start.
#[test]
fn each_tool_finishes_the_others_init() {
    if !require_tool("reencrypt_dshift_init", "cryptsetup") {
        return;
    }
    let v = Vol::new("dshift-init", 32, 8192, &[], 3);
    let (ui, uh) = v.copy("u");
    let (ci, ch) = v.copy("c");
    ok(
        ucrypt(&v, &ui, &["--decrypt", "--header", s(&uh), "--init-only"]),
        "ucrypt --init-only",
    );
    ok(
        cryptsetup(&v, &ci, &["--decrypt", "--header", s(&ch), "--init-only"]),
        "cryptsetup --init-only",
    );
    assert!(in_reencryption(&uh));
    assert_eq!(shape(json(&uh)), shape(json(&ch)), "the metadata");
    assert!(
        std::fs::read(&ui).unwrap() == std::fs::read(&ci).unwrap(),
        "the device after the init"
    );
    v.check_map(&ui, &uh, "ucrypt's init");
    v.check_map(&ci, &ch, "cryptsetup's init");
    // Each resumes the other's (the script's second call names
    // --decrypt --header again: a resume).
    ok(
        cryptsetup(&v, &ui, &["--resume-only", "--header", s(&uh)]),
        "cryptsetup resumes ucrypt's init",
    );
    ok(
        ucrypt(&v, &ci, &["--decrypt", "--header", s(&ch)]),
        "ucrypt resumes cryptsetup's init",
    );
    v.check_plain(&ui, "cryptsetup after ucrypt's init");
    v.check_plain(&ci, "ucrypt after cryptsetup's init");
    assert_eq!(shape(json(&uh)), shape(json(&ch)), "the finished metadata");
}

/// [33], [34] (recovery after a failed write in the shift area or in the
/// moved segment, dm-error there) with crash points instead: the run
/// aborted after each of its writes (`datashift-checksum` with the moved
/// segment as large as the data offset, 4 MiB, and of 1 MiB;
/// `datashift-journal` with 3 MiB, the script's size, as its journal
/// must hold it); the volume maps to its plaintext, ucrypt finishes it,
/// and cryptsetup (on a copy, after its `repair`) finishes it too —
/// except where the next hotzone is a moved segment smaller than the
/// shift: cryptsetup 2.6.1's resume sizes that hotzone as the shift and
/// fails ("Failed to write reencryption resilience metadata."), and
/// ucrypt finishes cryptsetup's repaired copy instead.
#[test]
fn a_crash_at_any_write_is_finished_by_both_tools() {
    if !require_tool("reencrypt_dshift_crash", "cryptsetup") {
        return;
    }
    for (res, moved) in [
        ("checksum", None),
        ("checksum", Some("1M")),
        ("journal", Some("3M")),
    ] {
        let v = Vol::new("dshift-crash", 16, 8192, &["--sector-size", "512"], 4);
        let mut n = 1;
        loop {
            let (ui, uh) = v.copy("u");
            let out = std::process::Command::new(testutil::ucrypt_bin())
                .env("UCRYPT_REENCRYPT_CRASH_AFTER", n.to_string())
                .args(["reencrypt", "-q", "--decrypt", "--header", s(&uh)])
                .args(["--resilience", res])
                .args(moved.map(|m| vec!["--hotzone-size", m]).unwrap_or_default())
                .args(["--key-file", s(&v.key), s(&ui)])
                .output()
                .unwrap();
            if out.status.success() {
                assert!(n > 10, "{res}: a run has more than 10 writes");
                v.check_plain(&ui, res);
                break;
            }
            let what = format!("{res} {moved:?}, crash {n}");
            assert!(
                uh.exists(),
                "{what}: the header file exists: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let ci = v.dir.join("c.img");
            let ch = v.dir.join("c.hdr");
            std::fs::copy(&ui, &ci).unwrap();
            std::fs::copy(&uh, &ch).unwrap();
            let finished = json(&uh)["keyslots"].as_object().unwrap().is_empty();
            if finished {
                // Aborted after the final header (its keyslots gone with
                // the old key): the plaintext is in place.
                v.check_plain(&ui, &what);
            } else if in_reencryption(&uh) {
                v.check_mid_way(&ui, &uh, &what);
                ok(
                    ucrypt(&v, &ui, &["--resume-only", "--header", s(&uh)]),
                    &format!("{what}: ucrypt resume"),
                );
                let mut a = vec!["repair", "-q", "--key-file", s(&v.key)];
                a.extend(["--header", s(&ch), s(&ci)]);
                ok(run("cryptsetup", &a, b""), &format!("{what}: repair"));
                if in_reencryption(&ch) {
                    let out = cryptsetup(&v, &ci, &["--resume-only", "--header", s(&ch)]);
                    let err = String::from_utf8_lossy(&out.stderr);
                    if moved.is_some() && err.contains("Failed to write reencryption resilience") {
                        ok(
                            ucrypt(&v, &ci, &["--resume-only", "--header", s(&ch)]),
                            &format!("{what}: ucrypt after cryptsetup's repair"),
                        );
                    } else {
                        ok(out, &format!("{what}: cryptsetup resume"));
                    }
                }
                v.check_plain(&ui, &format!("{what}: ucrypt"));
                v.check_plain(&ci, &format!("{what}: cryptsetup"));
            } else {
                // The crash came before the metadata: the file holds the
                // old header, the data still at its offset (as
                // cryptsetup leaves it).
                v.check_map(&ci, &ch, &format!("{what}: old header"));
            }
            n += 1;
        }
    }
}

/// [37]: data offsets near 512 MiB (a 16 MiB keyslots area), the data
/// 16 MiB and 1 MiB: the moved segment as large as the data.
#[test]
fn large_data_offsets() {
    if !require_tool("reencrypt_dshift_large", "cryptsetup") {
        return;
    }
    for (offset, seed) in [(1015808, 5), (1046528, 6)] {
        let v = Vol::new(
            "dshift-large",
            512,
            offset,
            &["--sector-size", "512", "--luks2-keyslots-size", "16M"],
            seed,
        );
        ok(
            run(
                "ucrypt",
                &[
                    "reencrypt",
                    "--decrypt",
                    "--header",
                    s(&v.hdr),
                    s(&v.img),
                    "-q",
                ],
                PW,
            ),
            "ucrypt reencrypt --decrypt",
        );
        v.check_plain(&v.img, &format!("offset {offset}"));
        assert!(!in_reencryption(&v.hdr));
    }
}

fn sha(files: &[&Path]) -> Vec<Option<Vec<u8>>> {
    files.iter().map(|f| std::fs::read(f).ok()).collect()
}

/// Refused by both tools with the same exit code (and ucrypt with
/// cryptsetup's wording), every file unchanged and no header file
/// created: no `--header`, a header file that is not LUKS, a wrong
/// passphrase, `--resilience none`/`datashift`, a moved segment larger
/// than the data offset, a device that is not LUKS2.
#[test]
fn refusals_are_cryptsetups_and_write_nothing() {
    if !require_tool("reencrypt_dshift_refusals", "cryptsetup") {
        return;
    }
    let v = Vol::new("dshift-refuse", 16, 4096, &[], 7);
    let junk = v.dir.join("junk");
    std::fs::write(&junk, vec![0x5a; 1 << 20]).unwrap();
    let wrong = v.dir.join("wrong");
    std::fs::write(&wrong, b"not the passphrase").unwrap();
    let plainfile = v.dir.join("plain");
    std::fs::write(&plainfile, vec![7u8; 8 << 20]).unwrap();
    let hdr = s(&v.hdr);
    let key = s(&v.key);
    let cases: Vec<(Vec<&str>, &Path, &str)> = vec![
        (
            vec!["--decrypt", "--key-file", key],
            &v.img,
            "LUKS2 decryption requires --header option.",
        ),
        (
            vec!["--decrypt", "--header", s(&junk), "--key-file", key],
            &v.img,
            "is not a valid LUKS device.",
        ),
        (
            vec!["--decrypt", "--header", hdr, "--key-file", s(&wrong)],
            &v.img,
            "No key available with this passphrase.",
        ),
        (
            vec![
                "--decrypt",
                "--header",
                hdr,
                "--key-file",
                key,
                "--resilience",
                "none",
            ],
            &v.img,
            "Requested --resilience option cannot be applied to current reencryption operation.",
        ),
        (
            vec![
                "--decrypt",
                "--header",
                hdr,
                "--key-file",
                key,
                "--resilience",
                "datashift",
            ],
            &v.img,
            "Requested --resilience option cannot be applied to current reencryption operation.",
        ),
        (
            vec![
                "--decrypt",
                "--header",
                hdr,
                "--key-file",
                key,
                "--hotzone-size",
                "4M",
            ],
            &v.img,
            "Moved segment size can not be greater than data shift value.",
        ),
        (
            vec!["--decrypt", "--header", hdr, "--key-file", key],
            &plainfile,
            "does not exist or access denied.",
        ),
    ];
    for (a, dev, msg) in cases {
        let files: [&Path; 4] = [&v.img, dev, &junk, &v.hdr];
        let before = sha(&files);
        let mut all = vec!["reencrypt", "-q"];
        all.extend_from_slice(&a);
        all.push(s(dev));
        let u = run("ucrypt", &all, b"");
        assert!(sha(&files) == before, "{a:?}: ucrypt wrote");
        let mut all = vec!["reencrypt", "-q", "--force-offline-reencrypt"];
        all.extend_from_slice(&a);
        all.push(s(dev));
        let c = run("cryptsetup", &all, b"");
        assert!(sha(&files) == before, "{a:?}: cryptsetup wrote");
        assert!(!u.status.success(), "{a:?}: ucrypt passed");
        assert_eq!(u.status.code(), c.status.code(), "{a:?}: exit codes");
        let err = String::from_utf8_lossy(&u.stderr);
        assert!(err.contains(msg), "{a:?}: {err}");
    }
}

/// The JSON area of a 16 KiB-metadata LUKS2 header file rewritten (both
/// copies, their checksums recomputed), as the mangle script's
/// `img_update_json` does.
fn mangle(hdr: &Path, j: &Value) {
    const MSIZE: usize = 16384;
    let text = serde_json::to_vec(j).unwrap();
    let mut b = std::fs::read(hdr).unwrap();
    for base in [0, MSIZE] {
        let area = &mut b[base + 4096..base + MSIZE];
        area.fill(0);
        area[..text.len()].copy_from_slice(&text);
        let h = &mut b[base..base + MSIZE];
        h[448..448 + 64].fill(0);
        let out = testutil::run("sha256sum", &[], Some(h));
        let hex = String::from_utf8(out.stdout).unwrap();
        for i in 0..32 {
            h[448 + i] = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap();
        }
    }
    std::fs::write(hdr, &b).unwrap();
}

/// mangle-test [9]: cryptsetup's `--init-only` of a decryption with a
/// data shift, its metadata changed without the key (the checksum hash,
/// its block size, the resilience type, the requirement version, the
/// shift): refused by both tools, nothing written; the untouched
/// metadata is finished by ucrypt.
#[test]
fn mangled_datashift_metadata_is_refused() {
    if !require_tool("reencrypt_dshift_mangle", "cryptsetup") {
        return;
    }
    let v = Vol::new("dshift-mangle", 32, 8192, &[], 8);
    ok(
        cryptsetup(
            &v,
            &v.img,
            &[
                "--decrypt",
                "--init-only",
                "--resilience",
                "checksum",
                "--header",
                s(&v.hdr),
            ],
        ),
        "cryptsetup --init-only",
    );
    let pristine = std::fs::read(&v.hdr).unwrap();
    let orig = json(&v.hdr);
    let rs = orig["keyslots"]
        .as_object()
        .unwrap()
        .iter()
        .find(|(_, k)| k["type"] == "reencrypt")
        .map(|(id, _)| id.clone())
        .unwrap();
    type Edit = Box<dyn Fn(&mut Value)>;
    let r = rs.clone();
    let mut edits: Vec<(&str, Edit)> = vec![(
        "hash",
        Box::new(move |j| j["keyslots"][&r]["area"]["hash"] = "sha12345".into()),
    )];
    let r = rs.clone();
    edits.push((
        "sector size",
        Box::new(move |j| j["keyslots"][&r]["area"]["sector_size"] = 1024.into()),
    ));
    let r = rs.clone();
    edits.push((
        "resilience type",
        Box::new(move |j| {
            let a = j["keyslots"][&r]["area"].as_object_mut().unwrap();
            a.remove("hash");
            a.insert("type".into(), "datashift-journal".into());
        }),
    ));
    edits.push((
        "requirement",
        Box::new(|j| {
            j["config"]["requirements"]["mandatory"] = serde_json::json!(["online-reencrypt-v2"])
        }),
    ));
    let r = rs.clone();
    edits.push((
        "shift",
        Box::new(move |j| {
            let a = &mut j["keyslots"][&r]["area"];
            let n: u64 = a["shift_size"].as_str().unwrap().parse().unwrap();
            a["shift_size"] = (n - 4096).to_string().into();
        }),
    ));
    for (what, edit) in edits {
        std::fs::write(&v.hdr, &pristine).unwrap();
        let mut j = orig.clone();
        edit(&mut j);
        mangle(&v.hdr, &j);
        let files: [&Path; 2] = [&v.img, &v.hdr];
        let before = sha(&files);
        let u = ucrypt(&v, &v.img, &["--resume-only", "--header", s(&v.hdr)]);
        assert!(!u.status.success(), "{what}: ucrypt resumed");
        assert!(sha(&files) == before, "{what}: ucrypt wrote");
        let c = cryptsetup(&v, &v.img, &["--resume-only", "--header", s(&v.hdr)]);
        assert!(!c.status.success(), "{what}: cryptsetup resumed");
        assert!(sha(&files) == before, "{what}: cryptsetup wrote");
    }
    std::fs::write(&v.hdr, &pristine).unwrap();
    ok(
        ucrypt(&v, &v.img, &["--resume-only", "--header", s(&v.hdr)]),
        "ucrypt finishes the untouched metadata",
    );
    v.check_plain(&v.img, "after the mangled attempts");
}
