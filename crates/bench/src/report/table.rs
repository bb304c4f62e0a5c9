//! The readable table (headline per workload shape, crypto speeds, one
//! line per sweep target and direction) and the CSV of every cell.

use std::fmt::Write as _;

use super::{fmt_bs, CellResult, Phase, Report};
use crate::stats;
use crate::target::Mode;
use crate::CryptoSpeed;

fn opt(v: Option<f64>, prec: usize, suffix: &str) -> String {
    match v {
        Some(x) if x.is_finite() => format!("{x:.prec$}{suffix}"),
        Some(_) => "inf".into(),
        None => "-".into(),
    }
}

impl Report {
    /// The readable table: the headline first (like the seeds' tables),
    /// then the crypto speeds, then a one-line summary per heatmap.
    pub fn table(&self) -> String {
        let mut s = String::new();
        let head: Vec<&CellResult> = self
            .cells
            .iter()
            .filter(|c| c.phase == Phase::Headline)
            .collect();
        let o = &self.options;
        let _ = write!(
            s,
            "ucrypt bench ({}, {}), {} MiB {}",
            self.via,
            o.profile,
            o.size_bytes >> 20,
            if self.via.contains("rbd") {
                "RBD images"
            } else if self.via == "file" {
                "file"
            } else if self.storage.is_some() {
                "images (see storage)"
            } else {
                "ramdisk"
            }
        );
        if head.is_empty() {
            let _ = writeln!(s);
        } else {
            let _ = writeln!(s, ", median of {} x {} ms", o.reps, o.runtime_ms);
        }
        let _ = writeln!(s, "machine: {}", self.machine.describe());
        if let Some(storage) = &self.storage {
            let _ = writeln!(s, "storage: {storage}");
        }
        let mut workloads: Vec<(u32, usize, usize)> = Vec::new();
        for c in &head {
            if !workloads.contains(&(c.bs, c.qd, c.jobs)) {
                workloads.push((c.bs, c.qd, c.jobs));
            }
        }
        for (bs, qd, jobs) in workloads {
            let head: Vec<&CellResult> = head
                .iter()
                .copied()
                .filter(|c| (c.bs, c.qd, c.jobs) == (bs, qd, jobs))
                .collect();
            let _ = writeln!(s);
            let _ = writeln!(
                s,
                "{} {}, QD{qd}, {jobs} job{}:",
                fmt_bs(bs),
                if head.iter().any(|c| c.rw.is_random()) {
                    "random"
                } else {
                    "sequential"
                },
                if jobs == 1 { "" } else { "s" }
            );
            // --via file: raw is fio's io_uring engine on the file.
            let raw = if self.via == "file" { "% fio" } else { "% raw" };
            head_table(&mut s, &head, raw);
            bounds_lines(&mut s, &head);
        }
        let crypto4k: Vec<&CryptoSpeed> = self.crypto.iter().filter(|c| c.bs == 4096).collect();
        if !crypto4k.is_empty() {
            let _ = writeln!(s);
            for c in crypto4k {
                let _ = writeln!(
                    s,
                    "crypto c (1 thread, 4k): {:<22} encrypt {:>9} MiB/s  decrypt {:>9} MiB/s",
                    c.cipher,
                    opt(Some(c.encrypt_mib_s), 0, ""),
                    opt(Some(c.decrypt_mib_s), 0, "")
                );
            }
            let _ = if super::io_target(&self.cells) == super::DISK_TARGET {
                writeln!(
                    s,
                    "bound = io·c/(io+c) (serial: each byte read, then decrypted), ceiling = \
                     min(io, {} cores·c); io = disk's MiB/s (fio's io_uring engine on a plain \
                     file of the same storage) in the same cell",
                    self.machine.cpus
                )
            } else {
                writeln!(
                    s,
                    "bound = io·c/(io+c), io = raw's MiB/s in the same cell (seed 002)"
                )
            };
        }
        let ratios = super::ratios::table(self);
        if !ratios.is_empty() {
            let _ = writeln!(s);
            s.push_str(&ratios);
        }
        for c in head.iter().filter(|c| c.error.is_some()) {
            let _ = writeln!(
                s,
                "error: {} {}: {} failed request(s): {}",
                c.target,
                c.rw.name(),
                c.errors,
                c.error.as_deref().unwrap_or("")
            );
        }
        for k in &self.skipped {
            let _ = writeln!(s, "skipped: {}: {}", k.target, k.reason);
        }
        let sweep: Vec<&CellResult> = self
            .cells
            .iter()
            .filter(|c| c.phase == Phase::Sweep)
            .collect();
        if !sweep.is_empty() {
            let _ = writeln!(s);
            let _ = writeln!(
                s,
                "sweep: {} cells (bs {} × QD {:?} × jobs {:?} × {}), median of {} × {} ms; % of classic (min / median / max):",
                sweep.len(),
                o.bs.iter().map(|&b| fmt_bs(b)).collect::<Vec<_>>().join(","),
                o.qd,
                o.jobs,
                o.rw.iter().map(|r| r.name()).collect::<Vec<_>>().join(","),
                o.sweep_reps,
                o.sweep_runtime_ms
            );
            let mut names: Vec<&str> = Vec::new();
            for c in &sweep {
                if c.pct_classic.is_some()
                    && c.mode != Some(Mode::Classic)
                    && !names.contains(&c.target.as_str())
                {
                    names.push(&c.target);
                }
            }
            for name in names {
                for &rw in &o.rw {
                    let v: Vec<&&CellResult> = sweep
                        .iter()
                        .filter(|c| c.target == name && c.rw == rw && c.pct_classic.is_some())
                        .collect();
                    let p: Vec<f64> = v.iter().filter_map(|c| c.pct_classic).collect();
                    let (Some(min), Some(max)) = (
                        v.iter().min_by(|a, b| {
                            a.pct_classic
                                .unwrap_or(0.0)
                                .total_cmp(&b.pct_classic.unwrap_or(0.0))
                        }),
                        v.iter().max_by(|a, b| {
                            a.pct_classic
                                .unwrap_or(0.0)
                                .total_cmp(&b.pct_classic.unwrap_or(0.0))
                        }),
                    ) else {
                        continue;
                    };
                    let at = |c: &CellResult| format!("{} QD{} j{}", fmt_bs(c.bs), c.qd, c.jobs);
                    let _ = writeln!(
                        s,
                        "  {:<16} {:<9} {:>4.0}% ({})  {:>4.0}%  {:>4.0}% ({})",
                        name,
                        rw.name(),
                        min.pct_classic.unwrap_or(0.0),
                        at(min),
                        stats::median(&p).unwrap_or(0.0),
                        max.pct_classic.unwrap_or(0.0),
                        at(max)
                    );
                }
            }
        }
        let verdict = super::verdict::table(self);
        if !verdict.is_empty() {
            let _ = writeln!(s);
            s.push_str(&verdict);
        }
        let device = super::device::table(self);
        if !device.is_empty() {
            let _ = writeln!(s);
            s.push_str(&device);
        }
        if o.profile == "grid" {
            let grid = super::grid::table(self);
            if !grid.is_empty() {
                let _ = writeln!(s);
                s.push_str(&grid);
            }
        }
        s
    }

