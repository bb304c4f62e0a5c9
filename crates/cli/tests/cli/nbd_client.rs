//! A minimal NBD client for the tests that write through an export while
//! something happens to the daemon: fixed newstyle, the default export
//! (`NBD_OPT_EXPORT_NAME ""`), one request at a time, FUA when asked.

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

const REQUEST_MAGIC: u32 = 0x2560_9513;
const REPLY_MAGIC: u32 = 0x6744_6698;
/// `NBD_FLAG_SEND_FUA` in the transmission flags.
pub const FLAG_SEND_FUA: u16 = 1 << 3;

pub struct NbdClient {
    s: UnixStream,
    cookie: u64,
    /// The export's size in bytes.
    pub size: u64,
    /// The export's transmission flags.
    pub flags: u16,
}

impl NbdClient {
    pub fn connect(sock: &Path) -> std::io::Result<Self> {
        let mut s = UnixStream::connect(sock)?;
        s.set_read_timeout(Some(Duration::from_secs(60)))?;
        let mut hello = [0u8; 18];
        s.read_exact(&mut hello)?;
        assert_eq!(&hello[..8], b"NBDMAGIC");
        // FIXED_NEWSTYLE | NO_ZEROES, then NBD_OPT_EXPORT_NAME "".
        s.write_all(&3u32.to_be_bytes())?;
        let mut opt = b"IHAVEOPT".to_vec();
        opt.extend_from_slice(&1u32.to_be_bytes());
        opt.extend_from_slice(&0u32.to_be_bytes());
        s.write_all(&opt)?;
        let mut export = [0u8; 10];
        s.read_exact(&mut export)?;
        Ok(Self {
            s,
            cookie: 0,
            size: u64::from_be_bytes(export[..8].try_into().unwrap()),
            flags: u16::from_be_bytes([export[8], export[9]]),
        })
    }

    fn request(
        &mut self,
        kind: u16,
        flags: u16,
        off: u64,
        data: &[u8],
        len: u32,
    ) -> std::io::Result<()> {
        self.cookie += 1;
        let mut h = Vec::with_capacity(28 + data.len());
        h.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        h.extend_from_slice(&flags.to_be_bytes());
        h.extend_from_slice(&kind.to_be_bytes());
        h.extend_from_slice(&self.cookie.to_be_bytes());
        h.extend_from_slice(&off.to_be_bytes());
        h.extend_from_slice(&len.to_be_bytes());
        h.extend_from_slice(data);
        self.s.write_all(&h)?;
        let mut r = [0u8; 16];
        self.s.read_exact(&mut r)?;
        assert_eq!(u32::from_be_bytes(r[..4].try_into().unwrap()), REPLY_MAGIC);
        assert_eq!(u64::from_be_bytes(r[8..].try_into().unwrap()), self.cookie);
        match u32::from_be_bytes(r[4..8].try_into().unwrap()) {
            0 => Ok(()),
            e => Err(std::io::Error::other(format!("NBD error {e}"))),
        }
    }

    /// NBD_CMD_WRITE, with NBD_CMD_FLAG_FUA when `fua`.
    pub fn write(&mut self, off: u64, data: &[u8], fua: bool) -> std::io::Result<()> {
        self.request(1, u16::from(fua), off, data, data.len() as u32)
    }

    /// NBD_CMD_FLUSH.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.request(3, 0, 0, &[], 0)
    }

    /// NBD_CMD_READ of `len` bytes at `off`.
    pub fn read(&mut self, off: u64, len: usize) -> std::io::Result<Vec<u8>> {
        self.request(0, 0, off, &[], len as u32)?;
        let mut buf = vec![0u8; len];
        self.s.read_exact(&mut buf)?;
        Ok(buf)
    }
}
