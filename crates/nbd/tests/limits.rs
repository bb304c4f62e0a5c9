//! The server's limits (issue 17): a cap on connections, a handshake
//! timeout, and a per-connection cap on payload bytes in flight. Each test
//! plays a client that used to hold the server's resources without bound.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backend::MemBackend;
use crypto::{CryptConfig, SectorCrypt};
use datapath::{Engine, EngineConfig, Volume};
use nbd::proto::{self, RequestHeader};
use nbd::{Endpoint, ExportConfig, Limits, Server, ServerOptions};
use ucrypt_nbd as nbd;

const SIZE: u64 = 64 << 20;

struct Fixture {
    _dir: testutil::TempDir,
    path: PathBuf,
    server: Option<Server>,
}

impl Fixture {
    fn new(limits: Limits) -> Self {
        let dir = testutil::TempDir::new("nbd-limits");
        let path = dir.join("nbd.sock");
        let mem = Arc::new(MemBackend::new(SIZE).unwrap());
        // Encrypted, so the classic engine queues reads to its workers and
        // the connection's reader keeps going while replies wait (without
        // a cipher the engine completes reads inline, inside submit).
        let crypt = SectorCrypt::new(&CryptConfig {
            cipher: "aes-xts-plain64".into(),
            key: zeroize::Zeroizing::new((0..64u8).collect()),
            iv_offset: 0,
            sector_size: 512,
            iv_large_sectors: true,
        })
        .unwrap();
        let vol = Volume {
            backend: mem,
            crypt: Some(Arc::new(crypt)),
            data_offset: 0,
            size: SIZE,
            sector_size: 512,
        };
        let engine = Arc::new(Engine::new(vol, EngineConfig::default()).unwrap());
        let export = ExportConfig {
            name: "t".into(),
            description: "limits".into(),
            read_only: false,
            allow_trim: false,
        };
        let opts = ServerOptions {
            limits,
            ..ServerOptions::default()
        };
        let server =
            Server::start_with(engine, export, Endpoint::Unix(path.clone()), opts).unwrap();
        Self {
            _dir: dir,
            path,
            server: Some(server),
        }
    }

    fn stats(&self) -> nbd::ServerStats {
        self.server.as_ref().unwrap().stats()
    }

    fn connect(&self) -> UnixStream {
        let s = UnixStream::connect(&self.path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s
    }

    /// Connects and reads the greeting; `None` if the server closed first.
    fn greeted(&self) -> Option<UnixStream> {
        let mut s = self.connect();
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).ok()?;
        assert_eq!(&hello[..8], b"NBDMAGIC");
        Some(s)
    }

    /// A client through NBD_OPT_GO, in transmission.
    fn client(&self) -> UnixStream {
        let mut s = self.greeted().expect("greeting");
        s.write_all(&(proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES).to_be_bytes())
            .unwrap();
        let mut b = proto::IHAVEOPT.to_be_bytes().to_vec();
        b.extend_from_slice(&proto::OPT_GO.to_be_bytes());
        b.extend_from_slice(&6u32.to_be_bytes());
        b.extend_from_slice(&[0; 6]);
        s.write_all(&b).unwrap();
        loop {
            let mut h = [0u8; 20];
            s.read_exact(&mut h).unwrap();
            let rep = u32::from_be_bytes(h[12..16].try_into().unwrap());
            let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
            let mut d = vec![0u8; len as usize];
            s.read_exact(&mut d).unwrap();
            if rep == proto::REP_ACK {
                return s;
            }
            assert_eq!(rep, proto::REP_INFO);
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            s.shutdown();
        }
    }
}

fn read_request(s: &mut UnixStream, cookie: u64, offset: u64, len: u32) {
    let h = RequestHeader {
        flags: 0,
        kind: proto::CMD_READ,
        cookie,
        offset,
        len,
    };
    s.write_all(&h.encode()).unwrap();
}

/// True once the server has closed `s` (EOF or reset before the client's
/// 20 s read timeout).
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

/// Polls `f` until it holds or 20 s pass (a liveness bound, not a speed
/// requirement).
fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

#[test]
fn default_limits_are_bounded() {
    let l = Limits::default();
    assert!(l.max_connections <= 64, "{l:?}");
    assert!(l.handshake_timeout <= Duration::from_secs(60), "{l:?}");
    assert!(l.max_inflight_bytes <= 64 << 20, "{l:?}");
}

