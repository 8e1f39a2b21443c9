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
  micro-batch 0's weight gradients before micro-batch 1's backward, which the first stage waits for.  The gradients of the micro-batches add up in each param (a layer's blocks
share its params) and the sync strategy's calls follow the last of them, so the step's one sync and
update see the whole batch's gradient, as unpipelined.  A rank's stage is where its first layer sits
in the net's order; ranks whose first layer is the same (a data-split stage) share a stage.  The
proof (:mod:`.verify`) then checks the schedule like any other program: one whose sends and
receives would cross is refused before a rank starts.
"""
from __future__ import annotations

from singa_mpi.planner.pipeline import GPIPE, ONE_F_ONE_B, ZERO_BUBBLE
from singa_mpi.program.actions import Action, Local, Release, RunQueued
from singa_mpi.program.passes import backward_pass, forward_pass
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
    of its own first layer (micro-batch 0's).  Ranks that meet in a collective (a stage split over
    them, or an exchange between a split stage and its neighbour) take the earliest stage among them:
    a collective's members must reach their micro-batches' calls in one order.  Kept with the plan:
    every rank's program asks."""
    kept = plan.__dict__.get("_stages")
    if kept is not None:
        return kept
    order = {name: i for i, name in enumerate(plan.origins)}
    first: dict[int, int] = {}
    for sub in plan.sublayers:
        if sub.origin is not None and sub.micro == 0:
            first.setdefault(sub.rank, order[sub.origin])
    changed = True
    while changed:  # the earliest start spreads over chains of collectives
        changed = False
        for ex in plan.exchanges:
            if len(ex.group) > 2 or ex.forward_op != "Send":
                earliest = min(first[rank] for rank in ex.group)
                for rank in ex.group:
                    if first[rank] != earliest:
                        first[rank], changed = earliest, True
    starts = sorted(set(first.values()))
    kept = plan.__dict__["_stages"] = {rank: starts.index(start) for rank, start in first.items()}
    return kept


def pipelined_train(plan, rank: int, units: list[Unit]) -> list[Action]:
    """BP's training step of ``rank`` over micro-batches, in the order of ``plan.pipeline``'s schedule."""
    by_micro: dict[int, list[Unit]] = {}
    for unit in units:
        by_micro.setdefault(unit.sub.micro, []).append(unit)
    stage = stages_of(plan)
    order = slots(plan.pipeline.schedule, plan.pipeline.micro_batches, stage[rank], max(stage.values()) + 1)
    deferred = plan.pipeline.schedule == ZERO_BUBBLE  # the W slots say when the queue runs
    last = order[-1][1]  # the micro-batch whose backward ends the rank's step
    bounded = plan.pipeline.schedule == ONE_F_ONE_B
    actions: list[Action] = [Local("zero-grads")]
    for kind, micro in order:
        mine = by_micro.get(micro, [])
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


def timeline(plan) -> list[str]:
    """A pipelined plan's schedule as text: a row per rank, a column per unit of time, ``F3``/``B3``
    the forward/backward of micro-batch 3 over the rank's layers (ZB: ``W3`` its weight gradients
    apart from its backward), ``.`` idle."""
    pipe = plan.pipeline
    stage = stages_of(plan)
    stages = max(stage.values()) + 1
    placed = slot_times(pipe.schedule, pipe.micro_batches, stages)
    length = max(t + 1 for row in placed.values() for t, _, _ in row)
    width = max(3, len(str(pipe.micro_batches - 1)) + 2)
    busy = sum(len(placed[s]) for s in range(stages))
    how = (" (each slot one unit: W as long as F or B)" if pipe.schedule == ZERO_BUBBLE
           else " (the bubble: (S-1)/(M+S-1))")
    lines = [f"pipeline: schedule {pipe.schedule}, {pipe.micro_batches} micro-batches over {stages} stage(s); "
             f"idle share with equal stages {1 - busy / (stages * length):.0%}{how}"]
    for rank in sorted(stage):
        cells = ["."] * length
        for t, kind, micro in placed[stage[rank]]:
            cells[t] = f"{kind}{micro}"
        lines.append(f"  rank {rank:<3} stage {stage[rank]:<3}" + "".join(c.ljust(width) for c in cells).rstrip())
    return lines


__all__ = ["slots", "zero_bubble_orders", "stages_of", "pipelined_train", "slot_times", "timeline", "FORWARD_SLOT", "BACKWARD_SLOT", "WEIGHT_SLOT"]
