//! The NBD servers fio measures: ucrypt itself (`ucrypt open --export
//! nbd`), nbdkit (memory plugin as the raw baseline, luks filter) and
//! qemu-storage-daemon (raw, luks), each our child process on a unix
//! socket with its image in /dev/shm (RAM, like the seeds' brd) or under
//! `--dir` (then nbdkit's file plugin is the raw baseline), stopped
//! by pid and its files removed when dropped. The vhost runner
//! (`super::vhost`) starts its servers with the same pieces
//! ([`spawn_ucrypt`], [`spawn`], the images and the /dev/shm naming).
//! Every server also gets SIGTERM if the bench dies without dropping it
//! (`deathsig`).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crypto::perf::Flag;
use nix::sys::signal::{kill, Signal};
use nix::unistd::{sysconf, Pid, SysconfVar};

mod deathsig;

use super::fio::FioPlan;
use crate::target::{random_bytes, Cipher, Mode, Target};
use crate::Error;

/// A block-device server we started, serving NBD on a unix socket.
pub(super) struct Server {
    child: Child,
    /// The NBD URI fio connects to.
    pub uri: String,
    /// Cipher of the export (None for raw).
    pub cipher: Option<Cipher>,
    /// ucrypt's mode (None for peers).
    pub mode: Option<Mode>,
    /// A ucrypt server's binary, runtime directory and volume name, for
    /// `ucrypt status` (None for peers).
    status: Option<(PathBuf, PathBuf, String)>,
    files: Vec<PathBuf>,
}

impl Server {
    /// CPU time the server has used so far.
    pub fn cpu(&self) -> Duration {
        process_cpu(self.child.id())
    }

    /// A ucrypt server's engine counters (`ucrypt status --json`'s
    /// `stats` object); None for peers or when status does not answer.
    pub fn engine_stats(&self) -> Option<serde_json::Value> {
        let (exe, run_dir, name) = self.status.as_ref()?;
        let out = Command::new(exe)
            .env("UCRYPT_RUNTIME_DIR", run_dir)
            .args(["status", "--json", name])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let mut v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        Some(v.get_mut("stats")?.take())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // Ask our own child (by its pid) to shut down cleanly, then reap it.
        // The pid is our unreaped child, so it cannot have been reused.
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
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
    let hz = sysconf(SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100)
        .max(1) as f64;
    Duration::from_secs_f64((ticks(11) + ticks(12)) as f64 / hz)
}

/// True when `name --version` runs.
pub(super) fn tool(name: &str) -> bool {
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
            return Err(Error::ServerExited {
                name: what.into(),
                status: st,
                stderr: err.lines().take(3).collect::<Vec<_>>().join(" | "),
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Err(Error::ServerTimeout {
        name: what.into(),
        socket: sock.into(),
    })
}

pub(super) fn spawn(
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
    let mut child = deathsig::die_with_bench(&mut cmd)
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| Error::Spawn {
            program: name.into(),
            source,
        })?;
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
        child,
        uri: format!("nbd+unix:///{export}?socket={}", sock.display()),
        cipher: None,
        mode: None,
        status: None,
        files,
    })
}

/// Removes the sockets and images a killed bench left in [`shm_dir`]:
/// `ucrypt-bench-<pid>-…` whose process is gone (its servers, our
/// children, went with it or serve nobody now).
pub(super) fn remove_stale() {
    remove_stale_in(&shm_dir());
}

/// [`remove_stale`] in `dir` (a `--dir` the images went to).
pub(super) fn remove_stale_in(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(STEM))
            .and_then(|r| r.split('-').next())
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let p = e.path();
            let _ = match e.file_type() {
                Ok(t) if t.is_dir() => std::fs::remove_dir_all(&p),
                _ => std::fs::remove_file(&p),
            };
        }
    }
}

/// How every socket and image of ours in [`shm_dir`] starts, followed by
/// our pid.
pub(super) const STEM: &str = "ucrypt-bench-";

