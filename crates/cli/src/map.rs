//! `ucrypt map` (the cli's library side; `cmd::crypt` parses and prints):
//! a dm-crypt table applied to its file or block device with
//! no frontend, every byte going through [`datapath::Engine`] so the same
//! single check point (range, alignment, read-only) guards it as any
//! frontend's requests.
//!
//! ```text
//!  Read : device[offset .. offset+len] ─ Engine::read ─decrypt─▶ output  (dd if=/dev/mapper/x)
//!  Write: input ─(size checked first)─ Engine::write ─encrypt─▶ device   (dd of=/dev/mapper/x)
//! ```
//!
//! The engine runs [`CryptMode::Inline`] over a synchronous
//! [`FileBackend`]: one request at a time on the calling thread, like the
//! sequential copy this is. A table of several lines (crypt and linear
//! targets, e.g. a volume in mid-reencryption) is mapped as one device.

use std::fs::OpenOptions;
use std::io::{self, IsTerminal, Read, Seek, SeekFrom, Write};
use std::path::Path;
use std::sync::Arc;

use backend::FileOptions;
use crypto::table::Targets;
use datapath::{CryptMode, Engine, EngineConfig};
use zeroize::Zeroizing;

use daemon::{Error, ErrorKind, Result};
use luks::passphrase::Prompting;

/// An [`ErrorKind::InvalidInput`] error.
fn invalid(msg: impl Into<String>) -> Error {
    Error::new(ErrorKind::InvalidInput, msg)
}

/// Which way [`map`] moves data.
///
/// Deliberately exhaustive (no `#[non_exhaustive]`): a map decrypts from
/// the device or encrypts onto it, there is no third way, and callers
/// match both.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// Device ciphertext -> plaintext on the output.
    Read,
    /// Plaintext from the input -> ciphertext on the device.
    Write,
}

/// Where `ucrypt map` takes its table from (an open set).
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum Source<'a> {
    /// `--table LINE` (`-` = stdin), with `--key-file` for a `-` key field
    /// (see [`daemon::resolve::plain_table_arg`]).
    Table {
        /// The table line.
        line: &'a str,
        /// The raw key's file.
        key_file: Option<&'a Path>,
        /// Must be the whole file: a key-file range is refused here, as
        /// `open --table` refuses it.
        range: luks::passphrase::KeyfileRange,
    },
    /// `--luks DEVICE`: the table cryptsetup would load, unlocked with a
    /// passphrase from `key_file` or a prompt.
    Luks {
        /// The LUKS device.
        device: &'a Path,
        /// Detached header file.
        header: Option<&'a Path>,
        /// The passphrase's file.
        key_file: Option<&'a Path>,
        /// The part of it that is the passphrase (`--keyfile-offset`,
        /// `--keyfile-size`).
        range: luks::passphrase::KeyfileRange,
        /// Only this keyslot.
        key_slot: Option<u32>,
        /// The LUKS2 token options.
        tokens: &'a tokens::TokenOptions,
        /// How a passphrase (or PIN) typed at the terminal is asked for.
        prompting: Prompting,
        /// How the header and the device are reached (`--disable-locks`,
        /// the Ceph options).
        access: &'a luks::DeviceAccess,
    },
    /// `--bitlk DEVICE`: the BitLocker volume's table, unlocked with a
    /// passphrase, recovery password or `.BEK` file from `key_file` or a
    /// prompt.
    Bitlk {
        /// The BitLocker device.
        device: &'a Path,
        /// The passphrase's (or startup key's) file.
        key_file: Option<&'a Path>,
        /// The part of it that is read.
        range: luks::passphrase::KeyfileRange,
        /// `--volume-key-file`: the volume key itself, no passphrase.
        volume_key_file: Option<&'a Path>,
        /// How a passphrase typed at the terminal is asked for.
        prompting: Prompting,
    },
    /// `--fvault2 DEVICE`: the FileVault 2 volume's table (read only).
    Fvault2 {
        /// The FileVault 2 device.
        device: &'a Path,
        /// The passphrase's file.
        key_file: Option<&'a Path>,
        /// The part of it that is read.
        range: luks::passphrase::KeyfileRange,
        /// `--volume-key-file`: the volume key itself, no passphrase.
        volume_key_file: Option<&'a Path>,
        /// How a passphrase typed at the terminal is asked for.
        prompting: Prompting,
    },
    /// `--tcrypt DEVICE`: a TrueCrypt/VeraCrypt volume's table, its
    /// passphrase from a prompt or a line of stdin (read only).
    Tcrypt(daemon::tcrypt::Given<'a>),
}

