"""The planner's overlap check: ``_first_overlap`` must find two overlapping param shards whenever
there are any (against comparing every pair)."""
import itertools
import random

import pytest

from singa_mpi.planner.plan import _first_overlap


def overlapping_pairs(boxes):
    return {(min(a, b), max(a, b)) for a, b in itertools.combinations(set(boxes), 2)
            if all(max(x[0], y[0]) < min(x[1], y[1]) for x, y in zip(a, b))}


@pytest.mark.parametrize("seed", range(200))
def test_first_overlap_finds_one_whenever_some_pair_overlaps(seed):
    rng = random.Random(seed)
    dims = rng.randint(1, 3)
    boxes = []
    for _ in range(rng.randint(1, 12)):
        box = []
        for _ in range(dims):
            lo = rng.randrange(10)
            box.append((lo, lo + rng.randint(1, 4)))
        boxes.append(tuple(box))
    pairs = overlapping_pairs(boxes)
    found = _first_overlap(list(dict.fromkeys(boxes)))
    assert (found in pairs) if pairs else found is None


def test_first_overlap_of_a_feature_split_is_none_and_a_row_split_over_it_clashes():
    columns = [((0, 10), (c, c + 1)) for c in range(1000)]
    assert _first_overlap(columns) is None
    assert _first_overlap(columns + [((0, 5), (0, 1000))]) is not None
