"""The parameter groups of pserver.torch.DistributedOptimizer.

What torch.optim accepts as `params` (tensors, (name, tensor) pairs, or
param-group dicts) becomes the layout's named tensors and hyper-parameter
groups (pserver._native.Client.register's `groups` and `group_specs`), and
each group's "lr" and "weight_decay" become what the pushes carry
(Client.set_hyper). The shards own the rest of the update (Adam's betas and
eps, SGD's momentum): those entries are filled from the shards' flags and
checked against them, never sent.
"""

import math
import struct

import torch

# Per shard optimizer: the param-group entries the shards own, and the
# pserver_server flags that set them.
_OWNED = {
    "adam": {"betas": "--beta1 and --beta2", "eps": "--eps"},
    "onebit_adam": {"betas": "--beta1 and --beta2", "eps": "--eps"},
    "sgd": {"momentum": "--momentum", "nesterov": "--nesterov"},
}
_ALL_OWNED = ("betas", "eps", "momentum", "nesterov")


def _f32(x):
    """x rounded to float32 (how the shards hold every hyper-parameter)."""
    try:
        return struct.unpack("f", struct.pack("f", float(x)))[0]
    except OverflowError:
        return math.copysign(math.inf, x)


def tidy(x):
    """The shortest decimal that is the same float32 as x: the shards' 0.9
    (0.8999999761581421 as a double) reads back as 0.9."""
    x = float(x)
    if not math.isfinite(x):
        return x
    for digits in range(1, 10):
        y = float(f"{x:.{digits}g}")
        if _f32(y) == _f32(x):
            return y
    return x


def _same(given, shard):
    """Equal as the shards would hold them (float32; tuples elementwise)."""
    if isinstance(shard, bool):
        return bool(given) == shard
    if isinstance(shard, tuple):
        try:
            given = tuple(given)
        except TypeError:
            return False
        return len(given) == len(shard) and all(
            _same(a, b) for a, b in zip(given, shard))
    try:
        return _f32(given) == _f32(shard)
    except (TypeError, ValueError):
        return False


def hyper_value(value, where):
    """A learning rate or weight decay as a float: ValueError naming `where`
    unless it is a finite number >= 0 (TypeError for a non-number)."""
    if isinstance(value, bool) or value is None:
        raise TypeError(f"{where} is {value!r}; expected a finite number "
                        ">= 0")
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{where} is a {type(value).__name__}; expected a "
                        "finite number >= 0") from None
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{where} is {v!r}; expected a finite number >= 0")
    return v


def _check_owned(group, owned, name, tail, kind=None, none_given=False):
    """ValueError when an entry the shards own (`owned`: entry -> (their
    value, their flags)) is given in `group` with another value: "<name(key)>
    is <given>; the shards' is <value> (pserver_server <flags><tail>". With
    the shards' optimizer `kind`, also for an owned-elsewhere entry (betas
    for sgd) that this optimizer has not. `none_given`: an owned entry
    present as None counts as given (and differs)."""
    for key in _ALL_OWNED:
        given = group.get(key)
        if given is None and not (none_given and key in owned
                                  and key in group):
            continue
        if key not in owned:
            if kind is None:
                continue
            other = ", ".join(f"{k}: pserver_server {f}"
                              for k, (_, f) in owned.items())
            raise ValueError(
                f"{name(key)} is {given!r}; the shards run "
                f"--optimizer={kind}, which has no {key} ({other})")
        value, flags = owned[key]
        if not _same(given, value):
            raise ValueError(f"{name(key)} is {given!r}; the shards' is "
                             f"{value!r} (pserver_server {flags}{tail}")


