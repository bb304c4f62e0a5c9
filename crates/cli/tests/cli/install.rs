//! `scripts/install.sh` into a scratch root: the installed `ucrypt` runs,
//! `man` finds its pages there through MANPATH, `ucrypt bench` reaches the
//! installed `ucrypt-bench`, and the completions are where bash, zsh and
//! fish look. The binaries are the ones this test run built (`--bin-dir`).

use std::path::{Path, PathBuf};
use std::process::Command;

use testutil::TempDir;

/// Installs into a fresh root with `--prefix /usr/local`: the prefix dir.
fn install(root: &Path) -> PathBuf {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_ucrypt"))
        .parent()
        .expect("bin dir")
        .to_path_buf();
    let out = Command::new("bash")
        .arg(repo.join("scripts/install.sh"))
        .arg("--root")
        .arg(root)
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
    root.join("usr/local")
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
