//! cryptsetup's TrueCrypt/VeraCrypt image suite (v2.6.1:
//! `tests/tcrypt-compat-test` with `tests/tcrypt-images.tar.xz`), with
//! ucrypt in cryptsetup's place, checking what the script checks:
//!
//! - header checks: `tcryptDump` of every image with the script's
//!   passwords, PIM, `--tcrypt-system`, `--tcrypt-hidden` and keyfiles,
//!   and the refusals it expects (`-h xxxx`, `-c xxx`, VeraCrypt images
//!   with `--disable-veracrypt`);
//! - activation: every image the script activates, decrypted with
//!   `ucrypt map --tcrypt … --read` (the table cryptsetup would load, run
//!   through the engine) and its filesystem UUID read by `blkid -p`
//!   (`DEAD-BABE`, hidden volumes `CAFE-BABE`).
//!
//! Like the script, each image is opened with the hash and first cipher
//! its name gives (`-h HASH -c CIPHER`). The images of TrueCrypt's legacy
//! modes map through `lrw-benbi` and `cbc-tcw` as cryptsetup 2.6.1 maps
//! them, except the chains cryptsetup refuses to activate (CBC cascades,
//! `cbci-tcrypt`, and Blowfish, `cbc-tcrypt`): those must be refused with
//! its message, "Kernel does not support activation for this TCRYPT
//! legacy mode." (the script accepts that refusal as N/A). All 28 legacy
//! images run in `legacy_images_map_or_are_refused_as_cryptsetup_does`
//! (TrueCrypt KDFs only: fast), which checks beyond the UUID: the boot
//! sector, reserved sector and both FATs must equal those of a TrueCrypt 5
//! XTS image's plaintext (byte-identical across the images; the sectors
//! after them hold each volume's random fill, so they cannot be compared).
//! `legacy_volumes_are_writable_as_cryptsetup_maps_them` writes through
//! NBD to a `cbc-tcw` (cast5) and an `lrw-benbi` cascade copy.
//!
//! Where cryptsetup can decrypt headers here (it needs the kernel's
//! AF_ALG `algif_skcipher`), `tcryptDump`'s output is compared with its
//! byte for byte. By default every fourth image runs (CI time);
//! `UCRYPT_TCRYPT_ALL_IMAGES=1` runs all 80. The images are GPL test data: fetched at test time by
//! `scripts/fetch-cryptsetup-tests.sh`, never stored here. Images run on
//! as many threads as there are cores.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

const PASSWORD: &str = "aaaaaaaaaaaa";
const PASSWORD_HIDDEN: &str = "bbbbbbbbbbbb";
const PASSWORD_72C: &str =
    "aaaaaaaaaaaabbbbbbbbbbbbccccccccccccddddddddddddeeeeeeeeeeeeffffffffffff";
const PIM: &str = "1234";
/// cryptsetup's refusal of the legacy modes it cannot activate.
const LEGACY_REFUSAL: &str = "Kernel does not support activation for this TCRYPT legacy mode.";

/// Runs `prog args` with `stdin` piped in (a passphrase line).
fn run(prog: &Path, args: &[String], stdin: &str) -> Output {
    use std::io::Write;
    let mut child = Command::new(prog)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{}: {e}", prog.display()));
    let mut input = child.stdin.take().expect("stdin");
    let _ = input.write_all(stdin.as_bytes());
    drop(input);
    child.wait_with_output().expect("wait")
}

/// The hash and first cipher an image's name gives, as the script's
/// `get_HASH_CIPHER` cuts them, and its mode.
fn hash_cipher_mode(name: &str) -> (String, String, String) {
    let f: Vec<&str> = name.split('-').collect();
    (f[1].to_owned(), f[3].to_owned(), f[2].to_owned())
}

