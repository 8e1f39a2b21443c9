"""Energy models: a restricted Boltzmann machine as a pair of layers (SINGA's RBM family).

SINGA writes the RBM's undirected connection as two directed ones: ``kRBMVis``
lists its input and the ``kRBMHid`` layer as sources, ``kRBMHid`` lists the
``kRBMVis`` layer; the weight W (hdim x vdim) is declared by the visible layer
and shared by the hidden layer with ``share_from``.  Contrastive divergence
(:mod:`singa_mpi.algorithms.cd`) drives the pair through named passes:

=============  ==============================================================
pass           what happens
=============  ==============================================================
positive       vis: v⁺ = its input.  hid: h⁺ = act(v⁺·Wᵀ + b_h)
top-down       hid (its ``backward``): ĥ ~ sample(h), message ĥ·W to vis
negative       vis: v⁻ = σ(message + b_v).  hid: h⁻ = act(v⁻·Wᵀ + b_h)
gradients      hid: ∇W = (h⁻ᵀ·v⁻ − h⁺ᵀ·v⁺)/B, ∇b_h = colsum(h⁻ − h⁺)/B;
               vis: ∇b_v = colsum(v⁻ − v⁺)/B   (B: the global batch)
=============  ==============================================================

act is the logistic function, or the identity for Gaussian hidden units
(``rbm_conf.gaussian``), whose samples are h + N(0, 1).  Visible units are
never sampled (SINGA, after Hinton's practical guide).

The top-down message is the transpose of the up pass, so it travels along
the vis -> hid edge backwards exactly as a gradient would: the runtime's
connection layers sum partial products where the hidden units are split over
workers.  Hence the partitions the planner offers:

* ``partition_dim: 0`` on both: every worker its rows of the batch, W and the
  biases replicated (their gradients summed like any replicated param);
* ``partition_dim: 1`` on both: the hidden units (rows of W, b_h) are split,
  the hidden layer sees every row, and the visible layer computes the
  reconstruction of its rows of the batch (its own units depend on every
  hidden unit, so they cannot be split); the message ĥ_r·W_r of each worker is
  summed by the connection layer's backward (Reduce_scatter);
* ``location``: each layer whole on some worker (bridges in between).

Random numbers are entries of a (global batch x hdim) matrix per draw, from a
stream keyed by (seed, layer) and (phase, step, draw): a sub-layer draws only
its rows' block (:mod:`singa_mpi.streams`), so every partitioning samples what
one process samples.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from singa_mpi.layers.base import (LAYERS, ONE_TO_ALL, Layer, LayerConfigError, Shape, rows_product,
                                   sum_over_rows)
from singa_mpi.streams import KeyedStream, rows_block

_PHASE_CODES = {"train": 0, "test": 1, "val": 2}


def _logistic(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Stable σ(x) = (tanh(x/2) + 1)/2 that keeps the dtype; ``out=x`` computes it in place."""
    half = x.dtype.type(0.5)
    y = np.multiply(x, half, out=out)
    np.tanh(y, out=y)
    y += 1
    y *= half
    return y


def _hdim(layer: Layer) -> int:
    conf = layer.conf.rbm_conf
    if not layer.conf.HasField("rbm_conf") or conf.hdim <= 0:
        raise LayerConfigError("rbm_conf.hdim", conf.hdim if conf.HasField("hdim") else "missing",
                               "a positive number of hidden units")
    return conf.hdim


class _RBMLayer(Layer):
    """What both halves share: the passes contrastive divergence names."""

    def compute(self, phase: str, inputs: list[np.ndarray], train: bool) -> np.ndarray:
        if phase in ("positive", "forward"):
            return self.positive(inputs)
        if phase == "negative":
            return self.negative(inputs, train)
        raise ValueError(f"{type(self).__name__} has no pass {phase!r}: expected positive or negative")

    def forward(self, inputs: list[np.ndarray], train: bool) -> np.ndarray:
        return self.positive(inputs)


