//! `ucrypt bench --ceph --peers`: the Ceph comparison's runner on tiny
//! cells against the throwaway cluster (testutil::ceph: the suite's shared
//! one, or one started for this binary): every server starts on its own
//! image, every cell has a row for each, and the images are gone after.

use crate::bench_common;
use crate::rbd_common;

use std::process::Command;

use testutil::ceph::{Cluster, Store};
use testutil::{ucrypt_bin, TempDir};

#[test]
fn ceph_runner_measures_ucrypt_and_both_qsd_peers_on_rbd_images() {
    let test = "ceph_runner_measures_ucrypt_and_both_qsd_peers_on_rbd_images";
    if !rbd_common::require_ceph(test)
        || !testutil::require_tool(test, "fio")
        || !testutil::require_tool(test, "qemu-storage-daemon")
    {
        return;
    }
    let c = Cluster::start("bench-rbd", Store::Memstore(1 << 30));
    let tmp = TempDir::new("bench-rbd");
    let out_dir = tmp.join("results");
    let (stdout, v) = bench_common::run(
        Command::new(ucrypt_bin())
            .arg("--ceph-conf")
            .arg(&c.conf)
            .args(["bench", "--ceph", "--ceph-pool", &c.pool, "--peers"])
            .args(["--no-progress", "--size", "8M", "--reps", "1"])
            .args(["--runtime", "100ms", "--warmup", "0ms", "--out"])
            .arg(&out_dir),
        &out_dir,
    );
    assert!(
        stdout.starts_with("ucrypt bench (fio+rbd+peers, default), 8 MiB RBD images"),
        "{stdout}"
    );
    for cell in [
        "4k random, QD1, 1 job:",
        "4k random, QD16, 1 job:",
        "1M random, QD8, 1 job:",
    ] {
        assert!(stdout.contains(cell), "no {cell} in {stdout}");
    }
    assert_eq!(v["via"], "fio+rbd+peers");
    assert_eq!(v["skipped"], serde_json::json!([]), "every server started");
    let cells = v["cells"].as_array().unwrap();
    assert_eq!(
        cells.len(),
        3 * 2 * 3,
        "3 shapes x 2 directions x 3 servers"
    );
    for target in ["raw", "ucrypt-aes-adaptive", "qsd-luks2"] {
        for rw in ["randread", "randwrite"] {
            for (bs, qd) in [(4096, 1), (4096, 16), (1 << 20, 8)] {
                let cell = cells
                    .iter()
                    .find(|x| {
                        x["target"] == target && x["rw"] == rw && x["bs"] == bs && x["qd"] == qd
                    })
                    .unwrap_or_else(|| panic!("no {target} {rw} {bs} QD{qd} cell"));
                assert_eq!(cell["errors"], 0, "{cell}");
                assert!(cell["mib_s"]["median"].as_f64().unwrap() > 0.0, "{cell}");
            }
        }
    }
    let enc = cells.iter().find(|x| x["target"] == "qsd-luks2").unwrap();
    assert!(
        enc["pct_raw"].is_number(),
        "raw (qsd, unencrypted) is the base: {enc}"
    );
    // Every image the run made is gone (the template and the copies too).
    let left = String::from_utf8_lossy(&c.rbd(&["ls", &c.pool]).stdout).into_owned();
    assert!(
        !left.contains("ucrypt-bench-"),
        "images left in {}: {left}",
        c.pool
    );
}
