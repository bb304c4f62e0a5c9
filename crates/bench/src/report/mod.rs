//! Results: derived ratios (% of raw, of the bound, of classic) over the
//! records of [`crate::record`] (re-exported here), and the files of a run
//! ([`table`] renders the text and CSV, [`grid`] the grid profile's table,
//! [`crate::heatmap`] the pictures).

pub mod device;
pub mod grid;
pub mod ratios;
pub mod table;
pub mod verdict;

use std::path::{Path, PathBuf};

use crate::stats;
use crate::{CryptoSpeed, Error};

pub use crate::record::{
    CellResult, Machine, OptionsRecord, Phase, Report, Skipped, DISK_TARGET, SCHEMA_VERSION,
};
pub use crate::stats::fmt_bs;

/// A figure for a table cell: whole MiB/s, or `-` when not measured.
pub(crate) fn num(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |x| format!("{x:.0}"))
}

/// The cells of `report`'s sweep phase (the grid and verdict tables).
pub(crate) fn sweep_cells(report: &Report) -> Vec<&CellResult> {
    report
        .cells
        .iter()
        .filter(|c| c.phase == Phase::Sweep)
        .collect()
}

/// The target whose MiB/s is the bound's `io`: `disk` (fio's io_uring
/// engine on a plain file of the storage under `--dir`) when the run has
/// it, else `raw` (the unencrypted server).
pub fn io_target(cells: &[CellResult]) -> &'static str {
    if cells.iter().any(|c| c.target == DISK_TARGET) {
        DISK_TARGET
    } else {
        "raw"
    }
}

/// Fills `pct_raw`, `bound_mib_s`, `ceiling_mib_s` (with `cores` CPUs),
/// `pct_bound` and `pct_classic` from the other cells of the same workload.
pub fn derive(cells: &mut [CellResult], crypto: &[CryptoSpeed], cores: usize) {
    let snapshot: Vec<CellResult> = cells.to_vec();
    let io_name = io_target(&snapshot);
    for (i, c) in snapshot.iter().enumerate() {
        let Some(mine) = c.mib() else { continue };
        let peer = |pred: &dyn Fn(&CellResult) -> bool| {
            snapshot
                .iter()
                .find(|o| o.same_workload(c) && pred(o))
                .and_then(CellResult::mib)
        };
        let out = &mut cells[i];
        let raw = peer(&|o| o.target == "raw");
        if let Some(raw) = raw {
            out.pct_raw = stats::percent(mine, raw);
        }
        let io = peer(&|o| o.target == io_name);
        if let (Some(cipher), Some(io)) = (c.cipher, io) {
            let speed = crypto
                .iter()
                .find(|s| s.cipher == cipher.spec() && s.bs == c.bs);
            if let Some(s) = speed {
                let cs = if c.rw.is_write() {
                    s.encrypt_mib_s
                } else {
                    s.decrypt_mib_s
                };
                let b = stats::bound(io, cs);
                if b > 0.0 {
                    out.bound_mib_s = Some(b);
                    out.pct_bound = stats::percent(mine, b);
                    if io_name == DISK_TARGET {
                        out.ceiling_mib_s = Some(stats::ceiling(io, cs, cores));
                    }
                }
            }
        }
        if c.cipher.is_some() {
            let classic = c
                .mode
                .and_then(|m| c.target.strip_suffix(m.name()))
                .map(|p| format!("{p}classic"));
            if let Some(cl) = classic.and_then(|name| peer(&|o| o.target == name)) {
                out.pct_classic = stats::percent(mine, cl);
            }
        }
    }
}

impl Report {
    /// JSON (see docs/BENCHMARKING.md). Non-finite numbers become null.
    pub fn json(&self) -> String {
        serde_json::to_string_pretty(self).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
    }

