//! Shared helpers for the frontends end-to-end tests: a backing image, a
//! runtime directory of its own, and `ucrypt open/close` around them.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use testutil::TempDir;

/// A 512-bit aes-xts-plain64 key (hex), fixed so failures are reproducible.
pub const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
                       f0e1d2c3b4a5968778695a4b3c2d1e0fffeeddccbbaa99887766554433221100";

/// One test volume: image file + private runtime dir.
pub struct Vol {
    pub dir: TempDir,
    pub image: PathBuf,
    pub name: String,
    pub size: u64,
    pub sector_size: u32,
    open: bool,
}

impl Vol {
    /// A zero-filled sparse image of `size` bytes.
    pub fn new(tag: &str, size: u64, sector_size: u32) -> Self {
        Self::new_in(&std::env::temp_dir(), tag, size, sector_size)
    }

    /// [`Vol::new`] with the image under `base` (e.g. /dev/shm, a tmpfs).
    pub fn new_in(base: &std::path::Path, tag: &str, size: u64, sector_size: u32) -> Self {
        let dir = TempDir::new_in(base, tag);
        std::fs::create_dir_all(dir.join("run")).unwrap();
        let image = dir.join("backing.img");
        let f = std::fs::File::create(&image).unwrap();
        f.set_len(size).unwrap();
        Self {
            dir,
            image,
            name: format!("t{}", std::process::id()),
            size,
            sector_size,
            open: false,
        }
    }

    /// The dm table line for this volume.
    pub fn table(&self) -> String {
        let opts = if self.sector_size == 512 {
            String::new()
        } else {
            format!(" 1 sector_size:{}", self.sector_size)
        };
        format!(
            "0 {} crypt aes-xts-plain64 {KEY} 0 {} 0{opts}",
            self.size / 512,
            self.image.display()
        )
    }

    pub fn runtime(&self) -> PathBuf {
        self.dir.join("run")
    }

    /// Runs `ucrypt ARGS` with this volume's runtime dir.
    pub fn ucrypt(&self, args: &[&str]) -> Output {
        Command::new(testutil::ucrypt_bin())
            .args(args)
            .env("UCRYPT_RUNTIME_DIR", self.runtime())
            .output()
            .expect("run ucrypt")
    }

    /// `ucrypt open --table … EXTRA IMAGE NAME`; panics on failure.
    pub fn open(&mut self, extra: &[&str]) -> String {
        let table = self.table();
        let image = self.image.display().to_string();
        let mut args = vec!["open", "--type", "plain", "--table", &table];
        args.extend_from_slice(extra);
        args.push(&image);
        let name = self.name.clone();
        args.push(&name);
        let o = self.ucrypt(&args);
        assert!(
            o.status.success(),
            "open failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        self.open = true;
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    pub fn close(&mut self) {
        let o = self.ucrypt(&["close", &self.name.clone()]);
        assert!(
            o.status.success(),
            "close failed: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        self.open = false;
    }

    pub fn socket(&self) -> PathBuf {
        self.runtime().join(format!("{}.nbd.sock", self.name))
    }

    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket().display())
    }

    pub fn fuse_file(&self) -> PathBuf {
        self.runtime()
            .join(format!("{}.fuse", self.name))
            .join(&self.name)
    }

    pub fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.runtime().join(format!("{}.pid", self.name)))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Decrypts the whole backing image with the independent Python oracle.
    pub fn oracle_decrypt(&self) -> Vec<u8> {
        let oracle = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/oracle/dmcrypt.py");
        let o = Command::new("python3")
            .arg(oracle)
            .args(["decrypt", "--cipher", "aes-xts-plain64", "--key", KEY])
            .args(["--sector-size", &self.sector_size.to_string()])
            .stdin(std::fs::File::open(&self.image).unwrap())
            .output()
            .expect("run oracle");
        assert!(
            o.status.success(),
            "oracle: {}",
            String::from_utf8_lossy(&o.stderr)
        );
        o.stdout
    }
}

impl Drop for Vol {
    fn drop(&mut self) {
        if self.open {
            let _ = self.ucrypt(&["close", &self.name.clone()]);
            if let Some(pid) = self.pid() {
                let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            }
        }
    }
}

/// Runs a command, panicking with its output on failure.
pub use testutil::run_cmd as run;

/// Deterministic pseudo-random bytes from the shared seeded PRNG.
pub use testutil::random_bytes;
