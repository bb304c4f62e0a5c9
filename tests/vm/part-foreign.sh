#!/bin/sh
# Part 10: foreign formats against the kernel. A sample of cryptsetup 2.6.1's
# TrueCrypt/VeraCrypt, BitLocker and FileVault 2 images (tests/vm/foreign.list:
# VeraCrypt AES-XTS and a PIM, a 3-cipher cascade, a hidden volume, keyfiles,
# TrueCrypt's legacy lrw-benbi and cbc-tcw; BitLocker AES-CBC + Elephant,
# AES-XTS, 4096-byte sectors, To Go, a startup key; FileVault 2) sits on a disk
# vm-test.sh attaches (serial ucrypt-foreign, ext4; qemu discards the guest's
# writes to it). For each image, `cryptsetup open --type TYPE` activates it
# through dm-crypt over a loop device, and ucrypt with the same options and
# secret must give byte-identical plaintext: `ucrypt map --read` over the
# whole device for the small images (and all under KVM or
# UCRYPT_VM_FOREIGN_ALL=1), else ucrypt's ublk export at the first and last
# 256 KiB (and the middle) of every segment of dm-crypt's table; the
# filesystem UUID is the suite's. BitLocker images open with the volume key
# the host's cryptsetup dumped (cryptsetup takes 12-30 s per unlock under
# TCG), except the Elephant one (passphrase) and the slow lines (recovery
# password, startup key). A
# BitLocker volume written through ucrypt's ublk export reads back through
# dm-crypt, and what dm-crypt writes reads back through ucrypt. Last, `tcryptDump --dump-volume-key` prints the
# same text in both (cryptsetup decrypts the header through AF_ALG, which the
# guest kernel has). Sourced by suite.sh.

W=/tmp/foreign
M=/mnt/foreign
mkdir -p "$W" "$M"
# cryptsetup decrypts TrueCrypt headers through AF_ALG; dm-crypt's legacy
# TrueCrypt modes need lrw and the 64-bit-block ciphers; a BitLocker table
# has zero targets over the metadata.
modprobe -a dm_zero af_alg algif_skcipher algif_hash lrw gf128mul serpent_generic twofish_generic \
  cast5_generic des_generic 2>"$W/modprobe.err" || info "foreign: modprobe: $(cat "$W/modprobe.err")"
# Under TCG, OpenSSL's AVX/AVX2 code runs on emulated vector registers
# (cryptsetup's VeraCrypt PBKDF2 took 35-60 s here, ~30 s without them):
# this part's cryptsetup (a wrapper first in PATH) has its libcrypto use the
# scalar code (OPENSSL_ia32cap masks AVX and AVX2), which changes no result.
# ucrypt runs as it is.
if [ "$VMTEST_ACCEL" = tcg ]; then
  mkdir -p "$W/bin"
  printf '#!/bin/sh\nOPENSSL_ia32cap="~0x1000000000000000:~0x20" exec %s "$@"\n' \
    "$(command -v cryptsetup)" > "$W/bin/cryptsetup"
  chmod +x "$W/bin/cryptsetup"
  export PATH="$W/bin:$PATH"
fi
# GNU cmp (vm-test.sh adds it for this part) compares by blocks; busybox's
# byte loop is slow under TCG.
CMP=cmp
[ -x /vm/bin/cmp ] && CMP=/vm/bin/cmp
export W CMP

