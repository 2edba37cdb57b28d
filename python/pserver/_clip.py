"""clip_scope= for pserver.torch.DistributedOptimizer: where max_grad_norm
clips. "worker" (the default) clips this worker's gradient before it is
encoded; "mean" has the shards clip each round's mean gradient by its
global norm, as DDP with clip_grad_norm_ does (PushRequest.clip_norm): the
shards hold the summed round, each worker pulls every shard's part of the
norm, and its weights pull carries the total. That costs each step one
small pull per shard (one round trip) and works with overlap=True, since
nothing changes the gradient after backward."""

SCOPES = ("worker", "mean")


def configure(clip_scope, max_grad_norm, local_steps):
    """ValueError naming the option unless the combination is served."""
    if clip_scope not in SCOPES:
        raise ValueError(f"clip_scope is {clip_scope!r}; expected one of "
                         f"{', '.join(SCOPES)}")
    if clip_scope == "mean" and max_grad_norm is None:
        raise ValueError("clip_scope is 'mean' but max_grad_norm is None; "
                         "expected max_grad_norm=X (the norm to clip to)")
    if clip_scope == "mean" and local_steps > 1:
        raise ValueError("clip_scope is 'mean' with local_steps > 1; the "
                         "pushes are weight changes, not gradients: clip in "
                         "the inner optimizer's loop instead")


def start(opt, clip_scope, max_grad_norm):
    """After registration: the shards clip the mean (clip_scope "mean"),
    refused for 1-bit Adam, whose compression stage pushes momentum."""
    if clip_scope != "mean":
        return
    kind = opt.client.shard_config.get("optimizer")
    if kind == "onebit_adam":
        raise ValueError(
            "clip_scope is 'mean' but the shards run onebit_adam, whose "
            "pushes after the freeze carry the workers' momentum, not "
            "gradients; expected clip_scope='worker' with this optimizer")
    opt.client.set_clip_norm(max_grad_norm)
