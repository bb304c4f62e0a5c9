//! Interop both ways with librbd's own client-side LUKS encryption, on a
//! throwaway single-node cluster (`scripts/ceph-test-cluster.sh`):
//!
//! - an image formatted by `rbd encryption format IMG luks2|luks1 PASSFILE`
//!   and written through librbd's encryption (qemu's rbd driver with
//!   `encrypt.format`) opens in ucrypt with identical plaintext;
//! - an image ucrypt formats and writes reads identically through librbd's
//!   encryption.
//!
//! ucrypt reaches the image two ways: on a file (`rbd export` / `rbd
//! import`, the ciphertext moved byte for byte) and straight from the
//! cluster as `rbd:POOL/IMAGE` through its RBD backend.

use crate::rbd_common;

use std::path::Path;

use rbd_common::{require_ceph, ucrypt, Cluster, Luks};

const MIB: u64 = 1 << 20;
/// Raw image size: room for a 16 MiB LUKS2 header (librbd and ucrypt
/// defaults) and a few MiB of data.
const RAW: u64 = 24 * MIB;

/// Writes `len` seeded random bytes to `path`; returns them.
fn plaintext(path: &Path, len: u64, seed: u64) -> Vec<u8> {
    let data = testutil::random_bytes(len as usize, seed);
    std::fs::write(path, &data).expect("write plaintext");
    data
}

/// ucrypt decrypts the whole mapping of the LUKS volume on `device` (a
/// file, or `rbd:POOL/IMAGE` on cluster `c`).
fn ucrypt_read(c: &Cluster, device: &str, pass: &Path) -> Vec<u8> {
    let pass = pass.display().to_string();
    let conf = c.conf.display().to_string();
    let args = ["--ceph-conf", &conf, "map", "--luks", device, "-d", &pass];
    ucrypt(&[&args[..], &["--read"]].concat(), None).stdout
}

/// ucrypt encrypts the file `plain` onto the LUKS volume on `device`.
fn ucrypt_write(c: &Cluster, device: &str, pass: &Path, plain: &Path) {
    let pass = pass.display().to_string();
    let conf = c.conf.display().to_string();
    let args = ["--ceph-conf", &conf, "map", "--luks", device, "-d", &pass];
    ucrypt(&[&args[..], &["--write"]].concat(), Some(plain));
}

/// (a) librbd formats and writes; ucrypt reads the same plaintext.
fn librbd_to_ucrypt(c: &Cluster, luks: Luks, seed: u64) {
    let name = format!("from-librbd-{}", luks.rbd());
    let pass = c.scratch(&format!("{name}.pass"));
    std::fs::write(&pass, format!("librbd pass {seed}")).unwrap();
    c.create(&name, RAW);
    let pass_s = pass.display().to_string();
    c.rbd(&["encryption", "format", &c.image(&name), luks.rbd(), &pass_s]);
    let size = c.librbd_size(&name, luks, &pass);
    assert!(size > 0 && size < RAW, "{name}: plaintext size {size}");
    let plain_file = c.scratch(&format!("{name}.plain"));
    let plain = plaintext(&plain_file, size, seed);
    c.librbd_write(&name, luks, &pass, &plain_file);
    assert!(
        c.librbd_read(&name, luks, &pass) == plain,
        "{name}: librbd reads back what it wrote"
    );

    // On a file: the exported ciphertext.
    let raw = c.scratch(&format!("{name}.raw"));
    c.export(&name, &raw);
    let dump = ucrypt(&["dump", &raw.display().to_string()], None).stdout;
    let dump = String::from_utf8_lossy(&dump);
    assert!(
        dump.contains("aes-xts-plain64") || dump.contains("xts-plain64"),
        "{dump}"
    );
    let got = ucrypt_read(c, &raw.display().to_string(), &pass);
    assert_eq!(got.len(), plain.len(), "{name}: mapping size");
    assert!(
        got == plain,
        "{name}: ucrypt (file) reads librbd's plaintext"
    );
    let _ = std::fs::remove_file(&raw);

    // Straight from the cluster through ucrypt's RBD backend.
    let dev = c.device(&name);
    let conf = c.conf.display().to_string();
    let dump = ucrypt(&["--ceph-conf", &conf, "dump", &dev], None);
    assert!(String::from_utf8_lossy(&dump.stdout).contains("xts-plain64"));
    let got = ucrypt_read(c, &dev, &pass);
    assert_eq!(got.len(), plain.len(), "{dev}: mapping size");
    assert!(
        got == plain,
        "{dev}: ucrypt (rbd:) reads librbd's plaintext"
    );
}

