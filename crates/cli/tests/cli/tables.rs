//! Multi-target tables end to end: a two-target table (first half key A,
//! second half key B, ciphertext made by `ucrypt map --table` with
//! one-line tables) read and written through `map --table FILE|-` and
//! through `open --table FILE` + NBD clients; `table` and `status` of such
//! a mapping; `reload` moving the boundary while a writer writes; and the
//! tables dm refuses (gap, overlap, two devices, a boundary inside a
//! 4096-byte block), refused with exit code 1 and nothing written.

#[allow(unused_imports)]
use crate::frontends_common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use frontends_common::Vol;

const KA: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
                  f0e1d2c3b4a5968778695a4b3c2d1e0fffeeddccbbaa99887766554433221100";
const KB: &str = "a0a1a2a3a4a5a6a7a8a9aaabacadaeafb0b1b2b3b4b5b6b7b8b9babbbcbdbebf\
                  c0c1c2c3c4c5c6c7c8c9cacbcccdcecfd0d1d2d3d4d5d6d7d8d9dadbdcdddedf";

/// Mapping: 8192 sectors (4 MiB) at device sector 2048; 4096-byte sectors.
const LEN: u64 = 8192;
const OFF: u64 = 2048;
const HALF: u64 = LEN / 2;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn ucrypt(vol: &Vol, args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut c = Command::new(testutil::ucrypt_bin());
    c.args(args)
        .env("UCRYPT_RUNTIME_DIR", vol.runtime())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        });
    let mut child = c.spawn().unwrap();
    if let Some(data) = stdin {
        let mut w = child.stdin.take().unwrap();
        let data = data.to_vec();
        std::thread::spawn(move || {
            let _ = w.write_all(&data);
        });
    }
    child.wait_with_output().unwrap()
}

fn ok(vol: &Vol, args: &[&str], stdin: Option<&[u8]>) -> Output {
    let o = ucrypt(vol, args, stdin);
    assert!(o.status.success(), "ucrypt {args:?}: {}", text(&o.stderr));
    o
}

fn run(cmd: &mut Command) -> Output {
    let o = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(o.status.success(), "{cmd:?}: {}", text(&o.stderr));
    o
}

fn crypt(start: u64, len: u64, key: &str, iv: u64, dev: &Path, off: u64) -> String {
    format!(
        "{start} {len} crypt aes-xts-plain64 {key} {iv} {} {off} 1 sector_size:4096",
        dev.display()
    )
}

/// The two-target table: key A below `HALF`, key B above.
fn two(dev: &Path) -> String {
    format!(
        "{}\n{}\n",
        crypt(0, HALF, KA, 0, dev, OFF),
        crypt(HALF, LEN - HALF, KB, HALF, dev, OFF + HALF)
    )
}

fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut rng = testutil::Rng::new(u64::from(seed));
    rng.bytes(len)
}

/// Writes `plain` through one-line tables, one per half (each half's
/// target as a mapping of its own: start 0, the target's IV offset).
fn write_halves(vol: &Vol, plain: &[u8]) {
    let half = (HALF * 512) as usize;
    let a = crypt(0, HALF, KA, 0, &vol.image, OFF);
    let b = crypt(0, LEN - HALF, KB, HALF, &vol.image, OFF + HALF);
    ok(
        vol,
        &["map", "--write", "--table", &a],
        Some(&plain[..half]),
    );
    ok(
        vol,
        &["map", "--write", "--table", &b],
        Some(&plain[half..]),
    );
}

/// Reads the halves back through one-line tables.
fn read_halves(vol: &Vol) -> Vec<u8> {
    let a = crypt(0, HALF, KA, 0, &vol.image, OFF);
    let b = crypt(0, LEN - HALF, KB, HALF, &vol.image, OFF + HALF);
    let mut out = ok(vol, &["map", "--read", "--table", &a], None).stdout;
    out.extend(ok(vol, &["map", "--read", "--table", &b], None).stdout);
    out
}

fn volume(tag: &str) -> Vol {
    Vol::new(tag, (OFF + LEN + 64) * 512, 4096)
}

