"""A job's plans and programs, for every phase it runs and every way its params may sync (pure, no MPI).

The launcher computes this once, before any communication: each phase's plan of one worker group, each
rank's program under each sync method the job may take, every one of them proved deadlock-free, and
the digest of their calls that every rank votes on.  The worker runtime then executes the programs it
was given, so what ran is what was proved.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

from singa_mpi.algorithms import make_algorithm
from singa_mpi.errors import ConfigError
from singa_mpi.planner.pipeline import refused_schedule
from singa_mpi.planner.plan import Plan, partition
from singa_mpi.planner.syncs import methods_of
from singa_mpi.program import verify as proof
from singa_mpi.program.build import SERVERS, Program, programs
from singa_mpi.program.rules import schedule_digest, schedule_line


@dataclasses.dataclass(frozen=True)
class JobPrograms:
    """Each phase's plan and, per sync method, every rank's program (all proved).

    ``method``: the sync method the launch chose for world-replicated params (None: the runtime
    chooses, as when a test builds a worker by hand)."""

    plans: Mapping[str, Plan]
    programs: Mapping[tuple[str, str], Mapping[int, Program]]  # (phase, method) -> rank -> program
    method: str | None = None

    @property
    def methods(self) -> tuple[str, ...]:
        """The sync methods programs were built for (servers aside), in the order built."""
        return tuple(dict.fromkeys(method for _, method in self.programs if method != SERVERS))

    def program(self, phase: str, method: str, rank: int) -> Program:
        return self.programs[(phase, method)][rank]

    def schedule_lines(self, method: str) -> list[str]:
        """Every phase's communication calls under ``method``, one line each (what the vote digests)."""
        return [schedule_line(phase, call) for phase in sorted(self.plans)
                for prog in self.programs[(phase, method)].values() for call in prog.calls()]

    def digest(self, method: str) -> str:
        return schedule_digest(self.schedule_lines(method))


def job_programs(cfg, nworkers: int, phases, servers: bool = False, method: str | None = None) -> JobPrograms:
    """Plan each of ``phases`` for ``nworkers`` workers per group and build and prove every rank's
    program for each sync method (``servers``: also the sync through server ranks).  ConfigError
    naming the layers when a plan cannot run or its programs could deadlock."""
    algorithm = make_algorithm(cfg.proto.train_one_batch)
    plans, built = {}, {}
    for phase in phases:
        plans[phase] = partition(cfg, nworkers, phase)
        for each in methods_of(plans[phase]) + ((SERVERS,) if servers else ()):
            built[(phase, each)] = programs(plans[phase], algorithm, each)
            try:
                proof.verify({rank: list(prog.actions) for rank, prog in built[(phase, each)].items()})
            except ConfigError as err:
                raise refused_schedule(cfg, plans[phase], err) from None
    return JobPrograms(plans, built, method)


__all__ = ["JobPrograms", "job_programs"]