@LAYERS.register("kRBMVis")
class RBMVis(_RBMLayer):
    """Visible units of an RBM: srclayers = [input, its kRBMHid layer].

    Params: ``param[0]`` the weight W (hdim, vdim), used by the hidden layer, which
    computes every product with W; ``param[1]`` the visible bias (vdim,).
    Metric: ``squared_error``, Σ_j (v⁺ − v⁻)² per instance, for the first
    reconstruction of each batch (SINGA's "Squared Error", without its division
    by the number of passes).
    """

    energy_role = "visible"
    connection = ONE_TO_ALL  # its input's whole feature vector, whatever the split
    num_srcs = (2, 2)
    input_kinds = ("data",)  # the second source is the declared back edge, not an input
    # partition_dim 1 splits the pair's hidden units: this layer then splits the batch rows
    feature_split_rows = True
    deterministic = True  # row by row; its one gradient, the visible bias's, one term per row

    @classmethod
    def terms_for(cls, role: str) -> str:
        return "" if role == "weight" else "rows"  # W is the hidden layer's to train

    @classmethod
    def work_bytes(cls, conf, rows, in_shape, out_shape, backward=True, input_grad=True):
        """Held: the positive visible units, a float32 copy of the input."""
        return 4 * rows * math.prod(in_shape), 0

    def setup(self, src_shapes: Sequence[Shape]) -> Shape:
        hdim = _hdim(self)
        self.vdim = int(math.prod(src_shapes[0]))
        # W's shard follows the hidden units this sub-layer's pair holds (ctx.feature_slice)
        self.declare_param(0, "weight", (hdim, self.vdim), 0)
        self.bias = self.conf.rbm_conf.bias_term
        if self.bias:
            self.declare_param(1, "visible bias", (self.vdim,), None)
        self.sums = {"squared_error": 0.0}
        self.rows = 0
        self.reconstructions = 0
        return (self.vdim,)

    def feature_units(self) -> int:
        return self.conf.rbm_conf.hdim

    def local_out_shape(self) -> Shape:
        return self.out_shape  # every visible unit, whatever the split of the hidden units

    def positive(self, inputs: list[np.ndarray]) -> np.ndarray:
        x = inputs[0]
        self.v_pos = np.array(x.reshape(len(x), -1), dtype=np.float32 if x.dtype != np.float64 else x.dtype)
        self.reconstructions = 0
        return self.v_pos

    def negative(self, inputs: list[np.ndarray], train: bool) -> np.ndarray:
        message = self.grad  # ĥ·W, summed over the workers holding the hidden units
        if message is None:
            raise RuntimeError("no top-down message from the hidden layer: expected the hidden layer's "
                               "top-down pass before the negative pass")
        pre = message.reshape(self.v_pos.shape).astype(self.v_pos.dtype)  # a copy: the message may be a buffer
        if self.bias:
            pre += self.params[1].data
        self.v_neg = _logistic(pre, out=pre)
        self.reconstructions += 1
        if self.reconstructions == 1:  # the first reconstruction is the one SINGA reports
            diff = self.v_pos - self.v_neg
            sum_over_rows(self.ctx, self.sums, "squared_error", len(diff),
                          lambda lo, hi: float(np.einsum("ij,ij->", diff[lo:hi], diff[lo:hi])))
            self.rows += len(diff)
        return self.v_neg

    def param_gradients(self) -> None:
        if self.bias:
            scale = self.v_pos.dtype.type(1.0 / self.ctx.global_batch)
            # differences first: the two sums are close, their difference is the signal
            if self.ctx.block_rows is not None:  # deterministic: the rows, summed once every worker's are in
                self.params[1].add_rows((self.v_neg - self.v_pos) * scale)
            else:
                self.params[1].add_grad((self.v_neg - self.v_pos).sum(axis=0) * scale)

    def metrics(self) -> dict[str, float]:
        out = {}
        if self.rows:
            out = dict(self.sums, **{"squared_error/count": float(self.rows)})
        self.sums, self.rows = {"squared_error": 0.0}, 0
        return out


