"""The optimizer's stats() and the worker's Prometheus endpoint
(metrics_listen) against real shards: the scrape says what stats() says."""

import re
import shutil
import subprocess
import urllib.request

import pytest
import torch

import pserver
import pserver.torch

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (\S+)$")


def scrape(port):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics",
                                timeout=10) as r:
        assert r.status == 200
        return r.read().decode()


def samples(text):
    """{'name{labels}': value} of every sample line."""
    out = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            m = SAMPLE.match(line)
            assert m, line
            out[m.group(1)] = float(m.group(2))
    return out


def test_scrape_matches_stats_and_passes_promtool(shards):
    addrs = shards(2, 1, "--optimizer=adam", "--lr=0.01")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(20, 50), torch.nn.ReLU(),
                                torch.nn.Linear(50, 4))
    opt = pserver.torch.DistributedOptimizer(
        model.named_parameters(), servers=addrs, worker_id=0, num_workers=1,
        push_codec="onebit", metrics_listen="127.0.0.1:0")
    assert isinstance(opt.metrics_port, int) and opt.metrics_port > 0
    gen = torch.Generator().manual_seed(1)
    losses = []

    def closure():
        x = torch.randn(32, 20, generator=gen)
        y = torch.randint(0, 4, (32,), generator=gen)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        return loss

    steps = 6
    for _ in range(steps):
        losses.append(opt.step(closure).item())
        opt.zero_grad()
    stats = opt.stats()
    text = scrape(opt.metrics_port)
    m = samples(text)

    n = opt.client.num_params
    assert stats["steps"] == steps
    # fp32 would have moved 4 bytes per parameter per push and per pull
    # (one pull more: registration's snapshot).
    assert stats["push_fp32_bytes"] == 4 * n * steps
    assert stats["pull_fp32_bytes"] == 4 * n * (steps + 1)
    assert 0 < stats["push_payload_bytes"] < stats["push_fp32_bytes"] / 10
    assert stats["pull_payload_bytes"] > 0
    assert stats["compression_ratio"] == pytest.approx(
        (stats["push_fp32_bytes"] + stats["pull_fp32_bytes"])
        / (stats["push_payload_bytes"] + stats["pull_payload_bytes"]))
    assert stats["encode_seconds"] > 0 and stats["push_seconds"] > 0
    assert stats["pull_seconds"] > 0

    for direction in ("push", "pull"):
        assert m[f'pserver_worker_payload_bytes_total{{direction="{direction}"}}'] \
            == stats[f"{direction}_payload_bytes"]
        assert m[f'pserver_worker_fp32_equivalent_bytes_total{{direction='
                 f'"{direction}"}}'] == stats[f"{direction}_fp32_bytes"]
    for series, key in [("pserver_worker_rpc_retries_total", "retries"),
                        ("pserver_worker_rejoins_total", "rejoins"),
                        ("pserver_worker_snapshots_total", "snapshots"),
                        ("pserver_worker_checksum_mismatches_total",
                         "checksum_mismatches")]:
        assert m[series] == stats[key], series
    assert m["pserver_worker_encode_seconds_total"] == pytest.approx(
        stats["encode_seconds"], rel=1e-6)
    # The training loop's series, as pserver_worker exports them.
    assert m["pserver_worker_step"] == steps == opt.global_step
    assert m["pserver_worker_step_duration_seconds_count"] == steps
    assert m["pserver_worker_train_loss"] == pytest.approx(losses[-1],
                                                           rel=1e-6)
    assert m["pserver_worker_error_feedback_norm"] == pytest.approx(
        opt.client.residual_norm, rel=1e-6)
    assert m["pserver_worker_error_feedback_norm"] > 0
    assert m['pserver_build_info{component="worker",malloc="glibc",'
             'version="0.1.0"}'] == 1
    assert not re.search(r"[{,]worker", text)  # never a worker-id label

    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool is not installed, so the scrape cannot be "
                    "linted: apt-get install prometheus (tests/run.sh "
                    "installs it)")
    p = subprocess.run([promtool, "check", "metrics"], input=text.encode(),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       timeout=30)
    assert p.returncode == 0 and p.stdout == b"", p.stdout.decode()


def test_metrics_are_off_by_default_and_a_taken_port_is_refused(shards):
    addrs = shards(1, 1, "--optimizer=sgd")
    c = pserver.Client(addrs, 0, 1)
    assert c.metrics_port is None
    serving = pserver.Client(addrs, 0, 1, metrics_listen="127.0.0.1:0")
    taken = f"127.0.0.1:{serving.metrics_port}"
    with pytest.raises(pserver.Error, match=f"metrics_listen {taken}: "
                       "cannot listen") as e:
        pserver.Client(addrs, 0, 1, metrics_listen=taken)
    assert e.value.code == "UNAVAILABLE"
    assert "pserver_worker_step" in scrape(serving.metrics_port)