#[test]
fn connections_beyond_the_cap_are_closed_before_the_greeting() {
    let f = Fixture::new(Limits {
        max_connections: 2,
        ..Limits::default()
    });
    let a = f.greeted().expect("first connection served");
    let _b = f.greeted().expect("second connection served");
    let mut c = f.connect();
    assert!(closed(&mut c), "a third connection was served");
    assert_eq!(f.stats().refused, 1);
    // A slot frees when a client leaves.
    drop(a);
    assert!(
        eventually(|| f.greeted().is_some()),
        "no connection was served after one left"
    );
}

#[test]
fn a_silent_client_is_dropped_after_the_handshake_timeout() {
    let f = Fixture::new(Limits {
        handshake_timeout: Duration::from_millis(300),
        ..Limits::default()
    });
    // Greeted, then silent: never sends its flags.
    let mut s = f.greeted().unwrap();
    assert!(closed(&mut s), "a silent client kept its connection");
    // Flags sent, then no option.
    let mut s = f.greeted().unwrap();
    s.write_all(&proto::FLAG_C_FIXED_NEWSTYLE.to_be_bytes())
        .unwrap();
    assert!(
        closed(&mut s),
        "a client stalled in the option phase stayed"
    );
    assert!(eventually(|| f.stats().connections == 0));

    // Trickling: one byte of a valid handshake every 50 ms never lets a
    // single read wait long, but the whole phase still ends on time. The
    // server has hung up before the client got through 60 bytes (3 s).
    let mut s = f.greeted().unwrap();
    let mut msg = (proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    for _ in 0..4 {
        msg.extend_from_slice(&proto::IHAVEOPT.to_be_bytes());
        msg.extend_from_slice(&proto::OPT_INFO.to_be_bytes());
        msg.extend_from_slice(&6u32.to_be_bytes());
        msg.extend_from_slice(&[0; 6]);
    }
    let refused = msg.iter().take(60).any(|b| {
        std::thread::sleep(Duration::from_millis(50));
        s.write_all(&[*b]).is_err()
    });
    assert!(refused, "a trickling client outlived the handshake timeout");

    // In transmission, an idle client may stay as long as it likes.
    let mut s = f.client();
    std::thread::sleep(Duration::from_millis(900));
    read_request(&mut s, 1, 0, 512);
    let mut h = [0u8; 16];
    s.read_exact(&mut h)
        .expect("idle client in transmission was dropped");
    assert_eq!(u32::from_be_bytes(h[4..8].try_into().unwrap()), 0);
}

#[test]
fn a_client_that_does_not_read_replies_holds_at_most_its_cap() {
    const MIB: u32 = 1 << 20;
    for cap in [4u64 << 20, Limits::default().max_inflight_bytes] {
        let f = Fixture::new(Limits {
            max_inflight_bytes: cap,
            ..Limits::default()
        });
        let mut s = f.client();
        // Twice the cap in 1 MiB reads, never reading a reply: replies
        // fill the socket and then wait; the server must stop taking
        // requests at the cap instead of buffering them all.
        let n = 2 * cap / u64::from(MIB);
        let w = s.try_clone().unwrap();
        let sender = std::thread::spawn(move || {
            let mut w = w;
            for i in 0..n {
                read_request(&mut w, i, (i % 64) * u64::from(MIB), MIB);
            }
            w
        });
        assert!(
            eventually(|| f.stats().inflight_bytes >= cap),
            "the server never filled its cap: {:?}",
            f.stats()
        );
        for _ in 0..20 {
            let st = f.stats();
            assert!(st.inflight_bytes <= cap, "cap {cap} exceeded: {st:?}");
            std::thread::sleep(Duration::from_millis(10));
        }
        // Now read everything: every request is answered.
        let reader = std::thread::spawn(move || {
            let mut got = 0;
            let mut buf = vec![0u8; MIB as usize];
            while got < n {
                let mut h = [0u8; 16];
                s.read_exact(&mut h).unwrap();
                assert_eq!(u32::from_be_bytes(h[4..8].try_into().unwrap()), 0);
                s.read_exact(&mut buf).unwrap();
                got += 1;
            }
            s
        });
        let _w = sender.join().unwrap();
        let _s = reader.join().unwrap();
        assert!(eventually(|| f.stats().inflight_bytes == 0));
    }
}