@LAYERS.register("kRBMHid")
class RBMHid(_RBMLayer):
    """Hidden units of an RBM: srclayers = [its kRBMVis layer].

    Params: ``param[0]`` W (hdim, vdim), ``share_from`` the visible layer's W;
    ``param[1]`` the hidden bias (hdim,).  Split on features, this sub-layer
    holds hidden units ``ctx.feature_slice`` (rows of W, entries of b_h) for
    every row of the batch.
    """

    energy_role = "hidden"
    connection = ONE_TO_ALL
    num_srcs = (1, 1)
    # deterministic mode: products per canonical block; W's and b_h's terms two per batch row (the
    # positive and the negative phase's), the same on any worker
    deterministic = True
    deterministic_terms = "pairs"

    @classmethod
    def work_bytes(cls, conf, rows, in_shape, out_shape, backward=True, input_grad=True):
        """Held: the visible and hidden units of the positive and the latest negative pass (copies);
        passing: a pass's pre-activations and samples."""
        visible, hidden = rows * math.prod(in_shape), rows * math.prod(out_shape)
        return 4 * 2 * (visible + hidden), 4 * 2 * hidden

    def setup(self, src_shapes: Sequence[Shape]) -> Shape:
        hdim = _hdim(self)
        self.vdim = int(math.prod(src_shapes[0]))
        self.gaussian = self.conf.rbm_conf.gaussian
        self.declare_param(0, "weight", (hdim, self.vdim), 0)
        self.bias = self.conf.rbm_conf.bias_term
        if self.bias:
            self.declare_param(1, "hidden bias", (hdim,), 0)
        self._draw_key = (-1, 0)  # (step, draws at that step)
        self._stream: KeyedStream | None = None
        return (hdim,)

    # -- passes ---------------------------------------------------------------
    def _activate(self, v: np.ndarray) -> np.ndarray:
        w = self.params[0].data  # (hidden units here, vdim)
        pre = rows_product(v, w.T, self.ctx.block_rows)
        if self.bias:
            pre += self.params[1].data
        return pre if self.gaussian else _logistic(pre, out=pre)

    def _keep(self, which: int, v: np.ndarray, h: np.ndarray) -> np.ndarray:
        """Copy v and h into this layer's own arrays (inputs may be reused buffers):
        index 0 holds the positive pass, 1 the latest negative one."""
        if getattr(self, "_v", None) is None or self._v.shape[1:] != v.shape or self._v.dtype != v.dtype:
            self._v = np.empty((2,) + v.shape, v.dtype)
            self._h = np.empty((2,) + h.shape, h.dtype)
        self._v[which] = v
        self._h[which] = h
        return self._h[which]

    def positive(self, inputs: list[np.ndarray]) -> np.ndarray:
        v = inputs[0].reshape(len(inputs[0]), -1)
        self.current = 0
        return self._keep(0, v, self._activate(v))

    def negative(self, inputs: list[np.ndarray], train: bool) -> np.ndarray:
        v = inputs[0].reshape(len(inputs[0]), -1)
        self.current = 1
        return self._keep(1, v, self._activate(v))

    def sample(self) -> np.ndarray:
        """ĥ for this sub-layer's rows and units, from the latest hidden values: entries of the
        (global batch x hdim) random matrix of this draw, the same whatever the partitioning."""
        h = self._h[self.current]
        if self._stream is None:
            self._stream = KeyedStream(self.ctx.seed, self.conf.name)
        draw = self._stream.normal if self.gaussian else self._stream.uniform
        hdim = self.out_shape[0]
        numbers = rows_block(draw, self._next_draw(), self.ctx.rows(), hdim, self.ctx.features(hdim))
        if self.gaussian:
            return h + numbers.astype(h.dtype, copy=False)
        return (numbers.astype(h.dtype, copy=False) <= h).astype(h.dtype)

    def _next_draw(self) -> tuple[int, int, int]:
        """(phase, step, draw): draws count from 0 at each step, so a resumed run draws the same."""
        step, draws = self._draw_key
        draws = draws + 1 if step == self.ctx.step else 0
        self._draw_key = (self.ctx.step, draws)
        return _PHASE_CODES.get(self.ctx.phase, 3), self.ctx.step, draws

    def backward(self, grad: np.ndarray | None, need: list[bool]) -> list[np.ndarray | None]:
        """The top-down half of a Gibbs round: the message ĥ·W for the visible layer
        (a partial sum over the hidden units when they are split)."""
        if not need[0]:
            return [None]
        return [rows_product(self.sample(), self.params[0].data, self.ctx.block_rows)]

    def param_gradients(self) -> None:
        """∇W = (h⁻ᵀ·v⁻ − h⁺ᵀ·v⁺)/B as one product over the stacked passes, ∇b_h = colsum(h⁻ − h⁺)/B."""
        h, v = self._h, self._v
        scale = h.dtype.type(1.0 / self.ctx.global_batch)
        if self.ctx.block_rows is not None:  # deterministic: each row's positive then negative term
            signed = np.stack([h[0] * -scale, h[1] * scale], axis=1).reshape(-1, h.shape[-1])
            self.params[0].add_rows(signed, np.stack([v[0], v[1]], axis=1).reshape(-1, v.shape[-1]))
            if self.bias:
                self.params[1].add_rows(signed)
            return
        signed = np.concatenate([h[0] * -scale, h[1] * scale])  # (2·rows, units), matching v's stacking
        self.params[0].add_grad(signed.T, v.reshape(-1, v.shape[-1]))
        if self.bias:
            self.params[1].add_grad((h[1] - h[0]).sum(axis=0) * scale)
