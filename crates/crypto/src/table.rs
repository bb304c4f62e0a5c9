//! dm-crypt table lines (hand-written parser and formatter; never panics).
//!
//! ```text
//! <start> <len> crypt <cipher> <key> <iv_offset> <device> <offset> [<#opt> <opt>...]
//! ```
//!
//! Parsing follows `crypt_ctr()` and `crypt_ctr_optional()` in Linux
//! `drivers/md/dm-crypt.c` and refuses what the kernel refuses, with the
//! kernel's reason text plus the offending field. Options are matched
//! case-insensitively as the kernel does; the performance flags (and the
//! out-of-tree `force_inline`, both workqueue flags) are
//! [`crate::perf::PerfFlags`].
//!
//! Formatting writes the options in the kernel's `crypt_status()` order and,
//! like `dmsetup table` without `--showkeys`, masks the key as zeros of the
//! same length unless asked to show it.
//!
//! A mapping of several targets (crypt and linear lines) is a
//! [`Targets`] list (`table/targets.rs`).
//!
//! The key lives in a [`Secret`] (locked, non-dumpable pages): parsing
//! decodes the hex straight into one, and [`Table::line`] formats a line
//! with the key into another, so no `String` ever holds the key.

use std::fmt::{self, Write as _};

use zeroize::Zeroizing;

use crate::error;
use crate::perf::PerfFlags;
use crate::{CipherSpec, CryptConfig, Error, Secret, SectorCrypt};

mod targets;
pub use targets::{Linear, Target, Targets, Zero};

/// Optional parameters of a crypt table line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Options {
    /// Pass discards through (`allow_discards`).
    pub allow_discards: bool,
    /// The performance flags (`same_cpu_crypt`, `high_priority`, …); the
    /// options read as them too (`options.no_read_workqueue`).
    pub perf: PerfFlags,
    /// Encryption sector size in bytes (`sector_size:N`, default 512).
    pub sector_size: u32,
    /// IVs count `sector_size` units (`iv_large_sectors`).
    pub iv_large_sectors: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            allow_discards: false,
            perf: PerfFlags::default(),
            sector_size: 512,
            iv_large_sectors: false,
        }
    }
}

impl std::ops::Deref for Options {
    type Target = PerfFlags;
    fn deref(&self) -> &PerfFlags {
        &self.perf
    }
}

impl std::ops::DerefMut for Options {
    fn deref_mut(&mut self) -> &mut PerfFlags {
        &mut self.perf
    }
}

impl Options {
    /// The option words in the kernel's status order (empty when none).
    pub fn words(&self) -> Vec<String> {
        let mut w = Vec::new();
        if self.allow_discards {
            w.push("allow_discards".to_owned());
        }
        w.extend(self.perf.table_words().map(str::to_owned));
        if self.sector_size != 512 {
            w.push(format!("sector_size:{}", self.sector_size));
        }
        if self.iv_large_sectors {
            w.push("iv_large_sectors".to_owned());
        }
        w
    }
}

/// The kernel's limit on feature arguments (dm-crypt 6.x with high_priority).
const MAX_FEATURE_ARGS: u64 = 9;

/// A parsed, validated dm-crypt table line. The key sits in locked memory,
/// is zeroized on drop and never shown by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Table {
    /// First logical sector (512-byte units) of the mapping.
    pub start: u64,
    /// Length in 512-byte sectors.
    pub len: u64,
    /// Cipher spec.
    pub cipher: CipherSpec,
    key: Secret,
    /// IV offset in 512-byte sectors.
    pub iv_offset: u64,
    /// Backing device or file path.
    pub device: String,
    /// Start of the encrypted data on the device, in 512-byte sectors.
    pub offset: u64,
    /// Optional parameters.
    pub options: Options,
    /// A cipher cascade's lower layers, top to bottom ([`Table::stacked`]).
    below: Vec<Table>,
}

impl fmt::Debug for Table {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Table")
            .field("start", &self.start)
            .field("len", &self.len)
            .field("cipher", &self.cipher.as_str())
            .field("key", &format_args!("<{} bytes hidden>", self.key.len()))
            .field("iv_offset", &self.iv_offset)
            .field("device", &self.device)
            .field("offset", &self.offset)
            .field("options", &self.options)
            .finish()
    }
}

