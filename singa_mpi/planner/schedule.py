"""Each rank's communication schedule for one training step, and its proof of safety.

The schedule lists, per rank and in execution order, every communication
operation of a step: the forward pass, the backward pass (reverse order) and
the parameter synchronisation that the runtime really runs (gradient buckets
and/or node-shared memory, see :mod:`.syncs`).  Its bytes follow the
communicator's convention (:mod:`singa_mpi.communication.base`), so the
prediction can be checked against a run's measured table.  :func:`verify` checks that

* every Send has exactly one Recv with the same peer pair, tag, shape and dtype;
* every collective has the same operation and members on all of them, and
  each member enters the collectives of a communicator group in the same order;
* the per-rank sequences cannot deadlock: a simulation with non-blocking sends,
  blocking receives and blocking collectives runs to completion.

A plan that fails is rejected with a ConfigError naming the layers.
"""
from __future__ import annotations

import dataclasses
import hashlib
import math
import re

from singa_mpi.errors import ConfigError
from singa_mpi.planner.plan import Plan, SubLayer
from singa_mpi.planner.syncs import SHARED_MEMORY, buckets, shared_memory_bytes, shared_memory_syncs

FORWARD, BACKWARD, PARAMS = "forward", "backward", "params"


@dataclasses.dataclass(frozen=True)
class CommOp:
    """One communication call on one rank."""

    rank: int
    op: str  # Send, Recv, Bcast, Reduce, Scatterv, Gatherv, Allgatherv, Reduce_scatter, Alltoallv, Allreduce
    peer: int | None  # for Send/Recv
    group: tuple[int, ...]  # members of a collective (both ranks for Send/Recv)
    root: int | None
    tag: int | None
    shape: tuple[int, ...]  # Send/Recv: the message; collectives: this rank's local buffer
    dtype: str
    layer: str  # sub-layer name, or the parameter name for Allreduce
    direction: str
    key: str  # identifies the matching operation on the other ranks
    send_bytes: int
    recv_bytes: int

    def describe(self) -> str:
        who = f"peer {self.peer}" if self.peer is not None else f"group {list(self.group)}"
        tag = f" tag {self.tag}" if self.tag is not None else ""
        return f"{self.direction} {self.op} {who}{tag} {self.dtype}{list(self.shape)} ({self.layer})"


def _root(exchange) -> int | None:
    if exchange.forward_op in ("Bcast", "Scatterv"):
        return next(iter(exchange.holders))
    if exchange.forward_op == "Gatherv":
        return next(iter(exchange.needs))
    return None


def _exchange_ops(sub: SubLayer, direction: str) -> CommOp:
    ex = sub.exchange
    forward = direction == FORWARD
    rank = sub.rank
    sent, received = ex.sent_by(rank), ex.received_by(rank)
    if not forward:
        sent, received = received, sent
    if sub.role in ("bridge_src", "bridge_dst"):
        is_sender = (sub.role == "bridge_src") == forward
        peer = ex.group[0] if ex.group[1] == rank else ex.group[1]
        op = "Send" if is_sender else "Recv"
        return CommOp(rank, op, peer, ex.group, None, 2 * ex.id + (0 if forward else 1), sub.out_shape,
                      ex.dtype, sub.name, direction, f"{direction}:{ex.id}", sent, received)
    op = ex.forward_op if forward else ex.backward_op
    return CommOp(rank, op, None, ex.group, _root(ex), None, sub.out_shape, ex.dtype, sub.name, direction,
                  f"{direction}:{ex.id}", sent, received)


def _ring(nbytes: int, size: int) -> int:
    """What a ring Allreduce sends (and receives) per rank (communication.base.ring_bytes)."""
    return (2 * nbytes * (size - 1)) // size if size > 1 else 0


