"""SINGA's parameter slicing (its own test vectors, src/test/test_common.cc at v0.3) and the pieces each
worker sends each server, for every partitioning scheme."""
import math

import numpy as np
import pytest

import nets
from singa_mpi.planner import partition
from singa_mpi.planner.servers import (FIRST_PIECE_TAG, describe, partition_slices, pieces, server_ranges,
                                       slice_params, trained_params)

SIZES = [14112, 96, 256, 884736, 384]


def test_slice_matches_singas_test_vectors():
    assert slice_params(2, SIZES) == [[14112], [96], [256], [435328, 449408], [384]]
    assert slice_params(4, SIZES)[3] == [210432, 224896, 224896, 224512]
    assert slice_params(8, SIZES)[3] == [97984, 112448, 112448, 112448, 112448, 112448, 112448, 112064]
    assert all(len(cut) == 1 for k, cut in enumerate(slice_params(8, SIZES)) if k != 3)


@pytest.mark.parametrize("num,expected", [(1, [0] * 8), (2, [0, 0, 0, 0, 1, 1, 1, 1]),
                                          (4, [0, 0, 1, 1, 2, 2, 3, 3]), (8, list(range(8)))])
def test_partition_slices_matches_singas_test_vectors(num, expected):
    assert partition_slices(num, [97984] + [112448] * 6 + [112064]) == expected


def test_every_element_has_one_server_and_ranges_are_contiguous():
    params = [(f"p{k}", (size,)) for k, size in enumerate(SIZES)]
    for nservers in (1, 2, 3, 4, 8):
        ranges = server_ranges(params, nservers)
        for name, (size,) in params:
            mine = sorted((r.lo, r.hi) for r in ranges if r.name == name)
            assert mine[0][0] == 0 and mine[-1][1] == size
            assert all(a[1] == b[0] for a, b in zip(mine, mine[1:]))
        assert {r.server for r in ranges} <= set(range(nservers))
        loads = [sum(r.size for r in ranges if r.server == s) for s in range(nservers)]
        assert max(loads) <= 1.1 * math.ceil(sum(SIZES) / nservers) + sum(SIZES) % nservers + 1


@pytest.mark.parametrize("scheme", ["data", "feature", "hybrid"])
@pytest.mark.parametrize("nservers", [1, 2, 3])
def test_pieces_cover_every_shard_once_per_holder(tmp_path, scheme, nservers):
    text = nets.mlp(str(tmp_path / "d.h5"), 9, scheme, 3)
    the_plan = partition(nets.job(text), 3, "train")
    params = trained_params(the_plan, set())
    ranges = server_ranges(params, nservers)
    found = pieces(the_plan, ranges)
    shapes = dict(params)
    for sub in the_plan.sublayers:
        for shard in sub.params:
            mine = [p for p in found if p.worker == sub.rank and (p.name, p.offsets) == (shard.name, shard.offsets)]
            covered = np.zeros(shard.size, int)
            logical = np.zeros(math.prod(shapes[shard.name]), int)
            for p in mine:
                covered[p.local_lo:p.local_hi] += 1
                r = next(r for r in ranges if r.name == p.name and r.server == p.server)
                logical[r.lo:r.hi][p.remote] += 1
            assert (covered == 1).all()
            box = logical.reshape(shapes[shard.name])[tuple(slice(lo, hi) for lo, hi in shard.offsets)]
            assert (box == 1).all() and logical.sum() == shard.size
    for worker in {p.worker for p in found}:
        for server in range(nservers):
            tags = [p.tag for p in found if p.worker == worker and p.server == server]
            assert tags == list(range(FIRST_PIECE_TAG, FIRST_PIECE_TAG + len(tags)))
    assert len(describe(ranges, tuple(range(3, 3 + nservers)))) == nservers
