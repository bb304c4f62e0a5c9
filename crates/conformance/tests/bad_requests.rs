//! The same bad requests through every frontend that can run here, one
//! table: each row is a request the engine must refuse, with the errno the
//! engine's one table (`datapath::Error::errno`) gives it. Every frontend
//! must answer it the same way:
//!
//! * NBD, in process over a unix socket with a raw client: the row's errno
//!   in the protocol's vocabulary (`datapath::nbd_error_of`);
//! * ublk, through its translation (`ublk::translate`, the engine, then
//!   `ublk::completion_result`): `-errno`;
//! * vhost-user-blk, through libblkio's `virtio-blk-vhost-user` client
//!   (the one `crates/vhost/tests/blkio.rs` uses): the row's errno as a
//!   virtio-blk status (`vhost_blk::request::status_of`: "not
//!   supported" is `VIRTIO_BLK_S_UNSUPP`, which libblkio completes with
//!   `-ENOTSUP`; anything else `VIRTIO_BLK_S_IOERR`, `-EIO`), except where
//!   libblkio answers before the request leaves the client (a read-only
//!   device takes only a read-only client, which refuses writes itself; a
//!   feature the device does not offer); those rows say what it answers
//!   and why;
//! * FUSE, the export mounted and the file driven with pread / pwrite /
//!   fallocate: the errno, except where file semantics answer before the
//!   engine sees the request (EOF past the end, widened unaligned IO, the
//!   kernel splitting large reads); those rows say what the file answers
//!   and why.
//!
//! FUSE needs a usable `/dev/fuse`; without one the FUSE column goes
//! through `testutil::skip_or_fail` and the other two still run.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::mem::MaybeUninit;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use backend::MemBackend;
use blkio::{Blkio, Blkioq, MemoryRegion, ReqFlags};
use datapath::{Engine, EngineConfig, Volume, MAX_REQUEST_BYTES};
use fuse::{Export, ExportConfig};
use libublk::sys;
use nbd::proto::{self, RequestHeader};
use nix::fcntl::{fallocate, FallocateFlags};

const SIZE: u64 = 1 << 20;
/// The volume's sector size: 4 KiB, so a 512-byte-aligned request (all a
/// ublk descriptor can express) can still be misaligned.
const SS: u64 = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    Discard,
    WriteZeroes,
}

