//! Passphrase input as cryptsetup does it: a key file (`-` = all of stdin,
//! binary-safe), one line from a non-terminal stdin, or a prompt on the
//! terminal without echo. Every passphrase lands in a [`Secret`] (locked,
//! non-dumpable memory), read past `Stdin`'s heap buffer.

use std::io::{IsTerminal, Read};
use std::os::fd::AsFd;
use std::path::Path;

use crypto::Secret;
use zeroize::Zeroizing;

use crate::error::{invalid, Error, Result};

/// Largest key file cryptsetup reads by default (8 MiB).
pub const MAX_KEYFILE: u64 = 8 << 20;
/// Largest interactive passphrase cryptsetup accepts.
pub const MAX_PASSPHRASE: usize = 512;

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
            let f = std::fs::File::open(p)
                .map_err(|e| Error::io(format!("Cannot open key file {}", p.display()), e))?;
            let buf = read_all(f.take(MAX_KEYFILE + 1))
                .map_err(|e| Error::io(format!("Cannot read key file {}", p.display()), e))?;
            check_len(buf)
        }
        None if std::io::stdin().is_terminal() => {
            let first = Zeroizing::new(
                rpassword::prompt_password(prompt)
                    .map_err(|e| Error::io("Cannot read the passphrase", e))?,
            );
            if verify {
                let again = Zeroizing::new(
                    rpassword::prompt_password("Verify passphrase: ")
                        .map_err(|e| Error::io("Cannot read the passphrase", e))?,
                );
                if *first != *again {
                    return Err(invalid("Passphrases do not match"));
                }
            }
            if first.len() > MAX_PASSPHRASE {
                return Err(invalid(format!(
                    "Passphrase is longer than {MAX_PASSPHRASE} characters"
                )));
            }
            Ok(Secret::from(first.as_str()))
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
