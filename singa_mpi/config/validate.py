"""Check a whole job before anything runs; report the first problem on one line.

Every message names the file, line and column, the layer (name, index in the
file, type), the field, the bad value and what was expected.  Nothing here
opens a data file (missing data, or a missing checkpoint_path, is a warning), touches MPI or
allocates params.
"""
from __future__ import annotations

import dataclasses
import math
import os

from singa_mpi.algorithms import ALGORITHMS, algorithm_class, algorithm_name
from singa_mpi.config import unroll
from singa_mpi.config.checkpoint_paths import missing_checkpoint_paths
from singa_mpi.config.load import AUTO, JobConfig, effective_partition_dim
from singa_mpi.config.retired import RETIRED_LAYER_TYPES
from singa_mpi.data.prepare import how_to_make, is_bundled_digits
from singa_mpi.errors import ConfigError
from singa_mpi.graph import CycleError, Node, is_back_edge
from singa_mpi.layers.base import LAYERS, Layer, LayerContext, layer_class_of
from singa_mpi.net import describe, global_batch_size, instantiate, layer_error, phase_nodes
from singa_mpi.params import init_method, init_value_problem
from singa_mpi.proto import job_pb2
from singa_mpi.registry import selected_name
from singa_mpi.topology import check_cluster_supported


@dataclasses.dataclass
class PhaseSummary:
    phase: str
    layers: list[tuple[str, str, tuple[int, ...]]]  # (name, type, output shape per sample)
    batch: int


@dataclasses.dataclass
class Summary:
    """What ``singa-mpi check`` prints."""

    name: str
    algorithm: str
    updater: str
    train_steps: int
    phases: list[PhaseSummary]
    params: list[tuple[str, tuple[int, ...]]]  # (name, logical shape), owners only
    warnings: list[str]

    @property
    def num_weights(self) -> int:
        return sum(math.prod(shape) for _, shape in self.params)


def validate(cfg: JobConfig) -> Summary:
    """Raise ConfigError for the first problem; return a summary otherwise."""
    job = cfg.proto
    _check_finite_numbers(cfg)  # before anything computes with them
    _check_job_fields(cfg)
    _check_include_exclude(cfg)
    unroll.check(cfg)  # before anything looks at the copies
    check_cluster_supported(job.cluster, cfg.where("cluster"), lambda field: cfg.where("cluster", field))
    phases = ["train"]
    if job.test_steps > 0:
        phases.append("test")
    if job.validate_steps > 0:
        phases.append("val")
    summaries, params, warnings = [], {}, []
    for phase in phases:
        summaries.append(_check_phase(cfg, phase, params, warnings))
    warnings += missing_checkpoint_paths(cfg)  # a job of a chain before the one it starts from ran
    from singa_mpi.updaters import make_updater  # deferred: keeps `check` light

    if not is_test_only(job):
        _check_updater_written(cfg)
    try:
        if not is_test_only(job):
            make_updater(job.updater)
    except ConfigError as err:
        # messages start with the dotted field ("updater.learning_rate.type = ..."): point at it
        # or at its nearest written ancestor
        field = str(err).split(" ", 1)[0]
        fields = field.split(".") if field.startswith("updater.") else ["updater"]
        raise ConfigError(f"{cfg.where(*fields)}: {err}") from None
    return Summary(
        name=job.name or "(unnamed)",
        algorithm=algorithm_name(job.train_one_batch),
        updater=selected_name(job.updater),
        train_steps=job.train_steps,
        phases=summaries,
        params=sorted((name, shape) for name, (shape, _) in params.items()),
        warnings=warnings,
    )


def _fail(cfg: JobConfig, fields: tuple, message: str) -> ConfigError:
    return ConfigError(f"{cfg.where(*fields)}: {message}")


