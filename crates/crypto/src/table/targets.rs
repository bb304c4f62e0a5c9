//! Multi-target dm tables: one mapping made of several contiguous targets,
//! each a `crypt` line ([`Table`]), a `linear` line ([`Linear`]) or a
//! `zero` line ([`Zero`]: dm-zero, as cryptsetup maps BitLocker's metadata
//! areas), as
//! `dmsetup create` reads them and `dmsetup table` prints them (one target
//! a line). cryptsetup maps a LUKS2 volume in mid-reencryption this way:
//! the new key below the reencryption point, the old one above.
//!
//! Hand-written (dm's own rules are a few comparisons). The checks follow
//! Linux `drivers/md/dm-table.c`: every target starts where the previous
//! one ends, the first at sector 0 (`dm_table_add_target`'s "Gap in
//! table", which is also what dm says of an overlap), and every target's
//! start and length are multiples of the table's logical block size, the
//! largest `sector_size` of its crypt targets
//! (`validate_hardware_logical_block_alignment`). dm allows targets on
//! different devices; ucrypt serves one backing device per mapping and
//! refuses more.
//!
//! Parsing never panics on any text; formatting keeps the key in a
//! [`Secret`] and masks it unless asked to show it, line by line exactly
//! as [`Table::line`] does.

use std::fmt::Write as _;

use super::{parse_u64, Table};
use crate::error;
use crate::{Error, Secret};

/// A `linear` target: `<start> <len> linear <device> <offset>`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Linear {
    /// First logical sector (512-byte units) of the target in the mapping.
    pub start: u64,
    /// Length in 512-byte sectors.
    pub len: u64,
    /// Backing device or file path.
    pub device: String,
    /// Where the target's data starts on the device, in 512-byte sectors.
    pub offset: u64,
}

impl Linear {
    /// Parses one `linear` line (as `linear_ctr` does: exactly two
    /// arguments after the target type).
    pub fn parse(line: &str) -> Result<Self, Error> {
        let f: Vec<&str> = line.split_ascii_whitespace().collect();
        if f.len() < 3 || f[2] != "linear" {
            return Err(error::table(
                "Not a linear target: expected <start> <len> linear <device> <offset>",
            ));
        }
        if f.len() != 5 {
            return Err(error::table(format!(
                "Invalid argument count: a linear target takes <device> <offset>, {} given",
                f.len() - 3
            )));
        }
        let start = parse_u64(f[0], "start", "Invalid start sector")?;
        let len = parse_u64(f[1], "len", "Invalid length")?;
        let offset = parse_u64(f[4], "offset", "Invalid device sector")?;
        Self::new(start, len, f[3].to_owned(), offset)
    }

    /// A linear target from values, checked as [`Linear::parse`] checks.
    pub fn new(start: u64, len: u64, device: String, offset: u64) -> Result<Self, Error> {
        if len == 0 {
            return Err(error::table("Zero-length target: field <len> is 0"));
        }
        if start.checked_add(len).is_none() || offset.checked_add(len).is_none() {
            return Err(error::table(
                "Invalid length: field <start> or <offset> + <len> overflows",
            ));
        }
        if device.is_empty() || device.chars().any(|c| c.is_whitespace()) {
            return Err(error::table(
                "Device lookup failed: field <device> is empty or has blanks",
            ));
        }
        Ok(Self {
            start,
            len,
            device,
            offset,
        })
    }

    /// The line, as `dmsetup table` prints it.
    pub fn format(&self) -> String {
        format!(
            "{} {} linear {} {}",
            self.start, self.len, self.device, self.offset
        )
    }
}

/// A `zero` target: `<start> <len> zero` (dm-zero: reads return zeros,
/// writes are accepted and dropped; no device).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Zero {
    /// First logical sector (512-byte units) of the target in the mapping.
    pub start: u64,
    /// Length in 512-byte sectors.
    pub len: u64,
}

