//! `FaultBackend`: error and delay injection around any backend, for tests.
//!
//! ```text
//!   caller ──► FaultBackend ── rules: kind? range? skip N? once/times/sticky?
//!                  │              ├─ delay: sleep, then go on
//!                  │              └─ error: fail with errno, inner not called
//!                  ▼
//!              inner Backend
//! ```
//!
//! Modelled on nbdkit's `error` and `delay` filters: a [`FaultRule`] selects
//! operations by kind ([`OpKinds`]) and optionally by byte range (a request
//! matches when it overlaps the range; flush has no range and matches only
//! rules without one), lets the first `skip` matching operations through,
//! then fires once, a given number of times, or on every match (sticky).
//! Firing sleeps for the rule's delay and, if it has an errno, fails the
//! operation *before* the inner backend is called, so a failed write writes
//! nothing. Rules can be added and removed while IO runs. [`OpCounts`]
//! counts what reached the inner backend, so tests can check, for example,
//! that a FUA request really arrived as a FUA write or a flush. It lends no
//! [`Direct`](crate::Direct) access, even around a ramdisk, so every byte
//! goes through the operations the rules see.

use std::fmt;
use std::io;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::{Backend, Caps, Error, ErrorKind, OpKind};

/// A set of [`OpKind`]s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpKinds(u8);

impl OpKinds {
    /// Reads.
    pub const READ: Self = Self(1);
    /// Writes.
    pub const WRITE: Self = Self(2);
    /// Flushes.
    pub const FLUSH: Self = Self(4);
    /// Discards.
    pub const DISCARD: Self = Self(8);
    /// Write-zeroes.
    pub const WRITE_ZEROES: Self = Self(16);
    /// Everything.
    pub const ALL: Self = Self(31);

    /// True if `op` is in the set.
    pub fn contains(self, op: OpKind) -> bool {
        self.0 & Self::from(op).0 != 0
    }
}

impl From<OpKind> for OpKinds {
    fn from(op: OpKind) -> Self {
        match op {
            OpKind::Read => Self::READ,
            OpKind::Write => Self::WRITE,
            OpKind::Flush => Self::FLUSH,
            OpKind::Discard => Self::DISCARD,
            OpKind::WriteZeroes => Self::WRITE_ZEROES,
        }
    }
}

impl std::ops::BitOr for OpKinds {
    type Output = Self;
    fn bitor(self, rhs: Self) -> Self {
        Self(self.0 | rhs.0)
    }
}

/// How often a rule fires once its `skip` count is used up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Trigger {
    /// The first matching operation only.
    Once,
    /// The first `n` matching operations.
    Times(u64),
    /// Every matching operation until the rule is removed.
    Sticky,
}

/// A fault: which operations, when, and what happens to them.
#[derive(Debug, Clone)]
pub struct FaultRule {
    /// Operation kinds the rule applies to.
    pub ops: OpKinds,
    /// Only operations overlapping this byte range (None = any).
    pub range: Option<Range<u64>>,
    /// Matching operations let through before the rule starts firing.
    pub skip: u64,
    /// How often it fires.
    pub trigger: Trigger,
    /// Error to fail with (e.g. `libc::EIO`); None = delay only.
    pub errno: Option<i32>,
    /// Sleep before failing or passing the operation on.
    pub delay: Option<Duration>,
}

impl FaultRule {
    /// A sticky rule failing `ops` with `errno`.
    pub fn error(ops: OpKinds, errno: i32) -> Self {
        Self {
            ops,
            range: None,
            skip: 0,
            trigger: Trigger::Sticky,
            errno: Some(errno),
            delay: None,
        }
    }

    /// A sticky rule delaying `ops` by `delay`.
    pub fn delay(ops: OpKinds, delay: Duration) -> Self {
        Self {
            ops,
            range: None,
            skip: 0,
            trigger: Trigger::Sticky,
            errno: None,
            delay: Some(delay),
        }
    }

    /// Restricts the rule to operations overlapping `range`.
    pub fn range(mut self, range: Range<u64>) -> Self {
        self.range = Some(range);
        self
    }

