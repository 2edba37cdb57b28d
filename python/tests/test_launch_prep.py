"""What python3 -m pserver.launch checks and prepares before it starts
anything (pserver/_launch_prep.py): --checkpoint-dir gives each shard its
own folder and the same command resumes a stopped job (real shards and
workers, 2 and 3 shards); a folder of another layout or job is refused with
one line, exit 2, nothing started; OMP_NUM_THREADS as torchrun sets it; a
script interpreter without the extension is refused with the build
command."""

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch

from conftest import server_binary
# kill_leftovers: the autouse fixture, for this module's runs too.
from test_launch import (PACKAGE_ROOT, alive, kill_leftovers,  # noqa: F401
                         launcher, no_process_left, started_pids)

HERE = pathlib.Path(__file__).resolve().parent
RESUME_WORKER = str(HERE / "resume_worker.py")
ENV_WORKER = str(HERE / "env_worker.py")


def job_args(ckpt, out, shards, total, stop_at):
    """One command line, the same for the first start and every resume."""
    return ["--shards", str(shards), "--workers", "2", "--optimizer", "adam",
            "--pull-codec=fp32", "--checkpoint-dir", str(ckpt),
            "--checkpoint_every=1", RESUME_WORKER, str(out), str(total),
            str(stop_at)]


def wait_until_stopped(p, out, workers=2):
    deadline = time.monotonic() + 120
    while not all((out / f"rank{r}.stopped").exists()
                  for r in range(workers)):
        assert p.poll() is None, p.communicate()[0].decode()
        assert time.monotonic() < deadline, "the job never reached STOP_AT"
        time.sleep(0.05)


def load(out, name):
    return torch.load(out / name)


def same_weights(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def run_to_end(run_dir, *args):
    p = launcher(run_dir, *args)
    text = p.communicate(timeout=120)[0].decode()
    assert p.returncode == 0, text
    no_process_left(run_dir)
    return text


def check_resumed(text, run_dir, ckpt, out, shards, step, weights):
    """Every shard restored `step` from its own folder, and every worker
    started there with `weights`."""
    assert (f"launch: checkpoints in {ckpt}/shard-<i> for shard i; " +
            ", ".join(f"shard {i} step {step}" for i in range(shards))
            ) in text, text
    for i in range(shards):
        log = (run_dir / f"shard{i}.log").read_text()
        assert f"restored step {step} from {ckpt}/shard-{i}\n" in log, log
    for rank in range(2):
        start = load(out, f"rank{rank}.start.pt")
        assert start["step"] == step
        assert same_weights(start["weights"], weights), (start, weights)


def test_a_job_stopped_by_sigterm_resumes_with_the_same_command(tmp_path):
    """2 shards: a second job in the folder is refused while the first
    runs; SIGTERM to the first (as Ctrl-C) at step 5, the same command
    again: the shards restore step 5 and its weights from
    <dir>/shard-<i>, the job ends at step 8 with an uninterrupted run's
    weights (Adam's moments came back too), and a third start of the ended
    job begins at its last step."""
    run_dir, out, ckpt = tmp_path / "run", tmp_path / "out", tmp_path / "ck"
    out.mkdir()
    args = job_args(ckpt, out, shards=2, total=8, stop_at=5)
    p = launcher(run_dir, *args)
    wait_until_stopped(p, out)
    second = launcher(tmp_path / "second_run", *args)  # while it runs
    try:
        text = second.communicate(timeout=60)[0].decode()
    finally:
        if second.poll() is None:  # started a job: stop it
            second.terminate()
            second.communicate(timeout=60)
    assert second.returncode == 2, text
    assert text == (f"launch: error: --checkpoint-dir {ckpt} is in use by a "
                    "running job (its launcher or its shards); stop it "
                    "first, or give another folder\n"), text
    assert not (tmp_path / "second_run" / "pids").exists()
    p.send_signal(signal.SIGTERM)
    text = p.communicate(timeout=60)[0].decode()
    assert p.returncode == 143, text
    assert ("launch: checkpoints in " f"{ckpt}/shard-<i> for shard i; "
            "shard 0 fresh, shard 1 fresh") in text, text
    no_process_left(run_dir)
    assert json.loads((ckpt / "job.json").read_text()) == {"shards": 2,
                                                           "workers": 2}
    assert sorted(os.listdir(ckpt)) == ["job.json", "shard-0", "shard-1"]
    at_stop = load(out, "step5.pt")["weights"]

    text = run_to_end(run_dir, *args)
    check_resumed(text, run_dir, ckpt, out, 2, 5, at_stop)
    end = load(out, "rank0.end.pt")
    assert end["step"] == 8

    whole_out = tmp_path / "whole"
    whole_out.mkdir()
    run_to_end(tmp_path / "whole_run", *job_args(
        tmp_path / "whole_ck", whole_out, shards=2, total=8, stop_at=0))
    assert same_weights(load(whole_out, "rank0.end.pt")["weights"],
                        end["weights"])

    text = run_to_end(run_dir, *args)  # the ended job: its final checkpoint
    check_resumed(text, run_dir, ckpt, out, 2, 8, end["weights"])


def test_a_job_whose_launcher_was_killed_resumes(tmp_path):
    """3 shards: the launcher SIGKILLed at step 4 (its children get SIGTERM
    and write their final checkpoints); the same command resumes at 4."""
    run_dir, out, ckpt = tmp_path / "run", tmp_path / "out", tmp_path / "ck"
    out.mkdir()
    args = job_args(ckpt, out, shards=3, total=6, stop_at=4)
    p = launcher(run_dir, *args)
    wait_until_stopped(p, out)
    p.kill()
    p.communicate(timeout=30)
    pids = started_pids(run_dir)
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in pids.values()):
        assert time.monotonic() < deadline, pids
        time.sleep(0.05)
    at_stop = load(out, "step4.pt")["weights"]
    text = run_to_end(run_dir, *args)
    check_resumed(text, run_dir, ckpt, out, 3, 4, at_stop)
    assert load(out, "rank1.end.pt")["step"] == 6


