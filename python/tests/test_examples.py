"""python/examples/train_mlp.py runs as docs/examples.md shows (few steps, on a
subset of Fashion-MNIST), and a second run with --state continues the first;
python/examples/char_transformer.py trains a tiny transformer through the
launcher and its validation loss falls."""

import json
import math
import os
import pathlib
import re
import subprocess
import sys

import pytest

import pserver
from conftest import server_binary

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


def test_char_transformer_trains_through_the_launcher(tmp_path):
    """2 workers, 1 shard, 6 steps of a 30K-parameter model (1-bit Adam,
    frozen after 4 steps). The untrained model's validation loss is
    computed here from the same seed (and must equal rank 0's "untrained"
    report); 6 steps of Adam learn at least the byte frequencies, about 1.9
    nats lower (5.78 -> 3.88 when written), so the final loss must be below
    ln 256 and well below the untrained one (with --lr 0 it stays 5.78)."""
    examples = str(EXAMPLE.parent)
    sys.path.insert(0, examples)
    try:
        import char_transformer as ct
    finally:
        sys.path.remove(examples)
    stdlib = "/usr/lib/python3.11"
    if not any(n.endswith(".py") for n in os.listdir(stdlib)):
        pytest.skip(f"no .py files in {stdlib}")
    model_args = ["--d-model", "32", "--layers", "1", "--heads", "2",
                  "--context", "32"]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")]))
    result = tmp_path / "result.json"
    p = subprocess.run(
        [sys.executable, "-m", "pserver.launch", "--server-bin",
         server_binary(), "--run-dir", str(tmp_path / "run"), "--shards", "1",
         "--workers", "2", "--optimizer", "onebit_adam", "--freeze-step", "4",
         "--pull-codec", "onebit", str(EXAMPLE.parent / "char_transformer.py"),
         "--corpus-dir", stdlib, "--steps", "6", "--batch", "2",
         "--max-bytes", "200000", "--log-every", "2", "--eval-every", "3",
         "--eval-batches", "5", "--result-json", str(result), *model_args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    text = p.stdout.decode()
    assert p.returncode == 0, text
    assert "worker 0 done: 6 steps" in text, text
    worker1 = (tmp_path / "run" / "worker1.log").read_text()
    assert "worker 1 done: 6 steps" in worker1, worker1

    import torch
    _, val = ct.load_corpus(stdlib, max_bytes=200000)
    torch.manual_seed(1)  # the script's --seed
    untrained = ct.evaluate(ct.CharTransformer(d_model=32, layers=1, heads=2,
                                               context=32), val, 32,
                            batches=5)
    reported = float(re.search(r"^untrained: validation loss (\S+)", text,
                               re.M).group(1))
    assert abs(reported - untrained) < 1e-3, (untrained, text)
    final = float(re.search(r"^validation loss (\S+) \(\S+ bits per "
                            r"character\) after 6 steps", text, re.M).group(1))
    assert math.isfinite(final), text
    assert final < math.log(256) and final < untrained - 0.5, (untrained,
                                                                text)
    summary = json.loads(result.read_text())
    assert summary["workload"] == "transformer" and summary["steps"] == 6
    assert summary["workers"] == 2 and summary["parameters"] == 30432
    assert abs(summary["val_loss"] - final) < 1e-4
    assert summary["push_payload_bytes"] < summary["push_fp32_bytes"]
