//! `open`, `close`, `status`, `table`, `refresh`, `list`: arguments and
//! output of the commands that start and talk to a volume's daemon. The
//! daemon itself (resolve, serve, control protocol, runtime files,
//! detaching) is the `ucrypt-daemon` library.
//!
//! `open` resolves the mapping (a dm table line for `--type plain`, the LUKS
//! header for `--type luks`, prompting for the passphrase) in the calling
//! process, then either serves in the foreground or re-executes itself
//! detached with `--foreground --table-stdin` ([`daemon::detach`]). It
//! returns once the daemon answers on its control socket.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand, ValueEnum};
use crypto::table::Table;
use daemon::control::{self, flag_words, mode_name, ExportKind, Flags, Ping};
use daemon::resolve::VolumeType as Kind;
use daemon::{runtime, ExportSpec, TlsSpec};
use datapath::PerfFlags;

use crate::{CmdResult, Failure};

/// Commands of this group.
// Parsed once per process: the size of `Open` does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub enum Commands {
    /// Open a volume and serve the decrypted device (NBD on a unix socket by default).
    Open(OpenArgs),
    /// Flush and stop a volume's daemon, removing its sockets and mount.
    Close {
        /// Volume name.
        name: String,
    },
    /// Show a volume's mapping and live statistics (like `cryptsetup status`).
    Status {
        /// Volume name.
        name: String,
    },
    /// Print a volume's dm-crypt table line (key masked unless --showkeys).
    Table {
        /// Volume name.
        name: String,
        /// Print the key in clear.
        #[arg(long)]
        showkeys: bool,
    },
    /// Switch performance flags and data-path mode of an open volume live.
    Refresh(RefreshArgs),
    /// List open volumes.
    List,
}

/// Volume format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum VolumeType {
    /// LUKS1 or LUKS2 header on the device (or --header).
    Luks,
    /// Plain dm-crypt: the mapping is given with --table.
    Plain,
}

/// `--io-engine`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum IoEngineArg {
    /// pread / pwritev2 / fdatasync.
    Syscalls,
    /// One io_uring per calling thread.
    Uring,
}

/// `--direct-io`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum DirectIoArg {
    /// O_DIRECT for aligned requests when the file allows it.
    Auto,
    /// Always through the page cache.
    Never,
    /// O_DIRECT only; fail if refused.
    Required,
}

/// dm-crypt performance flags, as `cryptsetup --perf-*`.
#[derive(Args, Clone, Copy, Debug, Default)]
pub struct PerfArgs {
    /// Decrypt reads inline (no read workqueue).
    #[arg(long = "perf-no_read_workqueue")]
    pub no_read_workqueue: bool,
    /// Encrypt writes inline (no write workqueue).
    #[arg(long = "perf-no_write_workqueue")]
    pub no_write_workqueue: bool,
    /// Encrypt on the submitting CPU.
    #[arg(long = "perf-same_cpu_crypt")]
    pub same_cpu_crypt: bool,
    /// Submit writes from the crypt threads.
    #[arg(long = "perf-submit_from_crypt_cpus")]
    pub submit_from_crypt_cpus: bool,
}

impl PerfArgs {
    fn flags(&self) -> PerfFlags {
        PerfFlags {
            same_cpu_crypt: self.same_cpu_crypt,
            submit_from_crypt_cpus: self.submit_from_crypt_cpus,
            no_read_workqueue: self.no_read_workqueue,
            no_write_workqueue: self.no_write_workqueue,
        }
    }
}

/// Control request timeouts.
const QUICK: Duration = Duration::from_secs(2);
const QUERY: Duration = Duration::from_secs(10);
const REFRESH: Duration = Duration::from_secs(60);
const CLOSE: Duration = Duration::from_secs(300);

