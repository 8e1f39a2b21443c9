"""The launch description: from the job, the launched world and the request, everything a rank needs,
computed by pure functions (no MPI, no file writes) before any communication.

:func:`read_job` parses and checks the job once (with ``--workers``, ``--seed`` and the ``test``
command's single group applied); :func:`describe` turns it, the world's facts and rank 0's choice for
``partition_dim: auto`` layers into a frozen :class:`Launch`: the config, the topology, each phase's
plan and every rank's program under each sync method (proved), the sync method this world takes, and
the facts every rank votes on.  Every rank computes the same description; the vote checks that.
"""
from __future__ import annotations

import dataclasses
import hashlib
import warnings
from typing import Mapping

from singa_mpi import plugins
from singa_mpi.checks.job import Summary, validate
from singa_mpi.config.load import JobConfig, effective_partition_dim, is_test_only, load_job, phases_of
from singa_mpi.errors import ConfigError
from singa_mpi.launcher.options import TEST, Request, options_to_agree
from singa_mpi.planner.deterministic import deterministic_of
from singa_mpi.planner.syncs import ALLREDUCE, DETERMINISTIC, DETERMINISTIC_SHARED, SHARED_MEMORY
from singa_mpi.program.build import SERVERS
from singa_mpi.program.job import JobPrograms, job_programs
from singa_mpi.program.schedules import idle_pipeline_note
from singa_mpi.topology import Topology, check_supported, topology

# what `test` leaves out of the cluster: it needs neither servers nor several groups
GROUP_FIELDS = ("nworker_groups", "nserver_groups", "nservers_per_group", "server_worker_separate", "sync_freq",
                "max_staleness")


@dataclasses.dataclass(frozen=True)
class World:
    """What a launch needs to know of the launched processes: how many, on how many nodes, and whether
    the ranks can sum in node-shared memory (all on one node, ``SINGA_MPI_SHM`` not 0)."""

    size: int = 1
    nodes: int = 1
    shared_memory: bool = False
    launcher: str = "mpiexec"  # the command that started the world (start.launcher_name): named in its errors
    node_ranks: int = 1  # the ranks on this rank's node: they share its memory


@dataclasses.dataclass(frozen=True)
class Launch:
    """Everything a rank needs to run the job, the same on every rank of a consistent launch."""

    cfg: JobConfig  # parsed and checked once; --seed, --workers and partition_dim: auto applied
    summary: Summary  # the check's findings: each phase's layers and shapes, the params' shapes
    topo: Topology | None  # None in a single process: it runs the whole net, without a plan
    phases: tuple[str, ...]
    programs: JobPrograms | None  # each phase's plan, every rank's program per sync method, all proved
    workspace: str
    steps: int | None  # --steps, else the job's train_steps
    facts: tuple[tuple[str, str], ...]  # (what, value) pairs every rank must share, compared in order
    notes: tuple[str, ...] = ()  # lines rank 0 prints: what the launch decided for the user
    node_ranks: int = 1  # the ranks on this rank's node (World.node_ranks)

    @property
    def plans(self) -> Mapping:
        return self.programs.plans if self.programs is not None else {}


def read_job(request: Request) -> tuple[JobConfig, Summary]:
    """The job parsed and checked, once: ConfigError naming file:line for the first problem."""
    job, options = request.job, request.options
    cfg = job if isinstance(job, JobConfig) else load_job(job)
    if options.workers is not None:
        cfg.proto.cluster.nworkers_per_group = cfg.workers = options.workers
    if request.command == TEST:
        _as_one_group(cfg)
    if options.seed is not None:
        cfg.proto.seed = options.seed
    if options.deterministic:
        cfg.proto.deterministic.SetInParent()  # the job's own block_rows where it sets them
    summary = validate(cfg)
    for line in summary.said_by_runs if request.trains else ():  # a test updates nothing
        warnings.warn(line)  # recorded: rank 0 says it once (said_once), as `check` does
    _check_command(cfg, request)
    return cfg, summary


def _as_one_group(cfg: JobConfig) -> None:
    """``test``: every launched rank a worker of one group (the checkpoint holds the params, whichever
    framework trained them)."""
    cluster = cfg.proto.cluster
    if cluster.nworker_groups > 1 or cluster.server_worker_separate:
        if cfg.workers is None:  # a group's count of a framework is not the launched count
            cluster.ClearField("nworkers_per_group")
        for field in GROUP_FIELDS:
            cluster.ClearField(field)


