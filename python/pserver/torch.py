"""pserver.torch.DistributedOptimizer: a PyTorch training loop through pserver.

    import pserver, pserver.torch
    opt = pserver.torch.DistributedOptimizer(model.named_parameters(),
                                             **pserver.init(), push_codec="onebit")
    for x, y in data:
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()        # push the gradient, load the new weights in place
        opt.zero_grad()

The update itself (1-bit Adam, Adam or SGD, learning rate, betas, ...) runs on
the shards and is set by the pserver_server flags, not here; `lr` and other
entries in param_groups are not read. Every worker of a round must call step()
once per step (bulk-synchronous).
"""

import torch

from pserver._native import Client
from pserver.env import init


def _as_float(loss):
    """The closure's loss as a float for pserver_worker_train_loss, or None."""
    if isinstance(loss, torch.Tensor) and loss.numel() == 1:
        return float(loss.detach())
    if isinstance(loss, (int, float)):
        return float(loss)
    return None


class DistributedOptimizer(torch.optim.Optimizer):
    """torch.optim.Optimizer whose step() goes through the pserver shards.

    The model layout is the named parameters that require grad, in the order
    given (names and shapes): every worker must pass the same model, or the
    shards refuse it (pserver.Error with the shard's message, which names the
    first differing tensor). Parameters with requires_grad=False are left out
    of the layout: they are neither sent nor updated, and stay whatever each
    worker sets them to. Buffers (e.g. BatchNorm running statistics) are not
    parameters: they are the user's to keep in step.

    At construction every worker registers; rank 0 first installs its
    parameters on the shards, the others wait for it (up to retry_budget
    seconds), so on return every worker's parameters are rank 0's.

    Parameters must be float32 CPU tensors. step() copies the gradients into
    one flat float32 buffer (reused each step; a parameter whose .grad is None
    contributes zeros), blocks until the shards answer, and copies the new
    weights into the parameters in place. A refused step (e.g. a NaN or Inf
    gradient, refused before anything is sent) raises pserver.Error and
    leaves the parameters unchanged.

    Keyword arguments after num_workers go to pserver.Client: warmup_codec,
    block_size, k_fraction, bits, ef_decay, momentum_masking (True: Deep
    Gradient Compression's momentum-factor masking, with a sparse push_codec
    and the shards' --onebit_momentum=worker), schedule (the compression
    schedule file the shards run, as pserver_worker --schedule) and
    run_length (the job's rounds, for a schedule's fractions), seed,
    rpc_timeout, pull_timeout,
    retry_budget, metrics_listen ("host:port", port 0 for any free one:
    serve the worker's Prometheus metrics on http://host:port/metrics, as
    pserver_worker --metrics_listen does; see metrics_port), tls_ca,
    tls_cert, tls_key, auth_token_file (paths, as pserver_worker's flags:
    tls_ca turns TLS on, tls_cert/tls_key add a client certificate for
    mutual TLS, the token file, or else $PSERVER_AUTH_TOKEN, the bearer
    token; see client.security). servers/worker_id/num_workers default to pserver.init()
    (PSERVER_SERVERS, RANK, WORLD_SIZE).

    state_dict()/load_state_dict() carry the client's error-feedback
    residuals, so a restarted worker loses none of the gradient it has not
    sent yet.

    overlap=True pushes each parameter's gradient as soon as backward has
    accumulated it, while backward computes the rest (DDP's buckets, on a
    parameter server): the client's chunks that a gradient completes are
    encoded and sent on a background thread, and step() only waits for what
    is left. The result is bit-identical to overlap=False. It needs step()
    to follow one backward pass with the gradients untouched: a gradient
    changed after backward handed it over (clipping, scaling) raises
    RuntimeError in step(), as does a second backward pass in one step
    (gradient accumulation); use the default overlap=False for those. After
    such an error the step cannot complete (its pushes are on their way):
    make a new optimizer (or restart the worker, with its state_dict).

    local_steps=H with inner_optimizer=OPT (a torch.optim optimizer over
    the same parameters, e.g. torch.optim.AdamW(model.parameters(),
    lr=1e-3)) trains with local steps (DiLoCo, Douillard et al. 2023):
    step() runs OPT on this worker's own parameters, and every H-th step()
    pushes the weight change since the last synchronisation (through the
    codec and error feedback, like a gradient) and loads the shards' new
    weights; the shards run the outer optimizer (pserver_server
    --optimizer=sgd --nesterov=true --lr=0.7 --momentum=0.9). Every worker of
    the job must use the same H (the shards refuse another). global_step
    then counts local steps (H per round); synchronize() pushes a partial
    round early (e.g. at the end of training when the step count is not a
    multiple of H). OPT's own state is the caller's to save.

    Not yet: parameter groups added after construction.
    """

    def __init__(self, named_parameters, servers=None, worker_id=None,
                 num_workers=None, push_codec="onebit", overlap=False,
                 local_steps=1, inner_optimizer=None, **client_options):
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
        elif inner_optimizer is not None:
            raise ValueError("inner_optimizer is set but local_steps is 1; "
                             "expected local_steps > 1 with it")
        self._local_steps = local_steps
        self._inner = inner_optimizer
        self._local_done = 0  # local steps since the last synchronisation
        where = init(servers, worker_id, num_workers)
        names, params = [], []
        for item in named_parameters:
            if not (isinstance(item, tuple) and len(item) == 2):
                raise TypeError("named_parameters yields "
                                f"{type(item).__name__}; expected (name, "
                                "tensor) pairs, e.g. model.named_parameters()")
            name, p = item
            if not isinstance(p, torch.Tensor):
                raise TypeError(f"parameter {name!r} is a {type(p).__name__}; "
                                "expected a torch.Tensor")
            if not p.requires_grad:
                continue
            if p.dtype != torch.float32:
                raise TypeError(f"parameter {name!r} has dtype {p.dtype}; "
                                "expected torch.float32")
            if p.device.type != "cpu":
                raise ValueError(f"parameter {name!r} is on {p.device}; "
                                 "expected a CPU tensor")
            if p.is_sparse:
                raise ValueError(f"parameter {name!r} is sparse; expected a "
                                 "dense tensor")
            names.append(name)
            params.append(p)
        if not params:
            raise ValueError("named_parameters has no parameter that "
                             "requires grad; expected at least one")
        self._sizing = True
        super().__init__(params, {})
        self._sizing = False
        self._names = names
        self._params = params
        self._shapes = [list(p.shape) for p in params]
        self._offsets = []
        total = 0
        for p in params:
            self._offsets.append((total, total + p.numel()))
            total += p.numel()
        self._grad = torch.zeros(total, dtype=torch.float32)
        self._weights = torch.empty(total, dtype=torch.float32)
        self._copy_params_to(self._weights)
        self._where = where
        self.client = Client(where["servers"], where["worker_id"],
                             where["num_workers"], push_codec=push_codec,
                             local_steps=local_steps, **client_options)
        self.client.register(names, self._shapes, self._weights,
                             out=self._weights)
        self._load_weights()
        self._overlap = bool(overlap)
        self._handed = [False] * len(params)
        self._hooks = []
        if self._overlap:
            for i, p in enumerate(params):
                # The gradient accumulator's hook runs once p.grad holds this
                # backward pass's sum (torch 1.13 has no post-accumulate hook
                # on the tensor itself).
                with torch.enable_grad():
                    acc = p.view_as(p).grad_fn.next_functions[0][0]
                self._hooks.append((acc, acc.register_hook(
                    self._make_hook(i))))

    def _make_hook(self, i):
        def hook(*unused):
            self._gradient_ready(i)
        return hook

    @torch.no_grad()
    def _gradient_ready(self, i):
        if self._handed[i]:
            raise RuntimeError(
                f"DistributedOptimizer: the gradient of {self._names[i]!r} "
                "arrived twice in one step (several backward passes per "
                "step, e.g. gradient accumulation); construct it with "
                "overlap=False for that")
        if not self.client.in_step:
            self.client.start_step(self._grad)
        b, e = self._offsets[i]
        self._grad[b:e].copy_(self._params[i].grad.reshape(-1))
        self._handed[i] = True
        self.client.gradient_ready(b, e)

    def add_param_group(self, param_group):
        if not getattr(self, "_sizing", False):
            raise NotImplementedError(
                "DistributedOptimizer: the layout is fixed when the optimizer "
                "registers with the shards; pass every parameter to the "
                "constructor")
        super().add_param_group(param_group)

    @property
    def global_step(self):
        """The shards' step: rounds completed since the model was created;
        with local_steps=H, local steps (H per round, plus those taken since
        the last synchronisation)."""
        return self.client.global_step * self._local_steps + self._local_done

    def stats(self):
        """The client's counters since construction (worker/client_metrics.h).

        A dict: steps; push_payload_bytes / pull_payload_bytes (encoded
        tensor payloads sent and received) and push_fp32_bytes /
        pull_fp32_bytes (what fp32 would have moved); compression_ratio (fp32
        bytes over payload bytes, both directions); snapshots,
        checksum_mismatches, retries, rejoins; encode_seconds, push_seconds,
        pull_seconds. The same counts as the pserver_worker_* series on
        /metrics (metrics_listen).
        """
        return self.client.stats()

    @property
    def metrics_port(self):
        """The port of http://<metrics_listen host>:<port>/metrics, or None
        when metrics_listen was not given."""
        return self.client.metrics_port

    @torch.no_grad()
    def step(self, closure=None):
        if self._local_steps > 1:
            return self._local_step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        overlapped = self.client.in_step
        for i, (p, (b, e)) in enumerate(zip(self._params, self._offsets)):
            if self._handed[i]:
                # Handed over by its hook during backward: what was pushed
                # must be what the caller now holds.
                if not torch.equal(self._grad[b:e], p.grad.reshape(-1)):
                    raise RuntimeError(
                        f"DistributedOptimizer: the gradient of "
                        f"{self._names[i]!r} changed after backward handed it "
                        "over (clipping or scaling between backward and "
                        "step?); with overlap=True gradients are pushed as "
                        "backward produces them; use overlap=False")
                continue
            if p.grad is None:
                self._grad[b:e].zero_()
            elif p.grad.is_sparse:
                raise ValueError("a sparse gradient is not supported; "
                                 "expected dense gradients")
            else:
                self._grad[b:e].copy_(p.grad.reshape(-1))
        # The replica goes into the reused buffer only when the step
        # succeeded (the client checks sizes and writes nothing otherwise).
        try:
            if overlapped:
                self.client.finish_step(self._weights, loss=_as_float(loss))
            else:
                self.client.step(self._grad, self._weights,
                                 loss=_as_float(loss))
        finally:
            if not self.client.in_step:
                self._handed = [False] * len(self._params)
        self._load_weights()
        return loss

    def _local_step(self, closure):
        loss = self._inner.step(closure)
        self._local_done += 1
        if self._local_done == self._local_steps:
            self.synchronize(loss)
        return loss

    @torch.no_grad()
    def synchronize(self, loss=None):
        """With local_steps > 1: pushes the weight change since the last
        synchronisation now (a no-op when there is none) and loads the new
        weights. A refused push raises pserver.Error and changes nothing."""
        if self._local_steps == 1 or self._local_done == 0:
            return
        # The replica (self._weights) minus the local weights: what the
        # local steps moved, pushed in place of a gradient.
        self._copy_params_to(self._grad)
        torch.sub(self._weights, self._grad, out=self._grad)
        self.client.step(self._grad, self._weights, loss=_as_float(loss))
        self._local_done = 0
        self._load_weights()

    def state_dict(self):
        """The worker's state, for torch.save and a restarted worker.

        Returns a dict of plain values: "pserver_client_state" (bytes: the
        client's record, the one pserver_worker writes for --state_file:
        every shard's error-feedback residuals of both stages, the worker
        id and count, the shard ranges and the step), "layout" (the
        (name, shape) pairs registered), "worker_id", "num_workers" and
        "global_step". The optimizer's own state (moments, variance) lives
        on the shards and is in their checkpoints, not here.
        """
        return {
            "pserver_client_state": self.client.serialize_state(),
            "layout": [(n, tuple(s)) for n, s in zip(self._names,
                                                     self._shapes)],
            "worker_id": self._where["worker_id"],
            "num_workers": self._where["num_workers"],
            "global_step": self.client.global_step,
        }

    def load_state_dict(self, state_dict):
        """Restores a state_dict() of this worker (after a restart).

        Call it after construction (which registered and loaded the shards'
        weights) and before the next step(). Refused, with nothing changed:
        ValueError for something that is not such a dict or was saved for
        another model (naming the first differing tensor); pserver.Error
        (code FAILED_PRECONDITION) for another worker id, worker count or
        shard count, DATA_LOSS for a damaged record. Without "layout" (a
        dict holding only a --state_file's bytes) the record's own checks
        (worker, worker count, shards, sizes) are all there is.
        """
        key = "pserver_client_state"
        if not isinstance(state_dict, dict) or key not in state_dict:
            raise ValueError(
                f"state_dict is a {type(state_dict).__name__} without "
                f"{key!r}; expected a dict from "
                "DistributedOptimizer.state_dict()")
        record = state_dict[key]
        if not isinstance(record, (bytes, bytearray)):
            raise ValueError(f"state_dict[{key!r}] is a "
                             f"{type(record).__name__}; expected bytes")
        layout = state_dict.get("layout")
        if layout is not None:
            try:
                layout = [(str(n), [int(d) for d in shape])
                          for n, shape in layout]
            except (TypeError, ValueError):
                raise ValueError("state_dict['layout'] is not a list of "
                                 "(name, shape) pairs; expected the layout "
                                 "of DistributedOptimizer.state_dict()") \
                    from None
            mine = list(zip(self._names, self._shapes))
            for i, (saved, have) in enumerate(zip(layout, mine)):
                if (saved[0], list(saved[1])) != (have[0], list(have[1])):
                    raise ValueError(
                        f"state_dict layout[{i}] is {saved[0]!r} with shape "
                        f"{list(saved[1])}; expected {have[0]!r} with shape "
                        f"{list(have[1])} (the state of another model)")
            if len(layout) != len(mine):
                raise ValueError(f"state_dict layout has {len(layout)} "
                                 f"tensors; expected {len(mine)} (the state "
                                 "of another model)")
        self.client.restore_state(bytes(record), "state_dict")

    @torch.no_grad()
    def _copy_params_to(self, flat):
        for p, (b, e) in zip(self._params, self._offsets):
            flat[b:e].copy_(p.reshape(-1))

    @torch.no_grad()
    def _load_weights(self):
        for p, (b, e) in zip(self._params, self._offsets):
            p.copy_(self._weights[b:e].view_as(p))
