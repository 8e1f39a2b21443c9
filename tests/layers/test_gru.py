"""The GRU layer: gradient checks, SINGA's test vector, an independent reference chain (BPTT),
feature-split equivalence, the carried initial state and configuration errors."""
import numpy as np
import pytest
from google.protobuf import text_format

from singa_mpi.testing import build_layer, check_layer_gradients
from singa_mpi.layers.base import LayerConfigError, LayerContext, layer_class
from singa_mpi.layers.rnn import GRU
from singa_mpi.proto import job_pb2

NAMES = ("z_hx", "r_hx", "c_hx", "z_hh", "r_hh", "c_hh", "z_b", "r_b", "c_b")
GAUSSIAN = "init { type: kGaussian std: 0.5 }"


def gru_conf(hidden=3, nparams=9, gru_extra="", init=GAUSSIAN) -> job_pb2.LayerProto:
    params = " ".join(f'param {{ name: "{n}" {init} }}' for n in (NAMES * 2)[:nparams])
    layer = job_pb2.LayerProto()
    text_format.Parse(f'name: "gru" type: kGRU gru_conf {{ dim_hidden: {hidden} {gru_extra} }} '
                      f'srclayers: "x" {params}', layer)
    return layer


def rand(*shape, seed=0):
    return np.random.default_rng(seed).normal(0, 1, shape)


def gru(hidden=3, vdim=4, nsrcs=2, batch=3, nparams=9, feature_slice=None, dtype=np.float64, init=GAUSSIAN):
    shapes = [(vdim,), (hidden,)][:nsrcs]
    ctx = LayerContext(global_batch=batch, seed=7, feature_slice=feature_slice)
    return build_layer(gru_conf(hidden, nparams, init=init), shapes, batch=batch, ctx=ctx, dtype=dtype)


# ------------------------------------------------ an independent reference of SINGA's equations

def sigmoid(a):
    return 1 / (1 + np.exp(-a))


def ref_step(x, h, w):
    """gru.cc v0.3 ComputeFeature, written from the equations; w: name -> logical array."""
    bias = {n: w.get(n, 0) for n in ("z_b", "r_b", "c_b")}
    z = sigmoid(x @ w["z_hx"].T + bias["z_b"] + h @ w["z_hh"].T)
    r = sigmoid(x @ w["r_hx"].T + bias["r_b"] + h @ w["r_hh"].T)
    c = np.tanh(r * (h @ w["c_hh"].T) + x @ w["c_hx"].T + bias["c_b"])
    return z * h + (1 - z) * c


def ref_chain(xs, h0, w, weights):
    """Outputs of the unrolled chain and its loss Σ_t Σ h_t ⊙ weights_t."""
    h, outs = h0, []
    for x in xs:
        h = ref_step(x, h, w)
        outs.append(h)
    return outs, float(sum(np.sum(o * r) for o, r in zip(outs, weights)))


def numerical(loss, array, eps=1e-6):
    grad = np.zeros_like(array)
    for idx in np.ndindex(array.shape):
        old = array[idx]
        array[idx] = old + eps
        plus = loss()
        array[idx] = old - eps
        minus = loss()
        array[idx] = old
        grad[idx] = (plus - minus) / (2 * eps)
    return grad


# ------------------------------------------------------------------------------ the tests

def test_kgru_is_registered():
    assert layer_class("kGRU") is GRU


@pytest.mark.parametrize("nparams", [9, 6])
@pytest.mark.parametrize("start", ["h_prev", "zeros", "carried"])
def test_gradients(nparams, start):
    layer = gru(nsrcs=2 if start == "h_prev" else 1, nparams=nparams)
    assert len(layer.params) == nparams
    inputs = [rand(3, 4)]
    if start == "h_prev":
        inputs.append(0.8 * rand(3, 3, seed=1))
    elif start == "carried":
        layer.initial_state = 0.8 * rand(3, 3, seed=2)
    check_layer_gradients(layer, inputs, max_entries=100)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_singa_test_vector(dtype):
    """test_gru_layer.cc: all weights and biases 0.5, V=4, H=2, one-hot x."""
    half = "init { type: kConstant value: 0.5 }"
    first = gru(hidden=2, vdim=4, nsrcs=1, batch=1, init=half, dtype=dtype)
    x = np.array([[1, 0, 0, 0]], dtype)
    h1 = first.forward([x], True)
    assert h1.dtype == dtype
    np.testing.assert_allclose(h1, [[0.204824, 0.204824]], atol=1e-6)
    second = gru(hidden=2, vdim=4, nsrcs=2, batch=1, init=half, dtype=dtype)
    np.testing.assert_allclose(second.forward([x, h1], True), [[0.346753, 0.346753]], atol=1e-6)


