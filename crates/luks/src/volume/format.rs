//! Creating a volume ([`format`], cryptsetup's luksFormat) as named steps:
//! check the cipher and key, open the target, build the header, wipe and
//! write it, add the first passphrase.

use std::fs::OpenOptions;
use std::path::Path;

use zeroize::Zeroizing;

use super::io::{
    device_size, open_ro, open_rw, open_rw_with, sync, write_at, write_luks2, zero_range, Dev,
};
use super::keyslots::checked_uuid;
use super::{layout, DeviceAccess, Volume};
use crate::error::{invalid, Error, ErrorKind, Result};
use crate::hash::Hash;
use crate::kdf::{KdfRequest, MIN_PBKDF2_ITERATIONS};
use crate::keyslot;
use crate::luks1;
use crate::luks2::{self, binary::BinHeader, json};
use crate::Header;

/// What `format` creates (cryptsetup's luksFormat options). `Debug`
/// never shows the volume key.
#[derive(Clone)]
pub struct FormatOptions {
    /// 1 or 2.
    pub version: u32,
    /// dm-crypt cipher spec.
    pub cipher: String,
    /// Volume key size in bits (default: 512 for XTS, 256 otherwise).
    pub key_bits: Option<u32>,
    /// Encryption sector size (LUKS2; default 4096 when the data size allows).
    pub sector_size: Option<u32>,
    /// Hash for AF, digest (and PBKDF2).
    pub hash: Hash,
    /// Keyslot KDF request.
    pub kdf: KdfRequest,
    /// LUKS2 label.
    pub label: Option<String>,
    /// LUKS2 subsystem.
    pub subsystem: Option<String>,
    /// UUID (random if `None`).
    pub uuid: Option<String>,
    /// Keyslot for the first key (default 0).
    pub key_slot: Option<u32>,
    /// Use this volume key instead of a random one.
    pub volume_key: Option<Zeroizing<Vec<u8>>>,
    /// Data offset in bytes (default: 16 MiB LUKS2, 2 MiB LUKS1, 0 detached).
    pub data_offset: Option<u64>,
    /// Overwrite an existing LUKS header.
    pub force: bool,
    /// `--align-payload`, 512-byte sectors (data offset alignment; the
    /// data offset itself with a detached header).
    pub align_payload: Option<u32>,
    /// `--luks2-metadata-size`: one LUKS2 header copy, bytes.
    pub metadata_size: Option<u64>,
    /// `--luks2-keyslots-size`: the LUKS2 keyslots area, bytes.
    pub keyslots_size: Option<u64>,
    /// `--keyslot-cipher` and `--keyslot-key-size` (bits), LUKS2 only.
    pub keyslot_cipher: Option<(String, u32)>,
    /// How the header and data devices are opened (locking, Ceph).
    pub access: DeviceAccess,
}

impl std::fmt::Debug for FormatOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FormatOptions")
            .field("version", &self.version)
            .field("cipher", &self.cipher)
            .field("key_bits", &self.key_bits)
            .field("sector_size", &self.sector_size)
            .field("hash", &self.hash)
            .field("kdf", &self.kdf)
            .field("label", &self.label)
            .field("subsystem", &self.subsystem)
            .field("uuid", &self.uuid)
            .field("key_slot", &self.key_slot)
            .field(
                "volume_key",
                &self.volume_key.as_ref().map(|_| "<redacted>"),
            )
            .field("data_offset", &self.data_offset)
            .field("force", &self.force)
            .field("align_payload", &self.align_payload)
            .field("metadata_size", &self.metadata_size)
            .field("keyslots_size", &self.keyslots_size)
            .field("keyslot_cipher", &self.keyslot_cipher)
            .field("access", &self.access)
            .finish()
    }
}

impl Default for FormatOptions {
    fn default() -> Self {
        Self {
            version: 2,
            cipher: "aes-xts-plain64".into(),
            key_bits: None,
            sector_size: None,
            hash: Hash::Sha256,
            kdf: KdfRequest::default(),
            label: None,
            subsystem: None,
            uuid: None,
            key_slot: None,
            volume_key: None,
            data_offset: None,
            force: false,
            align_payload: None,
            metadata_size: None,
            keyslots_size: None,
            keyslot_cipher: None,
            access: DeviceAccess::default(),
        }
    }
}

