#!/bin/bash
# pserver_tune from the outside (issue 13): on a small capture written by
# tune_fixture, both modes write a schedule of one phase "tuned" with a codec
# per tensor (pull codecs only with --deltas), the table, JSON and SVG; bad
# inputs exit at once with one line naming the flag, and write nothing.
#
#   tune_cli_test.sh /path/to/pserver_tune /path/to/tune_fixture
set -u

TUNE=${1:?usage: tune_cli_test.sh /path/to/pserver_tune /path/to/tune_fixture}
FIXTURE=${2:?usage: tune_cli_test.sh /path/to/pserver_tune /path/to/tune_fixture}
PY=/usr/bin/python3
# shellcheck source=../test_util/cli_checks.sh
source "$(dirname "${BASH_SOURCE[0]}")/../test_util/cli_checks.sh"

check_help "$TUNE" gradients deltas window candidates target_error link_gbps \
  step_seconds push_share dense_below_bytes out svg json

G=$WORK/g.bin
"$FIXTURE" "$G" || fail "tune_fixture $G failed"
"$FIXTURE" "$WORK/d.bin" || fail "tune_fixture d.bin failed"
"$FIXTURE" "$WORK/other.bin" other || fail "tune_fixture other.bin failed"

# check_schedule FILE PULL(0|1): the schedule is one phase "tuned" without
# bounds, a push codec for each of the fixture's tensors, the bias fp32
# (256 bytes, below --dense_below_bytes), pull codecs iff PULL.
check_schedule() {
  "$PY" - "$1" "$2" <<'EOF' || fail "schedule $1 (pull $2) is not as expected"
import json, sys
s = json.load(open(sys.argv[1]))
want_pull = sys.argv[2] == "1"
(phase,) = s["phases"]
assert phase["name"] == "tuned", phase
assert not any(k.startswith(("begin", "end")) for k in phase), phase
names = [t["tensor"] for t in phase["tensors"]]
assert names == ["fc1.weight", "fc1.bias", "fc2.weight"], names
for t in phase["tensors"]:
    assert t["push"]["codec"], t
    assert ("pull" in t) == want_pull, t
bias = phase["tensors"][1]
assert bias["push"]["codec"] == "fp32", bias
EOF
}

# Target-error mode, with pulls.
"$TUNE" --gradients="$G" --deltas="$WORK/d.bin" --target_error=0.05 \
  --out="$WORK/t.json" --json="$WORK/t.figures.json" --svg="$WORK/t.svg" \
  >"$WORK/t.out" 2>"$WORK/t.err"
rc=$?
if [ "$rc" -ne 0 ]; then
  fail "target mode exited $rc: $(cat "$WORK/t.err")"
else
  check_schedule "$WORK/t.json" 1
  for row in fc1.weight fc1.bias fc2.weight '(model)'; do
    [ "$(grep -cF -- "$row" "$WORK/t.out")" -eq 2 ] ||
      fail "the push and pull tables do not both have a $row row"
  done
  "$PY" - "$WORK/t.figures.json" <<'EOF' || fail "figures JSON is not as expected"
import json, sys
d = json.load(open(sys.argv[1]))
for way in ("push", "pull"):
    r = d[way]
    assert r["windows"] == 2 and r["steps"] == 10, r
    total = 0
    for t in r["tensors"]:
        (c,) = [c for c in t["candidates"] if c["label"] == t["chosen"]]
        assert c["ef_window_error"] <= 0.05, (t["name"], c)
        # Nothing within the target is cheaper.
        for o in t["candidates"]:
            if o["eligible"] and o["ef_window_error"] is not None \
                    and o["ef_window_error"] <= 0.05 and t["reason"] != "dense":
                assert o["bytes_per_step"] >= c["bytes_per_step"], (t["name"], o)
        total += c["bytes_per_step"]
    assert abs(total - r["model"]["bytes_per_step"]) <= 1e-6 * total, r["model"]
    assert r["model"]["bytes_per_step"] < r["model"]["fp32_bytes_per_step"]
EOF
  "$PY" - "$WORK/t.svg" <<'EOF' || fail "the SVG is not as expected"
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
ns = "{http://www.w3.org/2000/svg}"
chosen = [c for c in root.iter(ns + "circle") if c.get("stroke") == "black"]
# fc1.weight and fc2.weight, push and pull; the dense bias has no panel.
assert len(chosen) == 4, len(chosen)
titles = [t.text for t in root.iter(ns + "text")]
assert any("fc2.weight" in (t or "") for t in titles), titles
assert not any("fc1.bias" in (t or "") for t in titles), titles
EOF
fi

# Budget mode: pushes get half of 1 Gbit/s x 0.2 ms = 12500 bytes per step.
"$TUNE" --gradients="$G" --link_gbps=1 --step_seconds=0.0002 \
  --out="$WORK/b.json" --json="$WORK/b.figures.json" >"$WORK/b.out" 2>"$WORK/b.err"
