//! cryptsetup's global options before the verb: `cryptsetup -q -v
//! luksErase DEV` works, so `ucrypt -q -v erase DEV` does too.
//!
//! clap only knows options where a subcommand defines them, so the
//! leading `-v`/`--verbose`, `--debug` and `-q`/`--batch-mode` (also
//! combined, as `-qv`) are moved to just after the verb when the verb
//! takes them; a verb without `--batch-mode` asks nothing, so there it is
//! dropped.
//!
//! `-v`/`--verbose` and `--debug` act on every verb, wherever they are
//! given ([`verbosity`]): as cryptsetup's `tools_show_status`, the run ends
//! with `Command successful.` or `Command failed with code -N (...).` on
//! stdout, and `--debug` first prints the `# ucrypt VERSION processing
//! "..."` line. Verbs with their own `--debug` (the header verbs) print
//! their success line themselves.

use std::ffi::OsString;

use clap::CommandFactory;

/// Long names of the global options, by their short letter.
const GLOBALS: [(char, &str); 3] = [('v', "verbose"), ('q', "batch-mode"), ('\0', "debug")];

fn long_of(arg: &str) -> Option<Vec<&'static str>> {
    if let Some(l) = arg.strip_prefix("--") {
        return GLOBALS.iter().find(|(_, n)| *n == l).map(|(_, n)| vec![*n]);
    }
    let shorts = arg.strip_prefix('-')?;
    if shorts.is_empty() {
        return None;
    }
    shorts
        .chars()
        .map(|c| {
            GLOBALS
                .iter()
                .find(|(s, _)| *s == c && c != '\0')
                .map(|(_, n)| *n)
        })
        .collect()
}

/// `args` (program name first) with leading global options moved after
/// the verb, and global options the verb has no such option for dropped
/// wherever they stand before `--` (cryptsetup takes options anywhere).
pub fn hoist(args: Vec<OsString>) -> Vec<OsString> {
    let mut it = args.into_iter();
    let Some(prog) = it.next() else {
        return Vec::new();
    };
    let rest: Vec<OsString> = it.collect();
    let names = |a: &OsString| a.to_str().and_then(long_of);
    let i = rest.iter().take_while(|a| names(a).is_some()).count();
    let sub = rest
        .get(i)
        .and_then(|v| command().find_subcommand(v).cloned());
    let Some(verb) = rest.get(i) else {
        // No verb: let clap say what is missing.
        return std::iter::once(prog).chain(rest).collect();
    };
    let Some(sub) = sub else {
        // An unknown verb: the leading globals go, clap refuses the verb.
        return std::iter::once(prog)
            .chain(rest.into_iter().skip(i))
            .collect();
    };
    let takes = |g: &&str| sub.get_arguments().any(|a| a.get_long() == Some(g));
    let mut out = vec![prog, verb.clone()];
    let mut seen = Vec::new();
    for g in rest[..i].iter().filter_map(names).flatten().filter(takes) {
        if !seen.contains(&g) {
            seen.push(g);
            out.push(format!("--{g}").into());
        }
    }
    let mut after_separator = false;
    for a in &rest[i + 1..] {
        after_separator |= a == "--";
        match names(a) {
            Some(n) if !after_separator && !n.iter().all(takes) => {
                out.extend(n.into_iter().filter(takes).map(|g| format!("--{g}").into()));
            }
            _ => out.push(a.clone()),
        }
    }
    out
}

/// What `-v`/`--verbose` and `--debug` ask of this run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Verbosity {
    /// Print how the command ended.
    pub verbose: bool,
    /// Also print the processing line first (implies `verbose`).
    pub debug: bool,
    /// The verb prints `Command successful.` itself.
    pub verb_reports: bool,
}

/// Finds `-v`, `--verbose` and `--debug` (alone or in a cluster of global
/// short options such as `-qv`) anywhere before `--` in `args` (program
/// name first), and whether the verb reports success itself.
pub fn verbosity(args: &[OsString]) -> Verbosity {
    let words: Vec<&str> = args
        .iter()
        .skip(1)
        .map(|a| a.to_str().unwrap_or(""))
        .take_while(|a| *a != "--")
        .collect();
    let names: Vec<&str> = words.iter().filter_map(|a| long_of(a)).flatten().collect();
    let debug = names.contains(&"debug");
    let verbose = debug || names.contains(&"verbose");
    let verb = words.iter().find(|a| long_of(a).is_none());
    let verb_reports = verb
        .and_then(|v| command().find_subcommand(v).cloned())
        .is_some_and(|sub| sub.get_arguments().any(|a| a.get_long() == Some("debug")));
    Verbosity {
        verbose,
        debug,
        verb_reports,
    }
}

