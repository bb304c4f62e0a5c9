//! Shell completions and man pages generated from the clap definition, so
//! they can never drift from the verbs and options the binary accepts:
//! `ucrypt completions bash|zsh|fish|elvish|powershell` prints a script,
//! `ucrypt man [--dir DIR]` prints `ucrypt(8)` or writes one page per verb
//! (`ucrypt-format.8`, …) into DIR. Install commands are in the README.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use clap_complete::Shell;

use crate::{CmdResult, Failure};

/// Commands of this group.
#[derive(Subcommand)]
pub enum Commands {
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completions(CompletionsArgs),
    /// Print the man page, or write one page per verb into --dir.
    Man(ManArgs),
}

/// `ucrypt completions SHELL`.
#[derive(Args)]
pub struct CompletionsArgs {
    /// The shell.
    shell: Shell,
}

/// `ucrypt man`.
#[derive(Args)]
pub struct ManArgs {
    /// Write ucrypt.8 and ucrypt-VERB.8 into this directory.
    #[arg(long)]
    dir: Option<PathBuf>,
}

impl Commands {
    /// Runs the command.
    pub fn run(self) -> CmdResult {
        let mut cmd = crate::global::command();
        cmd.build();
        match self {
            Self::Completions(a) => {
                let mut buf = Vec::new();
                clap_complete::generate(a.shell, &mut cmd, "ucrypt", &mut buf);
                print_all(&buf)
            }
            Self::Man(a) => match a.dir {
                None => {
                    let mut buf = Vec::new();
                    clap_mangen::Man::new(cmd)
                        .section("8")
                        .render(&mut buf)
                        .map_err(|e| Failure::usage(format!("Cannot render the man page: {e}")))?;
                    print_all(&buf)
                }
                Some(dir) => write_pages(cmd, &dir),
            },
        }
    }
}

/// ucrypt.8 plus ucrypt-VERB.8 for every verb (not the hidden ones) into `dir`.
fn write_pages(cmd: clap::Command, dir: &std::path::Path) -> CmdResult {
    let io = |e: std::io::Error| Failure::usage(format!("Cannot write to {}: {e}", dir.display()));
    std::fs::create_dir_all(dir).map_err(io)?;
    let mut pages = vec![("ucrypt".to_string(), cmd.clone())];
    for sub in cmd
        .get_subcommands()
        .filter(|s| s.get_name() != "help" && !s.is_hide_set())
    {
        let name = format!("ucrypt-{}", sub.get_name());
        pages.push((name, sub.clone()));
    }
    for (name, page) in pages {
        let mut buf = Vec::new();
        clap_mangen::Man::new(page)
            .title(name.clone())
            .section("8")
            .render(&mut buf)
            .map_err(io)?;
        std::fs::write(dir.join(format!("{name}.8")), buf).map_err(io)?;
    }
    Ok(())
}

/// Writes `buf` to stdout; a reader that stops early (`| head`) is fine.
fn print_all(buf: &[u8]) -> CmdResult {
    use std::io::Write;
    match std::io::stdout().write_all(buf) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(Failure::usage(format!("Cannot write to stdout: {e}")))
        }
        _ => Ok(()),
    }
}
