"""How replicated parameter shards will be synchronised: pure functions of a plan.

The worker runtime chooses one of two methods for the shards held by every
worker of the group (``ParamSync.ranks`` = all):

* ``shared_memory`` (all workers on one node): values live once in node-shared
  memory; rank ``r`` sums and updates chunk ``chunk(size, n, r)`` of each
  param, reading the other ranks' gradient copies of that chunk, or -- for a
  batch-factored weight used once per rank -- its row chunk of the product
  ``a @ b`` over the stacked factors of every rank's batch rows;
* ``allreduce``: gradients fused into buckets of up to ``BUCKET_BYTES`` and
  summed with non-blocking Allreduce;
* ``deterministic`` (deterministic mode): no partial sums at all: every worker's per-row gradient
  terms gathered in batch order by one Allgatherv; each worker forms its share of the gradients'
  canonical tiles from the whole batch's rows, as one worker alone forms every tile, and a second
  Allgatherv brings the formed tiles to every worker (:mod:`singa_mpi.planner.deterministic`);
* ``deterministic_shared_memory`` (deterministic mode, every worker on one node): the same terms and
  tiles through node-shared memory: the terms written to one shared buffer, the values kept once on
  the node, each worker forming and updating its own tiles (fences instead of the two Allgatherv).

Shards replicated on a subset of the workers always take the bucket path.
The runtime lays out its buffers from these functions, and the schedule
predicts the step's traffic from them, so both describe the same calls.
"""
from __future__ import annotations

import dataclasses
import math

from singa_mpi.errors import ConfigError
from singa_mpi.params import gradient_tiles
from singa_mpi.planner.chunk import chunk
from singa_mpi.planner.plan import ParamSync, Plan

SHARED_MEMORY = "shared_memory"
ALLREDUCE = "allreduce"
DETERMINISTIC = "deterministic"
DETERMINISTIC_SHARED = "deterministic_shared_memory"
METHODS = (SHARED_MEMORY, ALLREDUCE)  # the ways the default mode may take
DETERMINISTIC_METHODS = (DETERMINISTIC_SHARED, DETERMINISTIC)  # deterministic mode's: one node, or messages


def methods_of(plan: Plan) -> tuple[str, ...]:
    """The sync methods a run of ``plan`` may take (the launch picks one from the world it finds)."""
    return DETERMINISTIC_METHODS if plan.deterministic is not None else METHODS
GATHER_LABEL = "allgatherv(gradient rows)"
FORMED_LABEL = "allgatherv(formed gradients)"
SHARED_ROWS_LABEL = "shm(gradient rows)"

# gradient fusion: big enough to amortise latency, small enough to overlap with backward
BUCKET_BYTES = 8 << 20

ShardKey = tuple[str, tuple[tuple[int, int], ...]]


@dataclasses.dataclass(frozen=True)
class Bucket:
    """Gradients summed by one Iallreduce: shards with the same holders, in backward order."""

    index: int
    ranks: tuple[int, ...]
    shards: tuple[ShardKey, ...]
    size: int  # float32 items

    @property
    def label(self) -> str:
        return f"allreduce(bucket{self.index})"


def _use_order(plan: Plan) -> dict[str, int]:
    """Param name -> position of its first use in the global order."""
    order = dict.fromkeys(shard.name for sub in plan.sublayers for shard in sub.params)
    return {name: i for i, name in enumerate(order)}


def _kept(plan: Plan, key: tuple, compute):
    """``compute()`` once per plan and key: every rank's schedule asks the same question of the plan."""
    table = plan.__dict__.setdefault("_sync_cache", {})
    if key not in table:
        table[key] = compute()
    return table[key]


def shared_memory_syncs(plan: Plan, method: str) -> list[ParamSync]:
    """The syncs that go through node-shared memory under ``method``."""
    if method != SHARED_MEMORY:
        return []
    everyone = tuple(range(plan.nranks))
    return list(_kept(plan, ("shm",), lambda: [s for s in plan.param_syncs if s.ranks == everyone]))


def buckets(plan: Plan, method: str) -> list[Bucket]:
    """Every bucket of the step, for all ranks, in the order each member starts them."""
    return list(_kept(plan, ("buckets", method), lambda: _buckets(plan, method)))


