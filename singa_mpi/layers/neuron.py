"""Neuron layers: feature transformations (SINGA's neuron family).

Inner product, element-wise activations, dropout, softmax, embedding and
one-hot here; convolution, pooling and LRN in :mod:`singa_mpi.layers.conv`.
Maths preserves the input dtype (float32 in training, float64 in gradient checks).
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from singa_mpi.errors import DataError
from singa_mpi.layers.base import LAYERS, ONE_TO_ALL, Layer, LayerConfigError, Shape, row_blocks
from singa_mpi.proto import job_pb2


def _flat(shape: Shape) -> int:
    return int(math.prod(shape))


@LAYERS.register("kInnerProduct")
class InnerProduct(Layer):
    """y = x·Wᵀ + b with W of shape (F, D) (SINGA's (out, in) layout); ``transpose``: W (D, F), y = x·W.

    Split on features, this sub-layer computes output units ``ctx.feature_slice``
    with the matching rows (columns when transposed) of W and entries of b.
    """

    connection = ONE_TO_ALL
    per_batch = ("x",)
    deterministic = True

    @classmethod
    def work_bytes(cls, conf, rows, in_shape, out_shape, backward=True, input_grad=True):
        """Passing: the output gradient transposed for the weight gradient's GEMM (its input is kept by
        reference: it is the source's output)."""
        return 0, 4 * rows * math.prod(out_shape) if backward else 0

    def setup(self, src_shapes: Sequence[Shape]) -> Shape:
        conf = self.conf.innerproduct_conf
        if conf.num_output <= 0:
            raise LayerConfigError("innerproduct_conf.num_output", conf.num_output if conf.HasField("num_output")
                                   else "missing", "a positive number of output units")
        self.in_dim = _flat(src_shapes[0])
        self.transpose = conf.transpose
        weight_shape = (self.in_dim, conf.num_output) if self.transpose else (conf.num_output, self.in_dim)
        # backward adds dW as one product over the local rows (grad.T @ x, or x.T @ grad)
        self.declare_param(0, "weight", weight_shape, 1 if self.transpose else 0, batch_factored=True)
        self.bias = conf.bias_term
        if self.bias:
            self.declare_param(1, "bias", (conf.num_output,), 0)
        return (conf.num_output,)

    def forward(self, inputs: list[np.ndarray], train: bool) -> np.ndarray:
        self.in_shape = inputs[0].shape
        x = inputs[0].reshape(len(inputs[0]), -1)  # (batch, in_dim)
        self.x = x
        if self.ctx.block_rows is None:
            return self._product(x)
        return self._product_by_blocks(x)

    def _product_by_blocks(self, x: np.ndarray) -> np.ndarray:
        """Deterministic mode: one GEMM per canonical block, as the default mode's one product.  (x_b·Wᵀ
        against a row-major copy of Wᵀ runs the blocks' GEMMs 20-25% faster, but transposing the
        weight into that copy each pass costs more than it saves: mnist_mlp's deterministic step went
        from 408 to 349 samples/s.)"""
        w = self.params[0].data
        y = np.empty((len(x), w.shape[1] if self.transpose else w.shape[0]), x.dtype)
        for lo, hi in row_blocks(len(x), self.ctx.block_rows):
            y[lo:hi] = self._product(x[lo:hi])
        return y

    def _product(self, x: np.ndarray) -> np.ndarray:
        w = self.params[0].data
        if self.transpose:
            y = x @ w  # (batch, out)
            if self.bias:
                y += self.params[1].data
            return y
        # (W·xᵀ)ᵀ rather than x·Wᵀ: BLAS then streams W as stored, 10-15% faster for
        # batches of 32-64 rows; the bias add doubles as the copy back to row-major
        yt = w @ x.T  # (out, batch)
        y = np.empty((len(x), len(yt)), yt.dtype)
        if self.bias:
            np.add(yt.T, self.params[1].data, out=y)
        else:
            np.copyto(y, yt.T)
        return y

    def backward(self, grad: np.ndarray, need: list[bool]) -> list[np.ndarray | None]:
        w = self.params[0]
        blocks = self.ctx.block_rows
        if blocks is not None:  # deterministic: the rows themselves, formed once every worker's are in
            w.add_rows(self.x, grad) if self.transpose else w.add_rows(grad, self.x)
            if self.bias:
                self.params[1].add_rows(grad)
        else:
            if self.transpose:
                w.add_grad(self.x.T, grad)  # (in, out)
            else:
                w.add_grad(grad.T, self.x)  # (out, in)
            if self.bias:
                self.params[1].add_grad(grad.sum(axis=0))
        if not need[0]:
            return [None]
        wt = w.data.T if self.transpose else w.data
        if blocks is None:
            dx = grad @ wt  # (batch, in)
        else:
            dx = np.empty((len(grad), wt.shape[1]), grad.dtype)
            for lo, hi in row_blocks(len(grad), blocks):
                dx[lo:hi] = grad[lo:hi] @ wt
        return [dx.reshape(self.in_shape)]


class _Elementwise(Layer):
    """y = f(x) element by element; any slice of rows or features works unchanged."""

    deterministic = True

    @classmethod
    def work_bytes(cls, conf, rows, in_shape, out_shape, backward=True, input_grad=True):
        """Passing: the products of backward (two arrays as large as the output)."""
        return 0, 2 * 4 * rows * math.prod(out_shape) if backward else 0

    def setup(self, src_shapes: Sequence[Shape]) -> Shape:
        return tuple(src_shapes[0])

    def backward(self, grad: np.ndarray, need: list[bool]) -> list[np.ndarray | None]:
        return [self.input_grad(grad) if need[0] else None]

    def input_grad(self, grad: np.ndarray) -> np.ndarray:
        """dL/dx from dL/dy, using what forward cached."""
        raise NotImplementedError


@LAYERS.register("kReLU")
class ReLU(_Elementwise):
    """max(x, 0) + negative_slope·min(x, 0)."""

    per_batch = ("mask",)

    @classmethod
    def work_bytes(cls, conf, rows, in_shape, out_shape, backward=True, input_grad=True):
        """Held: the mask of positive inputs (a byte each)."""
        return rows * math.prod(out_shape), 0

    def setup(self, src_shapes):
        self.slope = self.conf.relu_conf.negative_slope
        return tuple(src_shapes[0])

    def forward(self, inputs, train):
        x = inputs[0]
        self.mask = x > 0
        if self.slope:
            return np.where(self.mask, x, x * x.dtype.type(self.slope))
        return np.maximum(x, 0)

    def input_grad(self, grad):
        if self.slope:
            return np.where(self.mask, grad, grad * grad.dtype.type(self.slope))
        return grad * self.mask


@LAYERS.register("kSigmoid")
class Sigmoid(_Elementwise):
    per_batch = ("y",)

    def forward(self, inputs, train):
        x = inputs[0]
        self.y = 0.5 * (np.tanh(0.5 * x) + 1)  # stable logistic, keeps the dtype
        return self.y

    def input_grad(self, grad):
        return grad * self.y * (1 - self.y)


# SINGA 0.3's hard-coded constants (mshadow/cxxnet_op.h ``stanh``, ``stanh_grad``)
STANH_A, STANH_B = 1.7159047, 0.66666667


@LAYERS.register("kSTanh")
class STanh(_Elementwise):
    """Scaled tanh of LeCun as SINGA computes it: 1.7159047·tanh(0.66666667·x)."""

    per_batch = ("t",)

    @classmethod
    def work_bytes(cls, conf, rows, in_shape, out_shape, backward=True, input_grad=True):
        """Held: tanh of the input (the output is it scaled); passing: a product of backward."""
        size = 4 * rows * math.prod(out_shape)
        return size, size if backward else 0

    def forward(self, inputs, train):
        x = inputs[0]
        self.t = np.tanh(x * x.dtype.type(STANH_B))
        return self.t * x.dtype.type(STANH_A)

    def input_grad(self, grad):
        t = self.t
        return grad * (grad.dtype.type(STANH_A * STANH_B) * (1 - t * t))


class _Tanh(_Elementwise):
    """tanh(x): only reachable through kActivation (SINGA has no kTanh type)."""

    per_batch = ("y",)

    def forward(self, inputs, train):
        self.y = np.tanh(inputs[0])
        return self.y

    def input_grad(self, grad):
        return grad * (1 - self.y * self.y)


_ACTIVATIONS = {"RELU": ReLU, "SIGMOID": Sigmoid, "TANH": _Tanh, "STANH": STanh}


@LAYERS.register("kActivation", "kCudnnActivation")
class Activation(_Elementwise):
    """One of RELU, SIGMOID, TANH, STANH chosen by ``activation_conf.type``."""

    def setup(self, src_shapes):
        name = job_pb2.ActivationProto.ActivationType.Name(self.conf.activation_conf.type)
        self.impl = _ACTIVATIONS[name](self.conf, self.ctx)
        self.impl.out_shape = self.impl.setup(src_shapes)
        return self.impl.out_shape

    def forward(self, inputs, train):
        return self.impl.forward(inputs, train)

    def input_grad(self, grad):
        return self.impl.input_grad(grad)

    def release(self) -> None:
        super().release()
        self.impl.release()


@LAYERS.register("kDropout")
class Dropout(_Elementwise):
    """Inverted dropout: keep with probability 1-p and scale by 1/(1-p) in training.

    The mask is drawn for the whole logical (global_batch, *out_shape) array from a
    stream keyed by (seed, layer, step) and then sliced to this sub-layer's rows and
    features, so any partitioning drops exactly the units the serial run drops.
    """

    per_batch = ("mask",)

    @classmethod
    def work_bytes(cls, conf, rows, in_shape, out_shape, backward=True, input_grad=True):
        """Held: the scaled mask (float32); passing: the uniform draws (float64) and the kept units
        (bool), drawn for every row of the global batch (counted here for this part's rows)."""
        size = rows * math.prod(out_shape)
        return (4 * size, 9 * size) if backward else (0, 0)  # a test net's forward is the identity

    def setup(self, src_shapes):
        ratio = self.conf.dropout_conf.dropout_ratio
        if not 0 <= ratio < 1:
            raise LayerConfigError("dropout_conf.dropout_ratio", ratio, "a ratio in [0, 1)")
        return tuple(src_shapes[0])

    def forward(self, inputs, train):
        x = inputs[0]
        ratio = self.conf.dropout_conf.dropout_ratio
        if not train or ratio == 0:
            self.mask = None
            return x
        keep = self.rng(self.ctx.step).random((self.ctx.global_batch,) + self.out_shape) >= ratio
        rows = slice(*self.ctx.rows())
        feats = slice(*self.ctx.features(self.out_shape[0]))
        self.mask = keep[rows, feats].astype(x.dtype) * x.dtype.type(1.0 / (1.0 - ratio))
        return x * self.mask

    def input_grad(self, grad):
        return grad if self.mask is None else grad * self.mask


def softmax(x: np.ndarray) -> np.ndarray:
    """Row-wise softmax over the last axis, shifted by the row maximum for stability."""
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    e /= e.sum(axis=-1, keepdims=True)
    return e


@LAYERS.register("kSoftmax", "kCudnnSoftmax")
class Softmax(Layer):
    """Softmax over the flattened features (``num_softmax_per_instance`` groups per row)."""

    deterministic = True

    connection = ONE_TO_ALL
    feature_partitionable = False
    per_batch = ("y",)

    def setup(self, src_shapes):
        self.groups = self.conf.softmax_conf.num_softmax_per_instance
        dim = _flat(src_shapes[0])
        if self.groups <= 0 or dim % self.groups:
            raise LayerConfigError("softmax_conf.num_softmax_per_instance", self.groups,
                                   f"a positive divisor of the feature count {dim}")
        return tuple(src_shapes[0])

    def forward(self, inputs, train):
        x = inputs[0]
        self.y = softmax(x.reshape(len(x), self.groups, -1))
        return self.y.reshape(x.shape)

    def backward(self, grad, need):
        if not need[0]:
            return [None]
        g = grad.reshape(self.y.shape)
        dx = self.y * (g - (g * self.y).sum(axis=-1, keepdims=True))
        return [dx.reshape(grad.shape)]


def _token_ids(layer: Layer, x: np.ndarray, vocab: int) -> np.ndarray:
    """Ids as int64 (stores may hold them as floats); DataError for any id outside the vocabulary."""
    ids = x.astype(np.int64)
    outside = (ids < 0) | (ids >= vocab)
    if outside.any():
        raise DataError(f"layer '{layer.name}': id {ids[outside][0]} outside the vocabulary 0..{vocab - 1}")
    return ids


def _example_ids(shape: Shape, vocab: int, rng: np.random.Generator) -> np.ndarray:
    """Ids inside the vocabulary, as float32 (as kCharRNN and the stores give them)."""
    return rng.integers(0, vocab, shape).astype(np.float32)


def _id_shape(shape: Shape, max_dims: int) -> Shape:
    """Per-sample shape of an id input, a trailing 1 dropped: () for one id, (T,) for a sequence."""
    ids = tuple(shape[:-1]) if shape and shape[-1] == 1 else tuple(shape)
    if len(ids) > max_dims:
        expected = "(batch,) or (batch, T) integer ids" if max_dims else "(batch,) integer ids"
        raise LayerConfigError("srclayers", f"output shape {tuple(shape)}", f"a source giving {expected}")
    return ids


@LAYERS.register("kEmbedding")
class Embedding(Layer):
    """Rows of a (vocab_size, feature_dim) table looked up by integer ids.

    ids (batch,) -> (batch, feature_dim); ids (batch, T) -> (batch, T, feature_dim), except in a copy
    of an unrolled net (``unroll_len`` > 1), which embeds column ``unroll_index`` of a (batch, T)
    window (as kOneHot does: copy t encodes step t).
    Split on features, a sub-layer holds columns ``ctx.feature_slice`` of the table;
    that needs (batch,) ids, since with (batch, T) ids axis 1 of the output is T.
    """

    connection = ONE_TO_ALL  # every feature shard needs all the ids

    def setup(self, src_shapes):
        conf = self.conf.embedding_conf
        if conf.vocab_size <= 0:
            raise LayerConfigError("embedding_conf.vocab_size", conf.vocab_size, "a positive vocabulary size")
        if conf.feature_dim <= 0:
            raise LayerConfigError("embedding_conf.feature_dim", conf.feature_dim, "a positive feature dimension")
        self.id_shape = _id_shape(src_shapes[0], max_dims=1)
        self.column = None
        if self.id_shape and self.conf.unroll_len > 1:  # a copy over time: its step's column
            self.column = self.conf.unroll_index
            if self.column >= self.id_shape[0]:
                raise LayerConfigError("unroll_index", self.column, f"0..{self.id_shape[0] - 1}: the source gives "
                                       f"{self.id_shape[0]} ids per row")
            self.id_shape = ()
        if self.id_shape and self.ctx.feature_slice is not None:
            raise LayerConfigError("partition_dim", 1, "0 or -1: with (batch, T) ids axis 1 of the output is T, "
                                   "not the embedding features")
        self.declare_param(0, "table", (conf.vocab_size, conf.feature_dim), 1)
        return self.id_shape + (conf.feature_dim,)

    def forward(self, inputs, train):
        x = inputs[0]
        if self.column is not None:
            x = x.reshape(len(x), -1)[:, self.column]
        self.ids = _token_ids(self, x.reshape((len(x),) + self.id_shape), self.conf.embedding_conf.vocab_size)
        return self.params[0].data[self.ids]  # (batch, [T,] local_dim)

    def example_input(self, index, shape, rng):
        return _example_ids(shape, self.conf.embedding_conf.vocab_size, rng)

    def backward(self, grad, need):
        table = self.params[0]
        # several rows may use one id: unbuffered add so every use accumulates
        np.add.at(table.grad_for_scatter(), self.ids.reshape(-1), grad.reshape(self.ids.size, -1))
        return [None]


@LAYERS.register("kOneHot")
class OneHot(Layer):
    """Integer ids (batch,) -> one-hot rows (batch, vocab_size); no gradient flows back to ids.

    Ids (batch, T), a window of T ids per row (kCharRNN's): column ``unroll_index`` of them, so
    that copy t of an unrolled net encodes step t (SINGA's ``src.data(unroll_index)``).
    Split on features, a sub-layer writes columns ``ctx.feature_slice`` of the rows.
    """

    deterministic = True

    connection = ONE_TO_ALL  # every column shard needs all the ids

    def setup(self, src_shapes):
        self.vocab = self.conf.onehot_conf.vocab_size
        if self.vocab <= 0:
            raise LayerConfigError("onehot_conf.vocab_size", self.vocab, "a positive vocabulary size")
        id_shape = _id_shape(src_shapes[0], max_dims=1)
        self.column = self.conf.unroll_index if id_shape else None  # None: one id per row
        if id_shape and not 0 <= self.column < id_shape[0]:
            raise LayerConfigError("unroll_index", self.column,
                                   f"0..{id_shape[0] - 1}: the column of its source's (batch, {id_shape[0]}) ids "
                                   f"(a kCharRNN source gives char_rnn_conf.unroll_len + 1)")
        return (self.vocab,)

    def forward(self, inputs, train):
        x = inputs[0]
        x = x.reshape(len(x)) if self.column is None else x.reshape(len(x), -1)[:, self.column]
        ids = _token_ids(self, x, self.vocab)
        lo, hi = self.ctx.features(self.vocab)
        # float ids keep their dtype (float64 in checks); integer ids give float32 rows
        dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.float32
        out = np.zeros((len(ids), hi - lo), dtype)
        inside = (ids >= lo) & (ids < hi)
        out[np.nonzero(inside)[0], ids[inside] - lo] = 1
        return out

    def example_input(self, index, shape, rng):
        return _example_ids(shape, self.vocab, rng)

    def backward(self, grad, need):
        return [None]
