//! Misuse rows: network exports and hostile peers. NBD over TCP on
//! loopback only (127.0.0.1, and 127.0.0.2 as a second peer address),
//! vhost-user-blk on a unix socket in the case's directory.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use testutil::Capability;

use super::harness::{text, Case, Expect, Outcome, Row};

#[path = "../../../../vhost/tests/common/master.rs"]
mod master;

/// A fixed aes-xts-plain64 key (hex) for plain tables.
const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
                   f0e1d2c3b4a5968778695a4b3c2d1e0fffeeddccbbaa99887766554433221100";

/// The PSK identity and key the exports accept.
const PSK_ID: &str = "alice";
const PSK_KEY: &str = "5f0b3b1a9ac4e9d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8";

/// Tools an NBD-over-TLS row needs.
const TLS_TOOLS: &[Capability<'static>] = &[
    Capability::Tool("openssl"),
    Capability::Tool("nbdinfo"),
    Capability::Tool("nbdcopy"),
];

/// `open --type plain --table` arguments for `img` (`sectors` of 512
/// bytes) as `name`.
fn plain_open(img: &Path, sectors: u64, name: &str, extra: &[&str]) -> Vec<String> {
    let img = img.display().to_string();
    let table = format!("0 {sectors} crypt aes-xts-plain64 {KEY} 0 {img} 0");
    let mut a: Vec<String> = ["open", "--type", "plain", "--table", &table]
        .iter()
        .map(|s| s.to_string())
        .collect();
    a.extend(extra.iter().map(|s| s.to_string()));
    a.extend([img, name.to_owned()]);
    a
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Serves a watched 1 MiB image as `name` with `extra` options (setup,
/// expected to work); returns `open`'s output line.
fn serve(c: &mut Case, name: &str, extra: &[&str]) -> String {
    let img = c.image(&format!("{name}.img"), 1 << 20);
    c.watch(&img);
    let a = plain_open(&img, 2048, name, extra);
    let o = c.open_ok(&args(&a), name);
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// The `nbds://127.0.0.1:PORT` (or, without TLS required, `nbd://`)
/// address in `open`'s output.
fn tcp_uri(out: &str) -> String {
    out.split_whitespace()
        .find(|w| w.starts_with("nbds://127.0.0.1:") || w.starts_with("nbd://127.0.0.1:"))
        .unwrap_or_else(|| panic!("no nbd[s]://127.0.0.1 URI in {out:?}"))
        .trim_end_matches('/')
        .to_owned()
}

/// `nbdcopy` of a 1 MiB pattern into `uri`: a client that would overwrite
/// the device if it were let in.
fn nbdcopy_into(c: &Case, uri: &str) -> Outcome {
    let src = c.image("pattern.raw", 1 << 20);
    Command::new("nbdcopy")
        .arg(&src)
        .arg(uri)
        .output()
        .expect("run nbdcopy")
        .into()
}

/// X.509 credentials made by the `openssl` CLI in the case's directory.
struct Creds {
    /// The server's directory: ca-cert.pem, server-cert.pem, server-key.pem.
    server: PathBuf,
    /// A client with a certificate signed by the server's CA.
    client: PathBuf,
    /// A client that trusts the server but has no certificate.
    bare: PathBuf,
    /// A client that trusts the server, with a certificate of another CA.
    stranger: PathBuf,
}

impl Creds {
    fn new(c: &Case) -> Self {
        let work = c.path("pki");
        let d = |n: &str| {
            let p = c.path(n);
            std::fs::create_dir_all(&p).expect("creds dir");
            p
        };
        let (server, client, bare, stranger) = (d("server"), d("client"), d("bare"), d("stranger"));
        std::fs::create_dir_all(&work).expect("pki dir");
        // EC keys: generated in milliseconds, and GnuTLS takes them.
        let key = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        for ca in ["ca", "other-ca"] {
            let mut a = vec!["req", "-x509", "-days", "2"];
            a.extend(key);
            let subj = format!("/CN=ucrypt misuse {ca}");
            let (k, crt) = (format!("{ca}-key.pem"), format!("{ca}-cert.pem"));
            a.extend(["-subj", &subj, "-keyout", &k, "-out", &crt]);
            openssl(&work, &a);
        }
        let ext = |name: &str, body: &str| {
            let p = work.join(name);
            std::fs::write(&p, body).expect("ext file");
            p.display().to_string()
        };
        let server_ext = ext(
            "server.ext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n\
             basicConstraints=CA:FALSE\n",
        );
        let client_ext = ext(
            "client.ext",
            "extendedKeyUsage=clientAuth\nbasicConstraints=CA:FALSE\n",
        );
        for (name, ca, ext) in [
            ("server", "ca", &server_ext),
            ("client", "ca", &client_ext),
            ("stranger", "other-ca", &client_ext),
        ] {
            let mut a = vec!["req"];
            a.extend(key);
            let subj = format!("/CN={name}");
            let (k, csr) = (format!("{name}-key.pem"), format!("{name}.csr"));
            a.extend(["-subj", &subj, "-keyout", &k, "-out", &csr]);
            openssl(&work, &a);
            let (ca_cert, ca_key) = (format!("{ca}-cert.pem"), format!("{ca}-key.pem"));
            let crt = format!("{name}-cert.pem");
            openssl(
                &work,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &csr,
                    "-CA",
                    &ca_cert,
                    "-CAkey",
                    &ca_key,
                    "-CAcreateserial",
                    "-days",
                    "2",
                    "-extfile",
                    ext,
                    "-out",
                    &crt,
                ],
            );
        }
        let cp = |from: &str, to: &Path, name: &str| {
            std::fs::copy(work.join(from), to.join(name)).expect("copy credential");
        };
        cp("ca-cert.pem", &server, "ca-cert.pem");
        cp("server-cert.pem", &server, "server-cert.pem");
        cp("server-key.pem", &server, "server-key.pem");
        for dir in [&client, &bare, &stranger] {
            cp("ca-cert.pem", dir, "ca-cert.pem");
        }
        cp("client-cert.pem", &client, "client-cert.pem");
        cp("client-key.pem", &client, "client-key.pem");
        cp("stranger-cert.pem", &stranger, "client-cert.pem");
        cp("stranger-key.pem", &stranger, "client-key.pem");
        Self {
            server,
            client,
            bare,
            stranger,
        }
    }
}

fn openssl(dir: &Path, a: &[&str]) {
    let o = Command::new("openssl")
        .args(a)
        .current_dir(dir)
        .output()
        .expect("run openssl");
    assert!(o.status.success(), "openssl {a:?}: {}", text(&o));
}

/// The export's PSK file (`psktool`'s format) in the case's directory.
fn psk_file(c: &Case, key: &str) -> PathBuf {
    let p = c.path(&format!("{key:.8}.psk"));
    std::fs::write(&p, format!("{PSK_ID}:{key}\n")).expect("psk file");
    p
}

/// `nbdinfo --size URI` succeeds (the export works for a rightful client).
fn served(uri: &str) -> bool {
    let o = Command::new("nbdinfo")
        .args(["--size", uri])
        .output()
        .expect("run nbdinfo");
    o.status.success()
}

/// A TCP connection to `to` from source address `from` (port chosen by
/// the kernel), as a peer on another host would make it.
fn connect_from(from: [u8; 4], to: SocketAddr) -> std::io::Result<TcpStream> {
    use nix::sys::socket::{bind, connect, socket, AddressFamily, SockFlag, SockType, SockaddrIn};
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )?;
    let [a, b, c, d] = from;
    bind(
        std::os::fd::AsRawFd::as_raw_fd(&fd),
        &SockaddrIn::new(a, b, c, d, 0),
    )?;
    let SocketAddr::V4(v4) = to else {
        return Err(std::io::Error::other("IPv4 only"));
    };
    connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &SockaddrIn::from(v4))?;
    Ok(TcpStream::from(fd))
}

