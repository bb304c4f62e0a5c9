//! A LUKS2 volume made by cryptsetup, opened by `ucrypt open --type luks`,
//! an ext4 filesystem made through the FUSE export, closed; the backing bytes
//! decrypted by the independent Python oracle with the volume key from
//! `cryptsetup luksDump --dump-volume-key` are a valid ext4 image holding the
//! files. Also the same volume through NBD with nbdcopy.

use crate::frontends_common;

use std::path::Path;
use std::process::Command;

use frontends_common::{random_bytes, run};
use testutil::{Capability, TempDir};

const MIB: u64 = 1 << 20;

struct Luks {
    dir: TempDir,
    image: std::path::PathBuf,
    pass: std::path::PathBuf,
    name: String,
}

impl Luks {
    fn format(tag: &str, size: u64, extra: &[&str]) -> Luks {
        let dir = TempDir::new(tag);
        std::fs::create_dir_all(dir.join("run")).unwrap();
        let image = dir.join("luks.img");
        std::fs::File::create(&image)
            .unwrap()
            .set_len(size)
            .unwrap();
        let pass = dir.join("pass");
        std::fs::write(&pass, "correct horse battery staple").unwrap();
        run(Command::new("cryptsetup")
            .args([
                "luksFormat",
                "-q",
                "--type",
                "luks2",
                "--cipher",
                "aes-xts-plain64",
                "--key-size",
                "512",
            ])
            .args([
                "--pbkdf",
                "pbkdf2",
                "--pbkdf-force-iterations",
                "1000",
                "--key-file",
            ])
            .arg(&pass)
            .args(extra)
            .arg(&image));
        Luks {
            dir,
            image,
            pass,
            name: format!("l{}", std::process::id()),
        }
    }

    fn ucrypt(&self, args: &[&str]) -> std::process::Output {
        Command::new(testutil::ucrypt_bin())
            .args(args)
            .env("UCRYPT_RUNTIME_DIR", self.dir.join("run"))
            .output()
            .unwrap()
    }

