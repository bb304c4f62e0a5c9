//! Fuzz target: arbitrary text as a dm-crypt table line. A line that
//! parses must format back (with keys) to a line that parses to the same
//! table. Thin by design; the parser is `crypto::table::Table::parse`.
#![no_main]
#![forbid(unsafe_code)]

use crypto::table::Table;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let Ok(line) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(t) = Table::parse(line) {
        let again = Table::parse(&t.format(true)).expect("a formatted table parses");
        assert!(again == t, "format/parse round trip changed the table");
        let _ = t.format(false);
    }
});
