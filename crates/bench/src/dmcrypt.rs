//! `--dm-crypt`: the flag advisor on the real kernel's dm-crypt.
//!
//! ```text
//!   preflight: root, dmsetup, /dev/mapper/control, dm-crypt (≥ 1.22 for the
//!              workqueue flags), brd, fio   → Features, or every gap named
//!   current flags: `dmsetup table NAME` (--mapping), else none
//!   modprobe brd rd_nr=1 rd_size=…      → /dev/ram0, filled once
//!   dmsetup create ucrypt-adv-<pid>-<i>  (table on stdin), all at once:
//!       0 current · 1 control (current again) · 2.. the other flag sets
//!       0 <sectors> crypt <cipher> <random key> 0 /dev/ram0 0 [n flags…]
//!   rounds × cells × mappings (order rotated per round):
//!       fio --filename=/dev/mapper/… --direct=1 --ioengine=libaio
//!   advisor::render → one `cryptsetup refresh` line, gain, noise band
//! ```
//!
//! The modules are found through `modules.dep` / `modules.builtin`, not
//! `modprobe -n`, so the preflight also works where modprobe is busybox's.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::advisor::{self, AdvisorWorkload, Current, Flags};
use crate::target::random_bytes;
use crate::{Error, Options};

/// The oldest dm-crypt target with `no_read_workqueue` and
/// `no_write_workqueue` (Linux 5.9).
pub const WORKQUEUE_FLAGS_SINCE: (u32, u32, u32) = (1, 22, 0);

/// What the kernel offers the advisor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Features {
    /// `uname -r`.
    pub kernel: String,
    /// The dm-crypt target's version, when it is loaded (`dmsetup targets`).
    pub crypt: Option<(u32, u32, u32)>,
    /// dm-crypt's `max_read_size` and `max_write_size` module parameters
    /// (Linux 6.11; 0 is the default, 128 KiB), when the kernel has them.
    pub max_io: Option<(u32, u32)>,
    /// The host's cryptsetup version (`cryptsetup --version`), the tool the
    /// recommendation's `refresh` line is for.
    pub cryptsetup: Option<(u32, u32, u32)>,
}

impl Features {
    /// True when the loaded dm-crypt knows both workqueue flags.
    pub fn workqueue_flags(&self) -> bool {
        self.crypt.is_some_and(|v| v >= WORKQUEUE_FLAGS_SINCE)
    }

    /// True when the loaded dm-crypt knows `high_priority` (1.26).
    pub fn high_priority(&self) -> bool {
        self.crypt
            .is_some_and(|v| v >= advisor::HIGH_PRIORITY_SINCE)
    }

    /// True when the host's cryptsetup sets `high_priority` with `refresh
    /// --perf-high_priority` (2.7); measured either way, a candidate with
    /// it is recommended only then.
    pub fn refresh_sets_high_priority(&self) -> bool {
        self.cryptsetup
            .is_some_and(|v| v >= advisor::HIGH_PRIORITY_CRYPTSETUP)
    }

    /// One line for the report.
    pub fn describe(&self) -> String {
        let yn = |b: bool| if b { "yes" } else { "no" };
        let sizes = match self.max_io {
            Some((r, w)) => format!(
                "; module parameters max_read_size {r}, max_write_size {w} (0: 131072; per host)"
            ),
            None => "; no max_read_size/max_write_size (before Linux 6.11)".into(),
        };
        let tool = match self.cryptsetup {
            Some((a, b, c)) => format!(
                "; cryptsetup {a}.{b}.{c} (refresh --perf-high_priority: {})",
                yn(self.refresh_sets_high_priority())
            ),
            None => "; no cryptsetup".into(),
        };
        match self.crypt {
            Some((a, b, c)) => format!(
                "kernel {}, dm-crypt v{a}.{b}.{c} (no_read_workqueue, no_write_workqueue: {}; high_priority: {}{sizes}){tool}",
                self.kernel,
                yn(self.workqueue_flags()),
                yn(self.high_priority()),
            ),
            None => format!("kernel {}, dm-crypt not loaded{tool}", self.kernel),
        }
    }
}

