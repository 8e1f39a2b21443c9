"""Param gradient accumulation: immediate, queued (GradientQueue) and collected as factors."""
import numpy as np
import pytest

from singa_mpi.params import GradientQueue, Param
from singa_mpi.sync.shared_memory import FactorSlot
from singa_mpi.proto import job_pb2


def _param(shape=(3, 4), name="w") -> Param:
    return Param(job_pb2.ParamProto(name=name), shape, tuple((0, n) for n in shape))


def _factors(rng, rows=5, shape=(3, 4)):
    return rng.normal(size=(shape[0], rows)).astype(np.float32), rng.normal(size=(rows, shape[1])).astype(np.float32)


def test_queued_products_wait_until_run_and_equal_immediate_accumulation():
    rng = np.random.default_rng(0)
    (a1, b1), (a2, b2), dense = _factors(rng), _factors(rng), rng.normal(size=(3, 4)).astype(np.float32)
    now, later, queue = _param(), _param(), GradientQueue()
    later.queue = queue
    for p in (now, later):
        p.zero_grad()
        p.add_grad(a1, b1)
        p.add_grad(dense)  # a dense contribution goes in at once, whatever is queued
        p.add_grad(a2, b2)
    assert len(queue.items) == 2 and not later.fresh  # the dense one already wrote the gradient
    np.testing.assert_allclose(later.grad, dense)
    later.finish_grad()
    assert queue.items == []
    np.testing.assert_allclose(later.grad, now.grad, rtol=1e-6)
    np.testing.assert_allclose(now.grad, a1 @ b1 + dense + a2 @ b2, rtol=1e-5, atol=1e-6)


def test_queue_holds_products_of_several_params_and_finish_of_any_runs_all():
    rng = np.random.default_rng(1)
    queue = GradientQueue()
    p, q = _param(name="p"), _param(name="q")
    (a, b), (c, d) = _factors(rng), _factors(rng)
    for param in (p, q):
        param.queue = queue
        param.zero_grad()
    p.add_grad(a, b)
    q.add_grad(c, d)
    p.finish_grad()
    np.testing.assert_allclose(q.grad, c @ d, rtol=1e-6)
    q.finish_grad()  # nothing left to run: the gradient stays as it is
    np.testing.assert_allclose(q.grad, c @ d, rtol=1e-6)


def test_a_param_without_contributions_finishes_as_zero_even_with_a_queue():
    param = _param()
    param.queue = GradientQueue()
    param.grad.fill(7.0)
    param.zero_grad()
    param.finish_grad()
    assert not param.grad.any()


def _factored(rows=5, shape=(3, 4)):
    param = _param(shape)
    left = np.full((rows, shape[0]), np.nan, np.float32)
    right = np.full((rows, shape[1]), np.nan, np.float32)
    param.factors, param.grad = FactorSlot(param.name, left, right), None
    return param, left, right


def test_factors_are_recorded_transposed_into_the_shared_rows():
    rng = np.random.default_rng(2)
    param, left, right = _factored()
    a, b = _factors(rng)
    param.zero_grad()
    param.add_grad(a, b)
    np.testing.assert_array_equal(left, a.T)
    np.testing.assert_array_equal(right, b)
    np.testing.assert_allclose(left.T @ right, a @ b, rtol=1e-6)


def test_a_factored_param_without_contribution_clears_both_factors():
    param, left, right = _factored()  # NaN garbage: zero times NaN would still be NaN
    param.zero_grad()
    param.finish_grad()
    assert not left.any() and not right.any()


@pytest.mark.parametrize("second", ["product", "dense"])
def test_a_factored_param_takes_exactly_one_product_per_step(second):
    rng = np.random.default_rng(3)
    param, _, _ = _factored()
    param.zero_grad()
    a, b = _factors(rng)
    if second == "dense":
        with pytest.raises(RuntimeError, match="'w' collects its gradient as factors.*a dense one"):
            param.add_grad(a @ b)
        return
    param.add_grad(a, b)
    with pytest.raises(RuntimeError, match="'w' collects its gradient as factors.*a second one"):
        param.add_grad(a, b)


def test_factors_of_the_wrong_shape_name_the_param_and_the_expected_shapes():
    rng = np.random.default_rng(4)
    param, _, _ = _factored(rows=5)
    param.zero_grad()
    a, b = _factors(rng, rows=6)
    with pytest.raises(RuntimeError, match=r"param 'w': gradient factors of shapes \(3, 6\) and \(6, 4\), "
                                           r"expected \(3, 5\) and \(5, 4\)"):
        param.add_grad(a, b)


def test_products_from_several_users_are_summed_as_one_gemm_when_read():
    """The copies of an unrolled layer each add a @ b: the sum is formed once, when the gradient is read."""
    rng = np.random.default_rng(0)
    param = Param(job_pb2.ParamProto(name="w"), (4, 3), ((0, 4), (0, 3)))
    pairs = [(rng.standard_normal((4, 5)).astype(np.float32), rng.standard_normal((5, 3)).astype(np.float32))
             for _ in range(3)]
    param.zero_grad()
    for a, b in pairs:
        param.add_grad(a, b)
    assert len(param.pending) == 3
    dense = rng.standard_normal((4, 3)).astype(np.float32)
    param.add_grad(dense)  # a dense contribution keeps what is pending
    np.testing.assert_allclose(param.grad, sum(a @ b for a, b in pairs) + dense, rtol=1e-5)
    assert not param.pending
    param.zero_grad()
    a, b = pairs[0]
    param.add_grad(a, b)
    param.finish_grad()
    np.testing.assert_array_equal(param.grad, a @ b)  # one product: exactly what adding it at once gives
    param.zero_grad()
    param.finish_grad()
    assert not param.grad.any()  # nothing added this step: an explicit zero


def test_gemm_add_adds_a_product_in_place_for_every_layout():
    from singa_mpi.params import gemm_add

    rng = np.random.default_rng(4)
    for a, b in [(rng.standard_normal((6, 3)), rng.standard_normal((3, 5))),
                 (rng.standard_normal((3, 6)).T, rng.standard_normal((5, 3)).T),  # transposed views
                 (rng.standard_normal((6, 6))[:, ::2], rng.standard_normal((3, 5)))]:  # neither order
        a, b = a.astype(np.float32), b.astype(np.float32)
        out = rng.standard_normal((6, 5)).astype(np.float32)
        expected = out + a @ b
        before = out.__array_interface__["data"][0]
        gemm_add(a, b, out)
        assert out.__array_interface__["data"][0] == before
        np.testing.assert_allclose(out, expected, rtol=1e-5, atol=1e-5)
