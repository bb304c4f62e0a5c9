//! `ucrypt reencrypt`: cryptsetup's offline LUKS2 reencryption (LUKS1:
//! `reencrypt_luks1.rs`) (a new
//! volume key; optionally a new cipher, key size or sector size; or
//! `--decrypt` with a detached `--header`, or with `--header NEWFILE` of a
//! volume whose header is inside the device (`reencrypt_dshift.rs`);
//! `--encrypt` of a plaintext
//! device with a detached `--header` or a data shift, online under a
//! NAME it serves when one is given) over `luks::reencrypt`. Options,
//! messages and exit codes are cryptsetup's.

use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use clap::{Args, Subcommand};
use luks::{ops, reencrypt};

use super::luks::KeyFileArgs;
use super::reencrypt_verbose as verbose;
use crate::global::Globals;
use crate::{CmdResult, Failure};

/// Commands of this group.
#[derive(Subcommand)]
pub enum Commands {
    /// Reencrypt a LUKS2 volume offline with a new volume key
    /// (cryptsetup reencrypt).
    #[command(disable_help_flag = true)]
    Reencrypt(ReencryptArgs),
}

/// `ucrypt reencrypt`.
#[derive(Args)]
pub struct ReencryptArgs {
    /// Device or image file with the LUKS2 volume (with `--active-name`:
    /// optional, the served volume's device).
    #[arg(required_unless_present = "active_name")]
    pub(super) device: Option<PathBuf>,
    /// With --encrypt: serve the device as NAME (as `open` does) and
    /// encrypt it online, as cryptsetup activates NAME.
    #[arg(value_name = "NAME")]
    pub(super) name: Option<String>,
    /// Print help (`-h` is `--hash`, as in cryptsetup).
    #[arg(long, short_alias = '?', action = clap::ArgAction::Help)]
    pub(super) help: Option<bool>,
    #[command(flatten)]
    pub(super) key: KeyFileArgs,
    /// Unlock (and renew) only this keyslot.
    #[arg(long, short = 'S')]
    pub(super) key_slot: Option<u32>,
    /// The new data cipher (default: the current one).
    #[arg(long, short = 'c')]
    pub(super) cipher: Option<String>,
    /// The new volume key size in bits (default: the current one; with a
    /// new --cipher, cryptsetup's default for it: 256, 512 for XTS).
    #[arg(long, short = 's')]
    pub(super) key_size: Option<u32>,
    /// The new encryption sector size.
    #[arg(long)]
    pub(super) sector_size: Option<u32>,
    /// Hotzone protection: checksum (default), journal or none.
    #[arg(long)]
    pub(super) resilience: Option<String>,
    /// Hash of the checksum resilience (default sha256).
    #[arg(long)]
    pub(super) resilience_hash: Option<String>,
    /// Largest hotzone (cryptsetup's size syntax).
    #[arg(long, value_parser = size_arg)]
    pub(super) hotzone_size: Option<u64>,
    /// Write the reencryption metadata only.
    #[arg(long, conflicts_with = "resume_only")]
    pub(super) init_only: bool,
    /// Resume a reencryption already initialized.
    #[arg(long)]
    pub(super) resume_only: bool,
    /// Reencrypt without checking for an active mapping (what ucrypt
    /// does anyway: it works offline).
    #[arg(long)]
    pub(super) force_offline_reencrypt: bool,
    /// Online reencryption of the volume ucrypt serves as NAME (the
    /// daemon moves the data while clients keep doing IO).
    #[arg(long, value_name = "NAME")]
    pub(super) active_name: Option<String>,
    /// With --active-name: pause the running reencryption after its
    /// current hotzone (IO keeps flowing).
    #[arg(long, requires = "active_name", conflicts_with_all = ["resume", "init_only", "resume_only"])]
    pub(super) pause: bool,
    /// With --active-name: continue a paused reencryption.
    #[arg(long, requires = "active_name", conflicts_with_all = ["init_only", "resume_only"])]
    pub(super) resume: bool,
    /// With --active-name: limit the data moved to MiB/s (0: no limit);
    /// alone, while one runs, its new limit.
    #[arg(long, requires = "active_name", value_name = "MIB_PER_SEC")]
    pub(super) rate: Option<f64>,
    /// Seconds between progress lines.
    #[arg(long, value_name = "SECS")]
    pub(super) progress_frequency: Option<u64>,
    /// Progress as JSON lines.
    #[arg(long)]
    pub(super) progress_json: bool,
    /// Decrypt the device (remove encryption; needs --header: a detached
    /// header with data offset 0, or a file that does not exist yet, to
    /// which the header inside the device is exported, as in cryptsetup 2.6).
    #[arg(long, conflicts_with = "encrypt")]
    pub(super) decrypt: bool,
    /// Device or file with the detached LUKS2 header.
    #[arg(long)]
    pub(super) header: Option<PathBuf>,
    /// Encrypt a plaintext device in place (LUKS2, the header in the
    /// detached --header file, as in cryptsetup 2.6; `--new`/`-N` as
    /// cryptsetup spells it too).
    #[arg(long, visible_alias = "new", short = 'N')]
    pub(super) encrypt: bool,
    /// With --encrypt and no --header: the header goes inside the
    /// device, the data moves by half of SIZE (the device's last SIZE
    /// bytes must be unused).
    #[arg(long, value_parser = size_arg, value_name = "SIZE")]
    pub(super) reduce_device_size: Option<u64>,
    /// With --encrypt: the data offset in 512-byte sectors (with
    /// --header: where the data starts, the bytes before it kept; with
    /// --reduce-device-size: at most half of it, which then becomes
    /// twice the offset). Ignored otherwise, as cryptsetup ignores it.
    #[arg(long, short = 'o', value_name = "SECTORS")]
    pub(super) offset: Option<u64>,
    /// Reencrypt only the data's first SIZE bytes (cryptsetup's size
    /// syntax; the rest of the device is left as it is).
    #[arg(long, value_parser = size_arg, value_name = "SIZE")]
    pub(super) device_size: Option<u64>,
    /// The new volume key from FILE (its first --key-size bits; default
    /// the current key's size) instead of a random one.
    #[arg(long, value_name = "FILE")]
    pub(super) volume_key_file: Option<PathBuf>,
    /// With --encrypt: the LUKS type (luks2 only); otherwise luks1 or
    /// luks2 must be the volume's version.
    #[arg(long = "type", short = 'M', value_name = "TYPE")]
    pub(super) luks_type: Option<String>,
    /// With --encrypt: the new volume's UUID (LUKS1 --decrypt: resume the
    /// decryption of this UUID, its header already overwritten).
    #[arg(long)]
    pub(super) uuid: Option<String>,
    /// LUKS1: a new header (hash, KDF) with the volume key kept; no data
    /// is rewritten.
    #[arg(long)]
    pub(super) keep_key: bool,
    #[command(flatten)]
    pub(super) kdf: super::kdf::KdfArgs,
}

