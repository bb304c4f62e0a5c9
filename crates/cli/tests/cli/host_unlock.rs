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

#[test]
fn pkcs11_token_on_softhsm_opens() {
    if !require_all(
        "host_unlock pkcs11",
        &[
            Capability::Tool("softhsm2-util"),
            Capability::Tool("pkcs11-tool"),
            Capability::Tool("openssl"),
            Capability::Tool("systemd-cryptenroll"),
            Capability::Tool("cryptsetup"),
        ],
    ) {
        return;
    }
    let dir = TempDir::new("tok-p11");
    let (img, pass, data) = volume(&dir);
    let tokens = dir.join("softhsm");
    std::fs::create_dir_all(&tokens).unwrap();
    let conf = dir.join("softhsm2.conf");
    std::fs::write(
        &conf,
        format!(
            "directories.tokendir = {}\nobjectstore.backend = file\nlog.level = ERROR\n",
            tokens.display()
        ),
    )
    .unwrap();
    let conf_s = conf.to_str().unwrap().to_string();
    let sh = |script: &str| {
        let out = Command::new("sh")
            .args(["-ec", script])
            .current_dir(dir.path())
            .env("SOFTHSM2_CONF", &conf_s)
            .output()
            .unwrap();
        assert!(out.status.success(), "{script}: {out:?}");
    };
    let module = [
        "/usr/lib/softhsm/libsofthsm2.so",
        "/usr/lib/x86_64-linux-gnu/softhsm/libsofthsm2.so",
    ]
    .into_iter()
    .find(|p| Path::new(p).exists())
    .expect("libsofthsm2.so");
    sh("softhsm2-util --init-token --free --label ucrypt --pin 1234 --so-pin 0000 >/dev/null");
    sh("openssl req -x509 -newkey rsa:2048 -nodes -keyout k.pem -out c.pem -subj /CN=ucrypt -days 2 2>/dev/null \
        && openssl pkcs8 -topk8 -nocrypt -in k.pem -outform DER -out k.der \
        && openssl x509 -in c.pem -outform DER -out c.der");
    sh(&format!(
        "pkcs11-tool --module {module} --token-label ucrypt --login --pin 1234 --write-object k.der --type privkey --id 01 --label k >/dev/null \
         && pkcs11-tool --module {module} --token-label ucrypt --login --pin 1234 --write-object c.der --type cert --id 01 --label k >/dev/null"
    ));
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
    let sock = dir.join("nbd.sock");
    let ct = dir.join("crypttab");
    let name = format!("notify-{}", std::process::id());
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
