//! `ucrypt open --export nbd` driven by real NBD clients: fio's nbd engine,
//! nbdcopy, nbdinfo, qemu-img; plus hostile raw clients, the daemon
//! lifecycle (close, SIGTERM, crash) and the status/table/refresh commands.

use crate::frontends_common;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::Duration;

use frontends_common::{random_bytes, run, Vol, KEY};

const MIB: u64 = 1 << 20;

fn fio(vol: &Vol, bs: &str, depth: u32, size: &str) {
    fio_jobs(vol, bs, depth, size, 1);
}

/// `jobs` > 1: that many connections at once (multi-conn), each on its own
/// region of the export.
fn fio_jobs(vol: &Vol, bs: &str, depth: u32, size: &str, jobs: u32) {
    let o = run(Command::new("fio")
        .arg(format!("--numjobs={jobs}"))
        .arg(format!("--offset_increment={size}"))
        .args([
            "--name=verify",
            "--ioengine=nbd",
            "--rw=randwrite",
            "--verify=crc32c",
        ])
        .args([
            "--do_verify=1",
            "--verify_fatal=1",
            "--verify_state_save=0",
            "--randrepeat=0",
            "--output-format=terse",
            "--terse-version=3",
        ])
        .arg(format!("--uri={}", vol.uri()))
        .arg(format!("--bs={bs}"))
        .arg(format!("--iodepth={depth}"))
        .arg(format!("--size={size}")));
    // terse v3: field 5 is the job's error code.
    let out = String::from_utf8_lossy(&o.stdout);
    let lines: Vec<&str> = out.lines().filter(|l| l.starts_with("3;")).collect();
    assert_eq!(
        lines.len(),
        jobs as usize,
        "one terse line per job expected: {out}"
    );
    for l in lines {
        let err = l.split(';').nth(4).unwrap_or("?");
        assert_eq!(err, "0", "fio {bs} QD{depth} reported error: {out}");
    }
}

#[test]
fn fio_nbd_write_verify_4k_and_1m_at_qd1_and_qd16() {
    if !testutil::require_tool("fio_nbd_write_verify", "fio")
        || !testutil::require_tool("fio_nbd", "python3")
    {
        return;
    }
    let mut vol = Vol::new("fe-fio", 64 * MIB, 512);
    vol.open(&[]);
    fio(&vol, "4k", 1, "4M");
    fio(&vol, "4k", 16, "8M");
    fio(&vol, "1M", 1, "16M");
    fio(&vol, "1M", 16, "32M");
    // Multi-conn: four connections at once, each verifying its own 8 MiB.
    fio_jobs(&vol, "64k", 8, "8M", 4);
    // What fio wrote and verified through NBD is what dm-crypt would have
    // written: the independent oracle decrypts the backing file to the same
    // bytes a real client reads back.
    let plain = read_all(&vol);
    vol.close();
    let raw = std::fs::read(&vol.image).unwrap();
    assert_ne!(
        raw[..MIB as usize],
        plain[..MIB as usize],
        "backing file holds plaintext"
    );
    if testutil::require_python_module("fio_nbd_oracle", "cryptography") {
        assert!(
            vol.oracle_decrypt() == plain,
            "oracle decryption differs from what NBD clients read"
        );
    }
}

/// An image on tmpfs is served from its mapped pages (the adaptive
/// default encrypts into them and decrypts out of them: `status` counts
/// the lent requests), and what fio writes and verifies through NBD, with
/// one connection and with four, is what dm-crypt would have written.
#[test]
fn a_tmpfs_image_is_served_from_its_mapped_pages() {
    let test = "a_tmpfs_image_is_served_from_its_mapped_pages";
    if !testutil::require_tool(test, "fio")
        || !testutil::require(test, testutil::Capability::ShmTmpfs)
    {
        return;
    }
    for ss in [512, 4096] {
        let mut vol = Vol::new_in(std::path::Path::new("/dev/shm"), "fe-shm", 64 * MIB, ss);
        vol.open(&[]);
        fio(&vol, "4k", 16, "8M");
        fio(&vol, "1M", 8, "32M");
        fio_jobs(&vol, "64k", 8, "8M", 4);
        let o = vol.ucrypt(&["status", &vol.name]);
        let s = String::from_utf8_lossy(&o.stdout).into_owned();
        let lent = s
            .lines()
            .find(|l| l.starts_with("  io:"))
            .and_then(|l| l.split_once("lent "))
            .and_then(|(_, n)| n.split(',').next()?.trim().parse::<u64>().ok());
        assert!(
            lent.is_some_and(|n| n > 1000),
            "{ss}: status counts the lent requests:\n{s}"
        );
        let plain = read_all(&vol);
        vol.close();
        if testutil::require_python_module("fio_nbd_oracle", "cryptography") {
            assert!(
                vol.oracle_decrypt() == plain,
                "{ss}: oracle decryption differs from what NBD clients read"
            );
        }
    }
}