/// One image's checks; returns the failures (empty: passed) and whether
/// it was mapped.
fn check_image(dir: &Path, name: &str, cs_dump: bool) -> (Vec<String>, bool) {
    let ucrypt = testutil::ucrypt_bin();
    let file = dir.join(name);
    let file_s = file.display().to_string();
    let (hash, cipher, mode) = hash_cipher_mode(name);
    let mut fails = Vec::new();
    let mut mapped = false;
    let hidden = name.ends_with("-hidden");
    let keyfiles = name.starts_with("tck_") || name.starts_with("vck_");
    let mut opts: Vec<String> = Vec::new();
    if name.starts_with("vcpim") {
        opts.extend(["--veracrypt-pim".into(), PIM.into()]);
    }
    if name.starts_with("sys_") {
        opts.push("--tcrypt-system".into());
    }
    let filt = |h: &str, c: &str| vec!["-h".to_string(), h.into(), "-c".into(), c.into()];
    let dump = |extra: &[String], pw: &str| -> Output {
        let mut a = vec!["tcryptDump".to_string()];
        a.extend(opts.iter().cloned());
        a.extend(extra.iter().cloned());
        a.push(file_s.clone());
        run(&ucrypt, &a, &format!("{pw}\n"))
    };
    if keyfiles {
        // HEADER KEYFILES CHECK
        let pw = if name.starts_with("vck_1_nopw") {
            ""
        } else if name.starts_with("vck_1_pw72") {
            PASSWORD_72C
        } else {
            PASSWORD
        };
        let mut extra = vec![
            "-d".to_string(),
            dir.join("keyfile1").display().to_string(),
            "-d".into(),
            dir.join("keyfile2").display().to_string(),
        ];
        extra.extend(filt(&hash, &cipher));
        let o = dump(&extra, pw);
        if !o.status.success() {
            fails.push(format!(
                "tcryptDump with keyfiles: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
        return (fails, mapped);
    }
    // HEADER CHECK
    let o = dump(&filt(&hash, &cipher), PASSWORD);
    let mut cipher_mode = String::new();
    if o.status.success() {
        let text = String::from_utf8_lossy(&o.stdout);
        // The file names list a chain as TrueCrypt's UI does; cryptsetup
        // names it in its own order: compare the ciphers as a set.
        let mut want: Vec<&str> = name.split('-').skip(3).filter(|p| *p != "hidden").collect();
        want.sort_unstable();
        let chain = text
            .lines()
            .find_map(|l| l.strip_prefix("Cipher chain:\t"))
            .unwrap_or_default();
        text.lines()
            .find_map(|l| l.strip_prefix("Cipher mode:\t"))
            .unwrap_or_default()
            .clone_into(&mut cipher_mode);
        // cryptsetup calls TrueCrypt's Blowfish `blowfish_le`.
        let mut got: Vec<&str> = chain
            .split('-')
            .map(|c| if c == "blowfish_le" { "blowfish" } else { c })
            .collect();
        got.sort_unstable();
        if got != want {
            fails.push(format!(
                "tcryptDump chain {chain:?}, the name says {want:?}"
            ));
        }
        if !text.contains(&format!("PBKDF2 hash:\t{hash}\n")) {
            fails.push(format!("tcryptDump lacks the hash {hash}: {text}"));
        }
        if cs_dump {
            let mut a = vec!["tcryptDump".to_string()];
            a.extend(opts.iter().cloned());
            a.extend(filt(&hash, &cipher));
            a.push(file_s.clone());
            let c = run(Path::new("cryptsetup"), &a, &format!("{PASSWORD}\n"));
            if c.stdout != o.stdout {
                fails.push(format!(
                    "tcryptDump differs from cryptsetup's:\n{}\n---\n{}",
                    String::from_utf8_lossy(&o.stdout),
                    String::from_utf8_lossy(&c.stdout)
                ));
            }
        }
    } else {
        fails.push(format!(
            "tcryptDump: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    if name.ends_with("-sha512-xts-aes") && !name.starts_with("sys_") {
        if !dump(&filt("sha512", "aes"), PASSWORD).status.success() {
            fails.push("tcryptDump -h sha512 -c aes failed".into());
        }
        let bad_hash = vec!["-h".to_string(), "xxxx".into()];
        if dump(&bad_hash, PASSWORD).status.success() {
            fails.push("tcryptDump -h xxxx succeeded".into());
        }
        if dump(&filt("sha512", "xxx"), PASSWORD).status.success() {
            fails.push("tcryptDump -c xxx succeeded".into());
        }
        // A wrong passphrase: cryptsetup's message and exit code 2.
        let o = dump(&filt("sha512", "aes"), "wrong passphrase");
        let err = String::from_utf8_lossy(&o.stderr);
        if o.status.code() != Some(2)
            || !err.contains("No device header detected with this passphrase.")
        {
            fails.push(format!("wrong passphrase: {:?} {err}", o.status));
        }
    }
    // HEADER CHECK (TCRYPT only)
    if name.starts_with("vc_") || name.starts_with("vcpim_") {
        let mut extra = vec!["--disable-veracrypt".to_string()];
        extra.extend(filt(&hash, &cipher));
        if dump(&extra, PASSWORD).status.success() {
            fails.push("tcryptDump --disable-veracrypt opened a VeraCrypt header".into());
        }
    }
    // ACTIVATION FS UUID CHECK (and its HIDDEN variant)
    let mut variants = vec![(false, PASSWORD, "DEAD-BABE")];
    if hidden {
        variants.push((true, PASSWORD_HIDDEN, "CAFE-BABE"));
        // HEADER CHECK (HIDDEN)
        let mut extra = vec!["--tcrypt-hidden".to_string()];
        extra.extend(filt(&hash, &cipher));
        let o = dump(&extra, PASSWORD_HIDDEN);
        if !o.status.success() {
            fails.push(format!(
                "tcryptDump --tcrypt-hidden: {}",
                String::from_utf8_lossy(&o.stderr).trim()
            ));
        }
    }
    for (hid, pw, uuid) in variants {
        let out = dir.join(format!("{name}{}.plain", if hid { ".hidden" } else { "" }));
        let mut a = vec![
            "map".to_string(),
            "--read".into(),
            "--tcrypt".into(),
            file_s.clone(),
        ];
        a.extend(opts.iter().cloned());
        if hid {
            a.push("--tcrypt-hidden".into());
        }
        a.extend([
            "--hash".into(),
            hash.clone(),
            "--cipher".into(),
            cipher.clone(),
        ]);
        let f = std::fs::File::create(&out).expect("plaintext file");
        let mut child = Command::new(&ucrypt)
            .args(&a)
            .stdin(Stdio::piped())
            .stdout(f)
            .stderr(Stdio::piped())
            .spawn()
            .expect("ucrypt map");
        {
            use std::io::Write;
            let mut i = child.stdin.take().expect("stdin");
            let _ = writeln!(i, "{pw}");
        }
        let o = child.wait_with_output().expect("wait");
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        if cipher_mode.ends_with("-tcrypt") {
            if o.status.success() || !err.contains(LEGACY_REFUSAL) {
                fails.push(format!(
                    "map of a {mode} ({cipher_mode}) image: expected cryptsetup's refusal, got {:?}: {err}",
                    o.status
                ));
            }
            let _ = std::fs::remove_file(&out);
            continue;
        }
        if !o.status.success() {
            fails.push(format!(
                "map{}: {err}",
                if hid { " --tcrypt-hidden" } else { "" }
            ));
            continue;
        }
        let b = Command::new("blkid")
            .args(["-p", "-o", "value", "-s", "UUID"])
            .arg(&out)
            .output()
            .expect("blkid");
        let got = String::from_utf8_lossy(&b.stdout).trim().to_owned();
        if got != uuid {
            fails.push(format!(
                "UUID {got:?}, expected {uuid}{}",
                if hid { " (hidden)" } else { "" }
            ));
        } else {
            mapped = true;
        }
        let _ = std::fs::remove_file(&out);
    }
    (fails, mapped)
}

/// The prologue every test here shares: `tools` present (else a skip
/// line), cryptsetup 2.6.1's test suite fetched (cached), and its
/// `tcrypt-images.tar.xz` unpacked into a new temp dir named after `tag`
/// (only the members `only` matches, tar wildcards, when given). The temp
/// dir (kept alive by the caller) and its `tcrypt-images` directory.
fn unpack_images(
    test: &str,
    tools: &[&str],
    tag: &str,
    only: &[&str],
) -> Option<(testutil::TempDir, PathBuf)> {
    for tool in tools {
        if !testutil::require_tool(test, tool) {
            return None;
        }
    }
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cryptsetup-2.6.1");
    let suite = testutil::cryptsetup_suite(test, &cache)?;
    let tmp = testutil::TempDir::new(tag);
    let mut tar = Command::new("tar");
    tar.arg("xJf")
        .arg(suite.join("tcrypt-images.tar.xz"))
        .arg("-C")
        .arg(tmp.path())
        .arg("--no-same-owner");
    if !only.is_empty() {
        tar.arg("--wildcards").args(only);
    }
    assert!(tar.status().expect("tar").success(), "tar");
    let dir = tmp.join("tcrypt-images");
    Some((tmp, dir))
}

#[test]
fn cryptsetup_tcrypt_images_open_as_the_script_expects() {
    let test = "cryptsetup_tcrypt_images_open_as_the_script_expects";
    let Some((_tmp, dir)) = unpack_images(
        test,
        &["apt-get", "xz", "tar", "blkid", "bash"],
        "tcrypt-images",
        &[],
    ) else {
        return;
    };
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("images")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            ["tc_", "vc_", "vcpim_", "sys_tc_", "sys_vc_", "tck_", "vck_"]
                .iter()
                .any(|p| n.starts_with(p))
        })
        .collect();
    names.sort();
    assert!(names.len() >= 80, "only {} images", names.len());
    // CI time: a VeraCrypt KDF is 500,000 iterations (several seconds
    // for whirlpool and stribog512), so by default every fourth image (and
    // the one the script's refusal checks use) runs;
    // UCRYPT_TCRYPT_ALL_IMAGES=1 runs them all.
    if std::env::var_os("UCRYPT_TCRYPT_ALL_IMAGES").is_none() {
        names = names
            .into_iter()
            .enumerate()
            .filter(|(i, n)| i % 4 == 0 || n == "vc_1-sha512-xts-aes")
            .map(|(_, n)| n)
            .collect();
    }
    // cryptsetup decrypts headers only with the kernel's AF_ALG ciphers.
    let cs_dump = testutil::which("cryptsetup").is_some() && {
        let o = run(
            Path::new("cryptsetup"),
            &[
                "tcryptDump".into(),
                "-h".into(),
                "sha512".into(),
                dir.join("vc_1-sha512-xts-aes").display().to_string(),
            ],
            &format!("{PASSWORD}\n"),
        );
        o.status.success()
    };
    if !cs_dump {
        eprintln!("{test}: cryptsetup cannot decrypt TCRYPT headers here (no AF_ALG): its tcryptDump is not compared");
    }
    let next = AtomicUsize::new(0);
    let results: Mutex<Vec<(String, Vec<String>, bool)>> = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some(name) = names.get(i) else { return };
                let (f, m) = check_image(&dir, name, cs_dump);
                results.lock().expect("results").push((name.clone(), f, m));
            });
        }
    });
    let results = results.into_inner().expect("results");
    let mapped = results.iter().filter(|r| r.2).count();
    let failed: Vec<String> = results
        .iter()
        .filter(|r| !r.1.is_empty())
        .map(|r| format!("{}: {}", r.0, r.1.join("; ")))
        .collect();
    eprintln!(
        "{test}: {} images checked, {mapped} mapped with the expected UUID, {} failed",
        results.len(),
        failed.len()
    );
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Whether cryptsetup 2.6.1 activates a legacy image, from its name:
/// `TCRYPT_activate` refuses the `-tcrypt` modes, which are the CBC
/// cascades (`cbci-tcrypt`) and the Blowfish chains (`cbc-tcrypt`).
fn cryptsetup_activates(name: &str) -> bool {
    let f: Vec<&str> = name.split('-').collect();
    let ciphers: Vec<&str> = f[3..].iter().copied().filter(|p| *p != "hidden").collect();
    f[2] != "cbc" || (ciphers.len() == 1 && ciphers[0] != "blowfish")
}

