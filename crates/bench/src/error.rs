//! The bench's errors: bad options apart from failures of the machinery
//! (ciphers, engines, external programs, output files), each carrying its
//! cause as a source rather than as text.

use std::path::PathBuf;
use std::process::ExitStatus;

/// Errors of the bench.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Bad options (the CLI's usage error).
    #[error(transparent)]
    Options(#[from] OptionsError),
    /// A cipher could not be built.
    #[error("{spec}")]
    Cipher {
        /// The cipher spec.
        spec: &'static str,
        /// Cause.
        #[source]
        source: crypto::Error,
    },
    /// An engine failed to start.
    #[error("{target}: engine failed to start")]
    Engine {
        /// Target name.
        target: String,
        /// Cause.
        #[source]
        source: datapath::Error,
    },
    /// The in-memory ramdisk could not be made or filled.
    #[error("Cannot prepare a {} MiB ramdisk", .size >> 20)]
    Ramdisk {
        /// Requested size in bytes.
        size: u64,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// No random key could be read.
    #[error("Cannot read /dev/urandom for a random key")]
    Random(#[source] std::io::Error),
    /// Required programs, devices or privileges are missing.
    #[error("{needs}; missing here: {}", .missing.join("; "))]
    Missing {
        /// What the run needs.
        needs: &'static str,
        /// Each missing component.
        missing: Vec<String>,
    },
    /// An external program could not be started.
    #[error("Cannot run {program}")]
    Spawn {
        /// Program name.
        program: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// An external program failed.
    #[error("{program} failed ({status}): {output}")]
    Failed {
        /// Program (and what it was doing).
        program: String,
        /// Its exit status.
        status: ExitStatus,
        /// The first lines it printed.
        output: String,
    },
    /// fio's JSON output could not be read.
    #[error("fio JSON unreadable")]
    FioJson(#[source] serde_json::Error),
    /// fio's JSON output lacks something.
    #[error("fio JSON lacks {0}")]
    FioField(&'static str),
    /// fio reported a job error.
    #[error("fio job error {0}")]
    FioJob(i64),
    /// A server exited before serving.
    #[error("{name} exited ({status}): {stderr}")]
    ServerExited {
        /// Server name.
        name: String,
        /// Its exit status.
        status: ExitStatus,
        /// The first lines of its standard error.
        stderr: String,
    },
    /// A server did not create its socket in time.
    #[error("{name} did not create its socket {} within 15 s", .socket.display())]
    ServerTimeout {
        /// Server name.
        name: String,
        /// The socket path.
        socket: PathBuf,
    },
    /// Drawing a heatmap failed.
    #[error("Cannot draw {file}")]
    Draw {
        /// The figure's file stem.
        file: String,
        /// Cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// Encoding a PNG failed.
    #[error("PNG encoding failed")]
    Png(#[source] png::EncodingError),
    /// SIGINT or SIGTERM arrived: the run stopped between two measurements
    /// and its servers were stopped and their files removed.
    #[error("Interrupted: the servers were stopped and their files removed; no results written")]
    Interrupted,
    /// Writing results (or a server's image) failed.
    #[error("Cannot write {}", .path.display())]
    Output {
        /// File or directory.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// True for bad options (the CLI answers with a usage error).
    pub fn is_usage(&self) -> bool {
        matches!(self, Error::Options(_))
    }

    /// True when a required program, device or privilege is missing.
    pub fn is_missing(&self) -> bool {
        matches!(self, Error::Missing { .. })
    }
}

/// Options the bench refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum OptionsError {
    /// Ramdisk too small or not sector-aligned.
    #[error("The ramdisk size must be at least 1 MiB and a multiple of 512")]
    RamdiskSize,
    /// A block size that cannot be used.
    #[error("Block size {0} is not a non-zero multiple of 512 no larger than the ramdisk")]
    BlockSize(u32),
    /// Block sizes must be multiples of the sector size.
    #[error("Block size {bs} is not a multiple of the {sector_size}-byte sector")]
    BlockNotSectors {
        /// Block size.
        bs: u32,
        /// Sector size.
        sector_size: u32,
    },
    /// Sector size other than 512, 1024, 2048, 4096.
    #[error("Sector size {0} is not one of 512, 1024, 2048, 4096")]
    SectorSize(u32),
    /// A list option with a value that does not parse (or none).
    #[error("Invalid {what} list `{value}`")]
    InvalidList {
        /// What the list holds (`block size`, `queue depth`, …).
        what: &'static str,
        /// The list given.
        value: String,
    },
    /// An option value that does not parse.
    #[error("Invalid {what} `{value}` (e.g. {example})")]
    Invalid {
        /// The option (`run time`, `size`, …).
        what: &'static str,
        /// The value given.
        value: String,
        /// Values that would parse.
        example: &'static str,
    },
    /// Zero queue depth or jobs.
    #[error("Queue depth and jobs must be at least 1")]
    ZeroDepth,
    /// Zero repetitions.
    #[error("Repetitions must be at least 1")]
    ZeroReps,
    /// Zero run time.
    #[error("Run time must be positive")]
    ZeroRuntime,
    /// Nothing to measure.
    #[error("Nothing to measure: no headline targets and no sweep")]
    NothingToRun,
    /// `--file` or `--file-size` without `--via file`.
    #[error("--file and --file-size go with --via file")]
    FileWithoutViaFile,
    /// `--dir` without `--via fio` or `--via vhost`.
    #[error("--dir goes with --via fio or --via vhost")]
    DirWithoutServers,
    /// A target name that does not exist.
    #[error("Unknown target `{word}` (known: all, null, aes, {known})")]
    UnknownTarget {
        /// The word given.
        word: String,
        /// The known names, comma-separated.
        known: String,
    },
    /// An empty target list.
    #[error("Empty target list")]
    EmptyTargets,
    /// An unknown profile name.
    #[error("Unknown profile `{0}` (known: quick, default, full, grid)")]
    UnknownProfile(String),
    /// An unknown advisor workload preset.
    #[error("Unknown workload `{name}` (known: {known}; or --fio-job FILE)")]
    UnknownWorkload {
        /// The name given.
        name: String,
        /// The known presets, comma-separated.
        known: String,
    },
    /// A mapping the advisor cannot take its current flags from.
    #[error("Cannot advise on mapping {name}: {reason}")]
    Mapping {
        /// The mapping name given.
        name: String,
        /// Why.
        reason: String,
    },
    /// An fio job file the advisor cannot read.
    #[error("Cannot read the fio job file {path}: {reason}")]
    JobFile {
        /// The path given.
        path: String,
        /// Why.
        reason: String,
    },
    /// The device cannot hold one block per job.
    #[error("Device of {size} bytes too small for {jobs} jobs of {bs} bytes")]
    TooSmall {
        /// Device bytes.
        size: u64,
        /// Jobs.
        jobs: usize,
        /// Block size.
        bs: u32,
    },
}