impl Table {
    /// Parses one table line (fields separated by blanks).
    pub fn parse(line: &str) -> Result<Self, Error> {
        Self::parse_keyed(line, None)
    }

    /// Parses a line whose `<key>` field is `-` and takes the key from
    /// elsewhere (a key file), so the key never appears in the line: the
    /// key is `key`'s bytes, raw, its length checked against the cipher.
    /// A line with a key of its own is refused (the key is given once).
    pub fn parse_with_key(line: &str, key: Secret) -> Result<Self, Error> {
        Self::parse_keyed(line, Some(key))
    }

    fn parse_keyed(line: &str, external: Option<Secret>) -> Result<Self, Error> {
        let f: Vec<&str> = line.split_ascii_whitespace().collect();
        let field = |i: usize, name: &str| -> Result<&str, Error> {
            f.get(i).copied().ok_or_else(|| {
                error::table(format!(
                    "Not enough arguments: table field <{name}> (field {}) is missing",
                    i + 1
                ))
            })
        };
        let start = parse_u64(field(0, "start")?, "start", "Invalid start sector")?;
        let len = parse_u64(field(1, "len")?, "len", "Invalid length")?;
        let target = field(2, "target")?;
        if target != "crypt" {
            return Err(error::table(format!(
                "Unknown target type {target:?} in field <target>: only \"crypt\" lines are accepted"
            )));
        }
        let cipher_text = field(3, "cipher")?;
        let key_text = field(4, "key")?;
        let iv_text = field(5, "iv_offset")?;
        let device = field(6, "device")?;
        let off_text = field(7, "offset")?;
        let options = parse_options(&f[8..])?;
        // The kernel's check for the loop-AES/TrueCrypt IV modes comes
        // before anything else ucrypt would say about them.
        if options.sector_size != 512 {
            for (mode, name) in [("lmk", "LMK"), ("tcw", "TCW")] {
                let ivmode = cipher_text.rsplit('-').next().unwrap_or("");
                if ivmode == mode || ivmode.starts_with(&format!("{mode}:")) {
                    return Err(error::sector_size(format!(
                        "Unsupported sector size for {name}: field <cipher> {cipher_text:?} needs 512-byte sectors"
                    )));
                }
            }
        }
        let cipher = CipherSpec::parse(cipher_text).map_err(|e| prefix(e, "<cipher>"))?;
        let key = match external {
            None => parse_key(key_text, &cipher)?,
            Some(_) if key_text != "-" => {
                // Never echo the key text.
                return Err(error::key(
                    "Error decoding and setting key: with a key file, field <key> must be \"-\" (the key is given once)",
                ));
            }
            Some(k) if cipher.subkey_sizes() == [0] && !k.is_empty() => {
                return Err(error::key(format!(
                    "Error decoding and setting key: {cipher} takes no key, the key file must be empty"
                )));
            }
            Some(k) => k,
        };
        let iv_offset = parse_u64(iv_text, "iv_offset", "Invalid iv_offset sector")?;
        let offset = parse_u64(off_text, "offset", "Invalid device sector")?;
        Self::from_parts(
            start,
            len,
            cipher,
            key,
            iv_offset,
            device.to_owned(),
            offset,
            options,
        )
    }

