"""Convolution, pooling, LRN: gradient checks and slow loop references written independently."""
import numpy as np
import pytest

from singa_mpi.testing import build_layer, check_layer_gradients
from singa_mpi.layers.base import LayerConfigError, LayerContext
from layer_support import conf, rand

WB = 'param { name: "w" init { type: kGaussian std: 0.5 } } param { name: "b" init { type: kGaussian } }'


def reference_conv(x, w, b, kh, kw, pad, stride):
    """Direct loops over output positions: out[n, f, i, j] = Σ x_pad[n, c, i*s+u, j*s+v] w[f, c, u, v] + b[f]."""
    n, c, h, wd = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    ho, wo = (h + 2 * pad[0] - kh) // stride[0] + 1, (wd + 2 * pad[1] - kw) // stride[1] + 1
    w4 = w.reshape(len(w), c, kh, kw)
    out = np.zeros((n, len(w), ho, wo))
    for i in range(ho):
        for j in range(wo):
            patch = xp[:, :, i * stride[0]:i * stride[0] + kh, j * stride[1]:j * stride[1] + kw]
            out[:, :, i, j] = np.einsum("ncuv,fcuv->nf", patch, w4) + b
    return out


@pytest.mark.parametrize("spec,geometry", [
    ("kernel: 3 pad: 1 stride: 1", ((3, 3), (1, 1), (1, 1))),
    ("kernel: 2 stride: 2", ((2, 2), (0, 0), (2, 2))),
    ("kernel_x: 3 kernel_y: 2 pad_x: 1 stride_y: 2", ((2, 3), (0, 1), (2, 1))),
])
def test_convolution_values_and_gradients(spec, geometry):
    (kh, kw), pad, stride = geometry
    layer = build_layer(conf(f'name: "c" type: kCConvolution convolution_conf {{ num_filters: 3 {spec} }} {WB}'),
                        [(2, 5, 6)], batch=2)
    x = rand(2, 2, 5, 6)
    y = layer.forward([x], True)
    expected = reference_conv(x, layer.params[0].data, layer.params[1].data, kh, kw, pad, stride)
    np.testing.assert_allclose(y, expected, atol=1e-12)
    assert y.shape[1:] == layer.out_shape
    check_layer_gradients(layer, [x])


@pytest.mark.parametrize("samples_per_chunk", [1, 2])  # batch 3: chunks of 1, 1, 1 and of 2, 1
@pytest.mark.parametrize("spec,geometry", [
    ("kernel: 3 pad: 1 stride: 1", ((3, 3), (1, 1), (1, 1))),
    ("kernel_x: 3 kernel_y: 2 pad_x: 1 stride_y: 2", ((2, 3), (0, 1), (2, 1))),
])
def test_columns_too_large_to_keep_are_made_again_for_the_weight_gradient(monkeypatch, samples_per_chunk, spec,
                                                                          geometry):
    from singa_mpi.layers import conv as conv_module

    (kh, kw), pad, stride = geometry
    ho, wo = (5 + 2 * pad[0] - kh) // stride[0] + 1, (6 + 2 * pad[1] - kw) // stride[1] + 1
    monkeypatch.setattr(conv_module, "CHUNK_BYTES", samples_per_chunk * 2 * kh * kw * ho * wo * 8)  # float64
    layer = build_layer(conf(f'name: "c" type: kCConvolution convolution_conf {{ num_filters: 3 {spec} }} {WB}'),
                        [(2, 5, 6)], batch=3)
    x = rand(3, 2, 5, 6)
    y = layer.forward([x], True)
    assert layer.cols is None and not layer.via_fourier
    np.testing.assert_allclose(y, reference_conv(x, layer.params[0].data, layer.params[1].data, kh, kw, pad,
                                                 stride), atol=1e-12)
    check_layer_gradients(layer, [x])


def filter_shards(text, x, g, cuts):
    """The whole layer's (output, input gradient, layer) and, per filter slice [lo, hi), its part's
    (output, input gradient, weight gradient)."""
    shape, batch = x.shape[1:], len(x)
    whole = build_layer(conf(text), [shape], batch=batch)
    y = whole.forward([x], True)
    gx = whole.backward(g, [True])[0]
    parts = []
    for lo, hi in cuts:
        part = build_layer(conf(text), [shape], batch=batch,
                           ctx=LayerContext(global_batch=batch, seed=7, feature_slice=(lo, hi)))
        out = part.forward([x], True)
        parts.append((out, part.backward(g[:, lo:hi], [True])[0], part.params[0].grad))
    return (y, gx, whole), parts


