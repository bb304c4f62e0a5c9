#!/bin/sh
# Part 9: unlocking through the guest's own TPM2, as a Linux host does. The
# host runs swtpm; qemu hands it to the guest as a TIS device, so the kernel
# has /dev/tpmrm0 (its resource manager). systemd-cryptenroll enrolls a
# cryptsetup-made LUKS2 volume to it (PCR 7; then PCR 7 + a PIN); ucrypt
# unseals through /dev/tpmrm0 (`--tpm2-device` auto and named) and reads
# exactly what dm-crypt reads after cryptsetup opened the volume with
# systemd's own token plugin, and after systemd-cryptsetup attach opened it
# through its own TPM2 code (the second reference). A PCR extended after
# enrollment makes all of them refuse the token. Sourced by suite.sh.

W=/tmp/tpm
mkdir -p "$W"
TPM=$(sed -n 's/.*vmtest\.tpm=\([^ ]*\).*/\1/p' /proc/cmdline)
if [ "$TPM" != swtpm ]; then
  echo "@@VMTEST SKIP tpm: no TPM2 given to the guest (${TPM:-vmtest.tpm unset}; scripts/vm-test.sh needs swtpm and systemd-cryptenroll on the host)"
  return 0 2>/dev/null || exit 0
fi
# tpm_tis is built in on Debian's kernels; a kernel with it as a module loads it here.
modprobe -a tpm_tis 2>/dev/null
if ! check "tpm: the kernel has /dev/tpmrm0 (qemu tpm-tis over the host's swtpm)" \
    sh -c '[ -c /dev/tpmrm0 ] && [ -e /sys/class/tpmrm/tpmrm0 ]'; then
  info "tpm: $(ls /sys/class/tpm /sys/class/tpmrm 2>&1 | tr '\n' ' ')"
  return 0 2>/dev/null || exit 0
fi

IMG="$W/vol.img"
SIZE_MIB=8
truncate -s 32M "$IMG"
pattern "$W/pat" "$SIZE_MIB"
PLUGIN=/usr/lib/x86_64-linux-gnu/cryptsetup/libcryptsetup-token-systemd-tpm2.so
export IMG W SIZE_MIB PLUGIN
# ucrypt_reads ARGS: ucrypt reads exactly the pattern through the token(s)
# ARGS select; the passphrase is never available to it (--token-only, stdin
# closed). Scripts rather than functions: `check` runs them under timeout.
cat > "$W/ucrypt_reads" <<'SH'
ucrypt map --read --token-only --luks "$IMG" "$@" </dev/null | head -c $((SIZE_MIB << 20)) | cmp - "$W/pat"
SH
# reference_reads PIN ARGS: dm-crypt reads exactly the pattern after the
# reference opened the volume through its token (PIN on stdin when not
# empty): cryptsetup with systemd's token plugin, else systemd-cryptsetup.
cat > "$W/reference_reads" <<'SH'
pin="$1"; shift
if [ -e "$PLUGIN" ]; then
  printf '%s\n' "$pin" | cryptsetup open --token-only "$@" "$IMG" tpmref || exit 1
else
  opts="tpm2-device=auto,headless"
  [ -n "$pin" ] && opts="tpm2-device=auto"
  printf '%s\n' "$pin" | /lib/systemd/systemd-cryptsetup attach tpmref "$IMG" - "$opts" || exit 1
fi
dd if=/dev/mapper/tpmref bs=1M count="$SIZE_MIB" iflag=direct 2>/dev/null | cmp - "$W/pat"
rc=$?
cryptsetup close tpmref
exit $rc
SH
# systemd_reads: dm-crypt reads exactly the pattern after systemd-cryptsetup
# attach unsealed a token itself (SYSTEMD_CRYPTSETUP_USE_TOKEN_MODULE=0 keeps
# it off cryptsetup's plugin), headless: the tokens alone, in header order.
cat > "$W/systemd_reads" <<'SH'
SYSTEMD_CRYPTSETUP_USE_TOKEN_MODULE=0 /lib/systemd/systemd-cryptsetup attach tpmsd "$IMG" - \
  tpm2-device=auto,headless </dev/null || exit 1
dd if=/dev/mapper/tpmsd bs=1M count="$SIZE_MIB" iflag=direct 2>/dev/null | cmp - "$W/pat"
rc=$?
cryptsetup close tpmsd
exit $rc
SH
ucrypt_reads="sh $W/ucrypt_reads"
reference_reads="sh $W/reference_reads"
systemd_reads="sh $W/systemd_reads"
# The second reference only where the first is the plugin (else it is the same).
[ -e "$PLUGIN" ] && [ -x /lib/systemd/systemd-cryptsetup ] || systemd_reads=""
info "tpm: reference: $([ -e "$PLUGIN" ] && echo "cryptsetup + systemd's token plugin" || echo "systemd-cryptsetup attach")${systemd_reads:+, and systemd-cryptsetup attach}"