dev=""
for b in /sys/block/vd*; do
  [ "$(cat "$b/serial" 2>/dev/null)" = ucrypt-foreign ] && dev=/dev/${b##*/}
done
if ! check "foreign: the image disk (serial ucrypt-foreign) mounts" \
    sh -c "[ -n '$dev' ] && mount -t ext4 '$dev' '$M' && [ -f /vm/foreign.list ]"; then
  for b in /sys/block/vd*; do info "foreign: $b serial '$(cat "$b/serial" 2>/dev/null)'"; done
  return 0 2>/dev/null || exit 0
fi

# Scripts rather than functions: `check` runs them under timeout. All take
# the image from $T (type), $DIR, $IMG, $SEC (`-`: none) and the options as
# arguments.
# cs_open NAME OPT...: cryptsetup activates the image through dm-crypt.
cat > "$W/cs_open" <<'SH'
name=$1; shift
cd "$DIR" || exit 1
{ [ "$SEC" = - ] || printf '%s\n' "$SEC"; } | cryptsetup open --type "$T" "$@" "$IMG" "$name"
SH
# same NAME OPT...: the whole dm-crypt device and `ucrypt map --read` are
# byte-identical (cmp also fails when one is shorter).
cat > "$W/same" <<'SH'
name=$1; shift
cd "$DIR" || exit 1
n=$(blockdev --getsize64 "/dev/mapper/$name") && [ "$n" -gt 0 ] || exit 1
echo "$n bytes"
rm -f "$W/fifo"; mkfifo "$W/fifo"
dd if="/dev/mapper/$name" bs=1M iflag=direct of="$W/fifo" 2>/dev/null &
{ [ "$SEC" = - ] || printf '%s\n' "$SEC"; } | ucrypt map --read "--$T" "$IMG" "$@" | $CMP - "$W/fifo"
rc=$?
wait
exit $rc
SH
# windows NAME OPT...: ucrypt serves the image over ublk (read-only, the same
# options and secret); each segment of dm-crypt's table (crypt, zero, linear)
# compares its first, middle and last 256 KiB, so every boundary of the table
# is read by both. For the large images under TCG, where whole devices take minutes.
cat > "$W/windows" <<'SH'
name=$1; shift
cd "$DIR" || exit 1
before=$(echo /dev/ublkb*)
{ [ "$SEC" = - ] || printf '%s\n' "$SEC"; } |
  ucrypt open --type "$T" --readonly --export ublk "$@" "$IMG" "u$name" || exit 1
d=""; for x in /dev/ublkb*; do case " $before " in *" $x "*) ;; *) d=$x ;; esac; done
rc=0
dm=$(blockdev --getsize64 "/dev/mapper/$name")
[ -b "$d" ] && [ "$(blockdev --getsize64 "$d")" = "$dm" ] || { echo "ublk device '$d' is not $dm bytes"; rc=1; }
dmsetup table "$name" > "$W/table"
n=0 bytes=0
while read -r start len _; do
  w=$((len * 512)); [ "$w" -gt 262144 ] && w=262144
  mid=$(((start + len / 2) * 512 / 65536 * 65536))
  [ "$mid" -lt $((start * 512)) ] && mid=$((start * 512))
  for off in $((start * 512)) "$mid" $(((start + len) * 512 - w)); do
    dd if="/dev/mapper/$name" of="$W/a" bs=65536 iflag=skip_bytes,count_bytes skip="$off" count="$w" 2>/dev/null
    dd if="$d" of="$W/b" bs=65536 iflag=skip_bytes,count_bytes skip="$off" count="$w" 2>/dev/null
    [ "$(stat -c %s "$W/a")" = "$w" ] && $CMP "$W/a" "$W/b" || { echo "differs at $off (+$w)"; rc=1; }
    n=$((n + 1)); bytes=$((bytes + w))
  done
done < "$W/table"
ucrypt close "u$name" || rc=1
echo "$n windows, $bytes of $dm bytes (every table boundary)"
exit $rc
SH
# uuid NAME WANT: blkid finds the suite's filesystem UUID on the dm device.
cat > "$W/uuid" <<'SH'
got=$(blkid -p -s UUID -o value "/dev/mapper/$1")
echo "UUID '$got', want '$2'"
[ "$got" = "$2" ]
SH

# The write round trip (one BitLocker image, before its comparison): 4 MiB
# through ucrypt's ublk export at 4 MiB, read by dm-crypt; 4 MiB through
# dm-crypt at 16 MiB, read by `ucrypt map` (the FVE metadata copies of the
# suite's images lie above 33 MiB).
WRITE_IMG=bitlk-aes-xts-128-4k.img
head -c 4194304 /dev/urandom > "$W/pat1"
head -c 4194304 /dev/urandom > "$W/pat2"
write_round_trip() { # OPT...
  before=$(echo /dev/ublkb*)
  if check "foreign: $T $IMG: ucrypt open --export ublk $*" \
      sh -c 'cd "$DIR" && printf "%s\n" "$SEC" | ucrypt open --type "$T" --export ublk "$@" "$IMG" fw' sh "$@"; then
    d=""; for x in /dev/ublkb*; do case " $before " in *" $x "*) ;; *) d=$x ;; esac; done
    check "foreign: $T $IMG: 4 MiB written through /dev/ublkbN" sh -c "
      [ -b '$d' ] && [ \$(blockdev --getss $d) = 4096 ] &&
      dd if='$W/pat1' of=$d bs=1M seek=4 oflag=direct conv=fsync 2>/dev/null"
    check "foreign: $T $IMG: ucrypt close" ucrypt close fw
  fi
  if check "foreign: $T $IMG: cryptsetup open after ucrypt wrote" sh "$W/cs_open" fw "$@"; then
    check "foreign: $T $IMG: dm-crypt reads what ucrypt wrote" sh -c "
      dd if=/dev/mapper/fw bs=1M skip=4 count=4 iflag=direct 2>/dev/null | $CMP - '$W/pat1'"
    check "foreign: $T $IMG: dm-crypt writes 4 MiB" \
      dd if="$W/pat2" of=/dev/mapper/fw bs=1M seek=16 oflag=direct conv=fsync
    run cryptsetup close fw
  fi
  check "foreign: $T $IMG: ucrypt map reads what dm-crypt wrote" sh -c '
    cd "$DIR" && printf "%s\n" "$SEC" | ucrypt map --read --bitlk "$IMG" "$@" |
    dd bs=1M skip=16 count=4 iflag=fullblock 2>/dev/null | $CMP - "$W/pat2"' sh "$@"
}

