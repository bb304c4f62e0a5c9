//! NBD over TLS for the daemon: `--tls=off|on|require`,
//! `--tls-certificates DIR`, `--tls-psk FILE`, `--tls-verify-peer[=yes|no]`
//! (as nbdkit spells them, with qemu's `verify-peer` default over TCP),
//! checked against the export before anything starts and loaded into an
//! [`nbd::TlsConfig`].
//!
//! Rules:
//!
//! * credentials alone mean `--tls=require`; `on`/`require` need one kind
//!   of credentials;
//! * over TCP (`--listen`) every client is authenticated unless the user
//!   says otherwise in so many words: by its pre-shared key, or by a
//!   client certificate signed by the directory's `ca-cert.pem` (peer
//!   verification is on by default there, as in qemu's `tls-creds-x509`);
//!   no credentials need an explicit `--tls=off`, an unverified X.509
//!   export an explicit `--tls-verify-peer=no`, and the caller then warns
//!   on the terminal ([`TlsSpec::tcp_warning`]);
//! * `--tls=on` over TCP is refused: it would still serve a client that
//!   skips `STARTTLS`, so a stranger gets in exactly as without TLS, and a
//!   script that asked for TLS would believe it has it. (`on` stays for
//!   the unix socket, where the socket's 0600 mode already decides who
//!   connects.)
//! * on a unix socket peer verification stays off unless asked for.

use std::path::{Path, PathBuf};

use nbd::{TlsConfig, TlsMode};
use serde::{Deserialize, Serialize};

use crate::error::{invalid, Result};
use crate::export::ExportSpec;

/// The NBD TLS options of `ucrypt open`, checked (part of a
/// [`crate::VolumeSpec`]: peer verification is always spelled out, so a
/// detached daemon never falls back on a default).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSpec {
    /// `--tls`, if given.
    #[serde(with = "opt_mode")]
    pub mode: Option<TlsMode>,
    /// `--tls-certificates`: a qemu/nbdkit-layout directory (absolute).
    pub certificates: Option<PathBuf>,
    /// `--tls-psk`: a psktool key file (absolute).
    pub psk: Option<PathBuf>,
    /// Clients must present a certificate signed by the directory's
    /// `ca-cert.pem`: `--tls-verify-peer[=yes|no]` as given, else on over
    /// TCP with `--tls-certificates` and off on a unix socket.
    pub verify_peer: bool,
}

/// The terminal warning for NBD over TCP without TLS.
const PLAINTEXT_WARNING: &str = "ucrypt: warning: NBD over TCP without TLS (--tls=off) is \
     unencrypted on the wire: anyone who can reach the port can read and write the decrypted \
     device";

/// The terminal warning for X.509 over TCP without client verification.
const UNVERIFIED_WARNING: &str = "ucrypt: warning: NBD over TCP with --tls-verify-peer=no \
     serves any client that completes TLS: anyone who can reach the port can read and write \
     the decrypted device";

impl TlsSpec {
    /// Parses the options and checks them against `export`; `verify_peer`
    /// is `--tls-verify-peer`'s value if given. Paths are made absolute (a
    /// detached daemon runs in `/`).
    pub fn new(
        mode: Option<&str>,
        certificates: Option<&Path>,
        psk: Option<&Path>,
        verify_peer: Option<bool>,
        export: &ExportSpec,
    ) -> Result<Self> {
        let mode = mode
            .map(|m| {
                m.parse::<TlsMode>()
                    .map_err(|_| invalid(format!("Invalid --tls {m:?}: use off, on or require")))
            })
            .transpose()?;
        let abs = |p: &Path| {
            std::path::absolute(p)
                .map_err(|e| invalid(format!("Invalid path {}", p.display())).with_source(e))
        };
        let tcp = matches!(export, ExportSpec::NbdTcp(_));
        let spec = Self {
            mode,
            certificates: certificates.map(abs).transpose()?,
            psk: psk.map(abs).transpose()?,
            verify_peer: verify_peer.unwrap_or(tcp && certificates.is_some()),
        };
        spec.check(export, verify_peer)?;
        Ok(spec)
    }

