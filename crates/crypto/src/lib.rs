//! Sector crypto compatible with Linux dm-crypt, byte for byte.
//!
//! The public seam is [`SectorCrypt`]: built once from a [`CryptConfig`]
//! (cipher spec, key, sector size, IV offset, `iv_large_sectors`), then
//! shared by every data-path thread. The sector number is the whole IV input.
//!
//! ```text
//!  table line ──▶ table::Table ──crypt_config()──▶ CryptConfig ──new()──▶ SectorCrypt
//!  cipher text ──▶ spec::CipherSpec ─────────────────────────────────────┘   │ per sector:
//!                                 cc_sector = sector + iv_offset              │  key  = cc_sector & (keycount-1)
//!                                 iv_sector = cc_sector [>> shift if large]   │  IV   = ivgen(iv_sector)
//!                                                                             ▼  chain mode (cipher/)
//! ```
//!
//! The per-sector rules (IV generators, key split, key index, `iv_offset`,
//! `iv_large_sectors`) are hand-written from Linux `drivers/md/dm-crypt.c`
//! and `Documentation/admin-guide/device-mapper/dm-crypt.rst`; `tests/`
//! checks them against an independent Python oracle
//! (`tests/oracle/dmcrypt.py`) and the IEEE 1619 XTS vectors.
// Unsafe code is allowed in three places only: `cipher::evp::Evp::xts_sectors`
// (raw EVP calls, OpenSSL writing into a Vec's spare capacity),
// `cipher::aesni` and `cipher::vaes` (the AES-NI and VAES XTS kernels) and
// `secret`, the locked-page allocator for keys.
#![deny(unsafe_code)]

use std::fmt;

use zeroize::Zeroizing;

mod cipher;
mod elephant;
mod error;
pub mod perf;
pub mod secret;
pub mod spec;
pub mod speed;
pub mod table;
mod tcw;

use cipher::{Dir, NullCipher, Prim, SectorCipher};
pub use cipher::{
    Provider, AESNI_XTS_NAME, CAMELLIA_XTS_NAME, KUZNYECHIK_XTS_NAME, OPENSSL_XTS_NAME,
    RUST_XTS_NAME, SERPENT_AVX2_XTS_NAME, SERPENT_XTS_NAME, TWOFISH_XTS_NAME, VAES_XTS_NAME,
};
pub use error::{Error, ErrorKind};
pub use perf::PerfFlags;
pub use secret::Secret;
pub use spec::CipherSpec;
use spec::{BlockCipher, ChainMode, EssivHash, IvMode};

/// Everything needed to build a [`SectorCrypt`].
#[derive(Clone)]
pub struct CryptConfig {
    /// dm-crypt cipher spec, e.g. `aes-xts-plain64` or `capi:ecb(cipher_null)`.
    pub cipher: String,
    /// Raw key bytes (empty for `cipher_null`).
    pub key: Zeroizing<Vec<u8>>,
    /// IV offset in 512-byte sectors (table field `<iv_offset>`).
    pub iv_offset: u64,
    /// Encryption sector size in bytes (512..=4096, power of two).
    pub sector_size: u32,
    /// IV counts in `sector_size` units instead of 512-byte units.
    pub iv_large_sectors: bool,
}

impl fmt::Debug for CryptConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CryptConfig")
            .field("cipher", &self.cipher)
            .field("key", &format_args!("<{} bytes hidden>", self.key.len()))
            .field("iv_offset", &self.iv_offset)
            .field("sector_size", &self.sector_size)
            .field("iv_large_sectors", &self.iv_large_sectors)
            .finish()
    }
}

/// One key part's transform: the chain mode and, for ESSIV, the IV cipher.
struct Tfm {
    cipher: Box<dyn SectorCipher>,
    essiv: Option<Prim>,
}

/// A ready-to-use sector cipher. `Send + Sync`; share it via `Arc`.
pub struct SectorCrypt {
    spec: CipherSpec,
    sector_size: usize,
    /// log2(sector_size / 512).
    shift: u32,
    iv_offset: u64,
    iv_large_sectors: bool,
    tfms: Vec<Tfm>,
    /// The Elephant key's AES (IV mode `elephant` only).
    elephant: Option<Prim>,
    /// The IV seed and whitening (IV mode `tcw` only).
    tcw: Option<tcw::Tcw>,
    /// A cascade's lower layers, top to bottom ([`SectorCrypt::stacked`]);
    /// empty for an ordinary cipher.
    below: Vec<SectorCrypt>,
}

impl fmt::Debug for SectorCrypt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SectorCrypt")
            .field("cipher", &self.spec.as_str())
            .field("sector_size", &self.sector_size)
            .field("iv_offset", &self.iv_offset)
            .field("iv_large_sectors", &self.iv_large_sectors)
            .field("implementation", &self.implementation())
            .finish_non_exhaustive()
    }
}

impl SectorCrypt {
    /// Builds the cipher, checking key length and options as dm-crypt does.
    pub fn new(cfg: &CryptConfig) -> Result<Self, Error> {
        Self::with_provider(cfg, Provider::Auto)
    }

