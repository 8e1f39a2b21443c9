"""Entry points that run a job: in one process, or one worker per MPI rank.

``run_training`` runs the serial runtime in a single process (or an MPI world
of size 1) and the worker runtime of :mod:`singa_mpi.runtimes.worker` when
launched on several ranks.  Under MPI a job fails in one of two ways, and
neither hangs:

* before any communication (reading, validating and planning the job, reading
  its checkpoint_path files and the first batch of its data, which every rank
  does by itself: :func:`check_first_batches`): the ranks exchange their
  verdicts once, rank 0 prints the first error (naming the rank when not every
  rank met it), and every rank exits with its code;
* after that (a bad label at step 40, a bug, a signal): the failing
  rank prints what failed where (rank, layer, step) and calls MPI_Abort, which
  ends every rank promptly.  A rank that stops responding is caught by the
  ``--stall-timeout`` watchdog, from MPI_Init on, which names it.

The vote also compares what every rank must share (seed, steps, workers, run
options, the job, the plugins, the schedule), so ranks started differently stop
with one line instead of deadlocking.  A rank that vanishes (SIGKILL, the OOM
killer) is named by its guardian (:mod:`singa_mpi.communication.liveness`).
Stop signals are caught from the start (:class:`StopSignals`): during setup the
run stops before training (exit 75, nothing written).
"""
from __future__ import annotations

import dataclasses
import os
import shlex
import sys
import time
import traceback
import warnings
from typing import Callable

from singa_mpi import plugins, progress, threads, timeline
from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.checkpoints.tools import read_initial
from singa_mpi.checks.job import validate
from singa_mpi.config.load import JobConfig, effective_partition_dim, is_test_only, layers_for_phase, load_job
from singa_mpi.errors import (ConfigError, DataError, NonFiniteError, PeerLost, ResourceError, SingaError, one_line,
                              out_of_memory)
from singa_mpi.layers.output import output_files
from singa_mpi.runtimes.serial import SerialRuntime
from singa_mpi.topology import check_supported, topology
from singa_mpi.stop_signals import STOPPED_BEFORE_TRAINING, StopSignals
from singa_mpi.trainer import Trainer, write_stop_note
from singa_mpi.workspace import claim_workspace, make_workspace

EXIT_ABORT = 1
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process ended by Ctrl-C


@dataclasses.dataclass
class RunOptions:
    """How to run beyond the job file: ``singa-mpi train`` options."""

    seed: int | None = None
    steps: int | None = None
    stall_timeout: float | None = None
    resume: bool = False
    workers: int | None = None  # overrides cluster.nworkers_per_group (--workers N)
    overwrite: bool = False  # move another run's checkpoints and metrics aside (WORKSPACE/previous-<time>/)
    keep: int | None = None
    allow_partial: bool = False
    allow_other_job: bool = False  # --resume from a checkpoint another job wrote (its identity differs)
    trace: str | None = None  # FILE: every rank's timeline as Chrome-trace JSON (singa_mpi.timeline)
    profile: bool = False  # print the per-layer compute/communication table at the end
    check_finite: bool = True  # stop at the first NaN/inf in inputs, metrics or gradients (exit 5)
    debug: bool = False  # --debug: also the communication table's bookkeeping rows


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


def refuse_launcher_mix_up(environ, library: str) -> None:
    """An MPI world of 1 where the environment says the launcher started N > 1 processes: a launcher
    of one MPI with mpi4py on another (one venv's mpiexec first on PATH) runs N serial copies of the
    job into one workspace.  ConfigError on the process the launcher calls rank 0; the others leave
    quietly with the same code (one line for the job, not N)."""
    for size_variable, rank_variable in ANNOUNCED_WORLD:
        if size_variable.startswith("SLURM") and not environ.get("SLURM_STEP_ID", "").isdigit():
            continue  # the batch script's own step, not processes srun started
        size = environ.get(size_variable, "")
        if size.isdigit() and int(size) > 1:
            if environ.get(rank_variable, "0") not in ("", "0"):
                raise SystemExit(ConfigError.exit_code)
            raise ConfigError(f"the launcher started {size} processes ({size_variable}={size}) but MPI sees a world "
                              f"of 1: the launcher is not of the MPI that mpi4py loaded ({library}): launch with "
                              f"that MPI's own mpiexec/mpirun (see README, Your system MPI)")


