"""Issue 47: the job's push codec is the shards' decision, announced at
register. A script that names no push codec takes it (fp32 under the plain
Adam flags, where it used to push 1-bit without a word); one that names
another than a codec the shards were given is refused, naming the flag."""

import pytest
import torch

import pserver
import pserver.torch


def one_step(addrs, **options):
    """Two steps (1-bit Adam frozen at 1 pushes its codec in the second)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(300, 4)
    opt = pserver.torch.DistributedOptimizer(
        model.parameters(), servers=addrs, worker_id=0, num_workers=1,
        retry_budget=20, **options)
    for _ in range(2):
        model(torch.randn(8, 300)).square().sum().backward()
        opt.step()
        opt.zero_grad()
    return opt


@pytest.mark.parametrize("flags,codec", [
    (("--optimizer=adam", "--pull_codec=fp32"), "fp32"),
    (("--optimizer=sgd",), "fp32"),
    (("--optimizer=onebit_adam", "--freeze_step=1"), "onebit"),
    (("--optimizer=adam", "--push_codec=topk"), "topk"),
])
def test_a_script_naming_no_push_codec_takes_the_jobs(shards, flags, codec):
    opt = one_step(shards(1, 1, *flags))
    assert opt.client.push_codec == codec
    stats = opt.stats()
    if codec == "fp32":
        assert stats["push_payload_bytes"] == stats["push_fp32_bytes"]
    else:
        assert stats["push_payload_bytes"] < stats["push_fp32_bytes"]


def test_a_push_codec_named_by_the_script_wins_over_a_default(shards):
    opt = one_step(shards(1, 1, "--optimizer=adam"), push_codec="onebit")
    assert opt.client.push_codec == "onebit"


def test_a_push_codec_against_the_shards_flag_is_refused(shards):
    addrs = shards(1, 1, "--optimizer=adam", "--push_codec=fp32")
    with pytest.raises(pserver.Error, match=r"push_codec is topk; this job "
                       r"pushes fp32 \(--push_codec=fp32 on the shards\): "
                       "expected the worker to leave push_codec unset") as e:
        one_step(addrs, push_codec="topk")
    assert e.value.code == "FAILED_PRECONDITION"
    assert e.value.reason == "REJECT_REASON_CONFIG_MISMATCH"
