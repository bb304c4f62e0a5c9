//! Every skip goes through testutil (so it is logged and honours
//! UCRYPT_REQUIRE_TOOLS): no Rust source in the workspace outside this crate
//! prints its own `SKIP` line.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            if p.file_name().is_some_and(|n| n != "target") {
                rust_files(&p, out);
            }
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn no_test_prints_its_own_skip() {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    let crates = here.parent().unwrap();
    let mut files = Vec::new();
    rust_files(crates, &mut files);
    assert!(
        files.len() > 20,
        "found only {} files under {crates:?}",
        files.len()
    );
    let mut stray = Vec::new();
    for f in files.iter().filter(|f| !f.starts_with(here)) {
        let text = std::fs::read_to_string(f).unwrap();
        for (i, line) in text.lines().enumerate() {
            if ["println!(\"SKIP", "eprintln!(\"SKIP", "eprintln!(\"skip"]
                .iter()
                .any(|p| line.contains(p))
            {
                stray.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
            }
        }
    }
    assert!(
        stray.is_empty(),
        "skip through testutil::require / skip / skip_kernel instead:\n{}",
        stray.join("\n")
    );
}
