"""Check one phase's net: layer names and sources, each layer's fields, the order of its inputs,
the layers built and set up (shapes), their params, an energy model's or a recurrent net's needs,
the input layers' batches; warn about data files not there yet.
"""
from __future__ import annotations

import dataclasses
import os

from singa_mpi.checks.algorithms import (check_carried_state, check_energy_models, check_loss,
                                        check_something_to_train, frozen_net_warning)
from singa_mpi.checks.params import check_params, check_shared_params
from singa_mpi.config.load import AUTO, PHASES, JobConfig, effective_partition_dim
from singa_mpi.config.retired import RETIRED_LAYER_TYPES
from singa_mpi.data.prepare import folder_problem, how_to_make, is_bundled_digits
from singa_mpi.data.stores import in_memory
from singa_mpi.errors import ConfigError
from singa_mpi.graph import CycleError, Node, is_back_edge
from singa_mpi.layers.base import LAYERS, Layer, LayerContext, layer_class_of
from singa_mpi.net import describe, global_batch_size, instantiate, layer_error, phase_nodes
from singa_mpi.proto import job_pb2


@dataclasses.dataclass
class PhaseSummary:
    """One phase's net as checking found it."""

    phase: str
    layers: list[tuple[str, str, tuple[int, ...]]]  # (name, type, output shape per sample)
    batch: int
    notes: list[str] = dataclasses.field(default_factory=list, repr=False)  # warnings about values, runs say them too


def check_phase(cfg: JobConfig, phase: str, params: dict, warnings: list[str]) -> PhaseSummary:
    """Raise ConfigError for the phase's first problem; add its params' owners to ``params`` (name ->
    (logical shape, layer)) and its warnings to ``warnings``; return its layers and batch."""
    nodes = phase_nodes(cfg, phase)
    if not nodes:
        raise ConfigError(f"{cfg.where('neuralnet')}: neuralnet: no layer is kept for phase {phase}: "
                          f"expected layers without include/exclude for it")
    _check_names_and_sources(cfg, nodes, phase)
    for node in nodes:
        _check_layer_fields(cfg, node)
    _check_inputs_are_forward_edges(cfg, nodes)
    batch = global_batch_size(cfg, nodes)
    ctx = LayerContext(global_batch=batch, workspace=cfg.proto.cluster.workspace or ".", phase=phase)
    try:
        built = instantiate(cfg, nodes, lambda node: dataclasses.replace(ctx))
    except CycleError as err:
        first = next(n for n in nodes if n.name == err.names[0])
        raise layer_error(cfg, first, "srclayers", list(first.conf.srclayers),
                          f"an acyclic net, found the cycle {' -> '.join(err.names)}") from None
    by_name = {node.name: (node, layer) for node, layer, _ in built}
    for node, layer, kinds in built:
        _check_sources(cfg, node, layer, kinds, by_name)
        check_params(cfg, node, layer, params)
        _warn_missing_data(cfg, node, warnings)
    check_energy_models(cfg, [(n, l) for n, l, _ in built])  # an RBM's hdim before its W's shape
    check_loss(cfg, phase, [(n, l) for n, l, _ in built])  # after: an RBM under kBP has none
    check_something_to_train(cfg, phase, [(n, l) for n, l, _ in built])  # after: a net of inputs has no loss either
    check_carried_state(cfg, [(n, l) for n, l, _ in built])
    for node, layer, _ in built:  # after all owners of the phase are known
        check_shared_params(cfg, node, layer, params)
    _check_batches(cfg, [(n, l) for n, l, _ in built])
    frozen = frozen_net_warning(cfg, phase, [(n, l) for n, l, _ in built])
    return PhaseSummary(phase, [(n.name, n.type_name, l.out_shape) for n, l, _ in built], batch,
                        [frozen] if frozen else [])


def _check_names_and_sources(cfg: JobConfig, nodes: list[Node], phase: str) -> None:
    seen: dict[str, Node] = {}
    for node in nodes:
        if not node.name:
            raise layer_error(cfg, node, "name", '""', "a non-empty layer name")
        written = cfg.proto.neuralnet.layer[node.index].name  # a copy's name adds "<t>#" to it
        if "@" in written or "#" in written:
            raise layer_error(cfg, node, "name", repr(written),
                              "a name without '@' or '#' (reserved for partition and unroll suffixes)")
        if node.name in seen:
            raise layer_error(cfg, node, "name", repr(node.name),
                              f"a name unique in phase {phase} (layer #{seen[node.name].index} has it)")
        seen[node.name] = node
    in_job = {layer.name for layer in cfg.proto.neuralnet.layer}
    code = job_pb2.Phase.Name(PHASES[phase])
    for node in nodes:
        for k, src in enumerate(node.conf.srclayers):
            if src in in_job and src not in seen:  # written, but its include/exclude leave it out here
                raise ConfigError(
                    f"{cfg.layer_where(node.index, 'srclayers', k)}: {describe(cfg, node)}: "
                    f"srclayers[{k}] = {src!r}: layer {src!r} is not kept for phase {phase} (its include/exclude): "
                    f"expected a source kept for phase {phase}: add {code} to its include, or give phase "
                    f"{phase} a layer of its own named {src!r} (include: {code})")
            if src not in seen:
                raise ConfigError(
                    f"{cfg.layer_where(node.index, 'srclayers', k)}: {describe(cfg, node)}: "
                    f"srclayers[{k}] = {src!r}: expected the name of a layer of phase {phase} "
                    f"(known: {', '.join(sorted(seen))})")
            if src == node.name:
                raise ConfigError(f"{cfg.layer_where(node.index, 'srclayers', k)}: {describe(cfg, node)}: "
                                  f"srclayers[{k}] = {src!r}: expected a layer other than itself")


