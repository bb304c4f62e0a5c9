//! LUKS2 volumes mid-encryption and mid-decryption, left so by cryptsetup
//! 2.6.1 (`--init-only`, or a run stopped between two hotzones under
//! gdb): `ucrypt map --luks` serves them as cryptsetup maps them (a
//! crypt and a linear segment, the linear one read at the moved segment
//! for an encryption with a data shift) and reads the plaintext written
//! before; writes through ucrypt survive cryptsetup's `--resume-only`; a
//! torn hotzone is refused with nothing written. Online: `ucrypt open`
//! serves such a volume and `ucrypt reencrypt --resume-only
//! --active-name` finishes it under a verifying NBD writer, the served
//! volume ending as plaintext (decryption) or as the LUKS2 volume
//! (encryption).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::Ordering;

use testutil::{require_tool, ucrypt_bin, Rng, TempDir};

use crate::nbd_client::NbdClient;
use crate::reencrypt::ok;
use crate::reencrypt::under_gdb;
use crate::reencrypt_online::{base, start_writer};

/// Fast keyslot parameters for both tools.
const FAST_KDF: &[&str] = &["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
/// Data of the detached-header cases; the online writer's device size.
const DATA: usize = 16 << 20;
/// The data-shift case: a 12 MiB device whose last 4 MiB are free (the
/// data, 8 MiB, moves by 2 MiB).
const SHIFT_DEV: usize = 12 << 20;
const SHIFT_DATA: usize = 8 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Case {
    /// `--encrypt --header HDR`: forward, plaintext above the boundary.
    Encrypt,
    /// `--encrypt --reduce-device-size 4M`: backward with a data shift.
    EncryptShift,
    /// `--decrypt --header HDR`: backward, plaintext at the end.
    Decrypt,
}

pub(crate) struct Vol {
    pub(crate) dir: TempDir,
    pub(crate) data: PathBuf,
    /// The detached header (`None`: in the device).
    pub(crate) hdr: Option<PathBuf>,
    pub(crate) key: PathBuf,
    pub(crate) plain: Vec<u8>,
    case: Case,
}

impl Vol {
    /// The device of `case` with seeded plaintext: plain bytes for an
    /// encryption, a LUKS2 volume with a detached header (cryptsetup's
    /// format, the plaintext written through ucrypt) for a decryption.
    pub(crate) fn new(tag: &str, base: &Path, case: Case, seed: u64) -> Vol {
        let dir = TempDir::new_in(base, tag);
        std::fs::create_dir_all(dir.join("run")).unwrap();
        let data = dir.join("data");
        let key = dir.join("key");
        std::fs::write(&key, b"plaintext passphrase").unwrap();
        let hdr = (case != Case::EncryptShift).then(|| dir.join("hdr"));
        let size = if case == Case::EncryptShift {
            SHIFT_DEV
        } else {
            DATA
        };
        let mut all = vec![0u8; size];
        Rng::new(seed).fill(&mut all);
        let mut v = Vol {
            dir,
            data,
            hdr,
            key,
            plain: Vec::new(),
            case,
        };
        if case == Case::Decrypt {
            std::fs::File::create(&v.data)
                .unwrap()
                .set_len(size as u64)
                .unwrap();
            ok(
                Command::new("cryptsetup")
                    .args(testutil::FAST_LUKS2_FORMAT)
                    .arg("--header")
                    .arg(v.hdr.as_ref().unwrap())
                    .arg("--key-file")
                    .arg(&v.key)
                    .arg(&v.data)
                    .output()
                    .unwrap(),
                "luksFormat --header",
            );
            v.write_plain(&all);
            v.plain = all;
        } else {
            std::fs::write(&v.data, &all).unwrap();
            all.truncate(if case == Case::EncryptShift {
                SHIFT_DATA
            } else {
                DATA
            });
            v.plain = all;
        }
        v
    }

    /// The header file cryptsetup and ucrypt read.
    fn meta(&self) -> &Path {
        self.hdr.as_deref().unwrap_or(&self.data)
    }

    /// `--header HDR` when detached.
    pub(crate) fn header_args(&self) -> Vec<&std::ffi::OsStr> {
        match &self.hdr {
            Some(h) => vec!["--header".as_ref(), h.as_os_str()],
            None => Vec::new(),
        }
    }

    /// cryptsetup's `reencrypt` arguments for this case (before the
    /// device).
    fn cryptsetup_args(&self, extra: &[&str]) -> Vec<std::ffi::OsString> {
        let mut a: Vec<std::ffi::OsString> = ["reencrypt", "-q", "--force-offline-reencrypt"]
            .iter()
            .map(Into::into)
            .collect();
        match self.case {
            Case::Encrypt => a.extend(["--encrypt", "--type", "luks2"].map(Into::into)),
            Case::EncryptShift => a.extend(
                ["--encrypt", "--type", "luks2", "--reduce-device-size", "4M"].map(Into::into),
            ),
            Case::Decrypt => a.push("--decrypt".into()),
        }
        a.extend(FAST_KDF.iter().map(Into::into));
        a.extend(self.header_args().into_iter().map(Into::into));
        a.extend(extra.iter().map(Into::into));
        a.push("--key-file".into());
        a.push(self.key.clone().into());
        a.push(self.data.clone().into());
        a
    }

    pub(crate) fn cryptsetup(&self, extra: &[&str]) -> Output {
        Command::new("cryptsetup")
            .args(self.cryptsetup_args(extra))
            .output()
            .unwrap()
    }

    fn map(&self, mode: &str) -> Command {
        let mut c = Command::new(ucrypt_bin());
        c.args(["map", mode, "--luks"])
            .arg(&self.data)
            .args(self.header_args())
            .arg("--key-file")
            .arg(&self.key);
        c
    }

    fn write_plain(&self, plain: &[u8]) {
        use std::io::Write;
        let mut c = self.map("--write").stdin(Stdio::piped()).spawn().unwrap();
        c.stdin.take().unwrap().write_all(plain).unwrap();
        assert!(c.wait().unwrap().success(), "map --write");
    }

    fn read_plain(&self) -> Vec<u8> {
        ok(self.map("--read").output().unwrap(), "map --read").stdout
    }

    pub(crate) fn in_reencryption(&self) -> bool {
        let out = Command::new("cryptsetup")
            .args(["luksDump", "--dump-json-metadata"])
            .arg(self.meta())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).contains("online-reencrypt")
    }

    /// The data segments' types, as luksDump lists them.
    fn segment_kinds(&self) -> Vec<String> {
        let out = ok(
            Command::new("cryptsetup")
                .args(["luksDump", "--dump-json-metadata"])
                .arg(self.meta())
                .output()
                .unwrap(),
            "luksDump",
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let mut segs: Vec<(u32, String)> = v["segments"]
            .as_object()
            .unwrap()
            .iter()
            .filter(|(_, s)| {
                !s["flags"]
                    .as_array()
                    .is_some_and(|f| f.iter().any(|x| x.as_str().unwrap().starts_with("backup")))
            })
            .map(|(k, s)| (k.parse().unwrap(), s["type"].as_str().unwrap().to_string()))
            .collect();
        segs.sort();
        segs.into_iter().map(|(_, k)| k).collect()
    }

    /// cryptsetup stopped at its `hits`-th fdatasync (SIGINT: it ends
    /// that hotzone; `kill`: killed there, the hotzone torn).
    fn cryptsetup_stopped(&self, hits: usize, kill: bool) -> String {
        let cs = testutil::which("cryptsetup").unwrap();
        let args = self.cryptsetup_args(&["--resume-only", "--hotzone-size", "1M"]);
        let args: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_os_str()).collect();
        under_gdb(hits, kill, &cs, &args)
    }

    /// The finished volume: plaintext on the data device (decryption),
    /// or a LUKS2 volume cryptsetup opens whose plaintext is `want`.
    pub(crate) fn check_finished(&self, want: &[u8], what: &str) {
        assert!(!self.in_reencryption(), "{what}: finished");
        if self.case == Case::Decrypt {
            let bytes = std::fs::read(&self.data).unwrap();
            assert!(bytes == want, "{what}: the data device is the plaintext");
            return;
        }
        let mut c = Command::new("cryptsetup");
        c.args(["open", "--test-passphrase"])
            .args(self.header_args())
            .arg("--key-file")
            .arg(&self.key)
            .arg(&self.data);
        ok(c.output().unwrap(), "cryptsetup open --test-passphrase");
        // A finished data shift leaves a volume of the device size less
        // the shift (its last bytes the freed space); the data starts it.
        let got = self.read_plain();
        assert!(
            got.get(..want.len()) == Some(want),
            "{what}: plaintext ({} bytes read)",
            got.len()
        );
    }
}

