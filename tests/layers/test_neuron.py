"""Neuron layers: numerical gradient checks, reference values, partition equivalence."""
import numpy as np
import pytest
from google.protobuf import text_format

from gradcheck import build_layer, check_layer_gradients
from singa_mpi.layers.base import LayerConfigError, LayerContext
from singa_mpi.proto import job_pb2

PARAMS = 'param { name: "w" init { type: kGaussian std: 0.5 } } param { name: "b" init { type: kGaussian } }'


def conf(text: str) -> job_pb2.LayerProto:
    layer = job_pb2.LayerProto()
    text_format.Parse(text, layer)
    return layer


def rand(*shape, seed=0):
    return np.random.default_rng(seed).normal(0, 1, shape)


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_inner_product_gradients(transpose, bias):
    layer = build_layer(conf(f'name: "ip" type: kInnerProduct innerproduct_conf {{ num_output: 5 '
                             f'transpose: {str(transpose).lower()} bias_term: {str(bias).lower()} }} {PARAMS}'),
                        [(2, 3)], batch=4)
    x = rand(4, 2, 3)
    check_layer_gradients(layer, [x])
    w = layer.params[0].data
    expected = x.reshape(4, 6) @ (w if transpose else w.T) + (layer.params[1].data if bias else 0)
    np.testing.assert_allclose(layer.forward([x], True), expected)


def test_inner_product_feature_shards_match_the_whole():
    text = f'name: "ip" type: kInnerProduct innerproduct_conf {{ num_output: 7 }} {PARAMS}'
    x, g = rand(3, 6), rand(3, 7, seed=1)
    whole = build_layer(conf(text), [(6,)], batch=3)
    y = whole.forward([x], True)
    whole.backward(g, [True])
    for lo, hi in [(0, 4), (4, 7)]:
        part = build_layer(conf(text), [(6,)], batch=3, ctx=LayerContext(global_batch=3, seed=7, feature_slice=(lo, hi)))
        np.testing.assert_allclose(part.forward([x], True), y[:, lo:hi])
        part.backward(g[:, lo:hi], [True])
        np.testing.assert_allclose(part.params[0].grad, whole.params[0].grad[lo:hi])
        np.testing.assert_allclose(part.params[1].grad, whole.params[1].grad[lo:hi])


def test_inner_product_needs_num_output():
    with pytest.raises(LayerConfigError, match="innerproduct_conf.num_output"):
        build_layer(conf(f'name: "ip" type: kInnerProduct {PARAMS}'), [(4,)], batch=2)


@pytest.mark.parametrize("kind", ["kReLU", "kSigmoid", "kSTanh"])
def test_elementwise_gradients(kind):
    layer = build_layer(conf(f'name: "a" type: {kind}'), [(3, 4)], batch=2)
    x = rand(2, 3, 4)
    x[np.abs(x) < 0.05] = 0.3  # keep away from ReLU's kink
    check_layer_gradients(layer, [x])


def test_relu_negative_slope_and_stanh_values():
    relu = build_layer(conf('name: "r" type: kReLU relu_conf { negative_slope: 0.1 }'), [(3,)], batch=1)
    np.testing.assert_allclose(relu.forward([np.array([[-2.0, 0.5, 3.0]])], True), [[-0.2, 0.5, 3.0]])
    check_layer_gradients(relu, [np.array([[-2.0, 0.5, 3.0]])])
    stanh = build_layer(conf('name: "s" type: kSTanh'), [(1,)], batch=1)
    np.testing.assert_allclose(stanh.forward([np.array([[1.5]])], True), [[1.7159 * np.tanh(1.0)]])


@pytest.mark.parametrize("kind", ["RELU", "SIGMOID", "TANH", "STANH"])
def test_activation_gradients(kind):
    layer = build_layer(conf(f'name: "a" type: kActivation activation_conf {{ type: {kind} }}'), [(5,)], batch=3)
    x = rand(3, 5) + 0.1
    check_layer_gradients(layer, [x])


