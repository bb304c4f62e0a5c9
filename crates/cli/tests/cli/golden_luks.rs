//! Golden tests: today's exact `ucrypt dump`, `is-luks` and `uuid` output
//! and exit codes, and the shape of `ucrypt benchmark` (rows, columns,
//! `--json` keys), pinned so the LUKS output can move between crates
//! without changing a byte.
//!
//! Volumes are made by cryptsetup and by ucrypt with a fixed UUID, forced
//! KDF costs and a fixed volume key, so the only random bytes are salts and
//! the digests computed from them; [`normalise`] masks those hex bytes
//! (keeping their count and layout) and the temporary directory's path.
//! Benchmark figures are measured, so each line is parsed and printed
//! again with the expected format: the layout is pinned, not the numbers.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use testutil::TempDir;

use crate::crypt_benchmark::benchmark;

const UUID: &str = "11111111-2222-3333-4444-555555555555";
const UUID2: &str = "66666666-7777-8888-9999-aaaaaaaaaaaa";
const FAST_ARGON: &[&str] = &[
    "--pbkdf",
    "argon2id",
    "--pbkdf-force-iterations",
    "4",
    "--pbkdf-memory",
    "1024",
    "--pbkdf-parallel",
    "1",
];
const FAST_PBKDF2: &[&str] = &["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];

/// What a command did: exit code, stdout, stderr (paths normalised).
#[derive(Debug, PartialEq)]
struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

fn out(code: i32, stdout: &str, stderr: &str) -> Out {
    Out {
        code,
        stdout: stdout.to_owned(),
        stderr: stderr.to_owned(),
    }
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Runs `prog` (`ucrypt` means the binary under test) with `args`, an empty
/// stdin, and `dir`'s path replaced by `$DIR` in both outputs.
fn run(dir: &TempDir, prog: &str, args: &[&str]) -> Out {
    let o = testutil::run(prog, args, None);
    let path = |b: &[u8]| {
        String::from_utf8(b.to_vec())
            .unwrap()
            .replace(s(dir.path()), "$DIR")
    };
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: path(&o.stdout),
        stderr: path(&o.stderr),
    }
}

/// Runs a command that must succeed and returns its stdout.
fn ok(dir: &TempDir, prog: &str, args: &[&str]) -> String {
    let o = run(dir, prog, args);
    assert_eq!(o.code, 0, "{prog} {args:?}: {o:?}");
    o.stdout
}

/// Masks the hex bytes a line ends with (`5a 0c ` -> `xx xx `): salts and
/// digests, the only random parts of a dump. Counts and spacing stay.
fn normalise(text: &str) -> String {
    let mut res = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (body, nl) = match line.strip_suffix('\n') {
            Some(b) => (b, "\n"),
            None => (line, ""),
        };
        let b = body.as_bytes();
        let mut start = b.len();
        while start >= 3
            && b[start - 1] == b' '
            && b[start - 2].is_ascii_hexdigit()
            && b[start - 3].is_ascii_hexdigit()
            && (start == 3 || matches!(b[start - 4], b' ' | b'\t'))
        {
            start -= 3;
        }
        res.push_str(&body[..start]);
        res.push_str(&"xx ".repeat((b.len() - start) / 3));
        res.push_str(nl);
    }
    res
}

fn tools(test: &str) -> bool {
    testutil::require_tool(test, "cryptsetup")
}

fn image(dir: &TempDir, name: &str, mib: u64) -> PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p)
        .unwrap()
        .set_len(mib << 20)
        .unwrap();
    p
}

fn file(dir: &TempDir, name: &str, content: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p)
        .unwrap()
        .write_all(content)
        .unwrap();
    p
}

/// A fixed 512-bit volume key: `dump --dump-volume-key` is then fully
/// deterministic.
fn volume_key(dir: &TempDir) -> PathBuf {
    let vk: Vec<u8> = (0u8..64)
        .map(|i| i.wrapping_mul(37).wrapping_add(5))
        .collect();
    file(dir, "vk.bin", &vk)
}

// ---------------------------------------------------------------- dump

/// ucrypt's dump of the cryptsetup-made LUKS2 volume below. cryptsetup 2.6
/// itself prints `Priority:   preferred` and a `Keyslot:    2` line under
/// the token; ucrypt's text differs there today and the golden pins it.
const CS_LUKS2_DUMP: &str = "LUKS header information
Version:       \t2
Epoch:         \t6
Metadata area: \t16384 [bytes]
Keyslots area: \t1048576 [bytes]
UUID:          \t11111111-2222-3333-4444-555555555555
Label:         \tgolden
Subsystem:     \tucrypt-test
Flags:       \t(no flags)

