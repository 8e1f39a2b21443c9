"""Pipeline schedules: the order in which a rank runs its micro-batches' passes in a training step (pure).

A pipelined plan (:mod:`singa_mpi.planner.pipeline`) holds every sub-layer once per micro-batch; a
schedule orders a rank's forward (``F m``) and backward (``B m``) slots over its stage's layers:

* GPipe: ``F 0 .. F M-1``, then ``B 0 .. B M-1``: every stage holds the activations of all ``M``
  micro-batches until its backward;
* 1F1B (PipeDream-flush): stage ``s`` of ``S`` first runs ``min(S - 1 - s, M)`` forwards, then one
  forward and one backward in turn, then the backwards left: at most ``S - s`` micro-batches'
  activations held at once.

Both leave every stage idle for the same share of the step, ``(S - 1) / (M + S - 1)`` with equal
stages (the bubble).  A backward computes the gradient a stage hands back (its inputs') at once and
queues its layers' weight-gradient products; GPipe runs the queue at the last backward, 1F1B after each
micro-batch's backward.  A third schedule fills the bubble with that queue, as zero-bubble schedules
do (Qi et al., "Zero Bubble Pipeline Parallelism", ZB-H1):

* ZB (``zb``): 1F1B's order of forwards and backwards, and a weight-gradient slot (``W m``) where a
  stage would otherwise wait for its next forward or backward, or where it would hold more than ``S``
  micro-batches (1F1B's most, on its first stage); the queued products of several micro-batches run
  as one GEMM per param.  With two stages and two micro-batches the last stage no longer computes
  micro-batch 0's weight gradients before micro-batch 1's backward, which the first stage waits for.

A fourth lets a rank hold several runs of layers apart in the net (virtual stages; Megatron's
interleaved 1F1B places them round robin, ``plan --auto`` too: :func:`~singa_mpi.planner.pipeline.interleaved_stages`):

* interleaved (``interleaved``): each rank's slots are per micro-batch *and* run of layers (``F m.v``:
  micro-batch ``m``'s forward over virtual stage ``v``, one of the rank's runs), so that a rank works on micro-batch 1's
  first run while the next rank has micro-batch 0's second.  The order is played out with one unit of
  time per slot over every rank at once (:func:`interleaved_orders`): a ready backward first (the
  oldest micro-batch), else the ready forward of the deepest run (the oldest micro-batch), at most one
  micro-batch per virtual stage of the net in flight, else ZB's weight-gradient slots.  A slot of a
  virtual stage split over several ranks is a meeting: its ranks run it in the same unit of time (the
  first to choose it waits for the others), and a connection layer between such a stage and a
  neighbour on fewer ranks sits in the split stage's slot on every member.  An order played out so cannot deadlock
  (each call's partner comes earlier in that play or in the same meeting), and the proof checks it.
  With one run per rank it is a ZB-like schedule over contiguous stages.

The gradients of the micro-batches add up in each param (a layer's blocks
share its params) and the sync strategy's calls follow the last of them, so the step's one sync and
update see the whole batch's gradient, as unpipelined.  A rank's stage is where its first layer sits
in the net's order; ranks whose first layer is the same (a data-split stage) share a stage, as do
ranks that hold parts of one layer and pass data both ways (:func:`stages_of`).  Every exchange of a pipelined step
sends its pieces as point-to-point messages (:func:`~singa_mpi.program.passes.message_calls`), so a
layer split over the workers of two stages (the convnet's conv2 halved on the batch at the cut)
keeps them apart: as a collective it made them meet, one stage.  The
proof (:mod:`.verify`) then checks the schedule like any other program: one whose sends and
receives would cross is refused before a rank starts.
"""
from __future__ import annotations

from singa_mpi.planner.pipeline import GPIPE, INTERLEAVED, ONE_F_ONE_B, ZERO_BUBBLE
from singa_mpi.program.actions import Action, Local, Release, RunQueued
from singa_mpi.program.passes import backward_pass, forward_pass
from singa_mpi.program.rules import MESSAGES
from singa_mpi.program.units import Unit

FORWARD_SLOT, BACKWARD_SLOT, WEIGHT_SLOT = "F", "B", "W"


