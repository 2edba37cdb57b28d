# Sourced by tests/run.sh and deploy/local.sh: the Debian packages pserver
# needs, and a function that installs whichever are missing.

# The C++ libraries and daemons (all that deploy/Dockerfile builds, with
# -DPSERVER_BUILD_PYTHON=OFF).
PSERVER_DAEMON_BUILD_PACKAGES=(
  cmake ninja-build g++ pkg-config libgoogle-perftools-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
  libabsl-dev libopenblas-dev prometheus-cpp-dev zlib1g-dev
)
# The default build: also the Python package's extension (python/), without
# which configuring fails unless -DPSERVER_BUILD_PYTHON=OFF.
PSERVER_BUILD_PACKAGES=(
  "${PSERVER_DAEMON_BUILD_PACKAGES[@]}"
  pybind11-dev python3-dev
)
PSERVER_TEST_PACKAGES=(
  libgtest-dev libgmock-dev libbenchmark-dev
  dataset-fashion-mnist prometheus curl python3-yaml iproute2
  openssl  # tests/server/tls_test.cc, tls_daemon_test.sh make certificates
  # The Python package's pytest suite (python/tests), which fails without
  # them. Debian's modules import only under /usr/bin/python3.
  python3-numpy python3-torch python3-pytest
)
PSERVER_RUN_PACKAGES=(dataset-fashion-mnist)
# Only for the tests that need them (tests/e2e/deploy_config_test.sh,
# compose_test.sh): docker-compose 1.29 validates offline; the real Compose
# run also needs the engine and a base image made by debootstrap.
PSERVER_COMPOSE_CONFIG_PACKAGES=(docker-compose)
PSERVER_COMPOSE_RUN_PACKAGES=(docker.io docker-compose debootstrap iptables)

# pserver_install_packages PKG...: installs the missing ones with apt-get as
# root or through sudo; otherwise prints the command and returns 1.
pserver_install_packages() {
  local missing=() p
  for p in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$p")
    fi
  done
  [[ ${#missing[@]} -eq 0 ]] && return 0
  echo "pserver: installing ${missing[*]}" >&2
  local sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
      sudo=(sudo)
    else
      echo "pserver: missing packages; run: sudo apt-get install -y ${missing[*]}" >&2
      return 1
    fi
  fi
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
}
