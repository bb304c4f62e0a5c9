//! `open`, `close`, `status`, `table`, `refresh`, `resize`, `reload`,
//! `suspend`, `resume`, `list`: arguments and
//! output of the commands that start and talk to a volume's daemon. The
//! daemon itself (resolve, serve, control protocol, runtime files,
//! detaching) is the `ucrypt-daemon` library.
//!
//! `open` resolves the mapping (a dm table line for `--type plain`, the LUKS
//! header for `--type luks`, prompting for the passphrase) in the calling
//! process, then either serves in the foreground or re-executes itself
//! detached with `--foreground --table-stdin` ([`OpenOptions::detach`]). It
//! returns once the daemon answers on its control socket.

use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use daemon::control::{self, Flags};
use daemon::open::TypeArg as VolumeType;
use daemon::resolve::Mapping;
use daemon::{runtime, OpenOptions};

use crate::cmd::luks::KeyFileArgs;
use crate::{CmdResult, Failure};

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
    /// Read the table line from standard input (used by the detached daemon).
    #[arg(long, hide = true)]
    pub table_stdin: bool,
    /// Detached LUKS header file.
    #[arg(long)]
    pub header: Option<PathBuf>,
    /// The passphrase's (or a table's `-` key's) file and its range.
    #[command(flatten)]
    pub key: KeyFileArgs,
    /// Only try this key slot.
    #[arg(long, short = 'S')]
    pub key_slot: Option<u32>,
    /// How the volume is served (checked by `OpenOptions::check`).
    #[command(flatten)]
    pub serve: daemon::open::Given,
    /// cryptsetup's plain-mode, key-file range and --test-passphrase options.
    #[command(flatten)]
    pub plain: super::plain::PlainArgs,
    /// cryptsetup's TCRYPT options (--type tcrypt).
    #[command(flatten)]
    pub tcrypt: daemon::tcrypt::TcryptArgs,
    /// Backing device or file.
    pub device: PathBuf,
    /// Volume name.
    #[arg(required_unless_present = "test_passphrase")]
    pub name: Option<String>,
}

/// Arguments of `refresh`.
#[derive(Args)]
pub struct RefreshArgs {
    /// The new performance flags (flags not given are cleared, as in cryptsetup).
    #[command(flatten)]
    pub perf: daemon::open::PerfArgs,
    /// New data-path mode (unchanged if omitted).
    #[arg(long)]
    pub mode: Option<String>,
    /// Volume name.
    pub name: String,
}

impl Commands {
    /// Runs the command.
    pub fn run(self) -> CmdResult {
        match self {
            Commands::Open(a) => open(a),
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
                let (max_read_size, max_write_size) = a.perf.max_io();
                let flags = Flags {
                    max_read_size,
                    max_write_size,
                    ..Flags::from(a.perf.flags())
                };
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
            Commands::Resume(a) => resume(a),
        }
    }
}

fn open(a: OpenArgs) -> CmdResult {
    let m = Mapping {
        kind: a.kind.map(VolumeType::kind),
        table: a.table.as_deref(),
        table_stdin: a.table_stdin,
        header: a.header.as_deref(),
        key_file: a.key.key_file.as_deref(),
        key_slot: a.key_slot,
        plain: a.plain.given(&a.key),
        test_passphrase: a.plain.test_passphrase,
        tcrypt: a.tcrypt.clone(),
    };
    let say = |w: &str| eprintln!("{w}");
    if a.plain.test_passphrase {
        return Ok(m.test_passphrase(&a.device, say)?);
    }
    let target = daemon::open::Target {
        // clap requires NAME unless --test-passphrase.
        name: a.name.as_deref().unwrap_or_default(),
        device: &a.device,
        header: a.header.as_deref(),
        detached: a.table_stdin,
    };
    let opts = OpenOptions::check(&a.serve, target, report_stale_mount)?;
    // cryptsetup's plain mode, a table line, or the LUKS header (prompting).
    let (table, volume_type) = m.resolve(&opts.device, say)?;
    if a.serve.foreground {
        opts.serve(table, volume_type, |p| {
            println!("{p}");
            let _ = std::io::Write::flush(&mut std::io::stdout());
        })?;
        return Ok(());
    }
    let exe = std::env::current_exe()
        .map_err(|e| Failure::device(format!("Cannot find the ucrypt binary: {e}")))?;
    if let Some(warning) = opts.tls.tcp_warning(&opts.export) {
        eprintln!("{warning}");
    }
    println!("{}", opts.detach(&exe, table, volume_type)?);
    Ok(())
}

/// `resume`: the key comes from the header as for `open` (prompting).
fn resume(a: ResumeArgs) -> CmdResult {
    let version = a.kind.and_then(VolumeType::luks_version);
    let (header, key_file) = (a.header.as_deref(), a.key.key_file.as_deref());
    let (range, slot) = (a.key.range(), a.key_slot);
    Ok(daemon::volumes::resume_luks(
        &a.name, version, header, key_file, range, slot,
    )?)
}

/// Says so when a dead daemon's FUSE mount had to be detached.
fn report_stale_mount(mountpoint: &Path) {
    eprintln!(
        "ucrypt: detached a stale FUSE mount at {}",
        mountpoint.display()
    );
}
