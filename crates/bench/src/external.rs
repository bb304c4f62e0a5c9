//! `--via fio` and `--peers`: the same jobs driven by fio (a real client)
//! over NBD against block-device servers on a tmpfs-backed ramdisk.
//!
//! ```text
//!   fio --ioengine=nbd --uri=nbd+unix:///<export>?socket=S
//!        │
//!        ├─► ucrypt open --export nbd=S --foreground   (ucrypt-<target>)
//!        ├─► nbdkit memory                             (nbdkit-memory, raw)
//!        ├─► nbdkit --filter=luks file                 (nbdkit-luks)
//!        ├─► qemu-storage-daemon raw                   (qsd-raw)
//!        └─► qemu-storage-daemon luks                  (qsd-luks)
//! ```
//!
//! Images live in /dev/shm (RAM, like the seeds' brd). Every server is our
//! child process, killed by pid when its jobs are done. CPU time per GiB
//! adds the server's CPU (from /proc/<pid>/stat) to fio's own.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::driver::{Rw, Workload};
use crate::report::{self, CellResult, Phase, Report};
use crate::stats::{self, Percentiles};
use crate::target::{random_bytes, Cipher, Target};
use crate::{Error, Options};

/// What to run through fio.
#[derive(Debug, Clone)]
pub struct FioPlan {
    /// ucrypt's own targets (each served by `ucrypt open`); raw is served by
    /// nbdkit's memory plugin (fio needs a server; ucrypt has no raw mode).
    pub ucrypt_targets: Vec<Target>,
    /// Add nbdkit (luks filter) and qemu-storage-daemon (raw, luks).
    pub peers: bool,
    /// The ucrypt binary (`std::env::current_exe()` from the CLI).
    pub ucrypt_exe: PathBuf,
}

/// One fio measurement.
#[derive(Debug, Clone, Copy)]
pub struct FioRep {
    /// Bytes per second.
    pub bytes_per_s: f64,
    /// IOPS.
    pub iops: f64,
    /// Completion latency percentiles.
    pub lat: Option<Percentiles>,
    /// fio's CPU seconds (user + system) over the run.
    pub cpu_s: f64,
    /// Bytes moved.
    pub bytes: u64,
}

/// Runs one fio job; `engine_args` says where (e.g. `--ioengine=nbd`,
/// `--uri=…`, or `--filename=/dev/…`, `--ioengine=libaio`, `--direct=1`).
pub fn fio(
    engine_args: &[String],
    w: &Workload,
    size: u64,
    ramp: Duration,
) -> Result<FioRep, Error> {
    let per_job = (size / w.jobs as u64) / u64::from(w.bs) * u64::from(w.bs);
    if per_job == 0 {
        return Err(Error::Usage(format!(
            "Device of {size} bytes too small for {} jobs of {} bytes",
            w.jobs, w.bs
        )));
    }
    let mut cmd = Command::new("fio");
    cmd.args([
        "--name=ucrypt-bench".to_string(),
        format!("--rw={}", w.rw.name()),
        format!("--bs={}", w.bs),
        format!("--iodepth={}", w.qd),
        format!("--numjobs={}", w.jobs),
        format!("--size={per_job}"),
        format!("--offset_increment={per_job}"),
        format!("--runtime={}ms", w.runtime.as_millis().max(1)),
        format!("--ramp_time={}ms", ramp.as_millis()),
        "--time_based".into(),
        "--group_reporting".into(),
        "--output-format=json".into(),
    ]);
    cmd.args(engine_args);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::External(format!("Cannot run fio: {e}")))?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(Error::External(format!(
            "fio failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .chain(text.lines())
                .take(4)
                .collect::<Vec<_>>()
                .join(" | ")
        )));
    }
    parse_fio_json(&text, w.rw)
}