impl Zero {
    /// Parses one `zero` line (dm-zero takes no arguments).
    pub fn parse(line: &str) -> Result<Self, Error> {
        let f: Vec<&str> = line.split_ascii_whitespace().collect();
        if f.len() < 3 || f[2] != "zero" {
            return Err(error::table(
                "Not a zero target: expected <start> <len> zero",
            ));
        }
        if f.len() != 3 {
            return Err(error::table(format!(
                "Invalid argument count: a zero target takes none, {} given",
                f.len() - 3
            )));
        }
        let start = parse_u64(f[0], "start", "Invalid start sector")?;
        let len = parse_u64(f[1], "len", "Invalid length")?;
        Self::new(start, len)
    }

    /// A zero target from values, checked as [`Zero::parse`] checks.
    pub fn new(start: u64, len: u64) -> Result<Self, Error> {
        if len == 0 {
            return Err(error::table("Zero-length target: field <len> is 0"));
        }
        if start.checked_add(len).is_none() {
            return Err(error::table(
                "Invalid length: field <start> + <len> overflows",
            ));
        }
        Ok(Self { start, len })
    }

    /// The line, as `dmsetup table` prints it.
    pub fn format(&self) -> String {
        format!("{} {} zero", self.start, self.len)
    }
}

/// One target of a mapping.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// A dm-crypt target.
    Crypt(Table),
    /// A linear (pass-through) target.
    Linear(Linear),
    /// A zero target (no device).
    Zero(Zero),
}

impl Target {
    /// First logical sector of the target.
    pub fn start(&self) -> u64 {
        match self {
            Target::Crypt(t) => t.start,
            Target::Linear(l) => l.start,
            Target::Zero(z) => z.start,
        }
    }

    /// Length in 512-byte sectors.
    // Never empty: a zero-length target is refused.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u64 {
        match self {
            Target::Crypt(t) => t.len,
            Target::Linear(l) => l.len,
            Target::Zero(z) => z.len,
        }
    }

    /// The backing device (empty for a zero target).
    pub fn device(&self) -> &str {
        match self {
            Target::Crypt(t) => &t.device,
            Target::Linear(l) => &l.device,
            Target::Zero(_) => "",
        }
    }

    /// Where the target's data starts on the device, in 512-byte sectors
    /// (0 for a zero target).
    pub fn offset(&self) -> u64 {
        match self {
            Target::Crypt(t) => t.offset,
            Target::Linear(l) => l.offset,
            Target::Zero(_) => 0,
        }
    }

    /// The encryption sector size in bytes (512 for linear and zero).
    pub fn sector_size(&self) -> u32 {
        match self {
            Target::Crypt(t) => t.options.sector_size,
            Target::Linear(_) | Target::Zero(_) => 512,
        }
    }

    /// The dm target type name (`crypt`, `linear` or `zero`).
    pub fn kind(&self) -> &'static str {
        match self {
            Target::Crypt(_) => "crypt",
            Target::Linear(_) => "linear",
            Target::Zero(_) => "zero",
        }
    }

    fn write_line(&self, show_keys: bool, out: &mut Secret) {
        match self {
            Target::Crypt(t) => t.write_line(show_keys, out),
            Target::Linear(l) => {
                let _ = write!(out, "{}", l.format());
            }
            Target::Zero(z) => {
                let _ = write!(out, "{}", z.format());
            }
        }
    }
}

/// A checked target list: contiguous from sector 0, aligned to the
/// largest sector size, all on one device. Never empty.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Targets {
    targets: Vec<Target>,
}

