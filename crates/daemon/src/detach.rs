//! Detaching: the caller resolves the table (prompting, KDFs) in the
//! foreground, then re-executes itself as a daemon in its own process
//! group, handing it the [`VolumeSpec`] and the table — key included —
//! over a pipe on stdin, never on the command line. The child's command
//! line is fixed ([`CHILD_ARGS`] and the name, for `ps`): it parses no
//! options, everything it serves comes from the pipe.
//!
//! ```text
//!  caller: spawn(exe, spec, table) ──stdin──► child: serve_stdin()
//!     │  stdout+stderr ─► NAME.log      line 1: the VolumeSpec as JSON
//!     │                                 rest:   the table with its keys
//!     │                                 (read into locked memory)
//!     └─ polls ping on NAME.ctl.sock until it answers (or the child exits)
//! ```
//!
//! The volume's name stays held across the hand-over: the caller's
//! [`NameLock`] descriptor is inherited by the child (named in
//! [`runtime::NAME_LOCK_FD_ENV`]), which adopts it, so no second `open` of
//! the name can slip in between.
//!

use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crypto::table::Targets;
use crypto::Secret;

use crate::control::{self, Ping};
use crate::error::{invalid, Error, ErrorKind, Result};
use crate::runtime::{self, NameLock, Paths};
use crate::spec::VolumeSpec;

/// The detached daemon's command line before the volume's name: the
/// binary's hidden `serve --spec-stdin` (the name only shows in `ps`; the
/// child checks it against the spec).
pub const CHILD_ARGS: [&str; 2] = ["serve", "--spec-stdin"];

/// How long a detached daemon may take to answer its first ping (LUKS
/// volumes are unlocked before, so this is engine and frontend start-up).
pub const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Largest hand-over read from stdin: the spec's line (a few hundred
/// bytes; paths are at most 4 KiB each) and every line of a multi-target
/// table.
const MAX_HANDOVER: u64 = 124 << 10;

