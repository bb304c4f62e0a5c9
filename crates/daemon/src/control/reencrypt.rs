//! The online reencryption's messages: what `ucrypt reencrypt
//! --active-name` sends ([`ReencryptStart`], with the passphrase in locked
//! memory), the pause/resume/rate request ([`ReencryptAction`]) and the
//! progress the daemon answers and `status` shows ([`Reencryption`]).

use std::fmt;

use crypto::Secret;
use serde::{Deserialize, Serialize};

/// Starts (or resumes) the reencryption of the served volume.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReencryptStart {
    /// The passphrase (it must open the old and the new key), in locked
    /// memory; hex on the wire, so any bytes a key file holds cross.
    #[serde(with = "secret_hex")]
    pub passphrase: Secret,
    /// Unlock (and renew) only this keyslot.
    pub key_slot: Option<u32>,
    /// A new reencryption's parameters; `None`: resume only (refused when
    /// none is in progress).
    pub init: Option<InitParams>,
    /// Initialize only: write the metadata, move nothing.
    pub init_only: bool,
    /// Largest hotzone in bytes (0: the daemon's default).
    pub hotzone: u64,
    /// Rate limit in bytes per second (0: none).
    pub rate: u64,
    /// A resume's new resilience (`checksum`, `journal`), switched before
    /// the data moves again as cryptsetup's `--resume-only --resilience`
    /// switches it; `None` keeps the recorded one.
    #[serde(default)]
    pub resilience: Option<String>,
    /// The checksum hash of a switched resilience.
    #[serde(default)]
    pub resilience_hash: Option<String>,
    /// `--device-size` in bytes: must be the size the volume is served
    /// with, which is what an online run covers (cryptsetup's rule).
    #[serde(default)]
    pub device_size: Option<u64>,
}

/// A new reencryption's parameters (`luks::reencrypt::InitRequest`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitParams {
    /// New data cipher.
    pub cipher: Option<String>,
    /// New volume key size in bits.
    pub key_bits: Option<u32>,
    /// New encryption sector size.
    pub sector_size: Option<u32>,
    /// `checksum` or `journal`.
    pub resilience: Option<String>,
    /// Checksum hash.
    pub resilience_hash: Option<String>,
    /// The new keyslots' KDF; `None` copies the old keyslots'.
    pub kdf: Option<KdfParams>,
    /// `--decrypt`: the data becomes plaintext (the volume must be served
    /// with a detached header, data offset 0).
    #[serde(default)]
    pub decrypt: bool,
    /// With `decrypt` of a volume whose header is inside the device: the
    /// file (not existing yet, an absolute path) the header is exported
    /// to, the data then moved down while it is decrypted (a data shift).
    #[serde(default)]
    pub export_header: Option<std::path::PathBuf>,
    /// The keyslots renewed, each with its passphrase (cryptsetup's
    /// every active keyslot); empty: the keyslot the start's passphrase
    /// opens (`key_slot`, or the only active one).
    #[serde(default)]
    pub slots: Vec<SlotPassphrase>,
}

/// The passphrase of one keyslot a new reencryption renews, in locked
/// memory; hex on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SlotPassphrase {
    /// The keyslot.
    pub slot: u32,
    /// Its passphrase.
    #[serde(with = "secret_hex")]
    pub passphrase: Secret,
}

/// `luks::kdf::KdfRequest` on the wire.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KdfParams {
    /// `pbkdf2`, `argon2i` or `argon2id`.
    pub kind: String,
    /// PBKDF2 (and AF) hash name.
    pub hash: String,
    /// Target unlock time in ms.
    pub iter_time_ms: u32,
    /// Fixed iterations (time cost).
    pub force_iterations: Option<u32>,
    /// Argon2 memory, KiB.
    pub memory_kib: Option<u32>,
    /// Argon2 lanes.
    pub parallel: Option<u32>,
}