/// Formats `device` (header on it, or in the detached `header` file, which
/// is created if missing). Returns the loaded volume.
///
/// The steps, in order: check the cipher and volume key, open the header
/// device and refuse an existing header, build the version's header with
/// no active keyslot, wipe the metadata area and write the header, then add
/// the first passphrase.
pub fn format(
    device: &Path,
    header: Option<&Path>,
    opts: &FormatOptions,
    passphrase: &[u8],
) -> Result<Volume> {
    let key = plan_key(opts)?;
    // Every option is checked (and the KDF benchmarked) before the first
    // byte is written: a refused option must never cost the old volume.
    let mut layout = opts.layout(header.is_some());
    layout.check(opts.version)?;
    let area = plan_area_cipher(opts)?;
    let kdf = plan_kdf(opts, &key, area.as_ref())?;
    let mut target = open_target(device, header, opts.force, &opts.access)?;
    layout.data_size = target.data_size;
    let uuid = match &opts.uuid {
        Some(u) => checked_uuid(u)?,
        None => keyslot::random_uuid()?,
    };
    let digest = VolumeDigest::new(opts, &key)?;
    let place = Placement {
        device,
        detached: header.is_some(),
        data_size: target.data_size,
        layout,
    };
    let mut layout_warnings = Vec::new();
    let (mut hdr, slot) = match opts.version {
        1 => {
            let (h, slot) = luks1_header(opts, &key, uuid, &digest, &place)?;
            (Header::V1(h), slot)
        }
        2 => {
            let (h, slot, w) = luks2_header(opts, &key, uuid, &digest, &place)?;
            layout_warnings = w;
            (Header::V2(h), slot)
        }
        v => {
            return Err(invalid(format!(
                "LUKS version {v} is not supported (1 or 2)"
            )))
        }
    };
    // The old contents of the metadata area (and, with the header on the
    // device, up to the data start) must not survive.
    let meta_end = hdr.metadata_end();
    let wipe = if place.detached {
        meta_end
    } else {
        hdr.payload_offset().max(meta_end)
    };
    zero_range(&mut target.file, 0, wipe)?;
    // The header goes out with no active slot; the key is added after.
    match &mut hdr {
        Header::V1(h) => {
            write_at(&mut target.file, 0, &h.to_bytes())?;
            sync(&target.file)?;
        }
        Header::V2(h) => write_luks2(&mut target.file, h)?,
    }
    drop(target.file);
    let vol = Volume {
        header: hdr,
        meta_path: header.unwrap_or(device).to_path_buf(),
        detached: place.detached,
        meta_size: target.meta_size.max(wipe),
        data_size: target.data_size,
        keyslot_encryption: area,
        access: opts.access.clone(),
    };
    let mut vol = add_first_key(vol, &key.volume_key, passphrase, slot, &kdf, device, header)?;
    if let Header::V2(h) = &mut vol.header {
        h.warnings.extend(layout_warnings);
    }
    Ok(vol)
}

impl FormatOptions {
    /// Checks what needs no device (the cipher and key size, placement
    /// options, keyslot encryption), as [`format`] does first: callers
    /// run it before asking for a passphrase.
    pub fn check(&self, detached: bool) -> Result<()> {
        plan_key(self)?;
        self.layout(detached).check(self.version)?;
        plan_area_cipher(self).map(|_| ())
    }

    /// The placement options (the data device size still unknown).
    fn layout(&self, detached: bool) -> layout::Request {
        layout::Request {
            detached,
            data_offset: self.data_offset,
            align_sectors: self.align_payload,
            metadata_size: self.metadata_size,
            keyslots_size: self.keyslots_size,
            data_size: 0,
        }
    }
}

/// Step 1b: `--keyslot-cipher` / `--keyslot-key-size`, checked (LUKS2
/// only, a cipher the keyslot code can use with that key size).
fn plan_area_cipher(opts: &FormatOptions) -> Result<Option<(String, usize)>> {
    match &opts.keyslot_cipher {
        None => Ok(None),
        Some(_) if opts.version != 2 => Err(invalid(
            "Keyslot encryption parameters can be set only for LUKS2 device.",
        )),
        Some((c, bits)) => super::keyslots::checked_keyslot_cipher(c, *bits).map(Some),
    }
}

/// Step 1c: resolves the KDF request to fixed costs (benchmarking like
/// cryptsetup) for the first keyslot, refusing unknown KDFs and costs out
/// of range before anything is written.
fn plan_kdf(
    opts: &FormatOptions,
    key: &KeyPlan<'_>,
    area: Option<&(String, usize)>,
) -> Result<KdfRequest> {
    let req = KdfRequest {
        hash: opts.hash,
        ..opts.kdf.clone()
    };
    let area_key_len = match area {
        Some((_, len)) => *len,
        None if opts.version == 2 => super::keyslots::keyslot_cipher(&opts.cipher, key.key_len).1,
        None => key.key_len,
    };
    Ok(KdfRequest::fixed(&req.resolve(area_key_len)?, opts.hash))
}

