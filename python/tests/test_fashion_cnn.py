"""python/examples/fashion_cnn.py runs through the launcher as docs/examples.md
shows (2 shards, 2 workers, few steps on a subset of Fashion-MNIST) and
learns: rank 0 reports a test accuracy well above chance."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

import pserver
from conftest import server_binary

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / \
    "fashion_cnn.py"
DATA = "/usr/share/datasets/fashion-mnist"
PACKAGE_ROOT = str(pathlib.Path(pserver.__file__).resolve().parents[1])


def test_fashion_cnn_trains_through_the_launcher(tmp_path):
    if not os.path.exists(os.path.join(DATA, "t10k-labels-idx1-ubyte.gz")):
        pytest.skip(f"no Fashion-MNIST in {DATA} (dataset-fashion-mnist)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run(
        [sys.executable, "-m", "pserver.launch", "--server-bin",
         server_binary(), "--run-dir", str(tmp_path / "run"), "--shards", "2",
         "--workers", "2", "--optimizer", "onebit_adam", "--freeze-step",
         "20", "--pull-codec", "onebit", str(EXAMPLE), "--steps", "60",
         "--train-subset", "4000", "--test-subset", "1000",
         "--log-every", "20"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        timeout=120)
    text = p.stdout.decode()
    assert p.returncode == 0, text
    assert re.search(r"^21\d{4} parameters, 2 workers", text, re.M), text
    assert "worker 0 done: 60 steps" in text, text
    # After the freeze step the pushes are 1-bit: far fewer than fp32 bytes.
    ratio = float(re.search(r"pushed \d+ bytes \((\S+)x less", text).group(1))
    assert ratio > 4, text
    acc = float(re.search(r"test accuracy (\S+), test loss \S+ after 60",
                          text).group(1))
    assert acc > 0.5, text  # 10 classes: chance is 0.1
    worker1 = (tmp_path / "run" / "worker1.log").read_text()
    assert "worker 1 done: 60 steps" in worker1, worker1