def _check_finite_numbers(cfg: JobConfig) -> None:
    """``nan`` and ``inf`` parse in every float field (and 1e39 overflows a float to inf), but no field
    of a job means anything by them: a learning rate, an init bound or a scale must be a number."""
    for fields, value in _float_values(cfg.proto, ()):
        if math.isfinite(value):
            continue
        written = cfg.source.value(*fields) or str(value)
        owner, below = "", fields
        if fields[:2] == ("neuralnet", "layer"):
            layer = cfg.proto.neuralnet.layer[fields[2]]
            owner, below = f"layer '{layer.name}' (#{fields[2]}, {selected_name(layer)}): ", fields[3:]
        raise ConfigError(f"{cfg.where(*fields)}: {owner}{_dotted(below)} = {written}: expected a finite number")


def _float_values(message, prefix: tuple):
    """(field path, value) of every float or double set in ``message`` and the messages inside it;
    a path alternates names and indices as :meth:`SourceMap.where` takes them."""
    for field, value in message.ListFields():
        name = f"[{field.full_name}]" if field.is_extension else field.name
        items = list(enumerate(value)) if field.is_repeated else [(None, value)]
        for k, item in items:
            path = prefix + ((name, k) if k is not None else (name,))
            if field.cpp_type == field.CPPTYPE_MESSAGE:
                yield from _float_values(item, path)
            elif field.cpp_type in (field.CPPTYPE_FLOAT, field.CPPTYPE_DOUBLE):
                yield path, item


def _dotted(fields: tuple) -> str:
    """``param[0].init.low`` for ("param", 0, "init", "low")."""
    text = ""
    for part in fields:
        text += f"[{part}]" if isinstance(part, int) else f"{'.' if text else ''}{part}"
    return text


def _check_job_fields(cfg: JobConfig) -> None:
    job = cfg.proto
    if not job.HasField("neuralnet"):
        raise _fail(cfg, (), "neuralnet: missing: expected neuralnet { layer { ... } ... }")
    if not job.neuralnet.layer:
        raise _fail(cfg, ("neuralnet",), "neuralnet: expected at least one layer { ... }")
    _check_algorithm_written(cfg)
    try:
        algorithm_class(job.train_one_batch)
    except ConfigError as err:  # "train_one_batch.alg = kUserAlg: expected one of kBP, ..."
        written = "user_alg" if job.train_one_batch.HasField("user_alg") else "alg"
        raise _fail(cfg, ("train_one_batch", written), str(err)) from None
    if job.train_steps <= 0 and not job.HasField("train_steps") and not is_test_only(job):
        raise _fail(cfg, (), "train_steps = missing: expected a positive number of training steps")
    for field in ("train_steps", "disp_freq", "test_freq", "test_steps", "validate_freq",
                  "validate_steps", "checkpoint_freq", "disp_after", "test_after", "validate_after",
                  "checkpoint_after"):
        value = getattr(job, field)
        if value < 0 or (field == "train_steps" and value == 0 and not is_test_only(job)):
            expected = "a positive integer" if field == "train_steps" else "an integer >= 0"
            raise _fail(cfg, (field,), f"{field} = {value}: expected {expected}")
    for prefix in ("test", "validate"):
        steps, freq = getattr(job, f"{prefix}_steps"), getattr(job, f"{prefix}_freq")
        if steps > 0 and freq <= 0 and not is_test_only(job):
            written = f"{prefix}_freq" if job.HasField(f"{prefix}_freq") else f"{prefix}_steps"
            raise _fail(cfg, (written,), f"{prefix}_freq = {freq}: expected a positive {prefix}_freq "
                                         f"when {prefix}_steps = {steps}")
    if not (-1 <= job.neuralnet.partition_dim <= 1) and job.neuralnet.partition_dim != AUTO:
        raise _fail(cfg, ("neuralnet", "partition_dim"),
                    f"neuralnet.partition_dim = {job.neuralnet.partition_dim}: expected -1, 0, 1 or auto")


