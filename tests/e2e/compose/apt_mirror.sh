# Sourced by tests/e2e/compose_test.sh (and apt_mirror_test.sh).
#
# apt_debian_mirror [APT_DIR]: prints the Debian archive apt uses, read from
# one-line sources ("deb [options] URI suite ...": APT_DIR/sources.list and
# sources.list.d/*.list) and deb822 ones ("URIs: URI ...":
# sources.list.d/*.sources, all that a fresh bookworm has). The first URI
# ending in /debian wins (not debian-security, not third-party archives).
# Prints nothing when there is none; never fails, so it is safe under
# `set -eo pipefail`. APT_DIR defaults to /etc/apt.
apt_debian_mirror() {
  local dir=${1:-/etc/apt} files=() f
  for f in "$dir/sources.list" "$dir"/sources.list.d/*.list "$dir"/sources.list.d/*.sources; do
    [[ -f $f && -r $f ]] && files+=("$f")
  done
  [[ ${#files[@]} -gt 0 ]] || return 0
  awk '
    { sub(/#.*/, "") }
    $1 == "deb" { line = $0; gsub(/\[[^]]*\]/, "", line); split(line, w); print w[2]; next }
    tolower($1) == "uris:" { for (i = 2; i <= NF; i++) print $i }
  ' "${files[@]}" | awk '!found && /^(https?|file):\/\/.*\/debian\/?$/ { print; found = 1 }'
}
