//! The workloads the advisor measures: the preset fio cells (db, vm,
//! backup, seeds) or a user's fio job file, rewritten to target the
//! volume under test.

use std::fmt::Write as _;

use crate::error::OptionsError;
use crate::Error;

/// One fio job of a preset workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CellSpec {
    /// fio `--rw`: read, write, randread, randwrite, randrw.
    pub rw: &'static str,
    /// fio `--rwmixread` for randrw (percent reads).
    pub mix_read: u8,
    /// Block size in bytes.
    pub bs: u32,
    /// Queue depth per job.
    pub qd: usize,
    /// Jobs.
    pub jobs: usize,
}

impl CellSpec {
    /// A short label: `4k randrw70 QD8`, `4k read QD32x4`.
    pub fn label(&self) -> String {
        let mut s = format!("{} {}", crate::report::fmt_bs(self.bs), self.rw);
        if self.rw == "randrw" {
            let _ = write!(s, "{}", self.mix_read);
        }
        let _ = write!(s, " QD{}", self.qd);
        if self.jobs > 1 {
            let _ = write!(s, "x{}", self.jobs);
        }
        s
    }

    /// fio arguments for this job (device, engine and timing come from the caller).
    pub fn fio_args(&self) -> Vec<String> {
        let mut v = vec![
            format!("--rw={}", self.rw),
            format!("--bs={}", self.bs),
            format!("--iodepth={}", self.qd),
            format!("--numjobs={}", self.jobs),
        ];
        if self.rw == "randrw" {
            v.push(format!("--rwmixread={}", self.mix_read));
        }
        v
    }
}

/// A named workload preset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Preset {
    /// `--workload` name.
    pub name: &'static str,
    /// What it models.
    pub about: &'static str,
    /// Its fio jobs, weighted equally.
    pub cells: &'static [CellSpec],
}

const fn cell(rw: &'static str, bs: u32, qd: usize, jobs: usize) -> CellSpec {
    CellSpec {
        rw,
        mix_read: 70,
        bs,
        qd,
        jobs,
    }
}

/// The presets `--workload` knows.
pub const PRESETS: [Preset; 4] = [
    Preset {
        name: "db",
        about: "a database: 4k random 70/30 read/write at QD1 and QD8",
        cells: &[cell("randrw", 4096, 1, 1), cell("randrw", 4096, 8, 1)],
    },
    Preset {
        name: "vm",
        about: "virtual machine disks: 4k random 70/30 at QD1 and QD32, 64k at QD8",
        cells: &[
            cell("randrw", 4096, 1, 1),
            cell("randrw", 4096, 32, 1),
            cell("randrw", 64 << 10, 8, 1),
        ],
    },
    Preset {
        name: "backup",
        about: "backups and streaming: 1M sequential read and write at QD8 and QD32",
        cells: &[
            cell("read", 1 << 20, 8, 1),
            cell("write", 1 << 20, 8, 1),
            cell("read", 1 << 20, 32, 1),
            cell("write", 1 << 20, 32, 1),
        ],
    },
    Preset {
        name: "seeds",
        about: "the seeds' cells: 4k QD1, 4k QD32 x 4 jobs, 4M QD16, read and write",
        cells: &[
            cell("read", 4096, 1, 1),
            cell("write", 4096, 1, 1),
            cell("read", 4096, 32, 4),
            cell("write", 4096, 32, 4),
            cell("read", 4 << 20, 16, 1),
            cell("write", 4 << 20, 16, 1),
        ],
    },
];

/// The preset used when the user names none.
pub const DEFAULT_PRESET: &str = "seeds";

/// What the user says the volume does.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum AdvisorWorkload {
    /// A preset's cells.
    Preset(Preset),
    /// The user's own fio job file (its text, and where it came from).
    JobFile {
        /// The file given.
        path: String,
        /// Its text, as the advisor will run it (see [`job_file_for`]).
        text: String,
    },
}

impl AdvisorWorkload {
    /// The preset called `name`.
    pub fn preset(name: &str) -> Result<Self, Error> {
        PRESETS
            .iter()
            .find(|p| p.name == name)
            .map(|p| Self::Preset(*p))
            .ok_or_else(|| {
                OptionsError::UnknownWorkload {
                    name: name.into(),
                    known: PRESETS
                        .iter()
                        .map(|p| p.name)
                        .collect::<Vec<_>>()
                        .join(", "),
                }
                .into()
            })
    }

    /// From the CLI: a preset name, or a job file (read now, so a bad path
    /// is a usage error before anything runs), or the default preset.
    pub fn new(preset: Option<&str>, job_file: Option<&std::path::Path>) -> Result<Self, Error> {
        match (preset, job_file) {
            (_, Some(p)) => {
                let path = p.display().to_string();
                let text = std::fs::read_to_string(p).map_err(|e| OptionsError::JobFile {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
                Ok(Self::JobFile { path, text })
            }
            (name, None) => Self::preset(name.unwrap_or(DEFAULT_PRESET)),
        }
    }

    /// Labels of the cells, in measuring order.
    pub fn labels(&self) -> Vec<String> {
        match self {
            Self::Preset(p) => p.cells.iter().map(CellSpec::label).collect(),
            Self::JobFile { path, .. } => vec![format!("job file {path}")],
        }
    }

    /// One line saying what is measured.
    pub fn describe(&self) -> String {
        match self {
            Self::Preset(p) => format!("workload {} ({})", p.name, p.about),
            Self::JobFile { path, .. } => format!("workload from the fio job file {path}"),
        }
    }
}

/// Job-file keys the advisor sets itself: where the IO goes and how long it
/// runs (each measurement is one interleaved slot of a round).
const OWNED_KEYS: [&str; 7] = [
    "filename",
    "directory",
    "filename_format",
    "runtime",
    "time_based",
    "ramp_time",
    "output-format",
];

/// The user's job file made to run on `dev`: the keys in `OWNED_KEYS` are
/// dropped wherever they appear, and a leading `[global]` section sets them
/// (plus direct IO on libaio and the device size, which the file may still
/// override).
pub fn job_file_for(text: &str, dev: &str, size: u64, runtime_ms: u128, ramp_ms: u128) -> String {
    let mut s = format!(
        "[global]\nfilename={dev}\ndirect=1\nioengine=libaio\nsize={size}\n\
         runtime={}ms\ntime_based=1\nramp_time={ramp_ms}ms\n\n",
        runtime_ms.max(1)
    );
    for line in text.lines() {
        let key = line
            .trim()
            .split(['=', ' ', '\t'])
            .next()
            .unwrap_or("")
            .to_ascii_lowercase();
        if !OWNED_KEYS.contains(&key.as_str()) {
            s.push_str(line);
            s.push('\n');
        }
    }
    s
}