/// Arguments of `open`.
#[derive(Args)]
pub struct OpenArgs {
    /// Volume format (default: plain when --table is given, else luks).
    #[arg(long = "type", value_enum)]
    pub kind: Option<VolumeType>,
    /// dm-crypt table line for --type plain; its <device> is replaced by DEVICE.
    /// `-` reads the line from stdin (as dmsetup does); a <key> of `-` takes the
    /// raw key from --key-file. A hex key here is visible in `ps` (warned).
    #[arg(long)]
    pub table: Option<String>,
    /// Read the table line from standard input (used by the detached daemon).
    #[arg(long, hide = true)]
    pub table_stdin: bool,
    /// Detached LUKS header file.
    #[arg(long)]
    pub header: Option<PathBuf>,
    /// Read the passphrase (LUKS) or, for --table with a `-` key field, the raw
    /// key bytes from this file (`-` = stdin).
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// Only try this key slot.
    #[arg(long)]
    pub key_slot: Option<u32>,
    /// Frontend: nbd[=SOCKET] (default), fuse[=MOUNTPOINT] or ublk.
    #[arg(long, default_value = "nbd")]
    pub export: String,
    /// Serve NBD on TCP at [ADDR:]PORT instead of a unix socket (loopback if no address);
    /// needs TLS credentials, or --tls=off to serve unencrypted.
    #[arg(long)]
    pub listen: Option<String>,
    /// NBD over TLS: off, on (offered) or require (default when credentials are given).
    #[arg(long)]
    pub tls: Option<String>,
    /// TLS certificate directory: ca-cert.pem, server-cert.pem, server-key.pem (qemu/nbdkit layout).
    #[arg(long, value_name = "DIR")]
    pub tls_certificates: Option<PathBuf>,
    /// TLS pre-shared keys: a psktool file of identity:hexkey lines.
    #[arg(long, value_name = "FILE")]
    pub tls_psk: Option<PathBuf>,
    /// Require clients to present a certificate signed by the directory's ca-cert.pem.
    #[arg(long)]
    pub tls_verify_peer: bool,
    /// Performance flags.
    #[command(flatten)]
    pub perf: PerfArgs,
    /// Data-path mode: classic (dm-crypt's queues), inline or adaptive.
    #[arg(long, default_value = "classic")]
    pub mode: String,
    /// Pass discards (TRIM) down to the device.
    #[arg(long)]
    pub allow_discards: bool,
    /// Serve read-only.
    #[arg(long)]
    pub readonly: bool,
    /// Stay in the foreground instead of detaching.
    #[arg(long)]
    pub foreground: bool,
    /// How the backing file is read and written: syscalls (pread/pwrite, the
    /// default: lowest latency for one request per thread) or uring.
    #[arg(long, value_enum, default_value = "syscalls")]
    pub io_engine: IoEngineArg,
    /// O_DIRECT on the backing file: auto (aligned requests bypass the page
    /// cache, like loop --direct-io), never, or required.
    #[arg(long, value_enum, default_value = "auto")]
    pub direct_io: DirectIoArg,
    /// Backing device or file.
    pub device: PathBuf,
    /// Volume name.
    pub name: String,
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
    pub fn run(self) -> CmdResult {
        match self {
            Commands::Open(a) => open(a),
            Commands::Close { name } => close(&name),
            Commands::Status { name } => status(&name),
            Commands::Table { name, showkeys } => {
                runtime::check_name(&name)?;
                Ok(control::print_table(&name, showkeys, QUERY)?)
            }
            Commands::Refresh(a) => refresh(&a),
            Commands::List => list(),
        }
    }
}

fn open(a: OpenArgs) -> CmdResult {
    runtime::check_name(&a.name)?;
    let mode = control::parse_mode(&a.mode)?;
    let export = ExportSpec::parse(&a.export, a.listen.as_deref())?;
    export.check_available()?;
    let tls = TlsSpec::new(
        a.tls.as_deref(),
        a.tls_certificates.as_deref(),
        a.tls_psk.as_deref(),
        a.tls_verify_peer,
        &export,
    )?;
    // Bad credentials fail here, on the terminal, before anything starts.
    tls.load()?;
    // The detached daemon re-checks the claim its parent made.
    let me = a.table_stdin.then(std::process::id);
    let claim = runtime::claim(&a.name, me)?;
    report_stale_mount(&claim.paths, claim.detached_stale_mount);
    let device = daemon::resolve::device(&a.device)?;
    let kind = a.kind.unwrap_or(if a.table.is_some() || a.table_stdin {
        VolumeType::Plain
    } else {
        VolumeType::Luks
    });
    let (mut table, volume_type) = if a.table_stdin {
        let t = daemon::detach::read_table_stdin()?;
        let k = match kind {
            VolumeType::Luks => Kind::of_header(a.header.as_deref().unwrap_or(&device)),
            VolumeType::Plain => Kind::Plain,
        };
        (t, k)
    } else {
        resolve_table(&a, kind, &device)?
    };
    table.device = device.display().to_string();

    let engine = daemon::resolve::engine_config(
        &mut table,
        mode,
        a.perf.flags(),
        a.allow_discards,
        a.readonly,
    );

    if a.foreground {
        let spec = daemon::Spec {
            name: a.name.clone(),
            volume_type,
            table,
            export,
            tls,
            engine,
            io_engine: match a.io_engine {
                IoEngineArg::Syscalls => backend::IoEngine::Syscalls,
                IoEngineArg::Uring => backend::IoEngine::Uring,
            },
            direct: match a.direct_io {
                DirectIoArg::Auto => backend::DirectIo::Auto,
                DirectIoArg::Never => backend::DirectIo::Never,
                DirectIoArg::Required => backend::DirectIo::Required,
            },
        };
        daemon::run(spec, |p| {
            println!("{}", describe(p));
            let _ = std::io::Write::flush(&mut std::io::stdout());
        })?;
        return Ok(());
    }
    let exe = std::env::current_exe()
        .map_err(|e| Failure::device(format!("Cannot find the ucrypt binary: {e}")))?;
    if tls.plaintext_tcp(&export) {
        // The detached daemon's own warning only reaches its log.
        eprintln!(
            "ucrypt: warning: NBD over TCP without TLS (--tls=off) is unencrypted on the wire: anyone who \
             can reach the port can read and write the decrypted device"
        );
    }
    let args = child_args(&a, volume_type == Kind::Plain, &device, &export, &tls);
    let ping = daemon::detach::spawn(&exe, &args, &a.name, &table)?;
    println!("{}", describe(&ping));
    Ok(())
}

