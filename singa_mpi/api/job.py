"""A whole job in Python: the net, the updater, the cluster and the job's own settings, written as the
``.conf`` text that ``singa-mpi`` runs and read back from it (:meth:`Job.from_conf`), field for field."""
from __future__ import annotations

import os
import re
import sys
import warnings
from types import FrameType
from typing import Any

from google.protobuf import text_format

from singa_mpi.api.fields import ArgumentError, ProtoView, fill, is_number
from singa_mpi.api.layers import Layer, refuse_unknown_type
from singa_mpi.api.net import Net, Sequential
from singa_mpi.config.load import AUTO, JobConfig, load_job, parse_job
from singa_mpi.data.prepare import synthetic_command
from singa_mpi.errors import ConfigError, DataError
from singa_mpi.proto import job_pb2

# the block of each learning-rate change method's own settings
LR_BLOCKS = {"kFixedStep": "fixedstep_conf", "kStep": "step_conf", "kLinear": "linear_conf",
             "kExponential": "exponential_conf", "kInverse": "inverse_conf", "kInverseT": "inverset_conf"}
_WRITTEN_AUTO = re.compile(rf"(\bpartition_dim: ){AUTO}\b")
PYTHON = "<python>"  # where a job built in Python comes from, for the parser
# random stores of a Python-built job's shapes (the command reads a job file)
# the job's own settings (Job(..., train_steps=...)): a check's message about one of them is the job's, as
# the constructor's are ("job: argument seed = ...")
_JOB_ARGUMENT = re.compile(r"^({}) = ".format("|".join(
    field.name for field in job_pb2.JobProto.DESCRIPTOR.fields if field.message_type is None)))
SYNTHETIC_FROM_PYTHON = '`singa-mpi data synthetic --like job.conf` on the file job.to_conf("job.conf") writes'


class LearningRate(ProtoView):
    """How the learning rate changes (LRGenProto): ``type`` a ChangeMethod name (``kFixed``, ``kStep``,
    ...), ``base_lr``, and the method's settings as arguments (``kStep``: ``change_freq``, ``gamma``)."""

    def __init__(self, type: str = "kFixed", base_lr: float | None = None, **settings: Any):
        where = f"learning rate ({type})"
        block = LR_BLOCKS.get(type)
        values: dict[str, Any] = {"type": type, "base_lr": base_lr}  # None: the schema's 0.01, unwritten
        if block is not None and settings:
            values[block] = settings
        elif settings:
            values.update(settings)
        self.proto = fill(job_pb2.LRGenProto(), values, where)


class Updater(ProtoView):
    """The updater (UpdaterProto): ``type`` an UpdaterType name (``kSGD``, ``kAdaGrad``, ...), ``lr``
    a number (a fixed rate) or a :class:`LearningRate`, and any other field (``momentum``,
    ``weight_decay``, ``rmsprop_conf={...}``)."""

    def __init__(self, type: str = "kSGD", lr: float | LearningRate | None = None, **more: Any):
        if lr is not None and not is_number(lr) and not isinstance(lr, (LearningRate, dict)):
            raise ArgumentError(f"updater ({type}): argument lr = {lr!r}: expected a number (a fixed rate), a "
                                f"LearningRate(...), or else expected a dict of LRGenProto's fields")
        rate = LearningRate("kFixed", lr) if is_number(lr) else lr
        self.proto = fill(job_pb2.UpdaterProto(), dict(type=type, learning_rate=rate, **more), f"updater ({type})")


def SGD(lr: float | LearningRate, momentum: float | None = None, weight_decay: float | None = None,  # noqa: N802
        **more: Any) -> Updater:
    """Stochastic gradient descent (kSGD): rate ``lr``, ``momentum``, ``weight_decay``, other UpdaterProto fields."""
    return Updater("kSGD", lr, momentum=momentum, weight_decay=weight_decay, **more)


def AdaGrad(lr: float | LearningRate, weight_decay: float | None = None, **more: Any) -> Updater:  # noqa: N802
    """AdaGrad (kAdaGrad): rate ``lr``, ``weight_decay``, other UpdaterProto fields."""
    return Updater("kAdaGrad", lr, weight_decay=weight_decay, **more)


class Cluster(ProtoView):
    """Where the job runs (ClusterProto): ``workers`` per group, worker ``groups``, ``servers`` per
    server group and ``server_groups`` (SINGA's frameworks: AllReduce, Sandblaster, Downpour, Hogwild,
    see docs/frameworks.md), the ``workspace`` folder, and any other ClusterProto field by name."""

    def __init__(self, workers: int | None = None, *, groups: int | None = None, servers: int | None = None,
                 server_groups: int | None = None, workspace: str | None = None, **more: Any):
        self.proto = fill(job_pb2.ClusterProto(), dict(nworkers_per_group=workers, nworker_groups=groups,
                                                       nservers_per_group=servers, nserver_groups=server_groups,
                                                       workspace=workspace, **more), "cluster")


