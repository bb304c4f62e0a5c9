//! Passphrase input as cryptsetup does it: a key file (`-` = all of stdin,
//! binary-safe), one line from a non-terminal stdin, or a prompt on the
//! terminal without echo. Every passphrase lands in a [`Secret`] (locked,
//! non-dumpable memory), read past `Stdin`'s heap buffer. How a typed
//! passphrase is asked for (tries, timeout, asked twice, an empty one
//! first) is a [`Prompting`] value the caller passes.

use std::io::{IsTerminal, Read};
use std::os::fd::AsFd;
use std::path::Path;
use std::time::Duration;

use crypto::Secret;

use crate::error::{invalid, Error, Result};
use crate::ErrorKind;

mod tty;

/// Largest key file cryptsetup reads by default (8 MiB).
pub const MAX_KEYFILE: u64 = 8 << 20;
/// Largest interactive passphrase cryptsetup accepts.
pub const MAX_PASSPHRASE: usize = 512;

/// How often a passphrase typed at the terminal is asked for when it
/// opens nothing, by default (cryptsetup's `--tries`).
pub const DEFAULT_TRIES: u32 = 3;

/// How passphrases typed at the terminal are asked for: cryptsetup's
/// `-T`/`--tries`, `-t`/`--timeout`, `-y`/`-q` (when a passphrase is asked
/// twice) and crypttab's `try-empty-password`. The command line builds one
/// from its global options (and a crypttab line's) and hands it to
/// whatever reads a passphrase: [`Prompting::read`], [`Prompting::read_range`],
/// [`Prompting::unlock`]. Input that is not a terminal is read once,
/// untimed, never asked twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prompting {
    /// How often [`Prompting::unlock`] asks for a passphrase typed at the
    /// terminal that opens nothing (0 counts as 1; default
    /// [`DEFAULT_TRIES`]). Other volume types' prompts and token PINs ask
    /// as often ([`Prompting::tries`]).
    pub tries: u32,
    /// How long a terminal prompt waits for its line, in seconds (0: for
    /// ever). A key file or piped stdin is read without a timeout, as
    /// cryptsetup reads them.
    pub timeout: u64,
    /// When a passphrase typed at the terminal is asked twice.
    pub verify: Verify,
    /// Whether [`Prompting::unlock`] tries an empty passphrase before it
    /// asks for one (crypttab's `try-empty-password`, as
    /// systemd-cryptsetup acts on it). A key file given is used as it is.
    pub try_empty: bool,
}

impl Default for Prompting {
    /// cryptsetup's defaults: three tries, no timeout, each passphrase
    /// asked as the verb says, no empty passphrase tried.
    fn default() -> Self {
        Self {
            tries: DEFAULT_TRIES,
            timeout: 0,
            verify: Verify::AsVerbSays,
            try_empty: false,
        }
    }
}

impl Prompting {
    /// The tries, at least one.
    pub fn tries(&self) -> u32 {
        self.tries.max(1)
    }
}

/// Whether a passphrase typed at the terminal is asked for twice
/// (cryptsetup's `verify_passphrase`; [`Prompting::verify`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Verify {
    /// As the verb says: a new passphrase (format, a key added or
    /// changed) twice, one that opens a keyslot once.
    #[default]
    AsVerbSays,
    /// Every typed passphrase twice (`-y`/`--verify-passphrase`).
    Always,
    /// Each once (`-q`/`--batch-mode` without `-y`).
    Never,
}

/// [`Prompting::unlock`]'s loop: `read`, then `open`, again while `open` says the
/// passphrase is wrong and tries are left (`wrong` hears of each such
/// failure but the last, which is returned).
fn retry<T>(
    tries: u32,
    mut read: impl FnMut() -> Result<Secret>,
    mut open: impl FnMut(&Secret) -> Result<T>,
    mut wrong: impl FnMut(&Error),
) -> Result<T> {
    let mut left = tries.max(1);
    loop {
        let pass = read()?;
        match open(&pass) {
            Err(e) if e.kind() == ErrorKind::WrongPassphrase && left > 1 => {
                left -= 1;
                wrong(&e);
            }
            r => return r,
        }
    }
}

