//! Unlocking a LUKS2 volume through its tokens, as `systemd-cryptsetup`
//! (and cryptsetup with systemd's token plugins) does: each token in turn
//! yields a passphrase, which is tried on the keyslots the token names.
//!
//! ```text
//!  header tokens (id order; --token-id / --token-type narrow them)
//!    ├─ systemd-tpm2   ─ tpm2::unseal    (tss-esapi: [signed] PCR policy [+ PIN]) ┐
//!    ├─ systemd-pkcs11 ─ pkcs11::decrypt (cryptoki: RSA key on a token)          ├─ passphrase
//!    ├─ luks2-keyring  ─ keyring::passphrase (request_key + KEYCTL_READ)         ┘   → its keyslots
//!    └─ systemd-fido2, clevis, others: reported, skipped
//!  none opened → the caller's passphrase prompt, unless --token-only
//! ```
//!
//! A signed PCR policy's signature JSON (`systemd-measure sign`'s) is read
//! and matched in [`signature`]. With crypttab's `token-timeout=` a TPM2
//! or a PKCS#11 token that is not there yet is waited for, as
//! systemd-cryptsetup waits. A token that fails (malformed JSON, keyslot
//! gone, no TPM, a policy the TPM refuses, no signature for this state, a
//! wrong PIN) is skipped with its reason (shown with `-v`,
//! [`TokenOptions::verbose`]); nothing is written to the header. The
//! daemon's `resolve` (for `open`, `open --test-passphrase`) and `map
//! --luks` call [`unlock`]; the options are [`TokenOptions`], a plain
//! value the `ucrypt` binary fills from its `--token-*` options and a
//! crypttab line.

use std::path::PathBuf;

use base64::Engine as _;
use crypto::Secret;
use luks::passphrase::Prompting;

pub mod keyring;
pub mod pkcs11;
pub mod signature;
pub mod token;
pub mod tpm2;

pub use token::{parse, Kind, Token};

/// Why a token gave no passphrase, in the workspace's error shape
/// (docs/ARCHITECTURE.md, "Errors"): a stable [`ErrorKind`], the message
/// `Display` shows (it is what `-v` prints after "Token N (TYPE) failed: ")
/// and an optional source.
#[derive(Debug)]
pub struct Error {
    kind: ErrorKind,
    message: String,
    source: Option<Box<dyn std::error::Error + Send + Sync + 'static>>,
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source.as_deref().map(|s| s as _)
    }
}

/// What went wrong; stable for callers to match on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorKind {
    /// The token (or a field of it: blob, URI) is not what its type says.
    Malformed,
    /// What the token needs is not here: no TPM, no PKCS#11 module, no
    /// key in the keyring, no PIN to give, no signature file.
    Unavailable,
    /// No PKCS#11 token matching the URI is plugged in (yet): waited for
    /// with crypttab's `token-timeout=`.
    Absent,
    /// The TPM's policy does not match this system's state (PCRs changed).
    Policy,
    /// The PIN was refused.
    WrongPin,
    /// The device refused or failed otherwise.
    Failed,
    /// A token type or feature ucrypt does not unlock.
    Unsupported,
    /// The passphrase opened none of the token's keyslots.
    Keyslot,
}

impl Error {
    /// A new error of `kind`; `message` does not repeat a source attached
    /// with [`Error::with_source`].
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
            source: None,
        }
    }

    /// Attaches the cause.
    #[must_use]
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }

    /// The stable kind.
    pub fn kind(&self) -> ErrorKind {
        self.kind
    }

    /// The message (what `Display` shows).
    pub fn message(&self) -> &str {
        &self.message
    }

    /// An [`ErrorKind::Malformed`] error.
    pub(crate) fn malformed(message: String) -> Self {
        Self::new(ErrorKind::Malformed, message)
    }

    /// An [`ErrorKind::Unavailable`] error.
    pub(crate) fn unavailable(message: String) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }

    /// An [`ErrorKind::Absent`] error.
    pub(crate) fn absent(message: String) -> Self {
        Self::new(ErrorKind::Absent, message)
    }

    /// An [`ErrorKind::Policy`] error.
    pub(crate) fn policy(message: String) -> Self {
        Self::new(ErrorKind::Policy, message)
    }

    /// An [`ErrorKind::WrongPin`] error.
    pub(crate) fn wrong_pin(message: String) -> Self {
        Self::new(ErrorKind::WrongPin, message)
    }

    /// An [`ErrorKind::Failed`] error.
    pub(crate) fn failed(message: String) -> Self {
        Self::new(ErrorKind::Failed, message)
    }

    /// An [`ErrorKind::Unsupported`] error.
    pub(crate) fn unsupported(message: String) -> Self {
        Self::new(ErrorKind::Unsupported, message)
    }

    /// An [`ErrorKind::Keyslot`] error.
    pub(crate) fn keyslot(message: String) -> Self {
        Self::new(ErrorKind::Keyslot, message)
    }
}

