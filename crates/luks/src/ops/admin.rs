//! cryptsetup's header administration verbs with typed requests: `token
//! add|remove|import|export|unassign`, `config`, `luksErase`, `repair`,
//! `convert` and `luksConvertKey`.
//!
//! Each verb loads the header through [`super::load_header`] (cryptsetup's
//! wording, full stop included), asks through [`Ui`] where cryptsetup
//! asks "Are you sure?", changes the header and returns a [`Done`] whose
//! [`Done::verbose`] lines are what cryptsetup says with `-v`.
//!
//! ```text
//!   Target + TokenRequest ─► token ──────► Done::TokenCreated | TokenRemoved | TokenJson | Nothing
//!   Target + ConfigRequest ─► config ────► Done::Nothing
//!   Target ─► erase | repair ────────────► Done::SlotsRemoved | HeaderClean | Repaired
//!   Target + "luks1"|"luks2" ─► convert ─► Done::Nothing
//!   Target + ConvertKeyRequest ─► convert_key ─► Done::KeySlotCreated
//! ```

use std::io::Read;
use std::path::{Path, PathBuf};

use super::{confirm_destructive, load_header, KdfChoice, KeySource, Ui};
use crate::error::invalid;
use crate::{Error, ErrorKind, Priority, Repair, Result, TokenPlacement, Volume};

/// The volume a header verb works on.
#[derive(Debug, Clone)]
pub struct Target {
    /// Device or image file.
    pub device: PathBuf,
    /// Detached header file.
    pub header: Option<PathBuf>,
    /// Never ask (`--batch-mode`).
    pub batch: bool,
    /// How the devices are opened (locking, Ceph).
    pub access: crate::DeviceAccess,
}

impl Target {
    /// The file holding the header (the detached one if given).
    fn meta(&self) -> &Path {
        self.header.as_deref().unwrap_or(&self.device)
    }

    /// Holds the header and data devices while a verb replaces the
    /// header (see `volume::claim`): refused while they are in use.
    fn claim(&self) -> Result<crate::volume::Claim> {
        crate::volume::claim(&[self.meta(), self.device.as_path()])
    }

    fn load(&self, ui: &mut dyn Ui) -> Result<Volume> {
        load_header(&self.device, self.header.as_deref(), &self.access, ui)
    }
}

/// What a header verb did, for the caller to show.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Done {
    /// Nothing to report.
    Nothing,
    /// A token was added or imported with this id.
    TokenCreated(u32),
    /// This token was removed.
    TokenRemoved(u32),
    /// An exported token's JSON, for standard output.
    TokenJson(String),
    /// These keyslots were wiped (luksErase).
    SlotsRemoved(Vec<u32>),
    /// repair found nothing to fix.
    HeaderClean,
    /// repair fixed these problems (always shown, on stderr).
    Repaired(Vec<String>),
    /// luksConvertKey wrote the keyslot again under this number.
    KeySlotCreated(u32),
}

impl Done {
    /// What cryptsetup says about it with `--verbose`, one line each.
    pub fn verbose(&self) -> Vec<String> {
        match self {
            Self::TokenCreated(id) => vec![format!("Token {id} created.")],
            Self::TokenRemoved(id) => vec![format!("Token {id} removed.")],
            Self::SlotsRemoved(slots) => slots
                .iter()
                .map(|s| format!("Key slot {s} removed."))
                .collect(),
            Self::HeaderClean => vec!["No known problems detected for LUKS header.".into()],
            Self::KeySlotCreated(s) => vec![format!("Key slot {s} created.")],
            _ => Vec::new(),
        }
    }
}

/// A token verb.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum TokenAction {
    /// Add a luks2-keyring token (needs a key description).
    Add,
    /// Remove a token (needs its id).
    Remove,
    /// Import a token's JSON (from a file, or stdin).
    Import,
    /// Return a token's JSON (or write it to a file).
    Export,
    /// Remove a keyslot from a token (needs its id and the slot).
    Unassign,
}