Data segments:
  0: crypt
\toffset: 2097152 [bytes]
\tlength: (whole device)
\tcipher: aes-xts-plain64
\tsector: 512 [bytes]

Keyslots:
  0: luks2
\tKey:        512 bits
\tPriority:   normal
\tCipher:     aes-xts-plain64
\tCipher key: 512 bits
\tPBKDF:      argon2i
\tTime cost:  4
\tMemory:     1024
\tThreads:    1
\tSalt:       xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx 
\t            xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx 
\tAF stripes: 4000
\tAF hash:    sha256
\tArea offset:32768 [bytes]
\tArea length:258048 [bytes]
\tDigest ID:  0
  2: luks2
\tKey:        512 bits
\tPriority:   preferred
\tCipher:     aes-xts-plain64
\tCipher key: 512 bits
\tPBKDF:      pbkdf2
\tHash:       sha512
\tIterations: 1000
\tSalt:       xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx 
\t            xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx 
\tAF stripes: 4000
\tAF hash:    sha512
\tArea offset:290816 [bytes]
\tArea length:258048 [bytes]
\tDigest ID:  0
Tokens:
  1: golden-token
\tKeyslot:    2
Digests:
  0: pbkdf2
\tHash:       sha256
\tIterations: 1000
\tSalt:       xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx 
\t            xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx 
\tDigest:     xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx 
\t            xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx 
";

/// cryptsetup LUKS2 with a label, a subsystem, 512-byte sectors, an
/// Argon2i and a PBKDF2-sha512 keyslot (the second one preferred) and a
/// token: ucrypt's dump is pinned.
#[test]
fn dump_cryptsetup_luks2() {
    if !tools("dump_cryptsetup_luks2") {
        return;
    }
    let dir = TempDir::new("golden-cs2");
    let dev = image(&dir, "cs2.img", 8);
    let kf = file(&dir, "pass", b"golden");
    let kf2 = file(&dir, "pass2", b"golden2");
    let tok = file(
        &dir,
        "token.json",
        br#"{"type":"golden-token","keyslots":["2"]}"#,
    );
    ok(
        &dir,
        "cryptsetup",
        &[
            "luksFormat",
            "-q",
            "--type",
            "luks2",
            "--uuid",
            UUID,
            "--label",
            "golden",
            "--subsystem",
            "ucrypt-test",
            "--sector-size",
            "512",
            "--pbkdf",
            "argon2i",
            "--pbkdf-force-iterations",
            "4",
            "--pbkdf-memory",
            "1024",
            "--pbkdf-parallel",
            "1",
            "--luks2-metadata-size",
            "16k",
            "--luks2-keyslots-size",
            "1m",
            "-d",
            s(&kf),
            s(&dev),
        ],
    );
    ok(
        &dir,
        "cryptsetup",
        &[
            "luksAddKey",
            "-q",
            "--key-slot",
            "2",
            "--pbkdf",
            "pbkdf2",
            "--hash",
            "sha512",
            "--pbkdf-force-iterations",
            "1000",
            "-d",
            s(&kf),
            s(&dev),
            s(&kf2),
        ],
    );
    ok(
        &dir,
        "cryptsetup",
        &["config", "--priority", "prefer", "--key-slot", "2", s(&dev)],
    );
    ok(
        &dir,
        "cryptsetup",
        &[
            "token",
            "import",
            "--json-file",
            s(&tok),
            "--token-id",
            "1",
            s(&dev),
        ],
    );
    let o = run(&dir, "ucrypt", &["dump", s(&dev)]);
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    assert_eq!(normalise(&o.stdout), CS_LUKS2_DUMP);
    assert_eq!(ok(&dir, "ucrypt", &["uuid", s(&dev)]), format!("{UUID}\n"));
}

const CS_LUKS1_DUMP: &str = "LUKS header information for $DIR/cs1.img

Version:       \t1
Cipher name:   \taes
Cipher mode:   \tcbc-essiv:sha256
Hash spec:     \tsha1
Payload offset:\t4096
MK bits:       \t256
MK digest:     \txx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx 
MK salt:       \txx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx 
               \txx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx 
MK iterations: \t1000
UUID:          \t11111111-2222-3333-4444-555555555555