impl KdfParams {
    /// The wire form of `k`.
    pub fn of(k: &luks::kdf::KdfRequest) -> Self {
        Self {
            kind: k.kind.clone(),
            hash: k.hash.name().to_owned(),
            iter_time_ms: k.iter_time_ms,
            force_iterations: k.force_iterations,
            memory_kib: k.memory_kib,
            parallel: k.parallel,
        }
    }

    /// Back to a request; an unknown hash is refused.
    pub fn request(&self) -> luks::Result<luks::kdf::KdfRequest> {
        Ok(luks::kdf::KdfRequest {
            kind: self.kind.clone(),
            hash: luks::hash::Hash::parse(&self.hash)?,
            iter_time_ms: self.iter_time_ms,
            force_iterations: self.force_iterations,
            memory_kib: self.memory_kib,
            parallel: self.parallel,
            // The daemon prints nothing of its own: the cli that asked
            // for the reencryption shows its progress.
            verbose: false,
        })
    }
}

/// What to change in a running reencryption.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReencryptAction {
    /// Stop moving data after the current hotzone (IO keeps flowing).
    Pause,
    /// Continue a paused reencryption.
    Resume,
    /// A new rate limit in bytes per second (0: none).
    Rate(u64),
}

/// A reencryption's progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Reencryption {
    /// Bytes of the data area under the new key.
    pub done: u64,
    /// Bytes of the data area.
    pub total: u64,
    /// `forward`.
    pub direction: String,
    /// `checksum`, `journal` or `none`.
    pub resilience: String,
    /// The largest hotzone, bytes.
    pub hotzone: u64,
    /// Hotzones moved by this daemon.
    pub hotzones: u64,
    /// Rate limit in bytes per second (0: none).
    pub rate: u64,
    /// Paused (`--pause`): no data moves until `--resume`.
    pub paused: bool,
    /// Still moving data (or paused); false once finished, stopped or
    /// failed.
    pub running: bool,
    /// Every byte moved and the header finalized.
    pub finished: bool,
    /// Why it stopped, when it failed.
    pub error: Option<String>,
    /// The longest time IO was held for one hotzone, microseconds.
    pub max_hold_us: u64,
}

/// `status`'s reencryption line: `reencryption: 37.5% (3 MiB of 8 MiB),
/// forward, checksum, running`.
impl fmt::Display for Reencryption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pct = if self.total > 0 {
            self.done as f64 * 100.0 / self.total as f64
        } else {
            100.0
        };
        let state = match (&self.error, self.finished, self.paused, self.running) {
            (Some(_), ..) => "failed",
            (None, true, ..) => "finished",
            (None, false, true, true) => "paused",
            (None, false, false, true) => "running",
            _ => "stopped",
        };
        write!(
            f,
            "{pct:.1}% ({} of {} bytes), {}, {}, {state}",
            self.done, self.total, self.direction, self.resilience
        )?;
        if self.rate > 0 {
            write!(f, ", rate {} MiB/s", self.rate as f64 / f64::from(1 << 20))?;
        }
        if let Some(e) = &self.error {
            write!(f, ": {e}")?;
        }
        Ok(())
    }
}

/// Serde for a [`Secret`] of any bytes: lower-case hex, decoded back into
/// locked memory.
mod secret_hex {
    use std::fmt;

    use crypto::Secret;
    use serde::de::{self, Visitor};
    use serde::{Deserializer, Serializer};

    pub fn serialize<S: Serializer>(v: &Secret, s: S) -> Result<S::Ok, S::Error> {
        let mut hex = Secret::with_capacity(v.len() * 2);
        hex.push_hex(v);
        s.serialize_str(hex.as_str().unwrap_or_default())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Secret, D::Error> {
        struct Hex;
        impl Visitor<'_> for Hex {
            type Value = Secret;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a hex string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Secret, E> {
                Secret::from_hex(v.as_bytes()).ok_or_else(|| E::custom("invalid hex"))
            }
        }
        d.deserialize_str(Hex)
    }
}