def test_every_spelling_of_the_flag_is_the_launchers():
    from pserver.launch import parse_args
    for spelling in (["--checkpoint-dir", "D"], ["--checkpoint_dir", "D"],
                     ["--checkpoint-dir=D"], ["--checkpoint_dir=D"]):
        opts = parse_args([*spelling, RESUME_WORKER, "out", "1"])
        assert opts["checkpoint_dir"] == "D", spelling
        assert opts["server_flags"] == [], spelling


def write_files(root, files):
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if text is None:
            path.mkdir()
        else:
            path.write_text(text)


@pytest.mark.parametrize("files,message", [
    ({"ckpt-00000000000000000003.pserver": "x"},
     "holds checkpoint files itself (ckpt-00000000000000000003.pserver): a "
     "shard's own folder, or one every shard wrote into; the launcher keeps "
     "shard i's in <folder>/shard-<i>: give it a new folder"),
    ({"shard-0": None, "shard-1": None, "shard-2": None},
     "holds shard-2/, a folder of a job with more than 2 shards (this one "
     "has shard-0..shard-1); give this job another folder"),
    ({"job.json": '{"shards": 3, "workers": 2}\n'},
     "the job in this folder has 3 shards and 2 workers, this one 2 shards "
     "and 2 workers; resume it with --shards 3 --workers 2, or give another "
     "--checkpoint-dir"),
    ({"job.json": '{"shards": 2, "workers": 4}\n', "shard-0": None},
     "the job in this folder has 2 shards and 4 workers, this one 2 shards "
     "and 2 workers; resume it with --shards 2 --workers 4"),
    ({"job.json": '{"shards": 2}'}, "job.json is not a pserver.launch job "
     "file ({'shards': 2}); expected {\"shards\": N, \"workers\": N}"),
    ({}, "is not a folder"),
])
def test_another_layout_or_job_is_refused_before_anything_starts(
        tmp_path, files, message):
    ckpt = tmp_path / "ck"
    if files:
        ckpt.mkdir()
        write_files(ckpt, files)
    else:
        ckpt.write_text("a file")
    before = sorted(p.name for p in tmp_path.rglob("*"))
    p = launcher(tmp_path / "run", "--shards", "2", "--workers", "2",
                 "--checkpoint-dir", str(ckpt), RESUME_WORKER,
                 str(tmp_path), "3")
    text = p.communicate(timeout=60)[0].decode()
    assert p.returncode == 2, text
    assert text.count("\n") == 1 and text.startswith("launch: error: "), text
    assert message in text, text
    assert str(ckpt) in text, text
    assert not (tmp_path / "run" / "pids").exists()
    after = sorted(p.name for p in tmp_path.rglob("*") if p.parent.name !=
                   "run" and p.name != "run")
    assert after == before


