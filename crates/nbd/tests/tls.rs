//! NBD over TLS against real clients: libnbd's `nbdinfo` and `nbdcopy`
//! (`nbds://`, `nbds+unix://`, `tls-certificates=`, `tls-psk-file=`),
//! qemu-img with `tls-creds-x509` / `tls-creds-psk` objects, and fio's nbd
//! engine, all against an in-process server on a unix socket and on
//! 127.0.0.1. Certificates come from the `openssl` CLI; the PSK file is
//! written by hand in `psktool`'s format. Under `--tls=require` plaintext
//! clients are refused before any data moves.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use backend::{Backend, MemBackend};
use datapath::{Engine, EngineConfig, Volume};
use nbd::proto;
use nbd::{Endpoint, ExportConfig, Limits, Server, ServerOptions, TlsConfig, TlsMode};
use ucrypt_nbd as nbd;

const SIZE: u64 = 4 << 20;
const PSK_ID: &str = "alice";
const PSK_KEY: &str = "5f0b3b1a9ac4e9d0e1f2a3b4c5d6e7f8091a2b3c4d5e6f708192a3b4c5d6e7f8";

/// Credentials for one test: a CA, a server certificate for localhost /
/// 127.0.0.1, a client certificate, and a PSK file.
struct Creds {
    dir: testutil::TempDir,
}

impl Creds {
    fn new(test: &str) -> Option<Self> {
        if !testutil::require_tool(test, "openssl") {
            return None;
        }
        let dir = testutil::TempDir::new("nbd-tls");
        let server = dir.join("server");
        let client = dir.join("client");
        let bare = dir.join("client-no-cert");
        let psk = dir.join("psk");
        for d in [&server, &client, &bare, &psk] {
            std::fs::create_dir_all(d).unwrap();
        }
        let work = dir.path();
        ossl(
            work,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-days",
                "2",
                "-subj",
                "/CN=ucrypt test CA",
                "-keyout",
                "ca-key.pem",
                "-out",
                "ca-cert.pem",
            ],
        );
        let ext = dir.join("server.ext");
        std::fs::write(
            &ext,
            "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n\
             keyUsage=digitalSignature,keyEncipherment\nbasicConstraints=CA:FALSE\n",
        )
        .unwrap();
        let cext = dir.join("client.ext");
        std::fs::write(
            &cext,
            "extendedKeyUsage=clientAuth\nkeyUsage=digitalSignature,keyEncipherment\n\
             basicConstraints=CA:FALSE\n",
        )
        .unwrap();
        for (name, cn, ext) in [("server", "localhost", &ext), ("client", "client", &cext)] {
            ossl(
                work,
                &[
                    "req",
                    "-newkey",
                    "rsa:2048",
                    "-nodes",
                    "-subj",
                    &format!("/CN={cn}"),
                    "-keyout",
                    &format!("{name}-key.pem"),
                    "-out",
                    &format!("{name}.csr"),
                ],
            );
            ossl(
                work,
                &[
                    "x509",
                    "-req",
                    "-in",
                    &format!("{name}.csr"),
                    "-CA",
                    "ca-cert.pem",
                    "-CAkey",
                    "ca-key.pem",
                    "-CAcreateserial",
                    "-days",
                    "2",
                    "-extfile",
                    ext.to_str().unwrap(),
                    "-out",
                    &format!("{name}-cert.pem"),
                ],
            );
        }
        let cp = |f: &str, to: &Path| std::fs::copy(dir.join(f), to.join(f)).unwrap();
        for f in ["ca-cert.pem", "server-cert.pem", "server-key.pem"] {
            cp(f, &server);
        }
        for f in ["ca-cert.pem", "client-cert.pem", "client-key.pem"] {
            cp(f, &client);
        }
        cp("ca-cert.pem", &bare);
        // psktool's format; qemu's tls-creds-psk wants it as keys.psk.
        std::fs::write(psk.join("keys.psk"), format!("{PSK_ID}:{PSK_KEY}\n")).unwrap();
        Some(Self { dir })
    }
    fn server(&self) -> PathBuf {
        self.dir.join("server")
    }
    /// Client dir with a certificate of its own.
    fn client(&self) -> PathBuf {
        self.dir.join("client")
    }
    /// Client dir with only the CA.
    fn bare(&self) -> PathBuf {
        self.dir.join("client-no-cert")
    }
    fn psk_dir(&self) -> PathBuf {
        self.dir.join("psk")
    }
    fn psk_file(&self) -> PathBuf {
        self.psk_dir().join("keys.psk")
    }
}

