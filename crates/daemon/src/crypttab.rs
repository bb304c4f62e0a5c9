//! `/etc/crypttab` as systemd's crypttab(5) reads it: one volume a line,
//! `NAME DEVICE [KEYFILE [OPTIONS]]`, `#` comments, blank lines; the
//! device as a path or `UUID=`/`PARTUUID=`/`LABEL=`/`PARTLABEL=` (their
//! `/dev/disk/by-*` links); a key file of `-` or `none` means "ask";
//! options comma-separated, `name=value` or flags. The volume types are
//! crypttab's: `luks` (the default), `plain`, `bitlk` and TrueCrypt's
//! (`tcrypt`, or implied by `tcrypt-hidden`, `tcrypt-system`,
//! `tcrypt-veracrypt`, `tcrypt-keyfile=`), whose key file field is a
//! passphrase file (its first line) and whose TrueCrypt keyfiles are
//! `tcrypt-keyfile=` options.
//!
//! [`parse`] never panics on any text: a line it cannot read is an error
//! naming the file, the line and what is wrong. Options ucrypt does not
//! know are collected in [`Entry::unknown`] for the caller to warn about,
//! as systemd-cryptsetup does ("Encountered unknown /etc/crypttab option
//! '…', ignoring."); options that only concern systemd's generator
//! (`noauto`, `nofail`, `_netdev`, `x-systemd.*`, ...) are accepted
//! silently. ucrypt's own export options are `x-ucrypt.export=`,
//! `x-ucrypt.mode=`, `x-ucrypt.listen=`, `x-ucrypt.tls-psk=`,
//! `x-ucrypt.tls-certificates=`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crypto::PerfFlags;

use crate::error::{invalid, Result};

/// The volume type crypttab names (`luks` when none is given).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Kind {
    /// `luks` (or nothing): a LUKS1 or LUKS2 header.
    #[default]
    Luks,
    /// `plain`: plain dm-crypt from `cipher=`, `size=`, `hash=`, ...
    Plain,
    /// `bitlk`: BitLocker (the key file holds the passphrase, recovery
    /// password or `.BEK` startup key).
    Bitlk,
    /// `tcrypt` and the options that imply it: TrueCrypt or VeraCrypt.
    Tcrypt,
}

/// One crypttab line, parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entry {
    /// The volume name.
    pub name: String,
    /// The device path (`UUID=` and the like resolved to their links).
    pub device: PathBuf,
    /// The key file (`None`: ask, i.e. `-`, `none` or absent).
    pub key_file: Option<PathBuf>,
    /// `luks` or `plain`.
    pub kind: Kind,
    /// `keyfile-offset=`.
    pub keyfile_offset: Option<u64>,
    /// `keyfile-size=`.
    pub keyfile_size: Option<u64>,
    /// `header=`.
    pub header: Option<PathBuf>,
    /// `discard`.
    pub discard: bool,
    /// `readonly`, `read-only`.
    pub read_only: bool,
    /// `no-read-workqueue`, `no-write-workqueue`, `same-cpu-crypt`,
    /// `submit-from-crypt-cpus` (`crypto::perf::Flag::crypttab_option`).
    pub perf: PerfFlags,
    /// `tpm2-device=`.
    pub tpm2_device: Option<String>,
    /// `tpm2-pin=`.
    pub tpm2_pin: Option<bool>,
    /// `tpm2-signature=`: the signature JSON of a signed PCR policy.
    pub tpm2_signature: Option<PathBuf>,
    /// `pkcs11-uri=`.
    pub pkcs11_uri: Option<String>,
    /// `token-timeout=`: how long to wait for the TPM2 (with
    /// `tpm2-device=`) or the PKCS#11 token (with `pkcs11-uri=`) to show
    /// up (zero: for ever).
    pub token_timeout: Option<Duration>,
    /// `try-empty-password`: an empty passphrase is tried before asking.
    pub try_empty_password: bool,
    /// `tcrypt-hidden`: the hidden volume's header.
    pub tcrypt_hidden: bool,
    /// `tcrypt-system`: the system encryption header.
    pub tcrypt_system: bool,
    /// `tcrypt-veracrypt`: VeraCrypt's KDFs too (systemd tries only
    /// TrueCrypt's without it).
    pub tcrypt_veracrypt: bool,
    /// `veracrypt-pim=` (used with `tcrypt-veracrypt` only).
    pub veracrypt_pim: Option<u32>,
    /// `tcrypt-keyfile=` (repeatable): TrueCrypt keyfiles.
    pub tcrypt_keyfiles: Vec<PathBuf>,
    /// `headless=`: never ask (no passphrase or PIN prompt).
    pub headless: bool,
    /// `tries=`.
    pub tries: Option<u32>,
    /// `timeout=` (seconds for the passphrase prompt).
    pub timeout: Option<u64>,
    /// `key-slot=`.
    pub key_slot: Option<u32>,
    /// `cipher=` (plain).
    pub cipher: Option<String>,
    /// `size=` (plain: key size in bits).
    pub key_bits: Option<u32>,
    /// `hash=` (plain).
    pub hash: Option<String>,
    /// `offset=` (plain, 512-byte sectors).
    pub offset: Option<u64>,
    /// `skip=` (plain, 512-byte sectors).
    pub skip: Option<u64>,
    /// `sector-size=` (plain).
    pub sector_size: Option<u32>,
    /// `x-ucrypt.export=`: `open --export`.
    pub export: Option<String>,
    /// `x-ucrypt.mode=`: `open --mode`.
    pub mode: Option<String>,
    /// `x-ucrypt.listen=`: `open --listen`.
    pub listen: Option<String>,
    /// `x-ucrypt.tls-psk=`: `open --tls-psk`.
    pub tls_psk: Option<PathBuf>,
    /// `x-ucrypt.tls-certificates=`: `open --tls-certificates`.
    pub tls_certificates: Option<PathBuf>,
    /// Options ucrypt does not know (to be warned about).
    pub unknown: Vec<String>,
}

