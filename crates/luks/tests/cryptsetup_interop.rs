//! Interop with cryptsetup (the reference), both directions, at library
//! level: cryptsetup formats and ucrypt opens; ucrypt formats and
//! cryptsetup reads, adds keys and reveals the same volume key. Payload
//! bytes are checked against the independent python oracle
//! (tests/oracle/dmcrypt.py) using the key cryptsetup reveals.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use luks::{FormatOptions, Hash, KdfRequest};
use testutil::{random_bytes, TempDir};
use ucrypt_luks as luks;

const PASS: &[u8] = b"correct horse battery staple";
const PASS2: &[u8] = b"second\npassphrase\0with nul";

fn tools(test: &str) -> bool {
    testutil::require_tool(test, "cryptsetup")
        && testutil::require_tool(test, "python3")
        && testutil::require_python_module(test, "cryptography")
}

fn oracle() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/oracle/dmcrypt.py")
}

fn cryptsetup(args: &[&str]) -> std::process::Output {
    let out = Command::new("cryptsetup")
        .args(args)
        .output()
        .expect("run cryptsetup");
    assert!(
        out.status.success(),
        "cryptsetup {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn write_file(p: &Path, b: &[u8]) {
    std::fs::write(p, b).unwrap();
}

fn sparse(p: &Path, len: u64) {
    let f = std::fs::File::create(p).unwrap();
    f.set_len(len).unwrap();
}

/// The volume key `cryptsetup luksDump --dump-volume-key` reveals.
fn cs_volume_key(dev: &Path, header: Option<&Path>, keyfile: &Path) -> Vec<u8> {
    let target = header.unwrap_or(dev);
    let out = cryptsetup(&[
        "luksDump",
        "--dump-volume-key",
        "--batch-mode",
        "--key-file",
        keyfile.to_str().unwrap(),
        target.to_str().unwrap(),
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    let key = testutil::volume_key_from_dump(&text);
    assert!(!key.is_empty(), "no MK dump in: {text}");
    key
}

/// The oracle's transform of `data`.
fn oracle_run(
    dir: &str,
    cipher: &str,
    key: &[u8],
    sector_size: u32,
    iv_offset: u64,
    data: &[u8],
) -> Vec<u8> {
    let key_hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let mut child = Command::new("python3")
        .arg(oracle())
        .args([dir, "--cipher", cipher, "--key", &key_hex])
        .args([
            "--sector-size",
            &sector_size.to_string(),
            "--iv-offset",
            &iv_offset.to_string(),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run oracle");
    let mut stdin = child.stdin.take().unwrap();
    let data = data.to_vec();
    let w = std::thread::spawn(move || stdin.write_all(&data));
    let out = child.wait_with_output().unwrap();
    w.join().unwrap().unwrap();
    assert!(
        out.status.success(),
        "oracle failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out.stdout
}

fn pwrite(p: &Path, off: u64, data: &[u8]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
    f.write_all_at(data, off).unwrap();
}

fn pread(p: &Path, off: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::open(p).unwrap();
    let mut b = vec![0u8; len];
    f.read_exact_at(&mut b, off).unwrap();
    b
}

/// One cell of the cryptsetup -> ucrypt matrix.
struct Cell {
    name: &'static str,
    luks_type: &'static str,
    cipher: &'static str,
    key_bits: u32,
    sector: u32,
    pbkdf: &'static str,
    detached: bool,
    second_key: bool,
}

fn cs_to_ucrypt(c: &Cell) {
    let test = format!("cryptsetup_to_ucrypt::{}", c.name);
    if !tools(&test) {
        return;
    }
    let dir = TempDir::new("luks-cs2u");
    let dev = dir.join("dev.img");
    let hdr = dir.join("hdr.img");
    let kf = dir.join("key");
    let kf2 = dir.join("key2");
    write_file(&kf, PASS);
    write_file(&kf2, PASS2);
    sparse(&dev, if c.detached { 1 << 20 } else { 18 << 20 });
    let mut args: Vec<String> = vec![
        "luksFormat".into(),
        "--batch-mode".into(),
        "--type".into(),
        c.luks_type.into(),
        "--cipher".into(),
        c.cipher.into(),
        "--key-size".into(),
        c.key_bits.to_string(),
        "--key-file".into(),
        kf.to_str().unwrap().into(),
    ];
    let kdf_args: Vec<String> = if c.pbkdf == "pbkdf2" {
        vec![
            "--pbkdf".into(),
            "pbkdf2".into(),
            "--pbkdf-force-iterations".into(),
            "1000".into(),
        ]
    } else {
        [
            "--pbkdf",
            c.pbkdf,
            "--pbkdf-force-iterations",
            "4",
            "--pbkdf-memory",
            "1024",
            "--pbkdf-parallel",
            "1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    args.extend(kdf_args.iter().cloned());
    if c.luks_type == "luks2" {
        args.extend(["--sector-size".into(), c.sector.to_string()]);
    }
    if c.detached {
        args.extend(["--header".into(), hdr.to_str().unwrap().into()]);
    }
    args.push(dev.to_str().unwrap().into());
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    cryptsetup(&argv);
    let header = c.detached.then_some(hdr.as_path());
    if c.second_key {
        let mut a: Vec<String> = vec![
            "luksAddKey".into(),
            "--batch-mode".into(),
            "--key-file".into(),
        ];
        a.push(kf.to_str().unwrap().into());
        a.extend(kdf_args.iter().cloned());
        if let Some(h) = header {
            a.extend(["--header".into(), h.to_str().unwrap().into()]);
        }
        a.push(dev.to_str().unwrap().into());
        a.push(kf2.to_str().unwrap().into());
        let argv: Vec<&str> = a.iter().map(String::as_str).collect();
        cryptsetup(&argv);
    }
    let cs_key = cs_volume_key(&dev, header, &kf);

    // ucrypt opens it.
    let (pass, slot) = if c.second_key { (PASS2, 1) } else { (PASS, 0) };
    let opened = luks::open(&dev, header, &luks::DeviceAccess::default(), pass, None)
        .expect("ucrypt opens the cryptsetup volume");
    assert_eq!(opened.keyslot, slot);
    assert_eq!(
        &opened.volume_key[..],
        &cs_key[..],
        "same volume key as cryptsetup"
    );
    assert_eq!(opened.cipher, c.cipher);
    assert_eq!(opened.sector_size, c.sector);
    if c.second_key {
        let by_slot =
            luks::open(&dev, header, &luks::DeviceAccess::default(), PASS2, Some(1)).unwrap();
        assert_eq!(&by_slot.volume_key[..], &cs_key[..]);
        let e =
            luks::open(&dev, header, &luks::DeviceAccess::default(), PASS, Some(1)).unwrap_err();
        assert_eq!(e.kind(), luks::ErrorKind::WrongPassphrase);
    }
    let e = luks::open(&dev, header, &luks::DeviceAccess::default(), b"wrong", None).unwrap_err();
    assert_eq!(e.kind(), luks::ErrorKind::WrongPassphrase);
    let expect_off = if c.detached {
        0
    } else if c.luks_type == "luks1" {
        2 << 20
    } else {
        16 << 20
    };
    assert_eq!(opened.payload_offset, expect_off);

    // Payload: ciphertext as dm-crypt would have written; both decrypt it.
    let len = 64 * 1024;
    let ct = random_bytes(len, 0x1234_5678 + u64::from(c.sector));
    pwrite(&dev, opened.payload_offset, &ct);
    let mut mine = pread(&dev, opened.payload_offset, len);
    let sc = crypto::SectorCrypt::new(&opened.crypt_config()).unwrap();
    sc.decrypt(0, &mut mine);
    let theirs = oracle_run(
        "decrypt",
        c.cipher,
        &cs_key,
        c.sector,
        opened.iv_offset,
        &ct,
    );
    assert!(
        mine == theirs,
        "{}: ucrypt plaintext differs from the oracle's",
        c.name
    );
}

macro_rules! cell {
    ($name:ident, $t:expr, $cipher:expr, $bits:expr, $sector:expr, $kdf:expr, $det:expr, $second:expr) => {
        #[test]
        fn $name() {
            cs_to_ucrypt(&Cell {
                name: stringify!($name),
                luks_type: $t,
                cipher: $cipher,
                key_bits: $bits,
                sector: $sector,
                pbkdf: $kdf,
                detached: $det,
                second_key: $second,
            });
        }
    };
}

cell!(
    cs_luks1_xts512_pbkdf2,
    "luks1",
    "aes-xts-plain64",
    512,
    512,
    "pbkdf2",
    false,
    false
);
cell!(
    cs_luks1_xts256_pbkdf2,
    "luks1",
    "aes-xts-plain64",
    256,
    512,
    "pbkdf2",
    false,
    false
);
cell!(
    cs_luks1_cbc_essiv,
    "luks1",
    "aes-cbc-essiv:sha256",
    256,
    512,
    "pbkdf2",
    false,
    false
);
cell!(
    cs_luks1_detached,
    "luks1",
    "aes-xts-plain64",
    512,
    512,
    "pbkdf2",
    true,
    false
);
cell!(
    cs_luks1_second_slot,
    "luks1",
    "aes-xts-plain64",
    512,
    512,
    "pbkdf2",
    false,
    true
);
cell!(
    cs_luks2_xts512_pbkdf2_512,
    "luks2",
    "aes-xts-plain64",
    512,
    512,
    "pbkdf2",
    false,
    false
);
cell!(
    cs_luks2_xts512_argon2id_4096,
    "luks2",
    "aes-xts-plain64",
    512,
    4096,
    "argon2id",
    false,
    false
);
cell!(
    cs_luks2_xts256_argon2i_4096,
    "luks2",
    "aes-xts-plain64",
    256,
    4096,
    "argon2i",
    false,
    false
);
cell!(
    cs_luks2_xts256_pbkdf2_512,
    "luks2",
    "aes-xts-plain64",
    256,
    512,
    "pbkdf2",
    false,
    false
);
cell!(
    cs_luks2_cbc_essiv_512,
    "luks2",
    "aes-cbc-essiv:sha256",
    256,
    512,
    "pbkdf2",
    false,
    false
);
cell!(
    cs_luks2_cbc_essiv_4096,
    "luks2",
    "aes-cbc-essiv:sha256",
    256,
    4096,
    "argon2id",
    false,
    false
);
cell!(
    cs_luks2_detached_4096,
    "luks2",
    "aes-xts-plain64",
    512,
    4096,
    "argon2id",
    true,
    false
);
cell!(
    cs_luks2_second_slot,
    "luks2",
    "aes-xts-plain64",
    512,
    4096,
    "argon2id",
    false,
    true
);

/// One cell of the ucrypt -> cryptsetup matrix.
fn ucrypt_to_cs(
    name: &str,
    version: u32,
    cipher: &str,
    key_bits: u32,
    sector: u32,
    pbkdf: &str,
    detached: bool,
) {
    let test = format!("ucrypt_to_cryptsetup::{name}");
    if !tools(&test) {
        return;
    }
    let dir = TempDir::new("luks-u2cs");
    let dev = dir.join("dev.img");
    let hdr = dir.join("hdr.img");
    let kf = dir.join("key");
    let kf2 = dir.join("key2");
    write_file(&kf, PASS);
    write_file(&kf2, PASS2);
    sparse(&dev, if detached { 1 << 20 } else { 18 << 20 });
    let header = detached.then_some(hdr.as_path());
    let opts = FormatOptions {
        version,
        cipher: cipher.into(),
        key_bits: Some(key_bits),
        sector_size: (version == 2).then_some(sector),
        hash: Hash::Sha256,
        kdf: KdfRequest {
            kind: pbkdf.into(),
            force_iterations: Some(if pbkdf == "pbkdf2" { 1000 } else { 4 }),
            memory_kib: Some(1024),
            parallel: Some(1),
            ..KdfRequest::default()
        },
        ..FormatOptions::default()
    };
    luks::format(&dev, header, &opts, PASS).expect("ucrypt format");
    let target = header.unwrap_or(&dev);
    cryptsetup(&["isLuks", target.to_str().unwrap()]);
    let dump = cryptsetup(&["luksDump", target.to_str().unwrap()]);
    let dump = String::from_utf8(dump.stdout).unwrap();
    assert!(
        dump.contains(&format!("Version:       \t{version}")),
        "{dump}"
    );
    let opened = luks::open(&dev, header, &luks::DeviceAccess::default(), PASS, None).unwrap();
    let cs_key = cs_volume_key(&dev, header, &kf);
    assert_eq!(
        &opened.volume_key[..],
        &cs_key[..],
        "cryptsetup reveals the key ucrypt uses"
    );

    // cryptsetup adds a key to the ucrypt header; ucrypt opens with it.
    let mut a = vec![
        "luksAddKey",
        "--batch-mode",
        "--key-file",
        kf.to_str().unwrap(),
    ];
    a.extend([
        "--pbkdf",
        pbkdf,
        "--pbkdf-force-iterations",
        if pbkdf == "pbkdf2" { "1000" } else { "4" },
    ]);
    if pbkdf != "pbkdf2" {
        a.extend(["--pbkdf-memory", "1024", "--pbkdf-parallel", "1"]);
    }
    if let Some(h) = header {
        a.extend(["--header", h.to_str().unwrap()]);
    }
    a.extend([dev.to_str().unwrap(), kf2.to_str().unwrap()]);
    cryptsetup(&a);
    let o2 = luks::open(&dev, header, &luks::DeviceAccess::default(), PASS2, None)
        .expect("ucrypt opens with cryptsetup's new key");
    assert_eq!(o2.keyslot, 1);
    assert_eq!(&o2.volume_key[..], &cs_key[..]);

    // Data written through ucrypt's cipher decrypts under the oracle.
    let len = 32 * 1024;
    let plain = random_bytes(len, 99 + u64::from(sector));
    let mut ct = plain.clone();
    crypto::SectorCrypt::new(&opened.crypt_config())
        .unwrap()
        .encrypt(0, &mut ct);
    pwrite(&dev, opened.payload_offset, &ct);
    let back = oracle_run(
        "decrypt",
        cipher,
        &cs_key,
        opened.sector_size,
        opened.iv_offset,
        &pread(&dev, opened.payload_offset, len),
    );
    assert!(
        back == plain,
        "{name}: oracle does not decrypt ucrypt's ciphertext"
    );
}

#[test]
fn u_luks1_xts512() {
    ucrypt_to_cs(
        "u_luks1_xts512",
        1,
        "aes-xts-plain64",
        512,
        512,
        "pbkdf2",
        false,
    );
}
#[test]
fn u_luks1_cbc_essiv_detached() {
    ucrypt_to_cs(
        "u_luks1_cbc_essiv_detached",
        1,
        "aes-cbc-essiv:sha256",
        256,
        512,
        "pbkdf2",
        true,
    );
}
#[test]
fn u_luks2_xts512_argon2id_4096() {
    ucrypt_to_cs(
        "u_luks2_xts512_argon2id_4096",
        2,
        "aes-xts-plain64",
        512,
        4096,
        "argon2id",
        false,
    );
}
#[test]
fn u_luks2_xts256_pbkdf2_512() {
    ucrypt_to_cs(
        "u_luks2_xts256_pbkdf2_512",
        2,
        "aes-xts-plain64",
        256,
        512,
        "pbkdf2",
        false,
    );
}
#[test]
fn u_luks2_cbc_essiv_detached() {
    ucrypt_to_cs(
        "u_luks2_cbc_essiv_detached",
        2,
        "aes-cbc-essiv:sha256",
        256,
        4096,
        "argon2id",
        true,
    );
}

/// Non-default LUKS2 geometry: 64 KiB metadata copies, a 1 MiB keyslots
/// area and a 2 MiB data offset from cryptsetup; ucrypt opens it, adds a
/// keyslot into the small area, and cryptsetup opens with that keyslot.
#[test]
fn cs_luks2_64k_metadata_small_keyslots_area() {
    if !tools("cryptsetup_to_ucrypt::64k_metadata") {
        return;
    }
    let dir = TempDir::new("luks-64k");
    let dev = dir.join("dev.img");
    let kf = dir.join("key");
    let kf2 = dir.join("key2");
    write_file(&kf, PASS);
    write_file(&kf2, PASS2);
    sparse(&dev, 4 << 20);
    cryptsetup(
        &[
            testutil::FAST_LUKS2_FORMAT,
            &[
                "--luks2-metadata-size",
                "64k",
                "--luks2-keyslots-size",
                "1m",
                "--offset",
                "4096",
                "--label",
                "geo",
                "--key-file",
                kf.to_str().unwrap(),
                dev.to_str().unwrap(),
            ],
        ]
        .concat(),
    );
    let mut vol = luks::Volume::load(&dev, None, &luks::DeviceAccess::default()).unwrap();
    assert_eq!(vol.header().label(), "geo");
    let o = vol.unlock(PASS, None).unwrap();
    assert_eq!(o.payload_offset, 2 << 20);
    assert_eq!(&o.volume_key[..], &cs_volume_key(&dev, None, &kf)[..]);
    let req = KdfRequest {
        kind: "pbkdf2".into(),
        force_iterations: Some(1000),
        ..KdfRequest::default()
    };
    let slot = vol.add_key(&o.volume_key, PASS2, None, &req).unwrap();
    assert_eq!(slot, 1);
    assert_eq!(&cs_volume_key(&dev, None, &kf2)[..], &o.volume_key[..]);
    // The 1 MiB area holds 4 keyslots of 258048 bytes; the 5th is refused.
    for _ in 0..2 {
        vol.add_key(&o.volume_key, b"more", None, &req).unwrap();
    }
    let e = vol.add_key(&o.volume_key, b"more", None, &req).unwrap_err();
    assert_eq!(e.kind(), luks::ErrorKind::SlotBusy, "{e}");
    cryptsetup(&["luksDump", dev.to_str().unwrap()]);
}
