//! dm-crypt's performance flags: the one definition of the set and of its
//! three spellings (hand-written).
//!
//! | flag | dm table word | cryptsetup option | crypttab option |
//! |---|---|---|---|
//! | [`Flag::SameCpuCrypt`] | `same_cpu_crypt` | `--perf-same_cpu_crypt` | `same-cpu-crypt` |
//! | [`Flag::SubmitFromCryptCpus`] | `submit_from_crypt_cpus` | `--perf-submit_from_crypt_cpus` | `submit-from-crypt-cpus` |
//! | [`Flag::NoReadWorkqueue`] | `no_read_workqueue` | `--perf-no_read_workqueue` | `no-read-workqueue` |
//! | [`Flag::NoWriteWorkqueue`] | `no_write_workqueue` | `--perf-no_write_workqueue` | `no-write-workqueue` |
//! | [`Flag::HighPriority`] | `high_priority` | `--perf-high_priority` | — (systemd 252 has none) |
//!
//! The table words are what `crypt_ctr_optional()` in Linux
//! `drivers/md/dm-crypt.c` accepts and `crypt_status()` prints (in
//! [`Flag::TABLE_ORDER`]); `cryptsetup status` lists its flags in
//! [`Flag::STATUS_ORDER`].

use std::fmt;

/// One dm-crypt performance flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flag {
    /// Encrypt on the submitting CPU.
    SameCpuCrypt,
    /// Submit writes from the crypt threads.
    SubmitFromCryptCpus,
    /// Decrypt reads inline, without the kcryptd queue.
    NoReadWorkqueue,
    /// Encrypt writes inline, without the kcryptd queue.
    NoWriteWorkqueue,
    /// High-priority workqueues (dm-crypt 1.26, Linux 6.10).
    HighPriority,
}

impl Flag {
    /// The order in which the kernel's `crypt_status()` prints the flags.
    pub const TABLE_ORDER: [Flag; 5] = [
        Flag::SameCpuCrypt,
        Flag::HighPriority,
        Flag::SubmitFromCryptCpus,
        Flag::NoReadWorkqueue,
        Flag::NoWriteWorkqueue,
    ];

    /// The order in which `cryptsetup status` lists the flags.
    pub const STATUS_ORDER: [Flag; 5] = [
        Flag::SameCpuCrypt,
        Flag::SubmitFromCryptCpus,
        Flag::NoReadWorkqueue,
        Flag::NoWriteWorkqueue,
        Flag::HighPriority,
    ];

    /// The dm table word (`no_read_workqueue`).
    pub const fn table_word(self) -> &'static str {
        match self {
            Flag::SameCpuCrypt => "same_cpu_crypt",
            Flag::SubmitFromCryptCpus => "submit_from_crypt_cpus",
            Flag::NoReadWorkqueue => "no_read_workqueue",
            Flag::NoWriteWorkqueue => "no_write_workqueue",
            Flag::HighPriority => "high_priority",
        }
    }

    /// cryptsetup's long option without its dashes (`perf-no_read_workqueue`),
    /// as clap's `long` takes it.
    pub const fn cli_long(self) -> &'static str {
        match self {
            Flag::SameCpuCrypt => "perf-same_cpu_crypt",
            Flag::SubmitFromCryptCpus => "perf-submit_from_crypt_cpus",
            Flag::NoReadWorkqueue => "perf-no_read_workqueue",
            Flag::NoWriteWorkqueue => "perf-no_write_workqueue",
            Flag::HighPriority => "perf-high_priority",
        }
    }

    /// cryptsetup's option as typed (`--perf-no_read_workqueue`).
    pub fn cli_option(self) -> String {
        format!("--{}", self.cli_long())
    }

    /// The crypttab option (`no-read-workqueue`), if crypttab has one.
    pub const fn crypttab_option(self) -> Option<&'static str> {
        match self {
            Flag::SameCpuCrypt => Some("same-cpu-crypt"),
            Flag::SubmitFromCryptCpus => Some("submit-from-crypt-cpus"),
            Flag::NoReadWorkqueue => Some("no-read-workqueue"),
            Flag::NoWriteWorkqueue => Some("no-write-workqueue"),
            Flag::HighPriority => None,
        }
    }

    /// The flag a dm table word names, matched case-insensitively as the
    /// kernel matches it.
    pub fn from_table_word(word: &str) -> Option<Flag> {
        Flag::TABLE_ORDER
            .into_iter()
            .find(|f| f.table_word().eq_ignore_ascii_case(word))
    }

    /// The flag a crypttab option names (exact, as systemd matches it).
    pub fn from_crypttab_option(option: &str) -> Option<Flag> {
        Flag::TABLE_ORDER
            .into_iter()
            .find(|f| f.crypttab_option() == Some(option))
    }
}

/// A set of dm-crypt performance flags (the table line's optional
/// parameters that change how the data path runs, not what it computes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(default))]
pub struct PerfFlags {
    /// `same_cpu_crypt`
    pub same_cpu_crypt: bool,
    /// `submit_from_crypt_cpus`
    pub submit_from_crypt_cpus: bool,
    /// `no_read_workqueue`
    pub no_read_workqueue: bool,
    /// `no_write_workqueue`
    pub no_write_workqueue: bool,
    /// `high_priority` (dm-crypt 1.26, Linux 6.10): the classic pipeline's
    /// threads run at nice -20, as the kernel's `WQ_HIGHPRI` workqueues
    /// and its `dmcrypt_write` thread do.
    pub high_priority: bool,
}