/// Starts `exe serve --spec-stdin NAME` detached (own process group,
/// working directory `/`, output to `NAME.log`, the runtime dir passed
/// on), writes `spec` and `table` with its key to the child's stdin and
/// waits until the daemon answers a ping for the spec's name. `lock` (the
/// caller's claim on the name) is inherited by the child.
///
/// If the child exits first, the error is [`ErrorKind::DaemonExited`] with
/// the child's exit code and the last `ucrypt: ` line of its log.
pub fn spawn(exe: &Path, spec: &VolumeSpec, table: &Targets, lock: &NameLock) -> Result<Ping> {
    let name = spec.name.as_str();
    let paths = Paths::new(&runtime::ensure_dir()?, name);
    // Never through a symlink or into an existing file someone planted.
    let log = runtime::create_file(&paths.log, 0o600).map_err(|e| {
        let kind = if e.kind() == std::io::ErrorKind::AlreadyExists {
            ErrorKind::Busy
        } else {
            ErrorKind::PermissionDenied
        };
        Error::new(kind, format!("Cannot create {}", paths.log.display())).with_source(e)
    })?;
    let log2 = log
        .try_clone()
        .map_err(|e| Error::new(ErrorKind::PermissionDenied, "Cannot create log").with_source(e))?;
    let fd = lock.share()?;
    let spawned = Command::new(exe)
        .args(CHILD_ARGS)
        .arg(name)
        .stdin(Stdio::piped())
        .stdout(log)
        .stderr(log2)
        .process_group(0)
        // Do not pin the caller's working directory (every path is absolute).
        .current_dir("/")
        .env("UCRYPT_RUNTIME_DIR", runtime::dir())
        .env(runtime::NAME_LOCK_FD_ENV, fd.to_string())
        .spawn();
    lock.seal();
    let mut child =
        spawned.map_err(|e| Error::new(ErrorKind::Io, "Cannot start the daemon").with_source(e))?;
    {
        let mut stdin = child
            .stdin
            .take()
            .ok_or_else(|| Error::new(ErrorKind::Io, "Daemon has no stdin"))?;
        let head = spec.to_json() + "\n";
        let line = table.line(true);
        stdin
            .write_all(head.as_bytes())
            .and_then(|()| stdin.write_all(&line))
            .map_err(|e| {
                Error::new(ErrorKind::Io, "Cannot hand the volume to the daemon").with_source(e)
            })?;
    }
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            let log = std::fs::read_to_string(&paths.log).unwrap_or_default();
            let msg = log
                .lines()
                .rev()
                .find_map(|l| l.strip_prefix("ucrypt: "))
                .unwrap_or("the daemon exited during start-up")
                .to_owned();
            let code = st
                .code()
                .and_then(|c| u8::try_from(c).ok())
                .filter(|&c| c != 0)
                .unwrap_or(1);
            return Err(Error::daemon_exited(code, msg));
        }
        if let Ok(p) = control::ping(name, Duration::from_secs(2)) {
            return Ok(p);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err(Error::new(
                ErrorKind::NoDevice,
                format!(
                    "The daemon did not become ready in time; see {}",
                    paths.log.display()
                ),
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The child's side: reads what [`spawn`] wrote, straight into locked
/// memory (a [`Secret`] wipes the old pages when it grows), and returns
/// the spec (its name checked against `name`, the one on the child's
/// command line) and the table.
pub fn read_handover(input: impl Read, name: &str) -> Result<(VolumeSpec, Targets)> {
    handover_from(
        Secret::read_from(input.take(MAX_HANDOVER), MAX_HANDOVER as usize),
        name,
    )
}

/// The detached daemon: reads the hand-over from standard input (past
/// `Stdin`'s heap buffer, which would keep a copy of the key), adopts the parent's claim on the name and
/// serves until `close` or a signal ([`crate::serve::run`]; `ready` gets
/// the ping answer).
pub fn serve_stdin(name: &str, ready: impl FnOnce(&Ping)) -> Result<()> {
    let (spec, table) = handover_from(Secret::read_stdin(MAX_HANDOVER as usize), name)?;
    let claim = runtime::claim(&spec.name, true)?;
    crate::serve::run(spec.into_spec(table, Some(claim.lock.into())), ready)
}

fn handover_from(bytes: std::io::Result<Secret>, name: &str) -> Result<(VolumeSpec, Targets)> {
    let bytes = bytes.map_err(|e| invalid("Cannot read the volume from stdin").with_source(e))?;
    let all: &[u8] = &bytes;
    let Some(nl) = all.iter().position(|&b| b == b'\n') else {
        return Err(invalid("Invalid hand-over: no volume spec line on stdin"));
    };
    let spec = VolumeSpec::from_json(&all[..nl])?;
    if spec.name != name {
        return Err(invalid(format!(
            "The volume spec names {:?}, not {name:?}",
            spec.name
        )));
    }
    let line = std::str::from_utf8(&all[nl + 1..])
        .map_err(|_| invalid("Invalid table: the text from stdin is not UTF-8"))?;
    Ok((spec, crate::resolve::plain_targets(line)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = "0 8 crypt aes-xts-plain64 \
        000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f 0 /img 0";

    fn spec() -> VolumeSpec {
        VolumeSpec {
            name: "v".into(),
            volume_type: crate::resolve::VolumeType::Luks2,
            device: "/img".into(),
            header: None,
            export: crate::ExportSpec::Fuse {
                mountpoint: None,
                uring: crate::FuseUring::Auto,
            },
            tls: crate::TlsSpec::default(),
            mode: datapath::CryptMode::Inline,
            perf: control::Flags::default(),
            allow_discards: true,
            read_only: false,
            io_engine: backend::IoEngine::Auto,
            direct: backend::DirectIo::Never,
            ceph: crate::spec::Ceph::default(),
        }
    }

    #[test]
    fn the_child_reads_back_what_the_parent_wrote() {
        let table = crate::resolve::plain_targets(LINE).unwrap();
        let mut pipe = (spec().to_json() + "\n").into_bytes();
        pipe.extend_from_slice(&table.line(true));
        let (s, t) = read_handover(&pipe[..], "v").unwrap();
        assert_eq!(s, spec());
        assert_eq!(&t.line(true)[..], &table.line(true)[..]);
    }

    #[test]
    fn a_broken_hand_over_is_refused() {
        let head = spec().to_json() + "\n";
        for (bytes, name) in [
            (Vec::new(), "v"),
            (LINE.as_bytes().to_vec(), "v"),
            (head.clone().into_bytes(), "v"),
            ([head.as_bytes(), LINE.as_bytes()].concat(), "w"),
            ([head.as_bytes(), b"0 8 crypt\n"].concat(), "v"),
            ([head.as_bytes(), b"\xff\xfe"].concat(), "v"),
            (
                [&head.as_bytes()[..10], b"\n", LINE.as_bytes()].concat(),
                "v",
            ),
        ] {
            let e = read_handover(&bytes[..], name).unwrap_err();
            assert_eq!(e.kind(), ErrorKind::InvalidInput, "{bytes:?}");
        }
    }
}