    /// Like [`SectorCrypt::new`] with an explicit implementation choice
    /// (tests and benchmarks compare them).
    pub fn with_provider(cfg: &CryptConfig, provider: Provider) -> Result<Self, Error> {
        let spec = CipherSpec::parse(&cfg.cipher)?;
        let ss = cfg.sector_size;
        if !(512..=4096).contains(&ss) || !ss.is_power_of_two() {
            return Err(error::sector_size(format!(
                "Invalid feature value for sector_size: {ss} (must be a power of two in 512..4096)"
            )));
        }
        let shift = (ss / 512).trailing_zeros();
        if cfg.iv_offset & (u64::from(ss / 512) - 1) != 0 {
            return Err(error::misaligned(format!(
                "Invalid iv_offset sector: {} is not a multiple of the {ss}-byte sector size",
                cfg.iv_offset
            )));
        }
        spec.check_key_len(cfg.key.len())?;
        if spec.iv == IvMode::Tcw && ss != 512 {
            return Err(error::sector_size(format!(
                "Unsupported sector size for TCW: {ss} (512 only)"
            )));
        }
        // tcw: the cipher's key, then the IV seed and the whitening.
        let (key, tcw) = if spec.iv == IvMode::Tcw {
            let (k, extra) = cfg.key.split_at(cfg.key.len() - spec.key_extra_size());
            (k, Some(tcw::Tcw::new(extra, spec.iv_size())))
        } else {
            (&cfg.key[..], None)
        };
        // elephant: the chain mode's key, then the Elephant key
        // (dm-crypt's `key_extra_size`, half the key).
        let (key, elephant) = if spec.iv == IvMode::Elephant {
            let (k, e) = key.split_at(key.len() / 2);
            let bad = || {
                error::key(format!(
                    "Error decoding and setting key for {}",
                    spec.as_str()
                ))
            };
            (k, Some(Prim::aes(e).ok_or_else(bad)?))
        } else {
            (key, None)
        };
        let n = spec.key_count as usize;
        let sub = key.len() / n;
        let mut tfms = Vec::with_capacity(n);
        for i in 0..n {
            let k = &key[i * sub..(i + 1) * sub];
            tfms.push(build_tfm(&spec, k, provider, ss as usize)?);
        }
        Ok(Self {
            spec,
            sector_size: ss as usize,
            shift,
            iv_offset: cfg.iv_offset,
            iv_large_sectors: cfg.iv_large_sectors,
            tfms,
            elephant,
            tcw,
            below: Vec::new(),
        })
    }

    /// A cascade of ciphers as stacked dm-crypt devices make it (TrueCrypt
    /// and VeraCrypt chains: cryptsetup maps `name` over `name_1` over
    /// `name_2` over the device): `layers[0]` is the top device, first
    /// to encrypt a write and last to decrypt a read. Every layer sees
    /// the same sector numbers (each device maps its whole length at
    /// offset 0 of the one below, with its own `iv_offset`), so a stack
    /// is one cipher to the engine and needs nothing from the data path:
    /// a write runs the layers top to bottom, a read bottom to top, each
    /// over the whole buffer. The layers must share the sector size.
    pub fn stacked(layers: Vec<SectorCrypt>) -> Result<Self, Error> {
        let mut it = layers.into_iter();
        let Some(mut top) = it.next() else {
            return Err(error::table("A cipher cascade needs at least one layer"));
        };
        for l in it {
            if l.sector_size != top.sector_size {
                return Err(error::sector_size(format!(
                    "The layers of a cipher cascade differ in sector size ({} and {})",
                    top.sector_size, l.sector_size
                )));
            }
            if !l.below.is_empty() {
                return Err(error::table("A cascade layer is itself a cascade"));
            }
            top.below.push(l);
        }
        Ok(top)
    }

    /// The cascade's layers under this one, top to bottom (empty for an
    /// ordinary cipher).
    pub fn below(&self) -> &[SectorCrypt] {
        &self.below
    }

    /// Encryption sector size in bytes.
    pub fn sector_size(&self) -> usize {
        self.sector_size
    }

    /// True for `cipher_null` (encryption is a no-op copy).
    pub fn is_null(&self) -> bool {
        self.spec.cipher == BlockCipher::Null && self.below.is_empty()
    }

    /// The parsed cipher spec.
    pub fn spec(&self) -> &CipherSpec {
        &self.spec
    }

