//! Unlocking as Linux hosts do, against the real components: volumes
//! enrolled by `systemd-cryptenroll` to a software TPM2 (`swtpm`, PCRs
//! with and without a PIN) and to a SoftHSM2 PKCS#11 token, and a
//! `luks2-keyring` token made by cryptsetup; ucrypt opens each with
//! `--token-only` and the data is checked through `map`. A PCR extended
//! after enrollment makes the TPM refuse: the token is skipped and the
//! passphrase opens, with systemd's message.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use testutil::{require_all, run, Capability, TempDir};

use crate::nbd_client::{NbdClient, FLAG_SEND_FUA};

const PASS: &[u8] = b"correct horse";

/// A swtpm listening on a free TCP port pair, killed on drop.
struct Swtpm {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl Swtpm {
    /// Stops and starts it again on the same state: the TPM's transient
    /// objects and sessions are gone, as at a reboot. systemd-cryptenroll
    /// 252 leaves a session loaded on a TPM without a resource manager
    /// (swtpm here; the kernel's /dev/tpmrm0 flushes them), and a TPM holds
    /// only 3.
    fn restart(self) -> Swtpm {
        let dir = self.dir.clone();
        drop(self);
        Swtpm::start(&dir)
    }

    fn start(dir: &Path) -> Swtpm {
        let state = dir.join("tpm");
        std::fs::create_dir_all(&state).unwrap();
        for _ in 0..20 {
            let port = free_port_pair();
            let child = Command::new("swtpm")
                .args(["socket", "--tpm2", "--flags", "not-need-init,startup-clear"])
                .arg("--tpmstate")
                .arg(format!("dir={}", state.display()))
                .args(["--server", &format!("type=tcp,port={port}")])
                .args(["--ctrl", &format!("type=tcp,port={}", port + 1)])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn swtpm");
            let mut tpm = Swtpm {
                child,
                port,
                dir: dir.to_path_buf(),
            };
            for _ in 0..100 {
                if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                    return tpm;
                }
                if tpm.child.try_wait().unwrap().is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = tpm.child.kill();
        }
        panic!("swtpm did not start");
    }