def _sync_ops(plan: Plan, rank: int, method: str) -> list[CommOp]:
    """The parameter synchronisation calls of ``rank`` (after backward, in the runtime's order)."""
    if plan.phase != "train":
        return []
    ops = []
    for bucket in buckets(plan, method):
        if rank in bucket.ranks:
            moved = _ring(4 * bucket.size, len(bucket.ranks))
            ops.append(CommOp(rank, "Iallreduce", None, bucket.ranks, None, None, (bucket.size,), "float32",
                              bucket.label, PARAMS, f"params:{bucket.label}", moved, moved))
    if shared_memory_syncs(plan, method):
        everyone = tuple(range(plan.nranks))
        size = sum(s.size for s in shared_memory_syncs(plan, method))
        fence = dict(peer=None, group=everyone, root=None, tag=None, shape=(size,), dtype="float32",
                     direction=PARAMS, send_bytes=0, recv_bytes=0)
        ops.append(CommOp(rank, "Barrier(shm)", layer="shm(gradients)", key="params:shm-gradients", **fence))
        ops.append(CommOp(rank, "sum(shm)", None, (rank,), None, None, (size,), "float32", "shm(gradients)",
                          PARAMS, f"params:shm-sum@{rank}", 0, shared_memory_bytes(plan, rank)))
        ops.append(CommOp(rank, "Barrier(shm)", layer="shm(values)", key="params:shm-values", **fence))
    return ops


def rank_schedule(plan: Plan, rank: int, method: str = SHARED_MEMORY) -> list[CommOp]:
    """The communication calls of ``rank`` in one step of ``plan``'s phase, in order.

    ``method``: how world-replicated params are synchronised (see :mod:`.syncs`)."""
    subs = [s for s in plan.on_rank(rank) if s.exchange is not None or (s.row_group and plan.phase == "train")]
    ops = [_layer_op(s, FORWARD) for s in subs]
    if plan.phase == "train":
        ops += [_layer_op(s, BACKWARD) for s in reversed(subs)
                if (s.exchange.with_backward if s.exchange is not None else s.needs_grad)]
    return ops + _sync_ops(plan, rank, method)


def _layer_op(sub: SubLayer, direction: str) -> CommOp:
    return _exchange_ops(sub, direction) if sub.exchange is not None else _statistics_op(sub, direction)


def _statistics_op(sub: SubLayer, direction: str) -> CommOp:
    """A batch-statistics layer's sum over the workers holding the batch's other rows: two float64
    values per channel (Σx, Σx² forward; Σdy, Σdy·x̂ backward), only in training (tests use the
    running statistics)."""
    channels = sub.out_shape[1] if len(sub.out_shape) > 1 else 1
    moved = _ring(2 * channels * 8, len(sub.row_group))
    return CommOp(sub.rank, "Allreduce", None, sub.row_group, None, None, (2, channels), "float64",
                  f"{sub.origin}(statistics)", direction, f"{direction}:statistics:{sub.origin}", moved, moved)


def schedules(plan: Plan, method: str = SHARED_MEMORY) -> dict[int, list[CommOp]]:
    return {rank: rank_schedule(plan, rank, method) for rank in range(plan.nranks)}


def schedule_lines(plan: Plan, method: str = SHARED_MEMORY) -> list[str]:
    """The whole job's schedule (every rank's calls), one line per call."""
    return [f"{plan.phase}: rank {op.rank}: {op.describe()}" for ops in schedules(plan, method).values()
            for op in ops]


def table_label(name: str) -> str:
    """The row of the communication table a call is counted in: one per connection layer or sync
    (a collective's sub-layers ``x@0``, ``x@1`` share the row ``x``)."""
    return re.sub(r"@\d+$", "", name)


def predicted_bytes(plan: Plan, method: str = SHARED_MEMORY) -> dict[int, dict[str, int]]:
    """Bytes per step each rank moves (sent + received), per row of the communication table."""
    result: dict[int, dict[str, int]] = {}
    for rank, ops in schedules(plan, method).items():
        row = result.setdefault(rank, {})
        for op in ops:
            label = table_label(op.layer)
            row[label] = row.get(label, 0) + op.send_bytes + op.recv_bytes
    return result


