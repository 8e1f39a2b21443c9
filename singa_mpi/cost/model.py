"""Predicted step time of a plan: kernel times and communicator rates in, milliseconds out.  No MPI.

Every rank's step is replayed in the plan's global order (the order the runtime runs it in):

* a layer adds its measured kernel time (:mod:`.kernels`) to its rank's clock; a layer that reads
  data adds its output's bytes at the memory bandwidth;
* a bridge's Send starts when the sender gets there (non-blocking), and the receiver waits for it:
  ``max(own clock, sender's clock + latency + bytes / bandwidth)``;
* a collective (slice, concat, split) starts when its last member arrives and ends for all members
  the calibrated time of the most bytes a member moves later (an Alltoallv's own calibration for
  Alltoallv, a concat's Allgatherv for the others);
* backward replays the same in reverse, for the layers and exchanges that carry gradients;
* parameter sync as the runtime does it (:mod:`singa_mpi.planner.syncs`): a bucket's Allreduce
  starts when the last of its gradients is ready on every member and runs beside the rest of
  backward, one bucket after another (ring time from the calibrated rates); node-shared sums start
  after a barrier, read the other ranks' gradients at the memory bandwidth, update, and end at a
  barrier; the update reads and writes each param the updater touches.

On several nodes (``rates`` a :class:`~singa_mpi.cost.rates.Network`), a bridge, collective or bucket
whose ranks span nodes takes the network's calibrated rates, one within a node the node's own.

The step is the last rank's clock.  What this leaves out, so where the prediction can be wrong: the
cores a rank shares with others (a 2-core machine at 4 ranks), the Python between layers (a few µs
each), MPI progress of non-blocking calls (modelled as fully overlapped) and the cache effects of
running layers in sequence rather than one at a time.
"""
from __future__ import annotations

import dataclasses
import math

from singa_mpi.cost.kernels import KernelTimes, is_source
from singa_mpi.cost.rates import Network, Rates
from singa_mpi.planner.plan import Exchange, Plan, SubLayer
from singa_mpi.planner.syncs import buckets, shared_memory_bytes, shared_memory_syncs
from singa_mpi.planner.chunk import chunk

UPDATE_PASSES = 5  # an SGD update with history: read value, grad, history; write value, history


@dataclasses.dataclass
class LayerCost:
    """Seconds of one original layer (the slowest rank's part) and of the exchanges into it."""

    name: str
    forward: float = 0.0
    backward: float = 0.0
    comm: float = 0.0


@dataclasses.dataclass
class StepCost:
    step: float  # seconds
    compute: float  # the busiest rank's layer time
    sync: float  # parameter sync and update after the busiest rank's backward (what was not hidden)
    layers: list[LayerCost]
    rates_source: str
    per_rank: list[float]

    def table(self) -> list[str]:
        lines = [f"{'layer':<24} {'forward ms':>10} {'backward ms':>11} {'comm ms':>8}"]
        for c in self.layers:
            lines.append(f"{c.name:<24} {1e3 * c.forward:>10.3f} {1e3 * c.backward:>11.3f} {1e3 * c.comm:>8.3f}")
        lines.append(f"{'param sync + update':<24} {'':>10} {'':>11} {1e3 * self.sync:>8.3f}")
        lines.append(f"predicted step {1e3 * self.step:.2f} ms (busiest rank's layers {1e3 * self.compute:.2f} ms)")
        return lines


def exchange_time(ex: Exchange, rates: Rates) -> float:
    """A collective's time for the most bytes one member moves: an Alltoallv at the calibrated
    Alltoallv's pace, the others (Allgatherv, Bcast, Scatterv, Gatherv) at the concat's Allgatherv's."""
    most = max(max(ex.sent_by(r), ex.received_by(r)) for r in ex.group)
    return rates.exchange(ex.forward_op).time(most)


def bridge_bytes(ex: Exchange) -> int:
    return ex.sent_by(ex.group[0]) or ex.sent_by(ex.group[-1])


