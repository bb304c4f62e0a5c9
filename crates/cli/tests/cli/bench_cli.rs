//! `ucrypt bench`: the quick run end to end (table, JSON schema, CSV, PNG
//! and SVG heatmaps), the grid profile's table, `--via fio`, and
//! `--dm-crypt`'s refusal where the kernel parts are missing.

use crate::bench_common;

use std::path::Path;
use std::process::Command;

use testutil::{ucrypt_bin, TempDir};

/// Width and height from a PNG's IHDR chunk, after checking the signature.
fn png_size(bytes: &[u8]) -> (u32, u32) {
    assert!(bytes.len() > 33, "PNG too short");
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "PNG signature");
    assert_eq!(&bytes[12..16], b"IHDR", "first chunk is IHDR");
    let be = |i: usize| u32::from_be_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
    assert_eq!(be(8), 13, "IHDR length");
    (be(16), be(20))
}

/// Width and height attributes of the root `<svg>` element.
fn svg_size(text: &str) -> (u32, u32) {
    let start = text.find("<svg").expect("an <svg> root element");
    assert!(text[..start].trim_start().starts_with("<?xml") || text[..start].trim().is_empty());
    let tag = &text[start..start + text[start..].find('>').expect("closed <svg> tag")];
    assert!(
        tag.contains(r#"xmlns="http://www.w3.org/2000/svg""#),
        "{tag}"
    );
    let attr = |name: &str| -> u32 {
        let key = format!(" {name}=\"");
        let i = tag
            .find(&key)
            .unwrap_or_else(|| panic!("no {name} in {tag}"))
            + key.len();
        tag[i..i + tag[i..].find('"').unwrap()].parse().unwrap()
    };
    assert!(text.trim_end().ends_with("</svg>"));
    (attr("width"), attr("height"))
}

fn num(v: &serde_json::Value) -> bool {
    v.is_number()
}

#[test]
fn quick_run_writes_table_json_csv_and_heatmaps() {
    let tmp = TempDir::new("bench-quick");
    let out_dir = tmp.join("results");
    let (stdout, v) = bench_common::run(
        Command::new(ucrypt_bin())
            .args(["bench", "--quick", "--no-progress", "--out"])
            .arg(&out_dir),
        &out_dir,
    );

    // The table comes first, headline workload and every in-process target.
    assert!(
        stdout.starts_with("ucrypt bench (in-process, quick)"),
        "{stdout}"
    );
    assert!(stdout.contains("4k sequential, QD1, 1 job:"), "{stdout}");
    let header = stdout
        .lines()
        .find(|l| l.starts_with("target "))
        .expect("table header");
    for col in ["read MiB/s", "write MiB/s"] {
        assert!(header.contains(col), "{header}");
    }
    assert!(
        stdout.contains("% raw") && stdout.contains("% bound"),
        "{stdout}"
    );
    let row = |name: &str| {
        stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(name))
            .map(str::to_string)
    };
    let raw = row("raw").expect("raw row");
    assert!(raw.contains("100%"), "raw is 100% of itself: {raw}");
    for t in [
        "null-classic",
        "null-inline-read",
        "null-inline-write",
        "null-inline",
        "null-adaptive",
    ] {
        let r = row(t).unwrap_or_else(|| panic!("no {t} row: {stdout}"));
        let read: f64 = r
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap_or_else(|_| panic!("{r}"));
        assert!(read > 0.0, "{r}");
    }
    assert!(
        stdout.contains("crypto c (1 thread, 4k): capi:ecb(cipher_null)"),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!("results: {}", out_dir.display())),
        "{stdout}"
    );

    // JSON with the documented schema (docs/BENCHMARKING.md).
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["via"], "in-process");
    assert!(v["started"].as_str().unwrap().ends_with('Z'));
    assert!(num(&v["duration_s"]) && num(&v["machine"]["cpus"]));
    assert_eq!(v["options"]["profile"], "quick");
    for key in [
        "size_bytes",
        "runtime_ms",
        "sweep_runtime_ms",
        "warmup_ms",
        "reps",
        "sweep_reps",
    ] {
        assert!(num(&v["options"][key]), "options.{key}");
    }
    let crypto = v["crypto"].as_array().unwrap();
    assert!(crypto
        .iter()
        .any(|c| c["cipher"] == "capi:ecb(cipher_null)" && c["bs"] == 4096));
    let cells = v["cells"].as_array().unwrap();
    let head: Vec<_> = cells.iter().filter(|c| c["phase"] == "headline").collect();
    assert!(head.len() >= 12, "raw + 5 null modes, read and write");
    for c in cells {
        for key in ["target", "rw"] {
            assert!(c[key].is_string(), "{key}: {c}");
        }
        for key in ["bs", "qd", "jobs", "reps", "errors"] {
            assert!(c[key].is_u64(), "{key}: {c}");
        }
        assert!(["headline", "sweep"].contains(&c["phase"].as_str().unwrap()));
        assert!(["read", "write", "randread", "randwrite"].contains(&c["rw"].as_str().unwrap()));
        if c["errors"] == 0 {
            let m = &c["mib_s"];
            for key in ["median", "min", "max", "spread_pct"] {
                assert!(num(&m[key]), "mib_s.{key}: {c}");
            }
            assert!(
                m["min"].as_f64() <= m["median"].as_f64()
                    && m["median"].as_f64() <= m["max"].as_f64()
            );
            for key in ["p50", "p99", "p999"] {
                assert!(num(&c["lat_us"][key]), "lat_us.{key}: {c}");
            }
            assert!(c["lat_us"]["p50"].as_f64() <= c["lat_us"]["p999"].as_f64());
            assert!(num(&c["iops"]) && num(&c["cpu_s_per_gib"]));
        }
    }
    let raw_read = head
        .iter()
        .find(|c| c["target"] == "raw" && c["rw"] == "read")
        .expect("raw read cell");
    assert_eq!(raw_read["pct_raw"].as_f64(), Some(100.0));
    assert_eq!(
        (
            raw_read["bs"].as_u64(),
            raw_read["qd"].as_u64(),
            raw_read["jobs"].as_u64()
        ),
        (Some(4096), Some(1), Some(1))
    );
    let null_classic = head
        .iter()
        .find(|c| c["target"] == "null-classic" && c["rw"] == "write")
        .unwrap();
    assert_eq!(null_classic["cipher"], "null");
    assert_eq!(null_classic["mode"], "classic");
    assert!(num(&null_classic["pct_raw"]) && num(&null_classic["pct_bound"]));
    let sweep = cells.iter().filter(|c| c["phase"] == "sweep").count();
    assert!(sweep > 0, "the quick sweep ran");

    // CSV: a header and one line per cell.
    let csv = std::fs::read_to_string(out_dir.join("cells.csv")).unwrap();
    let mut lines = csv.lines();
    assert!(lines
        .next()
        .unwrap()
        .starts_with("phase,target,cipher,mode,rw,bs,qd,jobs,"));
    assert_eq!(lines.count(), cells.len());

    // Heatmaps: valid PNG and SVG with matching dimensions.
    let maps: Vec<_> = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "png"))
        .collect();
    assert!(
        maps.iter().any(|p| p
            .file_name()
            .unwrap()
            .to_string_lossy()
            .ends_with("-vs-classic.png")),
        "{maps:?}"
    );
    assert!(
        maps.iter().any(|p| p
            .file_name()
            .unwrap()
            .to_string_lossy()
            .ends_with("-vs-raw.png")),
        "{maps:?}"
    );
    for png in &maps {
        let (w, h) = png_size(&std::fs::read(png).unwrap());
        assert!(w >= 400 && h >= 200, "{}: {w}x{h}", png.display());
        let svg = std::fs::read_to_string(png.with_extension("svg")).unwrap();
        assert_eq!(svg_size(&svg), (w, h), "{}", png.display());
        // plotters puts each text element's content on a line of its own.
        let texts = svg.replace(">\n", ">").replace("\n</text>", "</text>");
        assert!(
            texts.contains(">QD16</text>") && texts.contains(">4k</text>"),
            "axis labels"
        );
        assert!(
            svg.contains(r#"font-family="DejaVu Sans""#),
            "the embedded font"
        );
        assert!(stdout.contains(&png.display().to_string()));
    }
    assert!(Path::new(&out_dir.join("table.txt")).exists());
}

