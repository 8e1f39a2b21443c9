"""Running a request: describe the launch, vote on it, build the runtime, run the command's body.

In one process (or an MPI world of 1) the serial runtime runs the whole net.  Under MPI a job fails in
one of two ways, and neither hangs:

* before any communication but the vote (reading, checking and planning the job, reading its
  checkpoint files and the first batch of its data, which every rank does by itself): the ranks
  exchange their verdicts once, rank 0 prints the first error (naming the rank when not every rank met
  it), and every rank exits with its code;
* after that (a bad label at step 40, a bug, a signal): the failing rank prints what failed where
  (rank, layer, step) and calls MPI_Abort, which ends every rank promptly.  A rank that stops
  responding is caught by the ``--stall-timeout`` watchdog, from MPI_Init on, which names it.

The vote also compares what every rank must share (seed, steps, workers, run options, the job, the
plugins, the schedule, the checkpoint it starts from, the first batch each input layer read), so ranks
started differently stop with one line instead of deadlocking or training apart.  A rank that vanishes (SIGKILL, the OOM killer) is named by its guardian
(:mod:`singa_mpi.communication.liveness`).  Stop signals are caught from the start
(:class:`~singa_mpi.stop_signals.StopSignals`): during setup the run stops before training (exit 75,
nothing written).
"""
from __future__ import annotations

import os
import sys
import time
import traceback
import warnings
from typing import Callable

from singa_mpi import progress, run_events, threads
from singa_mpi.checkpoints.hdf5 import Checkpoint
from singa_mpi.communication import keeper
from singa_mpi.errors import PeerLost, ResourceError, SingaError, one_line, out_of_memory
from singa_mpi.launcher.checks import Start, read_before_start
from singa_mpi.launcher.describe import Launch, World, describe, read_job, topology_of
from singa_mpi.launcher.options import Request
from singa_mpi.launcher import said_once
from singa_mpi.launcher.start import mpi_world, rank_life, world_facts
from singa_mpi.launcher.vote import Verdict, phase_one_verdict, starts_from
from singa_mpi.layers.output import output_files
from singa_mpi.runtimes.serial import SerialRuntime
from singa_mpi.stop_signals import StopSignals
from singa_mpi.trainer import Trainer
from singa_mpi.workspace import claim_workspace, make_workspace

EXIT_ABORT = 1
PEER_LOST_WAIT = 15.0  # seconds a kept rank that lost a peer waits for the supervisor's request first
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a process ended by Ctrl-C

# what a command does once its runtime and trainer exist: body(trainer, initial) -> exit code, where
# ``initial`` is what :func:`~singa_mpi.launcher.checks.read_before_start` read
Body = Callable[[Trainer, Checkpoint | None], int]


def launch(request: Request, body: Body) -> int:
    """Run ``request`` with ``body``: serially in one process, else the two-phase MPI protocol.
    ``train`` catches SIGINT, SIGTERM and SIGUSR1 from the start (:class:`StopSignals`).  The
    warning filters the run adds (:mod:`~singa_mpi.launcher.said_once`) end with it."""
    with warnings.catch_warnings():
        return _launch(request, body)


def _launch(request: Request, body: Body) -> int:
    stops = StopSignals()
    life, tracer = rank_life(request.options.stall_timeout)  # before MPI_Init: its watchdog covers the wait
    stops.is_root = tracer is None or tracer.rank == 0
    world = None
    try:
        if request.trains:
            stops.install()
        world = mpi_world(tracer, life)
        if world is None:
            if life is not None:
                life.close()
                life = None
            return run_serial(request, body, stops)
        if life is None:  # a launcher that does not announce ranks in the environment: from now on
            life, _ = rank_life(request.options.stall_timeout, world.rank, world.size, world.tracer)
            world.status = life.record if life is not None else None
        if life is not None:  # a stop a rank's MPI wait would hold: acknowledged, and a stall named
            stops.watch_from_thread(life.watchdog.stop_signal)
            stops.ended_ranks = life.ended_ranks
        return run_parallel(world, request, body, stops, life)
    finally:
        stops.restore(keep_ignoring=world is not None and stops.received is not None)
        if life is not None:
            life.close()


def run_serial(request: Request, body: Body, stops: StopSignals) -> int:
    with said_once.said_at_the_end():
        the_launch = describe(read_job(request), World(), request)
        for line in the_launch.notes:
            print(line, flush=True)
        initial = read_before_start(the_launch, request, True, log=print).initial
    _claim(the_launch, request, True)
    make_workspace(the_launch.workspace)  # `test` claims nothing: a bad workspace is one line here too
    cfg = the_launch.cfg
    trainer = Trainer(cfg, the_launch.workspace, SerialRuntime(cfg, cfg.proto.seed, the_launch.workspace),
                      train_steps=the_launch.steps)
    stops.attach(trainer)
    try:
        return _run_body(trainer, the_launch, lambda: body(trainer, initial))
    finally:
        stops.finished = True


def run_parallel(world, request: Request, body: Body, stops: StopSignals, life) -> int:
    """Phase 1: every rank describes the launch and reads its files alone, then one vote (errors,
    stop signals, and what every rank must share: a rank with another job or other options would
    deadlock in phase 2).  Phase 2: each rank's role.  What the vote cannot carry (a failure in phase
    2, or a bug anywhere: the other ranks then wait in a collective) aborts the whole job."""
    try:
        return _both_phases(world, request, body, stops, life)
    except PeerLost as err:  # the dead rank's guardian names it: say nothing over it, then end the job
        # a kept rank (singa-mpi run --elastic) waits to be asked for its state: the rescue ends it
        time.sleep(PEER_LOST_WAIT if keeper.kept() else 1.0)
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


