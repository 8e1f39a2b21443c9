"""Check a whole job before anything runs; report the first problem on one line.

Every message names the file, line and column, the layer (name, index in the
file, type), the field, the bad value and what was expected.  Nothing here
opens a data file (missing data, or a missing checkpoint_path, is a warning), touches MPI or
allocates params.  :func:`validate` checks the job's own fields here, each phase's net in
:mod:`singa_mpi.checks.phase`, then the updater; its :class:`Summary` is what ``singa-mpi check``
prints and what the launch hands on (the params' logical shapes, each phase's layers and batch).
"""
from __future__ import annotations

import dataclasses
import math

from singa_mpi.algorithms import ALGORITHMS, algorithm_class, algorithm_name
from singa_mpi.checks.checkpoint_paths import missing_checkpoint_paths, refuse_pipes
from singa_mpi.checks.phase import PhaseSummary, check_phase
from singa_mpi.config import unroll
from singa_mpi.config.load import AUTO, JobConfig, is_test_only
from singa_mpi.errors import ConfigError
from singa_mpi.graph import Node
from singa_mpi.net import layer_error
from singa_mpi.planner.deterministic import check_deterministic
from singa_mpi.planner.pipeline import check_pipeline
from singa_mpi.proto import job_pb2
from singa_mpi.registry import selected_name
from singa_mpi.topology import check_cluster_supported


@dataclasses.dataclass
class Summary:
    """What ``singa-mpi check`` prints, and what a run learns of the job without building its nets:
    the params' logical shapes (a checkpoint's job identity) and each phase's layers and batch (the
    work per step that sets the BLAS threads)."""

    name: str
    algorithm: str
    updater: str
    train_steps: int
    phases: list[PhaseSummary]
    params: list[tuple[str, tuple[int, ...]]]  # (name, logical shape), owners only
    warnings: list[str]
    # the warnings about the job's values, which train says too (the others are about files, which a
    # run reads, and reports on, itself)
    said_by_runs: list[str] = dataclasses.field(default_factory=list, repr=False)  # in warnings too

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
    summaries, params, warnings, said_by_runs = [], {}, [], []
    for phase in phases:
        summaries.append(check_phase(cfg, phase, params, warnings))
        said_by_runs += summaries[-1].notes
    check_pipeline(cfg)
    check_deterministic(cfg)
    refuse_pipes(cfg)  # train's line, before any warning
    warnings += missing_checkpoint_paths(cfg)  # a job of a chain before the one it starts from ran
    from singa_mpi.updaters import make_updater, zero_delta_warning  # deferred: keeps `check` light

    if not is_test_only(job):
        _check_updater_written(cfg)
    try:
        if not is_test_only(job):
            note = zero_delta_warning(make_updater(job.updater))
            if note is not None:
                said_by_runs.append(f"{cfg.where('updater', 'delta')}: {note}")
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
        warnings=warnings + said_by_runs,
        said_by_runs=said_by_runs,
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
                  "checkpoint_after", "step", "warmup_steps"):  # step: the one a run starts from
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


def loss_classes(cfg: JobConfig) -> int | None:
    """The classes the job's softmax loss scores (the width of its first source in the train net), or
    None when it has none or the job does not check yet (a DataShard's shapes come from its data):
    labels beyond them end the first step."""
    from singa_mpi.errors import SingaError

    try:
        summary = validate(cfg)
    except SingaError:
        return None
    shapes = {name: shape for phase in summary.phases if phase.phase == "train" for name, _, shape in phase.layers}
    for layer in cfg.proto.neuralnet.layer:
        if layer.type == job_pb2.kSoftmaxLoss and layer.srclayers and layer.srclayers[0] in shapes:
            return math.prod(shapes[layer.srclayers[0]])
    return None
