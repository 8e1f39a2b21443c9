"""Runs that heal themselves: ``singa-mpi run -n N --elastic JOB`` restarts a job whose rank died.

The supervisor is one process outside MPI.  It starts ``train`` with the MPI's own launcher
(:func:`~singa_mpi.communication.launchers.find_launcher`: MPICH's ``mpiexec`` or Open MPI's
``mpirun``), waits, and reads what the run told it (:mod:`singa_mpi.run_events`: the guardian's
"rank 1 vanished at step 212", a rank's error line, the first step of a restarted run).  When a rank
dies it relaunches: on the same number of ranks (the host is still there), or with ``--shrink`` on
the survivors only, and resumes from the newest complete checkpoint with the plan recomputed for the
new rank count (``train --resume``: bit-exact on any rank count), so the samples seen and the numbers
trained equal an uninterrupted run's; metrics.jsonl keeps each step once (a resumed run drops what the
dead one reported past its checkpoint).

Bounded: at most ``--max-restarts`` restarts and never below ``--min-ranks``; a failure the job makes
twice the same way at the same step (a bug, not a fault: a layer that raises at step 5) and an error
before the first step (a bad job: exit code 2 or 3, a layer that always raises) end it with the reason
instead of looping.  Stop signals still mean stop: SIGINT, SIGTERM, SIGUSR1 and SIGHUP go to the
launcher, the ranks checkpoint and exit 75, and nothing restarts.  What it cost is printed at the end
and kept in ``WORKSPACE/supervisor/summary.json``: restarts, the dead ranks, the steps lost (from the
step it died in back to the checkpoint resumed from) and the recovery time (from the death to the
first step after the restart).
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from typing import Callable, Sequence

from singa_mpi import profiling, run_events
from singa_mpi.checkpoints import emergency
from singa_mpi.checkpoints.hdf5 import (EXIT_CHECKPOINTED, NotDurable, checkpoint_dir, checkpoint_path, listed,
                                        newest_sound_step)
from singa_mpi.checkpoints.hdf5 import write as write_checkpoint
from singa_mpi.communication.guardian import GRACE as GUARDIAN_GRACE  # how long a node's guardians may take
from singa_mpi.communication.hosts import Host, placement, ranks_on
from singa_mpi.data.convert import atomic_path
from singa_mpi.early_signals import early_stop_signal, python_default
from singa_mpi.errors import ConfigError, SingaError
from singa_mpi.workspace import make_workspace

# stop signals: passed on to the job (SIGHUP too, the terminal closed: the launcher in a session of its own
# would not get it, and its ranks would run on unwatched)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP)
END_WAIT = 10.0  # seconds a job whose supervisor fails gets to stop (and checkpoint) before it is killed
EXIT_SETUP = ConfigError.exit_code  # the launch refused the job before training: a restart cannot help
DEATHS = ("vanished", "host_lost")  # failures that are deaths (a rank's, a host's)
DIED = ("vanished", "rank_died")  # events that say a rank died: its survivors save their state
RESCUE_WAIT = 30.0  # seconds for the survivors to save their state (each gives up after emergency.LOCK_TIMEOUT)
STOP_GRACE = 5.0  # seconds a stopped run's survivors of a death get to end by themselves (their stop checkpoint)
RUN = "singa-mpi run"  # the command a refusal of its rank count tells the user to give again
KEPT_WAIT = 30.0  # seconds for a vanished rank's guardian to write the attempt's profile and timeline (--trace)


@dataclasses.dataclass(frozen=True)
class Policy:
    """How to restart: ``ranks`` launched first, ``elastic`` (restart at all), at most ``max_restarts``
    restarts, never on fewer than ``min_ranks``; ``shrink``: go on with the survivors only."""

    ranks: int
    elastic: bool = False
    min_ranks: int = 1
    max_restarts: int = 3
    shrink: bool = False
    servers: int = 0  # ranks that are servers (Sandblaster, Downpour): the workers are the rest
    groups: int = 1  # worker groups (Downpour, Hogwild): the workers are shared among them
    hosts: tuple[Host, ...] = ()  # where the ranks run, when known (--hosts, --hostfile, Slurm): a lost one is left out
    name_hosts: bool = False  # pass ``hosts`` to the launcher from the start (not only once one is left out)
    emergency: bool = True  # --elastic: survivors save their state when a rank dies (checkpoints.emergency)
    mpi: str | None = None  # --mpi, as given (the resume command names it again)
    hostfile: str | None = None  # --hostfile, as given (the resume command names it while no host is lost)


@dataclasses.dataclass
class Failure:
    """Why an attempt ended: ``kind`` ``vanished`` (died without a word), ``error`` (a rank's error
    line), ``setup_error`` (refused before training) or ``exit`` (only the exit code is known)."""

    kind: str
    code: int
    ranks: list[int]  # the rank that died, or the candidates when the guardians could not tell which
    step: int | None
    what: str
    time: float
    dead: int = 1  # how many died: one of several candidates, or each of them
    hosts_lost: list[str] = dataclasses.field(default_factory=list)  # hosts none of whose ranks said a word

    def signature(self) -> tuple:
        """What makes two failures the same one: how, where (step) and what, without pids and hosts."""
        return self.kind, self.code, self.step, re.sub(r"\bpid \d+|\bon \S+|\d+(\.\d+)?s\b", "", self.what)


@dataclasses.dataclass
class Attempt:
    """One launch: on ``ranks`` ranks from checkpoint step ``resumed_from`` (None: afresh)."""

    number: int
    ranks: int
    resumed_from: int | None
    code: int = 0
    failure: Failure | None = None
    first_step_at: float | None = None
    hosts: list[Host] = dataclasses.field(default_factory=list)  # where it ran ([]: not known)
    emergency: str | None = None  # what the survivors' emergency checkpoint gave (or why there is none)
    profile_before: tuple | None = None  # its failed run's profile file as it was before the launch (_identity)
    damaged: list[str] = dataclasses.field(default_factory=list)  # checkpoints none good: started over beside them
    kept: bool | None = None  # a guardian writing its profile and timeline (--trace): done (True), not yet (False)


def failure_of(events: list[dict], code: int, ended: float, hosts: Sequence[Host] = (), ranks: int = 0) -> Failure:
    """The attempt's failure from its events: hosts lost (given where the ranks ran: a host none of
    whose ranks or guardians said a word), else the vanished rank if a guardian named one, else the
    first error line, else the exit code alone."""
    lost = hosts_lost(events, list(hosts), ranks)
    if lost:
        gone = [rank for index in lost for rank in ranks_on(list(hosts), ranks, index)]
        steps = [who.get("step") for e in events for who in e.get("who", {}).values() if who.get("step") is not None]
        names = ", ".join(hosts[index].name for index in lost)
        what = (f"no word from host {names} (ranks {', '.join(map(str, gone))}): the node died, or its network "
                f"or launcher daemon did")
        return Failure("host_lost", code, gone, max(steps) if steps else None, what,
                       min((e["time"] for e in events if "time" in e), default=ended), len(gone),
                       [hosts[index].name for index in lost])
    died = sorted((e for e in events if e.get("kind") == "rank_died"), key=lambda e: e["time"])
    for kind in ("vanished", "rank_died", "error", "setup_error"):
        found = [e for e in events if e.get("kind") == kind]
        if not found:
            continue
        event = found[0]
        if died and (kind == "rank_died" or "one of ranks" in event.get("line", "")
                     or int(died[0]["rank"]) not in [int(r) for r in event.get("ranks", [])]):
            # the keepers saw the first death (a kept rank's peers may end soon after it: MPI's own error
            # handling), and the guardians' line, if any, names a later one
            first = died[0]
            how = f"killed by {first['signal']}" if "signal" in first else f"exit code {first.get('code')}"
            step = next((who.get("step") for e in events for r, who in e.get("who", {}).items()
                         if int(r) == int(first["rank"])), None)
            line = f"rank {first['rank']} vanished without a word ({how})"
            return Failure("vanished", code, [int(first["rank"])], step, line, first["time"])
        if kind == "vanished":
            ranks = [int(r) for r in event.get("ranks", [])]
            line = event.get("line", "")
            # "one of ranks 0, 1, 2 vanished": the launcher ended the others too fast to tell which (a node
            # short of cores): one death; the step is the furthest any candidate got (a server stays at 0)
            dead = 1 if "one of ranks" in line else max(1, len(ranks))
            steps = [who.get("step") for who in event.get("who", {}).values() if who.get("step") is not None]
            return Failure(kind, code, ranks, max(steps) if steps else None, line, event["time"], dead)
        rank = event.get("rank")
        return Failure(kind, event.get("code", code), [] if rank is None else [int(rank)], event.get("step"),
                       event.get("message", ""), event["time"])
    return Failure("exit", code, [], None, f"exit code {code}", ended)


def hosts_lost(events: list[dict], hosts: list[Host], ranks: int) -> list[int]:
    """The hosts (indices) from which no event came when others did: a guardian speaks for its node
    (``node_ranks``) whenever its rank ends without saying why, so every node still there is heard
    after a failure, and a node that is gone, guardians and all, is the one that is silent."""
    heard = hosts_heard(events, hosts, ranks)
    if not heard:
        return []  # nobody said anything: too little to tell a host from a launcher that failed
    return sorted(set(placement(hosts, ranks)) - heard)


def hosts_heard(events: list[dict], hosts: list[Host], ranks: int) -> set[int]:
    """The hosts (indices) some rank or guardian of which wrote an event (none when fewer than two hosts)."""
    if len(hosts) < 2 or ranks < 1:
        return set()
    where = placement(hosts, ranks)
    heard = set()
    for event in events:
        spoke = [int(r) for r in event.get("node_ranks", [])] + ([int(event["rank"])] if "rank" in event else [])
        heard |= {where[r] for r in spoke if 0 <= r < ranks}
    return heard


def first_step_time(events: list[dict]) -> float | None:
    return next((e["time"] for e in events if e.get("kind") == "first_step"), None)


def next_ranks(policy: Policy, ranks: int, failure: Failure) -> int:
    """The rank count of the relaunch: the same, or with ``shrink`` the survivors of a death; without
    the ranks of a lost host always (their slots went with it)."""
    if failure.hosts_lost or (policy.shrink and failure.kind == "vanished"):
        return ranks - failure.dead
    return ranks


def check_ranks(cluster, ranks: int, servers: int, groups: int, where: str = "") -> None:
    """ConfigError, in one line naming ``where`` and the count to give `run -n`, unless train takes a
    launch of ``cluster`` (a ClusterProto) on ``ranks`` ranks with the --workers :meth:`Supervisor._command`
    passes (``servers``, ``groups``: the job's server ranks and worker groups; several worker groups
    share the workers evenly, co-located servers set a count of their own)."""
    from singa_mpi.topology import check_launch

    if servers:
        workers = (ranks - servers) // groups
        if workers < 1:  # train would be told `--workers 0`, an option the user never gave
            raise ConfigError(f"{where}: {ranks} rank(s) leave no worker per group beside {servers} server(s): "
                              f"expected {RUN} -n {servers + groups} or more")
        copy = type(cluster)()
        copy.CopyFrom(cluster)
        copy.nworkers_per_group = workers
        cluster = copy
    # (one group without servers follows the count, as train does)
    check_launch(cluster, ranks, where=where, checked=False, launcher=RUN)


def cannot_shrink(cluster, ranks: int, servers: int, groups: int) -> str | None:
    """Why the survivors of one death could not run a job of ``cluster`` (a ClusterProto) launched on
    ``ranks`` (``servers``, ``groups``: its server ranks and worker groups), told as train would refuse
    them (:func:`check_ranks`); None when they could."""
    fewer = ranks - 1
    if fewer < 1:
        return None  # nothing to shrink to: the restart's own check says so
    try:
        check_ranks(cluster, fewer, servers, groups)
    except ConfigError as err:
        return str(err).removeprefix(": ").split(": expected")[0].replace(", launched with ", ", not ")
    return None


def why_not_restart(policy: Policy, attempts: list[Attempt]) -> str | None:
    """None to restart after the last attempt's failure, else the reason to stop (one clause)."""
    last = attempts[-1]
    failure = last.failure
    if failure is None:
        return "it ended without a failure"
    if not policy.elastic:
        return "not --elastic"
    if failure.kind == "setup_error" or failure.code == EXIT_SETUP:
        return f"the job was refused before training (exit code {failure.code}): a restart cannot change that"
    if failure.kind == "error" and last.first_step_at is None:  # a rank's error line, and no step was done
        return f"it failed before its first step (exit code {failure.code}): a restart cannot change that"
    before = [a.failure for a in attempts[:-1] if a.failure is not None]
    if before and before[-1].signature() == failure.signature():
        where = f" at step {failure.step}" if failure.step is not None else ""
        return f"it failed the same way twice{where}: a fault of the job, not of a rank"
    if len(attempts) - 1 >= policy.max_restarts:
        return f"it reached --max-restarts {policy.max_restarts}"
    if failure.hosts_lost and len(failure.hosts_lost) >= len(last.hosts):
        return "every host it ran on is gone"
    ranks = next_ranks(policy, last.ranks, failure)
    fewest = max(policy.min_ranks, policy.servers + policy.groups)  # a worker per group, beside the servers
    if ranks < fewest:
        return f"{ranks} ranks would be left, fewer than --min-ranks {fewest}"
    return None