impl Source<'_> {
    /// The table for moving data `dir`. A Write reads its plaintext from
    /// stdin, so then neither the table, its key nor the passphrase may
    /// come from there (nor the prompt's fallback when stdin is no
    /// terminal, which reads a line of it). `warn` gets the LUKS header's
    /// warnings.
    ///
    /// The process is made non-dumpable first: from here on it holds the
    /// key (as the daemon does).
    pub fn table(&self, dir: Direction, warn: impl FnMut(&str)) -> Result<Targets> {
        daemon::serve::non_dumpable("map")?;
        let stdin_free = dir == Direction::Read;
        match *self {
            Source::Table {
                line,
                key_file,
                range,
            } => {
                if range != luks::passphrase::KeyfileRange::default() {
                    return Err(invalid(
                        "--keyfile-offset and --keyfile-size do not apply to --table (its key file is the raw key)",
                    ));
                }
                daemon::resolve::plain_table_arg(line, key_file, stdin_free)
            }
            Source::Luks {
                device,
                header,
                key_file,
                range,
                key_slot,
                tokens,
                prompting,
                access,
            } => {
                let prompt_reads_stdin =
                    key_file.is_none() && !tokens.token_only && !io::stdin().is_terminal();
                if !stdin_free && (key_file == Some(Path::new("-")) || prompt_reads_stdin) {
                    return Err(invalid(
                        "--write reads plaintext from stdin: give the passphrase with --key-file FILE",
                    ));
                }
                let (table, _) = daemon::resolve::unlock_luks(
                    device, header, access, key_file, range, key_slot, None, tokens, &prompting,
                    warn,
                )?;
                Ok(table)
            }
            Source::Bitlk {
                device,
                key_file,
                range,
                volume_key_file,
                prompting,
            } => {
                let prompt_reads_stdin =
                    key_file.is_none() && volume_key_file.is_none() && !io::stdin().is_terminal();
                if !stdin_free && (key_file == Some(Path::new("-")) || prompt_reads_stdin) {
                    return Err(invalid(
                        "--write reads plaintext from stdin: give the passphrase with --key-file FILE",
                    ));
                }
                let device = daemon::resolve::device(device)?;
                daemon::resolve::unlock_bitlk(
                    &device,
                    key_file,
                    range,
                    volume_key_file,
                    &prompting,
                    warn,
                )
            }
            Source::Fvault2 {
                device,
                key_file,
                range,
                volume_key_file,
                prompting,
            } => {
                if !stdin_free {
                    return Err(invalid("FVAULT2 devices are mapped read-only: use --read"));
                }
                let device = daemon::resolve::device(device)?;
                daemon::resolve::unlock_fvault2(
                    &device,
                    key_file,
                    range,
                    volume_key_file,
                    &prompting,
                )
            }
            Source::Tcrypt(given) => {
                if !stdin_free && !io::stdin().is_terminal() {
                    return Err(invalid(
                        "--write reads plaintext from stdin: a TCRYPT passphrase must be typed at the terminal",
                    ));
                }
                let device = daemon::resolve::device(given.device)?;
                given.targets(&device)
            }
        }
    }
}

/// Bytes moved per engine request.
const CHUNK: usize = 1 << 20;

/// Applies `table` to its device: [`Direction::Read`] decrypts the whole
/// mapped range to `output`; [`Direction::Write`] encrypts `input` onto
/// the device and flushes.
///
/// On Write the input size is checked before anything is written: it must
/// be whole sectors and fit the mapping. `input_len` is the size when the
/// caller knows it (a regular file); otherwise the input is first spooled
/// to an unlinked temporary file.
///
/// A Write claims a block device exclusively, as `open` does (refused
/// while it is mounted, mapped or served: exit 5), and a regular file
/// under its write lock; a Read shares either. The process is
/// non-dumpable while it holds the table's key (see [`Source::table`]).
/// An `rbd:` device reaches its cluster with librados's defaults
/// ([`map_with`] says how otherwise).
pub fn map(
    table: &Targets,
    dir: Direction,
    input: &mut dyn Read,
    input_len: Option<u64>,
    output: &mut dyn Write,
) -> Result<()> {
    let ceph = backend::rbd::RbdConfig::default();
    map_with(table, dir, &ceph, input, input_len, output)
}

