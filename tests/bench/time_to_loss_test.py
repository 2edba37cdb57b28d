"""Tests of tests/bench/time_to_loss.py's plan and report on hand-made runs
(no namespaces, no training): what a run's spec is, how arrivals, speed-ups
and verdicts are read, the two step floors, and the report's table.

  PYTHONPATH=python /usr/bin/python3 -m pytest -q tests/bench/time_to_loss_test.py

The pserver rows' specs take the launcher's flag spelling from
pserver.launch, which imports without the extension: the source tree's
python/ is enough, and a missing launcher fails these tests.
"""

import json
import pathlib
import shutil
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import time_to_loss as ttl  # noqa: E402

RATES = "100mbit:100000000:65536"


def args_for(work, runs, repeats=1, out=None):
    argv = ["plan" if out is None else "report", "--work", str(work),
            "--rates", RATES, "--runs", " ".join(runs), "--repeats",
            str(repeats), "--cap", "1500", "--eval-every", "100",
            "--tbf-latency", "50ms", "--reference", "unused",
            "--target", "1.6"]
    if out is not None:
        argv += ["--out", str(out)]
    return ttl.parse(argv)


def test_arrivals_order_reached_before_capped_before_never():
    assert ttl.median_arrival([(300, "reached"), (10, "never"),
                               (100, "reached")]) == (300, "reached")
    assert ttl.median_arrival([(50, "never"), (90, "capped"),
                               (200, "reached")]) == (90, "capped")
    # Two runs: the mean of the two, as late as the later one is known.
    assert ttl.median_arrival([(100, "reached"), (300, "reached")]) == \
        (200, "reached")
    assert ttl.median_arrival([(100, "reached"), (40, "never")])[1] == "never"


def test_speedup_and_verdict():
    base = (1000.0, "reached")
    assert ttl.speedup(base, (200.0, "reached")) == (5.0, "=")
    assert ttl.verdict((5.0, "="), 5) == "met"
    assert ttl.verdict((4.3, "="), 5) == "MISSED"
    # The row never reaches: zero, a miss whatever the goal.
    assert ttl.speedup(base, (2000.0, "never")) == (0.0, "zero")
    assert ttl.verdict((0.0, "zero"), 5) == "MISSED"
    # The baseline stopped at the cap: the ratio is a lower bound.
    x = ttl.speedup((1500.0, "capped"), (500.0, "reached"))
    assert x == (3.0, ">=")
    assert ttl.verdict(x, 2) == "met" and ttl.verdict(x, 5) == "not decided"
    assert ttl.speedup((100.0, "never"), (50.0, "reached"))[1] == "inf"


def fake_result(row, seed, reached_at, steps, link_bytes, cpu, layout=None,
                rate_bps=100e6):
    """A result.json as collect() writes it, with only what the report
    reads."""
    recipe = {"kind": "ddp" if row.startswith("ddp") else "ps"}
    if layout:
        recipe["layout"] = layout
    train = reached_at if reached_at else 2 * steps
    return {"spec": {"row": row, "rate": "100mbit", "rate_bps": rate_bps,
                     "seed": seed, "cap_seconds": 1500, "recipe": recipe},
            "environment": {"cpu": "test", "cores": 2, "torch": "x",
                            "openblas_coretype": "x", "commit": "x"},
            "reached": reached_at is not None, "stopped": None,
            "time_to_target": reached_at, "train_seconds": train,
            "steps_done": steps, "step_seconds": train / steps,
            "final_val_loss": 1.6, "val_curve": [[steps, 1.6, train]],
            "link_bytes": link_bytes,
            "busiest_link": {"host": "w0", "way": "out",
                             "bytes": max(max(v.values())
                                          for v in link_bytes.values())},
            "cpu": {p: {"per_step": v} for p, v in cpu.items()},
            "client_stats": {}}