def _check_algorithm_written(cfg: JobConfig) -> None:
    """A job without train_one_batch (or with an empty one) selects no algorithm: say that, rather than
    name kUserAlg, the placeholder protobuf reads for an unset ``alg``."""
    job = cfg.proto
    others = ", ".join(name for name in ALGORITHMS.builtin_names() if name != "kBP")  # what `alg:` may name
    if not job.HasField("train_one_batch"):
        raise _fail(cfg, (), f"train_one_batch: missing: expected train_one_batch {{ alg: kBP }} (or {others})")
    written = job.train_one_batch
    if not written.HasField("alg") and not written.HasField("user_alg"):
        raise _fail(cfg, ("train_one_batch",), f"train_one_batch.alg: missing: expected alg: kBP (or {others}) "
                                               f"in train_one_batch {{ ... }}")


def _check_updater_written(cfg: JobConfig) -> None:
    """A deleted updater or learning_rate block: name the block, not kUserUpdater or kUserChange, the
    placeholders protobuf reads for the unset types inside it."""
    if not cfg.proto.HasField("updater"):
        raise _fail(cfg, (), "updater: missing: expected updater { type: kSGD learning_rate { type: kFixed "
                             "base_lr: 0.01 } } (or another updater type)")
    if not cfg.proto.updater.HasField("learning_rate"):
        raise _fail(cfg, ("updater",), "updater.learning_rate: missing: expected learning_rate { type: kFixed "
                                       "base_lr: 0.01 } (or another schedule) in updater { ... }")


def is_test_only(job: job_pb2.JobProto) -> bool:
    """A job that only tests, run by SINGA with ``-test`` (char-rnn's sample.conf): no train_steps,
    test_steps > 0; no updater or test_freq needed.  ``singa-mpi test`` runs it, ``train`` refuses it."""
    return not job.HasField("train_steps") and job.test_steps > 0


def _check_include_exclude(cfg: JobConfig) -> None:
    """SINGA's rule: one file uses include or exclude, never both."""
    first = {}
    for index, layer in enumerate(cfg.proto.neuralnet.layer):
        for field in ("include", "exclude"):
            if getattr(layer, field):
                first.setdefault(field, (index, layer))
    if len(first) == 2:
        index, layer = max(first.values(), key=lambda item: item[0])
        field = "include" if first["include"][0] == index else "exclude"
        other = "exclude" if field == "include" else "include"
        node = Node(index, layer)
        raise layer_error(cfg, node, field, _phases(getattr(layer, field)),
                          f"only '{other}' in this file (layer #{first[other][0]} uses it; "
                          f"SINGA forbids mixing include and exclude)")


def _phases(values) -> str:
    return ",".join(job_pb2.Phase.Name(v) for v in values)


