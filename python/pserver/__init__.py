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

from pserver.env import init

# How to build the extension, from the repository's root (pserver.launch
# prints it when the script's interpreter cannot import it).
_BUILD_NATIVE = ("cmake -S . -B build -DPSERVER_BUILD_PYTHON=ON && cmake "
                "--build build --target pserver_python")

try:
    from pserver._native import Client, Error
except ImportError as e:
    # Not built (deploy/local.sh builds only the daemons): pserver.launch
    # still imports, to say so in one line before it starts anything.
    _native_error = e

    def __getattr__(name):
        if name in ("Client", "Error"):
            raise ImportError(f"pserver.{name} needs the extension "
                              f"pserver._native ({_native_error}); build "
                              f"it: {_BUILD_NATIVE}") from _native_error
        raise AttributeError(f"module 'pserver' has no attribute {name!r}")

__all__ = ["Client", "Error", "init"]
