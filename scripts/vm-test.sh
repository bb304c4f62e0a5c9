#!/usr/bin/env bash
# Guest test bench: boots Debian 12's 6.12 kernel (ublk_drv, nbd, dm-crypt as
# modules) under qemu with a busybox initramfs holding ucrypt and the reference
# tools, runs the suite in tests/vm/ inside, and reports `N passed, M failed`.
#
#   bash scripts/vm-test.sh                 # every part
#   UCRYPT_VM_PARTS="ublk nbd" bash scripts/vm-test.sh
#
# Environment:
#   UCRYPT_VM_CACHE    cache dir (kernel, base initramfs): default target/vm-cache
#   UCRYPT_VM_KERNEL_SUITE  take the guest kernel from this Debian suite instead
#                      (trixie-backports: 6.16+, for the opt-in ublkresize part);
#                      cache default target/vm-cache-SUITE
#   UCRYPT_VM_ACCEL    kvm | tcg (default: kvm when /dev/kvm opens, else tcg)
#   UCRYPT_VM_TIMEOUT  seconds before a hung guest is killed (default 1800; the
#                      whole suite takes about 660 s under TCG here, and part reencrypt2 about 340 s more)
#   UCRYPT_VM_PARTS    parts to run: ublk nbd dmcrypt plain advisor seeds vhost live reencrypt reencrypt2 tpm foreign (default: all)
#   UCRYPT_VM_FOREIGN_ALL=1  foreign part: also the slow images (million-iteration
#                      KDFs, minutes under TCG; always run under KVM)
#   UCRYPT_VM_SEEDS    seeds part: <ramdisk MiB>:<seconds per cell> (default 64:0.5)
#   UCRYPT_VM_CPUS, UCRYPT_VM_MEM  guest vCPUs and MiB of RAM (default 2, 2048)
#   UCRYPT_BIN         ucrypt binary, ucrypt-bench beside it (default: cargo build --release, target/release/ucrypt)
# A missing prerequisite (qemu, kernel package, accelerator) fails the run with a
# message naming it; the suite is never skipped silently.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
# Another kernel (UCRYPT_VM_KERNEL_SUITE, see install-vm-deps.sh) gets its own
# cache, so the default kernel's stays.
CACHE="${UCRYPT_VM_CACHE:-$REPO/target/vm-cache${UCRYPT_VM_KERNEL_SUITE:+-$UCRYPT_VM_KERNEL_SUITE}}"
TIMEOUT="${UCRYPT_VM_TIMEOUT:-1800}"
PARTS="${UCRYPT_VM_PARTS:-ublk nbd dmcrypt plain advisor seeds vhost live reencrypt reencrypt2 tpm foreign}"
CPUS="${UCRYPT_VM_CPUS:-2}"
MEM="${UCRYPT_VM_MEM:-2048}"
T0=$(date +%s)
fatal() { echo "vm-test: $*" >&2; echo "0 passed, 1 failed"; echo "FAILED: vm-test setup: $*"; exit 1; }
mkdir -p "$CACHE"

# 1. Host packages and the guest kernel (extracted into the cache, not installed).
if ! KROOT=$(bash scripts/install-vm-deps.sh "$CACHE" | tail -n1); then
  fatal "scripts/install-vm-deps.sh failed (host packages or the linux-image-6.12-amd64 kernel package)"
fi
KVER=$(ls "$KROOT/lib/modules" 2>/dev/null | head -n1)
KERNEL="$KROOT/boot/vmlinuz-$KVER"
[ -n "$KVER" ] && [ -f "$KERNEL" ] || fatal "no kernel image under $KROOT (delete $CACHE/kernel.pkg to refetch)"
QEMU=$(command -v qemu-system-x86_64) || fatal "qemu-system-x86_64 not found (apt-get install qemu-system-x86)"

