//! The kernel's FUSE-over-io_uring UAPI and the FUSE messages the ring
//! carries for this export, declared by hand from
//! `include/uapi/linux/fuse.h` (Linux 6.14+) and
//! `Documentation/filesystems/fuse-io-uring.rst`: the `libc` crate has no
//! FUSE types, fuser keeps its ABI module private and knows only the INIT
//! flag of the ring protocol, and a bindgen build step for a few dozen
//! fixed fields would cost more than it checks. Every field is read and
//! written as a native-endian integer at its offset in the kernel's
//! `struct`, so this module needs no `unsafe`.

#![deny(unsafe_code)]

use std::time::{SystemTime, UNIX_EPOCH};

use fuser::{FileAttr, FileType};

/// `FUSE_IO_URING_CMD_REGISTER`: hand the kernel an entry's buffers.
pub(crate) const CMD_REGISTER: u32 = 1;
/// `FUSE_IO_URING_CMD_COMMIT_AND_FETCH`: answer a request, take the next.
pub(crate) const CMD_COMMIT_AND_FETCH: u32 = 2;

/// `sizeof(struct fuse_uring_req_header)`: `in_out[128]`, `op_in[128]`,
/// `struct fuse_uring_ent_in_out` (32 bytes).
pub(crate) const HEADER_LEN: usize = 288;
/// `fuse_uring_req_header::op_in`: the request's first argument.
pub(crate) const OP_IN: usize = 128;
const OP_IN_LEN: usize = 128;
/// `fuse_uring_req_header::ring_ent_in_out`.
const ENT_IN_OUT: usize = 256;
/// The kernel's `FUSE_MIN_READ_BUFFER`: no payload buffer is smaller.
pub(crate) const MIN_PAYLOAD: usize = 8192;

// Opcodes (`enum fuse_opcode`) the export answers over the ring.
pub(crate) const LOOKUP: u32 = 1;
pub(crate) const GETATTR: u32 = 3;
pub(crate) const SETATTR: u32 = 4;
pub(crate) const OPEN: u32 = 14;
pub(crate) const READ: u32 = 15;
pub(crate) const WRITE: u32 = 16;
pub(crate) const STATFS: u32 = 17;
pub(crate) const RELEASE: u32 = 18;
pub(crate) const FSYNC: u32 = 20;
pub(crate) const FLUSH: u32 = 25;
pub(crate) const OPENDIR: u32 = 27;
pub(crate) const READDIR: u32 = 28;
pub(crate) const RELEASEDIR: u32 = 29;
pub(crate) const FSYNCDIR: u32 = 30;
pub(crate) const ACCESS: u32 = 34;
pub(crate) const FALLOCATE: u32 = 43;

/// `FATTR_SIZE` in `fuse_setattr_in::valid`.
const FATTR_SIZE: u32 = 1 << 3;
/// `FOPEN_DIRECT_IO` in `fuse_open_out::open_flags`.
const FOPEN_DIRECT_IO: u32 = 1;

#[cfg(test)]
fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().unwrap_or([0; 4]))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().unwrap_or([0; 8]))
}
fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_ne_bytes());
}
fn put64(b: &mut [u8], at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_ne_bytes());
}

/// `struct fuse_uring_cmd_req` in the SQE's 80-byte command area.
pub(crate) fn cmd_req(commit_id: u64, qid: u16) -> [u8; 80] {
    let mut c = [0u8; 80];
    // flags (u64) stays 0.
    put64(&mut c, 8, commit_id);
    c[16..18].copy_from_slice(&qid.to_ne_bytes());
    c
}

/// What the kernel wrote into an entry's header: `fuse_in_header` and
/// `fuse_uring_ent_in_out`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct InHeader {
    pub(crate) opcode: u32,
    pub(crate) unique: u64,
    pub(crate) nodeid: u64,
    pub(crate) uid: u32,
    pub(crate) commit_id: u64,
    pub(crate) payload_sz: usize,
}

