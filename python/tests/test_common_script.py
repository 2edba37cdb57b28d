"""Issue 47: the common GPT script's own stop-and-resume (python/tests/
common_script.py: rank 0's single checkpoint file, loaded by every rank)
through python3 -m pserver.launch, into fresh shards. The optimizer state
(Adam's moments, 1-bit Adam's frozen variance and stage, the step) travels
in the script's checkpoint, so the resumed run continues where the stopped
one was; before, rank 1 refused rank 0's file, and with per-rank files the
fresh shards ran the warmup again without a word."""

import os
import pathlib
import re
import subprocess
import sys

import pytest
import torch

import pserver
from conftest import server_binary

HERE = pathlib.Path(__file__).resolve().parent
SCRIPT = str(HERE / "common_script.py")
PACKAGE_ROOT = str(pathlib.Path(pserver.__file__).resolve().parents[1])
# 1-bit Adam, variance frozen at round 5; the script's lr loop sends its lr
# and its betas (0.9, 0.95), as nanoGPT's, set the shards' (no flag).
FLAGS = ("--optimizer=onebit_adam", "--freeze_step=5", "--pull-codec=fp32")
LAST = 12


def launch(tmp_path, name, out_dir, *script_args, launcher_args=()):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")]))
    out_dir.mkdir(parents=True, exist_ok=True)
    p = subprocess.run(
        [sys.executable, "-m", "pserver.launch", "--server-bin",
         server_binary(), "--run-dir", str(tmp_path / name), "--shards", "2",
         "--workers", "2", *launcher_args, *FLAGS, SCRIPT, str(out_dir),
         *script_args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        timeout=300)
    logs = "".join(f.read_text() for f in sorted((tmp_path / name).glob(
        "*.log")))
    assert p.returncode == 0, p.stdout.decode() + logs
    return p.stdout.decode() + logs


def final(out_dir):
    return torch.load(out_dir / f"final_{LAST}.pt")


def max_diff(a, b):
    return max((a[k] - b[k]).abs().max().item() for k in a)


def final_loss(text):
    return float(re.search(rf"iter {LAST} loss ([0-9.]+)", text).group(1))


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("uninterrupted")
    text = launch(tmp, "run", tmp / "out", "--max-iters", str(LAST))
    return final(tmp / "out"), final_loss(text)


def stop_and_resume(tmp_path, stop, *variant, drop_shards=False,
                    launcher_args=()):
    """The script run to `stop`, then its own resume to LAST in a new
    launch (new shards). Returns (final weights, final loss, output)."""
    out = tmp_path / "out"
    launch(tmp_path, "first", out, "--max-iters", str(stop), *variant,
           launcher_args=launcher_args)
    if drop_shards:
        # What the optimizer's state_dict held before issue 47: no shard
        # state (and no rank takes the record).
        ckpt = torch.load(out / "ckpt.pt")
        del ckpt["optimizer"]["pserver_shards"]
        ckpt["optimizer"]["worker_id"] = 99
        torch.save(ckpt, out / "ckpt.pt")
    else:
        saved = torch.load(out / ("ckpt_0.pt" if variant else "ckpt.pt"))
        assert saved["iter_num"] == stop
        shards = saved["optimizer"]["pserver_shards"]
        assert [s["step"] for s in shards] == [stop, stop]
    text = launch(tmp_path, "resumed", out, "--max-iters", str(LAST),
                  "--init-from", "resume", *variant,
                  launcher_args=launcher_args)
    # Without the shards' state they count only the resumed run's rounds.
    step = LAST - stop if drop_shards else LAST
    assert f"iter {LAST} loss" in text and f"step {step} " in text, text
    return final(out), final_loss(text), text


def test_resume_before_the_freeze_is_the_uninterrupted_run(tmp_path,
                                                           uninterrupted):
    """Every rank loads rank 0's file; before the freeze pushes are fp32, so
    no residual is lost: bit for bit."""
    weights, _, text = stop_and_resume(tmp_path, 4)
    assert "this state_dict is worker 0's; worker 1 takes" in text, text
    assert max_diff(weights, uninterrupted[0]) == 0.0


def test_resume_after_the_freeze(tmp_path, uninterrupted):
    """Stopped at 8 (frozen at 5). Each rank's own file: bit for bit. Rank
    0's file: rank 1's 1-bit residuals start from zero, which moves the
    weights less than losing the shards' state does (the control, which
    shows the comparison can fail), and the loss stays near."""
    weights, _, text = stop_and_resume(tmp_path / "own", 8, "--per-rank")
    assert "pserver: this state_dict is worker" not in text
    assert max_diff(weights, uninterrupted[0]) == 0.0
    weights, loss, text = stop_and_resume(tmp_path / "rank0", 8)
    assert "this state_dict is worker 0's; worker 1 takes" in text, text
    lost_residual = max_diff(weights, uninterrupted[0])
    control, control_loss, _ = stop_and_resume(tmp_path / "control", 8,
                                               drop_shards=True)
    lost_state = max_diff(control, uninterrupted[0])
    print(f"max |w - w_uninterrupted|: rank 0's file {lost_residual:.4f}, "
          f"without the shards' state {lost_state:.4f}; final loss "
          f"{uninterrupted[1]:.6f} uninterrupted, {loss:.6f} and "
          f"{control_loss:.6f}")
    assert 0 < lost_residual < lost_state
    assert abs(loss - uninterrupted[1]) < abs(control_loss - uninterrupted[1])

    # The same resume with the launcher's --checkpoint-dir: the shards come
    # back from their own checkpoints at step 8, which load_state_dict()
    # leaves as they are; the run is the fresh-shards one, bit for bit.
    ckpt = tmp_path / "shard_ckpt"
    restored, _, text = stop_and_resume(
        tmp_path / "restored", 8,
        launcher_args=("--checkpoint-dir", str(ckpt), "--checkpoint_every=1"))
    assert "shard 0 step 8, shard 1 step 8" in text, text
    assert max_diff(restored, weights) == 0.0


def test_grad_scaler_enabled(tmp_path, uninterrupted):
    """The script's GradScaler enabled (on the CPU: cpu_grad_scaler.py).
    Its scales are powers of two, so without an overflow the run is the
    unscaled one bit for bit. An inf injected into rank 1's gradient at
    iteration 6 skips that round on both shards for both ranks, and rank
    0's scaler backs off too (4096, grown every 3 clean steps: 16384 at the
    end instead of 65536); the run goes on, no rank waiting out a lease."""
    out = tmp_path / "clean"
    text = launch(tmp_path, "clean", out, "--max-iters", str(LAST),
                  "--cpu-scaler")
    assert f"step {LAST} scale 65536.0" in text, text
    assert max_diff(final(out), uninterrupted[0]) == 0.0
    out = tmp_path / "overflow"
    text = launch(tmp_path, "overflow", out, "--max-iters", str(LAST),
                  "--cpu-scaler", "--overflow-at", "6")
    assert f"step {LAST} scale 16384.0" in text, text
    for shard in range(2):
        assert (f"shard {shard} skipped round 6: worker 1 reported an "
                "overflow") in text, text
    assert "skipped round 7" not in text and "lease" not in text, text
    assert max_diff(final(out), uninterrupted[0]) > 0
