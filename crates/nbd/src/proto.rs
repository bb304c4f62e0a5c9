//! NBD wire constants and the small encoders/decoders the server needs.
//!
//! Hand-written from the NetworkBlockDevice protocol document (`doc/proto.md`):
//! fixed newstyle negotiation, the `INFO` extension (`NBD_OPT_INFO` / `NBD_OPT_GO`,
//! `NBD_INFO_*`), simple replies. Every multi-byte field is big-endian.
//! Decoders take `&[u8]` and return `None` on any malformed input; they never panic.

/// `NBDMAGIC`, first 8 bytes the server sends.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// `IHAVEOPT`, newstyle negotiation magic (also prefixes every client option).
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Magic of every option reply.
pub const REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Magic of a transmission request.
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Magic of a simple reply.
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;

/// Handshake flag: fixed newstyle.
pub const FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Handshake flag: the 124 zero bytes after `NBD_OPT_EXPORT_NAME` may be omitted.
pub const FLAG_NO_ZEROES: u16 = 1 << 1;
/// Client flag: fixed newstyle.
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client flag: no zeroes.
pub const FLAG_C_NO_ZEROES: u32 = 1 << 1;

/// Transmission flag: always set.
pub const FLAG_HAS_FLAGS: u16 = 1 << 0;
/// Transmission flag: read-only export.
pub const FLAG_READ_ONLY: u16 = 1 << 1;
/// Transmission flag: `NBD_CMD_FLUSH` supported.
pub const FLAG_SEND_FLUSH: u16 = 1 << 2;
/// Transmission flag: `NBD_CMD_FLAG_FUA` supported.
pub const FLAG_SEND_FUA: u16 = 1 << 3;
/// Transmission flag: `NBD_CMD_TRIM` supported.
pub const FLAG_SEND_TRIM: u16 = 1 << 5;
/// Transmission flag: `NBD_CMD_WRITE_ZEROES` supported.
pub const FLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
/// Transmission flag: flush/FUA are visible across all connections.
pub const FLAG_CAN_MULTI_CONN: u16 = 1 << 8;

/// `NBD_OPT_EXPORT_NAME`
pub const OPT_EXPORT_NAME: u32 = 1;
/// `NBD_OPT_ABORT`
pub const OPT_ABORT: u32 = 2;
/// `NBD_OPT_LIST`
pub const OPT_LIST: u32 = 3;
/// `NBD_OPT_STARTTLS`
pub const OPT_STARTTLS: u32 = 5;
/// `NBD_OPT_INFO`
pub const OPT_INFO: u32 = 6;
/// `NBD_OPT_GO`
pub const OPT_GO: u32 = 7;

/// `NBD_REP_ACK`
pub const REP_ACK: u32 = 1;
/// `NBD_REP_SERVER`
pub const REP_SERVER: u32 = 2;
/// `NBD_REP_INFO`
pub const REP_INFO: u32 = 3;
/// `NBD_REP_ERR_UNSUP`
pub const REP_ERR_UNSUP: u32 = (1 << 31) + 1;
/// `NBD_REP_ERR_POLICY`
pub const REP_ERR_POLICY: u32 = (1 << 31) + 2;
/// `NBD_REP_ERR_INVALID`
pub const REP_ERR_INVALID: u32 = (1 << 31) + 3;
/// `NBD_REP_ERR_TLS_REQD`: TLS is required before this option.
pub const REP_ERR_TLS_REQD: u32 = (1 << 31) + 5;
/// `NBD_REP_ERR_UNKNOWN`
pub const REP_ERR_UNKNOWN: u32 = (1 << 31) + 6;
/// `NBD_REP_ERR_SHUTDOWN`
pub const REP_ERR_SHUTDOWN: u32 = (1 << 31) + 7;

/// `NBD_INFO_EXPORT`
pub const INFO_EXPORT: u16 = 0;
/// `NBD_INFO_NAME`
pub const INFO_NAME: u16 = 1;
/// `NBD_INFO_DESCRIPTION`
pub const INFO_DESCRIPTION: u16 = 2;
/// `NBD_INFO_BLOCK_SIZE`
pub const INFO_BLOCK_SIZE: u16 = 3;

/// `NBD_CMD_READ`
pub const CMD_READ: u16 = 0;
/// `NBD_CMD_WRITE`
pub const CMD_WRITE: u16 = 1;
/// `NBD_CMD_DISC`
pub const CMD_DISC: u16 = 2;
/// `NBD_CMD_FLUSH`
pub const CMD_FLUSH: u16 = 3;
/// `NBD_CMD_TRIM`
pub const CMD_TRIM: u16 = 4;
/// `NBD_CMD_WRITE_ZEROES`
pub const CMD_WRITE_ZEROES: u16 = 6;

/// `NBD_CMD_FLAG_FUA`
pub const CMD_FLAG_FUA: u16 = 1 << 0;
/// `NBD_CMD_FLAG_NO_HOLE` (write zeroes: must allocate; always true for us).
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;

/// `EPERM`
pub const EPERM: u32 = 1;
/// `EIO`
pub const EIO: u32 = 5;
/// `ENOMEM`
pub const ENOMEM: u32 = 12;
/// `EINVAL`
pub const EINVAL: u32 = 22;
/// `ENOSPC`
pub const ENOSPC: u32 = 28;
/// `EOVERFLOW`
pub const EOVERFLOW: u32 = 75;
/// `ENOTSUP`
pub const ENOTSUP: u32 = 95;
/// `ESHUTDOWN`
pub const ESHUTDOWN: u32 = 108;

