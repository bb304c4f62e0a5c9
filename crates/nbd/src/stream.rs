//! A connected client socket of either family (unix or TCP), with the one
//! `recv(MSG_PEEK)` the transmission loop's poller needs, the non-blocking
//! `sendmsg` replies go out with, and the `poll(2)` the reply writer, the
//! TLS pump and the accept loop wait in: this crate's only unsafe code.

use std::io::{self, IoSlice, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

/// A connected client socket of either family.
pub(crate) enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
}

impl Stream {
    /// True once a byte can be read without blocking (or the peer closed,
    /// or the socket failed: the blocking read then reports which).
    pub(crate) fn readable_now(&self) -> bool {
        let fd = self.as_raw_fd();
        let mut b = [0u8; 1];
        // SAFETY: `fd` is this stream's open socket for the whole call and
        // `b` is a valid 1-byte buffer; MSG_PEEK | MSG_DONTWAIT neither
        // consumes data nor blocks, and affects only this call (unlike
        // O_NONBLOCK, which the reply writer's dup of the socket shares).
        let n = unsafe {
            libc::recv(
                fd,
                b.as_mut_ptr().cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        n != -1 || io::Error::last_os_error().kind() != io::ErrorKind::WouldBlock
    }

    /// One `sendmsg(MSG_DONTWAIT)` of `bufs` (at most `IOV_MAX` of them):
    /// the bytes the socket took, or `WouldBlock` if it took none. Never
    /// blocks, whatever the socket's mode, and without touching
    /// `O_NONBLOCK` (which the reader's clone of the socket shares).
    pub(crate) fn send_nonblocking(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let fd = self.as_raw_fd();
        // SAFETY: an all-zero msghdr is valid (no name, no control data).
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        // `IoSlice` is ABI-compatible with `struct iovec` on unix (std's
        // documented guarantee); sendmsg only reads the array.
        msg.msg_iov = bufs.as_ptr() as *mut libc::iovec;
        msg.msg_iovlen = bufs.len().min(1024) as _;
        // SAFETY: `fd` is this stream's open socket for the whole call;
        // `msg` points at `msg_iovlen` live iovecs borrowed from `bufs`,
        // each describing memory valid for reads for the call's duration.
        let n = unsafe { libc::sendmsg(fd, &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if n < 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(n as usize)
        }
    }

    pub(crate) fn try_clone(&self) -> io::Result<Stream> {
        Ok(match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone()?),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone()?),
        })
    }
    /// `SO_RCVTIMEO` (shared by every clone of the socket).
    pub(crate) fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_read_timeout(t),
            Stream::Tcp(s) => s.set_read_timeout(t),
        }
    }

    /// Raises a unix socket's `SO_SNDBUF` to at least `bytes` (the kernel
    /// caps it at `net.core.wmem_max`; TCP keeps its autotuning), so a
    /// large reply fits in one non-blocking `sendmsg` instead of going to
    /// the writer thread in pieces. Best effort: errors are ignored.
    pub(crate) fn grow_send_buffer(&self, bytes: usize) {
        let Stream::Unix(s) = self else { return };
        let fd = s.as_raw_fd();
        let mut cur: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `fd` is this stream's open socket for the whole call;
        // `cur` and `len` are valid for writes of an int and its length.
        let got = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&mut cur as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        let want = bytes.min(libc::c_int::MAX as usize) as libc::c_int;
        if got == 0 && cur >= want {
            return;
        }
        // SAFETY: as above; `want` is a valid int for the call's duration.
        unsafe {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&want as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            );
        }
    }

    /// `SO_SNDTIMEO` (shared by every clone of the socket).
    pub(crate) fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_write_timeout(t),
            Stream::Tcp(s) => s.set_write_timeout(t),
        }
    }

    /// `O_NONBLOCK` (shared by every clone of the socket).
    pub(crate) fn set_nonblocking(&self, on: bool) -> io::Result<()> {
        match self {
            Stream::Unix(s) => s.set_nonblocking(on),
            Stream::Tcp(s) => s.set_nonblocking(on),
        }
    }

    pub(crate) fn shutdown(&self, how: Shutdown) {
        let _ = match self {
            Stream::Unix(s) => s.shutdown(how),
            Stream::Tcp(s) => s.shutdown(how),
        };
    }
}

