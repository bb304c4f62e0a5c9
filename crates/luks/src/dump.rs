//! The `cryptsetup luksDump` text of a header, for both LUKS versions, and
//! its `--dump-volume-key` variant.
//!
//! The layout (labels, tabs, 16 hex bytes a line) is cryptsetup's, so the
//! output can be compared with `cryptsetup luksDump` line for line.
//! Callers print the returned text as it is.
//!
//! Every string taken from a header (label, subsystem, UUID, ciphers,
//! hashes, KDF, keyslot, segment, digest and token types, flags, key
//! descriptions) goes through [`escape`]: a crafted header cannot send
//! terminal escape sequences to whoever dumps it. Control characters
//! (C0, DEL, C1) become `\xNN` and a backslash `\\`, as systemd's
//! `cescape` writes them. The JSON forms escape the same characters as
//! `\u00NN`. The volume key's hex is written into a
//! [`Secret`](crypto::Secret) (locked, wiped pages), never the heap.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::path::Path;

use crypto::Secret;

use crate::{luks1, luks2, Header, Opened};

/// `s` with control characters (C0, DEL, C1) as `\xNN` and `\` as
/// `\\`; borrowed when there is nothing to escape.
pub fn escape(s: &str) -> Cow<'_, str> {
    if !s.chars().any(|c| c.is_control() || c == '\\') {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            // Writing to a String cannot fail.
            c if c.is_control() => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

/// A file name for the text (the user's own, but it may hold anything).
fn shown(p: &Path) -> String {
    escape(&p.to_string_lossy()).into_owned()
}

/// The `luksDump` text of `header`. `target` is the file the header was
/// read from (the data device or a detached header), which LUKS1 names in
/// its first line.
pub fn header_text(header: &Header, target: &Path) -> String {
    match header {
        Header::V1(h) => v1(h, target),
        Header::V2(h) => v2(h),
    }
}

/// The `luksDump --dump-json-metadata` text: the LUKS2 JSON area pretty
/// printed the way cryptsetup's json-c does it (two-space indent, no space
/// after `:`, no final newline). LUKS1 has no JSON: `None`.
pub fn json_text(header: &Header) -> Option<String> {
    let Header::V2(h) = header else {
        return None;
    };
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, JsonC { indent: 0 });
    // Invariant: the metadata is plain maps, strings and numbers, which
    // always serialize.
    serde::Serialize::serialize(&h.meta, &mut ser).ok()?;
    String::from_utf8(out).ok()
}

/// A JSON string's unescaped run with DEL and the C1 controls as
/// `\u00NN` (serde_json leaves them raw; C0 never reaches here).
pub(crate) fn write_json_fragment<W: ?Sized + std::io::Write>(
    w: &mut W,
    fragment: &str,
) -> std::io::Result<()> {
    let mut rest = fragment;
    while let Some(i) = rest.find(|c: char| c.is_control()) {
        w.write_all(&rest.as_bytes()[..i])?;
        let c = rest[i..].chars().next().unwrap_or_default();
        write!(w, "\\u{:04x}", u32::from(c))?;
        rest = &rest[i + c.len_utf8()..];
    }
    w.write_all(rest.as_bytes())
}

/// json-c's `JSON_C_TO_STRING_PRETTY` layout for serde_json.
struct JsonC {
    indent: usize,
}

impl JsonC {
    fn newline<W: ?Sized + std::io::Write>(&self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b"\n")?;
        for _ in 0..self.indent {
            w.write_all(b"  ")?;
        }
        Ok(())
    }
}

