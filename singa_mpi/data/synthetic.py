"""Synthetic stores shaped like a job's inputs: smoke tests and benchmarks without real data.

``singa-mpi data synthetic --like JOB.conf`` writes, for every input layer of
the job, a store at its ``store_conf.path`` in its backend with its per-sample
shape (uniform pixel values 0..255, labels 0..classes-1: on the command line by default the classes
the job's softmax loss scores), plus the mean and std files if the layer names them.  SINGA 0.1's
kShardData layers get a DataShard folder of the shape of the data set their path names (MNIST,
CIFAR-10), else of what their
parsers read (3x32x32 images for kRGBImage, 28x28 otherwise), and a kRGBImage's
``meanfile`` in v0.1's format.  A store of a script's arrays (backend ``memory``) is no file: only its
mean and std files are written.  A kCharRNN layer (char-rnn) gets a random text and its vocabulary:
symbols of :data:`TEXT_SYMBOLS`, as many as the kOneHot layers it feeds encode (an existing vocabulary
is kept and the text drawn from it), and enough bytes for a few windows per row.  Existing files are
left alone unless ``overwrite``.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

import numpy as np

from singa_mpi.config.load import JobConfig, load_job
from singa_mpi.data.convert import atomic_path, write_mean_file, write_store
from singa_mpi.data.shard import known_shape
from singa_mpi.data.memory import is_memory_path
from singa_mpi.data.stores import in_memory
from singa_mpi.data.text import read_bytes, read_vocab
from singa_mpi.errors import ConfigError, DataError
from singa_mpi.proto import job_pb2

TEXT_SYMBOLS = b"\n abcdefghijklmnopqrstuvwxyz.,:()=_"  # a random text's alphabet, in this order
SYNTHETIC = "a synthetic store"  # what cannot be written, in an error
TEXT_WINDOWS = 4  # windows per row of a kCharRNN batch that a random text holds at least


def write_synthetic(job_path: str, count: int = 1000, classes: int = 10, seed: int = 0,
                    overwrite: bool = False) -> list[str]:
    """Write the stores ``job_path``'s input layers read (see the module docstring); the paths written.
    ``classes``: the label range (the command line's default is the job's own:
    :func:`singa_mpi.checks.job.loss_classes`).  ConfigError for a count or a class range below 1,
    DataError (one line) for a file it cannot write."""
    for name, value in (("count", count), ("classes", classes)):
        if value < 1:
            raise ConfigError(f"data synthetic: --{name} {value}: expected at least 1")
    cfg = load_job(job_path)
    try:
        return _write_inputs(cfg, np.random.default_rng(seed), count, classes, overwrite)
    except OSError as err:  # one not met writing a file the job names (those name their field)
        raise DataError(f"{err.filename or job_path}: cannot write a synthetic store for {job_path}: "
                        f"{err.strerror or err}") from None


@contextlib.contextmanager
def _field(cfg: JobConfig, index: int, conf: str, field: str) -> Iterator[None]:
    """A DataError writing the file that ``conf.field`` of layer ``index`` names, as the job's other path
    errors are: ``FILE:LINE:COL: layer 'NAME': CONF.FIELD PATH: what is wrong``."""
    try:
        yield
    except DataError as err:
        name = cfg.proto.neuralnet.layer[index].name
        raise DataError(f"{cfg.layer_where(index, conf, field)}: layer '{name}': {conf}.{field} {err}") from None


def _write_inputs(cfg: JobConfig, rng: np.random.Generator, count: int, classes: int,
                  overwrite: bool) -> list[str]:
    written = []
    layers = cfg.proto.neuralnet.layer
    for index, layer in enumerate(layers):
        if layer.type == job_pb2.kShardData and layer.HasField("sharddata_conf"):
            written += _write_shard(cfg, index, rng, count, classes, overwrite)
        if layer.type == job_pb2.kCharRNN and layer.HasField("char_rnn_conf"):
            written += _write_text(cfg, index, rng, count, overwrite)
        if not layer.HasField("store_conf") or layer.type not in (job_pb2.kRecordInput, job_pb2.kCSVInput):
            continue
        store = layer.store_conf
        shape = tuple(store.shape)
        backend = store.backend or "textfile"
        if store.path and not in_memory(backend) and (overwrite or not os.path.exists(store.path)):
            data = rng.integers(0, 256, (count, *shape)).astype(np.uint8)
            labels = rng.integers(0, classes, count).astype(np.int32) if store.has_label else None
            with _field(cfg, index, "store_conf", "path"):
                written.append(write_store(store.path, backend, data, labels, pixels=True, what=SYNTHETIC))
        # the mean and std of uniform bytes 0..255, per pixel (SINGA's one-record kvfiles)
        for field, path, value in (("mean_file", store.mean_file, 127.5), ("std_file", store.std_file, 73.9)):
            if path and (overwrite or not os.path.exists(path)):
                with _field(cfg, index, "store_conf", field):
                    written.append(write_mean_file(path, np.full(shape, value)))
    return list(dict.fromkeys(written))  # a mean file read by the train and test parsers: once


def _write_shard(cfg: JobConfig, index: int, rng: np.random.Generator, count: int, classes: int,
                 overwrite: bool) -> list[str]:
    """A DataShard for kShardData layer ``index``, and the mean files of the kRGBImage layers reading it."""
    layers = cfg.proto.neuralnet.layer
    layer = layers[index]
    parsers = [(at, other) for at, other in enumerate(layers) if layer.name in other.srclayers]
    images = any(other.type == job_pb2.kRGBImage for _, other in parsers)
    shape = known_shape(layer.sharddata_conf.path) or ((3, 32, 32) if images else (28, 28))
    written = []
    path = layer.sharddata_conf.path
    if path and (overwrite or not os.path.exists(path)):
        data = rng.integers(0, 256, (count, *shape)).astype(np.uint8)
        with _field(cfg, index, "sharddata_conf", "path"):
            written.append(write_store(path, "shard", data, rng.integers(0, classes, count).astype(np.int32),
                                       what=SYNTHETIC))
    for at, parser in parsers:
        mean = parser.rgbimage_conf.meanfile if parser.type == job_pb2.kRGBImage else ""
        if mean and (overwrite or not os.path.exists(mean)):
            with _field(cfg, at, "rgbimage_conf", "meanfile"):
                written.append(write_mean_file(mean, np.full(shape, 127.5), backend="shard"))
    return written


def _write_text(cfg: JobConfig, index: int, rng: np.random.Generator, count: int, overwrite: bool) -> list[str]:
    """A random text (at least ``count`` bytes) and its vocabulary for kCharRNN layer ``index``."""
    layers = cfg.proto.neuralnet.layer
    layer = layers[index]
    conf = layer.char_rnn_conf
    if not conf.path or not conf.vocab_path or is_memory_path(conf.path) or is_memory_path(conf.vocab_path):
        return []  # a script's text is no file
    keep_text = os.path.exists(conf.path) and not overwrite
    keep_vocab = os.path.exists(conf.vocab_path) and not overwrite
    if keep_text and keep_vocab:
        return []
    written = []
    if keep_vocab:
        vocab = read_vocab(conf.vocab_path, f"layer '{layer.name}': char_rnn_conf.vocab_path")
    elif keep_text:
        vocab = bytes(sorted(set(read_bytes(conf.path, f"layer '{layer.name}': char_rnn_conf.path"))))
    else:
        sizes = [other.onehot_conf.vocab_size for other in layers
                 if other.type == job_pb2.kOneHot and layer.name in other.srclayers and other.onehot_conf.vocab_size]
        vocab = bytes(sorted(TEXT_SYMBOLS[:min(sizes or [len(TEXT_SYMBOLS)])]))
    if not keep_vocab:
        with _field(cfg, index, "char_rnn_conf", "vocab_path"):
            written.append(_write_bytes(conf.vocab_path, vocab, "a synthetic vocabulary"))
    if not keep_text:
        size = max(count, max(conf.batchsize, 1) * (TEXT_WINDOWS * max(conf.unroll_len, 1) + 1))
        symbols = np.frombuffer(vocab, np.uint8)
        with _field(cfg, index, "char_rnn_conf", "path"):
            written.append(_write_bytes(conf.path, symbols[rng.integers(0, len(symbols), size)].tobytes(),
                                        "a synthetic text"))
    return written


def _write_bytes(path: str, blob: bytes, what: str) -> str:
    with atomic_path(path, what) as tmp, open(tmp, "wb") as f:
        f.write(blob)
    return path
