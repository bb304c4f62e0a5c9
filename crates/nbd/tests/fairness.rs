//! Fairness between NBD clients (issue 17): a client that stops reading its
//! replies stalls only itself, in every engine mode. One client queues
//! 1 MiB reads and never reads a reply, until the server holds its whole
//! in-flight cap; meanwhile a healthy client's 4 KiB reads must keep their
//! latency: p99 under 10 ms, the figure the issue asks for (the one
//! wall-clock bound in these tests; a stalled client used to cost the
//! healthy one ~30-60 s per read, so the margin is three orders of
//! magnitude).

mod common;

use std::io::Read;
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use common::{eventually, read_request, stall, Fixture, SIZE};
use datapath::CryptMode;
use ucrypt_nbd::Limits;

/// Healthy reads measured (after a warm-up); p99 is then the 4th worst.
const READS: usize = 400;
const P99_BOUND: Duration = Duration::from_millis(10);
/// Measurement windows tried before the bound counts as missed.
const WINDOWS: usize = 3;

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

/// The modes run one at a time: another mode's stall setup (32 MiB of
/// crypto) would otherwise compete with this one's measurement for the CPUs.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn stalled_client_stalls_only_itself(mode: CryptMode) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let f = Fixture::with(mode, Limits::default());
    let cap = Limits::default().max_inflight_bytes;
    let mut healthy = f.client();
    // Liveness only: a read stuck behind the stalled client fails the test
    // here instead of hanging it.
    healthy
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let stalled = f.client();
    let sender = stall(&stalled, cap);
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
    // Up to WINDOWS windows of READS reads, all under the stall: a busy CI
    // machine can spoil one window's tail, while a client stalled behind
    // the other spoils every window (by seconds, not milliseconds).
    let mut windows = Vec::new();
    for w in 0..WINDOWS as u64 {
        let mut lat: Vec<Duration> = (0..READS as u64)
            .map(|i| {
                let cookie = 100 + w * READS as u64 + i;
                timed_read(&mut healthy, cookie, rng.below(blocks) * 4096, &mut buf)
            })
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
            "{mode:?}: healthy 4 KiB reads under a stalled client, window {w}: p50 {p50:?} p99 {p99:?} max {:?}",
            lat[READS - 1]
        );
        windows.push((p99, p50));
        if p99 < P99_BOUND {
            break;
        }
    }
    assert!(
        windows.iter().any(|&(p99, _)| p99 < P99_BOUND),
        "{mode:?}: healthy client's p99 >= {P99_BOUND:?} in every window (p99, p50): {windows:?}"
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