impl serde_json::ser::Formatter for JsonC {
    /// serde_json escapes C0 itself; DEL and C1 are escaped here too.
    fn write_string_fragment<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        fragment: &str,
    ) -> std::io::Result<()> {
        write_json_fragment(w, fragment)
    }
    fn begin_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.indent += 1;
        w.write_all(b"{")
    }
    fn end_object<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.indent -= 1;
        self.newline(w)?;
        w.write_all(b"}")
    }
    fn begin_object_key<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if !first {
            w.write_all(b",")?;
        }
        self.newline(w)
    }
    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        w.write_all(b":")
    }
    fn begin_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.indent += 1;
        w.write_all(b"[")
    }
    fn end_array<W: ?Sized + std::io::Write>(&mut self, w: &mut W) -> std::io::Result<()> {
        self.indent -= 1;
        self.newline(w)?;
        w.write_all(b"]")
    }
    fn begin_array_value<W: ?Sized + std::io::Write>(
        &mut self,
        w: &mut W,
        first: bool,
    ) -> std::io::Result<()> {
        if !first {
            w.write_all(b",")?;
        }
        self.newline(w)
    }
}

/// The `luksDump --dump-volume-key` text: cipher, payload offset, UUID and
/// the volume key of `opened` in hex, in locked pages wiped on drop.
pub fn volume_key_text(header: &Header, opened: &Opened, target: &Path) -> Secret {
    let cipher = header.cipher();
    let (name, mode) = cipher.split_once('-').unwrap_or((cipher.as_str(), ""));
    let key = &opened.volume_key;
    let head = format!(
        "LUKS header information for {}\n\
         Cipher name:   \t{}\n\
         Cipher mode:   \t{}\n\
         Payload offset:\t{}\n\
         UUID:          \t{}\n\
         MK bits:       \t{}\n\
         MK dump:\t",
        shown(target),
        escape(name),
        escape(mode),
        opened.payload_offset / 512,
        escape(header.uuid()),
        key.len() * 8
    );
    // Room for all of it up front: the secret never moves.
    let mut out = Secret::with_capacity(head.len() + key.len() * 4 + 8);
    out.extend_from_slice(head.as_bytes());
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, chunk) in key.chunks(16).enumerate() {
        if i > 0 {
            out.extend_from_slice(b"\n\t\t");
        }
        for b in chunk {
            out.push(DIGITS[usize::from(b >> 4)]);
            out.push(DIGITS[usize::from(b & 0xf)]);
            out.push(b' ');
        }
    }
    out.push(b'\n');
    out
}

/// Appends `bytes` as `ab cd ` groups, `per_line` a line, continuation
/// lines starting with `cont`.
fn push_hex(s: &mut String, bytes: &[u8], cont: &str, per_line: usize) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (i, chunk) in bytes.chunks(per_line).enumerate() {
        if i > 0 {
            s.push('\n');
            s.push_str(cont);
        }
        for b in chunk {
            s.push(char::from(DIGITS[usize::from(b >> 4)]));
            s.push(char::from(DIGITS[usize::from(b & 0xf)]));
            s.push(' ');
        }
    }
}

/// `bytes` as hex lines of 16 (see [`push_hex`]).
fn hex_lines(bytes: &[u8], cont: &str) -> String {
    let mut s = String::new();
    push_hex(&mut s, bytes, cont, 16);
    s
}

fn v1(h: &luks1::Header, target: &Path) -> String {
    let mut digest = String::new();
    push_hex(&mut digest, &h.mk_digest, "", 20);
    let mut s = format!("LUKS header information for {}\n\n", shown(target));
    s.push_str("Version:       \t1\n");
    s.push_str(&format!(
        "Cipher name:   \t{}\nCipher mode:   \t{}\n",
        escape(&h.cipher_name),
        escape(&h.cipher_mode)
    ));
    s.push_str(&format!("Hash spec:     \t{}\n", h.hash.name()));
    s.push_str(&format!("Payload offset:\t{}\n", h.payload_offset));
    s.push_str(&format!("MK bits:       \t{}\n", h.key_bytes * 8));
    s.push_str(&format!("MK digest:     \t{digest}\n"));
    s.push_str(&format!(
        "MK salt:       \t{}\n",
        hex_lines(&h.mk_digest_salt, "               \t")
    ));
    s.push_str(&format!("MK iterations: \t{}\n", h.mk_digest_iterations));
    s.push_str(&format!("UUID:          \t{}\n\n", escape(&h.uuid)));
    for (i, k) in h.slots.iter().enumerate() {
        if k.active {
            s.push_str(&format!("Key Slot {i}: ENABLED\n"));
            s.push_str(&format!("\tIterations:         \t{}\n", k.iterations));
            s.push_str(&format!(
                "\tSalt:               \t{}\n",
                hex_lines(&k.salt, "\t                      \t")
            ));
            s.push_str(&format!(
                "\tKey material offset:\t{}\n",
                k.key_material_offset
            ));
            s.push_str(&format!("\tAF stripes:            \t{}\n", k.stripes));
        } else {
            s.push_str(&format!("Key Slot {i}: DISABLED\n"));
        }
    }
    s
}