#[test]
fn grid_profile_prints_the_mode_grid() {
    let tmp = TempDir::new("bench-grid");
    let out_dir = tmp.join("results");
    let (stdout, v) = bench_common::run(
        Command::new(ucrypt_bin())
            .args(["bench", "--profile", "grid", "--no-progress"])
            .args(["--seconds", "0.02", "--rounds", "2", "--warmup", "0ms"])
            .args([
                "--bs", "4k,64k", "--qd", "1", "--jobs", "1", "--size", "16M", "--out",
            ])
            .arg(&out_dir),
        &out_dir,
    );
    assert!(
        stdout.starts_with("ucrypt bench (in-process, grid)"),
        "{stdout}"
    );
    let header = stdout
        .lines()
        .find(|l| l.starts_with("cell (MiB/s)"))
        .unwrap_or_else(|| panic!("grid header: {stdout}"));
    let cols: Vec<&str> = header.split_whitespace().collect();
    assert_eq!(
        cols,
        [
            "cell",
            "(MiB/s)",
            "raw",
            "classic",
            "inline",
            "adaptive",
            "adaptive/best"
        ]
    );
    // 2 ciphers × 2 directions × 2 block sizes, in the grid's order.
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("null ") || l.starts_with("xts "))
        .collect();
    let names: Vec<String> = rows
        .iter()
        .map(|l| l.split_whitespace().take(5).collect::<Vec<_>>().join(" "))
        .collect();
    assert_eq!(
        names,
        [
            "null read 4k qd1 j1",
            "null read 64k qd1 j1",
            "null write 4k qd1 j1",
            "null write 64k qd1 j1",
            "xts read 4k qd1 j1",
            "xts read 64k qd1 j1",
            "xts write 4k qd1 j1",
            "xts write 64k qd1 j1",
        ],
        "{stdout}"
    );
    for r in &rows {
        let f: Vec<&str> = r.split_whitespace().collect();
        // Every mode measured something (a number, not `-`; a very short
        // run on a busy machine may round to 0 MiB/s).
        for v in &f[5..9] {
            assert!(v.parse::<f64>().is_ok_and(|x| x >= 0.0), "{r}");
        }
        assert!(f[9].parse::<f64>().is_ok(), "ratio: {r}");
    }
    assert!(rows[0].contains("inline/raw ") && rows[0].contains(", classic/raw "));
    let summary = stdout
        .lines()
        .find(|l| l.starts_with("adaptive >= max(classic, inline) in "))
        .unwrap_or_else(|| panic!("summary: {stdout}"));
    assert!(summary.ends_with("/8 cells"), "{summary}");
    assert_eq!(v["options"]["profile"], "grid");
    assert_eq!(v["options"]["sector_size"], 4096);
    assert_eq!(v["options"]["sweep_reps"], 2);
    assert_eq!(v["options"]["sweep_runtime_ms"], 20);
    for stem in [
        "null-vs-classic",
        "aes-vs-classic",
        "null-vs-raw",
        "aes-vs-raw",
    ] {
        assert!(
            out_dir.join(format!("heatmap-{stem}.png")).exists(),
            "{stem}"
        );
    }
}

