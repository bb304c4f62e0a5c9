//! One virtio-blk request: a descriptor chain from the guest becomes an
//! engine [`Request`] (or an immediate answer), and a [`Completion`]
//! becomes the status byte and the data written back.
//!
//! Every guest address is checked against the regions the frontend shared
//! before anything is read or written, and all guest memory is accessed
//! through vm-memory's bounds-checked calls: a hostile chain gets
//! `VIRTIO_BLK_S_IOERR` (or no status at all when it has no writable byte
//! to put one in), never an access outside guest memory.
//!
//! Parsing allocates nothing for a request's payload: a write is copied
//! out of guest memory only by [`Parsed::load`], which the queue thread
//! calls once the request's [`Parsed::payload`] fits in the server's
//! in-flight cap ([`MAX_INFLIGHT_BYTES`]). A guest that queues many
//! maximum-size chains makes the daemon hold at most that much (plus the
//! buffer pool's), not one payload per chain.

use datapath::{Completion, Op, Request, MAX_REQUEST_BYTES};
use virtio_bindings::virtio_blk::{
    VIRTIO_BLK_ID_BYTES, VIRTIO_BLK_S_IOERR, VIRTIO_BLK_S_OK, VIRTIO_BLK_S_UNSUPP,
    VIRTIO_BLK_T_DISCARD, VIRTIO_BLK_T_FLUSH, VIRTIO_BLK_T_GET_ID, VIRTIO_BLK_T_IN,
    VIRTIO_BLK_T_OUT, VIRTIO_BLK_T_WRITE_ZEROES, VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP,
};
use virtio_queue::DescriptorChain;
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, GuestMemoryBackend, GuestMemoryMmap};

/// Guest memory as the protocol crates map it (no dirty bitmap).
pub type Mem = GuestMemoryMmap<()>;

/// `struct virtio_blk_outhdr`: type, reserved, sector.
pub const HEADER_LEN: usize = 16;

/// Payload bytes (read buffers and write payloads) the requests of a
/// server's connection may hold at once. Beyond it the queue threads stop
/// starting chains until completions give room back, as NBD stops reading
/// a connection past `nbd::Limits::max_inflight_bytes` (32 MiB there, per
/// connection of up to 16; one hypervisor connection here, with several
/// queues). 64 MiB: two maximum-size requests, or 1 MiB requests at a
/// queue depth of 64; a request larger than the cap runs alone.
pub const MAX_INFLIGHT_BYTES: u64 = 64 << 20;
/// `struct virtio_blk_discard_write_zeroes`: sector, num_sectors, flags.
const RANGE_LEN: usize = 16;

/// `VIRTIO_BLK_S_OK`.
pub const S_OK: u8 = VIRTIO_BLK_S_OK as u8;
/// `VIRTIO_BLK_S_IOERR`.
pub const S_IOERR: u8 = VIRTIO_BLK_S_IOERR as u8;
/// `VIRTIO_BLK_S_UNSUPP`.
pub const S_UNSUPP: u8 = VIRTIO_BLK_S_UNSUPP as u8;

/// A guest buffer: one descriptor's range, already checked to lie inside
/// guest memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seg {
    /// Guest physical address.
    pub addr: GuestAddress,
    /// Length in bytes.
    pub len: u32,
}

/// What kind of request a chain was (for the per-queue counters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `VIRTIO_BLK_T_IN`.
    Read,
    /// `VIRTIO_BLK_T_OUT`.
    Write,
    /// `VIRTIO_BLK_T_FLUSH`.
    Flush,
    /// `VIRTIO_BLK_T_GET_ID`.
    GetId,
    /// `VIRTIO_BLK_T_DISCARD`.
    Discard,
    /// `VIRTIO_BLK_T_WRITE_ZEROES`.
    WriteZeroes,
    /// A request type this device does not implement.
    Unsupported,
    /// A chain that breaks the virtio-blk rules (outside guest memory, no
    /// room for header or status, readable after writable, too long).
    Malformed,
}

