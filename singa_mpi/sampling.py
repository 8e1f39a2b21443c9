"""``singa-mpi sample``: text from a trained char-rnn job (what SINGA's sample.conf did, as a driver).

    singa-mpi data text --out data/text && singa-mpi train conf/char_rnn.conf
    singa-mpi sample conf/char_rnn.conf --seed-text "def " -n 500 --temperature 0.8

The job's own train net, one character at a time: the same layers without unrolling (every
``unroll_len`` cleared, the reader's batch one row), built serially, with the checkpoint's params.
The characters go in where the kCharRNN reader's output would be (the reader reads no file); the
loss layer's first source gives the logits.  Each kGRU starts every character from its own last
output (SINGA restarted from zeros: bug B7).  The seed text is fed first, then ``n`` characters
are drawn from softmax(logits / temperature) over the vocabulary's symbols (logits beyond the
vocabulary, from a ``num_output`` larger than it, are left out), each fed back in.
"""
from __future__ import annotations

import os
from collections.abc import Callable

import numpy as np

from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.checks.job import validate
from singa_mpi.config.load import JobConfig, layers_for_phase, load_job
from singa_mpi.data.text import read_vocab, show_byte
from singa_mpi.errors import ConfigError, DataError
from singa_mpi.layers.base import layer_class_of
from singa_mpi.layers.input import find_file
from singa_mpi.net import Net, build_serial_net
from singa_mpi.proto import job_pb2

SHAPE = ("SINGA's char-rnn net (a kCharRNN reader feeding a kOneHot layer, a kGRU, a loss layer whose first "
         "source gives the logits: conf/char_rnn.conf)")


def one_step_job(cfg: JobConfig) -> JobConfig:
    """A copy of the job that is not unrolled, its kCharRNN readers one row of one step."""
    job = job_pb2.JobProto()
    job.CopyFrom(cfg.proto)
    job.neuralnet.unroll_len = 1
    for layer in job.neuralnet.layer:
        layer.ClearField("unroll_len")
        if layer.type == job_pb2.kCharRNN:
            layer.char_rnn_conf.batchsize = 1
            layer.char_rnn_conf.unroll_len = 1
    return JobConfig(job, cfg.path, cfg.text, cfg.source, cfg.workers)


def _pieces(cfg: JobConfig) -> tuple[str, str]:
    """(reader, logits layer) names of the train phase; ConfigError unless the net has char-rnn's shape."""
    layers = [conf for _, conf in layers_for_phase(cfg.proto, "train")]
    by_name = {conf.name: conf for conf in layers}
    reader = next((c.name for c in layers if c.type == job_pb2.kCharRNN), None)
    onehot = next((c.name for c in layers if c.type == job_pb2.kOneHot and c.srclayers[:1] == [reader]), None)
    loss = next((c for c in layers if layer_class_of(c).is_loss), None)
    problem = ("no kCharRNN input layer" if reader is None else f"no kOneHot layer reads the kCharRNN layer "
               f"'{reader}'" if onehot is None else "no loss layer" if loss is None else None)
    if problem is None:
        above = _ancestors(by_name, loss.srclayers[0])
        if onehot not in above:
            problem = f"the logits '{loss.srclayers[0]}' (the loss's first source) do not read '{onehot}'"
        elif not any(by_name[name].type == job_pb2.kGRU for name in above):
            problem = f"no kGRU layer below the logits '{loss.srclayers[0]}'"
    if problem is not None:
        raise ConfigError(f"{cfg.path}: train phase: {problem}: expected {SHAPE} to sample from")
    return reader, loss.srclayers[0]


def _ancestors(by_name: dict, name: str) -> set[str]:
    """``name`` and every layer it reads from, directly or not."""
    seen, todo = set(), [name]
    while todo:
        current = todo.pop()
        if current not in seen and current in by_name:
            seen.add(current)
            todo.extend(by_name[current].srclayers)
    return seen


