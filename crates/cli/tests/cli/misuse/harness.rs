//! The misuse matrix's runner and the [`Case`] a row works in.
#![allow(dead_code)]

use std::any::Any;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use testutil::{Capability, TempDir};

/// One row: something a user or a hostile peer does, and what ucrypt must
/// answer.
pub struct Row {
    /// What is done, in a user's words ("vhost socket path names a disk
    /// image"). Unique in the table.
    pub what: &'static str,
    /// What the row needs from the machine (skipped with the reason when
    /// missing).
    pub needs: &'static [Capability<'static>],
    /// The answer expected.
    pub expect: Expect,
    /// Sets the case up, [`Case::watch`]es what must not change, does the
    /// misuse and returns its outcome. It may panic to fail the row.
    pub case: fn(&mut Case) -> Outcome,
}

/// What a row expects of the misuse.
#[derive(Debug, Clone, Copy)]
pub enum Expect {
    /// A ucrypt command exits with this code (cryptsetup's) and prints
    /// this text (a substring of stderr or stdout).
    Exit(i32, &'static str),
    /// A peer's attempt (a client, a guest) fails, printing this text.
    Fails(&'static str),
    /// The misuse is survived: the row's own checks decide (a panic in
    /// [`Row::case`] fails it); the outcome is only reported.
    Survives,
}

/// What the misuse did: an exit code (`None` for a peer that reports no
/// code, or was killed) and what it printed.
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The exit code.
    pub code: Option<i32>,
    /// stderr then stdout.
    pub text: String,
    /// Set by [`Outcome::skipped`]: the row could not run here.
    pub skipped: Option<String>,
}

impl Outcome {
    /// A row that cannot run on this machine, and why (logged as a skip).
    pub fn skipped(why: impl Into<String>) -> Self {
        Self {
            code: None,
            text: String::new(),
            skipped: Some(why.into()),
        }
    }

    /// An outcome described in words (for [`Expect::Survives`] rows).
    pub fn note(code: Option<i32>, text: impl Into<String>) -> Self {
        Self {
            code,
            text: text.into(),
            skipped: None,
        }
    }
}

impl From<Output> for Outcome {
    fn from(o: Output) -> Self {
        let mut text = String::from_utf8_lossy(&o.stderr).into_owned();
        text.push_str(&String::from_utf8_lossy(&o.stdout));
        Self {
            code: o.status.code(),
            text,
            skipped: None,
        }
    }
}

/// A row's world: a private directory (with a private runtime directory,
/// so daemons started here are found and closed only here), the files and
/// devices watched, and whatever must live until the row ends.
pub struct Case {
    dir: TempDir,
    watched: Vec<(PathBuf, String)>,
    names: Vec<String>,
    kept: Vec<Box<dyn Any>>,
}

impl Case {
    fn new(tag: &str) -> Self {
        let dir = TempDir::new(tag);
        let run = dir.join("run");
        std::fs::create_dir_all(&run).expect("runtime dir");
        set_mode(&run, 0o700);
        Self {
            dir,
            watched: Vec::new(),
            names: Vec::new(),
            kept: Vec::new(),
        }
    }

    /// A path in the case's directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The case's runtime directory (`UCRYPT_RUNTIME_DIR` of every
    /// command run through [`Case::ucrypt`]).
    pub fn runtime(&self) -> PathBuf {
        self.dir.join("run")
    }

    /// A file of `size` bytes, filled with a seeded pattern (so a change
    /// anywhere shows in its hash).
    pub fn image(&self, name: &str, size: u64) -> PathBuf {
        let p = self.path(name);
        let mut rng = testutil::Rng::new(size ^ 0x5eed);
        let mut buf = vec![0u8; size as usize];
        rng.fill(&mut buf);
        std::fs::write(&p, &buf).expect("write image");
        p
    }

