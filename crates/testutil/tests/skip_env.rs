//! The environment side of skips, in its own process with a single test
//! (it sets UCRYPT_SKIP_LOG and UCRYPT_REQUIRE_TOOLS, which no other test in
//! this binary may read at the same time).

use testutil::{require, skip, skip_kernel, Capability};
use ucrypt_testutil as testutil;

#[test]
fn skips_are_logged_and_prerequisites_fail_when_required() {
    let dir = testutil::TempDir::new("testutil-skipenv");
    let log = dir.join("skips.tsv");
    std::env::set_var("UCRYPT_SKIP_LOG", &log);
    std::env::remove_var("UCRYPT_REQUIRE_TOOLS");

    assert!(!skip("short", "a\ttool is missing"));
    assert!(!skip_kernel("short", "no ublk_drv"));
    assert!(!require("short", Capability::Tool("no-such-tool-ucrypt")));
    assert!(require("short", Capability::Tool("sh")));

    // Required: a prerequisite skip fails the test and is not logged as a
    // skip; a kernel skip still skips and is logged.
    std::env::set_var("UCRYPT_REQUIRE_TOOLS", "1");
    let r = std::panic::catch_unwind(|| skip("short", "fio is missing"));
    let msg = r.expect_err("must panic when tools are required");
    let msg = msg.downcast_ref::<String>().unwrap();
    assert!(
        msg.contains("fio is missing and UCRYPT_REQUIRE_TOOLS=1"),
        "{msg}"
    );
    assert!(!skip_kernel("short", "io_uring disabled"));
    std::env::remove_var("UCRYPT_REQUIRE_TOOLS");

    let me = "skip_env::skips_are_logged_and_prerequisites_fail_when_required";
    let got = std::fs::read_to_string(&log).unwrap();
    let want = [
        format!("{me}\ta tool is missing\tprerequisite"),
        format!("{me}\tno ublk_drv\tkernel"),
        format!("{me}\t`no-such-tool-ucrypt` not found on PATH\tprerequisite"),
        format!("{me}\tio_uring disabled\tkernel"),
    ];
    assert_eq!(got.lines().collect::<Vec<_>>(), want, "{got}");
    std::env::remove_var("UCRYPT_SKIP_LOG");
}
