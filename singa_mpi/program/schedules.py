"""Pipeline schedules: the order in which a rank runs its micro-batches' passes in a training step (pure).

A pipelined plan (:mod:`singa_mpi.planner.pipeline`) holds every sub-layer once per micro-batch; a
schedule orders a rank's forward (``F m``) and backward (``B m``) slots over its stage's layers:

* GPipe: ``F 0 .. F M-1``, then ``B 0 .. B M-1``: every stage holds the activations of all ``M``
  micro-batches until its backward;
* 1F1B (PipeDream-flush): stage ``s`` of ``S`` first runs ``min(S - 1 - s, M)`` forwards, then one
  forward and one backward in turn, then the backwards left: at most ``S - s`` micro-batches'
  activations held at once.

Both leave every stage idle for the same share of the step, ``(S - 1) / (M + S - 1)`` with equal
stages (the bubble).  The gradients of the micro-batches add up in each param (a layer's blocks
share its params) and the sync strategy's calls follow the last of them, so the step's one sync and
update see the whole batch's gradient, as unpipelined.  A rank's stage is where its first layer sits
in the net's order; ranks whose first layer is the same (a data-split stage) share a stage.  The
proof (:mod:`.verify`) then checks the schedule like any other program: one whose sends and
receives would cross is refused before a rank starts.
"""
from __future__ import annotations

from singa_mpi.planner.pipeline import GPIPE, ONE_F_ONE_B
from singa_mpi.program.actions import Action, Local, Release, RunQueued
from singa_mpi.program.passes import backward_pass, forward_pass
from singa_mpi.program.units import Unit

FORWARD_SLOT, BACKWARD_SLOT = "F", "B"


def slots(schedule: str, micro_batches: int, stage: int, stages: int) -> list[tuple[str, int]]:
    """The (F or B, micro-batch) slots of stage ``stage`` of ``stages`` in order."""
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
    last = order[-1][1]  # the micro-batch whose backward ends the rank's step
    bounded = plan.pipeline.schedule == ONE_F_ONE_B
    actions: list[Action] = [Local("zero-grads")]
    for kind, micro in order:
        mine = by_micro.get(micro, [])
        if kind == FORWARD_SLOT:
            actions += forward_pass(mine, "forward", train=True)
            continue
        # GPipe: the weight gradients wait for the last backward's exchanges, then run as one GEMM per
        # param over every micro-batch queued so far (one product of a few rows costs nearly what the
        # whole batch's does, and that exchange is where a stage waits for the next one).  1F1B: each
        # micro-batch's run at the end of its backward, so that its activations can go
        actions += [a for a in backward_pass(mine) if micro == last or not isinstance(a, RunQueued)]
        if bounded and micro != last:
            actions.append(RunQueued())
        actions.append(Release(micro, tuple(unit.name for unit in mine)))
    return actions + [Local("finish-grads")]


def slot_times(schedule: str, micro_batches: int, stages: int) -> dict[int, list[tuple[int, str, int]]]:
    """Per stage, its slots as (time, F or B, micro-batch) when every slot takes one unit of time: a
    forward after the same micro-batch's forward on the stage before, a backward after its backward on
    the stage after (the last stage: after its own forward).  The picture of the schedule that
    ``plan`` prints; its idle units are the bubble."""
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
                if kind == FORWARD_SLOT:
                    before = ("F", s - 1, micro) if s > 0 else None
                else:
                    before = ("B", s + 1, micro) if s < stages - 1 else ("F", s, micro)
                if before is not None and before not in ends:
                    break
                start = max(clock[s], ends[before] if before is not None else 0)
                placed[s].append((start, kind, micro))
                clock[s] = ends[(kind, s, micro)] = start + 1
                progress = True
    return placed


def timeline(plan) -> list[str]:
    """A pipelined plan's schedule as text: a row per rank, a column per unit of time, ``F3``/``B3``
    the forward/backward of micro-batch 3 over the rank's layers, ``.`` idle."""
    pipe = plan.pipeline
    stage = stages_of(plan)
    stages = max(stage.values()) + 1
    placed = slot_times(pipe.schedule, pipe.micro_batches, stages)
    length = max(t + 1 for row in placed.values() for t, _, _ in row)
    width = max(3, len(str(pipe.micro_batches - 1)) + 2)
    lines = [f"pipeline: schedule {pipe.schedule}, {pipe.micro_batches} micro-batches over {stages} stage(s); "
             f"idle share with equal stages {(stages - 1) / (pipe.micro_batches + stages - 1):.0%} "
             f"(the bubble: (S-1)/(M+S-1))"]
    for rank in sorted(stage):
        cells = ["."] * length
        for t, kind, micro in placed[stage[rank]]:
            cells[t] = f"{kind}{micro}"
        lines.append(f"  rank {rank:<3} stage {stage[rank]:<3}" + "".join(c.ljust(width) for c in cells).rstrip())
    return lines


__all__ = ["slots", "stages_of", "pipelined_train", "slot_times", "timeline", "FORWARD_SLOT", "BACKWARD_SLOT"]
