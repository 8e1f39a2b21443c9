"""Batch normalization (SINGA 0.3's ``kBM`` / ``kCudnnBM``), with statistics over the whole batch.

Per channel c (axis 1; over rows and, for images, every pixel)::

    training:  μ, σ² of this batch;   x̂ = (x − μ) / √(σ² + ε);   y = γ·x̂ + β
               running ← (1 − f)·running + f·(μ, σ²·N/(N−1))      (f: bm_conf.running_factor)
    test:      μ, σ² = the running statistics

Params in SINGA's order and shapes: ``param[0]`` the scale γ, ``param[1]`` the bias β,
``param[2]`` the running mean, ``param[3]`` the running variance, each (1, C, 1, 1) for
images (SINGA's shape) and (1, C) for feature vectors.  The running statistics are state
the layer writes: the updater never touches them, checkpoints keep them.

Split on the batch, every worker normalises its rows with the statistics of the *global*
batch: the per-channel sums Σx and Σx² (forward) and Σdy, Σdy·x̂ (backward) of its rows
are summed over the workers holding the other rows (``ctx.allreduce``, set by the runtime;
None when this sub-layer holds every row), in float64, so a partitioned run normalises
exactly as the serial one.  Split on features (channels), each worker normalises its own
channels with no communication.

Deterministic mode (``ctx.block_rows``): every such sum is one partial sum per canonical block of
the batch, computed from the block's rows alone (the same bits on any worker), exchanged as an
array with a row per block of the whole batch (this worker's rows filled, the others -0.0, which
adds nothing: one value per element survives the sum over the workers), then added in block order;
the scale's and the bias's gradients are one term per block (``Param.add_rows``, "blocks").
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from singa_mpi.layers.base import LAYERS, Layer, LayerConfigError, Shape, row_blocks


@LAYERS.register("kBM")
@LAYERS.register("kCudnnBM")
class BatchNorm(Layer):
    # the statistics of a batch split over workers are summed over them (see the module docstring)
    batch_statistics = True
    deterministic = True  # its sums per canonical block, added in block order (see the module doc)
    deterministic_terms = "blocks"
    micro_batch_refusal = ("it normalises by the mean and variance of the whole batch, which no micro-batch "
                           "holds (statistics summed over micro-batches would stall the pipeline)")

    def setup(self, src_shapes: Sequence[Shape]) -> Shape:
        shape = tuple(src_shapes[0])
        if len(shape) not in (1, 3):
            raise LayerConfigError("srclayers", f"a source of shape {shape}",
                                   "images (channels, height, width) or feature vectors")
        channels = shape[0]
        param_shape = (1, channels, 1, 1) if len(shape) == 3 else (1, channels)
        for index, role in enumerate(("scale", "bias", "running mean", "running variance")):
            self.declare_param(index, role, param_shape, 1, trained=index < 2)
        conf = self.conf.bm_conf
        if not 0 < conf.running_factor <= 1:
            raise LayerConfigError("bm_conf.running_factor", conf.running_factor, "a fraction in (0, 1]")
        if conf.epsilon <= 0:
            raise LayerConfigError("bm_conf.epsilon", conf.epsilon, "a positive number")
        self.axes = (0, 2, 3) if len(shape) == 3 else (0,)
        # values per channel in the global batch: N of the formulas
        self.count = self.ctx.global_batch * (math.prod(shape[1:]) if len(shape) == 3 else 1)
        if self.count < 2:
            raise LayerConfigError("srclayers", f"{self.count} value per channel in a batch",
                                   "at least 2 values per channel to normalise over (a larger batch)")
        return shape

    # -- statistics over the whole batch ----------------------------------------------
    def _global_sums(self, *local: np.ndarray) -> list[np.ndarray]:
        """Per-channel float64 sums over the rows of every worker holding part of the batch; in
        deterministic mode ``local`` holds one row per block of this worker's rows (k, blocks, channels)."""
        if self.ctx.block_rows is not None:
            return self._block_sums(np.stack(local))
        stacked = np.stack(local)  # (k, channels)
        if self.ctx.allreduce is not None:
            stacked = self.ctx.allreduce(stacked)
        return list(stacked)

    def _block_sums(self, local: np.ndarray) -> list[np.ndarray]:
        """Deterministic mode: each canonical block's sums at its place in the batch's blocks (the
        others -0.0), summed over the workers, then added in block order."""
        rows, block_rows = self.ctx.rows(), self.ctx.block_rows
        every = np.full((-(-self.ctx.global_batch // block_rows),) + local.shape[::2], -0.0)  # (blocks, k, C)
        first = rows[0] // block_rows
        every[first:first + local.shape[1]] = local.transpose(1, 0, 2)
        if self.ctx.allreduce is not None:
            every = self.ctx.allreduce(every)
        total = every[0].copy()
        for block in every[1:]:
            total += block
        return list(total)

    def _per_block(self, values: np.ndarray) -> np.ndarray:
        """Per-channel float64 sums of ``values`` over this worker's rows: (channels,), or in
        deterministic mode one row per canonical block (blocks here, channels)."""
        if self.ctx.block_rows is None:
            return values.sum(self.axes, dtype=np.float64)
        blocks = row_blocks(len(values), self.ctx.block_rows)
        return np.stack([values[lo:hi].sum(self.axes, dtype=np.float64) for lo, hi in blocks])

    def _channels(self, values: np.ndarray) -> np.ndarray:
        """A per-channel vector shaped to broadcast against the input."""
        return values.reshape((1, -1) + (1,) * (len(self.axes) - 1))

    def forward(self, inputs: list[np.ndarray], train: bool) -> np.ndarray:
        x = inputs[0]
        scale, bias, running_mean, running_var = (p.data.reshape(-1) for p in self.params)
        if train:
            total, squares = self._global_sums(self._per_block(x),
                                               self._per_block(np.square(x, dtype=np.float64)))
            mean = total / self.count
            var = np.maximum(squares / self.count - mean * mean, 0.0)
            factor = self.conf.bm_conf.running_factor
            running_mean += factor * (mean - running_mean)
            running_var += factor * (var * self.count / (self.count - 1) - running_var)
        else:
            mean, var = running_mean.astype(np.float64), running_var.astype(np.float64)
        inv_std = 1.0 / np.sqrt(var + self.conf.bm_conf.epsilon)
        self.x_hat = (x - self._channels(mean).astype(x.dtype)) * self._channels(inv_std).astype(x.dtype)
        self.inv_std = inv_std
        return self.x_hat * self._channels(scale).astype(x.dtype) + self._channels(bias).astype(x.dtype)

    def backward(self, grad: np.ndarray, need: list[bool]) -> list[np.ndarray | None]:
        x_hat = self.x_hat
        d_bias = self._per_block(grad)
        d_scale = self._per_block(grad * x_hat)
        # this worker's rows' share of the param gradients: the param sync sums the shares
        for param, value in ((self.params[0], d_scale), (self.params[1], d_bias)):
            if self.ctx.block_rows is not None:  # deterministic: a term per block, added in block order
                param.add_rows(value.astype(param.data.dtype))
            else:
                param.add_grad(value.astype(param.data.dtype).reshape(param.data.shape))
        # summed even when no input gradient is needed: every worker of the group calls the sum
        total_bias, total_scale = self._global_sums(d_bias, d_scale)
        if not need[0]:
            return [None]
        scale = self.params[0].data.reshape(-1).astype(np.float64)
        coef = self._channels(scale * self.inv_std / self.count).astype(grad.dtype)
        dx = coef * (self.count * grad - self._channels(total_bias).astype(grad.dtype)
                     - x_hat * self._channels(total_scale).astype(grad.dtype))
        return [dx]