/// [`map`], an `rbd:` device reaching its cluster as `ceph` says.
pub fn map_with(
    table: &Targets,
    dir: Direction,
    ceph: &backend::rbd::RbdConfig,
    input: &mut dyn Read,
    input_len: Option<u64>,
    output: &mut dyn Write,
) -> Result<()> {
    daemon::serve::non_dumpable("map")?;
    check_device(table, dir)?;
    // Writes: the whole input is sized (and checked) before the device is
    // touched.
    let mut source = match dir {
        Direction::Read => None,
        Direction::Write => Some(checked_input(
            table,
            u64::from(table.sector_size()),
            input,
            input_len,
        )?),
    };
    let engine = engine(table, dir, ceph)?;
    let result = match &mut source {
        None => read_all(&engine, table, output),
        Some((src, len)) => write_all(&engine, table, src, *len),
    };
    let down = engine.shutdown();
    result?;
    down.map_err(|e| {
        Error::new(ErrorKind::Io, format!("Cannot flush {}", table.device())).with_source(e)
    })
}

/// [`map`] on the process's standard streams, as `ucrypt map` runs it:
/// Read decrypts to stdout; Write encrypts stdin, whose size is known up
/// front when it is a regular file (`< plain.img`); an `rbd:` device
/// reaches its cluster as `ceph` says.
pub fn map_stdio(table: &Targets, dir: Direction, ceph: &backend::rbd::RbdConfig) -> Result<()> {
    match dir {
        Direction::Read => {
            let mut out = io::stdout().lock();
            map_with(table, dir, ceph, &mut io::empty(), None, &mut out)
        }
        Direction::Write => {
            let len = stdin_regular_file_len();
            let mut input = io::stdin().lock();
            map_with(table, dir, ceph, &mut input, len, &mut io::sink())
        }
    }
}

/// What is left to read on stdin when it is a regular file: its size
/// minus stdin's current offset.
fn stdin_regular_file_len() -> Option<u64> {
    let m = std::fs::File::open("/proc/self/fd/0")
        .ok()?
        .metadata()
        .ok()?;
    if !m.is_file() {
        return None;
    }
    m.len().checked_sub(read_stdin_pos()?)
}

/// Current offset of fd 0 from /proc/self/fdinfo/0 (`pos:` line).
fn read_stdin_pos() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/self/fdinfo/0").ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("pos:"))
        .and_then(|v| v.trim().parse().ok())
}

/// An inline engine over the table's device, read-only for reads.
fn engine(table: &Targets, dir: Direction, ceph: &backend::rbd::RbdConfig) -> Result<Engine> {
    let path = table.device();
    let backend = backend::open_device(
        std::path::Path::new(path),
        &FileOptions {
            read_only: dir == Direction::Read,
            direct: backend::DirectIo::Never,
            allow_discard: false,
            engine: Some(backend::IoEngine::Syscalls),
            // A write claims a block device as `open` does; a read shares
            // it, as `dd` would.
            exclusive: dir == Direction::Write,
            ..FileOptions::default()
        },
        ceph,
    )
    .map_err(|e| {
        if matches!(
            e.kind(),
            backend::ErrorKind::Locked { .. } | backend::ErrorKind::InUse { .. }
        ) {
            daemon::backend_error(e)
        } else {
            Error::new(ErrorKind::NoDevice, format!("Cannot open device {path}")).with_source(e)
        }
    })?;
    let cfg = EngineConfig {
        mode: CryptMode::Inline,
        read_only: dir == Direction::Read,
        queue_depth: 1,
        workers: 1,
        ..EngineConfig::default()
    };
    daemon::targets::engine(table, Arc::from(backend), cfg).map_err(|e| match e {
        daemon::targets::EngineError::Table(e) => invalid("Invalid table").with_source(e),
        daemon::targets::EngineError::Engine(e) => {
            Error::new(ErrorKind::NoDevice, format!("Cannot map device {path}")).with_source(e)
        }
    })
}

