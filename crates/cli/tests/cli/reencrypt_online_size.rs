//! `reencrypt --active-name NAME --device-size SIZE` (luks2-reencryption-
//! test [17], [19], scaled down): an online run covers the size the
//! volume is served with (here resized to the first half of its data
//! area), as cryptsetup's does; `--device-size` must equal it. Clients
//! see the model's plaintext throughout (a verifying NBD writer), the
//! served size stays SIZE, the ciphertext past SIZE is left as it was,
//! and a run stopped mid-way by either tool is finished by the other.

use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Duration;

use testutil::require_tool;

use super::{base, ok, start_writer, wait_child, Vol, DATA, HEADER};
use crate::nbd_client::NbdClient;

/// The reencrypted part: the first half of the data area.
const SIZE: u64 = DATA / 2;

/// A volume of 512-byte sectors, as cryptsetup's tests format it.
fn vol(tag: &str, base: &Path, seed: u64) -> (Vol, Vec<u8>) {
    Vol::formatted(tag, base, seed, &["--sector-size", "512"])
}

fn sha256(path: &Path) -> String {
    let o = Command::new("sha256sum").arg(path).output().unwrap();
    assert!(o.status.success(), "sha256sum {}", path.display());
    String::from_utf8_lossy(&o.stdout)[..64].to_string()
}

/// The image's bytes past SIZE (ciphertext under the old key).
fn tail(v: &Vol) -> Vec<u8> {
    let mut b = vec![0u8; (DATA - SIZE) as usize];
    std::fs::File::open(&v.img)
        .unwrap()
        .read_exact_at(&mut b, HEADER + SIZE)
        .unwrap();
    b
}

/// `v` served as NAME `v`, resized to `sectors`.
fn open_resized(v: &Vol, sectors: u64) {
    v.open(&[]);
    ok(
        v.ucrypt(&["resize", "v", "--size", &sectors.to_string()]),
        "resize",
    );
}

fn served_bytes(v: &Vol) -> u64 {
    let c = NbdClient::connect(&v.socket()).unwrap();
    c.size
}

/// The first SIZE bytes through `ucrypt map --luks` are `want`.
fn check_head(v: &Vol, want: &[u8], what: &str) {
    let got = v.read_plain();
    assert!(
        got[..SIZE as usize] == *want,
        "{what}: the first SIZE bytes"
    );
}

fn cryptsetup_accepts(v: &Vol) {
    ok(
        Command::new("cryptsetup")
            .args(["open", "--test-passphrase", "--key-file"])
            .arg(&v.key)
            .arg(&v.img)
            .output()
            .unwrap(),
        "cryptsetup open --test-passphrase",
    );
}

#[test]
fn device_size_online_under_a_verifying_nbd_writer() {
    let test = "device_size_online_under_a_verifying_nbd_writer";
    if !require_tool(test, "cryptsetup") {
        return;
    }
    for (i, (res, ss)) in [("checksum", "512"), ("journal", "4096")]
        .into_iter()
        .enumerate()
    {
        let (v, plain) = vol(test, &base(), 0x5123 + i as u64);
        open_resized(&v, SIZE / 512);
        let before = tail(&v);
        let c = NbdClient::connect(&v.socket()).unwrap();
        assert_eq!(c.size, SIZE);
        let (stop, writer) = start_writer(c, plain[..SIZE as usize].to_vec(), 17 + i as u64);
        wait_child(
            v.reencrypt_online(&[
                "--device-size",
                "8M",
                "--hotzone-size",
                "1M",
                "--resilience",
                res,
                "--sector-size",
                ss,
            ]),
            "reencrypt --active-name --device-size",
        );
        let st = v.status().expect("status");
        let r = &st["reencryption"];
        assert_eq!(r["finished"], true, "{st}");
        assert_eq!(r["total"], SIZE, "{st}");
        assert_eq!(r["done"], SIZE, "{st}");
        stop.store(true, Ordering::Relaxed);
        let seen = writer.join().unwrap();
        assert!(seen.mismatch.is_none(), "{res}: {:?}", seen.mismatch);
        assert!(seen.ops > 0, "the writer did IO");
        assert_eq!(served_bytes(&v), SIZE, "{res}: the volume keeps SIZE");
        v.close();
        assert!(!v.in_reencryption());
        assert!(tail(&v) == before, "{res}: the bytes past SIZE are left");
        check_head(&v, &seen.model, res);
        cryptsetup_accepts(&v);
    }
}

/// [17] "active device != requested reencryption size": initialized
/// online, a resume asking for another size than the served one is
/// refused with every file unchanged; one asking for the served size
/// runs.
#[test]
fn device_size_other_than_the_served_size_is_refused() {
    let (v, plain) = vol("device_size_mismatch", &base(), 0x5124);
    open_resized(&v, SIZE / 512);
    ok(
        v.ucrypt(&[
            "reencrypt",
            "-q",
            "--active-name",
            "v",
            "--init-only",
            "--sector-size",
            "4096",
            "--key-file",
            v.k(),
        ]),
        "reencrypt --init-only",
    );
    let before = sha256(&v.img);
    let o = v.ucrypt(&[
        "reencrypt",
        "-q",
        "--active-name",
        "v",
        "--resume-only",
        "--device-size",
        &format!("{}s", SIZE / 512 - 8),
        "--key-file",
        v.k(),
    ]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("Active device size and requested reencryption size don't match."),
        "{err}"
    );
    assert_eq!(sha256(&v.img), before, "nothing written");
    wait_child(
        v.reencrypt_online(&[
            "--resume-only",
            "--device-size",
            &format!("{}s", SIZE / 512),
        ]),
        "reencrypt --resume-only --device-size SIZE",
    );
    assert_eq!(served_bytes(&v), SIZE);
    v.close();
    assert!(!v.in_reencryption());
    check_head(&v, &plain[..SIZE as usize], "resumed");
}

