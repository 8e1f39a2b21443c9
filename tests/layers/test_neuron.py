"""Neuron layers: numerical gradient checks, reference values, partition equivalence."""
import numpy as np
import pytest

from layer_support import conf, rand
from singa_mpi.testing import build_layer, check_layer_gradients
from singa_mpi.errors import DataError
from singa_mpi.layers.base import LayerConfigError, LayerContext, layer_class

PARAMS = 'param { name: "w" init { type: kGaussian std: 0.5 } } param { name: "b" init { type: kGaussian } }'


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
    np.testing.assert_allclose(stanh.forward([np.array([[1.5]])], True), [[1.7159047 * np.tanh(0.66666667 * 1.5)]])


def test_stanh_uses_singa_constants():
    """SINGA 0.3 (mshadow cxxnet_op.h): stanh = 1.7159047·tanh(0.66666667·x), grad A·B·(1 - tanh²)."""
    x = np.array([[-3.0, -0.7, 0.2, 1.5, 4.0]])
    stanh = build_layer(conf('name: "s" type: kSTanh'), [(5,)], batch=1)
    t = np.tanh(0.66666667 * x)
    np.testing.assert_allclose(stanh.forward([x], True), 1.7159047 * t, rtol=1e-7, atol=0)
    np.testing.assert_allclose(stanh.backward(np.ones_like(x), [True])[0],
                               0.66666667 * 1.7159047 - 0.66666667 / 1.7159047 * (1.7159047 * t) ** 2,
                               rtol=1e-7, atol=0)


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


# ---------------------------------------------------------------- registry and partition flags

@pytest.mark.parametrize("names,cls_name,connection,splittable", [
    (["kInnerProduct"], "InnerProduct", "OneToAll", True),
    (["kConvolution", "kCConvolution", "kCudnnConv"], "Convolution", "OneToAll", True),
    (["kPooling", "kCPooling", "kCudnnPool"], "Pooling", "OneToOne", True),
    (["kLRN", "kCudnnLRN"], "LRN", "OneToOne", False),
    (["kSoftmax", "kCudnnSoftmax"], "Softmax", "OneToAll", False),
    (["kActivation", "kCudnnActivation"], "Activation", "OneToOne", True),
    (["kReLU"], "ReLU", "OneToOne", True), (["kSigmoid"], "Sigmoid", "OneToOne", True),
    (["kSTanh"], "STanh", "OneToOne", True), (["kDropout"], "Dropout", "OneToOne", True),
    (["kEmbedding"], "Embedding", "OneToAll", True), (["kOneHot"], "OneHot", "OneToAll", True),
])
def test_every_singa_name_runs_the_cpu_layer(names, cls_name, connection, splittable):
    classes = {layer_class(name) for name in names}
    assert [c.__name__ for c in classes] == [cls_name]
    cls = classes.pop()
    assert (cls.connection, cls.feature_partitionable, cls.num_srcs) == (connection, splittable, (1, 1))


# ---------------------------------------------------------------- inner product

def test_inner_product_against_loops():
    layer = build_layer(conf(f'name: "ip" type: kInnerProduct innerproduct_conf {{ num_output: 3 }} {PARAMS}'),
                        [(4,)], batch=2)
    x = rand(2, 4)
    w, b = layer.params[0].data, layer.params[1].data  # w: (out, in)
    expected = np.array([[sum(x[n, d] * w[f, d] for d in range(4)) + b[f] for f in range(3)] for n in range(2)])
    np.testing.assert_allclose(layer.forward([x], True), expected)


def test_transposed_inner_product_shards_columns_and_input_grads_sum():
    text = f'name: "ip" type: kInnerProduct innerproduct_conf {{ num_output: 5 transpose: true }} {PARAMS}'
    x, g = rand(3, 2, 2), rand(3, 5, seed=1)
    whole = build_layer(conf(text), [(2, 2)], batch=3)
    assert whole.params[0].data.shape == (4, 5)  # (in, out) when transposed
    y = whole.forward([x], True)
    gx = whole.backward(g, [True])[0]
    total = np.zeros_like(gx)
    for lo, hi in [(0, 2), (2, 5)]:
        part = build_layer(conf(text), [(2, 2)], batch=3,
                           ctx=LayerContext(global_batch=3, seed=7, feature_slice=(lo, hi)))
        np.testing.assert_array_equal(part.params[0].data, whole.params[0].data[:, lo:hi])
        np.testing.assert_allclose(part.forward([x], True), y[:, lo:hi])
        total += part.backward(g[:, lo:hi], [True])[0]
        np.testing.assert_allclose(part.params[0].grad, whole.params[0].grad[:, lo:hi])
        np.testing.assert_allclose(part.params[1].grad, whole.params[1].grad[lo:hi])
    np.testing.assert_allclose(total, gx)  # the Split->Concate backward sums these partial input grads