class Job:
    """A training job: ``name``, the ``net`` (a :class:`~singa_mpi.api.net.Net`), the ``updater``, the
    ``cluster``, the ``algorithm`` (``kBP``, ``kBPTT``, ``kCD``; ``cd_k`` Gibbs rounds for CD) and any
    other JobProto field by name (``seed``, ``train_steps``, ``test_freq``, ``disp_freq``,
    ``checkpoint_freq``, ...)."""

    def __init__(self, name: str = "job", net: Net | None = None, *, updater: Updater | None = None,
                 cluster: Cluster | None = None, algorithm: str = "kBP", cd_k: int | None = None, **fields: Any):
        if fields.get("neuralnet") is not None:
            raise ArgumentError("job: argument neuralnet: expected the net as Job(name, net)")
        for argument, value, kind, expected in (("net", net, Net, "a Net or a Sequential"),
                                                ("updater", updater, Updater, "an updater such as SGD(0.1)"),
                                                ("cluster", cluster, Cluster, "a Cluster(...)")):
            if value is not None and not isinstance(value, kind):
                raise ArgumentError(f"job: argument {argument} = {value!r}: expected {expected}")
        one_batch = dict(alg=algorithm, cd_conf={"cd_k": cd_k} if cd_k is not None else None)
        self.settings = fill(job_pb2.JobProto(), dict(name=name, **fields), "job")
        fill(self.settings.train_one_batch, one_batch, "job", "train_one_batch.")
        self.net = net if net is not None else Sequential()
        self.updater, self.cluster = updater, cluster
        self.origin = PYTHON  # a job read from a file: its path (plugins named relative to it)

    # ------------------------------------------------------------ to and from the .conf text

    def to_proto(self) -> job_pb2.JobProto:
        """The whole JobProto: the settings with the net, the updater and the cluster."""
        proto = job_pb2.JobProto()
        proto.CopyFrom(self.settings)
        proto.neuralnet.CopyFrom(self.net.to_proto())
        if self.updater is not None:
            proto.updater.CopyFrom(self.updater.to_proto())
        if self.cluster is not None:
            proto.cluster.CopyFrom(self.cluster.to_proto())
        return proto

    def to_conf(self, path: str | os.PathLike | None = None) -> str:
        """The job as ``.conf`` text (also written to ``path`` when given): what ``singa-mpi train``
        runs, with ``partition_dim: auto`` where the cost model is to choose."""
        text = _WRITTEN_AUTO.sub(r"\1auto", text_format.MessageToString(self.to_proto()))
        if path is not None:
            if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
                raise ArgumentError(f"to_conf: argument path = {path!r}: expected a file name")
            try:
                with open(path, "w") as f:
                    f.write(text)
            except OSError as err:
                raise DataError(f"{os.fspath(path)}: cannot write the job's text: {err.strerror or err}: expected "
                                f"a file in a folder you can write") from None
        return text

    @classmethod
    def from_proto(cls, proto: job_pb2.JobProto) -> Job:
        """A job from a JobProto (copied): its net, updater and cluster as the API's objects."""
        job = cls.__new__(cls)
        job.settings = job_pb2.JobProto()
        job.settings.CopyFrom(proto)
        for part in ("neuralnet", "updater", "cluster"):
            job.settings.ClearField(part)
        job.net = Net.from_proto(proto.neuralnet)
        job.updater = Updater.from_proto(proto.updater) if proto.HasField("updater") else None
        job.cluster = Cluster.from_proto(proto.cluster) if proto.HasField("cluster") else None
        job.origin = PYTHON
        return job

    @classmethod
    def from_conf(cls, source: str | os.PathLike) -> Job:
        """A job from a ``.conf`` file's path, or from its text (the plugins it names are loaded); a
        one-line string that reads as a path (:func:`_names_a_file`) is a path, missing or not."""
        if not isinstance(source, (str, os.PathLike)):
            raise ArgumentError(f"from_conf: argument source = {source!r}: expected a .conf file's path or job text")
        if isinstance(source, os.PathLike) or "\n" not in source and (os.path.exists(source) or _names_a_file(source)):
            job = cls.from_proto(load_job(os.fspath(source)).proto)  # a missing file: its one-line error
            job.origin = os.path.abspath(source)  # its plugin files are found beside it from any folder
            return job
        return cls.from_proto(parse_job(source, PYTHON).proto)

    # ------------------------------------------------------------ checking

    def config(self) -> JobConfig:
        """The job as ``singa-mpi`` reads it (parsed from :meth:`to_conf`'s text)."""
        try:
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                cfg = parse_job(self.to_conf(), self.origin)
        except ConfigError as err:
            raise self._without_position(err) from None
        for warning in said:  # said again without the generated text's position, where the script called
            warnings.warn(self._unplaced(str(warning.message)), warning.category, stacklevel=_caller_level())
        return cfg

    def check(self):
        """What ``singa-mpi check`` checks, without data or MPI: the layers' shapes and settings, the
        params, the algorithm; :class:`ArgumentError` naming the layer and the argument (the field) at
        the first problem, else the job's summary (layers, params, shapes)."""
        from singa_mpi.checks.job import validate

        cfg = self.config()  # loads the job's plugins
        if self.origin == PYTHON:  # a script names a plugin's layer by Layer(type), never by user_type
            for layer in self.net.layers:
                if layer.proto.type == job_pb2.kUserLayer:
                    refuse_unknown_type(layer.type, Layer.where(layer.name, layer.type))
        try:
            summary = validate(cfg)
        except ConfigError as err:
            message = self._unplaced(str(err))
            raise ArgumentError(f"job: argument {message}" if _JOB_ARGUMENT.match(message) else message) from None
        summary.warnings = [self._unplaced(line) for line in summary.warnings]
        if self.origin == PYTHON:  # a job that is no file: the command's placeholder, in the API's words
            unwritten = synthetic_command(None)
            summary.warnings = [line.replace(unwritten, SYNTHETIC_FROM_PYTHON) for line in summary.warnings]
        return summary

    def _without_position(self, err: ConfigError) -> ArgumentError:
        """The parser's message without its ``file:line:col``: lines of the generated text, which the
        script's author never saw (the message names the layer and the field)."""
        return ArgumentError(self._unplaced(str(err)))

    def _unplaced(self, message: str) -> str:
        """A check's line without the generated text's ``file:line:col`` (errors and warnings alike)."""
        return re.sub(rf"^{re.escape(self.origin)}(:\d+:\d+)?: ", "", message)

    # ------------------------------------------------------------ running

    def fit(self, workspace: str | os.PathLike | None = None, **options: Any):
        """Train in this process (serially, or as one rank under ``mpirun``): :func:`singa_mpi.api.run.fit`."""
        from singa_mpi.api.run import fit

        return fit(self, workspace, **options)

    def evaluate(self, workspace: str | os.PathLike | None = None, **options: Any) -> dict[str, Any]:
        """The test phase on the newest checkpoint: :func:`singa_mpi.api.run.evaluate`."""
        from singa_mpi.api.run import evaluate

        return evaluate(self, workspace, **options)

    def predict(self, x: Any, workspace: str | os.PathLike | None = None, **options: Any) -> Any:
        """A layer's output for the rows of ``x``: :func:`singa_mpi.api.run.predict`."""
        from singa_mpi.api.run import predict

        return predict(self, x, workspace, **options)

    def params(self, workspace: str | os.PathLike | None = None, **options: Any) -> dict[str, Any]:
        """The trained params as numpy arrays by name: :func:`singa_mpi.api.run.params`."""
        from singa_mpi.api.run import params

        return params(self, workspace, **options)  # what it does not take: refused there, in the API's words

    @property
    def name(self) -> str:
        """The job's name."""
        return self.settings.name

    def __repr__(self) -> str:
        return f"Job({self.name!r}, {self.net!r})"


def _caller_level() -> int:
    """The ``stacklevel`` of a warning said in this module that names the first frame outside
    singa_mpi: the line of the script that called the API."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame: FrameType | None = sys._getframe(1)
    level = 1
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package + os.sep):
        frame, level = frame.f_back, level + 1
    return level


def _names_a_file(source: str) -> bool:
    """A one-line string that reads as a file's path rather than as job text (``conf/digits_mlpp.conf``,
    mistyped): it ends in ``.conf``, or holds a path separator and none of the text's ``{`` and ``:``."""
    separators = {os.sep, "/"} | ({os.altsep} if os.altsep else set())
    return source.rstrip().endswith(".conf") or (any(sep in source for sep in separators)
                                                 and not any(mark in source for mark in "{:"))


__all__ = ["Job", "Updater", "LearningRate", "SGD", "AdaGrad", "Cluster", "LR_BLOCKS"]