Key Slot 0: ENABLED
\tIterations:         \t1000
\tSalt:               \txx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx 
\t                      \txx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx 
\tKey material offset:\t8
\tAF stripes:            \t4000
Key Slot 1: DISABLED
Key Slot 2: DISABLED
Key Slot 3: ENABLED
\tIterations:         \t2000
\tSalt:               \txx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx 
\t                      \txx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx 
\tKey material offset:\t776
\tAF stripes:            \t4000
Key Slot 4: DISABLED
Key Slot 5: DISABLED
Key Slot 6: DISABLED
Key Slot 7: DISABLED
";

/// cryptsetup LUKS1, aes-cbc-essiv:sha256 with a 256-bit key and SHA-1,
/// keyslots 0 and 3: the dump, `uuid`, and `is-luks` with each `--type`.
#[test]
fn dump_cryptsetup_luks1_and_probe() {
    if !tools("dump_cryptsetup_luks1_and_probe") {
        return;
    }
    let dir = TempDir::new("golden-cs1");
    let dev = image(&dir, "cs1.img", 4);
    let kf = file(&dir, "pass", b"golden");
    let kf2 = file(&dir, "pass2", b"golden2");
    ok(
        &dir,
        "cryptsetup",
        &[
            "luksFormat",
            "-q",
            "--type",
            "luks1",
            "--uuid",
            UUID,
            "--cipher",
            "aes-cbc-essiv:sha256",
            "--key-size",
            "256",
            "--hash",
            "sha1",
            "--pbkdf-force-iterations",
            "1000",
            "-d",
            s(&kf),
            s(&dev),
        ],
    );
    ok(
        &dir,
        "cryptsetup",
        &[
            "luksAddKey",
            "-q",
            "--key-slot",
            "3",
            "--pbkdf-force-iterations",
            "2000",
            "-d",
            s(&kf),
            s(&dev),
            s(&kf2),
        ],
    );
    let o = run(&dir, "ucrypt", &["dump", s(&dev)]);
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    assert_eq!(normalise(&o.stdout), CS_LUKS1_DUMP);

    let d = s(&dev);
    assert_eq!(run(&dir, "ucrypt", &["is-luks", d]), out(0, "", ""));
    assert_eq!(
        run(&dir, "ucrypt", &["is-luks", "--type", "luks1", d]),
        out(0, "", "")
    );
    assert_eq!(
        run(&dir, "ucrypt", &["is-luks", "--type", "luks", d]),
        out(0, "", "")
    );
    assert_eq!(
        run(&dir, "ucrypt", &["is-luks", "--type", "luks2", d]),
        out(1, "", "ucrypt: Device $DIR/cs1.img is LUKS1, not luks2\n")
    );
    assert_eq!(
        run(&dir, "ucrypt", &["uuid", d]),
        out(0, &format!("{UUID}\n"), "")
    );
}

const UC_LUKS2_DUMP: &str = "LUKS header information
Version:       \t2
Epoch:         \t2
Metadata area: \t16384 [bytes]
Keyslots area: \t16744448 [bytes]
UUID:          \t11111111-2222-3333-4444-555555555555
Label:         \tmine
Subsystem:     \t(no subsystem)
Flags:       \t(no flags)

Data segments:
  0: crypt
\toffset: 16777216 [bytes]
\tlength: (whole device)
\tcipher: aes-xts-plain64
\tsector: 4096 [bytes]

Keyslots:
  0: luks2
\tKey:        512 bits
\tPriority:   normal
\tCipher:     aes-xts-plain64
\tCipher key: 512 bits
\tPBKDF:      argon2id
\tTime cost:  4
\tMemory:     1024
\tThreads:    1
\tSalt:       xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx 
\t            xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx 
\tAF stripes: 4000
\tAF hash:    sha256
\tArea offset:32768 [bytes]
\tArea length:258048 [bytes]
\tDigest ID:  0
Tokens:
Digests:
  0: pbkdf2
\tHash:       sha256
\tIterations: 1000
\tSalt:       xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx 
\t            xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx 
\tDigest:     xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx 
\t            xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx 
";

const UC_LUKS2_VK_DUMP: &str = "LUKS header information for $DIR/uc2.img
Cipher name:   \taes
Cipher mode:   \txts-plain64
Payload offset:\t32768
UUID:          \t11111111-2222-3333-4444-555555555555
MK bits:       \t512
MK dump:\t05 2a 4f 74 99 be e3 08 2d 52 77 9c c1 e6 0b 30 
\t\t55 7a 9f c4 e9 0e 33 58 7d a2 c7 ec 11 36 5b 80 
\t\ta5 ca ef 14 39 5e 83 a8 cd f2 17 3c 61 86 ab d0 
\t\tf5 1a 3f 64 89 ae d3 f8 1d 42 67 8c b1 d6 fb 20 
";

