#!/usr/bin/env bash
# Foreign-format peers side by side: one BitLocker image and one FileVault 2
# image (both from cryptsetup 2.6.1's test suite, fetched by
# scripts/fetch-cryptsetup-tests.sh; copied to tmpfs, or to $DIR) behind
#
#   BitLocker : ucrypt FUSE export, ucrypt NBD export (fio's nbd engine),
#               dislocker (FUSE, read-write), bdemount (libbde, FUSE, read-only)
#   FileVault2: fvdemount (libfvde, FUSE, read-only), when it opens the image
#               (Debian 12's libfvde refuses the suite's: then no FileVault row)
#
# and runs fio 4k QD1, 4k QD32 and 1M QD8 random reads (and random writes where
# the peer writes), printing MiB/s side by side and ucrypt's ratio to each peer.
# Files behind FUSE are read with O_DIRECT (libaio) where the mount allows it,
# else buffered with the cache dropped first (the row says which).
#
# Usage: scripts/bench-foreign.sh   (env: RUNTIME=10 s per run, ROUNDS=3,
#        DIR=/dev/shm where the images live: a directory on a real disk
#        measures that disk)
# A small check that it works: RUNTIME=1 ROUNDS=1 scripts/bench-foreign.sh
# Needs: fio cryptsetup's test images, dislocker libbde-utils libfvde-utils fuse3
# (scripts/install-test-deps.sh). Run it on an idle machine for real figures.
set -euo pipefail
cd "$(dirname "$0")/.."

RUNTIME=${RUNTIME:-10}
ROUNDS=${ROUNDS:-3}
UCRYPT=${UCRYPT:-${CARGO_TARGET_DIR:-target}/release/ucrypt}
[ -x "$UCRYPT" ] || cargo build --release -p ucrypt-cli
for t in fio dislocker bdemount fvdemount fusermount3 python3; do
  command -v "$t" >/dev/null || { echo "bench-foreign: $t not found (run scripts/install-test-deps.sh)" >&2; exit 1; }
done

CACHE=$(realpath -m "${CACHE:-${CARGO_TARGET_DIR:-target}/tmp/cryptsetup-2.6.1}")
SUITE=$(bash scripts/fetch-cryptsetup-tests.sh "$CACHE")
WORK=$(mktemp -d "${DIR:-/dev/shm}/ucrypt-foreign.XXXXXX")
export UCRYPT_RUNTIME_DIR=$WORK/run
PIDS=()
MOUNTS=()
# FUSE_URING=auto|on measures ucrypt's FUSE export over FUSE over io_uring
# (the fuse module's enable_uring turned on for the run, root only, put back
# after); the default, off, is the export's own default, /dev/fuse.
FUSE_URING=${FUSE_URING:-off}
URING_PARAM=/sys/module/fuse/parameters/enable_uring
URING_OLD=
if [ "$FUSE_URING" != off ] && [ -w "$URING_PARAM" ]; then
  URING_OLD=$(cat "$URING_PARAM")
  echo 1 >"$URING_PARAM" || URING_OLD=
fi
cleanup() {
  for v in bl-fuse bl-nbd; do "$UCRYPT" close "$v" >/dev/null 2>&1 || true; done
  if [ -n "$URING_OLD" ]; then
    if [ "$URING_OLD" = Y ]; then echo 1; else echo 0; fi >"$URING_PARAM" || true
  fi
  for m in "${MOUNTS[@]}"; do fusermount3 -u "$m" 2>/dev/null || umount "$m" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  sleep 0.3
  rm -rf "$WORK"
}
trap cleanup EXIT

