"""SINGA 0.3's examples/rnnlm as a singa_mpi plugin: Mikolov's recurrent language model with a
class-factored softmax, trained by back-propagation over windows of words.

SINGA's job.conf runs unchanged but for its data paths::

    python examples/rnnlm/create_data.py --python-docs --out examples/rnnlm   # the corpus
    singa-mpi train examples/rnnlm/job.conf --plugin examples/rnnlm/rnnlm.py

SINGA 0.1's job.conf (tests/config/singa_examples/v0.1.0/examples/rnnlm) checks and plans with this
plugin too: it puts a kLabel layer between kData and kLoss.  Its data was a DataShard of SINGA 0.1's
Records, which kData does not read: make the kvfile with create_data.py and point ``[data_conf]`` at it.

The five user layers keep SINGA's names (``user_type``) and configuration (``[data_conf]``,
``[embedding_conf]``, ``[loss_conf]``, declared in rnnlm.proto):

* kData: one window of words per step, read from a kvfile of WordRecords (create_data.py); a window
  runs from the previous window's last word to the next end of sentence, at most ``max_window``
  words further.
* kEmbedding: a word's vector, a row of a (vocab_size, word_dim) table.
* kHidden: h[t] = sigmoid(h[t-1]·W + x[t]), h[-1] = 0, within the window.
* kLabel (SINGA 0.1): the word each row predicts, its class and its class's words, from kData's rows.
* kLoss: p(next word w) = p(class(w) | h[t]) · p(w | class(w), h[t]), two softmaxes: over the
  classes, and over the words of w's class only; the next word from kData (0.3) or kLabel (0.1).
  Reports the loss (nats per word) and SINGA's perplexity, 10^(-mean log10 p) = exp(loss).

The rows of every array are the ``max_window`` time steps of the window (SINGA's blobs have one
row per step too); rows past the window's end are marked invalid by the data layer and carry no
loss and no gradient.  The rows of kData, kEmbedding, kLabel and kLoss are independent, so the net's
``partition_dim: 0`` splits them over the workers; kHidden's rows are one sequence, so it runs whole
(``batch_split_refusal``) and the planner moves its input and output between the workers.

Where SINGA's code is wrong, this is right (README, "SINGA's rnnlm"): kEmbedding's gradient adds up
a word used twice in a window (SINGA's Copy kept the last use only).  As in SINGA, the gradients are
sums over the window's words (not means), and the corpus is read round and round: a window may run
from the end of the file into its beginning.
"""
from __future__ import annotations

import math
import mmap

import numpy as np
import rnnlm_pb2

from singa_mpi.data.stores import scan_kvfile
from singa_mpi.errors import DataError
from singa_mpi.layers import LAYERS, Layer, LayerConfigError
from singa_mpi.layers.input import find_file

# the columns of kData's rows
INPUT, TARGET, CLASS, CLASS_START, CLASS_END, VALID = range(6)
# the columns of kLabel's rows (SINGA 0.1's order), and where kLoss finds each field in either source
LABEL_COLUMNS = (CLASS_START, CLASS_END, TARGET, CLASS, VALID)  # kData's columns, in kLabel's order
FIELDS = ("target", "class", "class start", "class end", "valid")
SOURCE_COLUMNS = {6: dict(zip(FIELDS, (TARGET, CLASS, CLASS_START, CLASS_END, VALID))),
                  5: dict(zip(FIELDS, (2, 3, 0, 1, 4)))}
CREATE = "make it with `python examples/rnnlm/create_data.py --python-docs --out DIR` (or --train FILE)"


class _Window(Layer):
    """Rows are time steps: no feature split (kHidden mixes every feature of a step into the next)."""

    feature_partitionable = False
    feature_split_refusal = "rnnlm's layers split only the time steps of a window"


def example_rows(rows: int, vocab_size: int, nclass: int, rng: np.random.Generator) -> np.ndarray:
    """kData's rows for the cost model to time a layer on: random words of ``vocab_size`` in ``nclass``
    classes of consecutive words, every row in the window.  # (rows, 6)"""
    bounds = np.linspace(0, vocab_size, min(nclass, vocab_size) + 1).astype(np.int64)  # class c: bounds[c:c+2]
    words = rng.integers(0, vocab_size, (rows, 2))
    cls = np.searchsorted(bounds, words[:, 1], side="right") - 1
    out = np.ones((rows, 6), np.float32)
    out[:, INPUT], out[:, TARGET], out[:, CLASS] = words[:, 0], words[:, 1], cls
    out[:, CLASS_START], out[:, CLASS_END] = bounds[cls], bounds[cls + 1]
    return out