check "tpm: cryptsetup luksFormat (LUKS2)" cryptsetup luksFormat -q --type luks2 $FAST_KDF --key-file "$KEY" "$IMG"
check "tpm: dm-crypt writes the data" sh -c "
  cryptsetup open --key-file '$KEY' '$IMG' tpmw &&
  dd if='$W/pat' of=/dev/mapper/tpmw bs=1M oflag=direct conv=fsync 2>/dev/null &&
  cryptsetup close tpmw"
check "tpm: systemd-cryptenroll --tpm2-device=/dev/tpmrm0 --tpm2-pcrs=7 (token 0)" \
  systemd-cryptenroll --unlock-key-file="$KEY" --tpm2-device=/dev/tpmrm0 --tpm2-pcrs=7 "$IMG"
check "tpm: ucrypt map --token-only unseals through /dev/tpmrm0 (--tpm2-device auto)" $ucrypt_reads -v
check "tpm: ucrypt with --tpm2-device=/dev/tpmrm0 --token-type systemd-tpm2" \
  $ucrypt_reads --tpm2-device=/dev/tpmrm0 --token-type systemd-tpm2
check "tpm: ucrypt open --test-passphrase --token-only" \
  ucrypt open --test-passphrase --token-only "$IMG" </dev/null
check "tpm: dm-crypt reads the same data after the reference unsealed token 0" $reference_reads "" --token-id 0
[ -n "$systemd_reads" ] &&
  check "tpm: dm-crypt reads the same data after systemd-cryptsetup attach unsealed token 0" $systemd_reads

# Served: open --token-only over ublk, the device read back.
before=$(echo /dev/ublkb*)
if check "tpm: ucrypt open --token-only --export ublk" \
    ucrypt open --token-only --export ublk "$IMG" tpmu </dev/null; then
  d=""; for x in /dev/ublkb*; do case " $before " in *" $x "*) ;; *) d=$x ;; esac; done
  check "tpm: /dev/ublkbN reads the data dm-crypt wrote" sh -c "
    [ -b '$d' ] && dd if=$d bs=1M count=$SIZE_MIB iflag=direct 2>/dev/null | cmp - '$W/pat'"
  run ucrypt close tpmu
fi

# A PIN: token 1 (PCR 7 + PIN).
check "tpm: systemd-cryptenroll --tpm2-with-pin=yes (token 1)" \
  env NEWPIN=4711 systemd-cryptenroll --unlock-key-file="$KEY" --tpm2-device=auto --tpm2-pcrs=7 \
  --tpm2-with-pin=yes "$IMG"
check "tpm: ucrypt unseals token 1 with the PIN from \$PIN" env PIN=4711 $ucrypt_reads --token-id 1
echo 4711 > "$W/pin"
check "tpm: ucrypt unseals token 1 with --token-pin-file" $ucrypt_reads --token-id 1 --token-pin-file "$W/pin"
echo 0000 > "$W/badpin"
expect_fail "tpm: a wrong PIN opens nothing (no passphrase asked)" \
  $ucrypt_reads --token-id 1 --token-pin-file "$W/badpin"
check "tpm: dm-crypt reads the same data after the reference unsealed token 1 with the PIN" \
  $reference_reads 4711 --token-id 1

# PCR 7 changes after enrollment: the TPM refuses both tokens, for ucrypt
# (systemd's fallback message, then the passphrase opens) and the reference.
if command -v tpm2_pcrextend >/dev/null; then
  check "tpm: tpm2_pcrextend 7 on /dev/tpmrm0" \
    env TPM2TOOLS_TCTI=device:/dev/tpmrm0 tpm2_pcrextend "7:sha256=$(printf '%064d' 7)"
  expect_fail "tpm: ucrypt --token-only refuses after PCR 7 changed" $ucrypt_reads --token-id 0
  check "tpm: ucrypt falls back to the passphrase in systemd's words" sh -c "
    printf 'vm-test passphrase\n' | ucrypt open --test-passphrase --token-id 0 '$IMG' 2>'$W/fallback.err';
    rc=\$?; cat '$W/fallback.err';
    [ \$rc = 0 ] && grep -q 'No TPM2 metadata matching the current system state found in LUKS2 header, falling back to traditional unlocking.' '$W/fallback.err'"
  expect_fail "tpm: the reference refuses too after PCR 7 changed" $reference_reads "" --token-id 0
  [ -n "$systemd_reads" ] &&
    expect_fail "tpm: systemd-cryptsetup attach refuses too after PCR 7 changed (headless)" $systemd_reads
else
  echo "@@VMTEST SKIP tpm: the PCR case (no tpm2_pcrextend in the guest: the host lacks tpm2-tools)"
fi
rm -f "$IMG" "$W/pat"
