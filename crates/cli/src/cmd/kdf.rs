//! The LUKS verbs' key-derivation and keyslot-cipher options as clap
//! parses them, handed to the `luks` crate as its plain request types
//! (`luks::ops::{KdfChoice, KeyslotCipher}`); the field docs are their
//! help.

use clap::Args;
use luks::ops::{KdfChoice, KeyslotCipher};

/// `--pbkdf`, `--hash`, `--iter-time`, `--pbkdf-force-iterations`,
/// `--pbkdf-memory`, `--pbkdf-parallel` as cryptsetup spells them.
#[derive(Args, Debug, Clone)]
pub struct KdfArgs {
    /// pbkdf2, argon2i or argon2id (default: argon2id for LUKS2, pbkdf2 for LUKS1).
    #[arg(long)]
    pub pbkdf: Option<String>,
    /// Hash for PBKDF2, AF and the digest (`-h`, as in cryptsetup).
    #[arg(long, short = 'h', default_value = "sha256")]
    pub hash: String,
    /// Unlock time to aim for, milliseconds.
    #[arg(id = "iter_time", long = "iter-time", short = 'i',
        value_name = "ITER_TIME", default_value_t = luks::kdf::DEFAULT_ITER_TIME_MS)]
    pub iter_time_ms: u32,
    /// Fixed iterations (PBKDF2) or time cost (Argon2), no benchmark.
    #[arg(
        id = "pbkdf_force_iterations",
        long = "pbkdf-force-iterations",
        value_name = "PBKDF_FORCE_ITERATIONS"
    )]
    pub force_iterations: Option<u32>,
    /// Argon2 memory cost in KiB.
    #[arg(
        id = "pbkdf_memory",
        long = "pbkdf-memory",
        value_name = "PBKDF_MEMORY"
    )]
    pub memory_kib: Option<u32>,
    /// Argon2 threads.
    #[arg(
        id = "pbkdf_parallel",
        long = "pbkdf-parallel",
        value_name = "PBKDF_PARALLEL"
    )]
    pub parallel: Option<u32>,
}

impl KdfArgs {
    /// The choice as the `luks` crate takes it; `verbose` (`-v`) prints
    /// what calibration measured and chose.
    pub fn choice(&self, verbose: bool) -> KdfChoice {
        KdfChoice {
            pbkdf: self.pbkdf.clone(),
            hash: self.hash.clone(),
            iter_time_ms: self.iter_time_ms,
            force_iterations: self.force_iterations,
            memory_kib: self.memory_kib,
            parallel: self.parallel,
            verbose,
        }
    }

    /// [`KdfChoice::request`] for a LUKS`version` keyslot.
    pub fn request(&self, version: u32, verbose: bool) -> luks::Result<luks::kdf::KdfRequest> {
        self.choice(verbose).request(version)
    }
}

/// `--keyslot-cipher` and `--keyslot-key-size` (bits).
#[derive(Args, Debug, Clone, Default)]
pub struct KeyslotCipherArgs {
    /// LUKS2 keyslot: the cipher used for keyslot encryption.
    #[arg(
        id = "keyslot_cipher",
        long = "keyslot-cipher",
        value_name = "KEYSLOT_CIPHER"
    )]
    pub cipher: Option<String>,
    /// LUKS2 keyslot: the size of the encryption key, bits.
    #[arg(
        id = "keyslot_key_size",
        long = "keyslot-key-size",
        value_name = "BITS"
    )]
    pub key_bits: Option<u32>,
}

impl KeyslotCipherArgs {
    /// The pair as the `luks` crate takes it.
    pub fn cipher(&self) -> KeyslotCipher {
        KeyslotCipher {
            cipher: self.cipher.clone(),
            key_bits: self.key_bits,
        }
    }
}
