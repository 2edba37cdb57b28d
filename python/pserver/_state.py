"""DistributedOptimizer.state_dict() / load_state_dict(): the optimizer's
state where a training script keeps torch.optim's, in its own checkpoint.

What torch.optim keeps in "state" (Adam's moments, the step) lives on the
shards here, so state_dict() fetches every shard's whole state (its
checkpoint bytes: weights, moments, 1-bit Adam's frozen variance and stage,
step, replica) into "pserver_shards", next to this worker's own part (its
error-feedback residuals, "pserver_client_state"; the outer momentum with
local steps). load_state_dict() of such a dict, on any rank:
  - shards with no rounds yet (a job started afresh) take it: worker 0
    sends it, the other workers wait until it is there;
  - shards already at its step with its replica (restored from their own
    checkpoints) are left as they are;
  - shards of a running job past its step (the job went on while this
    worker was away) keep theirs, said in one line on stderr;
  - any other shard is refused (pserver.Error FAILED_PRECONDITION, reason
    REJECT_REASON_STATE_MISMATCH, naming both steps) before anything changes;
  - another worker's dict (every rank loading rank 0's file): the shards'
    part is taken, not the saver's own part (this worker keeps its own, zero
    after construction), and one line on stderr says so.
"""

import copy
import sys
import warnings

import torch

from pserver import _outer

RECORD = "pserver_client_state"
SHARDS = "pserver_shards"


def _as_tensor(data):
    """bytes as a uint8 tensor sharing them (torch.save writes tensors as
    raw storage, not as pickled bytes)."""
    if not data:
        return torch.zeros(0, dtype=torch.uint8)
    with warnings.catch_warnings():
        # The tensor is only read: bytes being read-only is fine.
        warnings.simplefilter("ignore", UserWarning)
        return torch.frombuffer(data, dtype=torch.uint8)


def _raw(data, what):
    """A 1-d torch.uint8 tensor (what save() writes; as a numpy view, not
    copied) or bytes (an earlier version's record); ValueError naming
    `what` for anything else."""
    if isinstance(data, (bytes, bytearray)):
        return data
    if not isinstance(data, torch.Tensor):
        raise ValueError(f"{what} is a {type(data).__name__}; expected a "
                         "1-d torch.uint8 tensor")
    if data.dtype != torch.uint8 or data.dim() != 1:
        raise ValueError(f"{what} is {data.dtype} of shape "
                         f"{list(data.shape)}; expected a 1-d torch.uint8 "
                         "tensor")
    return data.detach().to("cpu").contiguous().numpy()


def save(opt, out):
    """Adds the shards' state and this worker's part to `out` (torch's
    state_dict() of the optimizer's param groups)."""
    flat = opt._flat
    shards = opt.client.fetch_shard_states()
    out.update({
        RECORD: _as_tensor(opt.client.serialize_state()),
        SHARDS: [{"step": step, "replica_checksum": checksum,
                  "state": _as_tensor(data)}
                 for step, checksum, data in shards],
        "layout": [(n, tuple(s)) for n, s in zip(flat.names, flat.shapes)],
        "worker_id": opt._where["worker_id"],
        "num_workers": opt._where["num_workers"],
        "global_step": opt.client.global_step,
        "pserver_hyper_from_client": opt._hyper.from_client,
    })
    if opt._outer is not None:
        out[_outer.OuterMomentum.KEY] = opt._outer.state()
    return out


def _shard_states(saved):
    """The "pserver_shards" entry as install_shard_states() takes it;
    ValueError for anything else."""
    if not isinstance(saved, (list, tuple)):
        raise ValueError(f"state_dict[{SHARDS!r}] is a "
                         f"{type(saved).__name__}; expected a list, as "
                         "DistributedOptimizer.state_dict() gives")
    out = []
    for s, entry in enumerate(saved):
        if (not isinstance(entry, dict)
                or not isinstance(entry.get("step"), int)
                or not isinstance(entry.get("replica_checksum"), int)
                or not isinstance(entry.get("state"),
                                  (torch.Tensor, bytes, bytearray))):
            raise ValueError(f"state_dict[{SHARDS!r}][{s}] is not a dict of "
                             "step, replica_checksum and state; expected "
                             "DistributedOptimizer.state_dict()'s")
        data = _raw(entry["state"], f"state_dict[{SHARDS!r}][{s}]['state']")
        out.append((entry["step"], entry["replica_checksum"], data))
    return out