/// The cipher and volume key `format` checked before touching any device.
struct KeyPlan<'a> {
    /// Cipher name, e.g. `aes`.
    cipher_name: &'a str,
    /// Chain mode and IV, e.g. `xts-plain64`.
    cipher_mode: &'a str,
    /// Volume key length in bytes.
    key_len: usize,
    /// The volume key (given or random).
    volume_key: Zeroizing<Vec<u8>>,
}

/// Step 1: splits the cipher, picks the key size, takes or makes the volume
/// key, and refuses ciphers and key sizes the sector cipher cannot do.
fn plan_key(opts: &FormatOptions) -> Result<KeyPlan<'_>> {
    let (cipher_name, cipher_mode) = opts.cipher.split_once('-').ok_or_else(|| {
        invalid(format!(
            "Cipher {:?} is not in cipher-mode-iv form",
            opts.cipher
        ))
    })?;
    let key_bits = opts.key_bits.unwrap_or(if cipher_mode.starts_with("xts") {
        512
    } else {
        256
    });
    if key_bits == 0 || key_bits % 8 != 0 || key_bits / 8 > json::MAX_KEY_SIZE {
        return Err(invalid(format!("Key size {key_bits} bits is invalid")));
    }
    let key_len = (key_bits / 8) as usize;
    let volume_key = match &opts.volume_key {
        Some(k) if k.len() != key_len => {
            return Err(invalid("Volume key length does not match the key size"))
        }
        Some(k) => k.clone(),
        None => keyslot::random(key_len)?,
    };
    crypto::SectorCrypt::new(&crypto::CryptConfig {
        cipher: opts.cipher.clone(),
        key: volume_key.clone(),
        iv_offset: 0,
        sector_size: 512,
        iv_large_sectors: false,
    })
    .map_err(|e| {
        Error::crypto(
            ErrorKind::InvalidArgument,
            format!(
                "Cipher {} with a {key_bits}-bit key is not usable",
                opts.cipher
            ),
            e,
        )
    })?;
    Ok(KeyPlan {
        cipher_name,
        cipher_mode,
        key_len,
        volume_key,
    })
}

/// The opened header device and the sizes `format` works with.
struct Target {
    /// The header device (the data device, or the detached header file),
    /// open for writing.
    file: Dev,
    /// Size of the data device in bytes.
    data_size: u64,
    /// Size of the header device in bytes before formatting.
    meta_size: u64,
}

/// Step 2: sizes the data device, opens (or creates) the header device and,
/// unless `force`, refuses one that already holds a LUKS header.
fn open_target(
    device: &Path,
    header: Option<&Path>,
    force: bool,
    access: &DeviceAccess,
) -> Result<Target> {
    let mut data = open_ro(device, access)?;
    let data_size = device_size(&mut data, device)?;
    drop(data);
    let meta_path = header.unwrap_or(device);
    let mut file = match header {
        Some(h) => open_rw_with(
            h,
            OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false),
            access,
        )?,
        None => open_rw(device, access)?,
    };
    let meta_size = device_size(&mut file, meta_path)?;
    if !force {
        match Header::read(&mut file, meta_size) {
            Ok(_) => {
                return Err(Error::new(
                    ErrorKind::AlreadyLuks,
                    format!("{} already contains a LUKS header", meta_path.display()),
                ))
            }
            Err(e) if e.kind() == ErrorKind::NotLuks => {}
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::AlreadyLuks,
                    format!("{} contains a damaged LUKS header", meta_path.display()),
                ))
            }
        }
    }
    Ok(Target {
        file,
        data_size,
        meta_size,
    })
}

/// Where the new volume's data goes.
struct Placement<'a> {
    /// The data device (named in "too small" errors).
    device: &'a Path,
    /// The header lives in a separate file.
    detached: bool,
    /// Size of the data device in bytes.
    data_size: u64,
    /// The placement options.
    layout: layout::Request,
}

impl Placement<'_> {
    fn too_small(&self) -> Error {
        Error::new(
            ErrorKind::DeviceSize,
            format!("Device {} is too small", self.device.display()),
        )
    }
}

