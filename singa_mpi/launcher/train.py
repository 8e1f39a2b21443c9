"""The ``train`` command: start from the job's checkpoint files or resume the workspace's newest
checkpoint, train (stopping on the signals caught), and say how to resume."""
from __future__ import annotations

import os
import shlex
import sys
from typing import Callable

from singa_mpi import durable, plugins, profiling, progress, run_events, timeline, timeline_parts
from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.checkpoints.emergency import Rescue
from singa_mpi.communication import liveness
from singa_mpi.config.load import JobConfig
from singa_mpi.errors import DataError, NonFiniteError, one_line
from singa_mpi.launcher.checks import merged_checkpoint_paths, resumes
from singa_mpi.launcher.options import Request, RunOptions
from singa_mpi.launcher.run import launch
from singa_mpi.launcher.start import launcher_name
from singa_mpi.runtimes.serial import SerialRuntime
from singa_mpi.stop_signals import STOPPED_BEFORE_TRAINING
from singa_mpi.trainer import Trainer, write_stop_note
from singa_mpi.workspace import JOB_FILE, write_job_file


def run_training(job: str | JobConfig, workspace_of: Callable[[JobConfig], str],
                 options: RunOptions | None = None) -> int:
    """Train ``job``; ``workspace_of(cfg)`` names the output folder.  Returns the exit code:
    0 when done, ``checkpoint.EXIT_CHECKPOINTED`` (75) when stopped by SIGINT/SIGTERM/SIGUSR1 after
    writing a checkpoint."""
    from singa_mpi.communication.liveness import launched_rank

    request = Request(job, workspace_of, options or RunOptions())
    # a launcher that stops reading the ranks' output (Open MPI's mpirun, signalled) must not stop the run
    with progress.forwarded_stdout(launched=launched_rank() is not None):
        return launch(request, lambda trainer, initial: train(trainer, request.options, initial))


def train(trainer: Trainer, options: RunOptions, initial: checkpoint.Checkpoint | None = None) -> int:
    """Initialise (``initial``: the job's checkpoint_path files, already read) or resume, run (stopping on
    the signals :class:`StopSignals` caught); returns the exit code."""
    trainer.keep = options.keep
    trainer.print_profile = options.profile
    trainer.debug = options.debug
    trainer.finite.switch = options.said("--no-check-finite")  # how the caller turns it off (the API: fit's)
    if not options.check_finite:
        trainer.finite.switch_off(list(trainer.nets().values()))
    if options.trace:  # record from here on, one clock on every rank
        serial = isinstance(trainer.runtime, SerialRuntime)
        run = timeline.start(trainer.runtime, None if serial else options.trace)
    _load_initial_state(trainer, options, initial)
    if options.write_job and trainer.runtime.is_root:  # this run is the job's now: its file names it
        path = os.path.join(os.path.dirname(trainer.cfg.path), JOB_FILE)
        try:
            write_job_file(path, trainer.cfg.text)
        except durable.NotDurable as err:  # there for the run and a resume; the disk is failing
            trainer.log(f"note: {path}: {durable.not_durable(err)}")
        except OSError as err:  # a full disk: one line, as a checkpoint's, not the OS's exception
            raise DataError(f"{path}: cannot write the run's job file: {checkpoint.disk_problem(err)}") from None
    trainer.rescue = Rescue.from_environment(trainer)  # under `singa-mpi run --elastic` only
    if trainer.rescue is not None:
        trainer.rescue.start()
    # server ranks wait for their initial state before anything else
    trainer.runtime.begin_training(trainer.loaded, trainer.finite.enabled)
    if trainer.start_step > 0 and trainer.start_step >= trainer.train_steps:
        trainer.log(nothing_to_do(trainer.start_step, trainer.train_steps, options))
        return 0
    if trainer.runtime.any(trainer.stop_requested):  # a signal during setup (StopSignals): stop before step 1
        trainer.log(STOPPED_BEFORE_TRAINING)
        if trainer.runtime.is_root:
            write_stop_note(trainer.workspace, [STOPPED_BEFORE_TRAINING])
        return checkpoint.EXIT_CHECKPOINTED
    trainer.training = True  # a stop signal from now on: after the step, with a checkpoint
    trainer.resume_flag = options.said("--resume")
    trainer.resume_hint = f"resume with: {options.resume_hint or resume_command(trainer, options)}"  # a stop's note too
    if options.trace:
        _write_trace_parts(trainer, options, run)
    try:
        trainer.run()
    except NonFiniteError as err:
        # every rank stops at the same step (voted): the profile and the timeline up to it (collective), the
        # profile where a failed run's goes (its own file under run --elastic: the restart writes profile.json)
        trainer.finish_profile(_failed_profile())
        _finish_trace(trainer, options)
        return _stopped_on_nonfinite(trainer, err)
    except Exception:
        if isinstance(trainer.runtime, SerialRuntime):  # the one rank: what it recorded is the whole run's
            _keep_the_record(trainer, options)
        else:
            _keep_what_it_can(trainer, options)
        raise
    _finish_trace(trainer, options)
    if trainer.stopped:
        trainer.log(trainer.resume_hint)
        if trainer.runtime.is_root:
            progress.also_on_stderr(trainer.resume_hint)
        return checkpoint.EXIT_CHECKPOINTED
    return 0