    fn device(&self) -> String {
        format!("swtpm:host=127.0.0.1,port={}", self.port)
    }
}

impl Drop for Swtpm {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A port p with p+1 free too (swtpm's server and control ports).
fn free_port_pair() -> u16 {
    loop {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = l.local_addr().unwrap().port();
        if p < u16::MAX && TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
            return p;
        }
    }
}

/// A LUKS2 image (fast PBKDF2 keyslot 0 with [`PASS`]) holding 1 MiB of
/// random data written through ucrypt; returns (image, pass file, data).
fn volume(dir: &TempDir) -> (PathBuf, PathBuf, Vec<u8>) {
    let img = dir.join("vol.img");
    let pass = dir.join("pass");
    std::fs::write(&pass, PASS).unwrap();
    std::fs::File::create(&img)
        .unwrap()
        .set_len(20 << 20)
        .unwrap();
    let (img_s, pass_s) = (img.to_str().unwrap(), pass.to_str().unwrap());
    let out = run(
        "cryptsetup",
        &[
            "luksFormat",
            "-q",
            "--type",
            "luks2",
            "--pbkdf",
            "pbkdf2",
            "--pbkdf-force-iterations",
            "1000",
            img_s,
            pass_s,
        ],
        None,
    );
    assert!(out.status.success(), "{out:?}");
    let mut rng = testutil::Rng::new(36);
    let data = rng.bytes(1 << 20);
    let out = run(
        "ucrypt",
        &["map", "--luks", img_s, "--key-file", pass_s, "--write"],
        Some(&data),
    );
    assert!(out.status.success(), "{out:?}");
    (img, pass, data)
}

/// `ucrypt map --luks IMG --read` with `args`, `env`; the data it reads.
fn read_through_tokens(img: &Path, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut c = Command::new(testutil::ucrypt_bin());
    c.args(["map", "--read", "--token-only", "--luks"])
        .arg(img)
        .args(args)
        .stdin(Stdio::null())
        .env_remove("PIN");
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn enroll(img: &Path, pass: &Path, args: &[&str], env: &[(&str, &str)]) {
    let mut c = Command::new("systemd-cryptenroll");
    c.arg(format!("--unlock-key-file={}", pass.display()))
        .args(args)
        .arg(img)
        .stdin(Stdio::null());
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    assert!(out.status.success(), "systemd-cryptenroll: {out:?}");
}

fn tpm_tools() -> bool {
    require_all(
        "host_unlock tpm2",
        &[
            Capability::Tool("swtpm"),
            Capability::Tool("systemd-cryptenroll"),
            Capability::Tool("cryptsetup"),
            Capability::Tool("tpm2_pcrextend"),
        ],
    )
}

#[test]
fn tpm2_pcr_token_opens_without_and_with_pin() {
    if !tpm_tools() {
        return;
    }
    let dir = TempDir::new("tok-tpm2");
    let tpm = Swtpm::start(dir.path());
    let (img, pass, data) = volume(&dir);
    let dev = format!("--tpm2-device={}", tpm.device());
    enroll(&img, &pass, &[&dev, "--tpm2-pcrs=7"], &[]);
    enroll(
        &img,
        &pass,
        &[&dev, "--tpm2-pcrs=0+7", "--tpm2-with-pin=yes"],
        &[("NEWPIN", "4711")],
    );
    let tpm = tpm.restart();
    let dev = format!("--tpm2-device={}", tpm.device());

    // Token 0: PCR 7, no PIN.
    let out = read_through_tokens(&img, &[&dev, "-v", "--token-id", "0"], &[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(&out.stdout[..data.len()], &data[..]);

    // Token 1: PCRs 0+7 and a PIN, from $PIN and from a file.
    let out = read_through_tokens(&img, &[&dev, "--token-id", "1"], &[("PIN", "4711")]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(&out.stdout[..data.len()], &data[..]);
    let pin = dir.join("pin");
    std::fs::write(&pin, "4711\n").unwrap();
    let pin_arg = format!("--token-pin-file={}", pin.display());
    let out = read_through_tokens(
        &img,
        &[&dev, "-v", "--token-type", "systemd-tpm2", &pin_arg],
        &[],
    );
    assert!(out.status.success(), "{out:?}");

    // A PIN typed at the terminal: a wrong one is asked again, each
    // counting as one of --tries (crypttab's tries=), as systemd-cryptsetup
    // counts them. Two wrong PINs in all: swtpm locks a key out at three.
    if testutil::require_tool(
        "tpm2_pcr_token_opens_without_and_with_pin typed PIN",
        "script",
    ) {
        let img_s = img.display().to_string();
        let args = |tries: &'static str| {
            vec![
                "open",
                "--test-passphrase",
                "--token-only",
                "--token-id",
                "1",
                "--tries",
                tries,
            ]
        };
        let mut a = args("2");
        a.extend([dev.as_str(), img_s.as_str()]);
        let (rc, shown) = crate::prompt::on_tty(&a, &["0000", "4711"]);
        assert_eq!(rc, 0, "{shown}");
        assert_eq!(shown.matches("Please enter TPM2 PIN").count(), 2, "{shown}");
        let mut a = args("1");
        a.extend([dev.as_str(), img_s.as_str()]);
        let (rc, shown) = crate::prompt::on_tty(&a, &["0000", "4711"]);
        assert_eq!(rc, 2, "{shown}");
        assert_eq!(shown.matches("Please enter TPM2 PIN").count(), 1, "{shown}");
    }

    // A wrong PIN: that token fails, no passphrase is asked (exit 2).
    let out = read_through_tokens(&img, &[&dev, "--token-id", "1", "-v"], &[("PIN", "0000")]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("No usable token is available."), "{err}");
    assert!(err.contains("Token 1 (systemd-tpm2) failed"), "{err}");
    assert!(out.stdout.len() < data.len(), "no data read");
}

#[test]
fn tpm2_changed_pcr_falls_back_to_the_passphrase() {
    if !tpm_tools() {
        return;
    }
    let dir = TempDir::new("tok-pcr");
    let tpm = Swtpm::start(dir.path());
    let (img, pass, _) = volume(&dir);
    let dev = format!("--tpm2-device={}", tpm.device());
    enroll(&img, &pass, &[&dev, "--tpm2-pcrs=7"], &[]);
    let tpm = tpm.restart();
    let dev = format!("--tpm2-device={}", tpm.device());
    let before = std::fs::read(&img).unwrap();
    let out = Command::new("tpm2_pcrextend")
        .arg(format!("7:sha256={}", "ab".repeat(32)))
        .env("TPM2TOOLS_TCTI", tpm.device())
        .output()
        .unwrap();
    assert!(out.status.success(), "tpm2_pcrextend: {out:?}");

    let img_s = img.to_str().unwrap();
    let out = run(
        "ucrypt",
        &["open", "--test-passphrase", "--token-only", &dev, img_s],
        None,
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");

    // Without --token-only the token is skipped in systemd's words and the
    // passphrase (one line of stdin here) opens.
    let mut line = PASS.to_vec();
    line.push(b'\n');
    let out = run(
        "ucrypt",
        &["open", "-v", "--test-passphrase", &dev, img_s],
        Some(&line),
    );
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("No TPM2 metadata matching the current system state found in LUKS2 header, falling back to traditional unlocking."),
        "{err}"
    );
    assert!(
        err.contains("Current policy digest does not match"),
        "{err}"
    );
    assert_eq!(std::fs::read(&img).unwrap(), before, "nothing written");
}

#[test]
fn tpm2_token_needs_its_tpm() {
    if !tpm_tools() {
        return;
    }
    let dir = TempDir::new("tok-notpm");
    let tpm = Swtpm::start(dir.path());
    let (img, pass, _) = volume(&dir);
    enroll(
        &img,
        &pass,
        &[&format!("--tpm2-device={}", tpm.device()), "--tpm2-pcrs=7"],
        &[],
    );
    // Another TPM (a fresh state) has another primary key: the blob does
    // not load there.
    let other_dir = TempDir::new("tok-notpm-other");
    let other = Swtpm::start(other_dir.path());
    let dev = format!("--tpm2-device={}", other.device());
    let out = read_through_tokens(&img, &[&dev, "-v"], &[]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Token 0 (systemd-tpm2) failed"), "{err}");
    // No TPM at all: a closed port.
    let dead = format!(
        "--tpm2-device=swtpm:host=127.0.0.1,port={}",
        free_port_pair()
    );
    let out = read_through_tokens(&img, &[&dead, "-v"], &[]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

/// crypttab's `tpm2-device=auto` with `token-timeout=`: with no TPM2 on
/// this machine the token waits for one as systemd-cryptsetup does, gives
/// up at the timeout in systemd's words, and the passphrase opens; a line
/// without `tpm2-device=` does not wait.
#[test]
fn crypttab_token_timeout_waits_for_the_tpm_then_asks() {
    let test = "crypttab_token_timeout_waits_for_the_tpm_then_asks";
    if !tpm_tools() {
        return;
    }
    if std::fs::read_dir("/sys/class/tpmrm").is_ok_and(|mut d| d.next().is_some()) {
        testutil::skip(
            test,
            "this machine has a TPM2 (/sys/class/tpmrm): nothing to wait for",
        );
        return;
    }
    let dir = TempDir::new("tok-timeout");
    let tpm = Swtpm::start(dir.path());
    let (img, pass, _) = volume(&dir);
    enroll(
        &img,
        &pass,
        &[&format!("--tpm2-device={}", tpm.device()), "--tpm2-pcrs=7"],
        &[],
    );
    let pid = std::process::id();
    let ct = dir.join("crypttab");
    std::fs::write(
        &ct,
        format!(
            "tt-wait-{pid} {img} - tpm2-device=auto,token-timeout=1\n\
             tt-nowait-{pid} {img} - token-timeout=1\n",
            img = img.display()
        ),
    )
    .unwrap();
    let ct_arg = format!("--crypttab={}", ct.display());
    let mut line = PASS.to_vec();
    line.push(b'\n');
    let name = format!("tt-wait-{pid}");
    let out = run(
        "ucrypt",
        &["open", "--test-passphrase", &ct_arg, &name],
        Some(&line),
    );
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    let waited = err.contains(&format!(
        "TPM2 device not present for unlocking {name}, waiting for it to become available."
    )) && err.contains(
        "Timed out waiting for security device, aborting security device based authentication attempt.",
    );
    // An EFI machine whose firmware saw no TPM2 does not wait (systemd's check).
    let efi_without_tpm =
        err.contains("No TPM2 hardware discovered and EFI firmware does not see it either");
    assert!(waited || efi_without_tpm, "{err}");

    let out = run(
        "ucrypt",
        &[
            "open",
            "--test-passphrase",
            &ct_arg,
            &format!("tt-nowait-{pid}"),
        ],
        Some(&line),
    );
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("waiting"), "{err}");
}

fn softhsm_tools(test: &str) -> bool {
    require_all(
        test,
        &[
            Capability::Tool("softhsm2-util"),
            Capability::Tool("pkcs11-tool"),
            Capability::Tool("openssl"),
            Capability::Tool("systemd-cryptenroll"),
            Capability::Tool("cryptsetup"),
        ],
    )
}

/// SoftHSM2's module on this machine.
fn softhsm_module() -> &'static str {
    [
        "/usr/lib/softhsm/libsofthsm2.so",
        "/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so",
    ]
    .into_iter()
    .find(|p| Path::new(p).exists())
    .expect("libsofthsm2.so")
}

/// A SoftHSM2 configuration `dir/NAME.conf` whose tokens live in
/// `dir/NAME/` (empty); returns the configuration's path.
fn softhsm_conf(dir: &Path, name: &str) -> String {
    let tokens = dir.join(name);
    std::fs::create_dir_all(&tokens).unwrap();
    let conf = dir.join(format!("{name}.conf"));
    std::fs::write(
        &conf,
        format!(
            "directories.tokendir = {}\nobjectstore.backend = file\nlog.level = ERROR\n",
            tokens.display()
        ),
    )
    .unwrap();
    conf.to_str().unwrap().to_string()
}

/// Initialises token `ucrypt` (PIN 1234) under `conf` and imports the key
/// pair and certificate `dir/k.der`, `dir/c.der` (made once by
/// [`softhsm_key`]).
fn softhsm_token(dir: &Path, conf: &str) {
    let module = softhsm_module();
    sh_in(
        dir,
        &format!(
            "softhsm2-util --init-token --free --label ucrypt --pin 1234 --so-pin 0000 >/dev/null \
             && pkcs11-tool --module {module} --token-label ucrypt --login --pin 1234 --write-object k.der --type privkey --id 01 --label k >/dev/null \
             && pkcs11-tool --module {module} --token-label ucrypt --login --pin 1234 --write-object c.der --type cert --id 01 --label k >/dev/null"
        ),
        &[("SOFTHSM2_CONF", conf)],
    );
}

/// An RSA key and its self-signed certificate in `dir` (k.der, c.der).
fn softhsm_key(dir: &Path) {
    sh_in(
        dir,
        "openssl req -x509 -newkey rsa:2048 -nodes -keyout k.pem -out c.pem -subj /CN=ucrypt -days 2 2>/dev/null \
         && openssl pkcs8 -topk8 -nocrypt -in k.pem -outform DER -out k.der \
         && openssl x509 -in c.pem -outform DER -out c.der",
        &[],
    );
}

#[test]
fn pkcs11_token_on_softhsm_opens() {
    if !softhsm_tools("host_unlock pkcs11") {
        return;
    }
    let dir = TempDir::new("tok-p11");
    let (img, pass, data) = volume(&dir);
    let module = softhsm_module();
    let conf_s = softhsm_conf(dir.path(), "softhsm");
    softhsm_key(dir.path());
    softhsm_token(dir.path(), &conf_s);
    enroll(
        &img,
        &pass,
        &["--pkcs11-token-uri=pkcs11:token=ucrypt"],
        &[("PIN", "1234"), ("SOFTHSM2_CONF", &conf_s)],
    );

    // Through p11-kit's proxy (softhsm2 is registered with p11-kit) and
    // through the module named.
    let out = read_through_tokens(&img, &[], &[("PIN", "1234"), ("SOFTHSM2_CONF", &conf_s)]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(&out.stdout[..data.len()], &data[..]);
    let m = format!("--pkcs11-module={module}");
    let out = read_through_tokens(&img, &[&m], &[("PIN", "1234"), ("SOFTHSM2_CONF", &conf_s)]);
    assert!(out.status.success(), "{out:?}");

    let out = read_through_tokens(
        &img,
        &["-v"],
        &[("PIN", "9999"), ("SOFTHSM2_CONF", &conf_s)],
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Token 0 (systemd-pkcs11) failed"), "{err}");
}

#[test]
fn keyring_token_reads_the_session_keyring() {
    if !require_all(
        "host_unlock keyring",
        &[Capability::Tool("keyctl"), Capability::Tool("cryptsetup")],
    ) {
        return;
    }
    let dir = TempDir::new("tok-keyring");
    let (img, _, data) = volume(&dir);
    let img_s = img.to_str().unwrap();
    let desc = format!("ucrypt-test-{}", std::process::id());
    let out = run(
        "cryptsetup",
        &["token", "add", "--key-description", &desc, img_s],
        None,
    );
    assert!(out.status.success(), "{out:?}");
    let bin = testutil::ucrypt_bin();
    // A session keyring of its own, holding the passphrase.
    let script = format!(
        "keyctl add user {desc} '{}' @s >/dev/null && exec {} map --read --token-only --token-type luks2-keyring --luks {img_s}",
        String::from_utf8_lossy(PASS),
        bin.display()
    );
    let out = Command::new("keyctl")
        .args(["session", "-", "sh", "-ec", &script])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(&out.stdout[..data.len()], &data[..]);
    // Without the key in the keyring: no usable token.
    let script = format!(
        "exec {} open --test-passphrase --token-only {img_s}",
        bin.display()
    );
    let out = Command::new("keyctl")
        .args(["session", "-", "sh", "-ec", &script])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

/// `ucrypt open --crypttab=FILE NAME` with crypttab's options: LUKS with a
/// key file range, the flags, ucrypt's export options; plain with its
/// cipher options; an unknown option warned; a bad line named.
#[test]
fn crypttab_lines_open_with_their_options() {
    if !require_all("host_unlock crypttab", &[Capability::Tool("cryptsetup")]) {
        return;
    }
    let dir = TempDir::new("crypttab");
    let (img, _, _) = volume(&dir);
    let kf = dir.join("keyfile");
    let mut key = b"skip".to_vec();
    key.extend_from_slice(PASS);
    key.extend_from_slice(&[b'z'; 60]);
    std::fs::write(&kf, &key).unwrap();
    let (img_s, kf_s, d) = (
        img.to_str().unwrap(),
        kf.to_str().unwrap(),
        dir.path().display(),
    );
    let ct = dir.join("crypttab");
    let pid = std::process::id();
    std::fs::write(
        &ct,
        format!(
            "# volumes\n\
             ct-luks-{pid} {img_s} {kf_s} luks,keyfile-offset=4,keyfile-size={},discard,readonly,no-read-workqueue,no-write-workqueue,same-cpu-crypt,submit-from-crypt-cpus,frobnicate,nofail,x-ucrypt.export=nbd={d}/l.sock,x-ucrypt.mode=classic\n\
             ct-plain-{pid} {img_s} {kf_s} plain,cipher=aes-xts-plain64,size=512,offset=8,skip=16,sector-size=4096,x-ucrypt.export=nbd={d}/p.sock\n\
             ct-wrong-{pid} {img_s} {kf_s} luks,keyfile-size=3\n\
             ct-bad-{pid} {img_s} - tries=many\n",
            PASS.len()
        ),
    )
    .unwrap();
    let ct_arg = format!("--crypttab={}", ct.display());

    let name = format!("ct-luks-{pid}");
    let out = run("ucrypt", &["open", &ct_arg, &name], None);
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "Encountered unknown {} option 'frobnicate', ignoring.",
            ct.display()
        )),
        "{err}"
    );
    let table = run("ucrypt", &["table", &name], None);
    let status = run("ucrypt", &["status", &name], None);
    let _ = run("ucrypt", &["close", &name], None);
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    for flag in [
        "allow_discards",
        "same_cpu_crypt",
        "submit_from_crypt_cpus",
        "no_read_workqueue",
        "no_write_workqueue",
    ] {
        assert!(table.contains(flag), "{flag}: {table}");
    }
    let status = String::from_utf8_lossy(&status.stdout).into_owned();
    assert!(
        status.contains("mode:    readonly")
            || status.contains("read-only")
            || status.contains("readonly"),
        "{status}"
    );
    assert!(status.contains("data path: classic"), "{status}");
    assert!(status.contains(&format!("{d}/l.sock")), "{status}");

    let name = format!("ct-plain-{pid}");
    let out = run("ucrypt", &["open", &ct_arg, &name], None);
    assert!(out.status.success(), "{out:?}");
    let table = run("ucrypt", &["table", &name], None);
    let _ = run("ucrypt", &["close", &name], None);
    let table = String::from_utf8_lossy(&table.stdout).into_owned();
    // cipher, a 512-bit key, IV offset 16, data at sector 8, 4 KiB sectors.
    assert!(table.contains(" crypt aes-xts-plain64 "), "{table}");
    assert!(table.contains(&format!(" 16 {img_s} 8 ")), "{table}");
    assert!(table.contains("sector_size:4096"), "{table}");

    // The key file range opens nothing: a wrong passphrase (exit 2).
    let out = run(
        "ucrypt",
        &[
            "open",
            "--test-passphrase",
            &ct_arg,
            &format!("ct-wrong-{pid}"),
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let out = run("ucrypt", &["open", &ct_arg, &format!("ct-bad-{pid}")], None);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}:5: option tries= needs a number", ct.display())),
        "{err}"
    );
    let out = run("ucrypt", &["open", &ct_arg, "ct-absent"], None);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}

/// A crypttab in `dir` with one line, `TAG-PID` serving `img` (key file
/// `pass`) over NBD on `dir/nbd.sock`: (the socket, the crypttab, the name).
fn nbd_crypttab(dir: &TempDir, img: &Path, pass: &Path, tag: &str) -> (PathBuf, PathBuf, String) {
    let sock = dir.join("nbd.sock");
    let ct = dir.join("crypttab");
    let name = format!("{tag}-{}", std::process::id());
    std::fs::write(
        &ct,
        format!(
            "{name} {} {} x-ucrypt.export=nbd={}\n",
            img.display(),
            pass.display(),
            sock.display()
        ),
    )
    .unwrap();
    (sock, ct, name)
}

/// The foreground daemon under a notify-aware supervisor (a unix datagram
/// listener standing in for systemd): READY=1 comes once the NBD export
/// answers, STOPPING=1 when `close` begins, with STATUS= text.
#[test]
fn foreground_daemon_notifies_readiness_and_stopping() {
    if !require_all("host_unlock sd_notify", &[Capability::Tool("cryptsetup")]) {
        return;
    }
    use std::io::Read;
    use std::os::unix::net::{UnixDatagram, UnixStream};

    let dir = TempDir::new("notify");
    let (img, pass, _) = volume(&dir);
    let (sock, ct, name) = nbd_crypttab(&dir, &img, &pass, "notify");
    let notify = dir.join("notify.sock");
    let listener = UnixDatagram::bind(&notify).unwrap();
    listener
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut daemon = Command::new(testutil::ucrypt_bin())
        .args(["open", "--foreground"])
        .arg(format!("--crypttab={}", ct.display()))
        .arg(&name)
        .env("NOTIFY_SOCKET", &notify)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut buf = [0u8; 4096];
    let n = listener.recv(&mut buf).expect("READY within 60 s");
    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(msg.lines().any(|l| l == "READY=1"), "{msg}");
    assert!(
        msg.contains(&format!("STATUS={name}: serving NBD")),
        "{msg}"
    );
    assert!(msg.contains(&format!("MAINPID={}", daemon.id())), "{msg}");
    // Ready means the export answers now: the NBD server's greeting.
    let mut s = UnixStream::connect(&sock).expect("export accepts at READY");
    let mut magic = [0u8; 8];
    s.read_exact(&mut magic).unwrap();
    assert_eq!(&magic, b"NBDMAGIC");
    drop(s);

    let out = run("ucrypt", &["close", &name], None);
    assert!(out.status.success(), "{out:?}");
    let n = listener.recv(&mut buf).expect("STOPPING");
    let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
    assert!(msg.lines().any(|l| l == "STOPPING=1"), "{msg}");
    let status = daemon.wait().unwrap();
    assert!(status.success(), "{status:?}");
}

/// Runs a shell script in `dir` with `env`; panics with its output when
/// it fails; returns its stdout.
fn sh_in(dir: &Path, script: &str, env: &[(&str, &str)]) -> Vec<u8> {
    let mut c = Command::new("sh");
    c.args(["-ec", script]).current_dir(dir);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().unwrap();
    assert!(out.status.success(), "{script}: {out:?}");
    out.stdout
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The signature JSON `systemd-measure sign` would write for PCR 11 (SHA-256
/// bank) holding `pcr11`, signed with `dir/KEY.pem` and naming the public
/// key of `dir/PUB.pem`: TPM2_PolicyPCR's digest computed here (from an
/// empty policy: PolicyPCR's command code, the PCR selection, the hash of
/// the PCR's value), signed by openssl (RSASSA-PKCS1-v1_5 over its SHA-256).
fn pcr11_signature(dir: &Path, pcr11: &[u8], key: &str, public: &str) -> String {
    let sha = |data: &[u8]| -> Vec<u8> {
        std::fs::write(dir.join("in.bin"), data).unwrap();
        sh_in(dir, "openssl dgst -sha256 -binary in.bin", &[])
    };
    let mut pre = vec![0u8; 32];
    pre.extend_from_slice(&0x17fu32.to_be_bytes()); // TPM_CC_PolicyPCR
    pre.extend_from_slice(&1u32.to_be_bytes()); // one bank
    pre.extend_from_slice(&0x000bu16.to_be_bytes()); // SHA-256
    pre.extend_from_slice(&[3, 0x00, 0x08, 0x00]); // PCR 11
    pre.extend_from_slice(&sha(pcr11));
    let policy = sha(&pre);
    std::fs::write(dir.join("pol.bin"), &policy).unwrap();
    let sig = sh_in(
        dir,
        &format!("openssl dgst -sha256 -sign {key}.pem pol.bin | openssl base64 -A"),
        &[],
    );
    let der = sh_in(
        dir,
        &format!("openssl rsa -pubin -in {public}.pem -RSAPublicKey_out -outform DER 2>/dev/null"),
        &[],
    );
    format!(
        r#"{{"sha256":[{{"pcrs":[11],"pkfp":"{}","pol":"{}","sig":"{}"}}]}}"#,
        hex(&sha(&der)),
        hex(&policy),
        String::from_utf8(sig).unwrap().trim()
    )
}

/// Signed PCR policies as systemd 252 makes them: `systemd-cryptenroll
/// --tpm2-public-key` (one token with the signed PCR 11 alone, one adding
/// PCR 7 and a PIN), unlocked with a signature JSON for the TPM's current
/// PCR 11; the TPM checks the signature (VerifySignature) and the policy.
/// A signature for another PCR 11 state, another key's signature, a forged
/// entry and a missing file each skip the token (passphrase fallback, in
/// systemd's words); crypttab's `tpm2-signature=` reaches the unlock.
#[test]
fn tpm2_signed_pcr_policy_opens_with_a_signature() {
    if !tpm_tools()
        || !require_all(
            "host_unlock tpm2 signed policy",
            &[
                Capability::Tool("openssl"),
                Capability::Tool("tpm2_pcrread"),
            ],
        )
    {
        return;
    }
    let dir = TempDir::new("tok-signed");
    let d = dir.path();
    sh_in(
        d,
        "for k in key other; do \
           openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out $k.pem 2>/dev/null; \
           openssl pkey -in $k.pem -pubout -out $k.pub.pem; done",
        &[],
    );
    let tpm = Swtpm::start(d);
    let extend = |tpm: &Swtpm, value: &str| {
        let out = Command::new("tpm2_pcrextend")
            .arg(format!("11:sha256={value}"))
            .env("TPM2TOOLS_TCTI", tpm.device())
            .output()
            .unwrap();
        assert!(out.status.success(), "tpm2_pcrextend: {out:?}");
    };
    // A measured PCR 11, so that systemd picks the SHA-256 bank.
    extend(&tpm, &"11".repeat(32));
    let (img, pass, data) = volume(&dir);
    let dev = format!("--tpm2-device={}", tpm.device());
    let pubkey = format!("--tpm2-public-key={}", d.join("key.pub.pem").display());
    enroll(
        &img,
        &pass,
        &[&dev, &pubkey, "--tpm2-public-key-pcrs=11"],
        &[],
    );
    enroll(
        &img,
        &pass,
        &[
            &dev,
            &pubkey,
            "--tpm2-public-key-pcrs=11",
            "--tpm2-pcrs=7",
            "--tpm2-with-pin=yes",
        ],
        &[("NEWPIN", "4711")],
    );
    let tpm = tpm.restart();
    let dev = format!("--tpm2-device={}", tpm.device());
    let zero = vec![0u8; 32];
    extend(&tpm, &"5a".repeat(32));
    let out = Command::new("tpm2_pcrread")
        .args(["sha256:11", "-o", "pcr11.bin"])
        .current_dir(d)
        .env("TPM2TOOLS_TCTI", tpm.device())
        .output()
        .unwrap();
    assert!(out.status.success(), "tpm2_pcrread: {out:?}");
    let pcr11 = std::fs::read(d.join("pcr11.bin")).unwrap();
    assert_eq!(pcr11.len(), 32);
    assert_ne!(pcr11, zero);

    let write = |name: &str, json: String| {
        let p = d.join(name);
        std::fs::write(&p, json).unwrap();
        format!("--tpm2-signature={}", p.display())
    };
    let good = write("good.json", pcr11_signature(d, &pcr11, "key", "key.pub"));
    let stale = write("stale.json", pcr11_signature(d, &zero, "key", "key.pub"));
    let other = write(
        "other.json",
        pcr11_signature(d, &pcr11, "other", "other.pub"),
    );
    let forged = write(
        "forged.json",
        pcr11_signature(d, &pcr11, "other", "key.pub"),
    );
    let missing = format!("--tpm2-signature={}", d.join("absent.json").display());

    // Token 0: the signed PCR 11 policy alone.
    let out = read_through_tokens(&img, &[&dev, &good, "-v", "--token-id", "0"], &[]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(&out.stdout[..data.len()], &data[..]);
    // Token 1: signed PCR 11, literal PCR 7 and the PIN.
    let out = read_through_tokens(&img, &[&dev, &good, "--token-id", "1"], &[("PIN", "4711")]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(&out.stdout[..data.len()], &data[..]);
    let out = read_through_tokens(
        &img,
        &[&dev, &good, "--token-id", "1", "-v"],
        &[("PIN", "0000")],
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");

    // Each bad signature: the token is skipped, the passphrase opens.
    let before = std::fs::read(&img).unwrap();
    let img_s = img.to_str().unwrap();
    let mut line = PASS.to_vec();
    line.push(b'\n');
    for (sig, why) in [
        (
            &stale,
            "Couldn't find signature for this PCR bank, PCR index and public key.",
        ),
        (
            &other,
            "Couldn't find signature for this PCR bank, PCR index and public key.",
        ),
        (&forged, "Failed to validate signature in TPM"),
        (&missing, "Failed to find TPM PCR signature file"),
    ] {
        let out = read_through_tokens(&img, &[&dev, sig, "--token-id", "0"], &[]);
        assert_eq!(out.status.code(), Some(2), "{sig}: {out:?}");
        let out = run(
            "ucrypt",
            &[
                "open",
                "-v",
                "--test-passphrase",
                "--token-id",
                "0",
                &dev,
                sig,
                img_s,
            ],
            Some(&line),
        );
        assert!(out.status.success(), "{sig}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("Token 0 (systemd-tpm2) failed"),
            "{sig}: {err}"
        );
        assert!(err.contains(why), "{sig}: {err}");
        assert!(
            err.contains("falling back to traditional unlocking"),
            "{sig}: {err}"
        );
    }
    assert_eq!(std::fs::read(&img).unwrap(), before, "nothing written");

    // crypttab's tpm2-signature= (headless: the tokens alone).
    let ct = d.join("crypttab");
    let name = format!("signed-{}", std::process::id());
    std::fs::write(
        &ct,
        format!(
            "{name} {img_s} - tpm2-device={},tpm2-signature={},headless=true\n",
            tpm.device().replace(',', "\\,"),
            d.join("good.json").display()
        ),
    )
    .unwrap();
    let ct_arg = format!("--crypttab={}", ct.display());
    let out = run(
        "ucrypt",
        &["open", "--test-passphrase", &ct_arg, &name],
        None,
    );
    assert!(out.status.success(), "{out:?}");
}

/// crypttab's `pkcs11-uri=` with `token-timeout=`: a token that never
/// shows up is waited for until the timeout, in systemd's words, then the
/// passphrase opens; a token initialised (the enrolled key imported into
/// a fresh SoftHSM2 token) and plugged in while ucrypt waits is used, no
/// passphrase asked (stdin is empty).
#[test]
fn crypttab_pkcs11_token_timeout_waits_for_the_token() {
    if !softhsm_tools("host_unlock pkcs11 token-timeout") {
        return;
    }
    use std::io::{BufRead, BufReader};

    let dir = TempDir::new("tok-p11-wait");
    let d = dir.path();
    let (img, pass, _) = volume(&dir);
    let enrolled = softhsm_conf(d, "enrolled");
    softhsm_key(d);
    softhsm_token(d, &enrolled);
    enroll(
        &img,
        &pass,
        &["--pkcs11-token-uri=pkcs11:token=ucrypt"],
        &[("PIN", "1234"), ("SOFTHSM2_CONF", &enrolled)],
    );
    let pid = std::process::id();
    let ct = d.join("crypttab");
    std::fs::write(
        &ct,
        format!(
            "p11-absent-{pid} {img} - pkcs11-uri=pkcs11:token=absent,token-timeout=1\n\
             p11-wait-{pid} {img} - pkcs11-uri=pkcs11:token=ucrypt,token-timeout=60\n",
            img = img.display()
        ),
    )
    .unwrap();
    let ct_arg = format!("--crypttab={}", ct.display());

    let name = format!("p11-absent-{pid}");
    let mut line = PASS.to_vec();
    line.push(b'\n');
    let mut c = Command::new(testutil::ucrypt_bin());
    c.args(["open", "--test-passphrase", &ct_arg, &name])
        .env("PIN", "1234")
        .env("SOFTHSM2_CONF", &enrolled)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = c.spawn().unwrap();
    std::io::Write::write_all(&mut child.stdin.take().unwrap(), &line).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!(
            "Security token pkcs11:token=absent not present for unlocking volume {name}, please plug it in."
        )),
        "{err}"
    );
    assert!(
        err.contains("Timed out waiting for security device, aborting security device based authentication attempt."),
        "{err}"
    );

    // An empty SoftHSM2 store: ucrypt waits; the token appears.
    let later = softhsm_conf(d, "later");
    let name = format!("p11-wait-{pid}");
    let mut child = Command::new(testutil::ucrypt_bin())
        .args(["open", "--test-passphrase", &ct_arg, &name])
        .env("PIN", "1234")
        .env("SOFTHSM2_CONF", &later)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut first = String::new();
    stderr.read_line(&mut first).unwrap();
    assert!(
        first.contains("Security token pkcs11:token=ucrypt not present"),
        "{first}"
    );
    // The token is made aside and moved in whole (one rename), so ucrypt
    // never sees it initialised but without its key.
    let staging = softhsm_conf(d, "staging");
    softhsm_token(d, &staging);
    sh_in(d, "for t in staging/*; do mv \"$t\" later/; done", &[]);
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "{status:?}: {first}{rest}");
    assert!(!rest.contains("Timed out"), "{rest}");
}

/// The unit's `[Service]` settings, as read from the shipped file.
struct UnitFile {
    exec_start: Vec<String>,
    exec_stop: Vec<String>,
    restart_sec: Duration,
}

impl UnitFile {
    /// Reads `contrib/systemd/ucrypt@.service`, checks it is a notify
    /// service restarted on failure, and substitutes the instance name,
    /// the binary and the crypttab path in its command lines.
    fn load(bin: &Path, crypttab: &Path, instance: &str) -> Self {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/systemd/ucrypt@.service");
        let text = std::fs::read_to_string(&path).unwrap();
        let mut section = "";
        let mut kv = std::collections::HashMap::new();
        for l in text.lines().map(str::trim) {
            if l.starts_with('#') || l.is_empty() {
                continue;
            }
            if l.starts_with('[') {
                section = if l == "[Service]" { "s" } else { "" };
                continue;
            }
            if let (Some((k, v)), "s") = (l.split_once('='), section) {
                kv.insert(k.to_string(), v.to_string());
            }
        }
        assert_eq!(kv.get("Type").map(String::as_str), Some("notify"));
        assert_eq!(kv.get("Restart").map(String::as_str), Some("on-failure"));
        let argv = |key: &str| -> Vec<String> {
            let line = kv.get(key).unwrap_or_else(|| panic!("{key}= in the unit"));
            let mut subst = 0;
            let v: Vec<String> = line
                .split_whitespace()
                .map(|w| {
                    if w.ends_with("/ucrypt") {
                        subst += 1;
                        bin.display().to_string()
                    } else if w.starts_with("--crypttab=") {
                        subst += 1;
                        format!("--crypttab={}", crypttab.display())
                    } else if w == "%I" {
                        subst += 1;
                        instance.to_string()
                    } else {
                        w.to_string()
                    }
                })
                .collect();
            assert!(subst >= 2, "{key}={line}: binary and %I");
            v
        };
        let sec = kv.get("RestartSec").expect("RestartSec=");
        let restart_sec = if let Some(ms) = sec.strip_suffix("ms") {
            Duration::from_millis(ms.parse().unwrap())
        } else {
            Duration::from_secs(sec.trim_end_matches('s').parse().unwrap())
        };
        Self {
            exec_start: argv("ExecStart"),
            exec_stop: argv("ExecStop"),
            restart_sec,
        }
    }
}

/// What systemd does for `Type=notify`, `Restart=on-failure` (enough of
/// it): a `NOTIFY_SOCKET` datagram listener, the main process started
/// with it, started again after `RestartSec` when it dies by a signal or
/// fails; `READY=1` from the main process (its `MAINPID=`) ends a start.
struct Supervisor {
    unit: UnitFile,
    notify: std::os::unix::net::UnixDatagram,
    notify_path: PathBuf,
    main: Option<Child>,
}

impl Supervisor {
    fn new(unit: UnitFile, dir: &Path) -> Self {
        let notify_path = dir.join("notify.sock");
        let notify = std::os::unix::net::UnixDatagram::bind(&notify_path).unwrap();
        notify
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        Self {
            unit,
            notify,
            notify_path,
            main: None,
        }
    }

    /// ExecStart, then wait for READY=1 from that process.
    fn start(&mut self) -> u32 {
        let child = Command::new(&self.unit.exec_start[0])
            .args(&self.unit.exec_start[1..])
            .env("NOTIFY_SOCKET", &self.notify_path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let pid = child.id();
        self.main = Some(child);
        let msg = self.wait_for("READY=1");
        assert!(msg.contains(&format!("MAINPID={pid}")), "{msg}");
        pid
    }

    /// The next datagram holding the line `line` (others are dropped);
    /// panics when the main process exits first or after 60 s.
    fn wait_for(&mut self, line: &str) -> String {
        let mut buf = [0u8; 4096];
        for _ in 0..300 {
            if let Ok(n) = self.notify.recv(&mut buf) {
                let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
                if msg.lines().any(|l| l == line) {
                    return msg;
                }
                continue;
            }
            if let Some(c) = self.main.as_mut() {
                if let Some(st) = c.try_wait().unwrap() {
                    panic!("the main process exited before {line}: {st:?}");
                }
            }
        }
        panic!("no {line} within 60 s");
    }

    /// Waits for the main process to end; starts it again as
    /// `Restart=on-failure` does. Returns whether it was restarted.
    fn reap(&mut self) -> bool {
        use std::os::unix::process::ExitStatusExt;
        let st = self.main.take().expect("running").wait().unwrap();
        // on-failure: an unclean exit code, or any signal but the four
        // clean ones (SIGHUP, SIGINT, SIGTERM, SIGPIPE).
        let failed = match (st.code(), st.signal()) {
            (Some(0), _) => false,
            (Some(_), _) => true,
            (None, Some(s)) => ![1, 2, 13, 15].contains(&s),
            (None, None) => true,
        };
        if failed {
            std::thread::sleep(self.unit.restart_sec);
            self.start();
        }
        failed
    }

    fn kill_main(&mut self) {
        let c = self.main.as_mut().expect("running");
        c.kill().unwrap();
    }

    /// ExecStop; then the main process must end cleanly (no restart).
    fn stop(&mut self) -> String {
        let out = Command::new(&self.unit.exec_stop[0])
            .args(&self.unit.exec_stop[1..])
            .output()
            .unwrap();
        assert!(out.status.success(), "ExecStop: {out:?}");
        let msg = self.wait_for("STOPPING=1");
        assert!(!self.reap(), "a clean stop is not restarted");
        msg
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        if let Some(mut c) = self.main.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// An NBD client of the export at `sock`, which takes FUA.
fn connect_fua(sock: &Path) -> NbdClient {
    let c = NbdClient::connect(sock).unwrap();
    assert!(
        c.flags & FLAG_SEND_FUA != 0,
        "the export takes FUA: {:#x}",
        c.flags
    );
    c
}

/// The shipped unit under a supervisor that does what systemd does: the
/// daemon is killed with SIGKILL while a client writes through its NBD
/// export (plain, FUA and flushed writes); the supervisor starts it again
/// after RestartSec, its successor says READY=1, and every acknowledged
/// write reads back; ExecStop then ends it with STOPPING=1 and no restart.
#[test]
fn unit_restarts_after_kill_and_keeps_acknowledged_writes() {
    if !require_all(
        "host_unlock unit restart",
        &[Capability::Tool("cryptsetup")],
    ) {
        return;
    }
    use std::sync::{Arc, Mutex};

    let dir = TempDir::new("unit-restart");
    let (img, pass, _) = volume(&dir);
    let (sock, ct, name) = nbd_crypttab(&dir, &img, &pass, "restart");
    let unit = UnitFile::load(&testutil::ucrypt_bin(), &ct, &name);
    let mut sup = Supervisor::new(unit, dir.path());
    let first = sup.start();

    const BLOCK: usize = 4096;
    let mut client = connect_fua(&sock);
    let blocks = client.size / BLOCK as u64;
    assert!(blocks >= 256, "{blocks}");
    // Acknowledged writes: offset → the data last acknowledged there.
    let acked: Arc<Mutex<std::collections::BTreeMap<u64, Vec<u8>>>> = Arc::default();
    let mut rng = testutil::Rng::new(7);
    for i in 0..64u64 {
        let off = (i * 3 % blocks) * BLOCK as u64;
        let data = rng.bytes(BLOCK);
        client.write(off, &data, i % 4 == 0).unwrap();
        acked.lock().unwrap().insert(off, data);
    }
    client.flush().unwrap();

    // A writer keeps going; the daemon is killed under it.
    let writer = {
        let acked = Arc::clone(&acked);
        std::thread::spawn(move || {
            let mut rng = testutil::Rng::new(8);
            let mut n = 0u64;
            loop {
                let off = (rng.below_usize(blocks as usize) as u64) * BLOCK as u64;
                let data = rng.bytes(BLOCK);
                match client.write(off, &data, n % 8 == 0) {
                    Ok(()) => {
                        acked.lock().unwrap().insert(off, data);
                        n += 1;
                    }
                    // The write in flight: it may or may not have landed.
                    Err(_) => return (n, Some((off, data))),
                }
                if n % 50 == 0 && client.flush().is_err() {
                    return (n, None);
                }
            }
        })
    };
    while acked.lock().unwrap().len() < 160 {
        std::thread::sleep(Duration::from_millis(5));
    }
    sup.kill_main();
    assert!(sup.reap(), "a daemon killed by SIGKILL is restarted");
    let (written, inflight) = writer.join().unwrap();
    assert!(written > 0);
    let second = sup.main.as_ref().unwrap().id();
    assert_ne!(first, second);

    // Every acknowledged write, through the successor's export.
    let mut client = connect_fua(&sock);
    let acked = acked.lock().unwrap();
    let mut checked = 0;
    for (off, data) in acked.iter() {
        let got = client.read(*off, BLOCK).unwrap();
        if got == *data {
            checked += 1;
            continue;
        }
        match &inflight {
            Some((o, d)) if o == off && got == *d => checked += 1,
            _ => panic!("block at {off}: an acknowledged write was lost"),
        }
    }
    assert_eq!(checked, acked.len());
    drop(client);

    let msg = sup.stop();
    assert!(msg.contains("STOPPING=1"), "{msg}");
}