    /// Name of the implementation doing the bulk work (e.g. the XTS one).
    pub fn implementation(&self) -> &'static str {
        self.tfms.first().map_or("none", |t| t.cipher.name())
    }

    /// Encrypts `buf` in place. `sector` is the 512-byte sector number of
    /// `buf[0]` relative to the start of the mapping (dm's target offset);
    /// `buf.len()` must be a multiple of the sector size and `sector` aligned
    /// to it. Panics otherwise: callers validate requests first.
    pub fn encrypt(&self, sector: u64, buf: &mut [u8]) {
        self.convert(Dir::Encrypt, sector, Out::InPlace(buf));
    }

    /// Decrypts `buf` in place; same contract as [`SectorCrypt::encrypt`].
    pub fn decrypt(&self, sector: u64, buf: &mut [u8]) {
        self.convert(Dir::Decrypt, sector, Out::InPlace(buf));
    }

    /// Encrypts `src` into `dst` (same length), leaving `src` alone: the
    /// same bytes as copying and then [`SectorCrypt::encrypt`], in one pass
    /// over the data where the implementation allows (OpenSSL XTS). Same
    /// contract as `encrypt`; also panics if the lengths differ.
    pub fn encrypt_to(&self, sector: u64, src: &[u8], dst: &mut [u8]) {
        self.convert(Dir::Encrypt, sector, Out::To(src, dst));
    }

    /// Decrypts `src` into `dst`; see [`SectorCrypt::encrypt_to`].
    pub fn decrypt_to(&self, sector: u64, src: &[u8], dst: &mut [u8]) {
        self.convert(Dir::Decrypt, sector, Out::To(src, dst));
    }

    /// Appends the decryption of `src` to `out`, written straight into its
    /// spare capacity where the implementation can (OpenSSL XTS), so a
    /// read needs no zeroed buffer. Same contract as `decrypt` for `src`.
    pub fn decrypt_append(&self, sector: u64, src: &[u8], out: &mut Vec<u8>) {
        self.convert(Dir::Decrypt, sector, Out::Append(src, out));
    }

    /// Converts `out`'s bytes through every layer: the first conversion
    /// writes the output (in place, to `dst`, or appended), the others
    /// run in place over it.
    fn convert(&self, dir: Dir, sector: u64, out: Out<'_>) {
        if self.below.is_empty() {
            return self.convert_layer(dir, sector, out);
        }
        // Encrypt top to bottom, decrypt bottom to top.
        match dir {
            Dir::Encrypt => Self::convert_through(
                std::iter::once(self).chain(self.below.iter()),
                dir,
                sector,
                out,
            ),
            Dir::Decrypt => Self::convert_through(
                self.below.iter().rev().chain(std::iter::once(self)),
                dir,
                sector,
                out,
            ),
        }
    }

    /// [`SectorCrypt::convert`] through `layers` in order (no allocation
    /// per request: this runs for every sector of a cascade).
    fn convert_through<'a>(
        mut layers: impl Iterator<Item = &'a SectorCrypt>,
        dir: Dir,
        sector: u64,
        out: Out<'_>,
    ) {
        let Some(first) = layers.next() else { return };
        let region: &mut [u8] = match out {
            Out::InPlace(buf) => {
                first.convert_layer(dir, sector, Out::InPlace(&mut *buf));
                buf
            }
            Out::To(src, dst) => {
                first.convert_layer(dir, sector, Out::To(src, &mut *dst));
                dst
            }
            Out::Append(src, v) => {
                let base = v.len();
                first.convert_layer(dir, sector, Out::Append(src, &mut *v));
                &mut v[base..]
            }
        };
        for l in layers {
            l.convert_layer(dir, sector, Out::InPlace(&mut *region));
        }
    }

    /// Converts `out`'s bytes with this layer's cipher alone.
    fn convert_layer(&self, dir: Dir, sector: u64, out: Out<'_>) {
        if let Some(key) = &self.elephant {
            return self.convert_elephant(key, dir, sector, out);
        }
        if let Some(t) = &self.tcw {
            return self.convert_tcw(t, dir, sector, out);
        }
        self.convert_chain(dir, sector, out)
    }

    /// IV mode `tcw`: the whitening is removed from each 512-byte
    /// ciphertext sector before the chain mode decrypts it and applied
    /// after it encrypts (dm-crypt's `crypt_iv_tcw_gen` and `_post`).
    fn convert_tcw(&self, t: &tcw::Tcw, dir: Dir, sector: u64, out: Out<'_>) {
        let buf = out.into_buf();
        let base = sector.wrapping_add(self.iv_offset);
        let whiten = |buf: &mut [u8]| {
            for (i, s) in buf.chunks_exact_mut(512).enumerate() {
                t.whiten(base.wrapping_add(i as u64), s);
            }
        };
        if dir == Dir::Decrypt {
            whiten(buf);
        }
        self.convert_chain(dir, sector, Out::InPlace(buf));
        if dir == Dir::Encrypt {
            whiten(buf);
        }
    }

    /// IV mode `elephant`: the diffuser runs on each sector before the
    /// chain mode encrypts it and after it decrypts it, in place (the
    /// output is first made a copy of the input).
    fn convert_elephant(&self, key: &Prim, dir: Dir, sector: u64, out: Out<'_>) {
        let buf = out.into_buf();
        let ss = self.sector_size;
        let step = (ss / 512) as u64;
        let shift = if self.iv_large_sectors { self.shift } else { 0 };
        let base = sector.wrapping_add(self.iv_offset);
        // The byte offset eboiv and the sector key use: iv_sector * sector_size.
        let offset = |i: usize| {
            (base.wrapping_add((i as u64).wrapping_mul(step)) >> shift).wrapping_mul(ss as u64)
        };
        if dir == Dir::Encrypt {
            for (i, s) in buf.chunks_exact_mut(ss).enumerate() {
                elephant::before_encrypt(key, offset(i), s);
            }
        }
        self.convert_chain(dir, sector, Out::InPlace(buf));
        if dir == Dir::Decrypt {
            for (i, s) in buf.chunks_exact_mut(ss).enumerate() {
                elephant::after_decrypt(key, offset(i), s);
            }
        }
    }

    /// Converts `out`'s bytes with the chain mode and the IV generator.
    fn convert_chain(&self, dir: Dir, sector: u64, mut out: Out<'_>) {
        let step = (self.sector_size / 512) as u64;
        let len = out.len();
        assert!(
            len % self.sector_size == 0 && sector % step == 0,
            "unaligned request: {len} bytes at sector {sector}, sector size {}",
            self.sector_size
        );
        let ss = self.sector_size;
        if self.is_null() {
            out.copy();
            return;
        }
        let base = sector.wrapping_add(self.iv_offset);
        if self.tfms.len() == 1 && len == ss {
            // The common one-sector call: no IV batch array to clear.
            let tfm = &self.tfms[0];
            let mut iv = [[0u8; 16]; 1];
            self.fill_ivs(tfm, base, step, &mut iv);
            out.run(dir, &*tfm.cipher, 0, ss, ss, &iv);
            return;
        }
        if self.tfms.len() == 1 {
            // A 4 KiB call of 512-byte sectors needs 8 IVs: clearing the
            // whole 64-entry array cost ~1.5% of such a call.
            if len <= ss * SMALL_IV_BATCH {
                return self.convert_one_key::<SMALL_IV_BATCH>(dir, base, step, len, out);
            }
            return self.convert_one_key::<IV_BATCH>(dir, base, step, len, out);
        }
        let mut ivs = [[0u8; 16]; 1];
        // dm-crypt's multi-key mode: key part = cc_sector & (keycount - 1).
        let mask = self.tfms.len() as u64 - 1;
        for i in 0..len / ss {
            let cc_sector = base.wrapping_add((i as u64).wrapping_mul(step));
            let tfm = &self.tfms[(cc_sector & mask) as usize];
            self.fill_ivs(tfm, cc_sector, step, &mut ivs);
            out.run(dir, &*tfm.cipher, i * ss, ss, ss, &ivs);
        }
    }

    /// [`SectorCrypt::convert`] with one key: the IVs of up to `N` sectors
    /// at a time, one cipher call per batch.
    fn convert_one_key<const N: usize>(
        &self,
        dir: Dir,
        base: u64,
        step: u64,
        len: usize,
        mut out: Out<'_>,
    ) {
        let ss = self.sector_size;
        let tfm = &self.tfms[0];
        let mut ivs = [[0u8; 16]; N];
        let mut at = 0;
        while at < len {
            let n = (len - at).min(ss * N);
            let first = base.wrapping_add(((at / ss) as u64).wrapping_mul(step));
            let ivs = &mut ivs[..n / ss];
            self.fill_ivs(tfm, first, step, ivs);
            out.run(dir, &*tfm.cipher, at, n, ss, ivs);
            at += n;
        }
    }

    /// The IVs of consecutive sectors starting at `cc_sector` (512-byte
    /// units, `iv_offset` included), as dm-crypt's generators make them.
    fn fill_ivs(&self, tfm: &Tfm, cc_sector: u64, step: u64, ivs: &mut [[u8; 16]]) {
        let shift = if self.iv_large_sectors { self.shift } else { 0 };
        let ss = self.sector_size as u64;
        // One loop per mode (the mode is matched once per batch, and the
        // generic `f` inlined into each loop): each IV is one 16-byte
        // store of a zero-extended integer.
        fn fill_with(
            ivs: &mut [[u8; 16]],
            (cc_sector, step, shift, ss): (u64, u64, u32, u64),
            f: impl Fn(u64, u64) -> [u8; 16],
        ) {
            for (i, iv) in ivs.iter_mut().enumerate() {
                let s = cc_sector.wrapping_add((i as u64).wrapping_mul(step)) >> shift;
                *iv = f(s, ss);
            }
        }
        let at = (cc_sector, step, shift, ss);
        match self.spec.iv {
            IvMode::None | IvMode::Null => ivs.fill([0u8; 16]),
            IvMode::Plain => fill_with(ivs, at, |s, _| u128::from(s as u32).to_le_bytes()),
            IvMode::Plain64 | IvMode::Essiv(_) => {
                fill_with(ivs, at, |s, _| u128::from(s).to_le_bytes())
            }
            IvMode::Plain64Be => fill_with(ivs, at, |s, _| u128::from(s).to_be_bytes()),
            // 9 - log2(16): cipher blocks per 512-byte sector, from 1.
            IvMode::Benbi => fill_with(ivs, at, |s, _| {
                u128::from((s << 5).wrapping_add(1)).to_be_bytes()
            }),
            // Byte offset (iv_sector * sector_size), encrypted below.
            IvMode::Eboiv | IvMode::Elephant => fill_with(ivs, at, |s, ss| {
                u128::from(s.wrapping_mul(ss)).to_le_bytes()
            }),
            // The seed XOR the sector number (in each 8-byte half).
            IvMode::Tcw => match &self.tcw {
                Some(t) => fill_with(ivs, at, |s, _| t.iv(s)),
                None => ivs.fill([0u8; 16]),
            },
        }
        match self.spec.iv {
            IvMode::Essiv(_) => {
                if let Some(e) = &tfm.essiv {
                    e.encrypt_ivs(ivs);
                }
            }
            IvMode::Eboiv | IvMode::Elephant => {
                // The first key's chain mode encrypts a zero block with the
                // byte offset as its IV (dm-crypt uses tfms[0] always).
                let mut zero = [0u8; 16 * IV_BATCH];
                let z = &mut zero[..16 * ivs.len()];
                self.tfms[0].cipher.crypt_run(Dir::Encrypt, z, 16, ivs);
                for (iv, b) in ivs.iter_mut().zip(z.chunks_exact(16)) {
                    iv.copy_from_slice(b);
                }
            }
            _ => {}
        }
    }
}

