//! The client side of the volume commands that need more than one
//! control request: [`close`] (ask, then wait for the daemon to be gone,
//! or clean up after a dead one) and [`list`] (every volume of the runtime
//! directory and who serves it).
//!
//! ```text
//!  close(name) ── control::close ──► daemon flushes, replies, exits
//!       │            └─ no answer ─► runtime::clean_stale (dead daemon's files)
//!       └─ waits until the pid no longer serves `name`, removes NAME.log
//!  list() ── runtime::volumes ── live_pid ── control::ping ──► [Listed]
//!  resume(name) / resume_luks ── control::status (LUKS? suspended?) ── unlock (prompt)
//!       └─ control::resume(table line, key shown) ──► daemon checks, resumes
//!  reload(name, FILE|-) ── table read into locked memory ── control::reload
//! ```

use std::fmt;
use std::path::Path;
use std::time::{Duration, Instant};

use crypto::table::Table;
use luks::passphrase::KeyfileRange;
use serde::Serialize;

use crate::control::{self, Ping, CLOSE_TIMEOUT, DRAIN_TIMEOUT, PING_TIMEOUT, QUERY_TIMEOUT};
use crate::error::{invalid, ErrorKind, Result};
use crate::resolve::VolumeType;
use crate::runtime::{self, Paths};

/// How long [`close`] waits for the process to exit after its reply.
const EXIT_WAIT: Duration = Duration::from_secs(30);

/// Closes volume `name`: the daemon flushes and replies, then this waits
/// (up to 30 s) for the process to be gone, so its socket, mount and pid
/// file are removed when this returns, and removes the log.
///
/// When no daemon answers ([`ErrorKind::NotActive`] or
/// [`ErrorKind::Protocol`]) whatever a crashed one left behind is cleaned
/// up, `stale_mount` is told if a dead FUSE mount had to be detached, and
/// the error is returned.
pub fn close(name: &str, stale_mount: impl FnOnce(&Path)) -> Result<()> {
    runtime::check_name(name)?;
    let paths = Paths::of(name);
    // Who serves it, and since when (a pid alone may be reused).
    let pid = runtime::live_pid(&paths).and_then(|p| Some((p, runtime::start_time(p)?)));
    if let Err(e) = control::close(name, CLOSE_TIMEOUT) {
        if matches!(e.kind(), ErrorKind::NotActive | ErrorKind::Protocol)
            && runtime::clean_stale(&paths)
        {
            stale_mount(&paths.fuse);
        }
        return Err(e);
    }
    if let Some((pid, started)) = pid {
        // Until its files are closed (not just its memory): an `open` of the
        // same device straight after must find the file lock free.
        let deadline = Instant::now() + EXIT_WAIT;
        while !runtime::has_exited(pid, started) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let _ = std::fs::remove_file(&paths.log);
    Ok(())
}

/// `luksResume NAME`: checks that `name` is a suspended LUKS volume, has
/// `unlock` turn the header of its device (the path `status` gives) into
/// the table (the caller prompts for the passphrase there), and hands it
/// to the daemon, which resumes IO with that key.
pub fn resume(name: &str, unlock: impl FnOnce(&Path, VolumeType) -> Result<Table>) -> Result<()> {
    runtime::check_name(name)?;
    let st = control::status(name, QUERY_TIMEOUT)?;
    if matches!(
        st.volume_type,
        VolumeType::Plain | VolumeType::Bitlk | VolumeType::Fvault2
    ) {
        return Err(invalid("This operation is supported only for LUKS device."));
    }
    if !st.suspended {
        return Err(invalid(format!("Volume {name} is not suspended.")));
    }
    let table = unlock(Path::new(&st.device), st.volume_type)?;
    control::resume(name, table.line(true), DRAIN_TIMEOUT)
}

/// [`resume`] with the key from the volume's LUKS header, as `open`
/// takes it: `version` (`--type luks1|luks2`), if given, must be the
/// header's; the passphrase comes from `key_file` (its `range`) or a
/// prompt on the terminal (asked as `prompting` says); only `key_slot` is
/// tried if given.
#[allow(clippy::too_many_arguments)]
pub fn resume_luks(
    name: &str,
    version: Option<VolumeType>,
    header: Option<&Path>,
    key_file: Option<&Path>,
    range: KeyfileRange,
    key_slot: Option<u32>,
    prompting: &luks::passphrase::Prompting,
    access: &luks::DeviceAccess,
) -> Result<()> {
    resume(name, |device, found| {
        let vol = crate::resolve::Luks::load(device, header, access)?;
        if version.unwrap_or(found) != vol.version() {
            let msg = format!("Device {} is not a valid LUKS device.", device.display());
            return Err(invalid(msg));
        }
        vol.unlock_asking(key_file, range, key_slot, prompting)
    })
}

/// `resize NAME`: to `sectors` (512-byte, `--size`) or `bytes`
/// (`--device-size`, a multiple of 512), or with neither to all the
/// device holds ([`control::resize`]).
pub fn resize(name: &str, sectors: Option<u64>, bytes: Option<u64>) -> Result<control::Resized> {
    runtime::check_name(name)?;
    let size = match bytes {
        Some(b) if b % 512 != 0 => {
            return Err(invalid("Device size must be multiple of 512 bytes sector."))
        }
        Some(b) => Some(b / 512),
        None => sectors,
    };
    control::resize(name, size, DRAIN_TIMEOUT)
}

/// `reload NAME --table FILE|-`: replaces a live volume's table (every
/// line, keys included) with the one in `source`, a file or `-` for
/// standard input; never a table on the command line, where its keys
/// would show in `ps`. Returns the number of targets and the size in
/// 512-byte sectors now served ([`control::reload`]).
pub fn reload(name: &str, source: &str) -> Result<(usize, u64)> {
    runtime::check_name(name)?;
    if source.trim().contains(|c: char| c.is_ascii_whitespace()) {
        return Err(invalid(
            "reload reads the table from a file or stdin (--table FILE|-), not from the command line",
        ));
    }
    let text = crate::resolve::read_table_text(source.trim())?;
    // Parsed here too, so a bad table is refused before the daemon is
    // asked (with the same message it would give).
    let s = text
        .as_str()
        .ok_or_else(|| invalid("Invalid table: the table read is not UTF-8"))?;
    crate::resolve::plain_targets(s)?;
    control::reload(name, text, DRAIN_TIMEOUT)
}

/// `list --json`: the volumes as one JSON object, `schema` first
/// (docs/JSON.md).
pub fn list_json(volumes: &[Listed]) -> String {
    #[derive(Serialize)]
    struct Volume<'a> {
        name: &'a str,
        pid: u32,
        answering: bool,
        export: Option<&'static str>,
        endpoint: Option<&'a str>,
    }
    #[derive(Serialize)]
    struct Doc<'a> {
        schema: u32,
        volumes: Vec<Volume<'a>>,
    }
    let doc = Doc {
        schema: control::JSON_SCHEMA,
        volumes: volumes
            .iter()
            .map(|l| Volume {
                name: &l.name,
                pid: l.pid,
                answering: l.ping.is_some(),
                export: l.ping.as_ref().map(|p| p.export.name()),
                endpoint: l.ping.as_ref().map(|p| p.endpoint.as_str()),
            })
            .collect(),
    };
    // Strings and numbers only: serialising cannot fail.
    serde_json::to_string_pretty(&doc).unwrap_or_default()
}

