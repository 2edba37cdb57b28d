"""What DDP's comm hooks send, for the fidelity benchmarks' DDP rows.

count_allreduces() wraps torch.distributed.all_reduce (the hooks call it
through the module) so that every tensor a hook reduces adds its bytes to
the returned counter's `bytes`; a ring allreduce sends that times 2(N-1)/N
per rank, and receives as much.
"""

import torch.distributed as dist


class _Counter:
    bytes = 0


def count_allreduces():
    counter = _Counter()
    real_all_reduce = dist.all_reduce

    def counting_all_reduce(tensor, *a, **k):
        counter.bytes += tensor.numel() * tensor.element_size()
        return real_all_reduce(tensor, *a, **k)

    dist.all_reduce = counting_all_reduce
    return counter
