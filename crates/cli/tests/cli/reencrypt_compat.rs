//! cryptsetup 2.6.1's own reencryption scenarios (`tests/luks2-reencryption-test`,
//! `tests/reencryption-compat-test`, `tests/luks2-reencryption-mangle-test`;
//! fetched by `scripts/fetch-cryptsetup-tests.sh`, never kept here) ported to
//! image files, with cryptsetup 2.6.1 as the oracle: the data read back
//! (`check_hash`), the result opened by `cryptsetup open --test-passphrase`
//! and its `luksDump`, every refusal refused by both tools with every file
//! unchanged. ucrypt is driven with the scripts' own argument spellings and
//! passphrases on stdin.
//!
//! Scenario map (`luks2-reencryption-test` unless named):
//! - [1] reencryption chain (512/4096 sectors, twofish, journal/none/checksum,
//!   `-c aes-xts-plain64 --init-only` then resumed): `reencryption_chain_of_the_script`;
//!   the online resume via `--active-name` needs dm-crypt (guest suite).
//! - [2] encryption with a data shift: `reencrypt_encrypt::reduce_device_size_*`;
//!   `--offset` with `--reduce-device-size` (below half of it: the reduction
//!   adjusted; above: refused): `reencrypt_offset::offset_with_reduce_device_size_is_cryptsetups`,
//!   `reencrypt_offset::an_offset_is_refused_where_cryptsetup_refuses_it`;
//!   `--header` with `--offset` and `--reduce-device-size` (a detached header
//!   and a data shift) is refused by ucrypt as unsupported (not ported).
//! - [3] encryption with a detached header: `reencrypt_encrypt::a_whole_ucrypt_run_is_cryptsetups`,
//!   `misuse_is_refused_and_nothing_is_written`; with `--offset` (the data
//!   past it encrypted, the bytes before it kept):
//!   `reencrypt_offset::offset_with_a_detached_header_is_cryptsetups`.
//! - [4] reencryption with a detached header: `reencryption_of_a_detached_header`;
//!   two mappings of one header (`--active-name`) need dm-crypt.
//! - [5] decryption with a detached header: `reencrypt::decrypt_with_a_detached_header_*`.
//! - [6]–[15] recovery after dm-error write failures (offline and online):
//!   `reencrypt::a_crash_at_any_write_is_repaired_by_both_tools`,
//!   `reencrypt_encrypt::an_interrupted_or_crashed_encryption_*`,
//!   `reencrypt::an_interrupted_or_crashed_decryption_*` (crash points stand in
//!   for the failing writes); the online variants need dm-crypt.
//! - [16], [18], [20], [21] `--device-size` offline (reencryption with the header
//!   inside or detached, encryption, decryption; the refusals; a crashed
//!   fixed-size run resumed by either tool): `reencrypt_device_size::*`; [17]
//!   online (the run covers the served size after `resize --size`; the
//!   size mismatch and the misaligned size refused after `--init-only`;
//!   a fixed-size run stopped by either tool finished by the other) in
//!   `reencrypt_online::size::*`; [19] (the same online with a detached
//!   header) is not ported.
//! - [22] multi-keyslot reencryption (one passphrase per keyslot on stdin,
//!   every keyslot renewed with its KDF; the `-d KEY` refusal with several
//!   keyslots, `-S` keeping one keyslot and the unbound ones, the keyslot
//!   count limits, a wrong passphrase): `multi_keyslot_reencryption_renews_every_keyslot`;
//!   either tool resuming the other's multi-keyslot `--init-only`:
//!   `multi_keyslot_init_only_is_resumed_by_the_other_tool`.
//! - [23] `--volume-key-file` (`-S0 -s 128`, then `luksErase` and the key file
//!   opening the data again; a short or missing file and the volume's own key
//!   refused): `reencrypt_volume_key::*`, which also checks it with
//!   `--encrypt` (the key from the file; a short file refused) and that
//!   `--decrypt` ignores it, as cryptsetup 2.6.1 does.
//! - [24]–[26] initial `cipher_null`: cryptsetup cannot format it without
//!   device-mapper here (not ported).
//! - [27] `--test-passphrase` with reencryption metadata: `test_passphrase_with_reencryption_metadata`;
//!   its variants with no data area, `-S`, wrong passphrases and a data device under
//!   one sector: `reencrypt_test_passphrase::*`.
//! - [28] nested encryption, `--type` mismatch: `nested_encryption_and_type_mismatch_are_refused`.
//! - [29] conflicting parameters on resume: `conflicting_parameters_are_refused`;
//!   a resume switching `--resilience` (and `--resilience-hash`):
//!   `resume_with_another_resilience`.
//! - [30], [31] blkid probes and the dm sector-size check: need blkid's
//!   superblock probing of a mapped device (not ported).
//! - [32]–[37] decryption with a data shift (header inside the device),
//!   in `reencrypt_dshift`: [32] offline (one run, `--init-only` then a
//!   run, data offset 4 MiB and 16 MiB): `a_whole_run_equals_cryptsetups`,
//!   `each_tool_finishes_the_others_init`; [33], [34] (a failed write in the
//!   shift area or the moved segment, `datashift-checksum`/`-journal`):
//!   `a_crash_at_any_write_is_finished_by_both_tools` (crash points stand in
//!   for dm-error); [37] large data offsets: `large_data_offsets`; the
//!   refusals: `refusals_are_cryptsetups_and_write_nothing`. [32] online
//!   (started on the served volume, `--init-only` online or by either tool
//!   then finished online, closed mid-way and finished by either tool):
//!   `reencrypt_online::dshift::*`; [35], [36] (an I/O error in the shift
//!   area or the moved segment online): the crash hook's points through
//!   an online run stand in for dm-error,
//!   `reencrypt_online::dshift::a_crash_during_an_online_datashift_decryption_loses_no_acknowledged_write`.
//! - `reencryption-compat-test` [1], [5] (LUKS1 chain, one keyslot):
//!   `luks1_chain_and_keyslot_choice`, with [6] (all keyslots renewed); [2]
//!   LUKS1 `--reduce-device-size`, [4] and [11] `--new --type luks1` (a
//!   data shift, a detached header, a key file), [8] `--keep-key`, [10]
//!   `--decrypt`, [12] nested encryption refused:
//!   `luks1_shift_encrypt_keep_key_decrypt_of_the_script` (its crash and
//!   resume cases in `reencrypt_luks1`; cryptsetup's LUKS1 tool needs
//!   device-mapper, so it checks results rather than runs); [1]'s
//!   `--volume-key-file`: `reencrypt_volume_key::a_luks1_reencryption_takes_the_volume_key_from_the_file`;
//!   [4]'s 64 MiB variant, `--use-directio`: not ported;
//!   [7], [9] block sizes of loop devices need the kernel.
//! - `luks2-reencryption-mangle-test` [1], [7]: `mangled_metadata_is_refused`;
//!   [1]'s requirement flags (an unknown `online-reencryptx`, two
//!   reencryption requirements: no LUKS2 header to either tool; `-v999`
//!   and `-v3X`, which cryptsetup dumps, refused by ucrypt as every
//!   unknown requirement): `reencrypt_old_metadata::reencryption_requirement_flags`;
//!   [1]–[6] old (`online-reencrypt` v1, no digest) metadata, refused with
//!   cryptsetup's answers and upgraded by either tool's `repair` for the
//!   other to finish: `reencrypt_old_metadata::old_reencryption_metadata_is_upgraded_by_either_repair`
//!   ([2]–[5] also with the script's own segment after the hotzone,
//!   whose IV tweak ucrypt refuses to run after cryptsetup's repair; [6]'s
//!   reencryption with a data shift is upgraded by ucrypt for cryptsetup
//!   and not run by ucrypt);
//!   [9] decryption with a data shift: `reencrypt_dshift::mangled_datashift_metadata_is_refused`;
//!   [8] AEAD: ucrypt has no integrity.

use std::path::Path;
use std::process::Output;

use serde_json::Value;
use testutil::{require_tool, Rng, TempDir};

use super::reencrypt::ok;

const PW1: &[u8] = b"compat passphrase 1\n";
pub(crate) const FAST_PBKDF2: &[&str] = &["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
const FAST_PBKDF_ARGON: &[&str] = &[
    "--pbkdf-force-iterations",
    "4",
    "--pbkdf-memory",
    "32",
    "--pbkdf-parallel",
    "1",
];

/// `prog ARGS` (paths as text) with `stdin`.
pub(crate) fn run(prog: &str, args: &[&str], stdin: &[u8]) -> Output {
    testutil::run(prog, args, Some(stdin))
}

/// `ucrypt ARGS` run in `dir` (where LUKS1 reencryption keeps its
/// `LUKS-<uuid>` files) with `stdin`.
fn ucrypt_in(dir: &Path, args: &[&str], stdin: &[u8]) -> Output {
    use std::io::Write;
    use std::process::{Command, Stdio};
    Command::new(testutil::ucrypt_bin())
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            c.stdin.take().unwrap().write_all(stdin)?;
            c.wait_with_output()
        })
        .unwrap()
}

