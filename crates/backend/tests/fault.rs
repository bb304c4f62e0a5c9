//! FaultBackend: rules fire as configured and failed writes write nothing.

mod common;

use std::io;
use std::sync::Arc;
use std::time::Duration;

use ucrypt_backend::{
    raw_os_error, Backend, Error, ErrorKind, FaultBackend, FaultRule, MemBackend, OpKind, OpKinds,
};

fn fb() -> FaultBackend<MemBackend> {
    FaultBackend::new(MemBackend::new(1 << 20).unwrap())
}

#[test]
fn pass_through_without_rules_and_counts() {
    let b = fb();
    common::random_workload(&b, 5, 500, 1, 10_000);
    let c = b.counts();
    assert!(c.reads > 0 && c.writes > 0 && c.fua_writes > 0 && c.flushes > 0);
    assert!(c.discards > 0 && c.write_zeroes > 0);
    assert_eq!((c.injected_errors, c.delayed), (0, 0));
    assert_eq!(b.caps(), b.inner().caps());
}

#[test]
fn sticky_error_per_op_kind_with_errno() {
    let b = fb();
    let id = b.add_rule(FaultRule::error(
        OpKinds::WRITE | OpKinds::FLUSH,
        libc::ENOSPC,
    ));
    let e = b.write_at(&[1u8; 512], 0, false).unwrap_err();
    assert_eq!(raw_os_error(&e), Some(libc::ENOSPC));
    assert_eq!(e.kind(), io::ErrorKind::StorageFull);
    assert!(matches!(
        Error::kind_of(&e),
        Some(ErrorKind::Injected {
            op: OpKind::Write,
            offset: 0,
            len: 512
        })
    ));
    assert!(e.to_string().starts_with("Injected write fault"), "{e}");
    assert!(b.flush().is_err());
    assert!(b.write_at(&[1u8; 512], 4096, true).is_err());
    // Reads, discards and zeroing are not selected.
    let mut buf = [9u8; 512];
    b.read_at(&mut buf, 0).unwrap();
    assert_eq!(buf, [0u8; 512], "a failed write wrote data");
    b.discard(0, 512).unwrap();
    b.write_zeroes(0, 512).unwrap();
    assert_eq!(b.fired(id), Some(3));
    assert_eq!(b.counts().writes, 0);
    assert!(b.remove_rule(id));
    assert!(!b.remove_rule(id));
    b.write_at(&[1u8; 512], 0, false).unwrap();
}

#[test]
fn once_after_n_ops() {
    let b = fb();
    let id = b.add_rule(FaultRule::error(OpKinds::READ, libc::EIO).after(3).once());
    let mut buf = [0u8; 64];
    let results: Vec<bool> = (0..8).map(|_| b.read_at(&mut buf, 0).is_ok()).collect();
    assert_eq!(results, [true, true, true, false, true, true, true, true]);
    assert_eq!(b.fired(id), Some(1));
    assert_eq!(b.counts().injected_errors, 1);
    assert_eq!(b.counts().reads, 7);
}

#[test]
fn times_n() {
    let b = fb();
    b.add_rule(FaultRule::error(OpKinds::DISCARD, libc::EIO).times(2));
    let ok: Vec<bool> = (0..4).map(|_| b.discard(0, 4096).is_ok()).collect();
    assert_eq!(ok, [false, false, true, true]);
}

#[test]
fn byte_range_selects_overlapping_requests() {
    let b = fb();
    b.add_rule(FaultRule::error(OpKinds::ALL, libc::EIO).range(8192..12288));
    assert!(
        b.write_at(&[1u8; 4096], 4096, false).is_ok(),
        "adjacent below"
    );
    assert!(
        b.write_at(&[1u8; 4096], 12288, false).is_ok(),
        "adjacent above"
    );
    assert!(
        b.write_at(&[1u8; 2], 8191, false).is_err(),
        "overlaps first byte"
    );
    assert!(
        b.write_at(&[1u8; 1], 12287, false).is_err(),
        "overlaps last byte"
    );
    assert!(b.read_at(&mut [0u8; 1 << 16], 0).is_err(), "covers it");
    assert!(b.write_zeroes(10_000, 1).is_err());
    assert!(b.discard(0, 1 << 20).is_err());
    // Flush has no range, so a ranged rule never hits it.
    b.flush().unwrap();
    // The writes beside the range landed; the failed ones wrote nothing.
    let mut got = vec![0u8; 4098];
    b.read_at(&mut got, 8191).unwrap_err();
    b.inner().read_at(&mut got, 8191).unwrap();
    assert_eq!((got[0], got[4097]), (1, 1));
    assert!(
        got[1..4097].iter().all(|&x| x == 0),
        "a failed write wrote data"
    );
}

#[test]
fn delay_rules_delay_and_pass_on() {
    let b = fb();
    b.add_rule(FaultRule::delay(OpKinds::READ, Duration::from_millis(2)).times(2));
    let mut buf = [0u8; 16];
    for _ in 0..3 {
        b.read_at(&mut buf, 0).unwrap();
    }
    let c = b.counts();
    assert_eq!((c.delayed, c.reads, c.injected_errors), (2, 3, 0));
    b.clear_rules();
    b.add_rule(
        FaultRule::error(OpKinds::WRITE, libc::EIO)
            .with_delay(Duration::from_millis(1))
            .once(),
    );
    assert!(b.write_at(&buf, 0, false).is_err());
    assert_eq!(b.counts().delayed, 3);
}

#[test]
fn wraps_shared_dyn_backends_and_races_with_rule_changes() {
    let inner: Arc<dyn Backend> = Arc::new(MemBackend::new(1 << 20).unwrap());
    let b = Arc::new(FaultBackend::new(inner));
    std::thread::scope(|s| {
        let b2 = b.clone();
        s.spawn(move || {
            for _ in 0..200 {
                let id = b2.add_rule(FaultRule::error(OpKinds::WRITE, libc::EIO).range(0..4096));
                b2.remove_rule(id);
            }
        });
        for t in 0..4u64 {
            let b = b.clone();
            s.spawn(move || {
                // Outside the faulty range nothing ever fails.
                let at = 8192 * (t + 1);
                for i in 0..500u32 {
                    b.write_at(&i.to_le_bytes(), at, false).unwrap();
                    let mut back = [0u8; 4];
                    b.read_at(&mut back, at).unwrap();
                    assert_eq!(u32::from_le_bytes(back), i);
                }
            });
        }
    });
}

#[test]
fn lends_no_direct_access_so_rules_see_every_byte() {
    let inner = MemBackend::new(1 << 20).unwrap();
    assert!(inner.direct().is_some());
    assert!(fb().direct().is_none());
}
