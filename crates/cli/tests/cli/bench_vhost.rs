//! `ucrypt bench --via vhost --peers`: libblkio in the bench process
//! against `ucrypt open --export vhost-user-blk` and qemu-storage-daemon
//! (raw, luks) on tiny cells; and the error naming qemu-storage-daemon
//! when it is not on PATH.

use crate::bench_common;

use std::process::Command;

use testutil::{ucrypt_bin, TempDir};

#[test]
fn via_vhost_measures_ucrypt_and_the_qsd_peers() {
    let test = "via_vhost_measures_ucrypt_and_the_qsd_peers";
    if !testutil::require_tool(test, "qemu-storage-daemon")
        || !testutil::require_tool(test, "cryptsetup")
    {
        return;
    }
    let tmp = TempDir::new("bench-vhost");
    let out_dir = tmp.join("results");
    let (stdout, v) = bench_common::run(
        Command::new(ucrypt_bin())
            .args(["bench", "--via", "vhost", "--peers", "--no-progress"])
            .args([
                "--targets",
                "aes-adaptive",
                "--sweep-targets",
                "aes-adaptive",
            ])
            .args(["--bs", "4k", "--qd", "4", "--jobs", "2"])
            .args(["--size", "16M", "--reps", "1", "--rounds", "1"])
            .args(["--runtime", "100ms", "--seconds", "0.1", "--warmup", "0ms"])
            .arg("--out")
            .arg(&out_dir),
        &out_dir,
    );
    assert!(
        stdout.starts_with("ucrypt bench (vhost+peers, "),
        "{stdout}"
    );
    assert_eq!(v["via"], "vhost+peers");
    assert_eq!(v["skipped"], serde_json::json!([]), "every server started");
    let cells = v["cells"].as_array().unwrap();
    // Headline 4k QD1 and 1M QD8 (one queue); the sweep default rw
    // (randread, randwrite) at 4k QD4 over two queues.
    let expected = [
        ("headline", "read", 4096, 1, 1),
        ("headline", "write", 4096, 1, 1),
        ("headline", "read", 1 << 20, 8, 1),
        ("headline", "write", 1 << 20, 8, 1),
        ("sweep", "randread", 4096, 4, 2),
        ("sweep", "randwrite", 4096, 4, 2),
    ];
    for target in ["raw", "ucrypt-aes-adaptive", "qsd-luks"] {
        for (phase, rw, bs, qd, jobs) in expected {
            let c = cells
                .iter()
                .find(|c| {
                    c["target"] == target
                        && c["phase"] == phase
                        && c["rw"] == rw
                        && c["bs"] == bs
                        && c["qd"] == qd
                        && c["jobs"] == jobs
                })
                .unwrap_or_else(|| panic!("no {target} {phase} {rw} {bs} QD{qd}x{jobs} cell"));
            assert_eq!(c["errors"], 0, "{c}");
            assert!(c["mib_s"]["median"].as_f64().unwrap() > 0.0, "{c}");
            assert!(c["iops"].as_f64().unwrap() > 0.0, "{c}");
            assert!(c["lat_us"]["p99"].as_f64().unwrap() > 0.0, "{c}");
            assert!(c["cpu_s_per_gib"].as_f64().unwrap() > 0.0, "{c}");
            if target != "raw" {
                // The bound: io = raw in the same cell, c = this run's XTS.
                assert!(
                    c["pct_raw"].as_f64().unwrap() > 0.0
                        && c["bound_mib_s"].as_f64().unwrap() > 0.0,
                    "{c}"
                );
            }
        }
    }
    assert_eq!(cells.len(), 3 * expected.len(), "no other cells");
    let u = cells
        .iter()
        .find(|c| c["target"] == "ucrypt-aes-adaptive")
        .unwrap();
    assert_eq!(
        (u["cipher"].as_str(), u["mode"].as_str()),
        (Some("aes-xts"), Some("adaptive"))
    );
    for t in ["raw", "ucrypt-aes-adaptive", "qsd-luks"] {
        assert!(stdout.contains(&format!("\n{t} ")), "{t} row: {stdout}");
    }
}

#[test]
fn via_vhost_names_a_missing_qemu_storage_daemon() {
    let empty = TempDir::new("bench-vhost-path");
    let stderr = bench_common::refused(
        Command::new(ucrypt_bin())
            .env("PATH", empty.path())
            .args(["bench", "--via", "vhost", "--no-progress", "--quick"])
            .args(["--targets", "raw,aes-adaptive", "--no-sweep"])
            .arg("--out")
            .arg(empty.join("results")),
    );
    assert!(
        stderr.contains("--via vhost needs qemu-storage-daemon")
            && stderr.contains("missing here: qemu-storage-daemon"),
        "{stderr}"
    );
}
