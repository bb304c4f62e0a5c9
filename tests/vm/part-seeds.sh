#!/bin/sh
# Part 5: the seeds' experiment with both engines in one guest. The same fio
# jobs (4k QD1, 4k QD32, 1M QD8; read and write; libaio, direct) run on brd
# raw, on kernel dm-crypt over it (default, no_read_workqueue,
# no_write_workqueue, both) and on ucrypt over ublk on the same ramdisk
# (classic, inline, adaptive), all aes-xts-plain64 with one random key. The
# table prints MiB/s for raw and every other row as a ratio to raw, with the
# accelerator named: under TCG the CPU is emulated and the ratios describe
# nothing physical; on a KVM host (scripts/vm-bench.sh) they do.
# Sourced by suite.sh with lib.sh loaded.
#
# Size and run time come from the kernel command line,
# vmtest.seeds=<ramdisk MiB>:<seconds per cell> (default 64:0.5, CI's short
# version: it checks that every row is produced).
SEEDS=$(sed -n 's/.*vmtest\.seeds=\([^ ]*\).*/\1/p' /proc/cmdline)
S_MIB=${SEEDS%%:*}; S_MIB=${S_MIB:-64}
S_SECS=${SEEDS#*:}; [ "$S_SECS" = "$SEEDS" ] && S_SECS=0.5
S_MS=$(awk "BEGIN { printf \"%d\", $S_SECS * 1000 }")
JOBS="4k:1:read 4k:1:write 4k:32:read 4k:32:write 1M:8:read 1M:8:write"
case "$VMTEST_ACCEL" in
  kvm) ACCEL_NOTE="KVM: ratios are this host's CPU, in a $(nproc)-vCPU guest" ;;
  *) ACCEL_NOTE="TCG: an emulated CPU; these ratios describe nothing physical (run scripts/vm-bench.sh on a host with /dev/kvm)" ;;
esac

# brd at the experiment's size (the advisor part may have loaded a smaller one).
rmmod brd 2>/dev/null
run modprobe brd rd_nr=1 rd_size=$((S_MIB * 1024))
check "seeds: brd /dev/ram0 of ${S_MIB} MiB" sh -c "[ \$(blockdev --getsize64 /dev/ram0) = $((S_MIB << 20)) ]" ||
  { return 0 2>/dev/null || exit 0; }
# Every page exists before anything is measured (brd answers unwritten pages
# without touching memory).
run fio --name=fill --filename=/dev/ram0 --direct=1 --ioengine=libaio --rw=write --bs=1M --iodepth=8 --size=${S_MIB}M
SECTORS=$((S_MIB * 2048))
HEXKEY=$(od -An -tx1 -N64 /dev/urandom | tr -d ' \n')
TABLE="0 $SECTORS crypt aes-xts-plain64 $HEXKEY 0 /dev/ram0 0"

# measure ROW DEV: runs every job on DEV, one fio process with a stonewalled
# job per cell (process starts dominate under TCG); records
# "ROW<tab>v1 v2 …" (MiB/s, 0 for a job that failed) in /tmp/seeds.tsv.
measure() {
  _args=""; _n=0
  for j in $JOBS; do
    _n=$((_n + 1)); _bs=${j%%:*}; _rest=${j#*:}
    _args="$_args --name=c$_n --bs=$_bs --iodepth=${_rest%%:*} --rw=${_rest#*:} --stonewall"
  done
  fio --filename="$2" --direct=1 --ioengine=libaio --size=${S_MIB}M --runtime=${S_MS}ms \
      --time_based --output-format=terse --terse-version=3 $_args \
      > /tmp/seeds.fio 2>>"$LOGDIR/seeds.err"
  _vals=$(awk -F';' -v n=$_n '$1 == "3" && $5 == "0" { bw[$3] = ($7 + $48) / 1024 }
    END { for (i = 1; i <= n; i++) printf "%.3f ", bw["c" i] + 0 }' /tmp/seeds.fio)
  printf '%s\t%s\n' "$1" "${_vals% }" >> /tmp/seeds.tsv
}
# A row that could not be set up: no figures.
no_row() { printf '%s\t\n' "$1" >> /tmp/seeds.tsv; }

rm -f /tmp/seeds.tsv
info "seeds: ${S_MIB} MiB brd, ${S_SECS} s per cell; accel $ACCEL_NOTE"
measure "brd raw" /dev/ram0
for fl in default no_read_workqueue no_write_workqueue both; do
  case $fl in
    default) opts="" ;;
    both) opts=" 2 no_read_workqueue no_write_workqueue" ;;
    *) opts=" 1 $fl" ;;
  esac
  if echo "$TABLE$opts" | dmsetup create seeds-dm; then
    measure "dm-crypt $fl" /dev/mapper/seeds-dm
    dmsetup remove --retry seeds-dm
  else
    no_row "dm-crypt $fl"
  fi
done
for mode in classic inline adaptive; do
  before=$(echo /dev/ublkb*)
  d=""
  if ucrypt open --type plain --table "$TABLE" --export ublk --mode $mode /dev/ram0 seeds-u \
      >>"$LOGDIR/seeds.err" 2>&1; then
    for x in /dev/ublkb*; do case " $before " in *" $x "*) ;; *) [ -b "$x" ] && d=$x ;; esac; done
  fi
  if [ -n "$d" ]; then measure "ucrypt ublk $mode" "$d"; else no_row "ucrypt ublk $mode"; fi
  ucrypt close seeds-u >>"$LOGDIR/seeds.err" 2>&1
done

# The table: raw in MiB/s, everything else as a ratio to raw.
info "seeds | aes-xts-plain64, fio libaio direct=1, ${S_SECS} s per cell; raw in MiB/s, others as a ratio to raw"
info "seeds | $(printf '%-28s' 'device')   4k QD1 r   4k QD1 w  4k QD32 r  4k QD32 w   1M QD8 r   1M QD8 w"
awk 'BEGIN { FS = "\t" }
  NR == 1 { n = split($2, raw, " ") }
  { split($2, v, " "); line = sprintf("%-28s", $1)
    for (i = 1; i <= 6; i++) {
      if (NR == 1) line = line sprintf(" %10.1f", v[i])
      else if (raw[i] > 0 && v[i] > 0) line = line sprintf(" %9.3gx", v[i] / raw[i])
      else line = line sprintf(" %10s", "-")
    }
    print line }' /tmp/seeds.tsv | while IFS= read -r l; do info "seeds | $l"; done
info "seeds | accel: $ACCEL_NOTE"

for row in "brd raw" "dm-crypt default" "dm-crypt no_read_workqueue" "dm-crypt no_write_workqueue" \
    "dm-crypt both" "ucrypt ublk classic" "ucrypt ublk inline" "ucrypt ublk adaptive"; do
  check "seeds: $row: every job measured" awk -v r="$row" 'BEGIN { FS = "\t" }
    $1 == r { n = split($2, v, " "); ok = (n == 6); for (i = 1; i <= n; i++) if (!(v[i] > 0)) ok = 0 }
    END { exit !ok }' /tmp/seeds.tsv
done
check "seeds: nothing left mapped" sh -c "! dmsetup ls | grep seeds-dm && ! ucrypt status seeds-u >/dev/null 2>&1"
tail -n 5 "$LOGDIR/seeds.err" 2>/dev/null | sed 's/^/    ! /'
