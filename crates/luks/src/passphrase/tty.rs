//! The terminal prompt, as cryptsetup's `interactive_pass` does it: the
//! prompt on `/dev/tty` (else stderr, reading stdin), echo off while the
//! line is typed, an optional timeout (`-t`/`--timeout`), and the
//! terminal's settings restored on every way out.
//!
//! Hand-written on rustix's termios and poll: `rpassword`, used before,
//! has no timeout and reads into a `String` that may be reallocated (and
//! so copied) as the line grows; here each byte goes straight into a
//! [`Secret`] sized for the longest passphrase.

use std::fs::File;
use std::io::{self, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use crypto::Secret;
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use rustix::termios::{tcgetattr, tcsetattr, LocalModes, OptionalActions, Termios};
use zeroize::Zeroize;

mod signals;

/// Why no line was read.
#[derive(Debug)]
pub(super) enum Failure {
    /// Nothing was typed within the timeout.
    TimedOut,
    /// The terminal reported end of input before anything was typed.
    Eof,
    /// The line was longer than the longest passphrase taken.
    TooLong,
    /// The terminal could not be set up or read.
    Io(io::Error),
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

/// Shows `prompt` and reads one line typed without echo, of at most `max`
/// bytes, within `timeout` if one is given (the whole line: from the
/// prompt to Enter, as cryptsetup times it). The newline is not kept.
pub(super) fn prompt(
    prompt: &str,
    timeout: Option<Duration>,
    max: usize,
) -> Result<Secret, Failure> {
    let (input, mut output) = open()?;
    let saved = tcgetattr(&input).map_err(io::Error::from)?;
    // Echo off before the prompt shows, so nothing typed at it echoes.
    let echo_off = Restore::new(&input, &saved)?;
    output.write_all(prompt.as_bytes())?;
    output.flush()?;
    let line = read_line(&input, timeout, max);
    drop(echo_off);
    // ECHONL echoed Enter's newline; a timeout or end of input typed
    // none, so end the prompt's line here.
    if !matches!(line, Ok(_) | Err(Failure::TooLong)) {
        let _ = output.write_all(b"\n");
    }
    line
}

/// The terminal to prompt on: `/dev/tty` for both ways, or, without a
/// controlling terminal, standard input and standard error.
fn open() -> io::Result<(OwnedFd, Box<dyn Write>)> {
    match File::options().read(true).write(true).open("/dev/tty") {
        Ok(tty) => {
            let input = OwnedFd::from(tty.try_clone()?);
            Ok((input, Box::new(tty)))
        }
        Err(_) => Ok((
            io::stdin().as_fd().try_clone_to_owned()?,
            Box::new(io::stderr()),
        )),
    }
}

/// Echo off (a typed newline still echoes, so the next line starts
/// afresh) until dropped, when the terminal's own settings return; a
/// signal that ends the process meanwhile returns them too (`signals.rs`).
struct Restore<'a> {
    fd: &'a OwnedFd,
    saved: &'a Termios,
    /// Dropped after the settings are back.
    _signals: signals::Guard,
}

impl<'a> Restore<'a> {
    fn new(fd: &'a OwnedFd, saved: &'a Termios) -> io::Result<Self> {
        let signals = signals::Guard::new(fd.as_fd())?;
        let mut quiet = saved.clone();
        quiet.local_modes.remove(LocalModes::ECHO);
        quiet.local_modes.insert(LocalModes::ECHONL);
        // As cryptsetup: TCSAFLUSH, so nothing typed before the prompt
        // is taken as the passphrase.
        tcsetattr(fd, OptionalActions::Flush, &quiet)?;
        Ok(Self {
            fd,
            saved,
            _signals: signals,
        })
    }
}

impl Drop for Restore<'_> {
    fn drop(&mut self) {
        let _ = tcsetattr(self.fd, OptionalActions::Flush, self.saved);
    }
}

/// One line from `fd`, byte by byte into locked memory (a canonical-mode
/// terminal hands the line over only once Enter is pressed, so the wait
/// for the first byte is the wait for the line).
fn read_line(fd: &OwnedFd, timeout: Option<Duration>, max: usize) -> Result<Secret, Failure> {
    let deadline = timeout.map(|t| Instant::now() + t);
    let mut line = Secret::with_capacity(max + 1);
    let mut too_long = false;
    let mut byte = [0u8; 1];
    loop {
        if let Some(d) = deadline {
            if !readable(fd, d)? {
                return Err(Failure::TimedOut);
            }
        }
        let n = match rustix::io::read(fd, &mut byte) {
            Ok(n) => n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(io::Error::from(e).into()),
        };
        if n == 0 {
            if line.is_empty() && !too_long {
                return Err(Failure::Eof);
            }
            break;
        }
        if byte[0] == b'\n' {
            break;
        }
        if line.len() < max {
            line.push(byte[0]);
        } else {
            // Read on to the end of the line, so the rest is not left
            // for whatever reads the terminal next.
            too_long = true;
        }
    }
    byte.zeroize();
    if too_long {
        return Err(Failure::TooLong);
    }
    Ok(line)
}

/// Waits until `deadline` for `fd` to have input; false when none came.
fn readable(fd: &OwnedFd, deadline: Instant) -> io::Result<bool> {
    let mut fds = [PollFd::new(fd, PollFlags::IN)];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(false);
        }
        let ts = Timespec {
            tv_sec: left.as_secs() as _,
            tv_nsec: left.subsec_nanos() as _,
        };
        match poll(&mut fds, Some(&ts)) {
            Ok(n) => return Ok(n > 0),
            // A signal (a resized terminal) cut the wait short.
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pipe: its read end stands in for the terminal (`read_line` needs
    /// no termios), its write end for the typist.
    fn pipe() -> (OwnedFd, File) {
        let (r, w) = rustix::pipe::pipe().unwrap();
        (r, File::from(w))
    }

    #[test]
    fn a_line_is_taken_without_its_newline_and_nothing_after_it() {
        let (r, mut w) = pipe();
        w.write_all(b"secret\nnext\n").unwrap();
        let line = read_line(&r, Some(Duration::from_secs(5)), 512).unwrap();
        assert_eq!(&line[..], b"secret");
        let line = read_line(&r, None, 512).unwrap();
        assert_eq!(&line[..], b"next");
    }

    #[test]
    fn nothing_within_the_timeout_and_end_of_input_are_failures() {
        let (r, w) = pipe();
        let t = Instant::now();
        let e = read_line(&r, Some(Duration::from_millis(50)), 512).unwrap_err();
        assert!(matches!(e, Failure::TimedOut), "{e:?}");
        assert!(t.elapsed() >= Duration::from_millis(50));
        drop(w);
        let e = read_line(&r, Some(Duration::from_secs(5)), 512).unwrap_err();
        assert!(matches!(e, Failure::Eof), "{e:?}");
    }

    #[test]
    fn an_over_long_line_is_refused_and_read_to_its_end() {
        let (r, mut w) = pipe();
        w.write_all(&[b'x'; 20]).unwrap();
        w.write_all(b"\nok\n").unwrap();
        let e = read_line(&r, None, 8).unwrap_err();
        assert!(matches!(e, Failure::TooLong), "{e:?}");
        // The rest of the long line was consumed with it.
        assert_eq!(&read_line(&r, None, 8).unwrap()[..], b"ok");
    }
}