    /// CSV of every cell (one header line).
    pub fn csv(&self) -> String {
        let mut s = String::from(
            "phase,target,cipher,mode,rw,bs,qd,jobs,reps,mib_s,mib_s_min,mib_s_max,spread_pct,mb_s,iops,\
             p50_us,p99_us,p999_us,cpu_s_per_gib,errors,pct_raw,bound_mib_s,pct_bound,pct_classic\n",
        );
        let f = |v: Option<f64>| v.map_or(String::new(), |x| format!("{x:.3}"));
        for c in &self.cells {
            let phase = match c.phase {
                Phase::Headline => "headline",
                Phase::Sweep => "sweep",
            };
            let _ = writeln!(
                s,
                "{phase},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                c.target,
                c.cipher.map_or("", |c| c.spec()).replace(',', ";"),
                c.mode.map_or("", Mode::name),
                c.rw.name(),
                c.bs,
                c.qd,
                c.jobs,
                c.reps,
                f(c.mib()),
                f(c.mib_s.map(|m| m.min)),
                f(c.mib_s.map(|m| m.max)),
                f(c.mib_s.map(|m| m.spread_pct)),
                f(c.mib().map(stats::mib_to_mb)),
                f(c.iops),
                f(c.lat_us.map(|l| l.p50)),
                f(c.lat_us.map(|l| l.p99)),
                f(c.lat_us.map(|l| l.p999)),
                f(c.cpu_s_per_gib),
                c.errors,
                f(c.pct_raw),
                f(c.bound_mib_s),
                f(c.pct_bound),
                f(c.pct_classic),
            );
        }
        s
    }
}

