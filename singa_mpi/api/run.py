"""Training and testing a Python-built job in the calling process: serially, or as one rank of an MPI
job when the script runs under ``mpiexec -n N python script.py`` (every rank runs the same script).

The run is the CLI's own (:mod:`singa_mpi.launcher`): the same two-phase failure protocol, checkpoints,
resume, progress lines (rank 0 prints), stop signals, profile and trace.  The job's text, with its
workspace, is written to ``WORKSPACE/job.conf`` before the run's checks in a workspace that holds no
run, else when the run starts training (never by a run that is refused: the file stays the run's whose
checkpoints are there), so that its messages, its resume line and a later ``singa-mpi train
WORKSPACE/job.conf --resume`` name a real file.  What the run recorded
(``metrics.jsonl``, rank 0's) comes back to every rank as a :class:`History`.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import os
import re
from typing import Any, Callable, ParamSpec, Protocol, TypeVar

from singa_mpi import option_values
from singa_mpi.api.fields import ArgumentError, is_integer, is_number
from singa_mpi.checkpoints.hdf5 import EXIT_CHECKPOINTED
from singa_mpi.errors import SingaError

# what a run's messages tell a script to do, for the options `singa-mpi train` spells as flags
FIT_SPELLING = {"--resume": "fit(..., resume=True)", "--overwrite": "fit(..., overwrite=True)",
                "--steps": "fit(..., steps={})",  # {}: the count
                "--no-check-finite": "fit(..., check_finite=False)",
                "--no-check-memory": "fit(..., check_memory=False)",
                "--allow-other-job": ""}  # fit has no way to resume another job's checkpoint
RECORDED_PHASES = ("train", "test", "val")  # the phases of metrics.jsonl's records
PHASE_NAMES = {"validation": "val"}  # a phase by its long name, as the API's layers take it too
# the test command's options, as evaluate takes them ("": it has none: its memory check cannot be skipped)
EVALUATE_SPELLING = {"--checkpoint": "evaluate(..., checkpoints=[FILE])", "--no-check-memory": ""}
EVALUATE_FILE = "evaluate.conf"  # what evaluate() tests: its own, so that job.conf stays the training's
GIVEN_FILE = "fit.conf"  # the job fit() was given, where job.conf is still another run's (until training starts)


_Arguments = ParamSpec("_Arguments")
_Result = TypeVar("_Result")


def arguments_checked(function: Callable[_Arguments, _Result]) -> Callable[_Arguments, _Result]:
    """``function`` refusing what Python itself would refuse (an unknown keyword, an argument given twice
    or missing, too many by position) as one ArgumentError line in the API's words, with the CLI's
    did-you-mean, rather than a TypeError traceback from inside the call (Job.fit forwards its options)."""
    signature = inspect.signature(function)
    name = function.__name__

    @functools.wraps(function)
    def checked(*args: _Arguments.args, **kwargs: _Arguments.kwargs) -> _Result:
        _check_call(name, signature, args, kwargs)
        return function(*args, **kwargs)

    return checked


def _check_call(name: str, signature: inspect.Signature, args: tuple, kwargs: dict) -> None:
    parameters = list(signature.parameters.values())
    by_position = [p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD]
    optional = [p.name for p in parameters if p.default is not p.empty]
    if len(args) > len(by_position):
        by_name = next((f" ({key}=...)" for key in optional if key not in by_position), "")
        raise ArgumentError(f"{name}: {len(args)} arguments given by position: expected at most {len(by_position)} "
                            f"({', '.join(by_position)}), the others by name{by_name}")
    for key in kwargs:
        if key not in signature.parameters:
            raise ArgumentError(f"{name}: unknown argument {key}: expected one of {', '.join(optional)}"
                                f"{option_values.did_you_mean(key, optional)}")
        if key in by_position[:len(args)]:
            raise ArgumentError(f"{name}: argument {key} given twice (by position and by name)")
    for index, parameter in enumerate(parameters):
        if parameter.default is parameter.empty and index >= len(args) and parameter.name not in kwargs:
            required = [p.name for p in parameters if p.default is p.empty]
            raise ArgumentError(f"{name}: argument {parameter.name}: missing: expected {name}({', '.join(required)}, "
                                f"...)")


class Job(Protocol):
    """What a run needs of :class:`singa_mpi.api.job.Job` (which calls these functions: a protocol
    rather than an import, so the two modules do not import each other)."""

    @property
    def name(self) -> str: ...

    cluster: Any

    def check(self) -> Any: ...

    origin: str  # the file the job was read from, else "<python>"

    def to_proto(self) -> Any: ...

    @classmethod
    def from_proto(cls, proto: Any) -> Any: ...

    def to_conf(self) -> str: ...


class RunFailed(SingaError):
    """The run ended with an error (its one-line message was printed by the run, on rank 0)."""

    def __init__(self, code: int, what: str):
        super().__init__(f"{what} ended with exit code {code} (see the error line above)")
        self.exit_code = code


class Stopped(SingaError):
    """A stop signal (SIGINT, SIGTERM, SIGUSR1) ended training after a checkpoint: ``fit(...,
    resume=True)`` continues it.  ``history`` holds what was recorded until then."""

    exit_code = EXIT_CHECKPOINTED

    def __init__(self, history: History):
        super().__init__("training stopped on a signal after writing a checkpoint: fit(..., resume=True) continues it")
        self.history = history


@dataclasses.dataclass
class History:
    """What a run recorded, as ``metrics.jsonl`` holds it: one record per report (``step``, ``phase``
    ``train``/``test``/``val``, and the metrics: ``loss``, ``accuracy``, ``perplexity``,
    ``squared_error``, ...)."""

    records: list[dict[str, Any]]

    def metric(self, name: str, phase: str = "train") -> list[tuple[int, float]]:
        """(step, value) of ``name`` in ``phase``'s records, in order; ArgumentError for a ``phase``
        that is none of a run's (``train``, ``test``, ``val`` or ``validation``), and for a ``name`` no
        record of the history holds (listing those ``phase``'s records hold).  A name other records hold (the
        test's ``accuracy`` asked of ``train``'s records, a phase without records) finds none: []."""
        asked, phase = phase, self._known("metric", phase)
        held = isinstance(name, str) and any(name in r for r in self.records)
        if self.records and not held:  # a history without records has no names to judge by
            self._unheld(name, phase, asked)
        return [(r["step"], r[name]) for r in self.records if r.get("phase") == phase and name in r] if held else []

    def _unheld(self, name: Any, phase: str, asked: str) -> None:
        """A metric no record holds ("acc", "Loss") found nothing without a word: refused, listing them."""
        def names(records: list[dict[str, Any]]) -> list[str]:
            return list(dict.fromkeys(key for r in records for key in r if key not in ("step", "phase")))

        held = names([r for r in self.records if r.get("phase") == phase])
        why = f"the names the {asked} records hold" if held else f"this history holds no {asked} records"
        raise ArgumentError(f"History.metric: argument name = {name!r}: expected one of "
                            f"{', '.join(held or names(self.records))} ({why})")

    def last(self, phase: str = "train") -> dict[str, Any]:
        """The newest record of ``phase`` (empty when there is none); ArgumentError as :meth:`metric`."""
        phase = self._known("last", phase)
        found = [r for r in self.records if r.get("phase") == phase]
        return found[-1] if found else {}

    def _known(self, function: str, phase: Any) -> str:
        """``phase`` as the records name it (``validation``: ``val``, their name for it); a phase no run
        records ("valid", "Test") found no records without a word: refused, listing them."""
        held = list(dict.fromkeys(r["phase"] for r in self.records if isinstance(r.get("phase"), str)))
        if isinstance(phase, str) and PHASE_NAMES.get(phase, phase) in (*RECORDED_PHASES, *held):
            return PHASE_NAMES.get(phase, phase)
        raise ArgumentError(f"History.{function}: argument phase = {phase!r}: expected one of "
                            f"{', '.join(dict.fromkeys([*RECORDED_PHASES, *held]))} (or validation; this history holds "
                            f"{', '.join(held) or 'no records'})")


def workspace_of(job: Job, workspace: str | os.PathLike | None) -> str:
    """Where ``job`` runs: ``workspace``, else its cluster's, else ``workspace/<name>`` (as the CLI)."""
    if workspace is not None:
        return os.fspath(workspace)
    if job.cluster is not None and job.cluster.proto.workspace:
        return job.cluster.proto.workspace
    return os.path.join("workspace", job.name or "job")


