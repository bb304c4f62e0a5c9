//! `--via file`: the engine over `backend::FileBackend` on one file, beside
//! fio's own io_uring engine on the same file (the file-backend
//! cells; formerly `datapath/examples/filebench.rs`).
//!
//! ```text
//!   fio --ioengine=io_uring --filename=F [--direct=1]       (raw: the ceiling, io)
//!   driver ► Engine ► FileBackend(F, io_uring)             (ucrypt-<target>-uring)
//!   driver ► Engine ► FileBackend(F, pread/pwrite)         (ucrypt-<target>-syscalls)
//! ```
//!
//! Every row works on the same file, in this process except fio. fio gets
//! `--direct=1` when the engine's file takes O_DIRECT (the engine's own
//! choice, `DirectIo::Auto`), so both sides bypass the page cache or both
//! use it. The engine's jobs submit as a deep-queued frontend does
//! ([`driver::run_hinted`]). `raw` is fio, so the report's `% raw` is
//! "of fio" and the bound is io·c/(io+c) with io = fio's MiB/s in the same
//! round and c = the cipher alone at that block size on one thread.
//! The sweep (when asked for) covers fio and the io_uring rows.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use backend::{Backend, DirectIo, FileBackend, FileOptions, FileStats, IoEngine};
use datapath::Engine;

use super::disk::{Disk, DiskStat};
use super::{Rep, RunTarget, Runner};
use crate::driver::{self, Rw, Workload};
use crate::plan::Shape;
use crate::report::{Report, Skipped};
use crate::target::Target;
use crate::{Error, Options};

/// Targets of `--via file` when `--targets` is not given: the engine
/// without a cipher and AES-XTS in each mode.
pub const DEFAULT_TARGETS: &str = "raw,aes-classic,aes-inline,aes-adaptive";

/// Size of the file the runner makes when `--file-size` is not given.
pub const DEFAULT_SIZE: u64 = 1 << 30;

/// What to measure with `--via file`.
#[derive(Debug, Clone, Default)]
pub struct FilePlan {
    /// The file (kept); None: a new file in the temporary directory
    /// (`$TMPDIR`, else /tmp), removed at the end.
    pub path: Option<PathBuf>,
    /// Its size; None: an existing file's size, else [`DEFAULT_SIZE`].
    pub size: Option<u64>,
    /// `--bs`/`--qd` were given: the cells are their product instead of
    /// the three headline cells.
    pub shapes_given: bool,
    /// `--rw` was given: its directions instead of random read and write.
    pub rw_given: bool,
}

/// The options the file runner runs with: the file's size, and the
/// headline cells 4k QD1, 4k QD32 and 1M QD8, random reads and writes;
/// or, where `plan` says they were given, every `--bs` × `--qd` and the
/// `--rw` directions.
pub fn file_options(opts: &Options, size: u64, plan: &FilePlan) -> Options {
    let headline = if plan.shapes_given {
        opts.bs
            .iter()
            .flat_map(|&bs| opts.qd.iter().map(move |&qd| Shape { bs, qd }))
            .collect()
    } else {
        vec![
            Shape { bs: 4096, qd: 1 },
            Shape { bs: 4096, qd: 32 },
            Shape { bs: 1 << 20, qd: 8 },
        ]
    };
    let headline_rw = if plan.rw_given {
        opts.rw.clone()
    } else {
        vec![Rw::RandRead, Rw::RandWrite]
    };
    Options {
        size,
        headline,
        headline_rw,
        ..opts.clone()
    }
}

/// Prepares the file, runs the plan and returns the report.
pub fn run(opts: &Options, plan: &FilePlan) -> Result<Report, Error> {
    if !super::servers::tool("fio") {
        return Err(Error::Missing {
            needs: "--via file needs fio (its io_uring engine on the same file is the ceiling)",
            missing: vec!["fio".into()],
        });
    }
    super::watch_interrupts();
    let file = BenchFile::prepare(plan)?;
    let opts = file_options(opts, file.size, plan);
    eprintln!(
        "bench: file {} ({} MiB){}",
        file.path.display(),
        file.size >> 20,
        if file.remove {
            ", removed at the end"
        } else {
            ""
        }
    );
    let mut runner = FileRunner::new(&opts, file)?;
    super::run(&mut runner, &opts)
}