/// The headline rows of one shape; `raw` labels the % raw columns.
/// Under a headline table with a `disk` row: per direction, the io the
/// bound used, and each cipher's bound and ceiling.
fn bounds_lines(s: &mut String, head: &[&CellResult]) {
    for write in [false, true] {
        let io = head
            .iter()
            .find(|c| c.target == super::DISK_TARGET && c.rw.is_write() == write)
            .and_then(|c| c.mib());
        let Some(io) = io else { continue };
        let mut seen: Vec<String> = Vec::new();
        for c in head.iter().filter(|c| c.rw.is_write() == write) {
            let (Some(cipher), Some(b), Some(top)) = (c.cipher, c.bound_mib_s, c.ceiling_mib_s)
            else {
                continue;
            };
            if seen.contains(&cipher.spec().to_string()) {
                continue;
            }
            seen.push(cipher.spec().to_string());
            let _ = writeln!(
                s,
                "  {}: io {io:.1} MiB/s (disk), {}: bound {b:.1}, ceiling {top:.1} MiB/s",
                if write { "writes" } else { "reads" },
                cipher.spec()
            );
        }
    }
}

fn head_table(s: &mut String, head: &[&CellResult], raw: &str) {
    // Wide enough for the longest name (24 for the usual targets).
    let tw = head
        .iter()
        .map(|c| c.target.len())
        .max()
        .unwrap_or(0)
        .max(24);
    let _ = writeln!(
        s,
        "{:<tw$} {:>10} {:>11} {:>7} {:>7} {:>8} {:>8} {:>9} {:>9} {:>6} {:>6}",
        "target",
        "read MiB/s",
        "write MiB/s",
        "read",
        "write",
        "read",
        "write",
        "read p50",
        "write p50",
        "read",
        "write"
    );
    // The disk's request sizes (`--via file` on a block device) after.
    let disk = head.iter().any(|c| c.disk_kib_per_req.is_some());
    if disk {
        s.pop();
        let _ = writeln!(s, " {:>8} {:>8}", "disk rd", "disk wr");
    }
    let _ = write!(
        s,
        "{:<tw$} {:>10} {:>11} {:>7} {:>7} {:>8} {:>8} {:>9} {:>9} {:>6} {:>6}",
        "", "", "", raw, raw, "% bound", "% bound", "µs", "µs", "±%", "±%"
    );
    let _ = if disk {
        writeln!(s, " {:>8} {:>8}", "KiB/req", "KiB/req")
    } else {
        writeln!(s)
    };
    let mut names: Vec<&str> = Vec::new();
    for c in head {
        if !names.contains(&c.target.as_str()) {
            names.push(&c.target);
        }
    }
    for name in names {
        // Reads in the read columns, writes in the write ones, whether
        // sequential or random (the headline has one of each).
        let get = |write: bool| {
            head.iter()
                .find(|c| c.target == name && c.rw.is_write() == write)
                .copied()
        };
        let (r, w) = (get(false), get(true));
        let f = |c: Option<&CellResult>,
                 g: &dyn Fn(&CellResult) -> Option<f64>,
                 p: usize,
                 suf: &str| opt(c.and_then(g), p, suf);
        let tput = |c: Option<&CellResult>| match c {
            Some(c) if c.mib_s.is_none() => "error".to_string(),
            _ => f(c, &CellResult::mib, 1, ""),
        };
        let _ = writeln!(
            s,
            "{:<tw$} {:>10} {:>11} {:>7} {:>7} {:>8} {:>8} {:>9} {:>9} {:>6} {:>6}",
            name,
            tput(r),
            tput(w),
            f(r, &|c| c.pct_raw, 0, "%"),
            f(w, &|c| c.pct_raw, 0, "%"),
            f(r, &|c| c.pct_bound, 0, "%"),
            f(w, &|c| c.pct_bound, 0, "%"),
            f(r, &|c| c.lat_us.map(|l| l.p50), 1, ""),
            f(w, &|c| c.lat_us.map(|l| l.p50), 1, ""),
            f(r, &|c| c.mib_s.map(|m| m.spread_pct), 0, ""),
            f(w, &|c| c.mib_s.map(|m| m.spread_pct), 0, ""),
        );
        if disk {
            // Reads per request of the read cell, writes of the write one.
            s.pop();
            let _ = writeln!(
                s,
                " {:>8} {:>8}",
                f(r, &|c| c.disk_kib_per_req.and_then(|d| d.read_kib), 0, ""),
                f(w, &|c| c.disk_kib_per_req.and_then(|d| d.write_kib), 0, ""),
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bs_names() {
        assert_eq!(fmt_bs(4096), "4k");
        assert_eq!(fmt_bs(4 << 20), "4M");
        assert_eq!(fmt_bs(1536), "1536");
    }
}