pub(super) fn shm_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

pub(super) fn make_raw_image(path: &Path, size: u64) -> Result<(), Error> {
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
        .map_err(|source| Error::Spawn {
            program: "qemu-img".into(),
            source,
        })?;
    if !out.status.success() {
        return Err(Error::Failed {
            program: "qemu-img create -f luks".into(),
            status: out.status,
            output: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    Ok(())
}

/// Starts `ucrypt open` for target `t` (its export socket `so`, named
/// `name`): a plain table with a fresh random key over a new `size`-byte
/// image `im`, the table on standard input (the key stays out of the
/// process list), `export` the `--export …` arguments of the frontend.
pub(super) fn spawn_ucrypt(
    exe: &Path,
    t: Target,
    name: &str,
    so: &Path,
    im: &Path,
    size: u64,
    export: &[String],
) -> Result<Server, Error> {
    let cipher = t.cipher.unwrap_or(Cipher::Null);
    make_raw_image(im, size)?;
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
        Mode::Adaptive => "adaptive",
        Mode::Inline => "inline",
        _ => "classic",
    };
    let run_dir = so.with_extension("run");
    let volume = format!("bench-{t}");
    let mut c = Command::new(exe);
    c.env("UCRYPT_RUNTIME_DIR", &run_dir);
    c.args([
        "open",
        "--type",
        "plain",
        "--foreground",
        "--table",
        "-",
        "--mode",
        mode,
    ]);
    if t.mode == Mode::InlineRead {
        c.arg(Flag::NoReadWorkqueue.cli_option());
    }
    if t.mode == Mode::InlineWrite {
        c.arg(Flag::NoWriteWorkqueue.cli_option());
    }
    c.args(export);
    c.arg(im).arg(&volume);
    let mut srv = spawn_with_input(
        name,
        c,
        Some(table.as_str()),
        so,
        "",
        vec![so.to_path_buf(), im.to_path_buf(), run_dir.clone()],
    )?;
    srv.cipher = t.cipher;
    srv.mode = Some(t.mode);
    srv.status = Some((exe.to_path_buf(), run_dir, volume));
    Ok(srv)
}

/// How to start one server.
pub(super) struct Starter {
    /// Target name in the tables (`raw` for nbdkit's memory plugin).
    pub name: String,
    /// ucrypt's target it serves (None for raw and peers).
    pub target: Option<Target>,
    /// Starts it.
    pub start: Box<dyn Fn() -> Result<Server, Error>>,
}

/// The servers of `plan`, in table order: raw, ucrypt's targets, peers.
/// Sockets go to [`shm_dir`], images to `plan.dir` if given (each server
/// then in its production configuration: nbdkit's file plugin with
/// `cache=none` as raw and under the luks filter, qemu-storage-daemon
/// with `cache.direct=on,aio=io_uring`, ucrypt with its defaults), else
/// to [`shm_dir`] too (raw: nbdkit's memory plugin).
pub(super) fn starters(plan: &FioPlan, size: u64, tag: &str) -> Vec<Starter> {
    let dir = shm_dir();
    let on_disk = plan.dir.is_some();
    let tag = tag.to_string();
    let sock = move |n: &str| dir.join(format!("{STEM}{tag}-{n}.sock"));
    let img = {
        let d = plan.dir.clone().unwrap_or_else(shm_dir);
        move |n: &str| d.join(format!("{STEM}{}-{n}.img", std::process::id()))
    };
    let mut v: Vec<Starter> = Vec::new();
    let (s, i) = (sock.clone(), img.clone());
    v.push(Starter {
        name: "raw".into(),
        target: None,
        start: Box::new(move || {
            let mut c = Command::new("nbdkit");
            if on_disk {
                let (so, im) = (s("nbdkit-file"), i("nbdkit-file"));
                make_raw_image(&im, size)?;
                c.args(["--foreground", "--unix"])
                    .arg(&so)
                    .arg("file")
                    .arg(format!("file={}", im.display()))
                    .arg("cache=none");
                return spawn("nbdkit-file", c, &so, "", vec![so.clone(), im.clone()]);
            }
            let so = s("nbdkit-memory");
            c.args(["--foreground", "--unix"])
                .arg(&so)
                .args(["memory", &format!("size={size}")]);
            spawn("nbdkit-memory", c, &so, "", vec![so.clone()])
        }),
    });
    for &t in plan.ucrypt_targets.iter().filter(|t| t.cipher.is_some()) {
        let (s, i, exe) = (sock.clone(), img.clone(), plan.ucrypt_exe.clone());
        let name = format!("ucrypt-{t}");
        v.push(Starter {
            name: name.clone(),
            target: Some(t),
            start: Box::new(move || {
                let so = s(&name);
                let export = ["--export".to_string(), format!("nbd={}", so.display())];
                spawn_ucrypt(&exe, t, &name, &so, &i(&name), size, &export)
            }),
        });
    }
    if plan.peers {
        let pass = "ucrypt-bench";
        let (s, i) = (sock.clone(), img.clone());
        v.push(Starter {
            name: "nbdkit-luks".into(),
            target: None,
            start: Box::new(move || {
                let (so, im) = (s("nbdkit-luks"), i("nbdkit-luks"));
                make_luks_image(&im, size, pass)?;
                let mut c = Command::new("nbdkit");
                c.args(["--foreground", "--unix"])
                    .arg(&so)
                    .args(["--filter=luks", "file"])
                    .arg(format!("file={}", im.display()));
                if on_disk {
                    c.arg("cache=none");
                }
                c.arg(format!("passphrase={pass}"));
                let mut srv = spawn("nbdkit-luks", c, &so, "", vec![so.clone(), im.clone()])?;
                srv.cipher = Some(Cipher::AesXts);
                Ok(srv)
            }),
        });
        for luks in [false, true] {
            let (s, i) = (sock.clone(), img.clone());
            let name = if luks { "qsd-luks" } else { "qsd-raw" };
            v.push(Starter {
                name: name.into(),
                target: None,
                start: Box::new(move || {
                    let (so, im) = (s(name), i(name));
                    let mut c = Command::new("qemu-storage-daemon");
                    if luks {
                        make_luks_image(&im, size, pass)?;
                        c.arg("--object").arg(format!("secret,id=sec0,data={pass}"));
                    } else {
                        make_raw_image(&im, size)?;
                    }
                    c.arg("--blockdev").arg(format!(
                        "driver=file,node-name=file0,filename={}{}",
                        im.display(),
                        if on_disk {
                            ",cache.direct=on,aio=io_uring"
                        } else {
                            ""
                        }
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
            });
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn leftovers_of_a_dead_bench_are_removed_and_live_ones_kept() {
        // Above the kernel's largest pid_max (2^22): never a live process.
        let dead = shm_dir().join(format!("{STEM}4194305-leftover-test.img"));
        let dead_dir = shm_dir().join(format!("{STEM}4194305-leftover-test.run"));
        let ours = shm_dir().join(format!("{STEM}{}-leftover-test.img", std::process::id()));
        let other = shm_dir().join("ucrypt-benchmark-4194305-not-ours");
        std::fs::write(&dead, b"x").unwrap();
        std::fs::create_dir_all(dead_dir.join("sub")).unwrap();
        std::fs::write(&ours, b"x").unwrap();
        std::fs::write(&other, b"x").unwrap();
        remove_stale();
        let (d, dd, o, x) = (
            dead.exists(),
            dead_dir.exists(),
            ours.exists(),
            other.exists(),
        );
        let _ = std::fs::remove_file(&ours);
        let _ = std::fs::remove_file(&other);
        assert!(!d && !dd, "a dead bench's image and run dir are removed");
        assert!(o, "this process's own files are kept");
        assert!(x, "files not named by our stem are kept");
    }
}