@arguments_checked
def fit(job: Job, workspace: str | os.PathLike | None = None, *, steps: int | None = None, resume: bool = False,
        overwrite: bool = False, seed: int | None = None, stall_timeout: float | None = None,
        deterministic: bool = False, profile: bool = False, trace: str | None = None, check_finite: bool = True,
        check_memory: bool = True, said_as: dict[str, str] | None = None) -> History:
    """Train ``job`` (the arguments are ``singa-mpi train``'s options); every rank returns the same
    :class:`History`.  ArgumentError for a bad job (before any communication, on every rank),
    :class:`Stopped` on a stop signal; another failure: in one process the run's own error (a
    ``DataError`` naming the layer, ...), on several ranks :class:`RunFailed` on every rank, after
    rank 0 printed the error line (a failure during training ends the whole job, as with the CLI).
    ``said_as``: how the run's messages name ``--resume``, ``--overwrite``, ... to the script's user
    (default: fit's own arguments; the SINGA binding's scripts take them as flags in their argv)."""
    from singa_mpi.launcher import RunOptions, run_training
    from singa_mpi.workspace import JOB_FILE

    options = RunOptions(seed=_number("fit", "seed", seed, option_values.JOB_SEED),
                         steps=_number("fit", "steps", steps, option_values.NON_NEGATIVE),
                         stall_timeout=_number("fit", "stall_timeout", stall_timeout, option_values.POSITIVE_SECONDS),
                         resume=_switch("fit", "resume", resume), overwrite=_switch("fit", "overwrite", overwrite),
                         deterministic=_switch("fit", "deterministic", deterministic),
                         profile=_switch("fit", "profile", profile), trace=_file_to_write("fit", "trace", trace),
                         check_finite=_switch("fit", "check_finite", check_finite),
                         check_memory=_switch("fit", "check_memory", check_memory))
    _folder("fit", workspace)
    _spelling("fit", said_as)
    job.check()
    where = workspace_of(job, workspace)
    options.write_job, options.resume_hint, options.spelling = (True, resume_hint(job),
                                                           FIT_SPELLING if said_as is None else dict(said_as))
    cfg = _as_file(job, where, JOB_FILE)
    _write_where_no_run_is(cfg, where, options.overwrite)
    if _another_run_s(cfg, where):  # messages before training name the job given, at its lines
        cfg = _as_file(job, where, GIVEN_FILE)
        _write_given(cfg)
    code = run_training(cfg, lambda cfg: where, options)
    history = History(_shared_records(os.path.join(where, "metrics.jsonl")))
    if code == EXIT_CHECKPOINTED:
        raise Stopped(history)
    if code != 0:
        raise RunFailed(code, "training")
    return history