def _check_phase(cfg: JobConfig, phase: str, params: dict, warnings: list[str]) -> PhaseSummary:
    nodes = phase_nodes(cfg, phase)
    if not nodes:
        raise _fail(cfg, ("neuralnet",), f"neuralnet: no layer is kept for phase {phase}: "
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
        _check_params(cfg, node, layer, params)
        _warn_missing_data(cfg, node, warnings)
    _check_energy_models(cfg, [(n, l) for n, l, _ in built])  # an RBM's hdim before its W's shape
    _check_carried_state(cfg, [(n, l) for n, l, _ in built])
    for node, layer, _ in built:  # after all owners of the phase are known
        _check_shared_params(cfg, node, layer, params)
    _check_batches(cfg, [(n, l) for n, l, _ in built])
    return PhaseSummary(phase, [(n.name, n.type_name, l.out_shape) for n, l, _ in built], batch)


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
    for node in nodes:
        for k, src in enumerate(node.conf.srclayers):
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


def _check_params(cfg: JobConfig, node: Node, layer: Layer, params: dict) -> None:
    names = set()
    for k, spec in enumerate(layer.param_specs):
        conf = spec.conf
        field = f"param[{k}]"
        if not conf.name:
            raise ConfigError(f"{cfg.layer_where(node.index, 'param', k)}: {describe(cfg, node)}: "
                              f"{field}.name = missing: expected a param name unique in the job")
        if conf.name in names:
            raise ConfigError(f"{cfg.layer_where(node.index, 'param', k, 'name')}: {describe(cfg, node)}: "
                              f"{field}.name = {conf.name!r}: expected a name not used twice in one layer")
        names.add(conf.name)
        if conf.share_from:
            continue
        if not conf.HasField("init") and not cfg.proto.checkpoint_path:
            raise ConfigError(f"{cfg.layer_where(node.index, 'param', k)}: {describe(cfg, node)}: "
                              f"{field}.init = missing: expected init {{ type: ... }}, or checkpoint_path in the "
                              f"job to load {conf.name!r} from")
        try:
            if conf.HasField("init"):  # without one, the values come from checkpoint_path
                init_method(conf)
        except ConfigError as err:  # "init.type = kUserInit: expected one of ..."
            written = "user_type" if conf.init.HasField("user_type") else "type"
            raise ConfigError(f"{cfg.layer_where(node.index, 'param', k, 'init', written)}: "
                              f"{describe(cfg, node)}: {field}.{err}") from None
        problem = init_value_problem(conf.init) if conf.HasField("init") else None
        if problem is not None:
            name, expected = problem
            raise ConfigError(f"{cfg.layer_where(node.index, 'param', k, 'init', name)}: {describe(cfg, node)}: "
                              f"{field}.init.{name} = {getattr(conf.init, name):g}: expected {expected}")
        known = params.get(conf.name)
        if known is not None and known[1] != node.name:
            raise ConfigError(f"{cfg.layer_where(node.index, 'param', k, 'name')}: {describe(cfg, node)}: "
                              f"{field}.name = {conf.name!r}: expected a name not used by another layer's "
                              f"param (layer '{known[1]}' declares it; use share_from to share it)")
        params[conf.name] = (spec.logical_shape, node.name)


def _check_shared_params(cfg: JobConfig, node: Node, layer: Layer, params: dict) -> None:
    for k, spec in enumerate(layer.param_specs):
        owner = spec.conf.share_from
        if not owner:
            continue
        where = cfg.layer_where(node.index, "param", k, "share_from")
        if owner not in params:
            raise ConfigError(f"{where}: {describe(cfg, node)}: param[{k}].share_from = {owner!r}: "
                              f"expected the name of a param declared by another layer "
                              f"(known: {', '.join(sorted(params)) or 'none'})")
        if params[owner][0] != spec.logical_shape:
            raise ConfigError(f"{where}: {describe(cfg, node)}: param[{k}].share_from = {owner!r}: "
                              f"expected a param of shape {spec.logical_shape}, {owner!r} has {params[owner][0]}")


def _check_energy_models(cfg: JobConfig, built: list[tuple[Node, Layer]]) -> None:
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
        raise _fail(cfg, ("train_one_batch", "alg"), "train_one_batch.alg = kCD: expected a net with an RBM to "
                                                     "train (a kRBMVis and kRBMHid pair)")
    cd_k = cfg.proto.train_one_batch.cd_conf.cd_k
    if alg == "kCD" and cd_k < 1:
        raise _fail(cfg, ("train_one_batch", "cd_conf", "cd_k"),
                    f"train_one_batch.cd_conf.cd_k = {cd_k}: expected at least 1 Gibbs round")


def _check_carried_state(cfg: JobConfig, built: list[tuple[Node, Layer]]) -> None:
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
    elif node.conf.HasField("store_conf") and node.conf.store_conf.path:
        conf, store = "store_conf", node.conf.store_conf
    else:
        return
    path = store.path
    workspace = cfg.proto.cluster.workspace
    candidates = [path] + ([os.path.join(workspace, path)] if workspace else [])
    if not any(os.path.exists(p) for p in candidates):
        todo = ("training prepares it from scikit-learn's bundled digits" if is_bundled_digits(path, store)
                else how_to_make(path, "path", store, cfg.path))
        warnings.append(f"{cfg.layer_where(node.index, conf, 'path')}: layer '{node.name}': "
                        f"data file {path!r} not found: {todo}")
