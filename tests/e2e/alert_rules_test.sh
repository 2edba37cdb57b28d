#!/usr/bin/env bash
# The alerting rules: `promtool check rules` accepts deploy/prometheus/alerts.yml
# and `promtool test rules` passes tests/e2e/prometheus/alerts_test.yml (each
# alert fires on synthetic series of its condition, after its `for:`, with
# its labels and annotations, and stays silent on healthy series).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
command -v promtool >/dev/null ||
  { echo "FAIL: promtool is not installed (apt-get install prometheus); tests/run.sh installs it"; exit 1; }
promtool check rules "$ROOT/deploy/prometheus/alerts.yml"
cd "$ROOT/tests/e2e/prometheus"
promtool test rules alerts_test.yml
