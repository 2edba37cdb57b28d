"""One push per machine: the workers of a machine reduce inside it first.

With python3 -m pserver.launch --push-per node, the G workers of a machine
form a gloo group over loopback (torch's ProcessGroupGloo on a TCPStore the
machine's launcher hosts). Every step they average their gradients (and
buffers) there; local rank 0, the machine's only pserver client, pushes
that mean with its own error feedback and pulls the round's weights, which
it broadcasts to the others. The shards count machines, not processes: a
round is one push per machine, and its mean over the N machines is the mean
over all G x N workers (every machine has G). The others never contact a
shard; they mirror what local rank 0 learns (the step, the shards'
settings, a skipped round) and raise what it raises.

BytePS and ZeRO++'s hierarchical gradients reduce inside a machine for the
same reason: the machine's link then carries one compressed copy a step,
not G.
"""

import datetime
import json

import torch
import torch.distributed as dist

# The header local rank 0 broadcasts after a call: how it went, then the
# call's numbers (a step's round_skipped and the shards' step).
_FAILED = 1.0
_NUMBERS = 2
_SHARED = ("global_step", "round_skipped", "shard_config")


def client(spec, overlap, flat, where, make):
    """DistributedOptimizer's client: make(worker_id, num_workers), a
    pserver.Client, when the machine's workers push each on their own (spec
    None), else a NodeClient over the machine's group, holding local rank
    0's make(node, nodes): the shards' worker is the machine. ValueError
    for what one push per machine does not serve."""
    if spec is None:
        return make(where["worker_id"], where["num_workers"])
    if overlap:
        raise ValueError("overlap=True pushes each gradient as backward "
                         "produces it; with one push per machine (--push-per "
                         "node) the machine's mean is pushed after backward: "
                         "use overlap=False")
    group = NodeGroup(spec)
    reduced = (flat.param_end if flat.buffer_mode == "broadcast"
               else flat.grad.numel())
    own = make(spec["node"], spec["nodes"]) if group.leader else None
    return NodeClient(group, own, len(flat.params), reduced)


class NodeGroup:
    """The machine's workers as one gloo group over loopback."""

    def __init__(self, spec, timeout_s=1800.0):
        self.rank, self.size = spec["local_rank"], spec["local_size"]
        self.leader = self.rank == 0
        timeout = datetime.timedelta(seconds=timeout_s)
        store = dist.TCPStore(spec["host"], spec["port"], None, False,
                              timeout=timeout)
        self._store = dist.PrefixStore("pserver/node", store)
        opts = dist.ProcessGroupGloo._Options()
        opts._devices = [dist.ProcessGroupGloo.create_device(
            hostname="127.0.0.1")]
        opts._timeout = timeout
        self._pg = dist.ProcessGroupGloo(
            dist.PrefixStore("pserver/gloo", store), self.rank, self.size,
            opts)
        self._seq = 0

    def sum_(self, t):
        if self.size > 1:
            self._pg.allreduce([t]).wait()
        return t

    def broadcast_(self, t):
        if self.size > 1:
            self._pg.broadcast(t, 0).wait()
        return t

    def lead(self, fn, share=None, numbers=None):
        """On local rank 0: runs fn() and tells the others how it went,
        returning fn()'s result. Elsewhere: returns what local rank 0 told,
        or raises its error. `numbers(result)`, _NUMBERS floats, ride in the
        header every call broadcasts (a step's outcome: nothing else moves);
        `share(result)`, anything JSON, goes through the store (Register's
        settings), as does an error's text: a step writes no key."""
        self._seq += 1
        key = f"call{self._seq}"
        head = torch.zeros(1 + _NUMBERS, dtype=torch.float64)
        if self.leader:
            try:
                result = fn()
            except BaseException as e:
                self._store.set(key, json.dumps(_describe(e)))
                head[0] = _FAILED
                self.broadcast_(head)
                raise
            if share is not None:
                self._store.set(key, json.dumps(share(result)))
            if numbers is not None:
                head[1:] = torch.tensor(numbers(result), dtype=torch.float64)
            self.broadcast_(head)
            return result
        self.broadcast_(head)
        if head[0] == _FAILED:
            raise _rebuild(json.loads(self._store.get(key).decode()))
        if share is not None:
            return json.loads(self._store.get(key).decode())
        return head[1:].tolist()


def _describe(e):
    return {"type": type(e).__name__, "message": str(e),
            "code": getattr(e, "code", None),
            "reason": getattr(e, "reason", None)}


def _rebuild(told):
    text = ("this machine's pushing worker (local rank 0) failed: "
            f"{told['message']}")
    if told["type"] == "Error":
        from pserver._native import Error
        err = Error(text)
        err.code, err.reason = told["code"], told["reason"]
        return err
    kind = {"ValueError": ValueError, "TypeError": TypeError}.get(
        told["type"], RuntimeError)
    return kind(text)


