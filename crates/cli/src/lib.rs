//! The `ucrypt` command line: argument parsing, passphrase prompts, output
//! formatting and one mapping from the libraries' typed errors to
//! cryptsetup's exit codes ([`Failure`]). Each subcommand group lives in its
//! own module under `cmd/`; the work is done by the library crates (the
//! daemon and its control protocol by `ucrypt-daemon`, LUKS by
//! `ucrypt-luks`, plain mode by `ucrypt-plain`), except `map` (which runs no
//! daemon: [`map`], the table through an inline engine) and `benchmark`'s
//! cipher table ([`benchmark`]).
//!
//! `ucrypt bench` runs in a binary of its own, `ucrypt-bench`
//! (`src/bin/ucrypt-bench.rs`, over the `ucrypt-bench` crate), which
//! [`cmd::bench`] execs: the `ucrypt` binary, which holds keys while it
//! serves, links no plotting, fonts, PNG or libblkio.
#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub mod benchmark;
pub mod cmd;
pub mod global;
pub mod map;

/// A failed command: the message for stderr and cryptsetup's exit code
/// (1 wrong parameters, 2 no permission / bad passphrase, 3 out of memory,
/// 4 wrong device specified, 5 device already exists or busy).
#[derive(Debug)]
pub struct Failure {
    /// Process exit code.
    pub code: u8,
    /// Human-readable message (never contains key material).
    pub message: String,
}

impl Failure {
    /// A failure with exit code `code`.
    pub fn new(code: u8, msg: impl Into<String>) -> Self {
        let message = msg.into();
        Self { code, message }
    }
    /// Exit code 1: wrong parameters.
    pub fn usage(msg: impl Into<String>) -> Self {
        Self::new(1, msg)
    }
    /// Exit code 4: wrong device specified.
    pub fn device(msg: impl Into<String>) -> Self {
        Self::new(4, msg)
    }
}

/// cryptsetup's exit code for a library error kind: the one place typed
/// errors become exit codes.
pub fn exit_code(e: &daemon::Error) -> u8 {
    use daemon::ErrorKind as K;
    match e.kind() {
        K::InvalidInput => 1,
        K::WrongPassphrase | K::PermissionDenied => 2,
        K::NotActive | K::NoDevice | K::Io | K::Protocol => 4,
        K::Busy => 5,
        // The detached daemon is this binary: its code is already ours.
        K::DaemonExited => e.exit_code().unwrap_or(1),
        _ => 1,
    }
}

impl From<daemon::Error> for Failure {
    fn from(e: daemon::Error) -> Self {
        Self::new(exit_code(&e), e.chain())
    }
}

impl From<luks::Error> for Failure {
    /// Through [`daemon::Error`], which keeps the LUKS kind: a wrong
    /// passphrase is 2, I/O 4, anything else 1.
    fn from(e: luks::Error) -> Self {
        daemon::Error::from(e).into()
    }
}

/// Result type of every subcommand.
pub type CmdResult = Result<(), Failure>;

#[derive(Parser)]
#[command(
    name = "ucrypt",
    version,
    about = "dm-crypt and LUKS in userspace, without the queues"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    #[command(flatten)]
    globals: global::Globals,
}

/// How `rbd:POOL/IMAGE[@SNAP]` devices reach their Ceph cluster (every verb
/// that takes a device accepts such a name).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct CephArgs {
    /// ceph.conf for rbd: devices [default: $CEPH_CONF, /etc/ceph/ceph.conf]
    #[arg(long, global = true, value_name = "FILE")]
    pub ceph_conf: Option<std::path::PathBuf>,
    /// Ceph client id for rbd: devices, without "client." [default: admin]
    #[arg(long, global = true, value_name = "ID")]
    pub ceph_id: Option<String>,
    /// Ceph keyring for rbd: devices [default: the one ceph.conf names]
    #[arg(long, global = true, value_name = "FILE")]
    pub keyring: Option<std::path::PathBuf>,
}

impl CephArgs {
    /// These options as the cluster settings an `rbd:` open is given.
    pub fn config(&self) -> backend::rbd::RbdConfig {
        backend::rbd::RbdConfig {
            conf: self.ceph_conf.clone(),
            id: self.ceph_id.clone(),
            keyring: self.keyring.clone(),
            timeout: None,
        }
    }

    /// The same options as arguments, to hand on to `ucrypt-bench`.
    pub fn to_args(&self) -> Vec<std::ffi::OsString> {
        let mut v = Vec::new();
        if let Some(c) = &self.ceph_conf {
            v.extend(["--ceph-conf".into(), c.clone().into_os_string()]);
        }
        if let Some(id) = &self.ceph_id {
            v.extend(["--ceph-id".into(), id.into()]);
        }
        if let Some(k) = &self.keyring {
            v.extend(["--keyring".into(), k.clone().into_os_string()]);
        }
        v
    }
}

// Parsed once per process; a boxed variant would only add indirection.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    #[command(flatten)]
    Crypt(cmd::crypt::Commands),
    #[command(flatten)]
    Luks(cmd::luks::Commands),
    #[command(flatten)]
    Header(cmd::header::Commands),
    #[command(flatten)]
    Docs(cmd::docs::Commands),
    #[command(flatten)]
    Daemon(cmd::daemon::Commands),
    #[command(flatten)]
    Bench(cmd::bench::Commands),
    #[command(flatten)]
    Reencrypt(cmd::reencrypt::Commands),
    #[command(flatten)]
    Bitlk(cmd::bitlk::Commands),
    #[command(flatten)]
    Fvault2(cmd::fvault2::Commands),
    #[command(flatten)]
    Tcrypt(cmd::tcrypt::Commands),
}

/// Entry point used by `main.rs`.
pub fn main() -> ExitCode {
    // cryptsetup exits 1 on a usage error (2 means a bad passphrase);
    // help and version still exit 0.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = match Cli::try_parse_from(&args) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 1 } else { 0 });
        }
    };
    let g = cli.globals;
    // `map --read` writes the plaintext to stdout: the tool's own lines
    // go to stderr there.
    let data_on_stdout = matches!(&cli.command, Command::Crypt(c) if c.stdout_is_data());
    if g.debug {
        if data_on_stdout {
            eprintln!("{}", global::processing_line(&args));
        } else {
            println!("{}", global::processing_line(&args));
        }
    }
    let result = match cli.command {
        // cryptsetup's --test-args: the arguments parsed; nothing runs.
        _ if g.test_args => Ok(()),
        Command::Crypt(c) => c.run(&g),
        Command::Luks(c) => c.run(&g),
        Command::Header(c) => c.run(&g),
        Command::Docs(c) => c.run(),
        Command::Daemon(c) => c.run(&g),
        Command::Bench(c) => c.run(&g),
        Command::Reencrypt(c) => c.run(&g),
        Command::Bitlk(c) => c.run(&g),
        Command::Fvault2(c) => c.run(&g),
        Command::Tcrypt(c) => c.run(&g),
    };
    let code = match result {
        Ok(()) => 0,
        Err(f) => {
            eprintln!("ucrypt: {}", f.message);
            f.code
        }
    };
    // cryptsetup's tools_show_status, on stdout unless that is data.
    if g.verbose() {
        if data_on_stdout {
            eprintln!("{}", global::status_line(code));
        } else {
            println!("{}", global::status_line(code));
        }
    }
    ExitCode::from(code)
}
