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

Each sum is one complex GEMM per frequency (the frequencies as the batch of ``np.matmul``).  The
kernels are tiny images (F·C of them, kh x kw taps), which FFTs handle one short line at a time: their
spectrum, and the kernel lags of the weight gradient, are two complex GEMMs with DFT matrices each
instead (2x faster; at the small batches of many data-parallel ranks these transforms were a third of
the layer's time).  Results agree with im2col to float32 rounding (relative 1e-6 of the largest output).
"""
from __future__ import annotations

import math

import numpy as np
import scipy.fft

from singa_mpi.layers.planes import move_planes

# Relative costs, in units of one float32 multiply-add inside sgemm, fitted (non-negative least squares
# of relative errors) to forward + backward times of 74 layer shapes on one core (the CIFAR-10 convnet's
# at batch 4-100, and random ones: batch 4-100, 3-64 channels, 8-64 filters, 7-32 pixels, 3x3 and 5x5
# kernels, with and without the input gradient): with them the cheaper route was chosen in 72, and the
# other two were within 4% of each other.  A transform costs per point and log2(points), and once per
# call; the kernels' own transforms are GEMMs with DFT matrices (:func:`_tap_transforms`).
COPIED_FLOAT = 23.9  # im2col's columns (a strided copy out of cache)
TRANSFORM_POINT_LOG = 15.7
TRANSFORM_CALL = 3690.0
COMPLEX_MAC = 3.19  # the per-frequency products
TAP_COMPLEX_MAC = 10.4  # the kernels' DFTs: small complex GEMMs (inner sizes kh, kw and N_h)


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
    # x and y forward; the gradient and (need_input) dx backward
    transforms = 2 * batch * filters + batch * channels * (2 if need_input else 1)
    # the kernels' spectrum forward and the weight gradient's taps backward, per (filter, channel)
    tap_macs = 2 * filters * channels * kernel[0] * (nw // 2 + 1) * (kernel[1] + nh)
    fourier = transforms * (TRANSFORM_CALL + TRANSFORM_POINT_LOG * nh * nw * math.log2(nh * nw)) \
        + COMPLEX_MAC * passes * batch * filters * channels * bins + TAP_COMPLEX_MAC * tap_macs
    return fourier < direct


def _tap_transforms(size: tuple[int, int], kernel) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """The DFT matrices between a kernel's taps (at the origin of an ``size`` grid) and the half
    spectrum rfft2 keeps: forward (rows (N_h, kh), columns (N_w//2+1, kw)); inverse, the lags
    0..kernel-1 only (rows (kh, N_h), columns (kw, N_w//2+1), irfft's weights folded in: the
    bins that stand for a conjugate pair count twice), in complex128."""
    (nh, nw), (kh, kw) = size, kernel
    half = nw // 2 + 1
    twice = np.full(half, 2.0)
    twice[0] = 1.0
    if nw % 2 == 0:
        twice[-1] = 1.0  # the Nyquist bin is its own conjugate
    rows, columns = np.arange(nh), np.arange(half)
    forward = (np.exp(-2j * np.pi * np.outer(rows, np.arange(kh)) / nh),
               np.exp(-2j * np.pi * np.outer(columns, np.arange(kw)) / nw))
    inverse = (np.exp(2j * np.pi * np.outer(np.arange(kh), rows) / nh) / nh,
               twice * np.exp(2j * np.pi * np.outer(np.arange(kw), columns) / nw) / nw)
    return forward, inverse


class FourierConvolution:
    """The spectra one layer keeps between its forward and backward."""

    def __init__(self, kernel, pad, in_hw, out_hw):
        self.kernel, self.pad, self.in_hw, self.out_hw = kernel, pad, in_hw, out_hw
        self.size = transform_size((in_hw[0] + 2 * pad[0], in_hw[1] + 2 * pad[1]))
        self.bins = self.size[0] * (self.size[1] // 2 + 1)
        self._buffers: dict[str, np.ndarray] = {}  # zero-bordered inputs of the transforms, by name
        self._tap_matrices = {np.dtype(np.complex128): _tap_transforms(self.size, kernel)}  # by complex type

    def _tap_matrices_for(self, dtype) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
        """The tap DFT matrices in the complex type of ``dtype`` (complex64 for float32), cast once."""
        complex_type = np.result_type(dtype, np.complex64)
        if complex_type not in self._tap_matrices:
            exact = self._tap_matrices[np.dtype(np.complex128)]
            self._tap_matrices[complex_type] = tuple(tuple(m.astype(complex_type) for m in pair) for pair in exact)
        return self._tap_matrices[complex_type]

    def _spectrum(self, name: str, array: np.ndarray, at: tuple[int, int]) -> np.ndarray:
        """rfft2 of ``array`` (n, m, h, w) placed at offset ``at`` in zeros of the transform size, as
        (bins, m, n): the frequencies first, for the per-frequency products.  The arrays are laid out
        pixels first, (rows, cols, m, n), so that the transform's output is already in that order (and
        each 1-D transform runs over all images at once along the contiguous axis).  Pruned: the
        transforms along the rows run over the h rows that hold data only (the rest are zeros), the
        transforms down the columns over every row."""
        n, m, h, w = array.shape
        rows = self._zeros(f"{name} rows", (h, self.size[1], m, n), array.dtype)  # the border stays zero
        # (n, m, h, w) -> (h, w, m, n) in two copies: blocks of whole planes to (h, w, n, m) (in one
        # pass, planes of 4 KiB, 32x32 floats, fall into the same cache sets: 5x slower), then (n, m)
        # -> (m, n) per pixel, a small transpose in cache
        planes_last = self._scratch(f"{name} planes", (h, w, n * m), array.dtype)
        move_planes(planes_last, array.reshape(n * m, h, w), planes_last=True)
        rows[:, at[1]:at[1] + w] = planes_last.reshape(h, w, n, m).transpose(0, 1, 3, 2)
        half = scipy.fft.rfft(rows, axis=1)  # (h, N_w // 2 + 1, m, n)
        grid = self._zeros(f"{name} grid", (self.size[0],) + half.shape[1:], half.dtype)
        grid[at[0]:at[0] + h] = half  # the other rows stay zero: the transform below returns a new array
        return scipy.fft.fft(grid, axis=0).reshape(self.bins, m, n)

    def _zeros(self, name: str, shape: tuple[int, ...], dtype) -> np.ndarray:
        return self._scratch(name, shape, dtype, np.zeros)

    def _scratch(self, name: str, shape: tuple[int, ...], dtype, make=np.empty) -> np.ndarray:
        array = self._buffers.get(name)
        if array is None or array.shape != shape or array.dtype != dtype:
            array = self._buffers[name] = make(shape, dtype)
        return array

    def _signal(self, spectrum: np.ndarray, rows: int, cols: int, at: tuple[int, int] = (0, 0)) -> np.ndarray:
        """(n, m, rows, cols) at offset ``at`` of the inverse transform of ``spectrum`` (bins, m, n), a
        temporary the transform may overwrite; a strided view (one copy of it, the caller's, is all
        the transposing there is: rows of N_w floats do not share cache sets as 4 KiB planes do).
        Pruned: the inverse transforms along the rows run on the rows wanted only."""
        _, m, n = spectrum.shape
        grid = spectrum.reshape(self.size[0], self.size[1] // 2 + 1, m, n)
        down = scipy.fft.ifft(grid, axis=0, overwrite_x=True)[at[0]:at[0] + rows]
        signal = scipy.fft.irfft(down, n=self.size[1], axis=1, overwrite_x=True)
        return signal[:, at[1]:at[1] + cols].transpose(3, 2, 0, 1)

    def _taps_spectrum(self, taps: np.ndarray) -> np.ndarray:
        """rfft2 of the kernels ``taps`` (F, C, kh, kw) at the origin of the transform grid, as (bins, C, F):
        two complex GEMMs with the DFT matrices of the taps (what :meth:`_spectrum` gives, 2x faster:
        there are F·C tiny images, which the transforms handle one line at a time)."""
        filters, channels, kh, kw = taps.shape
        to_bins, _ = self._tap_matrices_for(taps.dtype)
        columns = taps.transpose(2, 3, 1, 0).astype(to_bins[0].dtype)  # (kh, kw, C, F), complex for cgemm
        half = np.matmul(to_bins[1], columns.reshape(kh, kw, -1))  # along the columns: (kh, N_w//2+1, C·F)
        return np.matmul(to_bins[0], half.reshape(kh, -1)).reshape(self.bins, channels, filters)

    def _taps_signal(self, spectrum: np.ndarray) -> np.ndarray:
        """(kh, kw, m, n): lags ``0..kernel-1`` of the inverse rfft2 of ``spectrum`` (bins, m, n), by the
        inverse DFT matrices restricted to those lags (two complex GEMMs, the real part kept)."""
        _, m, n = spectrum.shape
        kh, kw = self.kernel
        _, to_taps = self._tap_matrices_for(spectrum.real.dtype)
        rows = np.matmul(to_taps[0], spectrum.reshape(self.size[0], -1))  # (kh, N_w//2+1 · m·n)
        taps = np.matmul(to_taps[1], rows.reshape(kh, -1, m * n))  # (kh, kw, m·n)
        return taps.real.reshape(kh, kw, m, n)

    def forward(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
        """y (B, F, Ho, Wo) of x (B, C, H, W) and weight (F, C·kh·kw)."""
        filters, channels = len(weight), x.shape[1]
        self.x_hat = self._spectrum("x", x, self.pad)  # (bins, C, B), kept for the weight gradient
        self.w_hat = self._taps_spectrum(weight.reshape(filters, channels, *self.kernel))  # (bins, C, F)
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
        dw_hat = np.matmul(g_hat.conj(), self.x_hat.transpose(0, 2, 1))  # (bins, F, C)
        dw = self._taps_signal(dw_hat)  # (kh, kw, F, C)
        dw = np.ascontiguousarray(dw.transpose(2, 3, 0, 1), grad.dtype).reshape(dw.shape[2], -1)
        if not need_input:
            return dw, None
        dx_hat = np.matmul(self.w_hat, g_hat)  # (bins, C, B)
        dx = self._signal(dx_hat, *self.in_hw, at=self.pad)
        return dw, np.ascontiguousarray(dx, grad.dtype)

    def release(self) -> None:
        """Drop the spectra kept for backward (a pipelined step frees a micro-batch's after its backward)."""
        self.x_hat = self.w_hat = None


def work_bytes(batch: int, channels: int, filters: int, kernel, in_hw, pad, out_hw, backward: bool = True,
               input_grad: bool = True) -> tuple[int, int]:
    """(held, passing) bytes of :class:`FourierConvolution` on ``batch`` samples (``backward``: its
    backward runs; ``input_grad``: with the input gradient): held, the input's transform buffers (rows,
    planes and the complex grid, kept from step to step) and the spectra kept for backward (the input's
    and the kernels'), and with backward the output gradient's buffers; passing (complex64), forward's
    product spectrum or backward's: the weight gradient's spectrum with its two tap GEMMs' products and
    the real taps, the output gradient's and the input gradient's spectra and a half-transformed set."""
    nh, nw = transform_size((in_hw[0] + 2 * pad[0], in_hw[1] + 2 * pad[1]))
    bins, half = nh * (nw // 2 + 1), in_hw[0] * (nw // 2 + 1)
    x, g, kernels, taps = batch * channels, batch * filters, channels * filters, kernel[0] * kernel[1]
    held = 4 * (in_hw[0] * nw + in_hw[0] * in_hw[1]) * x + 8 * bins * x + 8 * bins * (x + kernels)
    taps_spectrum = 8 * kernels * (kernel[0] * (nw // 2 + 1) + taps)  # the kernels' DFT GEMMs' products
    if not backward:
        return held, taps_spectrum + 8 * bins * g * 2
    held += 4 * (out_hw[0] * nw + out_hw[0] * out_hw[1]) * g + 8 * bins * g
    weights = 8 * kernels * bins + taps_spectrum + 4 * taps * kernels
    passing = weights + 8 * (bins * (g + (x if input_grad else 0)) + half * max(x if input_grad else 0, g))
    return held, passing