def _check_layer_fields(cfg: JobConfig, node: Node) -> None:
    conf = node.conf
    if not conf.HasField("type") and not conf.HasField("user_type"):
        raise layer_error(cfg, node, "type", "missing", "a layer type such as kInnerProduct (or user_type naming "
                                                        "a plugin's layer)")
    field = "user_type" if conf.HasField("user_type") else "type"
    if node.type_name == "kUserLayer":
        raise layer_error(cfg, node, "user_type", "missing",
                          f"with type kUserLayer, user_type naming {_registered_layers()}")
    if field == "type" and node.type_name in RETIRED_LAYER_TYPES:
        raise layer_error(cfg, node, field, node.type_name, RETIRED_LAYER_TYPES[node.type_name])
    try:
        cls = layer_class_of(conf)
    except ConfigError as err:
        expected = str(err).split("expected ", 1)[1] if field == "type" else _registered_layers()
        raise layer_error(cfg, node, field, node.type_name, expected) from None
    pdim = effective_partition_dim(cfg.proto, conf)
    if not -1 <= pdim <= 1 and pdim != AUTO:
        raise layer_error(cfg, node, "partition_dim", pdim, "-1 (none), 0 (batch), 1 (feature) or auto")
    if conf.location < 0:
        raise layer_error(cfg, node, "location", conf.location, "a worker id >= 0")
    low, high = cls.num_srcs
    count = len(conf.srclayers)
    if count < low or (high is not None and count > high):
        want = f"{low}" if low == high else f"{low}..{high if high is not None else 'n'}"
        raise layer_error(cfg, node, "srclayers", list(conf.srclayers), f"{want} source layer(s) for {node.type_name}")


def _check_inputs_are_forward_edges(cfg: JobConfig, nodes: list[Node]) -> None:
    """The sources a layer computes from (its first ``input_kinds``) run before it; an energy model's
    back edge (kRBMHid -> kRBMVis) does not, so it cannot be one of them: it is listed after them."""
    by_name = {node.name: node for node in nodes}
    for node in nodes:
        inputs = len(layer_class_of(node.conf).input_kinds)
        for k, src in enumerate(node.conf.srclayers[:inputs]):
            if is_back_edge(by_name[src], node):
                raise ConfigError(
                    f"{cfg.layer_where(node.index, 'srclayers', k)}: {describe(cfg, node)}: srclayers[{k}] = {src!r} "
                    f"({by_name[src].type_name}): expected the layer {node.type_name} reads its input from (its "
                    f"{by_name[src].type_name} partner is listed after it)")


def _registered_layers() -> str:
    """What a user_type may name: a layer a plugin registered, never a built-in."""
    mine = LAYERS.user_names()
    if mine:
        return f"one of the plugins' layers {', '.join(mine)} (a built-in layer is selected by type, not user_type)"
    return ("a layer a plugin registers (no loaded plugin registers one: --plugin MODULE_OR_FILE; a built-in layer "
            "is selected by type, not user_type)")


def _check_sources(cfg: JobConfig, node: Node, layer: Layer, kinds: list[str], by_name) -> None:
    # SINGA 0.1's parser layers name the one data layer type whose records they parse (kRNNLabel: kCharRNN)
    wanted = getattr(layer, "source_types", ())
    reason = getattr(layer, "source_reason", f"whose records {node.type_name} parses")
    for k, (src_name, kind) in enumerate(zip(node.conf.srclayers, kinds)):
        src_node, src_layer = by_name[src_name]
        if wanted and src_node.type_name not in wanted:
            raise ConfigError(
                f"{cfg.layer_where(node.index, 'srclayers', k)}: {describe(cfg, node)}: "
                f"srclayers[{k}] = {src_name!r} ({src_node.type_name}): expected a {' or '.join(wanted)} layer, "
                f"{reason}")
        if kind == "aux":
            # an input layer with labels, or a layer that passes them on (kLabel, kRNNLabel)
            has_label = (src_layer.is_input and (not src_node.conf.HasField("store_conf")
                                                 or src_node.conf.store_conf.has_label)
                         or getattr(src_layer, "provides_labels", False))
            if not has_label:
                raise ConfigError(
                    f"{cfg.layer_where(node.index, 'srclayers', k)}: {describe(cfg, node)}: "
                    f"srclayers[{k}] = {src_name!r}: expected a label source (an input layer with labels) "
                    f"for {node.type_name}")
    _check_dynamic_source(cfg, node, by_name)
    if node.type_name == "kCharRNN":
        _check_reader_unroll(cfg, node, by_name)