fn size_arg(s: &str) -> Result<u64, String> {
    ops::parse_size(s).ok_or_else(|| format!("invalid size {s:?}"))
}

impl Commands {
    /// Runs the command.
    pub fn run(self, g: &Globals) -> CmdResult {
        let Commands::Reencrypt(a) = self;
        reencrypt_cmd(a, g)
    }
}

/// cryptsetup's rules for a device whose header is (`in_progress`) or is
/// not in reencryption: `--init-only` needs a fresh one, `--resume-only`
/// one in progress, and resuming without `--resume-only` asks first
/// (unless `--batch-mode`).
pub(super) fn check_progress(
    in_progress: bool,
    a: &ReencryptArgs,
    g: &Globals,
    dev: &std::path::Path,
) -> CmdResult {
    if in_progress && a.init_only {
        return Err(Failure::usage(
            "LUKS2 reencryption already initialized. Aborting operation.",
        ));
    }
    if !in_progress && a.resume_only {
        return Err(Failure::usage("Device reencryption not in progress."));
    }
    if in_progress && !a.resume_only && !g.batch_mode {
        let q = format!(
            "Device {} is already in LUKS2 reencryption. Do you wish to resume previously initialised operation?",
            dev.display()
        );
        if !ops::Ui::confirm(&mut super::luks::Terminal, &q) {
            return Err(Failure::usage("Operation aborted."));
        }
    }
    Ok(())
}

