"""Convolution, pooling and local response normalisation on (batch, channels, height, width).

Convolution is im2col (one strided copy of the padded, channels-first input) and one GEMM over
the whole batch; the columns stay for the weight gradient when they fit in cache, else they are
made again, a chunk of samples at a time.  Stride-1 convolutions with enough channels go through
the Fourier transform instead (:mod:`.fft_conv`), where that is less work.  The im2col route's input
gradient is the output gradient convolved with the flipped kernel (stride 1), im2col and GEMM a few
samples at a time so that a chunk's columns are still in cache when the GEMM reads them; other
strides scatter column gradients back with a loop over the kernel offsets.  Average pooling loops
over kernel offsets on a pixels-first copy (each pass one long loop over batch and channels); MAX
pooling is separable (rows, then columns) and its gradient one scatter-add to the recorded maxima.
Output sizes use SINGA's floor rule ``(H + 2·pad - kernel) // stride + 1``.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from singa_mpi.layers import fft_conv
from singa_mpi.layers.planes import move_planes
from singa_mpi.layers.base import LAYERS, ONE_TO_ALL, Layer, LayerConfigError, Shape, row_blocks


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


# Bytes of im2col columns per GEMM: small enough to stay in L2/L3 between the copy and the product,
# large enough that the GEMM runs at full speed (measured on conf/cifar10_convnet.conf's layers)
CHUNK_BYTES = 4 << 20


class _Scratch:
    """Work arrays a layer keeps from step to step, one per name (replaced when its shape changes).

    Allocating the 30-70 MB column matrices anew each step costs page faults (glibc hands blocks
    over 32 MiB back to the OS when they are freed).  A zero-filled array keeps its zeros where
    nothing writes (the padding borders), so those are cleared once.
    """

    def __init__(self):
        self.arrays: dict[str, np.ndarray] = {}

    def get(self, name: str, shape: tuple[int, ...], dtype, zeros: bool = False) -> np.ndarray:
        array = self.arrays.get(name)
        if array is None or array.shape != tuple(shape) or array.dtype != dtype:
            array = self.arrays[name] = (np.zeros if zeros else np.empty)(shape, dtype)
        return array


def _padded_t(scratch: _Scratch, name: str, x: np.ndarray, pad: tuple[int, int]) -> np.ndarray:
    """x (B, C, H, W) zero-padded and channels first: (C, B, H + 2·pad_y, W + 2·pad_x); a negative pad crops."""
    batch, channels, h, w = x.shape
    out = scratch.get(name, (channels, batch, h + 2 * pad[0], w + 2 * pad[1]), x.dtype, zeros=True)
    (cy, cx), (oy, ox) = (max(0, -pad[0]), max(0, -pad[1])), (max(0, pad[0]), max(0, pad[1]))
    np.copyto(out[:, :, oy:oy + h - 2 * cy, ox:ox + w - 2 * cx], x[:, :, cy:h - cy, cx:w - cx].transpose(1, 0, 2, 3))
    return out


def _windows(xp: np.ndarray, kernel, stride, out_hw) -> np.ndarray:
    """[c, i, j, b, y, x] = xp[c, b, y·stride_y + i, x·stride_x + j] of the padded (C, B, Hp, Wp) input:
    im2col's columns are one copy of this view."""
    channels, batch = xp.shape[:2]
    sc, sb, sh, sw = xp.strides
    return np.lib.stride_tricks.as_strided(xp, (channels, *kernel, batch, *out_hw),
                                           (sc, sh, sw, sb, sh * stride[0], sw * stride[1]), writeable=False)


def _column_chunks(xp: np.ndarray, kernel, stride, out_hw, scratch: _Scratch, name: str,
                   keep: np.ndarray | None = None):
    """(first sample, samples, columns (C·kh·kw, samples·Ho·Wo)) of im2col(xp), chunk by chunk.

    With ``keep`` (C, kh, kw, B, Ho, Wo), the whole batch at once into it (it then holds the columns
    for the weight gradient); without, a few samples at a time through a scratch array (``name``)
    small enough to stay in cache while the GEMM reads it."""
    windows = _windows(xp, kernel, stride, out_hw)
    batch, depth, positions = xp.shape[1], xp.shape[0] * kernel[0] * kernel[1], out_hw[0] * out_hw[1]
    step = batch if keep is not None else _chunk_samples(depth, positions, xp.itemsize, batch)
    chunk = keep.reshape(-1) if keep is not None else scratch.get(f"{name} columns", (depth * step * positions,),
                                                                  xp.dtype)
    for lo in range(0, batch, step):
        n = min(step, batch - lo)
        cols = chunk[:depth * n * positions].reshape(xp.shape[0], *kernel, n, *out_hw)
        np.copyto(cols, windows[:, :, :, lo:lo + n])
        yield lo, n, cols.reshape(depth, n * positions)


