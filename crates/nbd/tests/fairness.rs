//! Fairness between NBD clients: a client that stops reading its
//! replies stalls only itself, in every engine mode. One client queues
//! 1 MiB reads and never reads a reply, until the server holds its whole
//! in-flight cap; meanwhile a healthy client's 4 KiB reads must all be
//! answered while that stall still holds.
//!
//! Counted, not timed: the stall ends only when the server gives up on the
//! stalled client (its reply write timeout, 30 s, closes the connection)
//! or the client leaves, so after every healthy reply the test checks that
//! the server still holds the stalled client's connection, and after the
//! last one that it still holds its whole cap. A healthy read queued
//! behind the stalled client's replies (the bug this pins: engine workers
//! blocked in the stalled client's reply writes) is answered only after
//! that release, and fails the check. The healthy client's read timeout is
//! a hang guard only, longer than the server's reply timeout so a
//! regression shows as the check failing, not a timeout.

mod common;

use std::io::Read;
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use common::{eventually, read_request, stall, Fixture, SIZE};
use datapath::CryptMode;
use ucrypt_nbd::Limits;

/// Healthy reads that must be answered under the stall.
const READS: u64 = 400;
/// Hang guard for one healthy read (twice the server's reply timeout).
const HANG_GUARD: Duration = Duration::from_secs(60);

/// One healthy 4 KiB read at QD1, checking the reply.
fn read_one(s: &mut UnixStream, cookie: u64, offset: u64, buf: &mut [u8]) {
    read_request(s, cookie, offset, buf.len() as u32).unwrap();
    let mut h = [0u8; 16];
    s.read_exact(&mut h).unwrap_or_else(|e| {
        panic!("healthy read {cookie} got no reply within the hang guard {HANG_GUARD:?}: {e}")
    });
    s.read_exact(buf).unwrap();
    assert_eq!(u32::from_be_bytes(h[4..8].try_into().unwrap()), 0);
    assert_eq!(u64::from_be_bytes(h[8..16].try_into().unwrap()), cookie);
}

/// The modes run one at a time: another mode's stall setup (32 MiB of
/// crypto) would otherwise compete with this one for the CPUs.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn stalled_client_stalls_only_itself(mode: CryptMode) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let f = Fixture::with(mode, Limits::default());
    let cap = Limits::default().max_inflight_bytes;
    let mut healthy = f.client();
    healthy.set_read_timeout(Some(HANG_GUARD)).unwrap();
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
    for cookie in 0..READS {
        read_one(&mut healthy, cookie, rng.below(blocks) * 4096, &mut buf);
        // Answered while the stalled client's connection is still open:
        // this reply did not wait for the server to give up on it.
        let st = f.stats();
        assert!(
            st.connections == 2,
            "{mode:?}: healthy read {cookie} of {READS} was answered only after the stalled \
             client was dropped: {st:?}"
        );
    }
    // And the stalled client is still held at its cap: it never got its
    // replies out (the count can dip for a moment while the socket buffer
    // takes a reply and the server reads the next request, so poll).
    assert!(
        eventually(|| f.stats().inflight_bytes >= cap),
        "{mode:?}: the stalled client was released during the healthy reads: {:?}",
        f.stats()
    );
    let st = f.stats();
    assert_eq!(
        (st.connections, st.protocol_errors),
        (2, 0),
        "{mode:?}: {st:?}"
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
