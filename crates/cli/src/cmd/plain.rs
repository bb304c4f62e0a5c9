//! cryptsetup's `open` options beyond a table line: plain mode as
//! `cryptsetup open --type plain` builds it (the `plain` crate; parsed here,
//! handed on as `daemon::resolve::PlainGiven`) and `--test-passphrase`
//! (the key-file range is `cmd::luks::KeyFileArgs`, shared by every verb
//! that reads a key file). cryptsetup's checks on their combinations and
//! the resolving are `daemon::resolve::Mapping`.

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
    pub plain: PlainModeArgs,
    /// LUKS: check the passphrase and exit (0, or 2 if wrong) without opening.
    #[arg(long)]
    pub test_passphrase: bool,
}

/// cryptsetup's plain-mode options as given (`None`: not given).
#[derive(Args, Clone, Debug, Default)]
pub struct PlainModeArgs {
    /// Plain mode: cipher (default aes-cbc-essiv:sha256).
    #[arg(long, short = 'c')]
    pub cipher: Option<String>,
    /// Plain mode: key size in bits (default 256).
    #[arg(long = "key-size", short = 's', value_name = "BITS")]
    pub key_bits: Option<u32>,
    /// Plain mode: passphrase hash, HASH[:LEN] or `plain` (default ripemd160;
    /// a --key-file other than `-` is never hashed, as in cryptsetup).
    #[arg(long, short = 'h')]
    pub hash: Option<String>,
    /// Plain mode: start of the data on the device, in 512-byte sectors.
    #[arg(long, short = 'o', value_name = "SECTORS")]
    pub offset: Option<u64>,
    /// Plain mode: IV offset, in 512-byte sectors.
    #[arg(long, short = 'p', value_name = "SECTORS")]
    pub skip: Option<u64>,
    /// Plain mode: size of the device, in 512-byte sectors (default: the rest).
    #[arg(long, short = 'b', value_name = "SECTORS")]
    pub size: Option<u64>,
    /// Plain mode: encryption sector size in bytes (default 512).
    #[arg(long, value_name = "BYTES")]
    pub sector_size: Option<u32>,
    /// Plain mode: IVs count sectors of --sector-size, not 512 bytes.
    #[arg(long)]
    pub iv_large_sectors: bool,
}

impl PlainArgs {
    /// The options with `key`'s range, as `daemon::resolve::Mapping`
    /// checks and applies them.
    pub fn given(&self, key: &crate::cmd::luks::KeyFileArgs) -> PlainGiven {
        let p = &self.plain;
        PlainGiven {
            cipher: p.cipher.clone(),
            key_bits: p.key_bits,
            hash: p.hash.clone(),
            offset: p.offset,
            skip: p.skip,
            size: p.size,
            sector_size: p.sector_size,
            iv_large_sectors: p.iv_large_sectors,
            keyfile_offset: key.keyfile_offset,
            keyfile_size: key.keyfile_size,
        }
    }
}
