#!/usr/bin/env bash
# A throwaway single-node Ceph cluster for the RBD tests and scripts/ceph-bench.sh.
#
#   bash scripts/ceph-test-cluster.sh start DIR      # prints DIR/ceph.conf on stdout
#   bash scripts/ceph-test-cluster.sh stop DIR       # stops this cluster's daemons only
#   bash scripts/ceph-test-cluster.sh osd-stop DIR   # fault injection: stop the OSD ...
#   bash scripts/ceph-test-cluster.sh osd-start DIR  # ... and start it again (same data)
#   bash scripts/ceph-test-cluster.sh status DIR     # `ceph -s` of that cluster
#   bash scripts/ceph-test-cluster.sh pool-create DIR POOL  # a new RBD pool (size 1)
#   bash scripts/ceph-test-cluster.sh pool-rm DIR POOL      # ... and its removal
#
# One mon, one mgr, one OSD (bluestore on a sparse file in DIR, so the OSD keeps
# its data across osd-stop/osd-start; CEPH_TEST_OBJECTSTORE=memstore for a
# RAM-only OSD that loses everything on restart), pool size 1, everything on
# 127.0.0.1, cephx with keys generated into DIR/keyring (client.admin is the
# default client; ceph.conf names the keyring, so `-c DIR/ceph.conf` is all a
# client needs). A replicated pool `rbd` is created and initialised for RBD.
#
# Several clusters may run at once in different DIRs: the mon takes a free port
# and the other daemons bind inside a free port window chosen at start. Daemon
# PIDs are kept in DIR/pids; `stop` signals only those (and only while the
# process still runs a ceph binary on this DIR's ceph.conf) — never by name.
#
# Environment: CEPH_TEST_TIMEOUT (seconds to wait for the cluster, default 180),
# CEPH_TEST_OSD_BYTES (bluestore file / memstore size, default 8 GiB sparse),
# CEPH_TEST_OBJECTSTORE (bluestore | memstore).
# Exit status: 0 ok, 1 failure (logs in DIR/log), 2 usage, 3 packages missing.
set -euo pipefail

TIMEOUT="${CEPH_TEST_TIMEOUT:-180}"
OSD_BYTES="${CEPH_TEST_OSD_BYTES:-8589934592}"
OBJECTSTORE="${CEPH_TEST_OBJECTSTORE:-bluestore}"

die() {
  echo "ceph-test-cluster: $*" >&2
  exit 1
}
log() { echo "ceph-test-cluster: $*" >&2; }

usage() {
  echo "usage: $0 start|stop|osd-stop|osd-start|status DIR | pool-create|pool-rm DIR POOL" >&2
  exit 2
}

need_tools() {
  local missing=() t
  for t in ceph-mon ceph-osd ceph-mgr ceph ceph-authtool monmaptool rbd python3; do
    command -v "$t" >/dev/null 2>&1 || missing+=("$t")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    echo "ceph-test-cluster: missing ${missing[*]}: install the Ceph packages" \
      "(ceph-mon ceph-osd ceph-mgr ceph-common; bash scripts/install-test-deps.sh)" >&2
    exit 3
  fi
}

# Bounded ceph CLI call against this cluster.
cephc() { timeout 30 ceph -c "$CONF" --connect-timeout 20 "$@"; }

# A free TCP port on 127.0.0.1 (the kernel picks it).
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# The first port of a window of $1 consecutive ports free on 127.0.0.1, below
# the kernel's ephemeral range, starting at a random place so that clusters
# started at the same time rarely pick the same window (ceph daemons try the
# next port of the window when one is taken, so an overlap is not fatal).
free_window() {
  python3 - "$1" <<'EOF'
import random, socket, sys
n = int(sys.argv[1])
for _ in range(200):
    base = random.randrange(10000, 32000 - n)
    socks = []
    try:
        for p in range(base, base + n):
            s = socket.socket()
            s.bind(("127.0.0.1", p))
            socks.append(s)
    except OSError:
        continue
    finally:
        for s in socks:
            s.close()
    print(base)
    sys.exit(0)
sys.exit("no free port window")
EOF
}

# Start one daemon in the foreground (-f) in the background, log to DIR/log,
# remember its PID.
spawn() {
  local name="$1"
  shift
  nohup "$@" -c "$CONF" -f >>"$DIR/log/$name.out" 2>&1 </dev/null &
  echo $! >"$DIR/pids/$name.pid"
}

