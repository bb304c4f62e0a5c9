//! From a volume spec to the dm-crypt [`Table`] the engine runs: a plain
//! table line, or a LUKS header unlocked with a passphrase.
//!
//! ```text
//!  "0 2048 crypt aes-xts-plain64 <key> 0 <dev> 0"  ── plain_table ──┐
//!  LUKS header (device or --header) ── Luks::load ─┐                ├─► Table
//!                     passphrase ───────── unlock ─┴────────────────┘
//! ```
//!
//! Prompting for the passphrase is the caller's business: [`Luks::load`]
//! first (so a device that is no LUKS volume fails before any prompt),
//! then [`Luks::unlock`] with the bytes. Keys stay in zeroizing buffers;
//! the [`Table`] wipes its key on drop.
//!
//! A plain table given on the command line ([`plain_table_arg`]) keeps
//! its key off argv, where `ps` shows it to every user:
//!
//! ```text
//!  --table -                         the whole line from stdin (as dmsetup reads tables)
//!  --table '... crypt CIPHER - ...'  the raw key bytes from --key-file FILE (- = stdin)
//!    --key-file FILE                  (the key field `-` is the placeholder)
//!  --table '... crypt CIPHER <hex> ...'  still works, with a warning on stderr
//! ```

use std::io::Read;
use std::path::{Path, PathBuf};

use crypto::table::{Table, Targets};
use crypto::Secret;
use datapath::{CryptMode, EngineConfig, PerfFlags};
use serde::{Deserialize, Serialize};

use crate::error::{invalid, Error, ErrorKind, Result};

mod bitlk;
mod fvault2;
mod mapping;
pub mod tcrypt;
pub use bitlk::{bitlk_as_luks, load_bitlk_metadata, unlock_bitlk};
pub use fvault2::{fvault2_as_luks, load_fvault2_metadata, unlock_fvault2};
pub use mapping::{Mapping, PlainGiven};

/// What kind of volume is served (shown by `status` as `type`; on the
/// control socket as its [`VolumeType::name`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
#[non_exhaustive]
pub enum VolumeType {
    /// A plain dm-crypt mapping.
    Plain,
    /// A LUKS1 volume.
    Luks1,
    /// A LUKS2 volume.
    Luks2,
    /// A LUKS volume whose version could not be read back.
    Luks,
    /// A BitLocker volume (`--type bitlk`).
    Bitlk,
    /// A FileVault 2 volume (`--type fvault2`, read-only).
    Fvault2,
    /// A TrueCrypt or VeraCrypt volume.
    Tcrypt,
}

impl VolumeType {
    /// `PLAIN`, `LUKS1`, `LUKS2`, `LUKS`, `BITLK`, `FVAULT2` or `TCRYPT`, as `cryptsetup status` prints.
    pub fn name(self) -> &'static str {
        match self {
            Self::Plain => "PLAIN",
            Self::Luks1 => "LUKS1",
            Self::Luks2 => "LUKS2",
            Self::Luks => "LUKS",
            Self::Bitlk => "BITLK",
            Self::Fvault2 => "FVAULT2",
            Self::Tcrypt => "TCRYPT",
        }
    }

    /// The LUKS version of the header at `header`, from its magic and
    /// version fields ([`VolumeType::Luks`] if unreadable).
    pub fn of_header(header: &Path) -> Self {
        let mut b = [0u8; 8];
        let ok = std::fs::File::open(header)
            .and_then(|mut f| f.read_exact(&mut b))
            .is_ok();
        match (ok, &b[..6], u16::from_be_bytes([b[6], b[7]])) {
            (true, b"LUKS\xba\xbe", 1) => Self::Luks1,
            (true, b"LUKS\xba\xbe", 2) => Self::Luks2,
            _ => Self::Luks,
        }
    }
}