class Sampler:
    """The one-step net of a char-rnn job, its params loaded: :meth:`step` feeds one character."""

    def __init__(self, cfg: JobConfig, params: dict[str, np.ndarray], workspace: str, where: str = "the checkpoint"):
        one_step = one_step_job(cfg)
        reader_name, logits_name = _pieces(one_step)
        self.net: Net = build_serial_net(one_step, "train", cfg.proto.seed, workspace, shared={})
        for p in self.net.params:
            value = params.get(p.name)
            if value is None or value.shape != p.logical_shape:
                found = "is not there" if value is None else f"has shape {value.shape}"
                raise DataError(f"{where}: parameter {p.name!r} {found}: expected shape {p.logical_shape} "
                                f"for the net of {cfg.path}")
            p.data[...] = value
        layers = {layer.name: layer for layer in self.net.layers}
        self.reader, self.logits = layers[reader_name], layers[logits_name]
        needed = _ancestors({name: layer.conf for name, layer in layers.items()}, logits_name)
        self.wires = [w for w in self.net.wires if w.layer.name in needed and w.layer is not self.reader]
        self.grus = [w.layer for w in self.wires if w.layer.recurrent]  # their state goes on to the next step
        conf = self.reader.conf.char_rnn_conf
        what = f"layer '{reader_name}': char_rnn_conf.vocab_path"
        self.vocab_path = find_file(conf.vocab_path, workspace, what, lambda: "make it with `singa-mpi data text`")
        self.vocab = read_vocab(self.vocab_path, what)
        width = int(np.prod(self.logits.out_shape))
        if width < len(self.vocab):
            raise DataError(f"{self.vocab_path}: {len(self.vocab)} symbols: expected at most {width}, the width "
                            f"of the logits '{logits_name}' of {cfg.path}")

    def reset(self) -> None:
        """Start afresh: every kGRU from zeros."""
        for gru in self.grus:
            gru.initial_state = None

    def step(self, index: int) -> np.ndarray:
        """Feed the symbol ``index``; returns the logits of the next one.  # (len(vocab),) float64"""
        window = np.zeros((1,) + tuple(self.reader.out_shape), np.float32)
        window[0, 0] = index  # column 0: what the one-step onehot (unroll_index 0) encodes
        self.reader.data = window
        for wire in self.wires:
            self.net.run_pass(wire, "forward", train=False)
        for gru in self.grus:  # the next character starts where this one left off
            gru.initial_state = np.array(gru.data, copy=True)
        return np.asarray(self.logits.data, np.float64).reshape(-1)[:len(self.vocab)]

    def encode(self, text: bytes) -> list[int]:
        """Each byte of ``text`` as its vocabulary index; ConfigError naming the first one missing."""
        index = {value: i for i, value in enumerate(self.vocab)}
        for offset, value in enumerate(text):
            if value not in index:
                raise ConfigError(f"--seed-text {text.decode('utf-8', 'replace')!r}: byte {show_byte(value)} at "
                                  f"offset {offset} is not in the vocabulary {self.vocab_path}: expected "
                                  f"characters of the training text")
        return [index[value] for value in text]


def softmax(logits: np.ndarray, temperature: float) -> np.ndarray:
    """softmax(logits / temperature) in float64.  # (V,)"""
    z = np.asarray(logits, np.float64) / temperature
    z -= z.max()
    p = np.exp(z)
    return p / p.sum()


def check_options(n: int, temperature: float, seed_text: bytes | None = None) -> None:
    if temperature <= 0 or not np.isfinite(temperature):
        raise ConfigError(f"--temperature {temperature:g}: expected a positive number (1: the model's own "
                          f"probabilities; lower: likelier characters)")
    if n < 0:
        raise ConfigError(f"-n {n}: expected a number of characters, 0 or more")
    if seed_text is not None and not seed_text:
        raise ConfigError("--seed-text '': expected at least one character to start from")


def generate(sampler: Sampler, seed_text: bytes, n: int, temperature: float = 1.0,
             rng: np.random.Generator | None = None) -> bytes:
    """``n`` symbols drawn after feeding ``seed_text`` (at least one byte), each fed back in."""
    check_options(n, temperature, seed_text)
    rng = rng if rng is not None else np.random.default_rng(0)
    ids = sampler.encode(seed_text)
    for index in ids[:-1]:
        sampler.step(index)
    logits = sampler.step(ids[-1])
    drawn = []
    for k in range(n):
        drawn.append(int(rng.choice(len(logits), p=softmax(logits, temperature))))
        if k + 1 < n:
            logits = sampler.step(drawn[-1])
    return bytes(sampler.vocab[i] for i in drawn)


def find_checkpoint(path: str | None, workspace: str) -> checkpoint.Checkpoint:
    """``path``, else the newest good checkpoint of ``workspace``; DataError if there is none."""
    if path:
        checkpoint.refuse_irregular(path)
        if not os.path.isfile(path):
            raise DataError(f"{path}: no such file: expected a checkpoint such as WORKSPACE/checkpoint/step<N>.h5")
        return checkpoint.read(path)
    ckpt = checkpoint.newest_good(workspace, todo="none to sample from: expected `--checkpoint FILE` or a "
                                                  "workspace with a good checkpoint")
    if ckpt is None:
        raise DataError(f"{workspace}: no checkpoint found: expected `--checkpoint FILE` or a trained workspace "
                        f"(`singa-mpi train JOB` writes WORKSPACE/checkpoint/step<N>.h5)")
    return ckpt


def sample_job(job: str, workspace_of: Callable[[JobConfig], str], checkpoint_path: str | None = None,
               seed_text: str | None = None, n: int = 500, temperature: float = 1.0, seed: int = 0,
               log: Callable[[str], None] = lambda line: None) -> bytes:
    """The seed text and ``n`` sampled characters (bytes); ``log`` gets a note.  Default seed text: a
    newline, else the vocabulary's first symbol."""
    check_options(n, temperature, None if seed_text is None else seed_text.encode("utf-8"))
    cfg = load_job(job)
    validate(cfg)
    _pieces(one_step_job(cfg))  # the net's shape (in the file's names) before any file is read
    workspace = workspace_of(cfg)
    ckpt = find_checkpoint(checkpoint_path, workspace)
    sampler = Sampler(cfg, ckpt.params, workspace, ckpt.path)
    start = (b"\n" if b"\n" in sampler.vocab else sampler.vocab[:1]) if seed_text is None else seed_text.encode()
    sampler.encode(start)  # a character missing from the vocabulary: before any note
    log(f"sampling {n} characters from {ckpt.path} (step {ckpt.step}) at temperature {temperature:g}, seed {seed}")
    return start + generate(sampler, start, n, temperature, np.random.default_rng(seed))