# Is PID (from pid file $1) one of our daemons still running?
ours() {
  local pid cmd
  pid="$(cat "$1" 2>/dev/null)" || return 1
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] || return 1
  cmd="$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null)" || return 1
  case "$cmd" in
  *ceph-*" -c $CONF "*) return 0 ;;
  *) return 1 ;;
  esac
}

stop_one() {
  local pf="$1" pid i
  if ours "$pf"; then
    pid="$(cat "$pf")"
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
      ours "$pf" || break
      sleep 0.1
    done
    if ours "$pf"; then
      kill -KILL "$pid" 2>/dev/null || true
      for ((i = 0; i < 50; i++)); do
        ours "$pf" || break
        sleep 0.1
      done
    fi
  fi
  rm -f "$pf"
}

# Wait until `ceph osd stat` says the OSD is up, bounded.
wait_osd_up() {
  local deadline=$((SECONDS + TIMEOUT))
  until cephc osd dump 2>/dev/null | grep -q '^osd\.0 up'; do
    ours "$DIR/pids/osd.0.pid" || die "osd.0 exited (see $DIR/log/osd.0.log, $DIR/log/osd.0.out)"
    [ $SECONDS -lt $deadline ] || die "osd.0 not up after ${TIMEOUT}s (see $DIR/log)"
    sleep 0.5
  done
}

# Wait until every PG is active+clean, bounded.
wait_pgs_clean() {
  local deadline=$((SECONDS + TIMEOUT)) st
  while :; do
    st="$(cephc pg stat 2>/dev/null || true)"
    # e.g. "33 pgs: 33 active+clean; 0 B data, ..."
    if echo "$st" | grep -Eq '^([0-9]+) pgs: \1 active\+clean;'; then
      return 0
    fi
    [ $SECONDS -lt $deadline ] || die "PGs not active+clean after ${TIMEOUT}s: $st (see $DIR/log)"
    sleep 0.5
  done
}

start_osd() {
  spawn osd.0 ceph-osd -i 0
  wait_osd_up
}

# A replicated pool of size 1 initialised for RBD, its PGs clean (tests that
# share one cluster each make their own).
pool_create() {
  cephc osd pool create "$1" 8 8 replicated >/dev/null 2>&1 || die "pool create $1 failed"
  cephc osd pool set "$1" size 1 --yes-i-really-mean-it >/dev/null 2>&1 || true
  timeout 60 rbd -c "$CONF" pool init "$1" || die "rbd pool init $1 failed"
  wait_pgs_clean
}

