"""The flat float32 host buffers behind pserver.torch.DistributedOptimizer.

The layout is the parameters that require grad, in the order given, then
the module's buffers (kind "buffer": averaged by the shards, not
optimized). Every step the gradients (and the buffers' values) are copied
into one flat float32 host buffer, and the shards' weights come back into
another (the fp32 replica), from which the parameters and buffers are
copied, cast to their own dtype and device. Both buffers are pinned when
CUDA is available, so the copies to and from a GPU are DMA transfers.
"""

import torch

PARAM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
BUFFER_MODES = ("average", "broadcast", "none")


def check_parameter(name, p):
    """TypeError / ValueError naming the parameter unless the layout can
    hold it: a dense float32, bfloat16 or float16 tensor on the CPU or a
    CUDA device."""
    if p.dtype not in PARAM_DTYPES:
        raise TypeError(f"parameter {name!r} has dtype {p.dtype}; expected "
                        "torch.float32, torch.bfloat16 or torch.float16")
    if p.device.type not in ("cpu", "cuda"):
        raise ValueError(f"parameter {name!r} is on {p.device}; expected a "
                         "CPU or CUDA tensor")
    if p.layout != torch.strided:
        raise ValueError(f"parameter {name!r} is {p.layout}; expected a "
                         "dense (torch.strided) tensor")


def as_float(loss):
    """The closure's loss as a float for pserver_worker_train_loss, or None."""
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return float(loss.detach())
    if isinstance(loss, (int, float)):
        return float(loss)
    return None


def sparse_modules(module, layout_ids):
    """Names of the layout's parameters that a sparse embedding owns."""
    out = []
    for prefix, m in module.named_modules():
        if (isinstance(m, (torch.nn.Embedding, torch.nn.EmbeddingBag))
                and m.sparse and id(m.weight) in layout_ids):
            out.append(f"{prefix}.weight" if prefix else "weight")
    return out


def module_buffers(module, taken):
    """[(name, tensor)]: the module's persistent floating and integer
    buffers (BatchNorm's running_mean, running_var, num_batches_tracked),
    each once. Non-persistent buffers (caches such as attention masks,
    rebuilt from the code) and bool or complex buffers stay each worker's
    own. `taken`: the parameters' names, which a buffer may not reuse."""
    out, seen = [], set()
    for prefix, mod in module.named_modules():
        for bname, b in mod._buffers.items():
            if b is None or id(b) in seen:
                continue
            if bname in mod._non_persistent_buffers_set:
                continue
            if b.dtype == torch.bool or b.is_complex():
                continue
            name = f"{prefix}.{bname}" if prefix else bname
            if name in taken:
                raise ValueError(f"buffer {name!r} has a parameter's name; "
                                 "expected unique names")
            if b.device.type not in ("cpu", "cuda"):
                raise ValueError(f"buffer {name!r} is on {b.device}; "
                                 "expected a CPU or CUDA tensor")
            if b.is_floating_point() and not torch.isfinite(b).all():
                raise ValueError(
                    f"buffer {name!r} holds a non-finite value; expected "
                    "finite buffers (register constant masks with "
                    "persistent=False, or pass buffers='none')")
            seen.add(id(b))
            out.append((name, b))
    return out