/// Builds the mapping in the calling process (prompting, KDFs, …).
fn resolve_table(a: &OpenArgs, kind: VolumeType, device: &Path) -> Result<(Table, Kind), Failure> {
    match kind {
        VolumeType::Plain => {
            let line = a.table.as_deref().ok_or_else(|| {
                Failure::usage("--type plain needs the mapping as --table '<start> <len> crypt <cipher> <key> <iv_offset> <device> <offset> [opts]'")
            })?;
            let table = daemon::resolve::plain_table_arg(line, a.key_file.as_deref(), true)?;
            Ok((table, Kind::Plain))
        }
        VolumeType::Luks => {
            if a.table.is_some() {
                return Err(Failure::usage("--table is only for --type plain"));
            }
            crate::cmd::luks::unlock(
                device,
                a.header.as_deref(),
                a.key_file.as_deref(),
                a.key_slot,
            )
        }
    }
}

/// Says so when a dead daemon's FUSE mount had to be detached.
fn report_stale_mount(paths: &runtime::Paths, detached: bool) {
    if detached {
        eprintln!(
            "ucrypt: detached a stale FUSE mount at {}",
            paths.fuse.display()
        );
    }
}

/// One line saying where the volume is served.
fn describe(p: &Ping) -> String {
    match p.export {
        ExportKind::Fuse => format!(
            "{}: serving the decrypted device as file {} (pid {})",
            p.name, p.endpoint, p.pid
        ),
        ExportKind::Ublk => format!(
            "{}: serving the decrypted device as {} (pid {})",
            p.name, p.endpoint, p.pid
        ),
        _ => format!("{}: serving NBD at {} (pid {})", p.name, p.endpoint, p.pid),
    }
}

/// The detached daemon's command line: `open --foreground --table-stdin`
/// with every option of `a` (paths already absolute: it runs in `/`).
fn child_args(
    a: &OpenArgs,
    plain: bool,
    device: &Path,
    export: &ExportSpec,
    tls: &TlsSpec,
) -> Vec<String> {
    let mut v: Vec<String> = vec!["open".into(), "--foreground".into(), "--table-stdin".into()];
    v.push(format!("--type={}", if plain { "plain" } else { "luks" }));
    if let Some(h) = &a.header {
        v.push(format!(
            "--header={}",
            std::path::absolute(h)
                .unwrap_or_else(|_| h.clone())
                .display()
        ));
    }
    let (export, listen) = export.to_args();
    v.push(format!("--export={export}"));
    if let Some(l) = listen {
        v.push(format!("--listen={l}"));
    }
    v.extend(tls.to_args());
    let p = &a.perf;
    for (on, f) in [
        (p.no_read_workqueue, "--perf-no_read_workqueue"),
        (p.no_write_workqueue, "--perf-no_write_workqueue"),
        (p.same_cpu_crypt, "--perf-same_cpu_crypt"),
        (p.submit_from_crypt_cpus, "--perf-submit_from_crypt_cpus"),
        (a.allow_discards, "--allow-discards"),
        (a.readonly, "--readonly"),
    ] {
        if on {
            v.push(f.into());
        }
    }
    v.push(format!("--mode={}", a.mode));
    v.push(
        match a.io_engine {
            IoEngineArg::Uring => "--io-engine=uring",
            IoEngineArg::Syscalls => "--io-engine=syscalls",
        }
        .into(),
    );
    v.push(
        match a.direct_io {
            DirectIoArg::Auto => "--direct-io=auto",
            DirectIoArg::Never => "--direct-io=never",
            DirectIoArg::Required => "--direct-io=required",
        }
        .into(),
    );
    v.push("--".into());
    v.push(device.display().to_string());
    v.push(a.name.clone());
    v
}

