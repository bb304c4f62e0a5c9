//! The decryption with a data shift of a volume whose header was inside
//! the device (`reencrypt --decrypt --header NEWFILE`,
//! luks2-reencryption-test [32] online, scaled down) online: started on
//! the served volume (the header exported under the clients), or
//! initialized by either tool (`--init-only`), served by `open --header
//! NEWFILE` and finished by `reencrypt --active-name --resume-only`,
//! always under a verifying NBD writer; closed mid-way, cryptsetup or
//! ucrypt online finishes it. At the end the device starts with the
//! plaintext the clients saw. The refusals write nothing and leave the
//! clients' IO flowing.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::process::Output;
use std::sync::atomic::Ordering;
use std::time::Duration;

use testutil::require_tool;

use super::{base, ok, start_writer, wait_child, Vol};
use crate::nbd_client::NbdClient;

/// The data offset (the shift): 2 MiB, so the 30 MiB of data move in
/// several hotzones.
const OFFSET_SECTORS: &str = "4096";

/// A volume with its data at 2 MiB; its whole plaintext.
fn vol(tag: &str, seed: u64) -> (Vol, Vec<u8>) {
    let (v, _) = Vol::formatted(tag, &base(), seed, &["--offset", OFFSET_SECTORS]);
    let plain = v.read_plain();
    (v, plain)
}

fn new_header(v: &Vol) -> PathBuf {
    v.dir.join("exported.hdr")
}

/// `tool reencrypt --decrypt --header NEWFILE --init-only` of `v`.
fn init_only(v: &Vol, tool: &str) {
    let h = new_header(v);
    let mut c = if tool == "cryptsetup" {
        let mut c = Command::new("cryptsetup");
        c.arg("reencrypt").arg("--force-offline-reencrypt");
        c
    } else {
        v.cmd(&["reencrypt"])
    };
    c.args(["-q", "--decrypt", "--init-only", "--header"])
        .arg(&h)
        .arg("--key-file")
        .arg(&v.key)
        .arg(&v.img);
    ok(c.output().unwrap(), &format!("{tool} --init-only"));
}

/// The device's first `len` bytes.
fn device_head(img: &Path, len: usize) -> Vec<u8> {
    let mut b = std::fs::read(img).unwrap();
    b.truncate(len);
    b
}

fn no_reencryption(h: &Path) {
    let o = ok(
        Command::new("cryptsetup")
            .args(["luksDump", "--dump-json-metadata"])
            .arg(h)
            .output()
            .unwrap(),
        "luksDump",
    );
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(
        j["config"]["requirements"].is_null(),
        "finished: {}",
        j["config"]
    );
    assert_eq!(j["segments"]["0"]["type"], "linear", "{}", j["segments"]);
}

#[test]
fn a_datashift_decryption_initialized_by_either_tool_is_finished_online() {
    let test = "datashift_decryption_finished_online";
    if !require_tool(test, "cryptsetup") {
        return;
    }
    for (i, tool) in ["ucrypt", "cryptsetup"].into_iter().enumerate() {
        let (v, plain) = vol(test, 0xd5f0 + i as u64);
        init_only(&v, tool);
        let h = new_header(&v);
        let hs = h.to_str().unwrap();
        v.open(&["--header", hs]);
        let c = NbdClient::connect(&v.socket()).unwrap();
        assert_eq!(c.size, plain.len() as u64);
        let (stop, writer) = start_writer(c, plain.clone(), 31 + i as u64);
        wait_child(
            v.reencrypt_online(&["--resume-only", "--header", hs]),
            "reencrypt --active-name --resume-only",
        );
        let st = v.status().expect("status");
        assert_eq!(st["reencryption"]["finished"], true, "{tool}: {st}");
        stop.store(true, Ordering::Relaxed);
        let seen = writer.join().unwrap();
        assert!(seen.mismatch.is_none(), "{tool}: {:?}", seen.mismatch);
        assert!(seen.ops > 0);
        v.close();
        no_reencryption(&h);
        assert!(
            device_head(&v.img, plain.len()) == seen.model,
            "{tool}: the device holds the plaintext"
        );
    }
}

#[test]
fn a_datashift_decryption_closed_midway_online_is_finished_by_cryptsetup() {
    let test = "datashift_decryption_closed_midway";
    if !require_tool(test, "cryptsetup") {
        return;
    }
    let (v, plain) = vol(test, 0xd5f5);
    init_only(&v, "ucrypt");
    let h = new_header(&v);
    let hs = h.to_str().unwrap();
    v.open(&["--header", hs]);
    let c = NbdClient::connect(&v.socket()).unwrap();
    let (stop, writer) = start_writer(c, plain.clone(), 37);
    let child = v.reencrypt_online(&["--resume-only", "--header", hs, "--rate", "4"]);
    testutil::wait_until(Duration::from_secs(60), "two hotzones", || {
        v.status()
            .is_some_and(|s| s["reencryption"]["hotzones"].as_u64() >= Some(2))
    });
    stop.store(true, Ordering::Relaxed);
    let seen = writer.join().unwrap();
    assert!(seen.mismatch.is_none(), "{:?}", seen.mismatch);
    v.close();
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success(), "interrupted by the close");
    let o = Command::new("cryptsetup")
        .args([
            "reencrypt",
            "-q",
            "--resume-only",
            "--force-offline-reencrypt",
            "--header",
        ])
        .arg(&h)
        .arg("--key-file")
        .arg(&v.key)
        .arg(&v.img)
        .output()
        .unwrap();
    ok(o, "cryptsetup --resume-only");
    no_reencryption(&h);
    assert!(device_head(&v.img, plain.len()) == seen.model);
}