/// The default file.
pub const DEFAULT_PATH: &str = "/etc/crypttab";

/// Reads `path` and returns the entry for `name`.
pub fn find(path: &Path, name: &str) -> Result<Entry> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| invalid(format!("Cannot read {}", path.display())).with_source(e))?;
    let file = path.display().to_string();
    for (i, line) in text.lines().enumerate() {
        if line.split_ascii_whitespace().next() == Some(name) {
            if let Some(e) = parse_line(line, &file, i + 1)? {
                return Ok(e);
            }
        }
    }
    Err(invalid(format!("No entry for {name} in {file}.")))
}

/// Parses crypttab `text` (named `file` in errors): every line must be
/// readable ([`find`] reads only the line of the name it looks for).
pub fn parse(text: &str, file: &str) -> Result<Vec<Entry>> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        out.extend(parse_line(line, file, i + 1)?);
    }
    Ok(out)
}

/// One line (number `n` of `file`): `None` for a blank or comment line.
fn parse_line(line: &str, file: &str, n: usize) -> Result<Option<Entry>> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let fields: Vec<&str> = line.split_ascii_whitespace().collect();
    let at = |what: String| invalid(format!("{file}:{n}: {what}"));
    if fields.len() < 2 || fields.len() > 4 {
        return Err(at(format!(
            "expected NAME DEVICE [KEYFILE [OPTIONS]], found {} fields",
            fields.len()
        )));
    }
    let mut e = Entry {
        name: fields[0].to_string(),
        device: device(fields[1]).map_err(at)?,
        ..Entry::default()
    };
    e.key_file = match fields.get(2) {
        None | Some(&"-") | Some(&"none") => None,
        Some(k) => Some(PathBuf::from(k)),
    };
    if let Some(opts) = fields.get(3) {
        for o in split_options(opts).iter().filter(|o| !o.is_empty()) {
            option(&mut e, o).map_err(at)?;
        }
    }
    Ok(Some(e))
}

/// The options field split at commas; `\,` is a comma inside a value (as
/// systemd-cryptsetup unescapes separators, e.g. in a TCTI spec:
/// `tpm2-device=swtpm:host=127.0.0.1\,port=2321`).
fn split_options(opts: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = opts.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&',') => {
                chars.next();
                cur.push(',');
            }
            ',' => out.push(std::mem::take(&mut cur)),
            c => cur.push(c),
        }
    }
    out.push(cur);
    out
}

