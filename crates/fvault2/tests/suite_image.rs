//! cryptsetup 2.6.1's FileVault 2 image (`tests/fvault2-images.tar.xz`,
//! passphrase and expected values in `fvault2-compat-test`) through this
//! crate: every field the script checks in the dump, the whole dump text
//! against `cryptsetup fvault2Dump`, the volume key the script expects,
//! and a wrong passphrase refused. The cli's `fvault2_image` test opens it
//! through `ucrypt`. GPL test data: fetched at test time, never stored.

use std::path::{Path, PathBuf};
use std::process::Command;

use ucrypt_fvault2::{ErrorKind, Metadata};

fn image(test: &str) -> Option<PathBuf> {
    for tool in ["apt-get", "xz", "tar"] {
        if !testutil::require_tool(test, tool) {
            return None;
        }
    }
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cryptsetup-2.6.1");
    let suite = testutil::cryptsetup_suite(test, &cache)?;
    let img = cache.join("fvault2-images/small");
    if !img.exists() {
        let st = Command::new("tar")
            .arg("xJf")
            .arg(suite.join("fvault2-images.tar.xz"))
            .arg("-C")
            .arg(&cache)
            .status()
            .expect("tar runs");
        assert!(st.success());
    }
    Some(img)
}

#[test]
fn cryptsetup_fvault2_image() {
    let test = "cryptsetup_fvault2_image";
    let Some(img) = image(test) else { return };
    let p = img.display().to_string();
    let f = std::fs::File::open(&img).expect("image opens");
    let m = Metadata::read(&f, &p).unwrap_or_else(|e| panic!("{e}"));
    let dump = m.dump(&p);
    for want in [
        "Physical volume UUID: \tfc52bfae-5a1f-4f9b-b3a6-f33303a0e401\n",
        "Family UUID:          \t33a76caa-1481-4bc5-8d04-1ac1707c19c0\n",
        "Logical volume offset:\t67108864 [bytes]\n",
        "Logical volume size:  \t167772160 [bytes]\n",
        "PBKDF2 iterations:    \t204222\n",
        "PBKDF2 salt:          \t2c 24 9e db 66 63 d6 fb cc 79 05 b7 a4 d7 27 52 \n",
    ] {
        assert!(dump.contains(want), "{want:?} in\n{dump}");
    }
    if testutil::which("cryptsetup").is_some() {
        let theirs = testutil::run("cryptsetup", &["fvault2Dump", &p], None);
        assert_eq!(dump, String::from_utf8_lossy(&theirs.stdout));
    }
    let vk = m.volume_key(b"heslo123").expect("the suite's passphrase");
    assert_eq!(
        vk.iter().map(|b| format!("{b:02x}")).collect::<Vec<_>>().join(" "),
        "20 73 4d 33 89 21 27 74 d7 61 0c 29 d7 32 88 09 16 f3 be 14 c4 b1 2a c7 aa f0 7e 5c cc 77 b3 19"
    );
    let e = m.volume_key(b"heslo124").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::WrongKey);
}