/// How libblkio's vhost-user-blk client answers a row.
#[derive(Debug, Clone, Copy)]
enum OnVhost {
    /// The device's status for the row's errno, as every frontend.
    Status,
    /// The client answers first with this (negative errno or 0); the text
    /// says why.
    Client(i32, &'static str),
}

/// How the FUSE file answers a row.
#[derive(Debug, Clone, Copy)]
enum OnFuse {
    /// The row's errno, as every frontend.
    Errno,
    /// File semantics answer first: the call succeeds with this many bytes
    /// (0 = end of file); the text says why.
    Bytes(usize, &'static str),
}

struct Case {
    name: &'static str,
    read_only: bool,
    allow_discards: bool,
    kind: Kind,
    offset: u64,
    len: u64,
    fua: bool,
    /// The errno of the engine's table.
    errno: i32,
    vhost: OnVhost,
    fuse: OnFuse,
}

const fn case(name: &'static str, kind: Kind, offset: u64, len: u64, errno: i32) -> Case {
    Case {
        name,
        read_only: false,
        allow_discards: true,
        kind,
        offset,
        len,
        fua: false,
        errno,
        vhost: OnVhost::Status,
        fuse: OnFuse::Errno,
    }
}

fn table() -> Vec<Case> {
    use Kind::*;
    vec![
        Case {
            fuse: OnFuse::Bytes(0, "a read at the end of a file is EOF"),
            ..case("read past the end", Read, SIZE, SS, libc::EINVAL)
        },
        case("write past the end", Write, SIZE, SS, libc::ENOSPC),
        case("zeroes past the end", WriteZeroes, SIZE, SS, libc::ENOSPC),
        case("discard past the end", Discard, SIZE, SS, libc::EINVAL),
        Case {
            fuse: OnFuse::Bytes(SS as usize, "unaligned file IO is widened"),
            ..case("misaligned read", Read, 512, SS, libc::EINVAL)
        },
        Case {
            fuse: OnFuse::Bytes(SS as usize, "unaligned file IO is read-modify-written"),
            ..case("misaligned write", Write, 512, SS, libc::EINVAL)
        },
        Case {
            fuse: OnFuse::Bytes(
                SIZE as usize,
                "the kernel splits a large read, which then stops at the end of the file",
            ),
            ..case(
                "read over the limit",
                Read,
                0,
                MAX_REQUEST_BYTES + SS,
                libc::EINVAL,
            )
        },
        Case {
            fua: true,
            vhost: OnVhost::Client(-libc::EINVAL, "libblkio refuses FUA on a read itself"),
            fuse: OnFuse::Bytes(SS as usize, "a file read has no FUA to ask for"),
            ..case("FUA on a read", Read, 0, SS, libc::EINVAL)
        },
        Case {
            read_only: true,
            vhost: OnVhost::Client(
                -libc::EBADF,
                "a read-only device takes only a read-only client, which refuses writes",
            ),
            ..case("write to read-only", Write, 0, SS, libc::EROFS)
        },
        Case {
            read_only: true,
            vhost: OnVhost::Client(
                -libc::ENOTSUP,
                "a read-only device offers neither discard nor write zeroes",
            ),
            ..case("zeroes to read-only", WriteZeroes, 0, SS, libc::EROFS)
        },
        Case {
            read_only: true,
            vhost: OnVhost::Client(
                -libc::ENOTSUP,
                "a read-only device offers neither discard nor write zeroes",
            ),
            ..case("discard on read-only", Discard, 0, SS, libc::EROFS)
        },
        Case {
            allow_discards: false,
            vhost: OnVhost::Client(-libc::ENOTSUP, "the device does not offer discard"),
            ..case("discard when disabled", Discard, 0, SS, libc::EOPNOTSUPP)
        },
    ]
}

/// One engine with its NBD server and (when possible) FUSE export, for one
/// (read_only, allow_discards) configuration.
struct Frontends {
    engine: Arc<Engine>,
    nbd: Option<nbd::Server>,
    socket: PathBuf,
    vhost: Option<vhost_blk::Server>,
    fuse: Option<Export>,
    _dir: testutil::TempDir,
}

impl Frontends {
    fn new(read_only: bool, allow_discards: bool, with_fuse: bool) -> Self {
        let dir = testutil::TempDir::new("bad-requests");
        let vol = Volume {
            backend: Arc::new(MemBackend::new(SIZE).expect("mem backend")),
            crypt: None,
            data_offset: 0,
            size: SIZE,
            sector_size: SS as u32,
        };
        let cfg = EngineConfig {
            read_only,
            allow_discards,
            ..EngineConfig::default()
        };
        let engine = Arc::new(Engine::new(vol, cfg).expect("engine"));
        let socket = dir.join("nbd.sock");
        let export = nbd::ExportConfig {
            name: "t".into(),
            description: "bad requests".into(),
        };
        let server =
            nbd::Server::start(engine.clone(), export, nbd::Endpoint::Unix(socket.clone()))
                .expect("nbd server");
        let opts = vhost_blk::Options::new(dir.join("vhost.sock"));
        let vhost = vhost_blk::Server::start(engine.clone(), &opts).expect("vhost server");
        let fuse = with_fuse.then(|| {
            let cfg = ExportConfig {
                file_name: "disk".into(),
                threads: 1,
                uring: fuse::UringMode::Auto,
            };
            std::fs::create_dir(dir.join("mnt")).expect("mountpoint");
            Export::mount(engine.clone(), &dir.join("mnt"), cfg).expect("mount FUSE export")
        });
        Self {
            engine,
            nbd: Some(server),
            socket,
            vhost: Some(vhost),
            fuse,
            _dir: dir,
        }
    }
}

impl Drop for Frontends {
    fn drop(&mut self) {
        if let Some(mut f) = self.fuse.take() {
            let _ = f.unmount();
        }
        if let Some(s) = self.nbd.take() {
            s.shutdown();
        }
        drop(self.vhost.take());
    }
}

/// Connects and negotiates with `NBD_OPT_EXPORT_NAME` on the default export.
fn nbd_client(socket: &Path) -> UnixStream {
    let mut s = UnixStream::connect(socket).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut hello = [0u8; 18];
    s.read_exact(&mut hello).unwrap();
    assert_eq!(&hello[..8], b"NBDMAGIC");
    s.write_all(&(proto::FLAG_C_FIXED_NEWSTYLE | proto::FLAG_C_NO_ZEROES).to_be_bytes())
        .unwrap();
    let mut opt = proto::IHAVEOPT.to_be_bytes().to_vec();
    opt.extend_from_slice(&proto::OPT_EXPORT_NAME.to_be_bytes());
    opt.extend_from_slice(&0u32.to_be_bytes());
    s.write_all(&opt).unwrap();
    let mut export = [0u8; 10];
    s.read_exact(&mut export).unwrap();
    assert_eq!(u64::from_be_bytes(export[..8].try_into().unwrap()), SIZE);
    s
}

/// Sends the row as an NBD request; returns the reply's error code.
fn via_nbd(s: &mut UnixStream, c: &Case, cookie: u64) -> u32 {
    let kind = match c.kind {
        Kind::Read => proto::CMD_READ,
        Kind::Write => proto::CMD_WRITE,
        Kind::Discard => proto::CMD_TRIM,
        Kind::WriteZeroes => proto::CMD_WRITE_ZEROES,
    };
    let h = RequestHeader {
        flags: if c.fua { proto::CMD_FLAG_FUA } else { 0 },
        kind,
        cookie,
        offset: c.offset,
        len: u32::try_from(c.len).unwrap(),
    };
    s.write_all(&h.encode()).unwrap();
    if c.kind == Kind::Write {
        s.write_all(&vec![0xa5; c.len as usize]).unwrap();
    }
    let mut r = [0u8; 16];
    s.read_exact(&mut r).unwrap();
    assert_eq!(
        u32::from_be_bytes(r[..4].try_into().unwrap()),
        proto::SIMPLE_REPLY_MAGIC
    );
    assert_eq!(u64::from_be_bytes(r[8..].try_into().unwrap()), cookie);
    let error = u32::from_be_bytes(r[4..8].try_into().unwrap());
    if error == 0 && c.kind == Kind::Read {
        // Keep the stream in step for the next row.
        let mut data = vec![0u8; c.len as usize];
        s.read_exact(&mut data).unwrap();
    }
    error
}

/// A libblkio vhost-user-blk client with one queue and a buffer region
/// that takes the largest row.
struct VhostClient {
    queue: Blkioq,
    region: MemoryRegion,
    _b: Blkio,
}

impl VhostClient {
    fn connect(server: &vhost_blk::Server, read_only: bool) -> Self {
        let mut b = Blkio::new("virtio-blk-vhost-user").expect("blkio");
        b.set_str("path", server.socket().to_str().unwrap())
            .unwrap();
        b.set_bool("read-only", read_only).unwrap();
        b.connect().expect("vhost-user connect");
        b.set_i32("num-queues", 1).unwrap();
        let mut out = b.start().expect("blkio start");
        let region = b
            .alloc_mem_region((MAX_REQUEST_BYTES + SS) as usize)
            .expect("blkio region");
        b.map_mem_region(&region).expect("map region");
        Self {
            queue: out.queues.remove(0),
            region,
            _b: b,
        }
    }
}

/// Sends the row through libblkio; returns the completion's value.
fn via_vhost(c: &mut VhostClient, row: &Case) -> i32 {
    let p = c.region.addr as *mut u8;
    let len = row.len as usize;
    let flags = if row.fua {
        ReqFlags::FUA
    } else {
        ReqFlags::empty()
    };
    let q = &mut c.queue;
    match row.kind {
        Kind::Read => q.read(row.offset, p, len, 0, flags),
        Kind::Write => q.write(row.offset, p, len, 0, flags),
        Kind::Discard => q.discard(row.offset, row.len, 0, flags),
        Kind::WriteZeroes => q.write_zeroes(row.offset, row.len, 0, flags),
    }
    let mut comps = [MaybeUninit::uninit()];
    let n = q.do_io(&mut comps, 1, None, None).expect("blkio do_io");
    assert_eq!(n, 1);
    // SAFETY: do_io initialised the first `n` completions.
    unsafe { comps[0].assume_init_ref() }.ret
}

/// Runs the row through ublk's translation and the engine; returns the
/// value the command would complete with.
fn via_ublk(engine: &Engine, c: &Case) -> i32 {
    let op = match c.kind {
        Kind::Read => sys::UBLK_IO_OP_READ,
        Kind::Write => sys::UBLK_IO_OP_WRITE,
        Kind::Discard => sys::UBLK_IO_OP_DISCARD,
        Kind::WriteZeroes => sys::UBLK_IO_OP_WRITE_ZEROES,
    };
    let fua = if c.fua { sys::UBLK_IO_F_FUA } else { 0 };
    let desc = ublk::IoDesc {
        op_flags: op | fua,
        nr_sectors: u32::try_from(c.len / 512).unwrap(),
        start_sector: c.offset / 512,
    };
    // The tag buffer: big enough that only the engine can refuse the size.
    let buf = vec![0xa5u8; c.len as usize];
    let req = match ublk::translate(&desc, &buf) {
        Ok(r) => r,
        Err(errno) => return -errno,
    };
    let (tx, rx) = mpsc::channel();
    engine.submit(req, move |res| drop(tx.send(res)));
    let res = rx
        .recv_timeout(Duration::from_secs(20))
        .expect("completion");
    ublk::completion_result(desc.nr_sectors * 512, &res)
}

/// Drives the row through the mounted file: `Ok(bytes)` or `Err(errno)`.
fn via_fuse(file: &Path, c: &Case) -> Result<usize, i32> {
    let errno = |e: std::io::Error| e.raw_os_error().unwrap_or(0);
    let f: File = OpenOptions::new()
        .read(true)
        .write(c.kind != Kind::Read)
        .custom_flags(if c.fua { libc::O_DSYNC } else { 0 })
        .open(file)
        .map_err(errno)?;
    let keep = FallocateFlags::FALLOC_FL_KEEP_SIZE;
    let (off, len) = (c.offset as libc::off_t, c.len as libc::off_t);
    match c.kind {
        Kind::Read => {
            let mut buf = vec![0u8; c.len as usize];
            let mut got = 0;
            // Read until EOF or the full length, as a reader of the file would.
            while got < buf.len() {
                match f.read_at(&mut buf[got..], c.offset + got as u64) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) => return Err(errno(e)),
                }
            }
            Ok(got)
        }
        Kind::Write => f
            .write_at(&vec![0xa5; c.len as usize], c.offset)
            .map_err(errno),
        Kind::Discard => fallocate(&f, keep | FallocateFlags::FALLOC_FL_PUNCH_HOLE, off, len)
            .map(|()| c.len as usize)
            .map_err(|e| e as i32),
        Kind::WriteZeroes => fallocate(&f, keep | FallocateFlags::FALLOC_FL_ZERO_RANGE, off, len)
            .map(|()| c.len as usize)
            .map_err(|e| e as i32),
    }
}

