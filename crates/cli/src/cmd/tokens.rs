//! The LUKS2 token options of `open`, `open --test-passphrase` and `map
//! --luks` (cryptsetup's and systemd-cryptsetup's spellings), flattened
//! into those verbs and handed to the tokens crate as its plain
//! [`tokens::TokenOptions`] ([`TokenUnlockArgs::options`]).

use std::path::PathBuf;

use clap::Args;

/// `--token-*`, the TPM2 and PKCS#11 devices and the PIN file. The field
/// docs are their help text.
#[derive(Args, Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenUnlockArgs {
    /// LUKS2: try only this token.
    #[arg(long, value_name = "N")]
    pub token_id: Option<u32>,
    /// LUKS2: unlock through tokens only, never ask for a passphrase.
    #[arg(long)]
    pub token_only: bool,
    /// LUKS2: try only tokens of this type (systemd-tpm2, systemd-pkcs11, luks2-keyring).
    #[arg(long, value_name = "TYPE")]
    pub token_type: Option<String>,
    /// The TPM2 for systemd-tpm2 tokens: auto (default), a device path, or a
    /// TCTI spec such as swtpm:host=127.0.0.1,port=2321.
    #[arg(long, value_name = "DEVICE")]
    pub tpm2_device: Option<String>,
    /// The signature JSON of a signed TPM2 PCR policy (systemd-measure sign's
    /// output; default: tpm2-pcr-signature.json in /etc/systemd, /run/systemd,
    /// /usr/local/lib/systemd, /usr/lib/systemd).
    #[arg(long, value_name = "PATH")]
    pub tpm2_signature: Option<PathBuf>,
    /// The PKCS#11 module for systemd-pkcs11 tokens (default: p11-kit's proxy,
    /// which offers every module p11-kit knows).
    #[arg(long, value_name = "PATH")]
    pub pkcs11_module: Option<PathBuf>,
    /// A token's PIN (TPM2 or PKCS#11), read from this file (a trailing
    /// newline is dropped); else $PIN, else a prompt at the terminal.
    #[arg(long, value_name = "FILE")]
    pub token_pin_file: Option<PathBuf>,
}

impl TokenUnlockArgs {
    /// The tokens crate's options: these, with `-v` (`verbose`); a
    /// crypttab line fills in the rest (`cmd::daemon`).
    pub fn options(&self, verbose: bool) -> tokens::TokenOptions {
        tokens::TokenOptions {
            token_id: self.token_id,
            token_only: self.token_only,
            token_type: self.token_type.clone(),
            tpm2_device: self.tpm2_device.clone(),
            tpm2_signature: self.tpm2_signature.clone(),
            pkcs11_module: self.pkcs11_module.clone(),
            token_pin_file: self.token_pin_file.clone(),
            verbose,
            ..tokens::TokenOptions::default()
        }
    }
}
