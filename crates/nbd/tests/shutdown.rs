//! `Server::shutdown` is prompt whatever happened to the socket file and
//! whatever the clients do. It used to wake its accept loop by
//! connecting to its own socket path, so with that file removed it never
//! returned, and with the file replaced it connected to a stranger. Each
//! test counts events (connections the replacement saw, files left,
//! sockets closed); the 20 s waits are liveness bounds only.

mod common;

use std::io::Read;
use std::os::unix::net::UnixListener;

use common::{closed, eventually, finishes, read_request, stall, Fixture};
use ucrypt_nbd::{proto, Limits};

#[test]
fn shutdown_after_the_socket_file_was_removed() {
    let mut f = Fixture::new(Limits::default());
    std::fs::remove_file(&f.path).unwrap();
    let server = f.server.take().unwrap();
    assert!(
        finishes(move || server.shutdown()).is_some(),
        "shutdown hung with its socket file removed"
    );
    assert!(!f.path.exists(), "shutdown recreated the socket file");
}

#[test]
fn shutdown_leaves_a_replacement_socket_alone() {
    let mut f = Fixture::new(Limits::default());
    std::fs::remove_file(&f.path).unwrap();
    let other = UnixListener::bind(&f.path).unwrap();
    let server = f.server.take().unwrap();
    assert!(
        finishes(move || server.shutdown()).is_some(),
        "shutdown hung with its socket file replaced"
    );
    other.set_nonblocking(true).unwrap();
    let e = other.accept().map(drop).unwrap_err();
    assert_eq!(
        e.kind(),
        std::io::ErrorKind::WouldBlock,
        "shutdown connected to the replacement socket"
    );
    assert!(f.path.exists(), "shutdown removed the replacement socket");
}

#[test]
fn shutdown_answers_what_was_read_and_cuts_a_client_that_does_not_read() {
    let mut f = Fixture::new(Limits::default());
    let cap = Limits::default().max_inflight_bytes;
    // A client with a request in flight and one that stopped reading at
    // its cap.
    let mut healthy = f.client();
    let mut stalled = f.client();
    let sender = stall(&stalled, cap);
    assert!(eventually(|| f.stats().inflight_bytes >= cap));
    read_request(&mut healthy, 7, 0, 4096).unwrap();
    let server = f.server.take().unwrap();
    assert!(
        finishes(move || server.shutdown()).is_some(),
        "shutdown hung on a client that does not read"
    );
    // The healthy client got its answer (the data, or ESHUTDOWN if the
    // server read the request only after shutdown began), then EOF; the
    // stalled one, cut, sees its socket closed.
    let mut h = [0u8; 16];
    healthy.read_exact(&mut h).unwrap();
    assert_eq!(u64::from_be_bytes(h[8..16].try_into().unwrap()), 7);
    match u32::from_be_bytes(h[4..8].try_into().unwrap()) {
        0 => healthy.read_exact(&mut [0u8; 4096]).unwrap(),
        e => assert_eq!(e, proto::ESHUTDOWN),
    }
    assert!(closed(&mut healthy));
    assert!(closed(&mut stalled));
    sender.join().unwrap();
    assert!(!f.path.exists(), "shutdown left its socket file");
}
