"""torch.cuda.amp.GradScaler enabled on the CPU, for tests (torch 1.13).

torch 1.13 has no GradScaler for the CPU: torch.cuda.amp.GradScaler
disables itself without CUDA, its two fused kernels have CUDA
implementations only, and scale() and _MultiDeviceReplicator assert a CUDA
tensor. enable() lets torch's own class run on the CPU: the two kernels
written out as what they compute, the two asserts left out. Everything
else, GradScaler.step's hand-over to an optimizer with
_step_supports_amp_scaling, unscale_, the per-device found_inf record and
update(), is torch's code.

    cpu_grad_scaler.enable(monkeypatch.setattr)   # or setattr, in a script
    scaler = cpu_grad_scaler.CpuGradScaler(init_scale=2.0 ** 10)
"""

import torch
from torch.cuda.amp import grad_scaler


def _unscale(grads, found_inf, inv_scale):
    # aten's _amp_foreach_non_finite_check_and_unscale_ (CUDA only in 1.13).
    for g in grads:
        if not torch.isfinite(g).all():
            found_inf.fill_(1.0)
        g.mul_(inv_scale)


def _update(scale, growth_tracker, found_inf, growth, backoff, interval):
    # aten's _amp_update_scale_ (CUDA only in 1.13).
    if found_inf.item() > 0:
        scale.mul_(backoff)
        growth_tracker.zero_()
    elif growth_tracker.item() + 1 == interval:
        scale.mul_(growth)
        growth_tracker.zero_()
    else:
        growth_tracker.add_(1)
    return scale


class CpuGradScaler(grad_scaler.GradScaler):
    def scale(self, outputs):
        # torch 1.13's scale() for one tensor, without `assert is_cuda`.
        if self._scale is None:
            self._lazy_init_scale_growth_tracker(outputs.device)
        return outputs * self._scale.to(outputs.device)


def _replicator_init(self, master_tensor):
    # torch 1.13's _MultiDeviceReplicator.__init__, without `assert is_cuda`.
    self.master = master_tensor
    self._per_device_tensors = {}


def enable(setattr_):
    """Patches torch (through setattr_, e.g. pytest's monkeypatch.setattr)
    so that GradScaler(enabled=True) runs on the CPU."""
    setattr_(grad_scaler._MultiDeviceReplicator, "__init__", _replicator_init)
    setattr_(grad_scaler, "amp_definitely_not_available", lambda: False)
    setattr_(torch, "_amp_foreach_non_finite_check_and_unscale_", _unscale)
    setattr_(torch, "_amp_update_scale_", _update)
