#!/usr/bin/env python3
"""A small character-level transformer language model trained through pserver.

A decoder-only transformer over bytes (the vocabulary is the 256 byte
values, no tokenizer): token and learned position embeddings, 4 pre-norm
causal self-attention blocks (d_model 192, 6 heads, GELU feed-forward of
4 x 192), a final LayerNorm and an output projection to the 256 bytes: about
1.9M parameters. It learns to predict the next byte of the Python standard
library's own source (the *.py files directly in /usr/lib/python3.11, sorted
by name, concatenated, the first 2 MB; the last tenth is the validation
split). The loop is an ordinary PyTorch one; pserver.init() and the
DistributedOptimizer are the only pserver lines. Run it with the launcher,
which starts the shards and one process per worker (the optimizer, its
learning rate, bias correction and 1-bit Adam's freeze step are the shards'
flags):

    PYTHONPATH=build/python /usr/bin/python3 -m pserver.launch \\
        --shards 2 --workers 4 --optimizer onebit_adam --pull-codec onebit \\
        --freeze-step 100 --bias-correction=true \\
        python/examples/char_transformer.py --steps 300

Keep --bias-correction=true: without it (onebit_adam's default, DeepSpeed's
convention; --optimizer adam corrects by default) the first steps of Adam
are several times larger than lr, and this model stalls near 3.0 nats per
byte after 100 steps (byte frequencies alone give 3.22) where
torch.optim.Adam reaches 2.5.

Batches: the global batch of step s is W*b windows of --context bytes whose
start offsets are drawn from a generator seeded by (seed, s); worker w takes
windows [w*b, (w+1)*b). One process with world=1 and batch=W*b gets exactly
the union of the W workers' batches. Rank 0 prints its training loss every
--log-every steps and the validation loss (nats per byte, on 640 fixed
evenly spaced windows) before training, every --eval-every steps (none by
default: the other workers wait meanwhile) and at the end; every rank prints
its bytes at the end.

Importable: load_corpus, CharTransformer, get_batch and evaluate are the
same data, model and metric for a comparison with torch.optim.Adam or DDP.
"""

import argparse
import json
import math
import pathlib
import sys
import time

import torch


def load_corpus(root="/usr/lib/python3.11", max_bytes=2_000_000,
                val_fraction=0.1):
    """(train, val): torch.uint8 1-D tensors of bytes.

    The *.py files directly in `root` (not its subfolders), sorted by name,
    concatenated in that order and truncated to `max_bytes`; the last
    `val_fraction` of it is the validation split. Raises ValueError when
    `root` holds no .py file or a split would be empty."""
    folder = pathlib.Path(root)
    if not folder.is_dir():
        raise ValueError(f"corpus folder {root} does not exist; expected a "
                         "folder of .py files (--corpus-dir)")
    if not 0 < val_fraction < 1:
        raise ValueError(f"val_fraction is {val_fraction}; expected a "
                         "fraction between 0 and 1")
    files = sorted(p for p in folder.iterdir()
                   if p.suffix == ".py" and p.is_file())
    if not files:
        raise ValueError(f"no .py files directly in {root}; expected the "
                         "Python standard library's folder (--corpus-dir)")
    chunks, size = [], 0
    for path in files:
        if size >= max_bytes:
            break
        chunks.append(path.read_bytes()[:max_bytes - size])
        size += len(chunks[-1])
    data = torch.frombuffer(bytearray(b"".join(chunks)), dtype=torch.uint8)
    n_val = int(len(data) * val_fraction)
    if n_val < 2 or len(data) - n_val < 2:
        raise ValueError(f"the corpus from {root} is {len(data)} bytes "
                         f"(max_bytes {max_bytes}); too small to split into "
                         "training and validation windows")
    return data[:-n_val].clone(), data[-n_val:].clone()