class NodeClient:
    """What DistributedOptimizer uses of pserver.Client, for a worker of a
    machine that pushes once: local rank 0 wraps the real client, the
    others hold none. `reduced` is how much of the flat buffer the machine
    averages (the parameters, and the buffers unless they are the shards'
    broadcast ones: rank 0's own values)."""

    def __init__(self, group, client, num_params, reduced):
        self.group, self._client = group, client
        self.follower = client is None
        self._num_params, self._reduced = num_params, reduced
        self._mirror = {"global_step": 0, "round_skipped": False,
                        "shard_config": {}}
        self._steps = 0

    def __getattr__(self, name):
        # shard_config, global_step, round_skipped, ...
        if name.startswith("_") or name in ("group", "follower"):
            raise AttributeError(name)
        if self._client is not None:
            return getattr(self._client, name)
        if name in self._mirror:
            return self._mirror[name]
        raise AttributeError(
            f"{name}: on a machine that pushes once (python3 -m "
            "pserver.launch --push-per node) only local rank 0 holds a "
            "pserver.Client")

    @property
    def in_step(self):
        return False

    @property
    def residual_norm(self):
        """local rank 0's; elsewhere 0.0: the others owe the shards
        nothing (their gradients went into the machine's mean)."""
        return 0.0 if self._client is None else self._client.residual_norm

    @property
    def metrics_port(self):
        return None if self._client is None else self._client.metrics_port

    def _share(self, _result=None):
        c = self._client
        return {k: getattr(c, k) for k in _SHARED}

    def _take(self, told):
        if self.follower:
            self._mirror.update(told)

    def register(self, *args, out, **kwargs):
        c = self._client

        def share(_):
            return dict(self._share(), stats_keys=list(c.stats()))
        self._take(self.group.lead(
            lambda: c.register(*args, out=out, **kwargs), share=share))
        self.group.broadcast_(out)

    def step(self, grad, weights, loss=None, no_gradient=(), overflow=False):
        """The machine's mean gradient pushed once; the round's weights in
        `weights` on every worker of the machine."""
        g, c = self.group, self._client
        absent = list(no_gradient)
        if g.size > 1:
            g.sum_(grad[:self._reduced]).div_(g.size)
            # Per parameter: how many of the machine's workers have a
            # gradient; then overflow and the loss.
            marks = torch.ones(self._num_params + 2, dtype=torch.float64)
            marks[absent] = 0.0
            marks[-2] = 1.0 if overflow else 0.0
            marks[-1] = float("nan") if loss is None else float(loss)
            g.sum_(marks)
            absent = (marks[:-2] == 0.0).nonzero().flatten().tolist()
            overflow = bool(marks[-2] > 0)
            loss = None if loss is None else float(marks[-1]) / g.size
        self._steps += 1
        told = g.lead(
            lambda: c.step(grad, weights, loss=loss, no_gradient=absent,
                           overflow=overflow),
            numbers=lambda _: (float(c.round_skipped), float(c.global_step)))
        if self.follower:
            self._mirror["round_skipped"] = bool(told[0])
            self._mirror["global_step"] = int(told[1])
        g.broadcast_(weights)

    def set_hyper(self, hyper):
        if self._client is not None:
            self._client.set_hyper(hyper)

    def set_clip_norm(self, norm):
        if self._client is not None:
            self._client.set_clip_norm(norm)

    def stats(self):
        """local rank 0's counters; elsewhere the same keys, zero but for
        steps (nothing of this process goes to a shard)."""
        if self._client is not None:
            return self._client.stats()
        return {k: (self._steps if k == "steps" else 0)
                for k in self._mirror.get("stats_keys", ("steps",))}

    def _only_leader(self, what):
        raise RuntimeError(
            f"DistributedOptimizer.{what}: with one push per machine "
            "(--push-per node) the optimizer's state is local rank 0's (its "
            "client's residuals, the shards' state it fetches); call it on "
            "the process with LOCAL_RANK 0 (rank 0 saving the checkpoint "
            "is one of those)")

    def fetch_shard_states(self):
        if self._client is None:
            self._only_leader("state_dict()")
        return self._client.fetch_shard_states()

    def serialize_state(self):
        if self._client is None:
            self._only_leader("state_dict()")
        return self._client.serialize_state()

    def install_shard_states(self, shards, out):
        c = self._client
        outcome = self.group.lead(
            lambda: c.install_shard_states(shards, out=out),
            share=lambda r: dict(r, **self._share()))
        if self.follower:
            self._take({k: outcome.pop(k) for k in _SHARED})
        self.group.broadcast_(out)
        return outcome

    def restore_state(self, record, what):
        if self._client is not None:
            self._client.restore_state(record, what)
