"""pserver.torch.DistributedOptimizer: a PyTorch training loop through pserver.

    import pserver, pserver.torch
    opt = pserver.torch.DistributedOptimizer(
        [{"params": decay, "weight_decay": 0.1},
         {"params": no_decay, "weight_decay": 0.0}],
        **pserver.init(), lr=3e-4, module=model, max_grad_norm=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine)
    for x, y in data:
        loss_fn(model(x), y).backward()
        opt.step()        # push the gradient, load the new weights in place
        opt.zero_grad()
        sched.step()

The update runs on the shards: its kind (Adam, 1-bit Adam, SGD), betas, eps
and momentum are the pserver_server flags; each group's lr and weight_decay
in param_groups travel with the pushes, so torch.optim.lr_scheduler works.
Every worker of a round calls step() once per step (bulk-synchronous).
"""

import json

import torch

from pserver import (_clip, _flat, _groups, _leave, _node, _outer,
                     _overlap, _scaler, _state)
from pserver._native import Client
from pserver.env import client_options as _env_client_options
from pserver.env import init


class DistributedOptimizer(torch.optim.Optimizer):
    """torch.optim.Optimizer whose step() goes through the pserver shards.

    params: what torch.optim takes: tensors, (name, tensor) pairs, or
    param-group dicts ({"params": ..., "lr", "weight_decay", "betas",
    "eps", and pserver's "lr_scale"}; a group's params may also be pairs).
    Names: a pair's own; with module=, the module's name for the tensor;
    else "group<g>.param<i>". The layout is the tensors that require grad,
    in the order given (every worker must give the same), then the module's
    buffers; frozen tensors (requires_grad=False) stay in their group but
    are neither sent nor updated. Parameters: float32, bfloat16 or float16,
    on the CPU or a CUDA device; the shards keep fp32 master weights, the
    fp32 replica stays on the host and each parameter gets it rounded to its
    own dtype.

    Hyper-parameters: each group's "lr" and "weight_decay" (decoupled, as
    AdamW's; L2 for sgd) are sent with every push once the caller has given
    an lr (here or in a group) or anything (a scheduler) has changed a
    group's lr / weight_decay from what construction filled in; until then
    the shards' own learning-rate schedule (pserver_server --lr and its
    schedule flags, times the group's lr_scale) applies, with each group's
    weight_decay. Missing entries are filled from the shards' flags at
    construction. betas and eps (adam, onebit_adam) given here or in the
    groups are what the shards run: the job's first registration sets them
    where pserver_server's --beta1/--beta2/--eps are left out; a flag or an
    earlier worker with other values refuses (pserver.Error
    FAILED_PRECONDITION naming both), as do groups with different ones
    (ValueError). momentum and nesterov (sgd) are the shards': given ones
    must equal them (ValueError naming the group, both values and the
    flag). A scheduler may change none of them (OneCycleLR needs
    cycle_momentum=False). A value that is
    not finite or is negative raises ValueError in step(), nothing sent.
    Every worker of a round must send the same values (workers running the
    same scheduler do); the shards refuse the round's later push otherwise
    (pserver.Error FAILED_PRECONDITION).

    module=, buffers="average" (the default with a module) | "broadcast" |
    "none": the module's persistent floating and integer buffers (e.g.
    BatchNorm's running statistics) join the layout as buffers: each step
    every worker sends their values and gets back the mean over the round's
    workers ("broadcast": rank 0's values exactly, the shards' broadcast
    buffers; it needs the shards' bsp rounds, and a round that went on
    without rank 0 leaves them as they were), cast back to their dtype.
    They travel in fp32 both ways.

    max_grad_norm=X clips this worker's whole gradient to L2 norm X (as
    torch.nn.utils.clip_grad_norm_, over the parameters with a gradient)
    before it is encoded: per-worker clipping; the mean of the workers'
    gradients is not clipped again. last_grad_norm is the norm before it.
    With clip_scope="mean" the shards clip each round's mean gradient to X
    instead, as DDP does (python/pserver/_clip.py).

    overlap=True pushes each parameter's gradient as soon as backward has
    accumulated it, while backward computes the rest (DDP's buckets, on a
    parameter server); the result is bit-identical to overlap=False. It
    needs step() to follow one backward pass with the gradients and lr
    untouched: a gradient or lr changed after backward handed it over
    raises RuntimeError in step(), as does a second backward pass in one
    step; after such an error the step cannot complete (its pushes are on
    their way): make a new optimizer. With max_grad_norm the hooks only
    copy and step() clips and pushes everything.

    local_steps=H with inner_optimizer=OPT (a torch.optim optimizer over
    the same parameters) trains with local steps (DiLoCo, Douillard et al.
    2023): step() runs OPT, and every H-th step() pushes the weight change
    since the last synchronisation (and the buffers) and loads the shards'
    new weights; the shards run the outer optimizer (e.g. pserver_server
    --optimizer=sgd --nesterov=true --lr=0.7 --momentum=0.9), whose lr and
    weight decay param_groups then hold. synchronize() pushes a partial
    round early. OPT's own state is the caller's to save. With
    outer_momentum=BETA each worker keeps the outer momentum u itself and
    pushes its step (u <- BETA u + delta; Nesterov, outer_nesterov=True:
    delta + BETA u; else u), so the codec's error feedback compresses the
    momentum step; run the shards with plain SGD (--optimizer=sgd
    --momentum=0). Without compression this is the shards' momentum; u is
    in state_dict().

    Other keyword arguments go to pserver.Client (push_codec, warmup_codec,
    block_size, k_fraction, bits, ef_decay, momentum_masking, schedule,
    run_length, seed, rpc_timeout, pull_timeout, retry_budget,
    metrics_listen, tls_ca, tls_cert, tls_key, auth_token_file: see
    docs/python.md). servers/worker_id/num_workers/node_group default to
    pserver.init() (PSERVER_SERVERS, RANK, WORLD_SIZE; with one push per
    machine the node's, python/pserver/_node.py). leave_on_sigterm: leave
    at the next round on SIGTERM (_leave.py). Client options the
    caller does not pass (push_codec included) come from PSERVER_CLIENT_OPTIONS
    when it is set: a JSON object of Client options, what python3 -m
    pserver.launch --recipe NAME gives the workers (it may set
    outer_momentum too, used with local steps when the caller passes none:
    the recipe lm-local's); a push_codec given here that is not the
    recipe's raises ValueError naming both. Given by neither, push_codec is
    the job's, which the shards announce (pserver_server --push_codec;
    unset: onebit for onebit_adam, fp32 for adam and sgd), and the others
    are Client's defaults. A value that
    is not JSON, not an object, or has a key that is not a Client option
    raises ValueError naming PSERVER_CLIENT_OPTIONS, before any shard is
    contacted.

    At construction every worker registers; rank 0 installs its parameters
    and buffers, the others wait for it (up to retry_budget seconds), so on
    return every worker holds rank 0's values (or the model the shards
    already held); frozen parameters (requires_grad=False) are not in the
    layout and stay each worker's own. state_dict() is torch's layout plus
    the client's record.
    """

    def __init__(self, params, servers=None, worker_id=None,
                 num_workers=None, push_codec=None, overlap=False,
                 local_steps=1, inner_optimizer=None, *, lr=None,
                 weight_decay=None, betas=None, eps=None, module=None,
                 buffers=None, max_grad_norm=None, outer_momentum=None,
                 outer_nesterov=True, clip_scope="worker", node_group=None,
                 leave_on_sigterm=None, **client_options):
        # Explicit arguments win over the launcher's recipe.
        from_env = _env_client_options()
        recipe_codec = from_env.pop("push_codec", None)
        if push_codec is None:
            # The recipe's, else the job's (the shards announce it).
            push_codec = recipe_codec or ""
        elif recipe_codec is not None and push_codec != recipe_codec:
            # The recipe's other options (momentum masking, k, bits, the
            # schedule) were chosen for its codec: refuse, naming both.
            raise ValueError(
                f"push_codec is {push_codec!r} but the launcher's recipe "
                f"pushes {recipe_codec!r} (PSERVER_CLIENT_OPTIONS: "
                f"{json.dumps(dict(from_env, push_codec=recipe_codec))}); "
                "expected push_codec left out (the recipe's) or the job run "
                "without --recipe")
        env_outer = from_env.pop("outer_momentum", None)
        client_options = {**from_env, **client_options}
        outer_momentum = _outer.configure(
            local_steps, inner_optimizer, overlap, max_grad_norm,
            outer_momentum, outer_nesterov, env_outer)
        if max_grad_norm is not None:
            max_grad_norm = _groups.hyper_value(max_grad_norm,
                                                "max_grad_norm")
        _clip.configure(clip_scope, max_grad_norm, local_steps)
        if buffers is None:
            buffers = "none" if module is None else "average"
        if buffers not in _flat.BUFFER_MODES:
            raise ValueError(f"buffers is {buffers!r}; expected one of "
                             f"{', '.join(_flat.BUFFER_MODES)}")
        if buffers != "none" and module is None:
            raise ValueError(f"buffers is {buffers!r} but module is None; "
                             "expected module=model (its buffers)")
        if module is not None and not isinstance(module, torch.nn.Module):
            raise TypeError(f"module is a {type(module).__name__}; expected "
                            "a torch.nn.Module")
        self._local_steps = local_steps
        self._inner = inner_optimizer
        self._local_done = 0  # local steps since the last synchronisation
        # Clipped here per worker; with clip_scope "mean", on the shards.
        self._max_grad_norm = (max_grad_norm if clip_scope == "worker"
                               else None)
        self.last_grad_norm = None
        where = init(servers, worker_id, num_workers)
        machine = where.get("node_group") if node_group is None else node_group
        self._leaver = _leave.Leaver(leave_on_sigterm, machine)

        hyper = _groups.GroupHyper(lr, weight_decay, betas, eps)
        torch_groups, layout, group_of = [], [], []
        for g, (given, entries) in enumerate(_groups.split(params, module)):
            group = hyper.prepare(g, given)
            group["params"] = [p for _, p in entries]
            torch_groups.append(group)
            trainable = [(n, p) for n, p in entries if p.requires_grad]
            for n, p in trainable:
                _flat.check_parameter(n, p)
            if trainable:
                group_of += [len(hyper.sent_groups)] * len(trainable)
                hyper.sent_groups.append(g)
                layout += trainable
        if not layout:
            raise ValueError("params has no parameter that requires grad; "
                             "expected at least one")
        if module is not None:
            sparse = _flat.sparse_modules(module, {id(p) for _, p in layout})
            if sparse:
                raise ValueError(
                    f"parameter {sparse[0]!r} belongs to an embedding with "
                    "sparse=True; expected dense gradients (sparse=False)")
        bufs = []
        if buffers != "none":
            bufs = _flat.module_buffers(module, {n for n, _ in layout})
        self._sizing = True
        super().__init__(torch_groups, dict(hyper.defaults))
        self._sizing = False
        self._hyper = hyper
        self._where = where
        self._flat = _flat.FlatLayout(layout, bufs, buffers,
                                      where["worker_id"],
                                      where["num_workers"])
        flat = self._flat
        self._outer = (None if outer_momentum is None else
                       _outer.OuterMomentum(outer_momentum, outer_nesterov,
                                            flat.param_end))
        flat.values_into(flat.weights)
        self.client = _node.client(
            machine, overlap, flat, where, lambda worker_id, num_workers: Client(
                where["servers"], worker_id, num_workers,
                push_codec=push_codec, local_steps=local_steps,
                **hyper.adam_hyper(self.param_groups), **client_options))
        self.client.register(flat.names, flat.shapes, flat.weights,
                             out=flat.weights,
                             groups=group_of + [0] * len(bufs),
                             kinds=flat.kinds,
                             group_specs=hyper.specs(self.param_groups))
        # Checked before anything is loaded: a refusal leaves the
        # parameters as they were.
        hyper.fill(self.param_groups, self.defaults,
                   self.client.shard_config)
        _clip.start(self, clip_scope, max_grad_norm)
        flat.load()
        self._sent_hyper = None  # what client.set_hyper last got
        self._overlap = _overlap.Overlap(self) if overlap else None

    def _set_hyper(self, hyper):
        if hyper != self._sent_hyper:
            self.client.set_hyper(hyper)
            self._sent_hyper = hyper

    def add_param_group(self, param_group):
        if not getattr(self, "_sizing", False):
            raise ValueError(
                "DistributedOptimizer.add_param_group: the layout is fixed "
                "when the optimizer registers with the shards; expected "
                "every group at construction (a parameter to unfreeze "
                "later must be there too, and requires_grad then)")
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

    # GradScaler.step(opt) calls step(grad_scaler=scaler) on every worker,
    # also on one whose gradient overflowed (python/pserver/_scaler.py).
    _step_supports_amp_scaling = True

    @torch.no_grad()
    def step(self, closure=None, grad_scaler=None):
        """Pushes this worker's gradient (and buffers) with the groups' lr
        and weight decay, waits for the round, and loads the new weights.
        Raises before anything is sent, changing nothing: ValueError for a
        group's value (naming it) or a sparse gradient; pserver.Error for a
        refused push (e.g. a non-finite gradient). grad_scaler: given by
        GradScaler.step; an inf or NaN in any worker's unscaled gradient
        skips the round for every worker, and every scaler sees it."""
        flat, ov = self._flat, self._overlap
        if grad_scaler is not None and ov is not None:
            raise RuntimeError(
                "DistributedOptimizer: overlap=True pushes gradients as "
                "backward produces them, still scaled by the GradScaler; "
                "construct it with overlap=False (nothing was sent)")
        scaled, overflow = (None, False) if grad_scaler is None else \
            _scaler.unscaled(self, grad_scaler)
        if self._local_steps > 1:
            # A replica of its own: an overflow skips this local step only.
            return None if overflow else self._local_step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        overlapped = self.client.in_step
        late = None  # changed after the push went out: said once it is done
        try:
            hyper = self._hyper.to_send(self.param_groups)
            if overlapped and hyper != ov.step_hyper:
                late = ("a group's lr or weight_decay changed after backward "
                        "started the step (with overlap=True they go with "
                        "the first gradient); set them before backward")
            flat.check_sparse()
            # A parameter whose .grad is None is not updated this step (no
            # momentum, no weight decay) unless another worker has one.
            present, absent = [], []
            for i, p in enumerate(flat.params):
                if ov is not None and ov.handed[i]:
                    # Copied (or pushed) by its hook during backward: it
                    # must be what the caller now holds.
                    if ov.changed(i):
                        what = (f"the gradient of {flat.param_names[i]!r} "
                                "changed after backward handed it over "
                                "(clipping or scaling between backward and "
                                "step?); with overlap=True gradients are "
                                "pushed as backward produces them: clip with "
                                "max_grad_norm=, or use overlap=False")
                        if not overlapped:
                            raise RuntimeError(
                                f"DistributedOptimizer: {what} (nothing was "
                                "sent)")
                        late = late or what
                else:
                    flat.copy_grad(i)
                (present if p.grad is not None else absent).append(i)
            flat.put_buffers(flat.grad)
            if overlapped:
                self.client.finish_step(flat.weights,
                                        loss=_flat.as_float(loss),
                                        no_gradient=absent)
            else:
                if self._max_grad_norm is not None and not overflow:
                    self.last_grad_norm = flat.clip(self._max_grad_norm,
                                                    present)
                self._set_hyper(hyper)
                self.client.step(flat.grad, flat.weights,
                                 loss=_flat.as_float(loss), no_gradient=absent,
                                 overflow=overflow)
                if scaled is not None:
                    _scaler.tell(scaled, self.client.round_skipped)
            if ov is not None:
                ov.probed = True
        finally:
            if ov is not None and not self.client.in_step:
                ov.end_step()
        flat.load()
        if late is not None:
            raise RuntimeError(f"DistributedOptimizer: {late} (this step "
                               "completed as it was pushed)")
        self._leaver.at_boundary(self)
        return loss

    def _local_step(self, closure):
        loss = self._inner.step(closure)
        self._local_done += 1
        if self._local_done >= self._local_steps:
            self.synchronize(loss)
        return loss

    @torch.no_grad()
    def synchronize(self, loss=None):
        """With local_steps > 1: pushes the weight change since the last
        synchronisation now (a no-op when there is none), with the buffers,
        and loads the new weights. A refused push raises (ValueError for a
        group's value, pserver.Error from the shards) and changes nothing."""
        if self._local_steps == 1 or self._local_done == 0:
            return
        hyper = self._hyper.to_send(self.param_groups)
        flat = self._flat
        # What the local steps moved, pushed in place of a gradient (with
        # outer_momentum, the worker's momentum step built from it).
        flat.moved_into(flat.grad)
        if self._outer is not None:
            self._outer.step(flat.grad[:flat.param_end])
        flat.put_buffers(flat.grad)
        self._set_hyper(hyper)
        try:
            self.client.step(flat.grad, flat.weights,
                             loss=_flat.as_float(loss))
        except BaseException:
            if self._outer is not None:
                self._outer.discard()  # refused: u as it was
            raise
        if self._outer is not None:
            self._outer.commit()
        self._local_done = 0
        flat.load()
        self._leaver.at_boundary(self)

    def state_dict(self):
        """torch.optim's layout plus the optimizer's state, for torch.save.

        "param_groups" is torch's (every entry but the parameters, which
        are indices), so a scheduler's state and torch.save({"model": ...,
        "optimizer": opt.state_dict()}) work as with torch.optim. "state"
        stays empty: the optimizer's state lives on the shards, and
        "pserver_shards" holds all of it, fetched now (one uint8 tensor per
        shard: its checkpoint bytes, about 16 bytes per parameter for Adam;
        every rank that calls this fetches it). This worker's own part:
        "pserver_client_state" (a uint8 tensor: error-feedback residuals,
        the record pserver_worker writes for --state_file) and, with
        outer_momentum,
        "pserver_outer_momentum". Also "layout", "worker_id",
        "num_workers", "global_step", "pserver_hyper_from_client".
        """
        return _state.save(self, super().state_dict())

    def load_state_dict(self, state_dict):
        """Restores a state_dict() of any worker of the job.

        Call it after construction and before the next step(), on every
        rank (each with its own file or all with rank 0's). Shards started
        fresh take the saved state (worker 0 sends it; the others wait for
        it); shards already at its step, restored from their own
        checkpoints, keep theirs; shards at any other step are refused
        (pserver.Error FAILED_PRECONDITION naming both steps) before
        anything changes. Another worker's dict: the shards' part is taken
        and this worker's residuals (and outer momentum) start from zero,
        said in one line on stderr. The param groups' entries (lr,
        weight_decay, a scheduler's initial_lr, ...) are restored as
        torch.optim does. Refused, with nothing changed: ValueError for
        something that is not such a dict, was saved for another model
        (naming the first differing tensor) or other groups, or holds a
        betas / eps other than the shards'; pserver.Error for another worker
        count or shard count, DATA_LOSS for a damaged record. A dict without
        "pserver_shards" (an earlier version's) restores the record only.
        """
        _state.load(self, state_dict)