def _buckets(plan: Plan, method: str) -> list[Bucket]:
    shm = {(s.name, s.offsets) for s in shared_memory_syncs(plan, method)}
    shm |= set(gathered_rows(plan, method))
    syncs = [s for s in plan.param_syncs if (s.name, s.offsets) not in shm]
    position = _use_order(plan)
    # reverse of first use: the order in which backward finishes them
    syncs.sort(key=lambda s: (s.ranks, -position.get(s.name, 0), s.name))
    result: list[Bucket] = []
    shards: list[ShardKey] = []
    ranks, size = None, 0
    for sync in syncs:
        if shards and (ranks != sync.ranks or size + sync.size > BUCKET_BYTES // 4):
            result.append(Bucket(len(result), ranks, tuple(shards), size))
            shards, size = [], 0
        ranks = sync.ranks
        shards.append((sync.name, sync.offsets))
        size += sync.size
    if shards:
        result.append(Bucket(len(result), ranks, tuple(shards), size))
    return result


def factored_rows(plan: Plan) -> dict[ShardKey, list[int]]:
    """World-replicated 2-D shards summed from gradient factors, with each rank's batch rows.

    A shard qualifies when, on every rank, exactly one sub-layer holds it and that
    sub-layer adds its gradient as one product over its batch rows.  Computed once per plan
    (every rank's schedule asks: asked per rank, planning grew as ranks x sub-layers per rank)."""
    return _kept(plan, ("factored",), lambda: _factored_rows(plan))


def _factored_rows(plan: Plan) -> dict[ShardKey, list[int]]:
    per_rank: dict[ShardKey, dict[int, list]] = {}
    for sub in plan.sublayers:
        for shard in sub.params:
            key = (shard.name, shard.offsets)
            per_rank.setdefault(key, {}).setdefault(sub.rank, []).append((sub, shard))
    result = {}
    for key, holders in per_rank.items():
        if len(holders) != plan.nranks or len(key[1]) != 2:
            continue
        uses = [holders[r] for r in range(plan.nranks)]
        if all(len(u) == 1 and u[0][1].batch_factored for u in uses):
            result[key] = [u[0][0].region.nrows for u in uses]
    return result


def row_width(shape: tuple[int, ...]) -> int:
    """Floats per batch row of a param's per-row gradient terms in deterministic mode: a 2-D (a, b)
    param's gradient is leftᵀ·right of rows a and b wide (an inner product's output gradient and
    input), a 1-D param's the column sums of rows as wide as it (a bias)."""
    return sum(shape) if len(shape) == 2 else shape[0]


@dataclasses.dataclass(frozen=True)
class Gathered:
    """A param's gradient terms in deterministic mode: ``uses`` sets of them per rank (the layers that
    train it there: an unrolled layer's copies), each of ``terms[rank]`` terms of ``width`` floats;
    ``kind`` the layers' ``deterministic_terms`` ("rows" or "pairs": one or two per batch row,
    :func:`row_width` each; "blocks": one per canonical block, the whole flattened gradient)."""

    terms: tuple[int, ...]
    width: int
    kind: str
    uses: int = 1


def gathered_rows(plan: Plan, method: str) -> dict[ShardKey, Gathered]:
    """Deterministic mode: the world-replicated shards whose gradient terms are gathered, in the order
    every rank packs them (sorted by name)."""
    if plan.deterministic is None or method in METHODS:  # (servers too: the workers gather, then send)
        return {}
    return dict(_kept(plan, ("gathered",), lambda: _gathered_rows(plan)))


def _gathered_rows(plan: Plan) -> dict[ShardKey, Gathered]:
    everyone = tuple(range(plan.nranks))
    replicated = sorted((s.name, s.offsets) for s in plan.param_syncs if s.ranks == everyone)
    uses: dict[ShardKey, dict[int, list[tuple[str, int]]]] = {key: {} for key in replicated}
    for sub in plan.sublayers:
        for shard in sub.params:
            key = (shard.name, shard.offsets)
            if key in uses and shard.terms:  # "": held by a layer that adds nothing to it
                rows = sub.region.nrows
                count = {"blocks": plan.deterministic.count(rows), "pairs": 2 * rows}.get(shard.terms, rows)
                uses[key].setdefault(sub.rank, []).append((shard.terms, count))
    result = {}
    for key, per_rank in uses.items():
        mine = [per_rank.get(rank, []) for rank in everyone]
        training = [each for each in mine if each]  # a worker whose layers add nothing to it: no terms
        kinds = {kind for each in training for kind, _ in each}
        if len(kinds) != 1 or len({len(each) for each in training}) != 1 or any(
                len({count for _, count in each}) != 1 for each in training):
            raise ConfigError(f"param {key[0]!r} is trained by layers whose gradient terms differ between or "
                              f"within the workers: expected every worker's layers that train it to be split "
                              f"alike in deterministic mode")
        shape = tuple(hi - lo for lo, hi in key[1])
        kind = kinds.pop()
        width = math.prod(shape) if kind == "blocks" else row_width(shape)
        result[key] = Gathered(tuple(each[0][1] if each else 0 for each in mine), width, kind, len(training[0]))
    return result


def gather_counts(plan: Plan, method: str) -> list[int]:
    """Floats each rank contributes to the step's one Allgatherv of gradient terms (deterministic mode)."""
    counts = [0] * plan.nranks
    for spec in gathered_rows(plan, method).values():
        for rank, n in enumerate(spec.terms):
            counts[rank] += spec.uses * n * spec.width
    return counts


def forming_tiles(plan: Plan, method: str) -> dict[ShardKey, tuple[tuple[int, int, int], ...]]:
    """Deterministic mode: who forms what.  Each gathered param's gradient in canonical tiles
    (``params.gradient_tiles``: fixed by its shape), as ``(first row, end row, rank)``; the tiles of
    every param, in the order of :func:`gathered_rows`, are dealt to the ranks in contiguous runs of
    about equal work (the GEMMs' multiply-adds), so that each rank forms its run into one contiguous
    range of the gradients laid end to end and one in-place Allgatherv completes them on every rank."""
    gathered = gathered_rows(plan, method)
    if not gathered:
        return {}
    tiles = [(key, lo, hi, work) for key, spec in gathered.items() for lo, hi, work in _tiles_of(key, spec)]
    total, done, rank, result = sum(t[3] for t in tiles) or 1, 0, 0, {key: [] for key in gathered}
    for key, lo, hi, work in tiles:
        # the rank whose share of the work this tile's middle falls in
        rank = max(rank, min(plan.nranks - 1, int((done + work / 2) * plan.nranks // total)))
        result[key].append((lo, hi, rank))
        done += work
    return {key: tuple(each) for key, each in result.items()}


def _tiles_of(key: ShardKey, spec: Gathered) -> list[tuple[int, int, int]]:
    """(first row, end row, multiply-adds) of each canonical tile of a gathered param's gradient."""
    shape = tuple(hi - lo for lo, hi in key[1])
    paired = spec.kind != "blocks" and len(shape) == 2
    rows = sum(spec.terms) * spec.uses
    inner = math.prod(shape[1:]) if shape else 1
    return [(lo, hi, (hi - lo) * inner * rows) for lo, hi in gradient_tiles(shape, paired)]


def formed_counts(plan: Plan, method: str) -> list[int]:
    """Floats of gradient each rank forms and contributes to the step's second Allgatherv."""
    counts = [0] * plan.nranks
    for key, tiles in forming_tiles(plan, method).items():
        inner = math.prod(hi - lo for lo, hi in key[1][1:])
        for lo, hi, rank in tiles:
            counts[rank] += (hi - lo) * inner
    return counts


def shared_memory_bytes(plan: Plan, rank: int) -> int:
    """Bytes ``rank`` reads per step from the other ranks' gradient memory (shared-memory method)."""
    n = plan.nranks
    factored = factored_rows(plan)
    total = 0
    for sync in shared_memory_syncs(plan, SHARED_MEMORY):
        key = (sync.name, sync.offsets)
        if key in factored:
            rows = factored[key]
            height, width = (hi - lo for lo, hi in sync.offsets)
            r0, r1 = chunk(height, n, rank)
            if r1 > r0:
                total += 4 * (sum(rows) - rows[rank]) * ((r1 - r0) + width)
        else:
            lo, hi = chunk(sync.size, n, rank)
            total += 4 * (n - 1) * (hi - lo)
    return total