def predict(plan: Plan, method: str, kernels: KernelTimes, rates: Rates | Network) -> StepCost:
    """The predicted training step of ``plan`` under param sync ``method``; ``rates`` of one node, or a
    :class:`Network` whose messages between nodes take the network's rates."""
    net = rates if isinstance(rates, Network) else Network(rates)
    rates = net.local  # memory passes: always the node's own
    n = plan.nranks
    clock = [0.0] * n
    busy = [0.0] * n
    costs: dict[str, LayerCost] = {}
    cost_of = lambda name: costs.setdefault(name, LayerCost(name))  # noqa: E731 - a lookup with a default

    def compute(sub: SubLayer, seconds: float, field: str) -> None:
        clock[sub.rank] += seconds
        busy[sub.rank] += seconds
        layer = cost_of(sub.origin)
        setattr(layer, field, max(getattr(layer, field), seconds))

    def replay(subs: list[SubLayer], backward: bool) -> None:
        sent: dict[int, float] = {}
        done: set[int] = set()
        for sub in subs:
            ex = sub.exchange
            if ex is None:
                if backward:
                    compute(sub, kernels.of(plan, sub).backward, "backward")
                    finished[(sub.rank, sub.name)] = clock[sub.rank]
                elif is_source(sub):
                    compute(sub, rates.copy(2 * 4 * math.prod(sub.out_shape)), "forward")
                else:
                    compute(sub, kernels.of(plan, sub).forward, "forward")
                continue
            sender = (sub.role == "bridge_src") != backward
            if sub.role in ("bridge_src", "bridge_dst"):
                if sender:
                    sent[ex.id] = clock[sub.rank]
                    clock[sub.rank] += net.among(ex.group).p2p.latency
                else:
                    seconds = net.among(ex.group).p2p.time(bridge_bytes(ex))
                    clock[sub.rank] = max(clock[sub.rank], sent[ex.id] + seconds)
                    cost_of(ex.dst_layer).comm += seconds
            elif ex.id not in done:
                done.add(ex.id)
                seconds = exchange_time(ex, net.among(ex.group))
                end = max(clock[m] for m in ex.group) + seconds
                for m in ex.group:
                    clock[m] = end
                cost_of(ex.dst_layer).comm += seconds

    for sub in plan.sublayers:  # the table lists layers in the net's order
        if sub.origin is not None:
            cost_of(sub.origin)
    finished: dict[tuple[int, str], float] = {}
    replay(plan.sublayers, backward=False)
    if plan.phase == "train":
        replay([s for s in reversed(plan.sublayers)
                if (s.exchange.with_backward if s.exchange is not None else s.needs_grad)], backward=True)
        after_backward = max(clock)
        _sync(plan, method, net, clock, finished)
        sync = max(clock) - after_backward
    else:
        sync = 0.0
    return StepCost(max(clock), max(busy), sync, list(costs.values()), net.source, clock)


def _sync(plan: Plan, method: str, net: Network, clock: list[float], finished: dict) -> None:
    """Advance the clocks over the parameter sync and the update."""
    rates = net.local
    holders: dict[tuple, list[SubLayer]] = {}
    for sub in plan.sublayers:
        for shard in sub.params:
            holders.setdefault((shard.name, shard.offsets), []).append(sub)
    synced: set[tuple] = set()
    channel = [0.0] * plan.nranks  # when each rank's previous Allreduce ends
    ends = list(clock)
    for bucket in buckets(plan, method):
        ready = max(finished.get((s.rank, s.name), 0.0) for key in bucket.shards for s in holders.get(key, [])
                    if s.rank in bucket.ranks)
        start = max([ready] + [channel[r] for r in bucket.ranks])
        end = start + net.among(bucket.ranks).ring_allreduce(4 * bucket.size, len(bucket.ranks))
        for r in bucket.ranks:
            channel[r] = end
            ends[r] = max(ends[r], end)
        synced.update(bucket.shards)
    for r in range(plan.nranks):
        clock[r] = ends[r]
    shm = shared_memory_syncs(plan, method)
    if shm:
        start = max(clock)
        for r in range(plan.nranks):
            mine = sum(chunk(s.size, plan.nranks, r)[1] - chunk(s.size, plan.nranks, r)[0] for s in shm)
            read = shared_memory_bytes(plan, r)
            clock[r] = start + rates.copy(read) + rates.copy(UPDATE_PASSES * 4 * mine)
        end = max(clock)
        clock[:] = [end] * plan.nranks
        synced.update((s.name, s.offsets) for s in shm)
    # the updates of everything not summed in shared memory: bucketed shards and unshared ones
    shm_keys = {(s.name, s.offsets) for s in shm}
    local: list[dict[tuple, int]] = [{} for _ in range(plan.nranks)]  # a shared param is updated once
    for sub in plan.sublayers:
        for shard in sub.params:
            if shard.trained and (shard.name, shard.offsets) not in shm_keys:
                local[sub.rank][(shard.name, shard.offsets)] = shard.size
    for r in range(plan.nranks):
        clock[r] += rates.copy(UPDATE_PASSES * 4 * sum(local[r].values()))
