//! Golden tests for the daemon commands: the exact text of `open`,
//! `status`, `table` (masked and `--showkeys`), `refresh` and `list` for an
//! open plain and LUKS2 volume, and the exit codes of common failures.
//!
//! Pinned before the daemon moved out of the cli crate, so the move cannot
//! change what users (and scripts parsing `status`) see. Only what varies
//! between runs is normalised: the temporary directory (`<DIR>`), process
//! ids (`<PID>`) and the live counters and latencies (`N`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use testutil::TempDir;

/// A 512-bit aes-xts-plain64 key (hex), fixed so the golden text is too.
const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
                   f0e1d2c3b4a5968778695a4b3c2d1e0fffeeddccbbaa99887766554433221100";

/// A test's private runtime directory and the volumes it opened (closed,
/// or killed, on drop so a failed assertion leaves no daemon behind).
struct Rt {
    dir: TempDir,
    opened: Vec<String>,
}

impl Rt {
    fn new(tag: &str) -> Self {
        let dir = TempDir::new(tag);
        std::fs::create_dir_all(dir.join("run")).unwrap();
        Self {
            dir,
            opened: Vec::new(),
        }
    }

    fn run_dir(&self) -> PathBuf {
        self.dir.join("run")
    }

    /// A sparse image of `size` bytes.
    fn image(&self, name: &str, size: u64) -> PathBuf {
        let p = self.dir.join(name);
        std::fs::File::create(&p).unwrap().set_len(size).unwrap();
        p
    }

    /// Runs `ucrypt ARGS` in this runtime dir with stdin closed.
    fn ucrypt(&self, args: &[&str]) -> Output {
        Command::new(testutil::ucrypt_bin())
            .args(args)
            .env("UCRYPT_RUNTIME_DIR", self.run_dir())
            .stdin(Stdio::null())
            .output()
            .expect("run ucrypt")
    }

    /// Runs `ucrypt ARGS`, asserts success and returns normalised stdout.
    fn ok(&self, args: &[&str]) -> String {
        let o = self.ucrypt(args);
        assert!(
            o.status.success(),
            "ucrypt {args:?} failed ({:?}): {}",
            o.status.code(),
            String::from_utf8_lossy(&o.stderr)
        );
        self.normalise(&String::from_utf8_lossy(&o.stdout))
    }

    /// `ucrypt open ARGS` (the volume name last), remembered for cleanup.
    fn open(&mut self, args: &[&str]) -> String {
        let name = args.last().expect("volume name").to_string();
        let mut full = vec!["open"];
        full.extend_from_slice(args);
        let out = self.ok(&full);
        self.opened.push(name);
        out
    }

    /// `ucrypt ARGS` must fail with `code`; returns normalised stderr.
    fn fails(&self, args: &[&str], code: i32) -> String {
        let o = self.ucrypt(args);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(code), "ucrypt {args:?}: {err}");
        assert!(o.stdout.is_empty(), "ucrypt {args:?} printed to stdout");
        self.normalise(&err)
    }

    fn normalise(&self, s: &str) -> String {
        let s = s.replace(&self.dir.path().display().to_string(), "<DIR>");
        s.lines()
            .map(|l| {
                let l = mask_pids(l);
                let counters = ["  clients:", "  reads:", "  writes:", "  flushes:"];
                if l.starts_with("  io:") {
                    // The host's filesystem decides O_DIRECT; frontends_nbd
                    // checks this line's content.
                    "  io:      <IO>".to_owned()
                } else if counters.iter().any(|c| l.starts_with(c)) {
                    mask_numbers(&l)
                } else {
                    l
                }
            })
            .map(|l| l + "\n")
            .collect()
    }
}

impl Drop for Rt {
    fn drop(&mut self) {
        for name in std::mem::take(&mut self.opened) {
            let pid = std::fs::read_to_string(self.run_dir().join(format!("{name}.pid")));
            let closed = self.ucrypt(&["close", &name]).status.success();
            if let (false, Ok(pid)) = (closed, pid) {
                let _ = Command::new("kill").arg("-9").arg(pid.trim()).status();
            }
        }
    }
}

/// `pid 1234` -> `pid <PID>`.
fn mask_pids(line: &str) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(i) = rest.find("pid ") {
        out.push_str(&rest[..i + 4]);
        rest = &rest[i + 4..];
        let digits = rest.len() - rest.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        if digits > 0 {
            out.push_str("<PID>");
            rest = &rest[digits..];
        }
    }
    out.push_str(rest);
    out
}

