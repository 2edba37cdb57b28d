# Sourced by the daemons' command-line tests: checks of --help and of the
# one-line error a bad flag must give. Sourcing makes WORK (a scratch folder,
# removed on exit) and fail() (records a failure and goes on); the script ends
# with cli_finish NAME. A script with its own EXIT trap (daemon_test.sh) sets
# WORK and fail() itself and sources it with CLI_CHECKS_NO_SETUP=1.

if [ -z "${CLI_CHECKS_NO_SETUP:-}" ]; then
  WORK=$(mktemp -d /tmp/pserver_cli_test.XXXXXX)
  FAILED=0
  trap 'rm -rf "$WORK"' EXIT
  fail() {
    echo "FAIL: $*" >&2
    FAILED=1
  }
fi

# cli_finish NAME: exits 1 if any check failed, else says NAME passed.
cli_finish() {
  if [ "$FAILED" -ne 0 ]; then
    echo "$1: FAILED" >&2
    exit 1
  fi
  echo "$1: passed"
}

# check_help BIN FLAG...: `BIN --help` exits 0, lists every --FLAG with its
# default, and is not absl's "No flags matched".
check_help() {
  local bin=$1 flag rc
  shift
  for h in --help --helpshort; do
    "$bin" "$h" >"$WORK/help.out" 2>&1
    rc=$?
    [ "$rc" -eq 0 ] || fail "$(basename "$bin") $h exited $rc, expected 0"
    grep -q 'No flags matched' "$WORK/help.out" &&
      fail "$(basename "$bin") $h says 'No flags matched'"
    for flag in "$@"; do
      grep -q -- "^  --$flag (.*); default: " "$WORK/help.out" ||
        fail "$(basename "$bin") $h does not list --$flag with its default"
    done
  done
}

# check_invalid_exit CODE BIN FLAG PATTERN ARG...: `BIN ARG...` exits CODE at once
# (within 10 s, so before any retry loop), prints nothing on stdout and one
# line on stderr that names FLAG and matches the extended regex PATTERN
# (e.g. the accepted values).
check_invalid_exit() {
  local code=$1 bin=$2 flag=$3 pattern=$4
  shift 4
  timeout 10 "$bin" "$@" >"$WORK/out" 2>"$WORK/err"
  local rc=$?
  local what
  what="$(basename "$bin") $*"
  if [ "$rc" -ne "$code" ]; then
    fail "$what exited $rc, expected $code: $(cat "$WORK/err")"
    return
  fi
  local lines
  lines=$(wc -l <"$WORK/err")
  [ "$lines" -eq 1 ] || fail "$what: $lines lines on stderr, expected 1: $(cat "$WORK/err")"
  grep -q -- "$flag" "$WORK/err" || fail "$what: message does not name $flag: $(cat "$WORK/err")"
  grep -qE -- "$pattern" "$WORK/err" || fail "$what: message does not match '$pattern': $(cat "$WORK/err")"
  [ -s "$WORK/out" ] && fail "$what: unexpected stdout: $(cat "$WORK/out")"
}
