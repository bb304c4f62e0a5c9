//! Hostile and broken clients against the NBD server: each is answered with
//! an error or disconnected, other clients keep being served, and nothing
//! reaches the backend. (The raw client here is deliberately minimal: real
//! clients — fio, nbdcopy, qemu-img, nbdinfo — are exercised by the CLI tests.)

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::Duration;

use backend::{Backend, MemBackend};
use datapath::{Engine, EngineConfig, Volume};
use nbd::proto::{self, RequestHeader};
use nbd::{Endpoint, ExportConfig, Server};
use ucrypt_nbd as nbd;

const SIZE: u64 = 1 << 20;

struct Fixture {
    _dir: testutil::TempDir,
    path: std::path::PathBuf,
    mem: Arc<MemBackend>,
    server: Option<Server>,
}

impl Fixture {
    fn new(read_only: bool) -> Self {
        let dir = testutil::TempDir::new("nbd-bad");
        let path = dir.join("nbd.sock");
        let mem = Arc::new(MemBackend::new(SIZE).unwrap());
        let vol = Volume {
            backend: mem.clone(),
            crypt: None,
            data_offset: 0,
            size: SIZE,
            sector_size: 512,
        };
        let cfg = EngineConfig {
            read_only,
            ..EngineConfig::default()
        };
        let engine = Arc::new(Engine::new(vol, cfg).unwrap());
        let export = ExportConfig {
            name: "t".into(),
            description: "test".into(),
        };
        let server = Server::start(engine, export, Endpoint::Unix(path.clone())).unwrap();
        Self {
            _dir: dir,
            path,
            mem,
            server: Some(server),
        }
    }

    fn connect(&self) -> UnixStream {
        let s = UnixStream::connect(&self.path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s
    }

    /// Handshake with NBD_OPT_GO on the default export; returns (size, flags).
    fn client(&self) -> (UnixStream, u64, u16) {
        let mut s = self.connect();
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).unwrap();
        assert_eq!(&hello[..8], b"NBDMAGIC");
        s.write_all(&(proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES).to_be_bytes())
            .unwrap();
        let mut data = 0u32.to_be_bytes().to_vec();
        data.extend_from_slice(&0u16.to_be_bytes());
        send_option(&mut s, proto::OPT_GO, &data);
        let (mut size, mut flags) = (0, 0);
        loop {
            let (rep, d) = read_option_reply(&mut s);
            if rep == proto::REP_ACK {
                break;
            }
            assert_eq!(rep, proto::REP_INFO);
            if u16::from_be_bytes([d[0], d[1]]) == proto::INFO_EXPORT {
                size = u64::from_be_bytes(d[2..10].try_into().unwrap());
                flags = u16::from_be_bytes([d[10], d[11]]);
            }
        }
        (s, size, flags)
    }

    fn backend_is_zero(&self) -> bool {
        let mut buf = vec![0u8; SIZE as usize];
        self.mem.read_at(&mut buf, 0).unwrap();
        buf.iter().all(|&b| b == 0)
    }

    fn server_stats(&self) -> nbd::ServerStats {
        self.server.as_ref().unwrap().stats()
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
    }
}

fn send_option(s: &mut UnixStream, opt: u32, data: &[u8]) {
    let mut b = proto::IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&opt.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    s.write_all(&b).unwrap();
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

fn request(s: &mut UnixStream, kind: u16, cookie: u64, offset: u64, len: u32, payload: &[u8]) {
    let h = RequestHeader {
        flags: 0,
        kind,
        cookie,
        offset,
        len,
    };
    let mut b = h.encode().to_vec();
    b.extend_from_slice(payload);
    s.write_all(&b).unwrap();
}

/// Reads a simple reply header: (error, cookie).
fn reply(s: &mut UnixStream) -> (u32, u64) {
    let mut h = [0u8; 16];
    s.read_exact(&mut h).unwrap();
    assert_eq!(
        u32::from_be_bytes(h[..4].try_into().unwrap()),
        proto::SIMPLE_REPLY_MAGIC
    );
    (
        u32::from_be_bytes(h[4..8].try_into().unwrap()),
        u64::from_be_bytes(h[8..16].try_into().unwrap()),
    )
}

/// True once the server has closed `s` (read returns EOF).
fn closed(s: &mut UnixStream) -> bool {
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(_) => return false,
        }
    }
}

