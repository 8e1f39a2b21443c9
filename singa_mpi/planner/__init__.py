"""Partition planning: pure functions from a job and a worker count to a Plan (no MPI).

:func:`plan` partitions the net (:mod:`.plan`) and proves the resulting
ranks' step programs safe (:mod:`.schedule`, :mod:`singa_mpi.program`) for the sync method the
runtime will use (:mod:`.syncs`).
"""
from singa_mpi.errors import ConfigError
from singa_mpi.planner.chunk import chunk, chunks
from singa_mpi.planner.pipeline import refused_schedule
from singa_mpi.planner.plan import Exchange, ParamShard, ParamSync, Plan, SubLayer, partition
from singa_mpi.planner.schedule import verify
from singa_mpi.planner.syncs import ALLREDUCE, METHODS, SHARED_MEMORY


def plan(cfg, nworkers: int, phase: str = "train", method: str = SHARED_MEMORY, algorithm=None) -> Plan:
    """Partition the ``phase`` net of ``cfg`` over ``nworkers``; ConfigError if impossible or unsafe
    (the ranks' programs for ``algorithm``, the job's; None: BP)."""
    the_plan = partition(cfg, nworkers, phase)
    try:
        verify(the_plan, method, algorithm)
    except ConfigError as err:
        raise refused_schedule(cfg, the_plan, err) from None
    return the_plan


__all__ = ["chunk", "chunks", "plan", "partition", "verify", "Plan", "SubLayer", "Exchange", "ParamShard",
           "ParamSync", "SHARED_MEMORY", "ALLREDUCE", "METHODS"]