/// The backing device as an absolute path (a detached daemon runs in
/// `/`); [`ErrorKind::NoDevice`] if it does not exist.
pub fn device(path: &Path) -> Result<PathBuf> {
    if backend::rbd::is_rbd(path) {
        // An RBD image is named, not a path: nothing to make absolute,
        // and only opening it asks the cluster whether it exists.
        return Ok(path.to_path_buf());
    }
    let missing = |p: &Path| format!("Device {} does not exist or access denied", p.display());
    let abs = std::path::absolute(path)
        .map_err(|e| Error::new(ErrorKind::NoDevice, missing(path)).with_source(e))?;
    if !abs.exists() {
        return Err(Error::new(ErrorKind::NoDevice, missing(&abs) + "."));
    }
    Ok(abs)
}

/// Parses a dm-crypt table line (`Invalid table: …` on error).
pub fn plain_table(line: &str) -> Result<Table> {
    Table::parse(line.trim()).map_err(|e| invalid("Invalid table").with_source(e))
}

/// Parses a dm table of one or more lines (`Invalid table: …` on error).
pub fn plain_targets(text: &str) -> Result<Targets> {
    Targets::parse(text).map_err(|e| invalid("Invalid table").with_source(e))
}

/// Largest key file read for a plain table (far above any dm-crypt key).
pub const MAX_KEY_FILE: usize = 64 << 10;

/// Largest table read from stdin (every line of a multi-target table).
const MAX_TABLE_LINE: usize = 60 << 10;

/// Reads a table's text from `arg`: `-` is standard input, anything else
/// a file (as `dmsetup create NAME FILE`), into locked memory (a table
/// holds keys). At most 60 KiB.
pub fn read_table_text(arg: &str) -> Result<Secret> {
    let too_big = |what: String| {
        move |e: std::io::Error| {
            if e.kind() == std::io::ErrorKind::InvalidData {
                invalid(format!(
                    "The table in {what} is larger than {} KiB",
                    MAX_TABLE_LINE >> 10
                ))
            } else {
                invalid(format!("Cannot read the table from {what}")).with_source(e)
            }
        }
    };
    if arg == "-" {
        return Secret::read_stdin(MAX_TABLE_LINE).map_err(too_big("stdin".into()));
    }
    let f = std::fs::File::open(arg)
        .map_err(|e| invalid(format!("Cannot open table file {arg}")).with_source(e))?;
    Secret::read_from(f, MAX_TABLE_LINE).map_err(too_big(arg.to_owned()))
}

/// The table of `--table ARG [--key-file FILE]` (see the module doc):
/// `ARG` `-` reads the table from stdin, an `ARG` without blanks names a
/// file holding it (one or more lines, as `dmsetup create` reads), any
/// other `ARG` is the line itself; with `key_file` the one line's key
/// field must be `-` and the key is the file's raw bytes (`-` = stdin).
/// A literal key in `ARG` draws a warning on stderr. `stdin_free` is false
/// when stdin carries something else (`map --write`'s plaintext): then
/// neither may come from it.
pub fn plain_table_arg(arg: &str, key_file: Option<&Path>, stdin_free: bool) -> Result<Targets> {
    let stdin = Path::new("-");
    let table_on_stdin = arg.trim() == "-";
    let table_in_file = !table_on_stdin && !arg.trim().contains(|c: char| c.is_ascii_whitespace());
    if table_on_stdin && key_file == Some(stdin) {
        return Err(invalid(
            "--table - and --key-file - both read stdin: give the key file by name",
        ));
    }
    if !stdin_free && (table_on_stdin || key_file == Some(stdin)) {
        // (a table file is fine: only `-` reads stdin)
        return Err(invalid(
            "--write reads plaintext from stdin: give the table and key file by name, not as -",
        ));
    }
    let line = if table_on_stdin || table_in_file {
        Some(read_table_text(arg.trim())?)
    } else {
        None
    };
    let text = match &line {
        Some(l) => l
            .as_str()
            .ok_or_else(|| invalid("Invalid table: the table read is not UTF-8"))?,
        None => arg,
    };
    let Some(kf) = key_file else {
        let t = plain_targets(text)?;
        if line.is_none() && t.tables().any(|t| !t.key().is_empty()) {
            eprintln!(
                "ucrypt: warning: the key in --table is visible to every user (ps, /proc/PID/cmdline); \
                 give it with --key-file FILE (key field -) or the whole line on stdin (--table -)"
            );
        }
        return Ok(t);
    };
    let key = read_key_file(kf)?;
    Targets::parse_with_key(text, key).map_err(|e| invalid("Invalid table").with_source(e))
}