def slots(schedule: str, micro_batches: int, stage: int, stages: int) -> list[tuple[str, int]]:
    """The (F, B or W, micro-batch) slots of stage ``stage`` of ``stages`` in order (W: ZB only)."""
    if schedule == ZERO_BUBBLE:
        return zero_bubble_orders(micro_batches, stages)[stage]
    forwards = [(FORWARD_SLOT, m) for m in range(micro_batches)]
    backwards = [(BACKWARD_SLOT, m) for m in range(micro_batches)]
    if schedule == GPIPE:
        return forwards + backwards
    if schedule != ONE_F_ONE_B:
        raise ValueError(f"unknown pipeline schedule {schedule!r}")
    warmup = min(stages - 1 - stage, micro_batches)
    order = forwards[:warmup]
    for i in range(micro_batches - warmup):
        order += [forwards[warmup + i], backwards[i]]
    return order + backwards[micro_batches - warmup:]


def zero_bubble_orders(micro_batches: int, stages: int) -> dict[int, list[tuple[str, int]]]:
    """Every stage's ZB slots: 1F1B's forwards and backwards, played out with one unit of time per slot
    (a stage's next slot waits for the slot it needs from its neighbour), and the stage's pending
    weight gradients, all of them in one slot per micro-batch, where the next forward or backward is
    not ready yet, where a forward would hold more than ``stages`` micro-batches, and at the end."""
    plain = {s: slots(ONE_F_ONE_B, micro_batches, s, stages) for s in range(stages)}
    orders: dict[int, list[tuple[str, int]]] = {s: [] for s in range(stages)}
    ends: dict[tuple[str, int, int], int] = {}  # (F or B, stage, micro-batch) -> when it ends
    free_at, pending = dict.fromkeys(range(stages), 0), {s: [] for s in range(stages)}
    done = dict.fromkeys(range(stages), 0)  # how many of its forwards and backwards each has run
    held = dict.fromkeys(range(stages), 0)  # micro-batches forwarded whose weight gradients wait
    clock = 0
    while any(done[s] < len(plain[s]) or pending[s] for s in range(stages)):
        for s in range(stages):
            if free_at[s] > clock:
                continue
            if done[s] < len(plain[s]):
                kind, micro = plain[s][done[s]]
                need = _needs(kind, s, micro, stages)
                ready = need is None or ends.get(need, clock + 1) <= clock
                if ready and not (kind == FORWARD_SLOT and held[s] >= stages):
                    orders[s].append((kind, micro))
                    ends[(kind, s, micro)] = free_at[s] = clock + 1
                    done[s] += 1
                    held[s] += kind == FORWARD_SLOT
                    if kind == BACKWARD_SLOT:
                        pending[s].append(micro)
                    continue
            if pending[s]:
                orders[s] += [(WEIGHT_SLOT, m) for m in pending[s]]
                free_at[s] = clock + len(pending[s])
                held[s] -= len(pending[s])
                pending[s] = []
        clock += 1
    return orders


def _needs(kind: str, stage: int, micro: int, stages: int) -> tuple[str, int, int] | None:
    """The slot a stage's forward or backward of ``micro`` waits for: the forward before it, the
    backward after it (the last stage: its own forward)."""
    if kind == FORWARD_SLOT:
        return (FORWARD_SLOT, stage - 1, micro) if stage > 0 else None
    return (BACKWARD_SLOT, stage + 1, micro) if stage < stages - 1 else (FORWARD_SLOT, stage, micro)


def stages_of(plan) -> dict[int, int]:
    """Each rank's pipeline stage: the position, among the ranks' first layers in the net's order,
    of its own first layer (micro-batch 0's).  Ranks that hold parts of one layer and pass data both
    ways between them (a chain of messages from each to the other: layers split over them on the batch
    and on features in turn) take the earliest stage among them, as do ranks that meet in a collective:
    each must reach its micro-batches' calls in the other's order.  Ranks that only pass data on (a layer split over the
    workers of two stages sends its pieces as messages) keep their own stages.  Kept with the plan:
    every rank's program asks."""
    kept = plan.__dict__.get("_stages")
    if kept is not None:
        return kept
    order = {name: i for i, name in enumerate(plan.origins)}
    first: dict[int, int] = {}
    for sub in plan.sublayers:
        if sub.origin is not None and sub.micro == 0:
            first.setdefault(sub.rank, order[sub.origin])
    for together in _ranks_together(plan):
        earliest = min(first[rank] for rank in together)
        for rank in together:
            first[rank] = earliest
    starts = sorted(set(first.values()))
    kept = plan.__dict__["_stages"] = {rank: starts.index(start) for rank, start in first.items()}
    return kept


