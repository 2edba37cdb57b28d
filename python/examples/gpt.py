"""A small GPT: a decoder-only byte-level language model, importable.

The shape of GPT-2 / nanoGPT, written here: token and learned position
embeddings, `n_layer` pre-norm blocks (LayerNorm, causal multi-head
self-attention, residual; LayerNorm, GELU MLP of 4 x n_embd, residual), a
final LayerNorm, and an output projection tied to the token embedding (one
tensor, `tok.weight`, is both). No dropout, so a forward pass is
deterministic. The vocabulary is the 256 byte values (no tokenizer).

Sizes (GPTConfig): the default, n_embd 192, 4 layers, 6 heads, context 128,
has 1,853,568 parameters; `GPTConfig.bench()` (n_embd 128, 5 layers, 4
heads, context 64) has 1,032,576, the language-model benchmark's
(tests/bench/lm_fidelity.sh); `GPTConfig.small()` (n_embd 64, 2 layers, 4
heads, context 64) has 120,576, for tests.

The data and the metric are char_transformer.py's, imported from it: the
corpus is the *.py files directly in /usr/lib/python3.11 (the Python standard
library's source, on every Debian machine with python3), sorted by name,
concatenated, the first 2 MB, the last tenth held out for validation;
get_batch(data, step, rank, world, batch, context, seed) gives worker
`rank`'s share of step `step`'s global batch of world*batch windows (drawn
from a generator seeded by (seed, step); one process with world=1 and
batch=W*b sees exactly the union of W workers' batches); evaluate(model,
val, context) is the mean cross entropy in nats per byte (= per token) over
640 fixed, evenly spaced validation windows.

configure_param_groups(model, weight_decay) gives the two usual AdamW
groups as torch.optim param-group dicts.
"""

import dataclasses
import math
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from char_transformer import evaluate, get_batch, load_corpus  # noqa: E402,F401

__all__ = ["GPTConfig", "GPT", "configure_param_groups", "load_corpus",
           "get_batch", "evaluate"]


@dataclasses.dataclass(frozen=True)
class GPTConfig:
    vocab: int = 256
    context: int = 128
    n_layer: int = 4
    n_head: int = 6
    n_embd: int = 192

    @classmethod
    def small(cls):
        """A 120K-parameter model for quick tests."""
        return cls(context=64, n_layer=2, n_head=4, n_embd=64)

    @classmethod
    def bench(cls):
        """The 1,032,576-parameter model of tests/bench/lm_fidelity.sh:
        n_embd 128, 5 layers, 4 heads, context 64 (a step of 16 windows
        takes about 0.09 s on one core of the benchmark machine)."""
        return cls(context=64, n_layer=5, n_head=4, n_embd=128)


class CausalSelfAttention(torch.nn.Module):
    """Multi-head self-attention where position t sees positions <= t."""

    def __init__(self, cfg):
        super().__init__()
        if cfg.n_embd % cfg.n_head:
            raise ValueError(f"n_embd {cfg.n_embd} is not a multiple of "
                             f"n_head {cfg.n_head}")
        self.n_head = cfg.n_head
        self.qkv = torch.nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.proj = torch.nn.Linear(cfg.n_embd, cfg.n_embd)
        # True above the diagonal: the future, masked out.
        self.register_buffer("future", torch.triu(torch.ones(
            cfg.context, cfg.context, dtype=torch.bool), 1), persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        h = self.n_head
        q, k, v = (z.view(b, t, h, c // h).transpose(1, 2)
                   for z in self.qkv(x).split(c, dim=2))  # each [b, h, t, d]
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // h))
        att = att.masked_fill(self.future[:t, :t], float("-inf")).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        return self.proj(y)


class Block(torch.nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg):
        super().__init__()
        self.ln1 = torch.nn.LayerNorm(cfg.n_embd)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = torch.nn.LayerNorm(cfg.n_embd)
        self.fc = torch.nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.proj = torch.nn.Linear(4 * cfg.n_embd, cfg.n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.proj(torch.nn.functional.gelu(self.fc(self.ln2(x))))


class GPT(torch.nn.Module):
    """forward(x [B, T] long, T <= context) -> logits [B, T, vocab].

    Weights initialised as GPT-2: normal(0, 0.02), biases zero, and the
    projections back into the residual stream (attn.proj, proj) with std
    0.02 / sqrt(2 * n_layer). The output layer is the token embedding
    (`head.weight is tok.weight`), so named_parameters() lists it once, as
    `tok.weight`."""

    def __init__(self, cfg=GPTConfig()):
        super().__init__()
        self.cfg = cfg
        self.tok = torch.nn.Embedding(cfg.vocab, cfg.n_embd)
        self.pos = torch.nn.Embedding(cfg.context, cfg.n_embd)
        self.blocks = torch.nn.ModuleList(Block(cfg)
                                          for _ in range(cfg.n_layer))
        self.ln_f = torch.nn.LayerNorm(cfg.n_embd)
        self.head = torch.nn.Linear(cfg.n_embd, cfg.vocab, bias=False)
        self.head.weight = self.tok.weight  # tied
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                torch.nn.init.normal_(p, std=0.02 / math.sqrt(2 * cfg.n_layer))
            elif p.dim() >= 2:
                torch.nn.init.normal_(p, std=0.02)
            elif name.startswith("ln") or ".ln" in name:
                pass  # LayerNorm: weight 1, bias 0 already
            else:
                torch.nn.init.zeros_(p)

    @property
    def context(self):
        return self.cfg.context

    def forward(self, x):
        t = x.shape[1]
        if t > self.cfg.context:
            raise ValueError(f"sequence of {t} tokens; the model's context "
                             f"is {self.cfg.context}")
        h = self.tok(x) + self.pos(torch.arange(t, device=x.device))
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_f(h))


def configure_param_groups(model, weight_decay):
    """[{"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0}] for torch.optim.

    Decayed: the weight matrices of the linear layers (every parameter of 2
    or more dimensions that is not an embedding). Not decayed: biases,
    LayerNorm weights and biases, and both embeddings: the position table
    and the token table, which is also the tied output layer (as GPT-2's
    and minGPT's recipe, and issue 28's "0 on biases, norms and
    embeddings"; nanoGPT's later code decays every >= 2-D tensor, embeddings
    included). Each tensor appears once (the tied one as `tok.weight`), in
    named_parameters() order. Frozen parameters (requires_grad=False) are
    kept in their group, as `model.parameters()` would pass them:
    torch.optim skips a parameter without a gradient."""
    embeddings = {id(m.weight) for m in model.modules()
                  if isinstance(m, torch.nn.Embedding)}
    decay, no_decay = [], []
    for p in model.parameters():
        (decay if p.dim() >= 2 and id(p) not in embeddings
         else no_decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay},
            {"params": no_decay, "weight_decay": 0.0}]
