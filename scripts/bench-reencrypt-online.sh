#!/usr/bin/env bash
# Online reencryption as the volume's clients feel it, side by side in one
# run: a LUKS2 image (cryptsetup-made, one cheap PBKDF2 keyslot so the KDF
# does not count) served by `ucrypt open` over NBD, fio's nbd engine as the
# client, each cell (4k QD1, 4k QD32, 1M QD8; randread and randwrite)
# measured in three states, one after the other in every round:
#
#   idle     nothing else runs
#   online   `ucrypt reencrypt --active-name` runs with no rate limit
#   limited  the same with `--rate`: RATE MiB/s, by default half of the
#            round's offline rate
#
# and each round's offline rate (`ucrypt reencrypt` of the closed image,
# timed). For each cell it reports the client's MiB/s and its ratio to
# idle, and the reencryption's own rate while the client runs and its
# ratio to the offline rate of the same round: medians of the same-round
# ratios with their lowest-highest, as scripts/bench-reencrypt.sh does.
#
# Every online and limited cell starts a fresh reencryption of the whole
# volume (the previous one is finished, unthrottled, before the next
# cell). One that finishes while the client still runs is followed at
# once by another: the output counts these restarts; each leaves a gap of
# up to ~0.3 s with no data moving (which flatters the client), so with a
# SIZE that the reencryption does not get through in RUNTIME there are
# none.
#
# The result is checked: the write cells write one 4-byte pattern into
# the first quarter of the volume, which is filled with that pattern
# before (the rest with random data), so the plaintext must not change at
# all. Its sha256 through ucrypt (`ucrypt map --read --luks`) before the
# first round and after the last must match, the header must have left
# reencryption and cryptsetup must open the keyslot; otherwise the script
# exits 1. (A lost write of the pattern over itself goes unseen: the
# write-verifying test is crates/cli/tests/cli/reencrypt_online.rs.)
#
# Usage: scripts/bench-reencrypt-online.sh  (env: DIR=/dev/shm where the
#        image lives, a directory on a real disk measures that disk;
#        SIZE=4096 MiB; ROUNDS=3; RUNTIME=2 s per cell; RATE=MiB/s of the
#        limited state (default: half the round's offline rate);
#        CIPHER=aes-xts-plain64; SECTOR=4096; CELLS="randread:4k:1 ...")
# A small check that it works (seconds):
#   SIZE=48 RUNTIME=1 ROUNDS=1 CELLS="randread:4k:1 randwrite:1M:8" \
#     scripts/bench-reencrypt-online.sh
# Needs: cryptsetup (2.4+), fio (nbd engine), python3. Run it on an idle
# machine for figures.
set -euo pipefail
cd "$(dirname "$0")/.."

DIR=${DIR:-/dev/shm}
SIZE=${SIZE:-4096}
ROUNDS=${ROUNDS:-3}
RUNTIME=${RUNTIME:-2}
RATE=${RATE:-}
CIPHER=${CIPHER:-aes-xts-plain64}
SECTOR=${SECTOR:-4096}
CELLS=${CELLS:-randread:4k:1 randread:4k:32 randread:1M:8 randwrite:4k:1 randwrite:4k:32 randwrite:1M:8}
UCRYPT=${UCRYPT:-${CARGO_TARGET_DIR:-target}/release/ucrypt}
[ -x "$UCRYPT" ] || cargo build --release --locked -p ucrypt-cli
for t in cryptsetup fio python3 sha256sum; do
  command -v "$t" >/dev/null || { echo "bench-reencrypt-online: $t not found (scripts/install-test-deps.sh installs it)" >&2; exit 1; }
done
die() { echo "bench-reencrypt-online: $*" >&2; exit 1; }

