"""The schedule's safety proof on hand-made schedules (no MPI), and the planner's overlap check.

:func:`singa_mpi.planner.schedule._simulate` must finish every schedule that MPI would finish and
name the stuck calls of one that would hang; ``_first_overlap`` must find two overlapping param
shards whenever there are any (against comparing every pair)."""
import itertools
import random

import pytest

from singa_mpi.errors import ConfigError
from singa_mpi.planner.plan import _first_overlap
from singa_mpi.planner.schedule import CommOp, _check_collectives, _simulate


def send(rank, peer, tag=0):
    return CommOp(rank, "Send", peer, (rank, peer), None, tag, (4,), "float32", f"s{tag}", "forward",
                  f"forward:{tag}", 16, 0)


def recv(rank, peer, tag=0):
    return CommOp(rank, "Recv", peer, (peer, rank), None, tag, (4,), "float32", f"r{tag}", "forward",
                  f"forward:{tag}", 0, 16)


def coll(rank, key, group):
    return CommOp(rank, "Allreduce", None, tuple(group), None, None, (4,), "float32", key, "params",
                  f"params:{key}", 0, 0)


def test_a_ring_of_sends_then_receives_finishes():
    n = 5
    _simulate({r: [send(r, (r + 1) % n), recv(r, (r - 1) % n)] for r in range(n)})


def test_receiving_first_all_round_the_ring_deadlocks_and_names_every_rank():
    n = 3
    with pytest.raises(ConfigError, match="would deadlock") as err:
        _simulate({r: [recv(r, (r - 1) % n), send(r, (r + 1) % n)] for r in range(n)})
    assert all(f"rank {r}: forward Recv" in str(err.value) for r in range(n))


def test_collectives_entered_in_different_orders_deadlock():
    group = (0, 1)
    sched = {0: [coll(0, "a", group), coll(0, "b", group)], 1: [coll(1, "b", group), coll(1, "a", group)]}
    _check_collectives(sched)  # members and ops agree: only the order is wrong
    with pytest.raises(ConfigError, match="would deadlock"):
        _simulate(sched)


def test_a_collective_waits_for_a_member_blocked_on_a_receive():
    # stuck: rank 0 sends to rank 2 after a collective that rank 2 reaches only after that send
    group = (0, 1, 2)
    stuck = {0: [coll(0, "a", group), send(0, 2)], 1: [coll(1, "a", group)], 2: [recv(2, 0), coll(2, "a", group)]}
    with pytest.raises(ConfigError, match="rank 2: forward Recv"):
        _simulate(stuck)
    fine = {0: [send(0, 2), coll(0, "a", group)], 1: [coll(1, "a", group)], 2: [recv(2, 0), coll(2, "a", group)]}
    _simulate(fine)


def test_many_ranks_and_subgroup_collectives_finish():
    n = 64
    sched = {r: [coll(r, "all", range(n)), coll(r, f"pair{r // 2}", (r - r % 2, r - r % 2 + 1)),
                 send(r, (r + 1) % n, 1), recv(r, (r - 1) % n, 1), coll(r, "end", range(n))] for r in range(n)}
    _simulate(sched)


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
