"""char-rnn's layers (SINGA 0.2/0.3's examples/char-rnn): read a text, label it, sample, write characters.

    layer { name: "data"  type: kCharRNN  char_rnn_conf { path vocab_path unroll_len: U batchsize: B } }
    layer { name: "onehot" type: kOneHot  srclayers: "data" unroll_conn_type: kUnrollOneToAll ... }
    layer { name: "label" type: kRNNLabel srclayers: "data" unroll_conn_type: kUnrollOneToAll }

Unrolled, copy t of ``onehot`` takes column t of the reader's window and copy t of ``label`` column
t + 1: the next character.  Files are read on the first forward, so ``check`` and ``plan`` work
without them.  Symbols are bytes; a symbol's index is its offset in the vocabulary file, 0-based
(:mod:`singa_mpi.data.text`).

SINGA differences, on purpose:
* B10: SINGA's indices started at -1 on current compilers; here they are the offsets, and a repeated
  byte in the vocabulary or a byte of the text missing from it is a one-line error.
* B11: SINGA's last row could read past the end of the text (and every row past its own stream into
  the next row's); here a window never leaves its row's stream (see :class:`CharRNN`).
* kCharRNNOutput writes to a file in the workspace, not to stdout (several ranks, progress lines).
"""
from __future__ import annotations

import os

import numpy as np

from singa_mpi.data import memory
from singa_mpi.data.text import encode, read_bytes, read_vocab
from singa_mpi.errors import DataError
from singa_mpi.layers.base import LAYERS, Layer, LayerConfigError
from singa_mpi.layers.input import find_file

_TODO = "make it and its vocabulary with `singa-mpi data text --out DIR`"


def _find(layer: Layer, field: str) -> tuple[str, str]:
    """(what, found path) of ``char_rnn_conf.<field>``: as written, else under the workspace."""
    what = f"layer '{layer.name}': char_rnn_conf.{field}"
    path = getattr(layer.conf.char_rnn_conf, field)
    if memory.is_memory_path(path):  # a script's text: nothing to look for on disk
        return what, path
    return what, find_file(path, layer.ctx.workspace, what, lambda: _TODO)


