"""overlap=True for pserver.torch.DistributedOptimizer: each parameter's
gradient is handed to the client from a hook as backward produces it, so
its push overlaps the rest of backward.

A gradient changed between backward and step() (clip_grad_norm_, a scaler's
unscale_) would then have been pushed as it was before the change. torch's
clip_grad_norm_ multiplies every gradient in place, by exactly 1.0 when the
norm is under the threshold, which bumps the gradient's version counter: a
change is seen by version, whatever the value. The first step pushes
nothing from the hooks (they only copy), so that such a script is refused
at its first step with nothing sent; a change found on a later step, once
the push went out, completes that round as it was pushed and then raises,
leaving the optimizer usable.
"""

import torch


class Overlap:
    """The hooks of one DistributedOptimizer and the state of the step
    they hand gradients to."""

    def __init__(self, opt):
        self._opt = opt
        n = len(opt._flat.params)
        self.handed = [False] * n  # copied by its hook this step
        self._seen = [None] * n  # (gradient id, version) when copied
        self.defer = False  # this step's hooks leave everything to step()
        self.step_hyper = None  # what an overlapped step started with
        self.probed = False  # a step found no gradient changed after backward
        self._hooks = []
        for i, p in enumerate(opt._flat.params):
            # The gradient accumulator's hook runs once p.grad holds this
            # backward pass's sum (torch 1.13 has no post-accumulate hook
            # on the tensor itself).
            with torch.enable_grad():
                acc = p.view_as(p).grad_fn.next_functions[0][0]
            self._hooks.append((acc, acc.register_hook(self._make_hook(i))))

    def _make_hook(self, i):
        def hook(*unused):
            self._ready(i)
        return hook

    def pushes(self):
        """Whether the hooks push (else they only copy, for step())."""
        return self.probed and self._opt._max_grad_norm is None

    @torch.no_grad()
    def _ready(self, i):
        opt, flat = self._opt, self._opt._flat
        if self.handed[i]:
            raise RuntimeError(
                f"DistributedOptimizer: the gradient of "
                f"{flat.param_names[i]!r} arrived twice in one step "
                "(several backward passes per step, e.g. gradient "
                "accumulation); construct it with overlap=False for that")
        if self.defer:
            return
        g = flat.params[i].grad
        if (g is not None and g.layout != torch.strided
                and not opt.client.in_step):
            self.defer = True  # step() raises it, naming it, nothing sent
            return
        pushes = self.pushes()
        if pushes and not opt.client.in_step:
            try:
                hyper = opt._hyper.to_send(opt.param_groups)
                flat.check_sparse()
            except (TypeError, ValueError):
                # step() raises it, with nothing sent.
                self.defer = True
                return
            opt._set_hyper(hyper)
            self.step_hyper = hyper
            opt.client.start_step(flat.grad)
        flat.copy_grad(i)
        self._seen[i] = None if g is None else (id(g), g._version)
        self.handed[i] = True
        if pushes:
            opt.client.gradient_ready(*flat.offsets[i])

    def changed(self, i):
        """Whether parameter i's gradient was replaced or changed in place
        since its hook copied it."""
        g = self._opt._flat.params[i].grad
        now = None if g is None else (id(g), g._version)
        return now != self._seen[i]

    def end_step(self):
        self.handed = [False] * len(self.handed)
        self._seen = [None] * len(self._seen)
        self.defer = False