/// True when this process can open `/dev/fuse`; otherwise reports the skip.
fn fuse_usable(test: &str) -> bool {
    let ok = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .is_ok()
        && testutil::which("fusermount3").is_some();
    ok || testutil::skip_or_fail(test, "/dev/fuse cannot be opened or fusermount3 is missing")
}

#[test]
fn every_frontend_answers_bad_requests_alike() {
    const T: &str = "every_frontend_answers_bad_requests_alike";
    let with_fuse = fuse_usable(T);
    let table = table();
    let mut failures = Vec::new();
    let mut ran = 0;
    let mut cookie = 0;
    for config in [(false, true), (true, true), (false, false)] {
        let fe = Frontends::new(config.0, config.1, with_fuse);
        let mut s = nbd_client(&fe.socket);
        let mut vc = VhostClient::connect(fe.vhost.as_ref().unwrap(), config.0);
        for c in table
            .iter()
            .filter(|c| (c.read_only, c.allow_discards) == config)
        {
            ran += 1;
            cookie += 1;
            let want = datapath::nbd_error_of(c.errno);
            let got = via_nbd(&mut s, c, cookie);
            if got != want {
                failures.push(format!("{}: NBD answered {got}, not {want}", c.name));
            }
            let got = via_ublk(&fe.engine, c);
            if got != -c.errno {
                failures.push(format!(
                    "{}: ublk completes with {got}, not {}",
                    c.name, -c.errno
                ));
            }
            let (want, why) = match c.vhost {
                OnVhost::Status if c.errno == libc::EOPNOTSUPP => {
                    (-libc::ENOTSUP, "VIRTIO_BLK_S_UNSUPP")
                }
                OnVhost::Status => (-libc::EIO, "VIRTIO_BLK_S_IOERR"),
                OnVhost::Client(ret, why) => (ret, why),
            };
            let got = via_vhost(&mut vc, c);
            if got != want {
                failures.push(format!(
                    "{}: vhost-user-blk completes with {got}, not {want} ({why})",
                    c.name
                ));
            }
            if let Some(export) = &fe.fuse {
                let want = match c.fuse {
                    OnFuse::Errno => Err(c.errno),
                    OnFuse::Bytes(n, _) => Ok(n),
                };
                let got = via_fuse(export.file(), c);
                if got != want {
                    let why = match c.fuse {
                        OnFuse::Bytes(_, why) => why,
                        OnFuse::Errno => "the engine's errno",
                    };
                    failures.push(format!(
                        "{}: FUSE answered {got:?}, not {want:?} ({why})",
                        c.name
                    ));
                }
            }
        }
    }
    assert_eq!(ran, table.len(), "a row's configuration is not run");
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