    /// Builds a table from already-parsed values (e.g. from a LUKS header)
    /// and validates it exactly like [`Table::parse`]. The key is copied
    /// into locked memory (a `Zeroizing` buffer given is wiped on drop).
    #[allow(clippy::too_many_arguments)]
    pub fn from_parts(
        start: u64,
        len: u64,
        cipher: CipherSpec,
        key: impl Into<Secret>,
        iv_offset: u64,
        device: String,
        offset: u64,
        options: Options,
    ) -> Result<Self, Error> {
        let key = key.into();
        if len == 0 {
            return Err(error::table("Zero-length target: field <len> is 0"));
        }
        if start.checked_add(len).is_none() {
            return Err(error::table(
                "Invalid length: field <start> + <len> overflows",
            ));
        }
        if device.is_empty() || device.chars().any(|c| c.is_whitespace()) {
            return Err(error::table(
                "Device lookup failed: field <device> is empty or has blanks",
            ));
        }
        let ss = options.sector_size;
        if !(512..=4096).contains(&ss) || !ss.is_power_of_two() {
            return Err(error::sector_size(format!(
                "Invalid feature value for sector_size: {ss} (option sector_size:N needs a power of two in 512..4096)"
            )));
        }
        let step = u64::from(ss / 512);
        if len % step != 0 {
            return Err(error::misaligned(format!(
                "Device size is not multiple of sector_size feature: field <len> {len} is not a multiple of {step} sectors"
            )));
        }
        if iv_offset % step != 0 {
            return Err(error::misaligned(format!(
                "Invalid iv_offset sector: field <iv_offset> {iv_offset} is not a multiple of sector_size {ss} ({step} sectors)"
            )));
        }
        if offset % step != 0 {
            return Err(error::misaligned(format!(
                "Invalid device sector: field <offset> {offset} is not a multiple of sector_size {ss} ({step} sectors)"
            )));
        }
        cipher
            .check_key_len(key.len())
            .map_err(|e| prefix(e, "<key>"))?;
        let t = Self {
            start,
            len,
            cipher,
            key,
            iv_offset,
            device,
            offset,
            options,
            below: Vec::new(),
        };
        // Build the cipher once so every refusal (e.g. an ESSIV hash whose
        // digest is no valid key) happens at parse time, as in the kernel.
        SectorCrypt::new(&t.crypt_config())?;
        Ok(t)
    }

    /// A cipher cascade as stacked dm-crypt devices (TrueCrypt/VeraCrypt
    /// chains): `layers[0]` is the top device, the last one sits on the
    /// backing device. All layers map the same sectors (same start,
    /// length, sector size); the result takes the last layer's device and
    /// offset, since the engine reads the device once and runs the layers
    /// as one stacked cipher ([`Table::sector_crypt`],
    /// [`SectorCrypt::stacked`]). Its text ([`Table::line`]) is one line
    /// per layer, top first, each lower one marked by a leading `+` (the
    /// line `dmsetup table` shows for that layer's device): ucrypt's own
    /// spelling of a stack, which [`Targets::parse`](crate::table::Targets::parse)
    /// reads back and no dm table has.
    pub fn stacked(layers: Vec<Table>) -> Result<Self, Error> {
        let mut it = layers.into_iter();
        let Some(mut top) = it.next() else {
            return Err(error::table("A cipher cascade needs at least one layer"));
        };
        for l in it {
            if (l.start, l.len, l.options.sector_size)
                != (top.start, top.len, top.options.sector_size)
                || !l.below.is_empty()
            {
                return Err(error::table(
                    "The layers of a cipher cascade must map the same sectors with the same sector size",
                ));
            }
            top.device.clone_from(&l.device);
            top.offset = l.offset;
            top.below.push(l);
        }
        top.sector_crypt()?;
        Ok(top)
    }

    /// The cascade's lower layers, top to bottom (empty for one cipher).
    pub fn below(&self) -> &[Table] {
        &self.below
    }

    /// The [`SectorCrypt`] of this table: its cipher, or for a cascade
    /// every layer stacked.
    pub fn sector_crypt(&self) -> Result<SectorCrypt, Error> {
        let top = SectorCrypt::new(&self.crypt_config())?;
        if self.below.is_empty() {
            return Ok(top);
        }
        let mut layers = vec![top];
        for l in &self.below {
            layers.push(SectorCrypt::new(&l.crypt_config())?);
        }
        SectorCrypt::stacked(layers)
    }

    /// Overwrites the key with zeros, keeping its length (dm-crypt's
    /// `key wipe` on `luksSuspend`: the table stays, the key goes).
    pub fn wipe_key(&mut self) {
        self.key.fill(0);
        for l in &mut self.below {
            l.wipe_key();
        }
    }

    /// The raw key (empty for `cipher_null`).
    pub fn key(&self) -> &[u8] {
        &self.key
    }

