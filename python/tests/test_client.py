"""pserver.Client (the extension) against real shards: bad input is refused
with a clear exception and changes nothing; refusals carry the shard's message."""

import threading

import numpy as np
import pytest

import pserver

# Exact arithmetic on the shard: fp32 both ways, SGD without momentum.
SGD = ("--optimizer=sgd", "--momentum=0", "--lr=0.5", "--pull_codec=fp32")


def registered_client(addrs, n=5, **kw):
    c = pserver.Client(addrs, 0, 1, push_codec="fp32", **kw)
    w0 = np.arange(n, dtype=np.float32)
    c.register(["w"], [[n]], w0)
    return c, w0


def weights(c):
    out = np.empty(c.num_params, np.float32)
    c.copy_weights_into(out)
    return out


def test_step_applies_the_shards_update(shards):
    c, w0 = registered_client(shards(1, 1, *SGD))
    g = np.array([1, -2, 0.25, 4, 0], np.float32)
    out = np.zeros(5, np.float32)
    assert c.step(g, out) == 1
    np.testing.assert_array_equal(out, w0 - np.float32(0.5) * g)
    assert c.global_step == 1
    s = c.stats()
    assert s["steps"] == 1 and s["push_fp32_bytes"] == 20
    assert s["push_payload_bytes"] == 20  # fp32: no compression


@pytest.mark.parametrize("make_bad, arg, error, words", [
    (lambda: np.zeros(5, np.float64), "gradient", TypeError, "float32"),
    (lambda: np.zeros(4, np.float32), "gradient", ValueError, "expected 5"),
    (lambda: np.zeros(10, np.float32)[::2], "gradient", ValueError,
     "not contiguous"),
    (lambda: np.zeros((5, 2), np.float32)[:, 0], "gradient",
     ValueError, "not contiguous"),
    (lambda: [0.0] * 5, "gradient", TypeError, "list"),
    (lambda: np.zeros(5, np.int32), "gradient", TypeError, "float32"),
])
def test_bad_gradient_is_refused_and_changes_nothing(shards, make_bad, arg,
                                                     error, words):
    c, w0 = registered_client(shards(1, 1, *SGD))
    out = np.full(5, 7, np.float32)
    with pytest.raises(error) as e:
        c.step(make_bad(), out)
    assert arg in str(e.value) and words in str(e.value)
    np.testing.assert_array_equal(out, np.full(5, 7, np.float32))
    assert c.global_step == 0
    np.testing.assert_array_equal(weights(c), w0)
    # The next good step is the first step: nothing was half-applied.
    g = np.ones(5, np.float32)
    assert c.step(g, out) == 1
    np.testing.assert_array_equal(out, w0 - np.float32(0.5) * g)


def test_bad_out_is_refused_before_anything_is_sent(shards):
    c, w0 = registered_client(shards(1, 1, *SGD))
    g = np.ones(5, np.float32)
    ro = np.zeros(5, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="out is read-only"):
        c.step(g, ro)
    with pytest.raises(ValueError, match="out holds 6 .*expected 5"):
        c.step(g, np.zeros(6, np.float32))
    assert c.global_step == 0 and c.stats()["steps"] == 0


def test_nan_gradient_is_refused_by_the_client(shards):
    c, w0 = registered_client(shards(1, 1, *SGD))
    g = np.ones(5, np.float32)
    g[3] = np.nan
    out = np.zeros(5, np.float32)
    with pytest.raises(pserver.Error) as e:
        c.step(g, out)
    assert e.value.code == "INVALID_ARGUMENT"
    assert "gradient[3] is nan" in str(e.value)
    assert c.global_step == 0 and c.stats()["push_payload_bytes"] == 0
    np.testing.assert_array_equal(out, np.zeros(5, np.float32))
    np.testing.assert_array_equal(weights(c), w0)


def test_register_checks_its_arguments(shards):
    c = pserver.Client(shards(1, 1, *SGD), 0, 1, push_codec="fp32")
    with pytest.raises(ValueError, match="initial_weights holds 3 .*expected 4"):
        c.register(["a", "b"], [[2], [2]], np.zeros(3, np.float32))
    with pytest.raises(ValueError, match="repeated"):
        c.register(["a", "a"], [[2], [2]], np.zeros(4, np.float32))
    with pytest.raises(ValueError, match="one shape per name"):
        c.register(["a"], [[2], [2]], np.zeros(4, np.float32))
    assert not c.registered


def test_bad_options_are_refused():
    with pytest.raises(ValueError, match="push_codec"):
        pserver.Client(["127.0.0.1:1"], 0, 1, push_codec="zip")
    with pytest.raises(pserver.Error, match="worker_id is 2") as e:
        pserver.Client(["127.0.0.1:1"], 2, 2)
    assert e.value.code == "INVALID_ARGUMENT"


