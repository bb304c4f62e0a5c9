//! Starting a LUKS2 decryption on a volume ucrypt serves with a detached
//! header (`reencrypt --decrypt --header HDR --active-name v`, in one go
//! or `--init-only` then `--resume-only`): a verifying NBD writer runs
//! throughout, and the data device ends as the plaintext it saw. Stopped
//! mid-way (`close`, or `kill -9` of the daemon) it is finished offline by
//! cryptsetup's `--resume-only` and by ucrypt's. An encryption started
//! with a NAME (`reencrypt --encrypt --header HDR DEVICE v`, as cryptsetup
//! activates NAME) is served as `v` and encrypted under a verifying
//! writer; cryptsetup opens the result. The starts cryptsetup 2.6.1
//! refuses on an active device (and those ucrypt does not do) are refused
//! with nothing written.

use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::Ordering;
use std::time::Duration;

use testutil::{require_tool, ucrypt_bin, Rng};

use crate::nbd_client::NbdClient;
use crate::reencrypt::ok;
use crate::reencrypt_online::{base, locked, start_writer};
use crate::reencrypt_plaintext::{Case, Closer, Vol};

/// A detached-header LUKS2 volume (cryptsetup's format) holding seeded
/// plaintext, served as `v` by `ucrypt open --header`.
fn served(test: &str, seed: u64) -> (Vol, Closer) {
    let v = Vol::new(test, &base(), Case::Decrypt, seed);
    let mut open: Vec<OsString> = vec!["open".into(), "--key-file".into(), v.key.clone().into()];
    open.extend(v.header_args().into_iter().map(Into::into));
    open.extend([v.data.clone().into(), "v".into()]);
    ok(ucrypt(&v, &open).output().unwrap(), "open");
    let closer = Closer(v.dir.join("run"));
    (v, closer)
}

/// `ucrypt ARGS` in `v`'s runtime directory.
fn ucrypt<S: AsRef<OsStr>>(v: &Vol, args: &[S]) -> Command {
    let mut c = Command::new(ucrypt_bin());
    c.env("UCRYPT_RUNTIME_DIR", v.dir.join("run"))
        .args(args)
        .stdin(Stdio::null());
    c
}

/// `reencrypt -q --active-name v --key-file KEY --header HDR EXTRA`.
fn online(v: &Vol, extra: &[&str]) -> Command {
    let mut a: Vec<OsString> = ["reencrypt", "-q", "--active-name", "v", "--key-file"]
        .map(Into::into)
        .to_vec();
    a.push(v.key.clone().into());
    a.extend(v.header_args().into_iter().map(Into::into));
    a.extend(extra.iter().map(Into::into));
    ucrypt(v, &a)
}

fn nbd(v: &Vol) -> NbdClient {
    NbdClient::connect(&v.dir.join("run").join("v.nbd.sock")).unwrap()
}

fn status(v: &Vol) -> serde_json::Value {
    let o = ucrypt(v, &["status", "--json", "v"]).output().unwrap();
    serde_json::from_slice(&o.stdout).unwrap_or_default()
}

fn skip(test: &str) -> bool {
    !require_tool(test, "cryptsetup")
}

/// The decryption started online (with `--init-only` first when
/// `init_only`) under a verifying writer: every acknowledged write is
/// served afterwards (plaintext now), and the data device is that
/// plaintext once closed; cryptsetup sees no reencryption left.
fn start_case(test: &str, init_only: bool, seed: u64) {
    let (v, _closer) = served(test, seed);
    let (stop, writer) = start_writer(nbd(&v), v.plain.clone(), seed);
    if init_only {
        ok(
            online(&v, &["--decrypt", "--init-only"]).output().unwrap(),
            "--decrypt --init-only --active-name",
        );
        assert!(v.in_reencryption(), "initialized");
        let st = status(&v);
        assert_ne!(st["reencryption"]["running"], true, "{st}");
        ok(
            online(&v, &["--resume-only", "--hotzone-size", "1M"])
                .output()
                .unwrap(),
            "--resume-only --active-name",
        );
    } else {
        ok(
            online(&v, &["--decrypt", "--hotzone-size", "1M"])
                .output()
                .unwrap(),
            "--decrypt --active-name",
        );
    }
    let st = status(&v);
    stop.store(true, Ordering::Relaxed);
    let seen = writer.join().unwrap();
    assert!(seen.mismatch.is_none(), "{test}: {:?}", seen.mismatch);
    assert!(seen.ops > 0, "the writer did IO");
    assert_eq!(st["reencryption"]["finished"], true, "{st}");
    // Served as plaintext now: no key.
    assert_eq!(st["keysize_bits"], 0, "{st}");
    let mut model = seen.model;
    let mut c = nbd(&v);
    assert!(c.read(0, model.len()).unwrap() == model, "served after");
    let extra = Rng::new(seed + 1).bytes(64 << 10);
    c.write(8192, &extra, false).unwrap();
    c.flush().unwrap();
    model[8192..8192 + extra.len()].copy_from_slice(&extra);
    drop(c);
    ok(ucrypt(&v, &["close", "v"]).output().unwrap(), "close");
    v.check_finished(&model, test);
}

