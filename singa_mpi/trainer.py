"""The training loop: SINGA 0.3's Worker::Run order, metrics, progress lines.

Per step ``s`` (from ``job.step`` while ``s < train_steps``): checkpoint if due
(``steps.h5``: the state after ``s`` batches), validate if due, test if due,
train one batch, vote (stop signals and non-finite values, see
:mod:`singa_mpi.nonfinite`), display if due.  Test and validation happen at
step 0 too, before the first batch, as in SINGA; singa_mpi also validates and
tests once more after the last step (in that order, SINGA's) so that the final model
is always measured, as Keras's fit validates after its last epoch.

A runtime (:mod:`singa_mpi.runtimes`) supplies this process's nets and the
reductions across workers; the serial runtime is the one-process case.
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from typing import TYPE_CHECKING, Callable, Iterator

from singa_mpi import durable
from singa_mpi import profiling
from singa_mpi import progress
from singa_mpi import run_events
from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.algorithms import algorithm_name, make_algorithm
from singa_mpi.config.load import JobConfig, wants_deterministic
from singa_mpi.data.convert import atomic_path
from singa_mpi.cost.beside import Prediction, beside_lines
from singa_mpi.layers.base import fold_block_sums, layer_class_of
from singa_mpi.net import Net, global_batch_size, phase_nodes
from singa_mpi.errors import DataError, NonFiniteError
from singa_mpi.nonfinite import LOSS, NonFiniteCheck, advice
from singa_mpi.proto import job_pb2
from singa_mpi.updaters import load_blas, make_updater

if TYPE_CHECKING:
    from singa_mpi import timeline_parts


# SINGA 0.3 include/singa/worker.h, verbatim semantics
def drop_records_from(path: str, step: int) -> None:
    """Keep metrics.jsonl's records of steps before ``step`` (a resume's checkpoint: a run that went
    on past it and died reported steps that the resumed run reports again), rewritten atomically."""
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:
        return
    kept = []
    for line in lines:
        try:
            if json.loads(line).get("step", 0) < step:
                kept.append(line)
        except ValueError:  # a line the dead run left half-written
            continue
    if len(kept) == len(lines):
        return
    with atomic_path(path, "the run's metrics") as temporary, open(temporary, "w") as f:
        f.write("".join(line + "\n" for line in kept))


def lost_progress_line(job: job_pb2.JobProto, path: str, step: int) -> str | None:
    """A run resumed from a checkpoint at ``step`` whose step before is a progress step with no train
    record in metrics.jsonl (``path``): the run that trained it ended inside that step after its update
    (a rank died; the survivors' emergency checkpoint holds the update, docs/self-healing.md), and its
    line was never printed.  The line that says so, or None."""
    last = step - 1
    if last < 0 or not display_now(job, last):
        return None
    try:
        with open(path) as f:
            lines = f.read().splitlines()
    except OSError:  # no record to go by
        return None
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("step") == last and entry.get("phase") == "train":
            return None
    return (f"step {last}: no progress line: the run before this one ended inside that step, after its update, "
            f"so its metrics were never reported (this run resumed from the checkpoint at step {step}, past it)")


def display_now(job: job_pb2.JobProto, step: int) -> bool:
    return job.disp_freq > 0 and step >= job.disp_after and (step - job.disp_after) % job.disp_freq == 0


def test_now(job: job_pb2.JobProto, step: int) -> bool:
    return (job.test_freq > 0 and job.test_steps > 0 and step >= job.test_after
            and (step - job.test_after) % job.test_freq == 0)


def checkpoint_now(job: job_pb2.JobProto, step: int) -> bool:
    return (job.checkpoint_freq > 0 and step >= job.checkpoint_after
            and (step - job.checkpoint_after) % job.checkpoint_freq == 0)


def validate_now(job: job_pb2.JobProto, step: int) -> bool:
    return (job.validate_freq > 0 and job.validate_steps > 0 and step >= job.validate_after
            and (step - job.validate_after) % job.validate_freq == 0)


# metrics that count (updates of the slowest and fastest worker group, the largest staleness)
COUNTS = frozenset({"staleness_max", "slowest_group", "fastest_group"})


def collected_metrics(runtime, net: Net) -> dict[str, float]:
    """The sums of ``net``'s metrics since the last call over every worker (collective), each
    metric's per-block sums folded in block order (deterministic mode: the same on any rank count)."""
    return fold_block_sums(runtime.reduce_metrics(net.collect_metrics()))


def added(window: dict[str, float], metrics: dict[str, float]) -> dict[str, float]:
    """The metric sums of ``window`` and ``metrics`` added key by key (``metrics`` itself when the
    window is empty: no rounding a run without a checkpoint in its window would not do)."""
    if not window:
        return metrics
    return {key: window.get(key, 0.0) + metrics.get(key, 0.0) for key in {**window, **metrics}}


def summarize(metrics: dict[str, float]) -> dict[str, float]:
    """Sums over rows -> means: each metric ``k`` divided by its own row count ``k/count``.

    Layers report a count per metric, so a loss and a kAccuracy layer are each
    averaged over the rows that produced them.  Loss first, then the rest by name;
    a metric without a count is kept as its total.
    """
    keys = sorted((k for k in metrics if not k.endswith("/count")), key=lambda k: (k != "loss", k))
    means = {}
    for key in keys:
        count = metrics.get(f"{key}/count")
        means[key] = metrics[key] if count is None else metrics[key] / count if count else float("nan")
    return means


STOP_NOTE = "stopped.txt"  # in the workspace: what the last stop saved (or, while it runs, what there is)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def write_stop_note(workspace: str, lines: list[str]) -> str | None:
    """WORKSPACE/stopped.txt with ``lines`` (written whole, then renamed); its path, or None where the
    workspace cannot be written (the stop goes on: this note is not worth failing it).  A note whose
    folder's fsync failed (durable.NotDurable) is there to read: its path."""
    path = os.path.join(workspace, STOP_NOTE)
    try:
        checkpoint.write_whole(path, "".join(f"{line}\n" for line in lines))
    except durable.NotDurable:
        return path
    except OSError:  # (no stopped.txt.tmp<PID> left: a full disk's is removed)
        return None
    return path


class Trainer:
    """Runs a job: builds the nets of each phase, trains, tests, logs metrics."""

    def __init__(self, cfg: JobConfig, workspace: str, runtime, log: Callable[[str], None] = print,
                 train_steps: int | None = None):
        self.cfg = cfg
        self.job = cfg.proto
        self.workspace = workspace
        self.runtime = runtime
        self.log = log if runtime.is_root else (lambda line: None)
        self.train_steps = train_steps if train_steps is not None else self.job.train_steps
        self.algorithm = make_algorithm(self.job.train_one_batch)
        self.algorithm.bind(self.job)
        self.updater = make_updater(self.job.updater, exact=wants_deterministic(self.job))
        load_blas()  # before the clock starts
        self.train_net = runtime.build_net("train")
        evaluates = runtime.evaluates  # several worker groups: group 0 alone
        self.test_net = runtime.build_net("test") if self.job.test_steps > 0 and evaluates else None
        self.val_net = runtime.build_net("val") if self.job.validate_steps > 0 and evaluates else None
        self.loaded = None  # (checkpoint, full) restored before training, for the servers
        # the job's params -> logical shape, as checking the job found them (checks.job.Summary.params), for
        # its checkpoints' job identity; the launch sets them (None: checkpoints are written without one)
        self.job_params: dict[str, tuple[int, ...]] | None = None
        self.batch = self.train_net_batch()
        self.metrics_path = os.path.join(workspace, "metrics.jsonl")
        self.history: list[dict] = []
        self.start_time = time.perf_counter()
        self.start_step = self.job.step
        self.elapsed_before = 0.0  # seconds since step 0 before this process (a resumed checkpoint's)
        # the train metrics' sums since the last progress line, as far as a checkpoint took them (it holds
        # them, so that a run resumed from it prints the line an uninterrupted run prints)
        self.display_window: dict[str, float] = {}
        self.tags: dict = {}  # extra fields for every metrics entry (`singa-mpi test`: the checkpoint)
        self.live_bar = True  # a tqdm bar on an interactive terminal (root only; progress.open_bar)
        self._comm_at_start = runtime.comm_seconds()  # the runtime's setup communicated already
        self._mark = (self.start_time, self._comm_at_start)  # the last progress line: time, comm seconds
        self._steps_timed = [0.0, 0.0]  # this run's seconds in training steps, and in communication within them
        self.pace_mark: tuple[float, int] | None = None  # (time, steps done) when this run's first step ended
        self.keep: int | None = None  # checkpoints to keep (None: all)
        self.prune_refused: set[str] = set()  # old checkpoints --keep could not remove, each said once
        self.stop_requested = False  # set by a signal handler: checkpoint and stop after this step
        self.stop_signal: int | None = None  # the signal that asked for it, when this process got one
        # the root's acknowledgement of a stop signal another rank received (StopSignals.attach sets it;
        # a signal this rank received is acknowledged as it arrives)
        self.acknowledge: Callable[[int], None] | None = None
        self.training = False  # the steps have begun: a stop now writes a checkpoint (else none)
        self.resume_hint: str | None = None  # "resume with: ...", for WORKSPACE/stopped.txt
        self.resume_flag = "--resume"  # how the caller resumes (the Python API: fit(..., resume=True))
        self.stopped = False
        self.nonfinite_said = None  # several groups: this group root's NonFiniteError, said by the job's root
        self._layer_types: dict[str, list] = {}  # phase -> its layer classes (their `report`)
        self.print_profile = False  # --profile: print the per-layer table at the end of the run
        self.debug = False  # --debug: the communication table shows the run's bookkeeping rows too
        self.evaluation_totals: dict = {}  # tracer totals of test/validation passes (kept out of profile.json)
        self.finite = NonFiniteCheck(cfg, runtime.rank)  # NaN/inf stop the run (switch_off: --no-check-finite)
        self.rescue = None  # checkpoints.emergency.Rescue under `singa-mpi run --elastic`: survivors save their state
        # called after every step: under MPI with --trace, this rank's new spans to its part file
        # (launcher.train; timeline_parts), which it merges with the others' if the job fails
        self.after_step: Callable[[], None] | None = None
        self.trace_part: timeline_parts.PartWriter | None = None

    def nets(self) -> dict[str, Net]:
        nets = {"train": self.train_net, "test": self.test_net, "val": self.val_net}
        return {phase: net for phase, net in nets.items() if net is not None}

    def train_net_batch(self) -> int:
        """Rows per training step over all workers: the train phase's input batch size.

        Read from the job, not from a layer: a worker's first layer may be a
        connection layer, which has no batch size of its own."""
        return global_batch_size(self.cfg, phase_nodes(self.cfg, "train"))

    # ---------------------------------------------------------------- steps
    def train_one_batch(self, step: int) -> None:
        """One step: the algorithm's passes, then the sync strategy sums, updates and publishes."""
        self.runtime.begin_step(step)
        self.train_net.set_step(step)
        sync, tracer = self.runtime.sync(), self.runtime.tracer
        with tracer.span("train_one_batch", "step"):
            self.algorithm.train_one_batch(self.train_net, sync.layer_done)
        self.finite.look_at_layers(self.train_net)
        with tracer.span("sync", "step"):
            sync.gradients_complete()
        self.finite.look_at_gradients(sync)  # before the update; the vote comes after the step
        with tracer.span("update", "step"), self.rescue.lock if self.rescue else contextlib.nullcontext():
            sync.update(step, self.updater)
            sync.publish()
            if self.rescue:
                self.rescue.mark(step + 1)
        if self._checkpoint_follows(step):  # an update may overflow: a checkpoint must not keep it
            self.finite.look_at_values(sync)

    def _checkpoint_follows(self, step: int) -> bool:
        """Whether the state after ``step`` is checkpointed before the next step (a stop aside)."""
        return checkpoint_now(self.job, step + 1) or step + 1 == self.train_steps

    def report(self, phase: str, sums: dict[str, float]) -> dict[str, float]:
        """Means over the workers, with what the algorithm and the phase's layer types derive from them."""
        metrics = self.algorithm.report(summarize(sums))
        if phase not in self._layer_types:
            self._layer_types[phase] = list(dict.fromkeys(layer_class_of(n.conf) for n in phase_nodes(self.cfg, phase)))
        for cls in self._layer_types[phase]:
            metrics = cls.report(metrics)
        return metrics

    def evaluate(self, net: Net, steps: int, phase: str, step: int) -> dict[str, float]:
        self.runtime.begin_step(step)  # "step 10 val" comes before training step 10: a death in it is at step 10
        net.collect_metrics()  # drop anything left from an earlier pass
        self.runtime.sync().refresh()  # other groups' updates too (servers of an asynchronous job)
        before = self.runtime.tracer.snapshot()
        with self.runtime.tracer.span(phase, "step"):
            for _ in range(steps):
                net.set_step(step)
                self.algorithm.evaluate(net)
        self.finite.look_at_layers(net)
        self.finite.raise_if_found(self.runtime, step, phase, self.workspace)  # collective
        result = self.report(phase, collected_metrics(self.runtime, net))
        profiling.add(self.evaluation_totals, profiling.subtract(self.runtime.tracer.snapshot(), before))
        self.record(step, phase, result)
        return result

    # ---------------------------------------------------------------- loop
    def run(self) -> dict[str, float]:
        """Train from ``start_step`` to ``train_steps`` (or a stop signal); returns the last metrics.

        Output layers' files are closed however the run ends.  A NonFiniteError (every rank stops at the
        same step, voted) goes to the caller, which profiles the steps before it (collective) where a failed
        run's profile goes (under ``run --elastic``, not the restart's profile.json)."""
        try:
            final = self._run_steps()
            self.finish_profile()
            return final
        finally:
            for net in self.nets().values():
                net.close_files()

    def finish_profile(self, name: str = profiling.FILE) -> None:
        """WORKSPACE/profile.json (or ``name``) from every worker's tracer totals (collective); with
        ``print_profile`` the root prints it as the per-layer table too, and the cost model's
        prediction of the step beside it (BP jobs: the model replays forward and backward)."""
        parts = self.runtime.gather_object(profiling.worker_part(self.runtime.tracer, self.evaluation_totals))
        prediction = None
        if self.print_profile:
            if algorithm_name(self.cfg.proto.train_one_batch) == "kBP":
                prediction = self.runtime.predict_step()  # collective
            else:
                prediction = (f"no prediction: the cost model replays BP's forward and backward passes, not "
                              f"{algorithm_name(self.cfg.proto.train_one_batch)}'s")
        if parts is None or not self.runtime.is_root:  # several groups: group 0's root writes
            return
        profile = profiling.build(parts)
        try:
            profiling.write(self.workspace, profile, name)
        except OSError as err:  # a by-product: the run (its checkpoint written) is not failed for it
            self.log(f"note: {os.path.join(self.workspace, name)}: {checkpoint.not_written(err)}")
        if self.print_profile:
            self.log(profiling.format_table(profile, self.debug))
            if isinstance(prediction, Prediction):
                self.log("\n".join(beside_lines(profile, prediction)))
            elif prediction is not None:
                self.log(prediction)

    def _run_steps(self) -> dict[str, float]:
        os.makedirs(self.workspace, exist_ok=True)
        with self._metrics_written():
            if self.runtime.is_root and self.start_step == 0:
                open(self.metrics_path, "w").close()
            elif self.runtime.is_root:
                drop_records_from(self.metrics_path, self.start_step)
                lost = lost_progress_line(self.job, self.metrics_path, self.start_step)
                if lost is not None:
                    self.log(lost)
        bar = progress.open_bar(self.train_steps, self.start_step) if self.live_bar and self.runtime.is_root else None
        if self.rescue:
            with self.rescue.lock:
                self.rescue.mark(self.start_step)
        with progress.bar_around(self, bar), self.finite.quiet():
            self.finite.check_initial(self.runtime.sync(), self.runtime, self.start_step, self.workspace)
            return self._steps(bar)

    def _steps(self, bar: progress.LiveBar | None) -> dict[str, float]:
        job, tracer = self.job, self.runtime.tracer
        last_time, steps_since = time.perf_counter(), 0
        final: dict[str, float] = {}
        resumed = self.start_step != job.step  # restore() moved the start to its checkpoint's step
        for step in range(self.start_step, self.train_steps):
            # as SINGA, step 0 too when checkpoint_after is 0; not the checkpoint a resume started from
            if checkpoint_now(job, step) and not (resumed and step == self.start_step):
                self.save_checkpoint(step)
            if self.val_net is not None and validate_now(job, step):
                self.evaluate(self.val_net, job.validate_steps, "val", step)
            if self.test_net is not None and test_now(job, step):
                self.evaluate(self.test_net, job.test_steps, "test", step)
            began, comm = time.perf_counter(), tracer.seconds("comm")
            self.train_one_batch(step)
            self._steps_timed[0] += time.perf_counter() - began
            self._steps_timed[1] += tracer.seconds("comm") - comm
            steps_since += 1
            if self.pace_mark is None:  # the pace (ETA) is timed from here: the first step had start-up costs
                self.pace_mark = (time.perf_counter(), step + 1)
                if self.runtime.is_root:  # a restarted run's recovery ends here (singa-mpi run --elastic)
                    run_events.note("first_step", step=step + 1, ranks=self.runtime.size)
            if bar is not None:
                bar.advance()
            # one vote a step, on stop signals and non-finite values; every rank stops after the same step
            halt = self.runtime.vote_to_stop(self.stop_requested or self.finite.found is not None
                                             or self.runtime.sync().stop_asked(), self.stop_signal,
                                             self.finite.found is not None, self._look_before_stop)
            if halt:  # a NaN stops here, before its progress line and with no checkpoint
                self._look_before_stop()  # a stop writes one
                self.finite.raise_if_found(self.runtime, step, "train", self.workspace)
                # voted: each worker reads its own servers' replies, and every worker of the group must raise
                # together (the profile and the trace are gathered after it)
                if self.runtime.any(self.runtime.sync().nonfinite_elsewhere()):
                    raise NonFiniteError(f"non-finite value at step {step} (train) in another worker group: "
                                         f"stopped without checkpointing it; {advice(LOSS, self.finite.switch)}")
            if self.after_step is not None:
                self.after_step()
            if display_now(job, step):
                now = time.perf_counter()
                rate = steps_since * self.batch / max(now - last_time, 1e-9)
                final = self.report("train", added(self.display_window, collected_metrics(self.runtime, self.train_net)))
                self.display_window = {}
                final.update(self.runtime.sync().metrics())  # staleness, with servers of several groups
                self.record(step, "train", final, samples_per_s=rate)
                headline = next((k for k in ("loss", "squared_error") if k in final), None)
                if bar is not None and headline is not None:
                    bar.show(f"{headline} {final[headline]:.4f}")
                last_time, steps_since = now, 0
            if halt:
                done = step + 1  # batches trained: stepN.h5 is the state after N of them
                self._learn_stop_signal()
                self.runtime.sync().training_done(stopped=True, signal=self.stop_signal)
                with self._stop_checkpoint(done):
                    if done == self.train_steps:  # the last step: its checkpoint is the final one, the run is complete
                        return self._finish(final, stop_at_end=True)
                    path = self.save_checkpoint(done, final=True)
                self.log(f"stopped on a signal after {done} steps (checkpoint {path}): resume with {self.resume_flag}")
                self.note_stop(done, path)
                self.stopped = True
                self.summarize_run(done, path)
                return final
        self.runtime.sync().training_done(stopped=False)
        return self._finish(final)

    def _finish(self, final: dict[str, float], stop_at_end: bool = False) -> dict[str, float]:
        """The end of a complete run: the final checkpoint, the final validation and test, the tables and
        the summary.
        ``stop_at_end``: a stop signal came at the last step; what it asked for (the step finished, a
        checkpoint) is the run's normal end, which the root says and writes in WORKSPACE/stopped.txt."""
        job = self.job
        path = self.save_checkpoint(self.train_steps, final=True)
        if stop_at_end:
            self.note_stop_at_end(path)
        if self.val_net is not None:
            self.evaluate(self.val_net, job.validate_steps, "val", self.train_steps)
        if self.test_net is not None:
            final = self.evaluate(self.test_net, job.test_steps, "test", self.train_steps)
        table = self.runtime.report(self.train_steps - self.start_step, debug=self.debug)
        if table:
            self.log(table)
        self.summarize_run(self.train_steps, path)
        return final

    def _look_before_stop(self) -> bool:
        """Before a stop's checkpoint: whether this rank finds a non-finite value in the values it
        updated (an overflow whose gradient was finite); where groups vote together (distributed
        Hogwild), called inside the vote, so that every group learns it before any checkpoints."""
        self.finite.look_at_values(self.runtime.sync())
        return self.finite.found is not None

    def _learn_stop_signal(self) -> None:
        """The signal that stopped the job, also where it reached other ranks only (collective over the
        group): a rank of the group, else a server rank or another group (as the sync was told); the
        root acknowledges one it did not receive itself, as it does its own."""
        own = self.stop_signal
        self.stop_signal = next((s for s in self.runtime.allgather_object(self.stop_signal) if s), None) \
            or self.runtime.sync().signal_elsewhere()
        if own is None and self.stop_signal is not None and self.acknowledge is not None and self.runtime.is_root:
            self.acknowledge(self.stop_signal)

    @contextlib.contextmanager
    def _stop_checkpoint(self, done: int) -> Iterator[None]:
        """A stop's checkpoint after ``done`` steps that cannot be written: stopped.txt, which said it was on
        its way, now says so on the root, naming the newest good checkpoint; the error goes on (exit 3)."""
        try:
            yield
        except DataError as err:
            if self.runtime.is_root:
                step = checkpoint.newest_sound_step(self.workspace)
                there = checkpoint.newest_good_said(self.workspace)
                name = signal_name(self.stop_signal) if self.stop_signal else "a stop"
                hint = [self.resume_hint] if self.resume_hint and step is not None else []
                write_stop_note(self.workspace, [f"{name}: the stop's checkpoint after {done} steps could not be "
                                                 f"written ({err}); {there}"] + hint)
            raise

    def note_stop(self, done: int, path: str | None) -> None:
        """Root: what the stop saved, in WORKSPACE/stopped.txt (its first line also on stderr while
        stdout is not being read: Open MPI's mpirun, signalled, forwards nothing more before it kills
        the ranks)."""
        if not self.runtime.is_root or path is None:
            return
        name = f" ({signal_name(self.stop_signal)})" if self.stop_signal else ""
        line = f"stopped on a signal{name} after {done} steps: checkpoint {path}"
        write_stop_note(self.workspace, [line] + ([self.resume_hint] if self.resume_hint else []))
        progress.also_on_stderr(line)

    def note_stop_at_end(self, path: str | None) -> None:
        """Root: a stop signal came at the last step, so the run is complete: said, and kept in
        WORKSPACE/stopped.txt in place of the pending stop its acknowledgement noted there."""
        if not self.runtime.is_root:
            return
        name = f"{signal_name(self.stop_signal)} " if self.stop_signal else "a stop "
        saved = f"; final checkpoint {path}" if path else ""
        line = (f"{name}came at the last step ({self.train_steps}): the run is complete{saved}; "
                f"nothing to resume")
        self.log(line)
        write_stop_note(self.workspace, [line])
        progress.also_on_stderr(line)

    def summarize_run(self, end: int, checkpoint_path: str | None) -> None:
        """Log the end-of-run block (:func:`progress.summary_lines`).  Collective: every rank's
        communication and step times are gathered to the root."""
        wall = time.perf_counter() - self.start_time
        mine = {"rank": self.runtime.rank, "wall": wall, "comm": self.runtime.comm_seconds() - self._comm_at_start,
                "steps": end - self.start_step, "step": self._steps_timed[0], "step_comm": self._steps_timed[1],
                "rss": progress.peak_rss()}
        ranks = self.runtime.gather_object(mine)
        if ranks is None:
            return
        entries = self._run_entries()
        run = {"start": self.start_step, "end": end, "total": self.train_steps, "wall": wall,
               "elapsed": self.elapsed(), "samples": (end - self.start_step) * self.batch,
               "test": [e for e in entries if e["phase"] == "test"], "val": [e for e in entries if e["phase"] == "val"],
               "checkpoint": checkpoint_path, "stopped": self.stopped, "pipeline": self.runtime.pipeline()}
        self.log("\n".join(progress.summary_lines(run, ranks)))

    def _run_entries(self) -> list[dict]:
        """metrics.jsonl's entries (all segments of a resumed run), else this process's."""
        try:
            with open(self.metrics_path) as f:
                return [json.loads(line) for line in f if line.strip()]
        except (OSError, ValueError):
            return list(self.history)

    def save_checkpoint(self, step: int, final: bool = False) -> str | None:
        """Gather the job's state to the root and write it atomically (collective over the group;
        of several worker groups, group 0 writes).  ``final``: the last of the run (with servers
        of several groups, it waits for every group to finish)."""
        from singa_mpi.checkpoints.snapshot import collect, contribute_group_state

        if not self.runtime.evaluates:
            contribute_group_state(self)  # group 0 writes: groups of one pace send it their hidden state
            return None
        self.runtime.begin_step(step)  # stepN.h5 is written before training step N: a death in it is at step N
        with self.runtime.tracer.span("checkpoint", "step"):
            if self.job.disp_freq > 0:  # (collective over the group, as the progress line's sums)
                self.display_window = added(self.display_window, collected_metrics(self.runtime, self.train_net))
            ckpt = collect(self, step, final)
            if ckpt is None:
                return None
            ckpt.elapsed = self.elapsed()
            ckpt.display_window = dict(self.display_window)
            path = checkpoint.write(checkpoint.checkpoint_path(self.workspace, step), ckpt)
        self.log(f"checkpoint {path}")
        if self.keep:
            _, refused = checkpoint.prune(self.workspace, self.keep, written=step)
            for old, reason in refused.items():
                if old not in self.prune_refused:  # once per file: each later checkpoint's prune tries it again
                    self.log(f"warning: {old}: cannot remove this old checkpoint (--keep {self.keep}): {reason}; "
                             f"training goes on, and each later checkpoint tries again")
            self.prune_refused = set(refused)
        return path

    def restore(self, ckpt: checkpoint.Checkpoint, full: bool, allow_partial: bool | None = None) -> None:
        """Load a checkpoint: everything to resume (``full``), or only params to initialise
        (``allow_partial``: :func:`singa_mpi.checkpoints.snapshot.restore`'s)."""
        from singa_mpi.checkpoints.snapshot import group_state_note, plan_summary, restore

        if self.runtime.is_root:
            for line in checkpoint.plan_diff(ckpt.plan, plan_summary(self.cfg, self.runtime.size)):
                self.log(f"note: {ckpt.path} was written with a different partitioning: {line}")
            note = group_state_note(ckpt, self.runtime.groups) if full else None
            if note is not None:
                self.log(note)
        skipped = restore(self, ckpt, full, allow_partial)
        self.loaded = (ckpt, full)
        for line in skipped:
            self.log(f"note: kept the initial value of {line}")
        if full:
            self.start_step = ckpt.step
            self.elapsed_before = ckpt.elapsed  # metrics.jsonl's `elapsed` goes on from the checkpoint's
            self.display_window = dict(ckpt.display_window)  # the first progress line's steps before it

    def elapsed(self) -> float:
        """Seconds since step 0: this process's, plus those of the runs a resume continues."""
        return self.elapsed_before + time.perf_counter() - self.start_time

    def record(self, step: int, phase: str, metrics: dict[str, float], samples_per_s: float | None = None) -> None:
        """Append one JSON line to metrics.jsonl and print the progress line (root only).

        Metrics are stored at full float precision; only the printed line rounds them.  ``comm_share``
        (several workers): this rank's seconds inside communication calls since its previous progress
        line, over the wall time since then (0..1)."""
        now = time.perf_counter()
        elapsed = self.elapsed_before + now - self.start_time
        entry = {"step": step, "phase": phase, **{k: float(v) for k, v in metrics.items()},
                 "elapsed": round(elapsed, 3), **self.tags}
        if samples_per_s is not None:
            entry["samples_per_s"] = round(samples_per_s, 1)
        comm = self.runtime.comm_seconds()
        since, comm_before = self._mark
        self._mark = (now, comm)
        if self.runtime.size > 1:
            entry["comm_share"] = round((comm - comm_before) / max(now - since, 1e-9), 4)
        self.history.append(entry)
        if not self.runtime.is_root:
            return
        with self._metrics_written(), open(self.metrics_path, "a") as f:
            f.write(json.dumps(entry) + "\n")
        self.log(self.progress_line(entry, metrics, now))

    @contextlib.contextmanager
    def _metrics_written(self) -> Iterator[None]:
        """metrics.jsonl refused (a full disk, a read-only one): a DataError naming it and what to do, as a
        checkpoint that cannot be written is (a half-written line is dropped when the run resumes)."""
        try:
            yield
        except OSError as err:
            raise DataError(f"{self.metrics_path}: cannot write the run's metrics: {checkpoint.disk_problem(err)}"
                            f"{checkpoint.RUN_GOES_ON}") from None

    def progress_line(self, entry: dict, metrics: dict[str, float], now: float) -> str:
        """``step   20/100  train  loss 0.6931  accuracy 0.5000  1,234 samples/s  comm 12%  elapsed 3.2s  ETA 12.8s``.

        ETA: the steps left at this run's mean pace since its first step ended (tests, validation and
        checkpoints included; the first step carries the start-up): none before two steps after it."""
        step, total = entry["step"], self.train_steps
        where = f"step {step:>{len(str(total))}}/{total}" if step <= total else f"step {step}"  # `test` of a longer run
        parts = [where, f"{entry['phase']:<5}"]
        parts += [f"{k} {v:.0f}" if k in COUNTS else f"{k} {v:.4f}" for k, v in metrics.items()]
        if "samples_per_s" in entry:
            parts.append(f"{entry['samples_per_s']:,.0f} samples/s")
        if "comm_share" in entry:
            parts.append(f"comm {100 * entry['comm_share']:.0f}%")
        parts.append(f"elapsed {progress.format_seconds(entry['elapsed'])}")
        done = step + (entry["phase"] == "train")  # a train line comes after its step, test/val before
        if self.pace_mark is not None and done < total:
            since, first = self.pace_mark
            left = progress.eta(done - first, now - since, total - done)
            if left is not None:
                parts.append(f"ETA {progress.format_seconds(left)}")
        return "  ".join(parts)