@arguments_checked
def evaluate(job: Job, workspace: str | os.PathLike | None = None, *, checkpoints: list[str] | None = None,
             said_as: dict[str, str] | None = None) -> dict[str, Any]:
    """The test phase on the newest checkpoint of ``workspace`` (or ``checkpoints``), partitioned as
    training when run on several ranks; the test's metrics (``loss``, ``accuracy``, ...).
    ``said_as``: how the messages name ``--checkpoint`` to the script's user (default: evaluate's own
    ``checkpoints`` argument; the SINGA binding's ``evaluate`` takes ``checkpoint_path``)."""
    from singa_mpi.checkpoints.hdf5 import disk_problem, listed
    from singa_mpi.communication.liveness import launched_rank
    from singa_mpi.durable import NotDurable, not_durable
    from singa_mpi.errors import DataError
    from singa_mpi.test_command import TEST_RESULTS, run_test
    from singa_mpi.workspace import make_workspace, write_job_file

    _folder("evaluate", workspace)
    if checkpoints is not None and (isinstance(checkpoints, (str, bytes)) or not all(
            isinstance(path, (str, os.PathLike)) for path in checkpoints)):
        raise ArgumentError(f"evaluate: argument checkpoints = {checkpoints!r}: expected a list of checkpoint files")
    _spelling("evaluate", said_as)
    spelling = EVALUATE_SPELLING if said_as is None else {**EVALUATE_SPELLING, **said_as}
    job.check()
    where = workspace_of(job, workspace)
    make_workspace(where)
    results = os.path.join(where, TEST_RESULTS)
    cfg = _as_file(job, where, EVALUATE_FILE)
    try:
        write_job_file(cfg.path, cfg.text)  # its own file: job.conf is the training run's
    except NotDurable as err:  # in place, and read by the test: said once, with what the disk did
        if (launched_rank() or (0,))[0] == 0:
            print(f"note: {cfg.path}: {not_durable(err)}", flush=True)
    except OSError as err:  # a full disk: one line, as a checkpoint's
        raise DataError(f"{cfg.path}: cannot write the test's job file: {disk_problem(err)}") from None
    # said in the API's words (the test command names itself and its --checkpoint option)
    if job.to_proto().test_steps <= 0:
        raise ArgumentError("evaluate: the job has no test (test_steps = 0): expected Job(..., test_steps=N), the "
                            "batches each test reads")
    if not checkpoints and not listed(where):
        raise DataError(f"{where}: no checkpoint to test: expected a workspace that fit() wrote, or "
                        f"{spelling['--checkpoint']}")
    code = run_test(cfg, lambda cfg: where, checkpoints=checkpoints, spelling=spelling)
    if code != 0:
        raise RunFailed(code, "the test")
    return History(_shared_records(results)).last("test")


