"""What an algorithm needs of the net: kBP and kBPTT follow a loss's gradient; kCD trains RBM pairs
(one hdim, one shared W, split together); kBPTT over text streams carries a recurrent layer's hidden
state, which a split of its hidden units cannot.
"""
from __future__ import annotations

from singa_mpi.algorithms import algorithm_name
from singa_mpi.config.load import JobConfig, effective_partition_dim, is_test_only
from singa_mpi.errors import ConfigError
from singa_mpi.graph import Node
from singa_mpi.layers.base import Layer
from singa_mpi.net import describe, layer_error
from singa_mpi.proto import job_pb2


def check_loss(cfg: JobConfig, phase: str, built: list[tuple[Node, Layer]]) -> None:
    """kBP and kBPTT train on the gradient of a loss: a train net without a loss layer has none, so
    every step would leave the params as they were (weight decay aside) and report no loss."""
    alg = algorithm_name(cfg.proto.train_one_batch)
    if phase != "train" or is_test_only(cfg.proto) or alg not in ("kBP", "kBPTT"):
        return  # a test-only job (SINGA's char-rnn sample.conf) trains nothing
    if any(layer.is_loss for _, layer in built):
        return
    raise ConfigError(f"{cfg.where('train_one_batch', 'alg')}: train_one_batch.alg = {alg}: expected a loss "
                      f"layer in the train net to take the gradient of (kSoftmaxLoss, kEuclideanLoss or a plugin "
                      f"layer with is_loss = True), found none among its {len(built)} layers")


def check_something_to_train(cfg: JobConfig, phase: str, built: list[tuple[Node, Layer]]) -> None:
    """kBP and kBPTT change params: a train net whose layers hold none (inputs and a loss alone) would
    run every step changing nothing (and plan --cost price it at next to no time)."""
    alg = algorithm_name(cfg.proto.train_one_batch)
    if phase != "train" or is_test_only(cfg.proto) or alg not in ("kBP", "kBPTT"):
        return
    if any(layer.param_specs for _, layer in built):
        return
    raise ConfigError(f"{cfg.where('neuralnet')}: neuralnet: the train net has nothing for {alg} to train: expected "
                      f"a layer with params (kInnerProduct, kConvolution, ...), found none among its {len(built)} "
                      f"layers ({', '.join(repr(node.name) for node, _ in built)})")


def frozen_net_warning(cfg: JobConfig, phase: str, built: list[tuple[Node, Layer]]) -> str | None:
    """The line to say when every param the train net trains has lr_scale 0: each step's change is
    lr·lr_scale·(...), so the run would change nothing.  Said, not refused: base_lr 0 freezes a net the
    same way and is taken (a run timing the steps alone); a layer that writes state of its own (batch
    norm's running statistics) still learns it, so such a net is not frozen."""
    if phase != "train" or is_test_only(cfg.proto):
        return None
    trained, stateful = [], False
    for node, layer in built:
        for k, spec in enumerate(layer.param_specs):
            stateful |= not spec.trained
            if spec.trained and not spec.conf.share_from:  # a sharer is updated at its owner's lr_scale
                trained.append((node, k, spec.conf))
    if not trained or stateful or any(conf.lr_scale != 0 for _, _, conf in trained):
        return None
    node, k, _ = trained[0]
    return (f"{cfg.layer_where(node.index, 'param', k, 'lr_scale')}: {describe(cfg, node)}: param[{k}].lr_scale = 0, "
            f"as for every one of the {len(trained)} params the train net trains, so the run changes none of them: "
            f"expected lr_scale > 0 (1 by default) on the params to train")