/// ucrypt-made LUKS2 with a fixed volume key: the dump, the volume key
/// dump, `uuid --uuid` (silent) and the exit codes of a wrong passphrase.
#[test]
fn dump_ucrypt_luks2() {
    let dir = TempDir::new("golden-uc2");
    let dev = image(&dir, "uc2.img", 20);
    let kf = file(&dir, "pass", b"golden");
    let bad = file(&dir, "bad", b"nope");
    let vk = volume_key(&dir);
    let mut fmt = vec![
        "format",
        "-q",
        "--type",
        "luks2",
        "--uuid",
        UUID,
        "--label",
        "mine",
        "--volume-key-file",
        s(&vk),
        "-d",
        s(&kf),
    ];
    fmt.extend_from_slice(FAST_ARGON);
    fmt.push(s(&dev));
    assert_eq!(run(&dir, "ucrypt", &fmt), out(0, "", ""));
    let o = run(&dir, "ucrypt", &["dump", s(&dev)]);
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    assert_eq!(normalise(&o.stdout), UC_LUKS2_DUMP);
    assert_eq!(
        run(
            &dir,
            "ucrypt",
            &["dump", "--dump-volume-key", "-q", "-d", s(&kf), s(&dev)]
        ),
        out(0, UC_LUKS2_VK_DUMP, "")
    );
    assert_eq!(
        run(
            &dir,
            "ucrypt",
            &["dump", "--dump-volume-key", "-q", "-d", s(&bad), s(&dev)]
        ),
        out(2, "", "ucrypt: No key available with this passphrase\n")
    );
    assert_eq!(
        run(&dir, "ucrypt", &["uuid", "--uuid", UUID2, s(&dev)]),
        out(0, "", "")
    );
    assert_eq!(
        run(&dir, "ucrypt", &["uuid", s(&dev)]),
        out(0, &format!("{UUID2}\n"), "")
    );
    assert_eq!(
        run(&dir, "ucrypt", &["is-luks", "--type", "luks1", s(&dev)]),
        out(1, "", "ucrypt: Device $DIR/uc2.img is LUKS2, not luks1\n")
    );
}

const UC_LUKS1_DUMP: &str = "LUKS header information for $DIR/uc1.hdr

Version:       \t1
Cipher name:   \taes
Cipher mode:   \txts-plain64
Hash spec:     \tsha256
Payload offset:\t0
MK bits:       \t512
MK digest:     \txx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx 
MK salt:       \txx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx 
               \txx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx 
MK iterations: \t1000
UUID:          \t11111111-2222-3333-4444-555555555555

Key Slot 0: ENABLED
\tIterations:         \t1000
\tSalt:               \txx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx 
\t                      \txx xx xx xx xx xx xx xx xx xx xx xx xx xx xx xx 
\tKey material offset:\t8
\tAF stripes:            \t4000
Key Slot 1: DISABLED
Key Slot 2: DISABLED
Key Slot 3: DISABLED
Key Slot 4: DISABLED
Key Slot 5: DISABLED
Key Slot 6: DISABLED
Key Slot 7: DISABLED
";

const UC_LUKS1_VK_DUMP: &str = "LUKS header information for $DIR/uc1.hdr
Cipher name:   \taes
Cipher mode:   \txts-plain64
Payload offset:\t0
UUID:          \t11111111-2222-3333-4444-555555555555
MK bits:       \t512
MK dump:\t05 2a 4f 74 99 be e3 08 2d 52 77 9c c1 e6 0b 30 
\t\t55 7a 9f c4 e9 0e 33 58 7d a2 c7 ec 11 36 5b 80 
\t\ta5 ca ef 14 39 5e 83 a8 cd f2 17 3c 61 86 ab d0 
\t\tf5 1a 3f 64 89 ae d3 f8 1d 42 67 8c b1 d6 fb 20 
";