@arguments_checked
def params(job: Job, workspace: str | os.PathLike | None = None) -> dict[str, Any]:
    """The params of the newest good checkpoint of ``workspace`` as numpy arrays by name (their whole,
    logical shapes, however the run was partitioned); DataError when there is none."""
    from singa_mpi.checkpoints.hdf5 import newest_good
    from singa_mpi.errors import DataError

    where = workspace_of(job, workspace)
    found = newest_good(where, todo="none to read params from: expected a workspace that fit() wrote")
    if found is None:
        raise DataError(f"{where}: no checkpoint to read params from: expected a workspace that fit() wrote")
    return dict(found.params)


@arguments_checked
def predict(job: Any, x: Any, workspace: str | os.PathLike | None = None, *, layer: str | None = None,
            batchsize: int | None = None) -> Any:
    """The output of ``layer`` (default: the scores, the loss layer's first source) for the rows of
    ``x``, with the newest checkpoint's params: the test phase's net, its inputs reading ``x``, run
    forward in this process alone (on every rank that calls it: no communication), in batches of
    ``batchsize`` (default: the test input's).  One row of output per row of ``x``."""
    import math
    import warnings

    import numpy as np

    from singa_mpi.checkpoints.hdf5 import newest_good
    from singa_mpi.checks.job import validate
    from singa_mpi.config.load import parse_job
    from singa_mpi.errors import ConfigError, DataError
    from singa_mpi.runtimes.serial import SerialRuntime
    from singa_mpi.trainer import Trainer
    from singa_mpi.workspace import JOB_FILE

    _number("predict", "batchsize", batchsize, option_values.COUNT)
    if layer is not None and not isinstance(layer, str):
        raise ArgumentError(f"predict: argument layer = {layer!r}: expected a layer's name")
    _folder("predict", workspace)
    job.check()  # as fit and evaluate: a field the run ignores is said at the script's line, not the text's
    where = workspace_of(job, workspace)
    found = newest_good(where, todo="none to predict with: expected a workspace that fit() wrote")
    if found is None:
        raise DataError(f"{where}: no checkpoint to predict with: expected a workspace that fit() wrote")
    try:
        rows = np.asarray(x)
    except (ValueError, TypeError):
        raise ArgumentError("predict: argument x: rows of different lengths (a ragged nested list): expected rows "
                            "of one shape (an array, or lists of equal length)") from None
    if rows.ndim < 2 or rows.dtype.kind not in "iufb" or len(rows) == 0:
        raise ArgumentError(f"predict: argument x of shape {rows.shape} and dtype {rows.dtype}: expected numbers, "
                            f"one row per sample (at least one row; x[None] for a single sample)")
    reader = _predicting(job, rows, batchsize)
    target = layer or _scores_layer(reader)
    if target not in reader.net.names():
        raise ArgumentError(f"predict: argument layer = {target!r}: expected one of "
                            f"{', '.join(dict.fromkeys(reader.net.names()))}")
    batch = reader.net[reader.net.names()[0]].proto.store_conf.batchsize[0]
    reader.settings.test_steps = math.ceil(len(rows) / batch)
    reader.settings.test_freq = reader.settings.test_freq or 1  # a job trained without a test: no test during training
    reader.origin = job.origin  # its plugin files, found where the job's are
    with warnings.catch_warnings():  # the parser's warnings (gpu ignored): job.check() said them, at the script's line
        warnings.simplefilter("ignore")
        cfg = parse_job(job_text(reader, where), os.path.join(where, JOB_FILE))
    try:  # a job trained without a test: its test phase's net was never checked
        validate(cfg)
    except ConfigError as err:  # without the position: lines of a text that is no file
        said = re.sub(rf"^{re.escape(cfg.path)}(:\d+:\d+)?: ", "", str(err))
        raise ArgumentError(f"predict: the job's test phase: {said}") from None
    trainer = Trainer(cfg, where, SerialRuntime(cfg, cfg.proto.seed, where), log=lambda line: None)
    trainer.restore(found, full=False)
    net = trainer.test_net
    assert net is not None  # test_steps > 0 above: the trainer built the test phase's net
    if target not in net.by_name:  # a layer of training alone (phase="train")
        tested = [name for name in dict.fromkeys(reader.net.names()) if name in net.by_name]
        raise ArgumentError(f"predict: argument layer = {target!r}: it runs in training alone: expected a layer of "
                            f"the test phase's net, one of {', '.join(tested)}")
    outputs = []
    for _ in range(reader.settings.test_steps):
        net.set_step(found.step)
        trainer.algorithm.evaluate(net)
        outputs.append(np.array(net.by_name[target].layer.data))
    return np.concatenate(outputs)[:len(rows)]


