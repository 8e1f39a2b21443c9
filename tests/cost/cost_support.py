"""Made-up kernel times and rates for exact arithmetic in the cost model's tests (tests/cost)."""
import math

from singa_mpi.cost.kernels import KernelTime
from singa_mpi.cost.rates import Link, Rates


class RowKernels:
    """Forward and backward of a layer cost ``per_item`` seconds per output number (deterministic)."""

    def __init__(self, per_item=1e-6):
        self.per_item = per_item

    def of(self, the_plan, sub):
        t = self.per_item * math.prod(sub.out_shape)
        return KernelTime(t, t)


def rates(p2p_bw=1e9, allreduce_bw=1e9, latency=1e-5, memory=1e10):
    return Rates(memory, Link(latency, p2p_bw), Link(latency, allreduce_bw), Link(latency, p2p_bw), "test")