/// Writes the whole device once (1M blocks, QD8).
pub fn fill(engine_args: &[String], size: u64) -> Result<(), Error> {
    let out = Command::new("fio")
        .args([
            "--name=fill",
            "--rw=write",
            "--bs=1M",
            "--iodepth=8",
            &format!("--size={size}"),
            "--output-format=json",
        ])
        .args(engine_args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::External(format!("Cannot run fio: {e}")))?;
    if !out.status.success() {
        return Err(Error::External(format!(
            "fio fill failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Extracts throughput, IOPS, latency and CPU from fio's JSON output (text
/// before the first `{` — warnings — is skipped).
pub fn parse_fio_json(text: &str, rw: Rw) -> Result<FioRep, Error> {
    let start = text
        .find('{')
        .ok_or_else(|| Error::External("fio printed no JSON".into()))?;
    let v: serde_json::Value = serde_json::from_str(&text[start..])
        .map_err(|e| Error::External(format!("fio JSON unreadable: {e}")))?;
    let job = &v["jobs"][0];
    let dir = if rw.is_write() {
        &job["write"]
    } else {
        &job["read"]
    };
    let num = |x: &serde_json::Value| {
        x.as_f64()
            .ok_or_else(|| Error::External("fio JSON lacks a field".into()))
    };
    let bytes_per_s = num(&dir["bw_bytes"])?;
    let iops = num(&dir["iops"])?;
    let bytes = dir["io_bytes"].as_u64().unwrap_or(0);
    if let Some(e) = job["error"].as_i64().filter(|&e| e != 0) {
        return Err(Error::External(format!("fio job error {e}")));
    }
    let pct = &dir["clat_ns"]["percentile"];
    let p = |k: &str| pct[k].as_f64().map(|ns| ns / 1000.0);
    let lat = match (p("50.000000"), p("99.000000"), p("99.900000")) {
        (Some(p50), Some(p99), Some(p999)) => Some(Percentiles { p50, p99, p999 }),
        _ => None,
    };
    let runtime_s = job["job_runtime"].as_f64().unwrap_or(0.0) / 1000.0;
    let cpu_pct = job["usr_cpu"].as_f64().unwrap_or(0.0) + job["sys_cpu"].as_f64().unwrap_or(0.0);
    Ok(FioRep {
        bytes_per_s,
        iops,
        lat,
        cpu_s: cpu_pct / 100.0 * runtime_s,
        bytes,
    })
}

/// A block-device server we started, serving NBD on a unix socket.
struct Server {
    name: String,
    child: Child,
    uri: String,
    cipher: Option<Cipher>,
    mode: Option<crate::Mode>,
    files: Vec<PathBuf>,
}

impl Server {
    fn cpu(&self) -> Duration {
        process_cpu(self.child.id())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Ask our own child (by its pid) to shut down cleanly, then reap it.
        if let Ok(pid) = libc::pid_t::try_from(self.child.id()) {
            // SAFETY: kill() has no memory-safety preconditions; the pid is
            // our unreaped child, so it cannot have been reused.
            unsafe { libc::kill(pid, libc::SIGTERM) };
        }
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(3) {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        for f in &self.files {
            let _ = if f.is_dir() {
                std::fs::remove_dir_all(f)
            } else {
                std::fs::remove_file(f)
            };
        }
    }
}

/// User + system CPU of process `pid` (`/proc/<pid>/stat` fields 14, 15).
pub fn process_cpu(pid: u32) -> Duration {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return Duration::ZERO;
    };
    // Fields after the parenthesised command name (which may contain spaces).
    let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) else {
        return Duration::ZERO;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // rest[0] is field 3 (state): utime = field 14 → index 11, stime → 12.
    // SAFETY: sysconf has no memory-safety preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Duration::from_secs_f64((ticks(11) + ticks(12)) as f64 / hz)
}

fn tool(name: &str) -> bool {
    Command::new(name)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

fn wait_for_socket(sock: &Path, child: &mut Child, what: &str) -> Result<(), Error> {
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(15) {
        if sock.exists() {
            return Ok(());
        }
        if let Ok(Some(st)) = child.try_wait() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                use std::io::Read;
                let _ = e.read_to_string(&mut err);
            }
            return Err(Error::External(format!(
                "{what} exited ({st}): {}",
                err.lines().take(3).collect::<Vec<_>>().join(" | ")
            )));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(Error::External(format!(
        "{what} did not create its socket {} within 15 s",
        sock.display()
    )))
}

fn spawn(
    name: &str,
    cmd: Command,
    sock: &Path,
    export: &str,
    files: Vec<PathBuf>,
) -> Result<Server, Error> {
    spawn_with_input(name, cmd, None, sock, export, files)
}

/// Starts a server, optionally writing `input` (e.g. a table line with a
/// key, kept out of the process list) to its standard input.
fn spawn_with_input(
    name: &str,
    mut cmd: Command,
    input: Option<&str>,
    sock: &Path,
    export: &str,
    files: Vec<PathBuf>,
) -> Result<Server, Error> {
    let mut child = cmd
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| Error::External(format!("Cannot start {name}: {e}")))?;
    if let (Some(data), Some(mut stdin)) = (input, child.stdin.take()) {
        use std::io::Write;
        let _ = stdin
            .write_all(data.as_bytes())
            .and_then(|()| stdin.write_all(b"\n"));
    }
    if let Err(e) = wait_for_socket(sock, &mut child, name) {
        let _ = child.kill();
        let _ = child.wait();
        for f in &files {
            let _ = std::fs::remove_file(f);
        }
        return Err(e);
    }
    // Keep stderr drained so a chatty server never blocks.
    if let Some(mut e) = child.stderr.take() {
        std::thread::spawn(move || std::io::copy(&mut e, &mut std::io::sink()));
    }
    Ok(Server {
        name: name.into(),
        child,
        uri: format!("nbd+unix:///{export}?socket={}", sock.display()),
        cipher: None,
        mode: None,
        files,
    })
}

fn shm_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

fn make_raw_image(path: &Path, size: u64) -> Result<(), Error> {
    let f = std::fs::File::create(path).map_err(|source| Error::Output {
        path: path.into(),
        source,
    })?;
    f.set_len(size).map_err(|source| Error::Output {
        path: path.into(),
        source,
    })
}

fn make_luks_image(path: &Path, size: u64, pass: &str) -> Result<(), Error> {
    let out = Command::new("qemu-img")
        .args(["create", "-q", "-f", "luks", "--object"])
        .arg(format!("secret,id=sec0,data={pass}"))
        .args([
            "-o",
            "key-secret=sec0,iter-time=10,cipher-alg=aes-256,cipher-mode=xts,ivgen-alg=plain64",
        ])
        .arg(path)
        .arg(size.to_string())
        .output()
        .map_err(|e| Error::External(format!("Cannot run qemu-img: {e}")))?;
    if !out.status.success() {
        return Err(Error::External(format!(
            "qemu-img create -f luks failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

type Starter = Box<dyn Fn() -> Result<Server, Error>>;

fn starters(plan: &FioPlan, size: u64, tag: &str) -> Vec<(String, Starter)> {
    let dir = shm_dir();
    let tag = tag.to_string();
    let sock = move |n: &str| dir.join(format!("ucrypt-bench-{tag}-{n}.sock"));
    let img = {
        let d = shm_dir();
        move |n: &str| d.join(format!("ucrypt-bench-{}-{n}.img", std::process::id()))
    };
    let mut v: Vec<(String, Starter)> = Vec::new();
    let (s, i) = (sock.clone(), img.clone());
    v.push((
        "nbdkit-memory".into(),
        Box::new(move || {
            let so = s("nbdkit-memory");
            let mut c = Command::new("nbdkit");
            c.args(["--foreground", "--unix"])
                .arg(&so)
                .args(["memory", &format!("size={size}")]);
            let _ = &i;
            spawn("nbdkit-memory", c, &so, "", vec![so.clone()])
        }),
    ));
    for &t in plan.ucrypt_targets.iter().filter(|t| t.cipher.is_some()) {
        let (s, i, exe) = (sock.clone(), img.clone(), plan.ucrypt_exe.clone());
        let name = format!("ucrypt-{t}");
        v.push((
            name.clone(),
            Box::new(move || {
                let cipher = t.cipher.unwrap_or(Cipher::Null);
                let (so, im) = (s(&name), i(&name));
                make_raw_image(&im, size)?;
                let mut key = zeroize::Zeroizing::new(vec![0u8; cipher.key_len()]);
                random_bytes(&mut key)?;
                let hexkey = zeroize::Zeroizing::new(if key.is_empty() {
                    "-".to_string()
                } else {
                    key.iter().map(|b| format!("{b:02x}")).collect()
                });
                let table = zeroize::Zeroizing::new(format!(
                    "0 {} crypt {} {} 0 {} 0",
                    size / 512,
                    cipher.spec(),
                    hexkey.as_str(),
                    im.display()
                ));
                let mode = match t.mode {
                    crate::Mode::Adaptive => "adaptive",
                    crate::Mode::Inline => "inline",
                    _ => "classic",
                };
                let run_dir = so.with_extension("run");
                let mut c = Command::new(&exe);
                c.env("UCRYPT_RUNTIME_DIR", &run_dir);
                c.args([
                    "open",
                    "--type",
                    "plain",
                    "--foreground",
                    "--table-stdin",
                    "--mode",
                    mode,
                ]);
                if t.mode == crate::Mode::InlineRead {
                    c.arg("--perf-no_read_workqueue");
                }
                if t.mode == crate::Mode::InlineWrite {
                    c.arg("--perf-no_write_workqueue");
                }
                c.arg("--export").arg(format!("nbd={}", so.display()));
                c.arg(&im).arg(format!("bench-{}", t));
                let mut srv = spawn_with_input(
                    &name,
                    c,
                    Some(table.as_str()),
                    &so,
                    "",
                    vec![so.clone(), im.clone(), run_dir],
                )?;
                srv.cipher = t.cipher;
                srv.mode = Some(t.mode);
                Ok(srv)
            }),
        ));
    }
    if plan.peers {
        let pass = "ucrypt-bench";
        let (s, i) = (sock.clone(), img.clone());
        v.push((
            "nbdkit-luks".into(),
            Box::new(move || {
                let (so, im) = (s("nbdkit-luks"), i("nbdkit-luks"));
                make_luks_image(&im, size, pass)?;
                let mut c = Command::new("nbdkit");
                c.args(["--foreground", "--unix"])
                    .arg(&so)
                    .args(["--filter=luks", "file"])
                    .arg(format!("file={}", im.display()));
                c.arg(format!("passphrase={pass}"));
                let mut srv = spawn("nbdkit-luks", c, &so, "", vec![so.clone(), im.clone()])?;
                srv.cipher = Some(Cipher::AesXts);
                Ok(srv)
            }),
        ));
        for luks in [false, true] {
            let (s, i) = (sock.clone(), img.clone());
            let name = if luks { "qsd-luks" } else { "qsd-raw" };
            v.push((
                name.into(),
                Box::new(move || {
                    let (so, im) = (s(name), i(name));
                    let mut c = Command::new("qemu-storage-daemon");
                    if luks {
                        make_luks_image(&im, size, pass)?;
                        c.arg("--object").arg(format!("secret,id=sec0,data={pass}"));
                    } else {
                        make_raw_image(&im, size)?;
                    }
                    c.arg("--blockdev").arg(format!(
                        "driver=file,node-name=file0,filename={}",
                        im.display()
                    ));
                    c.arg("--blockdev").arg(if luks {
                        "driver=luks,node-name=disk0,file=file0,key-secret=sec0".to_string()
                    } else {
                        "driver=raw,node-name=disk0,file=file0".to_string()
                    });
                    c.arg("--nbd-server")
                        .arg(format!("addr.type=unix,addr.path={}", so.display()));
                    c.arg("--export")
                        .arg("type=nbd,id=exp0,node-name=disk0,name=disk0,writable=on");
                    let mut srv = spawn(name, c, &so, "disk0", vec![so.clone(), im.clone()])?;
                    srv.cipher = luks.then_some(Cipher::AesXts);
                    Ok(srv)
                }),
            ));
        }
    }
    v
}

/// Runs the plan through fio: the headline workloads (4k QD1 and 1M QD8,
/// the ratios issue 5 asks about) and the options' sweep, for every server.
pub fn run(opts: &Options, plan: &FioPlan) -> Result<Report, Error> {
    let mut missing: Vec<&str> = Vec::new();
    if !tool("fio") {
        missing.push("fio");
    }
    if !tool("nbdkit") {
        missing.push("nbdkit (the raw baseline server)");
    }
    if plan.peers && !tool("qemu-storage-daemon") {
        missing.push("qemu-storage-daemon");
    }
    if plan.peers && !tool("qemu-img") {
        missing.push("qemu-img (to make LUKS images)");
    }
    if !missing.is_empty() {
        return Err(Error::Missing(format!(
            "Missing for --via fio/--peers: {}",
            missing.join(", ")
        )));
    }
    let started = humantime::format_rfc3339_seconds(std::time::SystemTime::now()).to_string();
    let t0 = Instant::now();
    // Every server gets its own RAM image: keep them small.
    let size = opts.size.min(256 << 20);
    let mut heads: Vec<Workload> = Vec::new();
    for (bs, qd) in [(4096u32, 1usize), (1 << 20, 8)] {
        for rw in [Rw::Read, Rw::Write] {
            heads.push(Workload {
                rw,
                bs,
                qd,
                jobs: 1,
                runtime: opts.runtime,
            });
        }
    }
    let mut sweep: Vec<Workload> = Vec::new();
    for &rw in &opts.rw {
        for &bs in &opts.bs {
            for &jobs in &opts.jobs {
                for &qd in &opts.qd {
                    sweep.push(Workload {
                        rw,
                        bs,
                        qd,
                        jobs,
                        runtime: opts.sweep_runtime,
                    });
                }
            }
        }
    }
    let tag = format!("{}-{}", std::process::id(), crate::timestamp_compact());
    let mut cells = Vec::new();
    let mut skipped = Vec::new();
    let mut ciphers = Vec::new();
    for (name, start) in starters(plan, size, &tag) {
        eprintln!("bench: fio against {name} …");
        let srv = match start() {
            Ok(s) => s,
            Err(e) => {
                skipped.push(report::Skipped {
                    target: name,
                    reason: e.to_string(),
                });
                continue;
            }
        };
        if let Some(c) = srv.cipher {
            if !ciphers.contains(&c) {
                ciphers.push(c);
            }
        }
        let args = vec!["--ioengine=nbd".to_string(), format!("--uri={}", srv.uri)];
        // Fill the export so no server answers reads from unallocated holes.
        if let Err(e) = fill(&args, size) {
            skipped.push(report::Skipped {
                target: name,
                reason: e.to_string(),
            });
            continue;
        }
        let target = if srv.name == "nbdkit-memory" {
            "raw".to_string()
        } else {
            srv.name.clone()
        };
        // The sweep covers raw and ucrypt's sweep targets; peers get the headline.
        let swept = target == "raw"
            || opts
                .sweep_targets
                .iter()
                .any(|t| format!("ucrypt-{t}") == target);
        let none = Vec::new();
        let sweep_here = if swept && !opts.sweep_targets.is_empty() {
            &sweep
        } else {
            &none
        };
        for (phase, list, reps) in [
            (Phase::Headline, &heads, opts.reps),
            (Phase::Sweep, sweep_here, opts.sweep_reps),
        ] {
            for w in list.iter() {
                let mut mib = Vec::new();
                let mut iops = Vec::new();
                let mut lats = Vec::new();
                let mut cpu = Vec::new();
                let mut errors = 0;
                let mut error = None;
                for _ in 0..reps {
                    let c0 = srv.cpu();
                    match fio(&args, w, size, opts.warmup) {
                        Ok(r) => {
                            let server_cpu = srv.cpu().saturating_sub(c0).as_secs_f64();
                            mib.push(stats::mib_per_s(r.bytes_per_s));
                            iops.push(r.iops);
                            lats.extend(r.lat);
                            if r.bytes > 0 {
                                cpu.push((server_cpu + r.cpu_s) / (r.bytes as f64 / stats::GIB));
                            }
                        }
                        Err(e) => {
                            errors += 1;
                            error.get_or_insert(e.to_string());
                        }
                    }
                }
                let mut cell = CellResult::from_parts(
                    phase, &target, srv.cipher, srv.mode, w, reps, &mib, &iops, &lats, &cpu,
                );
                cell.errors = errors;
                cell.error = error;
                cells.push(cell);
            }
        }
        drop(srv);
    }
    let mut crypto = Vec::new();
    for c in ciphers {
        let mut sizes: Vec<u32> = heads
            .iter()
            .map(|w| w.bs)
            .chain(opts.bs.iter().copied())
            .collect();
        sizes.sort_unstable();
        sizes.dedup();
        for bs in sizes {
            crypto.push(crate::measure_crypto(
                c,
                bs,
                (opts.sweep_runtime / 2).max(Duration::from_millis(10)),
            )?);
        }
    }
    report::derive(&mut cells, &crypto);
    Ok(Report {
        schema_version: report::SCHEMA_VERSION,
        tool: format!("ucrypt bench {}", env!("CARGO_PKG_VERSION")),
        started,
        duration_s: t0.elapsed().as_secs_f64(),
        machine: report::Machine::detect(),
        via: if plan.peers {
            "fio+peers".into()
        } else {
            "fio".into()
        },
        options: report::OptionsRecord::from(&Options {
            size,
            ..opts.clone()
        }),
        crypto,
        cells,
        skipped,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fio_json() {
        let text = r#"note: both iodepth >= 1 and synchronous I/O engine are selected
{"jobs":[{"jobname":"x","error":0,"job_runtime":1000,"usr_cpu":10.0,"sys_cpu":15.0,
 "read":{"io_bytes":104857600,"bw_bytes":104857600,"iops":25600.0,
  "clat_ns":{"percentile":{"50.000000":12000,"99.000000":30000,"99.900000":45000}}},
 "write":{"io_bytes":0,"bw_bytes":0,"iops":0.0}}]}"#;
        let r = parse_fio_json(text, Rw::Read).unwrap();
        assert_eq!(stats::mib_per_s(r.bytes_per_s), 100.0);
        assert_eq!(r.iops, 25600.0);
        assert_eq!(
            r.lat,
            Some(Percentiles {
                p50: 12.0,
                p99: 30.0,
                p999: 45.0
            })
        );
        assert!((r.cpu_s - 0.25).abs() < 1e-9);
        assert_eq!(parse_fio_json(text, Rw::Write).unwrap().lat, None);
        assert!(parse_fio_json("garbage", Rw::Read).is_err());
        assert!(parse_fio_json("{\"jobs\":[]}", Rw::Read).is_err());
    }

    #[test]
    fn own_cpu_time_is_readable() {
        let t = Instant::now();
        let mut x = 0u64;
        while t.elapsed() < Duration::from_millis(30) {
            x = x.wrapping_add(std::hint::black_box(1));
        }
        assert!(x > 0);
        assert!(process_cpu(std::process::id()) > Duration::ZERO);
        assert_eq!(process_cpu(u32::MAX), Duration::ZERO);
    }
}
