"""Each rank's communication in one step, read from its program (:mod:`singa_mpi.program`).

The calls, their bytes (the communicator's convention, :mod:`singa_mpi.communication.base`) and
the proof that they fit together all come from the ranks' programs, so the prediction can be
checked against a run's measured table and the proof covers what the runtime executes.  A plan
that fails is rejected with a ConfigError naming the layers (:mod:`singa_mpi.program.verify`).
"""
from __future__ import annotations

import re

from singa_mpi.planner.plan import Plan
from singa_mpi.planner.syncs import SHARED_MEMORY
from singa_mpi.program import verify as proof
from singa_mpi.program.actions import BACKWARD, FORWARD, PARAMS, Comm
from singa_mpi.program.build import Program, programs
from singa_mpi.program.rules import schedule_digest as digest
from singa_mpi.program.rules import schedule_line

CommOp = Comm  # one communication call on one rank (the name the schedule used before programs)

__all__ = ["FORWARD", "BACKWARD", "PARAMS", "CommOp", "schedules", "rank_schedule", "schedule_lines",
           "table_label", "predicted_bytes", "digest", "verify", "step_programs"]


def step_programs(plan: Plan, method: str = SHARED_MEMORY, algorithm=None) -> dict[int, Program]:
    """Every rank's program for ``plan``'s phase (``algorithm``: the job's; None: BP)."""
    return programs(plan, algorithm, method)


def schedules(plan: Plan, method: str = SHARED_MEMORY, algorithm=None) -> dict[int, list[Comm]]:
    """Every rank's communication calls, in order."""
    return {rank: prog.calls() for rank, prog in step_programs(plan, method, algorithm).items()}


def rank_schedule(plan: Plan, rank: int, method: str = SHARED_MEMORY, algorithm=None) -> list[Comm]:
    """The communication calls of ``rank`` in one step of ``plan``'s phase, in order."""
    from singa_mpi.program.build import program

    return program(plan, rank, algorithm, method).calls()


def schedule_lines(plan: Plan, method: str = SHARED_MEMORY, algorithm=None) -> list[str]:
    """The whole job's schedule (every rank's calls), one line per call."""
    return [schedule_line(plan.phase, op) for ops in schedules(plan, method, algorithm).values()
            for op in ops]


def table_label(name: str) -> str:
    """The row of the communication table a call is counted in: one per connection layer or sync
    (a collective's sub-layers ``x@0``, ``x@1`` share the row ``x``)."""
    return re.sub(r"@\d+$", "", name)


def predicted_bytes(plan: Plan, method: str = SHARED_MEMORY, algorithm=None) -> dict[int, dict[str, int]]:
    """Bytes per step each rank moves (sent + received), per row of the communication table."""
    result: dict[int, dict[str, int]] = {}
    for rank, ops in schedules(plan, method, algorithm).items():
        row = result.setdefault(rank, {})
        for op in ops:
            label = table_label(op.layer)
            row[label] = row.get(label, 0) + op.send_bytes + op.recv_bytes
    return result


def verify(plan: Plan, method: str = SHARED_MEMORY, algorithm=None) -> None:
    """ConfigError if the ranks' programs are unpaired, inconsistent or could deadlock."""
    proof.verify({rank: list(prog.actions) for rank, prog in step_programs(plan, method, algorithm).items()})