/// cryptsetup's checks of a resumed operation against the options
/// (`reencrypt_verify_and_update_params`): `--encrypt`/`--decrypt` must
/// name the operation in progress, and `--resilience` may not switch to
/// or from a data shift.
pub(super) fn check_resume(st: &reencrypt::State, a: &ReencryptArgs) -> CmdResult {
    if a.encrypt && st.mode != reencrypt::Mode::Encrypt {
        return Err(Failure::usage(
            "Device is not in LUKS2 encryption. Conflicting option --encrypt.",
        ));
    }
    if a.decrypt && st.mode != reencrypt::Mode::Decrypt {
        return Err(Failure::usage(
            "Device is not in LUKS2 decryption. Conflicting option --decrypt.",
        ));
    }
    if let Some(r) = a.resilience.as_deref() {
        let shifting = matches!(st.resilience, reencrypt::Resilience::Datashift { .. });
        if shifting && r != "datashift" {
            return Err(Failure::usage(
                "Device is in reencryption using datashift resilience. \
                 Requested --resilience option cannot be applied.",
            ));
        }
        if !shifting && r.starts_with("datashift") {
            return Err(Failure::usage(
                "Requested --resilience option cannot be applied to current reencryption operation.",
            ));
        }
    }
    Ok(())
}

fn reencrypt_cmd(a: ReencryptArgs, g: &Globals) -> CmdResult {
    check_offline_options(&a)?;
    if a.name.is_some() && (!a.encrypt || a.active_name.is_some()) {
        return Err(Failure::usage(
            "Only --encrypt (without --active-name) takes a NAME to activate.",
        ));
    }
    if let Some(name) = a.active_name.clone() {
        return super::reencrypt_online::run(a, &name, g);
    }
    if let Some(dev) = a.device.as_ref() {
        if super::reencrypt_luks1::wanted(&a, dev) {
            if !a.encrypt {
                check_type(&a, a.header.as_deref().unwrap_or(dev))?;
            }
            return super::reencrypt_luks1::run(&a, dev, g);
        }
    }
    if a.keep_key {
        return Err(Failure::usage(
            "LUKS2 reencryption with --keep-key is not supported by ucrypt.",
        ));
    }
    if a.encrypt || a.reduce_device_size.is_some() {
        return encrypt_cmd(a, g);
    }
    let Some(dev) = a.device.as_ref() else {
        return Err(Failure::usage("Command requires device as argument."));
    };
    if let (true, Some(h)) = (super::reencrypt_dshift::wanted(&a), a.header.as_deref()) {
        return super::reencrypt_dshift::run(&a, dev, h, g);
    }
    super::reencrypt_dshift::check_header(&a, g)?;
    check_type(&a, a.header.as_deref().unwrap_or(dev))?;
    let state = reencrypt::status(a.header.as_deref().unwrap_or(dev), &g.access())?;
    check_progress(state.is_some(), &a, g, dev)?;
    if let Some(st) = &state {
        check_resume(st, &a)?;
    }
    if let (None, Some(size)) = (&state, a.device_size) {
        let meta = a.header.as_deref().unwrap_or(dev);
        reencrypt::check_device_size(dev, meta, &g.access(), size, a.sector_size)?;
    }
    if state.is_none() && a.key_slot.is_none() && !a.decrypt {
        let req = init_request(&a, g)?;
        let meta = a.header.as_deref().unwrap_or(dev);
        let passes = slot_passphrases(&a, g, meta)?;
        let slots: Vec<reencrypt::SlotPassphrase<'_>> = passes
            .iter()
            .map(|(slot, p)| reencrypt::SlotPassphrase {
                slot: *slot,
                pass: p,
            })
            .collect();
        reencrypt::init_slots(dev, &slots, &req)?;
        let unlocked: Vec<u32> = passes.iter().map(|(s, _)| *s).collect();
        verbose::started(g, &unlocked, &verbose::created(g, meta)?);
        if a.init_only {
            return Ok(());
        }
        // The first passphrase opens the old key and the new one.
        return run_steps(&a, dev, slots[0].pass, false, g);
    }
    let pass = a.key.source(g.prompting()).read(&prompt(&a, dev), false)?;
    if state.is_none() {
        let meta = a.header.as_deref().unwrap_or(dev);
        let opened = verbose::opened_by(g, meta, a.key_slot, &pass)?;
        reencrypt::init(dev, &pass, a.key_slot, &init_request(&a, g)?)?;
        let created = match a.decrypt {
            true => Vec::new(),
            false => verbose::created(g, meta)?,
        };
        verbose::started(g, opened.as_slice(), &created);
        if a.init_only {
            return Ok(());
        }
    } else {
        change_resilience(&a, dev, &pass, g)?;
    }
    run_steps(&a, dev, &pass, state.is_some(), g)
}

