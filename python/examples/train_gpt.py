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

Through PyTorch DDP over gloo instead (--ddp fp32, fp16 or powersgd: the
comm hook), one process per rank started as torchrun starts them (RANK,
WORLD_SIZE, MASTER_ADDR, MASTER_PORT), each taking its share of the global
batch as with --pserver; DDP averages the gradients before clipping:

    torchrun --nproc_per_node 2 --redirects 2 --tee 2 \
        python/examples/train_gpt.py --ddp fp32

(Debian's torch 1.13 under Python 3.11 needs --redirects and --tee given:
their default fails before any rank starts.)

Rank 0 prints the training loss (its own share of the batch) every
--log-every steps, and at the end `final_val_loss X` (nats per byte on the
validation split, gpt.evaluate) and `seconds_per_step X`; --json FILE writes
the settings and the loss curves. With --eval-every N rank 0 also evaluates
every N steps; val_curve holds [step, val_loss, train_seconds], where
train_seconds is the wall clock since the training loop began less the time
rank 0 spent evaluating. --stop-at-loss X ends the run at the first
evaluation at or below X, --max-seconds S at the first one past S seconds
of training (tests/bench/time_to_loss.sh's time to a target loss).

Its flags, their defaults and the checks that refuse contradictory ones
are in train_gpt_args.py.
"""

import dataclasses
import hashlib
import json
import math
import os
import pathlib
import sys
import time
import warnings

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import gpt  # noqa: E402
import train_gpt_args  # noqa: E402
from train_gpt_args import POWERSGD_RANK  # noqa: E402

# --ddp: how long a rank waits in a collective (rank 0's evaluations keep
# the others waiting in the next one).
DDP_TIMEOUT_SECONDS = 1800


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
    """The flags train_gpt_args.py defines, with this file's first line as
    the description --help prints."""
    return train_gpt_args.parse_args(argv, __doc__.split("\n\n")[0])


def client_options(args):
    """DistributedOptimizer's Client options from the --pserver flags."""
    from pserver.env import client_options as recipe_options
    opts = {}
    if args.push_codec:
        opts["push_codec"] = args.push_codec
    elif "push_codec" not in recipe_options():
        opts["push_codec"] = "fp32"  # no recipe's either
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
        if key == "outer_momentum":
            sys.exit(f"train_gpt.py: --client-option {item!r}; expected "
                     "--outer-momentum for the outer momentum")
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


def shards_step(opt, args):
    """--pserver: the script step the shards' rounds stand at (a round is
    --local-steps script steps)."""
    return min(args.steps, opt.client.global_step * args.local_steps)


def advance(sched, n):
    """The scheduler n steps on, as if n optimizer steps had been taken
    (torch warns about scheduler steps without an optimizer step)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        for _ in range(n):
            sched.step()


def save_state(opt, path):
    """opt.state_dict() to path, atomically (a kill leaves the old one)."""
    tmp = f"{path}.tmp"
    torch.save(opt.state_dict(), tmp)
    os.replace(tmp, path)


def wrap_ddp(model, hook, powersgd_start, seed, powersgd_rank=POWERSGD_RANK):
    """model in DistributedDataParallel, the process group initialised,
    its gradients averaged by --ddp's `hook` (the same arithmetic as DDP's
    own allreduce for fp32, through a hook whose all_reduce calls
    tests/bench/ddp_bytes.py can count). Returns the wrapper."""
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook
    from torch.nn.parallel import DistributedDataParallel

    # gloo cannot broadcast the bool causal masks; every rank computes them.
    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(
        model, [n for n, b in model.named_buffers() if b.dtype == torch.bool])
    if hook == "powersgd":
        # One bucket: PowerSGD chains allreduces per bucket, and with several
        # buckets in flight gloo ranks may order them differently and abort
        # (tests/bench/torch_fidelity.py).
        dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 30
        ddp = DistributedDataParallel(model, bucket_cap_mb=1024)
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=powersgd_rank,
            start_powerSGD_iter=powersgd_start, random_seed=seed)
        ddp.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    else:
        ddp = DistributedDataParallel(model)
        ddp.register_comm_hook(None, {
            "fp32": default_hooks.allreduce_hook,
            "fp16": default_hooks.fp16_compress_hook}[hook])
    return ddp


def end_ddp():
    """Ends a DDP job's gloo process group, every rank together, once the
    caller has dropped its DistributedDataParallel wrappers: they are freed
    here, while the group lives on. Had a wrapper's reducer dropped the
    group's last reference after destroy_process_group, the group's
    destructor would join gloo's threads under the GIL while one of them
    waits for the GIL to free a tensor (torch 1.13): a rank that never
    exits."""
    import gc
    import torch.distributed as dist
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


class _Stop:
    """Rank 0's decision after an evaluation: go on, or stop (and why)."""
    CODES = (None, "target", "max_seconds")

    @staticmethod
    def decide(args, val_loss, train_seconds):
        if args.stop_at_loss and val_loss <= args.stop_at_loss:
            return "target"
        if args.max_seconds and train_seconds >= args.max_seconds:
            return "max_seconds"
        return None

    @classmethod
    def share(cls, reason):
        """--ddp: rank 0's reason on every rank (a collective: every rank
        calls it after the same step)."""
        import torch.distributed as dist
        flag = torch.tensor([cls.CODES.index(reason)], dtype=torch.int32)
        dist.broadcast(flag, src=0)
        return cls.CODES[int(flag.item())]


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.pserver:
        import pserver
        import pserver.torch
        where = pserver.init()
        rank, world = where["worker_id"], where["num_workers"]
    elif args.ddp:
        import datetime
        import torch.distributed as dist
        dist.init_process_group(
            "gloo", init_method="env://",
            timeout=datetime.timedelta(seconds=DDP_TIMEOUT_SECONDS))
        rank, world = dist.get_rank(), dist.get_world_size()
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
            outer_momentum=args.outer_momentum, module=model,
            buffers="none", **client_options(args), **where)
        scheduled = inner
    elif args.pserver:
        mean_clip = ({"max_grad_norm": args.clip, "clip_scope": "mean"}
                     if args.clip > 0 and args.clip_scope == "mean" else {})
        opt = pserver.torch.DistributedOptimizer(
            groups, lr=args.lr, betas=betas, eps=args.eps,
            weight_decay=args.weight_decay, module=model, buffers="none",
            **mean_clip, **client_options(args), **where)
        scheduled = opt
    else:
        opt = torch.optim.AdamW(groups, lr=args.lr, betas=betas, eps=args.eps,
                                weight_decay=args.weight_decay)
        scheduled = opt
    sched = torch.optim.lr_scheduler.LambdaLR(
        scheduled, warmup_cosine(args.warmup, args.steps, args.min_lr_ratio))
    # --ddp: the forward and backward passes go through the wrapper (whose
    # hook averages the gradients); evaluation and clipping use the model.
    forward = (wrap_ddp(model, args.ddp, args.warmup, args.seed)
               if args.ddp else model)

    say = print if rank == 0 else (lambda *a, **k: None)
    params = sum(p.numel() for p in model.parameters())
    how = ("pserver" if args.pserver else f"DDP ({args.ddp}) over gloo"
           if args.ddp else "torch.optim.AdamW")
    say(f"{params} parameters, {world} worker(s) of {batch} windows of "
        f"{cfg.context} bytes, {args.steps} steps, {how}", flush=True)
    curve, val_curve = [], []
    start = time.monotonic()
    evaluating = 0.0  # rank 0's seconds in evaluate(), not training time

    def evaluate():
        """(val_loss, train_seconds when the evaluation began)."""
        nonlocal evaluating
        began = time.monotonic()
        train_seconds = began - start - evaluating
        loss = gpt.evaluate(model, val, cfg.context, args.eval_batches)
        evaluating += time.monotonic() - began
        return loss, train_seconds

    grad_norm = None
    stop = None
    step = 0
    if args.pserver:
        if args.state_file and os.path.exists(args.state_file):
            opt.load_state_dict(torch.load(args.state_file))
            print(f"worker {rank}: error-feedback residuals restored from "
                  f"{args.state_file}", flush=True)
        # A worker started while the job is under way (a restart) goes on
        # at the shards' step: the same schedule value and batches as the
        # workers that never stopped.
        step = shards_step(opt, args)
        if step:
            advance(sched, step)
            print(f"worker {rank}: resuming at step {step} (the shards' "
                  "step)", flush=True)
    done = step
    while step < args.steps:
        x, y = gpt.get_batch(train, step, rank, world, batch, cfg.context,
                             args.seed)
        logits = forward(x)
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        if args.clip > 0 and args.pserver and args.clip_scope == "mean":
            # The shards clip the round's mean; this is this worker's norm.
            grad_norm = torch.norm(torch.stack(
                [p.grad.norm() for p in model.parameters()
                 if p.grad is not None])).item()
        elif args.clip > 0:
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(),
                                                       args.clip).item()
        lr = scheduled.param_groups[0]["lr"]
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        step += 1
        if args.pserver:
            # The rounds went on without this worker (it stalled past its
            # lease and rejoined them): follow them.
            now = shards_step(opt, args)
            advance(sched, now - step)  # nothing unless now > step
            step = max(step, now)
        done = step
        if args.state_file and done % args.state_every == 0:
            save_state(opt, args.state_file)
        if done % args.log_every == 0 or done == args.steps:
            # With --pserver: the norm of this worker's error-feedback
            # residuals (what its codec still owes the shards) beside the
            # gradient's norm before clipping.
            residual = opt.client.residual_norm if args.pserver else None
            curve.append([done, loss.item(), lr, grad_norm, residual])
            say(f"step {done}/{args.steps} loss {loss.item():.4f} "
                f"lr {lr:.3g}", flush=True)
        if args.eval_every and done % args.eval_every == 0 \
                and done != args.steps:
            if rank == 0:
                val_curve.append([done, *evaluate()])
                say(f"step {done} val_loss {val_curve[-1][1]:.4f}", flush=True)
                stop = _Stop.decide(args, *val_curve[-1][1:])
            if args.ddp and (args.stop_at_loss or args.max_seconds):
                # The other ranks wait here for rank 0's evaluation.
                stop = _Stop.share(stop)
            if stop:
                break
    if args.pserver and args.local_steps > 1 and not stop:
        opt.synchronize()  # the last partial round (steps % H local steps)
    seconds = time.monotonic() - start
    stats = opt.stats() if args.pserver else {}
    if args.pserver:
        say(f"worker {rank}: pushed {stats['push_payload_bytes']} bytes, "
            f"pulled {stats['pull_payload_bytes']} (+ "
            f"{stats.get('variance_payload_bytes', 0)} of frozen variance)",
            flush=True)
    if args.weights_sha256:
        digest = hashlib.sha256()
        for name, t in sorted(model.state_dict().items()):
            digest.update(name.encode())
            digest.update(t.detach().cpu().contiguous().numpy().tobytes())
        pathlib.Path(args.weights_sha256).write_text(digest.hexdigest() + "\n")
    if rank == 0:
        if not stop:  # every step done
            val_curve.append([args.steps, *evaluate()])
            stop = ("target" if _Stop.decide(args, val_curve[-1][1], 0)
                    else "steps")
        _, val_loss, train_seconds = val_curve[-1]
        reached = stop == "target" if args.stop_at_loss else None
        print(f"final_val_loss {val_loss:.6f}", flush=True)
        print(f"seconds_per_step {seconds / done:.4f}", flush=True)
        if stop != "steps":
            print(f"{'reached --stop-at-loss' if reached else '--max-seconds'}"
                  f" at step {done} after {train_seconds:.1f} s of training",
                  flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"script": "train_gpt.py", "settings": vars(args),
                           "workers": world, "batch_per_worker": batch,
                           "model": dataclasses.asdict(cfg),
                           "parameters": params, "frozen": ["ln_f.bias"],
                           "final_val_loss": val_loss,
                           "seconds": seconds,
                           "seconds_per_step": seconds / done,
                           # The loop's wall clock less rank 0's
                           # evaluations, at the last evaluation.
                           "train_seconds": train_seconds,
                           "steps_done": done, "stopped": stop,
                           "reached": reached,
                           "reached_step": done if reached else None,
                           "reached_train_seconds":
                               train_seconds if reached else None,
                           "train_curve": curve, "val_curve": val_curve,
                           "client_stats": {k: v for k, v in stats.items()
                                            if isinstance(v, (int, float))}},
                          f, indent=1)
    if args.ddp:
        del forward  # the DDP wrapper (end_ddp says why first)
        end_ddp()  # after rank 0's final evaluation and --json


if __name__ == "__main__":
    main()
