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
//! modes (`lrw`, `cbc`) have their headers checked; their data modes
//! (`lrw-benbi`, `cbc-tcw`) are not in the engine, so `map` must refuse
//! them with a message saying so (the script likewise accepts "legacy
//! mode" refusals from cryptsetup).
//!
//! Where cryptsetup can decrypt headers here (it needs the kernel's
//! AF_ALG `algif_skcipher`), `tcryptDump`'s output is compared with its
//! byte for byte. By default every fourth image runs (CI time);
//! `UCRYPT_TCRYPT_ALL_IMAGES=1` runs all 80. The images are GPL test data: fetched at test time by
//! `scripts/fetch-cryptsetup-tests.sh`, never stored here. Images run on
//! as many threads as there are cores.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

const PASSWORD: &str = "aaaaaaaaaaaa";
const PASSWORD_HIDDEN: &str = "bbbbbbbbbbbb";
const PASSWORD_72C: &str =
    "aaaaaaaaaaaabbbbbbbbbbbbccccccccccccddddddddddddeeeeeeeeeeeeffffffffffff";
const PIM: &str = "1234";

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
        if mode != "xts" {
            if o.status.success() || !err.contains("not support") {
                fails.push(format!(
                    "map of a {mode} image: expected a refusal naming the mode, got {:?}: {err}",
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

#[test]
fn cryptsetup_tcrypt_images_open_as_the_script_expects() {
    let test = "cryptsetup_tcrypt_images_open_as_the_script_expects";
    for tool in ["apt-get", "xz", "tar", "blkid", "bash"] {
        if !testutil::require_tool(test, tool) {
            return;
        }
    }
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cryptsetup-2.6.1");
    let Some(suite) = testutil::cryptsetup_suite(test, &cache) else {
        return;
    };
    let tmp = testutil::TempDir::new("tcrypt-images");
    let st = Command::new("tar")
        .arg("xJf")
        .arg(suite.join("tcrypt-images.tar.xz"))
        .arg("-C")
        .arg(tmp.path())
        .arg("--no-same-owner")
        .status()
        .expect("tar");
    assert!(st.success(), "tar");
    let dir = tmp.join("tcrypt-images");
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