def digest(lines: list[str]) -> str:
    """A short digest of schedule lines, identical on every rank of a consistent job."""
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def verify(plan: Plan, method: str = SHARED_MEMORY) -> None:
    """ConfigError if the schedule is unpaired, inconsistent or could deadlock."""
    sched = schedules(plan, method)
    _check_pairs(sched)
    _check_collectives(sched)
    _simulate(sched)


def _check_pairs(sched: dict[int, list[CommOp]]) -> None:
    sends = {(o.rank, o.peer, o.tag): o for ops in sched.values() for o in ops if o.op == "Send"}
    recvs = {(o.peer, o.rank, o.tag): o for ops in sched.values() for o in ops if o.op == "Recv"}
    for key in sends.keys() | recvs.keys():
        s, r = sends.get(key), recvs.get(key)
        if s is None or r is None:
            lone = s or r
            raise ConfigError(f"unpaired bridge: {lone.describe()} on rank {lone.rank} has no matching "
                              f"{'Recv' if s else 'Send'}")
        if (math.prod(s.shape), s.dtype) != (math.prod(r.shape), r.dtype):
            raise ConfigError(f"bridge {s.layer} -> {r.layer}: sends {s.dtype}{list(s.shape)} but the receiver "
                              f"expects {r.dtype}{list(r.shape)}")


def _check_collectives(sched: dict[int, list[CommOp]]) -> None:
    seen: dict[str, CommOp] = {}
    members: dict[str, set[int]] = {}
    for ops in sched.values():
        for o in ops:
            if o.op in ("Send", "Recv"):
                continue
            first = seen.setdefault(o.key, o)
            if (o.op, o.group, o.root) != (first.op, first.group, first.root):
                raise ConfigError(f"collective mismatch: {o.describe()} on rank {o.rank} vs "
                                  f"{first.describe()} on rank {first.rank}")
            members.setdefault(o.key, set()).add(o.rank)
    for key, ranks in members.items():
        op = seen[key]
        if ranks != set(op.group):
            missing = sorted(set(op.group) - ranks)
            raise ConfigError(f"collective {op.describe()}: ranks {missing} of its group never call it")


def _simulate(sched: dict[int, list[CommOp]]) -> None:
    """Run the schedule abstractly; ConfigError naming the stuck operations if it blocks.

    Sends never block, a Recv waits for its Send, a collective for every member to reach it.  Work
    list: a rank runs until it blocks; a Send wakes its receiver, the last arrival at a collective
    wakes every member.  Each op is visited a bounded number of times (O(ops + members)), where
    re-scanning every rank until nothing moves grew as ranks^2 per collective."""
    pos = {rank: 0 for rank in sched}
    posted: set[tuple] = set()
    waiting_recv: dict[tuple, int] = {}  # (src, dst, tag) -> the rank blocked on it
    arrived: dict[str, int] = {}  # collective key -> members that have reached it
    ready = list(sched)
    while ready:
        rank = ready.pop()
        ops = sched[rank]
        while pos[rank] < len(ops):
            op = ops[pos[rank]]
            if op.op == "Send":
                key = (op.rank, op.peer, op.tag)
                posted.add(key)
                if key in waiting_recv:
                    ready.append(waiting_recv.pop(key))
            elif op.op == "Recv":
                key = (op.peer, op.rank, op.tag)
                if key not in posted:
                    waiting_recv[key] = rank
                    break
            else:
                count = arrived.get(op.key, 0) + 1
                arrived[op.key] = count
                if count < len(op.group):
                    break  # the last member to arrive moves everybody on
                for member in op.group:
                    pos[member] += 1
                    if member != rank:
                        ready.append(member)
                continue
            pos[rank] += 1
    if any(pos[r] < len(ops) for r, ops in sched.items()):
        stuck = [f"rank {r}: {sched[r][pos[r]].describe()}" for r in sched if pos[r] < len(sched[r])]
        raise ConfigError("the communication schedule would deadlock: " + "; ".join(stuck))
