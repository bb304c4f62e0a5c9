//! cryptsetup's `open` options beyond a table line: plain mode as
//! `cryptsetup open --type plain` builds it (`daemon::plain`), the key-file
//! range (`--keyfile-offset`, `--keyfile-size`) for every volume type, and
//! `--test-passphrase`. Only argument checks and messages live here.

use std::path::Path;

use clap::Args;
use crypto::table::Table;
use daemon::plain::PlainOptions;
use daemon::resolve::VolumeType as Kind;
use luks::passphrase::KeyfileRange;

use super::daemon::{OpenArgs, VolumeType};
use crate::{CmdResult, Failure};

/// The options of `open` that cryptsetup has and a table line does not.
#[derive(Args, Clone, Debug, Default)]
#[command(disable_help_flag = true)]
pub struct PlainArgs {
    /// Print help (`-h` is `--hash`, as in cryptsetup).
    #[arg(long, short_alias = '?', action = clap::ArgAction::Help)]
    help: Option<bool>,
    /// Plain mode: cipher (default aes-cbc-essiv:sha256).
    #[arg(long, short = 'c')]
    pub cipher: Option<String>,
    /// Plain mode: key size in bits (default 256).
    #[arg(long, short = 's', value_name = "BITS")]
    pub key_size: Option<u32>,
    /// Plain mode: passphrase hash, HASH[:LEN] or `plain` (default ripemd160;
    /// a --key-file other than `-` is never hashed, as in cryptsetup).
    #[arg(long, short = 'h')]
    pub hash: Option<String>,
    /// Plain mode: start of the data on the device, in 512-byte sectors.
    #[arg(long, short = 'o', value_name = "SECTORS")]
    pub offset: Option<u64>,
    /// Plain mode: IV offset, in 512-byte sectors.
    #[arg(long, short = 'p', value_name = "SECTORS")]
    pub skip: Option<u64>,
    /// Plain mode: size of the device, in 512-byte sectors (default: the rest).
    #[arg(long, short = 'b', value_name = "SECTORS")]
    pub size: Option<u64>,
    /// Plain mode: encryption sector size in bytes (default 512).
    #[arg(long, value_name = "BYTES")]
    pub sector_size: Option<u32>,
    /// Plain mode: IVs count sectors of --sector-size, not 512 bytes.
    #[arg(long)]
    pub iv_large_sectors: bool,
    /// Skip this many bytes of the key file.
    #[arg(long, value_name = "BYTES")]
    pub keyfile_offset: Option<u64>,
    /// Read only this many bytes of the key file.
    #[arg(long, short = 'l', value_name = "BYTES")]
    pub keyfile_size: Option<u64>,
    /// LUKS: check the passphrase and exit (0, or 2 if wrong) without opening.
    #[arg(long)]
    pub test_passphrase: bool,
}

impl PlainArgs {
    fn range(&self) -> KeyfileRange {
        KeyfileRange {
            offset: self.keyfile_offset.unwrap_or(0),
            size: self.keyfile_size,
        }
    }

    /// The plain-mode option given first, if any (for refusals).
    fn plain_only(&self) -> Option<&'static str> {
        [
            (self.cipher.is_some(), "--cipher"),
            (self.key_size.is_some(), "--key-size"),
            (self.hash.is_some(), "--hash"),
            (self.offset.is_some(), "--offset"),
            (self.skip.is_some(), "--skip"),
            (self.size.is_some(), "--size"),
        ]
        .into_iter()
        .find_map(|(set, name)| set.then_some(name))
    }

    fn options(&self, key_file: Option<&Path>) -> PlainOptions {
        PlainOptions {
            cipher: self.cipher.clone(),
            key_bits: self.key_size,
            hash: self.hash.clone(),
            offset: self.offset.unwrap_or(0),
            skip: self.skip.unwrap_or(0),
            size: self.size,
            sector_size: self.sector_size,
            iv_large_sectors: self.iv_large_sectors,
            key_file: key_file.map(Path::to_path_buf),
            keyfile: self.range(),
        }
    }
}

/// Checks the option combinations cryptsetup refuses for `open` of `kind`.
fn check(a: &OpenArgs, kind: VolumeType) -> Result<(), Failure> {
    let p = &a.plain;
    let plain = kind == VolumeType::Plain;
    if p.test_passphrase && plain {
        return Err(Failure::usage(
            "Option --test-passphrase is allowed only for open of LUKS, TCRYPT, BITLK and FVAULT2 devices.",
        ));
    }
    if p.sector_size.is_some() && !plain {
        return Err(Failure::usage(
            "Sector size option with open action is supported only for plain devices.",
        ));
    }
    if p.iv_large_sectors && (!plain || p.sector_size.unwrap_or(512) <= 512) {
        return Err(Failure::usage(
            "Large IV sectors option is supported only for opening plain type device with sector size larger than 512 bytes.",
        ));
    }
    let table = a.table.is_some() || a.table_stdin;
    if let Some(opt) = p.plain_only() {
        if !plain || table {
            return Err(Failure::usage(format!(
                "{opt} is for --type plain without --table (a table line gives the mapping itself)"
            )));
        }
    }
    if table && (p.keyfile_offset.is_some() || p.keyfile_size.is_some() || p.sector_size.is_some())
    {
        return Err(Failure::usage(
            "--keyfile-offset, --keyfile-size and --sector-size do not apply to --table (its key file is the raw key)",
        ));
    }
    Ok(())
}

/// Builds the mapping `open` serves: a plain table from cryptsetup's
/// options or a `--table` line, or an unlocked LUKS header. Prompts here.
pub fn resolve(a: &OpenArgs, kind: VolumeType, device: &Path) -> Result<(Table, Kind), Failure> {
    check(a, kind)?;
    match kind {
        VolumeType::Plain => {
            if let Some(line) = a.table.as_deref() {
                let table = daemon::resolve::plain_table_arg(line, a.key_file.as_deref(), true)?;
                return Ok((table, Kind::Plain));
            }
            let o = a.plain.options(a.key_file.as_deref());
            for w in o.warnings() {
                eprintln!("{w}");
            }
            Ok((o.open(device)?, Kind::Plain))
        }
        VolumeType::Luks | VolumeType::Luks1 | VolumeType::Luks2 => {
            if a.table.is_some() {
                return Err(Failure::usage("--table is only for --type plain"));
            }
            let want = match kind {
                VolumeType::Luks1 => Some(Kind::Luks1),
                VolumeType::Luks2 => Some(Kind::Luks2),
                _ => None,
            };
            let header = a.header.as_deref();
            let vol = daemon::resolve::Luks::load(device, header)?;
            if want.is_some_and(|w| w != vol.version()) {
                return Err(Failure::usage(format!(
                    "Device {} is not a valid LUKS device",
                    header.unwrap_or(device).display()
                )));
            }
            for w in vol.warnings() {
                eprintln!("WARNING: {w}");
            }
            let pass = luks::passphrase::read_range(
                a.key_file.as_deref(),
                a.plain.range(),
                &format!("Enter passphrase for {}: ", device.display()),
                false,
            )?;
            Ok((vol.unlock(&pass, a.key_slot)?, vol.version()))
        }
    }
}

/// `open --test-passphrase DEVICE [NAME]`: unlocks the LUKS header and
/// stops there (exit 0; a wrong passphrase is 2), as cryptsetup does.
pub fn test_passphrase(a: &OpenArgs) -> CmdResult {
    let kind = a.kind.unwrap_or(VolumeType::Luks);
    check(a, kind)?;
    let device = daemon::resolve::device(&a.device)?;
    resolve(a, kind, &device).map(|_| ())
}