    fn check(&self, export: &ExportSpec, verify_given: Option<bool>) -> Result<()> {
        let creds = self.certificates.is_some() || self.psk.is_some();
        let nbd = matches!(export, ExportSpec::NbdUnix(_) | ExportSpec::NbdTcp(_));
        let tcp = matches!(export, ExportSpec::NbdTcp(_));
        if !nbd && (creds || self.mode.is_some() || verify_given.is_some()) {
            return Err(invalid("The --tls options apply only to --export nbd"));
        }
        if self.certificates.is_some() && self.psk.is_some() {
            return Err(invalid(
                "Give either --tls-certificates or --tls-psk, not both",
            ));
        }
        if verify_given.is_some() && self.certificates.is_none() {
            return Err(invalid(
                "--tls-verify-peer needs --tls-certificates DIR (with ca-cert.pem)",
            ));
        }
        match self.mode {
            Some(TlsMode::Off) if creds => Err(invalid(
                "--tls=off contradicts --tls-certificates / --tls-psk",
            )),
            Some(m @ (TlsMode::On | TlsMode::Require)) if !creds => Err(invalid(format!(
                "--tls={m} needs --tls-certificates DIR or --tls-psk FILE"
            ))),
            Some(TlsMode::On) if tcp => Err(invalid(
                "--tls=on over TCP (--listen) would still serve clients that skip TLS: use \
                 --tls=require (the default with credentials)",
            )),
            None if !creds && tcp => Err(invalid(
                "--listen serves NBD over TCP, where anyone who can reach the port reads and \
                 writes the decrypted device: give --tls-certificates DIR (clients need a \
                 certificate signed by its ca-cert.pem) or --tls-psk FILE (TLS required), or \
                 --tls=off to serve it unencrypted",
            )),
            _ => Ok(()),
        }
    }

    /// The mode in force: as given, else `require` with credentials, else
    /// `off`.
    pub fn effective_mode(&self) -> TlsMode {
        match self.mode {
            Some(m) => m,
            None if self.certificates.is_some() || self.psk.is_some() => TlsMode::Require,
            None => TlsMode::Off,
        }
    }

    /// True when NBD goes over TCP without TLS (the user said `--tls=off`).
    pub fn plaintext_tcp(&self, export: &ExportSpec) -> bool {
        matches!(export, ExportSpec::NbdTcp(_)) && self.effective_mode() == TlsMode::Off
    }

    /// True when NBD goes over TCP with X.509 but serves clients without
    /// a certificate (the user said `--tls-verify-peer=no`).
    pub fn unverified_tcp(&self, export: &ExportSpec) -> bool {
        matches!(export, ExportSpec::NbdTcp(_))
            && self.certificates.is_some()
            && !self.verify_peer
            && self.effective_mode() != TlsMode::Off
    }

    /// The warning for the user's terminal when a TCP export serves
    /// clients nobody authenticated: [`TlsSpec::plaintext_tcp`] or
    /// [`TlsSpec::unverified_tcp`] (a detached daemon's own warning only
    /// reaches its log).
    pub fn tcp_warning(&self, export: &ExportSpec) -> Option<&'static str> {
        if self.plaintext_tcp(export) {
            Some(PLAINTEXT_WARNING)
        } else if self.unverified_tcp(export) {
            Some(UNVERIFIED_WARNING)
        } else {
            None
        }
    }

    /// Loads the credentials; errors name the file and the reason.
    pub fn load(&self) -> Result<TlsConfig> {
        let mode = self.effective_mode();
        let loaded = match (&self.certificates, &self.psk) {
            (Some(dir), _) => TlsConfig::x509(mode, dir, self.verify_peer),
            (None, Some(file)) => TlsConfig::psk(mode, file),
            (None, None) => return Ok(TlsConfig::off()),
        };
        loaded.map_err(|e| invalid(e.to_string()))
    }
}

