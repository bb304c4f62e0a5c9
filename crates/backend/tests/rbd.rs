//! `RbdBackend` against a throwaway single-node Ceph cluster
//! (testutil::ceph: the suite's shared one, or one started for this binary
//! and stopped at its end): batches of asynchronous reads and writes, FUA,
//! flush, write-zeroes and discard reading back zero, completion-driven
//! entries (`submit_async`), snapshots read-only, the exclusive lock between
//! two clients, a live `rbd resize` seen by `refresh_size`, and the open
//! errors.

mod common;

use backend::rbd::{RbdConfig, RbdOptions, RbdSpec};
use backend::{AsyncKind, Backend, ErrorKind, RbdBackend, ReadOp, WriteOp};
use testutil::ceph::{Cluster, Store};
use testutil::{Capability, Rng};
use ucrypt_backend as backend;

/// The cluster of this binary, with what these tests open on it.
fn start(test: &str) -> Option<Cluster> {
    let tools = ["ceph-mon", "ceph-osd", "ceph-mgr", "ceph", "rbd"];
    let caps: Vec<Capability<'_>> = tools.iter().map(|t| Capability::Tool(t)).collect();
    if !testutil::require_all(test, &caps) {
        return None;
    }
    Some(Cluster::start("rbd-backend", Store::Memstore(1 << 30)))
}

fn cfg(c: &Cluster) -> RbdConfig {
    RbdConfig {
        conf: Some(c.conf.clone()),
        ..RbdConfig::default()
    }
}

fn open(c: &Cluster, spec: &str, read_only: bool) -> Result<RbdBackend, backend::Error> {
    let spec = RbdSpec::parse(spec).unwrap().unwrap();
    let opts = RbdOptions {
        read_only,
        allow_discard: true,
        min_size: 0,
    };
    RbdBackend::open_with(&spec, &opts, &cfg(c))
}

const MIB: usize = 1 << 20;

