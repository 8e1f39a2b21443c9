"""Predicted step time of a plan: kernel times and communicator rates in, milliseconds out.  No MPI.

The model reads every rank's program (:mod:`singa_mpi.program.build`): the actions the runtime
executes, in its order, the same list the pre-flight proof, the digest and the plan printout read.
It walks them with a clock per rank:

* ``Compute``: a layer's forward or backward adds its measured kernel time (:mod:`.kernels`); a layer
  that reads data adds its output's bytes at the memory bandwidth.  The weight-gradient products of a
  layer whose params no other rank sums with (a stage's, a feature shard's) wait in the runtime's queue
  (``_setup_queue``): their time is added at the next ``RunQueued`` (while an exchange travels, or in a
  pipeline's W slot) or at ``finish-grads``, not in the backward (a replicated param's products are
  computed when its sum starts, right after the backward: counted there);
* a send (a bridge's Isend) leaves when the sender gets there and costs it the latency; the receive
  ends at ``max(own clock, sender's clock + latency + bytes / bandwidth)``;
* a collective starts when its last member arrives and ends for every member its time later: an
  exchange's from the most bytes a member moves (an Alltoallv at the calibrated Alltoallv's pace, the
  others at a concat's Allgatherv's), an Allreduce (a gradient bucket, a layer's batch statistics) as
  a ring of calibrated Allreduce steps, the node-shared memory's barriers at once, and a rank's sum of
  the others' gradients in node memory by the bytes it reads at the memory bandwidth;
* a non-blocking call (a backward exchange, a gradient bucket) runs beside what follows it until its
  ``Wait``; a rank runs one gradient bucket at a time, first come (the earliest ready: every member
  has started it), first served;
* ``Update`` reads and writes each param this rank updates (``UPDATE_PASSES`` passes).

On several nodes (``rates`` a :class:`~singa_mpi.cost.rates.Network`), a call whose ranks span nodes
takes the network's calibrated rates, one within a node the node's own.

The step is the last rank's clock.  Priced are the passes kernels are timed for, forward and backward:
BP's steps and BPTT's (BP over the unrolled copies).  CD's positive, negative, top-down and gradient
passes are not timed, so a CD program is refused (:class:`NotPriced`).  What this leaves out, so where
the prediction can be wrong: the cores a rank shares with others (a 2-core machine at 4 ranks), the
Python between layers (a few µs each), MPI progress of non-blocking calls (modelled as fully
overlapped) and the cache effects of running layers in sequence (approximated: kernels of a step that
outgrows the last-level cache are timed with it emptied, :mod:`.kernels`).
"""
from __future__ import annotations

import dataclasses
import heapq
import math

import numpy as np

from singa_mpi.cost.kernels import KernelTimes, is_source
from singa_mpi.cost.rates import Network, Rates
from singa_mpi.errors import ConfigError
from singa_mpi.planner.chunk import chunk
from singa_mpi.planner.plan import Plan
from singa_mpi.planner.syncs import shared_memory_syncs
from singa_mpi.program.actions import Action, Comm, Compute, Local, RunQueued, SyncGradients, Update, Wait
from singa_mpi.program.build import programs
from singa_mpi.program.passes import NON_BLOCKING
from singa_mpi.program.verify import RECEIVES, SENDS, first_open, waited_for

UPDATE_PASSES = 5  # an SGD update with history: read value, grad, history; write value, history
PRICED = ("forward", "backward")  # the passes kernels are timed for
BLOCKING = {started: op for op, started in NON_BLOCKING.items()}  # a backward exchange's op, as calibrated


class NotPriced(ConfigError):
    """A program with a pass the model has no kernel times for (a request the model cannot answer:
    one line, the configuration's exit code)."""

    def __init__(self, passes: list[str]):
        self.passes = passes
        super().__init__(f"{self.reason()}: expected a BP or BPTT job (kBP, kBPTT)")

    def reason(self) -> str:
        return (f"the cost model times the layers' {' and '.join(PRICED)} passes only; this step also makes "
                f"{', '.join(self.passes)} passes")


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


def predict(plan: Plan, method: str, kernels: KernelTimes, rates: Rates | Network, algorithm=None) -> StepCost:
    """The predicted step of ``plan``'s phase under param sync ``method`` (``algorithm``: the job's;
    None: BP); ``rates`` of one node, or a :class:`Network` whose messages between nodes take the
    network's rates.  NotPriced for a program with passes other than forward and backward (CD)."""
    net = rates if isinstance(rates, Network) else Network(rates)
    actions = {rank: prog.actions for rank, prog in programs(plan, algorithm, method).items()}
    unpriced = sorted({a.pass_ for steps in actions.values() for a in steps if isinstance(a, Compute)} - set(PRICED))
    if unpriced:
        raise NotPriced(unpriced)
    walk = Walk(plan, method, kernels, net)
    walk.run(actions)
    step = max(walk.clock)
    sync = step - max(walk.backward_done) if plan.phase == "train" else 0.0
    return StepCost(step, max(walk.busy), sync, list(walk.costs.values()), net.source, walk.clock)