def _ranks_together(plan) -> list[set[int]]:
    """Groups of ranks that must share a stage: those that hold parts of one layer and whose forward
    data reaches each other (in one strongly connected set of the graph of who sends to whom), joined
    where a collective's members span several of them.  (Ranks that hand data back and forth through
    layers each holds whole keep their stages: 1F1B's order crosses there, and the proof says so.)"""
    sends_to, joined = _forward_flow(plan)
    reach = {rank: _reachable(rank, sends_to) for rank in sends_to}
    holders: dict[str, set[int]] = {}
    for sub in plan.sublayers:
        if sub.origin is not None and sub.micro == 0:
            holders.setdefault(sub.origin, set()).add(sub.rank)
    for ranks in holders.values():
        for rank in ranks:
            both_ways = {other for other in ranks if other in reach[rank] and rank in reach[other]}
            if both_ways:
                joined.append(both_ways | {rank})
    return _merged(joined, plan.nranks)


def _forward_flow(plan) -> tuple[dict[int, set[int]], list[set[int]]]:
    """(the ranks each rank sends forward data to, the members of each collective) over micro-batch
    0's exchanges (every micro-batch has the same)."""
    sends_to: dict[int, set[int]] = {rank: set() for rank in range(plan.nranks)}
    collectives: list[set[int]] = []
    first_block = {id(sub.exchange): sub.exchange for sub in plan.sublayers
                   if sub.exchange is not None and sub.micro == 0}
    for ex in first_block.values():
        if ex.forward_op != MESSAGES[0]:
            collectives.append(set(ex.group))  # its members meet
            continue
        for src in ex.holders:
            sends_to[src] |= {piece.dst for piece in ex.sends_of(src) if piece.dst != src}
    return sends_to, collectives


def _merged(groups: list[set[int]], nranks: int) -> list[set[int]]:
    """The groups joined wherever they share a rank; those of more than one rank."""
    group_of = {rank: {rank} for rank in range(nranks)}
    for members in groups:
        merged = set().union(*(group_of[rank] for rank in members))
        for rank in merged:
            group_of[rank] = merged
    unique = {id(group): group for group in group_of.values()}
    return [group for group in unique.values() if len(group) > 1]


def _reachable(start: int, edges: dict[int, set[int]]) -> set[int]:
    found, todo = set(), [start]
    while todo:
        for nxt in edges[todo.pop()]:
            if nxt not in found:
                found.add(nxt)
                todo.append(nxt)
    return found


# ---------------------------------------------------------------- interleaved: runs of layers per rank

def virtual_stages(plan) -> tuple[dict[str, int], dict[int, frozenset[int]], dict[int, set[int]]]:
    """The net cut where the workers holding a layer change: (each original layer's virtual stage, the
    ranks of each virtual stage, the virtual stages each one reads from).  Consecutive layers (in the
    net's order) on the same ranks are one virtual stage; a rank holding layers apart holds several."""
    kept = plan.__dict__.get("_virtual_stages")
    if kept is not None:
        return kept
    holders: dict[str, set[int]] = {}
    for sub in plan.sublayers:
        if sub.origin is not None and sub.micro == 0:
            holders.setdefault(sub.origin, set()).add(sub.rank)
    stage_of: dict[str, int] = {}
    ranks: dict[int, frozenset[int]] = {}
    for name in plan.origins:
        if name not in holders:
            continue
        here = frozenset(holders[name])
        if not ranks or ranks[len(ranks) - 1] != here:
            ranks[len(ranks)] = here
        stage_of[name] = len(ranks) - 1
    reads: dict[int, set[int]] = {v: set() for v in ranks}
    for name, node in plan.origins.items():
        for src in getattr(node.conf, "srclayers", ()):
            if src in stage_of and name in stage_of and stage_of[src] != stage_of[name]:
                reads[stage_of[name]].add(stage_of[src])
    kept = plan.__dict__["_virtual_stages"] = (stage_of, ranks, reads)
    return kept