    /// Lets `n` matching operations through first.
    pub fn after(mut self, n: u64) -> Self {
        self.skip = n;
        self
    }

    /// Fires on the first match only.
    pub fn once(mut self) -> Self {
        self.trigger = Trigger::Once;
        self
    }

    /// Fires on the first `n` matches.
    pub fn times(mut self, n: u64) -> Self {
        self.trigger = Trigger::Times(n);
        self
    }

    /// Adds a delay to an error rule.
    pub fn with_delay(mut self, delay: Duration) -> Self {
        self.delay = Some(delay);
        self
    }

    fn matches(&self, op: OpKind, offset: u64, len: u64) -> bool {
        if !self.ops.contains(op) {
            return false;
        }
        match (&self.range, op) {
            (None, _) => true,
            (Some(_), OpKind::Flush) => false,
            (Some(r), _) => offset < r.end && r.start < offset.saturating_add(len.max(1)),
        }
    }
}

/// Identifies an installed rule for [`FaultBackend::remove_rule`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RuleId(u64);

/// Operations that reached the inner backend, and faults injected.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OpCounts {
    /// Reads passed on.
    pub reads: u64,
    /// Writes passed on (FUA included).
    pub writes: u64,
    /// Of which FUA.
    pub fua_writes: u64,
    /// Flushes passed on.
    pub flushes: u64,
    /// Discards passed on.
    pub discards: u64,
    /// Write-zeroes passed on.
    pub write_zeroes: u64,
    /// Operations failed by a rule.
    pub injected_errors: u64,
    /// Operations delayed by a rule.
    pub delayed: u64,
}

/// A backend wrapper that injects errors and delays.
pub struct FaultBackend<B: Backend> {
    inner: B,
    rules: RwLock<Vec<Arc<Installed>>>,
    next_id: AtomicU64,
    counts: [AtomicU64; 8],
}

struct Installed {
    id: u64,
    rule: FaultRule,
    matched: AtomicU64,
    fired: AtomicU64,
}

impl<B: Backend> FaultBackend<B> {
    /// Wraps `inner` with no rules (a transparent, counting pass-through).
    pub fn new(inner: B) -> Self {
        Self {
            inner,
            rules: RwLock::new(Vec::new()),
            next_id: AtomicU64::new(1),
            counts: Default::default(),
        }
    }

    /// Installs a rule; rules are evaluated in installation order.
    pub fn add_rule(&self, rule: FaultRule) -> RuleId {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let installed = Arc::new(Installed {
            id,
            rule,
            matched: AtomicU64::new(0),
            fired: AtomicU64::new(0),
        });
        self.rules
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(installed);
        RuleId(id)
    }

    /// Removes a rule; returns false if it was not installed.
    pub fn remove_rule(&self, id: RuleId) -> bool {
        let mut rules = self.rules.write().unwrap_or_else(|e| e.into_inner());
        let before = rules.len();
        rules.retain(|r| r.id != id.0);
        rules.len() != before
    }

    /// Removes every rule.
    pub fn clear_rules(&self) {
        self.rules
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }

    /// How many times a rule has fired (None if not installed).
    pub fn fired(&self, id: RuleId) -> Option<u64> {
        let rules = self.rules.read().unwrap_or_else(|e| e.into_inner());
        rules
            .iter()
            .find(|r| r.id == id.0)
            .map(|r| r.fired.load(Ordering::Relaxed))
    }

    /// Counters since creation.
    pub fn counts(&self) -> OpCounts {
        let c = |i: usize| self.counts[i].load(Ordering::Relaxed);
        OpCounts {
            reads: c(0),
            writes: c(1),
            fua_writes: c(2),
            flushes: c(3),
            discards: c(4),
            write_zeroes: c(5),
            injected_errors: c(6),
            delayed: c(7),
        }
    }

    /// The wrapped backend.
    pub fn inner(&self) -> &B {
        &self.inner
    }

    fn bump(&self, i: usize) {
        self.counts[i].fetch_add(1, Ordering::Relaxed);
    }

