//! `scripts/install.sh` into a scratch root: the installed `ucrypt` runs,
//! `man` finds its pages there through MANPATH, `ucrypt bench` reaches the
//! installed `ucrypt-bench`, and the completions are where bash, zsh and
//! fish look, and the systemd unit is where systemd looks, naming the
//! installed binary. The binaries are the ones this test run built
//! (`--bin-dir`).

use std::path::{Path, PathBuf};
use std::process::Command;

use testutil::TempDir;

/// Installs into a fresh root with `--prefix /usr/local`: the prefix dir.
fn install(root: &Path) -> PathBuf {
    install_with(&["--root".as_ref(), root.as_os_str()]);
    root.join("usr/local")
}

/// Runs `scripts/install.sh ARGS --bin-dir DIR` (the binaries this test
/// run built).
fn install_with(args: &[&std::ffi::OsStr]) {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_ucrypt"))
        .parent()
        .expect("bin dir")
        .to_path_buf();
    let out = Command::new("bash")
        .arg(repo.join("scripts/install.sh"))
        .args(args)
        .arg("--bin-dir")
        .arg(&bin_dir)
        .output()
        .expect("run install.sh");
    assert!(
        out.status.success(),
        "install.sh: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn install_puts_binaries_man_pages_and_completions_in_place() {
    let test = "install_puts_binaries_man_pages_and_completions_in_place";
    if !testutil::require_tool(test, "gzip") {
        return;
    }
    let root = TempDir::new("install");
    let prefix = install(root.path());

    let version = testutil::run_ok(prefix.join("bin/ucrypt").to_str().unwrap(), &["--version"]);
    assert_eq!(
        version.trim(),
        format!("ucrypt {}", env!("CARGO_PKG_VERSION")),
        "{version}"
    );
    // `ucrypt bench` finds the ucrypt-bench installed beside it.
    let help = testutil::run_ok(
        prefix.join("bin/ucrypt").to_str().unwrap(),
        &["bench", "--help"],
    );
    assert!(help.contains("--profile"), "{help}");

    let man8 = prefix.join("share/man/man8");
    for page in ["ucrypt", "ucrypt-open", "ucrypt-format", "ucrypt-bench"] {
        assert!(
            man8.join(format!("{page}.8.gz")).is_file(),
            "no {page}.8.gz"
        );
    }
    for f in [
        "share/bash-completion/completions/ucrypt",
        "share/zsh/site-functions/_ucrypt",
        "share/fish/vendor_completions.d/ucrypt.fish",
    ] {
        let text = std::fs::read_to_string(prefix.join(f)).expect(f);
        assert!(
            text.contains("luksFormat") || text.contains("format"),
            "{f}"
        );
    }

    // The unit, in systemd's unit path for /usr/local, runs the installed
    // binary (the shipped file names /usr/local/bin/ucrypt as well).
    let unit = std::fs::read_to_string(prefix.join("lib/systemd/system/ucrypt@.service"))
        .expect("lib/systemd/system/ucrypt@.service");
    assert!(
        unit.contains(
            "\nExecStart=/usr/local/bin/ucrypt open --crypttab=/etc/crypttab --foreground %I\n"
        ),
        "{unit}"
    );
    assert!(
        unit.contains("\nExecStop=/usr/local/bin/ucrypt close %I\n"),
        "{unit}"
    );

    if !testutil::require_tool(test, "man") {
        return;
    }
    // man-db, as a user would ask for it once /usr/local/share/man is on
    // the manual path: the page's source file, then the page rendered.
    let man = |args: &[&str]| {
        let out = Command::new("man")
            .args(args)
            .env("MANPATH", prefix.join("share/man"))
            .env("MANPAGER", "cat")
            .env("PAGER", "cat")
            .env("MANWIDTH", "80")
            .output()
            .expect("run man");
        assert!(
            out.status.success(),
            "man {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let path = man(&["-w", "ucrypt"]);
    assert_eq!(
        Path::new(path.trim()),
        man8.join("ucrypt.8.gz"),
        "man -w ucrypt"
    );
    let page = man(&["ucrypt"]);
    assert!(page.contains("ucrypt"), "{page}");
    assert!(page.contains("format"), "{page}");
    let page = man(&["ucrypt-bench"]);
    assert!(page.contains("--profile"), "{page}");
}

/// Another prefix: the unit's commands follow it, and systemd itself
/// (`systemd-analyze verify`, which also checks that the commands are
/// executable) accepts an instance of it.
#[test]
fn install_unit_follows_the_prefix_and_systemd_accepts_it() {
    let test = "install_unit_follows_the_prefix_and_systemd_accepts_it";
    if !testutil::require_tool(test, "gzip") {
        return;
    }
    let dir = TempDir::new("install-unit");
    let prefix = dir.join("opt");
    install_with(&["--prefix".as_ref(), prefix.as_os_str()]);
    let unit_path = prefix.join("lib/systemd/system/ucrypt@.service");
    let unit = std::fs::read_to_string(&unit_path).expect("the unit");
    let bin = prefix.join("bin/ucrypt");
    assert!(
        unit.contains(&format!(
            "\nExecStart={} open --crypttab=/etc/crypttab --foreground %I\n",
            bin.display()
        )),
        "{unit}"
    );
    assert!(!unit.contains("/usr/local/"), "{unit}");
    if !testutil::require_tool(test, "systemd-analyze") {
        return;
    }
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(unit_path.with_file_name("ucrypt@vol.service"))
        .output()
        .expect("run systemd-analyze");
    assert!(
        out.status.success(),
        "systemd-analyze verify: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