/// `UUID=…` and its kin as `/dev/disk/by-*` links; a path as it is.
fn device(s: &str) -> std::result::Result<PathBuf, String> {
    for (tag, dir) in [
        ("UUID=", "by-uuid"),
        ("PARTUUID=", "by-partuuid"),
        ("LABEL=", "by-label"),
        ("PARTLABEL=", "by-partlabel"),
    ] {
        if let Some(v) = s.strip_prefix(tag) {
            let v = v.trim_matches('"');
            if v.is_empty() || v.contains('/') {
                return Err(format!("bad device {s}"));
            }
            return Ok(Path::new("/dev/disk").join(dir).join(v));
        }
    }
    Ok(PathBuf::from(s))
}

fn option(e: &mut Entry, o: &str) -> std::result::Result<(), String> {
    let (k, v) = match o.split_once('=') {
        Some((k, v)) => (k, Some(v)),
        None => (o, None),
    };
    fn num<T: std::str::FromStr>(k: &str, v: Option<&str>) -> std::result::Result<T, String> {
        v.and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("option {k}= needs a number"))
    }
    fn text(k: &str, v: Option<&str>) -> std::result::Result<String, String> {
        v.filter(|v| !v.is_empty())
            .map(str::to_string)
            .ok_or_else(|| format!("option {k}= needs a value"))
    }
    fn boolean(k: &str, v: Option<&str>) -> std::result::Result<bool, String> {
        match v {
            None | Some("1" | "yes" | "y" | "true" | "t" | "on") => Ok(true),
            Some("0" | "no" | "n" | "false" | "f" | "off") => Ok(false),
            Some(_) => Err(format!("option {k}= needs a boolean")),
        }
    }
    match k {
        "luks" => e.kind = Kind::Luks,
        "plain" => e.kind = Kind::Plain,
        "bitlk" => e.kind = Kind::Bitlk,
        "tcrypt" => e.kind = Kind::Tcrypt,
        "tcrypt-hidden" => {
            e.kind = Kind::Tcrypt;
            e.tcrypt_hidden = true;
        }
        "tcrypt-system" => {
            e.kind = Kind::Tcrypt;
            e.tcrypt_system = true;
        }
        "tcrypt-veracrypt" => {
            e.kind = Kind::Tcrypt;
            e.tcrypt_veracrypt = true;
        }
        "tcrypt-keyfile" => {
            let f = text(k, v)?;
            if !f.starts_with('/') {
                return Err(format!("option {k}= needs an absolute path"));
            }
            e.kind = Kind::Tcrypt;
            e.tcrypt_keyfiles.push(PathBuf::from(f));
        }
        "veracrypt-pim" => e.veracrypt_pim = Some(num(k, v)?),
        "keyfile-offset" => e.keyfile_offset = Some(num(k, v)?),
        "keyfile-size" => e.keyfile_size = Some(num(k, v)?),
        "header" => e.header = Some(PathBuf::from(text(k, v)?)),
        "discard" => e.discard = true,
        "readonly" | "read-only" => e.read_only = true,
        _ if e.perf.set_crypttab_option(k) => {}
        "tpm2-device" => e.tpm2_device = Some(text(k, v)?),
        "tpm2-pin" => e.tpm2_pin = Some(boolean(k, v)?),
        "tpm2-signature" => e.tpm2_signature = Some(PathBuf::from(text(k, v)?)),
        "pkcs11-uri" => e.pkcs11_uri = Some(text(k, v)?),
        "token-timeout" => {
            e.token_timeout = Some(span(v).ok_or("option token-timeout= needs a time span")?)
        }
        "try-empty-password" => e.try_empty_password = boolean(k, v)?,
        "headless" => e.headless = boolean(k, v)?,
        "tries" => e.tries = Some(num(k, v)?),
        "timeout" => e.timeout = Some(seconds(v).ok_or("option timeout= needs seconds")?),
        "key-slot" | "keyslot" => e.key_slot = Some(num(k, v)?),
        "cipher" => e.cipher = Some(text(k, v)?),
        "size" => e.key_bits = Some(num(k, v)?),
        "hash" => e.hash = Some(text(k, v)?),
        "offset" => e.offset = Some(num(k, v)?),
        "skip" => e.skip = Some(num(k, v)?),
        "sector-size" => e.sector_size = Some(num(k, v)?),
        "x-ucrypt.export" => e.export = Some(text(k, v)?),
        "x-ucrypt.mode" => e.mode = Some(text(k, v)?),
        "x-ucrypt.listen" => e.listen = Some(text(k, v)?),
        "x-ucrypt.tls-psk" => e.tls_psk = Some(PathBuf::from(text(k, v)?)),
        "x-ucrypt.tls-certificates" => e.tls_certificates = Some(PathBuf::from(text(k, v)?)),
        // For systemd's generator and fstab-like tools, not for unlocking.
        "noauto" | "auto" | "nofail" | "_netdev" | "force" | "swap" | "tmp" | "noearly"
        | "verify" => {}
        _ if k.starts_with("x-systemd.") || k.starts_with("x-initrd.") => {}
        _ => e.unknown.push(o.to_string()),
    }
    Ok(())
}

