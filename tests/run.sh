#!/usr/bin/env bash
# The test command: installs what is missing (Debian bookworm), configures,
# builds and runs the whole ctest suite. Idempotent; reuses the build folder.
#
#   tests/run.sh                 # Release build in ./build, all tests
#   BUILD_DIR=b tests/run.sh     # another build folder
#   CTEST_ARGS="-R Codec" tests/run.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD_DIR="${BUILD_DIR:-$ROOT/build}"
BUILD_TYPE="${BUILD_TYPE:-Release}"
JOBS="${JOBS:-$(nproc)}"

# shellcheck source=../deploy/packages.sh
source "$ROOT/deploy/packages.sh"
pserver_install_packages "${PSERVER_BUILD_PACKAGES[@]}" "${PSERVER_TEST_PACKAGES[@]}"

GENERATOR=()
if command -v ninja >/dev/null 2>&1; then GENERATOR=(-G Ninja); fi
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  cmake -S "$ROOT" -B "$BUILD_DIR" "${GENERATOR[@]}" \
    -DCMAKE_BUILD_TYPE="$BUILD_TYPE" ${CMAKE_ARGS:-}
fi
cmake --build "$BUILD_DIR" --parallel "$JOBS"
cd "$BUILD_DIR"
# shellcheck disable=SC2086
ctest --output-on-failure --parallel "$JOBS" --timeout 900 ${CTEST_ARGS:-}
