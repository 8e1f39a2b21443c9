"""Convolution, pooling and local response normalisation on (batch, channels, height, width).

Convolution is im2col (one block copy per kernel offset) and one GEMM over the
whole batch; its backward scatters column gradients back with a loop over the
kernel offsets only.  Pooling loops over kernel offsets too, each step
vectorised over batch, channels and positions.  Output sizes use SINGA's floor
rule ``(H + 2·pad - kernel) // stride + 1``.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from singa_mpi.layers.base import LAYERS, ONE_TO_ALL, Layer, LayerConfigError, Shape


def _pair(conf, name: str, default: int) -> tuple[int, int]:
    """SINGA: ``kernel``/``pad``/``stride`` when set override the ``_y``/``_x`` pair."""
    if conf.HasField(name):
        value = getattr(conf, name)
        return value, value
    y, x = f"{name}_y", f"{name}_x"
    return (getattr(conf, y) if conf.HasField(y) else default, getattr(conf, x) if conf.HasField(x) else default)


def _out_size(size: int, kernel: int, pad: int, stride: int) -> int:
    return (size + 2 * pad - kernel) // stride + 1


def _check_geometry(prefix: str, in_shape: Shape, kernel, pad, stride) -> tuple[int, int]:
    if len(in_shape) != 3:
        raise LayerConfigError("srclayers", f"output shape {tuple(in_shape)}",
                               "a (channels, height, width) source for this layer")
    for name, (vy, vx), low in (("kernel", kernel, 1), ("stride", stride, 1), ("pad", pad, 0)):
        if vy < low or vx < low:
            raise LayerConfigError(f"{prefix}.{name}", vy if vy < low else vx, f"an integer >= {low}")
    _, h, w = in_shape
    if kernel[0] > h + 2 * pad[0] or kernel[1] > w + 2 * pad[1]:
        raise LayerConfigError(f"{prefix}.kernel", f"{kernel[0]}x{kernel[1]}",
                               f"a kernel no larger than the padded input {h + 2 * pad[0]}x{w + 2 * pad[1]}")
    return _out_size(h, kernel[0], pad[0], stride[0]), _out_size(w, kernel[1], pad[1], stride[1])


def _pad(x: np.ndarray, pad: tuple[int, int], value: float = 0.0) -> np.ndarray:
    if pad == (0, 0):
        return x
    return np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])), constant_values=value)


def _offset_slices(i: int, j: int, stride, out_hw) -> tuple[slice, slice]:
    """Positions in the padded input that kernel offset (i, j) touches, over all outputs."""
    return (slice(i, i + stride[0] * (out_hw[0] - 1) + 1, stride[0]),
            slice(j, j + stride[1] * (out_hw[1] - 1) + 1, stride[1]))


@LAYERS.register("kConvolution", "kCConvolution", "kCudnnConv")
class Convolution(Layer):
    """2-D convolution; weight (F, C·kh·kw) as in SINGA, bias (F,).

    Split on features, a sub-layer computes filters ``ctx.feature_slice``.
    """

    connection = ONE_TO_ALL

    def setup(self, src_shapes: Sequence[Shape]) -> Shape:
        conf = self.conf.convolution_conf
        if conf.num_filters <= 0:
            raise LayerConfigError("convolution_conf.num_filters",
                                   conf.num_filters if conf.HasField("num_filters") else "missing",
                                   "a positive number of filters")
        self.kernel, self.pad, self.stride = _pair(conf, "kernel", 3), _pair(conf, "pad", 0), _pair(conf, "stride", 1)
        self.out_hw = _check_geometry("convolution_conf", src_shapes[0], self.kernel, self.pad, self.stride)
        channels = src_shapes[0][0]
        self.declare_param(0, "weight", (conf.num_filters, channels * self.kernel[0] * self.kernel[1]), 0)
        self.bias = conf.bias_term
        if self.bias:
            self.declare_param(1, "bias", (conf.num_filters,), 0)
        return (conf.num_filters,) + self.out_hw

    def forward(self, inputs, train):
        x = inputs[0]  # (B, C, H, W)
        self.in_shape = x.shape
        batch, channels = x.shape[:2]
        (kh, kw), (ho, wo) = self.kernel, self.out_hw
        # im2col in the layout (C, kh, kw, B, Ho, Wo): each kernel offset is one block copy,
        # the GEMM output is (F, B·Ho·Wo) and the backward's column gradient comes out in
        # the same layout, so col2im adds contiguous blocks
        xt = _pad(x, self.pad).transpose(1, 0, 2, 3)  # (C, B, Hp, Wp) view
        cols = np.empty((channels, kh, kw, batch, ho, wo), x.dtype)
        for i in range(kh):
            for j in range(kw):
                rows, columns = _offset_slices(i, j, self.stride, self.out_hw)
                cols[:, i, j] = xt[:, :, rows, columns]
        self.cols = cols.reshape(channels * kh * kw, batch * ho * wo)
        y = self.params[0].data @ self.cols  # (F, B·Ho·Wo)
        if self.bias:
            y += self.params[1].data[:, None]
        return np.ascontiguousarray(y.reshape(-1, batch, ho, wo).transpose(1, 0, 2, 3))

    def backward(self, grad, need):
        filters = grad.shape[1]
        g = np.ascontiguousarray(grad.transpose(1, 0, 2, 3)).reshape(filters, -1)  # (F, B·Ho·Wo)
        w = self.params[0]
        w.add_grad(g, self.cols.T)
        if self.bias:
            self.params[1].add_grad(g.sum(axis=1))
        if not need[0]:
            return [None]
        batch, channels, h, wd = self.in_shape
        (kh, kw), (ho, wo) = self.kernel, self.out_hw
        dcols = (w.data.T @ g).reshape(channels, kh, kw, batch, ho, wo)
        dxt = np.zeros((channels, batch, h + 2 * self.pad[0], wd + 2 * self.pad[1]), grad.dtype)
        for i in range(kh):
            for j in range(kw):
                rows, columns = _offset_slices(i, j, self.stride, self.out_hw)
                dxt[:, :, rows, columns] += dcols[:, i, j]
        dxt = dxt[:, :, self.pad[0]:self.pad[0] + h, self.pad[1]:self.pad[1] + wd]
        return [np.ascontiguousarray(dxt.transpose(1, 0, 2, 3))]


@LAYERS.register("kPooling", "kCPooling", "kCudnnPool")
class Pooling(Layer):
    """MAX or AVG pooling per channel (so a channel slice pools unchanged).

    AVG divides by the full kernel area, padding included (SINGA/Caffe).  MAX
    sends the gradient to the first maximum of each window.
    """

    def setup(self, src_shapes):
        conf = self.conf.pooling_conf
        self.kernel, self.pad, self.stride = _pair(conf, "kernel", 3), _pair(conf, "pad", 0), _pair(conf, "stride", 2)
        self.out_hw = _check_geometry("pooling_conf", src_shapes[0], self.kernel, self.pad, self.stride)
        if self.pad[0] >= self.kernel[0] or self.pad[1] >= self.kernel[1]:
            # a window lying wholly in the padding would pool nothing (-inf for MAX); Caffe refuses it too
            raise LayerConfigError("pooling_conf.pad", f"{self.pad[0]}x{self.pad[1]}",
                                   f"a pad smaller than the kernel {self.kernel[0]}x{self.kernel[1]}")
        self.max = conf.pool == conf.MAX
        return (src_shapes[0][0],) + self.out_hw

    def forward(self, inputs, train):
        x = inputs[0]
        self.in_shape = x.shape
        xp = _pad(x, self.pad, -np.inf if self.max else 0.0)
        kh, kw = self.kernel
        # one (kh·kw, B, C, Ho, Wo) copy, then contiguous reductions over the offsets
        stack = np.empty((kh * kw, x.shape[0], x.shape[1], *self.out_hw), x.dtype)
        for i in range(kh):
            for j in range(kw):
                rows, cols = _offset_slices(i, j, self.stride, self.out_hw)
                stack[i * kw + j] = xp[:, :, rows, cols]
        if self.max:
            self.stack, self.out = stack, stack.max(axis=0)  # backward finds the argmax again
            return self.out
        return stack.sum(axis=0) * x.dtype.type(1.0 / (kh * kw))

    def backward(self, grad, need):
        if not need[0]:
            return [None]
        batch, channels, h, w = self.in_shape
        kh, kw = self.kernel
        dxp = np.zeros((batch, channels, h + 2 * self.pad[0], w + 2 * self.pad[1]), grad.dtype)
        share = grad * grad.dtype.type(1.0 / (kh * kw)) if not self.max else None
        taken = np.zeros(grad.shape, bool) if self.max else None
        for i in range(kh):
            for j in range(kw):
                rows, cols = _offset_slices(i, j, self.stride, self.out_hw)
                if self.max:  # the first offset holding the maximum gets the gradient
                    first = (self.stack[i * kw + j] == self.out) & ~taken
                    taken |= first
                    dxp[:, :, rows, cols] += grad * first
                else:
                    dxp[:, :, rows, cols] += share
        return [dxp[:, :, self.pad[0]:self.pad[0] + h, self.pad[1]:self.pad[1] + w]]


@LAYERS.register("kLRN", "kCudnnLRN")
class LRN(Layer):
    """Local response normalisation across channels (SINGA 0.3):

        norm = knorm + alpha / local_size · Σ_{c' within local_size/2 of c} x[c']²,
        y = x · norm^(-beta).

    A channel window crosses any split of the channels, so this layer refuses
    partition_dim 1 (the planner says so).
    """

    feature_partitionable = False

    def setup(self, src_shapes):
        conf = self.conf.lrn_conf
        if conf.local_size <= 0 or conf.local_size % 2 == 0:
            raise LayerConfigError("lrn_conf.local_size", conf.local_size, "a positive odd window size")
        if len(src_shapes[0]) != 3:
            raise LayerConfigError("srclayers", f"output shape {tuple(src_shapes[0])}",
                                   "a (channels, height, width) source for LRN")
        return tuple(src_shapes[0])

    def _window_sum(self, a: np.ndarray) -> np.ndarray:
        """Σ over the channel window of size local_size centred on each channel."""
        size = self.conf.lrn_conf.local_size
        padded = np.pad(a, ((0, 0), (size // 2, size // 2), (0, 0), (0, 0)))
        channels = a.shape[1]
        total = padded[:, :channels].copy()
        for k in range(1, size):  # shifted sums: exact, unlike differences of a cumulative sum
            total += padded[:, k:k + channels]
        return total

    def forward(self, inputs, train):
        conf = self.conf.lrn_conf
        x = inputs[0]
        dt = x.dtype.type
        self.x = x
        self.norm = dt(conf.knorm) + dt(conf.alpha / conf.local_size) * self._window_sum(x * x)
        self.scale = self.norm ** dt(-conf.beta)
        return x * self.scale

    def backward(self, grad, need):
        if not need[0]:
            return [None]
        conf = self.conf.lrn_conf
        dt = grad.dtype.type
        inner = grad * self.x * self.scale / self.norm
        dx = grad * self.scale - dt(2 * conf.alpha * conf.beta / conf.local_size) * self.x * self._window_sum(inner)
        return [dx]
