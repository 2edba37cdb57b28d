"""The docs checker (check_docs.py) on small trees made here: each check
passes what is right and names what is wrong."""
import os
import subprocess
import sys

import pytest

CHECKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_docs.py")


def run(root, *files):
    p = subprocess.run([sys.executable, CHECKER, "--root", str(root)] +
                       [str(root / f) for f in files],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    return p.returncode, p.stdout


@pytest.fixture
def tree(tmp_path):
    results = tmp_path / "tests" / "bench" / "results"
    results.mkdir(parents=True)
    (results / "fidelity.json").write_text('[{"name": "adam", "test_accuracy": 0.8794}]\n')
    (results / "fidelity.md").write_text("| adam | 87.94 | 3.46x |\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n\n## Two words\n\ntext\n")
    return tmp_path


def write(tree, name, text):
    (tree / name).write_text(text)
    return name


def test_figures_found_in_the_named_file_pass(tree):
    doc = write(tree, "README.md",
                "# x\n\nAdam reaches 87.94 at 3.46x less "
                "([fidelity.md](tests/bench/results/fidelity.md)).\n\n"
                "From `tests/bench/results/fidelity.json`: 87.9 and 87.94%.\n")
    code, out = run(tree, doc)
    assert code == 0, out


def test_a_figure_missing_from_the_named_file_fails(tree):
    doc = write(tree, "README.md",
                "# x\n\nAdam reaches 87.95 ([r](tests/bench/results/fidelity.md)).\n")
    code, out = run(tree, doc)
    assert code == 1 and "README.md:3: figure 87.95" in out, out


def test_a_results_file_in_a_subfolder_is_a_source_too(tree):
    """A table kept in a folder of its own (results/lm_long/) names its
    figures as a top-level one does, and a figure found in neither file
    fails."""
    long = tree / "tests" / "bench" / "results" / "long"
    long.mkdir()
    (long / "table.md").write_text("| h80 | 1.2799 | +0.14% |\n")
    doc = write(tree, "README.md",
                "# x\n\nAdam 87.94 ([a](tests/bench/results/fidelity.md)), "
                "local steps +0.14% ([b](tests/bench/results/long/table.md)).\n")
    code, out = run(tree, doc)
    assert code == 0, out
    doc = write(tree, "README.md",
                "# x\n\nLocal steps 1.2798 "
                "([b](tests/bench/results/long/table.md)).\n")
    code, out = run(tree, doc)
    assert code == 1 and ("figure 1.2798 is in none of "
                          "tests/bench/results/long/table.md") in out, out
    # A folder beside results/ whose name starts the same is not results.
    other = tree / "tests" / "bench" / "results-old"
    other.mkdir()
    (other / "table.md").write_text("| h80 | 1.2798 |\n")
    doc = write(tree, "README.md",
                "# x\n\nLocal steps 1.2798 "
                "([b](tests/bench/results-old/table.md)).\n")
    code, out = run(tree, doc)
    assert code == 1 and "figure 1.2798: its block names no results file" \
        in out, out


def test_the_readme_must_name_a_source_for_every_figure(tree):
    doc = write(tree, "README.md", "# x\n\nIt is 12.1x smaller.\n\n`--lr 0.001` is fine in code.\n")
    code, out = run(tree, doc)
    assert code == 1 and "figure 12.1: its block names no results file" in out, out
    assert "0.001" not in out, out


def test_other_docs_check_only_blocks_that_name_a_results_file(tree):
    doc = write(tree, "docs/other.md",
                "# x\n\nA decay of 0.5 is a setting.\n\n"
                "Measured 88.10 (tests/bench/results/fidelity.md).\n")
    code, out = run(tree, doc)
    assert code == 1 and "figure 88.10" in out and "0.5" not in out, out


def test_a_table_is_named_by_its_caption(tree):
    doc = write(tree, "docs/other.md",
                "# x\n\nFrom [the table](../tests/bench/results/fidelity.md):\n"
                "\n| run | acc |\n|---|---|\n| adam | 87.94 |\n| onebit | 87.11 |\n")
    code, out = run(tree, doc)
    assert code == 1 and "other.md:8: figure 87.11" in out and "87.94" not in out, out


def test_figures_in_fenced_code_are_not_checked(tree):
    doc = write(tree, "README.md", "# x\n\n```\nwall time 22.1 s\n```\n")
    code, out = run(tree, doc)
    assert code == 0, out


def test_links_to_missing_files_and_headings_fail(tree):
    doc = write(tree, "README.md",
                "# x\n\nSee [guide](docs/guide.md#two-words) and [top](#x).\n\n"
                "See [gone](docs/gone.md) and [bad](docs/guide.md#three-words).\n\n"
                "Web links are not checked: [site](https://example.org/a.md).\n")
    code, out = run(tree, doc)
    assert code == 1, out
    assert "README.md:5: link docs/gone.md: no such file" in out, out
    assert "no heading #three-words" in out, out
    assert "two-words" not in out.replace("three-words", ""), out