/// `--device-size` as cryptsetup parses it (a positive multiple of 512
/// bytes, not with `--reduce-device-size`); ucrypt runs it on LUKS2,
/// offline or online (`--active-name`: the size the volume is served
/// with, checked by the daemon), not with an encryption that activates
/// NAME. `--volume-key-file` is taken offline (a LUKS2 reencryption or
/// `--encrypt`, a LUKS1 reencryption) and ignored where cryptsetup 2.6.1
/// ignores it (`--decrypt`, LUKS1 `--encrypt`); ucrypt's online
/// reencryption does not take it.
fn check_offline_options(a: &ReencryptArgs) -> CmdResult {
    if a.volume_key_file.is_some() && a.active_name.is_some() {
        return Err(Failure::usage(
            "--volume-key-file is not supported by ucrypt for online reencryption.",
        ));
    }
    let Some(size) = a.device_size else {
        return Ok(());
    };
    if size == 0 {
        return Err(Failure::usage("--device-size: invalid numeric value"));
    }
    if size % 512 != 0 {
        return Err(Failure::usage(
            "Device size must be multiple of 512 bytes sector.",
        ));
    }
    if a.reduce_device_size.is_some() {
        return Err(Failure::usage(
            "Options --reduce-device-size and --data-size cannot be combined.",
        ));
    }
    if a.name.is_some() {
        return Err(Failure::usage(
            "--device-size is not supported by ucrypt for online encryption.",
        ));
    }
    if a.header.is_none()
        && a.device
            .as_deref()
            .is_some_and(super::reencrypt_luks1::is_luks1)
    {
        return Err(Failure::usage(
            "--device-size is not supported by ucrypt for LUKS1 reencryption.",
        ));
    }
    Ok(())
}

/// A resume given `--resilience` switches the reencryption to it (with
/// `--resilience-hash`), as cryptsetup's resume does; without
/// `--resilience` the recorded one stays (`--resilience-hash` alone
/// changes nothing, as in cryptsetup).
fn change_resilience(
    a: &ReencryptArgs,
    dev: &std::path::Path,
    pass: &[u8],
    g: &Globals,
) -> CmdResult {
    if let Some(r) = a.resilience.as_deref() {
        let meta = a.header.as_deref().unwrap_or(dev);
        let hash = a.resilience_hash.as_deref();
        reencrypt::set_resilience(dev, meta, &g.access(), pass, a.key_slot, r, hash)?;
    }
    Ok(())
}