    /// Applies the rules to one operation: delays, then maybe an error.
    fn check(&self, op: OpKind, offset: u64, len: u64) -> io::Result<()> {
        let firing: Vec<Arc<Installed>> = {
            let rules = self.rules.read().unwrap_or_else(|e| e.into_inner());
            if rules.is_empty() {
                return Ok(());
            }
            rules
                .iter()
                .filter(|r| r.rule.matches(op, offset, len) && r.fires())
                .cloned()
                .collect()
        };
        for r in firing {
            if let Some(d) = r.rule.delay {
                self.bump(7);
                std::thread::sleep(d);
            }
            if let Some(errno) = r.rule.errno {
                self.bump(6);
                return Err(Error::new(ErrorKind::Injected { op, offset, len })
                    .with_source(io::Error::from_raw_os_error(errno))
                    .into());
            }
        }
        Ok(())
    }
}

impl Installed {
    /// Counts a match and decides whether this one fires.
    fn fires(&self) -> bool {
        let n = self.matched.fetch_add(1, Ordering::Relaxed);
        if n < self.rule.skip {
            return false;
        }
        let limit = match self.rule.trigger {
            Trigger::Once => 1,
            Trigger::Times(k) => k,
            Trigger::Sticky => u64::MAX,
        };
        self.fired
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |f| {
                (f < limit).then_some(f + 1)
            })
            .is_ok()
    }
}

impl<B: Backend> fmt::Debug for FaultBackend<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rules: Vec<FaultRule> = self
            .rules
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|r| r.rule.clone())
            .collect();
        f.debug_struct("FaultBackend")
            .field("rules", &rules)
            .field("counts", &self.counts())
            .finish()
    }
}

impl<B: Backend> Backend for FaultBackend<B> {
    fn size(&self) -> u64 {
        self.inner.size()
    }

    fn caps(&self) -> Caps {
        self.inner.caps()
    }

    fn io_path(&self) -> crate::IoPath {
        self.inner.io_path()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.check(OpKind::Read, offset, buf.len() as u64)?;
        self.bump(0);
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64, fua: bool) -> io::Result<()> {
        self.check(OpKind::Write, offset, buf.len() as u64)?;
        self.bump(1);
        if fua {
            self.bump(2);
        }
        self.inner.write_at(buf, offset, fua)
    }

    fn flush(&self) -> io::Result<()> {
        self.check(OpKind::Flush, 0, 0)?;
        self.bump(3);
        self.inner.flush()
    }

    fn discard(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(OpKind::Discard, offset, len)?;
        self.bump(4);
        self.inner.discard(offset, len)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.check(OpKind::WriteZeroes, offset, len)?;
        self.bump(5);
        self.inner.write_zeroes(offset, len)
    }

    fn completes_async(&self) -> bool {
        self.inner.completes_async()
    }

    fn reap(&self) -> usize {
        self.inner.reap()
    }

    /// The rules apply per entry on the submitting thread (a delay delays
    /// the submission); a failed entry completes there with its error, the
    /// rest go to the inner backend's `submit_async`.
    fn submit_async(&self, ops: Vec<crate::AsyncOp>) {
        let (mut pass, mut failed) = (Vec::with_capacity(ops.len()), Vec::new());
        for op in ops {
            let (kind, fua) = match op.kind {
                crate::AsyncKind::Read => (OpKind::Read, false),
                crate::AsyncKind::Write { fua } => (OpKind::Write, fua),
            };
            match self.check(kind, op.offset, op.buf.len() as u64) {
                Ok(()) => {
                    self.bump(if kind == OpKind::Read { 0 } else { 1 });
                    if fua {
                        self.bump(2);
                    }
                    pass.push(op);
                }
                Err(e) => failed.push((op, e)),
            }
        }
        // A callback panic re-raised by the inner backend must not strand
        // the failed entries.
        let mut panicked = None;
        if !pass.is_empty() {
            let inner = || self.inner.submit_async(std::mem::take(&mut pass));
            panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(inner)).err();
        }
        for (op, e) in failed {
            panicked = panicked.or(op.finish(Err(e)));
        }
        if let Some(p) = panicked {
            std::panic::resume_unwind(p);
        }
    }
}