def test_other_layout_is_refused_with_the_shards_message(shards):
    addrs = shards(2, 2, *SGD)
    first = pserver.Client(addrs, 0, 2, push_codec="fp32")
    first.register(["fc.weight", "fc.bias"], [[4, 3], [4]],
                   np.zeros(16, np.float32))
    other = pserver.Client(addrs, 1, 2, push_codec="fp32", retry_budget=5)
    with pytest.raises(pserver.Error) as e:
        other.register(["fc.weight", "fc.bias"], [[5, 3], [5]],
                       np.zeros(20, np.float32))
    assert e.value.code == "FAILED_PRECONDITION"
    assert e.value.reason == "REJECT_REASON_LAYOUT_MISMATCH"
    assert "fc.weight" in str(e.value) and "expected 4" in str(e.value)
    assert not other.registered


def test_rank_1_waits_for_rank_0s_weights(shards):
    addrs = shards(2, 2, *SGD)
    w1 = np.full(600, 1, np.float32)
    got = np.zeros(600, np.float32)
    c1 = pserver.Client(addrs, 1, 2, push_codec="fp32")
    # Rank 1 starts first; its registration must wait for rank 0's.
    t = threading.Thread(target=c1.register,
                         args=(["w"], [[600]], w1), kwargs={"out": got})
    t.start()
    t.join(0.5)
    assert t.is_alive()
    w0 = np.linspace(-1, 1, 600, dtype=np.float32)
    c0 = pserver.Client(addrs, 0, 2, push_codec="fp32")
    c0.register(["w"], [[600]], w0)
    t.join(30)
    assert not t.is_alive()
    np.testing.assert_array_equal(got, w0)


def test_other_worker_count_is_refused(shards):
    addrs = shards(1, 2, *SGD)
    c = pserver.Client(addrs, 0, 3, push_codec="fp32", retry_budget=5)
    with pytest.raises(pserver.Error) as e:
        c.register(["w"], [[4]], np.zeros(4, np.float32))
    assert e.value.code == "FAILED_PRECONDITION"
    assert e.value.reason == "REJECT_REASON_CONFIG_MISMATCH"
    assert "num_workers is 3; the shard expects 2" in str(e.value)


def test_gil_is_released_and_a_second_caller_is_refused(shards):
    """Rank 0's step waits for rank 1 without the GIL: this thread can still
    run Python, and a second call into the same Client is refused."""
    addrs = shards(1, 2, *SGD)
    cs = [pserver.Client(addrs, r, 2, push_codec="fp32") for r in (0, 1)]
    for c in cs:
        c.register(["w"], [[4]], np.ones(4, np.float32))
    outs = [np.zeros(4, np.float32) for _ in cs]
    g = np.ones(4, np.float32)
    t = threading.Thread(target=cs[0].step, args=(g, outs[0]))
    t.start()
    t.join(0.3)
    assert t.is_alive()  # waiting for rank 1's push
    with pytest.raises(RuntimeError, match="already in a call"):
        cs[0].step(g, outs[0])
    # Nor may another thread read the state the step is changing.
    for read in (cs[0].stats, cs[0].serialize_state,
                 lambda: cs[0].residual_norm,
                 lambda: cs[0].copy_weights_into(outs[0]),
                 lambda: cs[0].global_step, lambda: cs[0].num_params,
                 lambda: cs[0].stage, lambda: cs[0].schedule_phase,
                 lambda: cs[0].consistency):
        with pytest.raises(RuntimeError, match="already in a call"):
            read()
    assert cs[1].step(g, outs[1]) == 1
    t.join(30)
    assert not t.is_alive()
    np.testing.assert_array_equal(outs[0], np.full(4, 0.5, np.float32))
    np.testing.assert_array_equal(outs[1], outs[0])


# 1-bit Adam with the workers' momentum, frozen after the first round.
WORKER_MOMENTUM = ("--optimizer=onebit_adam", "--onebit_momentum=worker",
                   "--freeze_step=1", "--pull_codec=fp32")


def test_momentum_masking_reaches_the_client(shards):
    """momentum_masking=True masks the momentum at the elements pushed
    (pserver_worker --momentum_masking): the first compression-stage push is
    the same; once an element is pushed a second time (one element of five
    per push here) the weights differ. With a dense codec it is refused."""
    g = np.array([1, -2, 0.25, 4, 0.5], np.float32)
    runs = []
    for masking in (False, True):
        c = pserver.Client(shards(1, 1, *WORKER_MOMENTUM), 0, 1,
                           push_codec="topk", k_fraction=0.2,
                           momentum_masking=masking)
        c.register(["w"], [[5]], np.arange(5, dtype=np.float32))
        out = np.zeros(5, np.float32)
        seen = []
        for _ in range(12):
            c.step(g, out)
            seen.append(out.copy())
        runs.append(seen)
    for t in range(2):  # the warmup round and the first TopK push
        np.testing.assert_array_equal(runs[0][t], runs[1][t])
    assert not np.array_equal(runs[0][11], runs[1][11])

    c = pserver.Client(shards(1, 1, *WORKER_MOMENTUM), 0, 1,
                       push_codec="onebit", momentum_masking=True)
    with pytest.raises(pserver.Error, match="momentum_masking needs a sparse "
                       "push codec") as e:
        c.register(["w"], [[5]], np.arange(5, dtype=np.float32))
    assert e.value.code == "INVALID_ARGUMENT"
    assert not c.registered


