//! The passphrase prompt on a terminal, as cryptsetup's: `-T`/`--tries`
//! (a passphrase that opens no keyslot is asked for again, up to the tries,
//! 3 by default; a key file gets one try), `-t`/`--timeout`, echo off while
//! typing and back on after. The terminal is a real pty from util-linux's
//! `script`, and each passphrase is typed only once its prompt is shown.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use testutil::TempDir;

const PROMPT: &str = "Enter passphrase for";
const WRONG: &str = "No key available with this passphrase.";

/// A LUKS2 image whose one keyslot opens with "right".
fn image(dir: &TempDir) -> std::path::PathBuf {
    let img = dir.path().join("img");
    std::fs::write(&img, vec![0u8; 20 << 20]).unwrap();
    let key = dir.path().join("key");
    std::fs::write(&key, "right").unwrap();
    let o = Command::new(testutil::ucrypt_bin())
        .args(testutil::FAST_LUKS2_FORMAT)
        .arg("--key-file")
        .arg(&key)
        .arg(&img)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    img
}

/// Shown after the run when the pty's echo is on again.
const ECHO_ON: &str = "tty-echo=on";

/// Runs `ucrypt ARGS` on a pty, typing `typed` one line per prompt (any
/// "Enter passphrase…", "Verify passphrase:", "Are you sure?" or a
/// token's "Please enter … PIN"); returns
/// the exit code and everything the terminal showed, which ends with
/// [`ECHO_ON`] if the run left the terminal's echo on.
pub(crate) fn on_tty(args: &[&str], typed: &[&str]) -> (i32, String) {
    on_tty_with(args, |n, stdin, _| {
        if let Some(line) = typed.get(n) {
            stdin.write_all(format!("{line}\n").as_bytes()).unwrap();
            stdin.flush().unwrap();
        }
    })
}