/// `ucrypt map --read --tcrypt FILE ARGS` with `pw` on stdin, the
/// plaintext written to `out`.
fn map_to_file(file: &Path, args: &[&str], pw: &str, out: &Path) -> Output {
    use std::io::Write;
    let f = std::fs::File::create(out).expect("plaintext file");
    let mut child = Command::new(testutil::ucrypt_bin())
        .args(["map", "--read", "--tcrypt"])
        .arg(file)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(f)
        .stderr(Stdio::piped())
        .spawn()
        .expect("ucrypt map");
    let mut i = child.stdin.take().expect("stdin");
    let _ = writeln!(i, "{pw}");
    drop(i);
    child.wait_with_output().expect("wait")
}

#[test]
fn legacy_images_map_or_are_refused_as_cryptsetup_does() {
    let test = "legacy_images_map_or_are_refused_as_cryptsetup_does";
    let Some((_tmp, dir)) = unpack_images(
        test,
        &["apt-get", "xz", "tar", "blkid", "bash"],
        "tcrypt-legacy",
        &[],
    ) else {
        return;
    };
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("images")
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("tc_") && (n.contains("-lrw-") || n.contains("-cbc-")))
        .collect();
    names.sort();
    assert_eq!(names.len(), 28, "legacy images: {names:?}");
    // The reference plaintexts: a TrueCrypt 5 XTS image of the same
    // filesystem (outer and hidden), which map already decrypts.
    let reference = |img: &str, hash: &str, hid: bool| -> Vec<u8> {
        let out = dir.join(format!("{img}-{hid}.reference"));
        let mut args = vec!["--disable-veracrypt", "--hash", hash, "-c", "aes"];
        if hid {
            args.push("--tcrypt-hidden");
        }
        let pw = if hid { PASSWORD_HIDDEN } else { PASSWORD };
        let o = map_to_file(&dir.join(img), &args, pw, &out);
        assert!(o.status.success(), "reference {img}: {o:?}");
        std::fs::read(&out).expect("reference plaintext")
    };
    let refs = [
        reference("tc_3-ripemd160-xts-aes", "ripemd160", false),
        reference("tc_3-sha512-xts-aes-hidden", "sha512", true),
    ];
    for r in &refs {
        assert!(r.len() >= FS_SECTORS, "reference too short");
    }
    let mut jobs: Vec<(String, bool)> = names.iter().map(|n| (n.clone(), false)).collect();
    jobs.extend(
        names
            .iter()
            .filter(|n| n.ends_with("-hidden"))
            .map(|n| (n.clone(), true)),
    );
    let next = AtomicUsize::new(0);
    let fails: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mapped = AtomicUsize::new(0);
    let refused = AtomicUsize::new(0);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
    std::thread::scope(|s| {
        for _ in 0..threads {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                let Some((name, hid)) = jobs.get(i) else {
                    return;
                };
                let (hash, cipher, _) = hash_cipher_mode(name);
                // `-h` is `--hash` for `map` as for cryptsetup.
                let mut args = vec!["--disable-veracrypt", "-h", &hash, "-c", &cipher];
                let (pw, uuid) = if *hid {
                    args.push("--tcrypt-hidden");
                    (PASSWORD_HIDDEN, "CAFE-BABE")
                } else {
                    (PASSWORD, "DEAD-BABE")
                };
                let out = dir.join(format!("{name}-{hid}.plain"));
                let o = map_to_file(&dir.join(name), &args, pw, &out);
                let err = String::from_utf8_lossy(&o.stderr);
                let what = format!("{name}{}", if *hid { " (hidden)" } else { "" });
                let fail = if !cryptsetup_activates(name) {
                    if o.status.code() == Some(1) && err.contains(LEGACY_REFUSAL) {
                        refused.fetch_add(1, Ordering::SeqCst);
                        None
                    } else {
                        Some(format!(
                            "{what}: expected cryptsetup's refusal, got {:?}: {err}",
                            o.status
                        ))
                    }
                } else if !o.status.success() {
                    Some(format!("{what}: map failed: {err}"))
                } else {
                    let b = Command::new("blkid")
                        .args(["-p", "-o", "value", "-s", "UUID"])
                        .arg(&out)
                        .output()
                        .expect("blkid");
                    let got = String::from_utf8_lossy(&b.stdout).trim().to_owned();
                    let plain = std::fs::read(&out).unwrap_or_default();
                    let want = &refs[usize::from(*hid)][..FS_SECTORS];
                    if got != uuid {
                        Some(format!("{what}: UUID {got:?}, expected {uuid}"))
                    } else if plain.get(..FS_SECTORS) != Some(want) {
                        Some(format!(
                            "{what}: the boot sector and FATs differ from the XTS image's"
                        ))
                    } else {
                        mapped.fetch_add(1, Ordering::SeqCst);
                        None
                    }
                };
                let _ = std::fs::remove_file(&out);
                if let Some(f) = fail {
                    fails.lock().expect("fails").push(f);
                }
            });
        }
    });
    let fails = fails.into_inner().expect("fails");
    eprintln!(
        "{test}: {} legacy mappings: {} mapped with the expected UUID, {} refused as cryptsetup refuses, {} failed",
        jobs.len(),
        mapped.load(Ordering::SeqCst),
        refused.load(Ordering::SeqCst),
        fails.len()
    );
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}