fn bytes(path: &Path) -> Vec<u8> {
    std::fs::read(path).unwrap()
}

/// One case offline: initialized only, then stopped between hotzones,
/// each mapped to the plaintext; a write through ucrypt mid-way; then
/// cryptsetup finishes and the written data is there.
fn offline_case(case: Case, seed: u64) {
    let tag = format!("plaintext-{case:?}");
    let mut v = Vol::new(&tag, &std::env::temp_dir(), case, seed);
    ok(v.cryptsetup(&["--init-only"]), "cryptsetup --init-only");
    assert!(v.in_reencryption(), "{case:?}: initialized");
    assert!(v.read_plain() == v.plain, "{case:?}: map after --init-only");

    let text = v.cryptsetup_stopped(3, false);
    assert!(v.in_reencryption(), "{case:?}: stopped mid-way: {text}");
    let kinds = v.segment_kinds();
    assert!(
        kinds.iter().any(|k| k == "linear") && kinds.iter().any(|k| k == "crypt"),
        "{case:?}: a crypt and a linear segment: {kinds:?}"
    );
    assert!(v.read_plain() == v.plain, "{case:?}: map mid-way");

    // Writes across the boundary through ucrypt, then cryptsetup ends it.
    Rng::new(seed + 1).fill(&mut v.plain);
    v.write_plain(&v.plain);
    assert!(v.read_plain() == v.plain, "{case:?}: written mid-way");
    ok(v.cryptsetup(&["--resume-only"]), "cryptsetup --resume-only");
    v.check_finished(&v.plain, &format!("{case:?}"));
}

