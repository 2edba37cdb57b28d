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
    (results / "README.md").write_text("# Results\n")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "guide.md").write_text("# Guide\n\n## Two words\n\ntext\n")
    return tmp_path


def write(tree, name, text):
    (tree / name).write_text(text)
    return name


def test_a_figure_matches_its_key_at_the_precision_shown(tree):
    doc = write(tree, "README.md",
                "# x\n\nAdam reaches 87.94<!--@fidelity.json 0.test_accuracy * 100-->"
                " or 88<!--@fidelity.json 0.test_accuracy * 100-->, "
                "0.88<!--@fidelity.json [name=adam].test_accuracy-->, "
                "+0.02<!--@fidelity.json 0.9 - 0.test_accuracy-->.\n")
    code, out = run(tree, doc)
    assert code == 0, out


def test_a_wrong_figure_fails_naming_its_key(tree):
    doc = write(tree, "README.md",
                "# x\n\nAdam reaches 87.95<!--@fidelity.json 0.test_accuracy * 100-->.\n")
    code, out = run(tree, doc)
    assert code == 1, out
    assert ("README.md:3: figure 87.95: fidelity.json 0.test_accuracy * 100 "
            "gives 87.94 (87.94 at the precision shown)") in out, out


@pytest.mark.parametrize("source, good, bad, named", [
    # Integers are checked when annotated.
    ('{"seconds": 1057.4, "n": 318}',
     "In 1057<!--@r.json seconds--> s, 318<!--@r.json n--> files.",
     "319<!--@r.json n--> files.", "figure 319"),
    # A sign written is compared; without one, the magnitude.
    ('{"gap": -0.85}', "-0.85%<!--@r.json gap--> or 0.85%<!--@r.json gap--> below.",
     "+0.85%<!--@r.json gap-->.", "figure +0.85"),
])
def test_integers_and_signs(tree, source, good, bad, named):
    (tree / "tests/bench/results/r.json").write_text(source)
    assert run(tree, write(tree, "README.md", "# x\n\n%s\n" % good))[0] == 0
    code, out = run(tree, write(tree, "README.md", "# x\n\n%s\n" % bad))
    assert code == 1 and named in out, out


def test_a_default_file_holds_until_the_next_heading(tree):
    doc = write(tree, "docs/other.md",
                "# x\n\n<!--@@ fidelity.json-->\n\n"
                "It is 87.94<!--@0.test_accuracy * 100-->.\n\n## y\n\n"
                "It is 87.94<!--@0.test_accuracy * 100-->.\n")
    code, out = run(tree, doc)
    assert code == 1 and "other.md:9: figure 87.94: annotation" in out \
        and "no file" in out and "other.md:5" not in out, out


def test_a_missing_key_or_file_is_named(tree):
    doc = write(tree, "README.md",
                "# x\n\nA 1.5<!--@fidelity.json 0.loss--> and "
                "2.5<!--@gone.json a-->.\n")
    code, out = run(tree, doc)
    assert code == 1, out
    assert "figure 1.5: tests/bench/results/fidelity.json has no 0.loss" in out, out
    assert "figure 2.5: no results file tests/bench/results/gone.json" in out, out


def test_strict_files_need_a_source_for_every_decimal(tree):
    doc = write(tree, "README.md", "# x\n\nIt is 12.1x smaller.\n\n"
                "`--lr 0.001` is fine in code, 4 workers need none.\n")
    code, out = run(tree, doc)
    assert code == 1 and "README.md:3: figure 12.1 names no source" in out, out
    assert "0.001" not in out and "figure 4" not in out, out


def test_other_docs_need_sources_only_where_a_block_names_results(tree):
    doc = write(tree, "docs/other.md",
                "# x\n\nA decay of 0.5 is a setting.\n\n"
                "Measured 88.10 (tests/bench/results/fidelity.md).\n")
    code, out = run(tree, doc)
    assert code == 1 and "other.md:5: figure 88.10 names no source" in out \
        and "0.5" not in out, out


def test_a_sourced_table_is_compared_cell_by_cell(tree):
    (tree / "tests/bench/results/t.md").write_text(
        "| run | acc | ratio |\n|---|---|---|\n| adam 0.9 | 87.94 ± 0.40 | 1.0x |\n"
        "| onebit | 87.60 ± 0.36 | 16.9x |\n")
    table = ("| run | acc | ratio |\n|---|---|---|\n| adam 0.9 | 87.94 ± 0.40 | 1.0x |\n"
             "| onebit | %s | 16.9x |\n")
    ok = write(tree, "README.md", "# x\n\n<!--@@table t.md-->\n\n" + table % "87.60 ± 0.36")
    assert run(tree, ok)[0] == 0, run(tree, ok)[1]
    bad = write(tree, "README.md", "# x\n\n<!--@@table t.md-->\n\n" + table % "87.60 ± 0.37")
    code, out = run(tree, bad)
    assert code == 1 and "README.md:8: table cell 'onebit' / 'acc'" in out, out
    # The source names the block right below it only: a later table is
    # unsourced, and in README.md its decimals fail.
    later = write(tree, "README.md", "# x\n\n<!--@@table t.md-->\n\ntext\n\n" + table % "87.60")
    code, out = run(tree, later)
    assert code == 1 and "figure 87.60 names no source" in out, out


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


def perturbed(text, line, start, end):
    """The text with the figure at (line, start..end) moved by one unit of
    its last digit."""
    lines = text.split("\n")
    row = lines[line - 1]
    figure = row[start:end]
    sign = figure[0] if figure[0] in "+-" else ""
    digits = figure[len(sign):]
    decimals = len(digits.split(".")[1]) if "." in digits else 0
    moved = "%.*f" % (decimals, float(digits) + 10 ** -decimals)
    lines[line - 1] = row[:start] + sign + moved + row[end:]
    return "\n".join(lines)


def test_every_figure_of_the_front_page_and_the_results_fails_when_moved():
    """The self-test of issue 49: each checked figure of README.md, the
    results README and docs/benchmarks.md, moved by one unit of its last
    digit, must fail the check."""
    sys.path.insert(0, os.path.dirname(CHECKER))
    import check_docs
    root = os.path.normpath(os.path.join(os.path.dirname(CHECKER), "..", ".."))
    checker = check_docs.Checker(root)
    passed, total = [], 0
    for name in check_docs.STRICT:
        doc = os.path.join(root, name)
        with open(doc, encoding="utf-8") as f:
            text = f.read()
        checker.errors, checker.figures = [], []
        checker.check(doc, text)
        assert not checker.errors, checker.errors
        figures = list(checker.figures)
        total += len(figures)
        for _, line, start, end in figures:
            checker.errors, checker.figures = [], []
            checker.check(doc, perturbed(text, line, start, end))
            rel = os.path.relpath(doc, root)
            if not any(e.startswith("%s:%d:" % (rel, line)) for e in checker.errors):
                passed.append("%s:%d: %s" % (rel, line, text.split("\n")[line - 1][start:end]))
    assert total > 0
    assert not passed, "moved figures that still pass: %s" % passed