def updated_items(plan: Plan, method: str, rank: int) -> int:
    """Float32 items ``rank``'s update touches: its chunk of each param summed in node memory, and
    each other trained param it holds, once however many of its sub-layers share it."""
    shm = shared_memory_syncs(plan, method)
    in_shm = {(s.name, s.offsets) for s in shm}
    mine = sum(hi - lo for lo, hi in (chunk(s.size, plan.nranks, rank) for s in shm))
    local = {(shard.name, shard.offsets): shard.size for sub in plan.on_rank(rank) for shard in sub.params
             if shard.trained and (shard.name, shard.offsets) not in in_shm}
    return mine + sum(local.values())


class Walk:
    """Every rank's clock through its program, and what the ranks wait for from each other: the
    messages sent so far on each channel, the members arrived at each collective.

    The ranks' actions are taken in the order of their clocks, the earliest first, as they would
    happen: so a collective is priced when its last member arrives, and a gradient bucket after
    every bucket that was ready before it, behind those of them that share a member (each bucket
    has its own communicator, and ranks whose backward finishes params in another order start
    their buckets in another order)."""

    def __init__(self, plan: Plan, method: str, kernels: KernelTimes, net: Network):
        n = plan.nranks
        self.plan, self.method, self.kernels, self.net = plan, method, kernels, net
        self.subs = {sub.name: sub for sub in plan.sublayers}
        self.clock, self.busy, self.backward_done = [0.0] * n, [0.0] * n, [0.0] * n
        self.costs = {sub.origin: LayerCost(sub.origin) for sub in plan.sublayers if sub.origin is not None}
        self.messages: dict[tuple, list[float]] = {}  # (src, dst, tag) -> when each message sent arrives
        self.receives: dict[tuple, int] = {}  # (src, dst, tag) -> receives started
        self.arrivals: dict[str, dict[int, tuple[float, Comm]]] = {}  # call key -> member -> (clock, call)
        self.ends: dict[str, float] = {}  # call key -> when the collective ends (once every member arrived)
        self.started: dict[tuple[int, str, str], list] = {}  # (rank, layer, op) of non-blocking calls -> tickets
        self.ring_free = [0.0] * n  # when each rank's previous gradient bucket ends
        self.queued = [0.0] * n  # seconds of weight-gradient products waiting in each rank's queue
        self.synced = {(s.name, s.offsets) for s in plan.param_syncs}
        self.blocked: dict[tuple, list[int]] = {}  # ("message", channel) or ("collective", key) -> ranks waiting
        self.woken: list[int] = []  # ranks whose wait the last action may have ended

    def run(self, programs: dict[int, tuple[Action, ...]]) -> None:
        """Every program to its end, one action at a time, the rank with the earliest clock first."""
        position = dict.fromkeys(programs, 0)
        waiting: dict[int, tuple] = {}  # rank -> the ticket of the call it stopped at
        queue = [(0.0, rank) for rank, actions in programs.items() if actions]
        while queue:
            _, rank = heapq.heappop(queue)
            ticket = waiting.pop(rank, None) or self.start(rank, programs[rank][position[rank]])
            if ticket is not None and not self.finish(rank, ticket):
                waiting[rank] = ticket
                self.blocked.setdefault(first_open(ticket, self.ended)[:2], []).append(rank)
            else:
                position[rank] += 1
                if position[rank] < len(programs[rank]):
                    heapq.heappush(queue, (self.clock[rank], rank))
            for other in self.woken:
                heapq.heappush(queue, (self.clock[other], other))
            self.woken.clear()
        if waiting:  # the programs were proved deadlock-free: a walk that stops is a bug here
            raise RuntimeError(f"the cost model's walk is stuck at {waiting}")

    # ---------------------------------------------------------------- one action

    def start(self, rank: int, action: Action) -> tuple | None:
        """Perform ``action`` on ``rank``'s clock; what it must wait for before it ends (a ticket)."""
        if isinstance(action, Compute):
            self.compute(rank, action)
        elif isinstance(action, Comm):
            return self.call(rank, action)
        elif isinstance(action, Wait):
            return waited_for(self.started.pop((rank, action.layer, action.op), []))
        elif isinstance(action, SyncGradients):
            self.backward_done[rank] = self.clock[rank]
        elif isinstance(action, Update):
            self.clock[rank] += self.net.local.copy(UPDATE_PASSES * 4 * updated_items(self.plan, self.method, rank))
        elif isinstance(action, RunQueued) or (isinstance(action, Local) and action.what == "finish-grads"):
            self.clock[rank] += self.queued[rank]
            self.busy[rank] += self.queued[rank]
            self.queued[rank] = 0.0
        return None  # GradsFinal, zero-grads

    def finish(self, rank: int, ticket: tuple) -> bool:
        """Whether what ``ticket`` waits for has happened; if so the rank's clock moves to its end."""
        parts = ticket[1] if ticket[0] == "all" else (ticket,)  # "all": several receives, one Wait
        ends = [self.end_of(part) for part in parts]
        if any(end is None for end in ends):
            return False
        self.clock[rank] = max([self.clock[rank], *ends])  # the last to end
        return True

    def ended(self, ticket: tuple) -> bool:
        return self.end_of(ticket) is not None

    def end_of(self, ticket: tuple) -> float | None:
        """When what ``ticket`` waits for ends, once known."""
        if ticket[0] == "message":
            arrived = self.messages.get(ticket[1], [])
            end = arrived[ticket[2]] if len(arrived) > ticket[2] else None
        else:
            end = self.ends.get(ticket[1])
        return end

    def wake(self, what: tuple) -> None:
        self.woken += self.blocked.pop(what, [])

    def compute(self, rank: int, action: Compute) -> None:
        sub = self.subs[action.layer]
        deferred = 0.0
        if action.pass_ == "backward":
            kernel = self.kernels.of(self.plan, sub)
            seconds = kernel.backward
            if sub.params and all((p.name, p.offsets) not in self.synced for p in sub.params):
                deferred = kernel.weights  # into the queue (the runtime's _setup_queue)
        elif is_source(sub):  # a layer that reads data: its output copied once
            seconds = self.net.local.copy(2 * 4 * math.prod(sub.out_shape))
        else:
            seconds = self.kernels.of(self.plan, sub).forward
        self.clock[rank] += seconds - deferred
        self.busy[rank] += seconds - deferred
        self.queued[rank] += deferred
        layer = self.costs[sub.origin]
        setattr(layer, action.pass_, max(getattr(layer, action.pass_), seconds))

    def call(self, rank: int, call: Comm) -> tuple | None:
        """A send leaves now; a receive or a collective gives the ticket that ends it, which its
        ``Wait`` takes when the call does not block."""
        if call.op in SENDS:
            self.send(rank, call)
            return None
        if call.op in RECEIVES:
            channel = (call.peer, rank, call.tag)
            ticket = ("message", channel, self.receives.get(channel, 0))
            self.receives[channel] = ticket[2] + 1
        else:
            members = self.arrivals.setdefault(call.key, {})
            members[rank] = (self.clock[rank], call)
            if len(members) == len(call.group):
                self.price(call.key, members)
            ticket = ("collective", call.key)
        if call.blocking:
            return ticket
        self.started.setdefault((rank, call.layer, call.op), []).append(ticket)
        return None

    def send(self, rank: int, call: Comm) -> None:
        p2p = self.net.among(call.group).p2p
        seconds = p2p.time(call.send_bytes)
        channel = (rank, call.peer, call.tag)
        self.messages.setdefault(channel, []).append(self.clock[rank] + seconds)
        self.clock[rank] += p2p.latency
        self.costs[self.subs[call.layer].exchange.dst_layer].comm += seconds
        self.wake(("message", channel))

    # ---------------------------------------------------------------- collectives

    def price(self, key: str, members: dict[int, tuple[float, Comm]]) -> None:
        """When the collective ``key`` ends: its last member arrived just now."""
        call = next(iter(members.values()))[1]
        start = max(clock for clock, _ in members.values())
        if call.op == "Iallreduce":  # a gradient bucket: after the buckets its members run already
            start = max([start] + [self.ring_free[rank] for rank in call.group])
        end = self.ends[key] = start + self.seconds(call, [c for _, c in members.values()])
        if call.op == "Iallreduce":
            for rank in call.group:
                self.ring_free[rank] = end
        self.wake(("collective", key))

    def seconds(self, call: Comm, calls: list[Comm]) -> float:
        """The time of one collective, from its members' calls (each with its own bytes)."""
        rates = self.net.among(call.group)
        if call.op == "Barrier(shm)":
            return 0.0
        if call.op in ("sum(shm)", "read(shm)"):  # a rank alone, reading the others' gradients (terms) in node memory
            return self.net.local.copy(call.recv_bytes)
        if call.op in ("Allreduce", "Iallreduce"):
            nbytes = np.dtype(call.dtype).itemsize * math.prod(call.shape)
            return rates.ring_allreduce(nbytes, len(call.group))
        most = max(max(c.send_bytes, c.recv_bytes) for c in calls)
        seconds = rates.exchange(BLOCKING.get(call.op, call.op)).time(most)  # Ialltoallv: an Alltoallv's
        if call.by != "sync":  # the sync's calls (deterministic mode's gather) count in the sync's line
            self.costs[self.subs[call.layer].exchange.dst_layer].comm += seconds
        return seconds