/// The input as a reader of known length: whole sectors, at most the
/// mapping.
fn checked_input<'a>(
    table: &Targets,
    ss: u64,
    input: &'a mut dyn Read,
    input_len: Option<u64>,
) -> Result<(Box<dyn Read + 'a>, u64)> {
    let total = table.len_bytes();
    let (src, len) = sized_input(input, input_len, total)?;
    if len > total {
        return Err(invalid(format!(
            "Input length {} bytes exceeds the mapping ({total} bytes, {} sectors); nothing written",
            if input_len.is_some() { len.to_string() } else { format!("over {total}") },
            table.len()
        )));
    }
    if len % ss != 0 {
        return Err(invalid(format!(
            "Input length {len} bytes is not a multiple of the {ss}-byte sector size; nothing written"
        )));
    }
    Ok((src, len))
}

/// The device must exist and hold the whole mapping (checked before the
/// engine opens it, with the messages `map` always gave).
fn check_device(table: &Targets, dir: Direction) -> Result<()> {
    let path = table.device();
    if backend::rbd::is_rbd(std::path::Path::new(path)) {
        // Only the cluster knows: the engine's open checks it and its size.
        return Ok(());
    }
    let mut dev = OpenOptions::new()
        .read(true)
        .write(dir == Direction::Write)
        .open(path)
        .map_err(|e| {
            Error::new(ErrorKind::NoDevice, format!("Cannot open device {path}")).with_source(e)
        })?;
    let dev_size = dev.seek(SeekFrom::End(0)).map_err(|e| {
        Error::new(
            ErrorKind::NoDevice,
            format!("Cannot read the size of device {path}"),
        )
        .with_source(e)
    })?;
    let need = table.device_end_bytes();
    if dev_size < need {
        let how = match table.as_single() {
            Some(t) => format!("offset {} + length {} sectors", t.offset, t.len),
            None => format!("its {} targets end at sector {}", table.count(), need / 512),
        };
        return Err(Error::new(
            ErrorKind::NoDevice,
            format!(
                "Device {path} is too small: the table needs {need} bytes ({how}) but it has {dev_size}"
            ),
        ));
    }
    Ok(())
}

fn read_all(engine: &Engine, table: &Targets, output: &mut dyn Write) -> Result<()> {
    let total = table.len_bytes();
    let mut pos = 0u64;
    while pos < total {
        let n = (total - pos).min(CHUNK as u64) as u32;
        let plain = Zeroizing::new(engine.read(pos, n).map_err(|e| {
            Error::new(
                ErrorKind::Io,
                format!(
                    "Read error on {} at byte {}",
                    table.device(),
                    device_byte(table, pos)
                ),
            )
            .with_source(e)
        })?);
        output.write_all(&plain).map_err(output_error)?;
        pos += u64::from(n);
    }
    output.flush().map_err(output_error)
}

fn output_error(e: io::Error) -> Error {
    invalid("Cannot write the output").with_source(e)
}

fn write_all(engine: &Engine, table: &Targets, src: &mut dyn Read, len: u64) -> Result<()> {
    let mut pos = 0u64;
    while pos < len {
        let n = (len - pos).min(CHUNK as u64) as usize;
        // The engine encrypts in place: the buffer holds ciphertext once it
        // is consumed, and the plaintext never outlives this iteration.
        let mut buf = vec![0u8; n];
        if let Err(e) = src.read_exact(&mut buf) {
            drop(Zeroizing::new(buf));
            return Err(invalid("Cannot read the input").with_source(e));
        }
        engine.write(pos, buf, false).map_err(|e| {
            Error::new(
                ErrorKind::Io,
                format!(
                    "Write error on {} at byte {}",
                    table.device(),
                    device_byte(table, pos)
                ),
            )
            .with_source(e)
        })?;
        pos += n as u64;
    }
    engine.flush().map_err(|e| {
        Error::new(ErrorKind::Io, format!("Cannot flush {}", table.device())).with_source(e)
    })
}

/// The device byte that mapping byte `pos` lives at.
fn device_byte(table: &Targets, pos: u64) -> u64 {
    let sector = pos / 512;
    table
        .targets()
        .iter()
        .find(|t| sector < t.start() + t.len())
        .map_or(pos, |t| (t.offset() + sector - t.start()) * 512 + pos % 512)
}