#[test]
fn dm_crypt_names_missing_components() {
    let dm_ok = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/mapper/control")
        .is_ok();
    let root = testutil::is_root();
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let brd = Path::new("/sys/module/brd").exists()
        || Path::new("/dev/ram0").exists()
        || std::fs::read_to_string(format!("/lib/modules/{}/modules.dep", release.trim()))
            .is_ok_and(|t| t.contains("/brd.ko"));
    if dm_ok && root && brd {
        let why = "this host has device-mapper, brd and root, so nothing is missing to name";
        testutil::skip_kernel("dm_crypt_names_missing_components", why);
        return;
    }
    let out = Command::new(ucrypt_bin())
        .args(["bench", "--dm-crypt", "--no-progress"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "must fail here: {stderr}");
    assert!(stderr.contains("The --dm-crypt advisor needs a host with device-mapper, dm-crypt, brd, fio and root; missing here:"), "{stderr}");
    if !dm_ok {
        assert!(
            stderr.contains("device-mapper in the kernel (/dev/mapper/control"),
            "{stderr}"
        );
    }
    if !brd {
        assert!(stderr.contains("the brd ramdisk module"), "{stderr}");
    }
    if !root {
        assert!(stderr.contains("root privileges"), "{stderr}");
    }
    assert!(out.stdout.is_empty(), "fails before measuring anything");
}

#[test]
fn bad_options_are_refused() {
    for args in [
        &["bench", "--targets", "bogus"][..],
        &["bench", "--bs", "4x"],
        &["bench", "--qd", "0", "--no-sweep"],
        &[
            "bench",
            "--profile",
            "grid",
            "--sector-size",
            "4096",
            "--bs",
            "512",
        ],
        &["bench", "--profile", "grid", "--seconds", "0"],
    ] {
        let out = Command::new(ucrypt_bin()).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let e = String::from_utf8_lossy(&out.stderr);
        assert!(
            e.starts_with("ucrypt: ") && e.chars().nth(8).is_some_and(|c| c.is_uppercase()),
            "{args:?}: {e}"
        );
    }
}

#[test]
fn via_fio_drives_ucrypt_open_over_nbd() {
    let test = "via_fio_drives_ucrypt_open_over_nbd";
    if !testutil::require_tool(test, "fio") || !testutil::require_tool(test, "nbdkit") {
        return;
    }
    let tmp = TempDir::new("bench-fio");
    let out_dir = tmp.join("results");
    let (stdout, stderr, v) = bench_common::run_with_stderr(
        Command::new(ucrypt_bin())
            .args([
                "bench",
                "--via",
                "fio",
                "--no-sweep",
                "--no-progress",
                "--engine-stats",
                "--targets",
                "aes-inline",
            ])
            .args([
                "--size",
                "32M",
                "--reps",
                "1",
                "--runtime",
                "100ms",
                "--warmup",
                "0ms",
                "--out",
            ])
            .arg(&out_dir),
        &out_dir,
    );
    assert!(stdout.starts_with("ucrypt bench (fio, "), "{stdout}");
    assert!(
        stdout.contains("4k sequential, QD1, 1 job:")
            && stdout.contains("1M sequential, QD8, 1 job:"),
        "{stdout}"
    );
    assert_eq!(v["via"], "fio");
    assert_eq!(
        v["skipped"].as_array().unwrap().len(),
        0,
        "every server started: {}",
        v["skipped"]
    );
    let cells = v["cells"].as_array().unwrap();
    for target in ["raw", "ucrypt-aes-inline"] {
        for rw in ["read", "write"] {
            let c = cells
                .iter()
                .find(|c| c["target"] == target && c["rw"] == rw && c["bs"] == 4096)
                .unwrap_or_else(|| panic!("no {target} {rw} cell"));
            assert_eq!(c["errors"], 0, "{c}");
            assert!(c["mib_s"]["median"].as_f64().unwrap() > 0.0, "{c}");
            assert!(c["lat_us"]["p99"].as_f64().unwrap() > 0.0, "{c}");
        }
    }
    let enc = cells
        .iter()
        .find(|c| c["target"] == "ucrypt-aes-inline" && c["bs"] == 4096)
        .unwrap();
    assert_eq!(
        (enc["cipher"].as_str(), enc["mode"].as_str()),
        (Some("aes-xts"), Some("inline"))
    );
    assert!(
        enc["pct_raw"].is_number() && enc["pct_bound"].is_number(),
        "{enc}"
    );
    // --engine-stats: the served ucrypt's counters after each cell, from
    // `ucrypt status`; its inline mode answered every 4k read inline.
    let line = stderr
        .lines()
        .find(|l| l.starts_with("engine ucrypt-aes-inline after read bs=4k QD1"))
        .unwrap_or_else(|| panic!("no engine counters after the 4k read cell: {stderr}"));
    let counters: serde_json::Value =
        serde_json::from_str(&line[line.find('{').unwrap()..line.rfind('}').unwrap() + 1]).unwrap();
    let requests = counters["requests"].as_u64().unwrap();
    assert!(requests > 0 && counters["inline"] == requests, "{line}");
    assert!(
        !stderr.contains("engine raw after"),
        "raw is not a ucrypt server: {stderr}"
    );
}

/// The processes whose parent is `pid` (from /proc), with their state
/// letter (`Z`: exited, not yet reaped).
fn children_of(pid: u32) -> Vec<(u32, char)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // Fields after the parenthesised name: state, ppid, ...
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
            continue;
        };
        let mut f = rest.split(' ');
        let state = f.next().and_then(|s| s.chars().next()).unwrap_or('?');
        if f.next().and_then(|s| s.parse::<u32>().ok()) == Some(pid) {
            out.push((p, state));
        }
    }
    out
}