def _chunk_samples(depth: int, positions: int, itemsize: int, batch: int) -> int:
    return max(1, min(batch, CHUNK_BYTES // (depth * positions * itemsize)))


def _convolve(xp: np.ndarray, weight: np.ndarray, kernel, stride, out: np.ndarray, scratch: _Scratch, name: str,
              keep: np.ndarray | None = None, bias: np.ndarray | None = None) -> None:
    """out (B, F, Ho, Wo) = weight (F, C·kh·kw) · im2col(xp) (+ bias), xp the padded (C, B, Hp, Wp) input,
    the columns as :func:`_column_chunks` makes them.  The (F, b, Ho·Wo) products go to the samples'
    rows of ``out`` with the bias added on the way."""
    batch, filters, ho, wo = out.shape
    positions = ho * wo
    step = batch if keep is not None else _chunk_samples(len(weight.T), positions, xp.itemsize, batch)
    product = scratch.get(f"{name} product", (filters * step * positions,), xp.dtype)
    rows = out.reshape(batch, filters, positions)
    for lo, n, cols in _column_chunks(xp, kernel, stride, (ho, wo), scratch, name, keep):
        y = product[:filters * n * positions].reshape(filters, n * positions)
        np.matmul(weight, cols, out=y)
        y = y.reshape(filters, n, positions).transpose(1, 0, 2)
        if bias is None:
            np.copyto(rows[lo:lo + n], y)
        else:
            np.add(y, bias[:, None], out=rows[lo:lo + n])


def _weight_grad(xp: np.ndarray, grad: np.ndarray, kernel, stride, scratch: _Scratch) -> np.ndarray:
    """Σ_b grad[b] (F, Ho·Wo) · im2col(xp)[b]ᵀ, the columns made again a chunk at a time: one GEMM per
    sample straight from the output gradient (B, F, Ho, Wo), no transposed copy of it."""
    batch, filters, ho, wo = grad.shape
    depth, positions = xp.shape[0] * kernel[0] * kernel[1], ho * wo
    rows = grad.reshape(batch, filters, positions)
    dw = np.zeros((filters, depth), grad.dtype)
    for lo, n, cols in _column_chunks(xp, kernel, stride, (ho, wo), scratch, "weight grad"):
        per_sample = np.matmul(rows[lo:lo + n], cols.reshape(depth, n, positions).transpose(1, 2, 0))
        dw += per_sample.sum(axis=0)
    return dw


@LAYERS.register("kConvolution", "kCConvolution", "kCudnnConv")
class Convolution(Layer):
    """2-D convolution; weight (F, C·kh·kw) as in SINGA, bias (F,).

    Split on features, a sub-layer computes filters ``ctx.feature_slice``.
    """

    connection = ONE_TO_ALL
    # deterministic mode: products per canonical block of samples, gradients as one term per block
    deterministic = True
    deterministic_terms = "blocks"

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
        self.scratch = _Scratch()
        self.in_hw = tuple(src_shapes[0][1:])
        self.x, self.spectra = None, []  # deterministic mode: the input, or each block's spectra
        self.fourier: fft_conv.FourierConvolution | None = None
        return (conf.num_filters,) + self.out_hw

    @classmethod
    def work_bytes(cls, conf, rows, in_shape, out_shape, backward=True, input_grad=True):
        """im2col: held from step to step as scratch, the padded input, the columns and GEMM products of
        the whole batch where they fit a chunk (else a chunk's, for forward and the weight gradient) and,
        for an input gradient of stride 1, the padded output gradient with a chunk of its columns and
        products; held for the step, the output gradient in the columns' order where the kept columns or
        another stride use it; passing, for an input gradient of another stride, the column gradients and the
        padded input gradient.  The Fourier route (chosen as the
        layer chooses it): its buffers and spectra (:func:`.fft_conv.work_bytes`)."""
        c = conf.convolution_conf
        kernel, pad, stride = _pair(c, "kernel", 3), _pair(c, "pad", 0), _pair(c, "stride", 1)
        channels, hw, filters, out_hw = in_shape[0], tuple(in_shape[1:]), out_shape[0], tuple(out_shape[1:])
        input_grad = backward and input_grad
        if stride == (1, 1) and fft_conv.cheaper(rows, channels, filters, kernel, hw, pad, input_grad):
            return fft_conv.work_bytes(rows, channels, filters, kernel, hw, pad, out_hw, backward, input_grad)
        taps, positions, in_positions = kernel[0] * kernel[1], out_hw[0] * out_hw[1], hw[0] * hw[1]
        padded = channels * rows * (hw[0] + 2 * pad[0]) * (hw[1] + 2 * pad[1])
        step = _chunk_samples(channels * taps, positions, 4, rows)  # samples per chunk (all: kept whole)
        chunks = 2 if backward and step < rows else 1  # forward's, and the weight gradient's made again
        held = padded + (channels * taps + filters) * step * positions * chunks
        if backward and (step == rows or (input_grad and stride != (1, 1))):
            held += filters * rows * positions  # the output gradient in the columns' order, kept by the
            # weight's pending product until the step's gradients are formed
        passing = 0
        if input_grad and stride == (1, 1):
            back = _chunk_samples(filters * taps, in_positions, 4, rows)
            held += filters * rows * (out_hw[0] + 2 * (kernel[0] - 1 - pad[0])) * (out_hw[1] + 2 * (kernel[1] - 1 - pad[1]))
            held += filters * taps * back * in_positions + channels * back * in_positions
        elif input_grad:  # the column gradients and the padded input gradient they are added into
            passing += channels * taps * rows * positions + padded
        return 4 * held, 4 * passing

    def _use_fourier(self, batch: int, channels: int, filters: int) -> bool:
        """The Fourier route where it is less work: a function of this part's shapes and whether its
        input gradient is wanted (fixed by the net before the first step), so the same at every step,
        run after run and after a resume (ranks with other shapes may choose otherwise: both routes
        agree to rounding)."""
        wanted = self.input_grads[0] if self.input_grads else True  # the net says; alone: assume so
        return self.stride == (1, 1) and fft_conv.cheaper(batch, channels, filters, self.kernel, self.in_hw,
                                                          self.pad, wanted)

    def forward(self, inputs, train):
        x = inputs[0]  # (B, C, H, W)
        self.in_shape = x.shape
        batch, channels = x.shape[:2]
        (kh, kw), (ho, wo) = self.kernel, self.out_hw
        w = self.params[0].data
        if self.ctx.block_rows is not None:
            return self._forward_blocks(x, w)
        if self._use_fourier(batch, channels, len(w)):
            if self.fourier is None:
                self.fourier = fft_conv.FourierConvolution(self.kernel, self.pad, self.in_hw, self.out_hw)
            self.via_fourier = True
            return self.fourier.forward(x, w, self.params[1].data if self.bias else None)
        self.via_fourier = False
        # The columns of the whole batch, (C, kh, kw, B, Ho, Wo), stay for the weight gradient when
        # they fit in a chunk.  Larger ones would go out to memory and be read back twice (forward and
        # weight-gradient GEMMs): made again a chunk at a time in cache costs less (CIFAR-10's conv1,
        # 30 MB of columns, one core: forward 10.2 -> 7.4 ms; the weight gradient with its transposed
        # output gradient 8.5 ms, from the columns made again and the gradient as it is 7.7 ms).
        depth = channels * kh * kw
        keep = _chunk_samples(depth, ho * wo, x.itemsize, batch) == batch
        self.cols = self.scratch.get("cols", (channels, kh, kw, batch, ho, wo), x.dtype) if keep else None
        self.xp = _padded_t(self.scratch, "x", x, self.pad)  # the scratch stays until the next forward
        y = np.empty((batch, len(w), ho, wo), x.dtype)
        _convolve(self.xp, w, self.kernel, self.stride, y, self.scratch, "forward", keep=self.cols,
                  bias=self.params[1].data if self.bias else None)
        return y

    def release(self) -> None:
        super().release()
        self.x, self.spectra = None, []
        if self.fourier is not None:
            self.fourier.release()

    def backward(self, grad, need):
        if self.ctx.block_rows is not None:
            return self._backward_blocks(grad, need)
        if self.via_fourier:
            dw, dx = self.fourier.backward(grad, need[0])
            self.params[0].add_grad(dw)
            if self.bias:
                self.params[1].add_grad(grad.sum(axis=(0, 2, 3)))
            return [dx]
        batch, filters = grad.shape[:2]
        w = self.params[0]
        g = None  # (F, B·Ho·Wo), the columns' order: for the kept columns and strided input gradients
        if self.cols is not None or (need[0] and self.stride != (1, 1)):
            g = np.empty((filters, batch) + grad.shape[2:], grad.dtype)
            np.copyto(g, grad.transpose(1, 0, 2, 3))
            g = g.reshape(filters, -1)
        if self.cols is not None:
            w.add_grad(g, self.cols.reshape(-1, g.shape[1]).T)
        else:
            w.add_grad(_weight_grad(self.xp, grad, self.kernel, self.stride, self.scratch))
        if self.bias:
            self.params[1].add_grad(g.sum(axis=1) if g is not None else grad.sum(axis=(0, 2, 3)))
        if not need[0]:
            return [None]
        return [self._input_grad(grad, g)]

    def _input_grad(self, grad: np.ndarray, g: np.ndarray | None) -> np.ndarray:
        """dL/dx (B, C, H, W) of the output gradient ``grad`` (B, F, Ho, Wo); ``g``: the same as (F, B·Ho·Wo)
        when made already (other strides need it)."""
        w = self.params[0]
        batch, filters = grad.shape[:2]
        channels, h, wd = self.in_shape[1:]
        (kh, kw), (ph, pw) = self.kernel, self.pad
        if self.stride == (1, 1):
            # dx is the output gradient convolved with the flipped kernel, computed as forward is
            flipped = w.data.reshape(filters, channels, kh, kw)[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)
            dx = np.empty((batch,) + tuple(self.in_shape[1:]), grad.dtype)
            _convolve(_padded_t(self.scratch, "grad", grad, (kh - 1 - ph, kw - 1 - pw)),
                      flipped.reshape(channels, -1), self.kernel, (1, 1), dx, self.scratch, "backward")
            return dx
        if g is None:
            g = np.ascontiguousarray(grad.transpose(1, 0, 2, 3)).reshape(filters, -1)
        # other strides: scatter the column gradients back, one block per kernel offset
        ho, wo = self.out_hw
        dcols = (w.data.T @ g).reshape(channels, kh, kw, batch, ho, wo)
        dxt = np.zeros((channels, batch, h + 2 * ph, wd + 2 * pw), grad.dtype)
        for i in range(kh):
            for j in range(kw):
                rows, columns = _offset_slices(i, j, self.stride, self.out_hw)
                dxt[:, :, rows, columns] += dcols[:, i, j]
        dxt = dxt[:, :, ph:ph + h, pw:pw + wd]
        return np.ascontiguousarray(dxt.transpose(1, 0, 2, 3))

    # -- deterministic mode: one canonical block of samples at a time -------------------------------
    def _forward_blocks(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        """One canonical block of samples at a time, by im2col + GEMM or through the Fourier transform,
        whichever :func:`fft_conv.cheaper` picks for a full block (the same choice for every block
        and on every worker: a function of the job's shapes alone).  Each call has the block's shapes
        on any worker, so it gives the same bits there.  Kept for backward: the input (im2col makes
        a block's columns again) or each block's spectra."""
        self.x, self.spectra = x, []
        y = np.empty((len(x), len(w)) + tuple(self.out_hw), x.dtype)
        bias = self.params[1].data if self.bias else None
        self.via_fourier = self._use_fourier(self.ctx.block_rows, x.shape[1], len(w))
        if self.via_fourier and self.fourier is None:
            self.fourier = fft_conv.FourierConvolution(self.kernel, self.pad, self.in_hw, self.out_hw)
        for lo, hi in row_blocks(len(x), self.ctx.block_rows):
            if self.via_fourier:
                y[lo:hi] = self.fourier.forward(x[lo:hi], w, bias)
                self.spectra.append((self.fourier.x_hat, self.fourier.w_hat))
                continue
            xp = _padded_t(self.scratch, "x", x[lo:hi], self.pad)
            _convolve(xp, w, self.kernel, self.stride, y[lo:hi], self.scratch, "forward", bias=bias)
        return y

    def _backward_blocks(self, grad: np.ndarray, need: list[bool]) -> list[np.ndarray | None]:
        """Per canonical block: its weight and bias gradients, kept as one term per block
        (``Param.add_rows``: summed in block order once every worker's blocks are in), and its rows of
        the input gradient."""
        blocks = row_blocks(len(grad), self.ctx.block_rows)
        w = self.params[0]
        weights = np.empty((len(blocks), w.data.size), grad.dtype)
        biases = np.empty((len(blocks), len(w.data)), grad.dtype)
        dx = np.empty(self.in_shape, grad.dtype) if need[0] else None
        for k, (lo, hi) in enumerate(blocks):
            if self.via_fourier:
                self.fourier.x_hat, self.fourier.w_hat = self.spectra[k]
                dw, dx_block = self.fourier.backward(grad[lo:hi], need[0])
                weights[k] = dw.reshape(-1)
                if dx is not None:
                    dx[lo:hi] = dx_block
            else:
                xp = _padded_t(self.scratch, "x", self.x[lo:hi], self.pad)
                weights[k] = _weight_grad(xp, grad[lo:hi], self.kernel, self.stride, self.scratch).reshape(-1)
                if dx is not None:
                    dx[lo:hi] = self._input_grad(grad[lo:hi], None)
            biases[k] = grad[lo:hi].sum(axis=(0, 2, 3))
        w.add_rows(weights)
        if self.bias:
            self.params[1].add_rows(biases)
        return [dx]


def _pixels_first(x: np.ndarray, pad: tuple[int, int], value: float) -> np.ndarray:
    """x (B, C, H, W) as (H + 2·pad_y, W + 2·pad_x, B·C), the border filled with ``value``.

    Average pooling's kh·kw passes then run along the contiguous B·C axis: on (B, C, H, W) a
    window's strided view leaves numpy inner loops one output row long (3-15 pixels), at several
    times the cost per element (CIFAR-10 convnet's pool2 and pool3, forward and backward: 5.0 ->
    1.8 ms with the transposes)."""
    batch, channels, h, w = x.shape
    (py, px), planes = pad, batch * channels
    out = np.empty((h + 2 * py, w + 2 * px, planes), x.dtype)
    if pad != (0, 0):
        out[:py], out[py + h:], out[:, :px], out[:, px + w:] = value, value, value, value
    move_planes(out[py:py + h, px:px + w], x.reshape(planes, h, w), planes_last=True)
    return out


def _batch_first(x: np.ndarray, batch: int) -> np.ndarray:
    """(H, W, B·C) back to (B, C, H, W), contiguous."""
    h, w, planes = x.shape
    out = np.empty((batch, planes // batch, h, w), x.dtype)
    move_planes(out.reshape(planes, h, w), x, planes_last=False)
    return out


@LAYERS.register("kPooling", "kCPooling", "kCudnnPool")
class Pooling(Layer):
    """MAX or AVG pooling per channel (so a channel slice pools unchanged).

    AVG divides by the full kernel area, padding included (SINGA/Caffe), on a
    pixels-first copy of the input (:func:`_pixels_first`).  MAX sends the
    gradient to the first maximum of each window.
    """

    per_batch = ("chosen_at",)
    deterministic = True  # sample by sample: any split of the batch gives the same bits

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

    @classmethod
    def work_bytes(cls, conf, rows, in_shape, out_shape, backward=True, input_grad=True):
        """MAX: held, where each window's maximum lies and each window's corner (int32 per output);
        passing, the padded input (where padded) and the row maxima with their columns.  AVG: passing, the input and
        the output pixels first (and the gradient's, as large)."""
        c = conf.pooling_conf
        pad = _pair(c, "pad", 0)
        planes = rows * out_shape[0]  # a channel split pools its own channels
        padded = planes * (in_shape[1] + 2 * pad[0]) * (in_shape[2] + 2 * pad[1])
        out = planes * out_shape[1] * out_shape[2]
        if c.pool == c.MAX:  # the row maxima (float32) with their columns, comparisons and updates (bytes)
            across = planes * (in_shape[1] + 2 * pad[0]) * out_shape[2]
            # held too: the input gradient's padding (it is a view of the padded array)
            border = padded - planes * in_shape[1] * in_shape[2]
            return 4 * (2 * out + border), (4 * padded if any(pad) else 0) + 7 * across + 4 * out
        return 0, 4 * (padded + out)

    def _offsets(self):
        """(rows, columns) each kernel offset reads, offsets in row-major order."""
        return [_offset_slices(i, j, self.stride, self.out_hw) for i in range(self.kernel[0])
                for j in range(self.kernel[1])]

    def forward(self, inputs, train):
        x = inputs[0]
        self.in_shape = x.shape
        if self.max:  # kh + kw passes over (B, C, H, W): cheaper than transposing it
            return self._max_separably(_pad(x, self.pad, -np.inf))
        xt = _pixels_first(x, self.pad, 0.0)
        views = [xt[rows, cols] for rows, cols in self._offsets()]
        out = views[0].copy()
        for view in views[1:]:  # summed in offset order
            out += view
        out *= x.dtype.type(1.0 / len(views))
        return _batch_first(out, len(x))

    def _max_separably(self, xp: np.ndarray) -> np.ndarray:
        """MAX pooling as a maximum along each row's windows, then down the columns of those maxima:
        kh + kw passes instead of kh·kw.  ``chosen_at`` (for backward) is where in the flattened padded
        input each window's first maximum in row-major offset order lies: the first row holding the
        window's maximum and, in it, the first column (each pass keeps the earlier offset on a tie)."""
        (kh, kw), (sy, sx), (ho, wo) = self.kernel, self.stride, self.out_hw
        index = np.uint8 if kh * kw <= 256 else np.int32
        rows = xp.shape[2]
        # along rows: the maximum of each window's kw columns, for every padded row
        across = np.empty(xp.shape[:2] + (rows, wo), xp.dtype)
        column = np.zeros(across.shape, index)
        self._running_max([xp[:, :, :, j:j + sx * (wo - 1) + 1:sx] for j in range(kw)], across, column, index)
        # down the columns: the maximum of each window's kh row maxima.  ``offset`` follows the row
        # chosen: i·cols + j, where in the window (relative to its corner) its maximum lies
        cols = xp.shape[3]
        bands = [across[:, :, i:i + sy * (ho - 1) + 1:sy] for i in range(kh)]
        columns = [column[:, :, i:i + sy * (ho - 1) + 1:sy] for i in range(kh)]
        # the narrowest integers that hold the offsets and the positions: these passes are memory-bound
        near = np.int16 if kh * cols < 2 ** 15 else np.int32
        out = bands[0].copy()
        offset = columns[0].astype(near)
        greater, candidate = np.empty(out.shape, bool), np.empty(out.shape, near)
        for i in range(1, kh):
            np.greater(bands[i], out, out=greater)
            np.maximum(out, bands[i], out=out)
            np.add(columns[i], near(i * cols), out=candidate)
            candidate -= offset  # offset += greater·(candidate - offset): branch-free select
            candidate *= greater
            offset += candidate
        corners = self._corners(xp.shape)
        self.chosen_at = np.add(corners, offset, dtype=corners.dtype)
        return out

    def _corners(self, padded_shape) -> np.ndarray:
        """Each window's top-left corner in the flattened padded input (kept per shape)."""
        planes, (rows, cols), (sy, sx), (ho, wo) = padded_shape[0] * padded_shape[1], padded_shape[2:], \
            self.stride, self.out_hw
        shape = tuple(padded_shape[:2]) + (ho, wo)
        corners = getattr(self, "_corner_cache", None)
        if corners is None or corners.shape != shape:
            wide = np.int32 if planes * rows * cols < 2 ** 31 else np.int64
            corners = self._corner_cache = (np.arange(planes, dtype=wide).reshape(-1, 1, 1) * (rows * cols)
                                            + np.arange(ho, dtype=wide).reshape(-1, 1) * (sy * cols)
                                            + np.arange(wo, dtype=wide) * sx).reshape(shape)
        return corners

    @staticmethod
    def _running_max(views, out: np.ndarray, which: np.ndarray, index) -> None:
        """out = the maximum of ``views``, which = the position of the first view holding it.
        Branch-free: which = max(which, k·greater), as which < k (masked writes are slow)."""
        np.copyto(out, views[0])
        greater, update = np.empty(out.shape, bool), np.empty(out.shape, index)
        for k, view in enumerate(views[1:], 1):
            np.greater(view, out, out=greater)
            np.maximum(out, view, out=out)
            np.multiply(greater, index(k), out=update)
            np.maximum(which, update, out=which)

    def backward(self, grad, need):
        if not need[0]:
            return [None]
        batch, channels, h, w = self.in_shape
        (ph, pw) = self.pad
        rows, cols = h + 2 * ph, w + 2 * pw
        if self.max:
            # each window's gradient to its first maximum: one unbuffered scatter-add, summing where
            # windows overlap in window order (numpy >= 1.25 runs it at memory speed)
            dxp = np.zeros((batch, channels, rows, cols), grad.dtype)
            np.add.at(dxp.reshape(-1), self.chosen_at.reshape(-1), grad.reshape(-1))
            return [dxp[:, :, ph:ph + h, pw:pw + w]]
        share = _pixels_first(grad, (0, 0), 0.0)
        share *= grad.dtype.type(1.0 / (self.kernel[0] * self.kernel[1]))
        dxt = np.zeros((rows, cols, batch * channels), grad.dtype)
        for r, c in self._offsets():  # summed in offset order
            dxt[r, c] += share
        return [_batch_first(dxt[ph:ph + h, pw:pw + w], batch)]


@LAYERS.register("kLRN", "kCudnnLRN")
class LRN(Layer):
    """Local response normalisation across channels (SINGA 0.3):

        norm = knorm + alpha / local_size · Σ_{c' within local_size/2 of c} x[c']²,
        y = x · norm^(-beta).

    A channel window crosses any split of the channels, so this layer refuses
    partition_dim 1 (the planner says so).
    """

    feature_partitionable = False
    per_batch = ("x", "norm", "scale")
    deterministic = True  # sample by sample: any split of the batch gives the same bits

    def setup(self, src_shapes):
        conf = self.conf.lrn_conf
        if conf.local_size <= 0 or conf.local_size % 2 == 0:
            raise LayerConfigError("lrn_conf.local_size", conf.local_size, "a positive odd window size")
        # knorm + alpha/local_size·Σx² is raised to -beta: a negative one is NaN in the first forward
        for field in ("knorm", "alpha"):
            if getattr(conf, field) < 0:
                raise LayerConfigError(f"lrn_conf.{field}", f"{getattr(conf, field):g}",
                                       "a value >= 0 (the norm knorm + alpha/local_size·Σx² is raised to -beta)")
        if len(src_shapes[0]) != 3:
            raise LayerConfigError("srclayers", f"output shape {tuple(src_shapes[0])}",
                                   "a (channels, height, width) source for LRN")
        return tuple(src_shapes[0])

    @classmethod
    def work_bytes(cls, conf, rows, in_shape, out_shape, backward=True, input_grad=True):
        """Held, the norm and its power (the scale); passing, two arrays as large (forward's squares and
        window sums, backward's products)."""
        size = 4 * rows * math.prod(out_shape)
        return 2 * size, 2 * size

    def _window_sum(self, a: np.ndarray) -> np.ndarray:
        """Σ over the channel window of size local_size centred on each channel."""
        half, channels = self.conf.lrn_conf.local_size // 2, a.shape[1]
        total = np.empty_like(a)
        # shifted sums in window order from the lowest channel, outside channels counting as zero:
        # exact, unlike differences of a cumulative sum
        total[:, :min(half, channels)] = 0
        if half < channels:
            total[:, half:] = a[:, :channels - half]
        for d in range(1 - half, half + 1):
            lo, hi = max(0, -d), min(channels, channels - d)
            if lo < hi:
                total[:, lo:hi] += a[:, lo + d:hi + d]
        return total

    def forward(self, inputs, train):
        conf = self.conf.lrn_conf
        x = inputs[0]
        dt = x.dtype.type
        self.x = x
        self.norm = self._window_sum(x * x)
        self.norm *= dt(conf.alpha / conf.local_size)
        self.norm += dt(conf.knorm)
        self.scale = self.norm ** dt(-conf.beta)
        return x * self.scale

    def backward(self, grad, need):
        if not need[0]:
            return [None]
        conf = self.conf.lrn_conf
        dt = grad.dtype.type
        inner = grad * self.x
        inner *= self.scale
        inner /= self.norm
        across = dt(2 * conf.alpha * conf.beta / conf.local_size) * self.x
        across *= self._window_sum(inner)
        dx = grad * self.scale
        dx -= across
        return [dx]