/// The volume-key digest's salt and PBKDF2 iterations (cryptsetup's
/// 125 ms target, or the minimum when the caller forces keyslot costs).
struct VolumeDigest {
    salt: Zeroizing<Vec<u8>>,
    iterations: u32,
}

impl VolumeDigest {
    fn new(opts: &FormatOptions, key: &KeyPlan<'_>) -> Result<Self> {
        let iterations = match opts.kdf.force_iterations {
            Some(_) => MIN_PBKDF2_ITERATIONS,
            None => (crate::kdf::calibrate_pbkdf2(opts.hash, key.key_len, 125))
                .max(MIN_PBKDF2_ITERATIONS),
        };
        Ok(Self {
            salt: keyslot::random(32)?,
            iterations,
        })
    }

    /// The digest of `vk`, `len` bytes long.
    fn of(&self, opts: &FormatOptions, vk: &[u8], len: usize) -> Vec<u8> {
        keyslot::digest(opts.hash, vk, &self.salt, self.iterations, len)
    }
}

/// Step 3 for LUKS1: the header with no active slot, and the first slot.
fn luks1_header(
    opts: &FormatOptions,
    key: &KeyPlan<'_>,
    uuid: String,
    digest: &VolumeDigest,
    place: &Placement<'_>,
) -> Result<(luks1::Header, u32)> {
    if opts.sector_size.is_some_and(|s| s != 512) {
        return Err(invalid("LUKS1 supports only 512-byte sectors"));
    }
    if opts.label.is_some() || opts.subsystem.is_some() {
        return Err(invalid("LUKS1 has no label or subsystem"));
    }
    if opts.kdf.kind != "pbkdf2" {
        return Err(invalid("LUKS1 supports only the pbkdf2 KDF"));
    }
    if key.cipher_name.len() >= 32 || key.cipher_mode.len() >= 32 {
        return Err(invalid("Cipher name or mode is too long for LUKS1"));
    }
    let slot = opts.key_slot.unwrap_or(0);
    if slot as usize >= luks1::SLOTS {
        return Err(invalid(format!("Keyslot {slot} is invalid for LUKS1")));
    }
    let (offs, areas_end) = luks1::keyslot_layout(key.key_len as u32);
    let payload_sectors = layout::luks1_payload(&place.layout, areas_end)?;
    let mut mk_digest = [0u8; luks1::DIGEST_LEN];
    mk_digest.copy_from_slice(&digest.of(opts, &key.volume_key, luks1::DIGEST_LEN));
    let mut h = luks1::Header {
        cipher_name: key.cipher_name.to_string(),
        cipher_mode: key.cipher_mode.to_string(),
        hash: opts.hash,
        payload_offset: payload_sectors,
        key_bytes: key.key_len as u32,
        mk_digest,
        mk_digest_salt: [0; 32],
        mk_digest_iterations: digest.iterations,
        uuid,
        slots: [luks1::Slot {
            active: false,
            iterations: 0,
            salt: [0; 32],
            key_material_offset: 0,
            stripes: 4000,
        }; luks1::SLOTS],
    };
    h.mk_digest_salt.copy_from_slice(&digest.salt);
    for (s, o) in h.slots.iter_mut().zip(offs) {
        s.key_material_offset = o;
    }
    let data_start = u64::from(payload_sectors) * 512;
    if place.data_size <= data_start {
        return Err(place.too_small());
    }
    Ok((h, slot))
}