impl TokenAction {
    /// cryptsetup's names of the token verbs, in this enum's order.
    pub const NAMES: [&'static str; 5] = ["add", "remove", "import", "export", "unassign"];

    /// The verb cryptsetup names `name` (one of [`Self::NAMES`]).
    pub fn named(name: &str) -> Option<Self> {
        let all = [
            Self::Add,
            Self::Remove,
            Self::Import,
            Self::Export,
            Self::Unassign,
        ];
        Self::NAMES.iter().position(|n| *n == name).map(|i| all[i])
    }
}

/// `token ACTION`'s options.
#[derive(Debug, Clone)]
pub struct TokenRequest {
    /// The verb.
    pub action: TokenAction,
    /// `--token-id`.
    pub id: Option<u32>,
    /// `--key-slot`: assigned (add, import) or unassigned.
    pub key_slot: Option<u32>,
    /// `--json-file` (`-` or none = stdin / stdout).
    pub json_file: Option<PathBuf>,
    /// `--key-description` (add).
    pub key_description: Option<String>,
    /// `--token-replace`.
    pub replace: bool,
}

/// `json_file` unless it is absent or `-` (then standard input or output).
fn named(file: &Option<PathBuf>) -> Option<&Path> {
    file.as_deref().filter(|p| *p != Path::new("-"))
}

/// Runs a token verb.
pub fn token(t: &Target, req: &TokenRequest, ui: &mut dyn Ui) -> Result<Done> {
    let mut vol = t.load(ui)?;
    let at = TokenPlacement {
        id: req.id,
        keyslot: req.key_slot,
        replace: req.replace,
    };
    let need_id = || {
        req.id
            .ok_or_else(|| invalid("Action requires specific token. Use --token-id parameter."))
    };
    let io =
        |what: String| move |e: std::io::Error| Error::io_as(ErrorKind::InvalidArgument, what, e);
    Ok(match req.action {
        TokenAction::Add => {
            let d = req.key_description.as_deref().ok_or_else(|| {
                invalid("--key-description parameter is mandatory for token add action.")
            })?;
            Done::TokenCreated(vol.token_add_keyring(d, at)?)
        }
        TokenAction::Import => {
            let json = match named(&req.json_file) {
                Some(p) => std::fs::read(p).map_err(io(format!("Cannot read {}", p.display())))?,
                None => {
                    let mut v = Vec::new();
                    std::io::stdin()
                        .read_to_end(&mut v)
                        .map_err(io("Cannot read stdin".into()))?;
                    v
                }
            };
            Done::TokenCreated(vol.token_import(&json, at)?)
        }
        TokenAction::Remove => {
            let id = need_id()?;
            vol.token_remove(id)?;
            Done::TokenRemoved(id)
        }
        TokenAction::Export => {
            let text = vol.token_export(need_id()?)?;
            match named(&req.json_file) {
                Some(p) => {
                    std::fs::write(p, text).map_err(io(format!("Cannot write {}", p.display())))?;
                    Done::Nothing
                }
                None => Done::TokenJson(text),
            }
        }
        TokenAction::Unassign => {
            let id = need_id()?;
            let slot = req.key_slot.ok_or_else(|| {
                invalid("Action requires specific keyslot. Use --key-slot parameter.")
            })?;
            vol.token_unassign(id, slot)?;
            Done::Nothing
        }
    })
}

/// `config`'s options.
#[derive(Debug, Clone, Default)]
pub struct ConfigRequest {
    /// `--label` (the one of label and subsystem not given is cleared).
    pub label: Option<String>,
    /// `--subsystem`.
    pub subsystem: Option<String>,
    /// `--priority`: ignore, normal or prefer.
    pub priority: Option<String>,
    /// `--key-slot` for the priority.
    pub key_slot: Option<u32>,
}

/// Sets the LUKS2 label, subsystem or a keyslot's priority.
pub fn config(t: &Target, req: &ConfigRequest, ui: &mut dyn Ui) -> Result<Done> {
    let priority = req.priority.as_deref().map(Priority::parse).transpose()?;
    if priority.is_some() && req.key_slot.is_none() {
        return Err(invalid("Keyslot specification is required."));
    }
    let mut vol = t.load(ui)?;
    let (label, subsystem) = (req.label.as_deref(), req.subsystem.as_deref());
    if label.is_some() || subsystem.is_some() {
        // As cryptsetup's crypt_set_label: the one not given is cleared.
        vol.set_label(Some(label.unwrap_or("")), Some(subsystem.unwrap_or("")))?;
    }
    if let (Some(p), Some(s)) = (priority, req.key_slot) {
        vol.set_priority(s, p)?;
    }
    if label.is_none() && subsystem.is_none() && priority.is_none() {
        // cryptsetup rewrites the header unchanged; so does this.
        vol.set_label(None, None)?;
    }
    Ok(Done::Nothing)
}

/// luksErase: wipes every keyslot after cryptsetup's confirmation.
///
/// Refused while the volume is in use (mounted, mapped, served), where
/// cryptsetup would go on: the volume would then lose its keys under a
/// running mapping, and with them everything written to it until close.
/// `luksKillSlot` still removes keyslots one by one from a volume in use.
pub fn erase(t: &Target, ui: &mut dyn Ui) -> Result<Done> {
    let mut vol = t.load(ui)?;
    let _claim = t.claim()?;
    let warning = format!(
        "This operation will erase all keyslots on device {}.\nDevice will become unusable after this operation.",
        t.device.display()
    );
    confirm_destructive(ui, t.batch, &warning)?;
    Ok(Done::SlotsRemoved(vol.erase()?))
}

/// repair: rewrites what the header's checks find wrong.
pub fn repair(t: &Target, ui: &mut dyn Ui) -> Result<Done> {
    Ok(match t.load(ui)?.repair()? {
        Repair::Clean => Done::HeaderClean,
        Repair::Fixed(found) => Done::Repaired(found),
    })
}

/// convert: rewrites the header as `luks_type` (`luks1` or `luks2`) in
/// place; refused while the volume is in use, as cryptsetup refuses it.
pub fn convert(t: &Target, luks_type: &str, ui: &mut dyn Ui) -> Result<Done> {
    let version = match luks_type {
        "luks1" => 1,
        "luks2" => 2,
        t => {
            return Err(invalid(format!(
                "Invalid LUKS type {t:?}, only luks1 and luks2 are supported."
            )))
        }
    };
    let mut vol = t.load(ui)?;
    if vol.header().version() == version {
        return Err(invalid(format!("Device is already LUKS{version} type.")));
    }
    // cryptsetup refuses to convert an active volume, in these words.
    let _claim = t.claim().map_err(|e| match e.kind() {
        ErrorKind::Busy => Error::new(
            ErrorKind::Busy,
            format!(
                "Cannot convert device {} which is still in use.",
                t.meta().display()
            ),
        ),
        _ => e,
    })?;
    let warning = format!(
        "This operation will convert {} to LUKS{version} format.",
        t.meta().display()
    );
    confirm_destructive(ui, t.batch, &warning)?;
    vol.convert(version)?;
    Ok(Done::Nothing)
}

/// luksConvertKey's options.
#[derive(Debug, Clone)]
pub struct ConvertKeyRequest {
    /// The keyslot's passphrase.
    pub key: KeySource,
    /// Convert only this keyslot.
    pub key_slot: Option<u32>,
    /// The new key derivation.
    pub kdf: KdfChoice,
}

/// luksConvertKey: re-seals the keyslot the passphrase opens (LUKS2 only).
pub fn convert_key(t: &Target, req: &ConvertKeyRequest, ui: &mut dyn Ui) -> Result<Done> {
    let mut vol = t.load(ui)?;
    if vol.header().version() != 2 {
        return Err(invalid(format!(
            "Device {} is not a valid LUKS2 device.",
            t.meta().display()
        )));
    }
    let prompt = match req.key_slot {
        Some(s) => format!("Enter passphrase for keyslot {s}: "),
        None => "Enter passphrase for keyslot to be converted: ".to_string(),
    };
    let kdf = req.kdf.request(2)?;
    let slot = req
        .key
        .unlock(&prompt, |pass| vol.convert_key(pass, req.key_slot, &kdf))?;
    Ok(Done::KeySlotCreated(slot))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers every question with `yes` and records what was asked.
    struct Scripted {
        yes: bool,
        asked: Vec<String>,
    }

    impl Ui for Scripted {
        fn warn(&mut self, _: &str) {}
        fn confirm(&mut self, q: &str) -> bool {
            self.asked.push(q.to_string());
            self.yes
        }
    }

    #[test]
    fn destructive_verbs_ask_as_cryptsetup_does() {
        let mut ui = Scripted {
            yes: false,
            asked: Vec::new(),
        };
        let e = confirm_destructive(&mut ui, false, "Gone.").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert_eq!(e.to_string(), "Gone. Not confirmed (use --batch-mode).");
        assert_eq!(ui.asked, ["\nWARNING!\n========\nGone.\n\nAre you sure?"]);
        confirm_destructive(&mut ui, true, "Gone.").unwrap();
        ui.yes = true;
        confirm_destructive(&mut ui, false, "Gone.").unwrap();
        assert_eq!(ui.asked.len(), 2, "batch mode asks nothing");
    }

    #[test]
    fn header_verbs_say_not_luks_with_a_full_stop() {
        let dir = testutil::TempDir::new("luks-ops-admin");
        let zeros = dir.join("zeros");
        std::fs::write(&zeros, vec![0u8; 8192]).unwrap();
        let mut ui = Scripted {
            yes: true,
            asked: Vec::new(),
        };
        let t = Target {
            device: zeros.clone(),
            header: None,
            batch: true,
            access: crate::DeviceAccess::default(),
        };
        let e = repair(&t, &mut ui).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotLuks);
        let want = format!("Device {} is not a valid LUKS device", zeros.display());
        assert_eq!(e.to_string(), format!("{want}."));
        let e = super::super::load(&zeros, None, &crate::DeviceAccess::default(), &mut ui)
            .err()
            .unwrap();
        assert_eq!(e.to_string(), want);
        let missing = Target {
            device: dir.join("missing"),
            ..t
        };
        let e = erase(&missing, &mut ui).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Io);
        assert!(e
            .to_string()
            .ends_with("missing does not exist or access denied"));
    }

    #[test]
    fn verbose_lines_are_cryptsetup_s() {
        assert_eq!(
            Done::SlotsRemoved(vec![0, 3]).verbose(),
            ["Key slot 0 removed.", "Key slot 3 removed."]
        );
        assert_eq!(Done::TokenCreated(2).verbose(), ["Token 2 created."]);
        assert!(Done::Repaired(vec!["x".into()]).verbose().is_empty());
    }
}