impl PerfFlags {
    /// Whether `flag` is set.
    pub fn get(&self, flag: Flag) -> bool {
        match flag {
            Flag::SameCpuCrypt => self.same_cpu_crypt,
            Flag::SubmitFromCryptCpus => self.submit_from_crypt_cpus,
            Flag::NoReadWorkqueue => self.no_read_workqueue,
            Flag::NoWriteWorkqueue => self.no_write_workqueue,
            Flag::HighPriority => self.high_priority,
        }
    }

    /// Sets or clears `flag`.
    pub fn set(&mut self, flag: Flag, on: bool) {
        let f = match flag {
            Flag::SameCpuCrypt => &mut self.same_cpu_crypt,
            Flag::SubmitFromCryptCpus => &mut self.submit_from_crypt_cpus,
            Flag::NoReadWorkqueue => &mut self.no_read_workqueue,
            Flag::NoWriteWorkqueue => &mut self.no_write_workqueue,
            Flag::HighPriority => &mut self.high_priority,
        };
        *f = on;
    }

    /// Every flag set in either.
    #[must_use]
    pub fn union(self, other: PerfFlags) -> PerfFlags {
        let mut u = self;
        for f in Flag::TABLE_ORDER {
            if other.get(f) {
                u.set(f, true);
            }
        }
        u
    }

    /// The four flags that predate `high_priority` taken from `other`,
    /// `high_priority` kept.
    #[must_use]
    pub fn with_workqueue_flags_of(self, other: PerfFlags) -> PerfFlags {
        PerfFlags {
            high_priority: self.high_priority,
            ..other
        }
    }

    /// The set flags in `order`.
    pub fn flags_in(&self, order: [Flag; 5]) -> impl Iterator<Item = Flag> + '_ {
        order.into_iter().filter(|f| self.get(*f))
    }

    /// The set flags' table words in the kernel's status order.
    pub fn table_words(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.flags_in(Flag::TABLE_ORDER).map(Flag::table_word)
    }

    /// The set flags' words in `cryptsetup status`'s order.
    pub fn status_words(&self) -> impl Iterator<Item = &'static str> + '_ {
        self.flags_in(Flag::STATUS_ORDER).map(Flag::table_word)
    }

    /// Sets the flag a dm table word names; false when the word names
    /// none. The out-of-tree `force_inline` of the original
    /// workqueue-bypass patch sets both workqueue flags.
    pub fn set_table_word(&mut self, word: &str) -> bool {
        if word.eq_ignore_ascii_case("force_inline") {
            self.no_read_workqueue = true;
            self.no_write_workqueue = true;
            return true;
        }
        match Flag::from_table_word(word) {
            Some(f) => {
                self.set(f, true);
                true
            }
            None => false,
        }
    }

    /// Sets the flag a crypttab option names; false when it names none.
    pub fn set_crypttab_option(&mut self, option: &str) -> bool {
        match Flag::from_crypttab_option(option) {
            Some(f) => {
                self.set(f, true);
                true
            }
            None => false,
        }
    }
}

/// The set flags' table words, space-separated, in the kernel's order.
impl fmt::Display for PerfFlags {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, w) in self.table_words().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            f.write_str(w)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_round_trip() {
        for f in Flag::TABLE_ORDER {
            assert_eq!(Flag::from_table_word(f.table_word()), Some(f));
            assert_eq!(
                Flag::from_table_word(&f.table_word().to_ascii_uppercase()),
                Some(f)
            );
            assert_eq!(f.cli_option(), format!("--perf-{}", f.table_word()));
            if let Some(c) = f.crypttab_option() {
                assert_eq!(c, f.table_word().replace('_', "-"));
                assert_eq!(Flag::from_crypttab_option(c), Some(f));
            }
        }
        assert_eq!(Flag::from_crypttab_option("high-priority"), None);
        assert_eq!(Flag::from_table_word("allow_discards"), None);
    }

    #[test]
    fn orders_and_display() {
        let mut p = PerfFlags::default();
        assert_eq!(p.to_string(), "");
        for w in ["no_write_workqueue", "HIGH_PRIORITY", "same_cpu_crypt"] {
            assert!(p.set_table_word(w));
        }
        assert!(!p.set_table_word("sector_size:4096"));
        assert_eq!(
            p.to_string(),
            "same_cpu_crypt high_priority no_write_workqueue"
        );
        assert_eq!(
            p.status_words().collect::<Vec<_>>(),
            ["same_cpu_crypt", "no_write_workqueue", "high_priority"]
        );
        let mut q = PerfFlags::default();
        assert!(q.set_table_word("force_inline"));
        assert!(q.no_read_workqueue && q.no_write_workqueue);
        let u = p.union(q);
        assert!(u.same_cpu_crypt && u.high_priority && u.no_read_workqueue);
        let w = q.with_workqueue_flags_of(p);
        assert!(w.same_cpu_crypt && !w.high_priority && !w.no_read_workqueue);
        let mut c = PerfFlags::default();
        assert!(c.set_crypttab_option("submit-from-crypt-cpus"));
        assert!(!c.set_crypttab_option("submit_from_crypt_cpus"));
        assert!(c.submit_from_crypt_cpus);
    }
}
