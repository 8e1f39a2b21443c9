"""Stride-1 convolution through the Fourier transform: forward, input gradient and weight gradient.

A 5x5 kernel over 32 channels costs 800 multiply-adds per output in im2col + GEMM; in the frequency
domain it is one complex product per frequency, channel and filter, plus the transforms.  On the
CIFAR-10 convnet's second and third convolutions that is 2-5x less work (conv2: 20 ms forward with
im2col, 9 ms this way, on one core), and the spectrum kept for the weight gradient is 13x smaller
than im2col's columns.  The first convolution (3 channels, no input gradient) stays faster with
im2col: the choice is :func:`cheaper`'s, from the shapes and whether the input gradient is wanted
(``Layer.input_grads``, set by the net before the first step) alone, so it never changes mid-run.

The transforms are circular, of size ``N >= H + 2·pad`` per axis (the next size scipy transforms
fast), which is large enough that nothing wraps around for the outputs kept:

* forward (a cross-correlation): ``Y(k) = Σ_c conj(W_fc(k)) X_bc(k)``;
* input gradient (a convolution): ``DX_bc(k) = Σ_f W_fc(k) G_bf(k)``, of the padded input;
* weight gradient: ``DW_fc(k) = Σ_b conj(G_bf(k)) X_bc(k)``, kept at lags ``0..kernel-1``.

Each sum is one complex GEMM per frequency (the frequencies as the batch of ``np.matmul``).  Results
agree with im2col to float32 rounding (relative 1e-6 of the largest output).
"""
from __future__ import annotations

import math

import numpy as np
import scipy.fft

# Relative costs, in units of one float32 multiply-add inside sgemm, fitted (non-negative least squares
# of relative errors) to forward + backward times of 32 layer shapes on one core (batch 13-100, 3-64
# channels, 2-64 filters, 7-32 pixels, with and without the input gradient): with them the cheaper
# route was chosen in every case.  A transform costs per point and log2(points), and once per call.
COPIED_FLOAT = 30.4  # im2col's columns (a strided copy out of cache)
TRANSFORM_POINT_LOG = 15.0
TRANSFORM_CALL = 4350.0
COMPLEX_MAC = 6.3


def transform_size(padded: tuple[int, int]) -> tuple[int, int]:
    return tuple(scipy.fft.next_fast_len(n, real=True) for n in padded)


