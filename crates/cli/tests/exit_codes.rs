//! The one mapping from the libraries' typed errors to cryptsetup's exit
//! codes ([`Failure`]).

use daemon::{Error, ErrorKind as K};

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
