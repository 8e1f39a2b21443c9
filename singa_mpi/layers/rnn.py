"""Recurrent layers (SINGA's RNN family): the GRU, one time step per layer copy.

A recurrent net is trained by unrolling it (:mod:`singa_mpi.config.unroll` does that
before planning): copy t of a ``kGRU`` layer lists its input x_t and then copy
t-1 as sources, and every copy uses copy 0's params.  One copy therefore
computes one step, h_t from (x_t, h_{t-1}), and its backward returns the two
input gradients separately, so back-propagation over the unrolled net *is*
BPTT.  SINGA's equations (gru.cc, v0.3; the reset gate applied after the hidden
matmul, no hidden-side bias)::

    z = σ(x·W_zxᵀ + b_z + h_{t-1}·W_zhᵀ)
    r = σ(x·W_rxᵀ + b_r + h_{t-1}·W_rhᵀ)
    c = tanh(r ⊙ (h_{t-1}·W_chᵀ) + x·W_cxᵀ + b_c)
    h_t = z ⊙ h_{t-1} + (1 − z) ⊙ c

Where SINGA's backward is wrong ours is the true gradient: the direct term of
dh_{t-1} is g ⊙ z, not z (its bug B4), and dx and dh_{t-1} are two gradients
the framework routes to their own sources (B5: SINGA writes both into one slot
when the input is itself a GRU, and one of them is lost).

Split on features (``partition_dim: 1``), a sub-layer computes hidden units
``ctx.feature_slice`` = [lo, hi) for every row, with rows lo..hi of every
weight and entries lo..hi of every bias.  It reads all of x and all of
h_{t-1} (OneToAll) and returns partial input gradients over its units (full
width; the direct term g ⊙ z only in columns lo..hi) that the framework sums.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from singa_mpi.layers.base import LAYERS, ONE_TO_ALL, Layer, LayerConfigError, Shape, rows_product

# conf.param order, as SINGA's GRULayer::Setup reads it
Z_X, R_X, C_X, Z_H, R_H, C_H, Z_B, R_B, C_B = range(9)
_NAMES = ("z_hx", "r_hx", "c_hx", "z_hh", "r_hh", "c_hh", "z_b", "r_b", "c_b")


def _logistic(x: np.ndarray) -> np.ndarray:
    """σ(x) in place, as (tanh(x/2) + 1)/2: stable for any x and keeps the dtype."""
    half = x.dtype.type(0.5)
    x *= half
    np.tanh(x, out=x)
    x += 1
    x *= half
    return x


@LAYERS.register("kGRU")
class GRU(Layer):
    """One GRU time step: x (batch, V) [, h_prev (batch, H)] -> h (batch, H or hi-lo).

    Sources: ``[x]`` for the first step, ``[x, h_prev]`` after it (the previous
    copy of this layer).  With one source, h_prev is ``initial_state`` when the
    training algorithm has set it (the state carried from the previous batch:
    (local rows, H), no gradient flows into it), else zeros.
    """

    connection = ONE_TO_ALL  # every unit needs all of x and all of h_prev
    recurrent = True  # its first copy may start from the state carried from the previous batch
    num_srcs = (1, 2)  # both inputs are "data" (the default input kinds)
    deterministic = True  # products per canonical block, gradients as terms per row (each copy's)

    @classmethod
    def work_bytes(cls, conf, rows, in_shape, out_shape, backward=True, input_grad=True):
        """Held (per unrolled copy): the update and reset gates, the candidate and the hidden state's
        product, kept for backward, and backward's four gate gradients, kept by the params until their
        gradients are formed (one GEMM over every copy's); passing: two of backward's products."""
        size = 4 * rows * math.prod(out_shape)
        return (8 * size, 2 * size) if backward else (4 * size, 0)

    def __init__(self, conf, ctx=None):
        super().__init__(conf, ctx)
        self.initial_state: np.ndarray | None = None

    def setup(self, src_shapes: Sequence[Shape]) -> Shape:
        conf = self.conf.gru_conf
        hidden = conf.dim_hidden
        if not self.conf.HasField("gru_conf") or hidden <= 0:
            raise LayerConfigError("gru_conf.dim_hidden", hidden if conf.HasField("dim_hidden") else "missing",
                                   "a positive number of hidden units")
        self.bias = self._has_bias(len(self.conf.param))
        if len(src_shapes) > 1 and tuple(src_shapes[1]) != (hidden,):
            raise LayerConfigError("srclayers[1]", f"output shape {tuple(src_shapes[1])}",
                                   f"the previous GRU step, output shape ({hidden},)")
        self.hidden, self.in_dim = hidden, int(math.prod(src_shapes[0]))
        self.units = self.ctx.features(hidden)  # [lo, hi): the hidden units this sub-layer computes
        for index in (Z_X, R_X, C_X):  # backward adds each weight's gradient as one product over rows
            self.declare_param(index, _NAMES[index], (hidden, self.in_dim), 0, batch_factored=True)
        for index in (Z_H, R_H, C_H):
            self.declare_param(index, _NAMES[index], (hidden, hidden), 0, batch_factored=True)
        if self.bias:
            for index in (Z_B, R_B, C_B):
                self.declare_param(index, _NAMES[index], (hidden,), 0)
        return (hidden,)

    def _has_bias(self, count: int) -> bool:
        """SINGA decides by the param count (more than 6: biases); bias_term may only agree."""
        if count not in (6, 9):
            raise LayerConfigError("param", f"{count} params",
                                   "6 (z_hx r_hx c_hx z_hh r_hh c_hh) or 9 (those and z_b r_b c_b)")
        conf = self.conf.gru_conf
        if count == 9 and conf.HasField("bias_term") and not conf.bias_term:
            raise LayerConfigError("gru_conf.bias_term", "false", "true, or 6 params: 9 params include the biases")
        return count == 9

    # -- carried state (checkpoints) ---------------------------------------------
    def carried(self) -> dict[str, np.ndarray]:
        """The state carried into this copy from the previous batch, so that a resumed run
        continues the text where it stopped (rows: this sub-layer's, all H units)."""
        return {} if self.initial_state is None else {"hidden": self.initial_state}

    def load_carried(self, name: str, value: np.ndarray) -> None:
        if name != "hidden":
            super().load_carried(name, value)
        self.initial_state = np.array(value)

    # -- computation -----------------------------------------------------------
    def forward(self, inputs: list[np.ndarray], train: bool) -> np.ndarray:
        self.in_shape = inputs[0].shape
        x = inputs[0].reshape(len(inputs[0]), -1)  # (batch, V)
        h = inputs[1] if len(inputs) > 1 else self._start(x)  # (batch, H): all units
        w = [p.data for p in self.params]
        # one GEMM per weight: stacking the three weights of an input into one GEMM per call
        # measured 15% slower per step (batch 50, V 101, H 512, float32, one thread)
        z = self._gate(x, h, w, Z_X, Z_H, Z_B)
        r = self._gate(x, h, w, R_X, R_H, R_B)
        hc = self._product(h, w[C_H].T)  # (batch, units), kept: the reset gate's gradient needs it
        c = r * hc
        c += self._product(x, w[C_X].T)
        if self.bias:
            c += w[C_B]
        np.tanh(c, out=c)
        lo, hi = self.units
        self.cache = x, h, z, r, c, hc
        y = h[:, lo:hi] - c  # SINGA's order of operations: (h_prev − c)⊙z + c
        y *= z
        y += c
        return y

    def _gate(self, x, h, w, wx, wh, b) -> np.ndarray:
        a = self._product(x, w[wx].T)  # (batch, units)
        if self.bias:
            a += w[b]
        a += self._product(h, w[wh].T)
        return _logistic(a)

    def _product(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return rows_product(a, b, self.ctx.block_rows)

    def _start(self, x: np.ndarray) -> np.ndarray:
        """h_prev of the first step: the carried state, or zeros (SINGA's only choice)."""
        want = (len(x), self.hidden)
        if self.initial_state is None:
            dtype = np.result_type(x, self.params[Z_H].data)
            return np.zeros(want, dtype)
        if self.initial_state.shape != want:
            raise ValueError(f"layer {self.name!r}: initial_state shape {self.initial_state.shape}, expected {want}")
        return self.initial_state

    def backward(self, grad: np.ndarray, need: list[bool]) -> list[np.ndarray | None]:
        """[dx, dh_prev] (dh_prev only with two sources); the 6 or 9 param gradients accumulate."""
        x, h, z, r, c, hc = self.cache
        lo, hi = self.units
        dz = grad * (h[:, lo:hi] - c)
        dz *= z * (1 - z)
        dc = grad * (1 - z)
        dc *= 1 - c * c
        dr = dc * hc
        dr *= r * (1 - r)
        dcr = dc * r  # the gradient of h_prev·W_chᵀ
        p = self.params
        rows = self.ctx.block_rows is not None  # deterministic: the rows, formed once every worker's are in
        for index, d in ((Z_X, dz), (R_X, dr), (C_X, dc)):
            p[index].add_rows(d, x) if rows else p[index].add_grad(d.T, x)  # (units, V)
        for index, d in ((Z_H, dz), (R_H, dr), (C_H, dcr)):
            p[index].add_rows(d, h) if rows else p[index].add_grad(d.T, h)  # (units, H)
        if self.bias:
            for index, d in ((Z_B, dz), (R_B, dr), (C_B, dc)):
                p[index].add_rows(d) if rows else p[index].add_grad(d.sum(axis=0))
        grads: list[np.ndarray | None] = [None] * len(need)
        if need[0]:
            grads[0] = self._through(p, (dz, dr, dc), (Z_X, R_X, C_X)).reshape(self.in_shape)
        if len(need) > 1 and need[1]:
            dh = self._through(p, (dz, dr, dcr), (Z_H, R_H, C_H))  # (batch, H): through every unit
            dh[:, lo:hi] += grad * z  # the direct path (SINGA adds z alone: bug B4)
            grads[1] = dh
        return grads

    def _through(self, p, deltas, indices) -> np.ndarray:
        """Σ delta_k · W_k: the gradient of one input through the three projections of it."""
        total = self._product(deltas[0], p[indices[0]].data)
        for d, index in zip(deltas[1:], indices[1:]):
            total += self._product(d, p[index].data)
        return total