/// One line of [`list`]: a volume with a live daemon.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// Volume name.
    pub name: String,
    /// The daemon's pid (from its pid file, checked alive).
    pub pid: u32,
    /// Its answer to a ping; `None` if it did not answer.
    pub ping: Option<Ping>,
}

/// `NAME<TAB>pid PID<TAB>EXPORT<TAB>ENDPOINT`, or `(not answering)` in
/// place of the export.
impl fmt::Display for Listed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, pid) = (&self.name, self.pid);
        match &self.ping {
            Some(p) => write!(f, "{name}\tpid {pid}\t{}\t{}", p.export.name(), p.endpoint),
            None => write!(f, "{name}\tpid {pid}\t(not answering)"),
        }
    }
}

/// The volumes of the runtime directory served by a live daemon, sorted
/// by name, each pinged. An insecure runtime directory is refused
/// ([`ErrorKind::PermissionDenied`], as `open` and `status` refuse it); a
/// missing one lists nothing.
pub fn list() -> Result<Vec<Listed>> {
    let dir = runtime::dir();
    let mut v = Vec::new();
    for name in runtime::volumes()? {
        let paths = Paths::new(&dir, &name);
        let Some(pid) = runtime::live_pid(&paths) else {
            continue;
        };
        let ping = control::ping(&name, PING_TIMEOUT).ok();
        v.push(Listed { name, pid, ping });
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::ExportKind;

    #[test]
    fn listed_lines() {
        let mut l = Listed {
            name: "v".into(),
            pid: 7,
            ping: None,
        };
        assert_eq!(l.to_string(), "v\tpid 7\t(not answering)");
        l.ping = Some(Ping {
            name: "v".into(),
            pid: 7,
            export: ExportKind::Fuse,
            endpoint: "/r/v.fuse/v".into(),
        });
        assert_eq!(l.to_string(), "v\tpid 7\tfuse\t/r/v.fuse/v");
        let doc: serde_json::Value = serde_json::from_str(&list_json(&[l])).unwrap();
        assert_eq!(doc["schema"], 1);
        assert_eq!(doc["volumes"][0]["export"], "fuse");
        assert_eq!(doc["volumes"][0]["endpoint"], "/r/v.fuse/v");
        assert_eq!(doc["volumes"][0]["answering"], true);
        assert_eq!(
            list_json(&[]).replace([' ', '\n'], ""),
            r#"{"schema":1,"volumes":[]}"#
        );
    }
}
