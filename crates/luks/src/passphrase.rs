//! Passphrase input as cryptsetup does it: a key file (`-` = all of stdin,
//! binary-safe), one line from a non-terminal stdin, or a prompt on the
//! terminal without echo. Every passphrase lands in a [`Secret`] (locked,
//! non-dumpable memory), read past `Stdin`'s heap buffer.

use std::io::{IsTerminal, Read};
use std::os::fd::AsFd;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
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

/// This process's `--tries` (see [`set_tries`]).
static TRIES: AtomicU32 = AtomicU32::new(DEFAULT_TRIES);

/// Sets how often [`unlock`] asks again for a passphrase typed at the
/// terminal that opens nothing (cryptsetup's `-T`/`--tries`; 0 counts as
/// 1), once for the process, as the command line gives it.
pub fn set_tries(tries: u32) {
    TRIES.store(tries, Ordering::Relaxed);
}

/// This process's `--tries` (other volume types' prompts ask as often).
pub fn tries() -> u32 {
    TRIES.load(Ordering::Relaxed).max(1)
}

/// This process's `--timeout` in seconds, 0 for none (see [`set_timeout`]).
static TIMEOUT: AtomicU64 = AtomicU64::new(0);

/// Sets how long a terminal prompt waits for its line, in seconds (0:
/// for ever), once for the process, as cryptsetup's `-t`/`--timeout`
/// gives it. A key file or piped stdin is read without a timeout, as
/// cryptsetup reads them.
pub fn set_timeout(secs: u64) {
    TIMEOUT.store(secs, Ordering::Relaxed);
}

/// This process's `try-empty-password` (see [`set_try_empty`]).
static TRY_EMPTY: AtomicBool = AtomicBool::new(false);

/// Sets whether [`unlock`] tries an empty passphrase before it asks for
/// one (crypttab's `try-empty-password`, as systemd-cryptsetup acts on
/// it), once for the process. A key file given is used as it is.
pub fn set_try_empty(on: bool) {
    TRY_EMPTY.store(on, Ordering::Relaxed);
}

/// Whether an empty passphrase is tried before asking ([`set_try_empty`]).
pub fn try_empty() -> bool {
    TRY_EMPTY.load(Ordering::Relaxed)
}

/// Whether a passphrase typed at the terminal is asked for twice, for
/// the process (cryptsetup's `verify_passphrase`; see [`set_verify`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verify {
    /// As the verb says: a new passphrase (format, a key added or
    /// changed) twice, one that opens a keyslot once.
    AsVerbSays = 0,
    /// Every typed passphrase twice (`-y`/`--verify-passphrase`).
    Always = 1,
    /// Each once (`-q`/`--batch-mode` without `-y`).
    Never = 2,
}

/// This process's [`Verify`], as a `u8`.
static VERIFY: AtomicU8 = AtomicU8::new(Verify::AsVerbSays as u8);

impl Verify {
    /// The setting [`set_verify`] made.
    fn current() -> Self {
        match VERIFY.load(Ordering::Relaxed) {
            1 => Self::Always,
            2 => Self::Never,
            _ => Self::AsVerbSays,
        }
    }
}

/// Sets when typed passphrases are asked twice, once for the process, as
/// cryptsetup's `-y` and `-q` decide it. Input that is not a terminal is
/// never asked twice.
pub fn set_verify(v: Verify) {
    VERIFY.store(v as u8, Ordering::Relaxed);
}

/// Reads a passphrase as [`read_range`] does and hands it to `open`
/// (a keyslot unlock). When the passphrase was typed at the terminal and
/// `open` finds it wrong, says so on stderr and asks again, up to the
/// process's tries ([`set_tries`], default [`DEFAULT_TRIES`]) in all, as
/// cryptsetup does; a key file or piped stdin gets one try. Without a
/// key file and with [`set_try_empty`], an empty passphrase is tried
/// first (a wrong one is not reported).
pub fn unlock<T>(
    key_file: Option<&Path>,
    range: KeyfileRange,
    prompt: &str,
    mut open: impl FnMut(&Secret) -> Result<T>,
) -> Result<T> {
    if key_file.is_none() && try_empty() {
        match open(&Secret::from_slice(b"")) {
            Err(e) if e.kind() == ErrorKind::WrongPassphrase => {}
            r => return r,
        }
    }
    let typed = key_file.is_none() && std::io::stdin().is_terminal();
    let tries = if typed {
        TRIES.load(Ordering::Relaxed)
    } else {
        1
    };
    retry(
        tries,
        || read_range(key_file, range, prompt, false),
        open,
        |e| eprintln!("{e}."),
    )
}

/// [`unlock`]'s loop: `read`, then `open`, again while `open` says the
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

/// [`read`] taking only `range` of the input, as cryptsetup does: of a
/// key file; of piped stdin (no key file), where the offset skips bytes
/// and the line ends at a newline or after `size` bytes (fewer is
/// refused). A terminal prompt ignores the size and refuses an offset.
pub fn read_range(
    key_file: Option<&Path>,
    range: KeyfileRange,
    prompt: &str,
    verify: bool,
) -> Result<Secret> {
    if range == KeyfileRange::default() {
        return read(key_file, prompt, verify);
    }
    if key_file.is_none() {
        if !std::io::stdin().is_terminal() {
            return read_piped(range);
        }
        if range.offset != 0 {
            return Err(invalid("Cannot use offset with terminal input."));
        }
        return read(None, prompt, verify);
    }
    let all = read(key_file, prompt, verify)?;
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
/// prompt without echo (asked twice when `verify`), or one line of stdin
/// when stdin is not a terminal.
pub fn read(key_file: Option<&Path>, prompt: &str, verify: bool) -> Result<Secret> {
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
            let verify = match Verify::current() {
                Verify::Always => true,
                Verify::Never => false,
                Verify::AsVerbSays => verify,
            };
            let first = typed(prompt)?;
            if verify && *typed("Verify passphrase: ")? != *first {
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
            let mut buf = Secret::with_capacity(MAX_PASSPHRASE + 1);
            let mut byte = [0u8; 1];
            let mut stdin =
                stdin().map_err(|e| Error::io("Cannot read the passphrase from stdin", e))?;
            loop {
                match stdin.read(&mut byte) {
                    Ok(0) => break,
                    Ok(_) if byte[0] == b'\n' => break,
                    Ok(_) => buf.push(byte[0]),
                    Err(e) => return Err(Error::io("Cannot read the passphrase from stdin", e)),
                }
                if buf.len() > MAX_PASSPHRASE {
                    return Err(invalid(format!(
                        "Passphrase is longer than {MAX_PASSPHRASE} characters"
                    )));
                }
            }
            if buf.is_empty() {
                return Err(invalid("No passphrase given (empty input)"));
            }
            Ok(buf)
        }
    }
}

/// One line typed at the terminal after `prompt`, within the process's
/// timeout ([`set_timeout`]).
fn typed(prompt: &str) -> Result<Secret> {
    let secs = TIMEOUT.load(Ordering::Relaxed);
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
