//! `bitlkDump`'s text, line for line as cryptsetup 2.6.1 prints it
//! (`BITLK_dump`), and the `--dump-volume-key` form.
//!
//! The creation time is printed as cryptsetup's `ctime` prints it: in the
//! local time zone (`TZ`, else `/etc/localtime`), whose offset at that
//! time comes from the C library's `localtime_r`.

use std::fmt::Write as _;

use crate::metadata::{Metadata, FVE_METADATA_SIZE};

/// `ctime`'s format, `Thu Jul  4 07:01:55 2019`, of Unix time `t` in UTC.
fn ctime_utc(t: i64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let days = t.div_euclid(86_400);
    let secs = t.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{} {} {:2} {:02}:{:02}:{:02} {}",
        DAYS[days.rem_euclid(7) as usize],
        MONTHS[(month - 1) as usize],
        day,
        secs / 3600,
        secs / 60 % 60,
        secs % 60,
        year
    )
}

/// `ctime`'s text of Unix time `t` in the local time zone.
fn ctime_local(t: i64) -> String {
    ctime_utc(t.saturating_add(local_offset(t)))
}

/// The local time zone's offset from UTC at `t`, in seconds (0 if the C
/// library cannot tell).
fn local_offset(t: i64) -> i64 {
    // time_t is 64 bits on every target ucrypt builds for.
    let tt = t as libc::time_t;
    let mut tm = std::mem::MaybeUninit::<libc::tm>::zeroed();
    // SAFETY: `localtime_r` reads `tt` and writes only the `tm` it is
    // given, both live locals here, and is the reentrant form (no shared
    // buffer); glibc's reads TZ and the zone files on first use.
    let r = unsafe { libc::localtime_r(&tt, tm.as_mut_ptr()) };
    if r.is_null() {
        return 0;
    }
    // SAFETY: `tm` started zeroed (a valid `libc::tm`: integers and a
    // null zone pointer) and `localtime_r` succeeded in filling it.
    let tm = unsafe { tm.assume_init() };
    tm.tm_gmtoff
}

impl Metadata {
    /// The `bitlkDump` text for the device `path`.
    pub fn dump(&self, path: &str) -> String {
        let mut o = String::new();
        let togo = if self.togo { " To Go" } else { "" };
        let _ = writeln!(o, "Info for BITLK{togo} device {path}.");
        let _ = writeln!(o, "Version:      \t{}", self.metadata_version);
        let _ = writeln!(o, "GUID:         \t{}", self.guid);
        let _ = writeln!(o, "Sector size:  \t{} [bytes]", self.sector_size);
        let _ = writeln!(o, "Volume size:  \t{} [bytes]", self.volume_size);
        let _ = writeln!(o, "Created:      \t{}", ctime_local(self.creation_time));
        let desc = self.description.as_deref().unwrap_or("(null)");
        let _ = writeln!(o, "Description:  \t{desc}");
        let _ = writeln!(o, "Cipher name:  \t{}", self.cipher);
        let _ = writeln!(o, "Cipher mode:  \t{}", self.cipher_mode);
        let _ = writeln!(o, "Cipher key:   \t{} bits", self.key_bits);
        let _ = writeln!(o);
        let _ = writeln!(o, "Keyslots:");
        for (i, v) in self.vmks.iter().enumerate() {
            let _ = writeln!(o, " {i}: VMK");
            if let Some(n) = &v.name {
                let _ = writeln!(o, "\tName:       \t{n}");
            }
            let _ = writeln!(o, "\tGUID:       \t{}", v.guid);
            let _ = writeln!(o, "\tProtection: \t{}", v.protection.describe());
            let salt: String = v.salt.iter().map(|b| format!("{b:02x}")).collect();
            let _ = writeln!(o, "\tSalt:       \t{salt}");
            for n in v.key_sizes() {
                let _ = writeln!(o, "\tKey data size:\t{n} [bytes]");
            }
        }
        let _ = writeln!(o, " {}: FVEK", self.vmks.len());
        let _ = writeln!(
            o,
            "\tKey data size:\t{} [bytes]",
            self.fvek_size().unwrap_or(0)
        );
        let _ = writeln!(o);
        let _ = writeln!(o, "Metadata segments:");
        for (i, off) in self.metadata_offsets.iter().enumerate() {
            let _ = writeln!(o, " {i}: FVE metadata area");
            let _ = writeln!(o, "\tOffset: \t{off} [bytes]");
            let _ = writeln!(o, "\tSize:   \t{FVE_METADATA_SIZE} [bytes]");
        }
        let _ = writeln!(o, " 3: Volume header");
        let _ = writeln!(o, "\tOffset: \t{} [bytes]", self.volume_header_offset);
        let _ = writeln!(o, "\tSize:   \t{} [bytes]", self.volume_header_size);
        let _ = writeln!(o, "\tCipher: \t{}", self.cipher_spec());
        o
    }

    /// `bitlkDump --dump-volume-key`'s text for the device `path` and the
    /// volume key `key` (cryptsetup's layout: 16 bytes a line), or, when
    /// the key went to `--volume-key-file` `stored_in`, the line saying so.
    pub fn dump_volume_key(
        &self,
        path: &str,
        key: &[u8],
        stored_in: Option<&str>,
    ) -> crypto::Secret {
        let mut o = crypto::Secret::with_capacity(256 + key.len() * 4);
        let head = format!(
            "BITLK header information for {path}\nCipher name:   \t{}\nCipher mode:   \t{}\nUUID:          \t{}\nMK bits:       \t{}\n",
            self.cipher,
            self.cipher_mode,
            self.guid,
            key.len() * 8
        );
        o.extend_from_slice(head.as_bytes());
        if let Some(file) = stored_in {
            o.extend_from_slice(format!("Key stored to file {file}.\n").as_bytes());
            return o;
        }
        o.extend_from_slice(b"MK dump:\t");
        for (i, b) in key.iter().enumerate() {
            if i > 0 && i % 16 == 0 {
                o.extend_from_slice(b"\n\t\t");
            }
            o.push_hex(&[*b]);
            o.push(b' ');
        }
        o.push(b'\n');
        o
    }
}

#[cfg(test)]
mod tests {
    use super::ctime_utc;

    #[test]
    fn ctime_matches_c() {
        assert_eq!(ctime_utc(1_562_223_715), "Thu Jul  4 07:01:55 2019");
        assert_eq!(ctime_utc(0), "Thu Jan  1 00:00:00 1970");
        assert_eq!(ctime_utc(951_782_400), "Tue Feb 29 00:00:00 2000");
    }
}
