#!/usr/bin/env bash
# Lock discipline checked by the compiler (issue 9): every library, daemon
# and test built with clang's -Wthread-safety and -Werror in build-tsa/.
# A guarded member touched without its mutex, a REQUIRES not met or a lock
# not released fails the build.
#
#   tests/thread_safety.sh               # BUILD_DIR=build-tsa
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build-tsa}"
JOBS="${JOBS:-$(nproc)}"

# shellcheck source=../deploy/packages.sh
source "$ROOT/deploy/packages.sh"
pserver_install_packages "${PSERVER_BUILD_PACKAGES[@]}" libgtest-dev \
  libgmock-dev libbenchmark-dev clang

GENERATOR=()
if command -v ninja >/dev/null 2>&1; then GENERATOR=(-G Ninja); fi
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  CC=clang CXX=clang++ cmake -S "$ROOT" -B "$BUILD_DIR" "${GENERATOR[@]}" \
    -DCMAKE_BUILD_TYPE= -DPSERVER_WERROR=ON -DPSERVER_BUILD_BENCH=OFF ${CMAKE_ARGS:-}
fi
cmake --build "$BUILD_DIR" --parallel "$JOBS"
echo "thread_safety: clang -Wthread-safety -Werror build is clean" >&2
