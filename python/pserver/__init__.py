"""pserver from Python: train through the parameter server's shards.

    import pserver.torch
    opt = pserver.torch.DistributedOptimizer(model.named_parameters(),
                                             **pserver.init())
    loss.backward(); opt.step(); opt.zero_grad()

`Client` is the C++ client library (worker/client.h) over float32 buffers;
`Error` is raised for every refused or failed call (`code`: the gRPC code
name, `reason`: the shard's RejectReason name or None). The optimizer runs on
the shards: its kind, betas and eps are the pserver_server flags;
pserver.torch's param groups send their lr and weight decay with each push.
"""

from pserver._native import Client, Error
from pserver.env import init

__all__ = ["Client", "Error", "init"]
