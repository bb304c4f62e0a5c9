#!/bin/sh
# Part 4: the dm-crypt flag advisor (`ucrypt bench --dm-crypt`) on the guest's
# real dm-crypt over brd. It starts from a live LUKS2 mapping's flags
# (--mapping), measures them, a control (the same flags again) and the other
# workqueue flag sets in interleaved rounds, and answers one
# `cryptsetup refresh … adv` line; that line is applied to the mapping and
# checked with `dmsetup table`. Sourced by suite.sh with lib.sh loaded.
# Timings under TCG mean nothing: this checks the plumbing and the answer's
# form, not which flags win.

# brd is loaded by the advisor itself (busybox modprobe, no `modprobe -n`:
# the preflight finds the module in modules.dep); small here, for TCG.
ADV_OPTS="--size 64M --runtime 150ms --warmup 0 --no-progress"

img=/tmp/advisor.img
truncate -s 32M "$img"
check "advisor: a LUKS2 mapping with no_write_workqueue" sh -c "
  cryptsetup luksFormat -q --type luks2 $FAST_KDF --key-file '$KEY' '$img' &&
  cryptsetup open --perf-no_write_workqueue --key-file '$KEY' '$img' adv &&
  dmsetup table adv | grep -qw no_write_workqueue"

check "advisor: --workload db on the mapping's flags answers one line" sh -c "
  ucrypt bench --dm-crypt --mapping adv --workload db --reps 2 $ADV_OPTS > /tmp/advisor.out 2>&1
  rc=\$?; cat /tmp/advisor.out; [ \$rc = 0 ] &&
  grep -q '^current flags: no_write_workqueue (from mapping adv' /tmp/advisor.out &&
  grep -q '^noise band: ±' /tmp/advisor.out &&
  grep -q '^expected gain: ' /tmp/advisor.out &&
  [ \$(grep -c '^recommendation: ' /tmp/advisor.out) = 1 ]"
sed 's/^/    : /' /tmp/advisor.out 2>/dev/null | tail -n 14
check "advisor: preflight saw the kernel's dm-crypt and its workqueue flags" \
  grep -q 'dm-crypt v1\.[0-9.]* (no_read_workqueue, no_write_workqueue: yes;' /tmp/advisor.out
# Linux 6.10+ (dm-crypt 1.26): high_priority; 6.11+: the module parameters.
check "advisor: preflight saw high_priority and max_read_size/max_write_size" \
  grep -q 'high_priority: yes; module parameters max_read_size [0-9]*, max_write_size [0-9]*' /tmp/advisor.out
check "advisor: the control row and every candidate were measured" sh -c "
  for r in 'no_write_workqueue (current)' 'no_write_workqueue (control' 'none ' 'no_read_workqueue ' 'both ' \
           'none+high_priority ' 'no_write_workqueue+high_priority ' 'both+high_priority ' \
           'no_write_workqueue, max_read_size=1048576 max_write_size=1048576'; do
    grep -q \"^\$r\" /tmp/advisor.out || { echo \"no row \$r\"; exit 1; }
  done"

# The line to apply: the recommendation, or (when the gain is inside the
# noise band) the fastest candidate the advisor printed beside "keep".
# A module-parameter answer says so and ends with the refresh line to apply.
line=$(sed -n 's/^recommendation: .*\(cryptsetup refresh .*\)$/\1/p' /tmp/advisor.out)
[ -n "$line" ] || line=$(sed -n 's/^fastest candidate: .*\(cryptsetup refresh .*\)$/\1/p' /tmp/advisor.out)
if grep -q '^\(recommendation\|fastest candidate\): a module parameter' /tmp/advisor.out; then
  check "advisor: a module-parameter answer names the parameters, not a refresh flag" sh -c "
    grep -q 'not a refresh (applies to every dm-crypt mapping on this host): echo [0-9]* > /sys/module/dm_crypt/parameters/max_read_size' /tmp/advisor.out"
fi
check "advisor: the module parameters are as they were" sh -c "
  grep -q \"max_read_size \$(cat /sys/module/dm_crypt/parameters/max_read_size), max_write_size \$(cat /sys/module/dm_crypt/parameters/max_write_size)\" /tmp/advisor.out"
info "advisor answers: $(grep '^recommendation: ' /tmp/advisor.out 2>/dev/null); applying: ${line:-nothing}"
if [ -n "$line" ]; then
  check "advisor: the line names the mapping" sh -c "echo '$line' | grep -q ' adv\$'"
  check "advisor: $line applies" sh -c "$line --key-file '$KEY'"
  check "advisor: dmsetup table has exactly the line's workqueue flags" sh -c "
    t=\$(dmsetup table adv); echo \"\$t\" | sed 's/:64:logon:[^ ]*/<key>/'
    for f in no_read_workqueue no_write_workqueue high_priority; do
      want=0; echo '$line' | grep -q -- \"--perf-\$f\" && want=1
      have=0; echo \"\$t\" | grep -qw \"\$f\" && have=1
      [ \$want = \$have ] || { echo \"\$f: line \$want, table \$have\"; exit 1; }
    done"
else
  fail "advisor: a cryptsetup refresh line" "neither a recommendation nor a fastest candidate line"
fi
run cryptsetup close adv
rm -f "$img"

# A workload described by the user's own fio job file: its filename (here a
# real disk) is replaced by each measured mapping.
cat > /tmp/advisor.fio <<'EOF'
[global]
filename=/dev/vdb
bs=4k
runtime=60
[reader]
rw=randread
iodepth=4
EOF
check "advisor: --fio-job FILE answers for <name>" sh -c "
  ucrypt bench --dm-crypt --fio-job /tmp/advisor.fio --reps 1 $ADV_OPTS > /tmp/advisor-job.out 2>&1
  rc=\$?; cat /tmp/advisor-job.out; [ \$rc = 0 ] &&
  grep -q 'workload from the fio job file /tmp/advisor.fio' /tmp/advisor-job.out &&
  grep -q '^recommendation: .*cryptsetup refresh.* <name>\$' /tmp/advisor-job.out"
check "advisor: no ucrypt-adv mapping is left behind" sh -c "! dmsetup ls | grep ucrypt-adv"
expect_fail "advisor: an unknown workload is refused" \
  ucrypt bench --dm-crypt --workload nosuch $ADV_OPTS