/// Returns a reader over the whole input and its length, knowing the length
/// before any byte is written. A pipe is spooled to an unlinked temporary
/// file, stopping as soon as it exceeds `limit`.
fn sized_input<'a>(
    input: &'a mut dyn Read,
    known_len: Option<u64>,
    limit: u64,
) -> Result<(Box<dyn Read + 'a>, u64)> {
    if let Some(len) = known_len {
        return Ok((Box::new(input), len));
    }
    let dir = std::env::temp_dir();
    let name = dir.join(format!("ucrypt-map-{}-{}", std::process::id(), unique()));
    let mut spool = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&name)
        .map_err(|e| {
            invalid(format!("Cannot create a spool file in {}", dir.display())).with_source(e)
        })?;
    let _ = std::fs::remove_file(&name);
    let copied = io::copy(&mut input.take(limit.saturating_add(1)), &mut spool)
        .map_err(|e| invalid("Cannot read the input").with_source(e))?;
    spool
        .seek(SeekFrom::Start(0))
        .map_err(|e| invalid("Cannot rewind the spool file").with_source(e))?;
    Ok((Box::new(spool), copied))
}

fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
                       f0e1d2c3b4a5968778695a4b3c2d1e0fffeeddccbbaa99887766554433221100";

    fn table(dev: &std::path::Path, len: u64, offset: u64) -> Targets {
        plain(&format!(
            "0 {len} crypt aes-xts-plain64 {KEY} 0 {} {offset}",
            dev.display()
        ))
    }

    fn plain(line: &str) -> Targets {
        daemon::resolve::plain_targets(line).unwrap()
    }

    #[test]
    fn write_then_read_round_trips_through_the_engine() {
        let dir = testutil::TempDir::new("daemon-map");
        let dev = dir.join("dev.img");
        std::fs::File::create(&dev)
            .unwrap()
            .set_len(64 << 10)
            .unwrap();
        let t = table(&dev, 64, 8);
        let plain: Vec<u8> = (0..16384u32).map(|i| (i * 7 % 251) as u8).collect();
        map(&t, Direction::Write, &mut &plain[..], None, &mut io::sink()).unwrap();
        let disk = std::fs::read(&dev).unwrap();
        assert!(disk[..4096].iter().all(|&b| b == 0), "offset honoured");
        assert_ne!(&disk[4096..4096 + plain.len()], &plain[..], "encrypted");
        let mut out = Vec::new();
        map(&t, Direction::Read, &mut io::empty(), None, &mut out).unwrap();
        assert_eq!(out.len(), 64 * 512);
        assert_eq!(&out[..plain.len()], &plain[..]);
    }

    #[test]
    fn refusals_touch_nothing() {
        let dir = testutil::TempDir::new("daemon-map-err");
        let dev = dir.join("dev.img");
        std::fs::File::create(&dev)
            .unwrap()
            .set_len(8 << 10)
            .unwrap();
        let before = std::fs::read(&dev).unwrap();
        let cases: [(Targets, usize, ErrorKind, &str); 3] = [
            (table(&dev, 64, 0), 512, ErrorKind::NoDevice, "too small"),
            (table(&dev, 8, 0), 8192, ErrorKind::InvalidInput, "exceeds"),
            (
                table(&dev, 8, 0),
                100,
                ErrorKind::InvalidInput,
                "not a multiple",
            ),
        ];
        for (t, n, kind, needle) in cases {
            for known in [None, Some(n as u64)] {
                let input = vec![1u8; n];
                let e = map(
                    &t,
                    Direction::Write,
                    &mut &input[..],
                    known,
                    &mut io::sink(),
                )
                .unwrap_err();
                assert_eq!(e.kind(), kind, "{e}");
                assert!(e.to_string().contains(needle), "{e}");
            }
        }
        assert_eq!(std::fs::read(&dev).unwrap(), before);
        let t = table(&dir.join("missing"), 8, 0);
        let e = map(&t, Direction::Read, &mut io::empty(), None, &mut io::sink()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NoDevice);
        assert!(e.chain().starts_with("Cannot open device "), "{e}");
    }
}
