//! MemBackend: contents, range checks, zeroing, concurrency.

mod common;

use std::sync::Arc;

use ucrypt_backend::{Backend, MemBackend};

#[test]
fn random_workload_byte_granular() {
    let b = MemBackend::new(256 * 1024 + 123).unwrap();
    common::random_workload(&b, 1, 3000, 1, 20_000);
}

#[test]
fn random_workload_sector_granular() {
    let b = MemBackend::new(4 << 20).unwrap();
    common::random_workload(&b, 2, 1000, 512, 300_000);
}

#[test]
fn out_of_range_rejected() {
    common::out_of_range_rejected(&MemBackend::new(1 << 20).unwrap());
}

#[test]
fn discard_and_zeroes_read_back_zero() {
    common::zeroes_read_back(&MemBackend::new(1 << 20).unwrap(), 1);
    common::zeroes_read_back(&MemBackend::new(3 << 20).unwrap(), 512);
}

#[test]
fn large_discard_spans_batches() {
    // More than one 2 MiB lock batch, unaligned ends.
    let size = 9 << 20;
    let b = MemBackend::new(size).unwrap();
    b.write_at(&vec![0x5A; size as usize], 0, false).unwrap();
    b.discard(100, size - 200).unwrap();
    let mut got = vec![0u8; size as usize];
    b.read_at(&mut got, 0).unwrap();
    assert!(got[..100].iter().all(|&x| x == 0x5A));
    assert!(got[100..size as usize - 100].iter().all(|&x| x == 0));
    assert!(got[size as usize - 100..].iter().all(|&x| x == 0x5A));
}

#[test]
fn fresh_ramdisk_reads_zero_and_zero_size_works() {
    let b = MemBackend::new(1 << 20).unwrap();
    let mut buf = vec![1u8; 1 << 20];
    b.read_at(&mut buf, 0).unwrap();
    assert!(buf.iter().all(|&x| x == 0));
    let z = MemBackend::new(0).unwrap();
    assert_eq!(z.size(), 0);
    z.read_at(&mut [], 0).unwrap();
    assert!(z.read_at(&mut [0u8], 0).is_err());
}

#[test]
fn absurd_size_is_a_clean_error() {
    let err = MemBackend::new(u64::MAX).unwrap_err();
    assert!(err.to_string().starts_with("Cannot allocate"), "{err}");
}

#[test]
fn concurrent_threads() {
    let b: Arc<dyn Backend> = Arc::new(MemBackend::new(1 << 20).unwrap());
    common::concurrent_threads(&*b, 8, 300, true);
}

#[test]
fn concurrent_neighbours_sharing_pages() {
    let b: Arc<dyn Backend> = Arc::new(MemBackend::new(64 * 1024).unwrap());
    common::concurrent_shared_pages(&*b, 8, 2000);
}