    /// The line in locked memory, without a `String` copy of the key.
    /// Without `show_keys` the key is masked as zeros of the same length
    /// (as `dmsetup table` vs `dmsetup table --showkeys`).
    pub fn line(&self, show_keys: bool) -> Secret {
        let mut out = Secret::with_capacity(self.device.len() + self.key.len() * 2 + 256);
        self.write_line(show_keys, &mut out);
        out
    }

    /// Appends the line (see [`Table::line`]) to `out`.
    pub fn write_line(&self, show_keys: bool, out: &mut Secret) {
        // fmt::Write on a Secret appends in place and never fails; the
        // hex digits go in one by one.
        let _ = write!(out, "{} {} crypt {} ", self.start, self.len, self.cipher);
        if self.key.is_empty() {
            out.push(b'-');
        } else if show_keys {
            out.push_hex(&self.key);
        } else {
            for _ in 0..self.key.len() * 2 {
                out.push(b'0');
            }
        }
        let _ = write!(out, " {} {} {}", self.iv_offset, self.device, self.offset);
        let words = self.options.words();
        if !words.is_empty() {
            let _ = write!(out, " {} {}", words.len(), words.join(" "));
        }
        for l in &self.below {
            out.extend_from_slice(b"\n+");
            l.write_line(show_keys, out);
        }
    }

    /// Formats the line as a `String`. Without `show_keys` the key is
    /// masked as zeros of the same length. With `show_keys` the `String`
    /// holds the key on the ordinary heap: prefer [`Table::line`].
    pub fn format(&self, show_keys: bool) -> String {
        let line = self.line(show_keys);
        // Every part written is UTF-8 (the device is a `String`).
        line.as_str().unwrap_or_default().to_owned()
    }

    /// The [`CryptConfig`] for [`SectorCrypt::new`]. Its key is a
    /// transient heap copy, wiped when the config drops.
    pub fn crypt_config(&self) -> CryptConfig {
        CryptConfig {
            cipher: self.cipher.as_str().to_owned(),
            key: Zeroizing::new(self.key.to_vec()),
            iv_offset: self.iv_offset,
            sector_size: self.options.sector_size,
            iv_large_sectors: self.options.iv_large_sectors,
        }
    }

    /// Length of the mapping in bytes.
    pub fn len_bytes(&self) -> u64 {
        self.len.saturating_mul(512)
    }

    /// Byte offset of the encrypted data on the device.
    pub fn offset_bytes(&self) -> u64 {
        self.offset.saturating_mul(512)
    }
}

impl std::str::FromStr for Table {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self, Error> {
        Self::parse(s)
    }
}

/// Names the table field an error from the spec or key check is about.
fn prefix(e: Error, field: &str) -> Error {
    e.map_message(|m| format!("{m} (field {field})"))
}

/// Decimal u64 as the kernel's `sscanf("%llu%c")` accepts it, digits only.
fn parse_u64(s: &str, field: &str, reason: &str) -> Result<u64, Error> {
    if s.is_empty() || s.len() > 20 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return Err(error::table(format!(
            "{reason}: field <{field}> {s:?} is not a decimal number"
        )));
    }
    s.parse().map_err(|_| {
        error::table(format!(
            "{reason}: field <{field}> {s:?} does not fit in 64 bits"
        ))
    })
}

fn parse_key(s: &str, cipher: &CipherSpec) -> Result<Secret, Error> {
    if s == "-" {
        return Ok(Secret::new());
    }
    if s.starts_with(':') {
        return Err(error::unsupported(
            "Kernel keyring key references (field <key> :<size>:<type>:<desc>) are not supported yet; give the key in hex",
        ));
    }
    if cipher.subkey_sizes() == [0] {
        return Err(error::key(format!(
            "Error decoding and setting key: {} takes no key, field <key> must be \"-\"",
            cipher
        )));
    }
    if s.len() % 2 != 0 || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        // Never echo the key text.
        return Err(error::key(format!(
            "Error decoding and setting key: field <key> is not an even number of hex digits ({} characters)",
            s.len()
        )));
    }
    Secret::from_hex(s.as_bytes())
        .ok_or_else(|| error::key("Error decoding and setting key: field <key> is not valid hex"))
}