class CharTransformer(torch.nn.Module):
    """Byte-level decoder-only transformer: forward(x [B, T] long, T <=
    context) -> logits [B, T, vocab]. Pre-norm blocks with a causal mask;
    no dropout by default, so a forward pass is deterministic."""

    def __init__(self, vocab=256, d_model=192, layers=4, heads=6, context=128,
                 dropout=0.0):
        super().__init__()
        self.context = context
        self.tok = torch.nn.Embedding(vocab, d_model)
        self.pos = torch.nn.Embedding(context, d_model)
        torch.nn.init.normal_(self.tok.weight, std=0.02)
        torch.nn.init.normal_(self.pos.weight, std=0.02)
        self.blocks = torch.nn.ModuleList(
            torch.nn.TransformerEncoderLayer(
                d_model, heads, dim_feedforward=4 * d_model, dropout=dropout,
                activation="gelu", batch_first=True, norm_first=True)
            for _ in range(layers))
        self.norm = torch.nn.LayerNorm(d_model)
        self.out = torch.nn.Linear(d_model, vocab)
        # True above the diagonal: position t attends to positions <= t.
        self.register_buffer("causal", torch.triu(
            torch.ones(context, context, dtype=torch.bool), 1),
            persistent=False)

    def forward(self, x):
        t = x.shape[1]
        if t > self.context:
            raise ValueError(f"sequence of {t} tokens; the model's context "
                             f"is {self.context}")
        h = self.tok(x) + self.pos(torch.arange(t, device=x.device))
        mask = self.causal[:t, :t]
        for block in self.blocks:
            h = block(h, src_mask=mask)
        return self.out(self.norm(h))


def get_batch(data, step, rank, world, batch, context, seed):
    """(x, y): worker `rank`'s LongTensors [batch, context] at global step
    `step`; y is x shifted by one byte. The global batch is world*batch
    windows whose offsets come from a generator seeded by (seed, step);
    worker `rank` takes windows [rank*batch, (rank+1)*batch)."""
    if len(data) < context + 2:
        raise ValueError(f"{len(data)} bytes hold no window of {context}+1 "
                         "bytes")
    gen = torch.Generator().manual_seed(seed * 1000003 + step)
    offsets = torch.randint(0, len(data) - context - 1, (world * batch,),
                            generator=gen)[rank * batch:(rank + 1) * batch]
    windows = data[offsets[:, None] + torch.arange(context + 1)].long()
    return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


@torch.no_grad()
def evaluate(model, val, context, batches=20, batch=32):
    """Mean cross entropy (nats per byte) over batches*batch fixed windows
    of `val` at evenly spaced offsets; the model's mode is restored."""
    if len(val) < context + 1:
        raise ValueError(f"validation split of {len(val)} bytes holds no "
                         f"window of {context}+1 bytes")
    n = batches * batch
    offsets = torch.linspace(0, len(val) - context - 1, n).long()
    was_training = model.training
    model.eval()
    try:
        total = 0.0
        for i in range(0, n, batch):
            windows = val[offsets[i:i + batch, None] +
                          torch.arange(context + 1)].long()
            logits = model(windows[:, :-1])
            total += torch.nn.functional.cross_entropy(
                logits.reshape(-1, logits.shape[-1]),
                windows[:, 1:].reshape(-1), reduction="sum").item()
    finally:
        model.train(was_training)
    return total / (n * context)