/// The file every row works on; removed on drop when the runner made it
/// in the temporary directory.
struct BenchFile {
    path: PathBuf,
    size: u64,
    remove: bool,
}

impl BenchFile {
    /// Opens or makes the file of `plan`: at least its size, written over
    /// where it was shorter (so reads hit data, not holes). Only regular
    /// files: the write cells overwrite what they touch.
    fn prepare(plan: &FilePlan) -> Result<Self, Error> {
        let (path, remove) = match &plan.path {
            Some(p) => (p.clone(), false),
            None => (
                std::env::temp_dir().join(format!(
                    "ucrypt-bench-{}-{}.img",
                    std::process::id(),
                    crate::timestamp_compact()
                )),
                true,
            ),
        };
        let named = path.clone();
        let io = move |source| Error::Output {
            path: named.clone(),
            source,
        };
        let len = match std::fs::metadata(&path) {
            Ok(m) if !m.is_file() => {
                return Err(io(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "not a regular file (--via file measures a file on a filesystem)",
                )))
            }
            Ok(m) => Some(m.len()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io(e)),
        };
        // Whole MiB, so every block size up to 1M tiles it.
        let size = plan.size.or(len).unwrap_or(DEFAULT_SIZE) >> 20 << 20;
        if size == 0 {
            return Err(io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "smaller than 1 MiB (--file-size grows it)",
            )));
        }
        let file = BenchFile { path, size, remove };
        let have = len.unwrap_or(0).min(size);
        if len.is_none() || have < size {
            if let Err(e) = file.fill(have) {
                // A file the runner made goes with `file` (dropped here).
                return Err(if super::interrupted() {
                    Error::Interrupted
                } else {
                    io(e)
                });
            }
        }
        Ok(file)
    }

    /// Writes a pattern from `from` to the end and syncs.
    fn fill(&self, from: u64) -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&self.path)?;
        let chunk: Vec<u8> = (0..1u32 << 20).map(|i| (i as u8) ^ 0x3c).collect();
        std::io::Seek::seek(&mut f, std::io::SeekFrom::Start(from))?;
        let mut off = from;
        while off < self.size {
            if super::interrupted() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::Interrupted,
                    "interrupted while filling",
                ));
            }
            let n = (self.size - off).min(chunk.len() as u64) as usize;
            f.write_all(&chunk[..n])?;
            off += n as u64;
        }
        f.sync_all()
    }
}

