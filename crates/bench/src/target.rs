//! Bench targets: the raw ramdisk and each cipher × data-path mode, built as
//! `datapath::Engine`s over one shared `backend::MemBackend`.
//!
//! ```text
//!   target name         Volume.crypt                 EngineConfig
//!   raw                 None                         classic (no crypto: plain copy)
//!   null-classic        capi:ecb(cipher_null), "-"   Classic, no flags
//!   null-inline-read    ″                            Classic + no_read_workqueue
//!   null-inline-write   ″                            Classic + no_write_workqueue
//!   null-inline         ″                            Inline (both flags)
//!   null-adaptive       ″                            Adaptive
//!   aes-*               aes-xts-plain64, 512-bit random key, same modes
//! ```

use std::fmt;
use std::sync::Arc;

use backend::Backend;
use crypto::{CryptConfig, SectorCrypt};
use datapath::{CryptMode, Engine, EngineConfig, PerfFlags, Volume};
use zeroize::Zeroizing;

use crate::{Error, OptionsError};

/// The cipher of an encrypted target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Cipher {
    /// `capi:ecb(cipher_null)` with key `-`: the seeds' no-crypto-cost cipher.
    Null,
    /// `aes-xts-plain64` with a 512-bit random key (AES-256-XTS).
    AesXts,
}

impl Cipher {
    /// Short name used in target names (`null`, `aes`).
    pub fn short(self) -> &'static str {
        match self {
            Cipher::Null => "null",
            Cipher::AesXts => "aes",
        }
    }

    /// The dm-crypt cipher spec.
    pub fn spec(self) -> &'static str {
        match self {
            Cipher::Null => "capi:ecb(cipher_null)",
            Cipher::AesXts => "aes-xts-plain64",
        }
    }

    /// Key length in bytes.
    pub fn key_len(self) -> usize {
        match self {
            Cipher::Null => 0,
            Cipher::AesXts => 64,
        }
    }

    /// Builds the sector cipher (a fresh random key for AES) for
    /// `sector_size`-byte sectors.
    pub fn build(self, sector_size: u32) -> Result<SectorCrypt, Error> {
        let mut key = Zeroizing::new(vec![0u8; self.key_len()]);
        if !key.is_empty() {
            random_bytes(&mut key)?;
        }
        let cfg = CryptConfig {
            cipher: self.spec().to_string(),
            key,
            iv_offset: 0,
            sector_size,
            iv_large_sectors: false,
        };
        SectorCrypt::new(&cfg).map_err(|source| Error::Cipher {
            spec: self.spec(),
            source,
        })
    }
}

/// Data-path mode of an encrypted target (dm-crypt's flags).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
#[non_exhaustive]
pub enum Mode {
    /// Unmodified dm-crypt: both workqueues.
    Classic,
    /// `no_read_workqueue`.
    InlineRead,
    /// `no_write_workqueue`.
    InlineWrite,
    /// Both flags (`force_inline`).
    Inline,
    /// ucrypt's per-request choice.
    Adaptive,
}

impl Mode {
    /// Every mode, in table order.
    pub const ALL: [Mode; 5] = [
        Mode::Classic,
        Mode::InlineRead,
        Mode::InlineWrite,
        Mode::Inline,
        Mode::Adaptive,
    ];

    /// Name used in target names.
    pub fn name(self) -> &'static str {
        match self {
            Mode::Classic => "classic",
            Mode::InlineRead => "inline-read",
            Mode::InlineWrite => "inline-write",
            Mode::Inline => "inline",
            Mode::Adaptive => "adaptive",
        }
    }

    /// The engine configuration for this mode with `queue_depth` slots.
    pub fn engine_config(self, queue_depth: usize) -> EngineConfig {
        let (mode, r, w) = match self {
            Mode::Classic => (CryptMode::Classic, false, false),
            Mode::InlineRead => (CryptMode::Classic, true, false),
            Mode::InlineWrite => (CryptMode::Classic, false, true),
            Mode::Inline => (CryptMode::Inline, true, true),
            Mode::Adaptive => (CryptMode::Adaptive, false, false),
        };
        EngineConfig {
            mode,
            flags: PerfFlags {
                no_read_workqueue: r,
                no_write_workqueue: w,
                ..PerfFlags::default()
            },
            queue_depth,
            ..EngineConfig::default()
        }
    }
}

/// One thing to measure: the raw ramdisk or a cipher in a mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Target {
    /// `None` = raw ramdisk (no dm-crypt layer at all).
    pub cipher: Option<Cipher>,
    /// Mode (ignored for raw).
    pub mode: Mode,
}

