//! `open`, `close`, `status`, `table`, `refresh`, `resize`, `reload`,
//! `suspend`, `resume`, `list`: arguments and
//! output of the commands that start and talk to a volume's daemon. The
//! daemon itself (resolve, serve, control protocol, runtime files,
//! detaching) is the `ucrypt-daemon` library.
//!
//! `open` resolves the mapping (a dm table line for `--type plain`, the LUKS
//! header for `--type luks`, prompting for the passphrase) in the calling
//! process and checks its serving options into one `daemon::VolumeSpec`,
//! then either serves it in the foreground or re-executes itself detached
//! ([`OpenOptions::detach`]: the hidden `serve --spec-stdin NAME` reads the
//! spec and the table from a pipe and parses no options). It returns once
//! the daemon answers on its control socket.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Subcommand};
use daemon::control;
use daemon::open::OpenOptions;
use daemon::resolve::Mapping;
use daemon::runtime;

use crate::cmd::luks::{KeyFileArgs, KeyFilesArgs};
use crate::cmd::serve::{PerfArgs, ServeArgs, TypeArg as VolumeType};
use crate::global::Globals;
use crate::{CmdResult, Failure};
use luks::passphrase::Prompting;

/// Commands of this group.
// Parsed once per process: the size of `Open` does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub enum Commands {
    /// Open a volume and serve the decrypted device (NBD on a unix socket by default).
    #[command(alias = "luksOpen")]
    Open(OpenArgs),
    /// Flush and stop a volume's daemon, removing its sockets and mount.
    #[command(alias = "luksClose")]
    Close {
        /// Volume name.
        name: String,
    },
    /// Show a volume's mapping and live statistics (like `cryptsetup status`).
    Status {
        /// Print one JSON document (docs/JSON.md) instead of text.
        #[arg(long)]
        json: bool,
        /// Volume name.
        name: String,
    },
    /// Print a volume's dm table, one line per target (keys masked unless --showkeys).
    Table {
        /// Volume name.
        name: String,
        /// Print the key in clear.
        #[arg(long)]
        showkeys: bool,
    },
    /// Switch performance flags and data-path mode of an open volume live.
    Refresh(RefreshArgs),
    /// Change an open volume's size live (default: all the device holds).
    Resize {
        /// New size in 512-byte sectors.
        #[arg(
            long,
            short = 'b',
            value_name = "SECTORS",
            conflicts_with = "device_size"
        )]
        size: Option<u64>,
        /// New size in bytes (a multiple of 512).
        #[arg(long, value_name = "BYTES")]
        device_size: Option<u64>,
        /// Volume name.
        name: String,
    },
    /// Replace an open volume's table live (dmsetup reload + resume): same device and length.
    Reload {
        /// The new table (one or more lines, keys included): a file, or `-` for stdin.
        #[arg(long, value_name = "FILE|-")]
        table: String,
        /// Volume name.
        name: String,
    },
    /// Block IO to an open LUKS volume and wipe its key from the daemon's memory.
    #[command(alias = "luksSuspend")]
    Suspend {
        /// Detached LUKS header (accepted as in cryptsetup; suspending needs none).
        #[arg(long)]
        header: Option<PathBuf>,
        /// Volume name.
        name: String,
    },
    /// Reinstate a suspended volume's key (asks for a passphrase) and let IO through.
    #[command(alias = "luksResume")]
    Resume(ResumeArgs),
    /// List open volumes.
    List {
        /// Print one JSON document (docs/JSON.md) instead of text.
        #[arg(long)]
        json: bool,
    },
    /// The detached daemon `open` starts: serves the volume spec and table
    /// its parent writes to stdin (nothing else is read from the command line).
    #[command(hide = true)]
    Serve {
        /// Read the spec and the table from standard input (required).
        #[arg(long, required = true)]
        spec_stdin: bool,
        /// Volume name (checked against the spec).
        name: String,
    },
}

/// Arguments of `resume`: where the key comes from, as for `open`.
#[derive(Args)]
pub struct ResumeArgs {
    /// LUKS version (default: whichever the header is).
    #[arg(long = "type", value_enum)]
    pub kind: Option<VolumeType>,
    /// Detached LUKS header file.
    #[arg(long)]
    pub header: Option<PathBuf>,
    /// The passphrase's key file and its range.
    #[command(flatten)]
    pub key: KeyFileArgs,
    /// Only try this key slot.
    #[arg(long, short = 'S')]
    pub key_slot: Option<u32>,
    /// Volume name.
    pub name: String,
}