def write_schedule(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def test_schedule_switches_the_push_codec_at_the_shards_round(shards, tmp_path):
    """schedule= is pserver_worker --schedule: pushes follow the phase the
    shards announce (fp32 for 3 rounds, then 8-bit quantize, a quarter of
    the bytes). A worker without the file is refused by the shards."""
    f = write_schedule(tmp_path, "s.json", """{"phases": [
        {"end_step": 3, "push": {"codec": "fp32"}},
        {"begin_step": 3, "push": {"codec": "quantize",
                                  "params": {"bits": 8, "block_size": 64}}}]}""")
    flags = ("--optimizer=sgd", "--momentum=0", "--lr=0.5",
             "--pull_codec=fp32", f"--schedule={f}")
    addrs = shards(1, 1, *flags)
    c = pserver.Client(addrs, 0, 1, push_codec="fp32")
    with pytest.raises(pserver.Error, match="schedule_fingerprint") as e:
        c.register(["w"], [[64]], np.zeros(64, np.float32))
    assert e.value.code == "FAILED_PRECONDITION"
    assert not c.registered

    c = pserver.Client(addrs, 0, 1, push_codec="fp32", schedule=f)
    c.register(["w"], [[64]], np.zeros(64, np.float32))
    assert c.consistency == "bsp"
    g = np.linspace(-1, 1, 64).astype(np.float32)
    out = np.zeros(64, np.float32)
    phases, pushed = [], []
    for _ in range(5):
        phases.append(c.schedule_phase)
        before = c.stats()["push_payload_bytes"]
        c.step(g, out)
        pushed.append(c.stats()["push_payload_bytes"] - before)
    assert phases == [0, 0, 0, 1, 1]
    assert pushed[0] == pushed[2] == 64 * 4  # fp32
    assert pushed[3] < 64 * 4 / 3 and pushed[3] == pushed[4]  # 8-bit values


def test_schedule_fractions_need_the_jobs_run_length(shards, tmp_path):
    f = write_schedule(tmp_path, "f.json", """{"phases": [
        {"end_fraction": 0.5, "push": {"codec": "fp32"}},
        {"begin_fraction": 0.5, "push": {"codec": "bf16"}}]}""")
    addrs = shards(1, 2, *SGD, f"--schedule={f}")
    first = pserver.Client(addrs, 0, 2, push_codec="fp32", schedule=f,
                           run_length=10)
    first.register(["w"], [[5]], np.zeros(5, np.float32))
    other = pserver.Client(addrs, 1, 2, push_codec="fp32", schedule=f,
                           run_length=20)
    with pytest.raises(pserver.Error,
                       match="total_steps is 20; the job runs 10 rounds") as e:
        other.register(["w"], [[5]], np.zeros(5, np.float32))
    assert e.value.code == "FAILED_PRECONDITION"
    assert not other.registered


def test_a_bad_schedule_file_is_refused_before_anything_is_sent(tmp_path):
    bad = write_schedule(tmp_path, "bad.json", '{"phases": []}')
    with pytest.raises(ValueError, match="^schedule: "):
        pserver.Client(["127.0.0.1:1"], 0, 1, schedule=bad)
    with pytest.raises(pserver.Error, match="schedule: ") as e:
        pserver.Client(["127.0.0.1:1"], 0, 1,
                       schedule=str(tmp_path / "missing.json"))
    assert e.value.code == "NOT_FOUND"


def test_consistency_is_the_shards(shards):
    c, _ = registered_client(shards(1, 1, *SGD, "--consistency=ssp",
                                    "--max_staleness=2"))
    assert c.consistency == "ssp"
    assert pserver.Client(["127.0.0.1:1"], 0, 1).consistency == ""


def test_leave_takes_the_worker_out_and_register_brings_it_back(shards):
    """Client.leave (a planned leave, the Leave RPC): the shard goes on
    without the worker at once; the client is unregistered (a second leave
    or a step is refused, naming register), and register() brings it back
    at the shards' step."""
    addrs = shards(1, 2, *SGD)
    a = pserver.Client(addrs, 0, 2, push_codec="fp32")
    b = pserver.Client(addrs, 1, 2, push_codec="fp32")
    w0 = np.arange(5, dtype=np.float32)
    a.register(["w"], [[5]], w0)
    b.register(["w"], [[5]], w0)
    out = np.zeros(5, np.float32)
    assert b.leave() == 0
    assert not b.registered
    # The round no longer waits for worker 1: worker 0 steps alone.
    g = np.ones(5, np.float32)
    assert a.step(g, out) == 1
    np.testing.assert_array_equal(out, w0 - np.float32(0.5) * g)
    for call in (lambda: b.leave(), lambda: b.step(g, out)):
        with pytest.raises(ValueError, match="register"):
            call()
    b.register(["w"], [[5]], w0)
    assert b.global_step == 1