def unit_stage(unit: Unit, plan) -> int:
    """The virtual stage a rank's unit serves: its layer's, or for a connection layer the stage of the
    end of its edge this rank holds (a bridge's sender: the source's; its receiver: the destination's).
    A collective between a stage of one rank and a stage split over several (a layer whole on worker 0
    feeding one split over workers 0 and 1) serves, on every member, the stage that holds the whole
    group, so that its members call it in one slot of that stage (the play's meeting)."""
    stage_of, ranks, _ = virtual_stages(plan)
    sub = unit.sub
    if sub.origin is not None:
        return stage_of[sub.origin]
    ex = sub.exchange
    if sub.role == "collective":  # its members meet: in the one slot of a stage holding the whole group
        for stage in (stage_of[ex.src_layer], stage_of[ex.dst_layer]):
            if ranks[stage] >= set(ex.group):
                return stage
    if sub.role == "bridge_src":
        return stage_of[ex.src_layer]
    if sub.role == "bridge_dst":
        return stage_of[ex.dst_layer]
    return stage_of[ex.src_layer] if sub.rank in ranks[stage_of[ex.src_layer]] else stage_of[ex.dst_layer]


def interleaved_orders(plan) -> dict[int, list[tuple[str, int, int]]]:
    """Every rank's interleaved slots ``(F, B or W, micro-batch, virtual stage)`` in order."""
    return {rank: [slot for _, slot in row] for rank, row in interleaved_play(plan).items()}


def interleaved_play(plan) -> dict[int, list[tuple[int, tuple[str, int, int]]]]:
    """Every rank's interleaved slots with the unit of time each starts at, played out with one unit
    per slot (see the module's docstring).  Kept with the plan: every rank's program asks."""
    kept = plan.__dict__.get("_interleaved")
    if kept is None:
        kept = plan.__dict__["_interleaved"] = _InterleavedPlay(plan).run()
    return kept


Slot = tuple[str, int, int]  # (F, B or W, micro-batch, virtual stage)