def nothing_to_do(at: int, steps: int, options: RunOptions) -> str:
    """Why a resumed run at checkpoint step ``at`` trains no step, in the words of whoever set the last step
    (``--steps``, as the caller spells it, else the job's train_steps), and what to give instead."""
    flag = options.said("--steps")
    flag = flag if "{}" in flag else flag + " {}"  # the caller's words, the count in place of {}
    further = f"expected {flag.format('N')} with N above {at} to train further (N counts from step 0)"
    if options.steps is not None:
        return f"nothing to do: {flag.format(steps)} is not beyond the checkpoint's step {at}: {further}"
    return f"nothing to do: the job's train_steps {steps} is not beyond the checkpoint's step {at}: {further}"


def _write_trace_parts(trainer: Trainer, options: RunOptions, run: str) -> None:
    """Under MPI with --trace, each rank writes its spans, step by step, to its own part file: a failure
    aborts the job before the ranks' timelines can be gathered (``_keep_the_timelines``; a rank that
    vanished: its guardian)."""
    if not isinstance(trainer.runtime, SerialRuntime):
        part = timeline_parts.PartWriter(options.trace, trainer.runtime.tracer, run)
        trainer.trace_part, trainer.after_step = part, part.flush
        # a rank killed outright (SIGKILL, the out-of-memory killer) leaves no rank to merge the parts:
        # its guardian process does (singa_mpi.communication.guardian), and writes the profile from them
        liveness.tell_guardian_of_trace(options.trace, run, os.path.join(trainer.workspace, _failed_profile()),
                                        trainer.runtime.size)


def _finish_trace(trainer: Trainer, options: RunOptions) -> None:
    """--trace: every rank's timeline to the root, which writes the file (collective); the ranks' part
    files are not needed any more."""
    if options.trace:
        trainer.log(timeline.finish(trainer.runtime, options.trace))
        if trainer.trace_part is not None:  # the trace is written: a part that stopped early does not matter
            trainer.trace_part.close(remove=True)


def _keep_the_record(trainer: Trainer, options: RunOptions) -> None:
    """A serial run that failed: its profile and --trace timeline up to the failure, as a stopped run's.
    (Under MPI the failing rank aborts the job: the other ranks' parts cannot be gathered.)  A second
    failure here is one note: the first is the one reported."""
    try:
        trainer.finish_profile(_failed_profile())
        _finish_trace(trainer, options)
    except Exception as err:
        trainer.log(f"note: the profile or timeline of the failed run could not be written: {one_line(str(err))}")


def _keep_what_it_can(trainer: Trainer, options: RunOptions) -> None:
    """A rank that failed under MPI (or saw another fail): its failure aborts the job, so the ranks'
    profiles and timelines cannot be gathered.  It writes both itself: its own up to the failure and,
    under --trace, the others' from the part files they wrote as they ran (each up to its last
    written step), read once for both."""
    part = trainer.trace_part
    read: list = []
    if part is not None:
        part.close()
        read = timeline_parts.read_parts(options.trace, part.run)
    _keep_the_profile(trainer, options, read)
    if part is not None:
        _keep_the_timelines(trainer, options, part, read)


def _keep_the_profile(trainer: Trainer, options: RunOptions, read: list) -> None:
    """WORKSPACE/profile.json (:func:`_failed_profile`) of a run that failed under MPI
    (:func:`profiling.build_partial`): this rank's totals up to its failure, the others' from their
    timeline parts ``read`` (under --trace), and one line saying whose it holds.  A failure here is one note: the first is the one reported."""
    tracer = trainer.runtime.tracer
    try:
        parts = {header["rank"]: profiling.part_from_spans(spans) for header, spans in read
                 if header["rank"] != tracer.rank}
        parts[tracer.rank] = profiling.worker_part(tracer, trainer.evaluation_totals)
        profile = profiling.build_partial(parts, trainer.runtime.size)
        path, caveat = os.path.join(trainer.workspace, _failed_profile()), ""
        try:
            profiling.write(trainer.workspace, profile, _failed_profile())
        except durable.NotDurable as err:  # in place: its line is said, and what the disk did
            caveat = f" ({durable.not_durable(err)})"
    except Exception as err:
        why = err.strerror if isinstance(err, OSError) and err.strerror else str(err)
        print(f"note: {os.path.join(trainer.workspace, _failed_profile())}: the profile of the failed run could not "
              f"be written: {one_line(why)}", flush=True)
        return
    line = f"profile {path}: rank {tracer.rank} up to its failure"
    others, missing = sorted(rank for rank in parts if rank != tracer.rank), profile["missing"]
    if not options.trace:
        line += (" alone: the other ranks' totals are lost with the aborted job (--trace keeps each rank's "
                 "up to its last written step)") if missing else ""
    else:
        line += f", ranks {' '.join(map(str, others))} up to their last written step (their --trace parts)" \
            if others else ""
        line += f"; no part of ranks {' '.join(map(str, missing))} was found (on another node's disk?)" \
            if missing else ""
    print(line + caveat, flush=True)