/// A base64 header field as hex lines, or `(invalid)`.
fn b64_hex(b64: &str, cont: &str) -> String {
    match luks2::json::b64_decode(b64, "value") {
        Ok(v) => hex_lines(&v, cont),
        Err(_) => "(invalid)".into(),
    }
}

fn v2(h: &luks2::Header) -> String {
    let m = &h.meta;
    let mut s = String::from("LUKS header information\n");
    s.push_str("Version:       \t2\n");
    s.push_str(&format!("Epoch:         \t{}\n", h.bin.seqid));
    s.push_str(&format!("Metadata area: \t{} [bytes]\n", h.bin.hdr_size));
    s.push_str(&format!(
        "Keyslots area: \t{} [bytes]\n",
        m.config.keyslots_size
    ));
    s.push_str(&format!("UUID:          \t{}\n", escape(&h.bin.uuid)));
    let or = |v: &str, none: &str| {
        if v.is_empty() {
            none.to_string()
        } else {
            escape(v).into_owned()
        }
    };
    s.push_str(&format!(
        "Label:         \t{}\n",
        or(&h.bin.label, "(no label)")
    ));
    s.push_str(&format!(
        "Subsystem:     \t{}\n",
        or(&h.bin.subsystem, "(no subsystem)")
    ));
    let flags = m
        .config
        .flags
        .as_ref()
        .map(|f| f.join(" "))
        .unwrap_or_default();
    s.push_str(&format!("Flags:       \t{}\n\n", or(&flags, "(no flags)")));
    s.push_str("Data segments:\n");
    for (id, seg) in &m.segments {
        s.push_str(&format!("  {}: {}\n", escape(id), escape(&seg.kind)));
        s.push_str(&format!("\toffset: {} [bytes]\n", seg.offset));
        match seg.fixed_size() {
            Ok(Some(n)) => s.push_str(&format!("\tlength: {n} [bytes]\n")),
            _ => s.push_str("\tlength: (whole device)\n"),
        }
        if seg.kind == "crypt" {
            s.push_str(&format!("\tcipher: {}\n", escape(&seg.encryption)));
            s.push_str(&format!("\tsector: {} [bytes]\n", seg.sector_size));
            if seg.iv_tweak != 0 {
                s.push_str(&format!("\tIV tweak: {}\n", seg.iv_tweak));
            }
        }
        s.push('\n');
    }
    s.push_str("Keyslots:\n");
    let mut ids: Vec<(u32, &String)> = m
        .keyslots
        .keys()
        .filter_map(|k| k.parse().ok().map(|n| (n, k)))
        .collect();
    ids.sort_unstable();
    let cont = "\t            ";
    for (_, id) in ids {
        let k = &m.keyslots[id];
        s.push_str(&format!("  {}: {}\n", escape(id), escape(&k.kind)));
        s.push_str(&format!("\tKey:        {} bits\n", k.key_size * 8));
        let prio = match k.extra.get("priority").and_then(|p| p.as_i64()) {
            Some(0) => "ignored",
            Some(2) => "preferred",
            _ => "normal",
        };
        s.push_str(&format!("\tPriority:   {prio}\n"));
        s.push_str(&format!("\tCipher:     {}\n", escape(&k.area.encryption)));
        s.push_str(&format!("\tCipher key: {} bits\n", k.area.key_size * 8));
        s.push_str(&format!("\tPBKDF:      {}\n", escape(&k.kdf.kind)));
        if k.kdf.kind == "pbkdf2" {
            s.push_str(&format!(
                "\tHash:       {}\n",
                escape(k.kdf.hash.as_deref().unwrap_or("?"))
            ));
            s.push_str(&format!(
                "\tIterations: {}\n",
                k.kdf.iterations.unwrap_or(0)
            ));
        } else {
            s.push_str(&format!("\tTime cost:  {}\n", k.kdf.time.unwrap_or(0)));
            s.push_str(&format!("\tMemory:     {}\n", k.kdf.memory.unwrap_or(0)));
            s.push_str(&format!("\tThreads:    {}\n", k.kdf.cpus.unwrap_or(0)));
        }
        s.push_str(&format!("\tSalt:       {}\n", b64_hex(&k.kdf.salt, cont)));
        s.push_str(&format!("\tAF stripes: {}\n", k.af.stripes));
        s.push_str(&format!("\tAF hash:    {}\n", escape(&k.af.hash)));
        s.push_str(&format!("\tArea offset:{} [bytes]\n", k.area.offset));
        s.push_str(&format!("\tArea length:{} [bytes]\n", k.area.size));
        if let Some((did, _)) = m.digests.iter().find(|(_, d)| d.keyslots.contains(id)) {
            s.push_str(&format!("\tDigest ID:  {}\n", escape(did)));
        }
    }
    s.push_str("Tokens:\n");
    for (id, t) in &m.tokens {
        let ty = t.get("type").and_then(|v| v.as_str()).unwrap_or("?");
        s.push_str(&format!("  {}: {}\n", escape(id), escape(ty)));
        if ty == "luks2-keyring" {
            if let Some(d) = t.get("key_description").and_then(|v| v.as_str()) {
                s.push_str(&format!("\tKey description: {}\n", escape(d)));
            }
        }
        // The keyslots a token unlocks, in its array order (cryptsetup's
        // hdr_dump_tokens).
        for k in t
            .get("keyslots")
            .and_then(|v| v.as_array())
            .into_iter()
            .flatten()
        {
            let k = k
                .as_str()
                .map(str::to_string)
                .unwrap_or_else(|| k.to_string());
            s.push_str(&format!("\tKeyslot:    {}\n", escape(&k)));
        }
    }
    s.push_str("Digests:\n");
    for (id, d) in &m.digests {
        s.push_str(&format!("  {}: {}\n", escape(id), escape(&d.kind)));
        s.push_str(&format!("\tHash:       {}\n", escape(&d.hash)));
        s.push_str(&format!("\tIterations: {}\n", d.iterations));
        s.push_str(&format!("\tSalt:       {}\n", b64_hex(&d.salt, cont)));
        s.push_str(&format!("\tDigest:     {}\n", b64_hex(&d.digest, cont)));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_lines_wrap_with_continuation() {
        let bytes: Vec<u8> = (0u8..18).collect();
        assert_eq!(
            hex_lines(&bytes, "\t"),
            "00 01 02 03 04 05 06 07 08 09 0a 0b 0c 0d 0e 0f \n\t10 11 "
        );
        assert_eq!(hex_lines(&[], "\t"), "");
        assert_eq!(b64_hex("!!", ""), "(invalid)");
    }

    #[test]
    fn control_characters_are_escaped() {
        assert!(matches!(escape("aes-xts-plain64"), Cow::Borrowed(_)));
        assert_eq!(escape("\x1b[2J\x07"), "\\x1b[2J\\x07");
        assert_eq!(escape("a\u{7f}b\u{9b}c\td\n"), "a\\x7fb\\x9bc\\x09d\\x0a");
        assert_eq!(escape("back\\slash"), "back\\\\slash");
        assert_eq!(escape("ünïcode"), "ünïcode");
        let mut out = Vec::new();
        write_json_fragment(&mut out, "x\u{7f}y\u{85}z").unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "x\\u007fy\\u0085z");
    }
}