class FlatLayout:
    """The layout's tensors and their places in the flat buffers.

    `grad` is what a push sends (gradients, then buffer values); `weights`
    the fp32 replica the shards' weights arrive in. Not thread-safe; used
    by the optimizer's thread and its backward hooks (which torch runs one
    at a time).
    """

    def __init__(self, params, buffers, buffer_mode, worker_id, num_workers):
        self.params = [p for _, p in params]
        self.param_names = [n for n, _ in params]
        self.buffers = [b for _, b in buffers]
        self.buffer_names = [n for n, _ in buffers]
        self.buffer_mode = buffer_mode
        self.worker_id, self.num_workers = worker_id, num_workers
        self.offsets = []
        total = 0
        for t in self.params + self.buffers:
            self.offsets.append((total, total + t.numel()))
            total += t.numel()
        self.param_end = self.offsets[len(self.params) - 1][1]
        pin = torch.cuda.is_available()
        self.grad = torch.zeros(total, dtype=torch.float32, pin_memory=pin)
        self.weights = torch.empty(total, dtype=torch.float32,
                                   pin_memory=pin)

    @property
    def names(self):
        return self.param_names + self.buffer_names

    @property
    def shapes(self):
        return [list(t.shape) for t in self.params + self.buffers]

    @property
    def kinds(self):
        kind = "broadcast" if self.buffer_mode == "broadcast" else "buffer"
        return ["parameter"] * len(self.params) + [kind] * len(self.buffers)

    def copy_grad(self, i):
        """Parameter i's gradient into `grad` (zeros for None); ValueError
        naming it for a sparse gradient (nothing copied)."""
        p, (b, e) = self.params[i], self.offsets[i]
        if p.grad is None:
            self.grad[b:e].zero_()
        elif p.grad.layout != torch.strided:
            raise ValueError(
                f"the gradient of {self.param_names[i]!r} is sparse "
                f"({p.grad.layout}); expected a dense gradient (e.g. "
                "torch.nn.Embedding(..., sparse=False))")
        else:
            self.grad[b:e].copy_(p.grad.reshape(-1))

    def check_sparse(self):
        for i, p in enumerate(self.params):
            if p.grad is not None and p.grad.layout != torch.strided:
                self.copy_grad(i)  # raises, naming it

    def put_buffers(self, flat):
        """The buffers' contributions to the round, into `flat`: their
        values ("average": the shards take the mean); rank 0's values and
        zeros elsewhere ("broadcast": broadcast buffers, whose round result
        is the sum, i.e. rank 0's values exactly)."""
        for t, (b, e) in zip(self.buffers, self.offsets[len(self.params):]):
            dst = flat[b:e]
            if self.buffer_mode == "broadcast":
                if self.worker_id == 0:
                    dst.copy_(t.reshape(-1))
                else:
                    dst.zero_()
            else:
                dst.copy_(t.reshape(-1))

    @torch.no_grad()
    def params_into(self, flat):
        for p, (b, e) in zip(self.params, self.offsets):
            flat[b:e].copy_(p.detach().reshape(-1))

    @torch.no_grad()
    def moved_into(self, flat):
        """How far each parameter moved since load(), as fp32, into `flat`:
        what load() gave it (the replica rounded to its dtype) minus its
        value now. Rounding is not a move, so a bf16/fp16 parameter that
        did not change gives zeros."""
        for p, (b, e) in zip(self.params, self.offsets):
            src = self.weights[b:e]
            if p.dtype != torch.float32:
                src = src.to(p.dtype).float()
            flat[b:e].copy_(src)
            flat[b:e].sub_(p.detach().reshape(-1).to(flat.device,
                                                     torch.float32))

    @torch.no_grad()
    def values_into(self, flat):
        """The parameters' and buffers' own values (registration)."""
        self.params_into(flat)
        for t, (b, e) in zip(self.buffers, self.offsets[len(self.params):]):
            flat[b:e].copy_(t.reshape(-1))

    def clip(self, max_norm, present):
        """Scales the parameters' part of `grad` as
        torch.nn.utils.clip_grad_norm_(max_norm) would scale the gradients
        of the parameters whose index is in `present` (those with a
        gradient): the L2 norm of their per-tensor norms, coefficient
        max_norm / (norm + 1e-6) capped at 1. Returns the norm (float)."""
        if not present:
            return 0.0
        norms = [torch.norm(self.grad[slice(*self.offsets[i])], 2.0)
                 for i in present]
        total = torch.norm(torch.stack(norms), 2.0)
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        self.grad[:self.param_end].mul_(coef)
        return float(total)

    @torch.no_grad()
    def load(self):
        """The replica into the parameters and buffers, cast to their dtype
        (rounded to nearest; integer buffers rounded to the nearest
        integer) and copied to their device."""
        for p, (b, e) in zip(self.params, self.offsets):
            p.copy_(self.weights[b:e].view(p.shape))
        for t, (b, e) in zip(self.buffers, self.offsets[len(self.params):]):
            src = self.weights[b:e].view(t.shape)
            if not t.is_floating_point():
                src = torch.round(src)
            t.copy_(src)
