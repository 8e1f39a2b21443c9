"""Read a job configuration: text format -> JobProto, with positions for errors.

Parse errors become ``FILE:LINE:COL: message`` (worded by
:mod:`singa_mpi.config.parse_errors`).  Checking what the job means (layers,
shapes, params) is :mod:`singa_mpi.checks`, above the layers it builds; this
module only parses and selects layers by phase.
"""
from __future__ import annotations

import codecs
import dataclasses
import os
import pathlib
import re
import warnings

from google.protobuf import text_format

from singa_mpi import plugins
from singa_mpi.config import limits
from singa_mpi.config.parse_errors import explain_parse_error
from singa_mpi.config.source import SourceMap
from singa_mpi.config.unroll import stateless_unrolling, unroll
from singa_mpi.errors import ConfigError
from singa_mpi.file_kinds import PROBE, kind_of_job_candidate
from singa_mpi.proto import job_pb2

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "conf"  # the example jobs the package ships
PHASES = {"train": job_pb2.kTrain, "val": job_pb2.kVal, "test": job_pb2.kTest}


@dataclasses.dataclass
class JobConfig:
    """A parsed job: the proto, its text and where each field was written."""

    proto: job_pb2.JobProto
    path: str
    text: str
    source: SourceMap
    workers: int | None = None  # --workers N: the worker count the user asked for (else the file's)

    def where(self, *fields) -> str:
        return self.source.where(*fields)

    def layer_where(self, index: int, *fields) -> str:
        """``FILE:LINE:COL`` of ``neuralnet.layer[index].<fields>``."""
        return self.source.where("neuralnet", "layer", index, *fields)