def test_inner_product_accumulates_param_grads_even_without_input_grad():
    layer = build_layer(conf(f'name: "ip" type: kInnerProduct innerproduct_conf {{ num_output: 3 }} {PARAMS}'),
                        [(4,)], batch=2)
    x, g = rand(2, 4), rand(2, 3, seed=1)
    layer.forward([x], True)
    assert layer.backward(g, [False]) == [None]
    once = layer.params[0].grad.copy()
    layer.backward(g, [False])
    np.testing.assert_allclose(layer.params[0].grad, 2 * once)
    np.testing.assert_allclose(layer.params[1].grad, 2 * g.sum(axis=0))


@pytest.mark.parametrize("text,field", [
    ('innerproduct_conf { num_output: 0 }', "innerproduct_conf.num_output"),
    ('innerproduct_conf { num_output: 3 } param { name: "w" }', r"param\[1\]"),  # bias_term needs a 2nd param
])
def test_inner_product_config_errors(text, field):
    with pytest.raises(LayerConfigError, match=field):
        build_layer(conf(f'name: "ip" type: kInnerProduct {text}'), [(4,)], batch=2)


# ---------------------------------------------------------------- pooling shapes not covered in test_conv

def test_non_square_pooling_against_loops():
    layer = build_layer(conf('name: "p" type: kPooling pooling_conf { pool: MAX kernel_y: 2 kernel_x: 3 '
                             'stride_y: 1 stride_x: 2 }'), [(2, 4, 7)], batch=2)
    assert layer.out_shape == (2, 3, 3)
    x = np.random.default_rng(4).permutation(2 * 2 * 4 * 7).reshape(2, 2, 4, 7) / 7.0  # no ties
    expected = np.array([[[[x[n, c, i:i + 2, 2 * j:2 * j + 3].max() for j in range(3)] for i in range(3)]
                          for c in range(2)] for n in range(2)])
    np.testing.assert_array_equal(layer.forward([x], True), expected)
    check_layer_gradients(layer, [x])


def test_pooling_floor_output_size_and_channel_slice():
    # SINGA floors (7 - 2) / 2 + 1 = 3 where Caffe's ceil would give 4
    text = 'name: "p" type: kPooling pooling_conf { pool: AVG kernel: 2 stride: 2 }'
    whole = build_layer(conf(text), [(4, 7, 7)], batch=2)
    assert whole.out_shape == (4, 3, 3)
    x = rand(2, 4, 7, 7)
    part = build_layer(conf(text), [(4, 7, 7)], batch=2, ctx=LayerContext(global_batch=2, feature_slice=(1, 3)))
    np.testing.assert_allclose(part.forward([x[:, 1:3]], True), whole.forward([x], True)[:, 1:3])


@pytest.mark.parametrize("text,shape,field", [
    ('name: "p" type: kPooling pooling_conf { kernel: 2 pad: 2 }', (1, 6, 6), "pooling_conf.pad"),
    ('name: "p" type: kPooling pooling_conf { kernel: 2 }', (6,), "srclayers"),
    (f'name: "c" type: kConvolution convolution_conf {{ num_filters: 2 kernel: 3 stride: 0 }} {PARAMS}',
     (1, 6, 6), "convolution_conf.stride"),
    (f'name: "c" type: kConvolution convolution_conf {{ num_filters: 2 kernel: 3 }} {PARAMS}', (6, 6), "srclayers"),
])
def test_conv_family_config_errors(text, shape, field):
    with pytest.raises(LayerConfigError, match=field):
        build_layer(conf(text), [shape], batch=1)


# ---------------------------------------------------------------- dropout

def test_dropout_mask_on_images_matches_over_rows_and_channels():
    text = 'name: "d" type: kDropout dropout_conf { dropout_ratio: 0.5 }'
    x = np.ones((4, 3, 2, 2), np.float32)
    whole = build_layer(conf(text), [(3, 2, 2)], batch=4, dtype=np.float32)
    whole.ctx.step = 9
    y = whole.forward([x], True)
    assert y.dtype == np.float32
    halves = [build_layer(conf(text), [(3, 2, 2)], batch=4,
                          ctx=LayerContext(global_batch=4, seed=7, step=9, batch_slice=rows, feature_slice=feats))
              for rows, feats in [((0, 2), (0, 1)), ((0, 2), (1, 3)), ((2, 4), (0, 1)), ((2, 4), (1, 3))]]
    top = np.concatenate([halves[0].forward([x[:2, :1]], True), halves[1].forward([x[:2, 1:]], True)], axis=1)
    bottom = np.concatenate([halves[2].forward([x[2:, :1]], True), halves[3].forward([x[2:, 1:]], True)], axis=1)
    np.testing.assert_array_equal(np.concatenate([top, bottom]), y)