fn close(name: &str) -> CmdResult {
    runtime::check_name(name)?;
    let paths = runtime::Paths::of(name);
    let pid = runtime::live_pid(&paths, name);
    if let Err(e) = control::close(name, CLOSE) {
        if matches!(
            e.kind(),
            daemon::ErrorKind::NotActive | daemon::ErrorKind::Protocol
        ) {
            // No daemon answering: clean up after a crashed one, if any.
            report_stale_mount(&paths, runtime::clean_stale(&paths));
        }
        return Err(e.into());
    }
    // The reply came after the flush; wait for the process to be gone so
    // the socket, mount and pid file are removed when we return.
    if let Some(pid) = pid {
        let deadline = Instant::now() + Duration::from_secs(30);
        while runtime::pid_serves(pid, name) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let _ = std::fs::remove_file(&paths.log);
    Ok(())
}

fn status(name: &str) -> CmdResult {
    runtime::check_name(name)?;
    let s = control::status(name, QUERY)?;
    let in_use = s.nbd.is_some_and(|n| n.connections > 0);
    println!(
        "{name} is active{}.",
        if in_use { " and is in use" } else { "" }
    );
    println!("  type:    {}", s.volume_type.name());
    println!("  cipher:  {}", s.cipher);
    println!("  keysize: {} bits", s.keysize_bits);
    println!("  key location: ucrypt daemon memory (pid {})", s.ping.pid);
    println!("  device:  {}", s.device);
    println!("  sector size:  {}", s.sector_size);
    println!("  offset:  {} sectors", s.offset_sectors);
    println!("  size:    {} sectors", s.size_sectors);
    println!(
        "  mode:    {}",
        if s.read_only {
            "readonly"
        } else {
            "read/write"
        }
    );
    let flags = flag_words(s.allow_discards, &s.flags);
    if !flags.is_empty() {
        println!("  flags:   {}", flags.join(" "));
    }
    println!("  data path: {}", mode_name(s.mode));
    println!("  export:  {} {}", s.ping.export.name(), s.ping.endpoint);
    if let Some(c) = &s.nbd {
        println!(
            "  clients: {} connected, {} accepted, {} disconnected for protocol errors",
            c.connections, c.accepted, c.protocol_errors
        );
    }
    for (dir, d) in [("read", &s.stats.read), ("write", &s.stats.write)] {
        println!(
            "  {dir}s:   {} requests, {} bytes, {} errors, {} inline, {} queued, p50 {:.1} us, p99 {:.1} us",
            d.requests, d.bytes, d.errors, d.inline, d.queued, d.p50_us, d.p99_us
        );
    }
    let st = &s.stats;
    println!(
        "  flushes: {}, discards: {}, in flight: {} (max {}), reconfigurations: {}",
        st.flushes, st.discards, st.in_flight, st.max_in_flight, st.reconfigurations
    );
    Ok(())
}

fn refresh(a: &RefreshArgs) -> CmdResult {
    runtime::check_name(&a.name)?;
    let mode = a.mode.as_deref().map(control::parse_mode).transpose()?;
    let r = control::refresh(&a.name, mode, Flags::from(a.perf.flags()), REFRESH)?;
    let flags = flag_words(r.allow_discards, &r.flags);
    println!(
        "{}: data path {}, flags: {}",
        a.name,
        mode_name(r.mode),
        if flags.is_empty() {
            "(none)".to_owned()
        } else {
            flags.join(" ")
        }
    );
    Ok(())
}

fn list() -> CmdResult {
    let dir = runtime::dir();
    for name in runtime::volumes() {
        let paths = runtime::Paths::new(&dir, &name);
        let Some(pid) = runtime::live_pid(&paths, &name) else {
            continue;
        };
        match control::ping(&name, QUICK) {
            Ok(p) => println!("{name}\tpid {pid}\t{}\t{}", p.export.name(), p.endpoint),
            Err(_) => println!("{name}\tpid {pid}\t(not answering)"),
        }
    }
    Ok(())
}