impl InHeader {
    pub(crate) fn parse(h: &[u8]) -> Self {
        // fuse_in_header: len u32, opcode u32, unique u64, nodeid u64,
        // uid u32, gid u32, pid u32, total_extlen u16, padding u16.
        Self {
            opcode: u32_at(h, 4),
            unique: u64_at(h, 8),
            nodeid: u64_at(h, 16),
            uid: u32_at(h, 24),
            commit_id: u64_at(h, ENT_IN_OUT + 8),
            payload_sz: u32_at(h, ENT_IN_OUT + 16) as usize,
        }
    }
}

/// The request's first argument (`op_in`).
pub(crate) fn op_in(h: &[u8]) -> &[u8] {
    &h[OP_IN..OP_IN + OP_IN_LEN]
}

/// Writes the answer's `fuse_out_header` and payload size.
pub(crate) fn set_out_header(h: &mut [u8], unique: u64, error: i32, payload_sz: usize) {
    h[..16].fill(0);
    put32(h, 0, (16 + payload_sz) as u32);
    put32(h, 4, error as u32);
    put64(h, 8, unique);
    put64(h, ENT_IN_OUT, 0);
    put32(h, ENT_IN_OUT + 16, payload_sz as u32);
}

/// `fuse_read_in` (also READDIR's): `(offset, size)`.
pub(crate) fn read_in(op: &[u8]) -> (u64, u32) {
    (u64_at(op, 8), u32_at(op, 16))
}

/// `fuse_write_in`: `(offset, size, open flags)`.
pub(crate) fn write_in(op: &[u8]) -> (u64, u32, i32) {
    (u64_at(op, 8), u32_at(op, 16), u32_at(op, 32) as i32)
}

/// `fuse_open_in::flags`.
pub(crate) fn open_in(op: &[u8]) -> i32 {
    u32_at(op, 0) as i32
}

/// `fuse_setattr_in`: the new size, if one is set.
pub(crate) fn setattr_in(op: &[u8]) -> Option<u64> {
    (u32_at(op, 0) & FATTR_SIZE != 0).then(|| u64_at(op, 16))
}

/// `fuse_fallocate_in`: `(offset, length, mode)`.
pub(crate) fn fallocate_in(op: &[u8]) -> (u64, u64, i32) {
    (u64_at(op, 8), u64_at(op, 16), u32_at(op, 24) as i32)
}

fn time(t: SystemTime) -> (u64, u32) {
    t.duration_since(UNIX_EPOCH)
        .map(|d| (d.as_secs(), d.subsec_nanos()))
        .unwrap_or((0, 0))
}

fn mode(kind: FileType) -> u32 {
    match kind {
        FileType::Directory => libc::S_IFDIR,
        _ => libc::S_IFREG,
    }
}

/// `struct fuse_attr` (88 bytes).
fn attr(a: &FileAttr) -> [u8; 88] {
    let mut b = [0u8; 88];
    let (at, atn) = time(a.atime);
    let (mt, mtn) = time(a.mtime);
    let (ct, ctn) = time(a.ctime);
    put64(&mut b, 0, a.ino.0);
    put64(&mut b, 8, a.size);
    put64(&mut b, 16, a.blocks);
    put64(&mut b, 24, at);
    put64(&mut b, 32, mt);
    put64(&mut b, 40, ct);
    put32(&mut b, 48, atn);
    put32(&mut b, 52, mtn);
    put32(&mut b, 56, ctn);
    put32(&mut b, 60, mode(a.kind) | u32::from(a.perm));
    put32(&mut b, 64, a.nlink);
    put32(&mut b, 68, a.uid);
    put32(&mut b, 72, a.gid);
    put32(&mut b, 76, a.rdev);
    put32(&mut b, 80, a.blksize);
    put32(&mut b, 84, a.flags);
    b
}

/// `struct fuse_entry_out` (128 bytes).
pub(crate) fn entry_out(a: &FileAttr, ttl: std::time::Duration) -> Vec<u8> {
    let mut b = vec![0u8; 128];
    put64(&mut b, 0, a.ino.0);
    // generation 0
    put64(&mut b, 16, ttl.as_secs());
    put64(&mut b, 24, ttl.as_secs());
    put32(&mut b, 32, ttl.subsec_nanos());
    put32(&mut b, 36, ttl.subsec_nanos());
    b[40..].copy_from_slice(&attr(a));
    b
}

