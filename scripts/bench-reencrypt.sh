#!/usr/bin/env bash
# Offline reencryption speed, side by side in one run: `ucrypt reencrypt` and
# `cryptsetup reencrypt --force-offline-reencrypt` on the same LUKS2 image
# (each round a fresh copy for each tool), and the storage's own copy rate:
# fio reading and writing every byte of a plain file of the same size there
# (1 MiB blocks, QD8, io_uring; O_DIRECT where the filesystem takes it).
#
#   copy rate = size / time to read it all and write it all (the floor of
#               any reencryption: each byte is read once and written once)
#
# Both tools run with their defaults (checksum resilience, cryptsetup's
# hotzone) and one cheap PBKDF2 keyslot, so the KDF does not count. The
# page cache is dropped before each run on a real filesystem (root).
#
# Usage: scripts/bench-reencrypt.sh  (env: DIR=/dev/shm where the images live,
#        a directory on a real disk measures that disk; SIZE=1024 MiB;
#        ROUNDS=3; CIPHER=aes-xts-plain64; SECTOR=4096)
# Needs: cryptsetup (2.4+), fio, python3. Run it on an idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=${DIR:-/dev/shm}
SIZE=${SIZE:-1024}
ROUNDS=${ROUNDS:-3}
CIPHER=${CIPHER:-aes-xts-plain64}
SECTOR=${SECTOR:-4096}
UCRYPT=${UCRYPT:-${CARGO_TARGET_DIR:-target}/release/ucrypt}
[ -x "$UCRYPT" ] || cargo build --release --locked -p ucrypt-cli
for t in cryptsetup fio python3; do
  command -v "$t" >/dev/null || { echo "bench-reencrypt: $t not found (scripts/install-test-deps.sh installs it)" >&2; exit 1; }
done

WORK=$(mktemp -d "$DIR/ucrypt-reenc.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
# The filesystem type as mount(8) names it (stat -f says ext2/ext3 for ext4).
FS=$(findmnt -no FSTYPE -T "$WORK" 2>/dev/null || stat -f -c %T "$WORK")
DIRECT=1
[ "$FS" = tmpfs ] && DIRECT=0
KEY=$WORK/key
printf 'reencrypt-bench' >"$KEY"
KDF=(--pbkdf pbkdf2 --pbkdf-force-iterations 1000)

drop_caches() {
  [ "$FS" = tmpfs ] && return 0
  sync
  if [ -w /proc/sys/vm/drop_caches ]; then echo 3 >/proc/sys/vm/drop_caches; fi
}
# image PATH: SIZE MiB of written (not sparse) data, then a LUKS2 header.
image() {
  dd if=/dev/zero of="$1" bs=1M count="$SIZE" conv=fsync status=none
  cryptsetup luksFormat -q --type luks2 "${KDF[@]}" --cipher "$CIPHER" \
    --sector-size "$SECTOR" --key-file "$KEY" "$1"
}
# secs CMD...: wall seconds of CMD (it must succeed).
secs() {
  local t0 t1
  t0=$(date +%s.%N)
  "$@" >"$WORK/out.log" 2>&1 || { cat "$WORK/out.log" >&2; echo "bench-reencrypt: failed: $*" >&2; exit 1; }
  t1=$(date +%s.%N)
  python3 -c "print(f'{$t1 - $t0:.3f}')"
}
# copy_rate: MiB/s of reading and writing the whole of a plain file.
copy_rate() {
  local f=$WORK/plain.img
  [ -f "$f" ] || dd if=/dev/zero of="$f" bs=1M count="$SIZE" conv=fsync status=none
  drop_caches
  fio --name=copy --filename="$f" --rw=rw --rwmixread=50 --bs=1M --iodepth=8 \
    --ioengine=io_uring --direct=$DIRECT --size=${SIZE}M --io_size=$((2 * SIZE))M \
    --output-format=json >"$WORK/fio.json" 2>"$WORK/fio.err" ||
    { cat "$WORK/fio.err" >&2; exit 1; }
  python3 - "$WORK/fio.json" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
moved = j["read"]["io_bytes"] + j["write"]["io_bytes"]
secs = j["job_runtime"] / 1000.0
print(f"{moved / 2 / 1048576 / secs:.1f}")
EOF
}

echo "bench-reencrypt: $SIZE MiB LUKS2 ($CIPHER, ${SECTOR}-byte sectors) in $DIR ($FS$( [ $DIRECT = 1 ] && echo ', O_DIRECT for fio')), $ROUNDS rounds"
echo "cryptsetup: $(cryptsetup --version)"
echo "ucrypt: $("$UCRYPT" --version)"
printf '%-6s %12s %12s %12s %10s %10s\n' round cryptsetup ucrypt 'copy (fio)' 'u/c' 'u/copy'
ROWS=()
for r in $(seq 1 "$ROUNDS"); do
  image "$WORK/c.img"
  image "$WORK/u.img"
  copy=$(copy_rate)
  drop_caches
  tc=$(secs cryptsetup reencrypt -q --force-offline-reencrypt "${KDF[@]}" --key-file "$KEY" "$WORK/c.img")
  drop_caches
  tu=$(secs "$UCRYPT" reencrypt -q "${KDF[@]}" --key-file "$KEY" "$WORK/u.img")
  # Both finished: no reencryption left, and each opens with cryptsetup.
  for f in c u; do
    if cryptsetup luksDump "$WORK/$f.img" | grep -q 'online-reencrypt'; then
      echo "bench-reencrypt: $f.img is still in reencryption" >&2; exit 1
    fi
    cryptsetup open --test-passphrase --key-file "$KEY" "$WORK/$f.img"
  done
  row=$(python3 -c "
s=$SIZE; c=s/$tc; u=s/$tu; p=$copy
print(f'{c:.1f} {u:.1f} {p:.1f} {u/c:.2f} {u/p:.2f}')")
  ROWS+=("$row")
  # shellcheck disable=SC2086
  printf '%-6s %12s %12s %12s %10s %10s\n' "$r" $row
done
python3 - "${ROWS[@]}" <<'EOF'
import statistics, sys
rows = [list(map(float, r.split())) for r in sys.argv[1:]]
col = lambda i: [r[i] for r in rows]
med = lambda v: statistics.median(v)
print(f"{'median':<6} {med(col(0)):12.1f} {med(col(1)):12.1f} {med(col(2)):12.1f} "
      f"{med(col(3)):10.2f} {med(col(4)):10.2f}")
print(f"MiB/s of the volume reencrypted; u/c and u/copy: median of the same-round ratios "
      f"(lowest-highest: {min(col(3)):.2f}-{max(col(3)):.2f}, {min(col(4)):.2f}-{max(col(4)):.2f})")
EOF
