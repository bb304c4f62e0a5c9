#!/usr/bin/env bash
# Installs ucrypt: builds the release binaries (cargo build --release
# --locked) and puts, under PREFIX (default /usr/local):
#   bin/ucrypt, bin/ucrypt-bench
#   share/man/man8/ucrypt.8.gz, ucrypt-VERB.8.gz (one per verb), ucrypt-bench.8.gz
#   share/bash-completion/completions/ucrypt
#   share/zsh/site-functions/_ucrypt (share/zsh/vendor-completions with --prefix /usr)
#   share/fish/vendor_completions.d/ucrypt.fish
#   lib/systemd/system/ucrypt@.service (contrib/systemd/, its ExecStart and
#     ExecStop naming PREFIX/bin/ucrypt)
# These are the places Debian's man-db, bash-completion, zsh, fish and systemd
# read for /usr/local (and for /usr with --prefix /usr). Nothing is enabled:
# `systemctl daemon-reload && systemctl enable --now ucrypt@NAME` serves the
# /etc/crypttab line NAME (docs/GUIDE.md). Man pages and
# completions are generated from the binary's own clap definition
# (`ucrypt man --dir`, `ucrypt completions SHELL`).
#
# Usage: bash scripts/install.sh [--root DIR] [--prefix PREFIX] [--bin-dir DIR]
#   --root DIR     stage everything under DIR (as DESTDIR; DIR/PREFIX/...)
#   --prefix P     installation prefix (default /usr/local)
#   --bin-dir DIR  install the ucrypt and ucrypt-bench found in DIR instead
#                  of building (e.g. target/release)
set -euo pipefail
cd "$(dirname "$0")/.."
root="" prefix=/usr/local bindir=""
while [ $# -gt 0 ]; do
  case "$1" in
    --root) root="${2:?--root needs a directory}"; shift 2 ;;
    --prefix) prefix="${2:?--prefix needs a directory}"; shift 2 ;;
    --bin-dir) bindir="${2:?--bin-dir needs a directory}"; shift 2 ;;
    -h|--help) sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown argument $1 (see --help)" >&2; exit 1 ;;
  esac
done
case "$prefix" in /*) ;; *) echo "install.sh: --prefix must be absolute" >&2; exit 1 ;; esac
if [ -z "$bindir" ]; then
  cargo build --release --locked -p ucrypt-cli --bins
  bindir="${CARGO_TARGET_DIR:-target}/release"
fi
for b in ucrypt ucrypt-bench; do
  [ -x "$bindir/$b" ] || { echo "install.sh: $bindir/$b not found" >&2; exit 1; }
done
dest="$root$prefix"
share="$dest/share"
zsh="$share/zsh/site-functions"
[ "$prefix" != /usr ] || zsh="$share/zsh/vendor-completions"
units="$dest/lib/systemd/system"
install -d "$dest/bin" "$share/man/man8" "$share/bash-completion/completions" \
  "$zsh" "$share/fish/vendor_completions.d" "$units"
install -m 0755 "$bindir/ucrypt" "$bindir/ucrypt-bench" "$dest/bin/"
ucrypt="$dest/bin/ucrypt"
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
"$ucrypt" man --dir "$work/man"
# `ucrypt bench` hands its options to ucrypt-bench, whose page lists them.
"$dest/bin/ucrypt-bench" --man >"$work/man/ucrypt-bench.8"
for page in "$work"/man/*.8; do
  gzip -9n <"$page" >"$share/man/man8/$(basename "$page").gz"
  chmod 0644 "$share/man/man8/$(basename "$page").gz"
done
"$ucrypt" completions bash >"$share/bash-completion/completions/ucrypt"
"$ucrypt" completions zsh >"$zsh/_ucrypt"
"$ucrypt" completions fish >"$share/fish/vendor_completions.d/ucrypt.fish"
chmod 0644 "$share/bash-completion/completions/ucrypt" "$zsh/_ucrypt" \
  "$share/fish/vendor_completions.d/ucrypt.fish"
# The unit as shipped names /usr/local/bin/ucrypt; it runs the one installed here.
sed "s|/usr/local/bin/ucrypt |$prefix/bin/ucrypt |" contrib/systemd/ucrypt@.service >"$units/ucrypt@.service"
chmod 0644 "$units/ucrypt@.service"
echo "installed ucrypt $("$ucrypt" --version | awk '{print $2}') under $dest"