/// The raw bytes of a plain table's key file (`-` = stdin), read into
/// locked memory.
pub fn read_key_file(path: &Path) -> Result<Secret> {
    let too_big = |e: std::io::Error| {
        if e.kind() == std::io::ErrorKind::InvalidData {
            invalid(format!(
                "Key file {} is larger than {} KiB: no dm-crypt key is that long",
                path.display(),
                MAX_KEY_FILE >> 10
            ))
        } else {
            invalid(format!("Cannot read key file {}", path.display())).with_source(e)
        }
    };
    if path == Path::new("-") {
        return Secret::read_stdin(MAX_KEY_FILE).map_err(too_big);
    }
    let f = std::fs::File::open(path)
        .map_err(|e| invalid(format!("Cannot open key file {}", path.display())).with_source(e))?;
    Secret::read_from(f, MAX_KEY_FILE).map_err(too_big)
}

/// A LUKS volume whose header has been read, not yet unlocked.
pub struct Luks {
    vol: luks::Volume,
    device: PathBuf,
    version: VolumeType,
}

impl Luks {
    /// Reads the LUKS header of `device` (or the detached `header`).
    ///
    /// Fails with [`ErrorKind::NoDevice`] when `device` does not exist and
    /// [`ErrorKind::InvalidInput`] when it holds no LUKS header. Both are
    /// opened as `access` says.
    pub fn load(device: &Path, header: Option<&Path>, access: &luks::DeviceAccess) -> Result<Self> {
        let vol = luks::ops::open_header(device, header, access)?;
        let version = match vol.header() {
            luks::Header::V1(_) => VolumeType::Luks1,
            luks::Header::V2(_) => VolumeType::Luks2,
        };
        Ok(Self {
            vol,
            device: device.to_path_buf(),
            version,
        })
    }

    /// [`Luks::load`] requiring one LUKS version (`open --type luks1|luks2`):
    /// any other is "not a valid LUKS device" ([`ErrorKind::InvalidInput`]),
    /// as in cryptsetup.
    pub fn load_as(
        device: &Path,
        header: Option<&Path>,
        access: &luks::DeviceAccess,
        want: Option<VolumeType>,
    ) -> Result<Self> {
        let vol = Self::load(device, header, access)?;
        if want.is_some_and(|w| w != vol.version) {
            return Err(invalid(format!(
                "Device {} is not a valid LUKS device",
                header.unwrap_or(device).display()
            )));
        }
        Ok(vol)
    }

    /// Warnings about the header (unknown LUKS2 features and the like).
    pub fn warnings(&self) -> &[String] {
        self.vol.header().warnings()
    }

    /// [`VolumeType::Luks1`] or [`VolumeType::Luks2`].
    pub fn version(&self) -> VolumeType {
        self.version
    }

    /// Unlocks with `passphrase` (only `key_slot` if given) and returns the
    /// table cryptsetup would load. A wrong passphrase is
    /// [`ErrorKind::WrongPassphrase`].
    pub fn unlock(&self, passphrase: &[u8], key_slot: Option<u32>) -> Result<Table> {
        let opened = self.vol.unlock(passphrase, key_slot)?;
        Ok(opened.to_table(&self.device)?)
    }

