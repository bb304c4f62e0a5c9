#!/bin/bash
# Fetches cryptsetup's test directory (cryptsetup 2.6.1, GPL-2.0-or-later: the LUKS2
# metadata validation suite, the reencryption scripts, the tcrypt/bitlk/fvault2
# compatibility images and scripts) into DEST, from Debian bookworm's cryptsetup source package through apt with a
# private deb-src list (no root, no change to the system's apt configuration).
# The suite is GPL: it is fetched at test time and never kept in this repository.
#
# usage: scripts/fetch-cryptsetup-tests.sh DEST     (prints DEST/tests on success)
set -euo pipefail

dest=${1:?usage: $0 DEST}
want=2.6.1
if [ -f "$dest/tests/.ucrypt-fetched-$want" ]; then
    echo "$dest/tests"
    exit 0
fi
mkdir -p "$dest"
work=$(mktemp -d "$dest/fetch.XXXXXX")
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/lists/partial" "$work/cache/archives/partial" "$work/src"
echo "deb-src http://deb.debian.org/debian bookworm main" >"$work/sources.list"
apt_opts=(
    -o "Dir::Etc::SourceList=$work/sources.list"
    -o "Dir::Etc::SourceParts=/dev/null"
    -o "Dir::State::Lists=$work/lists"
    -o "Dir::Cache=$work/cache"
    -o "APT::Sandbox::User=$(id -un)"
)
apt-get "${apt_opts[@]}" -qq update >&2
(cd "$work/src" && apt-get "${apt_opts[@]}" -qq source --download-only cryptsetup >&2)
orig=$(ls "$work"/src/cryptsetup_*.orig.tar.* | head -n1)
case "$orig" in
*"cryptsetup_${want}.orig"*) ;;
*)
    echo "expected cryptsetup $want, the archive has $(basename "$orig")" >&2
    exit 1
    ;;
esac
tar -xf "$orig" -C "$work" "cryptsetup-$want/tests"
touch "$work/cryptsetup-$want/tests/.ucrypt-fetched-$want"
rm -rf "$dest/tests"
mv "$work/cryptsetup-$want/tests" "$dest/tests"
echo "$dest/tests"