/// `struct fuse_attr_out` (104 bytes).
pub(crate) fn attr_out(a: &FileAttr, ttl: std::time::Duration) -> Vec<u8> {
    let mut b = vec![0u8; 104];
    put64(&mut b, 0, ttl.as_secs());
    put32(&mut b, 8, ttl.subsec_nanos());
    b[16..].copy_from_slice(&attr(a));
    b
}

/// `struct fuse_open_out` (16 bytes), file handle 0.
pub(crate) fn open_out(direct_io: bool) -> Vec<u8> {
    let mut b = vec![0u8; 16];
    put32(&mut b, 8, if direct_io { FOPEN_DIRECT_IO } else { 0 });
    b
}

/// `struct fuse_write_out` (8 bytes).
pub(crate) fn write_out(size: u32) -> Vec<u8> {
    let mut b = vec![0u8; 8];
    put32(&mut b, 0, size);
    b
}

/// `struct fuse_statfs_out` (80 bytes): no free space, as a full device.
pub(crate) fn statfs_out(blocks: u64, files: u64, bsize: u32, namelen: u32) -> Vec<u8> {
    let mut b = vec![0u8; 80];
    put64(&mut b, 0, blocks);
    put64(&mut b, 24, files);
    put32(&mut b, 40, bsize);
    put32(&mut b, 44, namelen);
    put32(&mut b, 48, bsize);
    b
}

/// Appends one `struct fuse_dirent` (padded to 8 bytes) if it fits in
/// `max` bytes; `false` when it does not.
pub(crate) fn push_dirent(
    out: &mut Vec<u8>,
    max: usize,
    ino: u64,
    next: u64,
    kind: FileType,
    name: &[u8],
) -> bool {
    let len = (24 + name.len()).next_multiple_of(8);
    if out.len() + len > max {
        return false;
    }
    let at = out.len();
    out.resize(at + len, 0);
    put64(out, at, ino);
    put64(out, at + 8, next);
    put32(out, at + 16, name.len() as u32);
    put32(out, at + 20, mode(kind) >> 12);
    out[at + 24..at + 24 + name.len()].copy_from_slice(name);
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_sit_where_the_kernel_puts_them() {
        let mut h = vec![0u8; HEADER_LEN];
        put32(&mut h, 4, WRITE);
        put64(&mut h, 8, 77);
        put64(&mut h, 16, 2);
        put32(&mut h, 24, 1000);
        put64(&mut h, ENT_IN_OUT + 8, 77);
        put32(&mut h, ENT_IN_OUT + 16, 4096);
        put64(&mut h, OP_IN + 8, 8192);
        put32(&mut h, OP_IN + 16, 4096);
        put32(&mut h, OP_IN + 32, libc::O_SYNC as u32);
        let i = InHeader::parse(&h);
        assert_eq!(
            (
                i.opcode,
                i.unique,
                i.nodeid,
                i.uid,
                i.commit_id,
                i.payload_sz
            ),
            (WRITE, 77, 2, 1000, 77, 4096)
        );
        assert_eq!(write_in(op_in(&h)), (8192, 4096, libc::O_SYNC));
        set_out_header(&mut h, 77, -libc::EIO, 8);
        assert_eq!(u32_at(&h, 0), 24);
        assert_eq!(u32_at(&h, 4) as i32, -libc::EIO);
        assert_eq!(u64_at(&h, 8), 77);
        assert_eq!(u32_at(&h, ENT_IN_OUT + 16), 8);
        let c = cmd_req(77, 1);
        assert_eq!((u64_at(&c, 8), u16_at(&c, 16)), (77, 1));
    }

    #[test]
    fn dirents_are_padded_and_bounded() {
        let mut out = Vec::new();
        assert!(push_dirent(&mut out, 64, 1, 1, FileType::Directory, b"."));
        assert_eq!(out.len(), 32);
        assert_eq!(u32_at(&out, 20), libc::DT_DIR as u32);
        assert!(!push_dirent(
            &mut out,
            56,
            2,
            2,
            FileType::RegularFile,
            b"disk.img"
        ));
        assert!(push_dirent(&mut out, 64, 2, 2, FileType::RegularFile, b"d"));
        assert_eq!(u32_at(&out, 52), libc::DT_REG as u32);
    }
}