def windows_per_pass(text_bytes: int, streams: int, unroll: int) -> int:
    """How many batches a kCharRNN reader gives before its streams start again (offsets 0, U, 2U, ...
    while the window [kU, kU + U] fits a stream of M = text_bytes // streams bytes; ``streams``: the
    rows of every worker group, :func:`text_streams`): a pure function, so that every worker knows
    when the text wraps, the reader's worker or not."""
    stream = text_bytes // streams
    return max(1, (stream - unroll - 1) // unroll + 1)


def text_groups(ctx) -> tuple[int, int]:
    """(g, G): training reads worker group g's part of the text, one of G (``LayerContext.stream``);
    test and validation, which group 0 alone runs, read the whole text: (0, 1)."""
    return ctx.stream if ctx.phase == "train" else (0, 1)


def text_streams(batchsize: int, groups: int) -> int:
    """The streams a text is cut into: ``batchsize`` rows in each of ``groups`` worker groups.  Group g's
    rows read streams g·B .. g·B + B - 1, so each group reads its own contiguous part of the text, and
    every stream has the same length: every group's text wraps after the same batches."""
    return batchsize * groups


def reader_period(conf, workspace: str, groups: int = 1) -> int:
    """:func:`windows_per_pass` of a kCharRNN layer conf, from the size of its text file, for a job
    of ``groups`` worker groups (:func:`text_groups`)."""
    char, what = conf.char_rnn_conf, f"layer '{conf.name}': char_rnn_conf.path"
    streams = text_streams(char.batchsize, groups)
    if memory.is_memory_path(char.path):
        return windows_per_pass(len(memory.held_bytes(char.path, what)), streams, char.unroll_len)
    path = find_file(char.path, workspace, what, lambda: _TODO)
    return windows_per_pass(os.path.getsize(path), streams, char.unroll_len)


def group_ahead(state: dict, stream: tuple[int, int]) -> int | None:
    """Windows worker group g of G (``stream``) had read beyond group 0 when a checkpoint's kCharRNN
    ``state`` was written (``ahead<g>``: asynchronous groups go at their own pace; the checkpoint adds
    each group's steps, :func:`singa_mpi.checkpoints.snapshot.paced`), or None when the state was written
    by another number of groups, or before states were kept per group: then every group starts from
    group 0's position (the old behaviour, which the resume notes)."""
    group, groups = stream
    if int(state.get("groups", 1)) != groups:
        return None
    return int(state.get(f"ahead{group}", 0))


@LAYERS.register("kCharRNN")
class CharRNN(Layer):
    """Windows of ``unroll_len + 1`` character indices per row.  # (B_local, U + 1) float32

    The text of N bytes is cut into ``batchsize`` streams of M = N // batchsize bytes; row i reads
    stream i, [i·M, (i+1)·M).  Of G worker groups (``ctx.stream``, training), into G·B streams of
    M = N // (G·B) bytes, row i of group g reading stream g·B + i: each group its own contiguous part
    of the text, [g·B·M, (g+1)·B·M), its rows continuing from batch to batch as one group's do.  Each forward gives every row the characters offset .. offset + U of its
    stream (consecutive windows overlap by one character: the last input is the next window's
    first), then offset += U, and back to 0 when the next window would run past M (B11).  The
    bytes at the end of a stream that fill no whole window are never read.

    ``restarted``: True after a forward that sent the offset back to 0, i.e. the next batch starts
    the streams afresh, so the hidden state this batch ends with must not be carried into it (kBPTT
    carries it after each batch otherwise); False after the others.  A batch-partitioned sub-layer
    reads its rows ``ctx.batch_slice`` of the same global batch: the serial characters.
    """

    deterministic = True  # row by row: any split of the batch gives the same bits

    is_input = True
    feature_partitionable = False
    num_srcs = (0, 0)

    def setup(self, src_shapes):
        if not self.conf.HasField("char_rnn_conf"):
            raise LayerConfigError("char_rnn_conf", "missing", "char_rnn_conf { path vocab_path unroll_len batchsize }")
        conf = self.conf.char_rnn_conf
        for field, what in (("path", "the text file"), ("vocab_path", "the vocabulary file")):
            if not getattr(conf, field):
                raise LayerConfigError(f"char_rnn_conf.{field}", "missing", what)
        if conf.unroll_len < 1:
            raise LayerConfigError("char_rnn_conf.unroll_len", conf.unroll_len,
                                   "a positive number of time steps (the net's unroll_len)")
        if conf.batchsize < 1:
            raise LayerConfigError("char_rnn_conf.batchsize", conf.batchsize, "a positive number of rows")
        self.unroll, self.batch_size = conf.unroll_len, conf.batchsize
        lo, hi = self._rows()
        if not 0 <= lo < hi <= self.batch_size:
            raise LayerConfigError("char_rnn_conf.batchsize", self.batch_size,
                                   f"a global batch holding rows {lo}..{hi - 1} (this sub-layer's batch slice)")
        self.ids: np.ndarray | None = None  # the text as indices, read on the first forward
        self.offset = 0  # where the next batch's windows start in every row's stream
        self.ahead: dict[int, int] = {}  # group -> its windows beyond group 0's at the start (state())
        self.skip: int | None = 0  # windows this group moves on from the loaded offset (None: group 0's)
        self.restarted = False
        return (self.unroll + 1,)

    def _rows(self) -> tuple[int, int]:
        return self.ctx.batch_slice or (0, self.batch_size)

    def _open(self) -> None:
        vocab_what, vocab_path = _find(self, "vocab_path")
        vocab = read_vocab(vocab_path, vocab_what)
        what, path = _find(self, "path")
        self.ids = encode(read_bytes(path, what), vocab, what, path, vocab_path)
        group, groups = text_groups(self.ctx)
        self.first = group * self.batch_size  # this group's first stream
        self.stream = len(self.ids) // text_streams(self.batch_size, groups)  # M
        if self.stream < self.unroll + 1:
            rows = f"{groups} worker groups x {self.batch_size}" if groups > 1 else f"{self.batch_size}"
            raise DataError(f"{what} {path}: {len(self.ids)} bytes give {rows} rows of "
                            f"{self.stream} characters: expected at least unroll_len + 1 = {self.unroll + 1} "
                            f"per row (a longer text or a smaller batchsize)")
        fits = self.offset + self.unroll < self.stream or self.skip is None  # (None: group 0's, wrapped below)
        if self.offset % self.unroll or not fits:
            raise DataError(f"layer '{self.name}': reader state offset {self.offset}: expected a multiple of "
                            f"unroll_len {self.unroll} below {self.stream - self.unroll} (rows of {self.stream} "
                            f"characters): was the checkpoint written for another text or batchsize?")
        period = windows_per_pass(len(self.ids), text_streams(self.batch_size, groups), self.unroll)
        self.offset = (self.offset // self.unroll + (self.skip or 0)) % period * self.unroll
        self.skip = 0

    def _next_offset(self) -> int:
        """offset + U, or 0 when the window there, [offset + U, offset + 2U], would leave the stream."""
        step = self.offset + self.unroll
        return step if step + self.unroll < self.stream else 0

    def forward(self, inputs, train):
        if self.ids is None:
            self._open()
        starts = (self.first + np.arange(*self._rows())) * self.stream + self.offset  # (B_local,)
        window = self.ids[starts[:, None] + np.arange(self.unroll + 1)]  # (B_local, U + 1)
        self.offset = self._next_offset()
        self.restarted = self.offset == 0
        return window.astype(np.float32)

    def state(self) -> dict[str, int]:
        """Where the next windows start; of several groups, also how many and ``ahead<g>`` (as the
        record stores' readers: the checkpoint moves it by the steps each group trained)."""
        groups = text_groups(self.ctx)[1]
        if groups == 1:
            return {"offset": self.offset}
        return {"offset": self.offset, "groups": groups, **{f"ahead{g}": n for g, n in self.ahead.items() if n}}

    def load_state(self, state: dict[str, int]) -> None:
        """Group 0's offset, moved on by this group's ``ahead<g>`` when the text is read (checked against
        it then); a state of another number of groups, or an older one: group 0's offset, wrapped into
        this group's streams (:func:`group_ahead`)."""
        self.offset = int(state.get("offset", 0))
        self.skip = group_ahead(state, text_groups(self.ctx))
        written = int(state.get("groups", 1))
        self.ahead = {g: int(state.get(f"ahead{g}", 0)) for g in range(1, written)} if self.skip is not None else {}


@LAYERS.register("kRNNLabel")
class RNNLabel(Layer):
    """Copy t (``unroll_index``) of the labels: column t + 1 of its kCharRNN source's windows.

    ``aux``: int32 (B_local,), what a loss names in srclayers; output: the same as float32.
    """

    deterministic = True  # row by row: any split of the batch gives the same bits

    input_kinds = ("data",)
    feature_partitionable = False
    source_types = ("kCharRNN",)  # the validator checks srclayers[0]
    source_reason = "whose windows of characters kRNNLabel labels with the next character"
    provides_labels = True  # the validator accepts it as a loss's label source

    def setup(self, src_shapes):
        shape, step = tuple(src_shapes[0]), self.conf.unroll_index
        if len(shape) != 1 or shape[0] < 2:
            raise LayerConfigError("srclayers", f"a source of shape {shape}",
                                   "a kCharRNN layer (a window of unroll_len + 1 characters per row)")
        if not 0 <= step < shape[0] - 1:
            raise LayerConfigError("unroll_index", step, f"0..{shape[0] - 2}: copy t takes the character t + 1 "
                                                         f"of its source's windows of {shape[0]}")
        return ()

    def forward(self, inputs, train):
        self.aux = inputs[0][:, self.conf.unroll_index + 1].astype(np.int32)  # (B_local,)
        return self.aux.astype(np.float32)

    def backward(self, grad, need):
        return [None]  # labels: nothing below needs a gradient


@LAYERS.register("kCharRNNOutput")
class CharRNNOutput(Layer):
    """Appends the character of each row's index (column 0 of its source: kArgSort's top choice) to a file.

    The file is ``char_rnn_conf.path`` if set, else ``<layer name>.txt``, under the workspace when
    relative; it is emptied at the first forward and flushed after each (one byte per row per call).
    ``last`` keeps this call's characters (bytes) for a driver to print.  Output: the input, unchanged.
    """

    feature_partitionable = False

    def setup(self, src_shapes):
        if not self.conf.char_rnn_conf.vocab_path:
            raise LayerConfigError("char_rnn_conf.vocab_path", "missing", "the vocabulary the indices refer to")
        lo, hi = self.ctx.rows()
        if (lo, hi) != (0, self.ctx.global_batch):
            raise LayerConfigError("partition_dim", 0, "-1: an output layer writes whole batches to one file")
        self.vocab: np.ndarray | None = None
        self.file = None
        self.last, self.written = b"", 0
        return tuple(src_shapes[0])

    def path(self) -> str:
        path = self.conf.char_rnn_conf.path or f"{self.name}.txt"
        return path if os.path.isabs(path) else os.path.join(self.ctx.workspace or ".", path)

    def _indices(self, x: np.ndarray) -> np.ndarray:
        ids = np.asarray(x).reshape(len(x), -1)[:, 0]
        bad = (ids != np.round(ids)) | (ids < 0) | (ids >= len(self.vocab))
        if bad.any():
            raise DataError(f"layer '{self.name}': index {ids[bad][0]}: expected an integer in "
                            f"0..{len(self.vocab) - 1} (the vocabulary {self.conf.char_rnn_conf.vocab_path})")
        return ids.astype(np.int64)

    def forward(self, inputs, train):
        if self.vocab is None:  # read and opened on the first batch: check/plan touch no file
            what, found = _find(self, "vocab_path")
            self.vocab = np.frombuffer(read_vocab(found, what), np.uint8)
            os.makedirs(os.path.dirname(self.path()) or ".", exist_ok=True)
            self.file = open(self.path(), "wb")
        self.last = self.vocab[self._indices(inputs[0])].tobytes()
        self.file.write(self.last)
        self.file.flush()  # readable while the job runs
        self.written += len(self.last)
        return inputs[0]

    def backward(self, grad, need):
        return [None]

    def close_files(self) -> None:
        if self.file is not None:
            self.file.close()


@LAYERS.register("kRNNDummy")
class RNNDummy(Layer):
    """SINGA's sampling input: random values, or what a sampling driver feeds back.

    Without a source: ``rnn_dummy_conf.shape`` values per row drawn uniformly from [low, high)
    (floored if ``integer``), keyed by (seed, layer, step) for the whole global batch and sliced to
    this sub-layer's rows, so any partitioning draws the serial values.  ``feedback``: None, or an
    array of this sub-layer's rows that a driver sets (e.g. the previous output of the layer
    ``dynamic_srclayer`` names, which SINGA re-shared); while set, it is the output.  With a source
    (as SINGA allows): its output.  No gradient.  SINGA's ``shape`` included the batch; here it is
    per row, and the batch is the phase's (1 when no input layer gives one: sample.conf's shape 1).
    """

    is_input = True
    feature_partitionable = False
    num_srcs = (0, 1)

    def setup(self, src_shapes):
        self.feedback: np.ndarray | None = None
        if src_shapes:
            return tuple(src_shapes[0])
        conf = self.conf.rnn_dummy_conf
        shape = tuple(conf.shape)
        if not shape or min(shape) < 1:
            raise LayerConfigError("rnn_dummy_conf.shape", list(shape) or "missing",
                                   "positive dimensions of each row's values, e.g. shape: 1")
        if not conf.low < conf.high:
            raise LayerConfigError("rnn_dummy_conf.high", conf.high,
                                   f"a bound above low = {conf.low} (values are drawn from [low, high))")
        return shape

    def forward(self, inputs, train):
        if inputs:
            return inputs[0]
        lo, hi = self.ctx.rows()
        if self.feedback is not None:
            return self._fed_back(hi - lo)
        conf = self.conf.rnn_dummy_conf
        values = self.rng(self.ctx.step).uniform(conf.low, conf.high, (self.ctx.global_batch,) + self.out_shape)
        values = np.floor(values[lo:hi]) if conf.integer else values[lo:hi]
        # float32 rounding must not reach `high`
        return np.minimum(values.astype(np.float32), np.nextafter(np.float32(conf.high), np.float32(conf.low)))

    def _fed_back(self, rows: int) -> np.ndarray:
        fed = np.asarray(self.feedback, np.float32)
        per_row = int(np.prod(self.out_shape))
        if fed.size != rows * per_row:
            raise DataError(f"layer '{self.name}': feedback of shape {fed.shape}: expected {rows} rows of "
                            f"shape {self.out_shape}")
        return fed.reshape((rows,) + self.out_shape)

    def backward(self, grad, need):
        return [None] * len(need)
