//! Faults under ucrypt's RBD backend, on a throwaway single-node cluster:
//!
//! - the OSD stopped and restarted while NBD clients write through
//!   `ucrypt open rbd:POOL/IMAGE`: IO stalls while the OSD is down (counted:
//!   no writer gets more than the one reply that may have been on its way
//!   when the OSD stopped, and no error reply), resumes when the OSD is
//!   back, and every acknowledged write is there afterwards, read back
//!   through ucrypt and, after `close`, through librbd's own LUKS
//!   encryption;
//! - a cluster that does not answer at open: a clear error within a bound.

use crate::rbd_common;

use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use rbd_common::{require_ceph, ucrypt, Cluster, Luks};

const MIB: u64 = 1 << 20;
const BLOCK: usize = 4096;
/// Writers (one NBD connection each) and blocks per writer.
const WRITERS: u64 = 4;
const PER_WRITER: u64 = 256;

/// The content of write number `n` of `writer` to `block`.
fn pattern(writer: u64, n: u64, block: u64) -> Vec<u8> {
    let tag = (writer << 56) ^ (n << 20) ^ block;
    let mut b = Vec::with_capacity(BLOCK);
    for i in 0..(BLOCK / 8) as u64 {
        b.extend_from_slice(&(tag ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15)).to_le_bytes());
    }
    b
}

/// A minimal NBD client: fixed newstyle handshake, one request at a time.
struct Nbd(UnixStream);

impl Nbd {
    fn connect(socket: &Path) -> Self {
        let mut s = UnixStream::connect(socket).expect("connect to the NBD socket");
        // Generous: a write may wait for the OSD to come back.
        s.set_read_timeout(Some(Duration::from_secs(300))).unwrap();
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).unwrap();
        s.write_all(&3u32.to_be_bytes()).unwrap(); // fixed newstyle, no zeroes
        let mut opt = 0x4948_4156_454f_5054u64.to_be_bytes().to_vec();
        opt.extend_from_slice(&1u32.to_be_bytes()); // NBD_OPT_EXPORT_NAME
        opt.extend_from_slice(&0u32.to_be_bytes());
        s.write_all(&opt).unwrap();
        let mut info = [0u8; 10];
        s.read_exact(&mut info).unwrap();
        Self(s)
    }

    /// Sends one request and waits for its reply: the NBD error (0 = ok).
    fn request(&mut self, kind: u16, offset: u64, len: u32, data: &[u8], out: &mut [u8]) -> u32 {
        let mut b = 0x2560_9513u32.to_be_bytes().to_vec();
        b.extend_from_slice(&0u16.to_be_bytes());
        b.extend_from_slice(&kind.to_be_bytes());
        b.extend_from_slice(&offset.to_be_bytes()); // cookie
        b.extend_from_slice(&offset.to_be_bytes());
        b.extend_from_slice(&len.to_be_bytes());
        b.extend_from_slice(data);
        self.0.write_all(&b).expect("send NBD request");
        let mut r = [0u8; 16];
        self.0.read_exact(&mut r).expect("NBD reply");
        let err = u32::from_be_bytes(r[4..8].try_into().unwrap());
        if err == 0 && !out.is_empty() {
            self.0.read_exact(out).expect("NBD read payload");
        }
        err
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> u32 {
        self.request(1, offset, data.len() as u32, data, &mut [])
    }

    fn read(&mut self, offset: u64, len: usize) -> Vec<u8> {
        let mut out = vec![0u8; len];
        let err = self.request(0, offset, len as u32, &[], &mut out);
        assert_eq!(err, 0, "NBD read at {offset} failed");
        out
    }

    fn flush(&mut self) -> u32 {
        self.request(3, 0, 0, &[], &mut [])
    }
}

/// What a block must hold: what it held before the writers started, the
/// last acknowledged write, or (after a write that got an error reply)
/// either that or the failed one.
#[derive(Clone, Copy, Debug)]
enum Expect {
    Initial,
    Write(u64),
    Either(Option<u64>, u64),
}

/// What the writers tell the test as they go.
#[derive(Default)]
struct Progress {
    /// Acknowledged writes, all writers.
    acks: AtomicU64,
    /// Set while the OSD is down (after `osd-stop` returned, before
    /// `osd-start` began).
    osd_down: AtomicBool,
    /// Replies (ok or error) each writer got while `osd_down` was set.
    replies_while_down: [AtomicU64; WRITERS as usize],
    /// Error replies among those.
    errors_while_down: AtomicU64,
}