/// [`on_tty`], calling `at_prompt(n, terminal input, script's pid)` once
/// for each prompt shown (n counts them from 0).
fn on_tty_with(
    args: &[&str],
    mut at_prompt: impl FnMut(usize, &mut std::process::ChildStdin, u32),
) -> (i32, String) {
    let mut line = format!("'{}'", testutil::ucrypt_bin().display());
    for a in args {
        line.push_str(&format!(" '{a}'"));
    }
    line.push_str("; rc=$?; stty -a | tr ' ;' '\\n\\n' | grep -qx echo && echo tty-echo=on");
    line.push_str("; echo \"rc=$rc\"");
    let mut script = Command::new("script");
    crate::signals_common::default_interrupt(&mut script);
    let mut child = script
        .args(["-qec", &line, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn script");
    let shown = Arc::new(Mutex::new(String::new()));
    let reader = {
        let shown = shown.clone();
        let mut out = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = out.read(&mut buf) {
                if n == 0 {
                    break;
                }
                shown
                    .lock()
                    .unwrap()
                    .push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        })
    };
    let mut stdin = child.stdin.take().unwrap();
    let (mut sent, start) = (0, Instant::now());
    loop {
        let text = shown.lock().unwrap().clone();
        if text.contains("rc=") {
            break;
        }
        let prompts: usize = [
            "Enter passphrase",
            "Verify passphrase",
            "Are you sure?",
            "Please enter TPM2 PIN",
        ]
        .iter()
        .map(|p| text.matches(p).count())
        .sum();
        if prompts > sent {
            at_prompt(sent, &mut stdin, child.id());
            sent += 1;
        }
        if start.elapsed() > Duration::from_secs(120) {
            let _ = child.kill();
            panic!("no end after 120 s; the terminal showed: {text}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(stdin);
    child.wait().unwrap();
    reader.join().unwrap();
    let text = shown.lock().unwrap().clone();
    let rc = text
        .split("rc=")
        .nth(1)
        .and_then(|r| r.trim().lines().next())
        .and_then(|r| r.trim().parse().ok())
        .unwrap_or_else(|| panic!("no exit code in: {text}"));
    (rc, text)
}

/// [`on_tty`], checking the exit code is `rc`; returns what the terminal
/// showed.
fn expect_rc(rc: i32, args: &[&str], typed: &[&str]) -> String {
    let (got, text) = on_tty(args, typed);
    assert_eq!(got, rc, "ucrypt {args:?}: {text}");
    text
}

/// A temp dir holding a LUKS2 image whose one keyslot opens with
/// "right", and the image's path; `None` (a logged skip) without `script`.
fn setup(tag: &str) -> Option<(TempDir, String)> {
    if !testutil::require_tool(tag, "script") {
        return None;
    }
    let dir = TempDir::new(tag);
    let img = image(&dir).to_str().unwrap().to_string();
    Some((dir, img))
}

#[test]
fn a_wrong_typed_passphrase_is_asked_again_up_to_three_times() {
    let Some((_dir, img)) = setup("tries") else {
        return;
    };
    let img = img.as_str();
    let text = expect_rc(0, &["open", "--test-passphrase", img], &["a", "b", "right"]);
    assert_eq!(text.matches(PROMPT).count(), 3, "{text}");
    assert_eq!(text.matches(WRONG).count(), 2, "{text}");

    // Three wrong: exit 2 (bad passphrase), and no fourth prompt.
    let text = expect_rc(
        2,
        &["open", "--test-passphrase", img],
        &["a", "b", "c", "right"],
    );
    assert_eq!(text.matches(PROMPT).count(), 3, "{text}");
}

#[test]
fn tries_limits_the_prompts_and_a_key_file_gets_one_try() {
    let Some((dir, img)) = setup("tries-one") else {
        return;
    };
    let img = img.as_str();
    let text = expect_rc(
        2,
        &["-T", "1", "open", "--test-passphrase", img],
        &["a", "right"],
    );
    assert_eq!(text.matches(PROMPT).count(), 1, "{text}");
    // --tries after the verb, on a verb of the luks group: removing a key
    // asks again too.
    let text = expect_rc(
        2,
        &["luksRemoveKey", "--tries", "2", img],
        &["a", "b", "right"],
    );
    assert_eq!(
        text.matches("Enter passphrase to be deleted").count(),
        2,
        "{text}"
    );
    // The slot is still there: the wrong passphrases removed nothing.
    expect_rc(0, &["open", "--test-passphrase", img], &["right"]);

    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "wrong").unwrap();
    let key_file = wrong.to_str().unwrap();
    let text = expect_rc(
        2,
        &["open", "--test-passphrase", "--key-file", key_file, img],
        &["right"],
    );
    assert_eq!(text.matches(PROMPT).count(), 0, "{text}");
}

#[test]
fn a_prompt_times_out_when_nothing_is_typed_and_gives_the_terminal_back() {
    let Some((_dir, img)) = setup("timeout") else {
        return;
    };
    let img = img.as_str();
    // Nothing typed: without the timeout this run would wait for ever
    // (on_tty gives up after 120 s).
    let start = Instant::now();
    let text = expect_rc(1, &["-t", "1", "open", "--test-passphrase", img], &[]);
    assert!(
        text.contains("Error reading passphrase from terminal: nothing typed within 1 s"),
        "{text}"
    );
    assert!(start.elapsed() >= Duration::from_secs(1), "{text}");
    assert_eq!(
        text.matches(PROMPT).count(),
        1,
        "a timeout is not a wrong passphrase: {text}"
    );
    assert!(text.contains(ECHO_ON), "echo left off: {text}");

    // Typed in time (--timeout after the verb): opens, and the typed
    // passphrase never shows.
    let text = expect_rc(
        0,
        &["open", "--timeout", "60", "--test-passphrase", img],
        &["right"],
    );
    assert!(!text.contains("right"), "echoed: {text}");
    assert!(text.contains(ECHO_ON), "echo left off: {text}");
}

#[test]
fn end_of_input_and_an_over_long_line_are_refused_at_the_prompt() {
    let Some((_dir, img)) = setup("prompt-eof") else {
        return;
    };
    let img = img.as_str();
    // Ctrl-D at the prompt.
    let text = expect_rc(1, &["open", "--test-passphrase", img], &["\u{4}"]);
    assert!(
        text.contains("Error reading passphrase from terminal: end of input"),
        "{text}"
    );
    assert_eq!(text.matches(PROMPT).count(), 1, "{text}");
    assert!(text.contains(ECHO_ON), "echo left off: {text}");
    // 600 characters: cryptsetup takes at most 512.
    let long = "x".repeat(600);
    let text = expect_rc(1, &["open", "--test-passphrase", img], &[&long]);
    assert!(
        text.contains("Passphrase is longer than 512 characters"),
        "{text}"
    );
    assert!(text.contains(ECHO_ON), "echo left off: {text}");
}

#[test]
fn format_asks_before_it_overwrites_and_asks_a_new_passphrase_twice() {
    let Some((dir, _)) = setup("format-confirm") else {
        return;
    };
    let img = dir.path().join("new.img");
    std::fs::write(&img, vec![0u8; 20 << 20]).unwrap();
    let img = img.to_str().unwrap();
    let fast = ["--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000"];
    let format = |rc: i32, extra: &[&str], typed: &[&str]| {
        let args: Vec<&str> = [&["luksFormat"][..], extra, &fast, &[img]].concat();
        expect_rc(rc, &args, typed)
    };
    let is_luks = || {
        Command::new(testutil::ucrypt_bin())
            .args(["isLuks", img])
            .stderr(Stdio::null())
            .status()
            .unwrap()
            .success()
    };
    // As cryptsetup: "Are you sure?" first; anything but YES stops it.
    let text = format(1, &[], &["yes"]);
    assert!(text.contains("This will overwrite data on"), "{text}");
    assert!(!is_luks(), "formatted without a YES: {text}");
    // The new passphrase twice; a mismatch is a bad passphrase (exit 2).
    let text = format(2, &[], &["YES", "new", "wen"]);
    assert!(text.contains("Passphrases do not match"), "{text}");
    assert!(!is_luks(), "formatted on a mismatch: {text}");
    format(0, &[], &["YES", "new", "new"]);
    assert!(is_luks());
    expect_rc(0, &["open", "--test-passphrase", img], &["new"]);
    // Batch mode: no question, and the passphrase asked once.
    let text = format(0, &["-q", "--force"], &["other"]);
    assert!(
        !text.contains("Are you sure?") && !text.contains("Verify"),
        "{text}"
    );
    // -y: an opening passphrase is asked twice too.
    let text = expect_rc(
        2,
        &["-y", "open", "--test-passphrase", img],
        &["other", "othre"],
    );
    assert!(text.contains("Passphrases do not match"), "{text}");
    let text = expect_rc(
        0,
        &["open", "-y", "--test-passphrase", img],
        &["other", "other"],
    );
    assert!(text.contains(ECHO_ON), "echo left off: {text}");
}

/// The pid of the first process named `name` under `root` (breadth
/// first, through `/proc/PID/task/PID/children`).
fn descendant_named(root: u32, name: &str) -> Option<u32> {
    let mut todo = vec![root];
    while let Some(pid) = todo.pop() {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if pid != root && comm.trim() == name {
            return Some(pid);
        }
        let kids =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        todo.extend(
            kids.split_whitespace()
                .filter_map(|k| k.parse::<u32>().ok()),
        );
    }
    None
}

#[test]
fn a_signal_at_the_prompt_gives_the_terminal_back() {
    let Some((_dir, img)) = setup("prompt-signal") else {
        return;
    };
    // Echo is off while the prompt waits; each signal that ends the
    // process there (sent to ucrypt alone, so the shell goes on to look
    // at the terminal) must leave it on again, and still end the process
    // as the signal does: exit 128 + the signal's number.
    for (sig, rc) in [("INT", 130), ("TERM", 143), ("HUP", 129)] {
        let (got, text) = on_tty_with(&["open", "--test-passphrase", &img], |n, _, script| {
            assert_eq!(n, 0, "asked again after SIG{sig}");
            let pid = descendant_named(script, "ucrypt").expect("ucrypt under script");
            let ok = Command::new("kill")
                .args([&format!("-{sig}"), &pid.to_string()])
                .status()
                .unwrap()
                .success();
            assert!(ok, "kill -{sig} {pid}");
        });
        assert_eq!(got, rc, "SIG{sig}: {text}");
        assert!(text.contains(ECHO_ON), "SIG{sig} left echo off: {text}");
    }
}