/// Arguments of `open`.
#[derive(Args)]
pub struct OpenArgs {
    /// Volume format (default: plain when --table is given, else luks).
    #[arg(long = "type", value_enum)]
    pub kind: Option<VolumeType>,
    /// dm table: a line, a file holding one or more lines (crypt and linear
    /// targets), or `-` for stdin (a hex key on the command line shows in
    /// `ps`); <device> is replaced by DEVICE, a <key> of `-` read from --key-file.
    #[arg(long)]
    pub table: Option<String>,
    /// Detached LUKS header file.
    #[arg(long)]
    pub header: Option<PathBuf>,
    /// The passphrase's (or a table's `-` key's) file and its range;
    /// TrueCrypt keyfiles, repeatable.
    #[command(flatten)]
    pub key: KeyFilesArgs,
    /// Only try this key slot.
    #[arg(long, short = 'S')]
    pub key_slot: Option<u32>,
    /// BitLocker or FileVault 2: open with the volume key in this file
    /// instead of a passphrase (`--master-key-file` works too).
    #[arg(long, alias = "master-key-file")]
    pub volume_key_file: Option<PathBuf>,
    /// How the volume is served (checked into a `daemon::VolumeSpec`).
    #[command(flatten)]
    pub serve: ServeArgs,
    /// cryptsetup's plain-mode, key-file range and --test-passphrase options.
    #[command(flatten)]
    pub plain: super::plain::PlainArgs,
    /// LUKS2 tokens: --token-id, --token-only, --token-type and their devices.
    #[command(flatten)]
    pub tokens: super::tokens::TokenUnlockArgs,
    /// Open the volume NAME as crypttab(5) lists it (default file
    /// /etc/crypttab): `ucrypt open --crypttab[=FILE] NAME`.
    #[arg(
        long,
        value_name = "FILE",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = daemon::crypttab::DEFAULT_PATH,
    )]
    pub crypttab: Option<PathBuf>,
    /// cryptsetup's TCRYPT options (--type tcrypt).
    #[command(flatten)]
    pub tcrypt: super::tcrypt::TcryptArgs,
    /// Backing device or file (with --crypttab: the volume name).
    pub device: PathBuf,
    /// Volume name.
    #[arg(required_unless_present_any = ["test_passphrase", "crypttab"])]
    pub name: Option<String>,
}

/// Arguments of `refresh`.
#[derive(Args)]
pub struct RefreshArgs {
    /// The new performance flags (flags not given are cleared, as in cryptsetup).
    #[command(flatten)]
    pub perf: PerfArgs,
    /// New data-path mode (unchanged if omitted).
    #[arg(long)]
    pub mode: Option<String>,
    /// Volume name.
    pub name: String,
}

impl Commands {
    /// Runs the command.
    pub fn run(self, g: &Globals) -> CmdResult {
        match self {
            Commands::Open(a) => open(a, g),
            Commands::Close { name } => {
                daemon::volumes::close(&name, report_stale_mount)?;
                Ok(())
            }
            Commands::Status { json, name } => {
                runtime::check_name(&name)?;
                let st = control::status(&name, control::QUERY_TIMEOUT)?;
                if json {
                    println!("{}", st.to_json());
                } else {
                    println!("{st}");
                }
                Ok(())
            }
            Commands::Table { name, showkeys } => {
                runtime::check_name(&name)?;
                Ok(control::print_table(
                    &name,
                    showkeys,
                    control::QUERY_TIMEOUT,
                )?)
            }
            Commands::Refresh(a) => {
                runtime::check_name(&a.name)?;
                let mode = a.mode.as_deref().map(control::parse_mode).transpose()?;
                let flags = a.perf.flags();
                let r = control::refresh(&a.name, mode, flags, control::REFRESH_TIMEOUT)?;
                println!("{}", r.line(&a.name));
                Ok(())
            }
            Commands::List { json } => {
                let all = daemon::volumes::list()?;
                if json {
                    println!("{}", daemon::volumes::list_json(&all));
                    return Ok(());
                }
                for v in all {
                    println!("{v}");
                }
                Ok(())
            }
            Commands::Resize {
                size,
                device_size,
                name,
            } => {
                let r = daemon::volumes::resize(&name, size, device_size)?;
                for n in &r.notes {
                    eprintln!("ucrypt: {name}: {n}");
                }
                Ok(())
            }
            Commands::Reload { table, name } => {
                // Silent on success, as `dmsetup reload`.
                daemon::volumes::reload(&name, &table)?;
                Ok(())
            }
            Commands::Suspend { header: _, name } => {
                runtime::check_name(&name)?;
                Ok(control::suspend(&name, control::DRAIN_TIMEOUT)?)
            }
            Commands::Resume(a) => resume(a, g),
            Commands::Serve {
                spec_stdin: _,
                name,
            } => Ok(daemon::detach::serve_stdin(&name, print_ping)?),
        }
    }
}

