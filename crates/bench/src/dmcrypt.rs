//! `--dm-crypt`: the seeds' exact experiment on the real kernel, and a flag
//! advisor.
//!
//! ```text
//!   modprobe brd rd_nr=1 rd_size=…      → /dev/ram0 (the seeds' ramdisk)
//!   dmsetup create ucrypt-bench-<cipher>-<flags>   (table on stdin)
//!       0 <sectors> crypt <cipher> <key> 0 /dev/ram0 0 [n flags…]
//!   fio --filename=/dev/… --direct=1 --ioengine=libaio  (each workload)
//!   dmsetup remove …; print the table and which flags win per workload,
//!   with the `cryptsetup refresh --perf-…` line that applies them
//! ```
//!
//! Needs root, device-mapper (`dmsetup` and a working /dev/mapper/control),
//! the brd module and fio. [`preflight`] checks them all first and names
//! every missing one, so the command fails at once where they are absent.

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::driver::{Rw, Workload};
use crate::runner::fio::fio;
use crate::stats;
use crate::target::{random_bytes, Cipher};
use crate::{Error, Options};

/// The four flag combinations of the seeds.
pub const FLAG_SETS: [(&str, &[&str]); 4] = [
    ("none", &[]),
    ("no_read_workqueue", &["no_read_workqueue"]),
    ("no_write_workqueue", &["no_write_workqueue"]),
    ("both", &["no_read_workqueue", "no_write_workqueue"]),
];