impl Drop for BenchFile {
    fn drop(&mut self) {
        if self.remove {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// fio's IO buffers (one `malloc` of bs × QD) in transparent huge pages,
/// as the engine's are (`backend::PageAlignLarge`): glibc ≥ 2.35 then
/// marks its heap and mmap'd chunks `MADV_HUGEPAGE`. Without it whether a
/// 1 MiB O_DIRECT read reaches a virtio disk (254 segments per request)
/// as one request or two 512 KiB ones depends on where its 4 KiB pages
/// happen to be, and fio's 1M QD8 reads, the bound, swung 0.85-1.7 GiB/s
/// between runs. Older glibc ignores the tunable.
const FIO_HUGE: (&str, &str) = ("GLIBC_TUNABLES", "glibc.malloc.hugetlb=1");

/// How a row moves its bytes.
enum Row {
    /// fio's io_uring engine with these arguments.
    Fio(Vec<String>),
    /// An engine for this target over a `FileBackend` on this IO engine.
    Engine(Target, IoEngine),
}

/// fio and engines on one file.
///
/// A `FileBackend` holds a write lock on its file for its lifetime, so
/// only one can be open at a time: each repetition of an engine row opens
/// its backend, starts its engine, warms it up, measures, and shuts both
/// down. fio takes no lock.
pub struct FileRunner {
    rows: Vec<Row>,
    targets: Vec<RunTarget>,
    skipped: Vec<Skipped>,
    size: u64,
    queue_depth: usize,
    sector_size: u32,
    warmup: Duration,
    engine_stats: bool,
    /// Each row's IO engine and counters of its last repetition.
    last: Vec<Option<(IoEngine, FileStats)>>,
    file: BenchFile,
    /// Whether the engines' backends (and so fio) bypass the page cache.
    direct: bool,
    /// The disk under the file, whose request sizes each row records.
    disk: Option<Disk>,
}

/// The IO engines each target runs with, and their row suffixes.
const IO_ENGINES: [(IoEngine, &str); 2] =
    [(IoEngine::Uring, "uring"), (IoEngine::Syscalls, "syscalls")];

/// The row name of `target` on `io` (`ucrypt-aes-adaptive-uring`).
fn row_name(target: Target, io: &str) -> String {
    format!("ucrypt-{target}-{io}")
}

impl FileRunner {
    /// The fio row, then an engine per target and IO engine; one that
    /// cannot open or start (tried once here) is skipped with its error.
    fn new(opts: &Options, file: BenchFile) -> Result<Self, Error> {
        opts.validate()?;
        let head_qd = opts.headline.iter().map(|s| s.qd).max().unwrap_or(1);
        let max = |v: &[usize]| v.iter().max().copied().unwrap_or(1);
        let mut runner = Self {
            rows: Vec::new(),
            targets: Vec::new(),
            skipped: Vec::new(),
            size: file.size,
            queue_depth: (max(&opts.qd) * max(&opts.jobs)).max(head_qd).max(1),
            sector_size: opts.sector_size,
            warmup: opts.warmup,
            engine_stats: opts.engine_stats,
            last: Vec::new(),
            disk: Disk::of(&file.path),
            file,
            direct: false,
        };
        match &runner.disk {
            Some(d) => eprintln!(
                "bench: the file is on {} (each row records its average request size)",
                d.name
            ),
            None => eprintln!("bench: the file is on no block device: no request sizes"),
        }
        // fio bypasses the page cache when the engine does.
        let direct = runner
            .open(IoEngine::Syscalls)
            .map(|b| b.direct_alignment().is_some())
            .unwrap_or(false);
        runner.direct = direct;
        eprintln!(
            "bench: fio and the engines go {}",
            if direct {
                "around the page cache (O_DIRECT)"
            } else {
                "through the page cache (no O_DIRECT here)"
            }
        );
        let mut fio_args = vec![
            "--ioengine=io_uring".to_string(),
            // fio splits --filename at ':' (a list of files).
            format!(
                "--filename={}",
                runner.file.path.display().to_string().replace(':', "\\:")
            ),
        ];
        if direct {
            fio_args.push("--direct=1".into());
        }
        runner.rows.push(Row::Fio(fio_args));
        runner.targets.push(RunTarget {
            name: "raw".into(),
            cipher: None,
            mode: None,
            headline: !opts.targets.is_empty(),
            swept: !opts.sweep_targets.is_empty(),
        });
        let mut all: Vec<Target> = opts.targets.clone();
        all.extend(
            opts.sweep_targets
                .iter()
                .filter(|t| !opts.targets.contains(t)),
        );
        for t in all {
            for (io, suffix) in IO_ENGINES {
                let name = row_name(t, suffix);
                match runner.start(t, io) {
                    Ok((e, _)) => {
                        let _ = e.shutdown();
                        runner.rows.push(Row::Engine(t, io));
                        runner.targets.push(RunTarget {
                            name,
                            cipher: t.cipher,
                            mode: t.cipher.map(|_| t.mode),
                            headline: opts.targets.contains(&t),
                            // The sweep's verdict pairs modes per cipher:
                            // one IO engine only.
                            swept: opts.sweep_targets.contains(&t) && io == IoEngine::Uring,
                        });
                    }
                    Err(reason) => runner.skipped.push(Skipped {
                        target: name,
                        reason,
                    }),
                }
            }
        }
        runner.last = vec![None; runner.rows.len()];
        Ok(runner)
    }

    /// A backend on the file through `io` (O_DIRECT where it takes it).
    /// The previous backend's lock can outlive it briefly (the kernel
    /// tears a closed io_uring down, and drops its file, asynchronously):
    /// a locked file is retried for up to 2 s.
    fn open(&self, io: IoEngine) -> Result<FileBackend, backend::Error> {
        let deadline = std::time::Instant::now() + Duration::from_secs(2);
        loop {
            let r = FileBackend::open(
                &self.file.path,
                &FileOptions {
                    direct: DirectIo::Auto,
                    engine: Some(io),
                    ..FileOptions::default()
                },
            );
            match r {
                Err(e)
                    if matches!(e.kind(), backend::ErrorKind::Locked { .. })
                        && std::time::Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(2));
                }
                r => return r,
            }
        }
    }

    /// The disk's counters now (None: no disk under the file).
    fn sample(&self) -> Option<DiskStat> {
        self.disk.as_ref()?.sample()
    }

    /// The disk's request sizes since `before` (fio's run includes its
    /// ramp-up, the engine's excludes its warm-up).
    fn disk_since(&self, before: Option<DiskStat>) -> Option<super::DiskReqs> {
        Some(self.sample()?.since(&before?))
    }

    /// `target`'s engine over a new backend through `io`.
    fn start(&self, target: Target, io: IoEngine) -> Result<(Engine, Arc<FileBackend>), String> {
        let fb = Arc::new(self.open(io).map_err(|e| crate::error_chain(&e))?);
        let b: Arc<dyn Backend> = fb.clone();
        let e = target
            .engine(b, self.queue_depth, self.sector_size)
            .map_err(|e| crate::error_chain(&e))?;
        Ok((e, fb))
    }
}

impl Runner for FileRunner {
    fn via(&self) -> String {
        "file".into()
    }