/// systemd's time spans as crypttab takes them: `N` (seconds), `Nms`,
/// `Ns`, `Nmin`, `Nh`.
fn span(v: Option<&str>) -> Option<Duration> {
    let v = v?;
    for (unit, ms) in [("ms", 1), ("min", 60_000), ("s", 1000), ("h", 3_600_000)] {
        if let Some(n) = v.strip_suffix(unit) {
            return Some(Duration::from_millis(
                n.parse::<u64>().ok()?.checked_mul(ms)?,
            ));
        }
    }
    Some(Duration::from_secs(v.parse().ok()?))
}

/// systemd's time spans as crypttab takes them: `N`, `Ns`, `Nmin`.
fn seconds(v: Option<&str>) -> Option<u64> {
    let v = v?;
    if let Some(n) = v.strip_suffix("min") {
        return n.parse::<u64>().ok()?.checked_mul(60);
    }
    v.strip_suffix('s').unwrap_or(v).parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_option() {
        let t = "# comment\n\n\
            data UUID=1234-abcd /etc/keys/data.key luks,keyfile-offset=16,keyfile-size=32,header=/h.img,discard,readonly,no-read-workqueue,no-write-workqueue,same-cpu-crypt,submit-from-crypt-cpus,tpm2-device=auto,tpm2-pin=yes,tpm2-signature=/run/s.json,pkcs11-uri=auto,token-timeout=30,try-empty-password,headless=true,tries=5,timeout=2min,key-slot=1,x-ucrypt.export=fuse=/mnt/x,x-ucrypt.mode=classic,nofail,x-systemd.device-timeout=0,frobnicate\n\
            swap /dev/sdb2 /dev/urandom plain,cipher=aes-xts-plain64,size=512,hash=sha256,offset=8,skip=4,sector-size=4096,read-only\n\
            home PARTUUID=\"0f-1\" -\n";
        let v = parse(t, "ct").unwrap();
        assert_eq!(v.len(), 3);
        let d = &v[0];
        assert_eq!(d.device, Path::new("/dev/disk/by-uuid/1234-abcd"));
        assert_eq!(d.key_file.as_deref(), Some(Path::new("/etc/keys/data.key")));
        assert_eq!((d.keyfile_offset, d.keyfile_size), (Some(16), Some(32)));
        assert_eq!(d.header.as_deref(), Some(Path::new("/h.img")));
        assert!(d.discard && d.read_only && d.perf.no_read_workqueue && d.perf.no_write_workqueue);
        assert!(d.perf.same_cpu_crypt && d.perf.submit_from_crypt_cpus && d.headless);
        assert_eq!(d.tpm2_device.as_deref(), Some("auto"));
        assert_eq!(d.tpm2_pin, Some(true));
        assert_eq!(d.tpm2_signature.as_deref(), Some(Path::new("/run/s.json")));
        let esc = parse(
            "a /dev/x - tpm2-device=swtpm:host=h\\,port=1,headless\n",
            "ct",
        )
        .unwrap();
        assert_eq!(esc[0].tpm2_device.as_deref(), Some("swtpm:host=h,port=1"));
        assert!(esc[0].headless);
        assert_eq!(d.pkcs11_uri.as_deref(), Some("auto"));
        assert_eq!(d.token_timeout, Some(Duration::from_secs(30)));
        assert!(d.try_empty_password);
        assert_eq!(
            (d.tries, d.timeout, d.key_slot),
            (Some(5), Some(120), Some(1))
        );
        assert_eq!(d.export.as_deref(), Some("fuse=/mnt/x"));
        assert_eq!(d.mode.as_deref(), Some("classic"));
        assert_eq!(d.unknown, vec!["frobnicate".to_string()]);
        let s = &v[1];
        assert_eq!(s.kind, Kind::Plain);
        assert_eq!(s.cipher.as_deref(), Some("aes-xts-plain64"));
        assert_eq!(
            (s.key_bits, s.offset, s.skip, s.sector_size),
            (Some(512), Some(8), Some(4), Some(4096))
        );
        assert!(s.read_only);
        assert_eq!(v[2].device, Path::new("/dev/disk/by-partuuid/0f-1"));
        assert_eq!(v[2].key_file, None);
    }

    #[test]
    fn bad_lines_say_where_and_what() {
        for (t, what) in [
            ("onlyname\n", "ct:1: expected NAME DEVICE"),
            ("# c\na b c d e\n", "ct:2: expected"),
            (
                "a /dev/x - tries=many\n",
                "ct:1: option tries= needs a number",
            ),
            ("a /dev/x - header=\n", "option header= needs a value"),
            ("a UUID= -\n", "bad device"),
            ("a /dev/x - tcrypt-keyfile=k\n", "needs an absolute path"),
            (
                "a /dev/x - veracrypt-pim=x\n",
                "veracrypt-pim= needs a number",
            ),
            ("a /dev/x - token-timeout=soon\n", "needs a time span"),
            ("a /dev/x - headless=maybe\n", "needs a boolean"),
        ] {
            let e = parse(t, "ct").unwrap_err().to_string();
            assert!(e.contains(what), "{t:?}: {e}");
        }
    }

    #[test]
    fn foreign_types_and_their_options() {
        let t = "win /dev/sdc1 /etc/bek/win.BEK bitlk,discard\n\
            tc /dev/sdd /etc/tc.pass tcrypt,tcrypt-keyfile=/k/1,tcrypt-keyfile=/k/2\n\
            hid /dev/sdd - tcrypt-hidden\n\
            sys /dev/sde /dev/null tcrypt-system,token-timeout=0\n\
            vc /dev/sdf /p tcrypt-veracrypt,veracrypt-pim=485,token-timeout=1500ms\n\
            l /dev/sdg - try-empty-password=no,token-timeout=2min\n";
        let v = parse(t, "ct").unwrap();
        assert_eq!(v[0].kind, Kind::Bitlk);
        assert!(v[0].discard);
        assert_eq!(
            v[0].key_file.as_deref(),
            Some(Path::new("/etc/bek/win.BEK"))
        );
        assert_eq!(v[1].kind, Kind::Tcrypt);
        assert_eq!(
            v[1].tcrypt_keyfiles,
            vec![PathBuf::from("/k/1"), PathBuf::from("/k/2")]
        );
        assert!(!v[1].tcrypt_veracrypt && !v[1].tcrypt_hidden);
        assert_eq!((v[2].kind, v[2].tcrypt_hidden), (Kind::Tcrypt, true));
        assert_eq!((v[3].kind, v[3].tcrypt_system), (Kind::Tcrypt, true));
        assert_eq!(v[3].token_timeout, Some(Duration::ZERO));
        assert_eq!((v[4].kind, v[4].tcrypt_veracrypt), (Kind::Tcrypt, true));
        assert_eq!(v[4].veracrypt_pim, Some(485));
        assert_eq!(v[4].token_timeout, Some(Duration::from_millis(1500)));
        assert_eq!(v[5].kind, Kind::Luks);
        assert!(!v[5].try_empty_password);
        assert_eq!(v[5].token_timeout, Some(Duration::from_secs(120)));
        assert!(v.iter().all(|e| e.unknown.is_empty()));
    }

    #[test]
    fn random_text_never_panics() {
        let mut rng = testutil::Rng::new(7);
        let alphabet = b"ab=,- \n#UUID=/x-ucrypt.export0123456789";
        for _ in 0..3000 {
            let len = rng.below_usize(120);
            let t: String = (0..len)
                .map(|_| alphabet[rng.below_usize(alphabet.len())] as char)
                .collect();
            let _ = parse(&t, "ct");
        }
        let _ = parse(&String::from_utf8_lossy(&rng.bytes(500)), "ct");
    }
}
