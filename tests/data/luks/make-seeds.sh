#!/usr/bin/env bash
# Regenerates the fuzz seed corpus: real headers made by cryptsetup
# (LUKS1: first 4 KiB; LUKS2: both header copies, first 32 KiB), with
# fast KDF settings. Needs cryptsetup (no root: plain image files).
set -euo pipefail
cd "$(dirname "$0")"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
printf 'seed-passphrase' > "$tmp/key"
fmt() { # name head-bytes cryptsetup-args...
  local name=$1 bytes=$2; shift 2
  truncate -s 20M "$tmp/img"
  cryptsetup luksFormat --batch-mode --key-file "$tmp/key" "$@" "$tmp/img"
  head -c "$bytes" "$tmp/img" > "$name"
  rm -f "$tmp/img"
}
fmt luks1-xts512.hdr 4096 --type luks1 --pbkdf-force-iterations 1000
fmt luks1-cbc-essiv.hdr 4096 --type luks1 --cipher aes-cbc-essiv:sha256 --key-size 256 --hash sha1 --pbkdf-force-iterations 1000
fmt luks2-pbkdf2-512.hdr 32768 --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --sector-size 512
fmt luks2-argon2id-4096.hdr 32768 --type luks2 --pbkdf argon2id --pbkdf-force-iterations 4 --pbkdf-memory 1024 --sector-size 4096 --label seed --subsystem fuzz
fmt luks2-argon2i-essiv.hdr 32768 --type luks2 --pbkdf argon2i --pbkdf-force-iterations 4 --pbkdf-memory 1024 --cipher aes-cbc-essiv:sha256 --key-size 256
# Two keyslots and a token-free header with a higher seqid.
truncate -s 20M "$tmp/img"
cryptsetup luksFormat --batch-mode --key-file "$tmp/key" --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 "$tmp/img"
printf 'second' > "$tmp/key2"
cryptsetup luksAddKey --batch-mode --key-file "$tmp/key" --pbkdf pbkdf2 --pbkdf-force-iterations 1000 "$tmp/img" "$tmp/key2"
head -c 32768 "$tmp/img" > luks2-two-slots.hdr