impl Targets {
    /// Parses a table of one or more lines (as `dmsetup create` reads a
    /// table file: one target a line; blank lines and lines starting with
    /// `#` are skipped).
    /// A one-line table's errors are the line's own (as [`Table::parse`]
    /// gives them); in a longer one they name the line.
    ///
    /// ucrypt's one extension: a crypt line starting with `+` stacks on
    /// the crypt line above as a lower layer of a cipher cascade (see
    /// [`Table::stacked`]: TrueCrypt/VeraCrypt chains, which cryptsetup
    /// maps as one dm device per cipher).
    pub fn parse(text: &str) -> Result<Self, Error> {
        let lines: Vec<(usize, &str)> = text
            .lines()
            .enumerate()
            .map(|(n, l)| (n + 1, l.trim_matches(|c: char| c.is_ascii_whitespace())))
            .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
            .collect();
        let mut targets: Vec<Target> = Vec::with_capacity(lines.len());
        let mut layers: Vec<Vec<Table>> = Vec::with_capacity(lines.len());
        let many = lines.len() > 1;
        for &(n, line) in &lines {
            if let Some(lower) = line.strip_prefix('+') {
                let t = Table::parse(lower).map_err(|e| at_line(e, n))?;
                match (targets.last(), layers.last_mut()) {
                    (Some(Target::Crypt(_)), Some(stack)) => stack.push(t),
                    _ => {
                        return Err(at_line(
                            error::table("A `+` line stacks on a crypt line, and none is above it"),
                            n,
                        ))
                    }
                }
                continue;
            }
            let kind = line.split_ascii_whitespace().nth(2).unwrap_or("");
            let t = match kind {
                "linear" => Linear::parse(line).map(Target::Linear),
                "zero" => Zero::parse(line).map(Target::Zero),
                _ => Table::parse(line).map(Target::Crypt),
            };
            targets.push(t.map_err(|e| if many { at_line(e, n) } else { e })?);
            layers.push(Vec::new());
        }
        for (t, stack) in targets.iter_mut().zip(layers) {
            if stack.is_empty() {
                continue;
            }
            if let Target::Crypt(top) = t {
                let mut all = vec![top.clone()];
                all.extend(stack);
                *top = Table::stacked(all)?;
            }
        }
        Self::new(targets)
    }

    /// Parses a table whose one crypt line has `-` as its key and takes
    /// the key from a key file (see [`Table::parse_with_key`]). Only a
    /// one-line table takes a key this way: in a longer one each crypt
    /// line carries its own key.
    pub fn parse_with_key(text: &str, key: Secret) -> Result<Self, Error> {
        let lines: Vec<&str> = text
            .lines()
            .map(|l| l.trim_matches(|c: char| c.is_ascii_whitespace()))
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .collect();
        match lines.as_slice() {
            [one] => Self::new(vec![Target::Crypt(Table::parse_with_key(one, key)?)]),
            _ => Err(error::key(format!(
                "A key file gives the key of a one-line table; this table has {} lines (give each crypt line its key)",
                lines.len()
            ))),
        }
    }

    /// Checks a list of targets (e.g. one crypt table per segment of a
    /// LUKS2 volume in reencryption) as [`Targets::parse`] does.
    pub fn new(targets: Vec<Target>) -> Result<Self, Error> {
        let Some(first) = targets.first() else {
            return Err(error::table("Table is empty: no target lines"));
        };
        // A zero target has no device: the others must share one.
        let device = targets
            .iter()
            .map(Target::device)
            .find(|d| !d.is_empty())
            .unwrap_or(first.device());
        let block = targets.iter().map(Target::sector_size).max().unwrap_or(512);
        let step = u64::from(block / 512);
        let mut next = 0u64;
        for (i, t) in targets.iter().enumerate() {
            let line = i + 1;
            if t.start() != next {
                let what = if t.start() < next {
                    "overlaps"
                } else {
                    "leaves a gap before"
                };
                return Err(error::table(format!(
                    "Gap in table: line {line} starts at sector {} but the previous target ends at {next} (it {what} it; targets must be contiguous from sector 0)",
                    t.start()
                )));
            }
            if !matches!(t, Target::Zero(_)) && t.device() != device {
                return Err(error::unsupported(format!(
                    "Targets on more than one device are not supported: line {line} uses {}, the table uses {device}",
                    t.device()
                )));
            }
            if t.start() % step != 0 || t.len() % step != 0 {
                return Err(error::misaligned(format!(
                    "Table line {line} (start sect {} len {}) not aligned to h/w logical block size {block}",
                    t.start(),
                    t.len()
                )));
            }
            // `Table`/`Linear` checked start + len fits.
            next = t.start() + t.len();
        }
        Ok(Self { targets })
    }

