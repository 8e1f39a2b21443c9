"""Back-propagation (``alg: kBP``): forward in topological order, backward in reverse."""
from __future__ import annotations

from singa_mpi.algorithms.base import Algorithm, LayerDone, backward_pass, forward_pass
from singa_mpi.net import Net


class BackPropagation(Algorithm):
    """Param gradients start from zero each step and accumulate over the layers that use them."""

    def train_one_batch(self, net: Net, on_layer_done: LayerDone | None = None) -> None:
        net.zero_grads()
        forward_pass(net, "forward", train=True)
        backward_pass(net, on_layer_done)
        net.finish_grads()