class _InterleavedPlay:
    """The play behind :func:`interleaved_play`: every rank's clock, what it ran and what it holds.  A
    slot of a virtual stage on several ranks is a meeting (its ranks call its collectives together):
    the first of them to choose it waits, choosing nothing else, until all of them are free, and all
    run it in the same unit of time, so that every rank meets the others in one order."""

    def __init__(self, plan) -> None:
        _, self.ranks, self.reads = virtual_stages(plan)
        self.feeds: dict[int, set[int]] = {v: set() for v in self.ranks}
        for v, sources in self.reads.items():
            for src in sources:
                self.feeds[src].add(v)
        self.micro = plan.pipeline.micro_batches
        self.limit = len(self.ranks)  # micro-batches in flight per rank: one per virtual stage of the net
        self.mine = {rank: sorted(v for v, holders in self.ranks.items() if rank in holders)
                     for rank in range(plan.nranks)}
        self.todo = {rank: {(kind, m, v) for v in stages for m in range(self.micro)
                            for kind in (FORWARD_SLOT, BACKWARD_SLOT)} for rank, stages in self.mine.items()}
        self.ran: dict[Slot, list[int]] = {}  # slot -> [ranks that ran it, when the last of them ends]
        self.orders: dict[int, list[tuple[int, Slot]]] = {rank: [] for rank in self.mine}
        self.free_at = dict.fromkeys(self.mine, 0)
        # per rank, the micro-batches it started, with how many of their weight-gradient slots are to
        # run: a new one may start only below the limit, a later run of one in flight always may (or
        # nothing would drain)
        self.in_flight: dict[int, dict[int, int]] = {rank: {} for rank in self.mine}
        self.pending: dict[int, list[tuple[int, int]]] = {rank: [] for rank in self.mine}  # backwards without W
        self.meetings: list[Slot] = []  # slots of shared stages chosen, in that order, until all their ranks are free

    def run(self) -> dict[int, list[tuple[int, Slot]]]:
        clock, most = 0, 4 * self.micro * len(self.ranks) * (len(self.ranks) + 2)
        while any(self.todo.values()) or any(self.pending.values()):
            if clock > most:
                raise RuntimeError("interleaved schedule: no progress (a virtual stage that reads a later one?)")
            for rank in self.mine:
                if self.free_at[rank] <= clock and not any(rank in self.ranks[s[2]] for s in self.meetings):
                    self._next(rank, clock)
            self._meet(clock)
            clock += 1
        return self.orders

    def _meet(self, clock: int) -> None:
        """Run each meeting whose ranks are all free (in the order they were chosen) on all of them."""
        for slot in list(self.meetings):
            holders = sorted(self.ranks[slot[2]])
            if all(self.free_at[rank] <= clock for rank in holders):
                self.meetings.remove(slot)
                for rank in holders:
                    self._run(rank, slot, clock)

    def _next(self, rank: int, clock: int) -> None:
        """A ready backward (the oldest micro-batch), else the ready forward of the deepest run (the
        oldest micro-batch), else the weight gradients waiting, one slot each.  A slot of a shared
        stage becomes a meeting."""
        ready = [slot for slot in self.todo[rank] if self._ready(slot, clock)]
        backward = [slot for slot in ready if slot[0] == BACKWARD_SLOT]
        if backward or ready:
            slot = (min(backward, key=lambda s: (s[1], -s[2])) if backward
                    else min(ready, key=lambda s: (-s[2], s[1])))
            if len(self.ranks[slot[2]]) > 1:
                self.meetings.append(slot)
            else:
                self._run(rank, slot, clock)
        elif self.pending[rank]:
            self.orders[rank] += [(clock + i, (WEIGHT_SLOT, m, v)) for i, (m, v) in enumerate(self.pending[rank])]
            self.free_at[rank] = clock + len(self.pending[rank])
            for m, _ in self.pending[rank]:
                self.in_flight[rank][m] -= 1
                if not self.in_flight[rank][m]:
                    del self.in_flight[rank][m]
            self.pending[rank] = []

    def _run(self, rank: int, slot: Slot, clock: int) -> None:
        self.todo[rank].discard(slot)
        self.orders[rank].append((clock, slot))
        entry = self.ran.setdefault(slot, [0, 0])
        entry[0], entry[1] = entry[0] + 1, max(entry[1], clock + 1)
        self.free_at[rank] = clock + 1
        if slot[0] == FORWARD_SLOT:
            self.in_flight[rank].setdefault(slot[1], len(self.mine[rank]))
        else:
            self.pending[rank].append(slot[1:])

    def _done(self, slot: Slot, clock: int) -> bool:
        entry = self.ran.get(slot)
        return entry is not None and entry[0] == len(self.ranks[slot[2]]) and entry[1] <= clock

    def _ready(self, slot: Slot, clock: int) -> bool:
        kind, m, v = slot
        if kind == FORWARD_SLOT:
            if any(m not in self.in_flight[r] and len(self.in_flight[r]) >= self.limit for r in self.ranks[v]):
                return False
            return all(self._done((FORWARD_SLOT, m, src), clock) for src in self.reads[v])
        return self._done((FORWARD_SLOT, m, v), clock) and \
            all(self._done((BACKWARD_SLOT, m, dst), clock) for dst in self.feeds[v])


def _slot_units(plan, rank: int, units: list[Unit]) -> list[tuple[str, int, list[Unit]]]:
    """The rank's slots in the schedule's order, each as (F, B or W, micro-batch, its units): a
    micro-batch's units on the rank; interleaved, those of one virtual stage."""
    if plan.pipeline.schedule == INTERLEAVED:
        groups: dict[tuple[int, int], list[Unit]] = {}
        for unit in units:
            groups.setdefault((unit.sub.micro, unit_stage(unit, plan)), []).append(unit)
        return [(kind, micro, groups.get((micro, stage), [])) for kind, micro, stage in interleaved_orders(plan)[rank]]
    by_micro: dict[int, list[Unit]] = {}
    for unit in units:
        by_micro.setdefault(unit.sub.micro, []).append(unit)
    stage = stages_of(plan)
    order = slots(plan.pipeline.schedule, plan.pipeline.micro_batches, stage[rank], max(stage.values()) + 1)
    return [(kind, micro, by_micro.get(micro, [])) for kind, micro in order]


