//! The server's limits: a cap on connections, a handshake
//! timeout, and a per-connection cap on payload bytes in flight. Each test
//! plays a client that used to hold the server's resources without bound.

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::{closed, eventually, greeted_from, negotiate, read_request, Fixture};
use nbd::proto;
use nbd::Limits;
use ucrypt_nbd as nbd;

#[test]
fn default_limits_are_bounded() {
    let l = Limits::default();
    assert!(l.max_connections <= 64, "{l:?}");
    assert!(l.handshake_timeout <= Duration::from_secs(60), "{l:?}");
    assert!(l.max_inflight_bytes <= 64 << 20, "{l:?}");
    assert!(
        l.max_handshakes_per_peer < l.max_connections / 2,
        "one peer may hold half the slots: {l:?}"
    );
}

#[test]
fn one_peer_address_holds_at_most_its_share_of_handshakes() {
    let f = Fixture::tcp(Limits {
        max_handshakes_per_peer: 2,
        ..Limits::default()
    });
    let to = f.tcp_addr();
    // 127.0.0.2 stalls in the option phase: two connections are greeted,
    // the third is closed at once.
    let a = greeted_from([127, 0, 0, 2], to).expect("first stalled handshake");
    let _b = greeted_from([127, 0, 0, 2], to).expect("second stalled handshake");
    assert!(
        greeted_from([127, 0, 0, 2], to).is_none(),
        "a third handshake from 127.0.0.2 was served"
    );
    assert_eq!(f.stats().refused, 1);
    // Another address is served meanwhile, and a client in transmission
    // no longer counts against its address: 127.0.0.1 still gets two
    // handshakes besides it.
    let mut c = greeted_from([127, 0, 0, 1], to).expect("127.0.0.1 served");
    negotiate(&mut c);
    let _d = greeted_from([127, 0, 0, 1], to).expect("127.0.0.1's first handshake");
    // (The server marks `c` past its option phase just after sending the
    // reply `negotiate` waited for: retry until it has.)
    let mut e = None;
    assert!(
        eventually(|| {
            e = greeted_from([127, 0, 0, 1], to);
            e.is_some()
        }),
        "127.0.0.1's second handshake was refused: its client in transmission still counts"
    );
    // A stalled handshake that ends frees its address's slot.
    drop(a);
    assert!(
        eventually(|| greeted_from([127, 0, 0, 2], to).is_some()),
        "127.0.0.2 got no slot back after one of its connections left"
    );
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
        // Long enough that a loaded machine never stalls a step that must
        // succeed (the greeting, a full handshake) past it.
        handshake_timeout: Duration::from_secs(2),
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
    // server has hung up before the client got through its 92 bytes
    // (4.6 s).
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
    let refused = msg.iter().any(|b| {
        std::thread::sleep(Duration::from_millis(50));
        s.write_all(&[*b]).is_err()
    });
    assert!(refused, "a trickling client outlived the handshake timeout");

    // In transmission, an idle client may stay as long as it likes.
    let mut s = f.client();
    std::thread::sleep(Duration::from_millis(2500));
    read_request(&mut s, 1, 0, 512).unwrap();
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
        // Twice the cap in 1 MiB reads, never reading a reply, plus what
        // the socket itself absorbs (the server raises a unix socket's
        // SO_SNDBUF up to net.core.wmem_max, and the kernel doubles it):
        // replies fill the socket and then wait; the server must stop
        // taking requests at the cap instead of buffering them all.
        let wmem_max: u64 = std::fs::read_to_string("/proc/sys/net/core/wmem_max")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(4 << 20);
        let n = (2 * cap + 2 * wmem_max) / u64::from(MIB) + 1;
        let w = s.try_clone().unwrap();
        let sender = std::thread::spawn(move || {
            let mut w = w;
            for i in 0..n {
                read_request(&mut w, i, (i % 64) * u64::from(MIB), MIB).unwrap();
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