/// Where a conversion's output goes.
enum Out<'a> {
    /// Converted where it is.
    InPlace(&'a mut [u8]),
    /// From a source into a destination of the same length.
    To(&'a [u8], &'a mut [u8]),
    /// From a source, appended to a Vec.
    Append(&'a [u8], &'a mut Vec<u8>),
}

impl<'a> Out<'a> {
    /// The output made a copy of the input (in place: the buffer itself),
    /// for modes that work on it in place around the chain mode.
    fn into_buf(self) -> &'a mut [u8] {
        match self {
            Out::InPlace(b) => b,
            Out::To(src, dst) => {
                assert_eq!(
                    src.len(),
                    dst.len(),
                    "source and destination differ in length"
                );
                dst.copy_from_slice(src);
                dst
            }
            Out::Append(src, v) => {
                let at = v.len();
                v.extend_from_slice(src);
                &mut v[at..]
            }
        }
    }

    /// Bytes converted.
    fn len(&self) -> usize {
        match self {
            Out::InPlace(b) => b.len(),
            Out::To(src, dst) => {
                assert_eq!(
                    src.len(),
                    dst.len(),
                    "source and destination differ in length"
                );
                src.len()
            }
            Out::Append(src, _) => src.len(),
        }
    }

    /// The output of `cipher_null`: the input.
    fn copy(&mut self) {
        match self {
            Out::InPlace(_) => {}
            Out::To(src, dst) => dst.copy_from_slice(src),
            Out::Append(src, out) => out.extend_from_slice(src),
        }
    }

    /// Converts bytes `at..at + len` (whole `unit`-byte sectors, in order).
    fn run(
        &mut self,
        dir: Dir,
        c: &dyn SectorCipher,
        at: usize,
        len: usize,
        unit: usize,
        ivs: &[[u8; 16]],
    ) {
        match self {
            Out::InPlace(b) => c.crypt_run(dir, &mut b[at..at + len], unit, ivs),
            Out::To(src, dst) => {
                c.crypt_run_to(dir, &src[at..at + len], &mut dst[at..at + len], unit, ivs)
            }
            Out::Append(src, out) => c.crypt_run_append(dir, &src[at..at + len], out, unit, ivs),
        }
    }
}

