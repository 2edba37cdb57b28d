#!/bin/bash
# tests/e2e/compose/apt_mirror.sh, the mirror detection of compose_test.sh
# (issue 9, hole 12: a machine with only sources.list.d/debian.sources made
# the old grep exit 2 and stop the script without a word), on fixture apt
# folders in every format, under the same `set -Eeuo pipefail`.
set -Eeuo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/compose/apt_mirror.sh"
WORK=$(mktemp -d /tmp/pserver_apt_mirror_test.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
FAILED=0

# expect NAME WANT: apt_debian_mirror on $WORK/NAME prints WANT.
expect() {
  local got
  got=$(apt_debian_mirror "$WORK/$1")
  if [[ "$got" != "$2" ]]; then
    echo "FAIL: $1: got '$got', expected '$2'" >&2
    FAILED=1
  fi
}

# A fresh bookworm: deb822 only, security archive listed too, no sources.list.
mkdir -p "$WORK/deb822/sources.list.d"
cat >"$WORK/deb822/sources.list.d/debian.sources" <<'SRC'
Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb
URIs: http://deb.debian.org/debian-security
Suites: bookworm-security
Components: main
SRC
expect deb822 http://deb.debian.org/debian

# The old one-line format, with options and a third-party archive first.
mkdir -p "$WORK/oneline/sources.list.d"
cat >"$WORK/oneline/sources.list" <<'SRC'
# deb http://commented.example/debian bookworm main
deb [arch=amd64 signed-by=/usr/share/keyrings/x.gpg] https://packages.example.com/apt stable main
deb [ arch=amd64 ] http://mirror.example.org/debian/ bookworm main
deb http://security.debian.org/debian-security bookworm-security main
SRC
expect oneline http://mirror.example.org/debian/

# Only a *.list in sources.list.d; a disabled file is ignored.
mkdir -p "$WORK/dlist/sources.list.d"
echo 'deb http://ftp.example.net/debian bookworm main' >"$WORK/dlist/sources.list.d/mirror.list"
echo 'deb http://wrong.example/debian bookworm main' >"$WORK/dlist/sources.list.d/x.list.disabled"
expect dlist http://ftp.example.net/debian

# Nothing usable: empty output, and no failure under set -e.
mkdir -p "$WORK/none/sources.list.d" "$WORK/empty"
echo 'deb https://deb.nodesource.com/node_20.x nodistro main' >"$WORK/none/sources.list"
expect none ""
expect empty ""
expect missing ""

if [[ $FAILED -ne 0 ]]; then
  echo "apt_mirror_test: FAILED" >&2
  exit 1
fi
echo "apt_mirror_test: passed"
