//! `open`, `close`, `status`, `table`, `refresh`, `list`: the daemon that
//! serves a decrypted device, and the commands that talk to it.
//!
//! `open` resolves the mapping (a dm table line for `--type plain`, the LUKS
//! header for `--type luks`) in the calling process, then either serves in
//! the foreground or re-executes itself detached (`--foreground`, own
//! process group, output to `NAME.log`) and hands the table — key included —
//! over a pipe on stdin, never on the command line. It returns once the
//! daemon answers on its control socket. See [`runtime`] for the files and
//! [`serve`] for the daemon itself.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::{Args, Subcommand, ValueEnum};
use crypto::table::Table;
use datapath::{EngineConfig, PerfFlags};
use serde_json::{json, Value};
use zeroize::Zeroizing;

use crate::{CmdResult, Failure};

pub mod runtime;
pub mod serve;

use serve::ExportSpec;

/// Commands of this group.
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

/// Arguments of `open`.
#[derive(Args)]
pub struct OpenArgs {
    /// Volume format (default: plain when --table is given, else luks).
    #[arg(long = "type", value_enum)]
    pub kind: Option<VolumeType>,
    /// dm-crypt table line for --type plain; its <device> is replaced by DEVICE.
    #[arg(long)]
    pub table: Option<String>,
    /// Read the table line from standard input (used by the detached daemon).
    #[arg(long, hide = true)]
    pub table_stdin: bool,
    /// Detached LUKS header file.
    #[arg(long)]
    pub header: Option<PathBuf>,
    /// Read the passphrase from this file.
    #[arg(long)]
    pub key_file: Option<PathBuf>,
    /// Only try this key slot.
    #[arg(long)]
    pub key_slot: Option<u32>,
    /// Frontend: nbd[=SOCKET] (default), fuse[=MOUNTPOINT] or ublk.
    #[arg(long, default_value = "nbd")]
    pub export: String,
    /// Serve NBD on TCP at [ADDR:]PORT instead of a unix socket (loopback if no address).
    #[arg(long)]
    pub listen: Option<String>,
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
                let v = runtime::request(
                    &name,
                    &json!({"cmd": "table", "showkeys": showkeys}),
                    Duration::from_secs(10),
                )?;
                println!("{}", v["table"].as_str().unwrap_or_default());
                Ok(())
            }
            Commands::Refresh(a) => refresh(&a),
            Commands::List => list(),
        }
    }
}

fn open(a: OpenArgs) -> CmdResult {
    runtime::check_name(&a.name)?;
    let mode = serve::parse_mode(&a.mode)?;
    let export = parse_export(&a.export, a.listen.as_deref())?;
    if export == ExportSpec::Ublk && !ublk::available() {
        return Err(Failure::device(serve::ublk_unavailable()));
    }
    let dir = runtime::ensure_dir()?;
    let paths = runtime::Paths::new(&dir, &a.name);
    if let Some(pid) = runtime::live_pid(&paths, &a.name) {
        if !(a.table_stdin && pid == std::process::id()) {
            return Err(Failure::busy(format!(
                "Device {} already exists (served by pid {pid}).",
                a.name
            )));
        }
    }
    // Whatever a crashed daemon left behind must not block us.
    runtime::clean_stale(&paths);

    let device = std::path::absolute(&a.device).map_err(|e| {
        Failure::device(format!(
            "Device {} does not exist or access denied: {e}",
            a.device.display()
        ))
    })?;
    if !device.exists() {
        return Err(Failure::device(format!(
            "Device {} does not exist or access denied.",
            device.display()
        )));
    }
    let kind = a.kind.unwrap_or(if a.table.is_some() || a.table_stdin {
        VolumeType::Plain
    } else {
        VolumeType::Luks
    });
    let (mut table, kind_name) = if a.table_stdin {
        // Room for any table line up front, so no reallocation leaves a
        // copy of the key behind in freed memory.
        let mut line = Zeroizing::new(String::with_capacity(64 << 10));
        std::io::stdin()
            .take(60 << 10)
            .read_to_string(&mut line)
            .map_err(|e| Failure::usage(format!("Cannot read the table from stdin: {e}")))?;
        let t =
            Table::parse(line.trim()).map_err(|e| Failure::usage(format!("Invalid table: {e}")))?;
        (
            t,
            if kind == VolumeType::Luks {
                luks_version(a.header.as_deref().unwrap_or(&device))
            } else {
                "PLAIN"
            },
        )
    } else {
        resolve_table(&a, kind, &device)?
    };
    table.device = device.display().to_string();

    let mut flags = a.perf.flags();
    flags.same_cpu_crypt |= table.options.same_cpu_crypt;
    flags.submit_from_crypt_cpus |= table.options.submit_from_crypt_cpus;
    flags.no_read_workqueue |= table.options.no_read_workqueue;
    flags.no_write_workqueue |= table.options.no_write_workqueue;
    table.options.same_cpu_crypt = flags.same_cpu_crypt;
    table.options.submit_from_crypt_cpus = flags.submit_from_crypt_cpus;
    table.options.no_read_workqueue = flags.no_read_workqueue;
    table.options.no_write_workqueue = flags.no_write_workqueue;
    table.options.allow_discards |= a.allow_discards;
    let engine = EngineConfig {
        mode,
        flags,
        allow_discards: table.options.allow_discards,
        read_only: a.readonly,
        ..EngineConfig::default()
    };

    if a.foreground {
        let io_engine = match a.io_engine {
            IoEngineArg::Syscalls => backend::IoEngine::Syscalls,
            IoEngineArg::Uring => backend::IoEngine::Uring,
        };
        let direct = match a.direct_io {
            DirectIoArg::Auto => backend::DirectIo::Auto,
            DirectIoArg::Never => backend::DirectIo::Never,
            DirectIoArg::Required => backend::DirectIo::Required,
        };
        let spec = serve::Spec {
            name: a.name.clone(),
            kind: kind_name.to_owned(),
            table,
            export,
            engine,
            io_engine,
            direct,
        };
        return serve::run(spec, |v| {
            println!("{}", describe(v));
            let _ = std::io::stdout().flush();
        });
    }
    spawn_detached(&a, kind_name, &table, &device, &export, &paths)
}