def load(opt, state_dict):
    """DistributedOptimizer.load_state_dict (see the module docstring)."""
    if not isinstance(state_dict, dict) or RECORD not in state_dict:
        raise ValueError(
            f"state_dict is a {type(state_dict).__name__} without "
            f"{RECORD!r}; expected a dict from "
            "DistributedOptimizer.state_dict()")
    record = bytes(_raw(state_dict[RECORD], f"state_dict[{RECORD!r}]"))
    saved_groups = state_dict.get("param_groups")
    if saved_groups is not None:
        _check_saved_groups(opt, saved_groups)
    layout = state_dict.get("layout")
    if layout is not None:
        _check_layout(opt, layout)
    outer = state_dict.get(_outer.OuterMomentum.KEY)
    if (outer is None) != (opt._outer is None):
        raise ValueError(
            f"state_dict {'has no' if outer is None else 'has an'} "
            f"{_outer.OuterMomentum.KEY!r}; expected "
            f"{'one' if opt._outer is not None else 'none'}, as this "
            "optimizer was made with outer_momentum="
            f"{None if opt._outer is None else opt._outer.beta}")
    shards = state_dict.get(SHARDS)
    if shards is not None:
        shards = _shard_states(shards)
    me = opt._where["worker_id"]
    saver = state_dict.get("worker_id", me)
    own = saver == me
    before = None if opt._outer is None else opt._outer.u
    if outer is not None:
        opt._outer.load(outer)  # checked: refused leaves u as it was
        if not own:
            opt._outer.u = before  # another worker's: only checked
    outcome = {"installed": 0, "shards_ahead": False}
    try:
        if shards is not None:
            outcome = opt.client.install_shard_states(shards,
                                                      out=opt._flat.weights)
        if own:
            opt.client.restore_state(record, "state_dict")
    except BaseException:
        if before is not None:
            opt._outer.u = before  # refused: nothing changed here
        raise
    if getattr(opt.client, "follower", False):
        pass  # local rank 0 of this machine said it
    elif outcome["shards_ahead"]:
        print(f"pserver: the job's shards are at step "
              f"{opt.client.global_step}, past this state_dict's step "
              f"{state_dict.get('global_step')} (they went on while this "
              "worker was away): their optimizer state stays, this worker's "
              f"own part {'is' if own else 'is not'} restored",
              file=sys.stderr, flush=True)
    elif not own:
        own_part = ("error-feedback residuals and outer momentum"
                    if outer is not None else "error-feedback residuals")
        print(f"pserver: this state_dict is worker {saver}'s; worker {me} "
              f"takes the shards' optimizer state from it, not worker "
              f"{saver}'s {own_part} (worker {me}'s stay as they are, zero "
              "after construction: a few steps of error feedback, not the "
              "run's state)", file=sys.stderr, flush=True)
    elif shards is None and state_dict.get("global_step") not in (
            None, opt.client.global_step):
        print(f"pserver: this state_dict (of step "
              f"{state_dict.get('global_step')}) holds no shard state; the "
              f"shards' own state at step {opt.client.global_step} stays "
              "(save it again with this version to carry the optimizer "
              "state)", file=sys.stderr, flush=True)
    opt._flat.load()
    if saved_groups is not None:
        for group, saved in zip(opt.param_groups,
                                copy.deepcopy(saved_groups)):
            saved.pop("params", None)
            group.update(saved)
        if state_dict.get("pserver_hyper_from_client"):
            opt._hyper.from_client = True


def _check_saved_groups(opt, saved):
    if (not isinstance(saved, list)
            or not all(isinstance(g, dict) for g in saved)):
        raise ValueError("state_dict['param_groups'] is not a list of "
                         "dicts; expected DistributedOptimizer."
                         "state_dict()'s")
    if len(saved) != len(opt.param_groups):
        raise ValueError(f"state_dict has {len(saved)} param groups; "
                         f"expected {len(opt.param_groups)}")
    for g, (s, mine) in enumerate(zip(saved, opt.param_groups)):
        n = len(s.get("params", ()))
        if n != len(mine["params"]):
            raise ValueError(f"state_dict param group {g} has {n} "
                             f"parameters; expected {len(mine['params'])}")
    opt._hyper.check_loaded(saved)


def _check_layout(opt, layout):
    try:
        layout = [(str(n), [int(d) for d in shape]) for n, shape in layout]
    except (TypeError, ValueError):
        raise ValueError("state_dict['layout'] is not a list of "
                         "(name, shape) pairs; expected the layout "
                         "of DistributedOptimizer.state_dict()") from None
    mine = list(zip(opt._flat.names, opt._flat.shapes))
    for i, (saved, have) in enumerate(zip(layout, mine)):
        if (saved[0], list(saved[1])) != (have[0], list(have[1])):
            raise ValueError(
                f"state_dict layout[{i}] is {saved[0]!r} with shape "
                f"{list(saved[1])}; expected {have[0]!r} with shape "
                f"{list(have[1])} (the state of another model)")
    if len(layout) != len(mine):
        raise ValueError(f"state_dict layout has {len(layout)} tensors; "
                         f"expected {len(mine)} (the state of another model)")
