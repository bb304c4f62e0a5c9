//! NBD over TLS for the daemon: `--tls=off|on|require`,
//! `--tls-certificates DIR`, `--tls-psk FILE`, `--tls-verify-peer` (as
//! nbdkit spells them), checked against the export before anything starts
//! and loaded into an [`nbd::TlsConfig`].
//!
//! Rules: credentials alone mean `--tls=require`; `on`/`require` need one
//! kind of credentials; `--listen` (NBD over TCP) without credentials needs
//! an explicit `--tls=off`, and the caller then warns on the terminal.

use std::path::{Path, PathBuf};

use nbd::{TlsConfig, TlsMode};

use crate::error::{invalid, Result};
use crate::serve::ExportSpec;

/// The NBD TLS options of `ucrypt open`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsSpec {
    /// `--tls`, if given.
    pub mode: Option<TlsMode>,
    /// `--tls-certificates`: a qemu/nbdkit-layout directory (absolute).
    pub certificates: Option<PathBuf>,
    /// `--tls-psk`: a psktool key file (absolute).
    pub psk: Option<PathBuf>,
    /// `--tls-verify-peer`: clients must present a certificate signed by
    /// the directory's `ca-cert.pem`.
    pub verify_peer: bool,
}

impl TlsSpec {
    /// Parses the options and checks them against `export`. Paths are made
    /// absolute (a detached daemon runs in `/`).
    pub fn new(
        mode: Option<&str>,
        certificates: Option<&Path>,
        psk: Option<&Path>,
        verify_peer: bool,
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
        let spec = Self {
            mode,
            certificates: certificates.map(abs).transpose()?,
            psk: psk.map(abs).transpose()?,
            verify_peer,
        };
        spec.check(export)?;
        Ok(spec)
    }

    fn check(&self, export: &ExportSpec) -> Result<()> {
        let creds = self.certificates.is_some() || self.psk.is_some();
        let nbd = matches!(export, ExportSpec::NbdUnix(_) | ExportSpec::NbdTcp(_));
        if !nbd && (creds || self.mode.is_some() || self.verify_peer) {
            return Err(invalid("The --tls options apply only to --export nbd"));
        }
        if self.certificates.is_some() && self.psk.is_some() {
            return Err(invalid(
                "Give either --tls-certificates or --tls-psk, not both",
            ));
        }
        if self.verify_peer && self.certificates.is_none() {
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
            None if !creds && matches!(export, ExportSpec::NbdTcp(_)) => Err(invalid(
                "--listen serves NBD over TCP, where anyone who can reach the port reads and \
                 writes the decrypted device: give --tls-certificates DIR or --tls-psk FILE \
                 (TLS required), or --tls=off to serve it unencrypted",
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

    /// True when NBD goes over TCP without TLS (the user said `--tls=off`):
    /// the caller warns on the user's terminal.
    pub fn plaintext_tcp(&self, export: &ExportSpec) -> bool {
        matches!(export, ExportSpec::NbdTcp(_)) && self.effective_mode() == TlsMode::Off
    }

    /// The warning for the user's terminal when [`TlsSpec::plaintext_tcp`]
    /// (a detached daemon's own warning only reaches its log).
    pub fn plaintext_warning(&self, export: &ExportSpec) -> Option<&'static str> {
        self.plaintext_tcp(export).then_some(
            "ucrypt: warning: NBD over TCP without TLS (--tls=off) is unencrypted on the wire: anyone who \
             can reach the port can read and write the decrypted device",
        )
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

    /// The `open` arguments that parse back to `self`.
    pub fn to_args(&self) -> Vec<String> {
        let mut v = Vec::new();
        if let Some(m) = self.mode {
            v.push(format!("--tls={m}"));
        }
        if let Some(d) = &self.certificates {
            v.push(format!("--tls-certificates={}", d.display()));
        }
        if let Some(f) = &self.psk {
            v.push(format!("--tls-psk={}", f.display()));
        }
        if self.verify_peer {
            v.push("--tls-verify-peer".into());
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp() -> ExportSpec {
        ExportSpec::parse("nbd", Some("0")).unwrap()
    }

    #[test]
    fn listen_needs_tls_or_an_explicit_off() {
        let e = TlsSpec::new(None, None, None, false, &tcp()).unwrap_err();
        assert!(e.to_string().contains("--tls=off"), "{e}");
        let off = TlsSpec::new(Some("off"), None, None, false, &tcp()).unwrap();
        assert!(off.plaintext_tcp(&tcp()));
        let psk = TlsSpec::new(None, None, Some(Path::new("k.psk")), false, &tcp()).unwrap();
        assert_eq!(psk.effective_mode(), TlsMode::Require);
        assert!(!psk.plaintext_tcp(&tcp()));
        assert!(psk.psk.as_ref().unwrap().is_absolute());
    }

    #[test]
    fn contradictions_are_refused() {
        let unix = ExportSpec::parse("nbd", None).unwrap();
        let d = Some(Path::new("/certs"));
        let k = Some(Path::new("/k.psk"));
        for (mode, c, p, v, export) in [
            (Some("maybe"), None, None, false, &unix),
            (Some("require"), None, None, false, &unix),
            (Some("on"), None, None, false, &unix),
            (Some("off"), d, None, false, &unix),
            (None, d, k, false, &unix),
            (None, None, k, true, &unix),
            (
                None,
                d,
                None,
                false,
                &ExportSpec::parse("fuse", None).unwrap(),
            ),
        ] {
            assert!(
                TlsSpec::new(mode, c, p, v, export).is_err(),
                "{mode:?} {c:?} {p:?} {v} {export:?}"
            );
        }
        // The plain unix socket needs nothing.
        let none = TlsSpec::new(None, None, None, false, &unix).unwrap();
        assert_eq!(none.effective_mode(), TlsMode::Off);
        assert!(none.to_args().is_empty());
    }

    #[test]
    fn args_round_trip() {
        let s = TlsSpec::new(Some("on"), Some(Path::new("/c")), None, true, &tcp()).unwrap();
        let args = s.to_args();
        assert_eq!(
            args,
            ["--tls=on", "--tls-certificates=/c", "--tls-verify-peer"]
        );
    }
}