impl AsRawFd for Stream {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Stream::Unix(s) => s.as_raw_fd(),
            Stream::Tcp(s) => s.as_raw_fd(),
        }
    }
}

/// A socket whose reads and writes all end by one instant: before each
/// call the socket's timeout is set to the time left, so a client that
/// trickles bytes cannot stretch the handshake past its deadline. Without
/// a deadline it is a plain pass-through (the transmission phase).
pub(crate) struct Deadline {
    pub(crate) s: Stream,
    pub(crate) until: Option<Instant>,
}

impl Deadline {
    fn arm(&self, read: bool) -> io::Result<()> {
        let Some(t) = self.until else {
            return Ok(());
        };
        let left = t.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "handshake deadline passed",
            ));
        }
        if read {
            self.s.set_read_timeout(Some(left))
        } else {
            self.s.set_write_timeout(Some(left))
        }
    }

    /// Drops the deadline and the socket timeouts it set.
    pub(crate) fn clear(&mut self) -> io::Result<()> {
        if self.until.take().is_some() {
            self.s.set_read_timeout(None)?;
            self.s.set_write_timeout(None)?;
        }
        Ok(())
    }
}

impl Read for Deadline {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.arm(true)?;
        self.s.read(buf)
    }
}

impl Write for Deadline {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.arm(false)?;
        self.s.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl AsRawFd for Deadline {
    fn as_raw_fd(&self) -> RawFd {
        self.s.as_raw_fd()
    }
}

/// Waits until one of `fds` (descriptor, `POLLIN`/`POLLOUT` events; a
/// negative descriptor is ignored) is ready or `timeout` passes. Returns
/// false on timeout. `EINTR` counts as ready (the caller retries its IO).
pub(crate) fn poll(fds: &[(RawFd, i16)], timeout: Option<Duration>) -> io::Result<bool> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&(fd, events)| libc::pollfd {
            fd,
            events,
            revents: 0,
        })
        .collect();
    let ms = timeout.map_or(-1, |t| t.as_millis().min(i32::MAX as u128) as i32);
    // SAFETY: `pfds` is a live, exclusively borrowed array of `pfds.len()`
    // initialised pollfd structs for the whole call; poll only writes their
    // `revents` fields.
    let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
    if n < 0 {
        let e = io::Error::last_os_error();
        if e.kind() == io::ErrorKind::Interrupted {
            return Ok(true);
        }
        return Err(e);
    }
    Ok(n > 0)
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
        }
    }
    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write_vectored(bufs),
            Stream::Tcp(s) => s.write_vectored(bufs),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `SO_SNDBUF` of `s` as the kernel reports it (twice what was set).
    fn sndbuf(s: &UnixStream) -> libc::c_int {
        let mut v: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: `s` is open for the call; `v` and `len` are valid for
        // writes of an int and its length.
        let r = unsafe {
            libc::getsockopt(
                s.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_SNDBUF,
                (&mut v as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(r, 0, "{}", io::Error::last_os_error());
        v
    }

    #[test]
    fn unix_send_buffer_grows_and_never_shrinks() {
        let (a, _b) = UnixStream::pair().unwrap();
        let before = sndbuf(&a);
        let s = Stream::Unix(a);
        s.grow_send_buffer(4 << 20);
        let Stream::Unix(a) = &s else { unreachable!() };
        let grown = sndbuf(a);
        // The kernel doubles what it was asked for, up to twice
        // net.core.wmem_max, so even a small cap beats the default.
        assert!(grown > before, "SO_SNDBUF {before} -> {grown}");
        // A smaller request leaves a larger buffer alone.
        s.grow_send_buffer(4096);
        assert_eq!(sndbuf(a), grown);
    }
}