/// A well-behaved client still works: write + read back a sector, then
/// restore zeroes with WRITE_ZEROES so the "nothing written" check stays valid.
fn healthy_round_trip(f: &Fixture) {
    let (mut s, size, flags) = f.client();
    assert_eq!(size, SIZE);
    assert_ne!(flags & proto::FLAG_SEND_FLUSH, 0);
    request(&mut s, proto::CMD_READ, 7, 512, 512, &[]);
    assert_eq!(reply(&mut s), (0, 7));
    let mut d = vec![0u8; 512];
    s.read_exact(&mut d).unwrap();
    request(&mut s, proto::CMD_DISC, 8, 0, 0, &[]);
    assert!(closed(&mut s));
}

#[test]
fn garbage_disconnects_only_that_client() {
    let f = Fixture::new(false);
    // Garbage instead of client flags / options.
    let mut g = f.connect();
    let mut hello = [0u8; 18];
    g.read_exact(&mut hello).unwrap();
    g.write_all(&[0xff; 4]).unwrap(); // unknown client flags
    assert!(closed(&mut g));

    let mut g = f.connect();
    g.read_exact(&mut hello).unwrap();
    g.write_all(&1u32.to_be_bytes()).unwrap();
    g.write_all(b"this is not an NBD option header at all")
        .unwrap();
    assert!(closed(&mut g));

    // Garbage in the transmission phase, with another client connected.
    let (mut other, _, _) = f.client();
    let (mut g, _, _) = f.client();
    g.write_all(&[0x5a; 200]).unwrap();
    assert!(closed(&mut g));
    request(&mut other, proto::CMD_FLUSH, 1, 0, 0, &[]);
    assert_eq!(reply(&mut other), (0, 1));
    healthy_round_trip(&f);
    // A connection's thread counts its protocol error after its socket
    // closed (the client may see the close first): wait for the count.
    let mut errors = f.server_stats().protocol_errors;
    for _ in 0..1000 {
        if errors >= 3 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
        errors = f.server_stats().protocol_errors;
    }
    assert!(errors >= 3, "{errors} protocol errors counted");
    assert!(f.backend_is_zero());
}

#[test]
fn truncated_requests_write_nothing() {
    let f = Fixture::new(false);
    let (mut s, _, _) = f.client();
    // Half a header, then hang up.
    s.write_all(
        &RequestHeader {
            flags: 0,
            kind: proto::CMD_WRITE,
            cookie: 1,
            offset: 0,
            len: 4096,
        }
        .encode()[..10],
    )
    .unwrap();
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(closed(&mut s));

    // A whole header promising 4096 bytes but only 100 of them.
    let (mut s, _, _) = f.client();
    request(&mut s, proto::CMD_WRITE, 2, 0, 4096, &[0xaa; 100]);
    s.shutdown(std::net::Shutdown::Write).unwrap();
    assert!(closed(&mut s));

    // A payload larger than the server's maximum: disconnected, not allocated.
    let (mut s, _, _) = f.client();
    request(&mut s, proto::CMD_WRITE, 3, 0, u32::MAX, &[0xaa; 4096]);
    assert!(closed(&mut s));
    healthy_round_trip(&f);
    assert!(f.backend_is_zero());
}