/// Reads the server's 18-byte NBD greeting; false if the server closed
/// the connection instead.
fn greeted(s: &mut TcpStream) -> bool {
    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).is_ok() && &hello[..8] == b"NBDMAGIC"
}

/// The daemon of volume `name` in this case (from its pid file).
fn daemon_pid(c: &Case, name: &str) -> u32 {
    let p = c.runtime().join(format!("{name}.pid"));
    std::fs::read_to_string(&p)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pid in {}", p.display()))
}

/// A field of `/proc/PID/status` in KiB (`VmHWM`: peak resident set).
fn status_kib(pid: u32, field: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    s.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// This area's rows.
pub fn rows() -> Vec<Row> {
    vec![
        Row {
            what: "TCP client without a certificate writes to an X.509 export",
            needs: TLS_TOOLS,
            // Refused while connecting (TLS 1.3: the client hears of it
            // at its first write), before any data moves.
            expect: Expect::Fails("nbd_connect_uri"),
            case: |c: &mut Case| {
                let creds = Creds::new(c);
                let dir = creds.server.display().to_string();
                let out = serve(c, "x", &["--listen", "0", "--tls-certificates", &dir]);
                let uri = tcp_uri(&out);
                let with = format!("{uri}/?tls-certificates={}", creds.client.display());
                assert!(served(&with), "a client with a certificate was refused");
                let without = format!("{uri}/?tls-certificates={}", creds.bare.display());
                nbdcopy_into(c, &without)
            },
        },
        Row {
            what: "TCP client with a certificate from another CA writes to an X.509 export",
            needs: TLS_TOOLS,
            expect: Expect::Fails("nbd_connect_uri"),
            case: |c: &mut Case| {
                let creds = Creds::new(c);
                let dir = creds.server.display().to_string();
                let out = serve(c, "x", &["--listen", "0", "--tls-certificates", &dir]);
                let uri = tcp_uri(&out);
                let stranger = format!("{uri}/?tls-certificates={}", creds.stranger.display());
                nbdcopy_into(c, &stranger)
            },
        },
        Row {
            what: "--tls=on over TCP, which would serve clients that skip STARTTLS",
            needs: &[],
            expect: Expect::Exit(1, "--tls=on over TCP"),
            case: |c: &mut Case| {
                let img = c.image("on.img", 1 << 20);
                c.watch(&img);
                let psk = psk_file(c, PSK_KEY).display().to_string();
                let a = plain_open(
                    &img,
                    2048,
                    "on",
                    &["--listen", "0", "--tls=on", "--tls-psk", &psk],
                );
                c.served("on");
                let o = c.ucrypt(&args(&a));
                if o.status.success() {
                    // Served anyway: show what a plaintext client gets.
                    let out = String::from_utf8_lossy(&o.stdout);
                    let plain = tcp_uri(&out).replacen("nbds:", "nbd:", 1);
                    let got = nbdcopy_into(c, &plain);
                    let mut outcome: Outcome = o.into();
                    outcome.text.push_str(&format!(
                        "\nplaintext nbdcopy into {plain}: exit {:?}",
                        got.code
                    ));
                    return outcome;
                }
                o.into()
            },
        },
        Row {
            what: "PSK client with the right identity and a wrong key",
            needs: TLS_TOOLS,
            expect: Expect::Fails("gnutls_handshake"),
            case: |c: &mut Case| {
                let psk = psk_file(c, PSK_KEY).display().to_string();
                let out = serve(c, "k", &["--listen", "0", "--tls-psk", &psk]);
                let uri = tcp_uri(&out).replacen("://", &format!("://{PSK_ID}@"), 1);
                let right = format!("{uri}/?tls-psk-file={psk}");
                assert!(served(&right), "the right key was refused");
                let wrong = psk_file(c, &"11".repeat(32));
                nbdcopy_into(c, &format!("{uri}/?tls-psk-file={}", wrong.display()))
            },
        },
        Row {
            what: "one peer holds every TLS handshake slot open",
            needs: TLS_TOOLS,
            expect: Expect::Survives,
            case: |c: &mut Case| {
                let psk = psk_file(c, PSK_KEY).display().to_string();
                let out = serve(c, "h", &["--listen", "127.0.0.1:0", "--tls-psk", &psk]);
                let uri = tcp_uri(&out);
                let addr: SocketAddr = uri
                    .trim_start_matches("nbds://")
                    .trim_start_matches("nbd://")
                    .parse()
                    .unwrap_or_else(|e| panic!("address in {uri}: {e}"));
                // The hostile peer (127.0.0.2) opens as many connections
                // as the server has slots and never says a word: each is
                // an unauthenticated handshake until the 10 s timeout.
                let mut held = Vec::new();
                for _ in 0..16 {
                    let mut s = connect_from([127, 0, 0, 2], addr).expect("connect from 127.0.0.2");
                    if greeted(&mut s) {
                        held.push(s);
                    }
                }
                // Another peer (127.0.0.1) is still served meanwhile.
                let who = uri.replacen("://", &format!("://{PSK_ID}@"), 1);
                let ok = served(&format!("{who}/?tls-psk-file={psk}"));
                let n = held.len();
                drop(held);
                assert!(
                    ok,
                    "127.0.0.2 holds {n} stalled handshakes and 127.0.0.1 is not served"
                );
                Outcome::note(
                    Some(0),
                    format!(
                        "127.0.0.2 got {n} of 16 stalled handshakes; 127.0.0.1 was served meanwhile"
                    ),
                )
            },
        },
        Row {
            what: "vhost-user guest queues many maximum-size requests to pin memory",
            needs: &[],
            expect: Expect::Survives,
            case: pin_memory,
        },
    ]
}

/// Payload of each hostile chain: the largest request the engine takes.
const CHAIN: u32 = 32 << 20;
/// Hostile chains queued at once (96 × 32 MiB = 3 GiB of payload).
const CHAINS: u16 = 96;
/// The daemon's peak resident set must stay under this.
const RSS_BOUND_KIB: u64 = 512 << 10;

/// A vhost-user guest that reads 32 MiB of the device into one buffer
/// and then queues [`CHAINS`] writes of that same buffer back to the same
/// place (so the image's bytes do not change): the daemon's peak RSS
/// stays below [`RSS_BOUND_KIB`], every request succeeds, and it answers
/// afterwards. Without the in-flight cap every queued chain's payload
/// would be allocated as the queue thread reached it, up to the engine's
/// 128 requests: 4 GiB.
fn pin_memory(c: &mut Case) -> Outcome {
    use vhost::vhost_user::VhostUserFrontend;
    use virtio_bindings::virtio_blk::{VIRTIO_BLK_T_IN, VIRTIO_BLK_T_OUT};
    use vm_memory::{Bytes, GuestAddress};

    const QSIZE: u16 = 512;
    const HDR: u64 = 0x10_0000;
    const HDR_IN: u64 = HDR + 0x100;
    const STATUS: u64 = 0x11_0000;
    const DATA: u64 = 0x20_0000;
    let img = c.image("guest.img", u64::from(CHAIN) + (1 << 20));
    c.watch(&img);
    let sock = c.path("vm.sock");
    let export = format!("vhost-user-blk={}", sock.display());
    let sectors = (u64::from(CHAIN) >> 9) + 2048;
    // What makes the daemon hold payloads is a queue thread that starts
    // chains faster than the engine finishes them. On a machine with few
    // CPUs, crypt workers busy encrypting take the CPU the queue thread
    // would start chains with; so the cipher is cipher_null and the mode
    // classic (the queue thread only hands each write to a worker), and
    // the guest turns the write cache off (every write FUA): the workers
    // wait for the disk while the queue thread runs.
    let img_s = img.display().to_string();
    let table = format!("0 {sectors} crypt capi:ecb(cipher_null) - 0 {img_s} 0");
    let a = [
        "open", "--type", "plain", "--table", &table, "--export", &export, "--mode", "classic",
        &img_s, "vm",
    ];
    c.open_ok(&a, "vm");
    let pid = daemon_pid(c, "vm");

    let mem = master::guest_memory(&c.path("guest.mem"), DATA as usize + CHAIN as usize);
    let mut m = master::connect(&sock, &mem, 1);
    let wce = std::mem::offset_of!(virtio_bindings::virtio_blk::virtio_blk_config, wce);
    m.set_config(
        wce as u32,
        vhost::vhost_user::message::VhostUserConfigFlags::WRITABLE,
        &[0],
    )
    .expect("write-through cache (SET_CONFIG wce=0)");
    let (ring, kick, _call) = master::start_queue(&mut m, &mem, 0, QSIZE);
    let wait = |want: u16, what: &str| {
        assert!(
            ring.wait_used(&mem, want, Duration::from_secs(120)),
            "the daemon stopped answering ({what}, used ring at {})",
            ring.used_index(&mem)
        );
    };
    let status = |i: u16| -> u8 {
        mem.read_obj(GuestAddress(STATUS + u64::from(i)))
            .expect("status")
    };

    // Read the first 32 MiB (what the writes will put back).
    master::header(&mem, HDR_IN, VIRTIO_BLK_T_IN, 0);
    ring.add_chains(
        &mem,
        &master::chain(0, HDR_IN, DATA, CHAIN, true, STATUS),
        0,
    );
    kick.write(1).expect("kick");
    wait(1, "the first read");
    assert_eq!(status(0), 0, "the first read failed");
    let rss_before = status_kib(pid, "VmRSS");

    // The attack: every chain a maximum-size write of that one buffer.
    master::header(&mem, HDR, VIRTIO_BLK_T_OUT, 0);
    let mut descs = Vec::new();
    for i in 0..CHAINS {
        let st = STATUS + 1 + u64::from(i);
        mem.write_obj(0xEEu8, GuestAddress(st))
            .expect("status byte");
        descs.extend(master::chain(3 * i, HDR, DATA, CHAIN, false, st));
    }
    ring.add_chains(&mem, &descs, 0);
    kick.write(1).expect("kick");
    wait(1 + CHAINS, "the hostile writes");
    let failed = (1..=CHAINS).filter(|&i| status(i) != 0).count();
    assert_eq!(failed, 0, "{failed} of {CHAINS} writes failed");
    let peak = status_kib(pid, "VmHWM");

    // Still answering: a 4 KiB read matches what was read first.
    let first: Vec<u8> = {
        let mut b = vec![0u8; 4096];
        mem.read_slice(&mut b, GuestAddress(DATA))
            .expect("guest data");
        b
    };
    mem.write_slice(&[0u8; 4096], GuestAddress(DATA))
        .expect("clear");
    mem.write_obj(0xEEu8, GuestAddress(STATUS))
        .expect("status byte");
    ring.add_chains(&mem, &master::chain(0, HDR_IN, DATA, 4096, true, STATUS), 0);
    kick.write(1).expect("kick");
    wait(2 + CHAINS, "the read after");
    let mut again = vec![0u8; 4096];
    mem.read_slice(&mut again, GuestAddress(DATA))
        .expect("guest data");
    assert!(
        status(0) == 0 && again == first,
        "the read after the attack differs"
    );
    drop(m);
    let st = c.ucrypt(&["status", "vm"]);
    assert!(
        st.status.success(),
        "status after the attack: {}",
        text(&st)
    );
    assert!(
        peak < RSS_BOUND_KIB,
        "the daemon's peak RSS reached {} MiB (bound {} MiB) for {CHAINS} queued 32 MiB writes",
        peak >> 10,
        RSS_BOUND_KIB >> 10
    );
    Outcome::note(
        Some(0),
        format!(
            "{CHAINS} queued 32 MiB writes: daemon peak RSS {} MiB (before {} MiB, bound {} MiB), all answered",
            peak >> 10,
            rss_before >> 10,
            RSS_BOUND_KIB >> 10
        ),
    )
}