def env_run(tmp_path, workers, **env):
    """A launcher run of env_worker.py with the caller's environment `env`
    on top of this one's, OMP_NUM_THREADS removed; returns (output, what
    each rank saw)."""
    out = tmp_path / "out"
    out.mkdir()
    base = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    base["PYTHONPATH"] = os.pathsep.join(
        [PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")])
    p = subprocess.run(
        [sys.executable, "-m", "pserver.launch", "--server-bin",
         server_binary(), "--run-dir", str(tmp_path / "run"), "--shards",
         "1", "--workers", str(workers), ENV_WORKER, str(out),
         "OMP_NUM_THREADS"], env={**base, **env}, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, timeout=120)
    text = p.stdout.decode()
    assert p.returncode == 0, text
    return text, [json.loads((out / f"rank{r}.json").read_text())
                  ["OMP_NUM_THREADS"] for r in range(workers)]


@pytest.mark.parametrize("workers,given,seen", [
    (3, None, "1"), (2, "3", "3"), (1, None, None)])
def test_omp_num_threads_is_set_as_torchrun_sets_it(tmp_path, workers,
                                                    given, seen):
    """torchrun (torch/distributed/run.py) sets OMP_NUM_THREADS=1 with a
    notice when more than one process runs and the caller set none."""
    text, ranks = env_run(tmp_path, workers, **(
        {} if given is None else {"OMP_NUM_THREADS": given}))
    assert ranks == [seen] * workers, text
    notice = (f"launch: OMP_NUM_THREADS=1 for each of the {workers} workers "
              "(unset, as torchrun sets it; set it to choose another value)")
    assert (notice in text) == (given is None and workers > 1), text


@pytest.mark.parametrize("arrangement", ["package", "script", "python"])
def test_no_extension_for_the_script_is_one_line(tmp_path, arrangement):
    """"package": the launcher from a package folder without the extension
    (a source tree, or a build of the daemons only); "script": a script
    beside such a folder (a script puts its own folder first on sys.path,
    where the launcher's built package then goes unseen); "python": a
    script interpreter that does not see PYTHONPATH (-I). All exit 2
    naming what failed and how to build it, with nothing started. The
    launcher runs in tmp_path: `-m` would take a pserver in its cwd."""
    env = dict(os.environ, PYTHONPATH=PACKAGE_ROOT)
    python = sys.executable
    script = ENV_WORKER
    if arrangement in ("package", "script"):
        (tmp_path / "pkg" / "pserver").mkdir(parents=True)
        for f in (pathlib.Path(PACKAGE_ROOT) / "pserver").glob("*.py"):
            shutil.copy(f, tmp_path / "pkg" / "pserver")
        if arrangement == "package":
            env["PYTHONPATH"] = str(tmp_path / "pkg")
        else:
            script = shutil.copy(ENV_WORKER, tmp_path / "pkg")
        why = "ModuleNotFoundError: No module named 'pserver._native'"
    else:
        python = tmp_path / "isolated-python"
        python.write_text(f'#!/bin/sh\nexec {sys.executable} -I "$@"\n')
        python.chmod(0o755)
        why = "ModuleNotFoundError: No module named 'pserver'"
    p = subprocess.run(
        [sys.executable, "-m", "pserver.launch", "--server-bin",
         server_binary(), "--run-dir", str(tmp_path / "run"), "--python",
         str(python), str(script), str(tmp_path)], env=env, cwd=tmp_path,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    text = p.stdout.decode()
    assert p.returncode == 2 and text.count("\n") == 1, text
    assert text == (f"launch: error: {python} cannot import pserver._native,"
                    f" the extension the workers need ({why}; PYTHONPATH="
                    f"{env['PYTHONPATH']}); build it from the repository's "
                    "root: cmake -S . -B build -DPSERVER_BUILD_PYTHON=ON && "
                    "cmake --build build --target pserver_python, then run "
                    "with PYTHONPATH=build/python\n"), text
    assert not (tmp_path / "run" / "pids").exists()