/// What to do with a parsed chain.
#[derive(Debug)]
pub enum Action {
    /// Submit this request to the engine.
    Engine(Request),
    /// A write whose `len` payload bytes are still in guest memory (after
    /// the header, in [`Parsed::input`]): [`Parsed::load`] copies them
    /// and makes this an [`Action::Engine`].
    Write {
        /// Byte offset on the device.
        offset: u64,
        /// Payload length.
        len: u64,
        /// Write-through cache: the write is FUA.
        fua: bool,
    },
    /// Answer at once with this status and data (GET_ID, refusals).
    Reply(u8, Vec<u8>),
}

/// A parsed chain: where its answer goes and what to do.
#[derive(Debug)]
pub struct Parsed {
    /// The chain's head index (what goes into the used ring).
    pub head: u16,
    /// Request type, for counters.
    pub kind: Kind,
    /// The status byte's address; `None` when the chain has no writable
    /// byte (the request is returned unanswered with used length 0).
    pub status: Option<GuestAddress>,
    /// Device-writable data buffers (reads and GET_ID land here).
    pub out: Vec<Seg>,
    /// Device-readable buffers, header included (a write's payload comes
    /// from here); empty unless the action is [`Action::Write`].
    pub input: Vec<Seg>,
    /// What to do.
    pub action: Action,
}

impl Parsed {
    /// Payload bytes the request makes the device hold until it completes:
    /// a read's buffer or a write's data; 0 for the rest.
    pub fn payload(&self) -> u64 {
        match &self.action {
            Action::Write { len, .. } => *len,
            Action::Engine(Request {
                op: Op::Read { len },
                ..
            }) => u64::from(*len),
            Action::Engine(Request {
                op: Op::Write { data },
                ..
            }) => data.len() as u64,
            _ => 0,
        }
    }

    /// Copies an [`Action::Write`]'s payload out of guest memory (into a
    /// pooled buffer) and makes it an [`Action::Engine`]; a copy guest
    /// memory refuses becomes an IOERR reply. Call it once the request's
    /// [`Parsed::payload`] has been admitted; other actions are left as
    /// they are.
    pub fn load(&mut self, mem: &Mem) {
        let Action::Write { offset, len, fua } = self.action else {
            return;
        };
        let input = std::mem::take(&mut self.input);
        // A pooled buffer: `gather` overwrites all of it or fails (then
        // it is dropped, never submitted).
        let mut data = datapath::bufpool::take(len as usize);
        self.action = if gather(mem, &input, HEADER_LEN, &mut data) {
            Action::Engine(Request {
                op: Op::Write { data },
                offset,
                fua,
            })
        } else {
            Action::Reply(S_IOERR, Vec::new())
        };
    }
}

/// Per-device facts a request needs.
#[derive(Debug, Clone, Copy)]
pub struct Ctx {
    /// GET_ID answer (NUL-padded).
    pub serial: [u8; VIRTIO_BLK_ID_BYTES as usize],
    /// Cache in write-through mode (`wce` = 0): every write is FUA.
    pub write_through: bool,
}

/// A chain's segments ([`segments`]).
struct Segments {
    readable: Vec<Seg>,
    writable: Vec<Seg>,
    /// Longer than the largest request: answered IOERR (the status byte
    /// is still found, so the guest is told instead of left with
    /// a buffer it takes for data).
    too_long: bool,
}

/// Splits a chain into its readable and writable segments, each checked
/// against guest memory. `Err` names the first rule broken that leaves no
/// trustworthy status byte. The walk is bounded by the queue size
/// (virtio-queue's iterator stops there).
fn segments<M>(chain: DescriptorChain<M>, mem: &Mem) -> Result<Segments, &'static str>
where
    M: std::ops::Deref,
    M::Target: GuestMemory,
{
    let mut readable = Vec::new();
    let mut writable: Vec<Seg> = Vec::new();
    let mut total: u64 = 0;
    let mut too_long = false;
    for d in chain {
        let seg = Seg {
            addr: d.addr(),
            len: d.len(),
        };
        if !GuestMemoryBackend::check_range(mem, seg.addr, seg.len as usize) {
            return Err("descriptor outside guest memory");
        }
        total += u64::from(seg.len);
        too_long |= total > MAX_REQUEST_BYTES + 2 * RANGE_LEN as u64 + HEADER_LEN as u64 + 1;
        if d.is_write_only() {
            writable.push(seg);
        } else if !writable.is_empty() {
            return Err("device-readable descriptor after a writable one");
        } else {
            readable.push(seg);
        }
    }
    Ok(Segments {
        readable,
        writable,
        too_long,
    })
}

