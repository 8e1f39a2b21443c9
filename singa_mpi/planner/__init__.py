"""Partition planning: pure functions from a job and a worker count to a Plan (no MPI)."""
from singa_mpi.planner.chunk import chunk, chunks
from singa_mpi.planner.plan import Exchange, ParamShard, ParamSync, Plan, SubLayer, plan

__all__ = ["chunk", "chunks", "plan", "Plan", "SubLayer", "Exchange", "ParamShard", "ParamSync"]