    /// A one-target list.
    pub fn single(table: Table) -> Self {
        Self {
            targets: vec![Target::Crypt(table)],
        }
    }

    /// The targets, in sector order.
    pub fn targets(&self) -> &[Target] {
        &self.targets
    }

    /// The crypt tables, in sector order.
    pub fn tables(&self) -> impl Iterator<Item = &Table> {
        self.targets.iter().filter_map(|t| match t {
            Target::Crypt(c) => Some(c),
            Target::Linear(_) | Target::Zero(_) => None,
        })
    }

    /// Mutable access to the crypt tables (e.g. to wipe their keys).
    pub fn tables_mut(&mut self) -> impl Iterator<Item = &mut Table> {
        self.targets.iter_mut().filter_map(|t| match t {
            Target::Crypt(c) => Some(c),
            Target::Linear(_) | Target::Zero(_) => None,
        })
    }

    /// Names `device` as every target's backing device (the caller has
    /// resolved the path the table named).
    pub fn set_device(&mut self, device: &str) {
        for t in &mut self.targets {
            match t {
                Target::Crypt(c) => c.device = device.to_owned(),
                Target::Linear(l) => l.device = device.to_owned(),
                Target::Zero(_) => {}
            }
        }
    }

    /// Wipes every crypt target's key (see [`Table::wipe_key`]).
    pub fn wipe_keys(&mut self) {
        for t in self.tables_mut() {
            t.wipe_key();
        }
    }

    /// The one crypt table when the mapping has exactly one target and it
    /// is a crypt target.
    pub fn as_single(&self) -> Option<&Table> {
        match self.targets.as_slice() {
            [Target::Crypt(t)] => Some(t),
            _ => None,
        }
    }

    /// The one crypt table, mutable (see [`Targets::as_single`]).
    pub fn as_single_mut(&mut self) -> Option<&mut Table> {
        match self.targets.as_mut_slice() {
            [Target::Crypt(t)] => Some(t),
            _ => None,
        }
    }

    /// Turns a one-crypt-target list back into its table.
    pub fn into_single(self) -> Result<Table, Self> {
        if self.as_single().is_none() {
            return Err(self);
        }
        match self.targets.into_iter().next() {
            Some(Target::Crypt(t)) => Ok(t),
            // Checked just above; rebuilt only to satisfy the match.
            Some(other) => Err(Self {
                targets: vec![other],
            }),
            None => Err(Self {
                targets: Vec::new(),
            }),
        }
    }

    /// Number of targets.
    pub fn count(&self) -> usize {
        self.targets.len()
    }

    /// The backing device every target is on (empty only when every
    /// target is a zero target).
    pub fn device(&self) -> &str {
        self.targets
            .iter()
            .map(Target::device)
            .find(|d| !d.is_empty())
            .unwrap_or_default()
    }

    /// Length of the mapping in 512-byte sectors.
    // Never empty: a table has at least one target, none of length zero.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u64 {
        self.targets.iter().map(Target::len).sum()
    }

    /// Length of the mapping in bytes.
    pub fn len_bytes(&self) -> u64 {
        self.len().saturating_mul(512)
    }

    /// The mapping's logical block size: its largest target sector size.
    pub fn sector_size(&self) -> u32 {
        self.targets
            .iter()
            .map(Target::sector_size)
            .max()
            .unwrap_or(512)
    }

    /// The first byte past the last byte any target uses on the device.
    pub fn device_end_bytes(&self) -> u64 {
        self.targets
            .iter()
            .filter(|t| !matches!(t, Target::Zero(_)))
            .map(|t| (t.offset() + t.len()).saturating_mul(512))
            .max()
            .unwrap_or(0)
    }

    /// The table in locked memory, one line per target separated by `\n`
    /// (no trailing newline). Without `show_keys` every key is masked as
    /// zeros of the same length.
    pub fn line(&self, show_keys: bool) -> Secret {
        let cap: usize = self
            .targets
            .iter()
            .map(|t| match t {
                Target::Crypt(c) => c.device.len() + c.key().len() * 2 + 256,
                Target::Linear(l) => l.device.len() + 64,
                Target::Zero(_) => 64,
            })
            .sum();
        let mut out = Secret::with_capacity(cap);
        for (i, t) in self.targets.iter().enumerate() {
            if i > 0 {
                out.push(b'\n');
            }
            t.write_line(show_keys, &mut out);
        }
        out
    }

    /// The table as a `String` (see [`Table::format`]; with `show_keys`
    /// the keys sit on the ordinary heap: prefer [`Targets::line`]).
    pub fn format(&self, show_keys: bool) -> String {
        let line = self.line(show_keys);
        line.as_str().unwrap_or_default().to_owned()
    }
}