/// Copies `dst.len()` bytes starting `skip` bytes into `segs`.
fn gather(mem: &Mem, segs: &[Seg], mut skip: usize, dst: &mut [u8]) -> bool {
    let mut done = 0;
    for s in segs {
        let len = s.len as usize;
        if skip >= len {
            skip -= len;
            continue;
        }
        let n = (len - skip).min(dst.len() - done);
        let Some(addr) = s.addr.checked_add(skip as u64) else {
            return false;
        };
        if mem.read_slice(&mut dst[done..done + n], addr).is_err() {
            return false;
        }
        done += n;
        skip = 0;
        if done == dst.len() {
            return true;
        }
    }
    done == dst.len()
}

/// Copies `src` into `segs` from their start; false if it does not fit or
/// guest memory refused.
pub fn scatter(mem: &Mem, segs: &[Seg], src: &[u8]) -> bool {
    let mut done = 0;
    for s in segs {
        if done == src.len() {
            break;
        }
        let n = (s.len as usize).min(src.len() - done);
        if mem.write_slice(&src[done..done + n], s.addr).is_err() {
            return false;
        }
        done += n;
    }
    done == src.len()
}

fn len_of(segs: &[Seg]) -> u64 {
    segs.iter().map(|s| u64::from(s.len)).sum()
}