    /// Writes table.txt, results.json, cells.csv and the heatmaps into
    /// `dir`; returns the files written.
    pub fn write(&self, dir: &Path) -> Result<Vec<PathBuf>, Error> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Output {
            path: dir.to_path_buf(),
            source,
        })?;
        let mut files = Vec::new();
        let mut put = |name: &str, bytes: &[u8]| -> Result<(), Error> {
            let p = dir.join(name);
            std::fs::write(&p, bytes).map_err(|source| Error::Output {
                path: p.clone(),
                source,
            })?;
            files.push(p);
            Ok(())
        };
        put("table.txt", self.table().as_bytes())?;
        put("results.json", self.json().as_bytes())?;
        put("cells.csv", self.csv().as_bytes())?;
        for map in crate::heatmap::build(self) {
            put(&format!("{}.svg", map.file_stem), map.svg()?.as_bytes())?;
            put(&format!("{}.png", map.file_stem), &map.png()?)?;
        }
        Ok(files)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::time::Duration;

    use crate::driver::{Rw, Workload};
    use crate::record::{Rep, RunTarget};
    use crate::stats::Percentiles;
    use crate::target::{Cipher, Mode};
    use crate::Options;

    fn rep(bytes: u64, ms: u64) -> Rep {
        let s = Duration::from_millis(ms).as_secs_f64();
        Rep {
            ops: bytes / 4096,
            bytes_per_s: bytes as f64 / s,
            iops: (bytes / 4096) as f64 / s,
            lat: Some(Percentiles {
                p50: 1.0,
                p99: 1.0,
                p999: 1.0,
            }),
            ..Rep::default()
        }
    }

    fn cell(
        target: &str,
        cipher: Option<Cipher>,
        mode: Mode,
        rw: Rw,
        mib_per_100ms: &[u64],
    ) -> CellResult {
        let w = Workload {
            rw,
            bs: 4096,
            qd: 1,
            jobs: 1,
            runtime: Duration::from_millis(100),
        };
        let reps = mib_per_100ms.iter().map(|&m| rep(m << 20, 100)).collect();
        let t = RunTarget {
            name: target.into(),
            cipher,
            mode: Some(mode),
            headline: true,
            swept: false,
        };
        CellResult::from_reps(Phase::Headline, &t, &w, reps)
    }

    #[test]
    fn derive_ratios_and_bound() {
        // raw 200 MiB/s; null classic 80; inline 200; aes inline 100 with
        // c = 300 MiB/s → bound 200·300/500 = 120 → 83.3%.
        let mut cells = vec![
            cell("raw", None, Mode::Classic, Rw::Read, &[19, 20, 21]),
            cell(
                "null-classic",
                Some(Cipher::Null),
                Mode::Classic,
                Rw::Read,
                &[8, 8, 9],
            ),
            cell(
                "null-inline",
                Some(Cipher::Null),
                Mode::Inline,
                Rw::Read,
                &[20, 20, 20],
            ),
            cell(
                "aes-inline",
                Some(Cipher::AesXts),
                Mode::Inline,
                Rw::Read,
                &[10],
            ),
        ];
        assert_eq!(cells[0].mib(), Some(200.0));
        assert_eq!(cells[0].mib_s.unwrap().spread_pct, 10.0);
        let crypto = vec![CryptoSpeed {
            cipher: "aes-xts-plain64".into(),
            bs: 4096,
            encrypt_mib_s: 1.0,
            decrypt_mib_s: 300.0,
        }];
        derive(&mut cells, &crypto, 2);
        assert_eq!(cells[2].mode, Some(Mode::Inline));
        assert_eq!(cells[0].pct_raw, Some(100.0));
        assert_eq!(cells[1].pct_raw, Some(40.0));
        assert_eq!(cells[2].pct_classic, Some(250.0));
        assert_eq!(cells[3].bound_mib_s, Some(120.0));
        assert!((cells[3].pct_bound.unwrap() - 83.333).abs() < 0.01);
        assert_eq!(cells[3].pct_classic, None);
        assert_eq!(
            cells[1].pct_bound, None,
            "no crypto speed measured for null"
        );
    }

    #[test]
    fn a_disk_cell_is_the_bounds_io_and_gives_the_ceiling() {
        // raw (a server) 300 MiB/s, disk (fio on the storage) 200 MiB/s,
        // aes 100 MiB/s, c = 300 (decrypt): bound 200·300/500 = 120,
        // ceiling min(200, 2·300) = 200; with c = 60 (encrypt, writes):
        // bound 200·60/260 = 46.15, ceiling min(200, 2·60) = 120.
        let mut cells = vec![
            cell("raw", None, Mode::Classic, Rw::Read, &[30]),
            cell("disk", None, Mode::Classic, Rw::Read, &[20]),
            cell(
                "aes-classic",
                Some(Cipher::AesXts),
                Mode::Classic,
                Rw::Read,
                &[10],
            ),
            cell("disk", None, Mode::Classic, Rw::Write, &[20]),
            cell(
                "aes-classic",
                Some(Cipher::AesXts),
                Mode::Classic,
                Rw::Write,
                &[10],
            ),
        ];
        let crypto = vec![CryptoSpeed {
            cipher: "aes-xts-plain64".into(),
            bs: 4096,
            encrypt_mib_s: 60.0,
            decrypt_mib_s: 300.0,
        }];
        assert_eq!(io_target(&cells), DISK_TARGET);
        derive(&mut cells, &crypto, 2);
        assert_eq!(cells[2].bound_mib_s, Some(120.0));
        assert_eq!(cells[2].ceiling_mib_s, Some(200.0));
        assert!(
            (cells[2].pct_raw.unwrap() - 33.333).abs() < 0.01,
            "% raw stays raw's"
        );
        assert!((cells[4].bound_mib_s.unwrap() - 46.154).abs() < 0.01);
        assert_eq!(cells[4].ceiling_mib_s, Some(120.0));

        let mut r = empty_report("quick");
        r.via = "fio".into();
        r.storage = Some("images in /var/tmp on ext4 /dev/vda1 (mounted at /), O_DIRECT".into());
        r.crypto = crypto;
        r.cells = cells;
        let t = r.table();
        assert!(t.contains("MiB images (see storage)"), "{t}");
        assert!(
            t.contains("storage: images in /var/tmp on ext4 /dev/vda1"),
            "{t}"
        );
        assert!(
            t.contains(
                "reads: io 200.0 MiB/s (disk), aes-xts-plain64: bound 120.0, ceiling 200.0 MiB/s"
            ),
            "{t}"
        );
        assert!(
            t.contains(
                "writes: io 200.0 MiB/s (disk), aes-xts-plain64: bound 46.2, ceiling 120.0 MiB/s"
            ),
            "{t}"
        );
        assert!(
            t.contains(&format!("min(io, {} cores·c)", r.machine.cpus)),
            "{t}"
        );
        assert!(t.contains("io = disk's MiB/s"), "{t}");

        // Without a disk cell: raw is the io, and no ceiling.
        let mut cells = vec![
            cell("raw", None, Mode::Classic, Rw::Read, &[20]),
            cell(
                "aes-classic",
                Some(Cipher::AesXts),
                Mode::Classic,
                Rw::Read,
                &[10],
            ),
        ];
        derive(&mut cells, &r.crypto, 2);
        assert_eq!(cells[1].bound_mib_s, Some(120.0));
        assert_eq!(cells[1].ceiling_mib_s, None);
    }

    /// A sweep cell of `target` with one repetition per round at `rounds`
    /// MiB/s, for the renderers' tests.
    pub(crate) fn sweep_cell(
        target: &str,
        cipher: Option<Cipher>,
        mode: Option<Mode>,
        rw: Rw,
        bs: u32,
        qd: usize,
        rounds: &[f64],
    ) -> CellResult {
        let t = RunTarget {
            name: target.into(),
            cipher,
            mode,
            headline: false,
            swept: true,
        };
        let w = Workload {
            rw,
            bs,
            qd,
            jobs: 1,
            runtime: Duration::from_millis(1),
        };
        let reps = rounds
            .iter()
            .map(|&m| Rep {
                ops: 1,
                bytes_per_s: m * crate::stats::MIB,
                ..Rep::default()
            })
            .collect();
        CellResult::from_reps(Phase::Sweep, &t, &w, reps)
    }

    /// A report with no cells, for the renderers' tests.
    pub(crate) fn empty_report(profile: &str) -> Report {
        let o = Options {
            profile: profile.into(),
            ..Options::quick()
        };
        Report {
            schema_version: SCHEMA_VERSION,
            tool: "t".into(),
            started: "2026-11-23T00:00:00Z".into(),
            duration_s: 0.0,
            machine: Machine::detect(),
            via: "in-process".into(),
            storage: None,
            options: OptionsRecord::from(&o),
            crypto: Vec::new(),
            cells: Vec::new(),
            skipped: Vec::new(),
        }
    }
}