/// Builds the mapping in the calling process (prompting, KDFs, …).
fn resolve_table(
    a: &OpenArgs,
    kind: VolumeType,
    device: &std::path::Path,
) -> Result<(Table, &'static str), Failure> {
    match kind {
        VolumeType::Plain => {
            let line = a.table.as_deref().ok_or_else(|| {
                Failure::usage("--type plain needs the mapping as --table '<start> <len> crypt <cipher> <key> <iv_offset> <device> <offset> [opts]'")
            })?;
            let t =
                Table::parse(line).map_err(|e| Failure::usage(format!("Invalid table: {e}")))?;
            Ok((t, "PLAIN"))
        }
        VolumeType::Luks => {
            if a.table.is_some() {
                return Err(Failure::usage("--table is only for --type plain"));
            }
            let t = crate::cmd::luks::luks_table(
                device,
                a.header.as_deref(),
                a.key_file.as_deref(),
                a.key_slot,
            )?;
            Ok((t, luks_version(a.header.as_deref().unwrap_or(device))))
        }
    }
}

/// "LUKS1" / "LUKS2" from the header's magic and version fields.
fn luks_version(header: &std::path::Path) -> &'static str {
    let mut b = [0u8; 8];
    let ok = std::fs::File::open(header)
        .and_then(|mut f| f.read_exact(&mut b))
        .is_ok();
    match (ok, &b[..6], u16::from_be_bytes([b[6], b[7]])) {
        (true, b"LUKS\xba\xbe", 1) => "LUKS1",
        (true, b"LUKS\xba\xbe", 2) => "LUKS2",
        _ => "LUKS",
    }
}

fn parse_export(s: &str, listen: Option<&str>) -> Result<ExportSpec, Failure> {
    let (kind, arg) = match s.split_once('=') {
        Some((k, v)) => (k, Some(v)),
        None => (s, None),
    };
    let path = |v: &str| -> Result<PathBuf, Failure> {
        std::path::absolute(v).map_err(|e| Failure::usage(format!("Invalid path {v:?}: {e}")))
    };
    let spec = match (kind, arg) {
        ("nbd", _) if listen.is_some() => {
            if arg.is_some() {
                return Err(Failure::usage(
                    "Give either --export nbd=SOCKET or --listen, not both",
                ));
            }
            ExportSpec::NbdTcp(parse_listen(listen.unwrap_or_default())?)
        }
        ("nbd", None) => ExportSpec::NbdUnix(None),
        ("nbd", Some(p)) => ExportSpec::NbdUnix(Some(path(p)?)),
        ("fuse", None) => ExportSpec::Fuse(None),
        ("fuse", Some(p)) => ExportSpec::Fuse(Some(path(p)?)),
        ("ublk", None) => ExportSpec::Ublk,
        _ => {
            return Err(Failure::usage(format!(
                "Unknown export {s:?}: use nbd[=SOCKET], fuse[=MOUNTPOINT] or ublk"
            )))
        }
    };
    if listen.is_some() && !matches!(spec, ExportSpec::NbdTcp(_)) {
        return Err(Failure::usage("--listen only applies to --export nbd"));
    }
    Ok(spec)
}

