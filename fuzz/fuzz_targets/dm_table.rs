//! Fuzz target: arbitrary text as a dm-crypt table line and as a whole
//! (multi-target) table. A line or table that parses must format back
//! (with keys) to text that parses to the same value. Thin by design; the
//! parsers are `crypto::table::Table::parse` and `Targets::parse`.
#![no_main]
#![forbid(unsafe_code)]

use crypto::table::{Table, Targets};

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(t) = Table::parse(line) {
        let again = Table::parse(&t.format(true)).expect("a formatted table parses");
        assert!(again == t, "format/parse round trip changed the table");
        let _ = t.format(false);
    }
    if let Ok(t) = Targets::parse(line) {
        let again = Targets::parse(&t.format(true)).expect("a formatted table parses");
        assert!(again == t, "format/parse round trip changed the targets");
        let _ = t.format(false);
    }
});