def assert_shards_make_the_whole(cuts, parts, y, gx, whole, atol=0.0):
    """Each filter slice's output and weight gradient are the whole's; their input gradients sum to it."""
    total = np.zeros_like(gx)
    for (lo, hi), (out, part_gx, part_gw) in zip(cuts, parts):
        np.testing.assert_allclose(out, y[:, lo:hi], atol=atol)
        total += part_gx
        np.testing.assert_allclose(part_gw, whole.params[0].grad[lo:hi], atol=atol)
    np.testing.assert_allclose(total, gx, atol=atol)


def test_convolution_filter_shards_match_the_whole():
    text = f'name: "c" type: kConvolution convolution_conf {{ num_filters: 5 kernel: 3 pad: 1 }} {WB}'
    x, g = rand(2, 3, 4, 4), rand(2, 5, 4, 4, seed=2)
    cuts = [(0, 3), (3, 5)]
    (y, gx, whole), parts = filter_shards(text, x, g, cuts)
    assert_shards_make_the_whole(cuts, parts, y, gx, whole)


def test_convolution_rejects_kernel_larger_than_padded_input():
    with pytest.raises(LayerConfigError, match="convolution_conf.kernel"):
        build_layer(conf(f'name: "c" type: kConvolution convolution_conf {{ num_filters: 2 kernel: 7 pad: 1 }} {WB}'),
                    [(1, 4, 4)], batch=1)
    with pytest.raises(LayerConfigError, match="convolution_conf.num_filters"):
        build_layer(conf(f'name: "c" type: kConvolution convolution_conf {{ kernel: 3 }} {WB}'), [(1, 4, 4)], batch=1)


def reference_pool(x, k, stride, pad, op):
    n, c, h, w = x.shape
    fill = -np.inf if op == "max" else 0.0
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=fill)
    ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    out = np.zeros((n, c, ho, wo))
    for i in range(ho):
        for j in range(wo):
            window = xp[:, :, i * stride:i * stride + k, j * stride:j * stride + k]
            out[:, :, i, j] = window.max(axis=(2, 3)) if op == "max" else window.sum(axis=(2, 3)) / (k * k)
    return out


@pytest.mark.parametrize("op", ["MAX", "AVG"])
@pytest.mark.parametrize("k,stride,pad", [(2, 2, 0), (3, 2, 0), (3, 2, 1), (3, 1, 0)])
def test_pooling_values_and_gradients(op, k, stride, pad):
    layer = build_layer(conf(f'name: "p" type: kCPooling pooling_conf {{ pool: {op} kernel: {k} stride: {stride} '
                             f'pad: {pad} }}'), [(2, 7, 7)], batch=2)
    x = np.random.default_rng(3).permutation(2 * 2 * 7 * 7).reshape(2, 2, 7, 7) / 10.0  # no ties
    np.testing.assert_allclose(layer.forward([x], True), reference_pool(x, k, stride, pad, op.lower()))
    check_layer_gradients(layer, [x])


def test_max_pooling_ties_send_the_gradient_once():
    layer = build_layer(conf('name: "p" type: kPooling pooling_conf { pool: MAX kernel: 2 stride: 2 }'),
                        [(1, 2, 2)], batch=1)
    layer.forward([np.zeros((1, 1, 2, 2))], True)
    grad = layer.backward(np.ones((1, 1, 1, 1)), [True])[0]
    assert grad.sum() == 1 and grad[0, 0, 0, 0] == 1  # the first maximum only