#[test]
fn two_keys_through_map() {
    let vol = volume("tables-map");
    let plain = pattern((LEN * 512) as usize, 1);
    write_halves(&vol, &plain);
    let file = vol.dir.join("two.table");
    std::fs::write(&file, two(&vol.image)).unwrap();
    let f = file.display().to_string();
    // From a file, and from stdin.
    let got = ok(&vol, &["map", "--read", "--table", &f], None).stdout;
    assert!(got == plain, "map --read --table FILE");
    let got = ok(
        &vol,
        &["map", "--read", "--table", "-"],
        Some(two(&vol.image).as_bytes()),
    )
    .stdout;
    assert!(got == plain, "map --read --table -");
    // Written through the two-target table, read per half.
    let plain2 = pattern((LEN * 512) as usize, 2);
    ok(&vol, &["map", "--write", "--table", &f], Some(&plain2));
    assert!(
        read_halves(&vol) == plain2,
        "ciphertext differs from the per-key reference"
    );
    // The area before the data offset is untouched.
    let raw = std::fs::read(&vol.image).unwrap();
    assert!(raw[..(OFF * 512) as usize].iter().all(|&b| b == 0));
}

#[test]
fn two_keys_through_open_and_nbd() {
    for t in ["nbdcopy", "qemu-img"] {
        if !testutil::require_tool("two_keys_through_open_and_nbd", t) {
            return;
        }
    }
    let vol = volume("tables-nbd");
    let name = vol.name.clone();
    let plain = pattern((LEN * 512) as usize, 3);
    write_halves(&vol, &plain);
    let file = vol.dir.join("two.table");
    std::fs::write(&file, two(&vol.image)).unwrap();
    let image = vol.image.display().to_string();
    let f = file.display().to_string();
    ok(&vol, &["open", "--table", &f, &image, &name], None);
    let out = vol.dir.join("out.raw");
    run(Command::new("nbdcopy").arg(vol.uri()).arg(&out));
    assert!(
        std::fs::read(&out).unwrap() == plain,
        "nbdcopy out of the export"
    );
    // `table`: both lines, keys masked; --showkeys shows them.
    let t = text(&ok(&vol, &["table", &name], None).stdout);
    let lines: Vec<&str> = t.lines().collect();
    assert_eq!(lines.len(), 2, "{t}");
    assert!(
        lines[0].starts_with(&format!(
            "0 {HALF} crypt aes-xts-plain64 {}",
            "0".repeat(128)
        )),
        "{t}"
    );
    assert!(
        lines[1].starts_with(&format!("{HALF} {HALF} crypt ")),
        "{t}"
    );
    assert!(
        !t.contains(&KA[..16]) && !t.contains(&KB[..16]),
        "keys shown: {t}"
    );
    let shown = text(&ok(&vol, &["table", "--showkeys", &name], None).stdout);
    assert!(shown.contains(KA) && shown.contains(KB), "{shown}");
    assert_eq!(shown.trim_end(), two(&vol.image).trim_end());
    // `status` lists the targets.
    let st = text(&ok(&vol, &["status", &name], None).stdout);
    assert!(
        st.contains("targets: 2") && st.contains(&format!("size:    {LEN} sectors")),
        "{st}"
    );
    let js: serde_json::Value =
        serde_json::from_slice(&ok(&vol, &["status", "--json", &name], None).stdout).unwrap();
    assert_eq!(js["targets"].as_array().map(Vec::len), Some(2), "{js}");
    // resize refuses a mapping of several targets.
    let o = ucrypt(&vol, &["resize", "--size", "4096", &name], None);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o.stderr));
    assert!(
        text(&o.stderr).contains("several targets"),
        "{}",
        text(&o.stderr)
    );
    // Written through the export with qemu-img, then checked per half.
    let src = vol.dir.join("src.raw");
    let plain2 = pattern((LEN * 512) as usize, 4);
    std::fs::write(&src, &plain2).unwrap();
    run(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&src)
        .arg(vol.uri()));
    ok(&vol, &["close", &name], None);
    assert!(
        read_halves(&vol) == plain2,
        "the export's writes are not per-key ciphertext"
    );
}

