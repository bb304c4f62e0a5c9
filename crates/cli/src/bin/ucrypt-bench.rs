//! `ucrypt-bench`: the seeds' experiment (`ucrypt bench`, docs/BENCHMARKING.md)
//! as a binary of its own, so the `ucrypt` binary, which holds keys while it
//! serves a volume, links no plotting, fonts, PNG or libblkio.
//!
//! ```text
//!   ucrypt [GLOBALS] bench ARGS ──exec──► ucrypt-bench [GLOBALS] ARGS
//!                                            │ args::BenchFlags (clap)
//!                                            │   → bench::BenchArgs
//!                                            ▼
//!                      in process | fio, libblkio ──► `ucrypt open` (beside it)
//! ```
//!
//! `ucrypt bench` finds this binary beside itself and replaces itself with
//! it ([`ucrypt_cli::cmd::bench`]); it can also be run directly. The
//! servers it measures are the `ucrypt` found beside this binary.

use std::process::ExitCode;

use clap::Parser;
use ucrypt_cli::global::{self, Globals};
use ucrypt_cli::Failure;

// Beside this file, in a directory cargo does not take for a binary.
#[path = "ucrypt-bench/args.rs"]
mod args;

/// Large buffers page-aligned, as in `ucrypt` itself, so the in-process
/// engine runs on the same allocator as the daemon it stands for.
#[global_allocator]
static ALLOC: backend::PageAlignLarge = backend::PageAlignLarge;

/// `ucrypt bench`'s command line.
#[derive(Parser)]
#[command(
    name = "ucrypt-bench",
    bin_name = "ucrypt bench",
    version,
    about = "Run the ramdisk experiment (docs/BENCHMARKING.md): headline table, \
             sweep, heatmaps, JSON/CSV; or the mode grid (--profile grid)"
)]
struct Cli {
    #[command(flatten)]
    bench: args::BenchFlags,
    #[command(flatten)]
    globals: Globals,
    /// Print this command's man page (ucrypt-bench.8) and exit.
    #[arg(long, hide = true)]
    man: bool,
}

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let cli = match Cli::try_parse_from(&args) {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { 1 } else { 0 });
        }
    };
    let g = cli.globals;
    if g.debug {
        println!("{}", global::processing_line(&args));
    }
    let result = if g.test_args {
        Ok(())
    } else if cli.man {
        man()
    } else {
        run(&cli.bench.request(g.ceph.config()))
    };
    let code = match result {
        Ok(()) => 0,
        Err(f) => {
            eprintln!("ucrypt: {}", f.message);
            f.code
        }
    };
    if g.verbose() {
        println!("{}", global::status_line(code));
    }
    ExitCode::from(code)
}

/// Runs the bench and prints where its results went.
fn run(a: &bench::BenchArgs) -> Result<(), Failure> {
    let opts = a.options().map_err(bench_failure)?;
    if let Some(req) = a.advisor().map_err(bench_failure)? {
        print!(
            "{}",
            bench::dmcrypt::run(&opts, &req).map_err(bench_failure)?
        );
        return Ok(());
    }
    let via = a
        .via(ucrypt_beside())
        .map_err(|e| Failure::usage(format!("Cannot find the ucrypt binary: {e}")))?;
    let report = bench::run_via(&opts, via).map_err(bench_failure)?;
    print!("{}", report.table());
    let files = report.write(&opts.out).map_err(bench_failure)?;
    println!();
    println!("results: {}", opts.out.display());
    for f in files {
        println!("  {}", f.display());
    }
    Ok(())
}

/// The `ucrypt` that serves the measured volumes: the one beside this binary.
fn ucrypt_beside() -> std::io::Result<std::path::PathBuf> {
    let exe = std::env::current_exe()?;
    let path = exe.with_file_name("ucrypt");
    if path.is_file() {
        Ok(path)
    } else {
        Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{} does not exist", path.display()),
        ))
    }
}

/// The bench's errors: bad options are usage errors (1), missing tools or
/// kernel parts device errors (4), anything else 1; the message names
/// every cause.
fn bench_failure(e: impl Into<bench::Error>) -> Failure {
    let e = e.into();
    let code = if !e.is_usage() && e.is_missing() {
        4
    } else {
        1
    };
    Failure::new(code, bench::error_chain(&e))
}

/// Prints ucrypt-bench.8 (the install step puts it beside ucrypt's pages).
fn man() -> Result<(), Failure> {
    use clap::CommandFactory;
    use std::io::Write;
    let mut buf = Vec::new();
    clap_mangen::Man::new(Cli::command().name("ucrypt-bench"))
        .section("8")
        .render(&mut buf)
        .map_err(|e| Failure::usage(format!("Cannot render the man page: {e}")))?;
    match std::io::stdout().write_all(&buf) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(Failure::usage(format!("Cannot write to stdout: {e}")))
        }
        _ => Ok(()),
    }
}
