//! cryptsetup's global options before the verb: `cryptsetup -q -v
//! luksErase DEV` works, so `ucrypt -q -v erase DEV` does too.
//!
//! clap only knows options where a subcommand defines them, so the
//! leading `-v`/`--verbose`, `--debug` and `-q`/`--batch-mode` (also
//! combined, as `-qv`) are moved to just after the verb when the verb
//! takes them. A verb without `--verbose`/`--debug` has nothing more to
//! say; one without `--batch-mode` asks nothing; so such an option is
//! accepted and has no effect there, as in cryptsetup.

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
/// the verb, or dropped where the verb has no such option.
pub fn hoist(args: Vec<OsString>) -> Vec<OsString> {
    let mut it = args.into_iter();
    let Some(prog) = it.next() else {
        return Vec::new();
    };
    let rest: Vec<OsString> = it.collect();
    let mut globals: Vec<&'static str> = Vec::new();
    let mut i = 0;
    while let Some(names) = rest.get(i).and_then(|a| a.to_str()).and_then(long_of) {
        globals.extend(names);
        i += 1;
    }
    if globals.is_empty() || i >= rest.len() {
        // Nothing to move, or no verb (let clap say what is missing).
        return std::iter::once(prog).chain(rest).collect();
    }
    let verb = rest[i].to_string_lossy().into_owned();
    let cmd = command();
    let takes: Vec<&str> = match cmd.find_subcommand(&verb) {
        Some(sub) => globals
            .iter()
            .copied()
            .filter(|g| sub.get_arguments().any(|a| a.get_long() == Some(g)))
            .collect(),
        None => Vec::new(),
    };
    let mut out = vec![prog, rest[i].clone()];
    let mut seen = Vec::new();
    for g in takes {
        if !seen.contains(&g) {
            seen.push(g);
            out.push(format!("--{g}").into());
        }
    }
    out.extend(rest[i + 1..].iter().cloned());
    out
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
    }
}
