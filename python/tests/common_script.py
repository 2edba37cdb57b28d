"""The most common shape of a GPT training script, in miniature, changed only
as docs/python.md says (the optimizer line, no DDP wrapper) and run under
python3 -m pserver.launch by test_common_script.py.

What it keeps of that shape: one file; a causal mask registered as a
persistent buffer; two AdamW groups (decay on matrices); a hand-written
warmup-cosine `for g in optimizer.param_groups: g["lr"] = lr`; a GradScaler
(enabled only with --scaler, a no-op on the CPU as in fp32 runs; the test
enables it on the CPU with --cpu-scaler and injects an overflow on one rank
with --overflow-at);
clip_grad_norm_ between backward and step; rank 0 saving {"model",
"optimizer", "iter_num", ...} to out_dir/ckpt.pt at evaluations and every
rank loading that one file with --init-from resume. Batches follow the
iteration and the rank (not a global random state), so a resumed run sees
an uninterrupted run's batches.

    script.py OUT_DIR --max-iters N [--init-from resume] [--eval-interval K]
"""

import argparse
import math
import os

import torch

import pserver
import pserver.torch

VOCAB, BLOCK, EMBD = 32, 16, 24


class TinyGPT(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = torch.nn.Embedding(VOCAB, EMBD)
        self.wpe = torch.nn.Embedding(BLOCK, EMBD)
        self.ln = torch.nn.LayerNorm(EMBD)
        self.attn = torch.nn.Linear(EMBD, 3 * EMBD)
        self.proj = torch.nn.Linear(EMBD, EMBD)
        self.head = torch.nn.Linear(EMBD, VOCAB, bias=False)
        # As nanoGPT without flash attention: persistent, in the state_dict.
        self.register_buffer("bias", torch.tril(torch.ones(BLOCK, BLOCK))
                             .view(1, 1, BLOCK, BLOCK))

    def forward(self, idx, targets):
        b, t = idx.shape
        x = self.wte(idx) + self.wpe(torch.arange(t))
        q, k, v = self.attn(self.ln(x)).split(EMBD, dim=2)
        att = (q @ k.transpose(1, 2)) / math.sqrt(EMBD)
        att = att.masked_fill(self.bias[0, :, :t, :t] == 0, float("-inf"))
        x = x + self.proj(torch.softmax(att, dim=-1) @ v)
        logits = self.head(x)
        return torch.nn.functional.cross_entropy(
            logits.reshape(-1, VOCAB), targets.reshape(-1))

    def configure_optimizers(self, weight_decay, learning_rate, betas):
        params = {n: p for n, p in self.named_parameters() if p.requires_grad}
        decay = [p for p in params.values() if p.dim() >= 2]
        nodecay = [p for p in params.values() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay},
                  {"params": nodecay, "weight_decay": 0.0}]
        # Was: torch.optim.AdamW(groups, lr=learning_rate, betas=betas)
        return pserver.torch.DistributedOptimizer(
            groups, **pserver.init(), lr=learning_rate, betas=betas,
            module=self)


def get_batch(it, rank):
    g = torch.Generator().manual_seed(1000 * it + rank)
    start = torch.randint(0, VOCAB, (8, 1), generator=g)
    x = (start + torch.arange(BLOCK + 1)) % VOCAB  # a learnable sequence
    return x[:, :-1], x[:, 1:]


def get_lr(it, warmup=3, decay_iters=30, lr=3e-3, min_lr=3e-4):
    if it < warmup:
        return lr * (it + 1) / (warmup + 1)
    ratio = min(1.0, (it - warmup) / (decay_iters - warmup))
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--max-iters", type=int, required=True)
    ap.add_argument("--eval-interval", type=int, default=4)
    ap.add_argument("--init-from", default="scratch")
    ap.add_argument("--scaler", action="store_true")
    ap.add_argument("--cpu-scaler", action="store_true")
    ap.add_argument("--overflow-at", type=int, default=-1)  # on rank 1
    # Every rank saves (and loads) its own file, ckpt_<rank>.pt: the
    # variant that keeps each worker's error-feedback residuals too.
    ap.add_argument("--per-rank", action="store_true")
    args = ap.parse_args()
    rank = int(os.environ.get("RANK", "0"))
    torch.manual_seed(1337)
    torch.set_num_threads(1)
    iter_num = resumed_at = 0
    model = TinyGPT()
    ckpt_path = os.path.join(
        args.out_dir, f"ckpt_{rank}.pt" if args.per_rank else "ckpt.pt")
    checkpoint = None
    if args.init_from == "resume":
        checkpoint = torch.load(ckpt_path, map_location="cpu")
        model.load_state_dict(checkpoint["model"])
        iter_num = resumed_at = checkpoint["iter_num"]
    scaler = torch.cuda.amp.GradScaler(enabled=args.scaler)
    if args.cpu_scaler:  # not a user's line: torch 1.13 has no CPU scaler
        import cpu_grad_scaler
        cpu_grad_scaler.enable(setattr)
        scaler = cpu_grad_scaler.CpuGradScaler(init_scale=2.0 ** 12,
                                               growth_interval=3)
    optimizer = model.configure_optimizers(0.1, 3e-3, (0.9, 0.95))
    if checkpoint is not None:
        optimizer.load_state_dict(checkpoint["optimizer"])
    checkpoint = None

    def save():
        if rank == 0 or args.per_rank:
            torch.save({"model": model.state_dict(),
                        "optimizer": optimizer.state_dict(),
                        "iter_num": iter_num}, ckpt_path)

    while True:
        lr = get_lr(iter_num)
        for param_group in optimizer.param_groups:
            param_group["lr"] = lr
        # Not at the iteration just resumed from (nanoGPT's val loss is then
        # not below the saved best): the other ranks may still be reading it.
        if iter_num % args.eval_interval == 0 and iter_num > resumed_at:
            save()
        if iter_num >= args.max_iters:
            break
        x, y = get_batch(iter_num, rank)
        loss = model(x, y)
        scaler.scale(loss).backward()
        if iter_num == args.overflow_at and rank == 1:
            next(model.parameters()).grad.view(-1)[0] = math.inf
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        iter_num += 1
    if rank == 0:
        print(f"iter {iter_num} loss {loss.item():.6f} step "
              f"{optimizer.global_step} scale {scaler.get_scale()}",
              flush=True)
        torch.save({k: v.clone() for k, v in model.state_dict().items()},
                   os.path.join(args.out_dir, f"final_{iter_num}.pt"))


if __name__ == "__main__":
    main()
