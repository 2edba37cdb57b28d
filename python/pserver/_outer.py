"""The outer momentum of local steps, kept on the worker.

With local steps the shards run the outer optimizer on the mean of the
workers' pseudo-gradients (the weight change of a round). When the shards
keep the outer momentum, the compression error of each pushed
pseudo-gradient enters that momentum and stays in it for about 1/(1 - beta)
rounds. Kept on each worker instead, the momentum is applied before the
push: the worker pushes its momentum step (Nesterov: delta + beta * u, with
u <- beta * u + delta), error feedback compresses that, and the shards run
plain SGD on the mean. Without compression the two are the same update (the
mean of the workers' u is the shards' momentum, as the update is linear);
with it the error enters one step and is paid back by error feedback in the
next, as with 1-bit Adam's momentum on the workers.
"""

import torch


def configure(local_steps, inner_optimizer, overlap, max_grad_norm,
              outer_momentum, outer_nesterov, env_outer):
    """DistributedOptimizer's local-step arguments checked together:
    ValueError naming the argument and what it expects. Returns the outer
    momentum to use: the caller's, else a recipe's (`env_outer`, from
    PSERVER_CLIENT_OPTIONS) when there are local steps."""
    if (not isinstance(local_steps, int) or isinstance(local_steps, bool)
            or not 1 <= local_steps <= 100000):
        raise ValueError(f"local_steps is {local_steps!r}; expected an "
                         "integer in 1..100000")
    if local_steps > 1:
        if not isinstance(inner_optimizer, torch.optim.Optimizer):
            raise ValueError(
                f"local_steps is {local_steps} and inner_optimizer is "
                f"{type(inner_optimizer).__name__}; expected a "
                "torch.optim.Optimizer over the same parameters (e.g. "
                "torch.optim.AdamW(model.parameters(), lr=1e-3))")
        if overlap:
            raise ValueError("overlap=True pushes gradients during "
                             "backward; with local_steps > 1 nothing is "
                             "pushed per step: use overlap=False")
        if max_grad_norm is not None:
            raise ValueError("max_grad_norm clips the pushed gradient; "
                             "with local_steps > 1 a weight change is "
                             "pushed: clip the inner optimizer's "
                             "gradients with clip_grad_norm_ instead")
    elif inner_optimizer is not None:
        raise ValueError("inner_optimizer is set but local_steps is 1; "
                         "expected local_steps > 1 with it")
    # A recipe's outer momentum (lm-local) applies to local steps only.
    from_recipe = (outer_momentum is None and env_outer is not None
                   and local_steps > 1)
    if from_recipe:
        outer_momentum = env_outer
    try:
        check(outer_momentum, outer_nesterov, local_steps)
    except ValueError as e:
        if from_recipe:
            raise ValueError(f"PSERVER_CLIENT_OPTIONS: {e}") from None
        raise
    return outer_momentum


def check(beta, nesterov, local_steps):
    """Refuses what cannot be an outer momentum: ValueError naming the
    argument and what it expects."""
    if beta is None:
        return
    if (isinstance(beta, bool) or not isinstance(beta, (int, float))
            or not 0.0 <= beta < 1.0):
        raise ValueError(f"outer_momentum is {beta!r}; expected a number in "
                         "[0, 1) (e.g. 0.9), or None for none")
    if not isinstance(nesterov, bool):
        raise ValueError(f"outer_nesterov is {nesterov!r}; expected True or "
                         "False")
    if local_steps == 1:
        raise ValueError("outer_momentum is set but local_steps is 1; "
                         "expected local_steps > 1 with it (every step's "
                         "momentum is the shards' optimizer's)")


class OuterMomentum:
    """u, the worker's outer momentum over the parameters' flat elements,
    and the step built from it. step() leaves u as it was: commit() takes
    the new u once the push was accepted, so a refused push changes
    nothing."""

    KEY = "pserver_outer_momentum"

    def __init__(self, beta, nesterov, numel):
        self.beta = float(beta)
        self.nesterov = nesterov
        self.u = torch.zeros(numel, dtype=torch.float32)
        self._next = None

    def step(self, delta):
        """Turns `delta` (this round's pseudo-gradient, a flat fp32 tensor
        over the parameters) into the step to push, in place."""
        u = torch.add(delta, self.u, alpha=self.beta)
        if self.nesterov:
            delta.add_(u, alpha=self.beta)
        else:
            delta.copy_(u)
        self._next = u

    def commit(self):
        if self._next is not None:
            self.u, self._next = self._next, None

    def discard(self):
        self._next = None

    def state(self):
        return {"beta": self.beta, "nesterov": self.nesterov,
                "u": self.u.clone()}

    def load(self, saved):
        """Restores state(); ValueError naming what does not match (another
        model, another beta or Nesterov setting), u unchanged."""
        if (not isinstance(saved, dict)
                or not isinstance(saved.get("u"), torch.Tensor)):
            raise ValueError(f"state_dict[{self.KEY!r}] is not a dict with a "
                             "tensor 'u'; expected DistributedOptimizer."
                             "state_dict()'s")
        u = saved["u"]
        if u.dtype != torch.float32 or tuple(u.shape) != tuple(self.u.shape):
            raise ValueError(f"state_dict[{self.KEY!r}]['u'] is {u.dtype} of "
                             f"shape {list(u.shape)}; expected torch.float32 "
                             f"of shape {list(self.u.shape)} (the state of "
                             "another model)")
        for name, mine, arg in (("beta", self.beta, "outer_momentum"),
                                ("nesterov", self.nesterov, "outer_nesterov")):
            if saved.get(name) != mine:
                raise ValueError(f"state_dict[{self.KEY!r}][{name!r}] is "
                                 f"{saved.get(name)!r}; expected {mine!r}, "
                                 f"this optimizer's {arg}")
        self.u = u.detach().to("cpu").clone()
        self._next = None