#[test]
fn past_the_end_and_unknown_commands_get_errors() {
    let f = Fixture::new(false);
    let (mut s, _, _) = f.client();
    request(&mut s, proto::CMD_READ, 1, SIZE, 512, &[]);
    assert_eq!(reply(&mut s), (proto::EINVAL, 1));
    request(&mut s, proto::CMD_READ, 2, u64::MAX - 511, 512, &[]);
    assert_eq!(reply(&mut s), (proto::EINVAL, 2));
    request(&mut s, proto::CMD_WRITE, 3, SIZE - 512, 1024, &[0xbb; 1024]);
    assert_eq!(reply(&mut s), (proto::ENOSPC, 3));
    request(&mut s, proto::CMD_WRITE_ZEROES, 4, SIZE, 512, &[]);
    assert_eq!(reply(&mut s).0, proto::ENOSPC);
    // Misaligned write (volume sector size 512).
    request(&mut s, proto::CMD_WRITE, 5, 100, 512, &[0xcc; 512]);
    assert_eq!(reply(&mut s), (proto::EINVAL, 5));
    // Unknown command type, CACHE, BLOCK_STATUS (not negotiated), TRIM (not advertised).
    for (i, kind) in [99u16, 5, 7, proto::CMD_TRIM].into_iter().enumerate() {
        request(&mut s, kind, 10 + i as u64, 0, 512, &[]);
        assert_eq!(reply(&mut s), (proto::EINVAL, 10 + i as u64));
    }
    // Unknown command flag.
    let h = RequestHeader {
        flags: 1 << 12,
        kind: proto::CMD_FLUSH,
        cookie: 20,
        offset: 0,
        len: 0,
    };
    s.write_all(&h.encode()).unwrap();
    assert_eq!(reply(&mut s), (proto::EINVAL, 20));
    // A read larger than the maximum payload: EINVAL (proto.md keeps
    // EOVERFLOW for NBD_CMD_FLAG_DF, which is not offered).
    request(&mut s, proto::CMD_READ, 21, 0, u32::MAX, &[]);
    assert_eq!(reply(&mut s), (proto::EINVAL, 21));
    // The same connection still works afterwards.
    request(&mut s, proto::CMD_READ, 22, 0, 512, &[]);
    assert_eq!(reply(&mut s), (0, 22));
    let mut d = [0u8; 512];
    s.read_exact(&mut d).unwrap();
    assert!(f.backend_is_zero());
}

#[test]
fn read_only_export_refuses_writes() {
    let f = Fixture::new(true);
    let (mut s, _, flags) = f.client();
    assert_ne!(flags & proto::FLAG_READ_ONLY, 0);
    request(&mut s, proto::CMD_WRITE, 1, 0, 512, &[0xdd; 512]);
    assert_eq!(reply(&mut s), (proto::EPERM, 1));
    request(&mut s, proto::CMD_WRITE_ZEROES, 2, 0, 512, &[]);
    assert_eq!(reply(&mut s), (proto::EPERM, 2));
    assert!(f.backend_is_zero());
}

