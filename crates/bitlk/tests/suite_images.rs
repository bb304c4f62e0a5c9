//! cryptsetup 2.6.1's BitLocker images (`tests/bitlk-images.tar.xz`, with
//! `images.conf`: passphrase, recovery password, GUIDs, filesystem UUID
//! and sha256 of the decrypted device per image) through this crate
//! alone: the dump against `cryptsetup bitlkDump`, the volume key from
//! both passwords (and the `.BEK` file) against `cryptsetup bitlkDump
//! --dump-volume-key`, and the whole decrypted device, read through the
//! table [`Metadata::targets`] builds, against the expected sha256. The
//! cli's `bitlk_images` test runs the same images through `ucrypt`.
//!
//! A sample of the images runs by default (one per cipher mode, sector
//! size and protector kind; the cli's test covers all of them through
//! `ucrypt`); `UCRYPT_FULL_SUITES=1` runs every image here too.
//!
//! The images are GPL test data: `scripts/fetch-cryptsetup-tests.sh`
//! fetches them at test time, they are never stored here.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use crypto::table::Target;
use crypto::SectorCrypt;
use sha2::Digest;
use ucrypt_bitlk::{ErrorKind, Metadata};

/// The unpacked `bitlk-images` directory, or `None` (skipped).
fn images(test: &str) -> Option<PathBuf> {
    for tool in ["apt-get", "xz", "tar"] {
        if !testutil::require_tool(test, tool) {
            return None;
        }
    }
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cryptsetup-2.6.1");
    let suite = testutil::cryptsetup_suite(test, &cache)?;
    let dir = cache.join("bitlk-images");
    if !dir.join("images.conf").exists() {
        let st = Command::new("tar")
            .arg("xJf")
            .arg(suite.join("bitlk-images.tar.xz"))
            .arg("-C")
            .arg(&cache)
            .status()
            .expect("tar runs");
        assert!(st.success(), "bitlk-images.tar.xz unpacks");
    }
    Some(dir)
}

/// `images.conf`: section name → key → value.
fn conf(dir: &Path) -> HashMap<String, HashMap<String, String>> {
    let text = std::fs::read_to_string(dir.join("images.conf")).expect("images.conf");
    let mut out: HashMap<String, HashMap<String, String>> = HashMap::new();
    let mut cur = String::new();
    for line in text.lines() {
        let line = line.trim();
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            cur = name.to_owned();
        } else if let Some((k, v)) = line.split_once('=') {
            out.entry(cur.clone())
                .or_default()
                .insert(k.to_owned(), v.to_owned());
        }
    }
    out
}

/// sha256 of the decrypted device, read through the table.
fn decrypted_sha256(img: &Path, m: &Metadata, key: &crypto::Secret) -> String {
    let data = std::fs::read(img).expect("image reads");
    let t = m
        .targets(&img.display().to_string(), data.len() as u64, key)
        .expect("table builds");
    let mut h = sha2::Sha256::new();
    for target in t.targets() {
        let len = (target.len() * 512) as usize;
        match target {
            Target::Zero(_) => h.update(vec![0u8; len]),
            Target::Linear(_) => unreachable!("no linear targets in a BitLocker table"),
            Target::Crypt(c) => {
                let at = (c.offset * 512) as usize;
                let mut buf = data[at..at + len].to_vec();
                SectorCrypt::new(&c.crypt_config())
                    .expect("cipher builds")
                    .decrypt(0, &mut buf);
                h.update(&buf);
            }
        }
    }
    hex::encode(h.finalize())
}

fn cryptsetup(args: &[&str], stdin: Option<&[u8]>) -> std::process::Output {
    testutil::run("cryptsetup", args, stdin)
}