    /// Tries the header's tokens as `args` allow ([`tokens::unlock`]; a
    /// PIN asked as `prompting` says):
    /// when a key file is given only if `args` names tokens, as
    /// cryptsetup does. `Ok(None)`: no token opened a keyslot and a
    /// passphrase may be asked for; with `--token-only` that is an error
    /// (cryptsetup's "No usable token is available.").
    pub fn unlock_tokens(
        &self,
        args: &tokens::TokenOptions,
        prompting: &luks::passphrase::Prompting,
        key_file_given: bool,
    ) -> Result<Option<Table>> {
        let ids = self.vol.token_ids();
        let wanted = args.asked() || !key_file_given;
        if !wanted || self.version != VolumeType::Luks2 {
            return if args.token_only {
                Err(invalid("No usable token is available."))
            } else {
                Ok(None)
            };
        }
        let list: Vec<(u32, String)> = ids
            .iter()
            .filter_map(|&id| self.vol.token_export(id).ok().map(|t| (id, t)))
            .collect();
        let falling_back = !args.token_only;
        let opened = tokens::unlock(&list, args, prompting, falling_back, &mut |pass, slots| {
            let mut why = String::from("the passphrase opens none of its keyslots");
            for &slot in slots {
                match self.vol.unlock(pass, Some(slot)) {
                    Ok(o) => return Ok(o),
                    Err(e) if e.kind() == luks::ErrorKind::WrongPassphrase => {}
                    Err(e) => why = format!("keyslot {slot}: {e}"),
                }
            }
            Err(why)
        });
        match opened {
            Some(o) => Ok(Some(o.to_table(&self.device)?)),
            None if args.token_only => Err(Error::new(
                if list.is_empty() {
                    ErrorKind::InvalidInput
                } else {
                    ErrorKind::WrongPassphrase
                },
                "No usable token is available.",
            )),
            None => Ok(None),
        }
    }

    /// [`Luks::unlock`] with a passphrase from `range` of `key_file` or a
    /// prompt for this device, asked again when one typed at the terminal
    /// opens nothing (cryptsetup's `--tries`,
    /// [`luks::passphrase::Prompting::unlock`]).
    pub fn unlock_asking(
        &self,
        key_file: Option<&Path>,
        range: luks::passphrase::KeyfileRange,
        key_slot: Option<u32>,
        prompting: &luks::passphrase::Prompting,
    ) -> Result<Table> {
        let prompt = format!("Enter passphrase for {}: ", self.device.display());
        let opened = prompting.unlock(key_file, range, &prompt, |pass| {
            self.vol.unlock(pass, key_slot)
        })?;
        Ok(opened.to_table(&self.device)?)
    }
}

/// Unlocks the LUKS volume on `device` for `open` and `map --luks`: the
/// header is read first, so a device that is no LUKS volume (or not the
/// `want`ed version) fails before the prompt; `warn` gets the header's
/// warnings; the header's tokens are tried first ([`Luks::unlock_tokens`]),
/// then the passphrase comes from `range` of `key_file` (cryptsetup's
/// `--keyfile-offset`/`--keyfile-size`) or a prompt (asked as `prompting`
/// says). Returns the table cryptsetup would load and the LUKS version.
/// Header and device are opened as `access` says.
#[allow(clippy::too_many_arguments)]
pub fn unlock_luks(
    device: &Path,
    header: Option<&Path>,
    access: &luks::DeviceAccess,
    key_file: Option<&Path>,
    range: luks::passphrase::KeyfileRange,
    key_slot: Option<u32>,
    want: Option<VolumeType>,
    tokens: &tokens::TokenOptions,
    prompting: &luks::passphrase::Prompting,
    mut warn: impl FnMut(&str),
) -> Result<(Targets, VolumeType)> {
    let reencrypting = unlock_reencrypting(
        device, header, access, key_file, range, key_slot, want, true, prompting,
    )?;
    if let Some(t) = reencrypting {
        return Ok((t, VolumeType::Luks2));
    }
    let vol = Luks::load_as(device, header, access, want)?;
    vol.warnings().iter().for_each(|w| warn(w));
    if let Some(t) = vol.unlock_tokens(tokens, prompting, key_file.is_some())? {
        return Ok((t.into(), vol.version()));
    }
    Ok((
        vol.unlock_asking(key_file, range, key_slot, prompting)?
            .into(),
        vol.version(),
    ))
}

