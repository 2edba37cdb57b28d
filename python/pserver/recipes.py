"""Named compression recipes: python3 -m pserver.launch --recipe NAME[:FREEZE].

A recipe is what both sides of a compressed run need and must agree on: the
shards' flags, the workers' pserver.Client options (the launcher hands them
to DistributedOptimizer through PSERVER_CLIENT_OPTIONS) and a compression
schedule file that both read. Each was measured for transformer training
with pserver.torch.DistributedOptimizer (tests/bench/lm_fidelity.py, rows
ps_onebit and ps_topk; figures in tests/bench/results/lm_fidelity.md):

  lm-onebit  1-bit Adam with the workers' momentum compressed (its decay 0.5
             after the freeze): 4-bit quantize both ways until the variance
             freezes at round FREEZE (default 300), 1-bit pushes and pulls
             after (deploy/schedules/q4_then_onebit.txtpb).
  lm-topk    the same optimizer; 8-bit quantize both ways until the freeze
             (default 200), then pushes of the top 1% of each worker's
             momentum (momentum-factor masking on the workers) and pulls of
             the top 3% of the weights' change at 4-bit values
             (deploy/schedules/q8_then_topk_pullq.txtpb).
  lm-local   local steps (DiLoCo; row diloco_h16_q2_b085): the script's own
             optimizer runs 16 steps between pushes (DistributedOptimizer
             local_steps=16 with an inner_optimizer; the shards refuse any
             other H), each worker keeps the outer Nesterov momentum at 0.85
             and pushes its step at 2 bits, the shards apply the mean with
             SGD at lr 0.6 and answer with 2-bit pulls. No freeze, no
             schedule (NAME only). H = 16 suits a run of about 2000 steps
             (125 rounds); a longer run keeps about as many rounds with a
             larger H: give the shards --local_steps=H too (the launcher
             puts yours after the recipe's: yours wins) and run H local
             steps in the script
             (H = 80 over 8000 steps, 1138x less traffic than fp32: row
             diloco_h80_q2_b085 of tests/bench/results/lm_long/).

FREEZE is 1-bit Adam's --freeze_step (the shards keep the variance of that
round for the rest of the run) and the round at which the schedule leaves
quantize. The defaults are what was measured on a 2000-step run with a
100-round learning-rate warmup: three times the warmup for lm-onebit (its
4-bit warmup costs half the 8-bit one, which pays for the later freeze;
frozen at 200 after 8-bit it ended 1.4% behind AdamW, at 300 after 4-bit
0.9%), twice for lm-topk. Advice: freeze at two to three times the learning
rate's warmup, 10-15% of the run.
"""

import re

_MAX_FREEZE = 2**63 - 1  # pserver_server's --freeze_step is a uint64

# 1-bit Adam as both recipes run it: bias-corrected (torch.optim.Adam's
# convention; onebit_adam's default is DeepSpeed's, without), the workers
# keeping and compressing the momentum, whose decay is 0.5 after the freeze.
_ONEBIT_ADAM = ("--optimizer=onebit_adam", "--bias_correction=true",
                "--onebit_momentum=worker", "--compression_beta1=0.5")
# Until the freeze: quantize both ways.
_Q8 = ("quantize", {"bits": 8})
_Q4 = ("quantize", {"bits": 4})