def _check_command(cfg: JobConfig, request: Request) -> None:
    if request.trains and is_test_only(cfg.proto):  # SINGA ran these with -test
        raise ConfigError(f"{cfg.path}: a test-only job (no train_steps, test_steps {cfg.proto.test_steps}): "
                          f"expected train_steps to train it; run it with singa-mpi test")
    if not request.trains and cfg.proto.test_steps <= 0:
        raise ConfigError(f"{cfg.path}: test_steps = {cfg.proto.test_steps}: expected test_steps > 0 for `test`")


def describe(read: tuple[JobConfig, Summary], world: World, request: Request,
             chosen=None) -> Launch:
    """The launch of the job ``read`` (:func:`read_job`) on ``world``; ``chosen``: rank 0's
    :class:`~singa_mpi.cost.auto.Choice` for the `auto` layers (their partition_dims, or a pipeline of
    the whole net; one worker: every layer on the batch).  Pure."""
    from singa_mpi.cost.auto import auto_layers, resolved, with_choice

    cfg, summary = read
    phases = tuple(phases_of(cfg) if request.trains else ["test"])
    if world.size == 1:  # the serial runtime: the whole net in this process, on the batch
        cfg = resolved(cfg, {name: 0 for name in auto_layers(cfg)})
        pipeline = idle_pipeline_note(cfg, 1) if request.trains else None
        return Launch(cfg, summary, None, phases, None, request.workspace_of(cfg), request.options.steps, (),
                      one_process_notes(cfg) + ((pipeline,) if pipeline else ()), world.node_ranks)
    notes = []
    if chosen is not None:
        notes.append(chosen.describe())
    cfg = _copy(resolved(cfg, chosen.dims if chosen is not None else None))
    if chosen is not None and chosen.places_layers():
        cfg = with_choice(cfg, chosen)
    topo, note = topology_of(cfg, world.size, world.launcher)
    notes += [note] if note else []
    built = job_programs(cfg, topo.workers_per_group, phases, servers=topo.servers_separate,
                         method=sync_method(topo, world, deterministic_of(cfg.proto) is not None))
    pipeline = idle_pipeline_note(cfg, topo.workers_per_group, built.plans.get("train")) if request.trains else None
    notes += [pipeline] if pipeline else []
    facts = run_facts(cfg, request) + job_facts(cfg, built)
    return Launch(cfg, summary, topo, phases, built, request.workspace_of(cfg), request.options.steps,
                  tuple(facts), tuple(notes), world.node_ranks)


def _copy(cfg: JobConfig) -> JobConfig:
    """A copy whose proto the description may change (following the launched count) without
    changing the caller's."""
    proto = type(cfg.proto)()
    proto.CopyFrom(cfg.proto)
    return dataclasses.replace(cfg, proto=proto)


def sync_method(topo: Topology, world: World, deterministic: bool = False) -> str:
    """How world-replicated params sync: through the servers beside them; in deterministic mode by
    gathering their gradient rows (in node-shared memory when the world offers it); else in node-shared
    memory when the world offers it; else bucketed Allreduce (always for distributed Hogwild's groups:
    their exchanges write every replica, which node-shared chunks cannot take)."""
    if topo.servers_separate:
        return SERVERS
    if deterministic:
        return DETERMINISTIC_SHARED if world.shared_memory and len(topo.worker_groups) == 1 else DETERMINISTIC
    if world.shared_memory and len(topo.worker_groups) == 1:
        return SHARED_MEMORY
    return ALLREDUCE


