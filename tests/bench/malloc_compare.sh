#!/usr/bin/env bash
# The daemons' allocator, measured (issue 29 section 3): tests/bench/
# large_model.sh (100M parameters, 1 shard, 1 worker, loopback; PARAMS
# STEPS REPEAT pass through) once per allocator, then one table of the
# medians: fp32 and 1-bit s/step, the worker's and the shard's minor page
# faults per step, and each step time against glibc's from the same run.
#
#   linked     BUILD as configured (PSERVER_MALLOC=tcmalloc by default)
#   jemalloc   the same binaries with LD_PRELOAD=libjemalloc.so.2 (preloaded
#              first, it takes malloc from the linked tcmalloc)
#   glibc      SYSTEM_BUILD, configured with -DPSERVER_MALLOC=system
#   glibc_env  SYSTEM_BUILD with MALLOC_MMAP_THRESHOLD_ and
#              MALLOC_TRIM_THRESHOLD_ at 1 GiB (large buffers stay in the
#              heap instead of going back to the kernel after every step)
#
#   tests/bench/malloc_compare.sh [--results] [BUILD [SYSTEM_BUILD]]
#
# SYSTEM_BUILD defaults to build-sysmalloc beside BUILD; without it the two
# glibc rows are skipped with a note. Make it with (daemons only):
#   cmake -S . -B build-sysmalloc -G Ninja -DPSERVER_MALLOC=system \
#     -DPSERVER_BUILD_TESTS=OFF -DPSERVER_BUILD_PYTHON=OFF -DPSERVER_BUILD_BENCH=OFF
#   ninja -C build-sysmalloc pserver_server_bin pserver_worker_bin
# About 8 minutes with the defaults.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
RESULTS=0
if [[ "${1:-}" == "--results" ]]; then RESULTS=1; shift; fi
BUILD="${1:-$ROOT/build}"
SYSTEM_BUILD="${2:-$(dirname "$BUILD")/build-sysmalloc}"
JEMALLOC=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2
OUT="$(mktemp -d /tmp/pserver-malloc.XXXXXX)"
trap 'rm -rf "$OUT"' EXIT

bench() {  # bench NAME BUILD [ENV...]
  local name=$1 build=$2
  shift 2
  echo "== $name" >&2
  env "$@" "$ROOT/tests/bench/large_model.sh" "$build" | tee "$OUT/$name.txt" >&2
}
bench linked "$BUILD"
if [[ -f "$JEMALLOC" ]]; then
  bench jemalloc "$BUILD" LD_PRELOAD="$JEMALLOC"
else
  echo "malloc_compare.sh: $JEMALLOC missing (apt-get install libjemalloc2); jemalloc skipped" >&2
fi
if [[ -x "$SYSTEM_BUILD/server/pserver_server" && -x "$SYSTEM_BUILD/worker/pserver_worker" ]]; then
  bench glibc "$SYSTEM_BUILD"
  bench glibc_env "$SYSTEM_BUILD" MALLOC_MMAP_THRESHOLD_=1073741824 MALLOC_TRIM_THRESHOLD_=1073741824
else
  echo "malloc_compare.sh: no daemons in $SYSTEM_BUILD (see --help in the header); glibc rows skipped" >&2
fi

/usr/bin/python3 - "$OUT" "$RESULTS" "$ROOT" <<'PY'
import os, re, sys
out, results, root = sys.argv[1], sys.argv[2] == "1", sys.argv[3]
rows, machine = {}, ""
for name in ("linked", "jemalloc", "glibc", "glibc_env"):
    path = os.path.join(out, name + ".txt")
    if not os.path.exists(path):
        continue
    text = open(path).read()
    machine = re.search(r"^machine: (.*)$", text, re.M).group(1)
    malloc = re.search(r"^daemons' malloc: (\S+)", text, re.M).group(1)
    r = {"malloc": malloc}
    for codec in ("fp32", "onebit"):
        m = re.search(rf"^{codec}\s+median\s+([\d.]+).*?\s+([\d.]+), ([\d.]+)\s*$", text, re.M)
        r[codec] = (float(m.group(1)), float(m.group(2)), float(m.group(3)))
    rows[name] = r
lines = [f"machine: {machine}", "100M parameters, 1 shard, 1 worker, loopback; medians of large_model.sh's runs",
         "%-10s %-9s %10s %14s %10s %14s %9s %9s" % ("allocator", "reports", "fp32 s", "faults w, s",
                                                    "1-bit s", "faults w, s", "fp32 x", "1-bit x")]
base = rows.get("glibc")
for name, r in rows.items():
    ratio = lambda c: "%.2fx" % (base[c][0] / r[c][0]) if base else "-"
    lines.append("%-10s %-9s %10.3f %14s %10.3f %14s %9s %9s" % (
        name, r["malloc"], r["fp32"][0], "%.0f, %.0f" % r["fp32"][1:], r["onebit"][0],
        "%.0f, %.0f" % r["onebit"][1:], ratio("fp32"), ratio("onebit")))
lines.append("x: glibc's step time / this one's, from this run (higher is faster)")
text = "\n".join(lines)
print(text)
if results:
    open(os.path.join(root, "tests/bench/results/malloc_compare.txt"), "w").write(text + "\n")
PY
