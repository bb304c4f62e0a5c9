//! cryptsetup's global options: `-v`/`--verbose`, `--debug`,
//! `-q`/`--batch-mode`, `-T`/`--tries`, `-t`/`--timeout`,
//! `-y`/`--verify-passphrase`, `--disable-locks` and `--test-args`, with
//! the Ceph options of `rbd:` devices (`--ceph-conf`, `--ceph-id`,
//! `--keyring`), are clap global options ([`Globals`]), so every verb takes
//! them before or after its name, alone or combined (`ucrypt -qv erase
//! DEV`, `ucrypt status -v NAME`), and `--help` lists them. The verbs get
//! them as values: [`Globals::prompting`], [`Globals::access`].
//!
//! As cryptsetup's `tools_show_status`, `-v` ends the run with `Command
//! successful.` or `Command failed with code -N (...).` on stdout
//! ([`status_line`]); `--debug` implies `-v` and first prints the
//! `# ucrypt VERSION processing "..."` line ([`processing_line`]).

use std::ffi::OsString;

use clap::{Args, CommandFactory};

/// The options every verb takes.
#[derive(Args, Clone, Debug, Default)]
pub struct Globals {
    /// How `rbd:` devices reach their cluster (first: `--help` lists
    /// them before the other global options).
    #[command(flatten)]
    pub ceph: crate::CephArgs,
    /// Do not ask for confirmation.
    #[arg(long, short = 'q', global = true)]
    pub batch_mode: bool,
    /// Say how the command ended (and what it did, where it has more to say).
    #[arg(long, short = 'v', global = true)]
    pub verbose: bool,
    /// Print the command line first; implies --verbose.
    #[arg(long, global = true)]
    pub debug: bool,
    /// How often a passphrase typed at the terminal is asked for when it
    /// opens no keyslot (a key file or piped input gets one try).
    #[arg(long, short = 'T', global = true, value_name = "N", default_value_t = luks::passphrase::DEFAULT_TRIES)]
    pub tries: u32,
    /// How many seconds a passphrase prompt on the terminal waits for its
    /// line (0: no limit); a key file or piped input is not timed.
    #[arg(
        long,
        short = 't',
        global = true,
        value_name = "SECS",
        default_value_t = 0
    )]
    pub timeout: u64,
    /// Do not lock LUKS metadata (a header file is otherwise flock()ed
    /// while read and written, as cryptsetup does).
    #[arg(long, global = true)]
    pub disable_locks: bool,
    /// Check the command line only: run nothing (exit 0 when it parses).
    #[arg(long, global = true)]
    pub test_args: bool,
    /// Ask for every passphrase typed at the terminal twice (a new one is
    /// asked twice anyway, unless --batch-mode).
    #[arg(long, short = 'y', global = true)]
    pub verify_passphrase: bool,
}

impl Globals {
    /// When typed passphrases are asked twice: `-y` always, else `-q`
    /// never, else as the verb says (cryptsetup's `verify_passphrase`).
    pub fn verify(&self) -> luks::passphrase::Verify {
        use luks::passphrase::Verify;
        match (self.verify_passphrase, self.batch_mode) {
            (true, _) => Verify::Always,
            (false, true) => Verify::Never,
            (false, false) => Verify::AsVerbSays,
        }
    }

    /// How passphrases are asked for: `--tries`, `--timeout` and
    /// [`Globals::verify`], handed to whatever reads one (a crypttab line
    /// may change it for `open`).
    pub fn prompting(&self) -> luks::passphrase::Prompting {
        luks::passphrase::Prompting {
            tries: self.tries,
            timeout: self.timeout,
            verify: self.verify(),
            try_empty: false,
        }
    }

    /// How LUKS headers are reached: `--disable-locks` and the Ceph
    /// options, handed to every `luks` call that opens one.
    pub fn access(&self) -> luks::DeviceAccess {
        luks::DeviceAccess {
            locking: !self.disable_locks,
            ceph: self.ceph.config(),
        }
    }

    /// `-v` or `--debug`.
    pub fn verbose(&self) -> bool {
        self.verbose || self.debug
    }

    /// The options given (those that differ from their defaults) as
    /// arguments, to hand on to `ucrypt-bench`.
    pub fn to_args(&self) -> Vec<OsString> {
        let flags = [
            (self.batch_mode, "--batch-mode"),
            (self.verbose, "--verbose"),
            (self.debug, "--debug"),
            (self.disable_locks, "--disable-locks"),
            (self.test_args, "--test-args"),
            (self.verify_passphrase, "--verify-passphrase"),
        ];
        let mut v: Vec<OsString> = flags
            .iter()
            .filter(|(on, _)| *on)
            .map(|(_, name)| name.into())
            .collect();
        if self.tries != luks::passphrase::DEFAULT_TRIES {
            v.extend(["--tries".into(), self.tries.to_string().into()]);
        }
        if self.timeout != 0 {
            v.extend(["--timeout".into(), self.timeout.to_string().into()]);
        }
        v
    }
}

/// `--debug`'s first line: the command as run, a `--table` line (it may
/// hold a key) replaced by `<table>`.
pub fn processing_line(args: &[OsString]) -> String {
    let mut shown = Vec::new();
    let mut hide = false;
    for a in args.iter().skip(1) {
        let a = a.to_string_lossy();
        shown.push(if hide {
            "<table>".into()
        } else {
            a.to_string()
        });
        hide = a == "--table";
    }
    format!(
        "# ucrypt {} processing \"ucrypt {}\"",
        env!("CARGO_PKG_VERSION"),
        shown.join(" ")
    )
}

/// cryptsetup's closing line for exit code `code` (0: success).
pub fn status_line(code: u8) -> String {
    let what = match code {
        0 => return "Command successful.".into(),
        1 => "wrong or missing parameters",
        2 => "no permission or bad passphrase",
        3 => "out of memory",
        4 => "wrong device or file specified",
        5 => "device already exists or device is busy",
        _ => "unknown error",
    };
    format!("Command failed with code -{code} ({what}).")
}

/// The clap definition (for completions and the man page).
pub fn command() -> clap::Command {
    crate::Cli::command()
}