def check_energy_models(cfg: JobConfig, built: list[tuple[Node, Layer]]) -> None:
    """RBM pairs (seed 001): kRBMVis lists [input, its kRBMHid], kRBMHid lists [its kRBMVis]; one hdim,
    one W (the hidden layer's param[0] shares the visible layer's), split together; trained by kCD."""
    by_name = {node.name: (node, layer) for node, layer in built}
    alg = algorithm_name(cfg.proto.train_one_batch)
    pairs = 0
    for node, layer in built:
        role = layer.energy_role
        if not role:
            continue
        if alg != "kCD":
            raise layer_error(cfg, node, "type", node.type_name,
                              f"a job with train_one_batch {{ alg: kCD }}: RBM layers are trained by contrastive "
                              f"divergence, this job says alg: {alg}")
        index, want_role, want_type = (1, "hidden", "kRBMHid") if role == "visible" else (0, "visible", "kRBMVis")
        partner_name = node.conf.srclayers[index]
        partner_node, partner = by_name[partner_name]
        back = partner_node.conf.srclayers[1 - index] if len(partner_node.conf.srclayers) > 1 - index else None
        if partner.energy_role != want_role or back != node.name:
            raise ConfigError(f"{cfg.layer_where(node.index, 'srclayers', index)}: {describe(cfg, node)}: "
                              f"srclayers[{index}] = {partner_name!r}: expected the {want_type} layer of this RBM, "
                              f"which lists '{node.name}' as its srclayers[{1 - index}]")
        if role == "visible":
            continue
        pairs += 1
        vis_node = partner_node
        if node.conf.rbm_conf.hdim != vis_node.conf.rbm_conf.hdim:
            raise layer_error(cfg, node, "rbm_conf.hdim", node.conf.rbm_conf.hdim,
                              f"{vis_node.conf.rbm_conf.hdim}, the hdim of its kRBMVis '{vis_node.name}' (one W)")
        weight = vis_node.conf.param[0].name
        share = node.conf.param[0].share_from
        if share != weight:
            raise ConfigError(f"{cfg.layer_where(node.index, 'param', 0)}: {describe(cfg, node)}: "
                              f"param[0].share_from = {share or 'missing'!r}: expected {weight!r}, the weight of its "
                              f"kRBMVis '{vis_node.name}' (the two layers of an RBM share one W)")
        dims = [effective_partition_dim(cfg.proto, n.conf) for n in (vis_node, node)]
        if (dims[0] == 1) != (dims[1] == 1):
            raise layer_error(cfg, node, "partition_dim", dims[1],
                              f"{'1' if dims[0] == 1 else '0 or -1'} like its kRBMVis '{vis_node.name}' "
                              f"(partition_dim {dims[0]}): an RBM's hidden units are split on both layers or on none")
    if alg == "kCD" and not pairs:
        raise ConfigError(f"{cfg.where('train_one_batch', 'alg')}: train_one_batch.alg = kCD: expected a net "
                          f"with an RBM to train (a kRBMVis and kRBMHid pair)")
    cd_k = cfg.proto.train_one_batch.cd_conf.cd_k
    if alg == "kCD" and cd_k < 1:
        raise ConfigError(f"{cfg.where('train_one_batch', 'cd_conf', 'cd_k')}: "
                          f"train_one_batch.cd_conf.cd_k = {cd_k}: expected at least 1 Gibbs round")


def check_carried_state(cfg: JobConfig, built: list[tuple[Node, Layer]]) -> None:
    """kBPTT over text streams carries each recurrent layer's hidden state from batch to batch
    (algorithms/bptt.py): its first copy needs all the units its last copy computed, so a recurrent
    layer split on its hidden units cannot carry it (that would need an exchange between batches)."""
    from singa_mpi.algorithms.bptt import sequential_readers

    job = cfg.proto
    if job.train_one_batch.alg != job_pb2.kBPTT or not sequential_readers(job):
        return
    for node, layer in built:
        if layer.recurrent and effective_partition_dim(job, node.conf) == 1:
            raise layer_error(cfg, node, "partition_dim", 1,
                              "0 or -1: its hidden state is carried from batch to batch over the text "
                              "streams, and a split of its hidden units cannot carry it; split the batch")