/// Which part of a key file is the key (cryptsetup's `--keyfile-offset`
/// and `--keyfile-size`/`-l`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeyfileRange {
    /// Bytes skipped at the start.
    pub offset: u64,
    /// Bytes read after them (all that remain if `None`); a file with
    /// fewer is refused.
    pub size: Option<u64>,
}

impl Prompting {
    /// Reads a passphrase as [`Prompting::read_range`] does and hands it to
    /// `open` (a keyslot unlock). When the passphrase was typed at the
    /// terminal and `open` finds it wrong, says so on stderr and asks again,
    /// up to [`Prompting::tries`] in all, as cryptsetup does; a key file or
    /// piped stdin gets one try. Without a key file and with
    /// [`Prompting::try_empty`], an empty passphrase is tried first (a wrong
    /// one is not reported).
    pub fn unlock<T>(
        &self,
        key_file: Option<&Path>,
        range: KeyfileRange,
        prompt: &str,
        mut open: impl FnMut(&Secret) -> Result<T>,
    ) -> Result<T> {
        if key_file.is_none() && self.try_empty {
            match open(&Secret::from_slice(b"")) {
                Err(e) if e.kind() == ErrorKind::WrongPassphrase => {}
                r => return r,
            }
        }
        let typed = key_file.is_none() && std::io::stdin().is_terminal();
        let tries = if typed { self.tries } else { 1 };
        retry(
            tries,
            || self.read_range(key_file, range, prompt, false),
            open,
            |e| eprintln!("{e}."),
        )
    }

    /// [`Prompting::read`] taking only `range` of the input, as cryptsetup does: of a
    /// key file; of piped stdin (no key file), where the offset skips bytes
    /// and the line ends at a newline or after `size` bytes (fewer is
    /// refused). A terminal prompt ignores the size and refuses an offset.
    pub fn read_range(
        &self,
        key_file: Option<&Path>,
        range: KeyfileRange,
        prompt: &str,
        verify: bool,
    ) -> Result<Secret> {
        if range == KeyfileRange::default() {
            return self.read(key_file, prompt, verify);
        }
        if key_file.is_none() {
            if !std::io::stdin().is_terminal() {
                return read_piped(range);
            }
            if range.offset != 0 {
                return Err(invalid("Cannot use offset with terminal input."));
            }
            return self.read(None, prompt, verify);
        }
        let all = self.read(key_file, prompt, verify)?;
        let start = usize::try_from(range.offset)
            .ok()
            .filter(|&o| o <= all.len())
            .ok_or_else(|| invalid("Cannot seek to requested keyfile offset"))?;
        let end = match range.size {
            None => all.len(),
            Some(n) => usize::try_from(n)
                .ok()
                .and_then(|n| start.checked_add(n))
                .filter(|&e| e <= all.len())
                .ok_or_else(|| invalid("Cannot read requested amount of data"))?,
        };
        Ok(Secret::from_slice(&all[start..end]))
    }

