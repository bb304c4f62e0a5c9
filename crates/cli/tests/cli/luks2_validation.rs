//! cryptsetup's own LUKS2 metadata validation suite (v2.6.1:
//! `tests/luks2-validation-test` and its 83 header generators: 28 headers
//! that must load, 55 that must be refused), run with ucrypt in
//! cryptsetup's place: the suite calls `$CRYPTSETUP_PATH/cryptsetup
//! luksDump IMG`, here a shim that runs `ucrypt luksDump IMG`.
//!
//! The suite is GPL-2.0-or-later shell, so it is not in this repository:
//! `scripts/fetch-cryptsetup-tests.sh` fetches it from Debian's cryptsetup
//! source package (apt, private deb-src list) into the target directory
//! at test time, once.

use std::path::Path;
use std::process::Command;

const CASES: usize = 83;

#[test]
fn cryptsetup_luks2_validation_suite_agrees() {
    let test = "cryptsetup_luks2_validation_suite_agrees";
    for tool in ["apt-get", "jq", "xz", "dd", "bash"] {
        if !testutil::require_tool(test, tool) {
            return;
        }
    }
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cryptsetup-2.6.1");
    let Some(suite) = testutil::cryptsetup_suite(test, &cache) else {
        return;
    };

    // A private copy: the generators write next to themselves.
    let dir = testutil::TempDir::new("luks2-validation");
    let work = dir.join("tests");
    let cp = Command::new("cp")
        .arg("-r")
        .arg(&suite)
        .arg(&work)
        .status()
        .unwrap();
    assert!(cp.success());
    let shim = dir.join("shim");
    std::fs::create_dir(&shim).unwrap();
    let cs = shim.join("cryptsetup");
    std::fs::write(
        &cs,
        format!(
            "#!/bin/sh\nexec '{}' \"$@\"\n",
            testutil::ucrypt_bin().display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&cs, std::fs::Permissions::from_mode(0o755)).unwrap();

    let out = Command::new("bash")
        .arg("./luks2-validation-test")
        .current_dir(&work)
        .env("CRYPTSETUP_PATH", &shim)
        .env_remove("_DEBUG")
        .env_remove("VALG")
        .output()
        .unwrap();
    let log =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let passed = log.lines().filter(|l| l.ends_with("...OK")).count();
    let failed: Vec<&str> = log
        .lines()
        .filter(|l| l.starts_with("Test image:") && !l.ends_with("...OK"))
        .collect();
    assert!(
        out.status.success() && passed == CASES && failed.is_empty(),
        "ucrypt agrees with cryptsetup's suite on {passed} of {CASES}; disagrees on:\n{}\n\n{log}",
        failed.join("\n")
    );
}
