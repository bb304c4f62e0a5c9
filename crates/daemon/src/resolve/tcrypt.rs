//! `--type tcrypt`: a TrueCrypt or VeraCrypt volume turned into the table
//! the engine serves (`open`, `open --test-passphrase`, `map --tcrypt`),
//! and the header `tcryptDump` prints. The header work is the `tcrypt`
//! crate's; this module reads the passphrase as cryptsetup does (a line of
//! piped stdin, possibly empty, or a prompt retried up to `--tries`) and
//! maps its errors to this crate's kinds (no header: a wrong passphrase,
//! exit 2).
//!
//! A chain of several ciphers becomes one crypt target carrying its lower
//! layers (`crypto::table::Table::stacked`): cryptsetup stacks one
//! dm-crypt device per cipher; here the engine runs the layers as one
//! stacked `SectorCrypt`, so every frontend, `map` and the choke point
//! see one device, and `table`/`status` show one line per layer.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use crypto::table::Targets;
use crypto::Secret;

use crate::error::{Error, ErrorKind, Result};

/// cryptsetup's TCRYPT switches (`open`, `map`, `tcryptDump`; the cli's
/// `--tcrypt-hidden`, `--tcrypt-system`, `--tcrypt-backup`,
/// `--veracrypt`, `--disable-veracrypt`, `--veracrypt-pim`).
#[derive(Clone, Debug, Default)]
pub struct TcryptArgs {
    /// Use the hidden volume's header.
    pub tcrypt_hidden: bool,
    /// Use the system encryption header.
    pub tcrypt_system: bool,
    /// Use the backup header at the device's end.
    pub tcrypt_backup: bool,
    /// `--veracrypt` (the default; accepted as cryptsetup 2.6 does).
    pub veracrypt: bool,
    /// Do not try VeraCrypt's KDFs and header magic.
    pub disable_veracrypt: bool,
    /// VeraCrypt Personal Iteration Multiplier.
    pub veracrypt_pim: Option<u32>,
    /// crypttab's key file field for a TCRYPT line: the passphrase is its
    /// first line (without the newline), as systemd-cryptsetup reads it.
    pub passphrase_file: Option<PathBuf>,
    /// crypttab's `tcrypt-keyfile=` options: TrueCrypt keyfiles after
    /// `--key-file`'s.
    pub keyfiles: Vec<PathBuf>,
}

/// Everything a TCRYPT header search takes.
#[derive(Debug, Clone, Copy)]
pub struct Given<'a> {
    /// The device (or image file) holding the header.
    pub device: &'a Path,
    /// TrueCrypt keyfiles (`--key-file`, repeatable where the verb allows).
    pub keyfiles: &'a [PathBuf],
    /// `--hash`: only this PBKDF2 hash.
    pub hash: Option<&'a str>,
    /// `--cipher`: only chains containing this.
    pub cipher: Option<&'a str>,
    /// The TCRYPT switches.
    pub args: &'a TcryptArgs,
    /// How a passphrase typed at the terminal is asked for (`--tries`,
    /// `--timeout`, `-y`, crypttab's `try-empty-password`).
    pub prompting: luks::passphrase::Prompting,
}

/// A tcrypt error as this crate's: no header is a wrong passphrase (2),
/// the rest bad input (1), as cryptsetup's -EPERM / -EINVAL / -ENOTSUP.
fn error(e: tcrypt::Error) -> Error {
    let kind = match e.kind() {
        tcrypt::ErrorKind::NoHeader => ErrorKind::WrongPassphrase,
        _ => ErrorKind::InvalidInput,
    };
    Error::transparent(kind, e)
}

/// Longest passphrase read (VeraCrypt's 128 is the format's limit; longer
/// ones are refused by the header search with cryptsetup's message).
const MAX_LINE: usize = 512;