/// ucrypt-made LUKS1 on a detached header: the dump names the header file.
#[test]
fn dump_ucrypt_luks1_detached() {
    let dir = TempDir::new("golden-uc1");
    let dev = image(&dir, "uc1.img", 1);
    let hdr = image(&dir, "uc1.hdr", 2);
    let kf = file(&dir, "pass", b"golden");
    let vk = volume_key(&dir);
    let mut fmt = vec![
        "format",
        "-q",
        "--type",
        "luks1",
        "--uuid",
        UUID,
        "--header",
        s(&hdr),
        "--volume-key-file",
        s(&vk),
        "-d",
        s(&kf),
    ];
    fmt.extend_from_slice(FAST_PBKDF2);
    fmt.push(s(&dev));
    assert_eq!(run(&dir, "ucrypt", &fmt), out(0, "", ""));
    let o = run(&dir, "ucrypt", &["dump", "--header", s(&hdr), s(&dev)]);
    assert_eq!((o.code, o.stderr.as_str()), (0, ""), "{o:?}");
    assert_eq!(normalise(&o.stdout), UC_LUKS1_DUMP);
    assert_eq!(
        run(
            &dir,
            "ucrypt",
            &[
                "dump",
                "--dump-volume-key",
                "-q",
                "--header",
                s(&hdr),
                "-d",
                s(&kf),
                s(&dev)
            ]
        ),
        out(0, UC_LUKS1_VK_DUMP, "")
    );
    assert_eq!(
        run(&dir, "ucrypt", &["uuid", "--header", s(&hdr), s(&dev)]),
        out(0, &format!("{UUID}\n"), "")
    );
}

/// Devices that are missing or hold no LUKS header: messages and
/// cryptsetup's exit codes (4 wrong device, 1 not LUKS).
#[test]
fn not_luks_and_missing_devices() {
    let dir = TempDir::new("golden-bad");
    let plain = file(&dir, "plain.img", &[0u8; 8192]);
    let missing = dir.join("missing.img");
    let (p, m) = (s(&plain), s(&missing));
    let not_luks = "ucrypt: Device $DIR/plain.img is not a valid LUKS device\n";
    let no_dev = "ucrypt: Device $DIR/missing.img does not exist or access denied\n";
    assert_eq!(run(&dir, "ucrypt", &["dump", p]), out(1, "", not_luks));
    assert_eq!(run(&dir, "ucrypt", &["dump", m]), out(4, "", no_dev));
    assert_eq!(run(&dir, "ucrypt", &["uuid", p]), out(1, "", not_luks));
    assert_eq!(run(&dir, "ucrypt", &["uuid", m]), out(4, "", no_dev));
    assert_eq!(run(&dir, "ucrypt", &["is-luks", p]), out(1, "", not_luks));
    assert_eq!(
        run(&dir, "ucrypt", &["is-luks", "-v", p]),
        out(
            1,
            // cryptsetup 2.6 -v ends every verb with this line on stdout.
            "Command failed with code -1 (wrong or missing parameters).\n",
            "No LUKS signature\n\
             ucrypt: Device $DIR/plain.img is not a valid LUKS device\n"
        )
    );
    assert_eq!(
        run(&dir, "ucrypt", &["is-luks", m]),
        out(
            1,
            "",
            "ucrypt: Device $DIR/missing.img is not a valid LUKS device\n"
        )
    );
    assert_eq!(
        run(&dir, "ucrypt", &["is-luks", "-v", m]),
        out(
            1,
            "Command failed with code -1 (wrong or missing parameters).\n",
            "Cannot open $DIR/missing.img: No such file or directory (os error 2)\n\
             ucrypt: Device $DIR/missing.img is not a valid LUKS device\n"
        )
    );
}

