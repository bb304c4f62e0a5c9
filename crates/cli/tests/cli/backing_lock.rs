//! Advisory locks on backing files: one file must not be open
//! read-write twice (another `open` under another name, or `map --write`);
//! the second is refused with exit 5 naming the holder and nothing is
//! written, read-only opens share, and the lock goes with the daemon.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use testutil::TempDir;

const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
                   f0e1d2c3b4a5968778695a4b3c2d1e0fffeeddccbbaa99887766554433221100";

struct Rt {
    dir: TempDir,
    img: PathBuf,
    opened: Vec<String>,
}

impl Rt {
    fn new(tag: &str) -> Self {
        let dir = TempDir::new(tag);
        let img = dir.join("vol.img");
        std::fs::File::create(&img)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        Self {
            dir,
            img,
            opened: Vec::new(),
        }
    }

    fn table(&self) -> String {
        format!(
            "0 2048 crypt aes-xts-plain64 {KEY} 0 {} 0",
            self.img.display()
        )
    }

    fn ucrypt(&self, args: &[&str], stdin: &[u8]) -> Output {
        let mut c = Command::new(testutil::ucrypt_bin())
            .args(args)
            .env("UCRYPT_RUNTIME_DIR", self.dir.join("run"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run ucrypt");
        let mut i = c.stdin.take().unwrap();
        let _ = i.write_all(stdin);
        drop(i);
        c.wait_with_output().unwrap()
    }

    fn open(&mut self, name: &str, readonly: bool) -> Output {
        let t = self.table();
        let img = self.img.display().to_string();
        let mut args = vec!["open", "--type", "plain", "--table", &t];
        if readonly {
            args.push("--readonly");
        }
        args.extend_from_slice(&[&img, name]);
        let o = self.ucrypt(&args, b"");
        if o.status.success() {
            self.opened.push(name.into());
        }
        o
    }

    fn close(&mut self, name: &str) {
        let o = self.ucrypt(&["close", name], b"");
        assert!(o.status.success(), "close {name}: {o:?}");
        self.opened.retain(|n| n != name);
    }
}

impl Drop for Rt {
    fn drop(&mut self) {
        for n in std::mem::take(&mut self.opened) {
            let _ = self.ucrypt(&["close", &n], b"");
        }
    }
}

fn assert_busy(o: &Output, img: &Path) {
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(5), "{err}");
    assert!(
        err.contains(&format!("{} is in use (locked by", img.display())),
        "{err}"
    );
}

#[test]
fn second_read_write_open_is_refused_until_the_first_closes() {
    let mut rt = Rt::new("lock-rw");
    let o = rt.open("a", false);
    assert!(o.status.success(), "{o:?}");
    let before = std::fs::read(&rt.img).unwrap();

    let o = rt.open("b", false);
    assert_busy(&o, &rt.img.clone());
    let o = rt.open("c", true);
    assert_busy(&o, &rt.img.clone());
    let t = rt.table();
    let o = rt.ucrypt(&["map", "--write", "--table", &t], &[0x5a; 4096]);
    assert_busy(&o, &rt.img.clone());
    assert_eq!(std::fs::read(&rt.img).unwrap(), before, "nothing written");

    rt.close("a");
    let o = rt.open("b", false);
    assert!(o.status.success(), "after close: {o:?}");
}

#[test]
fn read_only_opens_share() {
    let mut rt = Rt::new("lock-ro");
    for name in ["r1", "r2"] {
        let o = rt.open(name, true);
        assert!(o.status.success(), "{name}: {o:?}");
    }
    let t = rt.table();
    let o = rt.ucrypt(&["map", "--read", "--table", &t], b"");
    assert!(o.status.success(), "map --read: {o:?}");
    assert_eq!(o.stdout.len(), 1 << 20);
    // A writer is refused while readers hold the file.
    let o = rt.ucrypt(&["map", "--write", "--table", &t], &[0x5a; 4096]);
    assert_busy(&o, &rt.img.clone());
}