#[test]
fn decryption_starts_online_under_a_verifying_nbd_writer() {
    let test = "decrypt_start_online";
    if skip(test) {
        return;
    }
    start_case(test, false, 0x5e01);
}

#[test]
fn decryption_initialized_online_then_resumed_online() {
    let test = "decrypt_init_only_online";
    if skip(test) {
        return;
    }
    start_case(test, true, 0x5e02);
}

#[derive(Clone, Copy, Debug)]
enum Stop {
    Close,
    Kill9,
}

/// Started online, stopped mid-way by `how` (the writer's model taken
/// before), then finished offline by cryptsetup (`cryptsetup`) or by
/// ucrypt; the data device ends as the writer's plaintext.
fn interrupted(test: &str, how: Stop, cryptsetup: bool, seed: u64) {
    let (v, _closer) = served(test, seed);
    let (stop, writer) = start_writer(nbd(&v), v.plain.clone(), seed);
    // Slow enough to be caught in the middle.
    let child: Child = online(&v, &["--decrypt", "--hotzone-size", "1M", "--rate", "2"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    testutil::wait_until(Duration::from_secs(120), "two hotzones", || {
        status(&v)["reencryption"]["hotzones"].as_u64() >= Some(2)
    });
    stop.store(true, Ordering::Relaxed);
    let seen = writer.join().unwrap();
    assert!(seen.mismatch.is_none(), "{test}: {:?}", seen.mismatch);
    match how {
        Stop::Close => {
            ok(ucrypt(&v, &["close", "v"]).output().unwrap(), "close");
        }
        Stop::Kill9 => {
            let pid = std::fs::read_to_string(v.dir.join("run").join("v.pid")).unwrap();
            let pid = pid.trim().to_string();
            ok(
                Command::new("kill").args(["-9", &pid]).output().unwrap(),
                "kill -9",
            );
            testutil::wait_until(Duration::from_secs(60), "the daemon's locks gone", || {
                !locked(&v.data) && !locked(v.hdr.as_ref().unwrap())
            });
            // Its runtime files stay behind: `close` clears them.
            let _ = ucrypt(&v, &["close", "v"]).output();
        }
    }
    let o: Output = child.wait_with_output().unwrap();
    assert!(
        !o.status.success(),
        "{test}: the watcher ends with the stop"
    );
    assert!(v.in_reencryption(), "{test}: stopped mid-way");
    if cryptsetup {
        ok(v.cryptsetup(&["--resume-only"]), "cryptsetup --resume-only");
    } else {
        let mut a: Vec<OsString> = ["reencrypt", "-q", "--resume-only", "--key-file"]
            .map(Into::into)
            .to_vec();
        a.push(v.key.clone().into());
        a.extend(v.header_args().into_iter().map(Into::into));
        a.push(v.data.clone().into());
        ok(ucrypt(&v, &a).output().unwrap(), "ucrypt --resume-only");
    }
    v.check_finished(&seen.model, test);
}

#[test]
fn a_decryption_closed_midway_is_finished_by_cryptsetup() {
    let test = "decrypt_start_close_cryptsetup";
    if skip(test) {
        return;
    }
    interrupted(test, Stop::Close, true, 0x5e03);
}

#[test]
fn a_decryption_closed_midway_is_finished_by_ucrypt() {
    let test = "decrypt_start_close_ucrypt";
    if skip(test) {
        return;
    }
    interrupted(test, Stop::Close, false, 0x5e04);
}

#[test]
fn a_decryption_killed_midway_is_finished_by_cryptsetup() {
    let test = "decrypt_start_kill_cryptsetup";
    if skip(test) {
        return;
    }
    interrupted(test, Stop::Kill9, true, 0x5e05);
}

#[test]
fn a_decryption_killed_midway_is_finished_by_ucrypt() {
    let test = "decrypt_start_kill_ucrypt";
    if skip(test) {
        return;
    }
    interrupted(test, Stop::Kill9, false, 0x5e06);
}

/// Fast keyslot parameters.
const FAST_KDF: &[&str] = &["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

/// `reencrypt --encrypt --header HDR DEVICE v` (with `--init-only` first,
/// then `--resume-only --active-name`, when `init_only`): `v` is served
/// from the start; a verifying writer runs while the data moves (in one
/// go: from when `v` appears); cryptsetup opens the finished volume and
/// its plaintext is the writer's.
fn encrypt_as(test: &str, case: Case, init_only: bool, seed: u64) {
    let v = Vol::new(test, &base(), case, seed);
    let _closer = Closer(v.dir.join("run"));
    let mut a: Vec<OsString> = ["reencrypt", "-q", "--encrypt", "--type", "luks2"]
        .map(Into::into)
        .to_vec();
    a.extend(FAST_KDF.iter().map(Into::into));
    a.extend(v.header_args().into_iter().map(Into::into));
    if case == Case::EncryptShift {
        a.extend(["--reduce-device-size", "4M"].map(Into::into));
    }
    a.extend(["--hotzone-size", "1M", "--key-file"].map(Into::into));
    a.push(v.key.clone().into());
    if init_only {
        a.push("--init-only".into());
    }
    a.extend([v.data.clone().into(), "v".into()]);
    let sock = v.dir.join("run").join("v.nbd.sock");
    let seen = if init_only {
        let o = ok(
            ucrypt(&v, &a).output().unwrap(),
            "--encrypt --init-only NAME",
        );
        assert!(
            String::from_utf8_lossy(&o.stdout).contains("ready for online encryption"),
            "{o:?}"
        );
        assert!(v.in_reencryption(), "initialized");
        let mut c = nbd(&v);
        assert!(c.read(0, v.plain.len()).unwrap() == v.plain, "served");
        if case == Case::EncryptShift {
            // The volume is smaller than the writer's device: one write
            // before, the data checked after.
            return encrypt_shift_rest(&v, c, seed);
        }
        let (stop, writer) = start_writer(c, v.plain.clone(), seed);
        ok(
            online(&v, &["--resume-only", "--hotzone-size", "1M"])
                .output()
                .unwrap(),
            "--resume-only --active-name",
        );
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap()
    } else {
        let child = ucrypt(&v, &a)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        testutil::wait_until(Duration::from_secs(60), "v served", || sock.exists());
        let (stop, writer) = start_writer(nbd(&v), v.plain.clone(), seed);
        ok(child.wait_with_output().unwrap(), "--encrypt NAME");
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap()
    };
    assert!(seen.mismatch.is_none(), "{test}: {:?}", seen.mismatch);
    assert!(seen.ops > 0, "the writer did IO");
    let st = status(&v);
    assert_eq!(st["reencryption"]["finished"], true, "{st}");
    let mut c = nbd(&v);
    assert!(
        c.read(0, seen.model.len()).unwrap() == seen.model,
        "served after"
    );
    drop(c);
    ok(ucrypt(&v, &["close", "v"]).output().unwrap(), "close");
    v.check_finished(&seen.model, test);
}

/// The data-shift case of [`encrypt_as`] once `v` is served: a write
/// mid-way, then the encryption online; the plaintext served and opened
/// by cryptsetup afterwards is the model.
fn encrypt_shift_rest(v: &Vol, mut c: NbdClient, seed: u64) {
    let mut model = v.plain.clone();
    let extra = Rng::new(seed + 1).bytes(64 << 10);
    c.write(1 << 20, &extra, false).unwrap();
    c.flush().unwrap();
    model[1 << 20..(1 << 20) + extra.len()].copy_from_slice(&extra);
    drop(c);
    ok(
        online(v, &["--resume-only", "--hotzone-size", "1M"])
            .output()
            .unwrap(),
        "--resume-only --active-name",
    );
    let mut c = nbd(v);
    assert!(c.read(0, model.len()).unwrap() == model, "served after");
    drop(c);
    ok(ucrypt(v, &["close", "v"]).output().unwrap(), "close");
    v.check_finished(&model, "encrypt with a data shift and a name");
}

#[test]
fn encryption_started_with_a_name_is_served_and_encrypted_online() {
    let test = "encrypt_as_name";
    if skip(test) {
        return;
    }
    encrypt_as(test, Case::Encrypt, false, 0x5e08);
}

#[test]
fn encryption_initialized_with_a_name_then_resumed_online() {
    let test = "encrypt_as_name_init_only";
    if skip(test) {
        return;
    }
    encrypt_as(test, Case::Encrypt, true, 0x5e09);
}

#[test]
fn encryption_with_a_data_shift_initialized_with_a_name_then_resumed_online() {
    let test = "encrypt_shift_as_name";
    if skip(test) {
        return;
    }
    encrypt_as(test, Case::EncryptShift, true, 0x5e0a);
}

fn sha256(path: &Path) -> String {
    let o = Command::new("sha256sum").arg(path).output().unwrap();
    assert!(o.status.success(), "sha256sum {}", path.display());
    String::from_utf8_lossy(&o.stdout).into()
}

/// The starts cryptsetup 2.6.1 refuses on an active device, and those
/// ucrypt does not do: exit code 1, the message, every file unchanged,
/// no reencryption in the daemon, and nothing created.
#[test]
fn starts_refused_online_write_nothing() {
    let test = "start_online_refusals";
    if skip(test) {
        return;
    }
    let (v, _closer) = served(test, 0x5e07);
    let hdr = v.hdr.clone().unwrap();
    let data = v.data.to_str().unwrap().to_string();
    let new_hdr = v.dir.join("exported");
    let k = v.key.to_str().unwrap().to_string();
    let h = hdr.to_str().unwrap().to_string();
    let n = new_hdr.to_str().unwrap().to_string();
    let base_args = ["reencrypt", "-q", "--active-name", "v", "--key-file", &k];
    let cases: Vec<(Vec<&str>, String)> = vec![
        (
            vec!["--decrypt"],
            "LUKS2 decryption requires --header option.".into(),
        ),
        (
            vec!["--decrypt", "--header", &data],
            "LUKS2 decryption is supported with detached header device only (with data offset set to 0).".into(),
        ),
        (
            // The data device holds no header to export.
            vec!["--decrypt", "--header", &n],
            format!("Device {n} does not exist or access denied."),
        ),
        (
            vec!["--encrypt", "--header", &h, &data],
            format!("Device {h} is already LUKS device. Aborting operation."),
        ),
        (
            vec!["--encrypt", "--header", &h],
            "Command requires device as argument.".into(),
        ),
        (
            vec!["--encrypt", "--header", &h, &data, "w"],
            "Only --encrypt (without --active-name) takes a NAME to activate.".into(),
        ),
        (
            vec!["--reduce-device-size", "4M", "--header", &h],
            "with a data shift (--reduce-device-size) of an active device is not supported".into(),
        ),
        (
            vec!["--decrypt", "--reduce-device-size", "4M", "--header", &h],
            "with a data shift (--reduce-device-size) of an active device is not supported".into(),
        ),
    ];
    for (extra, want) in cases {
        let before = (sha256(&v.data), sha256(&hdr));
        let mut args: Vec<&str> = base_args.to_vec();
        args.extend(&extra);
        let o = ucrypt(&v, &args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{extra:?}: {err}");
        assert!(err.contains(&want), "{extra:?}: {err}");
        assert_eq!(
            (sha256(&v.data), sha256(&hdr)),
            before,
            "{extra:?}: nothing written"
        );
        assert!(!new_hdr.exists(), "{extra:?}: no header exported");
        assert!(!v.in_reencryption(), "{extra:?}");
        assert!(status(&v)["reencryption"].is_null(), "{extra:?}");
    }
}