/// Bytes at the start of every image's plaintext that the filesystem
/// wrote: the FAT12 boot sector, a reserved sector and the two FATs
/// (identical in every image of one kind; the root directory and data
/// sectors after them hold the random fill the volumes were created with).
const FS_SECTORS: usize = 4 * 512;

/// Runs `ucrypt ARGS` with `stdin` piped in.
fn ucrypt(args: &[&str], stdin: &str) -> Output {
    let args: Vec<String> = args.iter().map(|s| (*s).to_owned()).collect();
    run(&testutil::ucrypt_bin(), &args, stdin)
}

#[test]
fn several_keyfiles_open_and_map_a_truecrypt_volume() {
    let test = "several_keyfiles_open_and_map_a_truecrypt_volume";
    let Some((_tmp, dir)) = unpack_images(
        test,
        &["apt-get", "xz", "tar", "blkid", "bash"],
        "tcrypt-keyfiles",
        &["*/tck_*", "*/keyfile*"],
    ) else {
        return;
    };
    let img = dir.join("tck_5-sha512-xts-aes");
    let (img, k1, k2) = (
        img.to_str().expect("utf-8"),
        dir.join("keyfile1").display().to_string(),
        dir.join("keyfile2").display().to_string(),
    );
    // TrueCrypt's KDF only (fast): the image is a TrueCrypt one.
    let base = ["--disable-veracrypt", "--hash", "sha512", "-c", "aes"];
    // map with both keyfiles: the filesystem cryptsetup's script expects.
    let out = dir.join("tck.plain");
    let mut args: Vec<&str> = base.to_vec();
    args.extend(["-d", &k1, "--key-file", &k2]);
    let o = map_to_file(Path::new(img), &args, PASSWORD, &out);
    assert!(
        o.status.success(),
        "map: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let b = Command::new("blkid")
        .args(["-p", "-o", "value", "-s", "UUID"])
        .arg(&out)
        .output()
        .expect("blkid");
    assert_eq!(String::from_utf8_lossy(&b.stdout).trim(), "DEAD-BABE");
    // One keyfile is not the pool: no header, exit 2.
    let mut one: Vec<&str> = base.to_vec();
    one.extend(["-d", &k1]);
    let o = map_to_file(Path::new(img), &one, PASSWORD, &out);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Each keyfile is added into the pool from its start (TrueCrypt's
    // and cryptsetup's pool): the other order opens too.
    let mut rev: Vec<&str> = base.to_vec();
    rev.extend(["-d", &k2, "-d", &k1]);
    let o = map_to_file(Path::new(img), &rev, PASSWORD, &out);
    assert!(
        o.status.success(),
        "map, keyfiles reversed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let _ = std::fs::remove_file(&out);
    // open --test-passphrase takes them too (the detached child gets the
    // table its parent resolved, so this is the keyfiles' only path).
    let mut open = vec!["open", "--type", "tcrypt", "--test-passphrase"];
    open.extend(base);
    open.extend(["-d", &k1, "-d", &k2, img]);
    let o = ucrypt(&open, &format!("{PASSWORD}\n"));
    assert!(
        o.status.success(),
        "open --test-passphrase: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    // Every other type takes one key file, with cryptsetup's message.
    let o = ucrypt(
        &["open", "--test-passphrase", "-d", &k1, "-d", &k2, img],
        "",
    );
    assert_eq!(o.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("Only one --key-file argument is allowed."),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// cryptsetup 2.6.1 activates `cbc-tcw` and `lrw-benbi` volumes
/// read-write (TCRYPT_activate forces no read-only): a copy of a legacy
/// image opened through NBD takes the plaintext back unchanged (the same
/// ciphertext, byte for byte) and a changed root directory, which reads
/// back and changes only those sectors of the image.
#[test]
fn legacy_volumes_are_writable_as_cryptsetup_maps_them() {
    let test = "legacy_volumes_are_writable_as_cryptsetup_maps_them";
    let Some((tmp, dir)) = unpack_images(
        test,
        &["apt-get", "xz", "tar", "bash", "nbdcopy"],
        "tcrypt-legacy-rw",
        &["*/tc_1-sha1-cbc-cast5", "*/tc_2-ripemd160-lrw-aes-twofish"],
    ) else {
        return;
    };
    for (img, hash, cipher) in [
        ("tc_1-sha1-cbc-cast5", "sha1", "cast5"),
        ("tc_2-ripemd160-lrw-aes-twofish", "ripemd160", "aes"),
    ] {
        let orig = std::fs::read(dir.join(img)).expect("image");
        let copy = tmp.join(&format!("{img}.rw"));
        std::fs::write(&copy, &orig).expect("copy");
        let copy_s = copy.display().to_string();
        let sock = tmp.join(&format!("{img}.sock"));
        let name = format!("tclegacy-rw-{}-{cipher}", std::process::id());
        let export = format!("nbd={}", sock.display());
        let o = ucrypt(
            &[
                "open",
                "--type",
                "tcrypt",
                "--disable-veracrypt",
                "--hash",
                hash,
                "-c",
                cipher,
                "--export",
                &export,
                &copy_s,
                &name,
            ],
            &format!("{PASSWORD}\n"),
        );
        assert!(o.status.success(), "open {img}: {o:?}");
        let uri = format!("nbd+unix:///?socket={}", sock.display());
        let plain = tmp.join(&format!("{img}.plain"));
        let nbdcopy = |from: &str, to: &str| {
            Command::new("nbdcopy")
                .args([from, to])
                .stdin(Stdio::null())
                .output()
                .expect("nbdcopy runs")
        };
        let plain_s = plain.display().to_string();
        let read = nbdcopy(&uri, &plain_s);
        // The same plaintext written back, then a changed root directory.
        let same = nbdcopy(&plain_s, &uri);
        let before = std::fs::read(&copy).expect("image after rewrite");
        let mut changed = std::fs::read(&plain).expect("plaintext");
        for (i, b) in changed[FS_SECTORS..FS_SECTORS + 1024]
            .iter_mut()
            .enumerate()
        {
            *b = (i * 7 + 3) as u8;
        }
        std::fs::write(&plain, &changed).expect("changed plaintext");
        let write = nbdcopy(&plain_s, &uri);
        let close = ucrypt(&["close", &name], "");
        assert!(read.status.success(), "{img}: nbdcopy out: {read:?}");
        assert!(same.status.success(), "{img}: nbdcopy back: {same:?}");
        assert!(write.status.success(), "{img}: nbdcopy changed: {write:?}");
        assert!(close.status.success(), "{img}: close: {close:?}");
        assert!(
            before == orig,
            "{img}: the unchanged plaintext written back changed the ciphertext"
        );
        let after = std::fs::read(&copy).expect("image after write");
        // The data starts one sector in: sectors 4 and 5 are bytes
        // 2560..3584 of the image.
        let (lo, hi) = (512 + FS_SECTORS, 512 + FS_SECTORS + 1024);
        assert!(
            after[..lo] == orig[..lo] && after[hi..] == orig[hi..],
            "{img}: only the written sectors change"
        );
        assert!(
            after[lo..hi] != orig[lo..hi],
            "{img}: the written sectors change"
        );
        let back = tmp.join(&format!("{img}.back"));
        let o = map_to_file(
            &copy,
            &["--disable-veracrypt", "--hash", hash, "-c", cipher],
            PASSWORD,
            &back,
        );
        assert!(o.status.success(), "{img}: map: {o:?}");
        assert!(
            std::fs::read(&back).expect("read back") == changed,
            "{img}: the written plaintext reads back"
        );
    }
}