def reference_lrn(x, size, alpha, beta, knorm):
    n, c = x.shape[:2]
    out = np.empty_like(x)
    for ch in range(c):
        lo, hi = max(0, ch - size // 2), min(c, ch + size // 2 + 1)
        norm = knorm + alpha / size * (x[:, lo:hi] ** 2).sum(axis=1)
        out[:, ch] = x[:, ch] * norm ** -beta
    return out


def test_lrn_values_and_gradients():
    layer = build_layer(conf('name: "n" type: kLRN lrn_conf { local_size: 3 alpha: 0.5 beta: 0.75 knorm: 2 }'),
                        [(5, 3, 3)], batch=2)
    x = rand(2, 5, 3, 3)
    np.testing.assert_allclose(layer.forward([x], True), reference_lrn(x, 3, 0.5, 0.75, 2.0))
    check_layer_gradients(layer, [x])


def test_lrn_rejects_even_window():
    with pytest.raises(LayerConfigError, match="lrn_conf.local_size"):
        build_layer(conf('name: "n" type: kLRN lrn_conf { local_size: 4 }'), [(5, 3, 3)], batch=1)


@pytest.mark.parametrize("field", ["knorm", "alpha"])
def test_lrn_rejects_a_negative_norm_term(field):
    """A negative knorm or alpha made the first forward's norm^(-beta) NaN, reported as a diverged run."""
    with pytest.raises(LayerConfigError, match=rf"lrn_conf.{field}.*-1.*expected a value >= 0"):
        build_layer(conf(f'name: "n" type: kLRN lrn_conf {{ local_size: 3 {field}: -1 }}'), [(5, 3, 3)], batch=1)


def test_pooling_rejects_kernel_larger_than_input():
    with pytest.raises(LayerConfigError, match="pooling_conf.kernel"):
        build_layer(conf('name: "p" type: kPooling pooling_conf { kernel: 5 }'), [(1, 3, 3)], batch=1)


@pytest.mark.parametrize("text", [
    f'name: "c" type: kConvolution convolution_conf {{ num_filters: 2 kernel: 3 }} {WB}',
    'name: "p" type: kPooling pooling_conf { kernel: 2 }', 'name: "n" type: kLRN lrn_conf { local_size: 3 }',
])
def test_float32_stays_float32(text):
    layer = build_layer(conf(text), [(3, 6, 6)], batch=2, dtype=np.float32)
    y = layer.forward([rand(2, 3, 6, 6).astype(np.float32)], True)
    assert y.dtype == np.float32
    assert layer.backward(np.ones_like(y), [True])[0].dtype == np.float32


# ---- the Fourier route (singa_mpi.layers.fft_conv), forced on and off on the same layers

@pytest.fixture(params=["fourier", "im2col"])
def route(request, monkeypatch):
    from singa_mpi.layers import fft_conv

    monkeypatch.setattr(fft_conv, "cheaper", lambda *args: request.param == "fourier")
    return request.param


@pytest.mark.parametrize("geometry", ["kernel: 3 pad: 1", "kernel: 5 pad: 2", "kernel_x: 3 kernel_y: 2 pad_x: 2",
                                      "kernel: 3"])
def test_both_routes_match_the_loop_reference_and_their_gradients(route, geometry):
    text = f'name: "c" type: kConvolution convolution_conf {{ num_filters: 4 {geometry} }} {WB}'
    layer = build_layer(conf(text), [(3, 7, 6)], batch=2)
    x = rand(2, 3, 7, 6)
    y = layer.forward([x], True)
    assert layer.via_fourier == (route == "fourier")
    kh, kw = layer.kernel
    np.testing.assert_allclose(y, reference_conv(x, layer.params[0].data, layer.params[1].data, kh, kw,
                                                 layer.pad, (1, 1)), atol=1e-12)
    check_layer_gradients(layer, [x])


def test_fourier_filter_shards_and_batch_rows_match_the_whole(route):
    text = f'name: "c" type: kConvolution convolution_conf {{ num_filters: 5 kernel: 3 pad: 1 }} {WB}'
    x, g = rand(4, 3, 6, 6), rand(4, 5, 6, 6, seed=2)
    cuts = [(0, 2), (2, 5)]
    (y, gx, whole), parts = filter_shards(text, x, g, cuts)
    assert_shards_make_the_whole(cuts, parts, y, gx, whole, atol=1e-12)
    summed = np.zeros_like(whole.params[0].grad)
    for rows in (slice(0, 1), slice(1, 4)):  # a batch split: each rank's weight gradient of its rows
        part = build_layer(conf(text), [(3, 6, 6)], batch=4)
        np.testing.assert_allclose(part.forward([x[rows]], True), y[rows], atol=1e-12)
        np.testing.assert_allclose(part.backward(g[rows], [True])[0], gx[rows], atol=1e-12)
        part.params[0].finish_grad()
        summed += part.params[0].grad
    np.testing.assert_allclose(summed, whole.params[0].grad, atol=1e-12)


def test_fourier_route_in_float32_agrees_with_im2col_to_rounding(monkeypatch):
    from singa_mpi.layers import fft_conv

    text = f'name: "c" type: kConvolution convolution_conf {{ num_filters: 16 kernel: 5 pad: 2 }} {WB}'
    x = rand(8, 16, 15, 15).astype(np.float32)
    g = rand(8, 16, 15, 15, seed=4).astype(np.float32)
    results = {}
    for fourier in (True, False):
        monkeypatch.setattr(fft_conv, "cheaper", lambda *args, on=fourier: on)
        layer = build_layer(conf(text), [(16, 15, 15)], batch=8, dtype=np.float32)
        y = layer.forward([x], True)
        dx = layer.backward(g, [True])[0]
        layer.params[0].finish_grad()
        assert y.dtype == dx.dtype == layer.params[0].grad.dtype == np.float32
        results[fourier] = (y, dx, layer.params[0].grad.copy())
    for a, b in zip(results[True], results[False]):
        assert np.abs(a - b).max() <= 2e-6 * np.abs(b).max()


def test_the_route_follows_the_work_and_whether_the_input_gradient_is_wanted():
    from singa_mpi.layers.fft_conv import cheaper

    # the CIFAR-10 convnet's layers at batch 100 (conv1 reads the data: no input gradient)
    assert not cheaper(100, 3, 32, (5, 5), (32, 32), (2, 2), need_input=False)
    assert cheaper(100, 32, 32, (5, 5), (15, 15), (2, 2))
    assert cheaper(100, 32, 64, (5, 5), (7, 7), (2, 2))
    # conv3 at the rows of 8 ranks (13) and of 16 (7): Fourier (1.8 vs 2.7 ms, 1.3 vs 1.5 ms measured); at
    # 25 ranks' 4 rows im2col (0.90 vs 0.98 ms): the kernels' transforms, a cost per step, then dominate
    assert cheaper(13, 32, 64, (5, 5), (7, 7), (2, 2)) and cheaper(7, 32, 64, (5, 5), (7, 7), (2, 2))
    assert not cheaper(4, 32, 64, (5, 5), (7, 7), (2, 2))
    layer = build_layer(conf(f'name: "c" type: kConvolution convolution_conf {{ num_filters: 32 kernel: 5 pad: 2 }} '
                             f'{WB}'), [(3, 32, 32)], batch=100, dtype=np.float32)
    x = rand(100, 3, 32, 32).astype(np.float32)
    layer.forward([x], True)
    assert layer.via_fourier  # on its own: the input gradient is assumed wanted
    layer.input_grads = [False]  # as a net sets it for a layer that reads the data
    layer.forward([x], True)
    assert not layer.via_fourier


@pytest.mark.parametrize("k,stride,pad", [((3, 3), (2, 2), (0, 0)), ((3, 2), (1, 2), (1, 0)), ((2, 3), (2, 1), (0, 1)),
                                          ((3, 3), (3, 3), (1, 1))])
def test_max_pooling_sends_each_window_gradient_to_its_first_maximum_in_row_major_order(k, stride, pad):
    (kh, kw), (sy, sx), (ph, pw) = k, stride, pad
    layer = build_layer(conf(f'name: "p" type: kPooling pooling_conf {{ pool: MAX kernel_y: {kh} kernel_x: {kw} '
                             f'stride_y: {sy} stride_x: {sx} pad_y: {ph} pad_x: {pw} }}'), [(2, 8, 7)], batch=2)
    x = np.random.default_rng(5).integers(0, 3, (2, 2, 8, 7)).astype(float)  # ties everywhere
    y = layer.forward([x], True)
    g = np.random.default_rng(6).random(y.shape)
    dx = layer.backward(g, [True])[0]
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=-np.inf)
    expected = np.zeros_like(xp)
    for n, c, i, j in np.ndindex(*y.shape):
        window = xp[n, c, i * sy:i * sy + kh, j * sx:j * sx + kw]
        u, v = divmod(int(np.argmax(window)), kw)  # numpy's argmax: the first maximum, row-major
        assert y[n, c, i, j] == window[u, v]
        expected[n, c, i * sy + u, j * sx + v] += g[n, c, i, j]
    np.testing.assert_allclose(dx, expected[:, :, ph:ph + 8, pw:pw + 7])


