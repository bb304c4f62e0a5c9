//! `ucrypt completions SHELL` and `ucrypt man` come from the clap
//! definition: every verb appears, the bash script parses, and the man
//! pages render with `man -l` where man is installed.

use testutil::TempDir;

#[test]
fn completions_name_every_verb_and_parse() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = testutil::run_ok("ucrypt", &["completions", shell]);
        for verb in [
            "format",
            "token",
            "convert-key",
            "erase",
            "repair",
            "open",
            "completions",
        ] {
            assert!(out.contains(verb), "{shell}: no {verb}");
        }
    }
    let dir = TempDir::new("compl");
    let script = dir.join("ucrypt.bash");
    std::fs::write(
        &script,
        testutil::run_ok("ucrypt", &["completions", "bash"]),
    )
    .unwrap();
    let o = testutil::run("bash", &["-n", script.to_str().unwrap()], None);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let o = testutil::run("ucrypt", &["completions", "tcsh"], None);
    assert_eq!(o.status.code(), Some(1), "unknown shell is a usage error");
}

#[test]
fn man_pages_cover_every_verb() {
    let page = testutil::run_ok("ucrypt", &["man"]);
    assert!(
        page.starts_with(".ie") || page.contains(".TH ucrypt 8"),
        "{page}"
    );
    for verb in ["token", "convert", "config", "erase", "repair", "format"] {
        assert!(page.contains(verb), "no {verb} in ucrypt.8");
    }
    let dir = TempDir::new("man");
    let d = dir.join("man8");
    testutil::run_ok("ucrypt", &["man", "--dir", d.to_str().unwrap()]);
    for verb in [
        "token",
        "convert",
        "convert-key",
        "config",
        "erase",
        "repair",
    ] {
        let p = d.join(format!("ucrypt-{verb}.8"));
        let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        assert!(text.contains(&format!(".TH ucrypt-{verb} 8")), "{text}");
    }
    assert!(d.join("ucrypt.8").exists());
}