def after_a_death(stopping: bool, since: float, trained: bool = True) -> str:
    """What the supervisor does while a rank's death leaves the others running (kept ranks), ``since``
    seconds after it heard of it: ``ask`` the survivors for their state (each saves it and exits),
    ``wait``, or ``end`` the launcher and its ranks at once.  Survivors of an attempt that has not
    ``trained`` (no first step yet) hold no step to save, and those still setting up would never answer
    (the request is read once training starts): ended at once, the relaunch resumes from the newest
    checkpoint (it used to wait RESCUE_WAIT for them).  A stopped run's survivors may be writing their
    stop checkpoint (the request would end them in it): they get STOP_GRACE seconds to end by
    themselves; then they are asked too, for nothing else ends them (the launcher leaves them running,
    and a survivor of a dead peer never gets through MPI's finalization)."""
    if not trained:
        return "end"
    if stopping and since < STOP_GRACE:
        return "wait"
    return "ask"


def rescue_wait(stopping: bool) -> float:
    """Seconds the survivors get to answer the request before the launcher is killed: RESCUE_WAIT, or
    when stopping STOP_GRACE (they may already have stopped and checkpointed, and be blocked for good in
    MPI's finalization, where no request is read)."""
    return STOP_GRACE if stopping else RESCUE_WAIT