    fn targets(&self) -> &[RunTarget] {
        &self.targets
    }

    fn skipped(&self) -> Vec<Skipped> {
        self.skipped.clone()
    }

    fn storage(&self) -> Option<String> {
        Some(format!(
            "{}{}, {}{}",
            self.file.path.display(),
            if self.file.remove {
                " (made for the run, removed)"
            } else {
                ""
            },
            if self.direct {
                "O_DIRECT"
            } else {
                "page cache (no O_DIRECT here)"
            },
            match &self.disk {
                Some(d) => format!(", on {}", d.name),
                None => String::new(),
            }
        ))
    }

    // No warm-up per cell: fio ramps up in each run, the engine rows warm
    // up each repetition's new engine.

    fn run(&mut self, target: usize, w: &Workload) -> Rep {
        let failed = |error: String| Rep {
            errors: 1,
            error: Some(error),
            ..Rep::default()
        };
        let (t, io) = match &self.rows[target] {
            Row::Fio(args) => {
                let before = self.sample();
                let r = super::fio::fio_env(args, &[FIO_HUGE], w, self.size, self.warmup);
                return match r {
                    Ok(r) => Rep {
                        disk: self.disk_since(before),
                        ..r.rep(w.bs, 0.0)
                    },
                    Err(e) => failed(crate::error_chain(&e)),
                };
            }
            Row::Engine(t, io) => (*t, *io),
        };
        let (e, fb) = match self.start(t, io) {
            Ok(x) => x,
            Err(reason) => return failed(reason),
        };
        let e = Arc::new(e);
        if !self.warmup.is_zero() {
            let warm = Workload {
                runtime: self.warmup,
                ..*w
            };
            driver::run_hinted(&e, &warm, self.size);
        }
        let before = self.sample();
        let r = driver::run_hinted(&e, w, self.size);
        let disk = self.disk_since(before);
        if let Err(err) = e.shutdown() {
            return failed(crate::error_chain(&err));
        }
        self.last[target] = Some((fb.io_engine(), fb.stats()));
        Rep {
            disk,
            ..super::engine::rep_of(r)
        }
    }