class Recipe:
    """One named recipe: shard flags and client options without the freeze
    and the schedule (which take FREEZE and the file's path), and the
    codecs, (name, params), of its two schedule phases; default_freeze
    is the freeze it was measured with (NAME without :FREEZE). A recipe
    without a freeze (default_freeze None) has no schedule either: its
    flags and options are all there is."""

    def __init__(self, name, summary, shard_flags, client_options, warmup=None,
                 compression=None, default_freeze=None):
        self.name = name
        self.default_freeze = default_freeze
        self.summary = summary
        # The shards announce the recipe's push codec as the job's
        # (pserver_server --push_codec): a worker that names none takes it.
        self._shard_flags = (*shard_flags,
                             f"--push_codec={client_options['push_codec']}")
        self._client_options = dict(client_options)
        self._phases = (("warmup", warmup), ("compression", compression))

    @property
    def freezes(self):
        """Whether the recipe has a freeze and a schedule."""
        return self.default_freeze is not None

    def shard_flags(self, freeze, schedule_path):
        """pserver_server's flags, as --name=value (freeze and
        schedule_path unused without a freeze)."""
        if not self.freezes:
            return list(self._shard_flags)
        return [self._shard_flags[0], f"--freeze_step={freeze}",
                *self._shard_flags[1:], f"--schedule={schedule_path}"]

    def client_options(self, schedule_path):
        """pserver.Client's options (JSON-serialisable), and
        DistributedOptimizer's outer_momentum where the recipe has one."""
        if not self.freezes:
            return dict(self._client_options)
        return {**self._client_options, "schedule": str(schedule_path)}

    def schedule_text(self, freeze):
        """The compression schedule in protobuf text format
        (pserver.v1.CompressionSchedule): phase "warmup" ends at round
        `freeze`, phase "compression" begins there."""
        lines = [f"# python3 -m pserver.launch --recipe "
                 f"{self.name}:{freeze} (pserver/recipes.py).",
                 "# The same file goes to the shards (--schedule) and the "
                 "workers (schedule=)."]
        for (name, (push, pull)), bound in zip(
                self._phases, (f"end_step: {freeze}",
                               f"begin_step: {freeze}")):
            lines += ["phases {", f'  name: "{name}"', f"  {bound}",
                      f"  push {_codec_text(push)}",
                      f"  pull {_codec_text(pull)}", "}"]
        return "\n".join(lines) + "\n"


def _codec_text(codec):
    name, params = codec
    if not params:
        return f'{{ codec: "{name}" }}'
    fields = " ".join(f"{k}: {v!r}" for k, v in params.items())
    return f'{{ codec: "{name}" params {{ {fields} }} }}'


RECIPES = {r.name: r for r in (
    Recipe("lm-onebit",
           "1-bit Adam, 4-bit quantize until the freeze, 1-bit both ways "
           "after",
           [*_ONEBIT_ADAM, "--pull_codec=onebit"],
           {"push_codec": "onebit"},
           warmup=(_Q4, _Q4),
           compression=(("onebit", {}), ("onebit", {})),
           default_freeze=300),
    Recipe("lm-topk",
           "1-bit Adam, 8-bit quantize until the freeze, then top 1% pushes "
           "and top 3% 4-bit pulls",
           [*_ONEBIT_ADAM, "--pull_codec=topk_quantize",
            "--pull_k_fraction=0.03", "--pull_bits=4"],
           {"push_codec": "topk", "k_fraction": 0.01,
            "momentum_masking": True},
           warmup=(_Q8, _Q8),
           compression=(("topk", {"k_fraction": 0.01}),
                        ("topk_quantize", {"k_fraction": 0.03, "bits": 4})),
           default_freeze=200),
    Recipe("lm-local",
           "local steps: H = 16, the workers' outer momentum 0.85, 2-bit "
           "quantize both ways, the shards' SGD at lr 0.6",
           ["--optimizer=sgd", "--momentum=0", "--weight_decay=0", "--lr=0.6",
            "--pull_codec=quantize", "--pull_bits=2", "--local_steps=16",
            "--lease_timeout_seconds=600"],
           {"push_codec": "quantize", "bits": 2, "outer_momentum": 0.85}),
)}


def parse(spec):
    """"NAME" or "NAME:FREEZE" -> (Recipe, freeze). Raises ValueError naming
    what is wrong and what is expected."""
    name, sep, freeze_text = spec.partition(":")
    recipe = RECIPES.get(name)
    if recipe is None:
        raise ValueError(f"recipe {name!r} is unknown; expected one of "
                         f"{', '.join(RECIPES)} (NAME, or NAME:FREEZE for "
                         "those with a freeze)")
    if not sep:
        return recipe, recipe.default_freeze
    if not recipe.freezes:
        raise ValueError(f"recipe {spec!r}: {name} has no freeze (its shards "
                         f"run SGD on the workers' local steps); expected "
                         f"{name}")
    if (not re.fullmatch(r"[0-9]+", freeze_text)
            or not 1 <= int(freeze_text) <= _MAX_FREEZE):
        raise ValueError(f"recipe {spec!r}: freeze is {freeze_text!r}; "
                         "expected an integer >= 1 (the round at which 1-bit "
                         "Adam's variance freezes, e.g. "
                         f"{name}:{recipe.default_freeze})")
    return recipe, int(freeze_text)
