"""One rank's part of a job once its world communicator exists: serve as a parameter server, or
build a worker's runtime and trainer and run the body (training, the ``test`` command) on it.

The launcher calls :func:`run_role` in phase 2, after the vote; a test calls it on threads with the
single-process communicator, so Sandblaster, Downpour and both Hogwilds run without MPI too.
"""
from __future__ import annotations

import dataclasses
import sys
from typing import Callable

from singa_mpi import threads
from singa_mpi.checkpoints import emergency
from singa_mpi.checkpoints.hdf5 import EXIT_CHECKPOINTED
from singa_mpi.config.load import JobConfig
from singa_mpi.nonfinite import GroupFinding, job_line
from singa_mpi.program.job import JobPrograms
from singa_mpi.runtimes.server import ServerRuntime
from singa_mpi.runtimes.worker import Place, WorkerRuntime
from singa_mpi.sync.shared_memory import shared_memory_enabled
from singa_mpi.topology import SERVER, Topology
from singa_mpi.trainer import Trainer, signal_name


@dataclasses.dataclass(frozen=True)
class RoleJob:
    """What every rank of the job agreed on in phase 1."""

    cfg: JobConfig
    topo: Topology
    programs: JobPrograms  # each phase's plan of one worker group and every rank's proved program
    workspace: str
    steps: int | None = None  # --steps, else the job's train_steps

    @property
    def plans(self) -> dict:
        return dict(self.programs.plans)


@dataclasses.dataclass
class RoleHooks:
    """What the launcher watches a rank with (all optional): ``note`` says what the rank is doing
    (its liveness record), ``named`` gives it its role's name, ``attach`` hands the trainer (a
    server rank: its ServerRuntime, which has the same ``stop_requested`` and ``stop_signal``) to the
    stop signals, ``finished`` says the body has returned."""

    note: Callable[[str], None] = lambda text: None
    named: Callable[[str], None] = lambda name: None
    attach: Callable[[Trainer | ServerRuntime], None] = lambda trainer: None
    finished: Callable[[], None] = lambda: None


def run_role(world, job: RoleJob, body: Callable[[Trainer], int], hooks: RoleHooks | None = None) -> int:
    """Serve, or train with ``body(trainer)``; the exit code.  Collective over ``world``."""
    hooks = hooks if hooks is not None else RoleHooks()
    topo, cfg = job.topo, job.cfg
    role = topo.role(world.rank)
    server = role.kind == SERVER
    # the worker runtime sees its group's communicator; the world only through its servers and peers
    group = world.split(len(topo.worker_groups) + role.group if server else role.group, role.index)
    place = place_of(world, topo, role, cfg.proto.cluster)
    if place is not None:  # a dead or stalled rank is named with its role
        hooks.named(f"{role.kind} {role.index} of {role.kind} group {role.group}")
    if server:
        hooks.note("")
        with threads.limit_blas(1):  # element-wise updates: one thread each, beside the workers' BLAS
            server = ServerRuntime(cfg, cfg.proto.seed, world, topo, role, job.plans)
            hooks.attach(server)  # a stop signal here stops the groups too
            emergency.serve_on_request(world.rank, server)
            server.serve()
        group.free()
        world.barrier(patient=True)
        return agreed_exit_code(world, topo, 0, server.stop_signal or server.group_signal or None)
    runtime = WorkerRuntime(cfg, cfg.proto.seed, job.workspace, group, job.programs, place)
    trainer = Trainer(cfg, job.workspace, runtime, train_steps=job.steps)
    hooks.attach(trainer)
    hooks.note("")
    try:
        code = body(trainer)
    finally:
        hooks.finished()
    runtime.close()
    world.barrier(patient=place is not None)  # a worker group may finish well before the others
    if place is None:
        return code
    return agreed_exit_code(world, topo, code, trainer.stop_signal, trainer.nonfinite_said, job.workspace)


def agreed_exit_code(world, topo: Topology, code: int, signal: int | None, said=None, workspace: str = "") -> int:
    """The exit code every rank of a job with several worker groups or servers returns (collective over the
    world, every rank past the final barrier): group 0's root writes the job's checkpoints, so its code is
    the job's.  A group that stopped on a stop signal (75) after group 0 had trained its last step (its
    final checkpoint waits for every group) leaves a complete run: 0, and the root says the late signal
    did not stop the job.  Otherwise the first error any rank met (a server's, another group's).
    ``said``: what a group root's non-finite stop would say (its own finding, or its line); the job's
    root says the groups' in one line."""
    everyone = world.allgather_object((code, signal, said))
    lead = topo.worker_groups[0][0]
    if world.rank == lead:
        _say_nonfinite([s for _, _, s in everyone if s is not None], workspace)
    everyone = [(c, s) for c, s, _ in everyone]
    job = everyone[lead][0]
    if job == 0:
        job = next((c for c, _ in everyone if c not in (0, EXIT_CHECKPOINTED)), 0)
    late = next((s for c, s in everyone if c == EXIT_CHECKPOINTED and s), None)
    if job == 0 and late is not None and world.rank == lead:
        late_groups = sorted({topo.role(rank).group for rank, (c, _) in enumerate(everyone)
                              if c == EXIT_CHECKPOINTED and topo.role(rank).kind != SERVER})
        print(f"note: {signal_name(late)} reached the job after worker group 0 had trained its last step: "
              f"the run is complete (its final checkpoint written), worker group(s) "
              f"{', '.join(map(str, late_groups))} stopped early; exit 0", flush=True)
    return job


def _say_nonfinite(said: list, workspace: str) -> None:
    """The job's one line for the non-finite values its worker groups stopped on: every group's own
    finding, else the line of a group stopped by another's."""
    findings = [s for s in said if isinstance(s, GroupFinding)]
    if findings or said:
        line = job_line(findings, workspace) if findings else said[0]
        print(f"singa-mpi: error: {line}", file=sys.stderr, flush=True)


def place_of(world, topo: Topology, role, cluster) -> Place | None:
    """The worker's place among several groups or beside servers (None: one group, no servers).
    Collective over the world for Hogwild: its exchange communicators, and whether the job is on one
    node (in-memory Hogwild: ``share_memory``, one worker per group, all on one node)."""
    groups = len(topo.worker_groups)
    if groups == 1 and not topo.servers_separate:
        return None
    if topo.servers_separate:
        return Place(world, topo, role)
    in_memory = cluster.share_memory and topo.workers_per_group == 1 and shared_memory_enabled()
    in_memory = in_memory and world.on_one_node()  # (a collective: every rank asks)
    if in_memory:
        return Place(world, topo, role, node=world)
    return Place(world, topo, role, peers=world.split(role.index, role.group), sync_freq=cluster.sync_freq)
