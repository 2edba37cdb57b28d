#!/usr/bin/env bash
# The unit tests under sanitizers, built with clang in their own folders:
#   asan: AddressSanitizer + UndefinedBehaviorSanitizer, every report fatal
#         (-fno-sanitize-recover=all), leak checking on      -> build-asan
#   tsan: ThreadSanitizer, including shard_stress_test (16 workers x 50
#         rounds on one shard, from threads)                 -> build-tsan
# Zero reports expected: any report fails the run.
#
#   tests/sanitizers.sh                       # both, every unit test (full)
#   SANITIZERS=tsan tests/sanitizers.sh       # one of them
#   SANITIZER_SCOPE=ci tests/sanitizers.sh    # the subset .ci/run runs
#
# Scopes. full: common, server and worker unit tests plus the fuzz corpus
# replays under ASan+UBSan; every threaded server/worker test under TSan.
# ci: ASan+UBSan on the common and server tests and the fuzz replays; TSan on
# the shard, lease, stress and gRPC service tests (the concurrent code).
# (checkpoint_test is left out of TSan; see tsan() below.)
# Benchmarks, the e2e suites and parity_test (which spawns daemons) are
# never built here.
#
# Uninstrumented system libraries (Debian's gRPC, protobuf, Abseil, OpenBLAS,
# libstdc++): fine for ASan. For TSan, Abseil's synchronization primitives
# are annotated by tests/tsan_absl_shim.cc (see there), and
# tests/tsan.supp lists, with a reason each, the reports whose frames lie in
# the other uninstrumented libraries.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
SANITIZERS="${SANITIZERS:-asan tsan}"
SCOPE="${SANITIZER_SCOPE:-full}"
JOBS="${JOBS:-$(nproc)}"

# shellcheck source=../deploy/packages.sh
source "$ROOT/deploy/packages.sh"
pserver_install_packages "${PSERVER_BUILD_PACKAGES[@]}" libgtest-dev \
  libgmock-dev clang libclang-rt-14-dev

# binary (relative to the build folder) [args...] per test; the fuzz replays
# read the committed corpora.
COMMON_TESTS=(
  tests/common/common_test tests/common/codec_test
  tests/common/error_feedback_test tests/common/codec_bad_input_test
  tests/common/topk_test tests/common/quantize_test
  tests/common/clock_thread_pool_test
)
SERVER_TESTS=(
  tests/server/optimizer_test tests/server/shard_test
  tests/server/shard_stress_test tests/server/service_test
  tests/server/metrics_test tests/server/checkpoint_test
  tests/server/lease_test tests/server/shard_components_test
  tests/server/shard_holes_test tests/server/model_install_test
  tests/server/hyper_test
)
WORKER_TESTS=(tests/worker/worker_model_test tests/worker/client_test
  tests/worker/client_chunks_test tests/worker/replica_test
  tests/worker/client_recovery_test)
FUZZ_REPLAYS=(
  tests/fuzz/fuzz_codec_replay tests/fuzz/fuzz_shard_replay
  tests/fuzz/fuzz_checkpoint_replay
)

GENERATOR=()
if command -v ninja >/dev/null 2>&1; then GENERATOR=(-G Ninja); fi

# configure DIR CXX_FLAGS LINKER_FLAGS [CMAKE_ARGS...]
configure() {
  local dir="$1" flags="$2" ldflags="$3"
  shift 3
  if [[ ! -f "$dir/CMakeCache.txt" ]]; then
    CC=clang CXX=clang++ cmake -S "$ROOT" -B "$dir" "${GENERATOR[@]}" \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" \
      -DCMAKE_CXX_FLAGS="$flags -fno-omit-frame-pointer" \
      -DCMAKE_EXE_LINKER_FLAGS="$ldflags" \
      -DPSERVER_BUILD_BENCH=OFF "$@" >/dev/null
  fi
}