/// (b) ucrypt formats and writes; librbd's encryption reads the same
/// plaintext. `extra`: ucrypt format options.
fn ucrypt_to_librbd(c: &Cluster, luks: Luks, extra: &[&str], seed: u64) {
    let name = format!("from-ucrypt-{}-{seed}", luks.rbd());
    let pass = c.scratch(&format!("{name}.pass"));
    std::fs::write(&pass, format!("ucrypt pass {seed}")).unwrap();
    let pass_s = pass.display().to_string();
    let conf = c.conf.display().to_string();
    let format_args = |device: &str| {
        let mut a = vec!["--ceph-conf", &conf, "format", "-q", "--type", luks.rbd()];
        // A fast keyslot: this test is about the data, not the KDF.
        a.extend_from_slice(&["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"]);
        a.extend_from_slice(extra);
        a.push(device);
        a.push(&pass_s);
        ucrypt(&a.iter().map(|s| &**s).collect::<Vec<_>>(), None);
    };

    // On a file, then imported.
    let raw = c.scratch(&format!("{name}.raw"));
    std::fs::File::create(&raw).unwrap().set_len(RAW).unwrap();
    let raw_s = raw.display().to_string();
    format_args(&raw_s);
    let size = ucrypt_read(c, &raw_s, &pass).len() as u64;
    let plain_file = c.scratch(&format!("{name}.plain"));
    let plain = plaintext(&plain_file, size, seed);
    ucrypt_write(c, &raw_s, &pass, &plain_file);
    c.import(&raw, &name);
    let _ = std::fs::remove_file(&raw);
    assert_eq!(c.librbd_size(&name, luks, &pass), size, "{name}: size");
    assert!(
        c.librbd_read(&name, luks, &pass) == plain,
        "{name}: librbd reads ucrypt's plaintext (file, imported)"
    );

    // Straight onto the cluster through ucrypt's RBD backend.
    let direct = format!("{name}-rbd");
    c.create(&direct, RAW);
    let dev = c.device(&direct);
    format_args(&dev);
    assert_eq!(
        ucrypt_read(c, &dev, &pass).len() as u64,
        size,
        "{dev}: size"
    );
    ucrypt_write(c, &dev, &pass, &plain_file);
    assert!(
        c.librbd_read(&direct, luks, &pass) == plain,
        "{dev}: librbd reads ucrypt's plaintext (rbd:)"
    );
}

#[test]
fn librbd_encryption_interop_both_ways() {
    let test = "librbd_encryption_interop_both_ways";
    if !require_ceph(test) {
        return;
    }
    let c = Cluster::start("rbd-interop");
    std::thread::scope(|s| {
        let c = &c;
        let cases = [
            s.spawn(move || librbd_to_ucrypt(c, Luks::V2, 1)),
            s.spawn(move || librbd_to_ucrypt(c, Luks::V1, 2)),
            s.spawn(move || ucrypt_to_librbd(c, Luks::V2, &[], 3)),
            s.spawn(move || ucrypt_to_librbd(c, Luks::V2, &["--sector-size", "512"], 4)),
            s.spawn(move || ucrypt_to_librbd(c, Luks::V1, &[], 5)),
        ];
        for h in cases {
            if let Err(e) = h.join() {
                std::panic::resume_unwind(e);
            }
        }
    });
}