/// An optional [`TlsMode`] in a [`crate::VolumeSpec`]: its `--tls` word
/// (`off`, `on`, `require`) or `null`.
mod opt_mode {
    use nbd::TlsMode;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(m: &Option<TlsMode>, s: S) -> Result<S::Ok, S::Error> {
        match m {
            Some(m) => s.serialize_some(&m.to_string()),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<TlsMode>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|m| {
                m.parse::<TlsMode>()
                    .map_err(|_| serde::de::Error::custom(format!("unknown TLS mode {m:?}")))
            })
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp() -> ExportSpec {
        ExportSpec::parse("nbd", Some("0")).unwrap()
    }

    fn unix() -> ExportSpec {
        ExportSpec::parse("nbd", None).unwrap()
    }

    #[test]
    fn listen_needs_tls_or_an_explicit_off() {
        let e = TlsSpec::new(None, None, None, None, &tcp()).unwrap_err();
        assert!(e.to_string().contains("--tls=off"), "{e}");
        let off = TlsSpec::new(Some("off"), None, None, None, &tcp()).unwrap();
        assert!(off.plaintext_tcp(&tcp()));
        assert!(off.tcp_warning(&tcp()).unwrap().contains("unencrypted"));
        let psk = TlsSpec::new(None, None, Some(Path::new("k.psk")), None, &tcp()).unwrap();
        assert_eq!(psk.effective_mode(), TlsMode::Require);
        assert!(!psk.plaintext_tcp(&tcp()));
        assert_eq!(psk.tcp_warning(&tcp()), None);
        assert!(psk.psk.as_ref().unwrap().is_absolute());
    }

    #[test]
    fn tcp_verifies_client_certificates_unless_told_not_to() {
        let d = Some(Path::new("/certs"));
        let by_default = TlsSpec::new(None, d, None, None, &tcp()).unwrap();
        assert!(by_default.verify_peer);
        assert_eq!(by_default.tcp_warning(&tcp()), None);
        let asked = TlsSpec::new(None, d, None, Some(true), &tcp()).unwrap();
        assert_eq!(asked, by_default);
        let opted_out = TlsSpec::new(None, d, None, Some(false), &tcp()).unwrap();
        assert!(!opted_out.verify_peer && opted_out.unverified_tcp(&tcp()));
        let w = opted_out.tcp_warning(&tcp()).unwrap();
        assert!(w.contains("--tls-verify-peer=no"), "{w}");
        // The unix socket keeps its default: no client certificate asked.
        let local = TlsSpec::new(None, d, None, None, &unix()).unwrap();
        assert!(!local.verify_peer);
        assert_eq!(local.tcp_warning(&unix()), None);
        assert!(
            TlsSpec::new(None, d, None, Some(true), &unix())
                .unwrap()
                .verify_peer
        );
    }

    #[test]
    fn tls_on_over_tcp_is_refused() {
        let k = Some(Path::new("/k.psk"));
        let e = TlsSpec::new(Some("on"), None, k, None, &tcp()).unwrap_err();
        assert!(e.to_string().contains("--tls=require"), "{e}");
        let d = Some(Path::new("/certs"));
        assert!(TlsSpec::new(Some("on"), d, None, None, &tcp()).is_err());
        // On the unix socket `on` is still offered.
        let on = TlsSpec::new(Some("on"), None, k, None, &unix()).unwrap();
        assert_eq!(on.effective_mode(), TlsMode::On);
        // `require` over TCP is what `on` should have been.
        let req = TlsSpec::new(Some("require"), None, k, None, &tcp()).unwrap();
        assert_eq!(req.effective_mode(), TlsMode::Require);
    }

    #[test]
    fn contradictions_are_refused() {
        let d = Some(Path::new("/certs"));
        let k = Some(Path::new("/k.psk"));
        let fuse = ExportSpec::parse("fuse", None).unwrap();
        for (mode, c, p, v, export) in [
            (Some("maybe"), None, None, None, &unix()),
            (Some("require"), None, None, None, &unix()),
            (Some("on"), None, None, None, &unix()),
            (Some("off"), d, None, None, &unix()),
            (None, d, k, None, &unix()),
            (None, None, k, Some(true), &unix()),
            (None, None, k, Some(false), &tcp()),
            (Some("off"), None, None, Some(false), &tcp()),
            (None, d, None, None, &fuse),
            (None, None, None, Some(false), &fuse),
        ] {
            assert!(
                TlsSpec::new(mode, c, p, v, export).is_err(),
                "{mode:?} {c:?} {p:?} {v:?} {export:?}"
            );
        }
        // The plain unix socket needs nothing.
        let none = TlsSpec::new(None, None, None, None, &unix()).unwrap();
        assert_eq!(none.effective_mode(), TlsMode::Off);
    }

    #[test]
    fn the_checked_options_cross_json_unchanged() {
        let d = Some(Path::new("/c"));
        for s in [
            TlsSpec::new(Some("on"), d, None, Some(true), &unix()).unwrap(),
            TlsSpec::new(None, d, None, None, &tcp()).unwrap(),
            TlsSpec::new(None, d, None, Some(false), &tcp()).unwrap(),
            TlsSpec::new(None, None, Some(Path::new("/k")), None, &tcp()).unwrap(),
            TlsSpec::new(Some("off"), None, None, None, &tcp()).unwrap(),
        ] {
            let json = serde_json::to_string(&s).unwrap();
            assert_eq!(serde_json::from_str::<TlsSpec>(&json).unwrap(), s, "{json}");
        }
        let bad = r#"{"mode":"maybe","certificates":null,"psk":null,"verify_peer":false}"#;
        assert!(serde_json::from_str::<TlsSpec>(bad).is_err());
    }
}