def pipelined_train(plan, rank: int, units: list[Unit]) -> list[Action]:
    """BP's training step of ``rank`` over micro-batches, in the order of ``plan.pipeline``'s schedule."""
    order = _slot_units(plan, rank, units)
    deferred = plan.pipeline.schedule in (ZERO_BUBBLE, INTERLEAVED)  # the W slots say when the queue runs
    last = order[-1][1]  # the micro-batch whose backward ends the rank's step
    bounded = plan.pipeline.schedule == ONE_F_ONE_B
    actions: list[Action] = [Local("zero-grads")]
    for kind, micro, mine in order:
        if kind == FORWARD_SLOT:
            actions += forward_pass(mine, "forward", train=True)
            continue
        if kind == WEIGHT_SLOT:  # several in a row: one GEMM per param over their products
            if not isinstance(actions[-1], RunQueued):
                actions.append(RunQueued())
            continue
        # GPipe: the weight gradients wait for the last backward's exchanges, then run as one GEMM per
        # param over every micro-batch queued so far (one product of a few rows costs nearly what the
        # whole batch's does, and that exchange is where a stage waits for the next one).  1F1B: each
        # micro-batch's run at the end of its backward, so that its activations can go
        keep_queue = micro == last and not deferred
        actions += [a for a in backward_pass(mine) if keep_queue or not isinstance(a, RunQueued)]
        if bounded and micro != last:
            actions.append(RunQueued())
        # the queued products keep what they multiply; the layers' own buffers go now
        actions.append(Release(micro, tuple(unit.name for unit in mine)))
    return actions + [Local("finish-grads")]


def slot_times(schedule: str, micro_batches: int, stages: int) -> dict[int, list[tuple[int, str, int]]]:
    """Per stage, its slots as (time, F, B or W, micro-batch) when every slot takes one unit of time: a
    forward after the same micro-batch's forward on the stage before, a backward after its backward on
    the stage after (the last stage: after its own forward), a W after the stage's slot before it.
    The picture of the schedule that ``plan`` prints; its idle units are the bubble."""
    orders = {s: slots(schedule, micro_batches, s, stages) for s in range(stages)}
    ends: dict[tuple[str, int, int], int] = {}  # (F or B, stage, micro-batch) -> when it ends
    placed: dict[int, list[tuple[int, str, int]]] = {s: [] for s in range(stages)}
    clock = dict.fromkeys(range(stages), 0)
    progress = True
    while progress:
        progress = False
        for s in range(stages):
            while len(placed[s]) < len(orders[s]):
                kind, micro = orders[s][len(placed[s])]
                before = None if kind == WEIGHT_SLOT else _needs(kind, s, micro, stages)
                if before is not None and before not in ends:
                    break
                start = max(clock[s], ends[before] if before is not None else 0)
                placed[s].append((start, kind, micro))
                clock[s] = ends[(kind, s, micro)] = start + 1
                progress = True
    return placed


def placed_slots(plan) -> dict[int, list[tuple[int, str, int]]]:
    """Per rank, its slots as (unit of time, label, micro-batch) when every slot takes one unit: the
    picture ``plan`` prints and draws.  Labels: ``F3``/``B3``/``W3`` (micro-batch 3's forward,
    backward, weight gradients over the rank's stage); interleaved ``F3.2``: over virtual stage 2."""
    pipe = plan.pipeline
    if pipe.schedule == INTERLEAVED:
        return {rank: [(t, f"{kind}{micro}.{stage}", micro) for t, (kind, micro, stage) in row]
                for rank, row in interleaved_play(plan).items()}
    stage = stages_of(plan)
    placed = slot_times(pipe.schedule, pipe.micro_batches, max(stage.values()) + 1)
    return {rank: [(t, f"{kind}{micro}", micro) for t, kind, micro in placed[stage[rank]]] for rank in sorted(stage)}


def idle_share(plan) -> float:
    """The share of the ranks' time idle in the schedule's timeline with equal slots (:func:`placed_slots`):
    the bubble (S-1)/(M+S-1) for GPipe and 1F1B, less for ZB and interleaved."""
    placed = placed_slots(plan)
    length = max(t + 1 for row in placed.values() for t, _, _ in row)
    return 1 - sum(len(row) for row in placed.values()) / (len(placed) * length)