/// One writer's loop over its own blocks until `stop`; its expectations
/// and its count of error replies.
fn writer(socket: &Path, w: u64, stop: &AtomicBool, progress: &Progress) -> (Vec<Expect>, u64) {
    let mut nbd = Nbd::connect(socket);
    let mut expect = vec![Expect::Initial; PER_WRITER as usize];
    let mut errors = 0;
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let i = n % PER_WRITER;
        let block = w * PER_WRITER + i;
        let err = nbd.write(block * BLOCK as u64, &pattern(w, n, block));
        if progress.osd_down.load(Ordering::SeqCst) {
            progress.replies_while_down[w as usize].fetch_add(1, Ordering::SeqCst);
            if err != 0 {
                progress.errors_while_down.fetch_add(1, Ordering::SeqCst);
            }
        }
        let slot = &mut expect[i as usize];
        if err == 0 {
            *slot = Expect::Write(n);
            progress.acks.fetch_add(1, Ordering::Relaxed);
        } else {
            let before = match *slot {
                Expect::Initial => None,
                Expect::Write(m) => Some(m),
                Expect::Either(_, m) => Some(m),
            };
            *slot = Expect::Either(before, n);
            errors += 1;
        }
        n += 1;
    }
    assert_eq!(nbd.flush(), 0, "flush after the OSD came back");
    (expect, errors)
}

/// Checks `data` (the whole plaintext) against every writer's expectations;
/// `initial` is what the volume held before the writers started.
fn verify(data: &[u8], initial: &[u8], all: &[Vec<Expect>], what: &str) {
    for (w, expect) in all.iter().enumerate() {
        for (i, e) in expect.iter().enumerate() {
            let block = w as u64 * PER_WRITER + i as u64;
            let at = block as usize * BLOCK;
            let got = &data[at..at + BLOCK];
            let ok = match *e {
                Expect::Initial => got == &initial[at..at + BLOCK],
                Expect::Write(n) => got == pattern(w as u64, n, block),
                Expect::Either(before, n) => {
                    got == pattern(w as u64, n, block)
                        || match before {
                            None => got == &initial[at..at + BLOCK],
                            Some(m) => got == pattern(w as u64, m, block),
                        }
                }
            };
            assert!(ok, "{what}: block {block} does not hold {e:?}");
        }
    }
}

/// Sets the flag when dropped (also when unwinding).
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