def _predicting(job: Any, rows: Any, batchsize: int | None) -> Any:
    """A copy of ``job`` whose input layers read ``rows`` (labels all 0: the loss layer's value is not
    the point), in order, in batches of ``batchsize`` or the test input's."""
    import math

    import numpy as np

    from singa_mpi.api.layers import RecordInput
    from singa_mpi.api.net import _is_input

    copy = type(job).from_proto(job.to_proto())  # the job's own class: run.py does not import job.py
    # a job whose inputs all run in training alone (no test input) predicts with them all the same
    tested = any(_is_input(layer) and _in_test_phase(layer.proto) for layer in copy.net.layers)
    for index, layer in enumerate(copy.net.layers):
        if not _is_input(layer):
            continue
        conf = layer.proto.store_conf
        record = tuple(np.shape(rows)[1:])
        if conf.shape and record != tuple(conf.shape):  # a convnet's (channels, h, w): not flat rows
            raise ArgumentError(f"predict: argument x of shape {np.shape(rows)}: expected rows of "
                                f"{tuple(conf.shape)} ({math.prod(conf.shape)} numbers each), the records "
                                f"input layer '{layer.name}' of the trained net reads")
        size = batchsize if batchsize is not None else (conf.batchsize[0] if conf.batchsize else 64)
        phases = list(layer.proto.include) if tested else []
        replaced = RecordInput.from_arrays(rows, np.zeros(len(rows), np.int64), size, name=layer.name,
                                           mean_value=conf.mean_value if conf.HasField("mean_value") else None,
                                           std_value=conf.std_value if conf.HasField("std_value") else None)
        replaced.proto.include.extend(phases)
        copy.net.layers[index] = replaced
    return copy


