#!/usr/bin/python3
"""What `module=` costs on the wire for a GPT with a persistent causal mask
(issue 47, C): bytes per step with the mask in the layout (persistent, as
nanoGPT registers it without flash attention) against the same model with
the mask registered persistent=False (not in the layout).

The model is karpathy/nanoGPT's model.py, unchanged (its GPT registers the
mask `bias` in every block when torch has no scaled_dot_product_attention,
as Debian's torch 1.13), at the size tests/bench/nanogpt_resume.py trains:
n_layer 4, n_head 4, n_embd 128, block_size 64, a 65-token vocabulary
(four 16 KiB masks, 64 KiB). Each variant runs under
`python3 -m pserver.launch --shards 2 --workers 2 --recipe lm-onebit:F`
for --steps steps of random tokens (bytes do not depend on the data: every
codec of the recipe sends a fixed size); each rank records its client's
stats() at step F (the end of the 4-bit warmup) and at the end, and the
report gives push and pull payload bytes per step and worker in each stage.

    /usr/bin/python3 tests/bench/gpt_buffer_bytes.py /work/.mirror/karpathy+nanoGPT/repo
    /usr/bin/python3 tests/bench/gpt_buffer_bytes.py --report tests/bench/results/gpt_buffer_bytes.json

NANOGPT is a nanoGPT checkout or a bare git dir (the fetch tool's mirror);
only model.py is read. Writes OUT/gpt_buffer_bytes.json and .md (OUT:
tests/bench/results). Runs under flock on /tmp/pserver_bench.lock.
"""

import argparse
import contextlib
import fcntl
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
PYTHON = "/usr/bin/python3"
LOCK = "/tmp/pserver_bench.lock"
VARIANTS = ("persistent", "non-persistent")


def worker(a):
    """One rank: nanoGPT's GPT with DistributedOptimizer(module=model)."""
    import torch
    sys.path.insert(0, a.model_dir)
    from model import GPT, GPTConfig  # nanoGPT's model.py
    import pserver
    import pserver.torch

    rank = int(os.environ["RANK"])
    torch.manual_seed(1337)
    torch.set_num_threads(1)
    model = GPT(GPTConfig(block_size=64, vocab_size=65, n_layer=4, n_head=4,
                          n_embd=128, dropout=0.0, bias=True))
    masks = [b.attn for b in model.transformer.h if hasattr(b.attn, "bias")]
    assert masks, "this torch has flash attention: no mask buffer"
    if a.mask == "non-persistent":
        for attn in masks:
            attn.register_buffer("bias", attn.bias, persistent=False)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2],
               "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2],
               "weight_decay": 0.0}]
    opt = pserver.torch.DistributedOptimizer(
        groups, **pserver.init(), lr=1e-3, betas=(0.9, 0.99), module=model)
    g = torch.Generator().manual_seed(1000 + rank)
    record = {"mask_elements": sum(m.bias.numel() for m in masks),
              "layout_elements": sum(p.numel() for p in params) + (
                  sum(m.bias.numel() for m in masks)
                  if a.mask == "persistent" else 0)}
    for it in range(a.steps):
        x = torch.randint(0, 65, (12, 65), generator=g)
        _, loss = model(x[:, :-1].contiguous(), x[:, 1:].contiguous())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if it + 1 == a.freeze:
            record["warmup"] = opt.stats()
    record["end"] = opt.stats()
    record["steps"] = a.steps
    record["freeze"] = a.freeze
    pathlib.Path(a.out, f"{a.mask}_{rank}.json").write_text(
        json.dumps(record))


def model_source(nanogpt):
    p = pathlib.Path(nanogpt)
    if (p / "model.py").exists():
        return (p / "model.py").read_text(), "checkout"
    text = subprocess.run(["git", "--git-dir", str(p), "show", "HEAD:model.py"],
                          check=True, capture_output=True, text=True).stdout
    commit = subprocess.run(["git", "--git-dir", str(p), "rev-parse", "HEAD"],
                            check=True, capture_output=True,
                            text=True).stdout.strip()
    return text, commit


def commit_of_tree():
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain",
                            "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    return head, bool(dirty)


def run(a):
    text, source = model_source(a.nanogpt)
    work = pathlib.Path(tempfile.mkdtemp(prefix="gpt_buffer_bytes_"))
    (work / "model.py").write_text(text)
    build = pathlib.Path(a.build).resolve()
    env = dict(os.environ, PYTHONPATH=str(build / "python"))
    runs = {}
    for mask in VARIANTS:
        out = work / mask
        out.mkdir()
        cmd = [PYTHON, "-m", "pserver.launch", "--server-bin",
               str(build / "server" / "pserver_server"), "--run-dir",
               str(work / f"run_{mask}"), "--shards", "2", "--workers", "2",
               "--recipe", f"lm-onebit:{a.freeze}", str(pathlib.Path(__file__)
                                                        .resolve()),
               "--worker", str(out), "--model-dir", str(work), "--mask", mask,
               "--steps", str(a.steps), "--freeze", str(a.freeze)]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True,
                           timeout=1800)
        if p.returncode != 0:
            sys.exit(f"{mask}: the launcher exited {p.returncode}:\n"
                     f"{p.stdout[-3000:]}{p.stderr[-3000:]}")
        runs[mask] = {"command": " ".join(cmd[1:]),
                      "ranks": [json.loads((out / f"{mask}_{r}.json")
                                           .read_text()) for r in (0, 1)]}
    head, dirty = commit_of_tree()
    result = {"commit": head, "dirty_tree": dirty,
              "machine": f"{platform.node()} {platform.machine()} "
                         f"{os.cpu_count()} cpus",
              "nanogpt_model_py": source, "steps": a.steps,
              "freeze": a.freeze, "runs": runs}
    result["summary"] = summarize(result)
    return result