def test_dropout_ratio_must_leave_something():
    with pytest.raises(LayerConfigError, match="dropout_conf.dropout_ratio"):
        build_layer(conf('name: "d" type: kDropout dropout_conf { dropout_ratio: 1 }'), [(4,)], batch=1)


# ---------------------------------------------------------------- softmax

def test_softmax_is_stable_and_groups_rows():
    layer = build_layer(conf('name: "s" type: kSoftmax softmax_conf { num_softmax_per_instance: 2 }'),
                        [(2, 3)], batch=2)
    x = rand(2, 2, 3) + 1000.0  # exp would overflow without the max shift
    y = layer.forward([x], True)
    assert y.shape == (2, 2, 3) and np.isfinite(y).all()
    groups = x.reshape(2, 2, 3)
    np.testing.assert_allclose(y, np.exp(groups - 1000) / np.exp(groups - 1000).sum(-1, keepdims=True))
    with pytest.raises(LayerConfigError, match="softmax_conf.num_softmax_per_instance"):
        build_layer(conf('name: "s" type: kSoftmax softmax_conf { num_softmax_per_instance: 4 }'), [(6,)], batch=1)


# ---------------------------------------------------------------- embedding and one-hot

EMBED = ('name: "e" type: kEmbedding embedding_conf {{ vocab_size: 5 feature_dim: 4 }} '
         'param {{ name: "table" init {{ type: kGaussian }} }}{extra}')


def test_embedding_of_sequences_accumulates_repeated_ids():
    layer = build_layer(conf(EMBED.format(extra="")), [(3,)], batch=2)
    ids = np.array([[0, 4, 0], [2, 0, 1]])
    out = layer.forward([ids], True)
    assert layer.out_shape == (3, 4) and out.shape == (2, 3, 4)
    np.testing.assert_array_equal(out[1, 0], layer.params[0].data[2])
    layer.backward(np.ones_like(out), [False])
    np.testing.assert_array_equal(layer.params[0].grad[:, 0], [3, 1, 1, 0, 1])  # id 0 used three times
    check_layer_gradients(layer, [ids.astype(float)], check_inputs=[])


def test_embedding_feature_shards_hold_table_columns():
    ids, g = np.array([3.0, 1.0, 3.0]), rand(3, 4, seed=2)
    whole = build_layer(conf(EMBED.format(extra="")), [()], batch=3)
    whole.forward([ids], True)
    whole.backward(g, [False])
    part = build_layer(conf(EMBED.format(extra="")), [()], batch=3,
                       ctx=LayerContext(global_batch=3, seed=7, feature_slice=(1, 4)))
    part.forward([ids], True)
    part.backward(g[:, 1:], [False])
    np.testing.assert_allclose(part.params[0].grad, whole.params[0].grad[:, 1:])


def test_embedding_errors():
    with pytest.raises(LayerConfigError, match="partition_dim"):  # axis 1 would be T, not features
        build_layer(conf(EMBED.format(extra="")), [(3,)], batch=1,
                    ctx=LayerContext(global_batch=1, feature_slice=(0, 2)))
    with pytest.raises(LayerConfigError, match="embedding_conf.vocab_size"):
        build_layer(conf(EMBED.format(extra="").replace("vocab_size: 5", "")), [()], batch=1)
    layer = build_layer(conf(EMBED.format(extra="")), [()], batch=2)
    with pytest.raises(DataError, match="id 5 outside the vocabulary 0..4"):
        layer.forward([np.array([1, 5])], True)


def test_layers_that_read_ids_give_example_inputs_inside_their_vocabulary():
    """What the cost model times a kernel on: ids a kOneHot or kEmbedding accepts, not N(0, 1) floats."""
    rng = np.random.default_rng(0)
    for text, shape in ((EMBED.format(extra=""), (3,)), ('name: "o" type: kOneHot onehot_conf { vocab_size: 5 }', ())):
        layer = build_layer(conf(text), [shape], batch=64)
        ids = layer.example_input(0, (64,) + shape, rng)
        assert ids.shape == (64,) + shape and set(np.unique(ids)) == {0, 1, 2, 3, 4}
        layer.forward([ids], True)