#[test]
fn mid_encryption_maps_and_cryptsetup_finishes() {
    if !require_tool("reencrypt_plaintext", "cryptsetup")
        || !require_tool("reencrypt_plaintext", "gdb")
    {
        return;
    }
    offline_case(Case::Encrypt, 200);
}

#[test]
fn mid_encryption_with_a_data_shift_maps_and_cryptsetup_finishes() {
    if !require_tool("reencrypt_plaintext", "cryptsetup")
        || !require_tool("reencrypt_plaintext", "gdb")
    {
        return;
    }
    offline_case(Case::EncryptShift, 210);
}

#[test]
fn mid_decryption_maps_and_cryptsetup_finishes() {
    if !require_tool("reencrypt_plaintext", "cryptsetup")
        || !require_tool("reencrypt_plaintext", "gdb")
    {
        return;
    }
    offline_case(Case::Decrypt, 220);
}

/// cryptsetup killed inside a hotzone of a decryption: `open
/// --test-passphrase` refuses the torn volume and writes nothing; `map`
/// repairs it first and reads the plaintext.
#[test]
fn a_torn_decryption_is_refused_unrepaired_and_repaired_by_map() {
    if !require_tool("reencrypt_plaintext", "cryptsetup")
        || !require_tool("reencrypt_plaintext", "gdb")
    {
        return;
    }
    let v = Vol::new("plaintext-torn", &std::env::temp_dir(), Case::Decrypt, 230);
    ok(v.cryptsetup(&["--init-only"]), "cryptsetup --init-only");
    v.cryptsetup_stopped(3, true);
    assert!(v.in_reencryption());
    let before = (bytes(&v.data), bytes(v.meta()));
    let out = Command::new(ucrypt_bin())
        .args(["open", "--test-passphrase"])
        .args(v.header_args())
        .arg(&v.data)
        .arg("--key-file")
        .arg(&v.key)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("requires reencryption recovery"),
        "{err}"
    );
    assert!(
        (bytes(&v.data), bytes(v.meta())) == before,
        "nothing written"
    );
    assert!(v.read_plain() == v.plain, "map repairs the hotzone");
}

