"""RBM layers: the CD-k gradient against a float64 reference, sampling independent of the partition."""
import numpy as np
import pytest
from google.protobuf import text_format

from singa_mpi.testing import build_layer
from singa_mpi.layers.base import LayerContext
from singa_mpi.streams import KeyedStream
from singa_mpi.proto import job_pb2

B, V, H, SEED, STEP = 6, 5, 4, 7, 3


def conf(text: str) -> job_pb2.LayerProto:
    layer = job_pb2.LayerProto()
    text_format.Parse(text, layer)
    return layer


def pair(gaussian: bool = False, ctx: LayerContext | None = None):
    """A visible and a hidden layer sharing one W, params in float64."""
    vis = build_layer(conf(f'name: "vis" type: kRBMVis srclayers: "data" srclayers: "hid" rbm_conf {{ hdim: {H} }} '
                           'param { name: "w" init { type: kGaussian std: 0.5 } } '
                           'param { name: "bv" init { type: kGaussian std: 0.3 } }'), [(V,)], B, SEED, ctx)
    hid = build_layer(conf(f'name: "hid" type: kRBMHid srclayers: "vis" rbm_conf {{ hdim: {H} '
                           f'gaussian: {str(gaussian).lower()} }} param {{ name: "w_" share_from: "w" init {{ type: kConstant }} }} '
                           'param { name: "bh" init { type: kGaussian std: 0.3 } }'), [(V,)], B, SEED, ctx)
    hid.params[0] = vis.params[0]  # the one W (build_layer gave the share an init of its own)
    for layer in (vis, hid):
        layer.ctx.step = STEP
        for p in layer.params:
            p.zero_grad()
    return vis, hid


def run_cd(vis, hid, v: np.ndarray, k: int) -> None:
    """What the CD algorithm does to one pair on one process (without a net)."""
    vis.compute("positive", [v], True)
    hid.compute("positive", [vis.v_pos], True)
    for _ in range(k):
        vis.grad = hid.backward(None, [True])[0]  # the top-down message
        v_neg = vis.compute("negative", [v], True)
        hid.compute("negative", [v_neg], True)
    hid.param_gradients()
    vis.param_gradients()
    for p in vis.params + hid.params:
        p.finish_grad()


def reference(v, w, bv, bh, k: int, gaussian: bool):
    """SINGA's CD-k (rbm.cc, worker.cc:507-533) in float64, drawing what the layer draws."""
    sigma = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
    act = (lambda x: x) if gaussian else sigma
    h_pos = act(v @ w.T + bh)
    h, v_neg, h_neg = h_pos, None, None
    stream = KeyedStream(SEED, "hid")
    first = None
    for draw in range(k):
        if gaussian:
            sample = h + stream.normal((0, STEP, draw), 0, B * H).reshape(B, H)
        else:
            sample = (stream.uniform((0, STEP, draw), 0, B * H).reshape(B, H) <= h).astype(np.float64)
        v_neg = sigma(sample @ w + bv)
        first = v_neg if first is None else first
        h_neg = h = act(v_neg @ w.T + bh)
    grads = {"w": (h_neg.T @ v_neg - h_pos.T @ v) / B, "bv": (v_neg - v).sum(0) / B, "bh": (h_neg - h_pos).sum(0) / B}
    return grads, ((v - first) ** 2).sum()


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("gaussian", [False, True])
def test_cd_k_gradients_match_a_float64_reference(k, gaussian):
    vis, hid = pair(gaussian)
    v = np.random.default_rng(1).random((B, V))
    run_cd(vis, hid, v, k)
    w, bv, bh = vis.params[0].data, vis.params[1].data, hid.params[1].data
    want, error = reference(v, w, bv, bh, k, gaussian)
    got = {"w": vis.params[0].grad, "bv": vis.params[1].grad, "bh": hid.params[1].grad}
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-10, atol=1e-12, err_msg=name)
    metrics = vis.metrics()
    assert metrics["squared_error/count"] == B
    np.testing.assert_allclose(metrics["squared_error"], error, rtol=1e-10)  # the first reconstruction only
    assert vis.metrics() == {}  # reset after reading


def test_hidden_samples_are_the_serial_run_s_whatever_the_slice():
    """A sub-layer holding some rows or some hidden units draws exactly those entries of the whole draw."""
    whole_vis, whole = pair()
    v = np.random.default_rng(2).random((B, V))
    whole_vis.compute("positive", [v], True)
    whole.compute("positive", [whole_vis.v_pos], True)
    want = whole.sample()
    for rows, units in [((2, 5), None), (None, (1, 3)), ((0, 3), (3, 4))]:
        ctx = LayerContext(global_batch=B, seed=SEED, batch_slice=rows, feature_slice=units)
        vis, hid = pair(ctx=ctx)
        r0, r1 = rows or (0, B)
        hid.params[0].data = whole.params[0].data[slice(*(units or (0, H)))]
        hid.params[1].data = whole.params[1].data[slice(*(units or (0, H)))]
        hid.compute("positive", [v[r0:r1]], True)
        np.testing.assert_array_equal(hid.sample(), want[r0:r1, slice(*(units or (0, H)))])


def test_draws_differ_per_round_and_step_and_repeat_after_a_restart():
    vis, hid = pair()
    v = np.random.default_rng(3).random((B, V))
    vis.compute("positive", [v], True)
    hid.compute("positive", [vis.v_pos], True)
    first, second = hid.sample(), hid.sample()
    assert not np.array_equal(first, second)  # round 2 draws afresh
    again_vis, again = pair()  # a resumed run: fresh layers at the same step
    again.compute("positive", [vis.v_pos], True)
    np.testing.assert_array_equal(again.sample(), first)
    hid.ctx.step = STEP + 1
    assert not np.array_equal(hid.sample(), first)


def test_hidden_layer_has_no_bias_without_bias_term():
    vis = build_layer(conf(f'name: "vis" type: kRBMVis srclayers: "d" srclayers: "hid" rbm_conf {{ hdim: {H} '
                           'bias_term: false } param { name: "w" init { type: kGaussian } }'), [(V,)], B)
    assert [s.role for s in vis.param_specs] == ["weight"]


@pytest.mark.parametrize("start", [0, 1, 2, 7, 40])
def test_a_stream_block_is_that_part_of_the_whole_draw(start):
    stream = KeyedStream(SEED, "hid")
    for draw in (stream.uniform, stream.normal):
        whole = draw((1, 9, 2), 0, 64)
        np.testing.assert_array_equal(draw((1, 9, 2), start, 64 - start), whole[start:])
        assert not np.array_equal(draw((1, 9, 3), 0, 64), whole)  # another draw, other numbers
    normal = stream.normal((0, 0, 0), 0, 20000)
    assert abs(normal.mean()) < 0.03 and abs(normal.std() - 1) < 0.03
    uniform = stream.uniform((0, 0, 0), 0, 20000)
    assert 0 <= uniform.min() and uniform.max() < 1 and abs(uniform.mean() - 0.5) < 0.01