    /// A LUKS2 image of `size` bytes formatted by ucrypt (fast pbkdf2)
    /// with passphrase file `name.key` holding `passphrase`; returns the
    /// image and the key file.
    pub fn luks2(&self, name: &str, size: u64, passphrase: &str) -> (PathBuf, PathBuf) {
        let img = self.image(name, size);
        let key = self.path(&format!("{name}.key"));
        std::fs::write(&key, passphrase).expect("key file");
        let mut args: Vec<&str> = testutil::FAST_LUKS2_FORMAT.to_vec();
        let (k, i) = (key.to_str().unwrap(), img.to_str().unwrap());
        args.extend(["--key-file", k, i]);
        let o = self.ucrypt(&args);
        assert!(o.status.success(), "luksFormat: {}", text(&o));
        (img, key)
    }

    /// `ucrypt ARGS` with this case's runtime dir, stdin empty.
    pub fn ucrypt(&self, args: &[&str]) -> Output {
        self.ucrypt_in(args, None)
    }

    /// `ucrypt ARGS` with `stdin` written to its standard input.
    pub fn ucrypt_in(&self, args: &[&str], stdin: Option<&[u8]>) -> Output {
        let mut c = self.command(args);
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().expect("spawn ucrypt");
        let mut input = child.stdin.take().expect("piped stdin");
        std::thread::scope(|s| {
            s.spawn(move || {
                use std::io::Write;
                if let Some(b) = stdin {
                    let _ = input.write_all(b);
                }
            });
            child.wait_with_output().expect("wait for ucrypt")
        })
    }

    /// A `ucrypt ARGS` command with this case's runtime dir, to spawn.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(testutil::ucrypt_bin());
        c.args(args).env("UCRYPT_RUNTIME_DIR", self.runtime());
        c
    }

    /// Notes that volume `name` may be served by a daemon of this case:
    /// it is closed (and its daemon killed if close fails) when the row
    /// ends.
    pub fn served(&mut self, name: &str) {
        self.names.push(name.to_owned());
    }

    /// `ucrypt open ARGS` expected to succeed (setup, not the misuse);
    /// `name` is closed when the row ends.
    pub fn open_ok(&mut self, args: &[&str], name: &str) -> Output {
        self.served(name);
        let o = self.ucrypt(args);
        assert!(o.status.success(), "setup open failed: {}", text(&o));
        o
    }

    /// Records the sha256 of `path` (a file or a block device) now; it
    /// must be the same after the misuse and after the row's daemons are
    /// closed.
    pub fn watch(&mut self, path: &Path) {
        let h = sha256(path).unwrap_or_else(|| panic!("cannot hash {}", path.display()));
        self.watched.push((path.to_owned(), h));
    }

    /// Keeps `thing` (a loop device, a child process, a listener) alive
    /// until the row ends.
    pub fn keep<T: Any>(&mut self, thing: T) {
        self.kept.push(Box::new(thing));
    }

    /// Watched paths whose contents changed (or vanished) since watched.
    fn changed(&self) -> Vec<String> {
        self.watched
            .iter()
            .filter_map(|(p, before)| match sha256(p) {
                Some(now) if &now == before => None,
                Some(_) => Some(format!("{} changed", p.display())),
                None => Some(format!("{} is gone", p.display())),
            })
            .collect()
    }

    /// Closes every volume this case served (killing a daemon that will
    /// not close).
    fn close_all(&mut self) {
        for name in std::mem::take(&mut self.names) {
            let pidfile = self.runtime().join(format!("{name}.pid"));
            let pid = std::fs::read_to_string(&pidfile).ok();
            let _ = self.ucrypt(&["close", &name]);
            if let Some(pid) = pid.and_then(|p| p.trim().parse::<i32>().ok()) {
                if Path::new(&format!("/proc/{pid}")).exists() {
                    let _ = Command::new("kill").args(["-9", &pid.to_string()]).status();
                    testutil::wait_until(Duration::from_secs(60), "a killed daemon", || {
                        !Path::new(&format!("/proc/{pid}/stat")).exists()
                            || std::fs::read_to_string(format!("/proc/{pid}/stat"))
                                .is_ok_and(|s| s.contains(") Z"))
                    });
                }
            }
        }
    }
}

