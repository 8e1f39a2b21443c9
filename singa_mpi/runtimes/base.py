"""The runtime interface: what the trainer needs from "where the job runs"."""
from __future__ import annotations

from typing import Protocol

from singa_mpi.net import Net
from singa_mpi.params import Param
from singa_mpi.sync.base import SyncStrategy
from singa_mpi.tracing import Tracer


class Runtime(Protocol):
    """One process's view of a job: its nets, its parameter sync, its reductions.

    rank, size: this worker's location ID and the number of workers in its group.
    """

    rank: int
    size: int
    is_root: bool  # logs, writes metrics and checkpoints
    tracer: Tracer

    def build_net(self, phase: str) -> Net:
        """This worker's part of the ``phase`` net (params allocated, shared across phases)."""

    def sync(self) -> SyncStrategy:
        """The strategy that sums and updates the train net's params (after ``build_net("train")``)."""

    def owned_params(self) -> list[Param]:
        """What this worker updates (whole params, shards or flat chunks): checkpoints store their
        updater state."""

    def contributes(self, param: Param) -> bool:
        """Whether this worker is the one that reports ``param``'s shard in a checkpoint."""

    def begin_step(self, step: int) -> None: ...

    def reduce_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        """Sums over the group's workers (every worker gets them)."""

    def gather_object(self, value) -> list | None:
        """Every worker's ``value`` on the root, None elsewhere (checkpoints)."""

    def any(self, flag: bool) -> bool:
        """True everywhere if true on any worker (stop signals)."""

    def barrier(self) -> None:
        """Wait for every worker (aligns the timelines' clocks)."""

    def comm_seconds(self) -> float: ...

    def report(self, steps: int, debug: bool = False) -> str | None:
        """The end-of-run communication table (root; the run's bookkeeping rows with ``debug``), or None."""

    def predict_step(self):
        """The cost model's step for this run's plan on the root (``--profile``), a line saying why there
        is none, or None off the root (collective)."""

    def close(self) -> None:
        """Release communicators and shared memory (before MPI_Finalize)."""