/// The passphrase of every active keyslot of the header on `meta`, each
/// asked as cryptsetup asks it ("Enter passphrase for key slot N: ", up
/// to `--tries` times at a terminal) and checked against its keyslot
/// before the next is asked (never empty). A key file serves a volume
/// with one active keyslot only, as in cryptsetup.
pub(super) fn slot_passphrases(
    a: &ReencryptArgs,
    g: &Globals,
    meta: &std::path::Path,
) -> Result<Vec<(u32, crypto::Secret)>, Failure> {
    let active = reencrypt::active_slots(meta, &g.access())?;
    if a.key.key_file.is_some() && active.len() > 1 {
        return Err(Failure::usage(
            "Key file can be used only with --key-slot or with exactly one key slot active.",
        ));
    }
    ask_each_slot(&a.key.source(g.prompting()), active, |slot, p| {
        reencrypt::check_slot(meta, &g.access(), slot, p)
    })
}

/// The passphrase of each of `slots` in turn, asked as cryptsetup asks it
/// ("Enter passphrase for key slot N: ") and checked by `check` before
/// the next is asked; none at all is refused as cryptsetup refuses it.
pub(super) fn ask_each_slot(
    source: &luks::ops::KeySource,
    slots: impl IntoIterator<Item = u32>,
    check: impl Fn(u32, &[u8]) -> luks::Result<()>,
) -> Result<Vec<(u32, crypto::Secret)>, Failure> {
    let mut out = Vec::new();
    for slot in slots {
        let pass = source.unlock(&format!("Enter passphrase for key slot {slot}: "), |p| {
            check(slot, p)?;
            Ok(p.clone())
        })?;
        out.push((slot, pass));
    }
    if out.is_empty() {
        return Err(Failure::usage("No key available with this passphrase."));
    }
    Ok(out)
}

/// `--type luks1|luks2` naming the other LUKS version than the header's
/// is refused, in cryptsetup's words (any other `--type` is ignored
/// without `--encrypt`, as cryptsetup ignores it).
fn check_type(a: &ReencryptArgs, hdr: &std::path::Path) -> CmdResult {
    let want = match a.luks_type.as_deref() {
        Some("luks1") => 1,
        Some("luks2") => 2,
        _ => return Ok(()),
    };
    let mut head = [0u8; 8];
    let read = std::fs::File::open(hdr).and_then(|f| {
        use std::os::unix::fs::FileExt;
        f.read_exact_at(&mut head, 0)
    });
    let is = match (
        read.is_ok(),
        &head[..6],
        u16::from_be_bytes([head[6], head[7]]),
    ) {
        (true, b"LUKS\xba\xbe", v @ (1 | 2)) => v,
        _ if super::reencrypt_luks1::is_luks1(hdr) => 1,
        _ => return Ok(()),
    };
    if is != want {
        return Err(Failure::usage(format!(
            "Conflicting versions. Device {} is LUKS{is}.",
            hdr.display()
        )));
    }
    Ok(())
}