/// Largest request payload we accept (the protocol's customary 32 MiB).
pub const MAX_PAYLOAD: u32 = 32 << 20;
/// Largest option payload we read; bigger options end the session.
pub const MAX_OPTION_LEN: u32 = 64 << 10;
/// Length of a transmission request header.
pub const REQUEST_LEN: usize = 28;

/// A decoded transmission request header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHeader {
    /// `NBD_CMD_FLAG_*`
    pub flags: u16,
    /// `NBD_CMD_*`
    pub kind: u16,
    /// Opaque handle ("cookie") echoed in the reply.
    pub cookie: u64,
    /// Byte offset.
    pub offset: u64,
    /// Byte length (payload length for writes).
    pub len: u32,
}

impl RequestHeader {
    /// Decodes a 28-byte request header; `None` on a bad magic.
    pub fn decode(b: &[u8; REQUEST_LEN]) -> Option<Self> {
        let mut r = Reader::new(b);
        if r.u32()? != REQUEST_MAGIC {
            return None;
        }
        Some(Self {
            flags: r.u16()?,
            kind: r.u16()?,
            cookie: r.u64()?,
            offset: r.u64()?,
            len: r.u32()?,
        })
    }

    /// Encodes the header (used by tests that play a hostile client).
    pub fn encode(&self) -> [u8; REQUEST_LEN] {
        let mut b = [0u8; REQUEST_LEN];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.kind.to_be_bytes());
        b[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.len.to_be_bytes());
        b
    }
}

/// The 16-byte simple reply header.
pub fn simple_reply(error: u32, cookie: u64) -> [u8; 16] {
    let mut b = [0u8; 16];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.to_be_bytes());
    b[8..16].copy_from_slice(&cookie.to_be_bytes());
    b
}

/// An option reply: header plus `data`.
pub fn option_reply(option: u32, reply: u32, data: &[u8]) -> Vec<u8> {
    let mut b = Vec::with_capacity(20 + data.len());
    b.extend_from_slice(&REPLY_MAGIC.to_be_bytes());
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&reply.to_be_bytes());
    // Option replies we build are tiny (names are capped at 4096 bytes).
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    b
}

/// The payload of `NBD_OPT_INFO` / `NBD_OPT_GO`.
#[derive(Debug, PartialEq, Eq)]
pub struct InfoRequest {
    /// Requested export name.
    pub name: Vec<u8>,
    /// Requested `NBD_INFO_*` items.
    pub requests: Vec<u16>,
}

impl InfoRequest {
    /// Parses the option data; rejects truncated data and trailing bytes.
    pub fn decode(data: &[u8]) -> Option<Self> {
        let mut r = Reader::new(data);
        let name_len = r.u32()? as usize;
        let name = r.bytes(name_len)?.to_vec();
        let n = r.u16()? as usize;
        let mut requests = Vec::with_capacity(n.min(64));
        for _ in 0..n {
            requests.push(r.u16()?);
        }
        r.is_empty().then_some(Self { name, requests })
    }
}

/// A bounds-checked big-endian cursor.
pub struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Reads from the start of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }
    /// Next `n` bytes.
    pub fn bytes(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.buf.len() {
            return None;
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Some(a)
    }
    /// Big-endian u16.
    pub fn u16(&mut self) -> Option<u16> {
        self.bytes(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    /// Big-endian u32.
    pub fn u32(&mut self) -> Option<u32> {
        self.bytes(4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    /// Big-endian u64.
    pub fn u64(&mut self) -> Option<u64> {
        let b = self.bytes(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Some(u64::from_be_bytes(a))
    }
    /// True when every byte was consumed.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_round_trip() {
        let h = RequestHeader {
            flags: 1,
            kind: CMD_WRITE,
            cookie: 0xdead_beef,
            offset: 4096,
            len: 512,
        };
        assert_eq!(RequestHeader::decode(&h.encode()), Some(h));
        let mut bad = h.encode();
        bad[0] ^= 1;
        assert_eq!(RequestHeader::decode(&bad), None);
    }

    #[test]
    fn info_request_rejects_truncation_and_trailing_bytes() {
        let mut d = Vec::new();
        d.extend_from_slice(&3u32.to_be_bytes());
        d.extend_from_slice(b"abc");
        d.extend_from_slice(&2u16.to_be_bytes());
        d.extend_from_slice(&INFO_BLOCK_SIZE.to_be_bytes());
        d.extend_from_slice(&INFO_NAME.to_be_bytes());
        let r = InfoRequest::decode(&d).unwrap();
        assert_eq!(r.name, b"abc");
        assert_eq!(r.requests, vec![INFO_BLOCK_SIZE, INFO_NAME]);
        for cut in 0..d.len() {
            assert_eq!(InfoRequest::decode(&d[..cut]), None, "cut {cut}");
        }
        d.push(0);
        assert_eq!(InfoRequest::decode(&d), None);
        // A huge name length never allocates or panics.
        let mut h = u32::MAX.to_be_bytes().to_vec();
        h.extend_from_slice(&[0; 8]);
        assert_eq!(InfoRequest::decode(&h), None);
    }
}