def test_float32_stays_float32():
    layer = gru(dtype=np.float32)
    x, h = rand(3, 4).astype(np.float32), rand(3, 3, seed=1).astype(np.float32)
    y = layer.forward([x, h], True)
    dx, dh = layer.backward(np.ones_like(y), [True, True])
    assert {a.dtype for a in (y, dx, dh, *(p.grad for p in layer.params))} == {np.dtype(np.float32)}


@pytest.mark.parametrize("nparams", [9, 6])
def test_bptt_over_four_steps_matches_the_reference_and_finite_differences(nparams):
    """A chain of 4 copies sharing one set of params: outputs equal the numpy reference;
    back-propagation through the chain (param gradients summed over steps) equals finite
    differences of the reference chain's loss for every param, every x_t and h_0."""
    steps, batch, vdim, hidden = 4, 2, 3, 4
    chain = [gru(hidden, vdim, nsrcs=2, batch=batch, nparams=nparams) for _ in range(steps)]
    for copy in chain[1:]:
        copy.params = chain[0].params  # copies t > 0 use copy 0's params and add into its gradients
    xs = [rand(batch, vdim, seed=10 + t) for t in range(steps)]
    h0 = 0.5 * rand(batch, hidden, seed=20)
    weights = [rand(batch, hidden, seed=30 + t) for t in range(steps)]
    w = {p.name: p.data for p in chain[0].params}

    h, outs = h0, []
    for copy, x in zip(chain, xs):
        h = copy.forward([x, h], True)
        outs.append(h)
    want, _ = ref_chain(xs, h0, w, weights)
    for got, ref in zip(outs, want):
        np.testing.assert_allclose(got, ref, rtol=1e-12, atol=1e-12)

    for p in chain[0].params:
        p.zero_grad()
    carry, dxs = np.zeros_like(h0), [None] * steps
    for t in reversed(range(steps)):  # the gradient of h_t: its own loss term + what step t+1 sends back
        dxs[t], carry = chain[t].backward(weights[t] + carry, [True, True])

    def loss():
        return ref_chain(xs, h0, w, weights)[1]

    for p in chain[0].params:
        np.testing.assert_allclose(p.grad, numerical(loss, p.data), rtol=1e-6, atol=1e-8, err_msg=p.name)
    for t in range(steps):
        np.testing.assert_allclose(dxs[t], numerical(loss, xs[t]), rtol=1e-6, atol=1e-8, err_msg=f"x_{t}")
    np.testing.assert_allclose(carry, numerical(loss, h0), rtol=1e-6, atol=1e-8, err_msg="h_0")


def test_singa_b4_would_differ():
    """SINGA adds z where g⊙z belongs: with g ≠ 1 the direct term must scale with g."""
    layer = gru(nsrcs=2)
    x, h = rand(3, 4), rand(3, 3, seed=1)
    layer.forward([x, h], True)
    z = layer.cache[2]
    g = rand(3, 3, seed=2)
    _, dh = layer.backward(g, [True, True])
    _, dh_zero = layer.backward(np.zeros_like(g), [True, True])
    np.testing.assert_allclose(dh_zero, 0)  # no gradient in, none out (SINGA would return z)
    assert not np.allclose(dh, dh + z - g * z)