cmd_start() {
  need_tools
  [ ! -e "$CONF" ] || die "$DIR already holds a cluster (stop it first, or use a new DIR)"
  # A start that fails leaves no daemon behind.
  trap 'rc=$?; [ $rc -eq 0 ] || cmd_stop; exit $rc' EXIT
  mkdir -p "$DIR"/{mon,mgr,osd,run,log,pids,crash}
  local mon_port win
  mon_port="$(free_port)"
  win="$(free_window 40)"
  local fsid
  fsid="$(python3 -c 'import uuid; print(uuid.uuid4())')"

  cat >"$CONF" <<EOF
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$mon_port
mon initial members = a
public network = 127.0.0.0/8
ms bind msgr1 = false
ms bind ipv4 = true
ms bind ipv6 = false
ms bind port min = $win
ms bind port max = $((win + 39))
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
auth allow insecure global id reclaim = false
mon warn on insecure global id reclaim = false
mon warn on insecure global id reclaim allowed = false
keyring = $DIR/keyring
run dir = $DIR/run
crash dir = $DIR/crash
pid file = $DIR/run/\$name.pid
log file = $DIR/log/\$name.log
log to stderr = false
err to stderr = true
mon cluster log file = $DIR/log/cluster.log
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon data avail warn = 1
mon data avail crit = 0
osd objectstore = $OBJECTSTORE
rbd default features = layering, exclusive-lock, object-map, fast-diff, deep-flatten

[mon]
admin socket = $DIR/run/\$name.asok
mon data = $DIR/mon
mon cluster log to file = true

[mgr]
admin socket = $DIR/run/\$name.asok
mgr data = $DIR/mgr
keyring = $DIR/mgr/keyring

[osd]
admin socket = $DIR/run/\$name.asok
osd data = $DIR/osd
keyring = $DIR/osd/keyring
osd journal = $DIR/osd/journal
osd max object name len = 460
osd max object namespace len = 64
osd memory target = 939524096
osd op num shards = 1
osd op num threads per shard = 2
bluestore block create = true
bluestore block size = $OSD_BYTES
bluestore block db create = false
bluestore block wal create = false
bluestore cache autotune = false
bluestore cache size = 134217728
bluestore fsck on mount = false
memstore device bytes = $OSD_BYTES
EOF

  log "mon on 127.0.0.1:$mon_port, daemon ports $win-$((win + 39)), $OBJECTSTORE OSD, logs in $DIR/log"
  # Keys: mon. and client.admin in one keyring, which every daemon reads.
  ceph-authtool --create-keyring "$DIR/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool "$DIR/keyring" --gen-key -n client.admin \
    --cap mon 'allow *' --cap osd 'allow *' --cap mgr 'allow *' --cap mds 'allow *' >/dev/null
  monmaptool --create --fsid "$fsid" --addv a "[v2:127.0.0.1:$mon_port]" "$DIR/monmap" >/dev/null
  ceph-mon -c "$CONF" --mkfs -i a --monmap "$DIR/monmap" --keyring "$DIR/keyring" \
    >>"$DIR/log/mkfs.out" 2>&1 || die "ceph-mon --mkfs failed (see $DIR/log/mkfs.out)"
  spawn mon.a ceph-mon -i a

  local deadline=$((SECONDS + TIMEOUT))
  until cephc mon stat >/dev/null 2>&1; do
    ours "$DIR/pids/mon.a.pid" || die "ceph-mon exited (see $DIR/log/mon.a.log, $DIR/log/mon.a.out)"
    [ $SECONDS -lt $deadline ] || die "mon not answering after ${TIMEOUT}s (see $DIR/log)"
    sleep 0.5
  done

  # The mgr (its key made by the mon, written into its data dir).
  mkdir -p "$DIR/mgr"
  cephc auth get-or-create mgr.x mon 'allow profile mgr' osd 'allow *' mds 'allow *' \
    -o "$DIR/mgr/keyring" >/dev/null
  spawn mgr.x ceph-mgr -i x

  # The OSD: id and key from the mon, then its store.
  local uuid id
  uuid="$(python3 -c 'import uuid; print(uuid.uuid4())')"
  id="$(cephc osd new "$uuid")"
  [ "$id" = 0 ] || die "unexpected osd id $id"
  cephc auth get-or-create osd.0 osd 'allow *' mon 'allow profile osd' mgr 'allow profile osd' \
    -o "$DIR/osd/keyring" >/dev/null
  ceph-osd -c "$CONF" -i 0 --mkfs --osd-uuid "$uuid" >>"$DIR/log/mkfs.out" 2>&1 ||
    die "ceph-osd --mkfs failed (see $DIR/log/mkfs.out, $DIR/log/osd.0.log)"
  cephc osd crush add osd.0 1 root=default host=localhost >/dev/null 2>&1
  start_osd

  pool_create rbd
  log "ready: $(cephc health 2>/dev/null || true)"
  echo "$CONF"
}

cmd_stop() {
  local pf
  # The OSD first (so the mon sees it go), the mon last.
  for pf in "$DIR/pids/osd.0.pid" "$DIR/pids/mgr.x.pid" "$DIR/pids/mon.a.pid"; do
    [ -e "$pf" ] && stop_one "$pf"
  done
  for pf in "$DIR"/pids/*.pid; do
    [ -e "$pf" ] && stop_one "$pf"
  done
  return 0
}

case "${1:-}" in
pool-create | pool-rm) [ $# -eq 3 ] || usage ;;
*) [ $# -eq 2 ] || usage ;;
esac
DIR="$(mkdir -p "$2" && cd "$2" && pwd)"
CONF="$DIR/ceph.conf"
case "$1" in
pool-create) pool_create "$3" ;;
pool-rm) cephc osd pool rm "$3" "$3" --yes-i-really-really-mean-it >/dev/null ;;
start) cmd_start ;;
stop) cmd_stop ;;
osd-stop) stop_one "$DIR/pids/osd.0.pid" ;;
osd-start)
  need_tools
  ! ours "$DIR/pids/osd.0.pid" || die "osd.0 already running"
  start_osd
  wait_pgs_clean
  ;;
status) cephc -s ;;
*) usage ;;
esac