def _rank_life(stall_timeout: float | None, rank: int | None = None, size: int | None = None, tracer=None):
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


def _prepare(job: str | JobConfig | Callable[[], JobConfig], seed: int | None) -> JobConfig:
    cfg = job() if callable(job) else job if isinstance(job, JobConfig) else load_job(job)
    if seed is not None:
        cfg.proto.seed = seed
    validate(cfg)
    return cfg


def run_training(job: str | JobConfig, workspace_of: Callable[[JobConfig], str],
                 options: RunOptions | None = None) -> int:
    """Train ``job``; ``workspace_of(cfg)`` names the output folder.  Returns the exit code:
    0 when done, ``checkpoint.EXIT_CHECKPOINTED`` (75) when stopped by SIGINT/SIGTERM/SIGUSR1 after
    writing a checkpoint."""
    options = options or RunOptions()
    job = with_workers(job, options.workers)

    initial: dict[str, checkpoint.Checkpoint | None] = {}  # the job's checkpoint_path files, read in phase 1

    def train(trainer: Trainer) -> int:
        return _train(trainer, options, initial.get("params"))

    def claim(cfg: JobConfig, workspace: str, is_root: bool) -> None:
        claim_workspace(workspace, options, is_root, outputs=output_files(cfg.proto, workspace))

    def trains(cfg: JobConfig) -> None:
        if is_test_only(cfg.proto):  # SINGA ran these with -test
            raise ConfigError(f"{cfg.path}: a test-only job (no train_steps, test_steps {cfg.proto.test_steps}): "
                              f"expected train_steps to train it; run it with singa-mpi test")
        initial["params"] = read_checkpoint_paths(cfg, workspace_of(cfg), options.resume)

    from singa_mpi.communication.liveness import launched_rank

    # a launcher that stops reading the ranks' output (Open MPI's mpirun, signalled) must not stop the run
    with progress.forwarded_stdout(launched=launched_rank() is not None):
        return _launch(job, workspace_of, options.seed, options.stall_timeout, train, steps=options.steps,
                       check=trains, claim=claim, agree=_options_to_agree(options))


# options that may differ between ranks: each rank's own watchdog, the root's pruning and printing
PER_RANK_OPTIONS = {"seed", "steps", "workers", "stall_timeout", "keep", "profile", "trace", "debug"}


def _options_to_agree(options: RunOptions) -> list[tuple[str, str]]:
    """The run options every rank must share (seed, steps and workers are compared from the job as
    each rank reads it); --trace's file is the root's, but recording is collective."""
    pairs = [(f"--{name.replace('_', '-')}", str(value)) for name, value in dataclasses.asdict(options).items()
             if name not in PER_RANK_OPTIONS]
    return pairs + [("--trace", "on" if options.trace else "off")]


def _launch(job, workspace_of, seed: int | None, stall_timeout: float | None,
            body: Callable[[Trainer], int], steps: int | None = None, check: Callable | None = None,
            claim: Callable[[JobConfig, str, bool], None] | None = None, phases: list[str] | None = None,
            agree: list[tuple[str, str]] | None = None, catch_signals: bool = True) -> int:
    """Serial in one process, else the two-phase MPI protocol; ``body(trainer)`` does the work.
    ``check(cfg)`` and ``claim(cfg, workspace, is_root)`` run in phase 1: their errors end every rank cleanly;
    so does a missing input store of ``phases`` (default: those the job trains, tests and validates).
    ``agree``: (option, value) pairs every rank must share; ``catch_signals``: stop on SIGINT, SIGTERM
    and SIGUSR1 from now on (:class:`StopSignals`), else leave them alone."""
    body = _in_blas_threads(body)
    stops = StopSignals()
    life, tracer = _rank_life(stall_timeout)  # before MPI_Init: its watchdog covers the wait in it
    stops.is_root = tracer is None or tracer.rank == 0
    world = None
    try:
        if catch_signals:
            stops.install()
        world = mpi_world(tracer, life)
        if world is None:
            if life is not None:
                life.close()
                life = None
            return _run_serial(job, workspace_of, seed, body, steps, check, claim, phases, stops)
        if life is None:  # a launcher that does not announce ranks in the environment: from now on
            life, _ = _rank_life(stall_timeout, world.rank, world.size, world.tracer)
            world.status = life.record if life is not None else None
        return _run_parallel(world, job, workspace_of, seed, stall_timeout, body, steps, check, claim, phases,
                             agree=agree or [], stops=stops, life=life)
    finally:
        stops.restore(keep_ignoring=world is not None and stops.received is not None)
        if life is not None:
            life.close()