/// Checks every prerequisite and returns one message naming all missing.
pub fn preflight() -> Result<(), Error> {
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
    let brd_loaded = Path::new("/sys/module/brd").exists() || Path::new("/dev/ram0").exists();
    if !brd_loaded {
        let probe = which("modprobe").map(|m| {
            Command::new(m)
                .args(["-n", "brd"])
                .stderr(Stdio::null())
                .status()
        });
        match probe {
            Some(Ok(st)) if st.success() => {}
            Some(_) => missing.push(
                "the brd ramdisk module (modprobe -n brd fails: no module for this kernel)"
                    .to_string(),
            ),
            None => missing.push(
                "the brd ramdisk module (not loaded, and no modprobe to load it)".to_string(),
            ),
        }
    }
    if which("fio").is_none() {
        missing.push("fio (apt-get install fio)".to_string());
    }
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Error::Missing {
            needs: "The --dm-crypt experiment needs a host with device-mapper, brd, fio and root",
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

/// One kernel measurement.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KernelCell {
    /// `ram0` or `<cipher>/<flags>`.
    pub device: String,
    /// Cipher spec (None for the raw ramdisk).
    pub cipher: Option<String>,
    /// Flag set name.
    pub flags: Option<String>,
    /// Direction.
    pub rw: Rw,
    /// Block size.
    pub bs: u32,
    /// Queue depth.
    pub qd: usize,
    /// Jobs.
    pub jobs: usize,
    /// Median MiB/s.
    pub mib_s: f64,
}

/// The workloads the advisor decides for: the seeds' 4k QD1, many small
/// parallel requests, and Nobuto's large deep IO.
pub fn workloads(runtime: Duration) -> Vec<Workload> {
    let mut v = Vec::new();
    for (bs, qd, jobs) in [(4096u32, 1usize, 1usize), (4096, 32, 4), (4 << 20, 16, 1)] {
        for rw in [Rw::Read, Rw::Write] {
            v.push(Workload {
                rw,
                bs,
                qd,
                jobs,
                runtime,
            });
        }
    }
    v
}

struct Mapping(String);

impl Drop for Mapping {
    fn drop(&mut self) {
        let _ = Command::new("dmsetup")
            .args(["remove", "--retry", &self.0])
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

/// Runs the experiment and returns the printable report.
pub fn run(opts: &Options) -> Result<String, Error> {
    preflight()?;
    let size = opts.size;
    if !Path::new("/dev/ram0").exists() {
        let st = Command::new("modprobe")
            .args(["brd", "rd_nr=1", &format!("rd_size={}", size / 1024)])
            .status()
            .map_err(|source| Error::Spawn {
                program: "modprobe brd".into(),
                source,
            })?;
        if !st.success() {
            return Err(Error::Failed {
                program: "modprobe brd".into(),
                status: st,
                output: String::new(),
            });
        }
    }
    let ram_size = std::fs::read_to_string("/sys/block/ram0/size")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map_or(size, |sectors| sectors * 512)
        .min(size);
    let sectors = ram_size / 512;
    let ws = workloads(opts.runtime);
    let direct = |dev: &str| {
        vec![
            format!("--filename={dev}"),
            "--ioengine=libaio".into(),
            "--direct=1".into(),
        ]
    };
    let measure = |dev: &str, w: &Workload| -> Result<f64, Error> {
        let mut v = Vec::new();
        for _ in 0..opts.reps {
            v.push(stats::mib_per_s(
                fio(&direct(dev), w, ram_size, opts.warmup)?.bytes_per_s,
            ));
        }
        Ok(stats::median(&v).unwrap_or(0.0))
    };
    let mut cells = Vec::new();
    for w in &ws {
        cells.push(KernelCell {
            device: "ram0".into(),
            cipher: None,
            flags: None,
            rw: w.rw,
            bs: w.bs,
            qd: w.qd,
            jobs: w.jobs,
            mib_s: measure("/dev/ram0", w)?,
        });
    }
    for cipher in [Cipher::Null, Cipher::AesXts] {
        let mut key = zeroize::Zeroizing::new(vec![0u8; cipher.key_len()]);
        random_bytes(&mut key)?;
        let hexkey: zeroize::Zeroizing<String> = zeroize::Zeroizing::new(if key.is_empty() {
            "-".into()
        } else {
            key.iter().map(|b| format!("{b:02x}")).collect()
        });
        for (fname, flags) in FLAG_SETS {
            let name = format!(
                "ucrypt-bench-{}-{}",
                cipher.short(),
                fname.replace('_', "-")
            );
            let mut table = format!(
                "0 {sectors} crypt {} {} 0 /dev/ram0 0",
                cipher.spec(),
                hexkey.as_str()
            );
            if !flags.is_empty() {
                table.push_str(&format!(" {} {}", flags.len(), flags.join(" ")));
            }
            let table = zeroize::Zeroizing::new(table);
            let map = create(&name, &table)?;
            let dev = format!("/dev/mapper/{}", map.0);
            for w in &ws {
                cells.push(KernelCell {
                    device: format!("{}/{fname}", cipher.short()),
                    cipher: Some(cipher.spec().into()),
                    flags: Some(fname.into()),
                    rw: w.rw,
                    bs: w.bs,
                    qd: w.qd,
                    jobs: w.jobs,
                    mib_s: measure(&dev, w)?,
                });
            }
            drop(map);
        }
    }
    Ok(advise(&cells, &ws))
}

/// Formats the kernel table and, per cipher and workload, the fastest flag
/// set with the `cryptsetup refresh` line for it.
pub fn advise(cells: &[KernelCell], ws: &[Workload]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "dm-crypt on brd (/dev/ram0), fio libaio direct=1, MiB/s (median):"
    );
    let _ = writeln!(
        s,
        "{:<26} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "device", "4k QD1 r", "4k QD1 w", "4k 32x4 r", "4k 32x4 w", "4M QD16 r", "4M QD16 w"
    );
    let mut devices: Vec<&str> = Vec::new();
    for c in cells {
        if !devices.contains(&c.device.as_str()) {
            devices.push(&c.device);
        }
    }
    for d in &devices {
        let _ = write!(s, "{d:<26}");
        for w in ws {
            let v = cells.iter().find(|c| {
                c.device == *d && c.rw == w.rw && c.bs == w.bs && c.qd == w.qd && c.jobs == w.jobs
            });
            let _ = write!(s, " {:>9.1}", v.map_or(0.0, |c| c.mib_s));
        }
        let _ = writeln!(s);
    }
    let _ = writeln!(s);
    for cipher in [Cipher::Null, Cipher::AesXts] {
        let mut pairs = Vec::new();
        for pair in ws.chunks(2) {
            let [r, w] = pair else { continue };
            // The flag set with the best read + write for this workload.
            let score = |fname: &str| {
                [r, w]
                    .iter()
                    .map(|wl| {
                        cells
                            .iter()
                            .find(|c| {
                                c.cipher.as_deref() == Some(cipher.spec())
                                    && c.flags.as_deref() == Some(fname)
                                    && c.rw == wl.rw
                                    && c.bs == wl.bs
                                    && c.qd == wl.qd
                                    && c.jobs == wl.jobs
                            })
                            .map_or(0.0, |c| c.mib_s)
                    })
                    .sum::<f64>()
            };
            let best = FLAG_SETS
                .iter()
                .map(|(f, _)| (*f, score(f)))
                .max_by(|a, b| a.1.total_cmp(&b.1));
            if let Some((f, _)) = best {
                pairs.push((
                    format!("{} QD{} jobs={}", crate::report::fmt_bs(r.bs), r.qd, r.jobs),
                    f,
                ));
            }
        }
        for (wl, f) in pairs {
            let perf = match f {
                "no_read_workqueue" => "--perf-no_read_workqueue",
                "no_write_workqueue" => "--perf-no_write_workqueue",
                "both" => "--perf-no_read_workqueue --perf-no_write_workqueue",
                _ => "",
            };
            let line = if perf.is_empty() {
                "cryptsetup refresh <name>  (default queues)".to_string()
            } else {
                format!("cryptsetup refresh {perf} <name>")
            };
            let _ = writeln!(s, "{:<16} {:<20} use {:<20} {line}", cipher.spec(), wl, f);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preflight_names_what_is_missing() {
        // On a host with everything this passes; elsewhere the message must
        // name each missing component.
        if let Err(e) = preflight() {
            let m = e.to_string();
            assert!(m.starts_with("The --dm-crypt experiment needs"), "{m}");
            assert!(m.contains("missing here:"), "{m}");
        }
    }

    #[test]
    fn advice_picks_the_fastest_flags() {
        let ws = workloads(Duration::from_millis(1));
        let mut cells = Vec::new();
        for (fname, _) in FLAG_SETS {
            for w in &ws {
                // "both" wins small IO, "none" wins 4M.
                let mib = match (fname, w.bs) {
                    ("both", 4096) => 300.0,
                    ("none", b) if b > 4096 => 900.0,
                    _ => 100.0,
                };
                cells.push(KernelCell {
                    device: format!("aes/{fname}"),
                    cipher: Some("aes-xts-plain64".into()),
                    flags: Some(fname.into()),
                    rw: w.rw,
                    bs: w.bs,
                    qd: w.qd,
                    jobs: w.jobs,
                    mib_s: mib,
                });
            }
        }
        let s = advise(&cells, &ws);
        assert!(s.contains("aes-xts-plain64  4k QD1 jobs=1"), "{s}");
        assert!(s.contains("use both                 cryptsetup refresh --perf-no_read_workqueue --perf-no_write_workqueue <name>"), "{s}");
        assert!(s.contains("4M QD16 jobs=1       use none"), "{s}");
    }
}