impl Verbosity {
    /// `--debug`'s first line: the command as run, a `--table` line (it
    /// may hold a key) replaced by `<table>`.
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
}

/// The clap definition (for [`hoist`], completions and the man page).
pub fn command() -> clap::Command {
    crate::Cli::command()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(args: &[&str]) -> Vec<String> {
        hoist(args.iter().map(OsString::from).collect())
            .into_iter()
            .map(|a| a.into_string().unwrap())
            .collect()
    }

    #[test]
    fn leading_globals_move_after_the_verb_that_takes_them() {
        assert_eq!(
            h(&["ucrypt", "-q", "-v", "erase", "d"]),
            ["ucrypt", "erase", "--batch-mode", "--verbose", "d"]
        );
        assert_eq!(
            h(&["ucrypt", "-qv", "--debug", "luksErase", "d"]),
            [
                "ucrypt",
                "luksErase",
                "--batch-mode",
                "--verbose",
                "--debug",
                "d"
            ]
        );
        // kill-slot has --batch-mode but no --verbose.
        assert_eq!(
            h(&["ucrypt", "-v", "-q", "kill-slot", "d", "1"]),
            ["ucrypt", "kill-slot", "--batch-mode", "d", "1"]
        );
        // Not a global option: left for clap to judge.
        assert_eq!(
            h(&["ucrypt", "-x", "erase", "d"]),
            ["ucrypt", "-x", "erase", "d"]
        );
        assert_eq!(
            h(&["ucrypt", "erase", "-v", "d"]),
            ["ucrypt", "erase", "-v", "d"]
        );
        // Anywhere after the verb: dropped where the verb has no such
        // option, left alone after `--`.
        assert_eq!(
            h(&["ucrypt", "status", "-v", "x"]),
            ["ucrypt", "status", "x"]
        );
        assert_eq!(
            h(&["ucrypt", "kill-slot", "-qv", "d", "--debug", "1"]),
            ["ucrypt", "kill-slot", "--batch-mode", "d", "1"]
        );
        assert_eq!(
            h(&["ucrypt", "map", "x", "--", "-v"]),
            ["ucrypt", "map", "x", "--", "-v"]
        );
    }

    fn v(args: &[&str]) -> Verbosity {
        verbosity(&args.iter().map(OsString::from).collect::<Vec<_>>())
    }

    #[test]
    fn verbose_and_debug_are_found_anywhere_before_the_separator() {
        let quiet = Verbosity::default();
        assert_eq!(v(&["ucrypt", "status", "x"]), quiet);
        assert!(v(&["ucrypt", "-v", "status", "x"]).verbose);
        assert!(v(&["ucrypt", "status", "--verbose", "x"]).verbose);
        assert!(v(&["ucrypt", "-qv", "status", "x"]).verbose);
        let d = v(&["ucrypt", "--debug", "list"]);
        assert!(d.verbose && d.debug && !d.verb_reports);
        assert!(!v(&["ucrypt", "map", "--", "-v"]).verbose);
        // `-vx` is no cluster of global options.
        assert!(!v(&["ucrypt", "status", "-vx"]).verbose);
        // The header verbs print their own success line.
        assert!(v(&["ucrypt", "-v", "erase", "d"]).verb_reports);
        assert!(v(&["ucrypt", "-v", "luksErase", "d"]).verb_reports);
        assert!(!v(&["ucrypt", "-v", "isLuks", "d"]).verb_reports);
    }

    #[test]
    fn closing_and_processing_lines_are_cryptsetups() {
        assert_eq!(Verbosity::status_line(0), "Command successful.");
        assert_eq!(
            Verbosity::status_line(4),
            "Command failed with code -4 (wrong device or file specified)."
        );
        let args: Vec<OsString> = ["ucrypt", "--debug", "open", "--table", "0 8 crypt k", "d"]
            .iter()
            .map(OsString::from)
            .collect();
        let line = Verbosity::processing_line(&args);
        assert!(line.starts_with("# ucrypt "), "{line}");
        assert!(
            line.ends_with(" processing \"ucrypt --debug open --table <table> d\""),
            "{line}"
        );
    }
}