def split(params, module):
    """params as torch.optim takes them -> [(group dict without 'params',
    [(name, tensor), ...])], every tensor given (frozen ones included).

    Names: a pair's own; else the module's name for that tensor (by
    identity); else "group<g>.param<i>" (i: its index in the group as
    given). Each tensor may appear once, each name once.
    """
    if isinstance(params, (torch.Tensor, dict)):
        raise TypeError(
            f"params is a {type(params).__name__}; expected an iterable of "
            "tensors, of (name, tensor) pairs or of param-group dicts, as "
            "torch.optim takes (a single group: [group])")
    items = list(params)
    if not items:
        raise ValueError("params is empty; expected at least one tensor")
    groups = items if isinstance(items[0], dict) else [{"params": items}]
    module_names = {}
    if module is not None:
        for name, p in module.named_parameters():
            module_names.setdefault(id(p), name)
    seen, names, out = {}, set(), []
    for g, group in enumerate(groups):
        if not isinstance(group, dict):
            raise TypeError(f"params[{g}] is a {type(group).__name__}; "
                            "expected a param-group dict, as params[0]")
        if "params" not in group:
            raise ValueError(f"param group {g} has no 'params'; expected "
                             "{'params': [tensors], ...}")
        ps = group["params"]
        if isinstance(ps, torch.Tensor):
            ps = [ps]
        elif isinstance(ps, set):
            raise TypeError(f"param group {g}'s params is a set; expected "
                            "an ordered collection (a list): every worker "
                            "must give the same order")
        entries = []
        for i, item in enumerate(ps):
            if (isinstance(item, tuple) and len(item) == 2
                    and isinstance(item[0], str)):
                name, p = item
            else:
                name, p = None, item
            if not isinstance(p, torch.Tensor):
                raise TypeError(
                    f"param group {g}'s params[{i}] is a "
                    f"{type(p).__name__}; expected a torch.Tensor or a "
                    "(name, tensor) pair")
            if name is None:
                name = module_names.get(id(p), f"group{g}.param{i}")
            if id(p) in seen:
                raise ValueError(
                    f"parameter {name!r} is given twice (also as "
                    f"{seen[id(p)]!r}); expected each tensor once (a tied "
                    "weight once, as model.parameters() gives it)")
            if name in names:
                raise ValueError(f"two parameters are named {name!r}; "
                                 "expected unique names")
            seen[id(p)] = name
            names.add(name)
            entries.append((name, p))
        out.append(({k: v for k, v in group.items() if k != "params"},
                    entries))
    return out