def test_dropout_mask_is_keyed_by_global_position():
    text = 'name: "d" type: kDropout dropout_conf { dropout_ratio: 0.4 }'
    x = np.ones((5, 6))
    whole = build_layer(conf(text), [(6,)], batch=5)
    whole.ctx.step = 3
    y = whole.forward([x], True)
    kept = np.unique(y[y != 0])
    np.testing.assert_allclose(kept, [1 / 0.6], rtol=1e-6)  # inverted dropout scale
    assert 0 < (y == 0).mean() < 1
    check_layer_gradients(whole, [rand(5, 6)])
    for rows, feats in [((0, 3), None), ((3, 5), None), (None, (2, 6))]:
        ctx = LayerContext(global_batch=5, seed=7, step=3, batch_slice=rows, feature_slice=feats)
        part = build_layer(conf(text), [(6,)], batch=5, ctx=ctx)
        r, f = slice(*(rows or (0, 5))), slice(*(feats or (0, 6)))
        np.testing.assert_array_equal(part.forward([x[r, f]], True), y[r, f])
    assert np.array_equal(whole.forward([x], False), x)  # identity at test time
    whole.ctx.step = 4
    assert not np.array_equal(whole.forward([x], True), y)  # a new mask each step


def test_softmax_gradients_and_values():
    layer = build_layer(conf('name: "s" type: kSoftmax'), [(4,)], batch=3)
    x = rand(3, 4)
    y = layer.forward([x], True)
    np.testing.assert_allclose(y.sum(axis=1), 1)
    np.testing.assert_allclose(y, np.exp(x) / np.exp(x).sum(axis=1, keepdims=True))
    check_layer_gradients(layer, [x])
    grouped = build_layer(conf('name: "s" type: kSoftmax softmax_conf { num_softmax_per_instance: 2 }'),
                          [(6,)], batch=2)
    check_layer_gradients(grouped, [rand(2, 6)])


def test_embedding_gradient_and_feature_shard():
    text = 'name: "e" type: kEmbedding embedding_conf { vocab_size: 6 feature_dim: 4 } ' \
           'param { name: "table" init { type: kGaussian } }'
    ids = np.array([[1], [3], [1], [5]], float)
    layer = build_layer(conf(text), [(1,)], batch=4)
    out = layer.forward([ids], True)
    np.testing.assert_allclose(out, layer.params[0].data[[1, 3, 1, 5]])
    check_layer_gradients(layer, [ids], check_inputs=[])
    part = build_layer(conf(text), [(1,)], batch=4, ctx=LayerContext(global_batch=4, seed=7, feature_slice=(1, 3)))
    np.testing.assert_allclose(part.forward([ids], True), out[:, 1:3])


def test_onehot():
    layer = build_layer(conf('name: "o" type: kOneHot onehot_conf { vocab_size: 4 }'), [(1,)], batch=3)
    np.testing.assert_array_equal(layer.forward([np.array([[2], [0], [3]])], True),
                                  [[0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 1]])


@pytest.mark.parametrize("text,shape", [
    (f'name: "ip" type: kInnerProduct innerproduct_conf {{ num_output: 3 }} {PARAMS}', (4,)),
    ('name: "r" type: kReLU', (4,)), ('name: "s" type: kSigmoid', (4,)), ('name: "t" type: kSTanh', (4,)),
    ('name: "d" type: kDropout', (4,)), ('name: "m" type: kSoftmax', (4,)),
])
def test_float32_stays_float32(text, shape):
    layer = build_layer(conf(text), [shape], batch=2, dtype=np.float32)
    x = rand(2, *shape).astype(np.float32)
    y = layer.forward([x], True)
    assert y.dtype == np.float32
    grads = layer.backward(np.ones_like(y), [True])
    assert grads[0].dtype == np.float32
