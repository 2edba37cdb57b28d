"""tests/bench/provenance.py: a dirty tree is refused unless allowed, and a
table's provenance line says when runs came from uncommitted code or from
machines of different speed.

  /usr/bin/python3 -m pytest -q tests/bench/provenance_test.py
"""

import pathlib
import subprocess
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import provenance  # noqa: E402


def git(repo, *args):
    subprocess.run(["git", "-C", str(repo), *args], check=True,
                   capture_output=True)


@pytest.fixture
def repo(tmp_path):
    git(tmp_path, "init", "-q")
    git(tmp_path, "config", "user.email", "t@example.com")
    git(tmp_path, "config", "user.name", "t")
    (tmp_path / "a.txt").write_text("one\n")
    git(tmp_path, "add", "a.txt")
    git(tmp_path, "commit", "-q", "-m", "one")
    return tmp_path


def test_a_dirty_tree_is_refused_unless_allowed(repo):
    provenance.require_clean(False, "bench", root=repo)  # clean: no exit
    (repo / "untracked.txt").write_text("not part of the tree\n")
    provenance.require_clean(False, "bench", root=repo)
    (repo / "a.txt").write_text("two\n")
    with pytest.raises(SystemExit) as e:
        provenance.require_clean(False, "bench", root=repo)
    assert "bench: the tree at" in str(e.value)
    assert "uncommitted changes (a.txt); commit them, or pass " \
        "--allow-dirty" in str(e.value)
    provenance.require_clean(True, "bench", root=repo)  # allowed
    commit, changed = provenance.tree(repo)
    assert len(commit) == 12 and changed == ["a.txt"]


def test_the_table_line_says_dirty_runs_and_mixed_machines():
    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] /
                           "python" / "examples"))
    import lm_fidelity
    env = {"cpu": "AMD EPYC", "cores": 2, "torch": "1.13",
           "openblas_coretype": "Haswell"}
    runs = [dict(env, commit="abc", dirty=False, calibration_seconds=0.050),
            dict(env, commit="abc-dirty", calibration_seconds=0.052),
            dict(env, commit="def", dirty=True, calibration_seconds=0.060)]
    line = lm_fidelity.machine_line(runs)
    assert "commit abc, abc-dirty, def (2 of 3 runs from a tree with " \
        "uncommitted changes)" in line, line
    assert "calibration 0.050 to 0.060 s; the runs mix machines of " \
        "different speed (1.20x)" in line, line
    same = lm_fidelity.machine_line(runs[:2])
    assert "mix machines" not in same and "(1 of 2 runs" in same, same
    old = lm_fidelity.machine_line([dict(env, commit="abc")])
    assert old.endswith("no calibration recorded (runs before it "
                        "existed)."), old


def test_the_calibration_is_a_positive_time():
    assert provenance.calibration() > 0
    assert provenance.record()["calibration_seconds"] > 0