def _both_phases(world, request: Request, body: Body, stops: StopSignals, life) -> int:
    from singa_mpi.runtimes.roles import RoleHooks, RoleJob, run_role

    _note(life, "setup: reading and planning the job")
    facts = world_facts(world)
    with said_once.recorded() as said:
        read, error = _attempt(lambda: read_job(request))
        chosen, auto_error = _auto_dims(world, read, facts)  # collective: every rank takes rank 0's choice
        error = error or auto_error
        the_launch, start = None, None
        if error is None:
            the_launch, error = _attempt(lambda: describe(read, facts, request, chosen))
        if error is None:
            for line in the_launch.notes if world.rank == 0 else ():
                print(line, flush=True)
            start, error = _attempt(lambda: _read_and_claim(the_launch, request, world.rank == 0))
    initial = start.initial if start is not None else None
    facts = the_launch.facts + (starts_from(initial),) + start.first_batches if start is not None else None
    verdicts = world.allgather_object(Verdict(error, stops.received is not None, facts, said))
    said_once.say(said_once.union([verdict.warnings for verdict in verdicts]), speaks=world.rank == 0)
    code = phase_one_verdict(world, the_launch.cfg if the_launch is not None else None, verdicts)
    if code is not None:
        return code
    # -- phase 2: communication has started; any failure aborts the whole job
    _note(life, "setup: building the nets")
    if world.rank == 0:
        make_workspace(the_launch.workspace)
    world.barrier()
    hooks = RoleHooks(note=lambda text: _note(life, text),
                      named=life.set_role if life is not None else (lambda name: None),
                      attach=stops.attach, finished=lambda: setattr(stops, "finished", True))
    job = RoleJob(the_launch.cfg, the_launch.topo, the_launch.programs, the_launch.workspace, the_launch.steps)
    return run_role(world, job, lambda trainer: _run_body(trainer, the_launch, lambda: body(trainer, initial)),
                    hooks)


def _attempt(step: Callable):
    """(``step()``, None), or (None, (message, exit code)) for what phase 1 reports by vote."""
    try:
        return step(), None
    except SingaError as err:
        return None, (str(err), err.exit_code)
    except MemoryError as err:
        return None, (str(out_of_memory(err)), ResourceError.exit_code)
    except KeyboardInterrupt as err:  # a second Ctrl-C during setup
        return None, (f"interrupted ({err or 'Ctrl-C'})", EXIT_INTERRUPTED)


def _read_and_claim(the_launch: Launch, request: Request, is_root: bool) -> Start:
    start = read_before_start(the_launch, request, is_root, log=print if is_root else None)
    _claim(the_launch, request, is_root)  # last: the root may move files (--overwrite)
    return start


def _auto_dims(world, read, facts: World):
    """(rank 0's choice (:class:`~singa_mpi.cost.auto.Choice`) for the job's `partition_dim: auto` layers,
    rank 0's error choosing as (message, exit code)), on every rank (one choice: kernel timings differ
    between ranks); a net whose every layer is `auto` may become a pipeline.  Every rank calls this; the
    choice is None where there is nothing to choose or rank 0 could not: every rank then reports its
    error, which rank 0 alone met (the vote prints it once)."""
    def choose():
        from singa_mpi.cost.auto import auto_layers, choose_for_job
        from singa_mpi.config.load import wants_deterministic
        from singa_mpi.launcher.describe import sync_method

        cfg = read[0]
        if not auto_layers(cfg):
            return None
        topo, _ = topology_of(cfg, world.size, facts.launcher)
        method = sync_method(topo, facts, wants_deterministic(cfg.proto))
        return choose_for_job(cfg, topo.workers_per_group, method, nodes=facts.nodes, pipelines=True)

    choice, error = _attempt(choose) if world.rank == 0 and read is not None else (None, None)
    return world.root_value((choice, error), "partition_dim: auto")


def _claim(the_launch: Launch, request: Request, is_root: bool) -> None:
    """``train`` claims its workspace (refusing another run's, or moving it aside with --overwrite)."""
    if request.trains:
        claim_workspace(the_launch.workspace, request.options, is_root,
                        outputs=output_files(the_launch.cfg.proto, the_launch.workspace))


def _run_body(trainer: Trainer, the_launch: Launch, run: Callable[[], int]) -> int:
    """``run()`` with the BLAS threads chosen for this rank and the job's size (singa_mpi.threads), the
    trainer told the params' logical shapes (its checkpoints' job identity): both from the launch."""
    def warn(line: str) -> None:
        print(f"warning: {line}", file=sys.stderr, flush=True)

    trainer.job_params = dict(the_launch.summary.params)
    work = threads.work_per_step(trainer.cfg, the_launch.summary, trainer.runtime.size)
    with threads.blas_threads(warn=warn if trainer.runtime.is_root else None, work=work):
        return run()


def _note(life, note: str) -> None:
    if life is not None:
        life.set_note(note)


def _abort(world, message: str, code: int, life=None, traceback_text: str = "") -> None:
    step = world.tracer.step
    shown = one_line(message) + (f"\n{traceback_text}" if traceback_text else "")
    what = f"error at step {step}: {shown}\n"
    line = f"singa-mpi: rank {world.rank}: {what}"
    # claimed: the guardians need not name this rank, and another rank's watchdog that would end the
    # job waits until this line is out (liveness.await_verdict); a rank that met the same error as
    # the claimant says nothing more
    if life is not None and life.explained():
        life.say(line)
    elif life is None or not life.says_the_same(what):
        os.write(2, line.encode())
    run_events.note("error", rank=world.rank, step=step, code=code, message=one_line(message))
    progress.drain_stdout()  # what this rank printed before it ends the job
    world.abort(code)