    /// Reads a passphrase. `key_file` (`-` = stdin) wins; otherwise a terminal
    /// prompt without echo (asked twice when `verify`, or as
    /// [`Prompting::verify`] overrides it), or one line of stdin
    /// when stdin is not a terminal.
    pub fn read(&self, key_file: Option<&Path>, prompt: &str, verify: bool) -> Result<Secret> {
        match key_file {
            Some(p) if p == Path::new("-") => {
                let buf = stdin()
                    .and_then(|f| read_all(f.take(MAX_KEYFILE + 1)))
                    .map_err(|e| Error::io("Cannot read the key from stdin", e))?;
                check_len(buf)
            }
            Some(p) => {
                let f = std::fs::File::open(p).map_err(|e| {
                    // A key file that cannot be opened is a wrong parameter
                    // (cryptsetup: "Failed to open key file.", exit 1).
                    Error::io_as(
                        ErrorKind::InvalidArgument,
                        format!("Cannot open key file {}", p.display()),
                        e,
                    )
                })?;
                let buf = read_all(f.take(MAX_KEYFILE + 1))
                    .map_err(|e| Error::io(format!("Cannot read key file {}", p.display()), e))?;
                check_len(buf)
            }
            None if std::io::stdin().is_terminal() => {
                let verify = match self.verify {
                    Verify::Always => true,
                    Verify::Never => false,
                    Verify::AsVerbSays => verify,
                };
                let first = self.typed(prompt)?;
                if verify && *self.typed("Verify passphrase: ")? != *first {
                    // A bad passphrase, as cryptsetup counts it (exit 2); read
                    // errors are not retried.
                    return Err(Error::new(
                        ErrorKind::WrongPassphrase,
                        "Passphrases do not match",
                    ));
                }
                Ok(first)
            }
            None => {
                // Piped passphrase: one line, newline stripped (cryptsetup).
                let buf = stdin_line(MAX_PASSPHRASE)
                    .map_err(|e| Error::io("Cannot read the passphrase from stdin", e))?;
                if buf.len() > MAX_PASSPHRASE {
                    return Err(invalid(format!(
                        "Passphrase is longer than {MAX_PASSPHRASE} characters"
                    )));
                }
                if buf.is_empty() {
                    return Err(invalid("No passphrase given (empty input)"));
                }
                Ok(buf)
            }
        }
    }

    /// One line typed at the terminal after `prompt`, within
    /// [`Prompting::timeout`].
    fn typed(&self, prompt: &str) -> Result<Secret> {
        let secs = self.timeout;
        let timeout = (secs > 0).then(|| Duration::from_secs(secs));
        tty::prompt(prompt, timeout, MAX_PASSPHRASE).map_err(|f| match f {
            // cryptsetup's words for both.
            tty::Failure::TimedOut => invalid(format!(
                "Error reading passphrase from terminal: nothing typed within {secs} s"
            )),
            tty::Failure::Eof => invalid("Error reading passphrase from terminal: end of input"),
            tty::Failure::TooLong => invalid(format!(
                "Passphrase is longer than {MAX_PASSPHRASE} characters"
            )),
            tty::Failure::Io(e) => Error::io("Cannot read the passphrase", e),
        })
    }
}

/// One passphrase line from piped stdin after skipping `range.offset`
/// bytes: up to a newline, or exactly `range.size` bytes when given
/// (cryptsetup's `crypt_keyfile_device_read` with `STOP_EOL`).
fn read_piped(range: KeyfileRange) -> Result<Secret> {
    let fail = |e| Error::io("Cannot read the passphrase from stdin", e);
    let mut input = stdin().map_err(fail)?;
    let mut byte = [0u8; 1];
    for _ in 0..range.offset {
        if input.read(&mut byte).map_err(fail)? == 0 {
            return Err(invalid("Cannot seek to requested keyfile offset"));
        }
    }
    let limit = range.size.map_or(MAX_PASSPHRASE + 1, |n| n as usize);
    let mut buf = Secret::with_capacity(limit.min(MAX_KEYFILE as usize));
    while buf.len() < limit {
        match input.read(&mut byte).map_err(fail)? {
            0 => break,
            _ if byte[0] == b'\n' => break,
            _ => buf.push(byte[0]),
        }
        if buf.len() as u64 > MAX_KEYFILE {
            return Err(invalid("Key file is larger than 8 MiB"));
        }
    }
    match range.size {
        Some(n) if buf.len() as u64 != n => Err(invalid("Cannot read requested amount of data")),
        None if buf.len() > MAX_PASSPHRASE => Err(invalid(format!(
            "Passphrase is longer than {MAX_PASSPHRASE} characters"
        ))),
        _ if buf.is_empty() => Err(invalid("No passphrase given (empty input)")),
        _ => Ok(buf),
    }
}