fn sha256(path: &Path) -> String {
    let o = Command::new("sha256sum").arg(path).output().unwrap();
    assert!(o.status.success(), "sha256sum {}", path.display());
    String::from_utf8_lossy(&o.stdout)[..64].to_string()
}

/// `reencrypt -q --active-name v --decrypt --header NEWFILE EXTRA` with
/// `pass` on stdin.
fn start_online(v: &Vol, pass: &[u8], extra: &[&str]) -> Output {
    use std::io::Write;
    let h = new_header(v);
    let mut a = vec![
        "reencrypt",
        "-q",
        "--active-name",
        "v",
        "--decrypt",
        "--header",
        h.to_str().unwrap(),
        "--key-file",
        "-",
    ];
    a.extend_from_slice(extra);
    let mut c = v
        .cmd(&a)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    c.stdin.take().unwrap().write_all(pass).unwrap();
    c.wait_with_output().unwrap()
}

#[test]
fn a_datashift_decryption_starts_online_under_a_verifying_nbd_writer() {
    let test = "datashift_decryption_starts_online";
    if !require_tool(test, "cryptsetup") {
        return;
    }
    for (i, res) in ["checksum", "journal"].into_iter().enumerate() {
        let (v, plain) = vol(test, 0xd5e0 + i as u64);
        v.open(&[]);
        let c = NbdClient::connect(&v.socket()).unwrap();
        assert_eq!(c.size, plain.len() as u64);
        let (stop, writer) = start_writer(c, plain.clone(), 41 + i as u64);
        ok(
            start_online(
                &v,
                super::PASS,
                &["--resilience", res, "--hotzone-size", "1M"],
            ),
            "reencrypt --decrypt --header NEWFILE --active-name",
        );
        let st = v.status().expect("status");
        assert_eq!(st["reencryption"]["finished"], true, "{res}: {st}");
        stop.store(true, Ordering::Relaxed);
        let seen = writer.join().unwrap();
        assert!(seen.mismatch.is_none(), "{res}: {:?}", seen.mismatch);
        assert!(seen.ops > 0);
        v.close();
        let h = new_header(&v);
        no_reencryption(&h);
        assert!(
            device_head(&v.img, plain.len()) == seen.model,
            "{res}: the device holds the plaintext"
        );
    }
}

/// `--init-only` online: the header exported, the volume served from it
/// at once (the writer's IO spans the switch); closed mid-way, the next
/// `open --header NEWFILE` and an online resume finish it, or
/// cryptsetup's `--resume-only` does.
#[test]
fn a_datashift_decryption_initialized_online_is_finished_by_either_tool() {
    let test = "datashift_decryption_init_online";
    if !require_tool(test, "cryptsetup") {
        return;
    }
    for (i, by_cryptsetup) in [false, true].into_iter().enumerate() {
        let (v, plain) = vol(test, 0xd5e5 + i as u64);
        v.open(&[]);
        let c = NbdClient::connect(&v.socket()).unwrap();
        let (stop, writer) = start_writer(c, plain.clone(), 43 + i as u64);
        ok(
            start_online(&v, super::PASS, &["--init-only"]),
            "--init-only online",
        );
        let h = new_header(&v);
        let hs = h.to_str().unwrap();
        assert!(h.exists(), "the header exported");
        let child = v.reencrypt_online(&["--resume-only", "--header", hs, "--rate", "4"]);
        testutil::wait_until(Duration::from_secs(60), "two hotzones", || {
            v.status()
                .is_some_and(|s| s["reencryption"]["hotzones"].as_u64() >= Some(2))
        });
        stop.store(true, Ordering::Relaxed);
        let seen = writer.join().unwrap();
        assert!(seen.mismatch.is_none(), "{:?}", seen.mismatch);
        v.close();
        let out = child.wait_with_output().unwrap();
        assert!(!out.status.success(), "interrupted by the close");
        if by_cryptsetup {
            let o = Command::new("cryptsetup")
                .args([
                    "reencrypt",
                    "-q",
                    "--resume-only",
                    "--force-offline-reencrypt",
                    "--header",
                ])
                .arg(&h)
                .arg("--key-file")
                .arg(&v.key)
                .arg(&v.img)
                .output()
                .unwrap();
            ok(o, "cryptsetup --resume-only");
            assert!(device_head(&v.img, plain.len()) == seen.model);
        } else {
            v.open(&["--header", hs]);
            let c = NbdClient::connect(&v.socket()).unwrap();
            let (stop, writer) = start_writer(c, seen.model.clone(), 47);
            wait_child(
                v.reencrypt_online(&["--resume-only", "--header", hs]),
                "resume online",
            );
            stop.store(true, Ordering::Relaxed);
            let seen = writer.join().unwrap();
            assert!(seen.mismatch.is_none(), "{:?}", seen.mismatch);
            v.close();
            assert!(device_head(&v.img, plain.len()) == seen.model);
        }
        no_reencryption(&h);
    }
}

