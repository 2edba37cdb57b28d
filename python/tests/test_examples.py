"""python/examples/train_mlp.py runs as docs/python.md shows (few steps, on a
subset of Fashion-MNIST), and a second run with --state continues the first."""

import os
import pathlib
import re
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("numpy")

import pserver  # noqa: E402

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / \
    "train_mlp.py"
DATA = "/usr/share/datasets/fashion-mnist"
PACKAGE_ROOT = str(pathlib.Path(pserver.__file__).resolve().parents[1])


def run(addrs, *args):
    env = dict(os.environ, RANK="0", WORLD_SIZE="1",
               PSERVER_SERVERS=",".join(addrs), PYTHONPATH=os.pathsep.join(
                   [PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, str(EXAMPLE), "--train-subset", "4000",
                        "--test-subset", "1000", "--log-every", "10", *args],
                       env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=120)
    text = p.stdout.decode()
    assert p.returncode == 0, text
    return text


def test_train_mlp_learns_and_resumes_from_its_state(shards, tmp_path):
    if not os.path.exists(os.path.join(DATA, "t10k-labels-idx1-ubyte.gz")):
        pytest.skip(f"no Fashion-MNIST in {DATA} (dataset-fashion-mnist)")
    addrs = shards(1, 1, "--optimizer=adam", "--lr=0.001")
    state = str(tmp_path / "worker0.pt")
    first = run(addrs, "--steps", "60", "--state", state)
    assert "restored" not in first
    acc = float(re.search(r"test accuracy (\S+),", first).group(1))
    assert acc > 0.5, first  # 10 classes: chance is 0.1
    second = run(addrs, "--steps", "80", "--state", state)
    assert "restored " + state + " at step 60" in second, second
    assert "step 70/80" in second and "step 10/80" not in second, second
    assert re.search(r"worker 0 done: 80 steps", second), second