/// A writer keeps writing (qemu-io, each round one connection) while the
/// boundary between two targets of one key moves back and forth by
/// `reload`: every acknowledged write reads back, and reloads that change
/// the device or the length, or hold a gap, are refused (exit 1).
#[test]
fn reload_moves_the_boundary_while_a_writer_writes() {
    for t in ["qemu-io"] {
        if !testutil::require_tool("reload_moves_the_boundary_while_a_writer_writes", t) {
            return;
        }
    }
    let vol = volume("tables-reload");
    let name = vol.name.clone();
    let image = vol.image.display().to_string();
    let one = format!("{}\n", crypt(0, LEN, KA, 0, &vol.image, OFF));
    let split = |b: u64| {
        format!(
            "{}\n{}\n",
            crypt(0, b, KA, 0, &vol.image, OFF),
            crypt(b, LEN - b, KA, b, &vol.image, OFF + b)
        )
    };
    ok(
        &vol,
        &["open", "--table", "-", &image, &name],
        Some(one.as_bytes()),
    );
    let stop = Arc::new(AtomicBool::new(false));
    // block (64 KiB) -> pattern byte of its last acknowledged write.
    let acked = Arc::new(Mutex::new(std::collections::BTreeMap::<u64, u8>::new()));
    let writer = {
        let (stop, acked, uri) = (stop.clone(), acked.clone(), vol.uri());
        std::thread::spawn(move || {
            let blocks = LEN * 512 / 65536;
            let mut round = 0u64;
            while !stop.load(Ordering::Relaxed) {
                round += 1;
                let mut cmds = Vec::new();
                let mut wrote = Vec::new();
                for i in 0..8 {
                    let blk = (round * 7 + i * 5) % blocks;
                    let pat = (round * 8 + i) as u8 | 1;
                    cmds.push(format!("write -P {pat} {} 65536", blk * 65536));
                    wrote.push((blk, pat));
                }
                let mut c = Command::new("qemu-io");
                c.args(["-f", "raw"]);
                for cmd in &cmds {
                    c.args(["-c", cmd]);
                }
                let o = c.arg(&uri).output().unwrap();
                assert!(o.status.success(), "qemu-io: {}", text(&o.stderr));
                assert!(!text(&o.stdout).contains("error"), "{}", text(&o.stdout));
                let mut a = acked.lock().unwrap();
                for (blk, pat) in wrote {
                    a.insert(blk, pat);
                }
            }
            round
        })
    };
    let tf = vol.dir.join("reload.table");
    let tfs = tf.display().to_string();
    for k in 1..=12u64 {
        let b = (k % 7 + 1) * 1024; // 4096-byte aligned, moving up and down
        std::fs::write(&tf, split(b)).unwrap();
        ok(&vol, &["reload", "--table", &tfs, &name], None);
        let t = text(&ok(&vol, &["table", &name], None).stdout);
        assert!(
            t.lines()
                .nth(1)
                .is_some_and(|l| l.starts_with(&format!("{b} "))),
            "{t}"
        );
        std::thread::sleep(std::time::Duration::from_millis(30));
    }
    // Refused reloads change nothing.
    let bad = |table: String, needle: &str| {
        let o = ucrypt(
            &vol,
            &["reload", "--table", "-", &name],
            Some(table.as_bytes()),
        );
        assert_eq!(o.status.code(), Some(1), "{needle}: {}", text(&o.stderr));
        assert!(
            text(&o.stderr).contains(needle),
            "{needle}: {}",
            text(&o.stderr)
        );
    };
    bad(
        format!("{}\n", crypt(0, LEN - 8, KA, 0, &vol.image, OFF)),
        "keeps the length",
    );
    let other = vol.dir.join("other.img");
    std::fs::File::create(&other)
        .unwrap()
        .set_len((OFF + LEN) * 512)
        .unwrap();
    bad(
        format!("{}\n", crypt(0, LEN, KA, 0, &other, OFF)),
        "keeps the device",
    );
    bad(
        format!(
            "{}\n{}\n",
            crypt(0, 8, KA, 0, &vol.image, OFF),
            crypt(16, LEN - 16, KA, 16, &vol.image, OFF + 16)
        ),
        "Gap in table",
    );
    let o = ucrypt(&vol, &["reload", "--table", &one, &name], None);
    assert_eq!(
        o.status.code(),
        Some(1),
        "a table on the command line: {}",
        text(&o.stderr)
    );
    // Back to one target; the writer stops.
    ok(
        &vol,
        &["reload", "--table", "-", &name],
        Some(one.as_bytes()),
    );
    stop.store(true, Ordering::Relaxed);
    let rounds = writer.join().unwrap();
    assert!(rounds > 0);
    let acked = acked.lock().unwrap().clone();
    let mut c = Command::new("qemu-io");
    c.args(["-f", "raw"]);
    for (blk, pat) in &acked {
        c.args(["-c", &format!("read -P {pat} {} 65536", blk * 65536)]);
    }
    let o = run(c.arg(vol.uri()));
    let out = text(&o.stdout);
    assert!(
        !out.contains("Pattern verification failed") && !out.contains("error"),
        "{out}"
    );
    let st: serde_json::Value =
        serde_json::from_slice(&ok(&vol, &["status", "--json", &name], None).stdout).unwrap();
    assert!(
        st["stats"]["reconfigurations"].as_u64().unwrap() >= 13,
        "{st}"
    );
    ok(&vol, &["close", &name], None);
}