/// `PORT` (loopback) or an explicit `ADDR:PORT` / `[V6]:PORT`.
fn parse_listen(s: &str) -> Result<SocketAddr, Failure> {
    if let Ok(port) = s.parse::<u16>() {
        return Ok(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), port));
    }
    s.parse::<SocketAddr>().map_err(|_| {
        Failure::usage(format!(
            "Invalid --listen {s:?}: use PORT or ADDR:PORT (e.g. 127.0.0.1:10809)"
        ))
    })
}

/// Human description of a ping reply.
fn describe(v: &Value) -> String {
    let name = v["name"].as_str().unwrap_or("?");
    let w = v["where"].as_str().unwrap_or("?");
    match v["export"].as_str() {
        Some("fuse") => format!(
            "{name}: serving the decrypted device as file {w} (pid {})",
            v["pid"]
        ),
        _ => format!("{name}: serving NBD at {w} (pid {})", v["pid"]),
    }
}

fn child_args(
    a: &OpenArgs,
    kind: &str,
    device: &std::path::Path,
    export: &ExportSpec,
) -> Vec<String> {
    let mut v: Vec<String> = vec!["open".into(), "--foreground".into(), "--table-stdin".into()];
    v.push(format!(
        "--type={}",
        if kind == "PLAIN" { "plain" } else { "luks" }
    ));
    if let Some(h) = &a.header {
        v.push(format!(
            "--header={}",
            std::path::absolute(h)
                .unwrap_or_else(|_| h.clone())
                .display()
        ));
    }
    // Paths already made absolute: the daemon runs in `/`.
    match export {
        ExportSpec::NbdUnix(None) => v.push("--export=nbd".into()),
        ExportSpec::NbdUnix(Some(p)) => v.push(format!("--export=nbd={}", p.display())),
        ExportSpec::NbdTcp(addr) => v.push(format!("--listen={addr}")),
        ExportSpec::Fuse(None) => v.push("--export=fuse".into()),
        ExportSpec::Fuse(Some(p)) => v.push(format!("--export=fuse={}", p.display())),
        ExportSpec::Ublk => v.push("--export=ublk".into()),
    }
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
    v.push(format!(
        "--io-engine={}",
        if a.io_engine == IoEngineArg::Uring {
            "uring"
        } else {
            "syscalls"
        }
    ));
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

fn spawn_detached(
    a: &OpenArgs,
    kind: &str,
    table: &Table,
    device: &std::path::Path,
    export: &ExportSpec,
    paths: &runtime::Paths,
) -> CmdResult {
    let exe = std::env::current_exe()
        .map_err(|e| Failure::device(format!("Cannot find the ucrypt binary: {e}")))?;
    let log = std::fs::File::create(&paths.log)
        .map_err(|e| Failure::denied(format!("Cannot create {}: {e}", paths.log.display())))?;
    let log2 = log
        .try_clone()
        .map_err(|e| Failure::denied(format!("Cannot create log: {e}")))?;
    let mut child = Command::new(exe)
        .args(child_args(a, kind, device, export))
        .stdin(Stdio::piped())
        .stdout(log)
        .stderr(log2)
        .process_group(0)
        // Do not pin the caller's working directory (every path is absolute).
        .current_dir("/")
        .env("UCRYPT_RUNTIME_DIR", runtime::dir())
        .spawn()
        .map_err(|e| Failure::device(format!("Cannot start the daemon: {e}")))?;
    {
        let line = Zeroizing::new(table.format(true));
        let mut stdin = child
            .stdin
            .take()
            .ok_or_else(|| Failure::device("Daemon has no stdin"))?;
        stdin
            .write_all(line.as_bytes())
            .map_err(|e| Failure::device(format!("Cannot hand the table to the daemon: {e}")))?;
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            let log = std::fs::read_to_string(&paths.log).unwrap_or_default();
            let msg = log
                .lines()
                .rev()
                .find_map(|l| l.strip_prefix("ucrypt: "))
                .unwrap_or("the daemon exited during start-up")
                .to_owned();
            let code = st
                .code()
                .and_then(|c| u8::try_from(c).ok())
                .filter(|&c| c != 0)
                .unwrap_or(1);
            return Err(Failure { code, message: msg });
        }
        if let Ok(v) = runtime::request(&a.name, &json!({"cmd": "ping"}), Duration::from_secs(2)) {
            println!("{}", describe(&v));
            return Ok(());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err(Failure::device(format!(
                "The daemon did not become ready in time; see {}",
                paths.log.display()
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn close(name: &str) -> CmdResult {
    runtime::check_name(name)?;
    let paths = runtime::Paths::of(name);
    let pid = runtime::live_pid(&paths, name);
    match runtime::request(name, &json!({"cmd": "close"}), Duration::from_secs(300)) {
        Ok(_) => {}
        Err(f) if f.code == 4 => {
            // No daemon answering: clean up after a crashed one, if any.
            runtime::clean_stale(&paths);
            return Err(f);
        }
        Err(f) => return Err(f),
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
    let v = runtime::request(name, &json!({"cmd": "status"}), Duration::from_secs(10))?;
    let n = |k: &str| v[k].as_u64().unwrap_or(0);
    let flags: Vec<&str> = v["flags"]
        .as_array()
        .map(|a| a.iter().filter_map(|f| f.as_str()).collect())
        .unwrap_or_default();
    let in_use = v["nbd"]["connections"].as_u64().unwrap_or(0) > 0;
    println!(
        "{name} is active{}.",
        if in_use { " and is in use" } else { "" }
    );
    println!("  type:    {}", v["type"].as_str().unwrap_or("?"));
    println!("  cipher:  {}", v["cipher"].as_str().unwrap_or("?"));
    println!("  keysize: {} bits", n("keysize_bits"));
    println!("  key location: ucrypt daemon memory (pid {})", n("pid"));
    println!("  device:  {}", v["device"].as_str().unwrap_or("?"));
    println!("  sector size:  {}", n("sector_size"));
    println!("  offset:  {} sectors", n("offset_sectors"));
    println!("  size:    {} sectors", n("size_sectors"));
    println!(
        "  mode:    {}",
        if v["read_only"] == true {
            "readonly"
        } else {
            "read/write"
        }
    );
    if !flags.is_empty() {
        println!("  flags:   {}", flags.join(" "));
    }
    println!("  data path: {}", v["mode"].as_str().unwrap_or("?"));
    println!(
        "  export:  {} {}",
        v["export"].as_str().unwrap_or("?"),
        v["where"].as_str().unwrap_or("?")
    );
    if v["nbd"].is_object() {
        let c = &v["nbd"];
        println!(
            "  clients: {} connected, {} accepted, {} disconnected for protocol errors",
            c["connections"], c["accepted"], c["protocol_errors"]
        );
    }
    let s = &v["stats"];
    for dir in ["read", "write"] {
        let d = &s[dir];
        println!(
            "  {dir}s:   {} requests, {} bytes, {} errors, {} inline, {} queued, p50 {:.1} us, p99 {:.1} us",
            d["requests"],
            d["bytes"],
            d["errors"],
            d["inline"],
            d["queued"],
            d["p50_us"].as_f64().unwrap_or(0.0),
            d["p99_us"].as_f64().unwrap_or(0.0)
        );
    }
    println!(
        "  flushes: {}, discards: {}, in flight: {} (max {}), reconfigurations: {}",
        s["flushes"], s["discards"], s["in_flight"], s["max_in_flight"], s["reconfigurations"]
    );
    Ok(())
}

fn refresh(a: &RefreshArgs) -> CmdResult {
    runtime::check_name(&a.name)?;
    if let Some(m) = &a.mode {
        serve::parse_mode(m)?;
    }
    let p = &a.perf;
    let req = json!({
        "cmd": "refresh",
        "mode": a.mode,
        "flags": {
            "same_cpu_crypt": p.same_cpu_crypt,
            "submit_from_crypt_cpus": p.submit_from_crypt_cpus,
            "no_read_workqueue": p.no_read_workqueue,
            "no_write_workqueue": p.no_write_workqueue,
        },
    });
    let v = runtime::request(&a.name, &req, Duration::from_secs(60))?;
    let flags: Vec<&str> = v["flags"]
        .as_array()
        .map(|a| a.iter().filter_map(|f| f.as_str()).collect())
        .unwrap_or_default();
    println!(
        "{}: data path {}, flags: {}",
        a.name,
        v["mode"].as_str().unwrap_or("?"),
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
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Ok(());
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_suffix(".pid"))
                .map(str::to_owned)
        })
        .collect();
    names.sort();
    for name in names {
        let paths = runtime::Paths::new(&dir, &name);
        let Some(pid) = runtime::live_pid(&paths, &name) else {
            continue;
        };
        match runtime::request(&name, &json!({"cmd": "ping"}), Duration::from_secs(2)) {
            Ok(v) => println!(
                "{name}\tpid {pid}\t{}\t{}",
                v["export"].as_str().unwrap_or("?"),
                v["where"].as_str().unwrap_or("?")
            ),
            Err(_) => println!("{name}\tpid {pid}\t(not answering)"),
        }
    }
    Ok(())
}