rc=$?
if [ "$rc" -ne 0 ]; then
  fail "budget mode exited $rc: $(cat "$WORK/b.err")"
else
  check_schedule "$WORK/b.json" 0
  grep -q "no pull codecs" "$WORK/b.out" || fail "budget mode does not say there are no pull codecs"
  "$PY" - "$WORK/b.figures.json" <<'EOF' || fail "budget figures are not as expected"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["pull"] is None
m = d["push"]["model"]
assert d["push"]["budget_bytes"] == 12500, d["push"]["budget_bytes"]
assert m["bytes_per_step"] <= 12500, m
EOF
fi

# Same input, same answer.
"$TUNE" --gradients="$G" --link_gbps=1 --step_seconds=0.0002 \
  --out="$WORK/b2.json" >/dev/null 2>&1
cmp -s "$WORK/b.json" "$WORK/b2.json" || fail "two runs wrote different schedules"

# Bad inputs: one line, the flag named, nothing written.
OUT=$WORK/bad.json
check_invalid_exit 2 "$TUNE" --gradients "expected a capture file" --target_error=0.1
check_invalid_exit 1 "$TUNE" --gradients "No such file" \
  --gradients="$WORK/missing.bin" --target_error=0.1 --out="$OUT"
cp "$G" "$WORK/corrupt.bin"
printf 'XXXX' | dd of="$WORK/corrupt.bin" bs=1 seek=5000 conv=notrunc 2>/dev/null
check_invalid_exit 1 "$TUNE" --gradients "checksum mismatch" \
  --gradients="$WORK/corrupt.bin" --target_error=0.1 --out="$OUT"
head -c 3000 "$G" >"$WORK/cut.bin"
check_invalid_exit 1 "$TUNE" --gradients "truncated" \
  --gradients="$WORK/cut.bin" --target_error=0.1 --out="$OUT"
echo "not a capture" >"$WORK/text.bin"
check_invalid_exit 1 "$TUNE" --gradients "text.bin" \
  --gradients="$WORK/text.bin" --target_error=0.1 --out="$OUT"
check_invalid_exit 2 "$TUNE" --target_error "both set; expected one mode" \
  --gradients="$G" --target_error=0.1 --link_gbps=1 --step_seconds=1 --out="$OUT"
check_invalid_exit 2 "$TUNE" --target_error "expected one mode" \
  --gradients="$G" --out="$OUT"
check_invalid_exit 2 "$TUNE" --target_error "expected a finite value > 0" \
  --gradients="$G" --target_error=0 --out="$OUT"
check_invalid_exit 2 "$TUNE" --target_error "expected a finite value > 0" \
  --gradients="$G" --target_error=inf --out="$OUT"
check_invalid_exit 2 "$TUNE" --step_seconds "unset; expected" \
  --gradients="$G" --link_gbps=1 --out="$OUT"
check_invalid_exit 2 "$TUNE" --link_gbps "expected a finite value > 0" \
  --gradients="$G" --link_gbps=-1 --step_seconds=1 --out="$OUT"
check_invalid_exit 2 "$TUNE" --push_share "expected 0 < share < 1" \
  --gradients="$G" --link_gbps=1 --step_seconds=1 --push_share=1 --out="$OUT"
check_invalid_exit 2 "$TUNE" --candidates "'zstd' is no codec" \
  --gradients="$G" --target_error=0.1 --candidates='topk 1%,zstd' --out="$OUT"
check_invalid_exit 2 "$TUNE" --window "expected >= 0" \
  --gradients="$G" --target_error=0.1 --window=-1 --out="$OUT"
check_invalid_exit 1 "$TUNE" "window is 7 steps" "expected at most 6" \
  --gradients="$G" --target_error=0.1 --window=7 --out="$OUT"
check_invalid_exit 1 "$TUNE" --link_gbps "budget of 62 bytes per step is below" \
  --gradients="$G" --link_gbps=1 --step_seconds=1e-6 --out="$OUT"
check_invalid_exit 1 "$TUNE" --deltas "fc2.weight.*shape\\[0\\] is 32, expected 64" \
  --gradients="$G" --deltas="$WORK/other.bin" --target_error=0.1 --out="$OUT"
[ -e "$OUT" ] && fail "a failed run wrote $OUT"
check_invalid_exit 1 "$TUNE" --out "/nonexistent/dir/s.json" \
  --gradients="$G" --target_error=0.1 --out=/nonexistent/dir/s.json
# A plot that cannot be written leaves no schedule.
check_invalid_exit 1 "$TUNE" --svg "/nonexistent/dir/p.svg" \
  --gradients="$G" --target_error=0.1 --svg=/nonexistent/dir/p.svg --out="$OUT"
[ -e "$OUT" ] && fail "a run whose --svg failed wrote $OUT"
ls "$WORK" | grep -q '\.tmp' && fail "a temporary file was left in $WORK"

cli_finish tune_cli_test