def main():
    # Imported here so that the functions above work without the extension
    # (e.g. for a torch.optim.Adam or DDP run of the same model).
    import pserver
    import pserver.torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus-dir", default="/usr/lib/python3.11")
    p.add_argument("--max-bytes", type=int, default=2_000_000)
    p.add_argument("--steps", type=int, default=300,
                   help="train until the shards' step reaches this")
    p.add_argument("--batch", type=int, default=8, help="per worker")
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--d-model", type=int, default=192)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--push-codec", default="onebit")
    p.add_argument("--warmup-codec", default="bf16")
    p.add_argument("--k-fraction", type=float, default=0.01,
                   help="fraction of elements a topk push keeps")
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--eval-every", type=int, default=0,
                   help="rank 0 also evaluates every N steps (0: only before "
                   "and after training); the others wait in step() "
                   "meanwhile, and the shards drop a worker that makes no "
                   "call for --lease_timeout_seconds (30 s): keep such "
                   "evaluations short (--eval-batches)")
    p.add_argument("--eval-batches", type=int, default=20,
                   help="validation batches of 32 windows of --context "
                   "bytes (default 20, as evaluate())")
    p.add_argument("--result-json", default="",
                   help="rank 0 writes its validation loss and bytes here")
    args = p.parse_args()

    where = pserver.init()
    torch.set_num_threads(1)  # the workers share the machine's cores
    rank, world = where["worker_id"], where["num_workers"]
    try:
        train, val = load_corpus(args.corpus_dir, args.max_bytes)
    except ValueError as e:
        sys.exit(f"char_transformer.py: {e}")
    if len(train) < args.context + 2 or len(val) < args.context + 1:
        sys.exit(f"char_transformer.py: the corpus ({len(train)} training, "
                 f"{len(val)} validation bytes) is too small for one batch "
                 f"of windows of {args.context} bytes; raise --max-bytes")

    torch.manual_seed(args.seed)  # rank 0's initial weights become everyone's
    model = CharTransformer(d_model=args.d_model, layers=args.layers,
                            heads=args.heads, context=args.context)
    params = sum(p.numel() for p in model.parameters())
    say = print if rank == 0 else (lambda *a, **k: None)
    say(f"{params} parameters, {world} workers, corpus {len(train)} training "
        f"+ {len(val)} validation bytes, training to step {args.steps}",
        flush=True)

    def validate(when):
        loss = evaluate(model, val, args.context, args.eval_batches)
        say(f"{when}: validation loss {loss:.4f} "
            f"({loss / math.log(2):.2f} bits per character)", flush=True)
        return loss

    if rank == 0:
        # Before registering: the other workers wait for rank 0's weights
        # (up to retry_budget), while a worker silent in the rounds would be
        # dropped after the shards' lease.
        validate("untrained")
    opt = pserver.torch.DistributedOptimizer(
        model.named_parameters(), **where, push_codec=args.push_codec,
        warmup_codec=args.warmup_codec, k_fraction=args.k_fraction)
    start = time.monotonic()
    while opt.global_step < args.steps:
        x, y = get_batch(train, opt.global_step, rank, world, args.batch,
                         args.context, args.seed)
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        done = opt.global_step
        if done % args.log_every == 0:
            say(f"step {done}/{args.steps} loss {loss.item():.4f}", flush=True)
        if (rank == 0 and args.eval_every > 0 and done % args.eval_every == 0
                and done != args.steps):
            validate(f"step {done}")
    seconds = time.monotonic() - start

    s = opt.stats()
    print(f"worker {rank} done: {opt.global_step} steps in {seconds:.1f} s, "
          f"pushed {s['push_payload_bytes']} bytes "
          f"({s['push_fp32_bytes'] / max(1, s['push_payload_bytes']):.1f}x "
          f"less than fp32), pulled {s['pull_payload_bytes']} bytes "
          f"({s['pull_fp32_bytes'] / max(1, s['pull_payload_bytes']):.1f}x "
          "less)", flush=True)
    if rank == 0:
        val_loss = evaluate(model, val, args.context, args.eval_batches)
        print(f"validation loss {val_loss:.4f} ({val_loss / math.log(2):.2f} "
              f"bits per character) after {opt.global_step} steps",
              flush=True)
        if args.result_json:
            with open(args.result_json, "w") as f:
                json.dump({"workload": "transformer", "seed": args.seed,
                           "steps": opt.global_step, "workers": world,
                           "parameters": params, "val_loss": val_loss,
                           "seconds": seconds, **{k: s[k] for k in (
                               "push_payload_bytes", "pull_payload_bytes",
                               "push_fp32_bytes", "pull_fp32_bytes",
                               "variance_payload_bytes")}},
                          f, indent=1)


if __name__ == "__main__":
    main()