/// Sectors whose IVs are computed (and ESSIV-encrypted) in one batch.
const IV_BATCH: usize = 64;
/// The batch for calls of at most this many sectors (a 4 KiB call of
/// 512-byte sectors, or 16 of them).
const SMALL_IV_BATCH: usize = 16;

fn build_tfm(
    spec: &CipherSpec,
    key: &[u8],
    provider: Provider,
    sector_size: usize,
) -> Result<Tfm, Error> {
    let bad_key = || {
        error::key(format!(
            "Error decoding and setting key for {}",
            spec.as_str()
        ))
    };
    let cipher: Box<dyn SectorCipher> = match spec.cipher {
        BlockCipher::Null => Box::new(NullCipher),
        c => cipher::new_mode_for(c, spec.chain, key, provider, sector_size).ok_or_else(bad_key)?,
    };
    let essiv = match spec.iv {
        IvMode::Essiv(h) => {
            let salt = essiv_salt(h, key);
            // The kernel's essiv template keys the same cipher with the digest.
            Some(Prim::new(spec.cipher, &salt).ok_or_else(|| {
                let name = spec.cipher.title();
                error::key(format!(
                    "Error decoding and setting key for {}: the {}-byte {} digest is no valid {name} key",
                    spec.as_str(),
                    h.digest_len(),
                    h.name()
                ))
            })?)
        }
        _ => None,
    };
    Ok(Tfm { cipher, essiv })
}