    fn after_cell(&mut self, w: &Workload) {
        if !self.engine_stats {
            return;
        }
        for (t, last) in self.targets.iter().zip(&self.last) {
            if let Some((io, st)) = last {
                eprintln!(
                    "file {} {} bs={} QD{} (last repetition, with warm-up): {io:?} engine, \
                     {} ring transfers ({} batches), {} reaped by submitters, {} syscalls; \
                     {} direct, {} bounced, {} buffered",
                    t.name,
                    w.rw.name(),
                    crate::report::fmt_bs(w.bs),
                    w.qd,
                    st.uring_ops,
                    st.uring_batches,
                    st.reaped_ops,
                    st.syscall_ops,
                    st.direct_ops,
                    st.bounced_ops,
                    st.buffered_ops
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::{Cipher, Mode};

    #[test]
    fn file_options_keep_the_issue_cells() {
        let o = file_options(&Options::standard(), 64 << 20, &FilePlan::default());
        assert_eq!(o.size, 64 << 20);
        assert_eq!(
            o.headline,
            [
                Shape { bs: 4096, qd: 1 },
                Shape { bs: 4096, qd: 32 },
                Shape { bs: 1 << 20, qd: 8 }
            ]
        );
        assert_eq!(o.headline_rw, [Rw::RandRead, Rw::RandWrite]);
        assert_eq!(
            row_name(Target::new(Cipher::AesXts, Mode::Adaptive), "uring"),
            "ucrypt-aes-adaptive-uring"
        );
    }

    #[test]
    fn a_made_file_is_filled_and_removed_a_named_one_kept() {
        let dir = std::env::temp_dir().join(format!("ucrypt-bench-file-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let named = dir.join("f.img");
        let plan = FilePlan {
            path: Some(named.clone()),
            size: Some((3 << 20) + 5),
            ..FilePlan::default()
        };
        let f = BenchFile::prepare(&plan).unwrap();
        assert_eq!(f.size, 3 << 20, "whole MiB");
        assert_eq!(std::fs::metadata(&named).unwrap().len(), 3 << 20);
        drop(f);
        assert!(named.exists(), "a named file is kept");
        // Reused at its size; a larger size extends it.
        let again = FilePlan {
            path: Some(named.clone()),
            size: None,
            ..FilePlan::default()
        };
        assert_eq!(BenchFile::prepare(&again).unwrap().size, 3 << 20);
        let bigger = FilePlan {
            size: Some(4 << 20),
            ..again
        };
        BenchFile::prepare(&bigger).unwrap();
        assert_eq!(std::fs::metadata(&named).unwrap().len(), 4 << 20);
        let not_file = FilePlan {
            path: Some(dir.clone()),
            size: None,
            ..FilePlan::default()
        };
        let e = BenchFile::prepare(&not_file).err().unwrap();
        assert!(crate::error_chain(&e).contains("not a regular file"), "{e}");
        let tiny = FilePlan {
            path: Some(dir.join("tiny.img")),
            size: Some(1000),
            ..FilePlan::default()
        };
        let e = BenchFile::prepare(&tiny).err().unwrap();
        assert!(crate::error_chain(&e).contains("smaller than 1 MiB"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
        // No path: a new file in the temporary directory, gone at the end.
        let made = BenchFile::prepare(&FilePlan {
            path: None,
            size: Some(1 << 20),
            ..FilePlan::default()
        })
        .unwrap();
        let at = made.path.clone();
        assert!(at.starts_with(std::env::temp_dir()) && at.exists());
        drop(made);
        assert!(!at.exists(), "a made file is removed");
    }
}
