//! Fairness between NBD clients (issue 17): a client that stops reading its
//! replies stalls only itself, in every engine mode. One client queues
//! 1 MiB reads and never reads a reply, until the server holds its whole
//! in-flight cap; meanwhile a healthy client's 4 KiB reads must keep their
//! latency: p99 under 10 ms, the figure the issue asks for (the one
//! wall-clock bound in these tests; a stalled client used to cost the
//! healthy one ~30-60 s per read, so the margin is three orders of
//! magnitude).

use std::io::{Read, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use backend::MemBackend;
use crypto::{CryptConfig, SectorCrypt};
use datapath::{CryptMode, Engine, EngineConfig, Volume};
use nbd::proto::{self, RequestHeader};
use nbd::{Endpoint, ExportConfig, Limits, Server};
use ucrypt_nbd as nbd;

const SIZE: u64 = 64 << 20;
const MIB: u32 = 1 << 20;
/// Healthy reads measured (after a warm-up); p99 is then the 4th worst.
const READS: usize = 400;
const P99_BOUND: Duration = Duration::from_millis(10);

struct Fixture {
    _dir: testutil::TempDir,
    path: PathBuf,
    server: Option<Server>,
}

impl Fixture {
    fn new(mode: CryptMode) -> Self {
        let dir = testutil::TempDir::new("nbd-fair");
        let path = dir.join("nbd.sock");
        let mem = Arc::new(MemBackend::new(SIZE).unwrap());
        // Encrypted, so classic queues reads to its workers and adaptive
        // may hand large ones to helpers: completions then run on threads
        // every connection shares.
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
            description: "fairness".into(),
            read_only: false,
            allow_trim: false,
        };
        let server = Server::start(engine, export, Endpoint::Unix(path.clone())).unwrap();
        Self {
            _dir: dir,
            path,
            server: Some(server),
        }
    }

    fn stats(&self) -> nbd::ServerStats {
        self.server.as_ref().unwrap().stats()
    }

    /// A client through NBD_OPT_GO, in transmission.
    fn client(&self) -> UnixStream {
        let mut s = UnixStream::connect(&self.path).unwrap();
        // Liveness only: a read stuck behind the stalled client fails the
        // test here instead of hanging it.
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello).unwrap();
        assert_eq!(&hello[..8], b"NBDMAGIC");
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

fn read_request(s: &mut UnixStream, cookie: u64, offset: u64, len: u32) -> std::io::Result<()> {
    let h = RequestHeader {
        flags: 0,
        kind: proto::CMD_READ,
        cookie,
        offset,
        len,
    };
    s.write_all(&h.encode())
}

/// Polls `f` until it holds or 20 s pass (a liveness bound).
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

/// One healthy 4 KiB read at QD1: its latency, checking the reply.
fn timed_read(s: &mut UnixStream, cookie: u64, offset: u64, buf: &mut [u8]) -> Duration {
    let t0 = Instant::now();
    read_request(s, cookie, offset, buf.len() as u32).unwrap();
    let mut h = [0u8; 16];
    s.read_exact(&mut h).unwrap_or_else(|e| {
        panic!("healthy read {cookie} got no reply in 5 s (stalled behind the other client): {e}")
    });
    s.read_exact(buf).unwrap();
    let dt = t0.elapsed();
    assert_eq!(u32::from_be_bytes(h[4..8].try_into().unwrap()), 0);
    assert_eq!(u64::from_be_bytes(h[8..16].try_into().unwrap()), cookie);
    dt
}

fn stalled_client_stalls_only_itself(mode: CryptMode) {
    let f = Fixture::new(mode);
    let cap = Limits::default().max_inflight_bytes;
    let mut healthy = f.client();
    let stalled = f.client();

    // The stalled client: twice its cap in 1 MiB reads, never reading a
    // reply. Its sender blocks once the server stops taking its requests.
    let n = 2 * cap / u64::from(MIB);
    let mut w = stalled.try_clone().unwrap();
    let sender = std::thread::spawn(move || {
        for i in 0..n {
            if read_request(&mut w, 1000 + i, (i % 64) * u64::from(MIB), MIB).is_err() {
                break;
            }
        }
    });
    // The stall is established once the server holds the whole cap for
    // that client: its replies fill the socket (a few hundred KiB) and the
    // rest wait, so the server has stopped reading its requests.
    assert!(
        eventually(|| f.stats().inflight_bytes >= cap),
        "{mode:?}: the stalled client never reached its cap: {:?}",
        f.stats()
    );

    let mut buf = vec![0u8; 4096];
    let blocks = SIZE / 4096;
    let mut rng = testutil::Rng::new(17);
    for i in 0..16 {
        timed_read(&mut healthy, i, rng.below(blocks) * 4096, &mut buf);
    }
    let mut lat: Vec<Duration> = (0..READS as u64)
        .map(|i| timed_read(&mut healthy, 100 + i, rng.below(blocks) * 4096, &mut buf))
        .collect();
    // Still stalled at the end: the measurement ran under the stall.
    let st = f.stats();
    assert!(
        st.inflight_bytes >= cap,
        "{mode:?}: the stalled client was released during the measurement: {st:?}"
    );
    assert_eq!(st.connections, 2, "{mode:?}: {st:?}");

    lat.sort();
    let p99 = lat[(READS * 99).div_ceil(100) - 1];
    let p50 = lat[READS / 2];
    eprintln!(
        "{mode:?}: healthy 4 KiB reads under a stalled client: p50 {p50:?} p99 {p99:?} max {:?}",
        lat[READS - 1]
    );
    assert!(
        p99 < P99_BOUND,
        "{mode:?}: healthy client's p99 {p99:?} >= {P99_BOUND:?} (p50 {p50:?})"
    );

    // The stalled client leaves; the server drops its replies.
    stalled.shutdown(Shutdown::Both).unwrap();
    sender.join().unwrap();
    assert!(
        eventually(|| f.stats().connections == 1),
        "{mode:?}: {:?}",
        f.stats()
    );
}

#[test]
fn stalled_client_stalls_only_itself_classic() {
    stalled_client_stalls_only_itself(CryptMode::Classic);
}

#[test]
fn stalled_client_stalls_only_itself_inline() {
    stalled_client_stalls_only_itself(CryptMode::Inline);
}

#[test]
fn stalled_client_stalls_only_itself_adaptive() {
    stalled_client_stalls_only_itself(CryptMode::Adaptive);
}