/// The keyslot verbs' messages (stderr) and exit codes: add-key,
/// change-key, remove-key, kill-slot, header-backup / header-restore.
#[test]
fn keyslot_verbs_messages_and_codes() {
    let dir = TempDir::new("golden-slots");
    let dev = image(&dir, "slots.img", 20);
    let k0 = file(&dir, "k0", b"zero");
    let k1 = file(&dir, "k1", b"one");
    let k2 = file(&dir, "k2", b"two");
    let bad = file(&dir, "bad", b"nope");
    let bak = dir.join("slots.bak");
    let d = s(&dev);
    let with_kdf = |head: &[&'static str], key: &Path, tail: &[&str]| -> Out {
        let mut a: Vec<&str> = head.to_vec();
        a.extend(["-d", s(key)]);
        a.extend_from_slice(FAST_ARGON);
        a.extend_from_slice(tail);
        run(&dir, "ucrypt", &a)
    };
    assert_eq!(
        with_kdf(&["format", "-q", "--uuid", UUID], &k0, &[d]),
        out(0, "", "")
    );
    assert_eq!(
        with_kdf(&["add-key"], &k0, &[d, s(&k1)]),
        out(0, "", "Key slot 1 created.\n")
    );
    assert_eq!(
        with_kdf(&["add-key", "-S", "1"], &k0, &[d, s(&k2)]),
        out(1, "", "ucrypt: Keyslot 1 is already in use\n")
    );
    assert_eq!(
        with_kdf(&["add-key"], &bad, &[d, s(&k2)]),
        out(2, "", "ucrypt: No key available with this passphrase\n")
    );
    assert_eq!(
        with_kdf(&["change-key"], &k1, &[d, s(&k2)]),
        out(
            0,
            "",
            // LUKS2 keeps the slot number, as cryptsetup does.
            "Key slot 1 changed.\n"
        )
    );
    assert_eq!(
        run(&dir, "ucrypt", &["kill-slot", "-q", d, "5"]),
        out(1, "", "ucrypt: Keyslot 5 is not active\n")
    );
    assert_eq!(
        run(&dir, "ucrypt", &["kill-slot", "-d", s(&k2), d, "1"]),
        out(
            2,
            "",
            "ucrypt: Give a passphrase of a remaining keyslot, not of the one to kill\n"
        )
    );
    assert_eq!(
        run(&dir, "ucrypt", &["remove-key", "-q", "-d", s(&k2), d]),
        out(0, "", "Key slot 1 removed.\n")
    );
    assert_eq!(
        run(&dir, "ucrypt", &["remove-key", "-d", s(&k0), d]),
        out(
            1,
            "",
            "ucrypt: Refusing to remove the last keyslot without --batch-mode\n"
        )
    );
    assert_eq!(
        run(&dir, "ucrypt", &["kill-slot", d, "0"]),
        out(
            1,
            "",
            "ucrypt: Refusing to kill the last keyslot without --batch-mode\n"
        )
    );
    assert_eq!(
        run(
            &dir,
            "ucrypt",
            &["header-backup", "--header-backup-file", s(&bak), d]
        ),
        out(0, "", "")
    );
    assert_eq!(
        run(
            &dir,
            "ucrypt",
            &["header-restore", "-q", "--header-backup-file", s(&bak), d]
        ),
        out(0, "", &format!("Restored LUKS2 header with UUID {UUID}.\n"))
    );
}

#[test]
fn normalise_masks_only_trailing_hex_bytes() {
    assert_eq!(
        normalise("\tSalt:       0a ff \n\t            12 \nEpoch: 3\nMK bits: 512 \n"),
        "\tSalt:       xx xx \n\t            xx \nEpoch: 3\nMK bits: 512 \n"
    );
}

// ----------------------------------------------------------- benchmark

fn num<T: std::str::FromStr>(field: Option<&str>, line: &str) -> T {
    field
        .and_then(|f| f.trim_end_matches(',').parse().ok())
        .unwrap_or_else(|| panic!("no number where expected in {line:?}"))
}