# run DIR BINARY...: builds the binaries, then runs each (all its tests in
# one process); fails after running all of them if any failed.
run() {
  local dir="$1"
  shift
  local targets=() b
  for b in "$@"; do targets+=("$(basename "$b")"); done
  cmake --build "$dir" --parallel "$JOBS" --target "${targets[@]}"
  local failed=() start
  for b in "$@"; do
    local args=()
    case "$b" in
      */fuzz_*_replay)
        local t="${b##*/fuzz_}"
        args=("$ROOT/tests/fuzz/corpus/${t%_replay}") ;;
    esac
    start=$SECONDS
    if timeout 1200 "$dir/$b" "${args[@]}" >"$dir/$(basename "$b").log" 2>&1; then
      echo "   ok   $(basename "$b") ($((SECONDS - start)) s)" >&2
    else
      echo "   FAIL $(basename "$b") ($((SECONDS - start)) s): $dir/$(basename "$b").log" >&2
      grep -E -A30 "(Sanitizer|runtime error|WARNING: ThreadSanitizer)" \
        "$dir/$(basename "$b").log" | head -n 60 >&2 || tail -n 30 "$dir/$(basename "$b").log" >&2
      failed+=("$(basename "$b")")
    fi
  done
  if [[ ${#failed[@]} -gt 0 ]]; then
    echo "sanitizer failures in $dir: ${failed[*]}" >&2
    return 1
  fi
}

asan() {
  local dir="${ASAN_BUILD_DIR:-$ROOT/build-asan}"
  local san="-fsanitize=address,undefined -fno-sanitize-recover=all"
  # fuzzer-no-link only adds coverage counters (the ASan runtime stubs them);
  # with it, this folder configures exactly as tests/fuzz/run_fuzzers.sh
  # does, so CI builds the libraries once for both (BUILD_DIR=build-asan).
  configure "$dir" "$san -fsanitize=fuzzer-no-link" "$san" -DPSERVER_FUZZ=ON
  export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1"
  export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
  local tests=("${COMMON_TESTS[@]}" "${SERVER_TESTS[@]}" "${FUZZ_REPLAYS[@]}")
  if [[ "$SCOPE" == full ]]; then tests+=("${WORKER_TESTS[@]}"); fi
  echo "== ASan+UBSan ($SCOPE) in $dir" >&2
  run "$dir" "${tests[@]}"
}

tsan() {
  local dir="${TSAN_BUILD_DIR:-$ROOT/build-tsan}"
  mkdir -p "$dir"
  # Abseil annotations (tests/tsan_absl_shim.cc): wrap what the shim defines
  # if this Abseil exports those symbols; otherwise TSan would flag every
  # absl::Mutex-guarded member, so refuse to run rather than mislead.
  local lib syms wraps=""
  lib="$(find /usr/lib /usr/lib64 -name 'libabsl_synchronization.so*' 2>/dev/null | head -n1)"
  syms="$(grep -oE '\((_Z[A-Za-z0-9_]+)\)' "$ROOT/tests/tsan_absl_shim.cc" | tr -d '()')"
  local s exported
  exported="$(nm -D --defined-only "$lib" | awk '{print $3}')"
  for s in $syms; do
    if ! grep -qx "$s" <<<"$exported"; then
      echo "tsan: $lib does not export $s; update tests/tsan_absl_shim.cc" >&2
      return 1
    fi
    wraps+=" -Wl,--wrap=$s"
  done
  # Linked through the linker flags, so ninja does not know to relink when
  # the shim changes: rebuild it and drop the test binaries only then.
  local stamp
  stamp="$(cat "$ROOT/tests/tsan_absl_shim.cc" <(echo "$wraps") | sha256sum)"
  if [[ ! -f "$dir/tsan_absl_shim.o" ]] ||
     [[ "$(cat "$dir/tsan_absl_shim.stamp" 2>/dev/null)" != "$stamp" ]]; then
    clang++ -O1 -g -fsanitize=thread -c "$ROOT/tests/tsan_absl_shim.cc" \
      -o "$dir/tsan_absl_shim.o"
    find "$dir/tests" -maxdepth 2 -type f -perm -u+x -delete 2>/dev/null || true
    echo "$stamp" > "$dir/tsan_absl_shim.stamp"
  fi
  # The shim references the real functions: every executable (and CMake's
  # own test programs) links libabsl_synchronization with it.
  configure "$dir" "-fsanitize=thread" \
    "-fsanitize=thread $dir/tsan_absl_shim.o -labsl_synchronization$wraps"
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$ROOT/tests/tsan.supp"
  local tests
  if [[ "$SCOPE" == full ]]; then
    # Not checkpoint_test: its kill -9 test forks a writer and expects a
    # complete write within ~120 ms, and its fallback test does not wait for
    # the background writer; under TSan's slowdown both fail without any
    # TSan report. It runs under ASan+UBSan and in the normal suite.
    tests=(tests/server/optimizer_test tests/server/shard_test
           tests/server/shard_stress_test tests/server/service_test
           tests/server/metrics_test tests/server/lease_test
           tests/server/shard_server_test tests/server/shard_components_test
           tests/server/shard_holes_test tests/common/clock_thread_pool_test
           tests/server/model_install_test tests/worker/client_test
           tests/worker/client_chunks_test tests/worker/client_recovery_test
           tests/common/codec_test)
  else
    tests=(tests/server/shard_stress_test tests/server/shard_test
           tests/server/lease_test tests/server/service_test)
  fi
  echo "== TSan ($SCOPE) in $dir" >&2
  run "$dir" "${tests[@]}"
}

status=0
for s in $SANITIZERS; do
  start=$SECONDS
  case "$s" in
    asan) asan || status=1 ;;
    tsan) tsan || status=1 ;;
    *) echo "unknown sanitizer $s (asan, tsan)" >&2; exit 2 ;;
  esac
  echo "== $s took $((SECONDS - start)) s" >&2
done
exit $status