/// Standard input past `Stdin`'s buffer (a duplicate of fd 0), so the
/// passphrase is not left in heap memory. Read byte by byte where only one
/// line is taken, so nothing after it is consumed.
fn stdin() -> std::io::Result<std::fs::File> {
    Ok(std::fs::File::from(
        std::io::stdin().as_fd().try_clone_to_owned()?,
    ))
}

/// One line of standard input, newline stripped, read byte by byte into
/// locked memory past `Stdin`'s buffer (so neither the line nor what
/// follows it is left behind): up to the newline or the end, or `limit` + 1
/// bytes, where it stops (the caller refuses or keeps a line that long).
pub fn stdin_line(limit: usize) -> std::io::Result<Secret> {
    let mut input = stdin()?;
    let mut buf = Secret::with_capacity(limit + 1);
    let mut byte = [0u8; 1];
    while buf.len() <= limit {
        match input.read(&mut byte)? {
            0 => break,
            _ if byte[0] == b'\n' => break,
            _ => buf.push(byte[0]),
        }
    }
    Ok(buf)
}

/// Everything `input` holds, in locked memory.
fn read_all(input: impl Read) -> std::io::Result<Secret> {
    Secret::read_from(input, usize::MAX)
}

fn check_len(buf: Secret) -> Result<Secret> {
    if buf.len() as u64 > MAX_KEYFILE {
        return Err(invalid("Key file is larger than 8 MiB"));
    }
    // An empty key file is an empty passphrase, as cryptsetup takes it.
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs [`retry`] over `typed` passphrases, `good` the one that opens;
    /// returns the result, how many were read and how many were reported.
    fn run(tries: u32, typed: &[&str], good: &str) -> (Result<usize>, usize, usize) {
        let read = std::cell::Cell::new(0);
        let mut told = 0;
        let r = retry(
            tries,
            || {
                read.set(read.get() + 1);
                typed
                    .get(read.get() - 1)
                    .map(|p| Secret::from(*p))
                    .ok_or_else(|| invalid("No passphrase given (empty input)"))
            },
            |p| {
                if &p[..] == good.as_bytes() {
                    Ok(read.get())
                } else {
                    Err(Error::new(
                        ErrorKind::WrongPassphrase,
                        "No key available with this passphrase",
                    ))
                }
            },
            |_| told += 1,
        );
        (r, read.get(), told)
    }

    #[test]
    fn a_wrong_passphrase_is_asked_again_until_the_tries_run_out() {
        let (r, read, told) = run(3, &["a", "b", "good"], "good");
        assert_eq!((r.unwrap(), read, told), (3, 3, 2));
        let (r, read, told) = run(3, &["a", "b", "c", "good"], "good");
        assert_eq!(r.unwrap_err().kind(), ErrorKind::WrongPassphrase);
        assert_eq!((read, told), (3, 2), "a fourth try");
    }

    #[test]
    fn one_try_and_zero_tries_read_once() {
        for tries in [0, 1] {
            let (r, read, told) = run(tries, &["a", "good"], "good");
            assert_eq!(r.unwrap_err().kind(), ErrorKind::WrongPassphrase);
            assert_eq!((read, told), (1, 0));
        }
    }

    #[test]
    fn only_a_wrong_passphrase_is_retried() {
        // The input ends: its error comes back, no further prompt.
        let (r, read, _) = run(3, &["a"], "good");
        assert_eq!(r.unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(read, 2);
        // Any other failure of the unlock stops at once.
        let mut read = 0;
        let r: Result<()> = retry(
            3,
            || {
                read += 1;
                Ok(Secret::from("x"))
            },
            |_| Err(invalid("bad slot")),
            |_| {},
        );
        assert_eq!(r.unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(read, 1);
    }
}