/// ESSIV salt: the hash of this key part (the kernel's essiv template
/// hashes the key it is given, i.e. one `keycount` share).
fn essiv_salt(h: EssivHash, key: &[u8]) -> Zeroizing<Vec<u8>> {
    use sha2::Digest;
    Zeroizing::new(match h {
        EssivHash::Md5 => md5::Md5::digest(key).to_vec(),
        EssivHash::Sha1 => sha1::Sha1::digest(key).to_vec(),
        EssivHash::Sha224 => sha2::Sha224::digest(key).to_vec(),
        EssivHash::Sha256 => sha2::Sha256::digest(key).to_vec(),
        EssivHash::Sha384 => sha2::Sha384::digest(key).to_vec(),
        EssivHash::Sha512 => sha2::Sha512::digest(key).to_vec(),
    })
}

/// One data unit of any length (a multiple of the block size) with a raw
/// IV or tweak, for formats whose metadata is encrypted in units that are
/// not dm-crypt sectors: FileVault 2's 8 KiB metadata blocks, a
/// TrueCrypt/VeraCrypt header (448 bytes, data unit 0). The same cipher
/// code as the data path.
pub mod unit {
    use crate::cipher::{self, Dir, Provider};
    use crate::spec::CipherSpec;

    /// Decrypts `buf` in place as one data unit of `spec`'s cipher and
    /// chain mode (`aes-xts-plain64`, `serpent-xts-plain64`, …; the IV
    /// generator is not used: `iv` is the raw IV or XTS tweak). `None` for
    /// a bad spec, a bad key, or a length that is not whole blocks.
    pub fn decrypt(spec: &str, key: &[u8], iv: [u8; 16], buf: &mut [u8]) -> Option<()> {
        if buf.is_empty() || buf.len() % 16 != 0 {
            return None;
        }
        let spec = CipherSpec::parse(spec).ok()?;
        let c = cipher::new_mode_for(spec.cipher, spec.chain, key, Provider::Auto, buf.len())?;
        let unit = buf.len();
        c.crypt_run(Dir::Decrypt, buf, unit, &[iv]);
        Some(())
    }
}

/// Low-level entry points for known-answer tests; not a stable API: built
/// only with the `testing` feature (this crate's tests turn it on).
#[cfg(feature = "testing")]
#[doc(hidden)]
pub mod internal {
    use crate::cipher::{self, Dir, Provider};
    use crate::spec::ChainMode;

    /// XTS-encrypts `buf` (a multiple of 16 bytes) in place with the raw
    /// 128-bit tweak `tweak` (IEEE 1619 data unit sequence number, LE).
    /// Returns the implementation name used, or `None` for a bad key.
    pub fn xts_encrypt(
        key: &[u8],
        imp: Provider,
        tweak: [u8; 16],
        buf: &mut [u8],
    ) -> Option<&'static str> {
        let c = cipher::new_mode(ChainMode::Xts, key, imp, buf.len())?;
        c.crypt(Dir::Encrypt, buf, &tweak);
        Some(c.name())
    }

    /// Converts `buf` (a multiple of 16 bytes) in place as one data unit
    /// of `spec`'s cipher and chain mode with the raw 16-byte `iv` (the
    /// spec's IV generator is not used; ECB ignores `iv`). Returns the
    /// implementation name used, or `None` for a bad spec or key.
    pub fn crypt_unit(
        spec: &str,
        key: &[u8],
        imp: Provider,
        iv: [u8; 16],
        buf: &mut [u8],
        encrypt: bool,
    ) -> Option<&'static str> {
        let spec = crate::spec::CipherSpec::parse(spec).ok()?;
        let c = cipher::new_mode_for(spec.cipher, spec.chain, key, imp, buf.len())?;
        let dir = if encrypt { Dir::Encrypt } else { Dir::Decrypt };
        c.crypt(dir, buf, &iv);
        Some(c.name())
    }

    /// Inverse of [`xts_encrypt`].
    pub fn xts_decrypt(
        key: &[u8],
        imp: Provider,
        tweak: [u8; 16],
        buf: &mut [u8],
    ) -> Option<&'static str> {
        let c = cipher::new_mode(ChainMode::Xts, key, imp, buf.len())?;
        c.crypt(Dir::Decrypt, buf, &tweak);
        Some(c.name())
    }
}

