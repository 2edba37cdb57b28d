#!/usr/bin/env python3
"""What per-worker gradient clipping changes on train_gpt.py, in pure torch.

With pserver.torch.DistributedOptimizer, clip_grad_norm_ between backward
and step clips each worker's own gradient, and the shards average the
clipped gradients; torch.optim.AdamW in one process clips the mean gradient.
This script trains train_gpt.py's model and recipe (its defaults and flags)
in one process, splitting each global batch into --workers shares as the
workers do, in three modes:

  standalone  one backward pass on the whole batch, clip, step (train_gpt.py
              without --pserver, exactly)
  mean_clip   one backward pass per share, average, clip the mean: the same
              arithmetic as standalone up to float rounding, so its gap to
              standalone is the run-to-run noise a pserver run also has
  worker_clip one backward pass per share, clip each, average: what a
              pserver fp32 run computes

and prints each mode's final validation loss per seed, the 3-seed means, the
relative differences, how often clipping was active (the share of steps whose
mean gradient, or of shares whose gradient, had a norm above --clip) and the
median norm before clipping (over the run and over its last tenth).

    OPENBLAS_NUM_THREADS=1 /usr/bin/python3 tests/bench/gpt_clip_sim.py \\
        --seeds 1 2 3 --json tests/bench/results/gpt_clip_sim.json

Any train_gpt.py option (--steps, --batch, --lr, --warmup, ...) applies.
"""

import argparse
import json
import pathlib
import statistics
import sys
import time

import torch

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "python" / "examples"
sys.path.insert(0, str(EXAMPLES))
import gpt  # noqa: E402
import train_gpt  # noqa: E402

MODES = ("standalone", "mean_clip", "worker_clip")


def run(args, mode, seed, train, val):
    """Final validation loss and clipping statistics of one run."""
    cfg = gpt.GPTConfig() if args.size == "default" else gpt.GPTConfig.small()
    torch.manual_seed(seed)
    model = gpt.GPT(cfg)
    model.ln_f.bias.requires_grad_(False)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(
        gpt.configure_param_groups(model, args.weight_decay), lr=args.lr,
        betas=(args.beta1, args.beta2), eps=args.eps,
        weight_decay=args.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, train_gpt.warmup_cosine(
        args.warmup, args.steps, args.min_lr_ratio))
    w = args.workers
    clipped_mean = clipped_share = 0
    norms = []  # before clipping: the mean gradient's, or each share's

    def loss_of(x, y):
        logits = model(x)
        return torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), y.reshape(-1))

    for step in range(args.steps):
        if mode == "standalone":
            x, y = gpt.get_batch(train, step, 0, 1, args.batch, cfg.context,
                                 seed)
            loss_of(x, y).backward()
        else:
            shares = []
            for r in range(w):
                x, y = gpt.get_batch(train, step, r, w, args.batch // w,
                                     cfg.context, seed)
                loss_of(x, y).backward()
                if mode == "worker_clip":
                    norm = torch.nn.utils.clip_grad_norm_(params, args.clip)
                    clipped_share += float(norm) > args.clip
                    norms.append(float(norm))
                shares.append([p.grad for p in params])
                for p in params:
                    p.grad = None
            for i, p in enumerate(params):
                p.grad = sum(s[i] for s in shares) / w
        norm = torch.nn.utils.clip_grad_norm_(
            params, args.clip if mode != "worker_clip" else float("inf"))
        if mode != "worker_clip":
            clipped_mean += float(norm) > args.clip
            norms.append(float(norm))
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
    return {"final_val_loss": gpt.evaluate(model, val, cfg.context,
                                           args.eval_batches),
            "mean_grad_clipped_fraction": (
                clipped_mean / args.steps if mode != "worker_clip" else None),
            "median_grad_norm": statistics.median(norms),
            "last_tenth_median_grad_norm": statistics.median(
                norms[-max(1, len(norms) // 10):]),
            "share_grad_clipped_fraction": (
                clipped_share / (w * args.steps) if mode == "worker_clip"
                else None)}


def main():
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    p.add_argument("--json", dest="out_json", default="")
    own, rest = p.parse_known_args()
    args = train_gpt.parse_args(rest)
    if args.batch % own.workers:
        sys.exit(f"--batch {args.batch} is not a multiple of --workers "
                 f"{own.workers}")
    args.workers = own.workers
    torch.set_num_threads(args.threads)
    train, val = gpt.load_corpus(args.corpus_dir, args.max_bytes)
    results = {m: {} for m in own.modes}
    for seed in own.seeds:
        for mode in own.modes:
            start = time.monotonic()
            r = run(args, mode, seed, train, val)
            r["seconds"] = time.monotonic() - start
            results[mode][seed] = r
            clipped = (r["share_grad_clipped_fraction"] if mode == "worker_clip"
                       else r["mean_grad_clipped_fraction"])
            print(f"seed {seed} {mode:11s} final_val_loss "
                  f"{r['final_val_loss']:.6f}, clipped on {100 * clipped:.0f}%"
                  f" of {'shares' if mode == 'worker_clip' else 'steps'}, "
                  f"median norm {r['median_grad_norm']:.3f} (last tenth "
                  f"{r['last_tenth_median_grad_norm']:.3f}), "
                  f"{r['seconds']:.0f} s", flush=True)
    means = {m: statistics.mean(results[m][s]["final_val_loss"]
                                for s in own.seeds) for m in own.modes}
    print("means: " + ", ".join(f"{m} {v:.4f}" for m, v in means.items()))
    rel = {}
    if "standalone" in means:
        for m in own.modes:
            if m == "standalone":
                continue
            per_seed = [results[m][s]["final_val_loss"] /
                        results["standalone"][s]["final_val_loss"] - 1
                        for s in own.seeds]
            rel[m] = {"per_seed": per_seed,
                      "of_means": means[m] / means["standalone"] - 1}
            print(f"{m} vs standalone: per seed "
                  + " ".join(f"{100 * d:+.3f}%" for d in per_seed)
                  + f", of the means {100 * rel[m]['of_means']:+.3f}%")
    if own.out_json:
        with open(own.out_json, "w") as f:
            json.dump({"script": "tests/bench/gpt_clip_sim.py",
                       "settings": {**vars(args), "seeds": own.seeds},
                       "results": results, "means": means,
                       "relative_to_standalone": rel}, f, indent=1)


if __name__ == "__main__":
    main()