def write_run(a, work, row, seed, reached_at, cpu):
    """A run of row and seed at 100 Mbit/s in work, as the benchmark
    leaves it: 2000 steps, 200 MB out of w0, the spec a's plan would
    give."""
    rd = work / "100mbit" / row / str(seed)
    rd.mkdir(parents=True)
    r = fake_result(row, seed, reached_at, 2000,
                    {"w0": {"in": 1e8, "out": 2e8}}, cpu)
    r["spec"] = ttl.spec(a, row, a.rates[0], seed, 1.6)
    (rd / "result.json").write_text(json.dumps(r))


def read_report(out):
    """(markdown, JSON, the JSON's 100mbit rows by name) of a report."""
    doc = json.loads((out / "time_to_loss.json").read_text())
    return ((out / "time_to_loss.md").read_text(), doc,
            {r["row"]: r for r in doc["rates"]["100mbit"]["rows"]})


def test_step_costs_wire_is_the_busiest_direction_rank0_not_counted():
    r = fake_result("ps_onebit", 1, 100.0, 1000,
                    {"s0": {"in": 5e6, "out": 25e6},
                     "w0": {"in": 12.5e6, "out": 1e6}},
                    {"s0": 0.01, "w0": 0.5, "w1": 0.04, "w2": 0.05,
                     "w3": 0.06})
    wire, cpu = ttl.step_costs(r)
    # 25 MB over 1000 steps at 12.5 MB/s.
    assert wire == pytest.approx(25e6 / 1000 / 12.5e6)
    # Rank 0 (0.5, its evaluations) counts as the median other worker.
    assert cpu == pytest.approx((0.01 + 0.05 + 0.04 + 0.05 + 0.06) / 2)
    # With more cores than work, the busiest process bounds the step.
    r["environment"]["cores"] = 64
    assert ttl.step_costs(r)[1] == pytest.approx(0.06)


def test_spec_of_a_colocated_row_names_its_layout_and_shards(tmp_path):
    a = args_for(tmp_path, ["ps_onebit", "ps_onebit_colocated"])
    rate = a.rates[0]
    dedicated = ttl.spec(a, "ps_onebit", rate, 1, 1.6)
    colocated = ttl.spec(a, "ps_onebit_colocated", rate, 1, 1.6)
    # A dedicated row's spec is what it was before layouts existed, so its
    # runs are still reused.
    assert "layout" not in dedicated["recipe"]
    assert dedicated["recipe"]["shards"] == 2
    # Nor does a dedicated spec gain a key: the committed runs' specs have
    # exactly these.
    assert set(dedicated) == {"row", "rate", "rate_bps", "burst",
                              "tbf_latency", "seed", "target", "cap_seconds",
                              "recipe", "server_flags", "worker_args"}
    assert set(dedicated["recipe"]) == {"row", "kind", "common", "workers",
                                        "shards", "shard_flags",
                                        "script_flags"}
    assert colocated["recipe"]["layout"] == "colocated"
    assert colocated["recipe"]["shards"] == 4
    # The same recipe otherwise.
    assert colocated["server_flags"] == dedicated["server_flags"]
    assert colocated["worker_args"] == dedicated["worker_args"]


def test_plan_prints_the_layout_of_each_run(tmp_path, capsys):
    a = args_for(tmp_path, ["ddp_fp32", "ps_topk_colocated"])
    ttl.plan(a)
    lines = [ln.split() for ln in capsys.readouterr().out.splitlines()]
    assert [ln[:5] for ln in lines] == [
        ["1", "100mbit", "ddp_fp32", "ddp", "dedicated"],
        ["1", "100mbit", "ps_topk_colocated", "ps", "colocated"]]
    rd = pathlib.Path(lines[1][5])
    assert (rd / "shard.args").read_text().strip()
    assert json.loads((rd / "spec.json").read_text())["recipe"]["shards"] == 4