fn ossl(dir: &Path, args: &[&str]) {
    let o = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

struct Fixture {
    dir: testutil::TempDir,
    mem: Arc<MemBackend>,
    server: Option<Server>,
}

impl Fixture {
    fn new(tls: TlsConfig, tcp: bool) -> Self {
        Self::with_limits(tls, tcp, Limits::default())
    }

    fn with_limits(tls: TlsConfig, tcp: bool, limits: Limits) -> Self {
        let dir = testutil::TempDir::new("nbd-tls-srv");
        let mem = Arc::new(MemBackend::new(SIZE).unwrap());
        let vol = Volume {
            backend: mem.clone(),
            crypt: None,
            data_offset: 0,
            size: SIZE,
            sector_size: 512,
        };
        let engine = Arc::new(Engine::new(vol, EngineConfig::default()).unwrap());
        let export = ExportConfig {
            name: "t".into(),
            description: "tls test".into(),
        };
        let ep = if tcp {
            Endpoint::Tcp("127.0.0.1:0".parse().unwrap())
        } else {
            Endpoint::Unix(dir.join("nbd.sock"))
        };
        let opts = ServerOptions { tls, limits };
        let server = Server::start_with(engine, export, ep, opts).unwrap();
        Self {
            dir,
            mem,
            server: Some(server),
        }
    }

    fn endpoint(&self) -> Endpoint {
        self.server.as_ref().unwrap().endpoint().clone()
    }

    /// A libnbd URI (TLS scheme) with `user@` and query parameters.
    fn uri(&self, user: Option<&str>, query: &str) -> String {
        let user = user.map(|u| format!("{u}@")).unwrap_or_default();
        match self.endpoint() {
            Endpoint::Unix(p) => {
                format!("nbds+unix://{user}/?socket={}&{query}", p.display())
            }
            Endpoint::Tcp(a) => format!("nbds://{user}{a}/?{query}"),
            e => panic!("no libnbd URI for {e:?}"),
        }
    }

    fn plain_uri(&self) -> String {
        match self.endpoint() {
            Endpoint::Unix(p) => format!("nbd+unix:///?socket={}", p.display()),
            Endpoint::Tcp(a) => format!("nbd://{a}/"),
            e => panic!("no libnbd URI for {e:?}"),
        }
    }

    fn backend(&self) -> Vec<u8> {
        let mut buf = vec![0u8; SIZE as usize];
        self.mem.read_at(&mut buf, 0).unwrap();
        buf
    }

    fn pattern_file(&self, seed: u8) -> (PathBuf, Vec<u8>) {
        let data: Vec<u8> = (0..SIZE as usize)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
            .collect();
        let p = self.dir.join(&format!("pattern-{seed}.img"));
        std::fs::write(&p, &data).unwrap();
        (p, data)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
    }
}

fn run(cmd: &mut Command) -> Output {
    let o = cmd.output().unwrap();
    eprintln!(
        "{cmd:?}: {}\nstdout: {}\nstderr: {}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

/// nbdcopy a pattern in, check the backend, nbdcopy it back out.
fn copy_round_trip(f: &Fixture, uri: &str, seed: u8) {
    let (src, data) = f.pattern_file(seed);
    let o = run(Command::new("nbdcopy").arg(&src).arg(uri));
    assert!(o.status.success(), "nbdcopy in over TLS failed");
    assert!(
        f.backend() == data,
        "backend differs from what nbdcopy wrote"
    );
    let out = f.dir.join("out.img");
    let _ = std::fs::remove_file(&out);
    let o = run(Command::new("nbdcopy").arg(uri).arg(&out));
    assert!(o.status.success(), "nbdcopy out over TLS failed");
    assert!(std::fs::read(&out).unwrap() == data, "read back differs");
}

fn x509(mode: TlsMode, c: &Creds, verify_peer: bool) -> TlsConfig {
    TlsConfig::x509(mode, &c.server(), verify_peer).unwrap()
}

fn tools(test: &str, tools: &[&str]) -> bool {
    tools.iter().all(|t| testutil::require_tool(test, t))
}

#[test]
fn x509_nbdinfo_and_nbdcopy_unix_and_tcp() {
    let t = "x509_nbdinfo_and_nbdcopy_unix_and_tcp";
    let Some(c) = Creds::new(t) else { return };
    if !tools(t, &["nbdinfo", "nbdcopy"]) {
        return;
    }
    for (tcp, seed) in [(false, 1u8), (true, 2)] {
        let f = Fixture::new(x509(TlsMode::Require, &c, false), tcp);
        let q = format!("tls-certificates={}", c.bare().display());
        let uri = f.uri(None, &q);
        let o = run(Command::new("nbdinfo").arg("--json").arg(&uri));
        assert!(o.status.success(), "nbdinfo over TLS failed");
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(out.contains(&format!("\"export-size\": {SIZE}")), "{out}");
        assert!(out.contains("\"TLS\": true"), "{out}");
        copy_round_trip(&f, &uri, seed);
    }
}

#[test]
fn psk_nbdinfo_and_nbdcopy_unix_and_tcp() {
    let t = "psk_nbdinfo_and_nbdcopy_unix_and_tcp";
    let Some(c) = Creds::new(t) else { return };
    if !tools(t, &["nbdinfo", "nbdcopy"]) {
        return;
    }
    for (tcp, seed) in [(false, 3u8), (true, 4)] {
        let tls = TlsConfig::psk(TlsMode::Require, &c.psk_file()).unwrap();
        let f = Fixture::new(tls, tcp);
        let q = format!("tls-psk-file={}", c.psk_file().display());
        let uri = f.uri(Some(PSK_ID), &q);
        let o = run(Command::new("nbdinfo").arg(&uri));
        assert!(o.status.success(), "nbdinfo with PSK failed");
        copy_round_trip(&f, &uri, seed);

        // An identity the server does not know, or the right identity with
        // another key: the handshake fails and nothing is written.
        let before = f.backend();
        let wrong = f.dir.join("wrong.psk");
        std::fs::write(
            &wrong,
            format!("mallory:{PSK_KEY}\n{PSK_ID}:{}\n", "11".repeat(32)),
        )
        .unwrap();
        for user in ["mallory", PSK_ID] {
            let q = format!("tls-psk-file={}", wrong.display());
            let (src, _) = f.pattern_file(99);
            let o = run(Command::new("nbdcopy").arg(&src).arg(f.uri(Some(user), &q)));
            assert!(!o.status.success(), "a wrong PSK ({user}) was accepted");
        }
        assert!(
            f.backend() == before,
            "a refused client changed the backend"
        );
    }
}

#[test]
fn verify_peer_wants_a_client_certificate() {
    let t = "verify_peer_wants_a_client_certificate";
    let Some(c) = Creds::new(t) else { return };
    if !tools(t, &["nbdinfo"]) {
        return;
    }
    let f = Fixture::new(x509(TlsMode::Require, &c, true), false);
    let with = f.uri(None, &format!("tls-certificates={}", c.client().display()));
    assert!(run(Command::new("nbdinfo").arg(&with)).status.success());
    let without = f.uri(None, &format!("tls-certificates={}", c.bare().display()));
    assert!(
        !run(Command::new("nbdinfo").arg(&without)).status.success(),
        "a client without a certificate passed --tls-verify-peer"
    );
}

#[test]
fn require_refuses_plaintext_clients_before_any_data() {
    let t = "require_refuses_plaintext_clients_before_any_data";
    let Some(c) = Creds::new(t) else { return };
    if !tools(t, &["nbdinfo", "nbdcopy"]) {
        return;
    }
    let f = Fixture::new(x509(TlsMode::Require, &c, false), false);
    let before = f.backend();
    let (src, _) = f.pattern_file(7);
    let o = run(Command::new("nbdcopy").arg(&src).arg(f.plain_uri()));
    assert!(!o.status.success(), "plaintext nbdcopy was served");
    let o = run(Command::new("nbdinfo").arg(f.plain_uri()));
    assert!(!o.status.success(), "plaintext nbdinfo was served");
    assert!(f.backend() == before);

    // On the wire: every option but STARTTLS/ABORT gets TLS_REQD, and
    // NBD_OPT_EXPORT_NAME ends the connection without an export.
    let Endpoint::Unix(p) = f.endpoint() else {
        unreachable!()
    };
    let mut s = raw_client(&p);
    for opt in [proto::OPT_LIST, proto::OPT_INFO, proto::OPT_GO, 42] {
        let mut data = Vec::new();
        if opt != proto::OPT_LIST {
            data.extend_from_slice(&0u32.to_be_bytes());
            data.extend_from_slice(&0u16.to_be_bytes());
        }
        send_option(&mut s, opt, &data);
        assert_eq!(read_option_reply(&mut s).0, proto::REP_ERR_TLS_REQD);
    }
    send_option(&mut s, proto::OPT_EXPORT_NAME, b"");
    assert!(closed(&mut s), "EXPORT_NAME before TLS was not refused");

    // Bytes pushed right behind STARTTLS (a plaintext injection) end it.
    let mut s = raw_client(&p);
    let mut b = option_bytes(proto::OPT_STARTTLS, &[]);
    b.extend_from_slice(&option_bytes(proto::OPT_GO, &[0; 6]));
    s.write_all(&b).unwrap();
    assert_eq!(read_option_reply(&mut s).0, proto::REP_ACK);
    assert!(closed(&mut s), "data injected after STARTTLS was accepted");
}

#[test]
fn tls_on_serves_both_and_off_refuses_starttls() {
    let t = "tls_on_serves_both_and_off_refuses_starttls";
    let Some(c) = Creds::new(t) else { return };
    if !tools(t, &["nbdinfo"]) {
        return;
    }
    let f = Fixture::new(x509(TlsMode::On, &c, false), false);
    let tls_uri = f.uri(None, &format!("tls-certificates={}", c.bare().display()));
    assert!(run(Command::new("nbdinfo").arg(&tls_uri)).status.success());
    assert!(run(Command::new("nbdinfo").arg(f.plain_uri()))
        .status
        .success());
    drop(f);

    let f = Fixture::new(TlsConfig::off(), false);
    let Endpoint::Unix(p) = f.endpoint() else {
        unreachable!()
    };
    let mut s = raw_client(&p);
    send_option(&mut s, proto::OPT_STARTTLS, &[]);
    assert_eq!(read_option_reply(&mut s).0, proto::REP_ERR_POLICY);
    let tls_uri = f.uri(None, &format!("tls-certificates={}", c.bare().display()));
    assert!(!run(Command::new("nbdinfo").arg(&tls_uri)).status.success());
}

#[test]
fn qemu_img_with_tls_creds_objects() {
    let t = "qemu_img_with_tls_creds_objects";
    let Some(c) = Creds::new(t) else { return };
    if !tools(t, &["qemu-img"]) {
        return;
    }
    let cases = [
        (
            x509(TlsMode::Require, &c, true),
            format!(
                "tls-creds-x509,id=tls0,endpoint=client,dir={}",
                c.client().display()
            ),
        ),
        (
            TlsConfig::psk(TlsMode::Require, &c.psk_file()).unwrap(),
            format!(
                "tls-creds-psk,id=tls0,endpoint=client,username={PSK_ID},dir={}",
                c.psk_dir().display()
            ),
        ),
    ];
    for (i, (tls, object)) in cases.into_iter().enumerate() {
        for tcp in [false, true] {
            let f = Fixture::new(tls.clone(), tcp);
            let server = match f.endpoint() {
                Endpoint::Unix(p) => format!("server.type=unix,server.path={}", p.display()),
                Endpoint::Tcp(a) => format!(
                    "server.type=inet,server.host={},server.port={}",
                    a.ip(),
                    a.port()
                ),
                e => panic!("no qemu server address for {e:?}"),
            };
            let image = format!("driver=nbd,{server},tls-creds=tls0,tls-hostname=localhost");
            let (src, data) = f.pattern_file(10 + i as u8 * 2 + tcp as u8);
            let o = run(Command::new("qemu-img")
                .args(["convert", "-n", "-f", "raw", "--object", &object])
                .arg(&src)
                .args(["--target-image-opts", &image]));
            assert!(
                o.status.success(),
                "qemu-img convert into TLS export failed"
            );
            assert!(
                f.backend() == data,
                "backend differs from what qemu-img wrote"
            );
            let out = f.dir.join("q.img");
            let o = run(Command::new("qemu-img")
                .args([
                    "convert",
                    "-O",
                    "raw",
                    "--object",
                    &object,
                    "--image-opts",
                    &image,
                ])
                .arg(&out));
            assert!(
                o.status.success(),
                "qemu-img convert out of TLS export failed"
            );
            assert!(std::fs::read(&out).unwrap() == data);
        }
    }
}

#[test]
fn fio_nbd_engine_over_tls() {
    let t = "fio_nbd_engine_over_tls";
    let Some(c) = Creds::new(t) else { return };
    if !tools(t, &["fio"]) {
        return;
    }
    let f = Fixture::new(x509(TlsMode::Require, &c, false), false);
    // fio's engine passes the URI to libnbd without allowing local files
    // in it, so the certificates come from libnbd's default place,
    // $HOME/.pki/libnbd.
    let home = f.dir.join("home");
    let pki = home.join(".pki/libnbd");
    std::fs::create_dir_all(&pki).unwrap();
    std::fs::copy(c.bare().join("ca-cert.pem"), pki.join("ca-cert.pem")).unwrap();
    let Endpoint::Unix(p) = f.endpoint() else {
        unreachable!()
    };
    let uri = format!("nbds+unix:///?socket={}", p.display());
    let o = run(Command::new("fio").env("HOME", &home).args([
        "--name=tls",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--rw=write",
        "--bs=64k",
        "--size=1M",
        "--iodepth=8",
        "--buffer_pattern=0x5a",
    ]));
    assert!(o.status.success(), "fio over TLS failed");
    assert!(f.backend()[..1 << 20].iter().all(|&b| b == 0x5a));
}

#[test]
fn shutdown_with_a_tls_client_connected_returns() {
    let t = "shutdown_with_a_tls_client_connected_returns";
    let Some(c) = Creds::new(t) else { return };
    let mut f = Fixture::new(x509(TlsMode::Require, &c, false), false);
    let Endpoint::Unix(p) = f.endpoint() else {
        unreachable!()
    };
    // A client stuck before its TLS handshake, and one idle after STARTTLS.
    let _a = raw_client(&p);
    let mut b = raw_client(&p);
    send_option(&mut b, proto::OPT_STARTTLS, &[]);
    assert_eq!(read_option_reply(&mut b).0, proto::REP_ACK);
    f.server.take().unwrap().shutdown();
    assert!(closed(&mut b));
}

#[test]
fn a_stalled_tls_handshake_is_dropped() {
    let t = "a_stalled_tls_handshake_is_dropped";
    let Some(c) = Creds::new(t) else { return };
    let limits = Limits {
        handshake_timeout: Duration::from_secs(2),
        ..Limits::default()
    };
    let f = Fixture::with_limits(x509(TlsMode::Require, &c, false), false, limits);
    let Endpoint::Unix(p) = f.endpoint() else {
        unreachable!()
    };
    // STARTTLS acknowledged, then no ClientHello.
    let mut s = raw_client(&p);
    send_option(&mut s, proto::OPT_STARTTLS, &[]);
    assert_eq!(read_option_reply(&mut s).0, proto::REP_ACK);
    assert!(
        closed(&mut s),
        "a client that never started TLS kept its slot"
    );
    let stats = f.server.as_ref().unwrap().stats();
    assert_eq!(stats.accepted, 1);
}

fn raw_client(p: &Path) -> UnixStream {
    let mut s = UnixStream::connect(p).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    assert_eq!(&hello[..8], b"NBDMAGIC");
    s.write_all(&(proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES).to_be_bytes())
        .unwrap();
    s
}

fn option_bytes(opt: u32, data: &[u8]) -> Vec<u8> {
    let mut b = proto::IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    b
}

fn send_option(s: &mut UnixStream, opt: u32, data: &[u8]) {
    s.write_all(&option_bytes(opt, data)).unwrap();
}

fn read_option_reply(s: &mut UnixStream) -> (u32, Vec<u8>) {
    let mut h = [0u8; 20];
    s.read_exact(&mut h).unwrap();
    assert_eq!(
        u64::from_be_bytes(h[..8].try_into().unwrap()),
        proto::REPLY_MAGIC
    );
    let rep = u32::from_be_bytes(h[12..16].try_into().unwrap());
    let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
    let mut d = vec![0u8; len as usize];
    s.read_exact(&mut d).unwrap();
    (rep, d)
}

/// True once the server has closed `s` (read returns EOF or a reset).
fn closed(s: &mut UnixStream) -> bool {
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) => return e.kind() == std::io::ErrorKind::ConnectionReset,
        }
    }
}
