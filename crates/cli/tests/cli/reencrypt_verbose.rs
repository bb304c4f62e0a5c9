//! `ucrypt -v reencrypt` prints what `cryptsetup -v reencrypt` prints on
//! the same files, on stdout ("Key slot N unlocked." for each keyslot a
//! start opens, "Key slot N created." for each new one, nothing more on
//! a resume, then "Command successful."); the `open` an encryption with
//! a NAME runs gets `-v`/`--debug` too, its closing line left to the
//! reencryption's.

use std::path::Path;
use std::process::{Command, Output, Stdio};

use crate::reencrypt::ok;
use crate::reencrypt_encrypt::FAST_KDF;
use crate::reencrypt_plaintext::Closer;
use testutil::{require_tool, ucrypt_bin, Rng, TempDir};

/// `TOOL -v reencrypt -q ARGS` (cryptsetup offline), `stdin` piped in.
fn reencrypt(tool: &str, args: &[&str], stdin: &[u8]) -> Output {
    let mut c = if tool == "cryptsetup" {
        let mut c = Command::new("cryptsetup");
        c.args(["-v", "reencrypt", "--force-offline-reencrypt"]);
        c
    } else {
        let mut c = Command::new(ucrypt_bin());
        c.args(["-v", "reencrypt"]);
        c
    };
    let mut child = c
        .arg("-q")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn verbose_lines_are_cryptsetups() {
    if !require_tool("reencrypt_verbose", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("reenc-verbose");
    let (k0, k1) = (dir.join("k0"), dir.join("k1"));
    std::fs::write(&k0, b"verbose pass 0").unwrap();
    std::fs::write(&k1, b"verbose pass 1").unwrap();
    let vol = dir.join("vol");
    std::fs::File::create(&vol)
        .unwrap()
        .set_len(20 << 20)
        .unwrap();
    let mut f = testutil::FAST_LUKS2_FORMAT.to_vec();
    f.extend(["--key-file", s(&k0), s(&vol)]);
    ok(
        Command::new("cryptsetup").args(&f).output().unwrap(),
        "luksFormat",
    );
    let mut add = vec!["luksAddKey", "-q", "--key-file", s(&k0)];
    add.extend_from_slice(FAST_KDF);
    add.extend([s(&vol), s(&k1)]);
    ok(
        Command::new("cryptsetup").args(&add).output().unwrap(),
        "luksAddKey",
    );
    let mut plain = vec![0u8; 8 << 20];
    Rng::new(300).fill(&mut plain);
    let mut outs: Vec<Vec<String>> = Vec::new();
    for tool in ["cryptsetup", "ucrypt"] {
        let mut seen = Vec::new();
        let mut step = |args: &[&str], stdin: &[u8]| {
            let o = ok(reencrypt(tool, args, stdin), &format!("{tool} {args:?}"));
            seen.push(String::from_utf8_lossy(&o.stdout).to_string());
        };
        let (v, w) = (
            dir.join(&format!("{tool}.vol")),
            dir.join(&format!("{tool}.vol2")),
        );
        std::fs::copy(&vol, &v).unwrap();
        std::fs::copy(&vol, &w).unwrap();
        // Both keyslots, each passphrase on stdin.
        let mut a = FAST_KDF.to_vec();
        a.push(s(&v));
        step(&a, b"verbose pass 0\nverbose pass 1\n");
        // One keyslot, initialized then resumed.
        let mut a = FAST_KDF.to_vec();
        a.extend(["--key-file", s(&k1), "-S", "1", "--init-only", s(&w)]);
        step(&a, b"");
        step(&["--key-file", s(&k1), "--resume-only", s(&w)], b"");
        // An encryption into keyslot 3, then its decryption.
        let (data, hdr) = (
            dir.join(&format!("{tool}.data")),
            dir.join(&format!("{tool}.hdr")),
        );
        std::fs::write(&data, &plain).unwrap();
        let mut a = FAST_KDF.to_vec();
        a.extend([
            "--encrypt",
            "--header",
            s(&hdr),
            "--key-file",
            s(&k0),
            "-S",
            "3",
            s(&data),
        ]);
        step(&a, b"");
        step(
            &[
                "--decrypt",
                "--header",
                s(&hdr),
                "--key-file",
                s(&k0),
                s(&data),
            ],
            b"",
        );
        assert!(std::fs::read(&data).unwrap() == plain, "{tool}: decrypted");
        outs.push(seen);
    }
    assert_eq!(outs[1], outs[0], "ucrypt's stdout is cryptsetup's");
    assert_eq!(outs[1][0], "Key slot 0 unlocked.\nKey slot 1 unlocked.\nKey slot 2 created.\nKey slot 3 created.\nCommand successful.\n");
}

/// `ucrypt -v reencrypt --encrypt --init-only ... DEVICE v`: the created
/// keyslot, the activation line and one closing status line; with
/// `--debug` the spawned open says it was run with it (and with the
/// passphrase on its stdin, not in its arguments).
#[test]
fn an_encryption_with_a_name_hands_its_verbosity_to_open() {
    let dir = TempDir::new("reenc-verbose-open");
    let _closer = Closer(dir.join("run"));
    let key = dir.join("key");
    std::fs::write(&key, b"verbose open pass").unwrap();
    for (flag, n) in [("-v", 0), ("--debug", 1)] {
        let (data, hdr) = (dir.join(&format!("data{n}")), dir.join(&format!("hdr{n}")));
        let mut plain = vec![0u8; 4 << 20];
        Rng::new(310 + n).fill(&mut plain);
        std::fs::write(&data, &plain).unwrap();
        let name = format!("v{n}");
        let mut a = vec![
            flag,
            "reencrypt",
            "-q",
            "--encrypt",
            "--init-only",
            "--header",
            s(&hdr),
        ];
        a.extend_from_slice(FAST_KDF);
        a.extend(["--key-file", s(&key), s(&data), &name]);
        let o = ok(
            Command::new(ucrypt_bin())
                .env("UCRYPT_RUNTIME_DIR", dir.join("run"))
                .args(&a)
                .stdin(Stdio::null())
                .output()
                .unwrap(),
            flag,
        );
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines.contains(&"Key slot 0 created."), "{flag}: {out}");
        let active = format!("{name} is now active and ready for online encryption.");
        assert!(lines.contains(&active.as_str()), "{flag}: {out}");
        assert_eq!(lines.last(), Some(&"Command successful."), "{flag}: {out}");
        assert_eq!(
            lines.iter().filter(|l| l.starts_with("Command ")).count(),
            1,
            "{flag}: one status line: {out}"
        );
        if flag == "--debug" {
            let open_line = lines
                .iter()
                .find(|l| l.contains("processing \"ucrypt open"))
                .unwrap_or_else(|| panic!("the open ran with --debug: {out}"));
            assert!(open_line.contains("--key-file -"), "{open_line}");
            assert!(!open_line.contains("verbose open pass"), "{open_line}");
        }
        ok(
            Command::new(ucrypt_bin())
                .env("UCRYPT_RUNTIME_DIR", dir.join("run"))
                .args(["close", &name])
                .output()
                .unwrap(),
            "close",
        );
    }
}