/// [17] "misaligned reencryption size": served at a size that is no
/// multiple of the new 4096-byte sectors, the initialization goes
/// through (as cryptsetup's `--init-only`) and the run is refused with
/// every file unchanged.
#[test]
fn a_served_size_misaligned_to_the_new_sector_size_is_refused() {
    let (v, _) = vol("device_size_misaligned", &base(), 0x5125);
    open_resized(&v, SIZE / 512 + 7);
    ok(
        v.ucrypt(&[
            "reencrypt",
            "-q",
            "--active-name",
            "v",
            "--init-only",
            "--sector-size",
            "4096",
            "--key-file",
            v.k(),
        ]),
        "reencrypt --init-only",
    );
    let before = sha256(&v.img);
    for extra in [&[][..], &["--device-size", &format!("{}s", SIZE / 512 + 7)]] {
        let mut a = vec![
            "reencrypt",
            "-q",
            "--active-name",
            "v",
            "--resume-only",
            "--key-file",
            v.k(),
        ];
        a.extend_from_slice(extra);
        let o = v.ucrypt(&a);
        assert_eq!(o.status.code(), Some(1), "{extra:?}: {o:?}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(
            err.contains("Illegal device size requested in reencryption parameters."),
            "{err}"
        );
        assert_eq!(sha256(&v.img), before, "{extra:?}: nothing written");
    }
}

/// Closed mid-way, cryptsetup (`--resume-only --force-offline-reencrypt`
/// without `--device-size`: to the device's end, as it resumes such a
/// run) finishes it: the head is what the writer left, the rest the
/// original plaintext.
#[test]
fn device_size_closed_midway_is_finished_by_cryptsetup() {
    let test = "device_size_closed_midway_is_finished_by_cryptsetup";
    if !require_tool(test, "cryptsetup") {
        return;
    }
    let (v, plain) = vol(test, &base(), 0x5126);
    open_resized(&v, SIZE / 512);
    let c = NbdClient::connect(&v.socket()).unwrap();
    let (stop, writer) = start_writer(c, plain[..SIZE as usize].to_vec(), 23);
    let child = v.reencrypt_online(&["--device-size", "8M", "--hotzone-size", "1M", "--rate", "4"]);
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
    assert!(v.in_reencryption(), "{}", v.status_of_header());
    ok(v.cryptsetup_resume(), "cryptsetup reencrypt --resume-only");
    assert!(!v.in_reencryption());
    let got = v.read_plain();
    assert!(got[..SIZE as usize] == seen.model[..], "the head");
    assert!(got[SIZE as usize..] == plain[SIZE as usize..], "the rest");
}

/// cryptsetup's fixed-size run (`--device-size`) stopped mid-way
/// (SIGINT under gdb) is served at SIZE by `open` and finished online.
#[test]
fn a_fixed_size_run_cryptsetup_stopped_is_continued_online() {
    let test = "a_fixed_size_run_cryptsetup_stopped_is_continued_online";
    if !require_tool(test, "cryptsetup") || !require_tool(test, "gdb") {
        return;
    }
    let (v, plain) = vol(test, &base(), 0x5127);
    let before = tail(&v);
    let cs = testutil::which("cryptsetup").unwrap();
    let args: Vec<&std::ffi::OsStr> = [
        "reencrypt",
        "-q",
        "--force-offline-reencrypt",
        "--device-size",
        "8M",
        "--hotzone-size",
        "1M",
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        "--key-file",
    ]
    .iter()
    .map(std::ffi::OsStr::new)
    .chain([v.key.as_os_str(), v.img.as_os_str()])
    .collect();
    let text = crate::reencrypt::under_gdb(4, false, &cs, &args);
    assert!(text.contains("Reencryption interrupted"), "{text}");
    assert!(v.in_reencryption());
    v.open(&[]);
    let c = NbdClient::connect(&v.socket()).unwrap();
    assert_eq!(c.size, SIZE, "served at the size recorded");
    let (stop, writer) = start_writer(c, plain[..SIZE as usize].to_vec(), 29);
    wait_child(
        v.reencrypt_online(&["--resume-only", "--hotzone-size", "1M"]),
        "reencrypt --active-name --resume-only",
    );
    stop.store(true, Ordering::Relaxed);
    let seen = writer.join().unwrap();
    assert!(seen.mismatch.is_none(), "{:?}", seen.mismatch);
    assert_eq!(served_bytes(&v), SIZE);
    v.close();
    assert!(!v.in_reencryption());
    assert!(tail(&v) == before, "the bytes past SIZE are left");
    check_head(&v, &seen.model, "continued");
    cryptsetup_accepts(&v);
}