#[test]
fn options_list_info_abort_and_unknown_names() {
    let f = Fixture::new(false);
    let mut s = f.connect();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    s.write_all(&1u32.to_be_bytes()).unwrap();
    send_option(&mut s, proto::OPT_LIST, &[]);
    let (rep, d) = read_option_reply(&mut s);
    assert_eq!(rep, proto::REP_SERVER);
    assert_eq!(&d[4..5], b"t");
    assert_eq!(read_option_reply(&mut s).0, proto::REP_ACK);
    send_option(&mut s, proto::OPT_LIST, b"junk");
    assert_eq!(read_option_reply(&mut s).0, proto::REP_ERR_INVALID);
    // INFO on an unknown name, then malformed INFO, then structured replies.
    let mut data = 4u32.to_be_bytes().to_vec();
    data.extend_from_slice(b"nope");
    data.extend_from_slice(&0u16.to_be_bytes());
    send_option(&mut s, proto::OPT_INFO, &data);
    assert_eq!(read_option_reply(&mut s).0, proto::REP_ERR_UNKNOWN);
    send_option(&mut s, proto::OPT_INFO, &[0, 0, 0, 9, 1]);
    assert_eq!(read_option_reply(&mut s).0, proto::REP_ERR_INVALID);
    send_option(&mut s, 8, &[]);
    assert_eq!(read_option_reply(&mut s).0, proto::REP_ERR_UNSUP);
    // INFO on the real name reports size and block sizes, then stays in negotiation.
    let mut data = 1u32.to_be_bytes().to_vec();
    data.extend_from_slice(b"t");
    data.extend_from_slice(&1u16.to_be_bytes());
    data.extend_from_slice(&proto::INFO_BLOCK_SIZE.to_be_bytes());
    send_option(&mut s, proto::OPT_INFO, &data);
    let mut saw_bs = false;
    loop {
        let (rep, d) = read_option_reply(&mut s);
        if rep == proto::REP_ACK {
            break;
        }
        if u16::from_be_bytes([d[0], d[1]]) == proto::INFO_BLOCK_SIZE {
            assert_eq!(u32::from_be_bytes(d[2..6].try_into().unwrap()), 512);
            saw_bs = true;
        }
    }
    assert!(saw_bs);
    // An oversized option ends the session without allocating it.
    let mut b = proto::IHAVEOPT.to_be_bytes().to_vec();
    b.extend_from_slice(&proto::OPT_INFO.to_be_bytes());
    b.extend_from_slice(&u32::MAX.to_be_bytes());
    s.write_all(&b).unwrap();
    assert!(closed(&mut s));

    let mut s = f.connect();
    s.read_exact(&mut hello).unwrap();
    s.write_all(&3u32.to_be_bytes()).unwrap();
    send_option(&mut s, proto::OPT_ABORT, &[]);
    assert_eq!(read_option_reply(&mut s).0, proto::REP_ACK);
    assert!(closed(&mut s));

    // EXPORT_NAME with an unknown name: closed, as the spec requires.
    let mut s = f.connect();
    s.read_exact(&mut hello).unwrap();
    s.write_all(&3u32.to_be_bytes()).unwrap();
    send_option(&mut s, proto::OPT_EXPORT_NAME, b"other");
    assert!(closed(&mut s));
    // EXPORT_NAME with the right name: size + flags, no zeroes.
    let mut s = f.connect();
    s.read_exact(&mut hello).unwrap();
    s.write_all(&3u32.to_be_bytes()).unwrap();
    send_option(&mut s, proto::OPT_EXPORT_NAME, b"t");
    let mut info = [0u8; 10];
    s.read_exact(&mut info).unwrap();
    assert_eq!(u64::from_be_bytes(info[..8].try_into().unwrap()), SIZE);
    request(&mut s, proto::CMD_FLUSH, 1, 0, 0, &[]);
    assert_eq!(reply(&mut s), (0, 1));
    assert!(f.backend_is_zero());
}

#[test]
fn pipelined_requests_all_answered_and_shutdown_drains() {
    let mut f = Fixture::new(false);
    let (mut s, _, _) = f.client();
    let mut expect = std::collections::HashSet::new();
    for i in 0..64u64 {
        let data = vec![i as u8 + 1; 4096];
        request(&mut s, proto::CMD_WRITE, 1000 + i, i * 4096, 4096, &data);
        expect.insert(1000 + i);
    }
    request(&mut s, proto::CMD_FLUSH, 5000, 0, 0, &[]);
    expect.insert(5000);
    while !expect.is_empty() {
        let (err, cookie) = reply(&mut s);
        assert_eq!(err, 0);
        assert!(expect.remove(&cookie), "unexpected cookie {cookie}");
    }
    let mut buf = vec![0u8; 4096];
    f.mem.read_at(&mut buf, 63 * 4096).unwrap();
    assert!(buf.iter().all(|&b| b == 64));
    // Shutdown with a client still connected: it is closed, socket removed.
    f.server.take().unwrap().shutdown();
    assert!(closed(&mut s));
    assert!(!f.path.exists());
}
