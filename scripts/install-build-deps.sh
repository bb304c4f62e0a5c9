#!/usr/bin/env bash
# Installs what building ucrypt needs beyond the Rust toolchain (Debian 12):
# a C toolchain, perl and make for the vendored OpenSSL, libclang for
# libublk's bindgen, tpm2-tss for the TPM2 tokens, the system OpenSSL headers
# for the fuzz build (scripts/fuzz.sh). Idempotent; uses sudo when not root;
# does nothing when everything is already there.
set -euo pipefail
PKGS=(build-essential perl make pkg-config libclang-dev
  libssl-dev # the fuzz build links the system OpenSSL
  libtss2-dev) # tss-esapi (systemd-tpm2 tokens) links tpm2-tss
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "Installing build dependencies: ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