/// A LUKS2 volume stopped in the middle of a reencryption, encryption or
/// decryption (by ucrypt or cryptsetup, between two hotzones): the
/// multi-target table cryptsetup would load for it, one target per data
/// segment — dm-crypt under the new key on the moved side and the old
/// key on the other, dm-linear where a side is plaintext, read at its
/// offset (an encryption with a data shift reads its first bytes from
/// the moved segment at the device's end) — ([`luks::reencrypt::tables`];
/// the passphrase must open every key in use). The header is `header`
/// (detached) or on `device`. `None` when it holds no such volume, so
/// the ordinary LUKS path answers (and names what is wrong). A hotzone a
/// crash tore is repaired first when `repair` (as cryptsetup recovers it
/// at activation: the resilience data says which blocks are still old),
/// and refused otherwise (`open --test-passphrase` writes nothing).
#[allow(clippy::too_many_arguments)]
pub fn unlock_reencrypting(
    device: &Path,
    header: Option<&Path>,
    access: &luks::DeviceAccess,
    key_file: Option<&Path>,
    range: luks::passphrase::KeyfileRange,
    key_slot: Option<u32>,
    want: Option<VolumeType>,
    repair: bool,
    prompting: &luks::passphrase::Prompting,
) -> Result<Option<Targets>> {
    if want.is_some_and(|w| w != VolumeType::Luks2) {
        return Ok(None);
    }
    let meta = header.unwrap_or(device);
    let torn = match luks::reencrypt::status(meta, access) {
        Ok(Some(st)) => st.hotzone().is_some(),
        _ => return Ok(None),
    };
    let prompt = format!("Enter passphrase for {}: ", device.display());
    let tables = prompting.unlock(key_file, range, &prompt, |pass| {
        if torn && repair {
            let stop = std::sync::atomic::AtomicBool::new(true);
            let opts = luks::reencrypt::RunOptions {
                header: header.map(Path::to_path_buf),
                access: access.clone(),
                ..Default::default()
            };
            let done = luks::reencrypt::run(device, pass, key_slot, &opts, &stop, &mut |_, _| {})?;
            if done == luks::reencrypt::Outcome::Finished {
                // The torn hotzone was the last: the volume is an
                // ordinary one now.
                return Ok(None);
            }
        }
        luks::reencrypt::tables_at(device, meta, access, pass, key_slot).map(Some)
    })?;
    match tables {
        Some(t) => Targets::new(t)
            .map(Some)
            .map_err(|e| invalid("Invalid reencryption table").with_source(e)),
        None => Ok(None),
    }
}

/// `open --test-passphrase` of a LUKS2 volume stopped in the middle of a
/// reencryption, encryption or decryption: the passphrase (from `range`
/// of `key_file` or a prompt, as [`unlock_reencrypting`] asks it) is
/// checked against the keys in use and nothing is resolved, as
/// cryptsetup checks it ([`luks::reencrypt::test_passphrase`]; a data
/// area of no bytes is no error). `false` when the header holds no
/// volume in reencryption, so the ordinary LUKS path answers.
#[allow(clippy::too_many_arguments)]
pub fn test_reencrypting(
    device: &Path,
    header: Option<&Path>,
    access: &luks::DeviceAccess,
    key_file: Option<&Path>,
    range: luks::passphrase::KeyfileRange,
    key_slot: Option<u32>,
    want: Option<VolumeType>,
    prompting: &luks::passphrase::Prompting,
) -> Result<bool> {
    if want.is_some_and(|w| w != VolumeType::Luks2) {
        return Ok(false);
    }
    let meta = header.unwrap_or(device);
    if !matches!(luks::reencrypt::status(meta, access), Ok(Some(_))) {
        return Ok(false);
    }
    luks::reencrypt::check_data_device(device, meta, access)?;
    let prompt = format!("Enter passphrase for {}: ", device.display());
    prompting.unlock(key_file, range, &prompt, |pass| {
        luks::reencrypt::test_passphrase(device, meta, access, pass, key_slot)
    })?;
    Ok(true)
}

/// Loads and unlocks the LUKS volume on `device` in one step (locking
/// its header, an `rbd:` device reached with librados's defaults); see
/// [`Luks`].
pub fn luks_table(
    device: &Path,
    header: Option<&Path>,
    passphrase: &[u8],
    key_slot: Option<u32>,
) -> Result<Table> {
    Luks::load(device, header, &luks::DeviceAccess::default())?.unlock(passphrase, key_slot)
}

