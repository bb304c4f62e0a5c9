//! `ucrypt bench --via file`: fio's io_uring engine and the engine over a
//! `FileBackend` (io_uring and pread/pwrite) on one file, on tiny cells;
//! and the error naming fio when it is not on PATH.

use crate::bench_common;

use std::process::Command;

use testutil::{ucrypt_bin, TempDir};

#[test]
fn via_file_measures_fio_and_every_engine_row_on_one_file() {
    if !testutil::require_tool(
        "via_file_measures_fio_and_every_engine_row_on_one_file",
        "fio",
    ) {
        return;
    }
    let tmp = TempDir::new("bench-file");
    let out_dir = tmp.join("results");
    let (stdout, v) = bench_common::run(
        Command::new(ucrypt_bin())
            // The runner's own file goes here (and must be gone after).
            .env("TMPDIR", tmp.path())
            .args([
                "bench",
                "--via",
                "file",
                "--file-size",
                "8M",
                "--no-progress",
            ])
            .args(["--reps", "1", "--runtime", "40ms", "--warmup", "0ms"])
            .arg("--out")
            .arg(&out_dir),
        &out_dir,
    );
    assert!(stdout.starts_with("ucrypt bench (file, "), "{stdout}");
    assert_eq!(v["via"], "file");
    // Where the figures come from: the file, and how it was opened.
    let storage = v["storage"].as_str().unwrap_or_default();
    // ", on DISK" when the file lives on a block device (not on tmpfs).
    let (opened, disk) = match storage.rsplit_once(", on ") {
        Some((o, d)) => (o, Some(d)),
        None => (storage, None),
    };
    assert!(
        storage.starts_with(&format!("{}/", tmp.path().display()))
            && storage.contains(" (made for the run, removed), ")
            && (opened.ends_with(", O_DIRECT") || opened.ends_with("(no O_DIRECT here)")),
        "results.json storage: {storage:?}"
    );
    assert!(
        stdout.contains(&format!("\nstorage: {storage}\n")),
        "{stdout}"
    );
    assert_eq!(v["skipped"], serde_json::json!([]), "every row started");
    assert_eq!(v["options"]["sector_size"], 4096);
    let cells = v["cells"].as_array().unwrap();
    let shapes = [(4096, 1), (4096, 32), (1 << 20, 8)];
    let mut rows = vec!["raw".to_string()];
    for t in ["raw", "aes-classic", "aes-inline", "aes-adaptive"] {
        for io in ["uring", "syscalls"] {
            rows.push(format!("ucrypt-{t}-{io}"));
        }
    }
    for target in &rows {
        for (bs, qd) in shapes {
            for rw in ["randread", "randwrite"] {
                let c = cells
                    .iter()
                    .find(|c| {
                        c["target"] == target.as_str()
                            && c["phase"] == "headline"
                            && c["rw"] == rw
                            && c["bs"] == bs
                            && c["qd"] == qd
                    })
                    .unwrap_or_else(|| panic!("no {target} {rw} {bs} QD{qd} cell"));
                assert_eq!(c["errors"], 0, "{c}");
                assert_eq!(c["rounds_mib_s"].as_array().unwrap().len(), 1, "{c}");
                assert!(c["mib_s"]["median"].as_f64().unwrap() > 0.0, "{c}");
                assert!(c["iops"].as_f64().unwrap() > 0.0, "{c}");
                // x fio for every row; the bound for the encrypted ones.
                assert!(c["pct_raw"].as_f64().unwrap() > 0.0, "{c}");
                // The disk's request sizes, only when there is a disk.
                assert_eq!(c.get("disk_kib_per_req").is_some(), disk.is_some(), "{c}");
                if target.contains("aes") {
                    assert!(c["bound_mib_s"].as_f64().unwrap() > 0.0, "{c}");
                    assert!(c["pct_bound"].as_f64().unwrap() > 0.0, "{c}");
                }
            }
        }
    }
    assert_eq!(cells.len(), rows.len() * shapes.len() * 2, "no other cells");
    // c at the cells' block sizes, with the targets' 4096-byte sectors.
    for bs in [4096, 1 << 20] {
        assert!(
            v["crypto"]
                .as_array()
                .unwrap()
                .iter()
                .any(|c| c["bs"] == bs && c["cipher"] == "aes-xts-plain64"),
            "c at {bs}"
        );
    }
    for t in &rows {
        assert!(stdout.contains(&format!("\n{t} ")), "{t} row: {stdout}");
    }
    // Same-round ratios: against fio, io_uring against pread/pwrite, bound.
    for r in [
        "ucrypt-aes-adaptive-uring     / fio (raw)",
        "ucrypt-aes-adaptive-uring     / syscalls",
        "ucrypt-aes-adaptive-uring     / bound",
        "ucrypt-raw-syscalls           / fio (raw)",
    ] {
        let r = r.split_whitespace().collect::<Vec<_>>().join(" ");
        let squeezed = stdout.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(squeezed.contains(&r), "{r}: {stdout}");
    }
    assert!(stdout.contains("% fio"), "{stdout}");
    assert_eq!(stdout.contains("disk rd"), disk.is_some(), "{stdout}");
    // Only the results are left: the runner removed its file.
    let left: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, ["results"], "the bench file is removed");
}

#[test]
fn via_file_names_a_missing_fio() {
    let empty = TempDir::new("bench-file-path");
    let stderr = bench_common::refused(
        Command::new(ucrypt_bin())
            .env("PATH", empty.path())
            .env("TMPDIR", empty.path())
            .args(["bench", "--via", "file", "--no-progress", "--quick"])
            .arg("--out")
            .arg(empty.join("results")),
    );
    assert!(
        stderr.contains("--via file needs fio") && stderr.contains("missing here: fio"),
        "{stderr}"
    );
    let left = std::fs::read_dir(empty.path()).unwrap().count();
    assert_eq!(left, 0, "no file made before the check");
}