# 2. The accelerator: KVM when the guest kernel really runs on it, else TCG
#    (multi-threaded); never neither. The probe boots the kernel without a root
#    filesystem: reaching its "VFS" panic means every vCPU feature it used works
#    (nested KVM can advertise instructions it then fails to run).
KVM_ARGS=(-accel kvm -cpu host,-arch-capabilities)
kvm_works() {
  [ -c /dev/kvm ] && [ -r /dev/kvm ] && [ -w /dev/kvm ] || return 1
  local plog="$CACHE/kvm-probe.log" pid i
  rm -f "$plog"
  "$QEMU" "${KVM_ARGS[@]}" -machine q35 -m 256 -nodefaults -no-reboot -display none \
    -serial "file:$plog" -kernel "$KERNEL" -append "console=ttyS0 panic=-1" \
    </dev/null >"$plog.qemu" 2>&1 &
  pid=$!
  for i in $(seq 1 60); do
    sleep 0.5
    if grep -q "VFS: Unable to mount root" "$plog" 2>/dev/null; then
      kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; return 0
    fi
    kill -0 "$pid" 2>/dev/null || break
    grep -q "^Code=\|KVM internal error\|emulation failure" "$plog.qemu" 2>/dev/null && break
  done
  kill -9 "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
  return 1
}
ACCEL="${UCRYPT_VM_ACCEL:-}"
if [ -z "$ACCEL" ]; then
  if kvm_works; then ACCEL=kvm; else ACCEL=tcg; fi
fi
case "$ACCEL" in
  kvm) ACCEL_ARGS=("${KVM_ARGS[@]}") ;;
  tcg) ACCEL_ARGS=(-accel tcg,thread=multi -cpu max)
       "$QEMU" -accel help 2>/dev/null | grep -qx tcg || fatal "this qemu has neither usable KVM nor TCG" ;;
  *) fatal "UCRYPT_VM_ACCEL must be kvm or tcg, not '$ACCEL'" ;;
esac

# 3. The ucrypt binary, without debug info (smaller initramfs).
BIN="${UCRYPT_BIN:-}"
if [ -z "$BIN" ]; then
  # The whole workspace, as scripts/test.sh builds it (same features: no rebuild).
  cargo build --release --locked -q --workspace || fatal "cargo build of ucrypt failed"
  BIN="${CARGO_TARGET_DIR:-$REPO/target}/release/ucrypt"
fi
[ -x "$BIN" ] || fatal "ucrypt binary not found at $BIN"
# The ublk crate's own kernel tests (they skip on a host without ublk_drv) run
# in the guest too (part ublk only). Same selection as scripts/test.sh's
# `cargo test`: no rebuild.
UBLK_TESTS=""
if [[ " $PARTS " == *" ublk "* ]]; then
  UBLK_TESTS=$(cargo test --release --locked --workspace --no-run --message-format=json 2>/dev/null \
    | grep '"src_path":"[^"]*/crates/ublk/tests/ublk.rs"' \
    | sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -n1)
  [ -n "$UBLK_TESTS" ] && [ -x "$UBLK_TESTS" ] || fatal "cannot build the ublk crate's test binary (cargo test --no-run)"
fi

# 4. Initramfs: a cached base (busybox, tools, libs, modules) + a small overlay
#    (ucrypt, the suite) rebuilt every run. The base key covers the builder, the
#    kernel and the host tool versions.
key=$( { cat tests/vm/mkinitramfs.sh; echo "$KROOT"; \
         dpkg-query -W busybox-static fio nbd-client cryptsetup-bin dmsetup e2fsprogs util-linux libc6 2>/dev/null; } \
       | sha256sum | cut -c1-16)
BASE="$CACHE/base-$key.cpio"
if [ ! -f "$BASE" ]; then
  echo "vm-test: building the base initramfs (cached as $BASE)" >&2
  rm -f "$CACHE"/base-*.cpio
  bash tests/vm/mkinitramfs.sh "$KROOT" "$BASE" || fatal "initramfs build failed"