/// Name of the XTS implementation [`SectorCrypt::new`] picks on this
/// machine for an ordinary 512-bit key and 512-byte sectors.
pub fn xts_implementation() -> &'static str {
    let key: Vec<u8> = (0..64u8).collect();
    cipher::new_mode(ChainMode::Xts, &key, Provider::Auto, 512).map_or("none", |c| c.name())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(cipher: &str, key: Vec<u8>) -> CryptConfig {
        CryptConfig {
            cipher: cipher.into(),
            key: Zeroizing::new(key),
            iv_offset: 0,
            sector_size: 512,
            iv_large_sectors: false,
        }
    }

    #[test]
    fn xts_roundtrip_and_sector_dependence() {
        let c = SectorCrypt::new(&cfg("aes-xts-plain64", (0..64).collect())).unwrap();
        let mut a = vec![0u8; 1024];
        c.encrypt(0, &mut a);
        assert_ne!(&a[..512], &a[512..], "different sectors, different IVs");
        // Known answer computed with Python `cryptography` (AES-256-XTS,
        // tweak = little-endian sector number).
        use sha2::Digest;
        assert_eq!(
            hex::encode(sha2::Sha256::digest(&a)),
            "b009da373f1e78e1b9b526f23f2a8c4690a9b4f8ab1c9da46af891f2fef2fa98"
        );
        for imp in [Provider::Rust, Provider::OpenSsl] {
            let c2 = SectorCrypt::with_provider(&cfg("aes-xts-plain64", (0..64).collect()), imp)
                .unwrap();
            let mut b = vec![0u8; 1024];
            c2.encrypt(0, &mut b);
            assert_eq!(a, b, "{imp:?}");
        }
        c.decrypt(0, &mut a);
        assert_eq!(a, vec![0u8; 1024]);
    }

    #[test]
    fn refuses_bad_config() {
        let e = |c: CryptConfig| SectorCrypt::new(&c).unwrap_err().to_string();
        assert!(e(cfg("aes-xts-plain64", vec![0; 20])).contains("Error decoding and setting key"));
        let mut c = cfg("aes-xts-plain64", vec![1; 64]);
        c.sector_size = 4096;
        c.iv_offset = 3;
        assert!(e(c).contains("Invalid iv_offset sector"));
        let mut c = cfg("aes-xts-plain64", vec![1; 64]);
        c.sector_size = 1000;
        assert!(e(c).contains("sector_size"));
        assert!(e(cfg("aes-cbc-essiv:sha1", vec![1; 32])).contains("no valid AES key"));
    }

    #[test]
    fn errors_have_kinds_callers_can_match() {
        let e = |c: CryptConfig| SectorCrypt::new(&c).unwrap_err();
        assert_eq!(
            e(cfg("aes-xts-plain64", vec![0; 20])).kind(),
            ErrorKind::Key
        );
        assert_eq!(e(cfg("aes-xts-bogus", vec![0; 64])).kind(), ErrorKind::Spec);
        assert_eq!(
            e(cfg("cast6-xts-plain64", vec![0; 64])).kind(),
            ErrorKind::Unsupported
        );
        let mut c = cfg("aes-xts-plain64", vec![1; 64]);
        c.sector_size = 1000;
        assert_eq!(e(c).kind(), ErrorKind::SectorSize);
        let mut c = cfg("aes-xts-plain64", vec![1; 64]);
        c.sector_size = 4096;
        c.iv_offset = 3;
        assert_eq!(e(c).kind(), ErrorKind::Misaligned);
        let t = |line: &str| table::Table::parse(line).unwrap_err();
        let key = "00".repeat(64);
        assert_eq!(t("0 8 crypt").kind(), ErrorKind::Table);
        assert_eq!(
            t(&format!(
                "0 8 crypt aes-xts-plain64 {key} 0 /dev/x 0 1 sector_size:999"
            ))
            .kind(),
            ErrorKind::SectorSize
        );
        assert_eq!(
            t(&format!(
                "0 9 crypt aes-xts-plain64 {key} 0 /dev/x 0 1 sector_size:4096"
            ))
            .kind(),
            ErrorKind::Misaligned
        );
        assert_eq!(
            t("0 8 crypt aes-xts-plain64 abc 0 /dev/x 0").kind(),
            ErrorKind::Key
        );
        let spec = t(&format!("0 8 crypt aes-xts-bogus {key} 0 /dev/x 0"));
        assert_eq!(spec.kind(), ErrorKind::Spec, "{spec:?}");
        assert!(spec.message().ends_with("(field <cipher>)"), "{spec}");
    }

    #[test]
    fn sector_crypt_is_shareable_across_threads() {
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<SectorCrypt>();
        let c = std::sync::Arc::new(
            SectorCrypt::new(&cfg("aes-cbc-essiv:sha256", vec![5; 32])).unwrap(),
        );
        let handles: Vec<_> = (0..4u64)
            .map(|t| {
                let c = c.clone();
                std::thread::spawn(move || {
                    let mut b = vec![t as u8; 4096];
                    c.encrypt(t * 8, &mut b);
                    c.decrypt(t * 8, &mut b);
                    b == vec![t as u8; 4096]
                })
            })
            .collect();
        assert!(handles.into_iter().all(|h| h.join().unwrap()));
    }

    #[test]
    fn legacy_modes_round_trip_and_depend_on_the_sector() {
        for (spec, klen) in [
            ("aes-lrw-benbi", 48),
            ("twofish-lrw-benbi", 48),
            ("aes-cbc-tcw", 64),
            ("serpent-cbc-tcw", 64),
            ("cast5-cbc-tcw", 40),
            ("des3_ede-cbc-tcw", 48),
        ] {
            let key: Vec<u8> = (0..klen as u8).map(|b| b.wrapping_mul(29)).collect();
            let c = SectorCrypt::new(&cfg(spec, key)).unwrap();
            let orig: Vec<u8> = (0..2048u32).map(|i| (i % 251) as u8).collect();
            let mut a = orig.clone();
            c.encrypt(8, &mut a);
            assert_ne!(a[..512], a[512..1024], "{spec}: sectors differ");
            let mut b = vec![0u8; 2048];
            c.decrypt_to(8, &a, &mut b);
            assert_eq!(b, orig, "{spec}");
            c.decrypt(8, &mut a);
            assert_eq!(a, orig, "{spec}");
        }
        let mut c = cfg("aes-cbc-tcw", vec![1; 64]);
        c.sector_size = 4096;
        assert_eq!(
            SectorCrypt::new(&c).err().map(|e| e.kind()),
            Some(ErrorKind::SectorSize)
        );
    }

    /// Sector 1 of TrueCrypt 1.x/4.x volumes from cryptsetup's test images
    /// (`tc_1-*`, `tc_2-*`): the mapping key as `tcryptDump
    /// --dump-volume-key` gives it, and the SHA-256 of the sector's
    /// ciphertext, whose plaintext is 512 zero bytes (the FAT's reserved
    /// sector). Encryption must give exactly that ciphertext, and
    /// decrypting it the zeros back.
    #[test]
    fn truecrypt_legacy_sectors_known_answers() {
        use sha2::Digest;
        let hex = |t: &str| -> Vec<u8> {
            (0..t.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&t[i..i + 2], 16).expect("hex"))
                .collect()
        };
        // (spec, iv_offset, key, sha256 of the ciphertext)
        let cases = [
            (
                "aes-cbc-tcw",
                1,
                "276038af631d03d895e8c3f07f98d5d888ee9c746424edddab250db8b730007d298b5803c9300acb63203ee7a2a06ab28c216278851039cee0f25843a42a9689",
                "e12b43f1264cb00df625ce3c08bb1753d41b115c116adfd195a0203e59eeab58",
            ),
            (
                "twofish-cbc-tcw",
                1,
                "f5c1ba02b4c1bb97d7e72a3b22bf860e5122b3ef914466c5b42af7b6d37e2e54efaa7a4a5179937ca79943721dcdae1709e63603ea21a30cf4bbebea5b34b7c6",
                "eeeb23911f74cdbbee0331fe1797f1032000e15be690c2fae74c3b04a33b5cf9",
            ),
            (
                "cast5-cbc-tcw",
                1,
                "15cef2a761c6a2d43493f74c97e3d86cd5c90c120c40de731b6ef020f76524c79ca4fabe2c371109",
                "4bc857e210cd441a2afc829b0728d6000179080c7196d41f1463a6c72688ca87",
            ),
            (
                "des3_ede-cbc-tcw",
                1,
                "39b9585cb68b811b1df0026e06026d94596651d3ad340758e4aa8e44227f9a4442fa96684f504e1e751ddd699dd1b6cd",
                "8afca66794af9963b6bda1d0a38fe653e4d06ff004877286a1ff107625dbb7bc",
            ),
            (
                "aes-lrw-benbi",
                0,
                "91dcd0bc0970af45b0002370fef285825de56e5f9acd3594ed213b26e86b47be418729d87f65b8c6605d8a75a2615d0d",
                "5cf1e3ebb0c03ab4a4a982ba301088ee89b2c5aa3565c6882a8a5c75b2c1722c",
            ),
            (
                "serpent-lrw-benbi",
                0,
                "9cd81944450ac3818c3054c07ac330bddc6bb712bc3db81e277ede56e3c62ba28b07d87580185803b440f2775f48cd7e",
                "ebd2ca9db18967fbd2ba67928061ff6ac1d2ca7e7b232d5fafb31e1ab1d7897e",
            ),
            (
                "twofish-lrw-benbi",
                0,
                "4fb5ec30d4a726ff789045b57afc828af3d3d69fb263fc232d91ac85872fe49e1d022d60b4f310eaadc701a5bee5f34e",
                "90be80fdf286572c35c90abc19795e4e7f20afa1ad63663ee065ef5cfc287541",
            ),
        ];
        for (spec, iv_offset, key, digest) in cases {
            let mut c = cfg(spec, hex(key));
            c.iv_offset = iv_offset;
            let c = SectorCrypt::new(&c).unwrap();
            let mut b = vec![0u8; 512];
            c.encrypt(1, &mut b);
            let got: Vec<u8> = sha2::Sha256::digest(&b).to_vec();
            assert_eq!(got, hex(digest), "{spec}: ciphertext of sector 1");
            c.decrypt(1, &mut b);
            assert_eq!(b, vec![0u8; 512], "{spec}: decrypts to the zeros");
            // Another sector gives another ciphertext (IV and whitening).
            let mut other = vec![0u8; 512];
            c.encrypt(2, &mut other);
            assert_ne!(sha2::Sha256::digest(&other).to_vec(), hex(digest), "{spec}");
        }
    }

    #[test]
    fn debug_hides_key() {
        let c = cfg("aes-xts-plain64", vec![0xAB; 64]);
        let s = format!("{c:?}");
        assert!(
            !s.to_lowercase().contains("abab") && !s.contains("171"),
            "{s}"
        );
    }
}