def one_process_notes(cfg: JobConfig) -> tuple[str, ...]:
    """A run of one process (no launcher, or ``-n 1``) trains the whole net serially, whatever the job's
    cluster asks for: say so, as a launch on another rank count says it follows the launched count;
    ``--workers N`` asked for more than this process: ConfigError, as under mpirun."""
    cluster = cfg.proto.cluster
    if cfg.workers is not None and cfg.workers != 1:
        raise ConfigError(f"--workers {cfg.workers}: expected the number of MPI ranks (1: no launcher started "
                          f"this process); launch with mpiexec -n {cfg.workers} or leave --workers out")
    asked = [f"{field} = {getattr(cluster, field)}" for field in ("nworkers_per_group", "nworker_groups",
                                                                  "nserver_groups", "nservers_per_group")
             if cluster.HasField(field) and getattr(cluster, field) > 1]
    asked += ["server_worker_separate = true"] if cluster.server_worker_separate else []
    if not asked:
        return ()
    return (f"note: {cfg.where('cluster')}: cluster {', '.join(asked)} in the job; running as one process: the whole "
            f"net, serially and synchronously (launch with mpiexec -n N to run the cluster it describes)",)


def topology_of(cfg: JobConfig, size: int, launcher: str = "mpiexec") -> tuple[Topology, str | None]:
    """Every rank's role from the job's cluster, and a note when the job's worker count gave way to
    the launched one; ConfigError for shapes not built and for a rank count that does not fit, saying
    how to launch with ``launcher`` (the command that started the world)."""
    cluster, note = cfg.proto.cluster, None
    if cluster.HasField("nworkers_per_group") and cluster.nworkers_per_group != size and \
            cluster.nworker_groups <= 1 and not cluster.server_worker_separate:
        workers = cluster.nworkers_per_group
        if cfg.workers is not None:  # asked for with --workers
            raise ConfigError(f"--workers {workers}: expected the number of MPI ranks ({size}); "
                              f"launch with {launcher} -n {workers} or pass --workers {size}")
        note = follow_launched_count(cfg, size, launcher)
    single = cluster.nworker_groups <= 1 and not cluster.server_worker_separate
    topo = topology(size, cluster, nworkers=None if cluster.HasField("nworkers_per_group") or not single else size,
                    where=cfg.where("cluster"), launcher=launcher)
    check_supported(topo, cfg.where("cluster"))
    return topo, note


def follow_launched_count(cfg: JobConfig, size: int, launcher: str = "mpiexec") -> str:
    """A job file's ``nworkers_per_group`` is SINGA's process count, not part of the net: run on the
    ``size`` launched ranks instead when every layer can (``partition_dim`` splits over any count;
    a ``location`` must name one of them: ConfigError naming the layer otherwise).  Returns the note."""
    workers = cfg.proto.cluster.nworkers_per_group
    where = cfg.where("cluster", "nworkers_per_group")
    for index, layer in enumerate(cfg.proto.neuralnet.layer):
        if effective_partition_dim(cfg.proto, layer) == -1 and layer.location >= size:
            raise ConfigError(f"{cfg.layer_where(index, 'location')}: layer '{layer.name}': location = "
                              f"{layer.location}: expected a worker below {size}, the number of MPI ranks "
                              f"(the job places layers on workers up to {layer.location}; its "
                              f"cluster.nworkers_per_group is {workers}): launch with {launcher} -n {workers}")
    cfg.proto.cluster.nworkers_per_group = size
    return (f"note: {where}: cluster.nworkers_per_group = {workers} in the job; running on the {size} "
            f"launched rank(s)")


def run_facts(cfg: JobConfig, request: Request) -> list[tuple[str, str]]:
    """The values of the options every rank must share, as this rank's job has them."""
    steps = request.options.steps
    facts = [("the seed (--seed, else the job's seed)", str(cfg.proto.seed)),
             ("the steps to train (--steps, else the job's train_steps)",
              str(steps if steps is not None else cfg.proto.train_steps)),
             ("the workers per group (--workers, else the job's cluster.nworkers_per_group)",
              str(cfg.proto.cluster.nworkers_per_group) if cfg.proto.cluster.HasField("nworkers_per_group")
              else "(not set)")]
    return facts + (options_to_agree(request.options) if request.trains else [])


def job_facts(cfg: JobConfig, built: JobPrograms) -> list[tuple[str, str]]:
    """The whole job, the plugins' code, and the communication schedule under each sync method."""
    job = hashlib.sha256(cfg.proto.SerializeToString(deterministic=True)).hexdigest()[:16]
    facts = [("the job", job), ("the plugins loaded", ", ".join(plugins.fingerprints()) or "none")]
    return facts + [(f"the communication schedule ({method})", built.digest(method)) for method in built.methods]