# The slow images (`+` in the list) run under KVM or when asked for.
SLOW=0
[ "$VMTEST_ACCEL" = kvm ] && SLOW=1
grep -q 'vmtest\.foreign=all' /proc/cmdline && SLOW=1

i=0
grep -v '^#' /vm/foreign.list | while read -r T IMG SEC FSUUID OPTS; do
  [ -n "$T" ] || continue
  i=$((i + 1))
  case "$T" in
    +*) T=${T#+}
        if [ "$SLOW" = 0 ]; then
          echo "@@VMTEST SKIP foreign: $T $IMG: a slow unlock under TCG, left out of the default sample (UCRYPT_VM_FOREIGN_ALL=1 runs it)"
          continue
        fi ;;
  esac
  DIR="$M/$T-images"
  export T IMG SEC DIR
  label="foreign: $T $IMG"
  # shellcheck disable=SC2086 # OPTS: options, one per word
  [ "$IMG" = "$WRITE_IMG" ] && write_round_trip $OPTS
  # The legacy TrueCrypt modes need dm-crypt's lrw and tcw: a kernel that
  # cannot activate them is a SKIP with its words, never a pass.
  case "$IMG" in
    tc_1-*-cbc-*|tc_2-*-lrw-*|tc_2-*-cbc-*) legacy=1 ;;
    *) legacy=0 ;;
  esac
  name="fr$i"
  t0=$(now)
  # shellcheck disable=SC2086 # OPTS: options, one per word
  if [ "$legacy" = 1 ] && ! sh "$W/cs_open" "$name" $OPTS >"$W/open.log" 2>&1; then
    echo "@@VMTEST SKIP $label: dm-crypt does not activate it: $(tail -n 1 "$W/open.log") $(dmesg | tail -n 2 | tr '\n' ' ')"
    continue
  elif [ "$legacy" = 0 ] && ! check "$label: cryptsetup open --type $T $OPTS" sh "$W/cs_open" "$name" $OPTS; then
    continue
  fi
  [ "$legacy" = 1 ] && pass "$label: cryptsetup open --type $T $OPTS"
  info "$label: dm-crypt table: $(dmsetup table "$name" | sed 's/ [0-9a-f]\{32,\} / <key> /g' | tr '\n' '|')"
  check "$label: dm-crypt's filesystem UUID is $FSUUID" sh "$W/uuid" "$name" "$FSUUID"
  # shellcheck disable=SC2086
  if [ "$SLOW" = 1 ] || [ "$(blockdev --getsize64 "/dev/mapper/$name")" -le 33554432 ]; then
    check "$label: ucrypt map --read is byte-identical to dm-crypt" sh "$W/same" "$name" $OPTS
  else
    check "$label: ucrypt's ublk device is byte-identical to dm-crypt at every table boundary" \
      sh "$W/windows" "$name" $OPTS
  fi
  info "$label: $(tail -n 1 "$LOGDIR/last.log") compared in $(awk "BEGIN {print $(now) - $t0}") s"
  run cryptsetup close "$name"
done

# cryptsetup's and ucrypt's tcryptDump --dump-volume-key print the same text:
# a TrueCrypt cascade (three keys), and the VeraCrypt image when slow images run.
cat > "$W/dump" <<'SH'
cd "$DIR" || exit 1
tool=$1; shift
printf '%s\n' "$SEC" | "$tool" tcryptDump --dump-volume-key -q "$@" "$IMG"
SH
same_dump() { # IMG OPT...
  IMG=$1; shift
  T=tcrypt SEC=aaaaaaaaaaaa DIR="$M/tcrypt-images"
  export T IMG SEC DIR
  if check "foreign: cryptsetup tcryptDump --dump-volume-key $IMG" sh -c "sh '$W/dump' cryptsetup $* > '$W/dump.cs'" &&
     check "foreign: ucrypt tcryptDump --dump-volume-key $IMG" sh -c "sh '$W/dump' ucrypt $* > '$W/dump.u'"; then
    check "foreign: tcryptDump --dump-volume-key $IMG: ucrypt's text is cryptsetup's" sh -c "
      grep -q '^MK dump:' '$W/dump.cs' && $CMP '$W/dump.cs' '$W/dump.u' || { diff '$W/dump.cs' '$W/dump.u'; exit 1; }"
  fi
}
same_dump tc_5-sha512-xts-serpent-twofish-aes -h sha512 -c serpent --disable-veracrypt
if [ "$SLOW" = 1 ]; then
  same_dump vc_1-sha512-xts-aes -h sha512 -c aes
else
  echo "@@VMTEST SKIP foreign: tcryptDump --dump-volume-key vc_1-sha512-xts-aes: two VeraCrypt KDFs, over a minute under TCG (UCRYPT_VM_FOREIGN_ALL=1 runs it)"
fi
umount "$M"