WORK=$(mktemp -d "$DIR/ucrypt-onreenc.XXXXXX")
export UCRYPT_RUNTIME_DIR=$WORK/run
NAME=onbench
RPID=
cleanup() {
  [ -z "$RPID" ] || kill "$RPID" 2>/dev/null || true
  "$UCRYPT" close "$NAME" >/dev/null 2>&1 || true
  rm -rf "$WORK"
}
trap cleanup EXIT
FS=$(findmnt -no FSTYPE -T "$WORK" 2>/dev/null | head -n1)
[ -n "$FS" ] || FS=$(stat -f -c %T "$WORK")
IMG=$WORK/img
KEY=$WORK/key
printf 'reencrypt-online-bench' >"$KEY"
KDF=(--pbkdf pbkdf2 --pbkdf-force-iterations 1000)
URI="nbd+unix:///?socket=$UCRYPT_RUNTIME_DIR/$NAME.nbd.sock"
# The first quarter's plaintext, and what the write cells write there
# (WRITE_PATTERN, another pattern, makes the final check fail: the smoke
# test's way to see that it can).
PATTERN=0x5ac3e11d
WRITE_PATTERN=${WRITE_PATTERN:-$PATTERN}

now() { date +%s.%N; }
drop_caches() {
  [ "$FS" = tmpfs ] && return 0
  sync
  if [ -w /proc/sys/vm/drop_caches ]; then echo 3 >/proc/sys/vm/drop_caches; fi
}
# status KEY...: the values of these keys in `status --json` (each key
# appears once in it), one line; "-" for one absent. No python here: it
# is polled while the client runs.
status() {
  "$UCRYPT" status --json "$NAME" | awk -v keys="$*" '
    BEGIN { n = split(keys, k, " ") }
    { for (i = 1; i <= n; i++) if ($1 == "\"" k[i] "\":") { v = $2; sub(/,$/, "", v); gsub(/"/, "", v); val[i] = v } }
    END { for (i = 1; i <= n; i++) printf "%s%s", (i > 1 ? " " : ""), (i in val ? val[i] : "-"); print "" }'
}
open_volume() {
  "$UCRYPT" open --key-file "$KEY" --direct-io "$DIO" "$IMG" "$NAME" >/dev/null
}
# plain_sha: sha256 of the whole plaintext through ucrypt (volume closed).
plain_sha() {
  "$UCRYPT" map --read --luks "$IMG" --key-file "$KEY" | sha256sum | cut -d' ' -f1
}
# fio_cell RW BS QD [fio args]: the client's MiB/s over RUNTIME.
fio_cell() {
  local rw=$1 bs=$2 qd=$3 region
  shift 3
  if [ "$rw" = randwrite ]; then
    region=(--offset=0 --size="$WREG" --buffer_pattern="$WRITE_PATTERN" --scramble_buffers=0)
  else
    region=(--size="$DATA")
  fi
  fio --name=client --ioengine=nbd --uri="$URI" --rw="$rw" --bs="$bs" --iodepth="$qd" \
    "${region[@]}" --time_based --runtime="$RUNTIME" --randrepeat=0 \
    --output-format=json >"$WORK/fio.json" 2>"$WORK/fio.err" ||
    { cat "$WORK/fio.err" >&2; die "fio $rw $bs QD$qd failed"; }
  python3 -c '
import json, sys
t = open(sys.argv[1]).read()  # fio nbd prints "fio: connected ..." first
j = json.loads(t[t.index("{"):])["jobs"][0]
d = j["read"] if j["read"]["io_bytes"] else j["write"]
print("%.1f" % (d["bw_bytes"] / 1048576))' "$WORK/fio.json"
}
# start_run [--rate R]: a fresh online reencryption in the background
# (RPID), seen by the daemon before this returns (or already finished).
start_run() {
  "$UCRYPT" reencrypt -q --active-name "$NAME" --key-file "$KEY" "${KDF[@]}" "$@" \
    >"$WORK/reenc.log" 2>&1 &
  RPID=$!
  local s
  for _ in $(seq 200); do
    kill -0 "$RPID" 2>/dev/null || return 0
    read -r s <<<"$(status running finished)"
    [ "$s" = "true false" ] && return 0
    sleep 0.05
  done
  die "the online reencryption did not start: $(cat "$WORK/reenc.log")"
}
# end_run: waits for RPID's run to finish; it must succeed.
end_run() {
  wait "$RPID" || { cat "$WORK/reenc.log" >&2; RPID=; die "ucrypt reencrypt --active-name failed"; }
  RPID=
}
# online_cell RW BS QD [--rate R]: "client-MiB/s reencryption-MiB/s restarts"
# into $WORK/cell, with a reencryption running throughout the client's run
# (called in this shell, not $(...): RPID is its child, die ends the script).
online_cell() {
  local rw=$1 bs=$2 qd=$3 moved=0 restarts=0 done0 total t0 t1 fpid d running finished
  shift 3
  start_run "$@"
  read -r done0 total <<<"$(status done total)"
  t0=$(now)
  fio_cell "$rw" "$bs" "$qd" >"$WORK/client" &
  fpid=$!
  while kill -0 "$fpid" 2>/dev/null; do
    if ! kill -0 "$RPID" 2>/dev/null; then
      # Finished within the cell: count it and start another.
      end_run
      moved=$((moved + total - done0))
      done0=0
      restarts=$((restarts + 1))
      start_run "$@"
    fi
    sleep 0.05
  done
  wait "$fpid" || die "fio $rw $bs QD$qd failed"
  t1=$(now)
  read -r d running finished <<<"$(status done running finished)"
  [ "$running" = true ] || [ "$finished" = true ] || die "the online reencryption stopped: $(cat "$WORK/reenc.log")"
  moved=$((moved + d - done0))
  # The next cell starts on a volume out of reencryption: finish this one
  # with no limit. `--resume --rate 0` only steers (`--rate` alone would
  # start another if this one just finished); it fails if none runs.
  if [ "$running" = true ] && [ $# -gt 0 ]; then
    "$UCRYPT" reencrypt --active-name "$NAME" --resume --rate 0 >/dev/null 2>&1 </dev/null || true
  fi
  end_run
  python3 -c "print('$(cat "$WORK/client")', f'{$moved / 1048576 / ($t1 - $t0):.1f}', $restarts)" >"$WORK/cell"
}

# ---- the image: the first quarter the pattern, the rest random -----------
dd if=/dev/zero of="$IMG" bs=1M count="$SIZE" conv=fsync status=none
cryptsetup luksFormat -q --type luks2 "${KDF[@]}" --cipher "$CIPHER" \
  --sector-size "$SECTOR" --key-file "$KEY" "$IMG"
# O_DIRECT for ucrypt's backing file where the filesystem takes it.
if dd if="$IMG" of=/dev/null bs=4096 count=1 iflag=direct status=none 2>/dev/null; then
  DIO=required
else
  DIO=never
fi
open_volume
read -r SECTORS ENGINE <<<"$(status size_sectors engine)"
DATA=$((SECTORS * 512))
WREG=$((DATA / 4 / 1048576 * 1048576))
[ "$WREG" -gt 0 ] || die "SIZE=$SIZE MiB leaves no data area to write to: raise SIZE"
fio --name=fill --ioengine=nbd --uri="$URI" --rw=write --bs=1M --iodepth=8 --offset=0 \
  --size="$WREG" --buffer_pattern="$PATTERN" --scramble_buffers=0 >/dev/null 2>"$WORK/fio.err" ||
  { cat "$WORK/fio.err" >&2; die "fio fill failed"; }
fio --name=fill --ioengine=nbd --uri="$URI" --rw=write --bs=1M --iodepth=8 --offset="$WREG" \
  --size=$((DATA - WREG)) --refill_buffers >/dev/null 2>"$WORK/fio.err" ||
  { cat "$WORK/fio.err" >&2; die "fio fill failed"; }
"$UCRYPT" close "$NAME" >/dev/null
SHA0=$(plain_sha)

DMIB=$((DATA / 1048576))
echo "bench-reencrypt-online: $SIZE MiB LUKS2 ($CIPHER, ${SECTOR}-byte sectors, $DMIB MiB of data) in $DIR ($FS, ucrypt's backing file $([ $DIO = required ] && echo O_DIRECT || echo buffered), $ENGINE), $ROUNDS rounds, ${RUNTIME}s cells, fio nbd engine over ucrypt's NBD unix socket"
echo "cryptsetup: $(cryptsetup --version)"
echo "ucrypt: $("$UCRYPT" --version)"
echo "online/limited cells each start a fresh reencryption of the whole volume (finished before the next cell); one that finishes within the cell restarts at once (restarts counted)"
echo "writes: first $((WREG / 1048576)) MiB, the pattern it holds; reads: all $DMIB MiB"
printf '%-5s %-16s %9s %9s %9s %8s %9s %9s %8s %9s\n' round cell offline idle online reenc limit limited reenc restarts
RES=$WORK/results
: >"$RES"
RESTARTS=0
for r in $(seq 1 "$ROUNDS"); do
  drop_caches
  t0=$(now)
  "$UCRYPT" reencrypt -q "${KDF[@]}" --key-file "$KEY" "$IMG" >"$WORK/off.log" 2>&1 ||
    { cat "$WORK/off.log" >&2; die "offline ucrypt reencrypt failed"; }
  t1=$(now)
  off=$(python3 -c "print(f'{$DMIB / ($t1 - $t0):.1f}')")
  lim=${RATE:-$(python3 -c "print(f'{$off / 2:.1f}')")}
  if python3 -c "import sys; sys.exit(0 if $DMIB > 1.2 * $RUNTIME * $off else 1)"; then :; else
    echo "round $r: $DMIB MiB at the offline $off MiB/s may not outlast a ${RUNTIME}s cell: restarts likely (raise SIZE)"
  fi
  open_volume
  for c in $CELLS; do
    IFS=: read -r rw bs qd <<<"$c"
    idle=$(fio_cell "$rw" "$bs" "$qd")
    online_cell "$rw" "$bs" "$qd"
    read -r on on_re on_n <"$WORK/cell"
    online_cell "$rw" "$bs" "$qd" --rate "$lim"
    read -r li li_re li_n <"$WORK/cell"
    RESTARTS=$((RESTARTS + on_n + li_n))
    echo "$r $rw-$bs-QD$qd $off $idle $on $on_re $lim $li $li_re $((on_n + li_n))" >>"$RES"
    printf '%-5s %-16s %9s %9s %9s %8s %9s %9s %8s %9s\n' "$r" "$rw-$bs-QD$qd" "$off" "$idle" \
      "$on" "$on_re" "$lim" "$li" "$li_re" "$((on_n + li_n))"
  done
  "$UCRYPT" close "$NAME" >/dev/null
done

# ---- the result is right --------------------------------------------------
if cryptsetup luksDump "$IMG" | grep -q 'online-reencrypt'; then
  die "the image is still in reencryption"
fi
cryptsetup open --test-passphrase --key-file "$KEY" "$IMG" ||
  die "cryptsetup does not open the reencrypted image's keyslot"
SHA1=$(plain_sha)
[ "$SHA0" = "$SHA1" ] || die "the plaintext changed: sha256 $SHA0 before, $SHA1 after"
echo "plaintext through ucrypt unchanged (sha256 ${SHA0:0:16}...); cryptsetup opens the keyslot"

python3 - "$RES" "$RESTARTS" <<'EOF'
import collections, statistics, sys
rows = collections.OrderedDict()
for line in open(sys.argv[1]):
    f = line.split()
    rows.setdefault(f[1], []).append(list(map(float, f[2:])))
med = statistics.median
span = lambda v: f"{med(v):.2f} ({min(v):.2f}-{max(v):.2f})"
print()
print("medians; ratios: median of the same-round ratios (lowest-highest)")
print(f"{'cell':<16} {'idle':>8} {'online':>8} {'÷idle':>17} {'reenc':>8} {'÷offline':>17}"
      f" {'limited':>8} {'÷idle':>17} {'reenc':>8} {'÷offline':>17}")
for cell, rs in rows.items():
    # offline idle online reenc limit limited reenc restarts
    col = lambda i: [r[i] for r in rs]
    ratio = lambda a, b: [r[a] / r[b] if r[b] > 0 else 0.0 for r in rs]
    print(f"{cell:<16} {med(col(1)):8.1f} {med(col(2)):8.1f} {span(ratio(2, 1)):>17} "
          f"{med(col(3)):8.1f} {span(ratio(3, 0)):>17} {med(col(5)):8.1f} "
          f"{span(ratio(5, 1)):>17} {med(col(6)):8.1f} {span(ratio(6, 0)):>17}")
print("MiB/s: idle/online/limited the client's; reenc the reencryption's while the client "
      "ran; ÷offline against the round's offline ucrypt reencrypt of the closed image")
n = int(sys.argv[2])
if n:
    print(f"restarts: {n} (a reencryption finished within a cell; raise SIZE for none)")
EOF