/// The engine configuration for serving `table` with the options given on
/// the command line. As with dm-crypt, a performance flag or
/// `allow_discards` set in the table line or given is on; `table` is
/// updated to show what is in effect (so `table` prints it back). In a
/// table of several targets the engine runs with what any crypt line
/// asks for, and every crypt line is updated to show it.
pub fn engine_config(
    table: &mut Targets,
    mode: CryptMode,
    given: PerfFlags,
    allow_discards: bool,
    read_only: bool,
) -> EngineConfig {
    // One engine serves every line: it takes each flag any line (or the
    // command line) sets. The lines then share the workqueue flags, while
    // `high_priority` stays on the lines that named it, as dm-crypt keeps
    // it per target.
    let mut flags = given;
    let mut discards = allow_discards;
    for t in table.tables_mut() {
        flags = flags.union(t.options.perf);
        discards |= t.options.allow_discards;
    }
    for t in table.tables_mut() {
        t.options.perf = t.options.perf.with_workqueue_flags_of(flags);
        t.options.allow_discards = discards;
    }
    EngineConfig {
        mode,
        flags,
        allow_discards: discards,
        read_only,
        ..EngineConfig::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crypto::perf::Flag;

    #[test]
    fn volume_type_from_the_header_magic() {
        let dir = testutil::TempDir::new("daemon-resolve");
        let h = dir.join("hdr");
        for (bytes, want) in [
            (&b"LUKS\xba\xbe\x00\x01rest"[..], VolumeType::Luks1),
            (&b"LUKS\xba\xbe\x00\x02rest"[..], VolumeType::Luks2),
            (&b"LUKS\xba\xbe\x00\x03rest"[..], VolumeType::Luks),
            (&b"LUKS"[..], VolumeType::Luks),
        ] {
            std::fs::write(&h, bytes).unwrap();
            assert_eq!(VolumeType::of_header(&h), want);
        }
        assert_eq!(VolumeType::of_header(&dir.join("none")), VolumeType::Luks);
        assert_eq!(VolumeType::Luks2.name(), "LUKS2");
        assert_eq!(
            serde_json::to_string(&VolumeType::Plain).unwrap(),
            "\"PLAIN\""
        );
    }

    #[test]
    fn devices_and_tables_fail_with_their_kinds() {
        let dir = testutil::TempDir::new("daemon-resolve-dev");
        let e = device(&dir.join("missing")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NoDevice);
        assert!(e
            .to_string()
            .ends_with("missing does not exist or access denied."));
        assert!(device(Path::new(".")).unwrap().is_absolute());

        let e = plain_table("0 8 crypt").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(e.chain().starts_with("Invalid table: "), "{}", e.chain());

        let e = Luks::load(&dir.join("missing"), None, &luks::DeviceAccess::default())
            .err()
            .unwrap();
        assert_eq!(e.kind(), ErrorKind::NoDevice);
        std::fs::write(dir.join("zeros"), vec![0u8; 8192]).unwrap();
        let e = Luks::load(&dir.join("zeros"), None, &luks::DeviceAccess::default())
            .err()
            .unwrap();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(
            e.to_string().ends_with("zeros is not a valid LUKS device"),
            "{e}"
        );
    }

    #[test]
    fn the_engine_takes_every_lines_flags_and_high_priority_stays_on_its_line() {
        const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
        let mut t = plain_targets(&format!(
            "0 8 crypt aes-xts-plain64 {KEY} 0 /x 0 1 high_priority\n\
             8 8 crypt aes-xts-plain64 {KEY} 0 /x 8 1 no_read_workqueue"
        ))
        .unwrap();
        let cfg = engine_config(
            &mut t,
            CryptMode::Classic,
            PerfFlags::default(),
            false,
            false,
        );
        assert!(cfg.flags.get(Flag::HighPriority), "{:?}", cfg.flags);
        assert!(cfg.flags.get(Flag::NoReadWorkqueue), "{:?}", cfg.flags);
        let lines: Vec<PerfFlags> = t.tables_mut().map(|l| l.options.perf).collect();
        assert!(lines[0].get(Flag::HighPriority) && lines[0].get(Flag::NoReadWorkqueue));
        assert!(!lines[1].get(Flag::HighPriority) && lines[1].get(Flag::NoReadWorkqueue));
    }

    #[test]
    fn plain_tables_take_keys_from_key_files() {
        const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
        let dir = testutil::TempDir::new("daemon-resolve-keyfile");
        let kf = dir.join("key");
        std::fs::write(&kf, hex_bytes(KEY)).unwrap();
        let t = plain_table_arg("0 8 crypt aes-xts-plain64 - 0 /x 0", Some(&kf), true).unwrap();
        assert_eq!(t.as_single().unwrap().key(), &hex_bytes(KEY)[..]);
        assert_eq!(
            t,
            plain_table_arg(
                &format!("0 8 crypt aes-xts-plain64 {KEY} 0 /x 0"),
                None,
                true
            )
            .unwrap()
        );
        let e = plain_table_arg(
            &format!("0 8 crypt aes-xts-plain64 {KEY} 0 /x 0"),
            Some(&kf),
            true,
        )
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
        assert!(!e.chain().contains(KEY), "{}", e.chain());
        let e = plain_table_arg(
            "0 8 crypt aes-xts-plain64 - 0 /x 0",
            Some(&dir.join("no")),
            true,
        )
        .unwrap_err();
        assert!(
            e.chain().starts_with("Cannot open key file"),
            "{}",
            e.chain()
        );
        std::fs::write(&kf, vec![1u8; MAX_KEY_FILE + 1]).unwrap();
        let e = plain_table_arg("0 8 crypt aes-xts-plain64 - 0 /x 0", Some(&kf), true).unwrap_err();
        assert!(e.chain().contains("larger than 64 KiB"), "{}", e.chain());
        let stdin = Some(Path::new("-"));
        for (arg, key, stdin_free) in [
            ("-", stdin, true),
            ("-", None, false),
            ("0 8", stdin, false),
        ] {
            let e = plain_table_arg(arg, key, stdin_free).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput);
            assert!(e.chain().contains("stdin"), "{}", e.chain());
        }
    }

    fn hex_bytes(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn given_options_are_merged_into_the_table() {
        let mut t = plain_targets(
            "0 8 crypt aes-xts-plain64 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f 0 /x 0 1 no_read_workqueue",
        )
        .unwrap();
        let given = PerfFlags {
            same_cpu_crypt: true,
            ..PerfFlags::default()
        };
        let cfg = engine_config(&mut t, CryptMode::Adaptive, given, true, true);
        assert!(cfg.flags.same_cpu_crypt && cfg.flags.no_read_workqueue);
        assert!(!cfg.flags.no_write_workqueue && !cfg.flags.submit_from_crypt_cpus);
        assert!(cfg.allow_discards && cfg.read_only);
        assert_eq!(cfg.mode, CryptMode::Adaptive);
        assert!(t
            .format(false)
            .ends_with(" 3 allow_discards same_cpu_crypt no_read_workqueue"));
    }

    #[test]
    fn every_crypt_line_of_a_table_shows_the_flags_in_effect() {
        const K: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";
        let mut t = plain_targets(&format!(
            "0 8 crypt aes-xts-plain64 {K} 0 /x 0 1 no_read_workqueue\n8 8 linear /x 8\n16 8 crypt aes-xts-plain64 {K} 16 /x 16"
        ))
        .unwrap();
        let cfg = engine_config(
            &mut t,
            CryptMode::Inline,
            PerfFlags::default(),
            false,
            false,
        );
        assert!(cfg.flags.no_read_workqueue);
        let text = t.format(false);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(
            lines[0].ends_with(" 1 no_read_workqueue")
                && lines[2].ends_with(" 1 no_read_workqueue"),
            "{text}"
        );
        assert_eq!(lines[1], "8 8 linear /x 8");
    }
}
