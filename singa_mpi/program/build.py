"""Programs: each rank's ordered actions for one phase of one algorithm, from a plan (pure, no MPI).

The algorithm's passes over the rank's units (:mod:`.passes`), and in training the sync
strategy's calls (:func:`sync_tail`): each gradient bucket started where backward finishes its
params, then the sums' waits, the update and the node-shared memory's fences, as laid out by
:mod:`singa_mpi.planner.syncs`.  Rules (tags, roots, ring bytes) come from :mod:`.rules`.
"""
from __future__ import annotations

import dataclasses

from singa_mpi.planner.syncs import (DETERMINISTIC_SHARED, FORMED_LABEL, GATHER_LABEL, SHARED_ROWS_LABEL, buckets,
                                     formed_counts, gather_counts, shared_memory_bytes, shared_memory_syncs)
from singa_mpi.program import rules
from singa_mpi.program.actions import PARAMS, Action, Comm, GradsFinal, SyncGradients, Update, Wait
from singa_mpi.program.passes import number_calls, passes
from singa_mpi.program.schedules import pipelined_train
from singa_mpi.program.units import units_of_plan

SERVERS = "servers"  # the sync of workers beside server ranks (Sandblaster, Downpour)


@dataclasses.dataclass(frozen=True)
class Program:
    """One rank's actions for one phase, in order."""

    phase: str
    rank: int
    actions: tuple[Action, ...]

    def calls(self) -> list[Comm]:
        """The communication calls, in order."""
        return [a for a in self.actions if isinstance(a, Comm)]

    def lines(self) -> list[str]:
        return [str(a) for a in self.actions]


def sync_tail(plan, rank: int, method: str, actions: list[Action]) -> list[Action]:
    """``actions`` with the sync strategy's calls: each gradient bucket started after the last
    ``GradsFinal`` of its params on this rank, then the sums' waits, the update and, with node-shared
    memory, its fences (:mod:`singa_mpi.planner.syncs` lays the buckets out).

    ``method`` DETERMINISTIC: the Allgatherv of the gradient terms and the one of the formed tiles, the
    sync's calls (its strategy makes them when the sync's wait begins); DETERMINISTIC_SHARED: the
    terms' fence and this rank's reading of the others' terms, the update, the values' fence.
    ``method`` SERVERS (workers beside parameter-server ranks): the sums are the servers'; a
    worker's messages to them (:mod:`singa_mpi.sync.servers`) answer whichever server replies
    first, so they are no fixed list, and the tail is the sync's wait and the update alone."""
    if method == SERVERS:  # (deterministic mode: the workers gather their terms first; the servers combine)
        return list(actions) + [SyncGradients()] + _gather_rows(plan, rank, method)[:1] + [Update()]
    if method == DETERMINISTIC_SHARED:
        return list(actions) + [SyncGradients()] + _shared_rows(plan, rank, method) + [Update()] + \
            _values_fence(plan, rank, method)
    mine = [b for b in buckets(plan, method) if rank in b.ranks]
    last_use: dict[int, int] = {}  # bucket index -> position of its last GradsFinal
    params_of = {u.name: set(u.params) for u in units_of_plan(plan, rank)}
    for position, action in enumerate(actions):
        if isinstance(action, GradsFinal):
            for bucket in mine:
                if params_of.get(action.layer, set()) & set(bucket.shards):
                    last_use[bucket.index] = position
    starts: dict[int, list[Comm]] = {}
    for bucket in mine:
        moved = rules.ring_bytes(4 * bucket.size, len(bucket.ranks))
        call = Comm(rank, "Iallreduce", None, bucket.ranks, None, None, (bucket.size,), "float32", bucket.label,
                    PARAMS, f"params:{bucket.label}", moved, moved, blocking=False, by="sync")
        starts.setdefault(last_use.get(bucket.index, len(actions) - 1), []).append(call)
    result: list[Action] = []
    for position, action in enumerate(actions):
        result.append(action)
        result += starts.get(position, [])
    if not actions:
        result += [c for calls in starts.values() for c in calls]
    result.append(SyncGradients())
    result += _gather_rows(plan, rank, method)
    shm = shared_memory_syncs(plan, method)
    if shm:
        everyone = tuple(range(plan.nranks))
        size = sum(s.size for s in shm)
        result.append(_fence(rank, everyone, size, "shm(gradients)"))
        result.append(Comm(rank, "sum(shm)", None, (rank,), None, None, (size,), "float32", "shm(gradients)", PARAMS,
                           f"params:shm-sum@{rank}", 0, shared_memory_bytes(plan, rank), by="sync"))
    result += [Wait(b.label, "Iallreduce") for b in mine]
    result.append(Update())
    if shm:
        result.append(_fence(rank, everyone, size, "shm(values)"))
    return result


def _gather_rows(plan, rank: int, method: str) -> list[Comm]:
    """Deterministic mode: the Allgatherv of every rank's per-row gradient terms, then the one of the
    gradient tiles each rank formed from them (none elsewhere)."""
    calls = []
    for counts, label in ((gather_counts(plan, method), GATHER_LABEL), (formed_counts(plan, method), FORMED_LABEL)):
        if any(counts):
            everyone = tuple(range(plan.nranks))
            sent = 4 * counts[rank] * (plan.nranks - 1)
            received = 4 * (sum(counts) - counts[rank])
            calls.append(Comm(rank, "Allgatherv", None, everyone, None, None, (counts[rank],), "float32", label,
                              PARAMS, f"params:{label}", sent, received, by="sync"))
    return calls


def _shared_rows(plan, rank: int, method: str) -> list[Comm]:
    """Deterministic mode on one node: the fence after every rank wrote its terms to the shared
    buffer, and this rank's reading of the others' terms there."""
    counts = gather_counts(plan, method)
    if not any(counts):
        return []
    everyone = tuple(range(plan.nranks))
    return [_fence(rank, everyone, sum(counts), SHARED_ROWS_LABEL),
            Comm(rank, "read(shm)", None, (rank,), None, None, (sum(counts),), "float32", SHARED_ROWS_LABEL, PARAMS,
                 f"params:shm-read@{rank}", 0, 4 * (sum(counts) - counts[rank]), by="sync")]


def _values_fence(plan, rank: int, method: str) -> list[Comm]:
    counts = formed_counts(plan, method)
    return [_fence(rank, tuple(range(plan.nranks)), sum(counts), "shm(values)")] if any(counts) else []


def _fence(rank: int, everyone: tuple[int, ...], size: int, label: str) -> Comm:
    return Comm(rank, "Barrier(shm)", None, everyone, None, None, (size,), "float32", label, PARAMS,
                f"params:{label}", 0, 0, by="sync")


# ---------------------------------------------------------------- whole programs

def program(plan, rank: int, algorithm, method: str) -> Program:
    """``rank``'s program for ``plan``'s phase: the algorithm's passes, in training with the sync."""
    units = units_of_plan(plan, rank)
    train = plan.phase == "train"
    if train and plan.pipeline is not None:  # micro-batches in the schedule's order (BP only: the check)
        actions = number_calls(pipelined_train(plan, rank, units))
    else:
        actions = number_calls(passes(algorithm, units, train))
    if train:
        actions = sync_tail(plan, rank, method, actions)
    return Program(plan.phase, rank, tuple(actions))


def programs(plan, algorithm, method: str) -> dict[int, Program]:
    return {rank: program(plan, rank, algorithm, method) for rank in range(plan.nranks)}


__all__ = ["Program", "program", "programs", "sync_tail", "SERVERS"]