/// Tables dm refuses: exit 1, no daemon, nothing written.
#[test]
fn refused_tables_write_nothing() {
    let vol = volume("tables-refused");
    let name = vol.name.clone();
    let image = vol.image.display().to_string();
    let other = vol.dir.join("other.img");
    std::fs::File::create(&other)
        .unwrap()
        .set_len((OFF + LEN) * 512)
        .unwrap();
    let d = &vol.image;
    let c512 = |start: u64, len: u64| {
        format!(
            "{start} {len} crypt aes-xts-plain64 {KA} {start} {} {}",
            d.display(),
            OFF + start
        )
    };
    let cases = [
        (
            "gap",
            format!(
                "{}\n{}",
                crypt(0, 4096, KA, 0, d, OFF),
                crypt(4104, 4088, KB, 4104, d, OFF + 4104)
            ),
            "Gap in table",
        ),
        (
            "overlap",
            format!(
                "{}\n{}",
                crypt(0, 4096, KA, 0, d, OFF),
                crypt(4088, 4104, KB, 4088, d, OFF + 4088)
            ),
            "overlaps",
        ),
        (
            "two devices",
            format!(
                "{}\n{}",
                crypt(0, 4096, KA, 0, d, OFF),
                crypt(4096, 4096, KB, 4096, &other, OFF + 4096)
            ),
            "more than one device",
        ),
        (
            "misaligned boundary",
            format!(
                "{}\n4100 4 linear {} {}\n{}",
                c512(0, 4100),
                d.display(),
                OFF + 4100,
                crypt(4104, 4088, KB, 4104, d, OFF + 4104)
            ),
            "not aligned to h/w logical block size 4096",
        ),
    ];
    let before = std::fs::read(&vol.image).unwrap();
    let before_other = std::fs::read(&other).unwrap();
    let input = pattern((LEN * 512) as usize, 5);
    for (what, table, needle) in &cases {
        let file = vol.dir.join("bad.table");
        std::fs::write(&file, table).unwrap();
        let f = file.display().to_string();
        let o = ucrypt(&vol, &["map", "--write", "--table", &f], Some(&input));
        assert_eq!(o.status.code(), Some(1), "{what}: map: {}", text(&o.stderr));
        assert!(
            text(&o.stderr).contains(needle),
            "{what}: {}",
            text(&o.stderr)
        );
        let o = ucrypt(&vol, &["open", "--table", &f, &image, &name], None);
        assert_eq!(
            o.status.code(),
            Some(1),
            "{what}: open: {}",
            text(&o.stderr)
        );
        assert!(
            text(&o.stderr).contains(needle),
            "{what}: {}",
            text(&o.stderr)
        );
        assert!(vol.pid().is_none(), "{what}: a daemon started");
    }
    assert!(
        std::fs::read(&vol.image).unwrap() == before,
        "the image changed"
    );
    assert!(
        std::fs::read(&other).unwrap() == before_other,
        "the other image changed"
    );
}