def _check_reader_unroll(cfg: JobConfig, node: Node, by_name) -> None:
    """kCharRNN gives each row unroll_len + 1 characters per batch: one per time step of its readers'
    copies and the last step's label.  Fewer copies would skip text and carry a wrong hidden state."""
    wanted = node.conf.char_rnn_conf.unroll_len
    steps = {user.conf.unroll_index for user, _ in by_name.values() if node.name in user.conf.srclayers}
    if steps and max(steps) + 1 != wanted:
        raise layer_error(cfg, node, "char_rnn_conf.unroll_len", wanted,
                          f"{max(steps) + 1}, the time steps of the layers reading it (the net's unroll_len, as "
                          f"in SINGA)")


def _check_dynamic_source(cfg: JobConfig, node: Node, by_name) -> None:
    """kRNNDummy's ``dynamic_srclayer``: a layer of the phase (or its unrolled copies) whose output a
    sampling driver feeds back; no edge of the graph, so the source checks above miss it."""
    name = node.conf.rnn_dummy_conf.dynamic_srclayer if node.conf.HasField("rnn_dummy_conf") else ""
    if name and name not in by_name and not any(known.endswith(f"#{name}") for known in by_name):
        raise ConfigError(f"{cfg.layer_where(node.index, 'rnn_dummy_conf', 'dynamic_srclayer')}: "
                          f"{describe(cfg, node)}: rnn_dummy_conf.dynamic_srclayer = {name!r}: expected the name of "
                          f"a layer of the same phase (known: {', '.join(sorted({n.split('#', 1)[-1] for n in by_name}))})")


def _check_batches(cfg: JobConfig, built: list[tuple[Node, Layer]]) -> None:
    """Input layers need a batch size, all the same; an output layer writes its source's
    rows and needs none (one it gives must agree)."""
    first = None
    for node, layer in built:
        found = _batch_of(cfg, node, layer)
        if found is None:
            continue
        field, batch = found
        if first is None:
            first = (node, batch)
        elif batch != first[1]:
            raise layer_error(cfg, node, field, batch,
                              f"{first[1]}, the batch size of input layer '{first[0].name}' of the same phase")


def _batch_of(cfg: JobConfig, node: Node, layer: Layer) -> tuple[str, int] | None:
    """(field, global batch size) of a layer that reads or writes batches, else None."""
    if node.conf.HasField("sharddata_conf") and layer.is_input:  # SINGA 0.1's kShardData (setup checked it)
        return "sharddata_conf.batchsize", node.conf.sharddata_conf.batchsize
    if node.conf.HasField("char_rnn_conf") and layer.is_input:  # kCharRNN (kCharRNNOutput has one too)
        return "char_rnn_conf.batchsize", node.conf.char_rnn_conf.batchsize
    if not node.conf.HasField("store_conf"):
        declared = layer.batch_field(node.conf)  # a plugin's input layer
        if declared is not None and declared[1] <= 0:
            raise layer_error(cfg, node, declared[0], declared[1], "a positive batch size")
        return declared
    if not layer.is_input and not node.conf.store_conf.batchsize:
        return None
    for k, size in enumerate(node.conf.store_conf.batchsize):
        if size <= 0:
            raise ConfigError(f"{cfg.layer_where(node.index, 'store_conf', 'batchsize', k)}: "
                              f"{describe(cfg, node)}: store_conf.batchsize = {size}: expected a positive integer")
    if not node.conf.store_conf.batchsize:
        raise layer_error(cfg, node, "store_conf.batchsize", "missing", "a positive batch size")
    return "store_conf.batchsize", sum(node.conf.store_conf.batchsize)


def _warn_missing_data(cfg: JobConfig, node: Node, warnings: list[str]) -> None:
    if node.conf.HasField("sharddata_conf") and node.conf.sharddata_conf.path:  # SINGA 0.1's DataShard folder
        conf, store = "sharddata_conf", job_pb2.StoreProto(backend="shard", path=node.conf.sharddata_conf.path)
    elif (node.conf.HasField("store_conf") and node.conf.store_conf.path
          and not in_memory(node.conf.store_conf.backend)):
        conf, store = "store_conf", node.conf.store_conf
    else:  # nothing to look for on disk (a script's arrays: the launch says if this process lacks them)
        return
    path = store.path
    workspace = cfg.proto.cluster.workspace
    candidates = [path] + ([os.path.join(workspace, path)] if workspace else [])
    problems = [folder_problem(p, "path", store) for p in candidates if os.path.exists(p)]
    if problems and problems[0]:  # the store the run would read is a folder
        warnings.append(f"{cfg.layer_where(node.index, conf, 'path')}: layer '{node.name}': "
                        f"data file {path!r} is {problems[0]}")
    if not problems:
        todo = ("training prepares it from scikit-learn's bundled digits" if is_bundled_digits(path, store)
                else how_to_make(path, "path", store, cfg.path if os.path.isfile(cfg.path) else None))
        warnings.append(f"{cfg.layer_where(node.index, conf, 'path')}: layer '{node.name}': "
                        f"data file {path!r} not found: {todo}")