impl Drop for Case {
    fn drop(&mut self) {
        self.close_all();
        // Kept things (loop devices, children) go before the directory.
        self.kept.clear();
    }
}

/// stderr then stdout of a finished command.
pub fn text(o: &Output) -> String {
    let mut t = String::from_utf8_lossy(&o.stderr).into_owned();
    t.push_str(&String::from_utf8_lossy(&o.stdout));
    t
}

/// `chmod MODE PATH`.
pub fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// sha256 of a file or block device by `sha256sum`; `None` if it cannot
/// be read (gone).
pub fn sha256(p: &Path) -> Option<String> {
    let o = Command::new("sha256sum").arg(p).output().ok()?;
    if !o.status.success() {
        return None;
    }
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .map(str::to_owned)
}

/// One row's verdict.
enum Verdict {
    Ok,
    Skipped(String),
    Failed(Vec<String>),
}

/// Runs every row, writes the report, and fails naming each failed row.
pub fn run_all(rows: &[Row]) {
    let mut report = String::new();
    let mut failed = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        let (verdict, outcome) = run_row(i, row);
        let shown = outcome
            .as_ref()
            .map(|o| {
                let first = o
                    .text
                    .lines()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("")
                    .trim();
                match o.code {
                    Some(c) => format!("exit {c}: {first}"),
                    None => first.to_owned(),
                }
            })
            .unwrap_or_default();
        let tag = match &verdict {
            Verdict::Ok => "ok  ".to_owned(),
            Verdict::Skipped(why) => format!("skip ({why})"),
            Verdict::Failed(_) => "FAIL".to_owned(),
        };
        let _ = writeln!(report, "{tag} {} — {shown}", row.what);
        if let Verdict::Failed(why) = verdict {
            for w in &why {
                let _ = writeln!(report, "       {w}");
            }
            if let Some(o) = &outcome {
                for l in o.text.lines().take(12) {
                    let _ = writeln!(report, "       | {l}");
                }
            }
            failed.push(row.what);
        }
    }
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("misuse-report.txt");
    let _ = std::fs::write(&out, &report);
    eprintln!("{report}");
    assert!(
        failed.is_empty(),
        "{} of {} misuse rows failed: {failed:#?}\n{report}",
        failed.len(),
        rows.len()
    );
}

fn run_row(i: usize, row: &Row) -> (Verdict, Option<Outcome>) {
    let test = format!("misuse::{}", row.what);
    if !row.needs.iter().all(|&c| testutil::require(&test, c)) {
        return (Verdict::Skipped("prerequisite missing".into()), None);
    }
    let mut case = Case::new(&format!("misuse{i}"));
    let got = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| (row.case)(&mut case)));
    let outcome = match got {
        Ok(o) => o,
        Err(p) => {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                .unwrap_or_else(|| "panicked".into());
            return (
                Verdict::Failed(vec![format!("the row panicked: {msg}")]),
                None,
            );
        }
    };
    if let Some(why) = &outcome.skipped {
        testutil::skip(&test, why);
        return (Verdict::Skipped(why.clone()), Some(outcome));
    }
    let mut why = Vec::new();
    match row.expect {
        Expect::Exit(code, msg) => {
            if outcome.code != Some(code) {
                why.push(format!("exit {:?}, expected {code}", outcome.code));
            }
            if !outcome.text.contains(msg) {
                why.push(format!("output lacks {msg:?}"));
            }
        }
        Expect::Fails(msg) => {
            if outcome.code == Some(0) {
                why.push("the peer's attempt succeeded".into());
            }
            if !outcome.text.contains(msg) {
                why.push(format!("output lacks {msg:?}"));
            }
        }
        Expect::Survives => {}
    }
    why.extend(
        case.changed()
            .into_iter()
            .map(|c| format!("after the misuse: {c}")),
    );
    case.close_all();
    why.extend(
        case.changed()
            .into_iter()
            .map(|c| format!("after close: {c}")),
    );
    drop(case);
    if why.is_empty() {
        (Verdict::Ok, Some(outcome))
    } else {
        (Verdict::Failed(why), Some(outcome))
    }
}
