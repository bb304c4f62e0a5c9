//! What the NBD integration tests share: an encrypted in-memory volume
//! served over a unix socket, and a minimal hand-rolled client.

#![allow(dead_code)] // each test binary uses its own subset

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backend::MemBackend;
use crypto::{CryptConfig, SectorCrypt};
use datapath::{CryptMode, Engine, EngineConfig, Volume};
use nbd::proto::{self, RequestHeader};
use nbd::{Endpoint, ExportConfig, Limits, Server, ServerOptions};
use ucrypt_nbd as nbd;

/// Size of the test volume.
pub const SIZE: u64 = 64 << 20;

/// A server on a fresh unix socket (or on 127.0.0.1), shut down on drop.
pub struct Fixture {
    pub dir: testutil::TempDir,
    pub path: PathBuf,
    pub server: Option<Server>,
}

impl Fixture {
    /// Classic mode with `limits`.
    pub fn new(limits: Limits) -> Self {
        Self::with(CryptMode::Classic, limits)
    }

    /// An engine in `mode` over an encrypted ramdisk, served with `limits`.
    pub fn with(mode: CryptMode, limits: Limits) -> Self {
        Self::serve(mode, limits, false)
    }

    /// Classic mode with `limits`, served on TCP at 127.0.0.1 (a port the
    /// kernel picks: [`Fixture::tcp_addr`]).
    pub fn tcp(limits: Limits) -> Self {
        Self::serve(CryptMode::Classic, limits, true)
    }

    /// The TCP address of a [`Fixture::tcp`] server.
    pub fn tcp_addr(&self) -> SocketAddr {
        match self.server.as_ref().unwrap().endpoint() {
            Endpoint::Tcp(a) => *a,
            e => panic!("not a TCP fixture: {e:?}"),
        }
    }

    fn serve(mode: CryptMode, limits: Limits, tcp: bool) -> Self {
        let dir = testutil::TempDir::new("nbd-test");
        let path = dir.join("nbd.sock");
        let mem = Arc::new(MemBackend::new(SIZE).unwrap());
        // Encrypted, so the classic engine queues reads to its workers and
        // adaptive may hand large ones to helpers: completions run on
        // threads every connection shares, and the connection's reader
        // keeps going while replies wait (without a cipher the engine
        // completes reads inline, inside submit).
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
        let cfg = EngineConfig {
            mode,
            ..EngineConfig::default()
        };
        let engine = Arc::new(Engine::new(vol, cfg).unwrap());
        let export = ExportConfig {
            name: "t".into(),
            description: "test".into(),
        };
        let opts = ServerOptions {
            limits,
            ..ServerOptions::default()
        };
        let endpoint = if tcp {
            Endpoint::Tcp("127.0.0.1:0".parse().unwrap())
        } else {
            Endpoint::Unix(path.clone())
        };
        let server = Server::start_with(engine, export, endpoint, opts).unwrap();
        Self {
            dir,
            path,
            server: Some(server),
        }
    }

    pub fn stats(&self) -> nbd::ServerStats {
        self.server.as_ref().unwrap().stats()
    }

    /// A raw connection (20 s read timeout: a liveness bound).
    pub fn connect(&self) -> UnixStream {
        let s = UnixStream::connect(&self.path).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s
    }

    /// Connects and reads the greeting; `None` if the server closed first.
    pub fn greeted(&self) -> Option<UnixStream> {
        let mut s = self.connect();
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).ok()?;
        assert_eq!(&hello[..8], b"NBDMAGIC");
        Some(s)
    }

    /// A client through NBD_OPT_GO, in transmission.
    pub fn client(&self) -> UnixStream {
        let mut s = self.greeted().expect("greeting");
        negotiate(&mut s);
        s
    }
}

/// A TCP connection to `to` from source address `from` (bound before
/// connecting; any 127.0.0.0/8 address is loopback), greeted; `None` if
/// the server closed it first.
pub fn greeted_from(from: [u8; 4], to: SocketAddr) -> Option<TcpStream> {
    use nix::sys::socket::{bind, connect, socket, AddressFamily, SockFlag, SockType, SockaddrIn};
    use std::os::fd::AsRawFd;
    let fd = socket(
        AddressFamily::Inet,
        SockType::Stream,
        SockFlag::SOCK_CLOEXEC,
        None,
    )
    .unwrap();
    let [a, b, c, d] = from;
    bind(fd.as_raw_fd(), &SockaddrIn::new(a, b, c, d, 0)).unwrap();
    let SocketAddr::V4(v4) = to else {
        panic!("IPv4 only: {to}")
    };
    connect(fd.as_raw_fd(), &SockaddrIn::from(v4)).unwrap();
    let mut s = TcpStream::from(fd);
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).ok()?;
    assert_eq!(&hello[..8], b"NBDMAGIC");
    Some(s)
}

/// Takes a greeted client through NBD_OPT_GO into transmission.
pub fn negotiate<S: Read + Write>(s: &mut S) {
    {
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
                return;
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

/// Sends one READ request.
pub fn read_request(s: &mut UnixStream, cookie: u64, offset: u64, len: u32) -> std::io::Result<()> {
    let h = RequestHeader {
        flags: 0,
        kind: proto::CMD_READ,
        cookie,
        offset,
        len,
    };
    s.write_all(&h.encode())
}

/// Sends `2 × cap` of 1 MiB reads on a clone of `s` from a thread, never
/// reading a reply (the thread blocks once the server stops taking them,
/// and ends when the socket is shut).
pub fn stall(s: &UnixStream, cap: u64) -> std::thread::JoinHandle<()> {
    const MIB: u32 = 1 << 20;
    let n = 2 * cap / u64::from(MIB);
    let mut w = s.try_clone().unwrap();
    std::thread::spawn(move || {
        for i in 0..n {
            if read_request(&mut w, 1000 + i, (i % 64) * u64::from(MIB), MIB).is_err() {
                break;
            }
        }
    })
}

/// True once the server has closed `s` (EOF or reset before the client's
/// read timeout); whatever was still buffered is read and discarded.
pub fn closed(s: &mut UnixStream) -> bool {
    let mut b = vec![0u8; 64 << 10];
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
pub fn eventually(mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    false
}

/// Runs `f` on a thread and returns its result, or `None` if it has not
/// finished within 20 s (a liveness bound: the thread is left behind).
pub fn finishes<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(20)).ok()
}