/// `max_read_size` and `max_write_size` from `dir` (dm-crypt's module
/// parameters directory); None unless both are there and numbers.
pub fn module_max_io(dir: &Path) -> Option<(u32, u32)> {
    let read = |n: &str| -> Option<u32> {
        std::fs::read_to_string(dir.join(n))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    Some((read("max_read_size")?, read("max_write_size")?))
}

/// The module parameters set for a measurement, put back as they were
/// when dropped.
struct ModuleParams {
    old: (u32, u32),
}

impl ModuleParams {
    fn write(v: (u32, u32)) -> Result<(), Error> {
        let dir = Path::new(advisor::MODULE_PARAMETERS);
        for (n, x) in [("max_read_size", v.0), ("max_write_size", v.1)] {
            let path = dir.join(n);
            std::fs::write(&path, x.to_string())
                .map_err(|source| Error::Output { path, source })?;
        }
        Ok(())
    }

    /// Sets `v`, remembering `old`.
    fn set(old: (u32, u32), v: (u32, u32)) -> Result<Self, Error> {
        let guard = Self { old };
        Self::write(v)?;
        Ok(guard)
    }
}

impl Drop for ModuleParams {
    fn drop(&mut self) {
        let _ = Self::write(self.old);
    }
}

/// The crypt target's version in `dmsetup targets` output
/// (`crypt            v1.27.0`).
pub fn crypt_version(targets: &str) -> Option<(u32, u32, u32)> {
    let line = targets
        .lines()
        .find(|l| l.split_whitespace().next() == Some("crypt"))?;
    let v = line.split_whitespace().nth(1)?.trim_start_matches('v');
    let mut n = v.split('.').map(|x| x.parse::<u32>().ok());
    Some((n.next()??, n.next()??, n.next()?.unwrap_or(0)))
}

/// True when `modules` (the text of `modules.dep` or `modules.builtin`)
/// lists the module `name` (`dm-crypt` and `dm_crypt` alike, any
/// compression).
pub fn lists_module(modules: &str, name: &str) -> bool {
    let want = name.replace('-', "_");
    modules.lines().any(|l| {
        let path = l.split(':').next().unwrap_or("");
        let file = path.rsplit('/').next().unwrap_or("");
        file.split(".ko")
            .next()
            .is_some_and(|m| !m.is_empty() && file.contains(".ko") && m.replace('-', "_") == want)
    })
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

/// True when the kernel has `name` loaded, built in, or as a module file
/// of this kernel (what `modprobe -n` would say, without modprobe).
fn module_available(name: &str) -> bool {
    if Path::new("/sys/module")
        .join(name.replace('-', "_"))
        .exists()
    {
        return true;
    }
    let dir = Path::new("/lib/modules").join(kernel_release());
    ["modules.dep", "modules.builtin"]
        .iter()
        .any(|f| std::fs::read_to_string(dir.join(f)).is_ok_and(|t| lists_module(&t, name)))
}

fn dmsetup_targets() -> String {
    Command::new("dmsetup")
        .arg("targets")
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// `cryptsetup --version` (`cryptsetup 2.6.1 flags: …`), when there is one.
fn cryptsetup_version() -> Option<(u32, u32, u32)> {
    let out = Command::new(which("cryptsetup")?)
        .arg("--version")
        .stderr(Stdio::null())
        .output()
        .ok()?;
    parse_cryptsetup_version(&String::from_utf8_lossy(&out.stdout))
}

/// The version in `cryptsetup --version`'s output.
pub fn parse_cryptsetup_version(out: &str) -> Option<(u32, u32, u32)> {
    let v = out.split_whitespace().nth(1)?;
    let mut n = v.split('.').map(|p| {
        p.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse::<u32>()
            .ok()
    });
    Some((n.next()??, n.next()??, n.next().flatten().unwrap_or(0)))
}

/// Checks every prerequisite and returns what the kernel offers, or one
/// message naming everything missing.
pub fn preflight() -> Result<Features, Error> {
    let mut missing = Vec::new();
    if !nix::unistd::geteuid().is_root() {
        missing.push("root privileges (run as root)".to_string());
    }
    if which("dmsetup").is_none() {
        missing.push("dmsetup (apt-get install dmsetup)".to_string());
    }
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/mapper/control")
    {
        Ok(_) => {}
        Err(e) => missing.push(format!(
            "device-mapper in the kernel (/dev/mapper/control: {e})"
        )),
    }
    let kernel = kernel_release();
    let mut crypt = None;
    if which("dmsetup").is_some() {
        crypt = crypt_version(&dmsetup_targets());
        if crypt.is_none() && module_available("dm-crypt") {
            // Loaded on demand; load it now to learn its version.
            if let Some(m) = which("modprobe") {
                let _ = Command::new(m)
                    .arg("dm_crypt")
                    .stderr(Stdio::null())
                    .status();
            }
            crypt = crypt_version(&dmsetup_targets());
        }
        if crypt.is_none() {
            missing.push(format!(
                "the dm-crypt target (not in `dmsetup targets`, no dm-crypt module for kernel {kernel})"
            ));
        }
    }
    let max_io = module_max_io(Path::new(advisor::MODULE_PARAMETERS));
    let features = Features {
        kernel,
        crypt,
        max_io,
        cryptsetup: cryptsetup_version(),
    };
    if crypt.is_some() && !features.workqueue_flags() {
        missing.push(format!(
            "dm-crypt ≥ 1.22 (Linux 5.9) for no_read_workqueue/no_write_workqueue; {}",
            features.describe()
        ));
    }
    let brd_here = Path::new("/dev/ram0").exists() || module_available("brd");
    if !brd_here {
        missing.push(if which("modprobe").is_some() {
            format!(
                "the brd ramdisk module (no brd module for kernel {})",
                features.kernel
            )
        } else {
            "the brd ramdisk module (not loaded, and no modprobe to load it)".to_string()
        });
    }
    if which("fio").is_none() {
        missing.push("fio (apt-get install fio)".to_string());
    }
    if missing.is_empty() {
        Ok(features)
    } else {
        Err(Error::Missing {
            needs: "The --dm-crypt advisor needs a host with device-mapper, dm-crypt, brd, fio and root",
            missing,
        })
    }
}

fn which(tool: &str) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(tool))
        .find(|p| p.is_file())
}

/// What the user asks the advisor.
#[derive(Debug, Clone)]
pub struct Request {
    /// The workload the volume serves.
    pub workload: AdvisorWorkload,
    /// The live mapping whose current flags (and cipher) to start from;
    /// without one: aes-xts-plain64 with no flags, answered for `<name>`.
    pub mapping: Option<String>,
}

struct Mapping(String);

impl Drop for Mapping {
    fn drop(&mut self) {
        let _ = Command::new("dmsetup")
            .args(["remove", "--retry", &self.0])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

fn create(name: &str, table: &str) -> Result<Mapping, Error> {
    let mut child = Command::new("dmsetup")
        .args(["create", name])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| Error::Spawn {
            program: "dmsetup".into(),
            source,
        })?;
    if let Some(mut i) = child.stdin.take() {
        // The table carries the key: stdin keeps it out of the process list.
        let _ = i.write_all(table.as_bytes());
    }
    let out = child.wait_with_output().map_err(|source| Error::Spawn {
        program: format!("dmsetup create {name}"),
        source,
    })?;
    if !out.status.success() {
        return Err(Error::Failed {
            program: format!("dmsetup create {name}"),
            status: out.status,
            output: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(Mapping(name.to_string()))
}

fn output(program: &str, args: &[&str]) -> Result<String, Error> {
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| Error::Spawn {
            program: program.into(),
            source,
        })?;
    if !out.status.success() {
        return Err(Error::Failed {
            program: format!("{program} {}", args.join(" ")),
            status: out.status,
            output: String::from_utf8_lossy(&out.stderr)
                .lines()
                .chain(String::from_utf8_lossy(&out.stdout).lines())
                .take(4)
                .collect::<Vec<_>>()
                .join(" | "),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Throughput (bytes/s, read plus write) per entry of an fio JSON report:
/// `(jobname, bytes/s)` for each job, or for each reporting group under
/// `group_reporting` (named after its first job).
pub fn fio_totals(text: &str) -> Result<Vec<(String, f64)>, Error> {
    let start = text.find('{').ok_or(Error::FioField("a JSON object"))?;
    let v: serde_json::Value = serde_json::from_str(&text[start..]).map_err(Error::FioJson)?;
    let jobs = v["jobs"]
        .as_array()
        .filter(|j| !j.is_empty())
        .ok_or(Error::FioField("jobs"))?;
    let mut out = Vec::new();
    for job in jobs {
        if let Some(e) = job["error"].as_i64().filter(|&e| e != 0) {
            return Err(Error::FioJob(e));
        }
        let mut total = 0.0;
        for dir in ["read", "write"] {
            total += job[dir]["bw_bytes"]
                .as_f64()
                .ok_or(Error::FioField("bw_bytes"))?;
        }
        out.push((job["jobname"].as_str().unwrap_or("").to_string(), total));
    }
    Ok(out)
}

/// Runs the advisor and returns the printable report.
pub fn run(opts: &Options, req: &Request) -> Result<String, Error> {
    opts.validate()?;
    let features = preflight()?;
    let current = match &req.mapping {
        Some(name) => Current::parse(name, &output("dmsetup", &["table", name])?)?,
        None => Current {
            cipher: "aes-xts-plain64".into(),
            key_len: 64,
            flags: Flags {
                kept: (opts.sector_size != 512)
                    .then(|| format!("sector_size:{}", opts.sector_size))
                    .into_iter()
                    .collect(),
                ..Flags::default()
            },
        },
    };
    let name = req.mapping.as_deref().unwrap_or("<name>");
    if !Path::new("/dev/ram0").exists() {
        output(
            "modprobe",
            &["brd", "rd_nr=1", &format!("rd_size={}", opts.size / 1024)],
        )?;
    }
    let ram_size = std::fs::read_to_string("/sys/block/ram0/size")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map_or(opts.size, |sectors| sectors * 512)
        .min(opts.size);
    let unit = current.sector_size().max(512);
    let ram_size = ram_size / unit * unit;
    // Every page of the ramdisk exists before anything is measured (brd
    // answers reads of unwritten pages without touching memory).
    crate::runner::fio::fill(
        &[
            "--filename=/dev/ram0".into(),
            "--direct=1".into(),
            "--ioengine=libaio".into(),
        ],
        ram_size,
    )?;
    let mut key = zeroize::Zeroizing::new(vec![0u8; current.key_len]);
    random_bytes(&mut key)?;
    let hexkey: zeroize::Zeroizing<String> = zeroize::Zeroizing::new(if key.is_empty() {
        "-".into()
    } else {
        key.iter().map(|b| format!("{b:02x}")).collect()
    });
    // Mapping 0 current, 1 the control (current again), 2.. candidates;
    // then the module-parameter candidates, measured on mapping 0 with
    // the parameters set for their runs only.
    let mut flag_sets = current.flags.combinations(features.high_priority());
    let mut sets: Vec<&Flags> = vec![&flag_sets[0]];
    sets.extend(flag_sets.iter());
    let module_sets: Vec<Flags> = features
        .max_io
        .map(|now| current.flags.module_candidates(now))
        .unwrap_or_default();
    let mut maps = Vec::new();
    for (i, f) in sets.iter().enumerate() {
        let table = zeroize::Zeroizing::new(format!(
            "0 {} crypt {} {} 0 /dev/ram0 0 {}",
            ram_size / 512,
            current.cipher,
            hexkey.as_str(),
            f.table_words()
        ));
        maps.push(create(
            &format!("ucrypt-adv-{}-{i}", std::process::id()),
            table.trim_end(),
        )?);
    }
    let labels = req.workload.labels();
    let job_path = std::env::temp_dir().join(format!("ucrypt-advisor-{}.fio", std::process::id()));
    let dev = |m: usize| format!("/dev/mapper/{}", maps[m].0);
    let timing = [
        format!("--runtime={}ms", opts.runtime.as_millis().max(1)),
        format!("--ramp_time={}ms", opts.warmup.as_millis()),
        "--time_based".into(),
    ];
    // One cell on every mapping in `order`, as bytes/s per mapping. A preset
    // cell is one fio process with a stonewalled job group per mapping (one
    // process start per cell, which dominates on slow or emulated CPUs); a
    // job file runs once per mapping.
    let measure = |order: &[usize], cell: usize| -> Result<Vec<f64>, Error> {
        let mut got = vec![0.0; order.len()];
        match &req.workload {
            AdvisorWorkload::Preset(p) => {
                let c = &p.cells[cell];
                let per_job = (ram_size / c.jobs as u64) / u64::from(c.bs) * u64::from(c.bs);
                if per_job == 0 {
                    return Err(crate::OptionsError::TooSmall {
                        size: ram_size,
                        jobs: c.jobs,
                        bs: c.bs,
                    }
                    .into());
                }
                let mut args = vec![
                    "--direct=1".to_string(),
                    "--ioengine=libaio".into(),
                    format!("--size={per_job}"),
                    format!("--offset_increment={per_job}"),
                    "--group_reporting".into(),
                    "--output-format=json".into(),
                ];
                args.extend(timing.iter().cloned());
                args.extend(c.fio_args());
                for &m in order {
                    args.extend([
                        format!("--name=m{m}"),
                        format!("--filename={}", dev(m)),
                        "--stonewall".into(),
                    ]);
                }
                let text = output("fio", &args.iter().map(String::as_str).collect::<Vec<_>>())?;
                for (name, bw) in fio_totals(&text)? {
                    if let Some(m) = name.strip_prefix('m').and_then(|m| m.parse::<usize>().ok()) {
                        if let Some(g) = got.get_mut(m) {
                            *g = bw;
                        }
                    }
                }
            }
            AdvisorWorkload::JobFile { text, .. } => {
                for &m in order {
                    let job = advisor::job_file_for(
                        text,
                        &dev(m),
                        ram_size,
                        opts.runtime.as_millis(),
                        opts.warmup.as_millis(),
                    );
                    std::fs::write(&job_path, job).map_err(|source| Error::Output {
                        path: job_path.clone(),
                        source,
                    })?;
                    let path = job_path.to_string_lossy();
                    let out = output("fio", &["--output-format=json", &path])?;
                    got[m] = fio_totals(&out)?.iter().map(|(_, bw)| bw).sum();
                }
            }
        }
        Ok(got)
    };
    let n = maps.len();
    let now = features.max_io.unwrap_or((0, 0));
    let mut rounds: advisor::Rounds = Vec::new();
    for r in 0..opts.reps {
        if opts.progress {
            eprintln!("advisor: round {}/{}", r + 1, opts.reps);
        }
        let mut round = vec![vec![0.0; labels.len()]; n + module_sets.len()];
        // Interleaved: every mapping once per cell, the order rotated per
        // round so no flag set always runs first or last.
        let order: Vec<usize> = (0..n).map(|k| (k + r) % n).collect();
        for cell in 0..labels.len() {
            let got = measure(&order, cell)?;
            for (row, bw) in round.iter_mut().zip(got) {
                row[cell] = bw;
            }
            for (k, f) in module_sets.iter().enumerate() {
                let Some(v) = f.module else { continue };
                let _set = ModuleParams::set(now, v)?;
                round[n + k][cell] = measure(&[0], cell)?.first().copied().unwrap_or(0.0);
            }
        }
        rounds.push(round);
    }
    let _ = std::fs::remove_file(&job_path);
    drop(maps);
    let header = format!(
        "dm-crypt flag advisor: {}\n{}; {} over brd (/dev/ram0, {} MiB), fio libaio direct=1, {} per measurement\ncurrent flags: {}{}",
        req.workload.describe(),
        features.describe(),
        current.cipher,
        ram_size >> 20,
        humantime::format_duration(opts.runtime),
        current.flags.name(),
        req.mapping
            .as_ref()
            .map_or(" (no --mapping given: cryptsetup's defaults)".to_string(), |m| format!(
                " (from mapping {m}{})",
                if current.flags.kept.is_empty() {
                    String::new()
                } else {
                    format!("; kept: {}", current.flags.kept.join(" "))
                }
            )),
    );
    flag_sets.extend(module_sets);
    let applies = |f: &Flags| !f.high_priority || features.refresh_sets_high_priority();
    Ok(advisor::render_for(
        &header, &labels, &flag_sets, &rounds, name, &applies,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cryptsetup_versions_decide_whether_refresh_sets_high_priority() {
        assert_eq!(
            parse_cryptsetup_version("cryptsetup 2.6.1 flags: UDEV BLKID KEYRING\n"),
            Some((2, 6, 1))
        );
        assert_eq!(
            parse_cryptsetup_version("cryptsetup 2.7.0-rc1"),
            Some((2, 7, 0))
        );
        assert_eq!(parse_cryptsetup_version("garbage"), None);
        let f = |v| Features {
            kernel: "6.12".into(),
            crypt: crypt_version("crypt v1.27.0"),
            max_io: None,
            cryptsetup: v,
        };
        assert!(!f(Some((2, 6, 1))).refresh_sets_high_priority());
        assert!(f(Some((2, 7, 0))).refresh_sets_high_priority());
        assert!(!f(None).refresh_sets_high_priority());
        assert!(f(Some((2, 6, 1)))
            .describe()
            .ends_with("; cryptsetup 2.6.1 (refresh --perf-high_priority: no)"));
    }

    #[test]
    fn preflight_names_what_is_missing() {
        // On a host with everything this passes; elsewhere the message must
        // name each missing component.
        match preflight() {
            Ok(f) => assert!(f.workqueue_flags(), "{f:?}"),
            Err(e) => {
                let m = e.to_string();
                assert!(m.starts_with("The --dm-crypt advisor needs"), "{m}");
                assert!(m.contains("missing here:"), "{m}");
            }
        }
    }

    #[test]
    fn kernel_features_without_modprobe() {
        let targets =
            "striped          v1.6.0\ncrypt            v1.27.0\nlinear           v1.4.0\n";
        assert_eq!(crypt_version(targets), Some((1, 27, 0)));
        assert_eq!(crypt_version("linear v1.4.0\n"), None);
        let old = Features {
            kernel: "5.4".into(),
            crypt: crypt_version("crypt v1.19.0"),
            max_io: None,
            cryptsetup: None,
        };
        assert!(!old.workqueue_flags());
        assert!(
            old.describe().contains("no_write_workqueue: no"),
            "{}",
            old.describe()
        );
        let dep = "kernel/drivers/md/dm-crypt.ko.xz: kernel/drivers/md/dm-mod.ko.xz\n\
                   kernel/drivers/block/brd.ko:\n";
        assert!(lists_module(dep, "dm-crypt") && lists_module(dep, "dm_crypt"));
        assert!(lists_module(dep, "brd"));
        assert!(
            !lists_module(dep, "dm-mod"),
            "a dependency is not a module line"
        );
        assert!(!lists_module(dep, "dm"));
        assert!(lists_module("kernel/drivers/md/dm-mod.ko\n", "dm_mod"));
    }

    #[test]
    fn newer_kernels_offer_high_priority_and_the_module_parameters() {
        let dir = testutil::TempDir::new("advisor-params");
        assert_eq!(module_max_io(&dir.join("")), None, "before 6.11");
        std::fs::write(dir.join("max_read_size"), "0\n").unwrap();
        assert_eq!(module_max_io(&dir.join("")), None, "both or none");
        std::fs::write(dir.join("max_write_size"), "262144\n").unwrap();
        assert_eq!(module_max_io(&dir.join("")), Some((0, 262144)));
        let f = Features {
            kernel: "6.12".into(),
            crypt: crypt_version("crypt v1.27.0"),
            max_io: module_max_io(&dir.join("")),
            cryptsetup: parse_cryptsetup_version("cryptsetup 2.6.1 flags: UDEV BLKID KEYRING"),
        };
        assert!(f.workqueue_flags() && f.high_priority());
        let d = f.describe();
        assert!(d.contains("high_priority: yes"), "{d}");
        assert!(d.contains("max_read_size 0, max_write_size 262144"), "{d}");
        let f610 = Features {
            crypt: crypt_version("crypt v1.25.0"),
            max_io: None,
            cryptsetup: None,
            ..f
        };
        assert!(!f610.high_priority());
        assert!(f610.describe().contains("high_priority: no"));
        assert!(f610.describe().contains("before Linux 6.11"));
    }

    #[test]
    fn fio_totals_add_reads_and_writes_per_job() {
        let t = r#"{"jobs":[{"error":0,"read":{"bw_bytes":100},"write":{"bw_bytes":50}},
                   {"error":0,"read":{"bw_bytes":0},"write":{"bw_bytes":25}}]}"#;
        assert_eq!(
            fio_totals(t).unwrap(),
            [(String::new(), 150.0), (String::new(), 25.0)]
        );
        let named =
            r#"{"jobs":[{"jobname":"m3","error":0,"read":{"bw_bytes":7},"write":{"bw_bytes":0}}]}"#;
        assert_eq!(fio_totals(named).unwrap(), [("m3".to_string(), 7.0)]);
        assert!(matches!(
            fio_totals("{\"jobs\":[]}"),
            Err(Error::FioField("jobs"))
        ));
        assert!(matches!(
            fio_totals(r#"{"jobs":[{"error":5,"read":{"bw_bytes":1},"write":{"bw_bytes":1}}]}"#),
            Err(Error::FioJob(5))
        ));
    }
}
