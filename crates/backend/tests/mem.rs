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

#[test]
fn direct_access_lends_the_stored_bytes_in_aligned_pieces() {
    use ucrypt_backend::DIRECT_ALIGN;
    let size = 5u64 << 20;
    let b = MemBackend::new(size).unwrap();
    let direct = b.direct().expect("the ramdisk lends its memory");
    // Unaligned start and end, more than one lock batch.
    let (off, len) = (4096 * 3 + 512, (3u64 << 20) + 1536);
    let pattern = |i: usize| (i * 13 + i / 4096) as u8;
    let mut pieces = Vec::new();
    direct
        .write_with(off, len, false, &mut |at, piece| {
            pieces.push((at, piece.len()));
            for (k, byte) in piece.iter_mut().enumerate() {
                *byte = pattern(at + k);
            }
        })
        .unwrap();
    // In order, contiguous, covering the range, cut only on 4 KiB device
    // boundaries.
    let mut next = 0;
    for &(at, n) in &pieces {
        assert_eq!(at, next);
        assert!(n > 0);
        next += n;
        if next < len as usize {
            assert_eq!((off + next as u64) % DIRECT_ALIGN, 0, "{pieces:?}");
        }
    }
    assert_eq!(next, len as usize);
    assert!(pieces.len() >= 2, "crosses a batch: {pieces:?}");
    let mut got = vec![0u8; len as usize];
    b.read_at(&mut got, off).unwrap();
    assert!(got.iter().enumerate().all(|(i, &v)| v == pattern(i)));
    // Bytes around the range are untouched.
    let mut edge = [1u8; 2];
    b.read_at(&mut edge[..1], off - 1).unwrap();
    b.read_at(&mut edge[1..], off + len).unwrap();
    assert_eq!(edge, [0, 0]);
    // read_with sees what write_at wrote.
    b.write_at(&[7u8; 8192], 8192, false).unwrap();
    let mut seen = Vec::new();
    direct
        .read_with(8192 + 100, 8000, &mut |at, piece| {
            seen.push((at, piece.to_vec()))
        })
        .unwrap();
    let flat: Vec<u8> = seen.iter().flat_map(|(_, p)| p.clone()).collect();
    assert_eq!(flat, vec![7u8; 8000]);
    assert_eq!(seen.len(), 1, "two pages, one lock batch: one piece");
}

#[test]
fn direct_access_checks_the_range_first() {
    let b = MemBackend::new(1 << 20).unwrap();
    let direct = b.direct().unwrap();
    let mut called = false;
    let err = direct
        .write_with((1 << 20) - 512, 1024, false, &mut |_, _| called = true)
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert!(direct
        .read_with(u64::MAX - 10, 20, &mut |_, _| called = true)
        .is_err());
    assert!(!called, "no piece lent for a bad range");
}