/// The token options of `open`, `open --test-passphrase` and `map --luks`
/// (cryptsetup's `--token-*` options and systemd-cryptsetup's crypttab
/// options).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenOptions {
    /// Try only this token (`--token-id`).
    pub token_id: Option<u32>,
    /// Unlock through tokens only, never ask for a passphrase
    /// (`--token-only`).
    pub token_only: bool,
    /// Try only tokens of this type (`--token-type`).
    pub token_type: Option<String>,
    /// The TPM2 for systemd-tpm2 tokens: auto (default), a device path, or a
    /// TCTI spec such as swtpm:host=127.0.0.1,port=2321.
    pub tpm2_device: Option<String>,
    /// The signature JSON of a signed TPM2 PCR policy (systemd-measure sign's
    /// output; default: tpm2-pcr-signature.json in /etc/systemd, /run/systemd,
    /// /usr/local/lib/systemd, /usr/lib/systemd).
    pub tpm2_signature: Option<PathBuf>,
    /// The PKCS#11 module for systemd-pkcs11 tokens (default: p11-kit's proxy,
    /// which offers every module p11-kit knows).
    pub pkcs11_module: Option<PathBuf>,
    /// A token's PIN (TPM2 or PKCS#11), read from this file (a trailing
    /// newline is dropped); else $PIN, else a prompt at the terminal.
    pub token_pin_file: Option<PathBuf>,
    /// crypttab's `pkcs11-uri=`: the PKCS#11 token to use instead of the
    /// one the token names (`auto`: the token's own).
    pub pkcs11_uri: Option<String>,
    /// crypttab's `headless`: never prompt for a PIN.
    pub headless: bool,
    /// crypttab's `tpm2-pin=`, kept for the record: whether a PIN is
    /// asked for follows the token's own `tpm2-pin` field.
    pub tpm2_pin: Option<bool>,
    /// crypttab's `token-timeout=` (with `tpm2-device=`): how long a
    /// systemd-tpm2 token waits for a TPM2 that is not there yet when the
    /// device is `auto` (zero: for ever; `None`: no wait), as
    /// systemd-cryptsetup waits ([`tpm2::wait_for_device`]).
    pub tpm2_timeout: Option<std::time::Duration>,
    /// crypttab's `token-timeout=` (with `pkcs11-uri=`): how long a
    /// systemd-pkcs11 token waits for a matching PKCS#11 token to be
    /// plugged in (zero: for ever; `None`: no wait), as systemd-cryptsetup
    /// waits; the module is loaded afresh for each look.
    pub pkcs11_timeout: Option<std::time::Duration>,
    /// The volume's name, for the waiting message.
    pub volume_name: Option<String>,
    /// `-v`: each token tried and why one failed go to stderr.
    pub verbose: bool,
}

impl TokenOptions {
    /// Whether any option asks for tokens by name.
    pub fn asked(&self) -> bool {
        self.token_id.is_some() || self.token_only || self.token_type.is_some()
    }
}

/// Tries a passphrase on the given keyslots: what opening gives, or why
/// none opened.
pub type TryKeyslots<'a, T> = dyn FnMut(&Secret, &[u32]) -> Result<T, String> + 'a;