@LAYERS.register("kData")
class WordWindow(_Window):
    """Rows t = 0..max_window-1: [word t, word t+1, its class, its class's first and end word, valid]."""

    is_input = True
    num_srcs = (0, 0)

    @classmethod
    def batch_field(cls, conf):
        return "[data_conf].max_window", conf.Extensions[rnnlm_pb2.data_conf].max_window

    @classmethod
    def input_files(cls, conf):
        path = conf.Extensions[rnnlm_pb2.data_conf].path
        return [("[data_conf]", "path", path, CREATE)] if path else []

    def setup(self, src_shapes):
        conf = self.conf.Extensions[rnnlm_pb2.data_conf]
        if not conf.path:
            raise LayerConfigError("[data_conf].path", "missing", "a kvfile of WordRecords (create_data.py)")
        if conf.max_window < 1:
            raise LayerConfigError("[data_conf].max_window", conf.max_window, "a positive number of words")
        if conf.backend != "kvfile":
            raise LayerConfigError("[data_conf].backend", repr(conf.backend), '"kvfile" (what create_data.py writes)')
        self.max_window = conf.max_window
        self.words: np.ndarray | None = None  # (N, 4): word, class, class start, class end; read on first use
        self.starts = [0]  # where window k starts, in the corpus repeated end to end
        self.windows = 0  # windows read so far: the next forward reads window number `windows`
        return (6,)

    def state(self):
        return {"windows": self.windows}

    def load_state(self, state):
        self.windows = int(state.get("windows", 0))

    def forward(self, inputs, train):
        if self.words is None:
            self._read()
        start, length = self._window(self.windows)
        self.windows += 1
        lo, hi = self.ctx.rows()
        steps = np.arange(lo, hi)
        rows = np.zeros((hi - lo, 6), np.float32)
        valid = steps < length
        here = (start + steps[valid]) % len(self.words)
        after = (here + 1) % len(self.words)
        rows[valid, INPUT] = self.words[here, 0]
        rows[valid, TARGET:CLASS_END + 1] = self.words[after]
        rows[valid, VALID] = 1
        return rows

    def _window(self, k: int) -> tuple[int, int]:
        """(start, length) of window ``k``: from the last word of window k-1 to the next sentence end
        (word 0, ``</s>``), or ``max_window`` words on, whichever comes first."""
        count = len(self.words)
        while len(self.starts) <= k + 1:
            start = self.starts[-1]
            self.starts.append(min(self.next_end[start % count] + start - start % count, start + self.max_window))
        return self.starts[k], self.starts[k + 1] - self.starts[k]

    def _read(self) -> None:
        conf = self.conf.Extensions[rnnlm_pb2.data_conf]
        path = find_file(conf.path, self.ctx.workspace, f"layer '{self.name}': [data_conf].path", lambda: CREATE)
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
            _, offsets, lengths = scan_kvfile(buffer, path)
            record = rnnlm_pb2.WordRecord()
            words = np.empty((len(offsets), 4), np.int64)
            for i, (at, size) in enumerate(zip(offsets, lengths)):  # once per run: the corpus is kept in memory
                record.ParseFromString(buffer[at:at + size])
                words[i] = record.word_index, record.class_index, record.class_start, record.class_end
        if not len(words):
            raise DataError(f"layer '{self.name}': {path}: no words")
        self.words = words
        ends = np.flatnonzero(words[:, 0] == 0)  # sentence ends
        if not len(ends):  # no sentence ends at all: every window is max_window words long
            self.next_end = np.full(len(words), np.iinfo(np.int64).max // 2)
            return
        # next_end[p]: the first sentence end after position p, counting on into the next pass
        after = np.searchsorted(ends, np.arange(len(words)), side="right")
        self.next_end = np.concatenate([ends, ends[:1] + len(words)])[after]


@LAYERS.register("kEmbedding")
class WordEmbedding(_Window):
    """Row t: the vector of word t (zero past the window's end)."""

    def setup(self, src_shapes):
        conf = self.conf.Extensions[rnnlm_pb2.embedding_conf]
        if conf.vocab_size < 1 or conf.word_dim < 1:
            raise LayerConfigError("[embedding_conf]", f"vocab_size {conf.vocab_size}, word_dim {conf.word_dim}",
                                   "a positive vocab_size and word_dim")
        self.vocab_size = conf.vocab_size
        self.declare_param(0, "embedding", (conf.vocab_size, conf.word_dim), None)
        return (conf.word_dim,)

    def forward(self, inputs, train):
        rows = inputs[0]
        self.ids = rows[:, INPUT].astype(np.int64)
        outside = np.flatnonzero((self.ids < 0) | (self.ids >= self.vocab_size))
        if outside.size:
            raise DataError(f"layer '{self.name}': word index {int(self.ids[outside[0]])} outside the vocabulary of "
                            f"{self.vocab_size} ([embedding_conf].vocab_size): a store made for a larger vocabulary")
        self.valid = rows[:, VALID:VALID + 1]
        return self.params[0].data[self.ids] * self.valid

    def example_input(self, index, shape, rng):
        return example_rows(shape[0], self.vocab_size, 1, rng)

    def backward(self, grad, need):
        # a word used twice in a window adds both gradients (SINGA's Copy kept only the last)
        np.add.at(self.params[0].grad_for_scatter(), self.ids, grad * self.valid)
        return [None] * len(need)


@LAYERS.register("kHidden")
class Hidden(_Window):
    """h[t] = sigmoid(h[t-1]·W + x[t]) over the rows of one window (h[-1] = 0)."""

    batch_split_refusal = "its rows are the time steps of one window, each computed from the one before"

    def setup(self, src_shapes):
        (dim,) = src_shapes[0]
        self.declare_param(0, "weight", (dim, dim), None)
        return (dim,)

    def forward(self, inputs, train):
        x, w = inputs[0], self.params[0].data
        h = np.empty_like(x)
        previous = np.zeros(x.shape[1], x.dtype)
        for t in range(len(x)):  # a recurrence: step t needs step t-1
            h[t] = _sigmoid(previous @ w + x[t])
            previous = h[t]
        self.h = h
        return h

    def backward(self, grad, need):
        w, h = self.params[0].data, self.h
        pre = np.empty_like(grad)  # dL/d(h[t-1]·W + x[t])
        carried = np.zeros(grad.shape[1], grad.dtype)
        for t in range(len(grad) - 1, -1, -1):
            pre[t] = (grad[t] + carried) * h[t] * (1 - h[t])
            carried = pre[t] @ w.T
        if len(grad) > 1:
            self.params[0].add_grad(h[:-1].T, pre[1:])  # sum over t of h[t-1]^T · pre[t]
        return [pre if need[0] else None]


@LAYERS.register("kLabel")
class NextWord(_Window):
    """SINGA 0.1's label source of kLoss: row t = [class start, class end, index, class] of word t+1 (the
    word to predict; kData's row t holds it), then 1 where row t lies in the window, else a row of zeros
    (0.1 passed the window's length beside its rows).  0.3 folded these into kData's rows; kLoss takes
    either as its second source.  No params; nothing flows back to kData."""

    def setup(self, src_shapes):
        if tuple(src_shapes[0]) != (6,):
            raise LayerConfigError("srclayers[0]", tuple(src_shapes[0]), "the kData layer (rows of 6 values)")
        return (len(LABEL_COLUMNS),)

    def forward(self, inputs, train):
        return inputs[0][:, LABEL_COLUMNS]  # rows past the window's end are zero in kData already


@LAYERS.register("kLoss")
class ClassFactoredLoss(_Window):
    """-log p(w) with p(w) = softmax over classes [class(w)] · softmax over class(w)'s words [w]."""

    is_loss = True
    num_srcs = (2, 2)

    def setup(self, src_shapes):
        conf = self.conf.Extensions[rnnlm_pb2.loss_conf]
        if conf.vocab_size < 1 or conf.nclass < 1:
            raise LayerConfigError("[loss_conf]", f"vocab_size {conf.vocab_size}, nclass {conf.nclass}",
                                   "a positive vocab_size and nclass")
        (dim,) = src_shapes[0]
        self.columns = SOURCE_COLUMNS.get(src_shapes[1][0]) if len(src_shapes[1]) == 1 else None
        if self.columns is None:
            raise LayerConfigError("srclayers[1]", tuple(src_shapes[1]), "the kData layer (rows of 6 values) or "
                                   "SINGA 0.1's kLabel layer (rows of 5)")
        self.vocab_size, self.nclass = conf.vocab_size, conf.nclass
        self.declare_param(0, "word weight", (conf.vocab_size, dim), None)
        self.declare_param(1, "class weight", (conf.nclass, dim), None)
        self.sums = {"loss": 0.0, "loss/count": 0.0}
        return (1,)

    def forward(self, inputs, train):
        h, rows = inputs
        words, classes = self.params[0].data, self.params[1].data
        target, cls, first, end = (rows[:, self.columns[field]].astype(np.int64) for field in FIELDS[:4])
        valid = rows[:, self.columns["valid"]] > 0
        if valid.any():
            self._check(target[valid], cls[valid], first[valid], end[valid])
        width = int(max((end - first)[valid].max(), 1)) if valid.any() else 1
        # each row's class as a padded block of word indices: one gather and one batched product
        self.members = first[:, None] + np.arange(width)
        self.inside = (self.members < end[:, None]) & valid[:, None]
        self.members = np.where(self.inside, self.members, 0)
        self.h, self.valid, self.target, self.cls, self.first = h, valid, target, cls, first
        self.p_word = _softmax(np.einsum("rd,rkd->rk", h, words[self.members]), self.inside)
        self.p_class = _softmax(h @ classes.T, valid[:, None])
        rows_at = np.flatnonzero(valid)
        p = np.zeros((len(h), 1), h.dtype)  # p(next word) per row; 0 past the window's end
        p[rows_at, 0] = self.p_word[rows_at, (target - first)[rows_at]] * self.p_class[rows_at, cls[rows_at]]
        self.sums["loss"] += float(-np.log(np.maximum(p[rows_at, 0], np.finfo(np.float32).tiny)).sum())
        self.sums["loss/count"] += float(len(rows_at))
        return p

    def example_input(self, index, shape, rng):
        if index == 0:
            return super().example_input(index, shape, rng)
        rows = example_rows(shape[0], self.vocab_size, self.nclass, rng)
        return rows if tuple(shape[1:]) == (6,) else rows[:, LABEL_COLUMNS]  # kData's rows, or kLabel's

    def _check(self, target, cls, first, end):
        if (end > self.vocab_size).any() or (cls >= self.nclass).any() or ((target < first) | (target >= end)).any():
            raise DataError(f"layer '{self.name}': a word record outside [loss_conf] (vocab_size {self.vocab_size}, "
                            f"nclass {self.nclass}), or a word outside its class: a store made for another vocabulary")

    def backward(self, grad, need):
        rows_at = np.flatnonzero(self.valid)
        d_word = self.p_word.copy()  # dL/d(word logits) = p - onehot
        d_word[rows_at, (self.target - self.first)[rows_at]] -= 1
        d_word *= self.inside
        d_class = self.p_class * self.valid[:, None]
        d_class[rows_at, self.cls[rows_at]] -= 1
        words, classes = self.params[0], self.params[1]
        member_vectors = words.data[self.members]  # (rows, width, dim)
        np.add.at(words.grad_for_scatter(), self.members.reshape(-1),
                  (d_word[:, :, None] * self.h[:, None, :]).reshape(-1, self.h.shape[1]))
        classes.add_grad(d_class.T, self.h)
        dh = np.einsum("rk,rkd->rd", d_word, member_vectors) + d_class @ classes.data
        return [dh if need[0] else None, None]

    def metrics(self):
        out, self.sums = self.sums, {"loss": 0.0, "loss/count": 0.0}
        return out

    @classmethod
    def report(cls, metrics):
        """SINGA's display: the perplexity beside the loss."""
        if "loss" in metrics:
            return {**metrics, "ppl": math.exp(min(metrics["loss"], 700.0))}
        return metrics


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (np.tanh(0.5 * x) + 1)  # never overflows, keeps the dtype


def _softmax(logits: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Row-wise softmax over the entries where ``mask`` holds (zero elsewhere, and on empty rows)."""
    shifted = np.where(mask, logits, -np.inf)
    top = np.max(shifted, axis=1, keepdims=True)
    e = np.exp(shifted - np.where(np.isfinite(top), top, 0))
    total = e.sum(axis=1, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0).astype(logits.dtype)