def test_onehot_feature_slice_dtype_and_errors():
    text = 'name: "o" type: kOneHot onehot_conf { vocab_size: 5 }'
    ids = np.array([4, 0, 2], np.float32)
    whole = build_layer(conf(text), [()], batch=3).forward([ids], True)
    assert whole.dtype == np.float32
    np.testing.assert_array_equal(whole, np.eye(5)[[4, 0, 2]])
    part = build_layer(conf(text), [()], batch=3, ctx=LayerContext(global_batch=3, feature_slice=(2, 5)))
    np.testing.assert_array_equal(part.forward([ids], True), whole[:, 2:])
    assert part.backward(np.ones((3, 3), np.float32), [True]) == [None]
    with pytest.raises(DataError, match="id -1"):
        part.forward([np.array([-1.0, 0, 0])], True)
    with pytest.raises(LayerConfigError, match="srclayers"):  # (batch, T) ids are windows: tests/layers/test_text.py
        build_layer(conf(text), [(2, 3)], batch=1)
    with pytest.raises(LayerConfigError, match="onehot_conf.vocab_size"):
        build_layer(conf('name: "o" type: kOneHot'), [()], batch=1)


# ---------------------------------------------------------------- dtypes and the need flags

@pytest.mark.parametrize("text,shape", [
    ('name: "r" type: kReLU relu_conf { negative_slope: 0.2 }', (4,)),
    ('name: "a" type: kCudnnActivation activation_conf { type: TANH }', (4,)),
    ('name: "a" type: kActivation activation_conf { type: STANH }', (4,)),
    ('name: "a" type: kActivation activation_conf { type: SIGMOID }', (4,)),
    ('name: "m" type: kCudnnSoftmax softmax_conf { num_softmax_per_instance: 2 }', (4,)),
    (f'name: "ip" type: kInnerProduct innerproduct_conf {{ num_output: 3 transpose: true }} {PARAMS}', (2, 2)),
    (f'name: "c" type: kCudnnConv convolution_conf {{ num_filters: 2 kernel_x: 3 kernel_y: 1 stride: 2 pad: 1 }} '
     f'{PARAMS}', (2, 4, 5)),
    ('name: "p" type: kCudnnPool pooling_conf { pool: AVG kernel: 2 pad: 1 }', (2, 4, 4)),
    ('name: "n" type: kCudnnLRN', (6, 2, 2)),
])
def test_more_float32_stays_float32(text, shape):
    layer = build_layer(conf(text), [shape], batch=2, dtype=np.float32)
    y = layer.forward([rand(2, *shape).astype(np.float32)], True)
    assert y.dtype == np.float32 and y.shape == (2,) + layer.out_shape
    assert layer.backward(np.ones_like(y), [True])[0].dtype == np.float32
    assert all(p.grad.dtype == np.float32 for p in layer.params)


def test_embedding_float32_table_gives_float32():
    layer = build_layer(conf(EMBED.format(extra="")), [()], batch=2, dtype=np.float32)
    y = layer.forward([np.array([1, 2], np.float32)], True)
    assert y.dtype == np.float32
    layer.backward(np.ones_like(y), [False])
    assert layer.params[0].grad.dtype == np.float32


@pytest.mark.parametrize("text,shape", [
    ('name: "r" type: kReLU', (4,)), ('name: "a" type: kActivation', (4,)), ('name: "m" type: kSoftmax', (4,)),
    ('name: "d" type: kDropout', (4,)), ('name: "p" type: kPooling pooling_conf { kernel: 2 }', (1, 4, 4)),
    ('name: "n" type: kLRN', (3, 2, 2)),
    (f'name: "c" type: kConvolution convolution_conf {{ num_filters: 2 kernel: 3 }} {PARAMS}', (1, 4, 4)),
])
def test_no_input_gradient_when_not_needed(text, shape):
    layer = build_layer(conf(text), [shape], batch=2)
    y = layer.forward([rand(2, *shape)], True)
    assert layer.backward(np.ones_like(y), [False]) == [None]


def test_an_unrolled_embedding_copy_embeds_its_time_steps_column():
    """Copy t of an unrolled net (unroll_len > 1) reads column t of a kCharRNN window, as kOneHot does."""
    text = ('name: "emb" type: kEmbedding unroll_len: 4 unroll_index: 2 embedding_conf { vocab_size: 6 '
            'feature_dim: 3 } param { name: "t" init { type: kGaussian } }')
    layer = build_layer(conf(text), [(4,)], batch=2)
    ids = np.array([[0, 1, 5, 2], [3, 3, 4, 0]], np.float32)
    np.testing.assert_array_equal(layer.forward([ids], True), layer.params[0].data[[5, 4]])
    with pytest.raises(LayerConfigError, match="0..3"):
        build_layer(conf(text.replace("unroll_index: 2", "unroll_index: 4")), [(4,)], batch=2)
