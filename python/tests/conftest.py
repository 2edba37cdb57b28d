"""Fixtures: real pserver_server processes on loopback, stopped after each test."""

import importlib
import os
import pathlib
import subprocess
import sys
import time

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]

# The tests need torch and numpy for the interpreter the package was built
# for. A missing one fails the whole suite here, naming the package, instead
# of skipping the tests that need it (a built package must be tested).
for _module, _package in (("numpy", "python3-numpy"),
                          ("torch", "python3-torch")):
    try:
        importlib.import_module(_module)
    except ImportError as e:
        raise ImportError(
            f"python/tests need {_module} for {sys.executable}: apt-get "
            f"install {_package} (tests/run.sh installs it); {e}") from e


def server_binary():
    path = os.environ.get("PSERVER_SERVER_BIN") or str(
        REPO / "build" / "server" / "pserver_server")
    if not os.access(path, os.X_OK):
        pytest.skip(f"no pserver_server at {path}; build it or set "
                    "PSERVER_SERVER_BIN")
    return path


@pytest.fixture
def shards(tmp_path):
    """shards(num_shards, num_workers, *flags) -> ["127.0.0.1:port", ...].

    Each shard listens on port 0 and reports its port through --port_file,
    so no port is guessed. Every process is stopped at teardown.
    """
    binary = server_binary()
    procs = []

    def start(num_shards, num_workers, *flags):
        addrs = []
        group = len(procs)
        for i in range(num_shards):
            port_file = tmp_path / f"port.{group}.{i}"
            log = open(tmp_path / f"shard.{group}.{i}.log", "wb")
            p = subprocess.Popen(
                [binary, f"--shard_index={i}", f"--num_shards={num_shards}",
                 f"--num_workers={num_workers}", "--listen=127.0.0.1:0",
                 f"--port_file={port_file}", "--metrics_listen=",
                 "--drain_seconds=0", *flags],
                stdout=log, stderr=subprocess.STDOUT)
            log.close()
            procs.append(p)
            deadline = time.monotonic() + 30
            while not port_file.exists():
                if p.poll() is not None:
                    text = (tmp_path / f"shard.{group}.{i}.log").read_text()
                    raise RuntimeError(f"pserver_server exited {p.returncode}:"
                                       f" {text}")
                if time.monotonic() > deadline:
                    raise RuntimeError("pserver_server did not listen in 30 s")
                time.sleep(0.02)
            addrs.append(f"127.0.0.1:{port_file.read_text().strip()}")
        return addrs

    yield start
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