/// Every run of digits -> `N` (so `12.5` -> `N.N`).
fn mask_numbers(line: &str) -> String {
    let mut out = String::new();
    let mut in_digits = false;
    for c in line.chars() {
        if c.is_ascii_digit() {
            if !in_digits {
                out.push('N');
            }
            in_digits = true;
        } else {
            out.push(c);
            in_digits = false;
        }
    }
    out
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// The counter lines of `status` for a volume without clients.
const STATS: &str = "  clients: N connected, N accepted, N disconnected for protocol errors
  reads:   N requests, N bytes, N errors, N inline, N queued, pN N.N us, pN N.N us
  writes:   N requests, N bytes, N errors, N inline, N queued, pN N.N us, pN N.N us
  flushes: N, discards: N, in flight: N (max N), reconfigurations: N
";

#[test]
fn plain_volume_open_status_table_refresh_list() {
    let mut rt = Rt::new("golden-plain");
    let img = rt.image("plain.img", 1 << 20);
    let table = format!("0 2048 crypt aes-xts-plain64 {KEY} 0 {} 0", s(&img));
    let out = rt.open(&["--type", "plain", "--table", &table, s(&img), "gold-plain"]);
    assert_eq!(
        out,
        "gold-plain: serving NBD at nbd+unix:///?socket=<DIR>/run/gold-plain.nbd.sock (pid <PID>)\n"
    );

    let status = rt.ok(&["status", "gold-plain"]);
    let want = "gold-plain is active.
  type:    PLAIN
  cipher:  aes-xts-plain64
  keysize: 512 bits
  key location: ucrypt daemon memory (pid <PID>)
  device:  <DIR>/plain.img
  sector size:  512
  offset:  0 sectors
  size:    2048 sectors
  mode:    read/write
  data path: adaptive
  io:      <IO>
  export:  nbd nbd+unix:///?socket=<DIR>/run/gold-plain.nbd.sock
"
    .to_owned()
        + STATS;
    assert_eq!(status, want);

    let zeros = "0".repeat(KEY.len());
    assert_eq!(
        rt.ok(&["table", "gold-plain"]),
        format!("0 2048 crypt aes-xts-plain64 {zeros} 0 <DIR>/plain.img 0\n")
    );
    assert_eq!(
        rt.ok(&["table", "gold-plain", "--showkeys"]),
        format!("0 2048 crypt aes-xts-plain64 {KEY} 0 <DIR>/plain.img 0\n")
    );

    assert_eq!(
        rt.ok(&[
            "refresh",
            "--perf-no_read_workqueue",
            "--perf-same_cpu_crypt",
            "--mode",
            "adaptive",
            "gold-plain"
        ]),
        "gold-plain: data path adaptive, flags: same_cpu_crypt no_read_workqueue\n"
    );
    let status = rt.ok(&["status", "gold-plain"]);
    assert!(
        status.contains(
            "  mode:    read/write\n  flags:   same_cpu_crypt no_read_workqueue\n  data path: adaptive\n"
        ),
        "{status}"
    );
    assert_eq!(
        rt.ok(&["table", "gold-plain"]),
        format!(
            "0 2048 crypt aes-xts-plain64 {zeros} 0 <DIR>/plain.img 0 2 same_cpu_crypt no_read_workqueue\n"
        )
    );
    assert_eq!(
        rt.ok(&["refresh", "gold-plain"]),
        "gold-plain: data path adaptive, flags: (none)\n"
    );

    assert_eq!(
        rt.ok(&["list"]),
        "gold-plain\tpid <PID>\tnbd\tnbd+unix:///?socket=<DIR>/run/gold-plain.nbd.sock\n"
    );
    assert_eq!(rt.ok(&["close", "gold-plain"]), "");
    rt.opened.clear();
    assert_eq!(rt.ok(&["list"]), "");
}

#[test]
fn plain_volume_with_flags_readonly_and_offset() {
    let mut rt = Rt::new("golden-flags");
    let img = rt.image("flags.img", 1 << 20);
    let table = format!(
        "0 1024 crypt aes-xts-plain64 {KEY} 8 {} 64 1 sector_size:4096",
        s(&img)
    );
    rt.open(&[
        "--table",
        &table,
        "--readonly",
        "--allow-discards",
        "--perf-no_write_workqueue",
        "--mode",
        "inline",
        s(&img),
        "gold-flags",
    ]);
    let status = rt.ok(&["status", "gold-flags"]);
    let want = "gold-flags is active.
  type:    PLAIN
  cipher:  aes-xts-plain64
  keysize: 512 bits
  key location: ucrypt daemon memory (pid <PID>)
  device:  <DIR>/flags.img
  sector size:  4096
  offset:  64 sectors
  size:    1024 sectors
  skipped: 8 sectors
  mode:    readonly
  flags:   discards no_write_workqueue
  data path: inline
  io:      <IO>
  export:  nbd nbd+unix:///?socket=<DIR>/run/gold-flags.nbd.sock
"
    .to_owned()
        + STATS;
    assert_eq!(status, want);
    let zeros = "0".repeat(KEY.len());
    assert_eq!(
        rt.ok(&["table", "gold-flags"]),
        format!(
            "0 1024 crypt aes-xts-plain64 {zeros} 8 <DIR>/flags.img 64 3 allow_discards no_write_workqueue sector_size:4096\n"
        )
    );
}

#[test]
fn luks2_volume_status_table_and_failures() {
    let mut rt = Rt::new("golden-luks");
    let img = rt.image("luks.img", 20 << 20);
    let vk = rt.dir.join("vk");
    std::fs::write(&vk, hex_decode(KEY)).unwrap();
    let kf = rt.dir.join("pass");
    std::fs::write(&kf, b"golden passphrase").unwrap();
    let bad = rt.dir.join("bad");
    std::fs::write(&bad, b"wrong passphrase").unwrap();
    rt.ok(&[
        "format",
        "-q",
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        "--volume-key-file",
        s(&vk),
        "--key-file",
        s(&kf),
        s(&img),
    ]);

    // Wrong passphrase: exit 2, nothing started.
    rt.fails(&["open", "--key-file", s(&bad), s(&img), "gold-luks"], 2);
    assert_eq!(rt.ok(&["list"]), "");

    let out = rt.open(&["--key-file", s(&kf), s(&img), "gold-luks"]);
    assert_eq!(
        out,
        "gold-luks: serving NBD at nbd+unix:///?socket=<DIR>/run/gold-luks.nbd.sock (pid <PID>)\n"
    );
    let status = rt.ok(&["status", "gold-luks"]);
    let want = "gold-luks is active.
  type:    LUKS2
  cipher:  aes-xts-plain64
  keysize: 512 bits
  key location: ucrypt daemon memory (pid <PID>)
  device:  <DIR>/luks.img
  sector size:  4096
  offset:  32768 sectors
  size:    8192 sectors
  mode:    read/write
  data path: adaptive
  io:      <IO>
  export:  nbd nbd+unix:///?socket=<DIR>/run/gold-luks.nbd.sock
"
    .to_owned()
        + STATS;
    assert_eq!(status, want);
    let zeros = "0".repeat(KEY.len());
    assert_eq!(
        rt.ok(&["table", "gold-luks"]),
        format!("0 8192 crypt aes-xts-plain64 {zeros} 0 <DIR>/luks.img 32768 1 sector_size:4096\n")
    );
    assert_eq!(
        rt.ok(&["table", "--showkeys", "gold-luks"]),
        format!("0 8192 crypt aes-xts-plain64 {KEY} 0 <DIR>/luks.img 32768 1 sector_size:4096\n")
    );

    // Open twice: exit 5, the first daemon keeps serving.
    assert_eq!(
        rt.fails(&["open", "--key-file", s(&kf), s(&img), "gold-luks"], 5),
        "ucrypt: Device gold-luks already exists (served by pid <PID>).\n"
    );
    assert_eq!(
        rt.ok(&["list"]),
        "gold-luks\tpid <PID>\tnbd\tnbd+unix:///?socket=<DIR>/run/gold-luks.nbd.sock\n"
    );
}

#[test]
fn failures_without_a_daemon() {
    let rt = Rt::new("golden-fail");
    for verb in ["close", "status", "table"] {
        assert_eq!(
            rt.fails(&[verb, "nobody"], 4),
            "ucrypt: Device nobody is not active.\n",
            "{verb}"
        );
    }
    assert_eq!(
        rt.fails(&["refresh", "--mode", "inline", "nobody"], 4),
        "ucrypt: Device nobody is not active.\n"
    );
    assert_eq!(
        rt.fails(&["status", "../x"], 1),
        "ucrypt: Invalid volume name \"../x\": use 1-64 characters from A-Z a-z 0-9 - _ . (not starting with '.')\n"
    );
    assert_eq!(
        rt.fails(&["refresh", "--mode", "fast", "nobody"], 1),
        "ucrypt: Unknown mode \"fast\": use classic, inline or adaptive\n"
    );
    let img = rt.image("x.img", 1 << 20);
    // Plain mode without --table asks for a passphrase, as cryptsetup does.
    assert_eq!(
        rt.fails(&["open", "--type", "plain", s(&img), "x"], 1),
        "ucrypt: No passphrase given (empty input)\n"
    );
    assert_eq!(
        rt.fails(&["open", "--table", "0 8 crypt", s(&img), "x"], 1),
        "ucrypt: Invalid table: Not enough arguments: table field <cipher> (field 4) is missing\n"
    );
    let missing = rt.dir.join("missing.img");
    assert_eq!(
        rt.fails(
            &[
                "open",
                "--table",
                "0 8 crypt aes-xts-plain64 - 0 /x 0",
                s(&missing),
                "x"
            ],
            4
        ),
        "ucrypt: Device <DIR>/missing.img does not exist or access denied.\n"
    );
    assert_eq!(rt.ok(&["list"]), "");
}

fn hex_decode(h: &str) -> Vec<u8> {
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
        .collect()
}