/// Reads the whole export with nbdcopy (or fio's verify already did the check).
fn read_all(vol: &Vol) -> Vec<u8> {
    let out = vol.dir.join("readback.raw");
    run(Command::new("nbdcopy").arg(vol.uri()).arg(&out));
    std::fs::read(out).unwrap()
}

#[test]
fn nbdcopy_and_qemu_img_round_trip() {
    for t in ["nbdcopy", "qemu-img"] {
        if !testutil::require_tool("nbdcopy_and_qemu_img_round_trip", t) {
            return;
        }
    }
    let size = 32 * MIB;
    let mut vol = Vol::new("fe-copy", size, 4096);
    let src = vol.dir.join("src.raw");
    std::fs::write(&src, random_bytes(size as usize, 0x5eed)).unwrap();
    vol.open(&[]);
    // nbdcopy in, qemu-img compare against the export.
    run(Command::new("nbdcopy").arg(&src).arg(vol.uri()));
    run(Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(&src)
        .arg(vol.uri()));
    // qemu-img convert out of the export, byte-identical.
    let out = vol.dir.join("out.raw");
    run(Command::new("qemu-img")
        .args(["convert", "-f", "raw", "-O", "raw"])
        .arg(vol.uri())
        .arg(&out));
    assert!(std::fs::read(&out).unwrap() == std::fs::read(&src).unwrap());
    // qemu-img convert into the export (-n: target exists), nbdcopy back.
    let src2 = vol.dir.join("src2.raw");
    std::fs::write(&src2, random_bytes(size as usize, 0xfeed)).unwrap();
    run(Command::new("qemu-img")
        .args(["convert", "-n", "-f", "raw", "-O", "raw"])
        .arg(&src2)
        .arg(vol.uri()));
    vol.close();
    // Persistent across close/reopen, and encrypted at rest.
    let raw = std::fs::read(&vol.image).unwrap();
    let want = std::fs::read(&src2).unwrap();
    assert!(raw != want, "backing file holds plaintext");
    vol.open(&[]);
    assert!(read_all(&vol) == want, "data changed across close/reopen");
    vol.close();
}

#[test]
fn nbdinfo_reports_size_and_block_sizes() {
    if !testutil::require_tool("nbdinfo_reports_size_and_block_sizes", "nbdinfo") {
        return;
    }
    for ss in [512u32, 4096] {
        let mut vol = Vol::new("fe-info", 16 * MIB, ss);
        vol.open(&["--allow-discards"]);
        let o = run(Command::new("nbdinfo").arg("--json").arg(vol.uri()));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let e = &v["exports"][0];
        assert_eq!(e["export-size"], 16 * MIB);
        assert_eq!(e["block_size_minimum"], ss);
        assert_eq!(e["block_size_preferred"], ss.max(4096));
        assert_eq!(e["block_size_maximum"], 32 * MIB);
        assert_eq!(e["can_flush"], true);
        assert_eq!(e["can_fua"], true);
        assert_eq!(e["can_multi_conn"], true);
        assert_eq!(e["can_trim"], true);
        assert_eq!(e["can_zero"], true);
        assert_eq!(e["is_read_only"], false);
        vol.close();
    }
    let mut vol = Vol::new("fe-info-ro", 16 * MIB, 512);
    vol.open(&["--readonly"]);
    let o = run(Command::new("nbdinfo").arg("--json").arg(vol.uri()));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["exports"][0]["is_read_only"], true);
    assert_eq!(v["exports"][0]["can_trim"], false);
    vol.close();
}