/// `--encrypt`: checks the options as cryptsetup does, starts the
/// encryption (or resumes the one the header records) and runs it.
fn encrypt_cmd(a: ReencryptArgs, g: &Globals) -> CmdResult {
    if let Some(r) = a.reduce_device_size {
        if r > 1 << 30 {
            return Err(Failure::usage("Maximum device reduce size is 1 GiB."));
        }
        if r % 512 != 0 {
            return Err(Failure::usage(
                "Reduce size must be multiple of 512 bytes sector.",
            ));
        }
        if a.header.is_some() {
            return Err(Failure::usage(
                "LUKS2 encryption with a detached header and a data shift is not supported by ucrypt.",
            ));
        }
    }
    match a.luks_type.as_deref() {
        None | Some("luks2") => {}
        Some(t) => return Err(Failure::usage(format!("Invalid device type {t}."))),
    }
    let Some(dev) = a.device.as_ref() else {
        return Err(Failure::usage("Command requires device as argument."));
    };
    if a.header.is_none() && a.reduce_device_size.is_none() && !a.resume_only {
        return Err(Failure::usage(
            "Encryption without detached header (--header) is not possible without data \
             device size reduction (--reduce-device-size).",
        ));
    }
    // The header: the detached file, or (a data shift) the device.
    let hdr = a.header.clone().unwrap_or_else(|| dev.clone());
    // A header already recording an encryption is resumed (cryptsetup
    // does the same); any other LUKS header is refused by the init.
    let state = if hdr.exists() {
        match reencrypt::status(&hdr, &g.access()) {
            Ok(s) => s,
            Err(e) if e.kind() == luks::ErrorKind::NotLuks => None,
            Err(e) => return Err(e.into()),
        }
    } else {
        None
    };
    check_progress(state.is_some(), &a, g, dev)?;
    if let Some(st) = &state {
        check_resume(st, &a)?;
    }
    if let (None, Some(size)) = (&state, a.device_size) {
        reencrypt::check_device_size(dev, &hdr, &g.access(), size, a.sector_size)?;
    }
    let (reduce, offset) = match state {
        None => super::reencrypt_offset::layout(&a)?,
        Some(_) => (None, None),
    };
    let pass = a
        .key
        .source(g.prompting())
        .read(&prompt(&a, dev), state.is_none())?;
    if state.is_none() {
        let hash = luks::Hash::parse(&a.kdf.hash)?;
        let req = reencrypt::EncryptRequest {
            cipher: a.cipher.clone(),
            key_bits: a.key_size,
            sector_size: a.sector_size,
            resilience: a.resilience.clone(),
            resilience_hash: a.resilience_hash.clone(),
            hash,
            kdf: a.kdf.request(2, g.verbose())?,
            key_slot: a.key_slot,
            uuid: a.uuid.clone(),
            header: a.header.clone(),
            reduce,
            offset,
            volume_key_file: a.volume_key_file.clone(),
            access: g.access(),
        };
        reencrypt::init_encrypt(dev, &pass, &req)?;
        verbose::started(g, &[], &[a.key_slot.unwrap_or(0)]);
        if let Some(name) = &a.name {
            return super::reencrypt_online::encrypt_as(&a, dev, name, pass, g);
        }
        if a.init_only {
            return Ok(());
        }
    } else {
        change_resilience(&a, dev, &pass, g)?;
    }
    run_steps(&a, dev, &pass, state.is_some(), g)
}

/// Runs (or resumes, `resumed`) the data steps, with cryptsetup's
/// progress and its handling of SIGINT/SIGTERM (stop after the hotzone).
pub(super) fn run_steps(
    a: &ReencryptArgs,
    dev: &std::path::Path,
    pass: &[u8],
    resumed: bool,
    g: &Globals,
) -> CmdResult {
    if a.force_offline_reencrypt && resumed {
        println!("Resuming LUKS reencryption in forced offline mode.");
    }
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone())
            .map_err(|e| Failure::usage(format!("Cannot handle signals: {e}")))?;
    }
    let mut pr = Progress::new(a.progress_json, a.progress_frequency, dev);
    let opts = reencrypt::RunOptions {
        hotzone: a.hotzone_size.unwrap_or(0),
        header: a.header.clone(),
        device_size: a.device_size,
        access: g.access(),
    };
    let out = reencrypt::run(dev, pass, a.key_slot, &opts, &stop, &mut |d, t| {
        pr.update(d, t)
    })?;
    pr.finish();
    match out {
        reencrypt::Outcome::Interrupted => Err(Failure::usage("Reencryption interrupted.")),
        _ => Ok(()),
    }
}