# ------------------------------------------------------------ the arguments, checked before anything runs
# by singa-mpi's own rules for its options (singa_mpi.option_values), named as the script wrote them

def _number(function: str, name: str, value: Any, rule: option_values.ValueRule) -> Any:
    """``value`` (None: not given) as ``rule`` takes it (an int or a float), else an ArgumentError."""
    if value is None:
        return None
    if not (is_integer(value) if rule.whole else is_number(value)) or not rule.holds(value):
        raise ArgumentError(f"{function}: argument {name} = {value!r}: expected {rule.expected}")
    return int(value) if rule.whole else float(value)


def _switch(function: str, name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ArgumentError(f"{function}: argument {name} = {value!r}: expected True or False")
    return value


def _file_to_write(function: str, name: str, value: Any) -> str | None:
    """A file the run will write (None: not given), refused now if it cannot be written there."""
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise ArgumentError(f"{function}: argument {name} = {value!r}: expected a file name")
    try:
        return option_values.writable_file(os.fspath(value))
    except option_values.BadPath as err:
        raise ArgumentError(f"{function}: argument {name} = {os.fspath(value)!r}: {err}") from None


def _spelling(function: str, said_as: Any) -> None:
    """The said_as argument: None (the function's own names) or option flags to the words naming them."""
    if said_as is not None and (not isinstance(said_as, dict) or not all(
            isinstance(key, str) and isinstance(value, str) for key, value in said_as.items())):
        raise ArgumentError(f"{function}: argument said_as = {said_as!r}: expected a dict of option flags to the "
                            f"words that name them")


def _folder(function: str, value: Any) -> None:
    """The workspace argument: None (the job's own) or a folder's name."""
    if value is not None and (not isinstance(value, (str, os.PathLike)) or not os.fspath(value)):
        raise ArgumentError(f"{function}: argument workspace = {value!r}: expected a folder's name")


def _in_test_phase(layer: Any) -> bool:
    """Whether a LayerProto runs in the test phase (as include/exclude say)."""
    from singa_mpi.proto import job_pb2

    return (not layer.include or job_pb2.kTest in layer.include) and job_pb2.kTest not in layer.exclude


def _scores_layer(job: Any) -> str:
    """The loss layer's first source (the scores a classifier's softmax reads)."""
    from singa_mpi.layers.base import layer_class_of

    for layer in job.net.layers:
        try:
            loss = layer_class_of(layer.proto).is_loss
        except Exception:  # a plugin type this process has not loaded: not the loss we look for
            loss = False
        if loss and layer.srcs:
            return layer.srcs[0]
    return job.net.layers[-1].name


def _as_file(job: Job, workspace: str, name: str):
    """The job as this rank holds it (:func:`job_text`), read as if from ``WORKSPACE/<name>``, which
    nothing writes here: ``fit`` writes ``job.conf`` once the run is the job's (a run refused because
    the workspace holds another's leaves that run's file as it is), ``evaluate`` its own file.  Each
    rank runs its own text, not a file: ranks whose jobs differ (other arrays) are then refused by
    the launch's vote, not by a confusing read of another rank's file."""
    import warnings

    from singa_mpi.config.load import parse_job

    with warnings.catch_warnings():  # the parser's warnings (gpu ignored) job.check() said, at the script's line
        warnings.simplefilter("ignore")
        return parse_job(job_text(job, workspace), os.path.join(workspace, name))


def _write_where_no_run_is(cfg: Any, workspace: str, overwrite: bool) -> None:
    """The job's text to ``WORKSPACE/job.conf`` before the run's checks, where it replaces no run's
    file: in a workspace that holds no checkpoint (and, with ``overwrite``, no job.conf to move aside),
    so that a run that fails before training (a missing data file) names a file that is there, and
    ``singa-mpi data synthetic --like WORKSPACE/job.conf`` reads it.  Elsewhere the run writes it
    once it is the job's (the root alone; one written here by every rank holds the same text)."""
    from singa_mpi.checkpoints.hdf5 import listed
    from singa_mpi.communication.liveness import launched_rank
    from singa_mpi.workspace import write_job_file

    launched = launched_rank()
    if (launched is not None and launched[0] != 0) or listed(workspace) or (overwrite and os.path.exists(cfg.path)):
        return
    try:
        os.makedirs(workspace, exist_ok=True)
        write_job_file(cfg.path, cfg.text)
    except OSError:
        return  # the run's own check of the workspace says what is wrong there


def _another_run_s(cfg: Any, workspace: str) -> bool:
    """Whether ``WORKSPACE/job.conf`` is not this job's text while the workspace holds a run's
    checkpoints (it is that run's, or gone): a message naming it before training would name
    another job's lines (a missing data file at another layer's line, ``--like`` making that job's data)."""
    from singa_mpi.checkpoints.hdf5 import listed

    if not listed(workspace):
        return False
    try:
        with open(cfg.path, encoding="utf-8") as f:
            return f.read() != cfg.text
    except (OSError, UnicodeDecodeError):
        return True


def _write_given(cfg: Any) -> None:
    """The job's text to ``WORKSPACE/fit.conf`` (every rank writes the same text)."""
    from singa_mpi.workspace import write_job_file

    try:
        write_job_file(cfg.path, cfg.text)
    except OSError:
        return  # the run's own check of the workspace says what is wrong there


def job_text(job: Job, workspace: str) -> str:
    """The job's text as its workspace holds it: with ``cluster.workspace`` (so that ``singa-mpi train
    WORKSPACE/job.conf --resume`` continues there) and the plugin files it names by absolute path
    (found, as when it was read, beside the file it came from: the copy lives in another folder)."""
    from singa_mpi.plugins import made_portable

    proto = job.to_proto()
    proto.cluster.workspace = os.path.abspath(workspace)
    made_portable(proto, job.origin)
    return type(job).from_proto(proto).to_conf()  # the job's own class: run.py does not import job.py


def resume_hint(job: Job) -> str | None:
    """How a stopped run of ``job`` continues, when ``singa-mpi train WORKSPACE/job.conf --resume``
    cannot: a job on arrays or a text the script holds (a file cannot carry them); None otherwise."""
    from singa_mpi.data.memory import is_memory_path

    for layer in job.to_proto().neuralnet.layer:
        paths = [layer.store_conf.path, layer.char_rnn_conf.path, layer.char_rnn_conf.vocab_path]
        if any(is_memory_path(path) for path in paths):
            return (f"fit(..., resume=True) in the script that holds the arrays of layer '{layer.name}' "
                    f"(a job file cannot carry them)")
    return None


def _shared_records(path: str) -> list[dict[str, Any]]:
    """The records of ``path`` as rank 0 reads them, on every rank (ranks on other nodes cannot
    read rank 0's file); the run's own world decides serial or not (:func:`mpi_world`)."""
    from singa_mpi.launcher.start import mpi_world

    world = mpi_world()
    if world is None:
        return _read_records(path)
    return world.root_value(_read_records(path) if world.rank == 0 else None, "history")


def _read_records(path: str) -> list[dict[str, Any]]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


__all__ = ["fit", "evaluate", "params", "predict", "History", "Stopped", "RunFailed", "workspace_of", "job_text",
           "resume_hint", "EVALUATE_FILE", "GIVEN_FILE"]