#[test]
fn rbd_backend_batches_lock_snapshots_and_errors() {
    let Some(c) = start("rbd_backend_batches_lock_snapshots_and_errors") else {
        return;
    };
    c.rbd(&["create", "--size", "16M", &c.image("b")]);
    let b = open(&c, &c.device("b"), false).unwrap();
    assert_eq!(b.size(), 16 * MIB as u64);

    // A batch of 32 writes of mixed sizes, in flight together, one FUA.
    let mut rng = Rng::new(7);
    let mut model = vec![0u8; 16 * MIB];
    let mut bufs = Vec::new();
    for i in 0..32u64 {
        let len = [4096, 512, 65536, MIB / 2][i as usize % 4];
        let mut v = vec![0u8; len];
        rng.fill(&mut v);
        let off = i * (MIB as u64 / 2);
        model[off as usize..off as usize + len].copy_from_slice(&v);
        bufs.push((v, off));
    }
    let ops: Vec<WriteOp<'_>> = bufs
        .iter()
        .enumerate()
        .map(|(i, (v, off))| WriteOp {
            buf: v,
            offset: *off,
            fua: i == 5,
        })
        .collect();
    for r in b.write_batch(&ops) {
        r.unwrap();
    }
    // Read it all back as one batch of 64 reads of 256 KiB.
    let mut out = vec![0u8; 16 * MIB];
    let mut reads: Vec<ReadOp<'_>> = out
        .chunks_mut(256 << 10)
        .enumerate()
        .map(|(i, buf)| ReadOp {
            buf,
            offset: i as u64 * (256 << 10),
        })
        .collect();
    for r in b.read_batch(&mut reads) {
        r.unwrap();
    }
    assert!(out == model, "batched read differs from what was written");

    // write_at / read_at, out of range, flush.
    b.write_at(&[0xa5; 4096], 4096, true).unwrap();
    model[4096..8192].fill(0xa5);
    let mut one = vec![0u8; 8192];
    b.read_at(&mut one, 0).unwrap();
    assert_eq!(one, model[..8192]);
    let e = b.read_at(&mut one, 16 * MIB as u64 - 4096).unwrap_err();
    assert!(matches!(
        backend::Error::kind_of(&e),
        Some(ErrorKind::OutOfRange { .. })
    ));
    b.flush().unwrap();

    // write_zeroes and a partial discard both read back zero.
    b.write_zeroes(MIB as u64, 12288).unwrap();
    b.discard(3 * MIB as u64 + 512, 8192).unwrap();
    model[MIB..MIB + 12288].fill(0);
    model[3 * MIB + 512..3 * MIB + 512 + 8192].fill(0);
    b.read_at(&mut out, 0).unwrap();
    assert!(
        out == model,
        "zeroed/discarded ranges do not read back zero"
    );

    // Completion-driven entries (Backend::submit_async): each completes on
    // the backend's completion thread with its own result, FUA included;
    // a refused entry fails alone, on the submitter.
    assert!(b.completes_async());
    let (tx, rx) = std::sync::mpsc::channel::<common::Event>();
    let entry = |tag: u64, kind: AsyncKind, offset: u64, buf: Vec<u8>| {
        common::op(&tx, tag as usize, kind, offset, buf)
    };
    let mut ops = Vec::new();
    for i in 0..8u64 {
        let off = i * MIB as u64 + 4096;
        let data = vec![i as u8 + 0x40; 8192];
        model[off as usize..off as usize + 8192].copy_from_slice(&data);
        ops.push(entry(i, AsyncKind::Write { fua: i == 3 }, off, data));
    }
    ops.push(entry(99, AsyncKind::Read, 16 * MIB as u64, vec![0; 512]));
    b.submit_async(ops);
    for _ in 0..9 {
        let (tag, buf, res, comp) = rx.recv().unwrap();
        if tag == 99 {
            let e = res.unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
            assert!(!comp);
        } else {
            res.unwrap_or_else(|e| panic!("async write {tag}: {e}"));
            assert_eq!(buf, vec![tag as u8 + 0x40; 8192]);
            assert!(comp, "write {tag} completed off the completion thread");
        }
    }
    let ops = (0..8u64)
        .map(|i| entry(i, AsyncKind::Read, i * MIB as u64 + 4096, vec![0; 8192]))
        .collect();
    b.submit_async(ops);
    for _ in 0..8 {
        let (tag, buf, res, comp) = rx.recv().unwrap();
        res.unwrap_or_else(|e| panic!("async read {tag}: {e}"));
        assert_eq!(buf, vec![tag as u8 + 0x40; 8192], "async read {tag}");
        assert!(comp);
    }
    b.read_at(&mut out, 0).unwrap();
    assert!(out == model, "async writes did not land");

    // A second read-write client is refused; a read-only one shares.
    let e = open(&c, &c.device("b"), false).unwrap_err();
    assert!(
        matches!(e.kind(), ErrorKind::Locked { .. }),
        "second rw open: {e}"
    );
    assert!(e.to_string().contains(&c.device("b")), "{e}");
    let ro = open(&c, &c.device("b"), true).unwrap();
    let e = ro.write_at(&[0; 512], 0, false).unwrap_err();
    assert!(matches!(
        backend::Error::kind_of(&e),
        Some(ErrorKind::ReadOnly)
    ));
    drop(ro);

    // Snapshot: read-only, keeps its data after the image changes.
    c.rbd(&["snap", "create", &c.image("b@s")]);
    b.write_at(&[0x11; 4096], 0, false).unwrap();
    let s = open(&c, &c.device("b@s"), true).unwrap();
    let mut first = vec![0u8; 4096];
    s.read_at(&mut first, 0).unwrap();
    assert_eq!(first, model[..4096]);
    let e = open(&c, &c.device("b@s"), false).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::ReadOnly), "{e}");
    drop(s);

    // `rbd resize` of the open image (librbd hands it to the lock owner,
    // this process): the size holds until refresh_size re-reads it.
    c.rbd(&["resize", "--size", "20M", &c.image("b")]);
    assert_eq!(b.size(), 16 * MIB as u64);
    assert_eq!(b.refresh_size().unwrap(), 20 * MIB as u64);
    assert_eq!(b.size(), 20 * MIB as u64);
    let end = 20 * MIB as u64 - 4096;
    b.write_at(&[0x22; 4096], end, false).unwrap();
    let mut tail = vec![0u8; 4096];
    b.read_at(&mut tail, end).unwrap();
    assert!(tail.iter().all(|&x| x == 0x22));
    drop(b);
    // The lock went with the first client.
    drop(open(&c, &c.device("b"), false).unwrap());

    // No exclusive-lock feature: read-write refused, read-only fine.
    c.rbd(&[
        "create",
        "--size",
        "1M",
        "--image-feature",
        "layering",
        &c.image("nolock"),
    ]);
    let e = open(&c, &c.device("nolock"), false).unwrap_err();
    assert!(e.to_string().contains("exclusive-lock"), "{e}");
    open(&c, &c.device("nolock"), true).unwrap();

    // Missing image, too small.
    let e = open(&c, &c.device("none"), true).unwrap_err();
    assert!(e.to_string().contains(&c.device("none")), "{e}");
    let spec = RbdSpec::parse(&c.device("nolock")).unwrap().unwrap();
    let opts = RbdOptions {
        read_only: true,
        allow_discard: false,
        min_size: 2 * MIB as u64,
    };
    let e = RbdBackend::open_with(&spec, &opts, &cfg(&c)).unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::TooSmall { .. }), "{e}");
}