# `[name] {` or `[name]:` -- an extension field (a list such as `shape: [1, 2]` never matches)
_EXTENSION = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\]\s*[:{<]")


# `partition_dim: auto` (the cost model chooses: singa_mpi.cost.auto) is read as this number, written
# in the text at the same length so that every file:line:col stays right
AUTO = 1000
_AUTO_WORD = re.compile(r"(\bpartition_dim\s*:\s*)auto\b")


def parse_job(text: str, path: str = "<string>") -> JobConfig:
    """Parse text-format JobProto; ConfigError ``path:line:col: ...`` on syntax errors.

    The plugins the job needs are loaded first (:func:`singa_mpi.plugins.load_for_job`), so that a
    second parse knows their ``[extensions]``; one nobody declares is an error naming it.
    The text is held to :mod:`singa_mpi.config.limits` first, before protobuf spends time on it."""
    limits.check_text(text, path)
    text = _AUTO_WORD.sub(lambda m: m.group(1) + str(AUTO), text)
    job = _parse(text, path, allow_unknown_extension=True)  # the job's own `plugin` fields first
    source = SourceMap(path, text)
    plugins.load_for_job(job, path, where=lambda k: source.where("plugin", k))
    if _EXTENSION.search(text):
        job = _parse(text, path, allow_unknown_extension=False)
    _warn_ignored(job, path)
    _infer_onehot_vocabulary(job, path)
    cfg = JobConfig(job, path, text, source)
    if (stateless := stateless_unrolling(cfg)) is not None:  # said once a run, as the others here
        warnings.warn(stateless, stacklevel=2)
    return cfg


def _parse(text: str, path: str, allow_unknown_extension: bool) -> job_pb2.JobProto:
    job = job_pb2.JobProto()
    try:
        text_format.Parse(text, job, allow_unknown_extension=allow_unknown_extension)
    except text_format.ParseError as err:
        raise explain_parse_error(err, text, path) from None
    return job


def updater_named(text: str) -> str | None:
    """The updater a job's text selects (``kSGD``, a plugin's ``user_type``: the registry's name), or None
    where the text names none or does not parse here (a checkpoint's copy of the job that wrote it)."""
    from singa_mpi.registry import selected_name

    try:
        job = _parse(_AUTO_WORD.sub(lambda m: m.group(1) + str(AUTO), text), "<job>", allow_unknown_extension=True)
    except (ConfigError, ValueError):
        return None
    return selected_name(job.updater) if job.HasField("updater") else None


def _infer_onehot_vocabulary(job: job_pb2.JobProto, path: str) -> None:
    """SINGA's char-rnn sample.conf gives its kOneHot no vocab_size (SINGA built a one-hot of width 0,
    so the file never sampled): take it from the kRNNDummy that feeds it, whose integers lie in
    [low, high), and say so."""
    by_name = {layer.name: layer for layer in job.neuralnet.layer}
    for layer in job.neuralnet.layer:
        if layer.type != job_pb2.kOneHot or layer.HasField("onehot_conf") or len(layer.srclayers) != 1:
            continue
        src = by_name.get(layer.srclayers[0])
        dummy = src.rnn_dummy_conf if src is not None and src.type == job_pb2.kRNNDummy else None
        if dummy is not None and dummy.integer and dummy.high > max(dummy.low, 0):
            layer.onehot_conf.vocab_size = int(dummy.high)
            warnings.warn(f"{path}: layer '{layer.name}': onehot_conf.vocab_size missing: taken as "
                          f"{int(dummy.high)} from layer '{src.name}' (rnn_dummy_conf.high)", stacklevel=3)


def load_job(path: str | pathlib.Path) -> JobConfig:
    """Read and parse a job file; ConfigError if it cannot be read, is too large or is not UTF-8 text."""
    path = str(path)
    try:
        with open(path, "rb") as f:
            limits.check_size(os.fstat(f.fileno()).st_size, path)  # before reading a huge file into memory
            data = f.read(limits.MAX_JOB_BYTES + 1)  # a file still growing is cut off here
    except OSError as err:
        raise ConfigError(f"{path}: cannot read job configuration: {err.strerror}{_example_hint(path)}") from None
    limits.check_size(len(data), path)
    _refuse_other_kinds(data, path)
    return parse_job(decode_job_text(data, path), path)


def _example_hint(path: str) -> str:
    """For a missing file named as an example job is (``conf/digits_mlp.conf`` in a folder without the
    checkout's conf/): where the examples are."""
    if os.path.exists(path) or not (EXAMPLES / os.path.basename(path)).is_file():
        return ""
    return (f" (an example job of singa_mpi's: `singa-mpi examples` copies them to ./conf/, or give "
            f"{EXAMPLES / os.path.basename(path)})")


def _refuse_other_kinds(data: bytes, path: str) -> None:
    """A checkpoint, data store or archive given where the job goes (``test WORKSPACE/checkpoint/step600.h5``)
    is named as what it is, rather than as text that is not UTF-8 at some byte."""
    kind = kind_of_job_candidate(data[:PROBE])
    if kind is None:
        return
    hint = f" (`singa-mpi ckpt inspect {path}` shows what it holds)" if "checkpoint" in kind else ""
    raise ConfigError(f"{path}: {kind}, not a job file: expected the job's configuration, a text file such as "
                      f"conf/digits_mlp.conf{hint}")


def decode_job_text(data: bytes, path: str) -> str:
    """The file's bytes as UTF-8 text (a byte-order mark dropped); ConfigError naming the first bad byte
    (counted from 1 in the file, as cmp(1) counts)."""
    skip = len(codecs.BOM_UTF8) if data.startswith(codecs.BOM_UTF8) else 0
    try:
        return data[skip:].decode("utf-8")
    except UnicodeDecodeError as err:
        offset = skip + err.start
        line = data.count(b"\n", 0, offset) + 1
        raise ConfigError(f"{path}: byte {offset + 1} (line {line}): not UTF-8 text: expected a text file in "
                          f"UTF-8 (0x{data[offset]:02x} cannot start or continue a UTF-8 character here; "
                          f"a binary file, or text in another encoding such as Latin-1?)") from None


def _warn_ignored(job: job_pb2.JobProto, path: str) -> None:
    if job.gpu:
        warnings.warn(f"{path}: gpu: {list(job.gpu)} ignored: singa_mpi trains on CPUs", stacklevel=3)


def layers_for_phase(job: job_pb2.JobProto, phase: str) -> list[tuple[int, job_pb2.LayerProto]]:
    """(file index, layer) of the layers kept for ``phase`` (SINGA's include/exclude rules), unrolled
    (:mod:`singa_mpi.config.unroll`): a copy's file index is its layer's.

    A layer is dropped if ``exclude`` lists the phase; if ``include`` is non-empty it is
    kept only when ``include`` lists the phase.
    """
    code = PHASES[phase]
    kept = []
    for index, layer in enumerate(job.neuralnet.layer):
        if code in layer.exclude:
            continue
        if layer.include and code not in layer.include:
            continue
        kept.append((index, layer))
    return unroll(job, kept)  # recurrent layers as their copies over time (a no-op for other nets)


def effective_partition_dim(job: job_pb2.JobProto, layer: job_pb2.LayerProto) -> int:
    """The layer's own partition_dim if written, else the net's (default 0); AUTO for `auto`."""
    if layer.HasField("partition_dim"):
        return layer.partition_dim
    return job.neuralnet.partition_dim


def wants_deterministic(job: job_pb2.JobProto) -> bool:
    """Whether the job asks for deterministic mode (`deterministic { ... }`, or `train --deterministic`,
    which sets it)."""
    return job.HasField("deterministic")


def deterministic_block_rows(job: job_pb2.JobProto, batch: int) -> int | None:
    """Deterministic mode's rows per canonical block for a phase of ``batch`` rows: the job's
    ``block_rows``, or :func:`default_block_rows` where it does not set them (not the field's
    default, 16: every net of a run, serial or partitioned, must cut its batch the same way); None
    when the mode is off."""
    if not wants_deterministic(job):
        return None
    if job.deterministic.HasField("block_rows"):
        return job.deterministic.block_rows
    return default_block_rows(batch)


def default_block_rows(batch: int) -> int:
    """Rows per block when the job does not say: the fewest from 16 to 32 that cut the batch into a
    number of equal blocks divisible by 4 (so that 2 and 4 workers get equal shares), else by 2, else
    16.  A function of the batch alone, as the blocks must be: 64 -> 16 (4 blocks), 100 -> 25 (4),
    96 -> 24 (4), 50 -> 25 (2), 359 -> 16."""
    for ways in (4, 2):
        for rows in range(16, 33):
            if batch % rows == 0 and (batch // rows) % ways == 0:
                return rows
    return 16


def is_test_only(job: job_pb2.JobProto) -> bool:
    """A job that only tests, run by SINGA with ``-test`` (char-rnn's sample.conf): no train_steps,
    test_steps > 0; no updater or test_freq needed.  ``singa-mpi test`` runs it, ``train`` refuses it."""
    return not job.HasField("train_steps") and job.test_steps > 0


def phases_of(cfg: JobConfig) -> list[str]:
    """The phases a training run has: train, and test and validation when the job asks for them."""
    return (["train"] + (["test"] if cfg.proto.test_steps > 0 else [])
            + (["val"] if cfg.proto.validate_steps > 0 else []))
