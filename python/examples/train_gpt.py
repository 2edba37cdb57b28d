#!/usr/bin/env python3
"""Train the small GPT of gpt.py with AdamW, as language-model scripts do.

The recipe: AdamW with two parameter groups (weight decay on the weight
matrices, none on biases, LayerNorms and the embeddings, the tied token
embedding among them), a LambdaLR schedule of linear warmup then cosine
decay to 10% of the peak, clip_grad_norm_(..., 1.0) between backward and
step, tied input/output embeddings, and one frozen parameter: the final
LayerNorm's bias (ln_f.bias, requires_grad=False, stays zero).

Standalone, one process, torch.optim.AdamW on the global batch:

    /usr/bin/python3 python/examples/train_gpt.py --steps 300

Through pserver, the same loop with only the optimizer line changed
(DistributedOptimizer applies the groups' lr and weight decay on the shards;
its betas and eps must be the shards' --beta1/--beta2/--eps), each worker
taking its share of the same global batch:

    PYTHONPATH=build/python /usr/bin/python3 -m pserver.launch --shards 2 \\
        --workers 2 --optimizer adam --pull-codec fp32 \\
        python/examples/train_gpt.py --pserver --steps 300

With 2 workers, clip_grad_norm_ clips each worker's gradient before the
shards average them (per-worker clipping), not the mean gradient as the
standalone run does; tests/bench/gpt_clip_sim.py measures what that changes.

Rank 0 prints the training loss (its own share of the batch) every
--log-every steps, and at the end `final_val_loss X` (nats per byte on the
validation split, gpt.evaluate) and `seconds_per_step X`; --json FILE writes
the settings and the loss curve.
"""

import argparse
import dataclasses
import json
import math
import pathlib
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import gpt  # noqa: E402


def warmup_cosine(warmup, steps, min_ratio=0.1):
    """LambdaLR's factor at step s: (s + 1) / warmup for s < warmup, then a
    cosine from 1 down to min_ratio at s = steps."""
    def factor(s):
        if s < warmup:
            return (s + 1) / warmup
        progress = min(1.0, (s - warmup) / max(1, steps - warmup))
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(
            math.pi * progress))
    return factor


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pserver", action="store_true",
                   help="train through pserver.torch.DistributedOptimizer "
                   "(run under python3 -m pserver.launch)")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--batch", type=int, default=16,
                   help="global batch (windows per step, over all workers)")
    p.add_argument("--size", choices=("default", "bench", "small"),
                   default="default",
                   help="gpt.GPTConfig() (1.85M parameters), "
                   "GPTConfig.bench() (1.03M) or GPTConfig.small() (121K)")
    p.add_argument("--lr", type=float, default=2e-3, help="peak")
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--min-lr-ratio", type=float, default=0.1)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.999)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--clip", type=float, default=1.0,
                   help="max gradient norm (0: no clipping)")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--corpus-dir", default="/usr/lib/python3.11")
    p.add_argument("--max-bytes", type=int, default=2_000_000)
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per process")
    p.add_argument("--log-every", type=int, default=25)
    p.add_argument("--eval-every", type=int, default=0,
                   help="rank 0 also evaluates every N steps (the other "
                   "workers wait meanwhile)")
    p.add_argument("--eval-batches", type=int, default=20,
                   help="validation batches of 32 windows")
    p.add_argument("--json", default="", help="rank 0 writes the run here")
    ps = p.add_argument_group("with --pserver")
    ps.add_argument("--push-codec", default="fp32",
                    help="the workers' push codec (fp32, bf16, quantize, "
                    "onebit, topk, ...)")
    ps.add_argument("--warmup-codec", default="",
                    help="push codec before 1-bit Adam's freeze (default: "
                    "the client's)")
    ps.add_argument("--k-fraction", type=float, default=0.0,
                    help="topk: the fraction kept (default: the client's)")
    ps.add_argument("--bits", type=int, default=0,
                    help="quantize: bits per value (default: the client's)")
    ps.add_argument("--local-steps", type=int, default=1,
                    help="H > 1: DiLoCo, H steps of the script's AdamW on "
                    "each worker (the inner optimizer, with the schedule and "
                    "clipping), then the weight change is pushed and the "
                    "shards' optimizer (the outer one, e.g. --optimizer sgd "
                    "--nesterov=true --lr 0.7) steps")
    ps.add_argument("--client-option", action="append", default=[],
                    metavar="KEY=VALUE",
                    help="another pserver.Client option (e.g. block_size=64, "
                    "ef_decay=0.9), repeatable")
    args = p.parse_args(argv)
    if not args.pserver and (args.local_steps != 1 or args.client_option):
        p.error("--local-steps and --client-option need --pserver")
    return args


