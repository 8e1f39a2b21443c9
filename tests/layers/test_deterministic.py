"""What deterministic mode relies on, checked on the BLAS and numpy in use, and the inner product's
deterministic path: a worker's rows give the bits the whole batch gives for those rows.

The mode's one assumption: BLAS (and numpy's element-wise loops) give the same bits for the same
shapes and operands, wherever the operands sit in memory (a block of rows inside a larger array, or
a copy of them; a worker's own rows, or the same rows gathered from every worker).  It does *not*
assume that a product over some rows equals those rows of a product over more rows (OpenBLAS breaks
that: the canonical blocks exist for it).  A BLAS that broke the assumption fails here first.
"""
import numpy as np
import pytest
from google.protobuf import text_format

from singa_mpi.layers.base import LAYERS, LayerContext, row_blocks
from singa_mpi.params import Param, form_rows, form_terms, gradient_tiles
from singa_mpi.proto import job_pb2

SHAPES = [(16, 784, 2500), (8, 100, 37), (5, 64, 10), (3, 12, 16)]  # block rows, inner, outer


@pytest.mark.parametrize("rows,inner,outer", SHAPES)
def test_a_block_inside_a_larger_array_multiplies_as_its_copy(rows, inner, outer):
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((4 * rows + 3, inner)).astype(np.float32)
    w = rng.standard_normal((outer, inner)).astype(np.float32)
    for lo in (0, rows, 3 * rows + 3 - rows):
        block = x[lo:lo + rows]
        assert np.array_equal(w @ block.T, w @ block.copy().T)  # forward (W·xᵀ)
        assert np.array_equal(block @ w.T, np.ascontiguousarray(block) @ w.T)


@pytest.mark.parametrize("rows,inner,outer", SHAPES)
def test_gradient_rows_form_the_same_bits_from_views_and_gathered_copies(rows, inner, outer):
    rng = np.random.default_rng(outer)
    grad = rng.standard_normal((outer, 3 * rows)).astype(np.float32).T  # a transposed view
    x = rng.standard_normal((3 * rows, inner)).astype(np.float32)
    here, gathered = np.empty((outer, inner), np.float32), np.empty((outer, inner), np.float32)
    form_rows(grad, x, here)
    form_rows(np.concatenate([grad[:rows], grad[rows:]]), np.concatenate([x[:rows], x[rows:]]), gathered)
    assert np.array_equal(here, gathered)
    sums_here, sums_gathered = np.empty(outer, np.float32), np.empty(outer, np.float32)
    form_rows(grad, None, sums_here)
    form_rows(np.concatenate([grad[:1], grad[1:]]), None, sums_gathered)
    assert np.array_equal(sums_here, sums_gathered)


@pytest.mark.parametrize("rows,inner,outer", [(64, 2500, 784), (32, 300, 130), (19, 12, 16)])
def test_a_tile_formed_alone_is_the_bits_of_that_tile_formed_with_all_the_others(rows, inner, outer):
    """Workers form some tiles of a gradient each (planner.syncs.forming_tiles), one worker all of them."""
    rng = np.random.default_rng(rows)
    grad = rng.standard_normal((rows, outer)).astype(np.float32)
    x = rng.standard_normal((rows, inner)).astype(np.float32)
    whole = np.empty((outer, inner), np.float32)
    form_rows(grad, x, whole)
    tiles = gradient_tiles(whole.shape)
    assert tiles[0][0] == 0 and tiles[-1][1] == outer and all(a[1] == b[0] for a, b in zip(tiles, tiles[1:]))
    for tile in tiles:
        alone = np.full_like(whole, np.nan)
        form_rows(grad.copy(), x.copy(), alone, [tile])
        assert np.array_equal(alone[tile[0]:tile[1]], whole[tile[0]:tile[1]])
    uses = [(grad, x), (grad[::-1].copy(), x[::-1].copy())]  # an unrolled layer's two uses, added in order
    both, alone = np.empty_like(whole), np.zeros_like(whole)
    form_terms(uses, both)
    for tile in tiles[::-1]:
        form_terms(uses, alone, [tile])
    assert np.array_equal(alone, both)


@pytest.mark.parametrize("function", [np.tanh, np.exp, np.log1p, lambda a: 1 / (1 + np.exp(-a)),
                                      lambda a: np.maximum(a, 0)])
def test_element_wise_functions_do_not_depend_on_where_an_element_sits(function):
    rng = np.random.default_rng(7)
    x = np.abs(rng.standard_normal((64, 37)).astype(np.float32))
    whole = function(x)
    for lo, hi in [(0, 1), (1, 2), (3, 17), (8, 64), (13, 50)]:
        assert np.array_equal(function(x[lo:hi].copy()), whole[lo:hi])
        assert np.array_equal(function(x.reshape(-1)[lo:hi * 37 - 5].copy()), whole.reshape(-1)[lo:hi * 37 - 5])


def test_canonical_blocks_start_on_every_block_rows_th_row():
    assert row_blocks(19, 4) == [(0, 4), (4, 8), (8, 12), (12, 16), (16, 19)]
    assert row_blocks(3, 4) == [(0, 3)]


def _inner_product(rows: tuple[int, int], transpose: bool) -> object:
    text = f'name: "fc" type: kInnerProduct innerproduct_conf {{ num_output: 7 transpose: {str(transpose).lower()} }}'
    conf = text_format.Parse(text + ' param { name: "w" } param { name: "b" }', job_pb2.LayerProto())
    layer = LAYERS.select(conf)(conf, LayerContext(global_batch=19, batch_slice=rows, block_rows=4))
    layer.out_shape = tuple(layer.setup([(11,)]))
    rng = np.random.default_rng(5)
    layer.params = []
    for spec in layer.param_specs:
        param = Param(spec.conf, spec.logical_shape, spec.shard)
        param.data[...] = rng.standard_normal(param.data.shape)
        param.zero_grad()
        layer.params.append(param)
    return layer


@pytest.mark.parametrize("transpose", [False, True])
def test_a_workers_rows_compute_the_bits_of_those_rows_of_the_whole_batch(transpose):
    rng = np.random.default_rng(9)
    x = rng.standard_normal((19, 11)).astype(np.float32)
    grad = rng.standard_normal((19, 7)).astype(np.float32)
    whole, part = _inner_product((0, 19), transpose), _inner_product((8, 19), transpose)
    y, y_part = whole.forward([x], True), part.forward([x[8:]], True)
    assert np.array_equal(y_part, y[8:])
    dx, dx_part = whole.backward(grad, [True])[0], part.backward(grad[8:], [True])[0]
    assert np.array_equal(dx_part, dx[8:])
    # the weight's gradient waits as rows; the whole batch's rows form the one computation
    left, right = whole.params[0].row_terms[0]
    assert left.shape[0] == right.shape[0] == 19
    assert whole.params[1].row_terms[0][1] is None  # a bias: column sums of its rows
    want = (x.T @ grad) if transpose else (grad.T @ x)
    np.testing.assert_allclose(whole.params[0].grad, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(whole.params[1].grad, grad.sum(axis=0), rtol=1e-5, atol=1e-5)