/// Step 3 for LUKS2: the header with no keyslot, the first slot, and
/// the layout's warnings.
fn luks2_header(
    opts: &FormatOptions,
    key: &KeyPlan<'_>,
    uuid: String,
    digest: &VolumeDigest,
    place: &Placement<'_>,
) -> Result<(luks2::Header, u32, Vec<String>)> {
    let lay = layout::luks2(&place.layout)?;
    let (hdr_size, keyslots_size, data_offset) = (lay.hdr_size, lay.keyslots_size, lay.data_offset);
    // One keyslot must fit (cryptsetup would write the header, then fail
    // to add the passphrase).
    let one_slot =
        (keyslot::material_len(key.key_len, crate::af::STRIPES) as u64).div_ceil(4096) * 4096;
    if keyslots_size < one_slot {
        return Err(invalid("Data offset leaves too little room for keyslots"));
    }
    if place.data_size <= data_offset {
        return Err(place.too_small());
    }
    let avail = place.data_size - data_offset;
    let sector_size = match opts.sector_size {
        Some(s) if ![512, 1024, 2048, 4096].contains(&s) => {
            return Err(invalid(format!(
                "Sector size {s} is invalid (512, 1024, 2048 or 4096)"
            )))
        }
        Some(s) => s,
        None => place.layout.auto_sector_size(),
    };
    if data_offset % u64::from(sector_size) != 0 {
        return Err(invalid("Data offset is not aligned to the sector size"));
    }
    if avail < u64::from(sector_size) {
        return Err(place.too_small());
    }
    let label = opts.label.clone().unwrap_or_default();
    let subsystem = opts.subsystem.clone().unwrap_or_default();
    if label.len() >= 48 || subsystem.len() >= 48 {
        return Err(invalid("Label and subsystem must be shorter than 48 bytes"));
    }
    let slot = opts.key_slot.unwrap_or(0);
    if slot >= json::MAX_KEYSLOTS {
        return Err(invalid(format!("Keyslot {slot} is invalid for LUKS2")));
    }
    let dg = digest.of(opts, &key.volume_key, opts.hash.digest_len());
    let mut digests = std::collections::BTreeMap::new();
    digests.insert(
        "0".to_string(),
        json::DigestJson {
            kind: "pbkdf2".into(),
            keyslots: vec![],
            segments: vec!["0".into()],
            hash: opts.hash.name().into(),
            iterations: digest.iterations,
            salt: json::b64_encode(&digest.salt),
            digest: json::b64_encode(&dg),
        },
    );
    let mut segments = std::collections::BTreeMap::new();
    segments.insert(
        "0".to_string(),
        json::Segment {
            kind: "crypt".into(),
            offset: data_offset,
            size: "dynamic".into(),
            iv_tweak: 0,
            encryption: opts.cipher.clone(),
            sector_size,
            extra: Default::default(),
        },
    );
    let meta = json::Metadata {
        keyslots: Default::default(),
        tokens: Default::default(),
        segments,
        digests,
        config: json::Config {
            json_size: hdr_size - 4096,
            keyslots_size,
            flags: None,
            requirements: None,
            extra: Default::default(),
        },
    };
    let h = luks2::Header {
        bin: BinHeader {
            primary: true,
            hdr_size,
            seqid: 0,
            label,
            checksum_alg: "sha256".into(),
            salt: [0; 64],
            uuid,
            subsystem,
            hdr_offset: 0,
        },
        meta,
        warnings: Vec::new(),
    };
    Ok((h, slot, lay.warnings))
}

/// Step 4, common to both versions: with the fresh header on disk (no
/// active slot), add the first passphrase and reload the volume the way
/// any other reader would.
fn add_first_key(
    mut vol: Volume,
    vk: &[u8],
    passphrase: &[u8],
    slot: u32,
    kdf: &KdfRequest,
    device: &Path,
    header: Option<&Path>,
) -> Result<Volume> {
    vol.add_key(vk, passphrase, Some(slot), kdf)?;
    Volume::load(device, header, &vol.access)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Opened;

    #[test]
    fn debug_never_shows_keys() {
        let key = Zeroizing::new(vec![0xabu8; 32]);
        let opts = FormatOptions {
            volume_key: Some(key.clone()),
            ..FormatOptions::default()
        };
        let o = Opened {
            volume_key: key.into(),
            keyslot: 0,
            cipher: "aes-xts-plain64".into(),
            sector_size: 512,
            iv_offset: 0,
            iv_large_sectors: false,
            payload_offset: 0,
            size: 512,
            uuid: String::new(),
        };
        for text in [format!("{opts:?}"), format!("{o:?}")] {
            assert!(
                !text.contains("171") && !text.contains("ab, ab") && !text.contains("abab"),
                "{text}"
            );
            assert!(text.contains("redacted"), "{text}");
        }
        assert!(o.table_line(Path::new("/dev/x")).contains(&"ab".repeat(32)));
    }

    #[test]
    fn unusable_cipher_keeps_the_crypto_cause() {
        use std::error::Error as _;
        let opts = FormatOptions {
            key_bits: Some(128),
            ..FormatOptions::default()
        };
        let e = plan_key(&opts).err().expect("XTS needs 256 bits or more");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        let cause = e
            .source()
            .and_then(|s| s.downcast_ref::<crypto::Error>())
            .expect("crypto cause");
        assert_eq!(cause.kind(), crypto::ErrorKind::Key, "{cause:?}");
        assert_eq!(
            e.to_string(),
            format!("Cipher aes-xts-plain64 with a 128-bit key is not usable: {cause}")
        );
    }
}