def spelled_out(args: Sequence[str], options: Sequence[str]) -> list[str]:
    """``args`` with each abbreviated long option written in full, as argparse reads it (allow_abbrev):
    the one of ``options`` it begins (``--worksp`` -> ``--workspace``, ``--overw=`` -> ``--overwrite=``),
    so that the supervisor finds the options it reads and rewrites; one that begins none or several is
    left for `train` to refuse."""
    full = []
    for arg in args:
        name, equals, value = arg.partition("=")
        if name.startswith("--") and name not in options:
            begun = [option for option in options if option.startswith(name)]
            if len(begun) == 1:
                arg = begun[0] + equals + value
        full.append(arg)
    return full


def lost_steps(failure: Failure | None, resumed_from: int | None) -> int | None:
    """Steps trained again after a restart: from the checkpoint resumed from to the step it died in."""
    if failure is None or failure.step is None:
        return None
    return max(0, failure.step - (resumed_from or 0))


class Supervisor:
    """Launch, watch, relaunch (see the module).  ``train_args``: ``train``'s options after the job."""

    def __init__(self, job: str, workspace: str, train_args: Sequence[str], policy: Policy, launcher,
                 log: Callable[[str], None] = print):
        self.job, self.workspace, self.train_args = job, workspace, list(train_args)
        self.policy, self.launcher, self.log = policy, launcher, log
        self.folder = os.path.join(workspace, "supervisor")
        self.attempts: list[Attempt] = []
        self.child: subprocess.Popen | None = None
        self.stopping: int | None = None  # the stop signal received
        self.stops, self.passed_on = 0, 0  # stop signals received, and passed on to the launcher now running
        self.gave_up: str | None = None  # why it did not restart after a failure
        self.name_hosts = policy.name_hosts  # once a host is left out, the launcher must be told where to go
        self.emergency_steps: dict[int, int] = {}  # step -> the attempt whose survivors' state it holds, as written

    def run(self) -> int:
        if self.policy.min_ranks > self.policy.ranks:  # it could never restart, nor say why until a rank died
            raise ConfigError(f"run: --min-ranks {self.policy.min_ranks} is more than the {self.policy.ranks} ranks "
                              f"launched (-n {self.policy.ranks}): expected at most {self.policy.ranks}")
        make_workspace(self.workspace)  # one line (exit 3) if it cannot be written, as `train` says it
        make_workspace(self.folder)
        previous = {s: signal.signal(s, self._forward) for s in STOP_SIGNALS}
        early = early_stop_signal()  # one that came while the package loaded (`run` catches them from its start)
        if early is not None:
            self._forward(early, None)
        try:
            ranks, resumed_from, hosts = self.policy.ranks, None, list(self.policy.hosts)
            damaged: list[tuple[int, str]] = []
            while True:
                if self.stopping is not None and self.attempts:  # a stop while it decided to relaunch: no relaunch
                    return self._finish(self._stopped(self.attempts[-1]))
                attempt = self._launch(ranks, resumed_from, hosts, damaged if self.attempts else [])
                if self.stopping is not None:  # stopped (75): nothing restarts
                    return self._finish(self._stopped(attempt))
                if attempt.failure is None:  # done
                    return self._finish(attempt.code)
                reason = why_not_restart(self.policy, self.attempts)
                if reason is not None:
                    if self.policy.elastic:  # without it, run only launches: the ranks' own line names the failure
                        self.log(f"singa-mpi: supervisor: not restarting: {reason}")
                    self.gave_up = reason
                    return self._finish(attempt.code)
                ranks = next_ranks(self.policy, attempt.ranks, attempt.failure)
                lost = attempt.failure.hosts_lost
                hosts = [host for host in hosts if host.name not in lost]
                self.name_hosts = self.name_hosts or bool(lost)
                resumed_from = newest_checkpoint_step(self.workspace)
                without = f" without host {', '.join(lost)}" if lost else ""
                if attempt.emergency:
                    self.log(f"singa-mpi: supervisor: {attempt.emergency}")
                damaged = [] if resumed_from is not None else listed(self.workspace)
                if damaged:
                    self.log(f"singa-mpi: supervisor: {self._starting_over(damaged)}")
                self.log(f"singa-mpi: supervisor: {describe_failure(attempt.failure)}; restarting on {ranks} ranks"
                         f"{without} "
                         f"from {'checkpoint step ' + str(resumed_from) if resumed_from is not None else 'step 0'}"
                         f" (restart {len(self.attempts)} of at most {self.policy.max_restarts})"
                         f"{self._traces_told(attempt.number)}{self._profiles_told(attempt)}")
        finally:
            self._end_job()  # only a failure of the supervisor itself leaves one running
            for s, handler in previous.items():
                signal.signal(s, python_default(s, handler))

    def _end_job(self) -> None:
        """End the launcher and its ranks if they still run: a stop signal (they checkpoint and exit 75), and
        after END_WAIT seconds SIGKILL to the launcher's process group (MPICH's launcher then ends the ranks)."""
        child = self.child
        if child is None or child.poll() is not None:
            return
        try:
            child.send_signal(getattr(signal, self.launcher.stop_signal))
            child.wait(timeout=END_WAIT)
        except (OSError, subprocess.TimeoutExpired):
            self._kill_launcher()
            child.wait()

    def _starting_over(self, damaged: list[tuple[int, str]]) -> str:
        """The line of a restart that finds only damaged checkpoints (``damaged``: :func:`listed`'s):
        it starts again from step 0, as with none, and moves them aside, as a stopped run's advice says
        (:meth:`resume_hint`): --resume would refuse them all, and end the healing run."""
        names = [os.path.basename(path) for _, path in damaged]
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        return (f"no good checkpoint: each of the {len(names)} in {checkpoint_dir(self.workspace)} is damaged "
                f"({shown}); the restart starts again from step 0 and moves them to "
                f"{os.path.join(self.workspace, 'previous-<time>')}/ (--overwrite)")

    def _launch(self, ranks: int, resumed_from: int | None, hosts: list[Host],
                damaged: list[tuple[int, str]] | None = None) -> Attempt:
        attempt = Attempt(len(self.attempts) + 1, ranks, resumed_from, hosts=hosts,
                          damaged=[os.path.basename(path) for _, path in damaged or []])
        self.attempts.append(attempt)
        events_path = os.path.join(self.folder, f"attempt{attempt.number}.jsonl")
        if os.path.exists(events_path):
            os.remove(events_path)
        env = self.launcher.environ(**{run_events.EVENTS_VARIABLE: os.path.abspath(events_path),
                                       run_events.SUPERVISOR_VARIABLE: shlex.join(self.own_command(ranks, hosts))})
        if self.policy.elastic:  # a restart writes profile.json: a failed attempt keeps its own (profiling.failed_file)
            env[run_events.ATTEMPT_VARIABLE] = str(attempt.number)
            attempt.profile_before = _identity(self._failed_profile(attempt.number))
        where = hosts if self.name_hosts else None
        command = self._command(ranks, attempt.number, resumed_from, where)
        rescue = self._rescue_folder(attempt.number)
        if rescue is not None:  # the launcher must leave the survivors of a death running: they save their state
            options, variables = self.launcher.survivors_kept()
            command = command[:1] + options + command[1:]
            env.update(variables, **{emergency.RESCUE_VARIABLE: os.path.abspath(rescue)})
        self.child = subprocess.Popen(command, env=env, start_new_session=True)  # our signals: only as forwarded
        requested = self._wait(events_path, rescue)
        attempt.code = self.child.returncode
        ended = time.time()
        events = run_events.read(events_path)
        attempt.first_step_at = first_step_time(events)
        died = [e for e in events if e.get("kind") in DIED]  # kept ranks: the launcher may have ended well
        if died and attempt.code == 0:  # as the shell reports a process killed by that signal (137: SIGKILL)
            attempt.code = 128 + _signal_number(next((e["signal"] for e in died if "signal" in e), "SIGKILL"))
        if attempt.code not in (0, EXIT_CHECKPOINTED) or died:
            if len(hosts) > 1 and len(hosts_heard(events, hosts, ranks)) < len(set(placement(hosts, ranks))):
                # a node's guardians may still be on their way (their GRACE): hear them out
                events = self._events_settled(events_path)
            attempt.failure = failure_of(events, attempt.code, ended, hosts, ranks)
            if any(e.get("keeps") for e in events):  # a guardian outlives the launcher: its files are on the way
                attempt.kept = self._kept(events_path)
        if requested:
            attempt.emergency = self._emergency_checkpoint(rescue, attempt.number)
        return attempt

    def _rescue_folder(self, number: int) -> str | None:
        """Where this attempt's survivors save their state; None when they cannot (see Policy.emergency)."""
        if not (self.policy.elastic and self.policy.emergency) or self.launcher.survivors_kept() is None:
            return None
        folder = os.path.join(self.folder, f"rescue{number}")
        shutil.rmtree(folder, ignore_errors=True)
        return folder

    def _wait(self, events_path: str, rescue: str | None) -> bool:
        """Wait for the launcher, passing on stop signals; when a rank dies meanwhile, ask the survivors for
        their state (after_a_death; the launcher is ended if they take longer than rescue_wait).  Whether
        they were asked."""
        asked_at, heard_at = None, None
        while True:
            try:
                self.child.wait(timeout=0.1)
                return asked_at is not None
            except subprocess.TimeoutExpired:
                pass
            self._pass_on_stops()
            if rescue is not None and asked_at is None:
                events = run_events.read(events_path)
                if heard_at is None and any(e.get("kind") in DIED for e in events):
                    heard_at = time.monotonic()
                action = "wait" if heard_at is None else after_a_death(
                    self.stopping is not None, time.monotonic() - heard_at,
                    trained=any(e.get("kind") == "first_step" for e in events))
                if action == "ask":
                    emergency.request(rescue)
                    asked_at = time.monotonic()
                elif action == "end":
                    self._kill_launcher()
                    rescue = None  # nobody to ask
            if asked_at is not None and time.monotonic() - asked_at > rescue_wait(self.stopping is not None):
                self._kill_launcher()  # survivors that neither saved nor ended
                asked_at = float("inf")  # once

    def _kill_launcher(self) -> None:
        """SIGKILL to the launcher's process group: MPICH's launcher then ends what it started."""
        try:
            os.killpg(self.child.pid, signal.SIGKILL)
        except OSError:
            pass

    def _emergency_checkpoint(self, rescue: str, number: int) -> str:
        """Write the checkpoint attempt ``number``'s survivors' pieces make whole, if they do and it is
        newer than the newest good one (periodic, or an earlier attempt's emergency one); what it gave, in
        words."""
        ckpt, note = emergency.assemble(emergency.pieces_in(rescue))
        shutil.rmtree(rescue, ignore_errors=True)
        if ckpt is None:
            return f"no emergency checkpoint: {note}"
        newest = newest_checkpoint_step(self.workspace)
        if newest is not None and newest >= ckpt.step:
            return f"no emergency checkpoint needed: the newest good checkpoint is at step {newest}{self._whose(newest)}"
        # the run restarts by itself: what it uses instead (not the user's --resume of a stopped run)
        instead = (f" (the restart resumes from the newest good checkpoint, step {newest}, instead)" if newest is not None
                   else " (the restart starts again from step 0: there is no good checkpoint)")
        try:
            write_checkpoint(checkpoint_path(self.workspace, ckpt.step), ckpt, after=instead)
        except NotDurable as err:  # in place: the restart resumes from it, unless the machine crashes first
            self.emergency_steps[ckpt.step] = number
            return f"emergency checkpoint at {note}, though {err.what}"
        except SingaError as err:  # a disk that refuses: the periodic checkpoint still serves
            return f"no emergency checkpoint: {err}"
        self.emergency_steps[ckpt.step] = number
        return f"emergency checkpoint at {note}"

    def _whose(self, step: int) -> str:
        """`` (attempt 1's emergency one)`` when this run's supervisor wrote the checkpoint of ``step`` from
        survivors' state; "" otherwise (a periodic checkpoint, or a stop's, or one of an earlier run)."""
        number = self.emergency_steps.get(step)
        return "" if number is None else f" (attempt {number}'s emergency one)"

    @staticmethod
    def _kept(path: str) -> bool:
        """Whether the guardian that writes a vanished rank's attempt's profile and timeline said it is
        done (a ``kept`` event) within KEPT_WAIT seconds: the restart line names them once they are there."""
        deadline = time.monotonic() + KEPT_WAIT
        while not any(e.get("kind") == "kept" for e in run_events.read(path)):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.1)
        return True

    @staticmethod
    def _events_settled(path: str, quiet: float = GUARDIAN_GRACE + 0.5, limit: float = 5.0) -> list[dict]:
        """The events once ``quiet`` seconds have passed without a new one (at most ``limit``)."""
        events, last_change, start = run_events.read(path), time.monotonic(), time.monotonic()
        while time.monotonic() - last_change < quiet and time.monotonic() - start < limit:
            time.sleep(0.1)
            now = run_events.read(path)
            if len(now) != len(events):
                events, last_change = now, time.monotonic()
        return events

    def own_command(self, ranks: int, hosts: list[Host] | None = None) -> list[str]:
        """This supervisor's command up to the job, on ``ranks`` ranks and the ``hosts`` named by the user
        that are left (default: all of them): what a stopped run resumes with."""
        policy = self.policy
        words = ["singa-mpi", "run", "-n", str(ranks)]
        words += ["--mpi", policy.mpi] if policy.mpi else []
        left = list(policy.hosts) if hosts is None else hosts
        if policy.name_hosts and policy.hostfile and left == list(policy.hosts):
            words += ["--hostfile", policy.hostfile]
        elif policy.name_hosts and left:
            words += ["--hosts", ",".join(f"{host.name}:{host.slots}" for host in left)]
        if policy.elastic:
            words += ["--elastic"] + (["--shrink"] if policy.shrink else [])
            words += ["--min-ranks", str(policy.min_ranks), "--max-restarts", str(policy.max_restarts)]
            words += [] if policy.emergency else ["--no-emergency-checkpoint"]
        return words

    def _command(self, ranks: int, attempt: int, resumed_from: int | None, hosts: list[Host] | None = None) -> list[str]:
        args = list(self.train_args)
        if attempt > 1:  # never move aside what the dead attempt wrote: resume it (or, without a checkpoint, restart)
            args = [a for a in args if a not in ("--overwrite", "--resume")]
            # without a good checkpoint (none, or each damaged: --resume would refuse them all) from step 0,
            # the dead attempt's files moved aside
            args.append("--resume" if resumed_from is not None else "--overwrite")
            args = _with_trace(args, lambda path: _attempt_file(path, attempt))
        # --workers is per group: the workers beside the servers, shared among the groups (one process
        # trains the whole net: none to give it)
        if self.policy.servers and ranks > 1:
            args += ["--workers", str((ranks - self.policy.servers) // self.policy.groups)]
        return self.launcher.command(ranks, hosts) + [sys.executable, "-m", "singa_mpi", "train", self.job,
                                               "--workspace", self.workspace, *args]

    def _traces_told(self, failed: int) -> str:
        """Where the relaunch after attempt ``failed`` writes its --trace timeline, and where the failed
        attempt's is (each attempt has its own: :func:`_attempt_file`); "" without --trace."""
        path = self._trace_given()
        if path is None:
            return ""
        old = path if failed == 1 else _attempt_file(path, failed)
        return (f"; its --trace timeline goes to {_attempt_file(path, failed + 1)} (attempt {failed}'s, up "
                f"to its failure, stays in {old})")

    def _failed_profile(self, number: int) -> str:
        return os.path.join(self.workspace, profiling.failed_file(number))

    def _profiles_told(self, failed: Attempt) -> str:
        """Where the relaunch after attempt ``failed`` writes its profile, and where the failed attempt's is
        (its own file: :func:`profiling.failed_file`), once written: by a rank during the attempt, or by the
        guardian of a rank killed outright under --trace, which outlives the launcher (:meth:`_kept` waited
        for it; one still at work is said to be).  "" when it left none."""
        kept = self._failed_profile(failed.number)
        written = _identity(kept) not in (None, failed.profile_before)
        goes = f"; its profile goes to {os.path.join(self.workspace, profiling.FILE)} (attempt {failed.number}'s"
        if written:
            return f"{goes}, up to its failure, stays in {kept})"
        if failed.kept is False:
            return f"{goes}, up to its failure, is still being written to {kept} by a guardian)"
        return ""

    def _trace_given(self) -> str | None:
        """The path of --trace PATH or --trace=PATH in train's options, if given (argparse keeps the last)."""
        args = self.train_args
        given = [arg.removeprefix("--trace=") for previous, arg in zip([""] + args[:-1], args)
                 if previous == "--trace" or arg.startswith("--trace=")]
        return given[-1] if given else None

    def _stopped(self, attempt: Attempt) -> int:
        """The exit code of a run a stop signal ended.  The ranks' own (75: they checkpointed and said how
        to resume; 0: it finished first; a rank's error) as it is; when a rank died as well, the
        launcher's code says nothing of the stop: 75, naming the newest checkpoint and the command that
        resumes it."""
        failure = attempt.failure
        if failure is None or failure.kind in ("error", "setup_error"):
            return attempt.code
        died = f", not restarting after {describe_failure(failure)}" if failure.kind in DEATHS else ""
        self.log(f"singa-mpi: supervisor: stopped by {signal.Signals(self.stopping or 0).name}{died}")
        self.log(self.resume_hint(attempt.ranks, attempt.hosts))
        return EXIT_CHECKPOINTED

    def resume_hint(self, ranks: int, hosts: list[Host] | None = None) -> str:
        """``newest checkpoint ...; resume with: singa-mpi run ... --resume`` (what a stopped run continues with)."""
        step = newest_checkpoint_step(self.workspace)
        args = [a for a in self.train_args if a not in ("--overwrite", "--resume")]
        words = self.own_command(ranks, hosts) + [self.job, "--workspace", self.workspace, *args]
        if step is None and listed(self.workspace):  # --resume would refuse them all: what it would say
            return (f"no good checkpoint: each in {checkpoint_dir(self.workspace)} is damaged; start again from "
                    f"step 0 with: {shlex.join(words + ['--overwrite'])} (it moves them aside)")
        if step is None:  # nothing to resume: the same run afresh
            return f"no checkpoint yet; start it again with: {shlex.join(words)}"
        return (f"newest checkpoint {checkpoint_path(self.workspace, step)}; "
                f"resume with: {shlex.join(words + ['--resume'])}")

    def _forward(self, signum, frame) -> None:
        """A stop signal: counted here, passed on by the loop that waits for the launcher (_pass_on_stops),
        so that one arriving while a relaunch starts reaches the new launcher, not the old one."""
        self.stopping = signum
        self.stops += 1

    def _pass_on_stops(self) -> None:
        """Each stop signal received once to the launcher running now (a second one: the ranks' second Ctrl-C)."""
        while self.passed_on < self.stops and self.child is not None and self.child.poll() is None:
            self.passed_on += 1
            try:
                # to the launcher alone, which passes it on to every rank once
                self.child.send_signal(getattr(signal, self.launcher.stop_signal))
            except OSError:
                pass

    def _finish(self, code: int) -> int:
        summary = self.summary(code)
        with atomic_path(os.path.join(self.folder, "summary.json"), "the supervisor's summary") as temporary, \
                open(temporary, "w") as f:
            json.dump(summary, f, indent=1)
        if len(self.attempts) > 1 or (code != 0 and self.policy.elastic):
            self.log("\n".join(summary_lines(summary)))
        return code

    def summary(self, code: int) -> dict:
        """The run's restarts: per failed attempt who died, where, the steps lost, the recovery time."""
        restarts = []
        for failed, after in zip(self.attempts, self.attempts[1:]):
            recovery = None
            if failed.failure is not None and after.first_step_at is not None:
                recovery = round(after.first_step_at - failed.failure.time, 2)
            failure = dataclasses.asdict(failed.failure) if failed.failure else None
            restarts.append({"attempt": failed.number, "ranks": failed.ranks, "failure": failure,
                             "emergency": failed.emergency,
                             "resumed_from": after.resumed_from, "relaunched_on": after.ranks,
                             "resumed_from_emergency_of": None if after.resumed_from is None
                             else self.emergency_steps.get(after.resumed_from),
                             "damaged_moved_aside": after.damaged,
                             "lost_steps": lost_steps(failed.failure, after.resumed_from),
                             "recovery_seconds": recovery})
        last = self.attempts[-1]
        return {"restarts": len(self.attempts) - 1, "exit_code": code, "final_ranks": last.ranks,
                "final_hosts": [f"{host.name}:{host.slots}" for host in last.hosts],
                "stopped_by_signal": self.stopping is not None, "not_restarted": self.gave_up,
                "too_few_ranks": self.gave_up is not None and "--min-ranks" in self.gave_up, "attempts": restarts,
                "last_failure": dataclasses.asdict(last.failure) if last.failure else None}


def summary_lines(summary: dict) -> list[str]:
    """The supervisor's end-of-run block."""
    lines = ["supervisor summary:", f"  restarts        {summary['restarts']}"]
    for entry in summary["attempts"]:
        failure = Failure(**entry["failure"]) if entry["failure"] else None
        lost = "" if entry["lost_steps"] is None else f", {entry['lost_steps']} steps trained again"
        recovery = "" if entry["recovery_seconds"] is None else f", recovered in {entry['recovery_seconds']:.1f}s"
        note = entry.get("emergency") or ""
        earlier = entry.get("resumed_from_emergency_of")
        kind = ("an emergency checkpoint" if note.startswith("emergency checkpoint") or earlier == entry["attempt"]
                else f"attempt {earlier}'s emergency checkpoint" if earlier else "the last periodic checkpoint")
        none = "no good checkpoint: each damaged" if entry.get("damaged_moved_aside") else "no checkpoint yet"
        resumed = (f"{kind}, step {entry['resumed_from']}" if entry["resumed_from"] is not None
                   else f"step 0 ({none})")
        if note.startswith("no emergency checkpoint:"):
            resumed += f" ({note})"
        lines.append(f"  attempt {entry['attempt']}       {entry['ranks']} ranks: "
                     f"{describe_failure(failure) if failure else 'ended'}; resumed from {resumed} on "
                     f"{entry['relaunched_on']} ranks{lost}{recovery}")
    ending = "finished" if summary["exit_code"] == 0 else (
        "stopped on a signal" if summary["stopped_by_signal"] else f"ended with exit code {summary['exit_code']}")
    lines.append(f"  final           {ending} on {summary['final_ranks']} ranks")
    return lines


def describe_failure(failure: Failure) -> str:
    """``rank 1 vanished at step 212 (killed by SIGKILL...)``, ``rank 0 failed at step 5: ...``."""
    ranks = ", ".join(str(r) for r in failure.ranks) or "?"
    at = f" at step {failure.step}" if failure.step is not None else ""
    if failure.kind == "host_lost":
        return f"host {', '.join(failure.hosts_lost)} (ranks {ranks}) was lost{at}: no word from it"
    if failure.kind == "vanished":
        who = f"one of ranks {ranks}" if failure.dead < len(failure.ranks) else f"rank {ranks}"
        how = re.search(r"vanished without a word \(([^)]*)\)", failure.what)
        return f"{who} vanished{at}" + (f" ({how.group(1)})" if how else "")
    if failure.kind in ("error", "setup_error"):
        return f"rank {ranks} failed{at}: {failure.what}"
    return f"the job ended with exit code {failure.code}{at}"


def _signal_number(name: str) -> int:
    try:
        return int(signal.Signals[name])
    except KeyError:
        return int(signal.SIGKILL)


def _with_trace(args: list[str], renamed: Callable[[str], str]) -> list[str]:
    """``args`` with the path of ``--trace PATH`` or ``--trace=PATH`` (abbreviations are spelled out
    already: :func:`spelled_out`) replaced by ``renamed(PATH)``."""
    out = []
    for previous, arg in zip([""] + args[:-1], args):
        if previous == "--trace":
            arg = renamed(arg)
        elif arg.startswith("--trace="):
            arg = "--trace=" + renamed(arg[len("--trace="):])
        out.append(arg)
    return out


def _identity(path: str) -> tuple | None:
    """What tells a file written anew (whole files are renamed into place) from one left as it was."""
    try:
        status = os.stat(path)
    except OSError:
        return None
    return status.st_ino, status.st_mtime_ns, status.st_size


def _attempt_file(path: str, attempt: int) -> str:
    """``trace.json`` -> ``trace.attempt2.json``: each attempt's own file (a failed one writes its ranks'
    timelines up to the failure: singa_mpi.timeline_parts; a relaunch must not write over it)."""
    stem, suffix = os.path.splitext(path)
    return f"{stem}.attempt{attempt}{suffix}"


def newest_checkpoint_step(workspace: str) -> int | None:
    """The step of the newest good checkpoint, the one ``train --resume`` goes on from (a damaged newer
    file, which it skips, is not counted: taken for the newest, it made an emergency checkpoint of a
    later step "not needed"); None when there is none.  Judged by the seal alone (:func:`newest_sound_step`):
    no checkpoint is loaded."""
    return newest_sound_step(workspace)



__all__ = ["Policy", "Failure", "Attempt", "Supervisor", "failure_of", "next_ranks", "why_not_restart",
           "after_a_death", "rescue_wait", "spelled_out", "lost_steps", "hosts_lost", "summary_lines",
           "describe_failure", "newest_checkpoint_step"]