fi
RUN="$CACHE/run"
rm -rf "$RUN"; mkdir -p "$RUN/overlay/vm" "$RUN/overlay/usr/bin"
objcopy --strip-debug "$BIN" "$RUN/overlay/usr/bin/ucrypt" 2>/dev/null || cp "$BIN" "$RUN/overlay/usr/bin/ucrypt"
# `ucrypt bench` (the advisor part) runs the ucrypt-bench beside ucrypt.
BENCH_BIN="$(dirname "$BIN")/ucrypt-bench"
[ -x "$BENCH_BIN" ] || fatal "ucrypt-bench not found beside $BIN"
objcopy --strip-debug "$BENCH_BIN" "$RUN/overlay/usr/bin/ucrypt-bench" 2>/dev/null || cp "$BENCH_BIN" "$RUN/overlay/usr/bin/ucrypt-bench"
mkdir -p "$RUN/overlay/vm/bin"
if [ -n "$UBLK_TESTS" ]; then
  objcopy --strip-debug "$UBLK_TESTS" "$RUN/overlay/vm/bin/ublk-tests" 2>/dev/null || cp "$UBLK_TESTS" "$RUN/overlay/vm/bin/ublk-tests"
fi
# The shared libraries these binaries load (tpm2-tss for the token code, …),
# at the paths ldd names; the base archive has only the reference tools' own.
# usr/lib is a link to lib in the guest, as in the base archive.
mkdir -p "$RUN/overlay/lib"; ln -s ../lib "$RUN/overlay/usr/lib"
overlay_libs() {
  ldd "$1" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}' | while read -r lib; do
    [ -e "$RUN/overlay$lib" ] && continue
    mkdir -p "$RUN/overlay$(dirname "$lib")"
    cp -L "$lib" "$RUN/overlay$lib"
  done
}
for b in "$BIN" "$BENCH_BIN" $UBLK_TESTS; do overlay_libs "$b"; done
# The tpm part's tools, at their host paths with their libraries: systemd's
# enrollment tool and cryptsetup token plugin (the reference), tpm2-tools'
# tpm2_pcrextend, and the tpm2-tss libraries loaded with dlopen (systemd opens
# esys/rc/mu, the TCTI loader opens the device TCTI for /dev/tpmrm0).
# vmtest.tpm= tells the guest whether it has a TPM, or why not.
TPM_STATE=""
if [[ " $PARTS " == *" tpm "* ]]; then
  TPM_STATE=swtpm
  command -v swtpm >/dev/null || TPM_STATE=no-swtpm-on-the-host
  command -v systemd-cryptenroll >/dev/null || TPM_STATE=no-systemd-cryptenroll-on-the-host
fi
if [ "$TPM_STATE" = swtpm ]; then
  L=/usr/lib/x86_64-linux-gnu
  for f in "$(command -v systemd-cryptenroll)" /lib/systemd/systemd-cryptsetup \
      "$(command -v tpm2_pcrextend || true)" "$L/cryptsetup/libcryptsetup-token-systemd-tpm2.so" \
      "$L"/libtss2-{esys,rc,mu,tctildr,tcti-device}.so.0; do
    [ -n "$f" ] && [ -e "$f" ] || continue
    mkdir -p "$RUN/overlay$(dirname "$f")"
    cp -L "$f" "$RUN/overlay$f"
    overlay_libs "$f"
  done
fi
# The foreign part: GNU cmp (block compares; busybox's byte loop is slow
# under TCG) for the whole-device comparisons.
if [[ " $PARTS " == *" foreign "* ]]; then
  cp -L "$(command -v cmp)" "$RUN/overlay/vm/bin/cmp" || fatal "GNU cmp (diffutils) not found"