def client_options(args):
    """DistributedOptimizer's Client options from the --pserver flags."""
    opts = {"push_codec": args.push_codec}
    if args.warmup_codec:
        opts["warmup_codec"] = args.warmup_codec
    if args.k_fraction:
        opts["k_fraction"] = args.k_fraction
    if args.bits:
        opts["bits"] = args.bits
    for item in args.client_option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            sys.exit(f"train_gpt.py: --client-option {item!r}; expected "
                     "KEY=VALUE")
        for conv in (int, float):
            try:
                value = conv(value)
                break
            except ValueError:
                pass
        else:
            value = {"true": True, "false": False}.get(value, value)
        opts[key] = value
    return opts


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.pserver:
        import pserver
        import pserver.torch
        where = pserver.init()
        rank, world = where["worker_id"], where["num_workers"]
    else:
        rank, world = 0, 1
    if args.batch % world:
        sys.exit(f"train_gpt.py: --batch {args.batch} is not a multiple of "
                 f"the {world} workers")
    batch = args.batch // world
    cfg = {"default": gpt.GPTConfig, "bench": gpt.GPTConfig.bench,
           "small": gpt.GPTConfig.small}[args.size]()
    train, val = gpt.load_corpus(args.corpus_dir, args.max_bytes)

    torch.manual_seed(args.seed)
    model = gpt.GPT(cfg)
    model.ln_f.bias.requires_grad_(False)
    groups = gpt.configure_param_groups(model, args.weight_decay)
    betas = (args.beta1, args.beta2)
    # module=model: the layout's tensor names are the model's (tok.weight,
    # blocks.0.attn.qkv.weight, ...), the names per-tensor codecs of a
    # compression schedule (--client-option schedule=FILE) refer to.
    if args.pserver and args.local_steps > 1:
        # DiLoCo: the script's AdamW (groups, schedule, clipping) is the
        # inner optimizer; the shards' optimizer, with its own --lr and
        # weight decay, is the outer one over every trainable parameter.
        inner = torch.optim.AdamW(groups, lr=args.lr, betas=betas,
                                  eps=args.eps, weight_decay=args.weight_decay)
        opt = pserver.torch.DistributedOptimizer(
            [p for p in model.parameters() if p.requires_grad],
            local_steps=args.local_steps, inner_optimizer=inner,
            module=model, buffers="none", **client_options(args), **where)
        scheduled = inner
    elif args.pserver:
        opt = pserver.torch.DistributedOptimizer(
            groups, lr=args.lr, betas=betas, eps=args.eps,
            weight_decay=args.weight_decay, module=model, buffers="none",
            **client_options(args), **where)
        scheduled = opt
    else:
        opt = torch.optim.AdamW(groups, lr=args.lr, betas=betas, eps=args.eps,
                                weight_decay=args.weight_decay)
        scheduled = opt
    sched = torch.optim.lr_scheduler.LambdaLR(
        scheduled, warmup_cosine(args.warmup, args.steps, args.min_lr_ratio))

    say = print if rank == 0 else (lambda *a, **k: None)
    params = sum(p.numel() for p in model.parameters())
    say(f"{params} parameters, {world} worker(s) of {batch} windows of "
        f"{cfg.context} bytes, {args.steps} steps, "
        f"{'pserver' if args.pserver else 'torch.optim.AdamW'}", flush=True)
    curve, val_curve = [], []
    start = time.monotonic()
    grad_norm = None
    for step in range(args.steps):
        x, y = gpt.get_batch(train, step, rank, world, batch, cfg.context,
                             args.seed)
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        if args.clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(),
                                                       args.clip).item()
        lr = scheduled.param_groups[0]["lr"]
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        done = step + 1
        if done % args.log_every == 0 or done == args.steps:
            # With --pserver: the norm of this worker's error-feedback
            # residuals (what its codec still owes the shards) beside the
            # gradient's norm before clipping.
            residual = opt.client.residual_norm if args.pserver else None
            curve.append([done, loss.item(), lr, grad_norm, residual])
            say(f"step {done}/{args.steps} loss {loss.item():.4f} "
                f"lr {lr:.3g}", flush=True)
        if (rank == 0 and args.eval_every and done % args.eval_every == 0
                and done != args.steps):
            val_curve.append([done, gpt.evaluate(model, val, cfg.context,
                                                 args.eval_batches)])
            say(f"step {done} val_loss {val_curve[-1][1]:.4f}", flush=True)
    if args.pserver and args.local_steps > 1:
        opt.synchronize()  # the last partial round (steps % H local steps)
    seconds = time.monotonic() - start
    stats = opt.stats() if args.pserver else {}
    if args.pserver:
        say(f"worker {rank}: pushed {stats['push_payload_bytes']} bytes, "
            f"pulled {stats['pull_payload_bytes']} (+ "
            f"{stats.get('variance_payload_bytes', 0)} of frozen variance)",
            flush=True)
    if rank != 0:
        return
    val_loss = gpt.evaluate(model, val, cfg.context, args.eval_batches)
    val_curve.append([args.steps, val_loss])
    print(f"final_val_loss {val_loss:.6f}", flush=True)
    print(f"seconds_per_step {seconds / args.steps:.4f}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"script": "train_gpt.py", "settings": vars(args),
                       "workers": world, "batch_per_worker": batch,
                       "model": dataclasses.asdict(cfg), "parameters": params,
                       "frozen": ["ln_f.bias"], "final_val_loss": val_loss,
                       "seconds": seconds,
                       "seconds_per_step": seconds / args.steps,
                       "train_curve": curve, "val_curve": val_curve,
                       "client_stats": {k: v for k, v in stats.items()
                                        if isinstance(v, (int, float))}},
                      f, indent=1)


if __name__ == "__main__":
    main()