impl From<Table> for Targets {
    fn from(t: Table) -> Self {
        Self::single(t)
    }
}

/// Prefixes a parse error with the line it is about.
fn at_line(e: Error, line: usize) -> Error {
    e.map_message(|m| format!("Table line {line}: {m}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const KA: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
                      202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f";
    const KB: &str = "f00102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
                      202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f";

    fn reenc() -> String {
        format!(
            "0 270336 crypt aes-xts-plain64 {KA} 0 /dev/x 32768 1 sector_size:4096\n\
             270336 8192 crypt aes-xts-plain64 {KB} 270336 /dev/x 302336 1 sector_size:4096\n"
        )
    }

    #[test]
    fn cryptsetups_reencryption_table_parses_and_formats_back() {
        let t = Targets::parse(&reenc()).unwrap();
        assert_eq!(t.count(), 2);
        assert_eq!(t.len(), 270336 + 8192);
        assert_eq!(t.sector_size(), 4096);
        assert_eq!(t.device(), "/dev/x");
        assert_eq!(t.format(true), reenc().trim_end());
        assert_eq!(Targets::parse(&t.format(true)).unwrap(), t);
        let masked = t.format(false);
        assert_eq!(masked.lines().count(), 2);
        assert!(
            !masked.contains("0102") && !masked.contains("f001"),
            "{masked}"
        );
        assert!(t.as_single().is_none());
    }

    #[test]
    fn linear_and_crypt_mix() {
        let text = format!(
            "# encrypting\n0 2048 crypt aes-xts-plain64 {KA} 0 /f 4096\n\n2048 2048 linear /f 2048\n"
        );
        let t = Targets::parse(&text).unwrap();
        assert_eq!(t.targets()[1].kind(), "linear");
        assert_eq!(t.device_end_bytes(), 6144 * 512);
        assert_eq!(
            t.format(false).lines().nth(1),
            Some("2048 2048 linear /f 2048")
        );
    }

    #[test]
    fn zero_targets_have_no_device() {
        let text = format!(
            "0 16 crypt aes-cbc-eboiv {} 100 /f 100\n16 16 zero\n32 8 crypt aes-cbc-eboiv {} 32 /f 32\n",
            &KA[..32],
            &KA[..32]
        );
        let t = Targets::parse(&text).unwrap();
        assert_eq!(t.targets()[1].kind(), "zero");
        assert_eq!(t.device(), "/f");
        assert_eq!(t.device_end_bytes(), 116 * 512);
        assert_eq!(t.format(false).lines().nth(1), Some("16 16 zero"));
        assert_eq!(Targets::parse(&t.format(true)).unwrap(), t);
        let e = |s: &str| Targets::parse(s).unwrap_err().to_string();
        assert!(e("0 8 zero /f").contains("takes none"));
        assert!(e("0 0 zero").contains("Zero-length"));
        let mut t = t;
        t.set_device("/g");
        assert_eq!(t.device(), "/g");
    }

    #[test]
    fn one_line_is_todays_table() {
        let line = format!("0 1024 crypt aes-xts-plain64 {KA} 16 /tmp/x.img 8");
        let t = Targets::parse(&line).unwrap();
        let single = Table::parse(&line).unwrap();
        assert_eq!(t.as_single(), Some(&single));
        assert_eq!(t.format(true), single.format(true));
        assert_eq!(t.clone().into_single().unwrap(), single);
        let key = Secret::from_hex(KA.as_bytes()).unwrap();
        let k = Targets::parse_with_key("0 8 crypt aes-xts-plain64 - 0 /d 0\n", key.clone());
        assert_eq!(k.unwrap().as_single().unwrap().key(), &*key);
        let two = "0 8 crypt aes-xts-plain64 - 0 /d 0\n8 8 crypt aes-xts-plain64 - 8 /d 8";
        let e = Targets::parse_with_key(two, key).unwrap_err().to_string();
        assert!(e.contains("one-line table"), "{e}");
    }

    #[test]
    fn dm_table_refusals() {
        let e = |s: &str| Targets::parse(s).unwrap_err().to_string();
        let c = |start: u64, len: u64, dev: &str, off: u64, opts: &str| {
            format!("{start} {len} crypt aes-xts-plain64 {KA} {start} {dev} {off}{opts}\n")
        };
        // Gap, overlap, not from 0.
        let gap = c(0, 8, "/d", 0, "") + &c(16, 8, "/d", 16, "");
        assert!(e(&gap).contains("Gap in table") && e(&gap).contains("gap"));
        let overlap = c(0, 16, "/d", 0, "") + &c(8, 8, "/d", 8, "");
        assert!(e(&overlap).contains("overlaps"), "{}", e(&overlap));
        assert!(e(&c(8, 8, "/d", 0, "")).contains("Gap in table"));
        // Two devices.
        let two = c(0, 8, "/d", 0, "") + &c(8, 8, "/e", 8, "");
        assert!(e(&two).contains("more than one device"), "{}", e(&two));
        // A 512-byte target's boundary inside a 4096-byte block.
        let mis =
            format!("0 12 linear /d 0\n12 8 crypt aes-xts-plain64 {KA} 0 /d 16 1 sector_size:4096");
        assert!(
            e(&mis).contains("not aligned to h/w logical block size 4096"),
            "{}",
            e(&mis)
        );
        // Bad lines name their line.
        let bad = c(0, 8, "/d", 0, "") + "8 8 linear /d\n";
        assert!(
            e(&bad).starts_with("Table line 2: Invalid argument count"),
            "{}",
            e(&bad)
        );
        assert!(e("").contains("empty"));
        assert!(e("# only a comment\n").contains("empty"));
        assert!(e("0 8 striped 2 /d 0").contains("<target>"));
        // One line: the line parser's own message, no line number.
        assert_eq!(
            e("0 8 crypt"),
            Table::parse("0 8 crypt").unwrap_err().to_string()
        );
    }

    #[test]
    fn crypt_tables_are_checked_in_order() {
        let a = Table::parse(&format!("0 8 crypt aes-xts-plain64 {KA} 0 /d 0")).unwrap();
        let b = Table::parse(&format!("8 8 crypt aes-xts-plain64 {KB} 8 /d 8")).unwrap();
        let crypt = |v: Vec<Table>| Targets::new(v.into_iter().map(Target::Crypt).collect());
        let t = crypt(vec![a.clone(), b.clone()]).unwrap();
        assert_eq!(t.len(), 16);
        assert!(crypt(vec![b, a]).is_err());
        assert!(crypt(vec![]).is_err());
    }

    #[test]
    fn never_panics_on_odd_text() {
        for s in [
            "\n\n",
            "0",
            "0 0 linear",
            "0 1 linear d 18446744073709551615",
            "18446744073709551615 1 linear d 0",
            "\u{0} \u{0} linear",
            "0 8 linear d 0\r\n8 8 linear d 8\r\n",
        ] {
            let _ = Targets::parse(s);
        }
        assert!(Targets::parse("0 8 linear d 0\r\n8 8 linear d 8\r\n").is_ok());
    }
}
