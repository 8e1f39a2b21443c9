"""The runtime interface: what the trainer needs from "where the job runs"."""
from __future__ import annotations

from typing import Callable, Protocol

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
    group: int  # this worker's group (several groups: Downpour, Hogwild); 0 otherwise
    groups: int  # the job's worker groups (1: one group)
    evaluates: bool  # runs the test and validation phases and writes checkpoints (group 0's workers)

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

    def begin_training(self, loaded, check_finite: bool) -> None:
        """Before the first step (with servers: the job's root gives them their initial state)."""

    def server_state(self, final: bool) -> list[dict] | None:
        """The servers' params and updater state for a checkpoint (root), or None without servers."""

    def group_steps(self, served: list[dict] | None) -> list[int] | None:
        """The steps each worker group has trained in this run, where the groups go at their own pace
        (Downpour: as the servers counted them, ``served``: :meth:`server_state`'s; in-memory Hogwild:
        as the groups wrote them beside the shared values); None where they keep one pace."""

    def gather_groups(self, value) -> list | None:
        """Every worker group's ``value`` on group 0's worker of this location ID (a list by group), None
        on the others, where the groups keep one pace (distributed Hogwild: every group checkpoints after
        the same steps); None everywhere, without communicating, where they do not, or of one group."""

    def vote_to_stop(self, flag: bool, signal: int | None = None, nonfinite: bool = False,
                     look: Callable[[], bool] | None = None) -> bool:
        """The trainer's vote after each step: True on every worker that must stop with the others
        (``signal``: the stop signal this rank received, if any; ``nonfinite``: this rank found a NaN;
        ``look``: where groups vote together, called once a stop is agreed, before the verdict: whether
        this rank finds a NaN in what the stop would checkpoint)."""

    def allgather_object(self, value) -> list:
        """Every worker's ``value`` on every worker of the group."""

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

    def pipeline(self):
        """(schedule, micro-batches, stages) of a pipelined training step, else None."""

    def predict_step(self):
        """The cost model's step for this run's plan on the root (``--profile``), a line saying why there
        is none, or None off the root (collective)."""

    def close(self) -> None:
        """Release communicators and shared memory (before MPI_Finalize)."""