/// Checks every line of a cryptsetup-style table by reading its figures
/// and printing them again in the expected format; returns the cipher rows.
fn check_table(text: &str, kdf: bool, openssl: bool) -> Vec<(String, String, String)> {
    let mut lines = text.lines().peekable();
    assert_eq!(
        lines.next(),
        Some("# Tests are approximate using memory only (no storage IO).")
    );
    let hashes: &[&str] = if kdf {
        &["sha1", "sha256", "sha512"]
    } else {
        &[]
    };
    for h in hashes {
        let l = lines.next().unwrap();
        let f: Vec<&str> = l.split_whitespace().collect();
        let rate: u64 = num(f.get(1).copied(), l);
        assert_eq!(
            l,
            format!(
                "{:<16} {rate:>7} iterations per second for 256-bit key",
                format!("PBKDF2-{h}")
            )
        );
    }
    let argons: &[&str] = if kdf { &["argon2i", "argon2id"] } else { &[] };
    for a in argons {
        let l = lines.next().unwrap();
        let f: Vec<&str> = l.split_whitespace().collect();
        let (t, m, p): (u32, u32, u32) = (
            num(f.get(1).copied(), l),
            num(f.get(3).copied(), l),
            num(f.get(5).copied(), l),
        );
        assert!(t >= 4 && m >= 32 && (1..=4).contains(&p), "{l}");
        assert_eq!(
            l,
            format!(
                "{a:<10} {t:>4} iterations, {m:>7} memory, {p} parallel threads (CPUs) for 256-bit key (requested 2000 ms time)"
            )
        );
    }
    assert_eq!(
        lines.next(),
        Some("#     Algorithm |       Key |      Encryption |      Decryption")
    );
    let mut rows = Vec::new();
    while let Some(l) = lines.next_if(|l| !l.starts_with('#')) {
        let f: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(f.len(), 6, "{l}");
        let (e, d): (f64, f64) = (num(f.get(2).copied(), l), num(f.get(4).copied(), l));
        assert_eq!(
            l,
            format!("{:>15}{:>12}{e:>12.1} MiB/s{d:>12.1} MiB/s", f[0], f[1])
        );
        rows.push((f[0].to_owned(), f[1].to_owned()));
    }
    assert_eq!(
        lines.next(),
        Some("# Sector size 4096 bytes, 1 MiB per call, one thread.")
    );
    let mut out = Vec::new();
    for (name, bits) in &rows {
        let l = lines.next().unwrap();
        let imp = l
            .strip_prefix(&format!("# {name} {bits} implementation: "))
            .unwrap_or_else(|| panic!("{l}"));
        assert!(!imp.is_empty(), "{l}");
        out.push((name.clone(), bits.clone(), imp.to_owned()));
    }
    if openssl {
        for ss in [512, 4096] {
            let l = lines.next().unwrap();
            assert!(
                l.starts_with(&format!("# XTS implementation at {ss}-byte sectors: ")),
                "{l}"
            );
            let l = lines.next().unwrap();
            let have_openssl = !l.starts_with("# system openssl comparison unavailable: ");
            if have_openssl {
                let f: Vec<&str> = l.split_whitespace().collect();
                let o: f64 = num(f.get(8).copied(), l);
                assert_eq!(
                    l,
                    format!("# system `openssl speed -evp aes-256-xts -bytes {ss}`: {o:.1} MiB/s")
                );
            }
            for bits in [256, 512] {
                let l = lines.next().unwrap();
                let f: Vec<&str> = l.split_whitespace().collect();
                let (e, d): (f64, f64) = (num(f.get(9).copied(), l), num(f.get(11).copied(), l));
                let head = format!(
                    "# aes-xts {bits}b, {ss}-byte sectors, 4 KiB per call: {e:.1} / {d:.1} MiB/s"
                );
                if have_openssl {
                    let (re, rd) = (f[14].to_owned(), f[16].to_owned());
                    assert!(re.ends_with('x') && rd.ends_with('x'), "{l}");
                    assert_eq!(
                        l,
                        format!("{head} = {re} / {rd} system openssl (encryption / decryption)")
                    );
                } else {
                    assert_eq!(l, format!("{head} (encryption / decryption)"));
                }
            }
        }
        for bits in [256, 512] {
            let l = lines.next().unwrap();
            let f: Vec<&str> = l.split_whitespace().collect();
            let (re, rd) = (f[6].to_owned(), f[8].to_owned());
            assert!(re.ends_with('x') && rd.ends_with('x'), "{l}");
            assert_eq!(
                l,
                format!("# aes-xts {bits}b: 512-byte sectors at {re} / {rd} the 4096-byte speed (encryption / decryption)")
            );
        }
    }
    assert_eq!(lines.next(), None, "{text}");
    out
}

/// The default table: KDF lines, cryptsetup's twelve cipher rows and
/// cipher_null, implementation notes.
#[test]
fn benchmark_table_layout() {
    let text = benchmark(&["--no-openssl"]);
    let rows = check_table(&text, true, false);
    let names: Vec<(&str, &str)> = rows
        .iter()
        .map(|(n, b, _)| (n.as_str(), b.as_str()))
        .collect();
    assert_eq!(
        names,
        [
            ("aes-cbc", "128b"),
            ("serpent-cbc", "128b"),
            ("twofish-cbc", "128b"),
            ("aes-cbc", "256b"),
            ("serpent-cbc", "256b"),
            ("twofish-cbc", "256b"),
            ("aes-xts", "256b"),
            ("serpent-xts", "256b"),
            ("twofish-xts", "256b"),
            ("aes-xts", "512b"),
            ("serpent-xts", "512b"),
            ("twofish-xts", "512b"),
            ("cipher_null-ecb", "0b")
        ]
    );
}

/// One cipher with the openssl comparison: no KDF lines, the XTS notes.
#[test]
fn benchmark_one_cipher_with_openssl_layout() {
    let text = benchmark(&["--cipher", "aes-xts-plain64", "--key-size", "512"]);
    let rows = check_table(&text, false, true);
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].0.as_str(), rows[0].1.as_str()),
        ("aes-xts", "512b")
    );
}

fn keys(v: &serde_json::Value) -> Vec<&str> {
    let mut k: Vec<&str> = v
        .as_object()
        .unwrap_or_else(|| panic!("not an object: {v}"))
        .keys()
        .map(String::as_str)
        .collect();
    k.sort_unstable();
    k
}

