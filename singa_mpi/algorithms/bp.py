"""Back-propagation (``alg: kBP``): forward in topological order, backward in reverse
(the program: :func:`singa_mpi.program.build.bp_train`)."""
from __future__ import annotations

from singa_mpi.algorithms.base import Algorithm


class BackPropagation(Algorithm):
    """Param gradients start from zero each step and accumulate over the layers that use them."""