# ---- the images ---------------------------------------------------------------
tar -xJf "$SUITE/bitlk-images.tar.xz" -C "$WORK" bitlk-images/bitlk-aes-xts-128.img bitlk-images/images.conf
tar -xJf "$SUITE/fvault2-images.tar.xz" -C "$WORK"
RP=$(grep -A8 '^\[bitlk-aes-xts-128\]' "$WORK/bitlk-images/images.conf" | sed -n 's/^RP=//p')
printf '%s' "$RP" >"$WORK/rp"
FV_PASS=heslo123
# Every job stays below the image's first FVE metadata area: dislocker fails a
# write there (EFAULT) where cryptsetup and ucrypt map the area out, so the
# peers are measured on the same plaintext range.
SPAN=$("$UCRYPT" bitlkDump "$WORK/bitlk-images/bitlk-aes-xts-128.img" |
  awk '/FVE metadata area/ { getline; print $2 }' | sort -n | head -n1)
[ -n "$SPAN" ] || { echo "bench-foreign: no FVE metadata offset in bitlkDump's output" >&2; exit 1; }
for p in uc-fuse uc-nbd dislocker bde; do cp "$WORK/bitlk-images/bitlk-aes-xts-128.img" "$WORK/$p.img"; done
mkdir -p "$WORK/mnt"/{uc,dis,bde,fvde}