/// The passphrase prompt, as cryptsetup words it.
pub(super) fn prompt(a: &ReencryptArgs, dev: &std::path::Path) -> String {
    match a.key_slot {
        Some(s) => format!("Enter passphrase for key slot {s}: "),
        None => format!("Enter passphrase for {}: ", dev.display()),
    }
}

/// What a new reencryption changes, from the options.
pub(super) fn init_request(
    a: &ReencryptArgs,
    g: &Globals,
) -> Result<reencrypt::InitRequest, Failure> {
    let kdf = if a.kdf.pbkdf.is_some() || a.kdf.force_iterations.is_some() {
        Some(a.kdf.request(2, g.verbose())?)
    } else {
        None
    };
    Ok(reencrypt::InitRequest {
        cipher: a.cipher.clone(),
        key_bits: a.key_size,
        sector_size: a.sector_size,
        resilience: a.resilience.clone(),
        resilience_hash: a.resilience_hash.clone(),
        kdf,
        decrypt: a.decrypt,
        header: a.header.clone(),
        // cryptsetup 2.6.1 ignores it for a decryption.
        volume_key_file: a.volume_key_file.clone().filter(|_| !a.decrypt),
        access: g.access(),
    })
}

/// cryptsetup's progress: a line rewritten on a terminal, one line per
/// `--progress-frequency` seconds elsewhere, JSON with `--progress-json`.
pub(super) struct Progress {
    start: Instant,
    last: Option<Instant>,
    first: Option<u64>,
    json: bool,
    every: Option<u64>,
    tty: bool,
    device: String,
    wrote: bool,
}

impl Progress {
    pub(super) fn new(json: bool, every: Option<u64>, dev: &std::path::Path) -> Self {
        Progress {
            start: Instant::now(),
            last: None,
            first: None,
            json,
            every,
            tty: std::io::stdout().is_terminal(),
            device: dev.display().to_string(),
            wrote: false,
        }
    }

    pub(super) fn update(&mut self, done: u64, total: u64) {
        let first = *self.first.get_or_insert(done);
        if !self.tty && !self.json && self.every.is_none() {
            return;
        }
        let now = Instant::now();
        let freq = std::time::Duration::from_secs(self.every.unwrap_or(1).max(1));
        if done < total && self.last.is_some_and(|l| now - l < freq) {
            return;
        }
        self.last = Some(now);
        let secs = (now - self.start).as_secs_f64().max(1e-3);
        let speed = (done - first) as f64 / secs;
        let eta = if speed > 0.0 {
            (total - done) as f64 / speed
        } else {
            0.0
        };
        let mut out = std::io::stdout().lock();
        if self.json {
            let _ = writeln!(
                out,
                "{{\"device\":\"{}\",\"device_bytes\":\"{done}\",\"device_size\":\"{total}\",\"speed\":\"{}\",\"eta_ms\":\"{}\",\"time_ms\":\"{}\"}}",
                self.device.replace('\\', "\\\\").replace('"', "\\\""),
                speed as u64,
                (eta * 1000.0) as u64,
                (secs * 1000.0) as u64
            );
            return;
        }
        let pct = if total > 0 {
            done as f64 * 100.0 / total as f64
        } else {
            100.0
        };
        let line = format!(
            "Progress: {pct:5.1}%, ETA {:02}:{:02}, {} MiB written, speed {:5.1} MiB/s",
            (eta as u64) / 60,
            (eta as u64) % 60,
            (done - first) >> 20,
            speed / f64::from(1 << 20)
        );
        if self.tty {
            let _ = write!(out, "\r\x1b[2K{line}");
        } else {
            let _ = writeln!(out, "{line}");
        }
        let _ = out.flush();
        self.wrote = true;
    }

    pub(super) fn finish(&mut self) {
        if self.wrote && self.tty {
            println!();
        }
    }
}
