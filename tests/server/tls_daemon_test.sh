#!/bin/bash
# The daemons with TLS from the outside (issue 6, "Security"): pserver_server
# with mutual TLS + token answers pserver_health_probe given the matching
# flags, and refuses the probe without them; bad TLS flag combinations exit
# non-zero with one line naming the flag; the token is in neither the logs
# nor /metrics. Certificates are made with the openssl CLI.
#
#   tls_daemon_test.sh /path/to/pserver_server /path/to/pserver_health_probe
set -u

SERVER=$(realpath "${1:?usage: tls_daemon_test.sh SERVER PROBE}")
PROBE=$(realpath "${2:?usage: tls_daemon_test.sh SERVER PROBE}")
WORK=$(mktemp -d /tmp/pserver_tls_daemon_test.XXXXXX)
PID=
FAILED=0
TOKEN=daemon-T0ken-9b2e61d0

cleanup() {
  if [ -n "$PID" ]; then
    kill -KILL "$PID" 2>/dev/null
    wait "$PID" 2>/dev/null
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

fail() {
  echo "FAIL: $*" >&2
  FAILED=1
}

command -v openssl >/dev/null || { echo "FAIL: no openssl; tests/run.sh installs it" >&2; exit 1; }
cd "$WORK" || exit 1
ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
{
  openssl req -x509 "${ec[@]}" -days 2 -subj /CN=ca -keyout ca.key -out ca.pem
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\n' >server.ext
  printf 'extendedKeyUsage=clientAuth\n' >client.ext
  for leaf in server client; do
    openssl req -new "${ec[@]}" -subj "/CN=$leaf" -keyout $leaf.key \
      -out $leaf.csr &&
      openssl x509 -req -in $leaf.csr -CA ca.pem -CAkey ca.key \
        -CAcreateserial -days 2 -extfile $leaf.ext -out $leaf.pem
  done
} >/dev/null 2>&1 || { fail "openssl could not make the certificates"; exit 1; }
printf '%s\n' "$TOKEN" >token
: >empty_token

# --- invalid combinations ---------------------------------------------------
check_invalid() {
  local bin=$1 flag=$2
  shift 2
  timeout 10 "$bin" "$@" >out 2>err
  local rc=$?
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 124 ]; then
    fail "$(basename "$bin") $* exited $rc, expected a non-zero exit at once"
  fi
  [ "$(wc -l <err)" -eq 1 ] || fail "$* printed $(wc -l <err) lines, expected 1"
  grep -q -- "$flag" err || fail "$* did not name $flag: $(cat err)"
}
S=(--listen=127.0.0.1:0 --metrics_listen=)
check_invalid "$SERVER" --tls_key "${S[@]}" --tls_cert=server.pem
check_invalid "$SERVER" --tls_cert "${S[@]}" --tls_key=server.key
check_invalid "$SERVER" --tls_cert "${S[@]}" --tls_cert=missing.pem \
  --tls_key=server.key
check_invalid "$SERVER" --auth_token_file "${S[@]}" --tls_cert=server.pem \
  --tls_key=server.key --auth_token_file=empty_token
check_invalid "$SERVER" --auth_token_file "${S[@]}" --auth_token_file=token
check_invalid "$PROBE" --tls_ca --tls_cert=client.pem --tls_key=client.key
grep -q "$TOKEN" err && fail "an error message shows the token"

# --- a live daemon with mutual TLS + token ------------------------------------
"$SERVER" --listen=127.0.0.1:0 --metrics_listen=127.0.0.1:0 \
  --port_file=port --tls_cert=server.pem --tls_key=server.key --tls_ca=ca.pem \
  --auth_token_file=token >server.out 2>server.err &
PID=$!
for _ in $(seq 100); do [ -s port ] && break; sleep 0.1; done
[ -s port ] || { fail "no port file; $(cat server.err)"; exit 1; }
ADDR=127.0.0.1:$(cat port)
TLS=(--tls_ca=ca.pem --tls_cert=client.pem --tls_key=client.key)

"$PROBE" --address="$ADDR" "${TLS[@]}" --auth_token_file=token >probe.out ||
  fail "probe with TLS flags: $(cat probe.out)"
PSERVER_AUTH_TOKEN=$TOKEN "$PROBE" --address="$ADDR" "${TLS[@]}" >probe.out ||
  fail "probe with PSERVER_AUTH_TOKEN: $(cat probe.out)"
"$PROBE" --address="$ADDR" --timeout=2 >probe.out &&
  fail "plaintext probe answered SERVING"
"$PROBE" --address="$ADDR" "${TLS[@]}" --timeout=2 >probe.out &&
  fail "probe without the token answered SERVING"
grep -q UNAUTHENTICATED probe.out || grep -q "code 16" probe.out ||
  fail "probe without the token: $(cat probe.out)"
"$PROBE" --address="$ADDR" --tls_ca=ca.pem --auth_token_file=token \
  --timeout=2 >probe.out && fail "probe without a client certificate answered"

grep -q "mutual TLS+token" server.err ||
  fail "start-up line does not say mutual TLS+token: $(cat server.err)"
METRICS_PORT=$(sed -n 's/.*metrics port \([0-9]*\).*/\1/p' server.err | head -1)
if [ -n "$METRICS_PORT" ] && command -v curl >/dev/null; then
  curl -sf "http://127.0.0.1:$METRICS_PORT/metrics" >metrics ||
    fail "cannot scrape /metrics"
  grep -q "$TOKEN" metrics && fail "/metrics shows the token"
fi
kill -TERM "$PID"
wait "$PID"
rc=$?
PID=
[ "$rc" -eq 0 ] || fail "SIGTERM exit $rc"
cat server.out server.err probe.out | grep -q "$TOKEN" &&
  fail "the token appears in the daemon's or the probe's output"

[ "$FAILED" -eq 0 ] && echo PASS
exit "$FAILED"