/// `--json` keys at every level, with and without the KDF and openssl parts.
#[test]
fn benchmark_json_keys() {
    let v: serde_json::Value =
        serde_json::from_str(&benchmark(&["--json", "--no-openssl"])).unwrap();
    assert_eq!(
        keys(&v),
        [
            "argon2",
            "bytes_per_call",
            "ciphers",
            "pbkdf",
            "sector_size",
            "xts_vs_openssl"
        ]
    );
    assert_eq!(v["sector_size"], 4096);
    assert_eq!(v["bytes_per_call"], 1 << 20);
    assert!(v["xts_vs_openssl"].is_null());
    let pbkdf: Vec<&str> = v["pbkdf"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            assert_eq!(keys(p), ["algorithm", "iterations_per_sec"]);
            assert!(p["iterations_per_sec"].as_u64().unwrap() > 0);
            p["algorithm"].as_str().unwrap()
        })
        .collect();
    assert_eq!(pbkdf, ["pbkdf2-sha1", "pbkdf2-sha256", "pbkdf2-sha512"]);
    let argon: Vec<&str> = v["argon2"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            assert_eq!(
                keys(a),
                [
                    "algorithm",
                    "iterations",
                    "memory_kib",
                    "parallel",
                    "requested_ms"
                ]
            );
            assert_eq!(a["requested_ms"], 2000);
            a["algorithm"].as_str().unwrap()
        })
        .collect();
    assert_eq!(argon, ["argon2i", "argon2id"]);
    let ciphers: Vec<(&str, u64)> = v["ciphers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            assert_eq!(
                keys(c),
                [
                    "algorithm",
                    "decryption_mib_per_sec",
                    "encryption_mib_per_sec",
                    "implementation",
                    "key_bits"
                ]
            );
            (
                c["algorithm"].as_str().unwrap(),
                c["key_bits"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        ciphers,
        [
            ("aes-cbc", 128),
            ("serpent-cbc", 128),
            ("twofish-cbc", 128),
            ("aes-cbc", 256),
            ("serpent-cbc", 256),
            ("twofish-cbc", 256),
            ("aes-xts", 256),
            ("serpent-xts", 256),
            ("twofish-xts", 256),
            ("aes-xts", 512),
            ("serpent-xts", 512),
            ("twofish-xts", 512),
            ("cipher_null-ecb", 0)
        ]
    );

    let v: serde_json::Value = serde_json::from_str(&benchmark(&[
        "--json",
        "--cipher",
        "aes-xts-plain64",
        "--sector-size",
        "512",
    ]))
    .unwrap();
    assert_eq!(v["sector_size"], 512);
    assert_eq!(v["pbkdf"], serde_json::json!([]));
    assert_eq!(v["argon2"], serde_json::json!([]));
    let x = &v["xts_vs_openssl"];
    assert_eq!(
        keys(x),
        [
            "aes_xts_4096",
            "aes_xts_512",
            "ratio_512_to_4096",
            "system_openssl_aes_256_xts_4096_mib_per_sec",
            "system_openssl_aes_256_xts_512_mib_per_sec",
            "system_openssl_error",
            "system_openssl_error_512",
            "xts_implementation",
            "xts_implementation_512"
        ]
    );
    for (r, bits) in x["ratio_512_to_4096"]
        .as_array()
        .unwrap()
        .iter()
        .zip([256, 512])
    {
        assert_eq!(keys(r), ["decryption", "encryption", "key_bits"]);
        assert_eq!(r["key_bits"], bits);
        assert!(r["encryption"].as_f64().unwrap() > 0.0);
    }
    let both = x["aes_xts_512"].as_array().unwrap().iter().zip([256, 512]);
    for (e, bits) in x["aes_xts_4096"]
        .as_array()
        .unwrap()
        .iter()
        .zip([256, 512])
        .chain(both)
    {
        assert_eq!(
            keys(e),
            [
                "decryption_mib_per_sec",
                "decryption_ratio",
                "encryption_mib_per_sec",
                "encryption_ratio",
                "key_bits"
            ]
        );
        assert_eq!(e["key_bits"], bits);
    }
}

/// A bad `--sector-size` is a usage error (exit 1) with this message.
#[test]
fn benchmark_bad_sector_size() {
    let o = Command::new(testutil::ucrypt_bin())
        .args(["benchmark", "--sector-size", "1000"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(o.stdout.is_empty());
    assert_eq!(
        String::from_utf8_lossy(&o.stderr),
        "ucrypt: Invalid --sector-size 1000: a power of two in 512..4096\n"
    );
}