/// Tries the header's `tokens` (id and JSON text) as `args` allow; `open`
/// tries a passphrase on the given keyslots (a wrong one is an `Err` with
/// the reason). A PIN typed at the terminal is asked as `prompting` says
/// (each wrong one counts as a try). Returns what `open` returned for the
/// first token that opened a keyslot, or `None` (each failure noted under
/// `-v`; a TPM2 failure also in systemd's words when `falling_back` to a
/// passphrase).
pub fn unlock<T>(
    tokens: &[(u32, String)],
    args: &TokenOptions,
    prompting: &Prompting,
    falling_back: bool,
    open: &mut TryKeyslots<'_, T>,
) -> Option<T> {
    let note = |line: &str| {
        if args.verbose {
            eprintln!("{line}");
        }
    };
    let mut tpm2_failure = None;
    for (id, json) in tokens {
        if args.token_id.is_some_and(|want| want != *id) {
            continue;
        }
        let token = match token::parse(*id, json.as_bytes()) {
            Ok(t) => t,
            Err(e) => {
                note(&format!("Token {id} skipped: {e}."));
                continue;
            }
        };
        if args
            .token_type
            .as_deref()
            .is_some_and(|want| want != token.kind.type_name())
        {
            continue;
        }
        note(&format!("Trying token {id} ({}).", token.kind.type_name()));
        match try_token(&token, args, prompting, open) {
            Ok(t) => return Some(t),
            Err(e) => {
                note(&format!(
                    "Token {id} ({}) failed: {e}",
                    token.kind.type_name()
                ));
                if matches!(token.kind, Kind::Tpm2(_)) {
                    tpm2_failure = Some(e);
                }
            }
        }
    }
    if let (true, Some(e)) = (falling_back, tpm2_failure) {
        if e.kind() == ErrorKind::Policy {
            eprintln!("No TPM2 metadata matching the current system state found in LUKS2 header, falling back to traditional unlocking.");
        } else {
            eprintln!("TPM2 operation failed, falling back to traditional unlocking: {e}");
        }
    }
    None
}

fn try_token<T>(
    token: &Token,
    args: &TokenOptions,
    prompting: &Prompting,
    open: &mut TryKeyslots<'_, T>,
) -> Result<T, Error> {
    if token.keyslots.is_empty() {
        return Err(Error::keyslot("the token is assigned to no keyslot".into()));
    }
    let mut pins = PinSource::new(args, prompting);
    let mut attempt = |pass: Secret| open(&pass, &token.keyslots).map_err(Error::keyslot);
    match &token.kind {
        Kind::Keyring { description } => attempt(keyring::passphrase(description)?),
        Kind::Tpm2(t) => loop {
            if let Some(timeout) = args.tpm2_timeout {
                let auto = matches!(args.tpm2_device.as_deref(), None | Some("auto"));
                let name = args.volume_name.as_deref().unwrap_or("the volume");
                if auto && !tpm2::wait_for_device(name, timeout) {
                    return Err(Error::unavailable("No TPM2 (tpmrm) device found.".into()));
                }
            }
            let pin = if t.pin {
                Some(pins.next("Please enter TPM2 PIN: ")?)
            } else {
                None
            };
            let device = args.tpm2_device.as_deref();
            let signature = args.tpm2_signature.as_deref();
            match tpm2::unseal(t, device, pin.as_ref(), signature) {
                Err(e) if e.kind() == ErrorKind::WrongPin && pins.again() => eprintln!("{e}"),
                r => break attempt(r?),
            }
        },
        Kind::Pkcs11(t) => {
            let uri = args.pkcs11_uri.as_deref().filter(|u| *u != "auto");
            let mut waiting = args.pkcs11_timeout.map(|timeout| {
                // systemd names the URI it was given, none for `auto`.
                let token = uri.map_or(String::new(), |u| format!(" {u}"));
                let name = args.volume_name.as_deref().unwrap_or("the volume");
                Waiting::new(
                    timeout,
                    format!("Security token{token} not present for unlocking volume {name}, please plug it in."),
                )
            });
            loop {
                let r = pkcs11::decrypt(t, uri, args.pkcs11_module.as_deref(), &mut |label| {
                    pins.next(&format!("Please enter security token PIN for '{label}': "))
                });
                match r {
                    Err(e) if e.kind() == ErrorKind::WrongPin && pins.again() => eprintln!("{e}"),
                    Err(e) if e.kind() == ErrorKind::Absent && waiting.as_mut().is_some_and(Waiting::again) => {}
                    r => break attempt(r?),
                }
            }
        }
        Kind::Fido2 => Err(Error::unsupported(
            "systemd-fido2 tokens are not supported (ucrypt has no FIDO2 stack); use the passphrase or another token".into(),
        )),
        Kind::Clevis => Err(Error::unsupported(
            "clevis tokens are not supported; unlock with clevis' own tools (clevis luks unlock)".into(),
        )),
        Kind::Other(ty) => Err(Error::unsupported(format!(
            "token type {ty} is not supported"
        ))),
    }
}

/// Waiting for a security device, as systemd-cryptsetup waits for one
/// with `token-timeout=`: the first miss says so, each later look comes
/// after [`Waiting::POLL`], and the deadline (none for a zero timeout)
/// ends it in systemd's words. systemd is woken by udev; this looks
/// again on a timer, which needs no udev.
struct Waiting {
    deadline: Option<std::time::Instant>,
    notice: Option<String>,
}