/// NBD handshake up to the transmission phase on the default export.
fn raw_client(vol: &Vol) -> UnixStream {
    let mut s = UnixStream::connect(vol.socket()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    s.write_all(&3u32.to_be_bytes()).unwrap(); // fixed newstyle, no zeroes
    let mut opt = 0x4948_4156_454f_5054u64.to_be_bytes().to_vec();
    opt.extend_from_slice(&1u32.to_be_bytes()); // NBD_OPT_EXPORT_NAME
    opt.extend_from_slice(&0u32.to_be_bytes());
    s.write_all(&opt).unwrap();
    let mut info = [0u8; 10];
    s.read_exact(&mut info).unwrap();
    s
}

fn request(kind: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut b = 0x2560_9513u32.to_be_bytes().to_vec();
    b.extend_from_slice(&0u16.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&cookie.to_be_bytes());
    b.extend_from_slice(&offset.to_be_bytes());
    b.extend_from_slice(&len.to_be_bytes());
    b
}

fn reply_error(s: &mut UnixStream) -> u32 {
    let mut r = [0u8; 16];
    s.read_exact(&mut r).unwrap();
    u32::from_be_bytes(r[4..8].try_into().unwrap())
}

fn eof(s: &mut UnixStream) -> bool {
    let mut b = [0u8; 256];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => {}
            Err(_) => return false,
        }
    }
}

#[test]
fn bad_clients_only_hurt_themselves() {
    if !testutil::require_tool("bad_clients_only_hurt_themselves", "nbdinfo") {
        return;
    }
    let mut vol = Vol::new("fe-bad", 8 * MIB, 512);
    vol.open(&[]);
    let before = std::fs::read(&vol.image).unwrap();
    // A well-behaved connection held open throughout.
    let mut good = raw_client(&vol);

    // Garbage before the handshake.
    let mut g = UnixStream::connect(vol.socket()).unwrap();
    g.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    g.write_all(&random_bytes(4096, 7)).unwrap();
    assert!(eof(&mut g));
    // Garbage in the transmission phase.
    let mut g = raw_client(&vol);
    g.write_all(&random_bytes(1000, 9)).unwrap();
    assert!(eof(&mut g));
    // A truncated write: header promises 64 KiB, 10 bytes arrive, hang up.
    let mut g = raw_client(&vol);
    let mut b = request(1, 1, 0, 65536);
    b.extend_from_slice(&[0xee; 10]);
    g.write_all(&b).unwrap();
    g.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(eof(&mut g));
    // Past-the-end read / write and an unknown command: error replies.
    let mut g = raw_client(&vol);
    g.write_all(&request(0, 2, 8 * MIB, 4096)).unwrap();
    assert_eq!(reply_error(&mut g), 22); // EINVAL
    let mut w = request(1, 3, 8 * MIB - 512, 4096);
    w.extend_from_slice(&[0xee; 4096]);
    g.write_all(&w).unwrap();
    assert_eq!(reply_error(&mut g), 28); // ENOSPC
    g.write_all(&request(77, 4, 0, 512)).unwrap();
    assert_eq!(reply_error(&mut g), 22);

    // The daemon still serves everyone else.
    good.write_all(&request(3, 5, 0, 0)).unwrap(); // FLUSH
    assert_eq!(reply_error(&mut good), 0);
    run(Command::new("nbdinfo").arg(vol.uri()));
    let st = vol.ucrypt(&["status", &vol.name]);
    assert!(st.status.success());
    let text = String::from_utf8_lossy(&st.stdout).into_owned();
    assert!(text.contains("disconnected for protocol errors"), "{text}");
    drop(good);
    drop(g);
    vol.close();
    assert!(
        std::fs::read(&vol.image).unwrap() == before,
        "a bad client changed the backing file"
    );
}