@pytest.mark.parametrize("size,kernel", [((9, 8), (3, 3)), ((20, 20), (5, 5)), ((12, 15), (2, 5))])
def test_kernel_transforms_by_dft_matrices_match_numpy_fft(size, kernel):
    from singa_mpi.layers.fft_conv import FourierConvolution

    layer = FourierConvolution(kernel, (0, 0), size, size)  # a kernel-sized pad-free grid: size is the transform's
    assert layer.size == size
    taps = rand(3, 4, *kernel)  # (F, C, kh, kw), float64
    expected = np.fft.rfft2(taps, s=size).transpose(2, 3, 1, 0).reshape(layer.bins, 4, 3)  # (bins, C, F)
    np.testing.assert_allclose(layer._taps_spectrum(taps), expected, atol=1e-12)
    rng = np.random.default_rng(3)
    spectrum = rng.standard_normal((layer.bins, 2, 5)) + 1j * rng.standard_normal((layer.bins, 2, 5))
    grid = spectrum.reshape(size[0], size[1] // 2 + 1, 2, 5).transpose(2, 3, 0, 1)
    lags = np.fft.irfft2(grid, s=size)[..., :kernel[0], :kernel[1]]  # (2, 5, kh, kw)
    np.testing.assert_allclose(layer._taps_signal(spectrum), lags.transpose(2, 3, 0, 1), atol=1e-12)
