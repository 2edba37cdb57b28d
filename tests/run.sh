#!/usr/bin/env bash
# The test command: installs what is missing (Debian bookworm), configures,
# builds and runs the whole ctest suite, the Python package's included.
# Idempotent; reuses the build folder (configured again on every run).
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

# Configure on every run (a second configure takes seconds): a cache from
# before the packages above were installed, e.g. deploy/local.sh's first
# configure, then finds them, and PSERVER_BUILD_PYTHON=ON brings the Python
# package and python_test into a folder once configured without them.
# The generator and build type are a new folder's only; CMAKE_ARGS come
# last, so they override (e.g. CMAKE_ARGS=-DPSERVER_BUILD_PYTHON=OFF).
configure=(-DPSERVER_BUILD_PYTHON=ON)
if [[ ! -f "$BUILD_DIR/CMakeCache.txt" ]]; then
  if command -v ninja >/dev/null 2>&1; then configure+=(-G Ninja); fi
  configure+=(-DCMAKE_BUILD_TYPE="$BUILD_TYPE")
fi
# shellcheck disable=SC2086
cmake -S "$ROOT" -B "$BUILD_DIR" "${configure[@]}" ${CMAKE_ARGS:-}
cmake --build "$BUILD_DIR" --parallel "$JOBS"
cd "$BUILD_DIR"
# shellcheck disable=SC2086
ctest --output-on-failure --parallel "$JOBS" --timeout 900 ${CTEST_ARGS:-}
