//! LUKS2 tokens as cryptsetup 2.6's `token` verbs handle them: add a
//! `luks2-keyring` token, import one from JSON, export, remove, and
//! unassign a keyslot. Every change is a header write through the
//! crash-safe two-copy path; the metadata is validated before it is
//! written, so a token can never name a keyslot that does not exist.

use serde_json::{Map, Value};

use super::io::write_luks2;
use super::Volume;
use crate::error::{invalid, Error, ErrorKind, Result};
use crate::luks2::{self, json::MAX_KEYSLOTS};
use crate::Header;

/// The token type cryptsetup's `token add --key-description` writes.
pub const KEYRING_TOKEN: &str = "luks2-keyring";

/// Where a new token goes and what it opens.
#[derive(Debug, Clone, Copy, Default)]
pub struct TokenPlacement {
    /// Token id (`--token-id`); the first free one when `None`.
    pub id: Option<u32>,
    /// Keyslot to assign (`--key-slot`). For `add` without one, the token
    /// is assigned to every keyslot, as cryptsetup does.
    pub keyslot: Option<u32>,
    /// Replace a token already at `id` (`--token-replace`).
    pub replace: bool,
}

/// "Device X is not a valid LUKS2 device." for verbs only LUKS2 has.
pub(crate) fn not_luks2(vol: &Volume) -> Error {
    Error::new(
        ErrorKind::InvalidArgument,
        format!(
            "Device {} is not a valid LUKS2 device.",
            vol.meta_path.display()
        ),
    )
}

fn token_unused(id: u32) -> Error {
    Error::new(
        ErrorKind::InvalidArgument,
        format!("Token {id} is not in use."),
    )
}

impl Volume {
    fn v2(&self) -> Result<&luks2::Header> {
        match &self.header {
            Header::V2(h) => Ok(h),
            Header::V1(_) => Err(not_luks2(self)),
        }
    }

    /// Runs `change` on the LUKS2 header and writes it back (validated).
    pub(crate) fn update_v2(
        &mut self,
        change: impl FnOnce(&mut luks2::Header) -> Result<()>,
    ) -> Result<()> {
        if let Header::V1(_) = self.header {
            return Err(not_luks2(self));
        }
        let mut f = self.open_update()?;
        let Header::V2(h) = &mut self.header else {
            unreachable!("checked above")
        };
        let mut new = h.clone();
        change(&mut new)?;
        write_luks2(&mut f, &mut new)?;
        *h = new;
        Ok(())
    }

    /// Ids of the tokens in use, ascending.
    pub fn token_ids(&self) -> Vec<u32> {
        match &self.header {
            Header::V1(_) => Vec::new(),
            Header::V2(h) => {
                let mut v: Vec<u32> = h
                    .meta
                    .tokens
                    .keys()
                    .filter_map(|k| k.parse().ok())
                    .collect();
                v.sort_unstable();
                v
            }
        }
    }

    /// cryptsetup `token add --key-description D`: a `luks2-keyring`
    /// token. Returns its id.
    pub fn token_add_keyring(&mut self, description: &str, at: TokenPlacement) -> Result<u32> {
        let h = self.v2()?;
        let keyslots: Vec<Value> = match at.keyslot {
            Some(s) => {
                check_active(h, s)?;
                vec![Value::String(s.to_string())]
            }
            None => {
                let mut ids: Vec<u32> = h
                    .meta
                    .keyslots
                    .keys()
                    .filter_map(|k| k.parse().ok())
                    .collect();
                ids.sort_unstable();
                ids.into_iter()
                    .map(|s| Value::String(s.to_string()))
                    .collect()
            }
        };
        let mut obj = Map::new();
        obj.insert("type".into(), KEYRING_TOKEN.into());
        obj.insert("keyslots".into(), Value::Array(keyslots));
        obj.insert("key_description".into(), description.into());
        self.put_token(Value::Object(obj), at)
    }