pub(crate) fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn cat(a: &[&str], b: &[&str]) -> Vec<String> {
    a.iter().chain(b).map(|x| x.to_string()).collect()
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// An image file of `mib` MiB formatted by cryptsetup (`luksFormat -q
/// --type luks2 OPTS`), passphrase `PW1`.
fn format(path: &Path, mib: u64, opts: &[&str]) {
    let f = std::fs::File::create(path).unwrap();
    f.set_len(mib << 20).unwrap();
    let mut a = vec!["-q", "luksFormat", "--type", "luks2"];
    a.extend_from_slice(opts);
    a.push(s(path));
    ok(run("cryptsetup", &a, PW1), "luksFormat");
}

/// Seeded random plaintext written through `ucrypt map --write --luks`
/// (the passphrase `PW1` in a key file beside the image); returns it.
fn fill(img: &Path, hdr: Option<&Path>, seed: u64) -> Vec<u8> {
    let key = img.with_extension("key");
    std::fs::write(&key, &PW1[..PW1.len() - 1]).unwrap();
    fill_with(img, hdr, &key, seed)
}

pub(crate) fn fill_with(img: &Path, hdr: Option<&Path>, key: &Path, seed: u64) -> Vec<u8> {
    let size = data_size(img, hdr);
    let mut plain = vec![0u8; size];
    Rng::new(seed).fill(&mut plain);
    let mut a = vec!["map", "--write", "--luks", s(img), "--key-file", s(key)];
    if let Some(h) = hdr {
        a.extend(["--header", s(h)]);
    }
    ok(run("ucrypt", &a, &plain), "map --write");
    plain
}

/// The plaintext read back through `ucrypt map --read --luks`.
fn read_back(img: &Path, hdr: Option<&Path>) -> Vec<u8> {
    let key = img.with_extension("key");
    std::fs::write(&key, &PW1[..PW1.len() - 1]).unwrap();
    let mut a = vec!["map", "--read", "--luks", s(img), "--key-file", s(&key)];
    if let Some(h) = hdr {
        a.extend(["--header", s(h)]);
    }
    ok(run("ucrypt", &a, b""), "map --read").stdout
}

/// The data area's size in bytes (the image past the data offset; LUKS1:
/// `Payload offset`, in sectors).
fn data_size(img: &Path, hdr: Option<&Path>) -> usize {
    let h = hdr.unwrap_or(img);
    let dump = testutil::run_ok("cryptsetup", &["luksDump", s(h)]);
    let off = match dump.lines().find_map(|l| l.strip_prefix("Payload offset:")) {
        Some(sectors) => sectors.trim().parse::<u64>().unwrap() * 512,
        None => json(h)["segments"]["0"]["offset"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap(),
    };
    (std::fs::metadata(img).unwrap().len() - off) as usize
}

pub(crate) fn json(hdr: &Path) -> Value {
    let out = ok(
        run(
            "cryptsetup",
            &["luksDump", "--dump-json-metadata", s(hdr)],
            b"",
        ),
        "luksDump --dump-json-metadata",
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// `cryptsetup open --test-passphrase` of `hdr` with `pass` succeeds.
fn cs_opens(hdr: &Path, pass: &[u8]) {
    ok(
        run("cryptsetup", &["open", "--test-passphrase", s(hdr)], pass),
        "cryptsetup open --test-passphrase",
    );
}

fn in_reencryption(hdr: &Path) -> bool {
    json(hdr)["config"]["requirements"]["mandatory"]
        .as_array()
        .is_some_and(|m| m.iter().any(|r| r == "online-reencrypt-v2"))
}

fn hashes(files: &[&Path]) -> Vec<Option<Vec<u8>>> {
    files.iter().map(|f| std::fs::read(f).ok()).collect()
}

/// `ucrypt reencrypt ARGS` and cryptsetup's `reencrypt
/// --force-offline-reencrypt ARGS` are both refused with the same exit
/// code, each leaving every file of `files` as it was (cryptsetup runs
/// first, on the same files: its refusal writes nothing either). Returns
/// ucrypt's stderr.
fn both_refuse(files: &[&Path], a: &[&str]) -> String {
    let before = hashes(files);
    let mut ca = vec!["reencrypt", "--force-offline-reencrypt"];
    ca.extend_from_slice(a);
    let cs = run("cryptsetup", &ca, PW1);
    assert!(!cs.status.success(), "cryptsetup accepted {a:?}");
    assert!(hashes(files) == before, "cryptsetup {a:?} wrote");
    let mut ua = vec!["reencrypt"];
    ua.extend_from_slice(a);
    let u = run("ucrypt", &ua, PW1);
    let err = String::from_utf8_lossy(&u.stderr).into_owned();
    assert_eq!(
        u.status.code(),
        cs.status.code(),
        "{a:?}: ucrypt {err} / cryptsetup {}",
        String::from_utf8_lossy(&cs.stderr)
    );
    assert!(hashes(files) == before, "ucrypt {a:?} wrote");
    err
}

#[test]
fn reencryption_chain_of_the_script() {
    if !require_tool("reencrypt_compat_chain", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("recompat-chain");
    let img = dir.join("img");
    // [512 sector], [4096 sector], [4096/512 sector]: the script's steps
    // after each format, its options verbatim.
    let steps: &[&[&str]] = &[
        &[],
        &[
            "-s",
            "256",
            "-c",
            "twofish-cbc-essiv:sha256",
            "--resilience",
            "journal",
        ],
        &["--resilience", "none"],
        &[
            "-s",
            "128",
            "-c",
            "aes-cbc-essiv:sha256",
            "--resilience",
            "checksum",
        ],
    ];
    for (i, first) in [
        &["--sector-size", "512"][..],
        &["--sector-size", "4096"],
        &["--sector-size", "512"],
    ]
    .into_iter()
    .enumerate()
    {
        let mut fmt = cat(
            &[
                "-s",
                "128",
                "-c",
                "aes-cbc-essiv:sha256",
                "--offset",
                "8192",
            ],
            FAST_PBKDF_ARGON,
        );
        fmt.extend(first.iter().map(|x| x.to_string()));
        format(&img, 12, &args(&fmt));
        let plain = fill(&img, None, 40 + i as u64);
        for (n, step) in steps.iter().enumerate() {
            let mut a = cat(&["reencrypt", s(&img), "-q"], FAST_PBKDF_ARGON);
            a.extend(step.iter().map(|x| x.to_string()));
            // [4096/512 sector]: the sector size goes 512 -> 4096 on the
            // first step.
            if i == 2 && n == 0 {
                a.extend(["--sector-size".into(), "4096".into()]);
            }
            ok(run("ucrypt", &args(&a), PW1), &format!("{i}: {a:?}"));
            assert!(!in_reencryption(&img));
            cs_opens(&img, PW1);
            assert!(read_back(&img, None) == plain, "{i}: {step:?}: data");
        }
        let j = json(&img);
        assert_eq!(j["segments"]["0"]["encryption"], "aes-cbc-essiv:sha256");
        let want_sector = if i == 0 { 512 } else { 4096 };
        assert_eq!(j["segments"]["0"]["sector_size"], want_sector, "{i}");
    }

    // `-c aes-xts-plain64 --init-only` of a 128-bit volume: the new key is
    // cryptsetup's default for XTS (512 bits), as cryptsetup's own init
    // of a copy says; cryptsetup resumes what ucrypt initialized.
    let mut fmt = cat(
        &[
            "-s",
            "128",
            "-c",
            "aes-cbc-essiv:sha256",
            "--offset",
            "8192",
        ],
        FAST_PBKDF_ARGON,
    );
    fmt.extend(["--sector-size".into(), "512".into()]);
    format(&img, 12, &args(&fmt));
    let plain = fill(&img, None, 50);
    let copy = dir.join("copy");
    std::fs::copy(&img, &copy).unwrap();
    let init = |tool: &str, path: &Path| {
        let mut a = cat(&["reencrypt", s(path), "-q"], FAST_PBKDF_ARGON);
        a.extend(["-c", "aes-xts-plain64", "--init-only"].map(String::from));
        ok(run(tool, &args(&a), PW1), &format!("{tool} init"));
        let j = json(path);
        let fin = j["segments"]
            .as_object()
            .unwrap()
            .values()
            .find(|g| g["flags"].to_string().contains("backup-final"))
            .cloned()
            .unwrap();
        let sizes: Vec<Value> = j["keyslots"]
            .as_object()
            .unwrap()
            .values()
            .map(|k| k["key_size"].clone())
            .collect();
        (fin, sizes)
    };
    assert_eq!(init("ucrypt", &img), init("cryptsetup", &copy));
    ok(
        run(
            "cryptsetup",
            &["reencrypt", "-q", "--force-offline-reencrypt", s(&img)],
            PW1,
        ),
        "cryptsetup resumes",
    );
    let j = json(&img);
    assert_eq!(j["segments"]["0"]["encryption"], "aes-xts-plain64");
    assert_eq!(j["keyslots"]["1"]["key_size"], 64);
    cs_opens(&img, PW1);
    assert!(read_back(&img, None) == plain, "xts: data");
}

#[test]
fn reencryption_of_a_detached_header() {
    if !require_tool("reencrypt_compat_detached", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("recompat-detached");
    let dev = dir.join("dev");
    let hdr = dir.join("hdr");
    let f = std::fs::File::create(&dev).unwrap();
    f.set_len(8 << 20).unwrap();
    let mut fmt = cat(
        &["-q", "luksFormat", "--type", "luks2", "--header", s(&hdr)],
        FAST_PBKDF_ARGON,
    );
    fmt.push(s(&dev).into());
    ok(run("cryptsetup", &args(&fmt), PW1), "luksFormat --header");
    let plain = fill(&dev, Some(&hdr), 90);
    // [4]: the script's four runs, its options verbatim.
    for step in [
        &["-c", "aes-cbc-essiv:sha256", "-s", "128"][..],
        &["--resilience", "journal"],
        &[
            "-c",
            "twofish-cbc-essiv:sha256",
            "-s",
            "128",
            "--resilience",
            "none",
        ],
        &["-c", "serpent-xts-plain", "--resilience", "checksum"],
    ] {
        let mut a = cat(&["reencrypt"], step);
        a.extend(["--header", s(&hdr), "-q"].map(String::from));
        a.extend(FAST_PBKDF_ARGON.iter().map(|x| x.to_string()));
        a.push(s(&dev).into());
        ok(run("ucrypt", &args(&a), PW1), &format!("{step:?}"));
        assert!(!in_reencryption(&hdr), "{step:?}");
        cs_opens(&hdr, PW1);
        assert!(read_back(&dev, Some(&hdr)) == plain, "{step:?}: data");
    }
    let j = json(&hdr);
    assert_eq!(j["segments"]["0"]["encryption"], "serpent-xts-plain");
    assert_eq!(j["segments"]["0"]["offset"], "0");
    let slot = j["keyslots"].as_object().unwrap().values().next().unwrap();
    assert_eq!(slot["key_size"], 64, "XTS default: 512 bits");
}

const PW2: &[u8] = b"compat passphrase 2\n";
const PW3: &[u8] = b"compat passphrase 3\n";

/// The passphrases `p`, one a line (each of `p` ends with its newline).
fn lines(p: &[&[u8]]) -> Vec<u8> {
    p.concat()
}

/// The volume key `cryptsetup luksDump --dump-volume-key` shows with `pass`.
fn volume_key(img: &Path, pass: &[u8]) -> String {
    let out = ok(
        run(
            "cryptsetup",
            &["luksDump", "-q", "--dump-volume-key", s(img)],
            pass,
        ),
        "luksDump --dump-volume-key",
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let at = text.find("MK dump:").expect("MK dump");
    text[at..].to_string()
}

/// The KDF of LUKS2 keyslot `slot`.
fn kdf_of(img: &Path, slot: u32) -> String {
    json(img)["keyslots"][slot.to_string()]["kdf"]["type"]
        .as_str()
        .unwrap_or("none")
        .to_string()
}

/// The keyslots of the header, in slot order.
fn slots(img: &Path) -> Vec<u32> {
    let mut v: Vec<u32> = json(img)["keyslots"]
        .as_object()
        .unwrap()
        .keys()
        .map(|k| k.parse().unwrap())
        .collect();
    v.sort_unstable();
    v
}

/// `ucrypt reencrypt ARGS` and cryptsetup's are both refused with the same
/// exit code, `stdin` the passphrases, every file of `files` unchanged.
fn both_refuse_with(files: &[&Path], a: &[&str], stdin: &[u8]) -> String {
    let before = hashes(files);
    let mut ca = vec!["reencrypt", "--force-offline-reencrypt"];
    ca.extend_from_slice(a);
    let cs = run("cryptsetup", &ca, stdin);
    assert!(!cs.status.success(), "cryptsetup accepted {a:?}");
    assert!(hashes(files) == before, "cryptsetup {a:?} wrote");
    let mut ua = vec!["reencrypt"];
    ua.extend_from_slice(a);
    let u = run("ucrypt", &ua, stdin);
    let err = String::from_utf8_lossy(&u.stderr).into_owned();
    assert_eq!(
        u.status.code(),
        cs.status.code(),
        "{a:?}: ucrypt {err} / cryptsetup {}",
        String::from_utf8_lossy(&cs.stderr)
    );
    assert!(hashes(files) == before, "ucrypt {a:?} wrote");
    err
}

/// `luksAddKey` `n` times with `PW1` for the new keyslot (argon2, fast).
fn add_keys(img: &Path, n: usize) {
    for _ in 0..n {
        ok(
            run(
                "cryptsetup",
                &args(&cat(&["-q", "luksAddKey", s(img)], FAST_PBKDF_ARGON)),
                &lines(&[PW1, PW1]),
            ),
            "luksAddKey",
        );
    }
}

/// The script's [22]: every active keyslot is renewed, each with its own
/// passphrase asked in slot order; a key file needs `--key-slot` when
/// several are active; `-S` keeps only that keyslot (and the unbound
/// ones); the keyslot count limits and a wrong passphrase refuse with
/// nothing written.
#[test]
fn multi_keyslot_reencryption_renews_every_keyslot() {
    if !require_tool("reencrypt_compat_keyslots", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("recompat-slots");
    let img = dir.join("img");
    format(
        &img,
        17,
        &args(&cat(&["--offset", "32768"], FAST_PBKDF_ARGON)),
    );
    let plain = fill(&img, None, 60);
    ok(
        run(
            "cryptsetup",
            &args(&cat(&["-q", "luksAddKey", s(&img)], FAST_PBKDF2)),
            &lines(&[PW1, PW2]),
        ),
        "luksAddKey 2",
    );
    ok(
        run(
            "cryptsetup",
            &args(&cat(&["-q", "luksAddKey", s(&img)], FAST_PBKDF_ARGON)),
            &lines(&[PW1, PW3]),
        ),
        "luksAddKey 3",
    );
    let old_key = volume_key(&img, PW1);
    // A wrong passphrase for the second keyslot: nothing written.
    let err = both_refuse_with(&[&img], &[s(&img), "-q"], &lines(&[PW1, b"wrong\n", PW3]));
    assert!(
        err.contains("No key available with this passphrase."),
        "{err}"
    );

    ok(
        run(
            "ucrypt",
            &["reencrypt", s(&img), "-q"],
            &lines(&[PW1, PW2, PW3]),
        ),
        "reencrypt of three keyslots",
    );
    assert!(!in_reencryption(&img));
    assert_eq!(slots(&img), [3, 4, 5]);
    for p in [PW1, PW2, PW3] {
        cs_opens(&img, p);
        let key = img.with_extension("key");
        std::fs::write(&key, &p[..p.len() - 1]).unwrap();
        let back = ok(
            run(
                "ucrypt",
                &["map", "--read", "--luks", s(&img), "--key-file", s(&key)],
                b"",
            ),
            "map --read",
        )
        .stdout;
        assert!(back == plain, "data through each passphrase");
    }
    let new_key = volume_key(&img, PW2);
    assert_ne!(old_key, new_key, "the volume key changed");
    assert_eq!(new_key, volume_key(&img, PW3));
    // Each twin has its old keyslot's KDF.
    assert!(kdf_of(&img, 3).starts_with("argon2"));
    assert_eq!(kdf_of(&img, 4), "pbkdf2");
    assert!(kdf_of(&img, 5).starts_with("argon2"));

    // With more keyslots, a specific one has to be selected for a key file.
    let key1 = dir.join("key1");
    std::fs::write(&key1, b"key file one").unwrap();
    ok(
        run(
            "cryptsetup",
            &args(&cat(&["-q", "luksAddKey", s(&img), s(&key1)], FAST_PBKDF2)),
            PW1,
        ),
        "luksAddKey key1",
    );
    let err = both_refuse_with(&[&img], &[s(&img), "-d", s(&key1), "-q"], b"");
    assert!(
        err.contains(
            "Key file can be used only with --key-slot or with exactly one key slot active."
        ),
        "{err}"
    );
    ok(
        run(
            "ucrypt",
            &["reencrypt", s(&img), "-d", s(&key1), "-q", "-S0"],
            b"",
        ),
        "reencrypt -S0",
    );
    assert!(read_back_with(&img, &key1) == plain, "data after -S0");
    // There is a single keyslot now: the key file alone is enough.
    assert_eq!(slots(&img).len(), 1);
    ok(
        run("ucrypt", &["reencrypt", s(&img), "-d", s(&key1), "-q"], b""),
        "reencrypt -d",
    );
    ok(
        run(
            "cryptsetup",
            &args(&cat(
                &["-q", "luksAddKey", s(&img), "-S1", "-d", s(&key1)],
                FAST_PBKDF2,
            )),
            PW1,
        ),
        "luksAddKey -S1",
    );
    for slot in ["2", "22", "23"] {
        ok(
            run(
                "cryptsetup",
                &args(&cat(
                    &[
                        "-q",
                        "luksAddKey",
                        s(&img),
                        "-S",
                        slot,
                        "--unbound",
                        "--key-size",
                        "32",
                    ],
                    FAST_PBKDF2,
                )),
                PW3,
            ),
            "luksAddKey --unbound",
        );
    }
    // `-S1`: the other bound keyslot goes, the unbound ones stay.
    ok(
        run("ucrypt", &["reencrypt", s(&img), "-S1", "-q"], PW1),
        "reencrypt -S1",
    );
    let out = run(
        "cryptsetup",
        &["open", "--test-passphrase", "-d", s(&key1), s(&img)],
        b"",
    );
    assert!(!out.status.success(), "the key file's keyslot is gone");
    for slot in ["2", "22"] {
        ok(
            run(
                "cryptsetup",
                &["open", "--test-passphrase", "-S", slot, s(&img)],
                PW3,
            ),
            "unbound keyslot kept",
        );
    }
    assert!(read_back(&img, None) == plain, "data after -S1");

    // 31 keyslots: no room for a twin and the reencrypt keyslot.
    add_keys(&img, 27);
    assert_eq!(slots(&img).len(), 31);
    both_refuse_with(&[&img], &[s(&img), "-S0", "-q"], PW1);
    ok(
        run("cryptsetup", &["luksKillSlot", "-q", s(&img), "30"], PW1),
        "luksKillSlot 30",
    );
    ok(
        run("ucrypt", &["reencrypt", s(&img), "-q", "-S0"], PW1),
        "reencrypt -S0 with 30 keyslots",
    );
    // 15 active and 3 unbound: 2 * 15 + 3 + 1 > 32.
    add_keys(&img, 14);
    let fifteen = lines(&[PW1; 15]);
    both_refuse_with(&[&img], &[s(&img), "-q"], &fifteen);
    ok(
        run("cryptsetup", &["luksKillSlot", "-q", s(&img), "1"], PW1),
        "luksKillSlot 1",
    );
    // One wrong passphrase (the last): refused, nothing initialized.
    let mut wrong = lines(&[PW1; 13]);
    wrong.extend_from_slice(PW2);
    both_refuse_with(&[&img], &[s(&img), "-q"], &wrong);
    both_refuse_with(&[&img], &[s(&img), "--resume-only", "-q"], PW1);
    ok(
        run("ucrypt", &["reencrypt", s(&img), "-q"], &lines(&[PW1; 14])),
        "reencrypt of 14 keyslots",
    );
    assert_eq!(slots(&img).len(), 14 + 3);
    cs_opens(&img, PW1);
    assert!(read_back(&img, None) == plain, "data at the end");
}

/// The plaintext read back with the key file `key`.
fn read_back_with(img: &Path, key: &Path) -> Vec<u8> {
    ok(
        run(
            "ucrypt",
            &["map", "--read", "--luks", s(img), "--key-file", s(key)],
            b"",
        ),
        "map --read",
    )
    .stdout
}

/// A multi-keyslot reencryption either tool initialized (`--init-only`)
/// is finished by the other with any one of the passphrases, and every
/// passphrase opens the result.
#[test]
fn multi_keyslot_init_only_is_resumed_by_the_other_tool() {
    if !require_tool("reencrypt_compat_keyslots_cross", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("recompat-slots-x");
    for (init, resume, with) in [("cryptsetup", "ucrypt", PW2), ("ucrypt", "cryptsetup", PW3)] {
        let img = dir.join(&format!("img-{init}"));
        format(&img, 17, &args(&cat(&["--offset", "32768"], FAST_PBKDF2)));
        let plain = fill(&img, None, 61);
        for p in [PW2, PW3] {
            ok(
                run(
                    "cryptsetup",
                    &args(&cat(&["-q", "luksAddKey", s(&img)], FAST_PBKDF2)),
                    &lines(&[PW1, p]),
                ),
                "luksAddKey",
            );
        }
        let old_key = volume_key(&img, PW1);
        let mut a = vec!["reencrypt", "--init-only", s(&img), "-q"];
        if init == "cryptsetup" {
            a.push("--force-offline-reencrypt");
        }
        ok(run(init, &a, &lines(&[PW1, PW2, PW3])), "init-only");
        assert!(in_reencryption(&img));
        assert_eq!(slots(&img), [0, 1, 2, 3, 4, 5, 6], "{init}");
        let mut a = vec!["reencrypt", "--resume-only", s(&img), "-q"];
        if resume == "cryptsetup" {
            a.push("--force-offline-reencrypt");
        }
        ok(run(resume, &a, with), "resume-only");
        assert!(!in_reencryption(&img));
        assert_eq!(slots(&img), [3, 4, 5], "{init} then {resume}");
        for p in [PW1, PW2, PW3] {
            cs_opens(&img, p);
        }
        assert_ne!(old_key, volume_key(&img, PW3));
        assert!(read_back(&img, None) == plain, "{init} then {resume}");
    }
}

#[test]
fn test_passphrase_with_reencryption_metadata() {
    if !require_tool("reencrypt_compat_test_passphrase", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("recompat-testpw");
    let dev = dir.join("dev");
    let hdr = dir.join("hdr");
    let test_pw = |h: &Path| {
        cs_opens(h, PW1);
        ok(
            run("ucrypt", &["open", "--test-passphrase", s(h)], PW1),
            "ucrypt open --test-passphrase",
        );
    };
    let unbound = |h: &Path| {
        let mut input = PW1.to_vec();
        input.extend_from_slice(PW1);
        ok(
            run(
                "cryptsetup",
                &args(&cat(
                    &["luksAddKey", "--unbound", "-s80", "-S0", s(h)],
                    FAST_PBKDF_ARGON,
                )),
                &input,
            ),
            "luksAddKey --unbound",
        );
    };
    // Reencryption with an unbound keyslot beside the volume's.
    format(&dev, 24, &args(&cat(&["-S5"], FAST_PBKDF_ARGON)));
    unbound(&dev);
    ok(
        run("ucrypt", &["reencrypt", "--init-only", s(&dev)], PW1),
        "init",
    );
    test_pw(&dev);
    // Decryption of a detached header.
    let mut fmt = cat(&["-S5", "--header", s(&hdr)], FAST_PBKDF_ARGON);
    fmt.push(s(&dev).into());
    ok(
        run(
            "cryptsetup",
            &args(&cat(&["-q", "luksFormat", "--type", "luks2"], &args(&fmt))),
            PW1,
        ),
        "luksFormat --header",
    );
    unbound(&hdr);
    ok(
        run(
            "ucrypt",
            &[
                "reencrypt",
                "--decrypt",
                "--init-only",
                "--header",
                s(&hdr),
                s(&dev),
            ],
            PW1,
        ),
        "decrypt init",
    );
    test_pw(&hdr);
    // Encryption into a new detached header, then with a data shift.
    std::fs::remove_file(&hdr).unwrap();
    std::fs::write(&dev, vec![0u8; 24 << 20]).unwrap();
    let mut a = cat(
        &[
            "reencrypt",
            "-q",
            "--encrypt",
            "--init-only",
            "--header",
            s(&hdr),
        ],
        FAST_PBKDF_ARGON,
    );
    a.push(s(&dev).into());
    ok(run("ucrypt", &args(&a), PW1), "encrypt init");
    test_pw(&hdr);
    let mut a = cat(
        &[
            "reencrypt",
            "--encrypt",
            "--init-only",
            "--reduce-device-size",
            "8M",
        ],
        FAST_PBKDF_ARGON,
    );
    a.push(s(&dev).into());
    ok(run("ucrypt", &args(&a), PW1), "encrypt shift init");
    test_pw(&dev);
}

#[test]
fn nested_encryption_and_type_mismatch_are_refused() {
    if !require_tool("reencrypt_compat_nested", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("recompat-nested");
    let dev = dir.join("dev");
    let hdr = dir.join("hdr");
    let dev_s = s(&dev);
    let hdr_s = s(&hdr);
    let refuse = |files: &[&Path], a: &[&str]| {
        let mut v = cat(&["-q"], a);
        v.extend(FAST_PBKDF2.iter().map(|x| x.to_string()));
        v.push(dev_s.into());
        both_refuse(files, &args(&v))
    };
    // The device is LUKS2 already.
    format(&dev, 32, FAST_PBKDF2);
    for a in [
        &["--encrypt", "--type", "luks1", "--reduce-device-size", "2m"][..],
        &["--encrypt", "--type", "luks1", "--header", hdr_s],
        &["--encrypt", "--type", "luks2", "--reduce-device-size", "2m"],
        &["--encrypt", "--type", "luks2", "--header", hdr_s],
    ] {
        refuse(&[&dev], a);
        assert!(!hdr.exists(), "{a:?} made the header");
    }
    let err = refuse(&[&dev], &["--type", "luks1"]);
    assert!(err.contains("Conflicting versions. Device"), "{err}");
    // The detached header is LUKS2 already.
    std::fs::write(&dev, vec![0u8; 32 << 20]).unwrap();
    let mut fmt = cat(&["--header", hdr_s], FAST_PBKDF2);
    fmt.push(dev_s.into());
    ok(
        run(
            "cryptsetup",
            &args(&cat(&["-q", "luksFormat", "--type", "luks2"], &args(&fmt))),
            PW1,
        ),
        "luksFormat --header",
    );
    for a in [
        &["--encrypt", "--type", "luks1", "--header", hdr_s][..],
        &["--encrypt", "--type", "luks2", "--header", hdr_s],
        &["--type", "luks1", "--header", hdr_s],
    ] {
        refuse(&[&dev, &hdr], a);
    }
    std::fs::remove_file(&hdr).unwrap();
    // The data device is in reencryption already.
    format(&dev, 32, FAST_PBKDF2);
    ok(
        run(
            "ucrypt",
            &args(&cat(&["reencrypt", "--init-only", dev_s], FAST_PBKDF_ARGON)),
            PW1,
        ),
        "init",
    );
    for a in [
        &["--encrypt", "--type", "luks1", "--header", hdr_s][..],
        &["--encrypt", "--type", "luks2", "--header", hdr_s],
        &["--type", "luks1"],
    ] {
        refuse(&[&dev], a);
        assert!(!hdr.exists(), "{a:?} made the header");
    }
}

#[test]
fn conflicting_parameters_are_refused() {
    if !require_tool("reencrypt_compat_conflicts", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("recompat-conflict");
    let dev = dir.join("dev");
    let hdr = dir.join("hdr");
    let dev_s = s(&dev);
    let hdr_s = s(&hdr);
    let init = |a: &[&str]| {
        let mut v = cat(&["reencrypt", "-q", "--init-only"], a);
        v.extend(FAST_PBKDF_ARGON.iter().map(|x| x.to_string()));
        v.push(dev_s.into());
        ok(run("ucrypt", &args(&v), PW1), &format!("init {a:?}"));
    };
    let refuse = |files: &[&Path], a: &[&str], msg: &str| {
        let mut v = cat(&["-q"], a);
        v.extend(FAST_PBKDF_ARGON.iter().map(|x| x.to_string()));
        v.push(dev_s.into());
        let err = both_refuse(files, &args(&v));
        assert!(err.contains(msg), "{a:?}: {err}");
    };
    const NOT_ENC: &str = "Device is not in LUKS2 encryption. Conflicting option --encrypt.";
    const NOT_DEC: &str = "Device is not in LUKS2 decryption. Conflicting option --decrypt.";
    const RESIL: &str = "Requested --resilience option cannot be applied";

    // A reencryption in progress.
    format(&dev, 32, FAST_PBKDF2);
    init(&[]);
    refuse(
        &[&dev],
        &["--encrypt", "--reduce-device-size", "4M"],
        NOT_ENC,
    );
    refuse(&[&dev], &["--decrypt"], NOT_DEC);
    for r in ["datashift", "datashift-checksum", "datashift-journal"] {
        refuse(&[&dev], &["--resilience", r], RESIL);
    }
    // An encryption with a data shift in progress.
    std::fs::write(&dev, vec![0u8; 32 << 20]).unwrap();
    init(&["--encrypt", "--reduce-device-size", "16M"]);
    refuse(&[&dev], &["--decrypt"], NOT_DEC);
    for r in ["journal", "datashift-checksum", "datashift-journal"] {
        refuse(
            &[&dev],
            &["--resilience", r],
            "Device is in reencryption using datashift resilience.",
        );
    }
    // A reencryption of a detached header in progress.
    std::fs::write(&dev, vec![0u8; 32 << 20]).unwrap();
    let mut fmt = cat(&["--header", hdr_s], FAST_PBKDF2);
    fmt.push(dev_s.into());
    ok(
        run(
            "cryptsetup",
            &args(&cat(&["-q", "luksFormat", "--type", "luks2"], &args(&fmt))),
            PW1,
        ),
        "luksFormat --header",
    );
    init(&["--header", hdr_s]);
    refuse(&[&dev, &hdr], &["--encrypt", "--header", hdr_s], NOT_ENC);
    refuse(&[&dev, &hdr], &["--decrypt", "--header", hdr_s], NOT_DEC);
    for r in ["datashift-checksum", "datashift-journal"] {
        refuse(
            &[&dev, &hdr],
            &["--header", hdr_s, "--resilience", r],
            RESIL,
        );
    }
    // An encryption into a detached header, then a decryption of one.
    std::fs::remove_file(&hdr).unwrap();
    init(&["--encrypt", "--header", hdr_s]);
    refuse(&[&dev, &hdr], &["--decrypt", "--header", hdr_s], NOT_DEC);
    ok(
        run(
            "cryptsetup",
            &args(&cat(&["-q", "luksFormat", "--type", "luks2"], &args(&fmt))),
            PW1,
        ),
        "luksFormat --header",
    );
    init(&["--decrypt", "--header", hdr_s]);
    refuse(&[&dev, &hdr], &["--encrypt", "--header", hdr_s], NOT_ENC);
}

#[test]
fn luks1_chain_and_keyslot_choice() {
    if !require_tool("reencrypt_compat_luks1", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("recompat-luks1");
    let img = dir.join("img");
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(12 << 20).unwrap();
    let fast = ["--pbkdf-force-iterations", "1000", "--pbkdf", "pbkdf2"];
    let luks1 = |extra: &[&str]| {
        let mut a = cat(&["-q", "luksFormat", "--type", "luks1"], extra);
        a.extend(fast.iter().map(|x| x.to_string()));
        a.push(s(&img).into());
        ok(run("cryptsetup", &args(&a), PW1), "luksFormat luks1");
    };
    // [1] Reencryption: the chain of the script, run in the image's
    // directory (the LUKS-<uuid> files go to the working directory).
    luks1(&[
        "-s",
        "128",
        "-c",
        "aes-cbc-plain",
        "--align-payload",
        "4096",
    ]);
    let plain = fill(&img, None, 70);
    for step in [
        &[][..],
        &["-s", "256"],
        &["-s", "256", "-c", "aes-xts-plain64", "-h", "sha512"],
        &["-s", "256", "-c", "aes-xts-plain64", "-h", "sha256"],
    ] {
        let mut a = cat(&["reencrypt", s(&img), "-q"], &fast);
        a.extend(step.iter().map(|x| x.to_string()));
        let out = ucrypt_in(dir.path(), &args(&a), PW1);
        ok(out, &format!("{step:?}"));
        cs_opens(&img, PW1);
        assert!(read_back(&img, None) == plain, "{step:?}: data");
        // `-h` is the new header's hash (the script's last step; one
        // with sha512 before it shows it is not the default).
        if let Some(h) = step.iter().position(|x| *x == "-h") {
            let dump = testutil::run_ok("cryptsetup", &["luksDump", s(&img)]);
            assert!(
                dump.contains(&format!("Hash spec:     \t{}", step[h + 1])),
                "{dump}"
            );
        }
    }
    let dump = testutil::run_ok("cryptsetup", &["luksDump", s(&img)]);
    for want in ["xts-plain64", "sha256", "MK bits:       \t256"] {
        assert!(dump.contains(want), "{want}: {dump}");
    }
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("LUKS-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");

    // [5] Reencryption using a specific keyslot: the others are dropped;
    // a keyslot out of range is refused.
    let pw2: &[u8] = b"compat passphrase 2\n";
    let pw3: &[u8] = b"compat passphrase 3\n";
    let f = std::fs::File::create(&img).unwrap();
    f.set_len(12 << 20).unwrap();
    let mut a = cat(&["-q", "luksFormat", "--type", "luks1"], &fast);
    a.push(s(&img).into());
    ok(run("cryptsetup", &args(&a), pw2), "luksFormat");
    for (slot, new) in [("1", PW1), ("7", pw3)] {
        let mut input = pw2.to_vec();
        input.extend_from_slice(new);
        let mut a = cat(&["-q", "luksAddKey"], &fast);
        a.extend(["-S".into(), slot.into(), s(&img).into()]);
        ok(run("cryptsetup", &args(&a), &input), "luksAddKey");
    }
    let plain = fill(&img, None, 71);
    let refuse = both_refuse(&[&img], &[s(&img), "-q", "-S", "8"]);
    assert!(refuse.contains("Key slot is invalid."), "{refuse}");
    let mut a = cat(&["reencrypt"], &fast);
    a.extend(["-S", "1", "-q", s(&img)].map(String::from));
    let out = ucrypt_in(dir.path(), &args(&a), PW1);
    ok(out, "-S 1");
    let dump = testutil::run_ok("cryptsetup", &["luksDump", s(&img)]);
    let enabled: Vec<&str> = dump
        .lines()
        .filter(|l| l.starts_with("Key Slot") && l.ends_with("ENABLED"))
        .collect();
    assert_eq!(enabled, ["Key Slot 1: ENABLED"], "{dump}");
    cs_opens(&img, PW1);
    assert!(read_back(&img, None) == plain, "-S 1: data");

    // [6] Reencryption using all active keyslots: each passphrase asked
    // in slot order, each keyslot renewed in its own number.
    for (slot, new) in [("0", pw2), ("7", pw3)] {
        let mut input = PW1.to_vec();
        input.extend_from_slice(new);
        let mut a = cat(&["-q", "luksAddKey"], &fast);
        a.extend(["-S".into(), slot.into(), s(&img).into()]);
        ok(run("cryptsetup", &args(&a), &input), "luksAddKey");
    }
    let old_key = volume_key(&img, PW1);
    // A wrong passphrase for the second keyslot: refused, nothing
    // written, no LUKS-<uuid> file left. (cryptsetup's LUKS1 tool reads
    // `--tries` lines for a keyslot even from a pipe, so its input would
    // differ: ucrypt alone here.)
    let before = hashes(&[&img]);
    let a = cat(&["reencrypt", "-q", s(&img)], &fast);
    let out = ucrypt_in(dir.path(), &args(&a), &lines(&[pw2, b"wrong\n", pw3]));
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(hashes(&[&img]) == before, "wrong passphrase: written");
    let left = std::fs::read_dir(dir.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("LUKS-")
        })
        .count();
    assert_eq!(left, 0, "no reencryption files");
    let a = cat(&["reencrypt", "-q", s(&img)], &fast);
    ok(
        ucrypt_in(dir.path(), &args(&a), &lines(&[pw2, PW1, pw3])),
        "all keyslots",
    );
    let dump = testutil::run_ok("cryptsetup", &["luksDump", s(&img)]);
    let enabled: Vec<&str> = dump
        .lines()
        .filter(|l| l.starts_with("Key Slot") && l.ends_with("ENABLED"))
        .collect();
    assert_eq!(
        enabled,
        [
            "Key Slot 0: ENABLED",
            "Key Slot 1: ENABLED",
            "Key Slot 7: ENABLED"
        ],
        "{dump}"
    );
    for (slot, p) in [("0", pw2), ("1", PW1), ("7", pw3)] {
        ok(
            run(
                "cryptsetup",
                &["open", "--test-passphrase", "-S", slot, s(&img)],
                p,
            ),
            "each keyslot renewed",
        );
    }
    assert_ne!(old_key, volume_key(&img, pw3), "the key changed");
    assert!(read_back(&img, None) == plain, "all keyslots: data");
}

/// The JSON area of a 16 KiB-metadata LUKS2 header rewritten (both
/// copies, their checksums recomputed), as the mangle script's
/// `img_update_json` does.
pub(crate) fn mangle(img: &Path, j: &Value) {
    const MSIZE: usize = 16384;
    let text = serde_json::to_vec(j).unwrap();
    let mut b = std::fs::read(img).unwrap();
    for base in [0, MSIZE] {
        let area = &mut b[base + 4096..base + MSIZE];
        area.fill(0);
        area[..text.len()].copy_from_slice(&text);
        let hdr = &mut b[base..base + MSIZE];
        hdr[448..448 + 64].fill(0);
        let sum = sha256(hdr);
        hdr[448..448 + 32].copy_from_slice(&sum);
    }
    std::fs::write(img, &b).unwrap();
}

fn sha256(b: &[u8]) -> Vec<u8> {
    let out = testutil::run("sha256sum", &[], Some(b));
    let hex = String::from_utf8(out.stdout).unwrap();
    (0..32)
        .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

#[test]
fn mangled_metadata_is_refused() {
    if !require_tool("reencrypt_compat_mangle", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("recompat-mangle");
    let img = dir.join("img");
    let key = dir.join("key1");
    std::fs::write(&key, b"mangle test key file").unwrap();
    let cs_params = ["-q", "--disable-locks", "--key-file", s(&key)];
    // img_prepare: a 32 MiB image, cryptsetup's reencryption initialized
    // with resilience none.
    let prepare = || -> Value {
        let f = std::fs::File::create(&img).unwrap();
        f.set_len(32 << 20).unwrap();
        let mut a = cat(&["luksFormat", "--type", "luks2"], FAST_PBKDF2);
        a.extend(cat(
            &cs_params,
            &["--luks2-metadata-size", "16384", s(&img)],
        ));
        ok(run("cryptsetup", &args(&a), b""), "luksFormat");
        fill_with(&img, None, &key, 80);
        let mut a = cat(&["reencrypt", s(&img)], &cs_params);
        a.extend(["--init-only", "--resilience", "none"].map(String::from));
        ok(run("cryptsetup", &args(&a), b""), "reencrypt --init-only");
        json(&img)
    };
    let key_s = s(&key);
    let img_s = s(&img);
    let resume = [
        "reencrypt",
        "--resume-only",
        "-q",
        "--key-file",
        key_s,
        img_s,
    ];
    // img_check_fail: cryptsetup's repair refuses, and so does ucrypt's
    // resume and its --test-passphrase; nothing written.
    let check_fail = |what: &str| {
        let before = std::fs::read(&img).unwrap();
        let mut a = vec!["repair", img_s];
        a.extend_from_slice(&cs_params);
        let out = run("cryptsetup", &a, b"");
        assert!(!out.status.success(), "{what}: cryptsetup repair passed");
        let out = run("ucrypt", &resume, b"");
        assert!(!out.status.success(), "{what}: ucrypt resumed");
        let out = run(
            "ucrypt",
            &["open", "--test-passphrase", "--key-file", key_s, img_s],
            b"",
        );
        assert!(!out.status.success(), "{what}: ucrypt unlocked it");
        assert!(std::fs::read(&img).unwrap() == before, "{what}: written");
    };
    // img_check_ok then a run: ucrypt finishes what cryptsetup repairs.
    // What fill_with wrote: the same seed gives the same data.
    let plain = {
        let mut p = vec![0u8; 16 << 20];
        Rng::new(80).fill(&mut p);
        p
    };
    // `from`: the first byte whose plaintext is known (a simulated
    // progress claims data the new key never wrote).
    let check_ok = |what: &str, from: usize| {
        let mut a = vec!["repair", img_s];
        a.extend_from_slice(&cs_params);
        ok(run("cryptsetup", &a, b""), &format!("{what}: repair"));
        ok(
            run("ucrypt", &resume, b""),
            &format!("{what}: ucrypt resume"),
        );
        assert!(!in_reencryption(&img), "{what}");
        ok(
            run(
                "cryptsetup",
                &["open", "--test-passphrase", "--key-file", key_s, img_s],
                b"",
            ),
            what,
        );
        let back = ok(
            run(
                "ucrypt",
                &["map", "--read", "--luks", img_s, "--key-file", key_s],
                b"",
            ),
            what,
        )
        .stdout;
        assert!(back[from..] == plain[from..], "{what}: data");
    };

    // Normal situation.
    prepare();
    check_ok("unchanged", 0);

    type Edit = fn(&mut Value);
    let fails: &[(&str, Edit)] = &[
        ("[1] old flag", |j| {
            j["config"]["requirements"]["mandatory"] = serde_json::json!(["online-reencryptx"])
        }),
        ("[1] two reencrypt flags (v999)", |j| {
            j["config"]["requirements"]["mandatory"]
                .as_array_mut()
                .unwrap()
                .push("online-reencrypt-v999".into())
        }),
        ("[1] two reencrypt flags (v1)", |j| {
            j["config"]["requirements"]["mandatory"]
                .as_array_mut()
                .unwrap()
                .push("online-reencrypt".into())
        }),
        ("[7] checksum area without its digest", |j| {
            let a = &mut j["keyslots"]["2"]["area"];
            a["type"] = "checksum".into();
            a["hash"] = "sha256".into();
            a["sector_size"] = 4096.into();
        }),
        ("[7] journal", |j| {
            j["keyslots"]["2"]["area"]["type"] = "journal".into()
        }),
        ("[7] mode decrypt", |j| {
            j["keyslots"]["2"]["mode"] = "decrypt".into()
        }),
        ("[7] direction backward", |j| {
            j["keyslots"]["2"]["direction"] = "backward".into()
        }),
        ("[7] key_size 16", |j| {
            j["keyslots"]["2"]["key_size"] = 16.into()
        }),
        ("[7] segment 1 gone", |j| {
            j["segments"].as_object_mut().unwrap().remove("1");
        }),
        ("[7] segment 0 cipher", |j| {
            j["segments"]["0"]["encryption"] = "aes-cbc-null".into()
        }),
        ("[7] segment 1 cipher", |j| {
            j["segments"]["1"]["encryption"] = "aes-cbc-null".into()
        }),
        ("[7] segment 2 cipher", |j| {
            j["segments"]["2"]["encryption"] = "aes-cbc-null".into()
        }),
        ("[7] digest 2 replaced", |j| {
            let mut d = j["digests"]["0"].clone();
            d["keyslots"] = serde_json::json!(["2"]);
            d["segments"] = serde_json::json!([]);
            j["digests"]["2"] = d;
        }),
        ("[7] digest 2 iterations", |j| {
            j["digests"]["2"]["iterations"] = 1111.into()
        }),
        ("[7] requirement removed", |j| {
            j["config"]["requirements"]["mandatory"] = serde_json::json!([])
        }),
    ];
    for (what, edit) in fails {
        let mut j = prepare();
        edit(&mut j);
        mangle(&img, &j);
        check_fail(what);
    }

    // Benign edits: the requirement put back, the reencrypt keyslot's
    // priority gone, an unknown segment flag; and a simulated progress
    // (1 MiB done) that the verification digest still covers.
    let oks: &[(&str, Edit)] = &[
        ("[1] flag restored", |j| {
            j["config"]["requirements"]["mandatory"] = serde_json::json!(["online-reencrypt-v2"])
        }),
        ("[7] priority removed", |j| {
            j["keyslots"]["2"]
                .as_object_mut()
                .unwrap()
                .remove("priority");
        }),
        ("[7] unknown segment flag", |j| {
            j["segments"]["0"]["flags"] = serde_json::json!(["dead-parrot"])
        }),
    ];
    for (what, edit) in oks {
        let mut j = prepare();
        edit(&mut j);
        mangle(&img, &j);
        check_ok(what, 0);
    }
    let mut j = prepare();
    let s0 = j["segments"]["0"].clone();
    let mut done = s0.clone();
    done["size"] = (1u64 << 20).to_string().into();
    let mut rest = s0.clone();
    rest["offset"] = (17u64 << 20).to_string().into();
    let (s1, s2) = (j["segments"]["1"].clone(), j["segments"]["2"].clone());
    j["segments"] = serde_json::json!({"0": done, "1": rest, "2": s1, "3": s2});
    j["digests"]["0"]["segments"] = serde_json::json!(["1", "2"]);
    j["digests"]["1"]["segments"] = serde_json::json!(["0", "3"]);
    mangle(&img, &j);
    // The script's segment 1 keeps iv_tweak 0 at its new offset: cryptsetup
    // accepts that (and would read the rest with the wrong IVs); ucrypt
    // refuses the inconsistent layout, writing nothing.
    let before = std::fs::read(&img).unwrap();
    let out = run("ucrypt", &resume, b"");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("does not continue the reencryption layout"),
        "{err}"
    );
    assert!(std::fs::read(&img).unwrap() == before, "written");
    j["segments"]["1"]["iv_tweak"] = (2048u64).to_string().into();
    mangle(&img, &j);
    check_ok("[7] simulated progress", 1 << 20);
}

/// The reencrypt keyslot's area of `hdr` (its resilience).
fn resilience_area(hdr: &Path) -> Value {
    json(hdr)["keyslots"]
        .as_object()
        .unwrap()
        .values()
        .find(|k| k["type"] == "reencrypt")
        .map(|k| k["area"].clone())
        .unwrap_or(Value::Null)
}

/// `ucrypt reencrypt --resume-only ARGS` stopped (aborted) right after
/// its first two writes: the two header copies of a resilience change.
fn ucrypt_resume_stopped(img: &Path, extra: &[&str]) {
    let mut a = vec!["reencrypt", "--resume-only", "-q", s(img)];
    a.extend_from_slice(extra);
    let out = std::process::Command::new(testutil::ucrypt_bin())
        .args(&a)
        .env("UCRYPT_REENCRYPT_CRASH_AFTER", "2")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(PW1)?;
            c.wait_with_output()
        })
        .unwrap();
    assert!(!out.status.success(), "aborted: {out:?}");
}

/// `--resilience` (with `--resilience-hash`) given to a resume switches
/// the reencryption to it, as cryptsetup's resume does: the header ucrypt
/// rewrites is one cryptsetup resumes (its verification digest made
/// again), each tool finishes what the other started with another
/// resilience, and a switch to a data shift or an unknown mode is refused
/// by both with nothing written.
#[test]
fn resume_with_another_resilience() {
    if !require_tool("reencrypt_compat_resilience", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("recompat-resil");
    let img = dir.join("img");
    format(&img, 24, FAST_PBKDF2);
    let plain = fill(&img, None, 80);
    ok(
        run("ucrypt", &["reencrypt", "--init-only", "-q", s(&img)], PW1),
        "init-only",
    );
    assert_eq!(resilience_area(&img)["type"], "checksum");
    for bad in ["datashift", "datashift-journal", "bogus"] {
        both_refuse(
            &[&img],
            &[s(&img), "--resume-only", "-q", "--resilience", bad],
        );
    }
    // ucrypt switches to journal; cryptsetup resumes with it.
    ucrypt_resume_stopped(&img, &["--resilience", "journal"]);
    let area = resilience_area(&img);
    assert_eq!(area["type"], "journal", "{area}");
    assert!(area.get("hash").is_none(), "{area}");
    ok(
        run(
            "cryptsetup",
            &[
                "reencrypt",
                "--resume-only",
                "-q",
                "--force-offline-reencrypt",
                s(&img),
            ],
            PW1,
        ),
        "cryptsetup resume",
    );
    assert!(!in_reencryption(&img));
    cs_opens(&img, PW1);
    assert!(read_back(&img, None) == plain, "journal: data");

    // cryptsetup's journal init; ucrypt switches to checksum with sha512,
    // cryptsetup finishes.
    ok(
        run(
            "cryptsetup",
            &[
                "reencrypt",
                "--init-only",
                "-q",
                "--resilience",
                "journal",
                s(&img),
            ],
            PW1,
        ),
        "cryptsetup init-only",
    );
    ucrypt_resume_stopped(
        &img,
        &["--resilience", "checksum", "--resilience-hash", "sha512"],
    );
    let area = resilience_area(&img);
    assert_eq!(area["type"], "checksum", "{area}");
    assert_eq!(area["hash"], "sha512", "{area}");
    ok(
        run(
            "cryptsetup",
            &[
                "reencrypt",
                "--resume-only",
                "-q",
                "--force-offline-reencrypt",
                s(&img),
            ],
            PW1,
        ),
        "cryptsetup resume",
    );
    cs_opens(&img, PW1);
    assert!(read_back(&img, None) == plain, "checksum: data");

    // cryptsetup's checksum init resumed by ucrypt with none, to the end.
    ok(
        run(
            "cryptsetup",
            &["reencrypt", "--init-only", "-q", s(&img)],
            PW1,
        ),
        "cryptsetup init-only",
    );
    ok(
        run(
            "ucrypt",
            &[
                "reencrypt",
                "--resume-only",
                "-q",
                "--resilience",
                "none",
                "--hotzone-size",
                "1M",
                s(&img),
            ],
            PW1,
        ),
        "ucrypt resume with none",
    );
    assert!(!in_reencryption(&img));
    cs_opens(&img, PW1);
    assert!(read_back(&img, None) == plain, "none: data");
}

/// `reencryption-compat-test` [2], [4], [8], [10], [11], [12]: LUKS1 data
/// shifts, encryption (`--new --type luks1`), `--keep-key`, decryption
/// and nested-encryption refusals, with the script's arguments and the
/// plaintext compared where it zero-fills and hashes (cryptsetup's LUKS1
/// tool itself needs device-mapper: the results are checked by
/// `cryptsetup open --test-passphrase`, `luksDump` and `isLuks`).
#[test]
fn luks1_shift_encrypt_keep_key_decrypt_of_the_script() {
    if !require_tool("reencrypt_compat_luks1_new", "cryptsetup") {
        return;
    }
    let dir = TempDir::new("recompat-luks1-new");
    let img = dir.join("img");
    let fast = ["--pbkdf-force-iterations", "1000", "--pbkdf", "pbkdf2"];
    let fresh = |mib: u64| {
        let f = std::fs::File::create(&img).unwrap();
        f.set_len(mib << 20).unwrap();
    };
    let luks1 = |extra: &[&str]| {
        let mut a = cat(&["-q", "luksFormat", "--type", "luks1"], extra);
        a.extend(fast.iter().map(|x| x.to_string()));
        a.push(s(&img).into());
        ok(run("cryptsetup", &args(&a), PW1), "luksFormat luks1");
    };
    let reenc = |extra: &[&str]| {
        let mut a = cat(&["reencrypt", s(&img), "-q"], &fast);
        a.extend(extra.iter().map(|x| x.to_string()));
        ucrypt_in(dir.path(), &args(&a), PW1)
    };

    // [2] Reencryption with data shift: the data moves up 1024 sectors.
    fresh(8);
    luks1(&[
        "-c",
        "aes-cbc-essiv:sha256",
        "-s",
        "128",
        "--align-payload",
        "2048",
    ]);
    let plain = fill(&img, None, 80);
    ok(
        reenc(&["-s", "256", "--reduce-device-size", "1024S"]),
        "[2] shift",
    );
    cs_opens(&img, PW1);
    assert!(
        read_back(&img, None) == plain[..plain.len() - (512 << 10)],
        "[2]"
    );
    ok(reenc(&[]), "[2] again");
    assert!(
        read_back(&img, None) == plain[..plain.len() - (512 << 10)],
        "[2]"
    );

    // [4] Encryption: a header that is the device itself is refused (not
    // detached, no reduction), nothing written; then with a reduction.
    fresh(8);
    let mut p = vec![0u8; 8 << 20];
    Rng::new(81).fill(&mut p);
    std::fs::write(&img, &p).unwrap();
    let link = dir.join("link");
    std::os::unix::fs::symlink(&img, &link).unwrap();
    for h in [&img, &link] {
        let before = hashes(&[&img]);
        let out = reenc(&["--type", "luks1", "--new", "--header", s(h)]);
        assert!(!out.status.success(), "[4] header {h:?}");
        assert!(hashes(&[&img]) == before, "[4] header {h:?}: written");
    }
    ok(
        reenc(&[
            "-c",
            "aes-cbc-essiv:sha256",
            "-s",
            "128",
            "--new",
            "--type",
            "luks1",
            "--reduce-device-size",
            "2048S",
        ]),
        "[4] encrypt",
    );
    cs_opens(&img, PW1);
    assert!(
        read_back(&img, None) == p[..p.len() - (1 << 20)],
        "[4] data"
    );
    // A key file as the new passphrase.
    fresh(8);
    let key1 = dir.join("key1");
    std::fs::write(&key1, b"compat key file").unwrap();
    ok(
        reenc(&[
            "-d",
            s(&key1),
            "--new",
            "--type",
            "luks1",
            "--reduce-device-size",
            "4096S",
        ]),
        "[4] -d KEY1",
    );
    ok(
        testutil::run(
            "cryptsetup",
            &["open", "--test-passphrase", s(&img), "-d", s(&key1)],
            None,
        ),
        "[4] key file opens",
    );

    // [8] Header only reencryption: hash and iterations, the key kept.
    fresh(8);
    luks1(&["--hash", "sha512"]);
    let plain = fill(&img, None, 82);
    let key = volume_key(&img, PW1);
    let keep = |extra: &[&str]| {
        let a = cat(&["reencrypt", s(&img), "-q", "--keep-key"], extra);
        ucrypt_in(dir.path(), &args(&a), PW1)
    };
    ok(keep(&fast), "[8] --keep-key");
    let before = hashes(&[&img]);
    let out = keep(&["--pbkdf-force-iterations", "999"]);
    assert!(!out.status.success(), "[8] 999 iterations");
    assert!(hashes(&[&img]) == before, "[8] 999: written");
    ok(
        keep(&["--hash", "sha256", "--pbkdf-force-iterations", "1001"]),
        "[8] 1001",
    );
    let dump = testutil::run_ok("cryptsetup", &["luksDump", s(&img)]);
    assert!(dump.contains("Hash spec:     \tsha256"), "{dump}");
    assert!(dump.contains("Iterations:         \t1001"), "{dump}");
    ok(
        keep(&["--hash", "sha512", "--pbkdf-force-iterations", "1000"]),
        "[8] sha512",
    );
    assert_eq!(volume_key(&img, PW1), key, "[8] the key kept");
    assert!(read_back(&img, None) == plain, "[8] data");

    // [10] Removal of encryption (keyslot 0, then keyslot 5): the
    // plaintext at the start, the rest zero.
    for extra in [&[][..], &["-S5"]] {
        fresh(8);
        luks1(extra);
        let plain = fill(&img, None, 83);
        ok(reenc(&["--decrypt"]), "[10] --decrypt");
        let mut want = plain.clone();
        want.resize(8 << 20, 0);
        assert!(std::fs::read(&img).unwrap() == want, "[10] {extra:?}");
    }

    // [11] Detached header: encryption, reencryption, decryption; then
    // an existing empty header file.
    fresh(8);
    std::fs::write(&img, &p).unwrap();
    let hdr = dir.join("img.hdr");
    ok(
        reenc(&["--header", s(&hdr), "--new", "--type", "luks1"]),
        "[11] encrypt",
    );
    assert!(read_back(&img, Some(&hdr)) == p, "[11] encrypted");
    ok(reenc(&["--header", s(&hdr)]), "[11] reencrypt");
    assert!(read_back(&img, Some(&hdr)) == p, "[11] reencrypted");
    ok(reenc(&["--header", s(&hdr), "--decrypt"]), "[11] decrypt");
    assert!(std::fs::read(&img).unwrap() == p, "[11] decrypted");
    std::fs::write(&hdr, b"").unwrap();
    ok(
        reenc(&["--header", s(&hdr), "--new", "--type", "luks1"]),
        "[11] empty header",
    );
    assert!(read_back(&img, Some(&hdr)) == p, "[11] empty header");
    let is_luks = |f: &Path| {
        testutil::run("cryptsetup", &["isLuks", s(f)], None)
            .status
            .success()
    };
    assert!(!is_luks(&img) && is_luks(&hdr), "[11]");

    // [12] Nested encryption is refused by both tools, nothing written
    // and no header file created.
    fresh(8);
    luks1(&[]);
    let _ = std::fs::remove_file(&hdr);
    for a in [
        &["--new", "--type", "luks1", "--reduce-device-size", "1024S"][..],
        &["--new", "--type", "luks1", "--header", s(&hdr)],
    ] {
        let mut full = vec![s(&img), "-q"];
        full.extend_from_slice(&fast);
        full.extend_from_slice(a);
        let err = both_refuse(&[&img], &full);
        assert!(err.contains("already LUKS device"), "[12] {a:?}: {err}");
        assert!(!hdr.exists(), "[12] {a:?}: header file created");
    }
}