/// A bench killed by SIGKILL runs no cleanup: its servers must still go
/// (the parent-death signal), not serve on with nobody to stop them.
#[test]
fn a_killed_bench_takes_its_servers_with_it() {
    let test = "a_killed_bench_takes_its_servers_with_it";
    if !testutil::require_tool(test, "fio") || !testutil::require_tool(test, "nbdkit") {
        return;
    }
    let tmp = TempDir::new("bench-kill");
    let mut bench = Command::new(ucrypt_bin())
        .args(["bench", "--via", "fio", "--no-sweep", "--no-progress"])
        .args(["--targets", "aes-inline", "--size", "32M", "--reps", "50"])
        .args(["--runtime", "1s", "--warmup", "0ms", "--out"])
        .arg(tmp.join("results"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let bench_pid = bench.id();
    // Gone, or exited and waiting for init to reap it.
    let alive = |p: u32| {
        std::fs::read_to_string(format!("/proc/{p}/stat"))
            .ok()
            .and_then(|s| s.rfind(')').map(|i| s[i + 2..].starts_with('Z')))
            == Some(false)
    };
    // Wait for the servers to be up and serving, ucrypt among them (it
    // starts after the nbdkit raw baseline): children by those names still
    // there a moment later (not a `--version` probe).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let servers = loop {
        let servers: Vec<u32> = children_of(bench_pid)
            .into_iter()
            .filter(|&(p, _)| {
                std::fs::read_to_string(format!("/proc/{p}/comm"))
                    .is_ok_and(|c| ["ucrypt", "nbdkit"].contains(&c.trim()))
            })
            .map(|(p, _)| p)
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let ucrypt = servers.iter().any(|&p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "ucrypt")
        });
        if ucrypt && servers.iter().all(|&p| alive(p)) {
            break servers;
        }
        assert!(std::time::Instant::now() < deadline, "no server started");
    };
    bench.kill().unwrap();
    bench.wait().unwrap();
    // A ucrypt server stops through its whole SIGTERM path (a grace for
    // connections, the NBD stop, a flush): ample room on a loaded machine.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while servers.iter().any(|&p| alive(p)) && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let left: Vec<u32> = servers.into_iter().filter(|&p| alive(p)).collect();
    for &p in &left {
        let _ = Command::new("kill").arg("-9").arg(p.to_string()).status();
    }
    assert!(
        left.is_empty(),
        "servers outlived the killed bench: {left:?}"
    );
}