# ---- the exports ----------------------------------------------------------------
declare -A TARGET WRITES
"$UCRYPT" open --type bitlk --key-file "$WORK/rp" --export "fuse=$WORK/mnt/uc,uring=$FUSE_URING" "$WORK/uc-fuse.img" bl-fuse >/dev/null
MOUNTS+=("$WORK/mnt/uc")
TARGET[ucrypt-fuse]="file:$WORK/mnt/uc/bl-fuse"; WRITES[ucrypt-fuse]=1
for _ in $(seq 200); do [ -e "$WORK/mnt/uc/bl-fuse" ] && break; sleep 0.05; done
[ -e "$WORK/mnt/uc/bl-fuse" ] || { echo "bench-foreign: ucrypt's FUSE export did not appear" >&2; exit 1; }
FUSE_TRANSPORT=$("$UCRYPT" status bl-fuse | awk '$1 == "fuse:" { sub(",", "", $3); print $3 }')
"$UCRYPT" open --type bitlk --key-file "$WORK/rp" "$WORK/uc-nbd.img" bl-nbd >/dev/null
TARGET[ucrypt-nbd]="nbd:nbd+unix:///?socket=$UCRYPT_RUNTIME_DIR/bl-nbd.nbd.sock"; WRITES[ucrypt-nbd]=1
dislocker -V "$WORK/dislocker.img" -p"$RP" -- "$WORK/mnt/dis"
MOUNTS+=("$WORK/mnt/dis")
TARGET[dislocker]="file:$WORK/mnt/dis/dislocker-file"; WRITES[dislocker]=1
bdemount -r "$RP" "$WORK/bde.img" "$WORK/mnt/bde" >/dev/null 2>&1 & PIDS+=($!)
MOUNTS+=("$WORK/mnt/bde")
fvdemount -p "$FV_PASS" "$WORK/fvault2-images/small" "$WORK/mnt/fvde" >/dev/null 2>&1 & PIDS+=($!)
MOUNTS+=("$WORK/mnt/fvde")
TARGET[bdemount]="file:$WORK/mnt/bde/bde1"; WRITES[bdemount]=0
TARGET[fvdemount]="file:$WORK/mnt/fvde/fvde1"; WRITES[fvdemount]=0
PEERS=(ucrypt-fuse ucrypt-nbd dislocker)
# A peer that cannot open its image (Debian 12's libfvde 20190104 refuses
# the suite's FileVault 2 image: "unsupported block size") is left out, said so.
for p in bdemount fvdemount; do
  f=${TARGET[$p]#file:}
  for _ in $(seq 100); do [ -e "$f" ] && break; sleep 0.05; done
  if [ -e "$f" ]; then PEERS+=("$p"); else echo "bench-foreign: $p did not open its image; left out" >&2; fi
done

# ---- fio --------------------------------------------------------------------
# fio_run TARGET RW BS QD -> prints "MiB/s how" ("n/a -" if the peer refuses)
fio_run() {
  local kind=${1%%:*} where=${1#*:} out how
  local common=(--name=foreign --rw="$2" --bs="$3" --iodepth="$4" --time_based
    --runtime="$RUNTIME" --randrepeat=0 --output-format=json)
  if [ "$kind" = nbd ]; then
    how=nbd
    out=$(fio "${common[@]}" --ioengine=nbd --uri="$where" --size="$SPAN" 2>/dev/null) || { echo "n/a -"; return; }
  else
    local size; size=$(stat -c %s "$where")
    [ "$size" -le "$SPAN" ] || size=$SPAN
    how=direct
    if ! out=$(fio "${common[@]}" --ioengine=libaio --direct=1 --filename="$where" --size="$size" 2>/dev/null); then
      how=buffered
      sync; echo 1 >/proc/sys/vm/drop_caches 2>/dev/null || true
      out=$(fio "${common[@]}" --ioengine=psync --filename="$where" --size="$size" 2>/dev/null) || { echo "n/a -"; return; }
    fi
  fi
  printf '%s' "$out" | python3 -c '
import json, sys
t = sys.stdin.read()
j = json.loads(t[t.index("{"):])["jobs"][0]
d = j["read"] if j["read"]["io_bytes"] else j["write"]
print("%.1f %s" % (d["bw_bytes"] / 1048576, sys.argv[1]))' "$how"
}
median() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

declare -A RES HOW
JOBS=("randread 4k 1" "randread 4k 32" "randread 1M 8" "randwrite 4k 1" "randwrite 4k 32" "randwrite 1M 8")
for job in "${JOBS[@]}"; do
  read -r rw bs qd <<<"$job"
  for p in "${PEERS[@]}"; do
    [ "$rw" = randwrite ] && [ "${WRITES[$p]}" = 0 ] && continue
    vals=()
    for _ in $(seq "$ROUNDS"); do
      read -r v h < <(fio_run "${TARGET[$p]}" "$rw" "$bs" "$qd")
      [ "$v" = n/a ] && break
      vals+=("$v"); HOW[$job/$p]=$h
    done
    RES[$job/$p]=$([ ${#vals[@]} -gt 0 ] && median "${vals[@]}" || echo n/a)
  done
done

# ---- report -------------------------------------------------------------------
echo "bench-foreign: MiB/s, median of $ROUNDS x ${RUNTIME}s, images in ${DIR:-/dev/shm} ($(stat -f -c %T "$WORK")), $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "ucrypt's FUSE export: transport ${FUSE_TRANSPORT:-unknown} (enable_uring $(cat "$URING_PARAM" 2>/dev/null || echo absent))"
echo "BitLocker: cryptsetup's bitlk-aes-xts-128.img (100 MiB; jobs span its first $((SPAN >> 20)) MiB, below the FVE metadata); FileVault 2: fvault2-images/small (160 MiB volume)"
printf '%-16s' job; for p in "${PEERS[@]}"; do printf ' %16s' "$p"; done
printf ' %14s %14s %14s\n' fuse/dislocker fuse/bdemount nbd/dislocker
ratio() { python3 -c 'import sys; a, b = sys.argv[1:]; print("%.2fx" % (float(a) / float(b)) if "n/a" not in (a, b) and float(b) > 0 else "-")' "$1" "$2"; }
for job in "${JOBS[@]}"; do
  printf '%-16s' "${job// /-}"
  for p in "${PEERS[@]}"; do
    v=${RES[$job/$p]:--}; h=${HOW[$job/$p]:-}
    printf ' %16s' "$v${h:+ ($h)}"
  done
  printf ' %14s %14s %14s\n' \
    "$(ratio "${RES[$job/ucrypt-fuse]:-n/a}" "${RES[$job/dislocker]:-n/a}")" \
    "$(ratio "${RES[$job/ucrypt-fuse]:-n/a}" "${RES[$job/bdemount]:-n/a}")" \
    "$(ratio "${RES[$job/ucrypt-nbd]:-n/a}" "${RES[$job/dislocker]:-n/a}")"
done
