//! The misuse matrix: one row per thing a careful user, a hurried operator
//! or a hostile peer does wrong, with the refusal ucrypt must give and a
//! check that nothing was lost.
//!
//! Each [`Row`] sets up a case (image files, devices, a serving daemon),
//! names the files and devices it watches, does the misuse, and expects a
//! refusal: cryptsetup's exit code (or the peer's failure) and a message.
//! Every watched file and device must be byte-for-byte unchanged
//! afterwards (sha256 before and after, with `sha256sum`, an independent
//! tool). A row that needs something this machine lacks (root, loop
//! devices, a tool) is skipped with its reason, as every test here is.
//!
//! The rows live by area in `misuse/*.rs`; [`rows`] gathers them. The
//! whole table's outcomes (what each refusal printed) are written to
//! `misuse-report.txt` in Cargo's test temp dir, and printed when a row
//! fails.

#[path = "misuse/harness.rs"]
mod harness;

#[path = "misuse/devices.rs"]
mod devices;
#[path = "misuse/luks.rs"]
mod luks;
#[path = "misuse/network.rs"]
mod network;
#[path = "misuse/paths.rs"]
mod paths;
#[path = "misuse/reencrypt.rs"]
mod reencrypt;

use harness::Row;

/// Every row of the matrix.
fn rows() -> Vec<Row> {
    let mut rows = Vec::new();
    rows.extend(paths::rows());
    rows.extend(devices::rows());
    rows.extend(network::rows());
    rows.extend(luks::rows());
    rows.extend(reencrypt::rows());
    rows
}

#[test]
fn every_misuse_is_refused_and_loses_nothing() {
    let rows = rows();
    let mut names: Vec<&str> = rows.iter().map(|r| r.what).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), rows.len(), "two rows share a description");
    harness::run_all(&rows);
}
