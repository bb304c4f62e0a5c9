#!/bin/sh
# Part 4 (smoke): `ucrypt bench --dm-crypt`, the advisor, runs end to end on the
# guest's dm-crypt over brd, and a `cryptsetup refresh --perf-…` line it
# recommends applies to a real mapping (checked with `dmsetup table`).
# Sourced by suite.sh with lib.sh loaded. Timings under TCG mean nothing: this
# checks the plumbing, not the numbers.

# busybox modprobe has no -n (the advisor's preflight probe), so brd is loaded
# here, small: the advisor uses the ramdisk that exists.
run modprobe brd rd_nr=1 rd_size=65536
check "advisor: brd /dev/ram0" test -b /dev/ram0
check "advisor: ucrypt bench --dm-crypt runs end to end" sh -c "
  ucrypt bench --dm-crypt --size 64M --runtime 50ms --warmup 10ms --reps 1 --no-progress \
    --out /tmp/bench > /tmp/advisor.out 2>&1; rc=\$?; cat /tmp/advisor.out
  [ \$rc = 0 ] && grep -q 'cryptsetup refresh' /tmp/advisor.out"
sed 's/^/    : /' /tmp/advisor.out 2>/dev/null | tail -n 30
line=$(grep -o 'cryptsetup refresh --perf[^<]*<name>' /tmp/advisor.out 2>/dev/null | head -n1)
flags=$(echo "$line" | grep -o -- '--perf-[a-z_]*' | tr '\n' ' ')
info "advisor recommends: ${line:-nothing with --perf flags}"
img=/tmp/advisor.img
truncate -s 32M "$img"
check "advisor: a LUKS2 mapping to refresh" sh -c "
  cryptsetup luksFormat -q --type luks2 --pbkdf pbkdf2 --pbkdf-force-iterations 1000 --key-file '$KEY' '$img' &&
  cryptsetup open --key-file '$KEY' '$img' adv"
if [ -n "$flags" ]; then
  check "advisor: cryptsetup refresh $flags applies" cryptsetup refresh $flags --key-file "$KEY" adv
  want=$(echo "$flags" | sed 's/--perf-//g')
  check "advisor: dmsetup table shows $want" sh -c "
    t=\$(dmsetup table adv); echo \"\$t\" | sed 's/ [0-9a-f]\{64,\} / <key> /'
    for f in $want; do echo \"\$t\" | grep -qw \"\$f\" || exit 1; done"
else
  fail "advisor: a --perf recommendation" "no 'cryptsetup refresh --perf-… <name>' line in the output"
fi
run cryptsetup close adv
rm -f "$img"