#[test]
fn cryptsetup_bitlk_images() {
    let test = "cryptsetup_bitlk_images";
    let Some(dir) = images(test) else { return };
    let have_cryptsetup = testutil::which("cryptsetup").is_some();
    let conf = conf(&dir);
    let full = std::env::var_os("UCRYPT_FULL_SUITES").is_some_and(|v| v == "1");
    const SAMPLE: [&str; 5] = [
        "bitlk-aes-cbc-128-4k",
        "bitlk-aes-cbc-elephant-128",
        "bitlk-aes-xts-128-eow",
        "bitlk-aes-xts-128-startup-key",
        "bitlk-togo-aes-xts-128",
    ];
    let mut names: Vec<&String> = conf
        .keys()
        .filter(|n| full || SAMPLE.contains(&n.as_str()))
        .collect();
    names.sort();
    let (mut opened, mut refused) = (0, 0);
    for name in names {
        let c = &conf[name];
        let img = dir.join(format!("{name}.img"));
        let path = img.display().to_string();
        let f = std::fs::File::open(&img).expect("image opens");
        let m = Metadata::read(&f, &path).unwrap_or_else(|e| panic!("{name}: {e}"));
        // What bitlk-compat-test checks of the dump, and the whole text
        // against cryptsetup's.
        let dump = m.dump(&path);
        assert!(
            dump.contains(&format!("GUID:         \t{}\n", c["GUID"])),
            "{name}"
        );
        assert_eq!(m.cipher_spec(), c["CIPHER"], "{name}");
        if have_cryptsetup {
            let out = cryptsetup(&["bitlkDump", &path], None);
            assert_eq!(dump, String::from_utf8_lossy(&out.stdout), "{name}: dump");
        }
        let vk = |pass: &[u8]| m.volume_key(pass);
        // As the script's `for PASSPHRASE in $PW $RP`: an empty one is none.
        let pw = c.get("PW").filter(|p| !p.is_empty()).map(String::as_bytes);
        let rp = c.get("RP").filter(|p| !p.is_empty()).map(String::as_bytes);
        if let Err(e) = m.activate_check() {
            // cryptsetup refuses these (encrypt-on-write, clear key).
            assert_eq!(e.kind(), ErrorKind::Unsupported, "{name}: {e}");
            assert!(
                name.contains("eow") || name.contains("clearkey"),
                "{name}: {e}"
            );
            refused += 1;
            continue;
        }
        let mut keys = Vec::new();
        for p in [pw, rp].into_iter().flatten() {
            keys.push(vk(p).unwrap_or_else(|e| panic!("{name}: {e:?}")));
        }
        if let Some(g) = c.get("SK_VMK_GUID") {
            let bek = std::fs::read(dir.join(format!("{}.BEK", g.to_uppercase()))).expect("BEK");
            keys.push(vk(&bek).unwrap_or_else(|e| panic!("{name} (BEK): {e:?}")));
        }
        assert!(!keys.is_empty(), "{name}");
        assert!(
            keys.windows(2).all(|w| w[0][..] == w[1][..]),
            "{name}: same FVEK"
        );
        assert_eq!(keys[0].len(), m.key_len(), "{name}");
        if have_cryptsetup {
            let out = cryptsetup(
                &["bitlkDump", "--dump-volume-key", "-q", &path],
                Some(&[rp.expect("RP"), b"\n"].concat()),
            );
            let theirs = String::from_utf8_lossy(&out.stdout);
            assert_eq!(
                testutil::volume_key_from_dump(&theirs),
                &keys[0][..],
                "{name}: volume key"
            );
            let ours = m.dump_volume_key(&path, &keys[0], None);
            assert_eq!(
                ours.as_str(),
                Some(&*theirs),
                "{name}: --dump-volume-key text"
            );
        }
        assert_eq!(
            decrypted_sha256(&img, &m, &keys[0]),
            c["SHA256SUM"],
            "{name}: decrypted device"
        );
        // A wrong passphrase unwraps nothing (once: each try costs a KDF
        // per VMK).
        if opened == 0 {
            let e = vk(b"wrong").unwrap_err();
            assert_eq!(e.kind(), ErrorKind::WrongKey, "{name}: {e}");
        }
        opened += 1;
    }
    eprintln!("{test}: {opened} images opened, {refused} refused as cryptsetup refuses them");
    assert!(opened >= if full { 12 } else { 4 }, "{opened} opened");
}