def test_report_reads_the_runs_it_planned(tmp_path):
    work, out = tmp_path / "runs", tmp_path / "out"
    rows = ["ddp_fp32", "ps_onebit", "ps_onebit_colocated"]
    a = args_for(work, rows, repeats=3, out=out)
    # Seconds to the target by row and seed; None: never.
    times = {"ddp_fp32": [1000, 1100, 1200], "ps_onebit": [250, 260, None],
             "ps_onebit_colocated": [190, 200, 230]}
    for row in rows:
        for seed, t in enumerate(times[row], 1):
            write_run(a, work, row, seed, t,
                      {"w0": 0.1, "w1": 0.05, "w2": 0.05, "w3": 0.05})
    assert ttl.report(a) == 0
    md, doc, got = read_report(out)
    assert got["ddp_fp32"]["median"] == [1100, "reached"]
    # One of three never reached: the median is the later of the other two.
    assert got["ps_onebit"]["median"] == [260, "reached"]
    assert got["ps_onebit_colocated"]["speedup"][0] == pytest.approx(5.5)
    # The goal is met by its best row, the co-located one.
    line = next(v for v in doc["rates"]["100mbit"]["verdicts"]
                if "5x" in v["line"])
    assert line["verdict"] == "met"
    assert line["ratio"] == pytest.approx(5.5)
    assert "| ps_onebit | 260 s | [250 s / 260 s / never] |" in md
    # Wire: 200 MB / 2000 steps at 12.5 MB/s = 0.008 s; CPU: 4 workers at
    # 0.05 s (rank 0 as the others) over 2 cores.
    assert "| 0.008 | 0.100 |" in md
    assert got["ps_onebit"]["cpu_s_per_step"] == pytest.approx(0.1)
    assert (out / "time_to_loss_100mbit.svg").exists()


def test_restore_writes_a_reports_runs_back_and_the_report_reads_them(
        tmp_path):
    """A committed report's runs, restored into an empty WORK, give the same
    report; a folder that has a result of its own is kept."""
    work, out = tmp_path / "runs", tmp_path / "out"
    rows = ["ddp_fp32", "ps_onebit"]
    a = args_for(work, rows, repeats=2, out=out)
    rate = a.rates[0]
    for row in rows:
        for seed, t in ((1, 900), (2, None)):
            rd = work / "100mbit" / row / str(seed)
            rd.mkdir(parents=True)
            r = fake_result(row, seed, t, 2000, {"w0": {"in": 1e8, "out": 2e8}},
                            {"w0": 0.1, "w1": 0.05})
            r["spec"] = ttl.spec(a, row, rate, seed, 1.6)
            (rd / "result.json").write_text(json.dumps(r))
    assert ttl.report(a) == 0
    first = (out / "time_to_loss.md").read_text()

    again = tmp_path / "again"
    mine = again / "100mbit" / "ps_onebit" / "2"
    mine.mkdir(parents=True)
    kept = fake_result("ps_onebit", 2, 300, 2000, {"w0": {"in": 1, "out": 1}},
                       {"w0": 0.1, "w1": 0.05})
    kept["spec"] = ttl.spec(a, "ps_onebit", rate, 2, 1.6)
    (mine / "result.json").write_text(json.dumps(kept))
    ttl.restore(ttl.parse(["restore", "--work", str(again), "--source",
                           str(out / "time_to_loss.json")]))
    assert json.loads((mine / "result.json").read_text()) == kept
    (mine / "result.json").unlink()
    ttl.restore(ttl.parse(["restore", "--work", str(again), "--source",
                           str(out / "time_to_loss.json")]))
    b = args_for(again, rows, repeats=2, out=tmp_path / "out2")
    assert ttl.report(b) == 0
    second = (tmp_path / "out2" / "time_to_loss.md").read_text()
    assert second.replace(str(again), "W") == first.replace(str(work), "W")