#[test]
fn lifecycle_status_table_refresh_list_and_crash_recovery() {
    let mut vol = Vol::new("fe-life", 8 * MIB, 512);
    let out = vol.open(&["--perf-no_read_workqueue", "--allow-discards"]);
    assert!(out.contains(&vol.socket().display().to_string()), "{out}");
    let name = vol.name.clone();

    let o = vol.ucrypt(&["status", &name]);
    let s = String::from_utf8_lossy(&o.stdout).into_owned();
    for want in [
        "is active",
        "type:    PLAIN",
        "cipher:  aes-xts-plain64",
        "keysize: 512 bits",
        "sector size:  512",
        "offset:  0 sectors",
        "size:    16384 sectors",
        "mode:    read/write",
        "flags:   discards no_read_workqueue",
        "data path: classic",
    ] {
        assert!(s.contains(want), "status lacks {want:?}:\n{s}");
    }
    assert!(s.contains(&vol.image.display().to_string()));

    // table: key masked unless --showkeys.
    let t = String::from_utf8_lossy(&vol.ucrypt(&["table", &name]).stdout).into_owned();
    assert!(!t.contains(KEY) && t.contains(&"0".repeat(128)), "{t}");
    assert!(
        t.contains("allow_discards") && t.contains("no_read_workqueue"),
        "{t}"
    );
    let t =
        String::from_utf8_lossy(&vol.ucrypt(&["table", &name, "--showkeys"]).stdout).into_owned();
    assert!(t.contains(KEY), "{t}");

    // refresh switches live; the flags given replace the old set.
    let o = vol.ucrypt(&[
        "refresh",
        &name,
        "--perf-no_write_workqueue",
        "--mode",
        "inline",
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = String::from_utf8_lossy(&vol.ucrypt(&["status", &name]).stdout).into_owned();
    assert!(
        s.contains("data path: inline") && s.contains("no_write_workqueue"),
        "{s}"
    );
    assert!(!s.contains("no_read_workqueue"), "{s}");
    let o = vol.ucrypt(&["refresh", &name, "--mode", "sideways"]);
    assert_eq!(o.status.code(), Some(1));

    // list, and a second open of the same name is refused (busy, 5).
    let l = String::from_utf8_lossy(&vol.ucrypt(&["list"]).stdout).into_owned();
    assert!(l.contains(&name) && l.contains("nbd"), "{l}");
    let table = vol.table();
    let image = vol.image.display().to_string();
    let o = vol.ucrypt(&["open", "--table", &table, &image, &name]);
    assert_eq!(
        o.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );

    // A crashed daemon (SIGKILL) leaves pid file and sockets behind; the
    // next open cleans them up and serves again.
    let pid = vol.pid().unwrap();
    run(Command::new("kill").args(["-9", &pid.to_string()]));
    // Gone, or a zombie (its files closed) until its parent reaps it.
    testutil::wait_until(Duration::from_secs(60), "the killed daemon to exit", || {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(true)
    });
    assert!(
        vol.socket().exists(),
        "a SIGKILLed daemon cannot remove its socket"
    );
    let o = vol.ucrypt(&["status", &name]);
    assert_eq!(o.status.code(), Some(4));
    vol.open(&[]);
    let pid = vol.pid().unwrap();

    // SIGTERM: drain, flush, remove socket/pid.
    run(Command::new("kill").args(["-TERM", &pid.to_string()]));
    testutil::wait_until(
        Duration::from_secs(60),
        "SIGTERM to remove the socket and pid file",
        || !vol.socket().exists() && vol.pid().is_none(),
    );
    let o = vol.ucrypt(&["close", &name]);
    assert_eq!(
        o.status.code(),
        Some(4),
        "closing a closed volume must fail"
    );

    // Bad arguments fail with cryptsetup's exit codes and clear messages.
    let o = vol.ucrypt(&["open", "--table", "0 8 crypt nope - 0 x 0", &image, &name]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("Invalid table"));
    let o = vol.ucrypt(&["open", "--export", "ublk", "--table", &table, &image, &name]);
    assert_ne!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stderr).contains("ublk export not available"));
    let o = vol.ucrypt(&["open", "--table", &table, "/nonexistent/dev", &name]);
    assert_eq!(o.status.code(), Some(4));
}

