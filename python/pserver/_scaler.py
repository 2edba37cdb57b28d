"""Loss scaling (torch.cuda.amp.GradScaler, fp16) with
pserver.torch.DistributedOptimizer.

Under DDP every rank unscales the same all-reduced gradient: an inf on one
rank is an inf on all of them, so every rank skips the step and backs its
scale off. Here each worker unscales its own gradient, and GradScaler.step
would skip step() on the worker that overflowed only, leaving the others
waiting for its push. The optimizer sets `_step_supports_amp_scaling`, so
GradScaler.step calls step(grad_scaler=scaler) on every worker instead
(torch's contract for optimizers that handle scaling themselves). step()
then unscales (unless the script did), and a worker that found an inf or
NaN pushes only that fact (Client.step's overflow): the round updates no
parameter, for any worker, and every worker's scaler is told that an inf
was found, so each update() backs off alike.
"""

from torch.cuda.amp.grad_scaler import OptState


def unscaled(opt, scaler):
    """Unscales opt's gradients unless the script did (scaler.unscale_);
    returns (the scaler's record for opt, whether this worker's gradient
    holds an inf or NaN)."""
    state = scaler._per_optimizer_states[id(opt)]
    if state["stage"] is OptState.READY:
        scaler.unscale_(opt)
    found = state["found_inf_per_device"]
    return state, any(v.item() != 0 for v in found.values())


def tell(state, skipped):
    """A round another worker's overflow skipped counts as an overflow for
    this worker's scaler too (its update() backs the scale off)."""
    if skipped:
        for v in state["found_inf_per_device"].values():
            v.fill_(1.0)
