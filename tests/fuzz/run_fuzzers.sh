#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (ASan + UBSan, libraries
# instrumented too) in their own build folder and runs each for a bounded
# time, starting from the committed seed corpus. Exits non-zero if any target
# crashes, leaks, times out on one input or trips a sanitizer.
#
#   tests/fuzz/run_fuzzers.sh                       # 20 s per target (CI)
#   FUZZ_SECONDS=3600 tests/fuzz/run_fuzzers.sh     # the longer run
#   FUZZ_TARGETS="codec" FUZZ_SECONDS=600 tests/fuzz/run_fuzzers.sh
#   FUZZ_JOBS=2 ...                # libFuzzer -fork=2: two fuzzing processes
#
# New inputs go to $BUILD_DIR/corpus/<target> (not the repo); a crash leaves
# $BUILD_DIR/artifacts/<target>/crash-*, which replays with
#   $BUILD_DIR/tests/fuzz/fuzz_<target> <file>
# or, without clang, build/tests/fuzz/fuzz_<target>_replay <file>.
# Needs clang and its libFuzzer runtime (Debian: clang, libclang-rt-14-dev).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-fuzz}"
FUZZ_SECONDS="${FUZZ_SECONDS:-20}"
FUZZ_TARGETS="${FUZZ_TARGETS:-codec shard checkpoint gradient_file}"
FUZZ_JOBS="${FUZZ_JOBS:-1}"
JOBS="${JOBS:-$(nproc)}"

# shellcheck source=../../deploy/packages.sh
source "$ROOT/deploy/packages.sh"
pserver_install_packages "${PSERVER_BUILD_PACKAGES[@]}" clang libclang-rt-14-dev

GENERATOR=()
if command -v ninja >/dev/null 2>&1; then GENERATOR=(-G Ninja); fi
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  # -O1 -g: fast enough to fuzz, symbolized reports, asserts on.
  # fuzzer-no-link: coverage feedback from the libraries, not just the target
  # file. The same configuration as tests/sanitizers.sh's ASan folder, so
  # BUILD_DIR=build-asan reuses that build (CI does).
  san="-fsanitize=address,undefined -fno-sanitize-recover=all"
  CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD_DIR" "${GENERATOR[@]}" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
    -DCMAKE_CXX_FLAGS="$san -fsanitize=fuzzer-no-link -fno-omit-frame-pointer" \
    -DCMAKE_EXE_LINKER_FLAGS="$san" \
    -DPSERVER_BUILD_BENCH=OFF -DPSERVER_FUZZ=ON >/dev/null
fi
targets=()
for t in $FUZZ_TARGETS; do targets+=("fuzz_$t"); done
cmake --build "$BUILD_DIR" --parallel "$JOBS" --target "${targets[@]}"

export ASAN_OPTIONS="${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
failed=()
for t in $FUZZ_TARGETS; do
  corpus="$BUILD_DIR/corpus/$t"
  artifacts="$BUILD_DIR/artifacts/$t"
  mkdir -p "$corpus" "$artifacts"
  echo "== fuzz_$t: ${FUZZ_SECONDS}s" >&2
  # The first folder collects new inputs; the committed seeds are read only.
  parallel=()
  if [[ "$FUZZ_JOBS" -gt 1 ]]; then
    # libFuzzer writes each job's log to fuzz-<n>.log in the working folder.
    parallel=(-fork="$FUZZ_JOBS")
  fi
  if ! "$BUILD_DIR/tests/fuzz/fuzz_$t" "$corpus" "$ROOT/tests/fuzz/corpus/$t" \
      -max_total_time="$FUZZ_SECONDS" -timeout=25 -rss_limit_mb=2048 \
      -max_len=8192 "${parallel[@]}" \
      -artifact_prefix="$artifacts/" -print_final_stats=1 \
      2> "$BUILD_DIR/fuzz_$t.log"; then
    failed+=("$t")
    tail -n 60 "$BUILD_DIR/fuzz_$t.log" >&2
  else
    grep -E "^(stat::number_of_executed_units|stat::peak_rss_mb|#[0-9]+ *DONE)" \
      "$BUILD_DIR/fuzz_$t.log" >&2 || true
    ls "$corpus" | wc -l | sed "s/^/   corpus files: /" >&2
  fi
done
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "fuzzers failed: ${failed[*]} (inputs in $BUILD_DIR/artifacts/)" >&2
  exit 1
fi
echo "fuzzers: ${FUZZ_TARGETS} ran ${FUZZ_SECONDS}s each, no findings" >&2