impl Target {
    /// The raw baseline.
    pub const RAW: Target = Target {
        cipher: None,
        mode: Mode::Classic,
    };

    /// Every in-process target in table order: raw, null × modes, aes × modes.
    pub fn all() -> Vec<Target> {
        let mut v = vec![Target::RAW];
        for c in [Cipher::Null, Cipher::AesXts] {
            v.extend(Mode::ALL.iter().map(|&mode| Target {
                cipher: Some(c),
                mode,
            }));
        }
        v
    }

    /// The encrypted target for `cipher` in `mode`.
    pub fn new(cipher: Cipher, mode: Mode) -> Self {
        Self {
            cipher: Some(cipher),
            mode,
        }
    }

    /// Parses a comma-separated list: target names, `raw`, `null`/`aes`
    /// (all modes of that cipher), `all`. Keeps table order, no duplicates.
    pub fn parse_list(s: &str) -> Result<Vec<Target>, OptionsError> {
        let all = Target::all();
        let mut picked = Vec::new();
        for word in s.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            let matched: Vec<Target> = match word {
                "all" => all.clone(),
                "null" | "aes" => all
                    .iter()
                    .copied()
                    .filter(|t| t.cipher.map(Cipher::short) == Some(word))
                    .collect(),
                _ => all
                    .iter()
                    .copied()
                    .filter(|t| t.to_string() == word)
                    .collect(),
            };
            if matched.is_empty() {
                let names: Vec<String> = all.iter().map(ToString::to_string).collect();
                return Err(OptionsError::UnknownTarget {
                    word: word.into(),
                    known: names.join(", "),
                });
            }
            picked.extend(matched);
        }
        if picked.is_empty() {
            return Err(OptionsError::EmptyTargets);
        }
        Ok(all.into_iter().filter(|t| picked.contains(t)).collect())
    }

    /// Builds the engine for this target over `backend`, encrypted
    /// targets with `sector_size`-byte sectors.
    pub fn engine(
        &self,
        backend: Arc<dyn Backend>,
        queue_depth: usize,
        sector_size: u32,
    ) -> Result<Engine, Error> {
        let crypt = match self.cipher {
            Some(c) => Some(Arc::new(c.build(sector_size)?)),
            None => None,
        };
        let size = backend.size();
        let vol = Volume {
            backend,
            crypt,
            data_offset: 0,
            size,
            sector_size: if self.cipher.is_some() {
                sector_size
            } else {
                512
            },
        };
        Engine::new(vol, self.mode.engine_config(queue_depth)).map_err(|source| Error::Engine {
            target: self.to_string(),
            source,
        })
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.cipher {
            None => f.write_str("raw"),
            Some(c) => write!(f, "{}-{}", c.short(), self.mode.name()),
        }
    }
}

/// Fills `buf` from the kernel's random source.
pub fn random_bytes(buf: &mut [u8]) -> Result<(), Error> {
    use std::io::Read;
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(buf))
        .map_err(Error::Random)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        let all = Target::all();
        assert_eq!(all.len(), 11);
        assert_eq!(all[0].to_string(), "raw");
        assert_eq!(all[4].to_string(), "null-inline");
        assert_eq!(all[10].to_string(), "aes-adaptive");
        for t in &all {
            assert_eq!(Target::parse_list(&t.to_string()).unwrap(), vec![*t]);
        }
        let l = Target::parse_list("aes-inline, raw,null-classic,raw").unwrap();
        assert_eq!(
            l.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["raw", "null-classic", "aes-inline"]
        );
        assert_eq!(Target::parse_list("null").unwrap().len(), 5);
        assert_eq!(Target::parse_list("all").unwrap(), all);
        assert!(Target::parse_list("bogus").is_err());
        assert!(Target::parse_list(",").is_err());
    }

    #[test]
    fn modes_map_to_flags() {
        let c = Mode::InlineRead.engine_config(8);
        assert_eq!(
            (
                c.mode,
                c.flags.no_read_workqueue,
                c.flags.no_write_workqueue,
                c.queue_depth
            ),
            (CryptMode::Classic, true, false, 8)
        );
        let c = Mode::Inline.engine_config(1);
        assert_eq!(
            (
                c.mode,
                c.flags.no_read_workqueue,
                c.flags.no_write_workqueue
            ),
            (CryptMode::Inline, true, true)
        );
        assert_eq!(Mode::Adaptive.engine_config(1).mode, CryptMode::Adaptive);
    }
}