    fn open(&self, export: &str) {
        let o = self.ucrypt(&[
            "open",
            "--type",
            "luks",
            "--key-file",
            &self.pass.display().to_string(),
            "--export",
            export,
            &self.image.display().to_string(),
            &self.name,
        ]);
        assert!(
            o.status.success(),
            "open: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }

    fn close(&self) {
        let o = self.ucrypt(&["close", &self.name]);
        assert!(
            o.status.success(),
            "close: {}",
            String::from_utf8_lossy(&o.stderr)
        );
    }

    /// (volume key hex, payload offset bytes, sector size, cipher) per cryptsetup.
    fn dump(&self) -> (String, u64, u32, String) {
        let o = run(Command::new("cryptsetup")
            .args(["luksDump", "-q", "--dump-volume-key", "--key-file"])
            .arg(&self.pass)
            .arg(&self.image));
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        let mut key = String::new();
        let mut in_key = false;
        for line in text.lines() {
            if let Some(rest) = line
                .split_once("MK dump:")
                .map(|x| x.1)
                .or(line.split_once("Volume key:").map(|x| x.1))
            {
                in_key = true;
                key.extend(rest.split_whitespace());
            } else if in_key
                && line.starts_with(|c: char| c.is_whitespace())
                && !line.trim().is_empty()
            {
                key.extend(line.split_whitespace());
            } else {
                in_key = false;
            }
        }
        let o = run(Command::new("cryptsetup")
            .args(["luksDump", "--dump-json-metadata"])
            .arg(&self.image));
        let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let seg = &j["segments"]["0"];
        let offset: u64 = seg["offset"].as_str().unwrap().parse().unwrap();
        let ss = seg["sector_size"].as_u64().unwrap() as u32;
        (
            key,
            offset,
            ss,
            seg["encryption"].as_str().unwrap().to_owned(),
        )
    }

    /// Decrypts the payload with the Python oracle.
    fn oracle_payload(&self) -> Vec<u8> {
        let (key, offset, ss, cipher) = self.dump();
        assert_eq!(key.len(), 128, "volume key not found in luksDump output");
        let raw = std::fs::read(&self.image).unwrap();
        let payload = self.dir.join("payload.enc");
        std::fs::write(&payload, &raw[offset as usize..]).unwrap();
        let oracle = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/oracle/dmcrypt.py");
        let o = run(Command::new("python3")
            .arg(oracle)
            // LUKS2 IVs count 512-byte sectors even with 4096-byte sectors
            // (cryptsetup sets iv_large_sectors only for plain/BITLK).
            .args([
                "decrypt",
                "--cipher",
                &cipher,
                "--key",
                &key,
                "--sector-size",
                &ss.to_string(),
            ])
            .stdin(std::fs::File::open(&payload).unwrap()));
        o.stdout
    }
}

impl Drop for Luks {
    fn drop(&mut self) {
        let _ = self.ucrypt(&["close", &self.name]);
    }
}

fn tools(test: &str) -> bool {
    ["cryptsetup", "python3", "mkfs.ext4", "fsck.ext4", "debugfs"]
        .iter()
        .all(|t| testutil::require_tool(test, t))
        && testutil::require_python_module(test, "cryptography")
}

#[test]
fn luks2_by_cryptsetup_ext4_through_fuse_decrypts_with_oracle() {
    let test = "luks2_by_cryptsetup_ext4_through_fuse_decrypts_with_oracle";
    let fuse = [Capability::Tool("fusermount3"), Capability::DevFuse];
    if !tools(test) || !testutil::require_all(test, &fuse) {
        return;
    }
    for extra in [
        &["--sector-size", "512"][..],
        &["--sector-size", "4096"][..],
    ] {
        let v = Luks::format("fe-luks", 32 * MIB, extra);
        v.open("fuse");
        let file = v
            .dir
            .join("run")
            .join(format!("{}.fuse", v.name))
            .join(&v.name);
        // Populate the filesystem at mkfs time: no mount needed.
        let tree = v.dir.join("tree");
        std::fs::create_dir_all(tree.join("a/b")).unwrap();
        let data = random_bytes(300_000, 99);
        std::fs::write(tree.join("a/b/data.bin"), &data).unwrap();
        std::fs::write(tree.join("hello.txt"), "hello through ucrypt\n").unwrap();
        run(Command::new("mkfs.ext4")
            .args(["-q", "-F", "-d"])
            .arg(&tree)
            .arg(&file));
        let st = String::from_utf8_lossy(&v.ucrypt(&["status", &v.name]).stdout).into_owned();
        assert!(
            st.contains("type:    LUKS2") && st.contains("aes-xts-plain64"),
            "{st}"
        );
        v.close();

        // Independent check: decrypt with the volume key, then fsck + read files.
        let plain = v.oracle_payload();
        let img = v.dir.join("decrypted.ext4");
        std::fs::write(&img, &plain).unwrap();
        let o = run(Command::new("fsck.ext4").arg("-fn").arg(&img));
        assert!(o.status.success());
        let o = run(Command::new("debugfs")
            .args(["-R", "cat /a/b/data.bin"])
            .arg(&img));
        assert!(
            o.stdout == data,
            "file content differs in the oracle-decrypted image ({extra:?})"
        );
        let o = run(Command::new("debugfs")
            .args(["-R", "cat /hello.txt"])
            .arg(&img));
        assert_eq!(String::from_utf8_lossy(&o.stdout), "hello through ucrypt\n");
    }
}

#[test]
fn luks2_by_cryptsetup_through_nbd_round_trip() {
    if !tools("luks2_through_nbd") || !testutil::require_tool("luks2_through_nbd", "nbdcopy") {
        return;
    }
    let v = Luks::format("fe-luks-nbd", 24 * MIB, &[]);
    v.open("nbd");
    let uri = format!(
        "nbd+unix:///?socket={}",
        v.dir
            .join("run")
            .join(format!("{}.nbd.sock", v.name))
            .display()
    );
    let (_, offset, _, _) = v.dump();
    let size = 24 * MIB - offset;
    let src = v.dir.join("src.raw");
    let data = random_bytes(size as usize, 1234);
    std::fs::write(&src, &data).unwrap();
    run(Command::new("nbdcopy").arg(&src).arg(&uri));
    v.close();
    assert!(
        v.oracle_payload() == data,
        "oracle decryption differs from what was written over NBD"
    );
    // Wrong passphrase: cryptsetup's exit code 2, nothing left running.
    std::fs::write(&v.pass, "wrong").unwrap();
    let o = v.ucrypt(&[
        "open",
        "--key-file",
        &v.pass.display().to_string(),
        &v.image.display().to_string(),
        &v.name,
    ]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(!v.dir.join("run").join(format!("{}.pid", v.name)).exists());
}