/// The first line of a passphrase file (crypttab's key file field).
fn read_passphrase_file(path: &Path) -> Result<Secret> {
    let f = std::fs::File::open(path).map_err(|e| {
        Error::new(
            ErrorKind::InvalidInput,
            format!("Cannot open the passphrase file {}", path.display()),
        )
        .with_source(e)
    })?;
    let mut all = Secret::read_from(f, luks::passphrase::MAX_KEYFILE as usize).map_err(|e| {
        Error::new(
            ErrorKind::InvalidInput,
            format!("Cannot read the passphrase file {}", path.display()),
        )
        .with_source(e)
    })?;
    if let Some(end) = all.iter().position(|&b| b == b'\n') {
        all.truncate(end);
    }
    Ok(all)
}

/// One passphrase: a prompt at a terminal, else one line of stdin (empty
/// allowed: a volume may open by keyfiles alone).
fn read_passphrase(device: &Path, prompting: &luks::passphrase::Prompting) -> Result<Secret> {
    if std::io::stdin().is_terminal() {
        let prompt = format!("Enter passphrase for {}: ", device.display());
        return prompting.read(None, &prompt, false).map_err(Error::from);
    }
    luks::passphrase::stdin_line(MAX_LINE).map_err(|e| {
        Error::new(
            ErrorKind::InvalidInput,
            "Cannot read the passphrase from stdin",
        )
        .with_source(e)
    })
}

impl Given<'_> {
    /// The header search cryptsetup's CLI asks for (legacy modes always,
    /// VeraCrypt unless disabled).
    pub fn request(&self) -> tcrypt::Request {
        tcrypt::Request {
            keyfiles: self.keyfiles.to_vec(),
            hash: self.hash.map(str::to_owned),
            cipher: self.cipher.map(str::to_owned),
            pim: self.args.veracrypt_pim.unwrap_or(0),
            veracrypt: !self.args.disable_veracrypt,
            legacy: true,
            hidden: self.args.tcrypt_hidden,
            system: self.args.tcrypt_system,
            backup: self.args.tcrypt_backup,
        }
    }

    /// Reads the passphrase and decrypts the header; a passphrase typed at
    /// a terminal that finds no header is asked for again, up to
    /// [`luks::passphrase::Prompting::tries`], with cryptsetup's message
    /// each time.
    pub fn load(&self) -> Result<tcrypt::Volume> {
        if self.args.tcrypt_hidden && self.args.tcrypt_system {
            return Err(Error::new(
                ErrorKind::InvalidInput,
                "Option --tcrypt-hidden cannot be combined with --tcrypt-system.",
            ));
        }
        if self.args.veracrypt_pim == Some(0) {
            return Err(Error::new(ErrorKind::InvalidInput, "Invalid PIM value: 0."));
        }
        let device = super::device(self.device)?;
        let req = self.request();
        if let Some(f) = &self.args.passphrase_file {
            let pass = read_passphrase_file(f)?;
            return tcrypt::load(&device, &pass, &req).map_err(error);
        }
        // crypttab's try-empty-password: an empty passphrase first.
        if self.prompting.try_empty {
            match tcrypt::load(&device, &Secret::from_slice(b""), &req) {
                Err(e) if e.kind() == tcrypt::ErrorKind::NoHeader => {}
                r => return r.map_err(error),
            }
        }
        let typed = std::io::stdin().is_terminal();
        let mut left = if typed { self.prompting.tries() } else { 1 };
        loop {
            let pass = read_passphrase(&device, &self.prompting)?;
            match tcrypt::load(&device, &pass, &req) {
                Err(e) if e.kind() == tcrypt::ErrorKind::NoHeader && left > 1 => {
                    eprintln!("{e}");
                    left -= 1;
                }
                r => return r.map_err(error),
            }
        }
    }

    /// The table cryptsetup would activate for this volume, over `device`
    /// (absolute; a cascade is one target with its layers stacked).
    pub fn targets(&self, device: &Path) -> Result<Targets> {
        let vol = self.load()?;
        let dev = device
            .to_str()
            .ok_or_else(|| Error::new(ErrorKind::InvalidInput, "Device path is not UTF-8"))?;
        Ok(Targets::single(vol.table(dev).map_err(error)?))
    }
}