/// A wrong passphrase and the resiliences a data shift cannot take:
/// exit 1 (2 for the passphrase, as cryptsetup), nothing written, no
/// header exported, and the clients' IO still flows.
#[test]
fn datashift_decryption_refusals_online_write_nothing() {
    let (v, plain) = vol("datashift_decryption_refusals", 0xd5ea);
    v.open(&[]);
    let h = new_header(&v);
    let cases: [(&[u8], &[&str], i32, &str); 3] = [
        (
            b"wrong passphrase",
            &[],
            2,
            "No key available with this passphrase.",
        ),
        (
            super::PASS,
            &["--resilience", "none"],
            1,
            "Requested --resilience option cannot be applied",
        ),
        (
            super::PASS,
            &["--resume-only"],
            1,
            "Device reencryption not in progress.",
        ),
    ];
    for (pass, extra, code, want) in cases {
        let before = sha256(&v.img);
        let o = start_online(&v, pass, extra);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(code), "{extra:?}: {err}");
        assert!(err.contains(want), "{extra:?}: {err}");
        assert_eq!(sha256(&v.img), before, "{extra:?}: nothing written");
        assert!(!h.exists(), "{extra:?}: no header exported");
        let mut c = NbdClient::connect(&v.socket()).unwrap();
        assert!(
            c.read(0, 4096).unwrap() == plain[..4096],
            "{extra:?}: IO flows"
        );
    }
}

/// The plaintext through `ucrypt map --luks --header NEWFILE` (which
/// repairs a torn hotzone first).
fn read_plain_with(v: &Vol, h: &Path) -> Vec<u8> {
    ok(
        v.ucrypt(&[
            "map",
            "--read",
            "--luks",
            v.i(),
            "--header",
            h.to_str().unwrap(),
            "--key-file",
            v.k(),
        ]),
        "map --luks --header",
    )
    .stdout
}

/// luks2-reencryption-test [35], [36] (an I/O error in the shift area or
/// the moved segment while the decryption runs online; here the daemon
/// aborts at its N-th write, the crash hook, from the init's first write
/// on): every write the clients saw acknowledged reads back through the
/// header left in NEWFILE, and `reencrypt --resume-only` finishes it to
/// that plaintext.
#[test]
fn a_crash_during_an_online_datashift_decryption_loses_no_acknowledged_write() {
    let test = "datashift_decryption_online_crash";
    if !require_tool(test, "cryptsetup") {
        return;
    }
    let (template, plain) = vol(test, 0xd5ee);
    for n in [1u64, 2, 3, 4, 5, 6, 8, 11, 15, 20, 30, 45] {
        let v = Vol::copy_of(&template, &format!("{test}{n}"), &base());
        let mut open = v.cmd(&["open", "--key-file", v.k(), v.i(), "v"]);
        open.env("UCRYPT_REENCRYPT_CRASH_AFTER", n.to_string());
        ok(
            open.stdin(std::process::Stdio::null()).output().unwrap(),
            "open",
        );
        let pid = v.pid().expect("the daemon's pid");
        let c = NbdClient::connect(&v.socket()).unwrap();
        let (stop, writer) = start_writer(c, plain.clone(), 200 + n);
        let _ = start_online(&v, super::PASS, &["--hotzone-size", "1M"]);
        // A crash past the run's last write: the daemon is still there.
        super::kill_daemon(pid, &v.img);
        stop.store(true, Ordering::Relaxed);
        let seen = writer.join().unwrap();
        assert!(seen.mismatch.is_none(), "point {n}: {:?}", seen.mismatch);
        testutil::wait_until(Duration::from_secs(30), "the killed daemon", || {
            !super::serves(pid, &v.img)
        });
        testutil::wait_until(Duration::from_secs(30), "the killed daemon's lock", || {
            !super::locked(&v.img)
        });
        let h = new_header(&v);
        assert!(
            h.exists(),
            "point {n}: the header exported before any data moved"
        );
        let got = read_plain_with(&v, &h);
        if let Some(at) = super::lost_write(&got, &seen) {
            panic!(
                "point {n}: byte {at} lost an acknowledged write ({} writer ops)",
                seen.ops
            );
        }
        if super::in_reencryption_at(&h) {
            ok(
                v.ucrypt(&[
                    "reencrypt",
                    "-q",
                    "--resume-only",
                    "--header",
                    h.to_str().unwrap(),
                    "--key-file",
                    v.k(),
                    v.i(),
                ]),
                "reencrypt --resume-only",
            );
            no_reencryption(&h);
            assert!(
                device_head(&v.img, plain.len()) == got,
                "point {n}: the finished plaintext"
            );
        }
    }
}