def per_step(rank, stage, key, freeze, steps):
    if stage == "warmup":
        return rank["warmup"][key] / freeze
    return (rank["end"][key] - rank["warmup"][key]) / (steps - freeze)


def summarize(r):
    s = {}
    for stage in ("warmup", "compression"):
        row = {}
        for mask in VARIANTS:
            ranks = r["runs"][mask]["ranks"]
            for key in ("push_payload_bytes", "pull_payload_bytes"):
                row[f"{mask} {key}"] = sum(
                    per_step(k, stage, key, r["freeze"], r["steps"])
                    for k in ranks) / len(ranks)
        both = {m: row[f"{m} push_payload_bytes"] +
                row[f"{m} pull_payload_bytes"] for m in VARIANTS}
        row["overhead"] = both["persistent"] / both["non-persistent"] - 1
        s[stage] = row
    return s


def report(r):
    s = r["summary"]
    mask = r["runs"]["persistent"]["ranks"][0]["mask_elements"]
    lines = [
        "# module= with a persistent causal mask: bytes per step",
        "",
        "`tests/bench/gpt_buffer_bytes.py` (issue 47, C): nanoGPT's "
        "model.py unchanged (n_layer 4, n_head 4, n_embd 128, block_size 64, "
        f"vocabulary 65; its mask buffers {mask} elements, "
        f"{mask * 4 // 1024} KiB in fp32) under `pserver.launch --shards 2 "
        f"--workers 2 --recipe lm-onebit:{r['freeze']}`, {r['steps']} steps, "
        "with the mask persistent (in the layout) and non-persistent (not). "
        "Payload bytes per step and worker, the mean of the two workers; "
        "every codec of the recipe sends a fixed size, so one run per "
        "variant.",
        "",
        f"Commit {r['commit'][:12]}"
        f"{' (dirty tree)' if r['dirty_tree'] else ''}, {r['machine']}, "
        f"nanoGPT model.py at {r['nanogpt_model_py']}.",
        "",
        "| stage | mask | push B/step | pull B/step | overhead of the mask |",
        "|---|---|---:|---:|---:|",
    ]
    for stage in ("warmup", "compression"):
        row = s[stage]
        name = ("4-bit warmup, steps 1-" + str(r["freeze"]) if stage ==
                "warmup" else f"1-bit, steps {r['freeze'] + 1}-{r['steps']}")
        for mask_kind in VARIANTS:
            over = (f"{100 * row['overhead']:+.2f}%"
                    if mask_kind == "persistent" else "")
            lines.append(
                f"| {name} | {mask_kind} | "
                f"{row[f'{mask_kind} push_payload_bytes']:.0f} | "
                f"{row[f'{mask_kind} pull_payload_bytes']:.0f} | {over} |")
    lines += ["", "The overhead is (push + pull of persistent) / (push + pull "
              "of non-persistent) - 1. The counters are the workers' "
              "DistributedOptimizer.stats() payload bytes from the first "
              "step on: the registration, whose initial weights carry the "
              "mask once, is not in them, nor is protobuf framing (an "
              "unchanged segment costs a few bytes of it per chunk). After "
              "the registration the mask travels as CODEC_UNCHANGED "
              "(nothing) both ways while it stays what the shards hold.", ""]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("nanogpt", nargs="?")
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--out", default=str(ROOT / "tests/bench/results"))
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--freeze", type=int, default=20)
    ap.add_argument("--report", metavar="JSON")
    ap.add_argument("--worker", metavar="OUT", dest="worker_out")
    ap.add_argument("--model-dir")
    ap.add_argument("--mask", choices=VARIANTS)
    a = ap.parse_args()
    if a.worker_out:
        a.out = a.worker_out
        worker(a)
        return
    if a.report:
        r = json.loads(pathlib.Path(a.report).read_text())
    else:
        if not a.nanogpt:
            ap.error("NANOGPT (a nanoGPT checkout or bare git dir) is needed "
                     "unless --report is given")
        if not 0 < a.freeze < a.steps:
            ap.error(f"--freeze is {a.freeze}; expected 1..{a.steps - 1}")
        with open(LOCK, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            r = run(a)
        out = pathlib.Path(a.out)
        (out / "gpt_buffer_bytes.json").write_text(json.dumps(r, indent=1))
    md = report(r)
    pathlib.Path(a.out, "gpt_buffer_bytes.md").write_text(md)
    print(md)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
