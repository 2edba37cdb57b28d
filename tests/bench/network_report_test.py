"""Tests of tests/bench/network_report.py on hand-made runs (no namespaces,
no daemons): the CPU figures it reads (workers' per-step CPU, the shards'
process_cpu_seconds_total between the page at step DROP and the one at the
end) and the dedicated-host estimate built from them and the wire limit.

  /usr/bin/python3 -m pytest -q tests/bench/network_report_test.py
"""

import json
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
STEPS, DROP = 10, 2


def write_pserver_run(rd, cpu_per_step, shard_cpu_per_round, up=1e6, down=1e6,
                      with_drop=True):
    rd.mkdir(parents=True)
    (rd / "meta").write_text("kind=pserver\nserver_flags=--x\nworker_flags=--y\n")
    for w in range(4):
        (rd / f"w{w}.json").write_text(json.dumps({
            "step_seconds": [0.5] * STEPS, "step_push_bytes": [up] * STEPS,
            "step_pull_bytes": [down] * STEPS,
            # the slowest worker sets the figure
            "step_cpu_seconds": [cpu_per_step * (1 + w / 10)] * STEPS}))
    for s in range(2):
        page = ('pserver_server_received_payload_bytes_total{shard="%d"} %g\n'
                'pserver_server_sent_payload_bytes_total{shard="%d"} %g\n')
        end = page % (s, 2e6 * STEPS, s, 2e6 * STEPS)
        per = shard_cpu_per_round * (1 if s == 0 else 2)
        (rd / f"shard{s}.metrics").write_text(
            end + f'pserver_server_step{{shard="{s}"}} {STEPS}\n'
            f"process_cpu_seconds_total {5 + per * (STEPS - DROP)}\n")
        if with_drop:
            (rd / f"shard{s}.drop").write_text(
                f'pserver_server_step{{shard="{s}"}} {DROP}\n'
                "process_cpu_seconds_total 5\n")
    for f in ("tc.before", "tc.after"):
        n = 0 if f == "tc.before" else 1000
        (rd / f).write_text("".join(f"{h} {d} {n}\n" for h in ("s0", "s1", "w0")
                                    for d in ("in", "out")))


def write_ddp_run(rd, cpu_per_step):
    rd.mkdir(parents=True)
    (rd / "meta").write_text("kind=ddp\nhook=fp32\n")
    for r in range(4):
        (rd / f"r{r}.json").write_text(json.dumps({
            "rank": r, "world_size": 4, "hook": "fp32", "params": 1000,
            "threads": 1, "compressed_from_step": 0, "powersgd_rank": None,
            "allreduce_bytes": 4e6, "step_seconds": [0.5] * STEPS,
            "step_cpu_seconds": [cpu_per_step] * STEPS}))
    for f in ("tc.before", "tc.after"):
        n = 0 if f == "tc.before" else 1000
        (rd / f).write_text("".join(f"w{h} {d} {n}\n" for h in range(4)
                                    for d in ("in", "out")))


def report(tmp_path, runs):
    out = tmp_path / "out"
    subprocess.run([sys.executable, str(HERE / "network_report.py"),
                    "--runs_dir", str(tmp_path / "runs"), "--runs", runs,
                    "--rate", "1gbit", "--out", str(out), "--rate_bps", "1000000000",
                    "--params", "1000", "--tensors", "1", "--steps", str(STEPS),
                    "--drop", str(DROP), "--freeze_step", "4", "--burst", "65536",
                    "--k_fraction", "0.01"], check=True, capture_output=True)
    return json.loads((out / "network.json").read_text()), (out / "network.md").read_text()


def test_cpu_figures_and_the_dedicated_host_estimate(tmp_path):
    write_pserver_run(tmp_path / "runs" / "onebit", 0.02, 0.01)
    write_ddp_run(tmp_path / "runs" / "ddp_fp32", 0.05)
    doc, md = report(tmp_path, "onebit ddp_fp32")
    by = {r["name"]: r for r in doc["runs"]}
    one, ddp = by["onebit"], by["ddp_fp32"]
    assert abs(one["worker_cpu_seconds_per_step"] - 0.026) < 1e-9  # worker 3
    assert abs(one["shard_cpu_seconds_per_round"] - 0.02) < 1e-9   # shard 1
    # onebit: a shard link carries half of 4 x (1 + 1) MB a step = 4 MB:
    # 0.032 s at 1 Gbit/s; overlapped the largest part, sequential the sum.
    assert abs(one["wire_limit_seconds"] - 0.032) < 1e-9
    lo, hi = one["dedicated_estimate_seconds"]
    assert abs(lo - 0.032) < 1e-9 and abs(hi - (0.032 + 0.026 + 0.02)) < 1e-9
    # DDP: 2 (N-1)/N x 4 MB one way = 6 MB: 0.048 s, and 0.05 s of CPU.
    lo, hi = ddp["dedicated_estimate_seconds"]
    assert abs(lo - 0.05) < 1e-9 and abs(hi - 0.098) < 1e-9
    assert "| onebit | 0.026 | 0.020 | 0.032 | 0.032 .. 0.078 |" in md
    assert ("dedicated hosts (estimate): onebit is 1.6x faster than ddp_fp32 "
            "overlapped, 1.3x sequential") in md


def test_no_estimate_without_the_shards_page_at_drop(tmp_path):
    """A run without shard<s>.drop (the shard never reached DROP while it was
    polled, or a run made before the pages were kept) has no shard CPU and
    no estimate, rather than a figure from the whole run."""
    write_pserver_run(tmp_path / "runs" / "onebit", 0.02, 0.01, with_drop=False)
    doc, md = report(tmp_path, "onebit")
    r = doc["runs"][0]
    assert r["shard_cpu_seconds_per_round"] is None
    assert r["dedicated_estimate_seconds"] is None
    assert "| onebit | 0.026 | - | 0.032 | - |" in md