fn parse_options(rest: &[&str]) -> Result<Options, Error> {
    let mut o = Options::default();
    let Some((count, opts)) = rest.split_first() else {
        return Ok(o);
    };
    let n = parse_u64(count, "#opt_params", "Invalid number of feature args")?;
    if n > MAX_FEATURE_ARGS {
        return Err(error::table(format!(
            "Invalid number of feature args: field <#opt_params> is {n}, at most {MAX_FEATURE_ARGS}"
        )));
    }
    let n = n as usize;
    if opts.len() < n {
        return Err(error::table(format!(
            "Not enough feature arguments: field <#opt_params> says {n}, {} given",
            opts.len()
        )));
    }
    if opts.len() > n {
        return Err(error::table(format!(
            "Too many arguments: field <#opt_params> says {n} but {} follow (first extra: {:?})",
            opts.len(),
            opts[n]
        )));
    }
    for &opt in opts {
        let lower = opt.to_ascii_lowercase();
        match lower.as_str() {
            "allow_discards" => o.allow_discards = true,
            "iv_large_sectors" => o.iv_large_sectors = true,
            // The performance flags, `force_inline` included.
            _ if o.perf.set_table_word(&lower) => {}
            _ => {
                if lower.starts_with("integrity:") {
                    return Err(error::unsupported(format!(
                        "Option {opt:?}: integrity (dm-integrity tags, AEAD) is not supported yet"
                    )));
                }
                // The kernel matches "sector_size:%hu%c" case-sensitively.
                if let Some(v) = opt.strip_prefix("sector_size:") {
                    let ss = parse_u64(v, "sector_size", "Invalid feature value for sector_size")?;
                    if !(512..=4096).contains(&ss) || !ss.is_power_of_two() {
                        return Err(error::sector_size(format!(
                            "Invalid feature value for sector_size: {ss} (option {opt:?} needs a power of two in 512..4096)"
                        )));
                    }
                    o.sector_size = ss as u32;
                    continue;
                }
                return Err(error::table(format!(
                    "Invalid feature arguments: unknown option {opt:?}"
                )));
            }
        }
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    const K64: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
                       202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f";

    #[test]
    fn seed_lines_parse() {
        let t =
            Table::parse("0 8388608 crypt capi:ecb(cipher_null) - 0 /dev/ram0 0 1 force_inline")
                .unwrap();
        assert!(t.options.no_read_workqueue && t.options.no_write_workqueue);
        assert!(t.key().is_empty());
        assert_eq!(
            t.format(false),
            "0 8388608 crypt capi:ecb(cipher_null) - 0 /dev/ram0 0 2 no_read_workqueue no_write_workqueue"
        );
        let t = Table::parse(
            "0 8388608 crypt capi:ecb(cipher_null) - 0 /dev/ram0 0 1 no_read_workqueue",
        )
        .unwrap();
        assert!(t.options.no_read_workqueue && !t.options.no_write_workqueue);
        let e = Table::parse("0 8388608 crypt capi:ecb(cipher_null) - 0 /dev/ram0 0 1 turbo_mode")
            .unwrap_err();
        assert!(e.to_string().contains("turbo_mode"), "{e}");
    }

    #[test]
    fn format_masks_and_shows_keys() {
        let line = format!("0 1024 crypt aes-xts-plain64 {K64} 16 /tmp/x.img 8 3 allow_discards sector_size:4096 iv_large_sectors");
        let t = Table::parse(&line).unwrap();
        assert_eq!(t.format(true), line);
        let masked = t.format(false);
        assert!(masked.contains(&"0".repeat(128)) && !masked.contains("0102"));
        assert_eq!(Table::parse(&t.format(true)).unwrap(), t);
        assert!(!format!("{t:?}").contains("0102"));
    }

    #[test]
    fn showkeys_line_is_rendered_in_locked_memory() {
        let line = format!("0 1024 crypt aes-xts-plain64 {K64} 16 /tmp/x.img 8");
        let t = Table::parse(&line).unwrap();
        let shown = t.line(true);
        assert_eq!(shown.as_str(), Some(line.as_str()));
        // Room for the whole line up front: formatting never moved it.
        assert!(shown.capacity() >= line.len());
        let mut out = Secret::with_capacity(4096);
        let at = out.addr();
        t.write_line(true, &mut out);
        assert_eq!(out.addr(), at, "formatted in place");
        assert_eq!(&*out, line.as_bytes());
        let masked = t.line(false);
        assert!(!masked.as_str().unwrap().contains("0102"));
        assert_eq!(masked.as_str().unwrap(), t.format(false));
    }

    #[test]
    fn keys_from_a_key_file() {
        let key = Secret::from_hex(K64.as_bytes()).unwrap();
        let t = Table::parse_with_key("0 8 crypt aes-xts-plain64 - 0 /d 0", key.clone()).unwrap();
        assert_eq!(t.key(), &*key);
        assert_eq!(
            t,
            Table::parse(&format!("0 8 crypt aes-xts-plain64 {K64} 0 /d 0")).unwrap()
        );
        let e = |line: &str, k: &[u8]| {
            Table::parse_with_key(line, Secret::from_slice(k))
                .unwrap_err()
                .to_string()
        };
        let literal = e(&format!("0 8 crypt aes-xts-plain64 {K64} 0 /d 0"), &key);
        assert!(literal.contains("must be \"-\""), "{literal}");
        assert!(!literal.contains("0102"), "{literal}");
        assert!(e("0 8 crypt aes-xts-plain64 - 0 /d 0", &[1; 33]).contains("got 264 bits"));
        assert!(e("0 8 crypt capi:ecb(cipher_null) - 0 /d 0", &[1; 32]).contains("takes no key"));
        let null = Table::parse_with_key("0 8 crypt capi:ecb(cipher_null) - 0 /d 0", Secret::new());
        assert!(null.unwrap().key().is_empty());
    }

    #[test]
    fn kernel_reasons() {
        let e = |l: &str| Table::parse(l).unwrap_err().to_string();
        let base = |iv: &str, off: &str, opts: &str| {
            format!("0 1024 crypt aes-xts-plain64 {K64} {iv} /d {off}{opts}")
        };
        assert!(e(&base("1", "0", " 1 sector_size:4096")).contains("Invalid iv_offset sector"));
        assert!(e(&base("0", "3", " 1 sector_size:4096")).contains("Invalid device sector"));
        assert!(e(&base("x", "0", "")).contains("Invalid iv_offset sector"));
        assert!(e(&base("0", "-1", "")).contains("Invalid device sector"));
        assert!(e(&base("0", "0", " 1 sector_size:1000"))
            .contains("Invalid feature value for sector_size"));
        assert!(e(&base("0", "0", " 2 allow_discards")).contains("Not enough feature arguments"));
        assert!(e(&base("0", "0", " 1 integrity:28:aead")).contains("not supported yet"));
        assert!(e(&base("0", "0", " 10 a b c d e f g h i j"))
            .contains("Invalid number of feature args"));
        assert!(e("0 1024 crypt aes-xts-plain64 0011 0 /d 0")
            .contains("Error decoding and setting key"));
        assert!(
            e("0 1024 crypt aes-xts-plain64 :64:logon:foo 0 /d 0").contains("not supported yet")
        );
        assert!(e("0 1024 crypt aes-xts-plain64").contains("<key>"));
        assert!(e("0 1024 linear /dev/x 0").contains("<target>"));
        assert!(
            e("0 1023 crypt aes-xts-plain64 00 0 /d 0 1 sector_size:4096").contains("Device size")
        );
        assert!(e(&format!(
            "0 8 crypt aes:64-cbc-lmk {K64} 0 /d 0 1 sector_size:4096"
        ))
        .contains("Unsupported sector size for LMK"));
        assert!(e(&format!(
            "0 8 crypt aes-cbc-tcw {K64} 0 /d 0 1 sector_size:4096"
        ))
        .contains("Unsupported sector size for TCW"));
        assert!(Table::parse(&format!("0 8 crypt aes-cbc-tcw {K64} 1 /d 1")).is_ok());
        assert!(e(&format!("0 8 crypt aes-cbc-lmk {K64} 0 /d 0")).contains("not supported yet"));
        // Case-insensitive flags, like strcasecmp in the kernel.
        assert!(
            Table::parse(&base("0", "0", " 1 ALLOW_DISCARDS"))
                .unwrap()
                .options
                .allow_discards
        );
    }
}