impl Waiting {
    const POLL: std::time::Duration = std::time::Duration::from_millis(250);

    fn new(timeout: std::time::Duration, notice: String) -> Self {
        let deadline = (!timeout.is_zero()).then(|| std::time::Instant::now() + timeout);
        Self {
            deadline,
            notice: Some(notice),
        }
    }

    /// After a miss: whether to look again (having waited), or give up.
    fn again(&mut self) -> bool {
        if let Some(n) = self.notice.take() {
            eprintln!("{n}");
            return true;
        }
        if self
            .deadline
            .is_some_and(|d| std::time::Instant::now() >= d)
        {
            eprintln!("Timed out waiting for security device, aborting security device based authentication attempt.");
            return false;
        }
        std::thread::sleep(Self::POLL);
        true
    }
}

/// Where a token's PIN comes from: `--token-pin-file`, `$PIN` (as
/// systemd's tools read it), or the terminal (not when headless), asked
/// again after a wrong PIN: each wrong one counts as a try of
/// `--tries` (crypttab's `tries=`), as systemd-cryptsetup counts it,
/// default 3.
struct PinSource<'a> {
    args: &'a TokenOptions,
    prompting: &'a Prompting,
    asked: u32,
    typed: bool,
}

impl<'a> PinSource<'a> {
    fn new(args: &'a TokenOptions, prompting: &'a Prompting) -> Self {
        Self {
            args,
            prompting,
            asked: 0,
            typed: false,
        }
    }

    fn next(&mut self, prompt: &str) -> Result<Secret, Error> {
        self.asked += 1;
        if let Some(f) = &self.args.token_pin_file {
            let mut s = self
                .prompting
                .read(Some(f), "", false)
                .map_err(|e| Error::unavailable(format!("Cannot read the PIN file: {e}")))?;
            while s.last() == Some(&b'\n') {
                s.truncate(s.len() - 1);
            }
            return Ok(s);
        }
        if let Some(v) = std::env::var_os("PIN") {
            return Ok(Secret::from_slice(std::os::unix::ffi::OsStrExt::as_bytes(
                v.as_os_str(),
            )));
        }
        if self.args.headless || !std::io::IsTerminal::is_terminal(&std::io::stdin()) {
            return Err(Error::unavailable(
                "A PIN is needed and none was given (--token-pin-file, $PIN or a terminal)".into(),
            ));
        }
        self.typed = true;
        self.prompting
            .read(None, prompt, false)
            .map_err(|e| Error::unavailable(format!("No PIN: {e}")))
    }

    /// After a wrong PIN: ask again? Only a typed PIN is, and each wrong
    /// one counts as a try.
    fn again(&self) -> bool {
        self.typed && self.asked < self.prompting.tries()
    }
}

/// systemd's keyslot passphrase for a token secret: its base64.
pub(crate) fn encode_passphrase(secret: &[u8]) -> Secret {
    let encoded = zeroize::Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(secret));
    Secret::from_slice(encoded.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keyring_token(id: u32, desc: &str, slots: &str) -> (u32, String) {
        (
            id,
            format!(
                r#"{{"type":"luks2-keyring","keyslots":[{slots}],"key_description":"{desc}"}}"#
            ),
        )
    }

    #[test]
    fn filters_and_failures_fall_through() {
        let tokens = vec![
            (0, "{broken".to_string()),
            (
                1,
                r#"{"type":"systemd-fido2","keyslots":["0"]}"#.to_string(),
            ),
            keyring_token(2, "ucrypt-test-absent-key-description", r#""0""#),
            keyring_token(3, "x", ""),
        ];
        let mut calls = 0;
        let r: Option<()> = unlock(
            &tokens,
            &TokenOptions::default(),
            &Prompting::default(),
            false,
            &mut |_, _| {
                calls += 1;
                Ok(())
            },
        );
        assert_eq!(r, None);
        assert_eq!(calls, 0, "no token yields a passphrase");
    }

    #[test]
    fn token_id_and_type_select() {
        let tokens = vec![keyring_token(4, "a", r#""1""#)];
        let args = TokenOptions {
            token_type: Some("systemd-tpm2".into()),
            ..TokenOptions::default()
        };
        let r: Option<()> = unlock(&tokens, &args, &Prompting::default(), false, &mut |_, _| {
            Ok(())
        });
        assert_eq!(r, None);
    }

    #[test]
    fn passphrase_is_base64_of_the_secret() {
        assert_eq!(&encode_passphrase(&[0xff, 0, 1])[..], b"/wAB");
    }
}
