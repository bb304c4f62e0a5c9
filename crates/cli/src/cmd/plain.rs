//! cryptsetup's `open` options beyond a table line: plain mode as
//! `cryptsetup open --type plain` builds it (`daemon::plain`; the options
//! are `daemon::resolve::PlainGiven`, clap-derived there) and
//! `--test-passphrase` (the key-file range is `cmd::luks::KeyFileArgs`,
//! shared by every verb that reads a key file). cryptsetup's checks on
//! their combinations and the resolving are `daemon::resolve::Mapping`.

use clap::Args;
use daemon::resolve::PlainGiven;

/// The options of `open` that cryptsetup has and a table line does not.
#[derive(Args, Clone, Debug, Default)]
#[command(disable_help_flag = true)]
pub struct PlainArgs {
    /// Print help (`-h` is `--hash`, as in cryptsetup).
    #[arg(long, short_alias = '?', action = clap::ArgAction::Help)]
    help: Option<bool>,
    /// Plain mode's options.
    #[command(flatten)]
    pub plain: PlainGiven,
    /// LUKS: check the passphrase and exit (0, or 2 if wrong) without opening.
    #[arg(long)]
    pub test_passphrase: bool,
}

impl PlainArgs {
    /// The options with `key`'s range, as `daemon::resolve::Mapping`
    /// checks and applies them.
    pub fn given(&self, key: &crate::cmd::luks::KeyFileArgs) -> PlainGiven {
        PlainGiven {
            keyfile_offset: key.keyfile_offset,
            keyfile_size: key.keyfile_size,
            ..self.plain.clone()
        }
    }
}