#[test]
fn tcp_listen_is_loopback_and_warns() {
    if !testutil::require_tool("tcp_listen_is_loopback_and_warns", "nbdinfo") {
        return;
    }
    let vol = Vol::new("fe-tcp", 8 * MIB, 512);
    // Port 0: the kernel picks one; open prints the real address.
    let table = vol.table();
    let image = vol.image.display().to_string();
    let name = vol.name.clone();
    // Plaintext over TCP only when asked for in so many words.
    let o = vol.ucrypt(&["open", "--listen", "0", "--table", &table, &image, &name]);
    assert_eq!(o.status.code(), Some(1), "plaintext --listen was served");
    assert!(String::from_utf8_lossy(&o.stderr).contains("--tls=off"));
    assert!(!vol.socket().exists() && vol.pid().is_none());
    let o = vol.ucrypt(&[
        "open",
        "--listen",
        "0",
        "--tls=off",
        "--table",
        &table,
        &image,
        &name,
    ]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    // The warning reaches the user's terminal, not only the daemon's log.
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("unencrypted"),
        "no warning on the terminal"
    );
    let log = std::fs::read_to_string(vol.runtime().join(format!("{name}.log"))).unwrap();
    assert!(log.contains("unencrypted"), "no warning: {log}");
    let uri = out
        .split_whitespace()
        .find(|w| w.starts_with("nbd://127.0.0.1:"))
        .expect("loopback uri");
    let o = run(Command::new("nbdinfo").arg("--size").arg(uri));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        (8 * MIB).to_string()
    );
    let o = vol.ucrypt(&["close", &name]);
    assert!(o.status.success());
}

/// `open` with `--tls-psk` (unix socket and TCP) and `--tls-certificates`:
/// TLS clients are served at the `nbds` URI open prints, plaintext
/// clients are refused, bad credentials fail before anything starts.
#[test]
fn open_with_tls_serves_nbds_only() {
    let t = "open_with_tls_serves_nbds_only";
    if !testutil::require_tool(t, "nbdinfo") || !testutil::require_tool(t, "openssl") {
        return;
    }
    let mut vol = Vol::new("fe-tls", 8 * MIB, 512);
    let psk = vol.dir.join("keys.psk");
    std::fs::write(&psk, format!("alice:{}\n", &KEY[..64])).unwrap();
    let psk_s = psk.display().to_string();
    let uri_in = |out: &str, scheme: &str| {
        out.split_whitespace()
            .find(|w| w.starts_with(scheme))
            .unwrap_or_else(|| panic!("no {scheme} URI in {out:?}"))
            .to_owned()
    };
    for listen in [None, Some("0")] {
        let mut extra = vec!["--tls-psk", &psk_s];
        if let Some(l) = listen {
            extra.extend(["--listen", l]);
        }
        let out = vol.open(&extra);
        let scheme = if listen.is_some() {
            "nbds://"
        } else {
            "nbds+unix://"
        };
        let uri = uri_in(&out, scheme);
        let sep = if uri.contains('?') { '&' } else { '?' };
        let with_user = uri.replacen("://", "://alice@", 1);
        let o = run(Command::new("nbdinfo")
            .arg("--size")
            .arg(format!("{with_user}{sep}tls-psk-file={psk_s}")));
        assert_eq!(
            String::from_utf8_lossy(&o.stdout).trim(),
            (8 * MIB).to_string()
        );
        let plain = uri.replacen("nbds", "nbd", 1);
        let o = Command::new("nbdinfo").arg(&plain).output().unwrap();
        assert!(!o.status.success(), "plaintext client served at {plain}");
        vol.close();
    }

    // X.509: a self-signed server certificate is its own CA.
    let certs = vol.dir.join("certs");
    let client = vol.dir.join("client");
    std::fs::create_dir_all(&certs).unwrap();
    std::fs::create_dir_all(&client).unwrap();
    run(Command::new("openssl").current_dir(&certs).args([
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=localhost",
        "-addext",
        "subjectAltName=DNS:localhost,IP:127.0.0.1",
        "-keyout",
        "server-key.pem",
        "-out",
        "server-cert.pem",
    ]));
    std::fs::copy(certs.join("server-cert.pem"), client.join("ca-cert.pem")).unwrap();
    let certs_s = certs.display().to_string();
    let out = vol.open(&["--tls-certificates", &certs_s]);
    let uri = uri_in(&out, "nbds+unix://");
    let o = run(Command::new("nbdinfo")
        .arg("--size")
        .arg(format!("{uri}&tls-certificates={}", client.display())));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        (8 * MIB).to_string()
    );
    vol.close();

    // Over TCP clients need a certificate by default: without a
    // ca-cert.pem to check them against, open refuses...
    let table = vol.table();
    let image = vol.image.display().to_string();
    let name = vol.name.clone();
    let tcp_x509 = ["--listen", "0", "--tls-certificates", certs_s.as_str()];
    let mut a = vec!["open", "--table", table.as_str()];
    a.extend(tcp_x509);
    a.extend([image.as_str(), name.as_str()]);
    let o = vol.ucrypt(&a);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("ca-cert.pem"), "{err}");
    assert!(vol.pid().is_none(), "a daemon started without ca-cert.pem");
    // ...and --tls-verify-peer=no serves any TLS client, with a warning
    // on the user's terminal.
    let mut a = vec!["open", "--table", table.as_str()];
    a.extend(tcp_x509);
    a.extend(["--tls-verify-peer=no", image.as_str(), name.as_str()]);
    let o = vol.ucrypt(&a);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("--tls-verify-peer=no"), "no warning: {err}");
    let uri = uri_in(&String::from_utf8_lossy(&o.stdout), "nbds://");
    let o = run(Command::new("nbdinfo")
        .arg("--size")
        .arg(format!("{uri}/?tls-certificates={}", client.display())));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        (8 * MIB).to_string()
    );
    vol.close();

    // Refusals: exit 1, a message naming the problem, no daemon.
    let empty = vol.dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let empty_s = empty.display().to_string();
    let table = vol.table();
    let image = vol.image.display().to_string();
    let name = vol.name.clone();
    for (args, says) in [
        (
            vec!["--tls-certificates", empty_s.as_str()],
            "server-cert.pem",
        ),
        (vec!["--tls=require"], "--tls-psk"),
        (
            vec!["--tls=maybe", "--tls-psk", psk_s.as_str()],
            "off, on or require",
        ),
        (
            vec!["--tls-verify-peer", "--tls-psk", psk_s.as_str()],
            "--tls-certificates",
        ),
        (
            vec!["--listen", "0", "--tls=on", "--tls-psk", psk_s.as_str()],
            "--tls=require",
        ),
        (
            vec![
                "--tls-verify-peer=maybe",
                "--tls-certificates",
                certs_s.as_str(),
            ],
            "--tls-verify-peer",
        ),
        (
            vec!["--export", "fuse", "--tls-psk", psk_s.as_str()],
            "--export nbd",
        ),
    ] {
        let mut a = vec!["open", "--table", &table];
        a.extend(args.iter().copied());
        a.extend([image.as_str(), name.as_str()]);
        let o = vol.ucrypt(&a);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err}");
        assert!(vol.pid().is_none(), "{args:?} started a daemon");
    }
}

