//! `ucrypt status NAME` of a served volume whose header records a
//! reencryption no one moves yet (`reencrypt --init-only --active-name`,
//! or one stopped before `open`): shown as in reencryption, stopped, at
//! the header's progress over the served size; then the run's progress
//! and its end.

use std::process::Command;

use super::{base, ok, wait_child, Vol, DATA};

fn status_text(v: &Vol) -> String {
    String::from_utf8_lossy(&ok(v.ucrypt(&["status", "v"]), "status").stdout).into_owned()
}

#[test]
fn init_only_online_shows_in_status() {
    let (v, _) = Vol::new("status_init_only", &base(), 0x5a7);
    v.open(&[]);
    assert!(v.status().expect("status")["reencryption"].is_null());
    assert!(!status_text(&v).contains("reencryption:"));
    ok(
        v.ucrypt(&[
            "reencrypt",
            "-q",
            "--active-name",
            "v",
            "--init-only",
            "--key-file",
            v.k(),
        ]),
        "--init-only",
    );
    let st = v.status().expect("status");
    let r = &st["reencryption"];
    assert_eq!(r["running"], false, "{st}");
    assert_eq!(r["finished"], false, "{st}");
    assert_eq!(r["done"], 0, "{st}");
    assert_eq!(r["total"], DATA, "{st}");
    assert_eq!(r["resilience"], "checksum", "{st}");
    let text = status_text(&v);
    assert!(
        text.contains("reencryption: 0.0% (0 of 16777216 bytes), forward, checksum, stopped"),
        "{text}"
    );
    wait_child(v.reencrypt_online(&["--resume-only"]), "--resume-only");
    assert_eq!(
        v.status().expect("status")["reencryption"]["finished"],
        true
    );
}

/// Stopped mid-way by cryptsetup (`--init-only` and nothing moved
/// would show 0): `open` serves it and `status` shows it at once.
#[test]
fn a_reencryption_stopped_before_open_shows_in_status() {
    if !testutil::require_tool("status_stopped_before_open", "cryptsetup") {
        return;
    }
    let (v, _) = Vol::new("status_stopped", &base(), 0x5a8);
    ok(
        Command::new("cryptsetup")
            .args([
                "reencrypt",
                "-q",
                "--force-offline-reencrypt",
                "--init-only",
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
                "--key-file",
            ])
            .arg(&v.key)
            .arg(&v.img)
            .output()
            .unwrap(),
        "cryptsetup --init-only",
    );
    v.open(&[]);
    let st = v.status().expect("status");
    assert_eq!(st["reencryption"]["running"], false, "{st}");
    assert_eq!(st["reencryption"]["total"], DATA, "{st}");
    assert!(status_text(&v).contains("stopped"));
}