@pytest.mark.parametrize("slices", [[(0, 2), (2, 5)], [(0, 1), (1, 3), (3, 5)]])
@pytest.mark.parametrize("nparams", [9, 6])
def test_feature_split_sublayers_add_up_to_the_whole(slices, nparams):
    hidden, vdim, batch = 5, 4, 3
    x, h, g = rand(batch, vdim), rand(batch, hidden, seed=1), rand(batch, hidden, seed=2)
    whole = gru(hidden, vdim, batch=batch, nparams=nparams)
    y = whole.forward([x, h], True)
    dx, dh = whole.backward(g, [True, True])
    outs, dx_sum, dh_sum = [], np.zeros_like(dx), np.zeros_like(dh)
    for lo, hi in slices:
        part = gru(hidden, vdim, batch=batch, nparams=nparams, feature_slice=(lo, hi))
        assert part.local_out_shape() == (hi - lo,)
        outs.append(part.forward([x, h], True))
        part_dx, part_dh = part.backward(g[:, lo:hi], [True, True])
        assert part_dx.shape == (batch, vdim) and part_dh.shape == (batch, hidden)  # partial sums, full width
        dx_sum += part_dx
        dh_sum += part_dh
        for mine, its in zip(part.params, whole.params):
            np.testing.assert_allclose(mine.data, its.data[lo:hi])
            np.testing.assert_allclose(mine.grad, its.grad[lo:hi], rtol=1e-12, atol=1e-14, err_msg=mine.name)
    np.testing.assert_allclose(np.concatenate(outs, axis=1), y, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(dx_sum, dx, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(dh_sum, dh, rtol=1e-12, atol=1e-14)


def test_initial_state_is_the_first_steps_h_prev():
    x, h0, g = rand(3, 4), rand(3, 3, seed=1), rand(3, 3, seed=2)
    paired = gru(nsrcs=2)
    y = paired.forward([x, h0], True)
    dx, _ = paired.backward(g, [True, True])
    first = gru(nsrcs=1)
    first.initial_state = h0
    np.testing.assert_allclose(first.forward([x], True), y)
    grads = first.backward(g, [True])
    assert len(grads) == 1  # no gradient flows into the carried state
    np.testing.assert_allclose(grads[0], dx)
    for mine, its in zip(first.params, paired.params):
        np.testing.assert_allclose(mine.grad, its.grad)
    first.initial_state = None  # SINGA's only choice: zeros
    np.testing.assert_allclose(first.forward([x], True), paired.forward([x, np.zeros((3, 3))], True))
    first.initial_state = h0[:2]
    with pytest.raises(ValueError, match=r"initial_state shape \(2, 3\), expected \(3, 3\)"):
        first.forward([x], True)


def test_initial_state_of_a_feature_split_sublayer_is_every_unit():
    x, h0 = rand(3, 4), rand(3, 5, seed=1)
    whole, part = gru(hidden=5, nsrcs=1), gru(hidden=5, nsrcs=1, feature_slice=(1, 4))
    whole.initial_state = part.initial_state = h0
    np.testing.assert_allclose(part.forward([x], True), whole.forward([x], True)[:, 1:4])


def test_six_params_mean_no_biases_whatever_bias_term_says():
    """SINGA's sample.conf: gru2 lists 6 params and leaves bias_term at its default (true)."""
    for extra in ("", "bias_term: true", "bias_term: false"):
        layer = build_layer(gru_conf(3, 6, extra), [(4,)], batch=2)
        assert [p.name for p in layer.params] == list(NAMES[:6])
        assert [s.logical_shape for s in layer.param_specs] == [(3, 4)] * 3 + [(3, 3)] * 3
    layer = build_layer(gru_conf(3, 9, "bias_term: true"), [(2, 2)], batch=2)  # V = 2·2
    assert [s.logical_shape for s in layer.param_specs] == [(3, 4)] * 3 + [(3, 3)] * 3 + [(3,)] * 3


@pytest.mark.parametrize("text, field", [
    ('name: "g" type: kGRU', "gru_conf.dim_hidden"),
    ('name: "g" type: kGRU gru_conf { dim_hidden: 0 }', "gru_conf.dim_hidden"),
])
def test_dim_hidden_is_required(text, field):
    layer = job_pb2.LayerProto()
    text_format.Parse(text, layer)
    with pytest.raises(LayerConfigError, match=f"^{field} = "):
        build_layer(layer, [(4,)], batch=2)


@pytest.mark.parametrize("nparams", [0, 5, 7, 8, 10])
def test_param_count_is_six_or_nine(nparams):
    with pytest.raises(LayerConfigError, match=rf"^param = {nparams} params: expected 6 .* or 9 "):
        build_layer(gru_conf(3, nparams), [(4,)], batch=2)


def test_bias_term_false_with_nine_params():
    with pytest.raises(LayerConfigError, match=r"^gru_conf.bias_term = false: expected true, or 6 params"):
        build_layer(gru_conf(3, 9, "bias_term: false"), [(4,)], batch=2)


def test_second_source_must_be_a_previous_step():
    with pytest.raises(LayerConfigError, match=r"^srclayers\[1\] = output shape \(4,\): expected the previous GRU"):
        build_layer(gru_conf(3), [(4,), (4,)], batch=2)


def test_the_carried_state_is_what_checkpoints_keep():
    layer = gru(nsrcs=1)
    assert layer.carried() == {}
    h0 = rand(3, 3, seed=1)
    layer.load_carried("hidden", h0)
    np.testing.assert_array_equal(layer.carried()["hidden"], h0)
    with pytest.raises(ValueError, match="carries no array 'cell'"):
        layer.load_carried("cell", h0)