#[test]
fn osd_restart_under_load_loses_no_acknowledged_write() {
    let test = "osd_restart_under_load_loses_no_acknowledged_write";
    if !require_ceph(test) {
        return;
    }
    // On the suite's shared cluster (bluestore) this stops its only OSD
    // for a while: any other test binary using it meanwhile just waits.
    let c = Cluster::start("rbd-faults");
    let conf = c.conf.display().to_string();
    let pass = c.scratch("pass");
    std::fs::write(&pass, "fault pass").unwrap();
    let pass_s = pass.display().to_string();
    c.create("vol", 24 * MIB);
    let dev = &c.device("vol");
    let fast = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
    let mut a = vec!["--ceph-conf", &conf, "format", "-q"];
    a.extend_from_slice(&fast);
    a.extend_from_slice(&[dev, &pass_s]);
    ucrypt(&a, None);

    let runtime = c.scratch("run");
    std::fs::create_dir_all(&runtime).unwrap();
    let uc = |args: &[&str]| {
        Command::new(testutil::ucrypt_bin())
            .args(["--ceph-conf", &conf])
            .args(args)
            .env("UCRYPT_RUNTIME_DIR", &runtime)
            .output()
            .expect("run ucrypt")
    };
    let o = uc(&["open", "-d", &pass_s, "--mode", "adaptive", dev, "flt"]);
    assert!(
        o.status.success(),
        "open: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let socket: PathBuf = runtime.join("flt.nbd.sock");

    // What the blocks the writers never reach must still hold afterwards:
    // never-written sectors of a fresh volume decrypt to noise, not zeros.
    let len = (WRITERS * PER_WRITER) as usize * BLOCK;
    let initial = Nbd::connect(&socket).read(0, len);

    let stop = AtomicBool::new(false);
    let progress = Progress::default();
    let acks = &progress.acks;
    let (all, errors, while_down) = std::thread::scope(|s| {
        // A failed wait below must not leave the writers running (the scope
        // joins them).
        let _stop_writers = StopOnDrop(&stop);
        let handles: Vec<_> = (0..WRITERS)
            .map(|w| {
                let (socket, stop, progress) = (&socket, &stop, &progress);
                s.spawn(move || writer(socket, w, stop, progress))
            })
            .collect();
        let bound = Duration::from_secs(180);
        testutil::wait_until(bound, "writes before the fault", || {
            acks.load(Ordering::Relaxed) >= 200
        });
        c.script("osd-stop");
        progress.osd_down.store(true, Ordering::SeqCst);
        // The OSD process is gone. Each writer has one request at a time:
        // the one it had out when the OSD stopped may have been written
        // before and be answered now; every later one must wait for the
        // OSD. The window only gives a stall-free data path the chance to
        // show (writers that kept going would count many replies here).
        std::thread::sleep(Duration::from_secs(3));
        progress.osd_down.store(false, Ordering::SeqCst);
        let while_down: Vec<u64> = progress
            .replies_while_down
            .iter()
            .map(|r| r.load(Ordering::SeqCst))
            .collect();
        c.script("osd-start");
        let resumed_from = acks.load(Ordering::Relaxed);
        testutil::wait_until(bound, "writes after the OSD came back", || {
            acks.load(Ordering::Relaxed) >= resumed_from + 200
        });

        stop.store(true, Ordering::Relaxed);
        let mut all = Vec::new();
        let mut errors = 0;
        for h in handles {
            let (e, n) = h.join().expect("writer");
            all.push(e);
            errors += n;
        }
        (all, errors, while_down)
    });
    eprintln!(
        "{} writes acknowledged, {errors} error replies; replies per writer while the OSD \
         was down: {while_down:?}",
        acks.load(Ordering::Relaxed)
    );
    assert!(
        while_down.iter().all(|&n| n <= 1),
        "writes completed while the OSD was down (replies per writer: {while_down:?})"
    );
    assert_eq!(
        progress.errors_while_down.load(Ordering::SeqCst),
        0,
        "error replies while the OSD was down: librbd waits for the OSD"
    );
    assert_eq!(errors, 0, "error replies: IO should only have waited");

    // Through ucrypt, on the same open volume.
    let mut nbd = Nbd::connect(&socket);
    verify(
        &nbd.read(0, len),
        &initial,
        &all,
        "read through ucrypt after the restart",
    );
    drop(nbd);
    let o = uc(&["close", "flt"]);
    assert!(
        o.status.success(),
        "close: {}",
        String::from_utf8_lossy(&o.stderr)
    );

    // Independently, through librbd's own LUKS2 decryption.
    let data = c.librbd_read("vol", Luks::V2, &pass);
    // librbd reads never-written ranges (holes in the objects) as zeros
    // instead of decrypting them.
    verify(
        &data,
        &vec![0; len],
        &all,
        "read through librbd's encryption after close",
    );
}

#[test]
fn open_against_a_silent_cluster_fails_clearly_within_a_bound() {
    let test = "open_against_a_silent_cluster_fails_clearly";
    if !require_ceph(test) {
        return;
    }
    // A "monitor" that accepts connections and never says a word.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let dir = testutil::TempDir::new("rbd-silent");
    let keyring = dir.join("keyring");
    std::fs::write(
        &keyring,
        "[client.admin]\n\tkey = AQBt1RxlAAAAABAAxs4Zm3mJ0QhV2u6DSxEUoQ==\n",
    )
    .unwrap();
    let conf = dir.join("ceph.conf");
    std::fs::write(
        &conf,
        format!(
            "[global]\nmon host = v2:127.0.0.1:{port}\nkeyring = {}\n\
             client mount timeout = 5\nrados mon op timeout = 5\n",
            keyring.display()
        ),
    )
    .unwrap();
    let pass = dir.join("pass");
    std::fs::write(&pass, "x").unwrap();
    for args in [
        vec!["dump", "rbd:rbd/none"],
        vec![
            "open",
            "-d",
            &pass.to_string_lossy(),
            "rbd:rbd/none",
            "silent",
        ],
    ] {
        let mut child = Command::new(testutil::ucrypt_bin())
            .arg("--ceph-conf")
            .arg(&conf)
            .args(&args)
            .env("UCRYPT_RUNTIME_DIR", dir.join("run"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ucrypt");
        // A hang detector, not a speed limit: the configured bound is 5 s.
        let end = Instant::now() + Duration::from_secs(120);
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if Instant::now() > end {
                let _ = child.kill();
                panic!("ucrypt {args:?} still waiting for a silent cluster after 120 s");
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(!status.success(), "ucrypt {args:?} succeeded: {err}");
        let e = err.to_lowercase();
        assert!(
            e.contains("rbd:rbd/none") && (e.contains("answer") || e.contains("timed out")),
            "ucrypt {args:?}: the error names the image and the timeout: {err}"
        );
    }
    drop(silent);
}