/// Parses one chain. Never fails: a broken chain becomes a
/// [`Kind::Malformed`] reply.
pub fn parse<M>(chain: DescriptorChain<M>, mem: &Mem, ctx: &Ctx) -> Parsed
where
    M: std::ops::Deref,
    M::Target: GuestMemory,
{
    let head = chain.head_index();
    let malformed = |status, out| Parsed {
        head,
        kind: Kind::Malformed,
        status,
        out,
        input: Vec::new(),
        action: Action::Reply(S_IOERR, Vec::new()),
    };
    let Segments {
        readable,
        mut writable,
        too_long,
    } = match segments(chain, mem) {
        Ok(s) => s,
        Err(_) => return malformed(None, Vec::new()),
    };
    // The status byte is the last writable byte.
    let status = match writable.last_mut() {
        Some(last) if last.len > 0 => {
            last.len -= 1;
            let addr = last.addr.unchecked_add(u64::from(last.len));
            if last.len == 0 {
                writable.pop();
            }
            Some(addr)
        }
        _ => None,
    };
    let Some(status_addr) = status else {
        return malformed(None, Vec::new());
    };
    if too_long {
        return malformed(status, Vec::new());
    }
    let mut hdr = [0u8; HEADER_LEN];
    if !gather(mem, &readable, 0, &mut hdr) {
        return malformed(status, Vec::new());
    }
    let typ = u32::from_le_bytes([hdr[0], hdr[1], hdr[2], hdr[3]]);
    let sector = u64::from_le_bytes(hdr[8..16].try_into().unwrap_or([0; 8]));
    let in_len = len_of(&readable) - HEADER_LEN as u64;
    let out_len = len_of(&writable);
    let parsed = |kind, action| Parsed {
        head,
        kind,
        status: Some(status_addr),
        out: writable.clone(),
        input: Vec::new(),
        action,
    };
    let ioerr = |kind| parsed(kind, Action::Reply(S_IOERR, Vec::new()));
    let offset = sector.checked_mul(512);
    match typ {
        VIRTIO_BLK_T_IN => {
            let (Some(offset), Ok(len)) = (offset, u32::try_from(out_len)) else {
                return ioerr(Kind::Read);
            };
            if u64::from(len) > MAX_REQUEST_BYTES {
                return ioerr(Kind::Read);
            }
            let req = Request {
                op: Op::Read { len },
                offset,
                fua: false,
            };
            parsed(Kind::Read, Action::Engine(req))
        }
        VIRTIO_BLK_T_OUT => {
            let Some(offset) = offset else {
                return ioerr(Kind::Write);
            };
            if in_len > MAX_REQUEST_BYTES {
                return ioerr(Kind::Write);
            }
            // The payload stays in guest memory until admitted
            // (`Parsed::load`).
            let action = Action::Write {
                offset,
                len: in_len,
                fua: ctx.write_through,
            };
            Parsed {
                input: readable,
                ..parsed(Kind::Write, action)
            }
        }
        VIRTIO_BLK_T_FLUSH => {
            let req = Request {
                op: Op::Flush,
                offset: 0,
                fua: false,
            };
            parsed(Kind::Flush, Action::Engine(req))
        }
        VIRTIO_BLK_T_GET_ID => {
            let n = (out_len as usize).min(ctx.serial.len());
            parsed(Kind::GetId, Action::Reply(S_OK, ctx.serial[..n].to_vec()))
        }
        VIRTIO_BLK_T_DISCARD | VIRTIO_BLK_T_WRITE_ZEROES => {
            let kind = if typ == VIRTIO_BLK_T_DISCARD {
                Kind::Discard
            } else {
                Kind::WriteZeroes
            };
            // One range per request (max_*_seg = 1).
            let mut r = [0u8; RANGE_LEN];
            if in_len != RANGE_LEN as u64 || !gather(mem, &readable, HEADER_LEN, &mut r) {
                return ioerr(kind);
            }
            let start = u64::from_le_bytes(r[0..8].try_into().unwrap_or([0; 8]));
            let sectors = u32::from_le_bytes([r[8], r[9], r[10], r[11]]);
            let flags = u32::from_le_bytes([r[12], r[13], r[14], r[15]]);
            let allowed = if kind == Kind::Discard {
                0
            } else {
                VIRTIO_BLK_WRITE_ZEROES_FLAG_UNMAP
            };
            if flags & !allowed != 0 {
                return parsed(kind, Action::Reply(S_UNSUPP, Vec::new()));
            }
            let (Some(offset), Some(len)) = (
                start.checked_mul(512),
                sectors.checked_mul(512).filter(|_| sectors > 0),
            ) else {
                return ioerr(kind);
            };
            let op = if kind == Kind::Discard {
                Op::Discard { len }
            } else {
                Op::WriteZeroes { len }
            };
            let req = Request {
                op,
                offset,
                fua: ctx.write_through && kind == Kind::WriteZeroes,
            };
            parsed(kind, Action::Engine(req))
        }
        _ => parsed(Kind::Unsupported, Action::Reply(S_UNSUPP, Vec::new())),
    }
}

/// The status for an engine completion: the engine's one typed error, by
/// its errno ([`datapath::Error::errno`]): "not supported" (a discard
/// while discards are off) is `VIRTIO_BLK_S_UNSUPP`, everything else
/// `VIRTIO_BLK_S_IOERR`.
pub fn status_of(c: &Completion) -> u8 {
    match c {
        Ok(_) => S_OK,
        Err(e) if e.errno() == libc::EOPNOTSUPP => S_UNSUPP,
        Err(_) => S_IOERR,
    }
}

/// Writes the answer of `p` into guest memory and returns the used length
/// (bytes the device wrote, status included). A data buffer that cannot
/// take the data turns the status into IOERR.
pub fn answer(mem: &Mem, p: &Parsed, mut status: u8, data: &[u8]) -> u32 {
    let Some(addr) = p.status else {
        return 0;
    };
    let mut written = 0u32;
    if status == S_OK && !data.is_empty() {
        if scatter(mem, &p.out, data) {
            written = u32::try_from(data.len()).unwrap_or(u32::MAX);
        } else {
            status = S_IOERR;
        }
    }
    if mem.write_obj(status, addr).is_err() {
        return written;
    }
    written.saturating_add(1)
}