    /// cryptsetup `token import`: the token object in `json`, plus the
    /// `--key-slot` assignment if given. Returns its id.
    pub fn token_import(&mut self, json: &[u8], at: TokenPlacement) -> Result<u32> {
        let h = self.v2()?;
        let value: Value = serde_json::from_slice(json)
            .map_err(|_| invalid("Failed to import token from file."))?;
        check_token(h, &value).map_err(|e| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("Failed to import token from file. ({})", e.message()),
            )
        })?;
        let mut value = value;
        if let Some(s) = at.keyslot {
            check_active(h, s)?;
            assign(&mut value, s);
        }
        self.put_token(value, at)
    }

    fn put_token(&mut self, token: Value, at: TokenPlacement) -> Result<u32> {
        let h = self.v2()?;
        let id = match at.id {
            Some(id) if id >= MAX_KEYSLOTS => {
                return Err(invalid(format!("Token {id} is invalid.")));
            }
            Some(id) if h.meta.tokens.contains_key(&id.to_string()) && !at.replace => {
                return Err(invalid(format!("Token {id} in use.")));
            }
            Some(id) => id,
            None => (0..MAX_KEYSLOTS)
                .find(|i| !h.meta.tokens.contains_key(&i.to_string()))
                .ok_or_else(|| invalid("No free token slot."))?,
        };
        self.update_v2(|h| {
            h.meta.tokens.insert(id.to_string(), token);
            Ok(())
        })?;
        Ok(id)
    }

    /// cryptsetup `token remove --token-id N`.
    pub fn token_remove(&mut self, id: u32) -> Result<()> {
        if !self.v2()?.meta.tokens.contains_key(&id.to_string()) {
            return Err(token_unused(id));
        }
        self.update_v2(|h| {
            h.meta.tokens.remove(&id.to_string());
            Ok(())
        })
    }

    /// cryptsetup `token export --token-id N`: the token's JSON, as
    /// cryptsetup prints it (no trailing newline).
    pub fn token_export(&self, id: u32) -> Result<String> {
        let h = self.v2()?;
        let t = h.meta.tokens.get(&id.to_string()).ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("Token {id} is not in use.\nFailed to get token {id} for export."),
            )
        })?;
        Ok(token_text(t))
    }

    /// cryptsetup `token unassign --token-id N --key-slot S`.
    pub fn token_unassign(&mut self, id: u32, keyslot: u32) -> Result<()> {
        let h = self.v2()?;
        let t = h
            .meta
            .tokens
            .get(&id.to_string())
            .ok_or_else(|| token_unused(id))?;
        let s = keyslot.to_string();
        let assigned = t["keyslots"]
            .as_array()
            .is_some_and(|a| a.iter().any(|k| k.as_str() == Some(&s)));
        if !assigned {
            return Err(invalid(format!(
                "Token {id} is not assigned to keyslot {keyslot}."
            )));
        }
        self.update_v2(|h| {
            if let Some(a) = h
                .meta
                .tokens
                .get_mut(&id.to_string())
                .and_then(|t| t.get_mut("keyslots"))
                .and_then(Value::as_array_mut)
            {
                a.retain(|k| k.as_str() != Some(&s));
            }
            Ok(())
        })
    }
}

fn check_active(h: &luks2::Header, slot: u32) -> Result<()> {
    if h.meta.keyslots.contains_key(&slot.to_string()) {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::SlotInactive,
            format!("Keyslot {slot} is not active."),
        ))
    }
}

/// Adds `slot` to the token's keyslots (once), as `crypt_token_assign_keyslot`.
fn assign(token: &mut Value, slot: u32) {
    let s = slot.to_string();
    if let Some(a) = token.get_mut("keyslots").and_then(Value::as_array_mut) {
        if !a.iter().any(|k| k.as_str() == Some(&s)) {
            a.push(Value::String(s));
        }
    }
}

/// cryptsetup's `LUKS2_token_validate` plus the keyring handler's check:
/// an object with a string `type`, a `keyslots` array of ids of existing
/// keyslots, and for `luks2-keyring` a string `key_description`.
fn check_token(h: &luks2::Header, t: &Value) -> Result<()> {
    let obj = t
        .as_object()
        .ok_or_else(|| invalid("the token is not a JSON object"))?;
    let ty = obj
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| invalid("the token has no type"))?;
    let slots = obj
        .get("keyslots")
        .and_then(Value::as_array)
        .ok_or_else(|| invalid("the token has no keyslots array"))?;
    for k in slots {
        let k = k
            .as_str()
            .ok_or_else(|| invalid("a token keyslot is not a string"))?;
        if !h.meta.keyslots.contains_key(k) {
            return Err(invalid(format!("the token names missing keyslot {k:?}")));
        }
    }
    if ty == KEYRING_TOKEN && !obj.get("key_description").is_some_and(Value::is_string) {
        return Err(invalid("a luks2-keyring token needs a key_description"));
    }
    Ok(())
}

/// One token's JSON as cryptsetup writes it: `type` and `keyslots` first,
/// then the other fields.
pub fn token_text(t: &Value) -> String {
    let Some(obj) = t.as_object() else {
        return t.to_string();
    };
    let mut parts = Vec::with_capacity(obj.len());
    let first = ["type", "keyslots"];
    for k in first {
        if let Some(v) = obj.get(k) {
            parts.push(format!("{}:{v}", Value::from(k)));
        }
    }
    for (k, v) in obj.iter().filter(|(k, _)| !first.contains(&k.as_str())) {
        parts.push(format!("{}:{v}", Value::from(k.as_str())));
    }
    format!("{{{}}}", parts.join(","))
}