def cheaper(batch: int, channels: int, filters: int, kernel, in_hw, pad, need_input: bool = True) -> bool:
    """Whether a training step of this stride-1 convolution (forward, weight gradient and, with
    ``need_input``, the input gradient) costs less through the Fourier transform than im2col + GEMM."""
    padded = (in_hw[0] + 2 * pad[0], in_hw[1] + 2 * pad[1])
    out_hw = (padded[0] - kernel[0] + 1, padded[1] - kernel[1] + 1)
    taps, pixels = kernel[0] * kernel[1], out_hw[0] * out_hw[1]
    passes = 3 if need_input else 2  # GEMMs: forward, weight gradient, input gradient
    columns = batch * channels * taps * pixels + batch * filters * pixels \
        + (batch * filters * taps * in_hw[0] * in_hw[1] if need_input else 0)
    direct = passes * batch * filters * channels * taps * pixels + COPIED_FLOAT * columns
    nh, nw = transform_size(padded)
    bins = nh * (nw // 2 + 1)
    # x, weights and y forward; the gradient, the weight gradient and (need_input) dx backward
    transforms = 2 * batch * filters + 2 * filters * channels + batch * channels * (2 if need_input else 1)
    fourier = transforms * (TRANSFORM_CALL + TRANSFORM_POINT_LOG * nh * nw * math.log2(nh * nw)) \
        + COMPLEX_MAC * passes * batch * filters * channels * bins
    return fourier < direct


class FourierConvolution:
    """The spectra one layer keeps between its forward and backward."""

    def __init__(self, kernel, pad, in_hw, out_hw):
        self.kernel, self.pad, self.in_hw, self.out_hw = kernel, pad, in_hw, out_hw
        self.size = transform_size((in_hw[0] + 2 * pad[0], in_hw[1] + 2 * pad[1]))
        self.bins = self.size[0] * (self.size[1] // 2 + 1)
        self._buffers: dict[str, np.ndarray] = {}  # zero-bordered inputs of the transforms, by name

    def _spectrum(self, name: str, array: np.ndarray, at: tuple[int, int]) -> np.ndarray:
        """rfft2 of ``array`` (n, m, h, w) placed at offset ``at`` in zeros of the transform size, as
        (bins, m, n): the frequencies first, for the per-frequency products.  The arrays are laid out
        pixels first, (rows, cols, m, n), so that the transform's output is already in that order (and
        each 1-D transform runs over all images at once along the contiguous axis).  Pruned: the
        transforms along the rows run over the h rows that hold data only (the rest are zeros), the
        transforms down the columns over every row."""
        n, m, h, w = array.shape
        rows = self._zeros(f"{name} rows", (h, self.size[1], m, n), array.dtype)  # the border stays zero
        rows[:, at[1]:at[1] + w] = array.transpose(2, 3, 1, 0)
        half = scipy.fft.rfft(rows, axis=1)  # (h, N_w // 2 + 1, m, n)
        grid = self._zeros(f"{name} grid", (self.size[0],) + half.shape[1:], half.dtype)
        grid[at[0]:at[0] + h] = half  # the other rows stay zero: the transform below returns a new array
        return scipy.fft.fft(grid, axis=0).reshape(self.bins, m, n)

    def _zeros(self, name: str, shape: tuple[int, ...], dtype) -> np.ndarray:
        array = self._buffers.get(name)
        if array is None or array.shape != shape or array.dtype != dtype:
            array = self._buffers[name] = np.zeros(shape, dtype)
        return array

    def _signal(self, spectrum: np.ndarray, rows: int, cols: int, at: tuple[int, int] = (0, 0)) -> np.ndarray:
        """(n, m, rows, cols) at offset ``at`` of the inverse transform of ``spectrum`` (bins, m, n), a
        temporary the transform may overwrite.  Pruned: the inverse transforms along the rows run on
        the rows wanted only."""
        _, m, n = spectrum.shape
        grid = spectrum.reshape(self.size[0], self.size[1] // 2 + 1, m, n)
        down = scipy.fft.ifft(grid, axis=0, overwrite_x=True)[at[0]:at[0] + rows]
        signal = scipy.fft.irfft(down, n=self.size[1], axis=1, overwrite_x=True)
        return signal[:, at[1]:at[1] + cols].transpose(3, 2, 0, 1)

    def forward(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
        """y (B, F, Ho, Wo) of x (B, C, H, W) and weight (F, C·kh·kw)."""
        filters, channels = len(weight), x.shape[1]
        self.x_hat = self._spectrum("x", x, self.pad)  # (bins, C, B), kept for the weight gradient
        taps = weight.reshape(filters, channels, *self.kernel)
        self.w_hat = self._spectrum("w", taps, (0, 0))  # (bins, C, F)
        y_hat = np.matmul(self.w_hat.conj().transpose(0, 2, 1), self.x_hat)  # (bins, F, B)
        y = self._signal(y_hat, *self.out_hw)
        out = np.empty(y.shape, x.dtype)
        if bias is None:
            np.copyto(out, y)
        else:
            np.add(y, bias[:, None, None], out=out)
        return out

    def backward(self, grad: np.ndarray, need_input: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """(weight gradient (F, C·kh·kw), input gradient (B, C, H, W) or None)."""
        g_hat = self._spectrum("g", grad, (0, 0))  # (bins, F, B)
        channels = self.x_hat.shape[1]
        dw_hat = np.matmul(g_hat.conj(), self.x_hat.transpose(0, 2, 1))  # (bins, F, C)
        dw = self._signal(dw_hat.transpose(0, 2, 1), *self.kernel)  # (F, C, kh, kw)
        dw = np.ascontiguousarray(dw, grad.dtype).reshape(len(dw), -1)
        if not need_input:
            return dw, None
        dx_hat = np.matmul(self.w_hat, g_hat)  # (bins, C, B)
        dx = self._signal(dx_hat, *self.in_hw, at=self.pad)
        return dw, np.ascontiguousarray(dx, grad.dtype).reshape(grad.shape[0], channels, *self.in_hw)