fn open(mut a: OpenArgs, g: &Globals) -> CmdResult {
    let mut tokens = a.tokens.options(g.verbose());
    let mut prompting = g.prompting();
    if let Some(file) = a.crypttab.take() {
        apply_crypttab(&mut a, &mut tokens, &mut prompting, &file)?;
    }
    // Several key files: TrueCrypt's keyfile pool, refused for the rest.
    let key = if matches!(a.kind, Some(VolumeType::Tcrypt)) {
        a.key.first()
    } else {
        a.key.one()?
    };
    let m = Mapping {
        kind: a.kind.map(VolumeType::kind),
        table: a.table.as_deref(),
        header: a.header.as_deref(),
        key_file: key.key_file.as_deref(),
        keyfiles: &a.key.key_file,
        volume_key_file: a.volume_key_file.as_deref(),
        key_slot: a.key_slot,
        plain: a.plain.given(&key),
        test_passphrase: a.plain.test_passphrase,
        tokens,
        prompting,
        tcrypt: a.tcrypt.given(),
        access: g.access(),
    };
    let say = |w: &str| eprintln!("{w}");
    if a.plain.test_passphrase {
        return Ok(m.test_passphrase(&a.device, say)?);
    }
    // clap requires NAME unless --test-passphrase.
    let name = a.name.as_deref().unwrap_or_default();
    let spec = a
        .serve
        .spec(name, &a.device, a.header.as_deref(), &m.access.ceph)?;
    let opts = OpenOptions::claim(spec, report_stale_mount)?;
    // cryptsetup's plain mode, a table line, or the LUKS header (prompting).
    let (table, volume_type) = m.resolve(&opts.spec.device, say)?;
    if a.serve.foreground {
        opts.serve(table, volume_type, m.access.locking, print_ping)?;
        return Ok(());
    }
    let exe = std::env::current_exe()
        .map_err(|e| Failure::device(format!("Cannot find the ucrypt binary: {e}")))?;
    if let Some(warning) = opts.spec.tls.tcp_warning(&opts.spec.export) {
        eprintln!("{warning}");
    }
    println!("{}", opts.detach(&exe, table, volume_type)?);
    Ok(())
}

