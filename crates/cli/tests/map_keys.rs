//! `map` holds a volume key in the foreground: from the moment it builds
//! the table the process is non-dumpable, as the daemon is. (Its own test
//! binary, apart from the cli's one `cli` binary: dumpability is
//! process-wide.)

use std::io;

use ucrypt_cli::map::{self, Direction, Source};

const KEY: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\
                   f0e1d2c3b4a5968778695a4b3c2d1e0fffeeddccbbaa99887766554433221100";

#[test]
fn map_makes_the_process_non_dumpable_before_it_holds_the_key() {
    let dir = testutil::TempDir::new("cli-map-keys");
    let img = dir.join("vol.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    let line = format!("0 2048 crypt aes-xts-plain64 {KEY} 0 {} 0", img.display());
    assert!(
        nix::sys::prctl::get_dumpable().unwrap(),
        "the test process starts dumpable"
    );
    let source = Source::Table {
        line: &line,
        key_file: None,
        range: Default::default(),
    };
    let table = source.table(Direction::Read, |_| {}).unwrap();
    assert!(
        !nix::sys::prctl::get_dumpable().unwrap(),
        "the table (with its key) was built in a dumpable process"
    );
    let mut out = Vec::new();
    map::map(&table, Direction::Read, &mut io::empty(), None, &mut out).unwrap();
    assert_eq!(out.len(), 1 << 20);
    assert!(!nix::sys::prctl::get_dumpable().unwrap());
}