/// `status` names the backing device's IO path (the engine `--io-engine`
/// chose, buffered or O_DIRECT) and counts the operations that took it.
#[test]
fn status_shows_the_io_path_and_its_counters() {
    if !testutil::require_tool("status_shows_the_io_path", "nbdcopy") {
        return;
    }
    for (tag, args, want) in [
        ("fe-io-ring", ["--io-engine", "uring"], "io_uring"),
        ("fe-io-sys", ["--io-engine", "syscalls"], "pread/pwrite"),
    ] {
        let mut vol = Vol::new(tag, 4 * MIB, 512);
        vol.open(&args);
        let io_line = |vol: &Vol| {
            let o = vol.ucrypt(&["status", &vol.name]);
            let s = String::from_utf8_lossy(&o.stdout).into_owned();
            let line = s
                .lines()
                .find(|l| l.starts_with("  io:"))
                .map(str::to_owned);
            line.unwrap_or_else(|| panic!("status has no io line:\n{s}"))
        };
        // Every counter after the `;`, summed.
        let ops = |line: &str| -> u64 {
            let (_, counters) = line.split_once("; ").expect("counters");
            counters
                .split(", ")
                .map(|c| c.rsplit_once(' ').unwrap().1.parse::<u64>().unwrap())
                .sum()
        };
        let before = io_line(&vol);
        assert!(
            before.starts_with(&format!("  io:      {want}, ")),
            "{tag}: {before}"
        );
        read_all(&vol);
        let after = io_line(&vol);
        assert!(ops(&after) > ops(&before), "{tag}: {before} then {after}");
        vol.close();
    }
}