/// `open --crypttab[=FILE] NAME`: the line for NAME sets the device, key
/// file and options (unknown options warned as systemd-cryptsetup does).
/// As systemd-cryptsetup: a TCRYPT line's key file is its passphrase file
/// and `tcrypt-keyfile=` its keyfiles, VeraCrypt is tried only with
/// `tcrypt-veracrypt`; cipher options apply to plain lines only;
/// `tpm2-device=` waits up to `token-timeout=` (default 30 s) for the TPM2,
/// `pkcs11-uri=` as long for a matching PKCS#11 token; `tpm2-signature=`
/// is `--tpm2-signature`. The token options and how a passphrase is asked
/// (`tries=`, `timeout=`, `try-empty-password`) go to `tokens` and
/// `prompting`.
fn apply_crypttab(
    a: &mut OpenArgs,
    tokens: &mut tokens::TokenOptions,
    prompting: &mut Prompting,
    file: &Path,
) -> CmdResult {
    if a.name.is_some() {
        return Err(Failure::usage(
            "With --crypttab give only the volume name (the device comes from the file)",
        ));
    }
    let name = a.device.to_string_lossy().into_owned();
    let e = daemon::crypttab::find(file, &name)?;
    for o in &e.unknown {
        eprintln!(
            "Encountered unknown {} option '{o}', ignoring.",
            file.display()
        );
    }
    use daemon::crypttab::Kind;
    a.name = Some(e.name.clone());
    a.device = e.device;
    a.kind = Some(match e.kind {
        Kind::Luks => VolumeType::Luks,
        Kind::Plain => VolumeType::Plain,
        Kind::Bitlk => VolumeType::Bitlk,
        Kind::Tcrypt => VolumeType::Tcrypt,
    });
    if e.kind == Kind::Tcrypt {
        let t = &mut a.tcrypt;
        t.passphrase_file = e.key_file;
        t.keyfiles = e.tcrypt_keyfiles;
        t.tcrypt_hidden |= e.tcrypt_hidden;
        t.tcrypt_system |= e.tcrypt_system;
        if e.tcrypt_veracrypt {
            // PIM 0 is VeraCrypt's default.
            t.veracrypt_pim = t.veracrypt_pim.or(e.veracrypt_pim.filter(|&p| p != 0));
        } else if !t.veracrypt {
            t.disable_veracrypt = true;
        }
    } else {
        if a.key.key_file.is_empty() {
            a.key.key_file.extend(e.key_file);
        }
        a.key.keyfile_offset = a.key.keyfile_offset.or(e.keyfile_offset);
        a.key.keyfile_size = a.key.keyfile_size.or(e.keyfile_size);
    }
    a.header = a.header.take().or(e.header);
    a.key_slot = a.key_slot.or(e.key_slot);
    if e.kind == Kind::Plain {
        let p = &mut a.plain.plain;
        p.cipher = p.cipher.take().or(e.cipher);
        p.key_bits = p.key_bits.or(e.key_bits);
        p.hash = p.hash.take().or(e.hash);
        p.offset = p.offset.or(e.offset);
        p.skip = p.skip.or(e.skip);
        p.sector_size = p.sector_size.or(e.sector_size);
    }
    let s = &mut a.serve;
    s.allow_discards |= e.discard;
    s.readonly |= e.read_only;
    s.perf.add(e.perf);
    if let Some(x) = e.export {
        s.export = x;
    }
    s.mode = s.mode.take().or(e.mode);
    s.listen = s.listen.take().or(e.listen);
    s.tls_psk = s.tls_psk.take().or(e.tls_psk);
    s.tls_certificates = s.tls_certificates.take().or(e.tls_certificates);
    let t = tokens;
    let timeout = e.token_timeout.unwrap_or(Duration::from_secs(30));
    if e.tpm2_device.is_some() {
        t.tpm2_timeout = Some(timeout);
    }
    if e.pkcs11_uri.is_some() {
        t.pkcs11_timeout = Some(timeout);
    }
    t.volume_name = Some(e.name);
    t.tpm2_device = t.tpm2_device.take().or(e.tpm2_device);
    t.tpm2_signature = t.tpm2_signature.take().or(e.tpm2_signature);
    t.pkcs11_uri = e.pkcs11_uri;
    t.tpm2_pin = e.tpm2_pin;
    t.headless = e.headless;
    if e.headless && a.key.key_file.is_empty() {
        // No prompt: the tokens alone, as systemd-cryptsetup's headless.
        t.token_only = e.kind == Kind::Luks;
    }
    prompting.try_empty = e.try_empty_password;
    if let Some(n) = e.tries {
        prompting.tries = n;
    }
    if let Some(secs) = e.timeout {
        prompting.timeout = secs;
    }
    Ok(())
}

/// `resume`: the key comes from the header as for `open` (prompting).
fn resume(a: ResumeArgs, g: &Globals) -> CmdResult {
    let version = a.kind.and_then(VolumeType::luks_version);
    let (header, key_file) = (a.header.as_deref(), a.key.key_file.as_deref());
    let (range, slot) = (a.key.range(), a.key_slot);
    Ok(daemon::volumes::resume_luks(
        &a.name,
        version,
        header,
        key_file,
        range,
        slot,
        &g.prompting(),
        &g.access(),
    )?)
}

/// A serving daemon's first line: where clients connect.
fn print_ping(p: &control::Ping) {
    println!("{p}");
    let _ = std::io::Write::flush(&mut std::io::stdout());
}

/// Says so when a dead daemon's FUSE mount had to be detached.
fn report_stale_mount(mountpoint: &Path) {
    eprintln!(
        "ucrypt: detached a stale FUSE mount at {}",
        mountpoint.display()
    );
}