class GroupHyper:
    """The hyper-parameters of an optimizer's param_groups, for the shards.

    prepare() resolves each group's entries before registration; fill()
    completes them from the shards' configuration after it; to_send() is
    what a push carries: None (the shards' own schedule and each group's
    registered weight decay) until the caller has set an lr or changed a
    group's lr / weight_decay from what fill() put there, then every
    group's (lr, weight_decay) on every push (sticky).
    """

    def __init__(self, lr, weight_decay, betas, eps):
        self.defaults = {"lr": None if lr is None else
                         hyper_value(lr, "lr"),
                         "weight_decay": None if weight_decay is None else
                         hyper_value(weight_decay, "weight_decay"),
                         "betas": None if betas is None else tuple(betas),
                         "eps": eps, "lr_scale": 1.0}
        self.from_client = lr is not None
        self.baseline = None
        self.owned = {}  # entry -> (the shards' value, the flags)
        self.sent_groups = []  # indices of the groups with layout tensors

    def prepare(self, g, given):
        """The group dict (without 'params') for param group g, from the
        user's `given` entries and the constructor's defaults."""
        group = dict(given)
        explicit_lr = group.get("lr") is not None
        if explicit_lr and "lr_scale" in group:
            raise ValueError(f"param group {g} gives both lr and lr_scale; "
                             "expected one (lr_scale scales the default lr)")
        scale = hyper_value(group.get("lr_scale", 1.0),
                            f"param group {g}: lr_scale")
        group["lr_scale"] = scale
        if explicit_lr:
            group["lr"] = hyper_value(group["lr"], f"param group {g}: lr")
            self.from_client = True
        elif self.defaults["lr"] is not None:
            group["lr"] = self.defaults["lr"] * scale
        else:
            group["lr"] = None
        wd = group.get("weight_decay", self.defaults["weight_decay"])
        group["weight_decay"] = None if wd is None else hyper_value(
            wd, f"param group {g}: weight_decay")
        for key in ("betas", "eps"):
            if group.get(key) is None:
                group[key] = self.defaults[key]
        return group

    def adam_hyper(self, groups):
        """The betas and eps the groups give, for the shards' Register
        (Client's beta1, beta2, eps; the first registration sets those the
        shards' flags leave out): a dict of the given ones. ValueError when
        two groups give different ones (the shards run one)."""
        out = {}
        for key in ("betas", "eps"):
            first = None
            for g, group in enumerate(groups):
                value = group.get(key)
                if value is None:
                    continue
                try:
                    value = (tuple(float(b) for b in value) if key == "betas"
                             else float(value))
                except (TypeError, ValueError):
                    raise ValueError(f"param group {g}: {key} is {value!r}; "
                                     "expected " + ("two floats" if key ==
                                                    "betas" else "a float"))
                if key == "betas" and len(value) != 2:
                    raise ValueError(f"param group {g}: betas is {value!r}; "
                                     "expected two floats")
                if first is None:
                    first = (g, value)
                elif not _same(value, first[1]):
                    raise ValueError(
                        f"param group {g}: {key} is {value!r}; param group "
                        f"{first[0]}'s is {first[1]!r}; expected one {key} "
                        "for every group (the shards run one)")
            if first is not None and key == "betas":
                out["beta1"], out["beta2"] = first[1]
            elif first is not None:
                out["eps"] = first[1]
        return out

    def specs(self, groups):
        """Client.register's group_specs: one per group that has layout
        tensors (self.sent_groups, set by the caller), in order."""
        return [{"lr_scale": groups[g]["lr_scale"],
                 "weight_decay": groups[g]["weight_decay"]}
                for g in self.sent_groups]

    def fill(self, groups, defaults, config):
        """Completes groups (and the optimizer's defaults) from the shards'
        configuration (Client.shard_config); ValueError naming the group,
        the entry, both values and the flag when a given betas / eps /
        momentum / nesterov is not the shards', changing nothing then."""
        kind = config.get("optimizer")
        if kind not in _OWNED:
            raise ValueError(f"the shards run optimizer {kind!r}; expected "
                             f"one of {sorted(_OWNED)}")
        owned = {}
        for key, flags in _OWNED[kind].items():
            if key == "betas":
                value = (tidy(config["beta1"]), tidy(config["beta2"]))
            elif key == "nesterov":
                value = bool(config["nesterov"])
            else:
                value = tidy(config[key])
            owned[key] = (value, flags)
        for g, group in enumerate(groups):
            _check_owned(group, owned, lambda k: f"param group {g}: {k}",
                         " set it; give the same or leave it out)", kind)
        self.owned = owned
        lr, wd = tidy(config["lr"]), tidy(config["weight_decay"])
        for group in [*groups, defaults]:
            for key in _ALL_OWNED:
                if key in owned:
                    if group.get(key) is None:
                        group[key] = owned[key][0]
                elif key in group:
                    del group[key]
            if group.get("lr") is None:
                group["lr"] = lr * group.get("lr_scale", 1.0)
            if group.get("weight_decay") is None:
                group["weight_decay"] = wd
        self.baseline = [(g["lr"], g["weight_decay"]) for g in groups]

    def check(self, groups):
        """[(lr, weight_decay)] of every group, checked: ValueError naming
        the group and entry for a value that is not finite or negative, or
        an entry the shards own that differs from theirs (e.g. betas cycled
        by OneCycleLR)."""
        values = []
        for g, group in enumerate(groups):
            where = f"param_groups[{g}]"
            lr = hyper_value(group.get("lr"), f"{where}['lr']")
            wd = hyper_value(group.get("weight_decay"),
                             f"{where}['weight_decay']")
            _check_owned(group, self.owned,
                         lambda k, where=where: f"{where}['{k}']",
                         ") and they do not schedule it: a scheduler that "
                         "cycles momentum (OneCycleLR, CyclicLR) needs "
                         "cycle_momentum=False", none_given=True)
            values.append((lr, wd))
        return values

    def to_send(self, groups):
        """Client.set_hyper's argument for the next push (after check())."""
        values = self.check(groups)
        if not self.from_client and values != self.baseline:
            self.from_client = True
        if not self.from_client:
            return None
        return [values[g] for g in self.sent_groups]

    def check_loaded(self, saved_groups):
        """ValueError for saved param groups whose entries cannot go to these
        shards (checked before load_state_dict changes anything)."""
        for g, group in enumerate(saved_groups):
            where = f"state_dict param group {g}"
            for key in ("lr", "weight_decay"):
                hyper_value(group.get(key), f"{where}: {key}")
            _check_owned(group, self.owned,
                         lambda k, where=where: f"{where}: {k}", ")")
