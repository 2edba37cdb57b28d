#!/bin/bash
# pserver_health_probe from the outside: --help lists its flags (absl's own
# --help printed "No flags matched"), and a bad flag exits 1 (the only failure
# code Docker's HEALTHCHECK defines) with one line naming it.
#
#   health_probe_cli_test.sh /path/to/pserver_health_probe
set -u

BIN=${1:?usage: health_probe_cli_test.sh /path/to/pserver_health_probe}
# shellcheck source=../test_util/cli_checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/../test_util/cli_checks.sh"

check_help "$BIN" address service timeout tls_ca tls_cert tls_key \
  tls_server_name auth_token_file

check_invalid_exit 1 "$BIN" --timeout "expected > 0" --timeout=0
# Transport security goes through the shared helper (common/daemon).
check_invalid_exit 1 "$BIN" --tls_ca "empty while --tls_cert is set" \
  --tls_cert=/nonexistent.pem --tls_key=/nonexistent.key
check_invalid_exit 1 "$BIN" --auth_token_file "cannot read" \
  --auth_token_file=/nonexistent.token
PSERVER_AUTH_TOKEN=secret check_invalid_exit 1 "$BIN" PSERVER_AUTH_TOKEN \
  "needs TLS \\(--tls_ca\\)"
check_invalid_exit 1 "$BIN" "'extra'" "unexpected argument" extra
check_invalid_exit 1 "$BIN" no_such_flag "Unknown command line flag" --no_such_flag=1
check_invalid_exit 1 "$BIN" timeout "Illegal value" --timeout=soon

cli_finish health_probe_cli_test