def test_a_row_whose_runs_come_from_machines_of_different_speed_is_marked(
        tmp_path):
    work, out = tmp_path / "runs", tmp_path / "out"
    rows = ["ddp_fp32", "ps_onebit", "ps_topk"]
    a = args_for(work, rows, repeats=2, out=out)
    # The workers' CPU seconds per step by row and seed (w1..w3; rank 0's
    # evaluations do not count): ps_topk's second run is 1.5x faster, ddp's
    # and ps_onebit's runs differ by 1.1x.
    speed = {"ddp_fp32": [0.05, 0.055], "ps_onebit": [0.04, 0.044],
             "ps_topk": [0.045, 0.03]}
    for row in rows:
        for seed, w in enumerate(speed[row], 1):
            write_run(a, work, row, seed,
                      1000 if row == "ddp_fp32" else 200,
                      {"w0": 0.5, "w1": w, "w2": w, "w3": w})
    assert ttl.report(a) == 0
    md, doc, got = read_report(out)
    assert got["ps_topk"]["machine_spread"] == pytest.approx([1.5, 0.03,
                                                              0.045])
    assert got["ddp_fp32"]["machine_spread"][0] == pytest.approx(1.1)
    assert "| ps_topk * | 200 s |" in md
    assert "| ps_onebit | 200 s |" in md and "| ddp_fp32 | 1000 s |" in md
    assert "ps_topk 0.030 to 0.045 s, 1.50x" in md
    assert "ps_onebit 0." not in md
    # The 5x goal names ps_onebit and the baseline, neither marked: no note.
    line = next(v["line"] for v in doc["rates"]["100mbit"]["verdicts"]
                if "5x" in v["line"])
    assert "different speed" not in line
    # A marked baseline puts the note on every goal that compares with it.
    r = json.loads((work / "100mbit/ddp_fp32/2/result.json").read_text())
    r["cpu"]["w1"]["per_step"] = r["cpu"]["w2"]["per_step"] = 0.08
    (work / "100mbit/ddp_fp32/2/result.json").write_text(json.dumps(r))
    ttl.report(a)
    doc = json.loads((out / "time_to_loss.json").read_text())
    line = next(v["line"] for v in doc["rates"]["100mbit"]["verdicts"]
                if "5x" in v["line"])
    assert "(runs of ddp_fp32 from machines of different speed" in line


def test_missing_and_failed_runs_are_listed_with_their_folders(tmp_path):
    work, out = tmp_path / "runs", tmp_path / "out"
    a = args_for(work, ["ddp_fp32", "ps_onebit"], repeats=2, out=out)
    cpu = {"w0": 0.1, "w1": 0.05, "w2": 0.05, "w3": 0.05}
    for seed in (1, 2):
        write_run(a, work, "ddp_fp32", seed, 1000, cpu)
    write_run(a, work, "ps_onebit", 1, 200, cpu)
    # Seed 2 of ps_onebit started (its spec is written) and died.
    failed = (work / "100mbit" / "ps_onebit" / "2").resolve()
    failed.mkdir(parents=True)
    (failed / "spec.json").write_text("{}")
    # The report is written without the run, and says so by its exit code.
    assert ttl.report(a) == 1
    md, _, got = read_report(out)
    assert got["ps_onebit"]["median"] == [200, "reached"]
    # A WORK outside the repository is named by its absolute path, not as
    # ../../tmp/...
    assert (f"- 100mbit ps_onebit seed 2: failed, see its logs ({failed})"
            in md)
    shutil.rmtree(failed)
    assert ttl.report(a) == 1
    assert f"seed 2: not run ({failed})" in read_report(out)[0]
    # Inside the repository the path is relative to it.
    assert ttl.shown(ttl.lmf.ROOT / "tests" / "bench") == "tests/bench"


def test_curves_across_rates_compare_the_steps_every_run_evaluated():
    def run(row, seed, curve):
        return {"spec": {"row": row, "seed": seed},
                "val_curve": [[s, loss, 10.0 * s] for s, loss in curve]}
    one = [(100, 2.5), (200, 2.1)]
    results = [
        run("ps_onebit", 1, one),
        # The same losses at another rate, stopped a step sooner (the cap)
        # and at other seconds: the same training.
        run("ps_onebit", 1, one[:1]),
        run("ps_onebit", 2, one),
        run("ps_onebit", 2, [(100, 2.5), (200, 2.1000001)]),
        # At one rate only: not compared.
        run("ddp_fp32", 1, one)]
    assert ttl.curves_across_rates(results) == {
        "pairs": 2, "same": 1, "differ": ["ps_onebit seed 2"]}
