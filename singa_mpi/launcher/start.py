"""Starting a rank: its liveness record and watchdog before MPI_Init, the world communicator, which
launcher started it (read from the environment here only), and the world's facts the launch
description needs (size, nodes, node-shared memory)."""
from __future__ import annotations

import os

from singa_mpi.errors import ConfigError
from singa_mpi.launcher.describe import World


def mpi_world(tracer=None, life=None):
    """The MPI world communicator if this process was launched on several ranks, else None.
    ``life`` (:class:`~singa_mpi.communication.liveness.RankLife`): its watchdog covers MPI_Init, which
    waits for every rank, and the world keeps its status record."""
    if life is not None:
        life.waiting_in("MPI_Init (start-up: it waits for every rank to start)")
    try:
        from singa_mpi.communication import mpi as comm
    except ImportError:
        return None
    finally:
        if life is not None:
            life.waiting_in(None)
    if comm.world_size() <= 1:
        refuse_launcher_mix_up(os.environ, comm.library())
        return None
    return comm.world(tracer, status=life.record if life is not None else None)


# what launchers announce: (size variable, rank variable) -- MPICH's PMI, Open MPI, srun's job step
ANNOUNCED_WORLD = (("PMI_SIZE", "PMI_RANK"), ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),
                   ("SLURM_STEP_NUM_TASKS", "SLURM_PROCID"))


def launcher_name(environ) -> str:
    """The command that launched this process, by what it announced: ``mpirun`` for Open MPI's launcher
    (OMPI_COMM_WORLD_SIZE; mpirun and mpiexec are one program there, the name typed is not known),
    ``mpiexec`` for MPICH's hydra (MPI_LOCALNRANKS, also when its proxies run in a Slurm step), ``srun``
    for a Slurm job step (SLURM_STEP_ID a number, with PMI-2 or PMIx), else ``mpiexec``."""
    if "OMPI_COMM_WORLD_SIZE" in environ:
        return "mpirun"
    if "MPI_LOCALNRANKS" in environ:
        return "mpiexec"
    if in_slurm_step(environ) and "SLURM_STEP_NUM_TASKS" in environ:
        return "srun"
    return "mpiexec"


def in_slurm_step(environ) -> bool:
    """Whether srun started this process as part of a job step (SLURM_STEP_ID a number), not the
    batch script's own step."""
    return environ.get("SLURM_STEP_ID", "").isdigit()


def announced_world(environ) -> tuple[str, int, str] | None:
    """(size variable, size, this process's rank as announced) where the environment says a launcher
    started this process among several (N > 1), else None."""
    for size_variable, rank_variable in ANNOUNCED_WORLD:
        if size_variable.startswith("SLURM") and not in_slurm_step(environ):
            continue  # the batch script's own step, not processes srun started
        size = environ.get(size_variable, "")
        if size.isdigit() and int(size) > 1:
            return size_variable, int(size), environ.get(rank_variable, "0")
    return None


def refuse_on_first(environ, message: str) -> None:
    """ConfigError(``message``) on the process the launcher calls rank 0; the others leave quietly with
    the same code (one line for the job, not N)."""
    announced = announced_world(environ)
    if announced is not None and announced[2] not in ("", "0"):
        raise SystemExit(ConfigError.exit_code)
    raise ConfigError(message)


def refuse_launcher_mix_up(environ, library: str) -> None:
    """An MPI world of 1 where the environment says the launcher started N > 1 processes: a launcher
    of one MPI with mpi4py on another (one venv's mpiexec first on PATH) runs N serial copies of the
    job into one workspace."""
    announced = announced_world(environ)
    if announced is not None:
        variable, size, _ = announced
        refuse_on_first(environ, f"the launcher started {size} processes ({variable}={size}) but MPI sees a world "
                                 f"of 1: the launcher is not of the MPI that mpi4py loaded ({library}): launch with "
                                 f"that MPI's own mpiexec/mpirun (see README, Your system MPI)")


def refuse_launched_run(environ) -> None:
    """``mpiexec -n 2 singa-mpi run -n 2 JOB``: `run` starts the ranks itself, so each of the N processes
    the outer launcher started ran a supervisor and a whole job of its own, N runs into one workspace."""
    announced = announced_world(environ)
    if announced is not None:
        variable, size, _ = announced
        outer = launcher_name(environ)
        refuse_on_first(environ, f"run: started by {outer} as {size} processes ({variable}={size}): `singa-mpi run` "
                                 f"launches the ranks itself: expected `singa-mpi run -n N JOB` outside {outer}, or "
                                 f"`{outer} -n N python -m singa_mpi train JOB`")


def rank_life(stall_timeout: float | None, rank: int | None = None, size: int | None = None, tracer=None):
    """This rank's status record, guardian and watchdog (singa_mpi.communication.liveness), started
    before MPI_Init when the launcher announced the rank in the environment; (life, tracer), or
    (None, None) in a single process or where the node's shared memory cannot be written."""
    from singa_mpi.communication import liveness
    from singa_mpi.tracing import Tracer

    if rank is None:
        launched = liveness.launched_rank()
        if launched is None or launched[1] <= 1:
            return None, None
        rank, size = launched
    tracer = tracer or Tracer(rank)
    early = liveness.take_early(rank, size)  # begun at the entry point, before the heavy imports
    if early is not None:
        early.adopt(tracer, stall_timeout)
        return early, tracer
    try:
        return liveness.RankLife(rank, size, tracer, stall_timeout), tracer
    except OSError:
        return None, tracer


def world_facts(world) -> World:
    """The launched world as the launch description sees it (collective: every rank asks its node)."""
    from singa_mpi.sync.shared_memory import shared_memory_enabled

    one_node, node_ranks = world.on_one_node(), world.node_size()
    return World(world.size, -(-world.size // node_ranks), shared_memory=one_node and shared_memory_enabled(),
                 launcher=launcher_name(os.environ), node_ranks=node_ranks)