def _auto_dims(world, job, seed) -> dict[str, int] | None:
    """Rank 0's choice for the job's `partition_dim: auto` layers, on every rank (one choice: kernel
    timings differ between ranks).  Every rank calls this; None where there is nothing to choose or
    rank 0 could not (its phase-1 error then reaches every rank)."""
    dims = None
    nodes = -(-world.size // world.node_size())  # (collective) kernels are timed beside a copy per node peer
    if world.rank == 0:
        try:
            from singa_mpi.cost.auto import auto_layers, choose_for_job
            from singa_mpi.sync.shared_memory import shared_memory_enabled

            cfg = _prepare(job, seed)
            if auto_layers(cfg):
                workers = _topology(cfg, world.size).workers_per_group
                method = "shared_memory" if shared_memory_enabled() else "allreduce"
                dims = choose_for_job(cfg, workers, method, nodes=nodes).dims
        except (SingaError, MemoryError):
            dims = None
    return world.root_value(dims, "partition_dim: auto")


def _run_serial(job, workspace_of, seed, body, steps, check, claim, phases, stops: StopSignals) -> int:
    from singa_mpi.cost.auto import auto_layers, resolved

    cfg = _prepare(job, seed)
    cfg = resolved(cfg, {name: 0 for name in auto_layers(cfg)})  # one worker: nothing to split
    if check is not None:
        check(cfg)
    workspace = workspace_of(cfg)
    check_inputs(cfg, workspace, phases or _phases(cfg), log=print)
    if claim is not None:
        claim(cfg, workspace, True)
    make_workspace(workspace)  # `test` has no claim: a bad workspace is one line here too
    trainer = Trainer(cfg, workspace, SerialRuntime(cfg, cfg.proto.seed, workspace), train_steps=steps)
    stops.attach(trainer)
    try:
        return body(trainer)
    finally:
        stops.finished = True


def _in_blas_threads(body: Callable[[Trainer], int]) -> Callable[[Trainer], int]:
    """``body`` run with the BLAS threads chosen for this rank and the job's size (singa_mpi.threads)."""
    def warn(line: str) -> None:
        print(f"warning: {line}", file=sys.stderr, flush=True)

    def run(trainer: Trainer) -> int:
        work = threads.work_per_step(trainer.cfg, validate(trainer.cfg), trainer.runtime.size)
        with threads.blas_threads(warn=warn if trainer.runtime.is_root else None, work=work):
            return body(trainer)
    return run


def _train(trainer: Trainer, options: RunOptions, initial: checkpoint.Checkpoint | None = None) -> int:
    """Initialise (``initial``: the job's checkpoint_path files, already read) or resume, run (stopping on
    the signals :class:`StopSignals` caught); returns the exit code."""
    trainer.job_params = dict(validate(trainer.cfg).params)  # its checkpoints' job identity
    trainer.keep = options.keep
    trainer.print_profile = options.profile
    trainer.debug = options.debug
    if not options.check_finite:
        trainer.finite.switch_off(list(trainer.nets().values()))
    if options.trace:
        timeline.start(trainer.runtime)  # record from here on, one clock on every rank
    _load_initial_state(trainer, options, initial)
    # server ranks wait for their initial state before anything else
    trainer.runtime.begin_training(trainer.loaded, trainer.finite.enabled)
    if trainer.start_step > 0 and trainer.start_step >= trainer.train_steps:
        trainer.log(f"nothing to do: the checkpoint is at step {trainer.start_step}, "
                    f"train_steps is {trainer.train_steps}")
        return 0
    if trainer.runtime.any(trainer.stop_requested):  # a signal during setup (StopSignals): stop before step 1
        trainer.log(STOPPED_BEFORE_TRAINING)
        if trainer.runtime.is_root:
            write_stop_note(trainer.workspace, [STOPPED_BEFORE_TRAINING])
        return checkpoint.EXIT_CHECKPOINTED
    trainer.training = True  # a stop signal from now on: after the step, with a checkpoint
    trainer.resume_hint = f"resume with: {resume_command(trainer, options)}"  # for a stop's note too
    try:
        trainer.run()
    except NonFiniteError as err:
        return _stopped_on_nonfinite(trainer, err)
    if options.trace:
        trainer.log(timeline.finish(trainer.runtime, options.trace))  # collective
    if trainer.stopped:
        trainer.log(trainer.resume_hint)
        if trainer.runtime.is_root:
            progress.also_on_stderr(trainer.resume_hint)
        return checkpoint.EXIT_CHECKPOINTED
    return 0


def _stopped_on_nonfinite(trainer: Trainer, err: NonFiniteError) -> int:
    """Every rank raised ``err`` at the same step (the verdict is voted): under MPI the root prints
    the one line and all ranks exit with its code, with no abort; serially the CLI reports it."""
    if isinstance(trainer.runtime, SerialRuntime):
        raise err
    # the root of the group that found it prints (other groups' roots hold a pointer to it)
    if trainer.runtime.rank == 0 and "another worker group" not in str(err) and "see rank 0" not in str(err):
        print(f"singa-mpi: error: {err}", file=sys.stderr, flush=True)
    return err.exit_code


def launcher_name(environ) -> str:
    """The command that launched this process, by what it announced: ``mpirun`` for Open MPI's launcher
    (OMPI_COMM_WORLD_SIZE; mpirun and mpiexec are one program there, the name typed is not known),
    ``mpiexec`` for MPICH's hydra (MPI_LOCALNRANKS, also when its proxies run in a Slurm step), ``srun``
    for a Slurm job step (SLURM_STEP_ID a number, with PMI-2 or PMIx), else ``mpiexec``."""
    if "OMPI_COMM_WORLD_SIZE" in environ:
        return "mpirun"
    if "MPI_LOCALNRANKS" in environ:
        return "mpiexec"
    if environ.get("SLURM_STEP_ID", "").isdigit() and "SLURM_STEP_NUM_TASKS" in environ:
        return "srun"
    return "mpiexec"


def resume_command(trainer: Trainer, options: RunOptions, environ=None) -> str:
    """The command that continues this run from its newest checkpoint (it may run on any number of
    ranks), with the launcher that started this one (``environ``: default this process's)."""
    size = trainer.runtime.size
    launcher = launcher_name(os.environ if environ is None else environ)
    words = [launcher, "-n", str(size), "python", "-m", "singa_mpi"] if size > 1 else ["singa-mpi"]
    words += ["train", trainer.cfg.path, "--workspace", trainer.workspace]
    for flag, value in (("--steps", options.steps), ("--seed", options.seed), ("--keep", options.keep),
                        ("--workers", options.workers)):
        if value is not None:
            words += [flag, str(value)]
    for spec in plugins.requested():  # the job cannot be read without them
        words += ["--plugin", spec]
    if not options.check_finite:
        words.append("--no-check-finite")
    return shlex.join(words + ["--resume"])


def _load_initial_state(trainer: Trainer, options: RunOptions, initial: checkpoint.Checkpoint | None = None) -> None:
    """--resume: the newest good checkpoint of the workspace; else the job's checkpoint_path files
    (``initial`` when :func:`read_checkpoint_paths` read them before)."""
    job = trainer.job
    if options.resume:
        with warnings.catch_warnings():
            if not trainer.runtime.is_root:
                warnings.simplefilter("ignore")  # one report of a damaged file is enough
            ckpt = checkpoint.newest_good(trainer.workspace)
        if ckpt is not None:
            _check_job_identity(trainer, ckpt, options.allow_other_job)
            trainer.log(f"resuming from {ckpt.path} (step {ckpt.step})")
            trainer.restore(ckpt, full=True, allow_partial=options.allow_partial)
            return
        trainer.log(f"note: no checkpoint in {checkpoint.checkpoint_dir(trainer.workspace)}: starting at step 0")
    if job.checkpoint_path:  # a fresh start (a first --resume of a requeued job included)
        merged = initial or _merged_checkpoint_paths(job.checkpoint_path)
        trainer.log(f"initialising parameters from {', '.join(job.checkpoint_path)}")
        trainer.restore(merged, full=False, allow_partial=options.allow_partial)


def read_checkpoint_paths(cfg: JobConfig, workspace: str, resume: bool) -> checkpoint.Checkpoint | None:
    """The job's checkpoint_path files, read in phase 1 so that a missing or damaged one is a voted error
    (one line from rank 0) rather than every rank's abort at step 0; None when the job names none, or
    when --resume continues from the workspace's own checkpoints."""
    from singa_mpi.checks.checkpoint_paths import missing_checkpoint_paths

    if not cfg.proto.checkpoint_path or (resume and checkpoint.listed(workspace)):
        return None
    missing = missing_checkpoint_paths(cfg)  # a line that names the job writing it, where one does
    if missing:
        raise DataError(missing[0])
    return _merged_checkpoint_paths(cfg.proto.checkpoint_path)


def _merged_checkpoint_paths(paths) -> checkpoint.Checkpoint:
    """SINGA: params matched by name; later files override earlier ones."""
    merged = read_initial(paths[0])
    for path in paths[1:]:
        merged.params.update(read_initial(path).params)
        merged.path = path
    return merged


def _check_job_identity(trainer: Trainer, ckpt: checkpoint.Checkpoint, allow_other_job: bool) -> None:
    """--resume: refuse another job's checkpoint (ConfigError) unless --allow-other-job.  The root alone
    decides, as its error ends every rank and the others would print the same line."""
    from singa_mpi.checkpoints.snapshot import other_job

    if not trainer.runtime.is_root:
        return
    if not ckpt.job_identity:
        trainer.log(f"note: {ckpt.path} has no job identity (format {ckpt.format_version}, or converted): "
                    f"not checked that this job wrote it")
        return
    mismatch = other_job(trainer.cfg, trainer.job_params, ckpt)
    if mismatch and not allow_other_job:
        raise ConfigError(f"{mismatch}: expected this job's checkpoint: resume from it anyway with "
                          f"--allow-other-job (params taken by name), or start afresh with --overwrite")
    if mismatch:
        trainer.log(f"note: --allow-other-job: {mismatch}")


def _run_parallel(world, job, workspace_of, seed, stall_timeout, body, steps, check, claim, phases, agree,
                  stops: StopSignals, life) -> int:
    from singa_mpi.runtimes.roles import RoleHooks, RoleJob, run_role
    from singa_mpi.runtimes.worker import WorkerRuntime

    # -- phase 1: every rank reads, validates and plans alone; then one vote (errors, stop signals, and
    # what every rank must share: a rank with another job or other options would deadlock in phase 2)
    error, plans, facts = None, None, None
    _note(life, "setup: reading and planning the job")
    chosen = _auto_dims(world, job, seed)
    try:
        from singa_mpi.cost.auto import resolved

        cfg = resolved(_prepare(job, seed), chosen)
        if chosen and world.rank == 0:
            print("partition_dim: auto chose " + ", ".join(f"{name} {dim}" for name, dim in chosen.items()),
                  flush=True)
        if check is not None:
            check(cfg)
        topo = _topology(cfg, world.size, log=print if world.rank == 0 else None)
        workspace = workspace_of(cfg)
        check_inputs(cfg, workspace, phases or _phases(cfg), log=print if world.rank == 0 else None)
        check_first_batches(cfg, workspace, phases or _phases(cfg))  # what step 0 would meet, voted
        plans = WorkerRuntime.plan_phases(cfg, topo.workers_per_group, _phases(cfg))
        facts = WorkerRuntime.agreement(cfg, plans, _run_facts(cfg, steps) + agree)
        if claim is not None:  # last: the root may move files (--overwrite)
            claim(cfg, workspace, world.rank == 0)
    except SingaError as err:
        error = (str(err), err.exit_code)
    except MemoryError as err:
        error = (str(out_of_memory(err)), ResourceError.exit_code)
    except KeyboardInterrupt as err:  # a second Ctrl-C during setup
        error = (f"interrupted ({err or 'Ctrl-C'})", EXIT_INTERRUPTED)
    verdicts = world.allgather_object((error, stops.received is not None, facts))
    code = _phase_one_verdict(world, cfg if facts is not None else None, verdicts)
    if code is not None:
        return code
    # -- phase 2: communication has started; any failure aborts the whole job
    try:
        _note(life, "setup: building the nets")
        if world.rank == 0:
            make_workspace(workspace)
        world.barrier()
        hooks = RoleHooks(note=lambda text: _note(life, text),
                          named=life.set_role if life is not None else (lambda name: None),
                          attach=stops.attach, finished=lambda: setattr(stops, "finished", True))
        return run_role(world, RoleJob(cfg, topo, plans, workspace, steps), body, hooks)
    except PeerLost as err:  # the dead rank's guardian names it: say nothing over it, then end the job
        time.sleep(1.0)
        if life is None or not life.guardian:
            os.write(2, f"singa-mpi: rank {world.rank}: {one_line(str(err))}\n".encode())
        world.abort(EXIT_ABORT)
    except SingaError as err:
        _abort(world, f"{err}", err.exit_code, life)
    except MemoryError as err:
        _abort(world, f"{out_of_memory(err)}", ResourceError.exit_code, life)
    except KeyboardInterrupt as err:  # a second Ctrl-C on this rank: one line, no traceback
        _abort(world, f"interrupted ({err or 'Ctrl-C'})", EXIT_INTERRUPTED, life)
    except BaseException as err:  # a bug or a signal: show where, then end every rank
        detail = "".join(traceback.format_exception(type(err), err, err.__traceback__))
        _abort(world, f"{type(err).__name__}: {err}", EXIT_ABORT, life, detail)
    return EXIT_ABORT


def _note(life, note: str) -> None:
    if life is not None:
        life.set_note(note)


def _run_facts(cfg: JobConfig, steps: int | None) -> list[tuple[str, str]]:
    """The values of the options every rank must share, as this rank's job has them."""
    return [("the seed (--seed, else the job's seed)", str(cfg.proto.seed)),
            ("the steps to train (--steps, else the job's train_steps)",
             str(steps if steps is not None else cfg.proto.train_steps)),
            ("the workers per group (--workers, else the job's cluster.nworkers_per_group)",
             str(cfg.proto.cluster.nworkers_per_group) if cfg.proto.cluster.HasField("nworkers_per_group")
             else "(not set)")]


def _phase_one_verdict(world, cfg: JobConfig | None, verdicts: list) -> int | None:
    """The exit code every rank returns after the phase-1 vote (rank 0 prints why), or None to go on:
    the first error; else a stop signal (75); else the first thing a rank does not share with rank 0."""
    from singa_mpi.runtimes.worker import WorkerRuntime, first_disagreement

    failed = [(rank, error) for rank, (error, _, _) in enumerate(verdicts) if error is not None]
    if failed:
        rank, (message, code) = failed[0]
        if world.rank == 0:
            where = "" if len(failed) == world.size else f" (on rank {rank})"
            print(f"singa-mpi: error{where}: {one_line(message)}", file=sys.stderr, flush=True)
        return code
    if any(stopped for _, stopped, _ in verdicts):
        if world.rank == 0:
            print(STOPPED_BEFORE_TRAINING, flush=True)
        return checkpoint.EXIT_CHECKPOINTED
    mismatch = first_disagreement([facts for _, _, facts in verdicts])
    if mismatch is None:
        return None
    rank, what, theirs, ours = mismatch
    files = world.allgather_object(cfg.path)
    if what == "the job":  # say where the jobs differ (one more exchange, only on this path)
        rank, what, theirs, ours = first_disagreement(world.allgather_object(WorkerRuntime.job_details(cfg))) \
            or mismatch
    if world.rank == 0:
        print(f"singa-mpi: error: ranks disagree: {what} is {theirs} on rank {rank} and {ours} on rank 0 "
              f"(job files: {files[0]} on rank 0, {files[rank]} on rank {rank}): expected every rank to run "
              f"the same job file with the same options", file=sys.stderr, flush=True)
    return ConfigError.exit_code


def _phases(cfg: JobConfig) -> list[str]:
    return (["train"] + (["test"] if cfg.proto.test_steps > 0 else [])
            + (["val"] if cfg.proto.validate_steps > 0 else []))


def check_inputs(cfg: JobConfig, workspace: str, phases: list[str], log: Callable[[str], None] | None) -> None:
    """Every file the input layers of ``phases`` read exists (as written, else under the workspace);
    scikit-learn's digits are prepared wherever a job asks for them (``log`` says so).  A missing
    file is a DataError naming the command that makes it."""
    from singa_mpi.data import prepare
    from singa_mpi.layers.input import resolve_path

    seen = set()
    for phase in phases:
        for index, layer in layers_for_phase(cfg.proto, phase):
            for field, path in prepare.store_files(layer):
                if path in seen or resolve_path(path, workspace) is not None:
                    continue
                seen.add(path)
                if field == "path" and prepare.is_bundled_digits(path, layer.store_conf):
                    if log is not None:
                        log(f"preparing scikit-learn's digits in {os.path.dirname(path)}/ (first use)")
                    prepare.prepare_digits(path, layer.store_conf)
                    continue
                todo = prepare.how_to_make(path, field, layer.store_conf, cfg.path)
                raise _missing(cfg, index, layer, "store_conf", field, path, workspace, todo)
            for conf, field, path, todo in prepare.reader_files(layer, cfg.path):  # DataShards, char-rnn text
                if path not in seen and resolve_path(path, workspace) is None:
                    raise _missing(cfg, index, layer, conf, field, path, workspace, todo)


def check_first_batches(cfg: JobConfig, workspace: str, phases: list[str]) -> None:
    """What the first step of each phase would find wrong with the data, found before any communication
    (every rank runs this in phase 1, so that data that every rank reads alike fails as one voted line):
    every input layer opens its data and reads the first global batch (all ranks' rows: the store
    decodes only these), label sources (kLabel) take their labels, and every loss layer looks at them.
    The layers are throw-away serial instances without parameters; a DataError says what the first
    step would have said."""
    import numpy as np

    from singa_mpi.layers.base import LayerContext
    from singa_mpi.net import global_batch_size, instantiate, phase_nodes

    for phase in phases:
        nodes = phase_nodes(cfg, phase)
        batch, train = global_batch_size(cfg, nodes), phase == "train"
        built = instantiate(cfg, nodes, lambda node: LayerContext(global_batch=batch, seed=cfg.proto.seed,
                                                                   workspace=workspace, phase=phase))
        by_name = {node.name: layer for node, layer, _ in built}
        read: dict[str, np.ndarray] = {}  # the output of each layer that read (input layers, label sources)
        try:
            for node, layer, kinds in built:
                srcs = [by_name[name] for name in node.conf.srclayers if name in by_name]
                if layer.is_input and not srcs:
                    if hasattr(layer, "open"):
                        layer.open(cache=False)
                    read[node.name] = layer.forward([], train)
                elif getattr(layer, "provides_labels", False) and srcs and all(s.name in read for s in srcs):
                    read[node.name] = layer.forward([s.aux if k == "aux" else read[s.name]
                                                     for s, k in zip(srcs, kinds)], train)
                elif layer.is_loss and "aux" in kinds[:len(srcs)]:
                    labels = srcs[kinds.index("aux")]
                    if labels.name in read and labels.aux is not None:  # scores of the right shape, and these labels
                        scores = np.zeros((len(labels.aux),) + srcs[kinds.index("data")].out_shape, np.float32)
                        try:
                            layer.forward([labels.aux if k == "aux" else scores for k in kinds[:len(srcs)]], train)
                        except DataError as err:
                            raise DataError(f"{err}, in the first batch{_read_from(labels, by_name)}") from None
        finally:
            for layer in by_name.values():
                store = getattr(layer, "store", None)
                if store is not None:
                    store.close()


def _read_from(layer, layers: dict) -> str:
    """" of layer 'data' read from PATH": the input layer (and its store) that ``layer``'s labels come from."""
    while getattr(layer, "store", None) is None and layer.conf.srclayers and layer.conf.srclayers[0] in layers:
        layer = layers[layer.conf.srclayers[0]]  # a label source (kLabel) takes them from its input layer
    store = getattr(layer, "store", None)
    return f" of layer '{layer.name}'" + (f" read from {store.path}" if store is not None else "")


def _missing(cfg: JobConfig, index: int, layer, conf: str, field: str, path: str, workspace: str,
             todo: str) -> DataError:
    """One line: where the job names the file, which layer, where it was looked for, how to make it."""
    where = "" if workspace in ("", ".") else f" or in the workspace {workspace}"
    return DataError(f"{cfg.layer_where(index, conf, field)}: layer '{layer.name}': {conf}.{field} {path}: "
                     f"no such file (looked in the current folder {os.getcwd()}{where}): {todo}")


def with_workers(job: str | JobConfig, workers: int | None):
    """``--workers N``: the job with cluster.nworkers_per_group = N, read when the launcher asks
    (in phase 1, so that a bad file is reported once)."""
    if workers is None:
        return job

    def load() -> JobConfig:
        cfg = job if isinstance(job, JobConfig) else load_job(job)
        cfg.proto.cluster.nworkers_per_group = cfg.workers = workers
        return cfg

    return load


def _topology(cfg: JobConfig, size: int, log: Callable[[str], None] | None = None):
    """Every rank's role from the job's cluster (pure but for the note ``log`` gets; ConfigError for
    shapes not built and for a rank count that does not fit)."""
    cluster = cfg.proto.cluster
    if cluster.HasField("nworkers_per_group") and cluster.nworkers_per_group != size and \
            cluster.nworker_groups <= 1 and not cluster.server_worker_separate:
        workers = cluster.nworkers_per_group
        if cfg.workers is not None:  # asked for with --workers
            raise ConfigError(f"--workers {workers}: expected the number of MPI ranks ({size}); "
                              f"launch with mpirun -n {workers} or pass --workers {size}")
        note = follow_launched_count(cfg, size)
        if log is not None:
            log(note)
    single = cluster.nworker_groups <= 1 and not cluster.server_worker_separate
    topo = topology(size, cluster, nworkers=None if cluster.HasField("nworkers_per_group") or not single else size,
                    where=cfg.where("cluster"))
    check_supported(topo, cfg.where("cluster"))
    return topo


def follow_launched_count(cfg: JobConfig, size: int) -> str:
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
                              f"cluster.nworkers_per_group is {workers}): launch with mpirun -n {workers}")
    cfg.proto.cluster.nworkers_per_group = size
    return (f"note: {where}: cluster.nworkers_per_group = {workers} in the job; running on the {size} "
            f"launched rank(s)")


def _abort(world, message: str, code: int, life=None, traceback_text: str = "") -> None:
    step = world.tracer.step
    shown = one_line(message) + (f"\n{traceback_text}" if traceback_text else "")
    os.write(2, f"singa-mpi: rank {world.rank}: error at step {step}: {shown}\n".encode())
    if life is not None:
        life.explained()  # the guardians need not name this rank: it said why it ends the job
    progress.drain_stdout()  # what this rank printed before it ends the job
    world.abort(code)