fi
cp tests/vm/init "$RUN/overlay/init"
cp tests/vm/*.sh tests/vm/foreign.list "$RUN/overlay/vm/"
rm -f "$RUN/overlay/vm/mkinitramfs.sh"
chmod +x "$RUN/overlay/init"
( cd "$RUN/overlay" && find . | LC_ALL=C sort | cpio -o -H newc --quiet ) > "$RUN/overlay.cpio"
cat "$BASE" "$RUN/overlay.cpio" > "$RUN/initrd.cpio"

# 5. Scratch disks (sparse): vda, vdb for the volumes ucrypt and cryptsetup make.
truncate -s 1G "$RUN/vda.img"
truncate -s 1G "$RUN/vdb.img"

# 5b. The vhost part: a host-side ucrypt serves a LUKS1 volume (qemu-img's
#     luks driver reads LUKS1 only: it is the oracle below) over
#     vhost-user-blk; the guest sees it as /dev/vdc. Guest RAM must be a
#     shared memfd for the backend to map it.
VHOST_ARGS=()
VHOST_SERIAL=""
VH_RT="$RUN/rt"
if [[ " $PARTS " == *" vhost "* ]]; then
  command -v cryptsetup >/dev/null && command -v qemu-img >/dev/null \
    || fatal "the vhost part needs cryptsetup and qemu-img on the host (scripts/install-test-deps.sh)"
  truncate -s 256M "$RUN/vhost.img"
  printf 'vm-test passphrase' > "$RUN/vhost.key"
  cryptsetup luksFormat -q --type luks1 --pbkdf-force-iterations 1000 "$RUN/vhost.img" "$RUN/vhost.key" \
    || fatal "cryptsetup luksFormat of the vhost volume failed"
  UCRYPT_RUNTIME_DIR="$VH_RT" "$BIN" open --key-file "$RUN/vhost.key" --allow-discards \
    --export vhost-user-blk="$RUN/vhost.sock" --num-queues 2 "$RUN/vhost.img" vmvhost >&2 \
    || fatal "ucrypt open --export vhost-user-blk failed"
  # A high PCI slot: the guest names virtio disks in PCI order, so the two
  # scratch drives stay vda and vdb (the other parts write to them) and this
  # disk is vdc. The guest checks that by the serial (GET_ID: the LUKS UUID's
  # first 20 characters) before writing anything.
  VHOST_SERIAL=$(cryptsetup luksUUID "$RUN/vhost.img" | cut -c1-20)
  VHOST_ARGS=(-object memory-backend-memfd,id=mem,size=${MEM}M,share=on -numa node,memdev=mem
              -chardev "socket,id=vh0,path=$RUN/vhost.sock"
              -device vhost-user-blk-pci,chardev=vh0,num-queues=2,addr=0x10)
fi

# 5c. The tpm part: a swtpm (TPM2) on a unix socket, which qemu offers the
#     guest as a TIS device (the kernel's /dev/tpm0 and /dev/tpmrm0). It ends
#     when qemu closes the connection.
TPM_ARGS=()
SWTPM_PID=""
if [ "$TPM_STATE" = swtpm ]; then
  mkdir -p "$RUN/tpm"
  swtpm socket --tpm2 --tpmstate "dir=$RUN/tpm" --ctrl "type=unixio,path=$RUN/swtpm.sock" \
    --terminate --log "file=$RUN/swtpm.log" </dev/null >/dev/null 2>&1 &
  SWTPM_PID=$!
  for _ in $(seq 1 50); do [ -S "$RUN/swtpm.sock" ] && break; sleep 0.1; done
  [ -S "$RUN/swtpm.sock" ] || fatal "swtpm did not create $RUN/swtpm.sock (see $RUN/swtpm.log)"
  TPM_ARGS=(-chardev "socket,id=chrtpm,path=$RUN/swtpm.sock"
            -tpmdev emulator,id=tpm0,chardev=chrtpm -device tpm-tis,tpmdev=tpm0)
fi

# 5d. The foreign part: the images of tests/vm/foreign.list from cryptsetup
#     2.6.1's suite (GPL test data: fetched here, never kept in the
#     repository), with tcrypt's keyfiles and bitlk's .BEK files and
#     images.conf, on an ext4 disk the guest finds by its serial. The images
#     are sparse (100-512 MiB, a few MiB of data): on a disk they cost no
#     guest RAM. Built once per sample; qemu's snapshot=on discards the
#     guest's writes.
FOREIGN_ARGS=()
if [[ " $PARTS " == *" foreign "* ]]; then
  CST=$(bash scripts/fetch-cryptsetup-tests.sh "$CACHE/cryptsetup-2.6.1" | tail -n1) \
    || fatal "scripts/fetch-cryptsetup-tests.sh failed (cryptsetup 2.6.1's test images)"
  fkey=$( { cat tests/vm/foreign.list; ls -l "$CST"/{tcrypt,bitlk,fvault2}-images.tar.xz; } | sha256sum | cut -c1-16)
  FIMG="$CACHE/foreign-$fkey.img"
  if [ ! -f "$FIMG" ]; then
    echo "vm-test: building the foreign image disk (cached as $FIMG)" >&2
    rm -f "$CACHE"/foreign-*.img
    fstage=$(mktemp -d "$CACHE/foreign.stage.XXXXXX")
    for t in tcrypt bitlk fvault2; do
      members=$(awk -v t="$t" '$1 == t || $1 == "+" t {print t "-images/" $2}' tests/vm/foreign.list | sort -u)
      case $t in
        tcrypt) members="$members tcrypt-images/keyfile1 tcrypt-images/keyfile2" ;;
        bitlk) members="$members bitlk-images/images.conf $(tar -tJf "$CST/bitlk-images.tar.xz" | grep '\.BEK$' | tr '\n' ' ')" ;;
      esac
      # shellcheck disable=SC2086 # members: archive paths, one per word
      tar -xJSf "$CST/$t-images.tar.xz" -C "$fstage" --no-same-owner $members \
        || { rm -rf "$fstage"; fatal "cannot unpack the sample from $CST/$t-images.tar.xz"; }
    done
    # The volume keys the list names (`--volume-key-file X.vk`), as the
    # host's cryptsetup dumps them with the list's secret.
    grep -v '^#' tests/vm/foreign.list | while read -r t img sec _ opts; do
      vk=$(printf '%s\n' "$opts" | sed -n 's/.*--volume-key-file \([^ ]*\).*/\1/p')
      [ -n "$vk" ] || continue
      t=${t#+}
      printf '%s\n' "$sec" | cryptsetup "${t}Dump" -q --dump-volume-key --volume-key-file "$fstage/$t-images/$vk" \
        "$fstage/$t-images/$img" >/dev/null \
        || { rm -rf "$fstage"; fatal "cryptsetup ${t}Dump --dump-volume-key of $img failed on the host"; }
    done
    # Holes stay holes on the disk (mke2fs -d copies data extents only).
    size_mib=$(( $(du -s --apparent-size -m "$fstage" | cut -f1) * 5 / 4 + 64 ))
    mke2fs -q -t ext4 -L ucrypt-foreign -d "$fstage" "$FIMG.tmp" "${size_mib}M" >/dev/null \
      || { rm -rf "$fstage"; fatal "mke2fs -d of the foreign image disk failed"; }
    rm -rf "$fstage"
    mv "$FIMG.tmp" "$FIMG"
  fi
  FOREIGN_ARGS=(-drive "file=$FIMG,if=none,id=foreign,format=raw,snapshot=on"
                -device virtio-blk-pci,drive=foreign,serial=ucrypt-foreign,addr=0x11)
fi

# 6. Boot. The guest prints @@VMTEST lines on the serial console and powers off.
LOG="$RUN/console.log"
APPEND="console=ttyS0 panic=-1 quiet loglevel=4 rdinit=/init vmtest.parts=${PARTS// /,} vmtest.accel=$ACCEL${VHOST_SERIAL:+ vmtest.vhost_serial=$VHOST_SERIAL}${UCRYPT_VM_SEEDS:+ vmtest.seeds=$UCRYPT_VM_SEEDS}${TPM_STATE:+ vmtest.tpm=$TPM_STATE}${UCRYPT_VM_FOREIGN_ALL:+ vmtest.foreign=all}"
echo "vm-test: booting $KVER ($ACCEL, $CPUS CPUs, timeout ${TIMEOUT}s); console: $LOG" >&2
set +e
"$QEMU" "${ACCEL_ARGS[@]}" -machine q35 -smp "$CPUS" -m "$MEM" \
  -nodefaults -no-reboot -display none -serial "file:$LOG" \
  -kernel "$KERNEL" -initrd "$RUN/initrd.cpio" -append "$APPEND" \
  -drive "file=$RUN/vda.img,if=virtio,format=raw,cache=unsafe,discard=unmap" \
  -drive "file=$RUN/vdb.img,if=virtio,format=raw,cache=unsafe,discard=unmap" \
  "${VHOST_ARGS[@]}" "${TPM_ARGS[@]}" "${FOREIGN_ARGS[@]}" \
  </dev/null >"$RUN/qemu.out" 2>&1 &
QPID=$!
# The guest dies with this script (Ctrl-C, a CI kill), and at the timeout.
trap 'kill -9 "$QPID" 2>/dev/null || true; [ -z "$SWTPM_PID" ] || kill "$SWTPM_PID" 2>/dev/null || true; [ ${#VHOST_ARGS[@]} -eq 0 ] || UCRYPT_RUNTIME_DIR="$VH_RT" "$BIN" close vmvhost >/dev/null 2>&1 || true' EXIT
trap 'kill -9 "$QPID" 2>/dev/null; exit 130' INT TERM HUP
( waited=0
  while kill -0 "$QPID" 2>/dev/null; do
    sleep 1; waited=$((waited + 1))
    if [ "$waited" -ge "$TIMEOUT" ]; then touch "$RUN/timed-out"; kill -9 "$QPID" 2>/dev/null; fi
  done ) &
WPID=$!
wait "$QPID"
qrc=$?
wait "$WPID" 2>/dev/null
set -e
T1=$(date +%s)

# 6b. The vhost part's host half: close ucrypt (flush), then decrypt the
#     backing file independently and compare with the guest's checksum.
if [ ${#VHOST_ARGS[@]} -gt 0 ]; then
  hcheck() { if "${@:2}" >>"$RUN/vhost-host.log" 2>&1; then echo "@@VMTEST PASS $1 [host]"; else echo "@@VMTEST FAIL $1: ${*:2} [host]"; fi >>"$LOG"; }
  hcheck "vhost: ucrypt close after the guest" env UCRYPT_RUNTIME_DIR="$VH_RT" "$BIN" close vmvhost
  want=$(grep -a '^@@VMTEST INFO vhost-sha256 ' "$LOG" | awk '{print $4}' | tr -d '\r' || true)
  hcheck "vhost: qemu-img (luks) decrypts the backing file" qemu-img convert \
    --object "secret,id=s0,file=$RUN/vhost.key" -O raw \
    --image-opts "driver=luks,key-secret=s0,file.filename=$RUN/vhost.img" "$RUN/vhost.plain"
  got=$(sha256sum "$RUN/vhost.plain" 2>/dev/null | cut -d' ' -f1)
  hcheck "vhost: the decrypted backing file is what the guest wrote" test -n "$want" -a "$want" = "$got"
  rm -f "$RUN/vhost.plain"
fi

# 7. Results.
passed=$(grep -ac '^@@VMTEST PASS ' "$LOG" 2>/dev/null || true)
failed_list=$(grep -a '^@@VMTEST FAIL ' "$LOG" 2>/dev/null | sed 's/^@@VMTEST FAIL //' || true)
failed=0; [ -n "$failed_list" ] && failed=$(printf '%s\n' "$failed_list" | wc -l)
grep -a '^@@VMTEST \(PASS\|FAIL\|INFO\|SKIP\)' "$LOG" 2>/dev/null | sed 's/^@@VMTEST /  /' >&2 || true
extra=""
if [ -f "$RUN/timed-out" ]; then
  extra="guest hung: killed after ${TIMEOUT}s"
elif ! grep -aq '^@@VMTEST DONE' "$LOG" 2>/dev/null; then
  if grep -aq 'Kernel panic' "$LOG" 2>/dev/null; then extra="guest kernel panicked"
  else extra="guest stopped before the suite finished (qemu exit $qrc)"; fi
fi
if [ -n "$extra" ]; then
  echo "vm-test: $extra; qemu said:" >&2
  tail -n 5 "$RUN/qemu.out" >&2 || true
  echo "vm-test: the console's last lines:" >&2
  tail -n 40 "$LOG" >&2 || true
  failed=$((failed + 1))
  failed_list=$(printf '%s\n%s' "$failed_list" "vm-test: $extra" | sed '/^$/d')
fi
if [ "$passed" -eq 0 ] && [ "$failed" -eq 0 ]; then
  failed=1; failed_list="vm-test: the guest reported no results"
fi
echo "vm-test: $((T1 - T0)) s wall ($ACCEL)" >&2
echo "$passed passed, $failed failed"
if [ "$failed" -gt 0 ]; then
  printf '%s\n' "$failed_list" | sed 's/^/FAILED: /'
  exit 1
fi
