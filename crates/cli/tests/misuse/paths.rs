//! Misuse rows: paths ucrypt creates (sockets, mountpoints, runtime
//! files) and volume names.

use crate::harness::{Case, Expect, Outcome, Row};

/// A fixed aes-xts-plain64 key (hex) for plain tables.
const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
                   f0e1d2c3b4a5968778695a4b3c2d1e0fffeeddccbbaa99887766554433221100";

/// `open --type plain --table` arguments for `img` (1 MiB) as `name`.
fn plain_open(img: &str, name: &str, extra: &[&str]) -> Vec<String> {
    let table = format!("0 2048 crypt aes-xts-plain64 {KEY} 0 {img} 0");
    let mut a: Vec<String> = ["open", "--type", "plain", "--table", &table]
        .iter()
        .map(|s| s.to_string())
        .collect();
    a.extend(extra.iter().map(|s| s.to_string()));
    a.extend([img.to_owned(), name.to_owned()]);
    a
}

fn args(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// This area's rows.
pub fn rows() -> Vec<Row> {
    vec![Row {
        what: "vhost-user-blk socket path names a disk image",
        needs: &[],
        expect: Expect::Exit(5, "is not a socket"),
        case: |c: &mut Case| {
            let img = c.image("backing.img", 1 << 20);
            let victim = c.image("vm1.img", 1 << 20);
            c.watch(&img);
            c.watch(&victim);
            let export = format!("vhost-user-blk={}", victim.display());
            let a = plain_open(img.to_str().unwrap(), "v", &["--export", &export]);
            c.served("v");
            c.ucrypt(&args(&a)).into()
        },
    }]
}
