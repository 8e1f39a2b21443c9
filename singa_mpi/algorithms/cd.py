"""Contrastive divergence (``alg: kCD``, ``cd_conf { cd_k }``): SINGA 0.3's CDWorker, on any partitioning.

One step (seed 003; SINGA's worker.cc:507-533):

1. the positive pass over every layer in topological order: layers below an
   RBM compute as in BP (their params stay frozen), an RBM's hidden layer
   computes h⁺ from its input v⁺;
2. ``cd_k`` Gibbs rounds for each RBM pair: the top-down half (the hidden layer
   samples ĥ and sends ĥ·W down the pair's edge, backwards through any
   connection layers, which sum the partial products of split hidden units),
   then the negative pass up the edge (v⁻, then h⁻);
3. each RBM layer adds its CD-k gradient; ``on_layer_done`` lets the sync
   strategy start the sums; the trainer then updates as for any param.

Test and validation batches run the positive pass and one reconstruction, whose
error the visible layer reports.  Which params train: those of the RBM layers;
every other param is loaded or initialised and left alone (:func:`trained_layer`).
"""
from __future__ import annotations

from singa_mpi.algorithms.base import Algorithm, LayerDone, forward_pass
from singa_mpi.layers.base import Layer
from singa_mpi.net import Net, Wire
from singa_mpi.proto import job_pb2


class ContrastiveDivergence(Algorithm):
    def __init__(self, cd_k: int = 1):
        if cd_k < 1:
            raise ValueError(f"cd_k = {cd_k}: expected at least 1 Gibbs round")
        self.cd_k = int(cd_k)

    @classmethod
    def from_conf(cls, conf: job_pb2.AlgProto) -> ContrastiveDivergence:
        return cls(conf.cd_conf.cd_k)

    @staticmethod
    def trains(layer_cls: type[Layer]) -> bool:
        return bool(layer_cls.energy_role)

    def train_one_batch(self, net: Net, on_layer_done: LayerDone | None = None) -> None:
        net.zero_grads()
        forward_pass(net, "positive", train=True)
        pairs = rbm_pairs(net)
        for _ in range(self.cd_k):
            for pair in pairs:
                gibbs_round(net, pair, train=True)
        net.tracer.direction = "gradients"
        for pair in pairs:
            for wire in reversed(pair):  # hidden first: W's last contribution, then the visible bias
                if wire.layer.energy_role:
                    net.run_param_gradients(wire)
                    for param in wire.layer.params:
                        # the visible layer holds W but adds nothing to it: where its hidden layer
                        # is on another worker, this worker's part of W's sum is an explicit zero
                        param.finish_grad()
                    if on_layer_done is not None and wire.layer.params:
                        on_layer_done(wire.layer)
        net.finish_grads()

    def evaluate(self, net: Net) -> None:
        forward_pass(net, "positive", train=False)
        for pair in rbm_pairs(net):
            top_down(net, pair)
            for wire in pair:
                if wire.layer.energy_role == "visible":
                    net.run_pass(wire, "negative", train=False)


def rbm_pairs(net: Net) -> list[list[Wire]]:
    """Per RBM pair with a sub-layer on this worker: its wires here in execution order
    (visible layer, connection layers of the visible -> hidden edge, hidden layer),
    pairs in the order their first wire runs (the same on every worker)."""
    keys = {pair_key(wire.layer) for wire in net.wires if wire.layer.energy_role}
    pairs: dict[tuple[str, str], list[Wire]] = {}
    for wire in net.wires:
        key = pair_key(wire.layer) if wire.layer.energy_role else wire.layer.edge()
        if key in keys:
            pairs.setdefault(key, []).append(wire)
    return list(pairs.values())


def pair_key(layer: Layer) -> tuple[str, str]:
    """(visible, hidden) layer names, from either half's sources (the other may live on another worker)."""
    conf = layer.conf
    if layer.energy_role == "visible":
        return conf.name, conf.srclayers[1]
    return conf.srclayers[0], conf.name


def top_down(net: Net, pair: list[Wire]) -> None:
    """The hidden layer's message ĥ·W back down the pair's edge to the visible layer."""
    net.tracer.direction = "top-down"
    for wire in reversed(pair):
        if wire.layer.energy_role != "visible":
            net.run_backward(wire)


def gibbs_round(net: Net, pair: list[Wire], train: bool) -> None:
    """Top-down, then the negative pass up: v⁻ = σ(ĥ·W + b_v), h⁻ = act(v⁻·Wᵀ + b_h)."""
    top_down(net, pair)
    net.tracer.direction = "negative"
    for wire in pair:
        net.run_pass(wire, "negative", train)