/// Online: `open` serves the volume mid-way, a verifying writer runs
/// through NBD while `reencrypt --resume-only --active-name` finishes
/// it; every acknowledged write is there afterwards, served and on disk.
fn online_case(case: Case, seed: u64) {
    let test = format!("online_{case:?}");
    let v = Vol::new(&test, &base(), case, seed);
    ok(v.cryptsetup(&["--init-only"]), "cryptsetup --init-only");
    if case != Case::EncryptShift {
        v.cryptsetup_stopped(3, false);
        assert!(v.in_reencryption(), "{case:?}: stopped mid-way");
    }
    let ucrypt = |args: &[&std::ffi::OsStr]| {
        Command::new(ucrypt_bin())
            .env("UCRYPT_RUNTIME_DIR", v.dir.join("run"))
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let k = v.key.as_os_str();
    let mut open: Vec<&std::ffi::OsStr> = vec!["open".as_ref(), "--key-file".as_ref(), k];
    open.extend(v.header_args());
    open.extend([v.data.as_os_str(), "v".as_ref()]);
    ok(ucrypt(&open), "open mid-way");
    let _closer = Closer(v.dir.join("run"));
    let sock = v.dir.join("run").join("v.nbd.sock");
    let client = NbdClient::connect(&sock).unwrap();
    let size = client.size as usize;
    // The writer covers DATA bytes: the shift case's volume is smaller,
    // so it is checked by reads and a write before and after instead.
    let (stop, writer) = if size == DATA {
        let (s, w) = start_writer(client, v.plain.clone(), seed);
        (Some(s), Some(w))
    } else {
        let mut c = client;
        assert_eq!(c.read(0, size).unwrap(), v.plain, "served mid-way");
        (None, None)
    };
    let mut re: Vec<&std::ffi::OsStr> = [
        "reencrypt",
        "-q",
        "--resume-only",
        "--active-name",
        "v",
        "--hotzone-size",
        "1M",
        "--key-file",
    ]
    .iter()
    .map(std::ffi::OsStr::new)
    .collect();
    re.push(k);
    re.extend(v.header_args());
    let out = ucrypt(&re);
    let status = ucrypt(&["status".as_ref(), "--json".as_ref(), "v".as_ref()]);
    let model = match (stop, writer) {
        (Some(s), Some(w)) => {
            s.store(true, Ordering::Relaxed);
            let seen = w.join().unwrap();
            assert!(seen.mismatch.is_none(), "{case:?}: {:?}", seen.mismatch);
            assert!(seen.ops > 0, "the writer did IO");
            seen.model
        }
        _ => v.plain.clone(),
    };
    ok(out, "reencrypt --resume-only --active-name");
    let st: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(st["reencryption"]["finished"], true, "{st}");
    // Still served, now as the final mapping: the model reads back, and
    // one more write lands.
    let mut c = NbdClient::connect(&sock).unwrap();
    assert!(c.read(0, size).unwrap() == model, "{case:?}: served after");
    let mut model = model;
    let extra = Rng::new(seed + 9).bytes(64 << 10);
    c.write(4096, &extra, false).unwrap();
    c.flush().unwrap();
    model[4096..4096 + extra.len()].copy_from_slice(&extra);
    drop(c);
    ok(ucrypt(&["close".as_ref(), "v".as_ref()]), "close");
    v.check_finished(&model, &format!("online {case:?}"));
}

/// Closes the served volume `v` when a test ends, failed or not.
pub(crate) struct Closer(pub(crate) PathBuf);

impl Drop for Closer {
    fn drop(&mut self) {
        let _ = Command::new(ucrypt_bin())
            .env("UCRYPT_RUNTIME_DIR", &self.0)
            .args(["close", "v"])
            .stdin(Stdio::null())
            .output();
    }
}

#[test]
fn mid_encryption_continues_online_under_a_verifying_nbd_writer() {
    if !require_tool("reencrypt_plaintext_online", "cryptsetup")
        || !require_tool("reencrypt_plaintext_online", "gdb")
    {
        return;
    }
    online_case(Case::Encrypt, 240);
}

#[test]
fn mid_decryption_continues_online_and_ends_serving_plaintext() {
    if !require_tool("reencrypt_plaintext_online", "cryptsetup")
        || !require_tool("reencrypt_plaintext_online", "gdb")
    {
        return;
    }
    online_case(Case::Decrypt, 250);
}

#[test]
fn mid_encryption_with_a_data_shift_continues_online() {
    if !require_tool("reencrypt_plaintext_online", "cryptsetup") {
        return;
    }
    online_case(Case::EncryptShift, 260);
}