def _failed_profile() -> str:
    """The name of a failed run's profile in its workspace: profile.json, or under ``singa-mpi run --elastic``
    the attempt's own, which the restart's profile.json does not replace (:func:`profiling.failed_file`)."""
    return profiling.failed_file(run_events.attempt())


def _keep_the_timelines(trainer: Trainer, options: RunOptions, part: timeline_parts.PartWriter, read: list) -> None:
    """The --trace timeline of a rank that failed under MPI: written from the ranks' part files ``read``
    (each up to the rank's last written step) and its own spans (``part``: its own part file's writer),
    up to the failure.  A failure here is one note: the first is the one reported."""
    tracer = trainer.runtime.tracer
    try:
        written = timeline.write_from_parts(options.trace, part.run, timeline.rank_trace(tracer), read=read)
    except Exception as err:
        print(f"note: the timeline of the failed run could not be written: {one_line(str(err))}", flush=True)
        return
    if part.note:  # this rank's own spans are in the trace whole, from memory
        print(part.note, flush=True)
    assert written is not None  # this rank's own part at least
    line, ranks = written
    missing = trainer.runtime.size - len(ranks)
    lost = f"; {missing} rank(s)' parts were not found (on another node's disk?)" if missing > 0 else ""
    print(f"{line} (up to the failure: rank {tracer.rank}'s to its failure, the others' to their last "
          f"written step; ranks {' '.join(map(str, ranks))}{lost}; the job is aborted)", flush=True)


def _stopped_on_nonfinite(trainer: Trainer, err: NonFiniteError) -> int:
    """Every rank raised ``err`` at the same step (the verdict is voted): under MPI the root prints
    the one line and all ranks exit with its code, with no abort; serially the CLI reports it."""
    if isinstance(trainer.runtime, SerialRuntime):
        raise err
    if trainer.runtime.rank == 0 and getattr(trainer.runtime.place, "groups", 1) > 1:
        trainer.nonfinite_said = err.finding or str(err)  # the job's root says every group's in one line
    # the root of the group that found it prints (other groups' roots hold a pointer to it)
    elif trainer.runtime.rank == 0 and "another worker group" not in str(err) and "see rank 0" not in str(err):
        print(f"singa-mpi: error: {err}", file=sys.stderr, flush=True)
    return err.exit_code


def resume_command(trainer: Trainer, options: RunOptions, environ=None) -> str:
    """The command that continues this run from its newest checkpoint (it may run on any number of
    ranks), with the launcher that started this one (``environ``: default this process's)."""
    size, environ = launched_ranks(trainer.runtime), os.environ if environ is None else environ
    supervised = environ.get(run_events.SUPERVISOR_VARIABLE)
    if supervised:  # under `singa-mpi run`: resumed the way it was started
        words = shlex.split(supervised)
    else:
        words = [launcher_name(environ), "-n", str(size), "python", "-m", "singa_mpi"] if size > 1 else ["singa-mpi"]
        words.append("train")
    words += [trainer.cfg.path, "--workspace", trainer.workspace]
    for flag, value in (("--steps", options.steps), ("--seed", options.seed), ("--keep", options.keep),
                        ("--workers", options.workers)):
        if value is not None:
            words += [flag, str(value)]
    for spec in plugins.requested():  # the job cannot be read without them
        words += ["--plugin", spec]
    if not options.check_finite:
        words.append("--no-check-finite")
    if options.deterministic:
        words.append("--deterministic")
    return shlex.join(words + ["--resume"])


def launched_ranks(runtime) -> int:
    """The ranks the job runs on: under a framework (worker groups, servers) every group's and every
    server's, where the worker runtime's ``size`` is its group's (a Downpour job of 3 ranks was told to
    resume with `singa-mpi train`, a Sandblaster one with one rank too few)."""
    place = getattr(runtime, "place", None)
    return place.world.size if place is not None else runtime.size


def _load_initial_state(trainer: Trainer, options: RunOptions, initial: checkpoint.Checkpoint | None = None) -> None:
    """--resume: the workspace's newest good checkpoint; else the job's checkpoint_path files.  Both
    are ``initial`` when :func:`~singa_mpi.launcher.checks.read_before_start` read them before (every
    rank, before the vote: a damaged or another job's checkpoint is one voted line there)."""
    job = trainer.job
    if resumes(trainer.workspace, options.resume) and initial is not None:
        trainer.log(f"resuming from {initial.path} (step {initial.step})")
        trainer.restore(initial, full=True, allow_partial=options.allow_partial)
        return
    if options.resume:
        trainer.log(f"note: no checkpoint in {checkpoint.checkpoint_dir(trainer.workspace)}: starting at step 0")
    if job.checkpoint_path:  # a fresh start (a first --resume of a requeued job included)
        merged = initial or merged_checkpoint_paths(trainer.cfg, trainer.job_params)
        trainer.log(f"initialising parameters from {', '.join(job.checkpoint_path)}")
        trainer.restore(merged, full=False, allow_partial=options.allow_partial)