def stage_count(plan) -> int:
    """The stages of a pipelined plan; of an interleaved plan, its virtual stages."""
    if plan.pipeline.schedule == INTERLEAVED:
        return len(virtual_stages(plan)[1])
    return max(stages_of(plan).values()) + 1


def pipeline_shape(plan) -> tuple[str, int, int, float]:
    """(schedule, micro-batches, stages, :func:`idle_share`) of a pipelined plan, for the run's
    summary; the stages of an interleaved plan are its virtual stages."""
    pipe = plan.pipeline
    return pipe.schedule, pipe.micro_batches, stage_count(plan), idle_share(plan)


def idle_pipeline_note(cfg, workers: int, plan=None) -> str | None:
    """The note ``plan``, ``check -n`` and a training run's start print when the job's pipeline does
    nothing: it sets no micro_batches (one); or, of two micro-batches or more, on ``workers`` workers per
    group: one worker runs the step unpipelined; a training ``plan`` of one stage runs each worker's
    micro-batches one after another, overlapping nothing.  None otherwise (``micro_batches: 1`` written
    out: no pipelining, as asked)."""
    net = cfg.proto.neuralnet
    if not net.HasField("pipeline"):
        return None
    where = f"note: {cfg.where('neuralnet', 'pipeline')}: neuralnet.pipeline"
    if not net.pipeline.HasField("micro_batches"):  # a schedule named, as if it pipelined on its own
        return (f"{where} sets no micro_batches (1 by default): its schedule {net.pipeline.schedule!r} has no "
                f"effect, each step takes the whole batch through the net in one pass (set micro_batches: 2 or "
                f"more to pipeline)")
    if net.pipeline.micro_batches < 2:
        return None
    if workers < 2:
        return (f"{where} has no effect on 1 worker: the step runs unpipelined, on the whole batch (a pipeline "
                f"overlaps stages: runs of layers on different workers; launch with mpiexec -n 2 or more)")
    if plan is not None and plan.pipeline is not None and stage_count(plan) == 1:
        return (f"{where}'s schedule has no effect: every worker starts at the net's first layer, so the net is "
                f"one stage and each worker runs its {plan.pipeline.micro_batches} micro-batches one after another, "
                f"overlapping nothing (place runs of layers on different workers, with location and "
                f"partition_dim: -1, to make stages)")
    return None


def timeline(plan) -> list[str]:
    """A pipelined plan's schedule as text: a row per rank, a column per unit of time, ``F3``/``B3``
    the forward/backward of micro-batch 3 over the rank's layers (ZB: ``W3`` its weight gradients
    apart from its backward; interleaved: ``F3.2`` over virtual stage 2), ``.`` idle."""
    pipe = plan.pipeline
    stage = stages_of(plan)
    placed = placed_slots(plan)
    length = max(t + 1 for row in placed.values() for t, _, _ in row)
    width = max(len(label) for row in placed.values() for _, label, _ in row) + 1
    if pipe.schedule == INTERLEAVED:
        runs = len(virtual_stages(plan)[1])
        over = f"{runs} virtual stage(s) on {plan.nranks} worker(s)"
        how, equal = " (each slot one unit: F, B and W over a virtual stage alike)", "slots"
    else:
        over = f"{max(stage.values()) + 1} stage(s)"
        how = (" (each slot one unit: W as long as F or B)" if pipe.schedule == ZERO_BUBBLE
               else " (the bubble: (S-1)/(M+S-1))")
        equal = "stages"
    lines = [f"pipeline: schedule {pipe.schedule}, {pipe.micro_batches} micro-batches over {over}; "
             f"idle share with equal {equal} {idle_share(plan):.0%}{how}"]
    for rank in sorted(placed):
        cells = ["."] * length
        for t, label, _ in placed[rank]:
            cells[t] = label
        lines.append(f"  rank {rank:<3} stage {stage[rank]:<3}" + "".join(c.ljust(width) for c in cells).rstrip())
    return lines


__all__ = ["slots", "zero_bubble_orders", "stages_of", "pipelined_train", "slot_times", "timeline", "placed_slots",
           "idle_share", "pipeline_shape", "stage_count", "idle_pipeline_note",
           "virtual_stages", "unit_stage", "interleaved_orders", "interleaved_play", "FORWARD_SLOT", "BACKWARD_SLOT", "WEIGHT_SLOT"]
