//! The one mapping from the libraries' typed errors to cryptsetup's exit
//! codes ([`Failure`]), and cryptsetup's global options and the lines
//! that show how a run ended (`ucrypt_cli::global`).

use std::ffi::OsString;

use daemon::{Error, ErrorKind as K};

use ucrypt_cli::global::{command, processing_line, status_line, Globals};
use ucrypt_cli::Failure;

#[test]
fn error_kinds_map_to_cryptsetup_exit_codes() {
    for (kind, code) in [
        (K::InvalidInput, 1),
        (K::WrongPassphrase, 2),
        (K::PermissionDenied, 2),
        (K::NotActive, 4),
        (K::NoDevice, 4),
        (K::Io, 4),
        (K::Protocol, 4),
        (K::Busy, 5),
    ] {
        let f = Failure::from(Error::new(kind, "x"));
        assert_eq!(f.code, code, "{kind:?}");
    }
    // A detached daemon's own exit code is passed through.
    assert_eq!(Failure::from(Error::daemon_exited(5, "busy")).code, 5);
}

#[test]
fn luks_errors_keep_their_exit_codes() {
    use luks::ErrorKind as L;
    for (kind, code) in [
        (L::WrongPassphrase, 2),
        (L::NotLuks, 1),
        (L::Corrupt, 1),
        (L::InvalidArgument, 1),
    ] {
        let f = Failure::from(luks::Error::new(kind, "Nope"));
        assert_eq!((f.code, f.message.as_str()), (code, "Nope"), "{kind:?}");
    }
    let io = luks::Error::io("Cannot read x", std::io::Error::other("gone"));
    let f = Failure::from(io);
    assert_eq!((f.code, f.message.as_str()), (4, "Cannot read x: gone"));
}

fn g(args: &[&str]) -> Globals {
    use clap::FromArgMatches;
    let m = command().try_get_matches_from(args).unwrap();
    Globals::from_arg_matches(&m).unwrap()
}

#[test]
fn every_verb_takes_the_globals_before_or_after_it() {
    let q = g(&["ucrypt", "-q", "-v", "erase", "d"]);
    assert!(q.batch_mode && q.verbose && !q.debug);
    let q = g(&["ucrypt", "-qv", "--debug", "luksErase", "d"]);
    assert!(q.batch_mode && q.verbose && q.debug);
    // Verbs that ask nothing and print no more take them too.
    assert!(g(&["ucrypt", "status", "-v", "x"]).verbose());
    assert!(g(&["ucrypt", "-q", "list"]).batch_mode);
    assert!(g(&["ucrypt", "--debug", "list"]).verbose());
    let q = g(&["ucrypt", "kill-slot", "-qv", "d", "--debug", "1"]);
    assert!(q.batch_mode && q.verbose && q.debug);
    // After `--` they are operands.
    assert!(!g(&["ucrypt", "open", "dev", "--", "-v"]).verbose());
    assert!(command()
        .try_get_matches_from(["ucrypt", "status", "-vx", "n"])
        .is_err());
}

#[test]
fn closing_and_processing_lines_are_cryptsetups() {
    assert_eq!(status_line(0), "Command successful.");
    assert_eq!(
        status_line(4),
        "Command failed with code -4 (wrong device or file specified)."
    );
    let args: Vec<OsString> = ["ucrypt", "--debug", "open", "--table", "0 8 crypt k", "d"]
        .iter()
        .map(OsString::from)
        .collect();
    let line = processing_line(&args);
    assert!(line.starts_with("# ucrypt "), "{line}");
    assert!(
        line.ends_with(" processing \"ucrypt --debug open --table <table> d\""),
        "{line}"
    );
}
