"""Which rank is alive and what it is doing: status records, the stall watchdog, stop signals.

Every rank of an MPI job keeps a **status record**: a small file in the node's shared memory
(``/dev/shm/singa-mpi-<uid>-<launch>/rank<N>``, memory-mapped) holding its rank, pid, host, step, what
it is doing, and when it last showed a sign of life and made progress.  The watchdog thread rewrites
it every 0.1 s and the runtime writes the step at each step: memory writes, no system calls.  The file
holds two copies written in turn, so that a rank stopped (SIGSTOP) or frozen in the middle of a write
still leaves its last whole record to be read.
``<launch>`` is the process that started the ranks on this node (MPICH's hydra proxy, Open MPI's
prted, slurmstepd) and its start time, so every rank of one launch finds the others' records without
communicating -- before ``MPI_Init``, which waits for every rank, too.

Two readers:

* a waiting rank's stall watchdog (:class:`Watchdog`) names the rank it waits for: :func:`blame`
  tells "stopped" (SIGSTOP: the state /proc gives), "no sign of life for 12 s" (a frozen node),
  "alive, busy in step 8 forward" and "itself waiting" apart;
* each rank's guardian (:mod:`singa_mpi.communication.guardian`), a small process that names the rank
  if it vanishes, and watches the wait in MPI_Init, where no thread of the rank can run.

What is guaranteed: a rank that vanishes after its status record exists is named on its node, with
its step, the phase of the step it was in (published as each phase begins: a rank killed as it
starts a checkpoint write is reported as writing it) and what it did inside that phase as of at most
0.1 s before; no second line is printed for the ranks the launcher ended afterwards; a stall is
named from MPI_Init on, and its line has reached the launcher before any rank of the node ends the
job (the first to claim the verdict speaks; the others wait until it has: :func:`await_verdict`).
Not guaranteed: which rank was first when several vanish within a few milliseconds and no guardian
looked in between (a node short of cores): the line then names all of them as candidates; the record and the guardian begin at the entry point, before the package's heavy
imports (:func:`start_early`), so a rank killed while Python loads numpy or MPI is named or listed too,
but one killed before the interpreter runs its first line (its first tens of milliseconds, a few
tenths of a second on a node short of cores), when no rank of the node has begun yet, is named by the
launcher alone; ranks on other nodes are not seen (each node's guardians report what
they saw: ranks that all ended together are reported as ended by the launcher); under hydra the line
comes after the launcher's banner, as hydra forwards output until every process holding the ranks'
stderr has ended. Records exist under MPI only; Linux's /proc and a writable /dev/shm (else the
temporary folder) are assumed, and without them less is told.
"""
from __future__ import annotations

import array
import atexit
import collections
import fcntl
import json
import mmap
import os
import select
import signal
import stat
import struct
import subprocess
import sys
import termios
import threading
import time
from typing import Sequence

# seq, rank, size, pid, state, in_comm, local size, step, alive_at, progress_at, host, activity
_LAYOUT = struct.Struct("<Q i i i i i i q d d 64s 384s")
_STEP = struct.Struct("<q")
_SEQ = struct.Struct("<Q")
_STEP_OFFSET = 32  # of `step` in _LAYOUT
SIZE = 512  # one copy of the record: _LAYOUT, then the sequence number again
COPIES = 2  # written in turn: a write cut short leaves the other copy whole
RUNNING, SETUP, IN_MPI_INIT = 0, 1, 2  # IN_MPI_INIT: mpi4py holds the interpreter, no heartbeat comes
CHECKPOINTING = 3  # in the step's checkpoint phase (gathering the state, or the root writing it)
STOP_PATIENCE = 20.0  # seconds a stop waits in one call for the ranks to finish their step (no --stall-timeout)
LIFE_LIMIT = 2.0  # seconds without a heartbeat (written every 0.1 s) that mean "stopped or frozen"
SAID = "said"  # beside the folder's "verdict": the claimant's line is out (say_verdict)
VERDICT_GRACE = 3.0  # how long a rank that lost the claim waits for the claimant's line


class Status(collections.namedtuple("Status", "rank size local pid state in_comm step alive_at progress_at host "
                                                "activity")):
    """One rank's record as read by another process: ``local``, the ranks the launcher started on this
    node (0: unknown); ``alive_at``, the time.time() of its last heartbeat; ``progress_at``, when what it
    does last changed.  (A named tuple, not a dataclass: the entry point imports this module first.)"""

    __slots__ = ()

    def who(self) -> str:
        return f"rank {self.rank} (pid {self.pid} on {self.host})"


# ------------------------------------------------------------------ where the records are

def launched_rank(environ=os.environ) -> tuple[int, int] | None:
    """(rank, size) as the launcher announced them in the environment, before MPI_Init; None if unknown."""
    for rank_key, size_key in (("PMI_RANK", "PMI_SIZE"), ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE")):
        if environ.get(rank_key, "").isdigit() and environ.get(size_key, "").isdigit():
            return int(environ[rank_key]), int(environ[size_key])
    return None


def local_size(environ=os.environ) -> int:
    """How many ranks the launcher started on this node, as it announced it (0: unknown)."""
    for key in ("MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE"):
        if environ.get(key, "").isdigit():
            return int(environ[key])
    return 0


def _stat_field(pid: int, index: int, default: int) -> int:
    """Field ``index`` after the command name of /proc/PID/stat (1: the parent, 19: the start time)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[index])
    except (OSError, IndexError, ValueError):
        return default


def launch_folder() -> str:
    """The folder of this launch's records on this node (the same for every rank the launcher's
    process on this node started; not created here)."""
    parent = os.getppid()
    if os.environ.get("SINGA_MPI_KEPT") == "1":  # keeper.KEPT_VARIABLE: the launcher's process is the keeper's parent
        parent = _stat_field(parent, 1, parent)
    # the parent's start time (field 22) tells this launch from an earlier one that had its pid
    started = _stat_field(parent, 19, 0)
    if os.access("/dev/shm", os.W_OK):
        base = "/dev/shm"
    else:
        import tempfile  # (not at the top: the entry point imports this module before anything heavy)

        base = tempfile.gettempdir()
    return os.path.join(base, f"singa-mpi-{os.getuid()}-{parent}-{started}")


def sweep_stale(base: str) -> None:
    """Remove the record folders of launches whose launcher has ended (whatever killed every
    guardian too left them behind)."""
    import shutil

    prefix = f"singa-mpi-{os.getuid()}-"
    try:
        names = [n for n in os.listdir(base) if n.startswith(prefix)]
    except OSError:
        return
    for name in names:
        try:
            pid, started = name[len(prefix):].split("-")
            with open(f"/proc/{int(pid)}/stat") as f:
                alive = f.read().rsplit(")", 1)[1].split()[19] == started
        except (OSError, ValueError, IndexError):
            alive = False
        if not alive and os.path.isdir("/proc/self"):  # without /proc nothing can be told: keep
            shutil.rmtree(os.path.join(base, name), ignore_errors=True)


def record_path(folder: str, rank: int) -> str:
    return os.path.join(folder, f"rank{rank}")


# ------------------------------------------------------------------ writing and reading

class StatusRecord:
    """This rank's record (the writer's side).  ``publish`` may be called from two threads."""

    def __init__(self, folder: str, rank: int, size: int):
        os.makedirs(folder, mode=0o700, exist_ok=True)
        self.folder, self.rank, self.size = folder, rank, size
        self.path = record_path(folder, rank)
        self.pid, self.host = os.getpid(), os.uname().nodename  # gethostname(), without importing socket
        self.local = local_size()
        self._lock = threading.Lock()
        self._seq = 0
        self._next = 0  # the copy the next write goes to
        self._progress_at = 0.0
        tmp = f"{self.path}.tmp{self.pid}"
        with open(tmp, "wb") as f:  # whole before it is visible under its name
            f.write(bytes(SIZE * COPIES))
        fd = os.open(tmp, os.O_RDWR)
        try:
            self._map = mmap.mmap(fd, SIZE * COPIES)
        finally:
            os.close(fd)
        now = time.time()
        self._write(SETUP, False, "starting", now, now)
        os.replace(tmp, self.path)

    def _write(self, state: int, in_comm: bool, activity: str, alive_at: float, progress_at: float) -> None:
        # a sequence number at both ends of the copy, odd while a write is under way: a reader that
        # copied it during a write sees them differ, or odd, and takes the other copy (the last whole
        # one, also when this process is stopped right here) or reads again
        base = self._next * SIZE
        self._seq += 1
        _SEQ.pack_into(self._map, base, self._seq)
        step = _STEP.unpack_from(self._map, base + _STEP_OFFSET)[0]
        _LAYOUT.pack_into(self._map, base, self._seq, self.rank, self.size, self.pid, state, int(in_comm), self.local,
                          step, alive_at, progress_at, self.host.encode()[:64], activity.encode()[:384])
        self._seq += 1
        _SEQ.pack_into(self._map, base + SIZE - _SEQ.size, self._seq)
        _SEQ.pack_into(self._map, base, self._seq)
        self._next = (self._next + 1) % COPIES
        self._progress_at = progress_at

    def publish(self, activity: str, in_comm: bool, progressed: bool, state: int = RUNNING) -> None:
        """A heartbeat: alive now; ``progressed``: what the rank does changed since the last one."""
        with self._lock:
            if self._map.closed:
                return
            now = time.time()
            self._write(state, in_comm, activity, now, now if progressed else self._progress_at)

    def set_step(self, step: int) -> None:
        """The step about to run (every step: an 8-byte write into each copy, no lock)."""
        for copy in range(COPIES):
            _STEP.pack_into(self._map, copy * SIZE + _STEP_OFFSET, step)

    def close(self, remove: bool = True) -> None:
        with self._lock:
            if not self._map.closed:
                self._map.close()
        if remove:
            remove_quietly(self.path)
            remove_folder_if_done(self.folder)


def read_record(path: str) -> Status | None:
    """The record at ``path`` (None if absent or never completely written)."""
    fields = None
    try:
        with open(path, "rb") as f:
            for _ in range(50):
                f.seek(0)
                data = f.read(SIZE * COPIES)
                if len(data) < SIZE:
                    return None
                fields = _latest_whole_copy(data)
                if fields is not None:
                    break
                time.sleep(0.001)
    except OSError:
        return None
    if fields is None:
        return None
    seq, rank, size, pid, state, in_comm, local, step, alive_at, progress_at, host, activity = fields
    return Status(rank, size, local, pid, state, bool(in_comm), step, alive_at, progress_at,
                  host.rstrip(b"\0").decode(errors="replace"), activity.rstrip(b"\0").decode(errors="replace"))


def _latest_whole_copy(data: bytes) -> tuple | None:
    """The fields of the newest copy in ``data`` that was whole when read (None: none was)."""
    best = None
    for base in range(0, len(data) - SIZE + 1, SIZE):
        head, tail = _SEQ.unpack_from(data, base)[0], _SEQ.unpack_from(data, base + SIZE - _SEQ.size)[0]
        if head == tail and head % 2 == 0 and head > 0 and (best is None or head > best[0]):
            best = _LAYOUT.unpack_from(data, base)
    return best


def read_all(folder: str) -> dict[int, Status]:
    """Every record of the launch on this node, by rank."""
    found = {}
    try:
        names = os.listdir(folder)
    except OSError:
        return found
    for name in names:
        if name.startswith("rank") and name[4:].isdigit():
            status = read_record(os.path.join(folder, name))
            if status is not None:
                found[status.rank] = status
    return found


# ------------------------------------------------------------------ who is not responding

def blame(records: dict[int, Status], awaited: list[int], now: float, unrecorded: dict[int, int] | None = None) -> str:
    """For a rank that waits too long: which of ``awaited`` holds it up, and why we think so (one
    clause).  ``unrecorded``: {rank: pid} of this node's ranks that have no record yet."""
    silent, missing, busy, waiting = [], [], [], []
    for rank in awaited:
        status = records.get(rank)
        if status is None and rank in (unrecorded or {}):
            pid = unrecorded[rank]
            stopped = proc_state(pid) in ("T", "t")
            (silent if stopped else missing).append(
                f"rank {rank} (pid {pid}) is {'stopped (SIGSTOP, Ctrl-Z or a debugger) ' if stopped else ''}"
                f"before it began its status record{'' if stopped else ' (still starting?)'}")
        elif status is None:
            missing.append(f"rank {rank}")
        elif proc_state(status.pid) in ("T", "t"):
            silent.append(f"{status.who()} is stopped (SIGSTOP, Ctrl-Z or a debugger; last seen at step "
                          f"{status.step}: {status.activity})")
        elif status.state == IN_MPI_INIT:
            waiting.append(f"{status.who()} is itself waiting ({status.activity})")
        elif now - status.alive_at > LIFE_LIMIT:
            silent.append(f"{status.who()} has shown no sign of life for {now - status.alive_at:.1f}s "
                          f"(stopped or frozen; last seen at step {status.step}: {status.activity})")
        elif status.in_comm:
            waiting.append(f"{status.who()} is itself waiting (step {status.step}: {status.activity})")
        else:
            busy.append(f"{status.who()} is alive but has made no progress for {now - status.progress_at:.1f}s "
                        f"(step {status.step}: {status.activity})")
    if silent:
        return "not responding: " + "; ".join(silent[:3])
    if missing:
        return (f"not responding: {', '.join(missing[:6])}: no status record on this node (not started, stopped "
                f"before it began, or running on another node)")
    if busy:
        return "waiting for: " + "; ".join(busy[:3])
    if waiting:
        return "every rank it waits for waits too (a deadlock): " + "; ".join(waiting[:3])
    return "no other rank to wait for"


def unrecorded_ranks(folder: str, records: dict[int, Status]) -> dict[int, int]:
    """{rank: pid} of the processes the launcher started on this node (the parent named in the
    folder's name) that have no record yet, from /proc (empty where there is none)."""
    try:
        launcher = int(os.path.basename(folder).split("-")[3])
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except (OSError, IndexError, ValueError):
        return {}
    found = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) != launcher:
                    continue
            with open(f"/proc/{pid}/environ", "rb") as f:
                environ = dict(item.split(b"=", 1) for item in f.read().split(b"\0") if b"=" in item)
        except (OSError, IndexError, ValueError):
            continue
        launched = launched_rank({k.decode(errors="replace"): v.decode(errors="replace") for k, v in environ.items()})
        if launched is not None and launched[0] not in records:
            found[launched[0]] = pid
    return found


def proc_state(pid: int) -> str:
    """The process's state letter from /proc (R, S, D, T stopped, Z...), "" if unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def ended_ranks(folder: str, but: int = -1) -> list[int]:
    """The ranks of this node, ``but`` this one, whose status record is still there while their process
    has ended: killed or crashed (a rank that ends as it should removes its record).  A launcher ends
    the job once one has (Open MPI's mpirun SIGTERMs the others): no stop can complete then."""
    host = os.uname().nodename
    return sorted(rank for rank, status in read_all(folder).items()
                  if rank != but and status.host == host and proc_state(status.pid) in ("", "Z", "X"))


def holds_up_setup(records: dict[int, Status], awaited: list[int], now: float) -> bool:
    """Whether every awaited rank is alive and still setting up without communicating (reading the
    job, preparing data): a legitimate wait at start-up, however long."""
    found = [records.get(rank) for rank in awaited]
    return bool(found) and all(s is not None and s.state == SETUP and not s.in_comm and now - s.alive_at <= LIFE_LIMIT
                               for s in found)


def checkpointing(records: dict[int, Status], awaited: list[int], now: float) -> bool:
    """Whether one of the awaited ranks is alive and in a checkpoint (the root may write for minutes)."""
    return any(rank in records and records[rank].state == CHECKPOINTING and now - records[rank].alive_at <= LIFE_LIMIT
               for rank in awaited)


def lifeless(records: dict[int, Status], awaited: list[int], now: float, limit: float) -> list[int]:
    """The awaited ranks of this node that have shown no sign of life for ``limit`` seconds (stopped,
    frozen): what ends even a patient wait.  A rank without a record here (another node) is not judged;
    one in MPI_Init beats no heart."""
    return [rank for rank in awaited if rank in records and records[rank].state != IN_MPI_INIT
            and now - records[rank].alive_at > limit]


# ------------------------------------------------------------------ the verdict: who speaks for the job

def claim_verdict(folder: str, note: str) -> bool:
    """Say "this job's end is explained" (a rank about to MPI_Abort after printing why, or the guardian
    that names a vanished rank); True for the first claimant only."""
    try:
        fd = os.open(os.path.join(folder, "verdict"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    except OSError:
        return True  # no folder: nobody else can speak either
    with os.fdopen(fd, "w") as f:
        f.write(note)
    return True


def say_verdict(folder: str, line: str, fd: int = 2) -> None:
    """The claimant's line (ending in a newline; "" when it has none to say): written, read by the
    launcher, then marked said, so that the ranks that lost the claim may end the job
    (:func:`await_verdict`)."""
    try:
        if line:
            os.write(fd, line.encode(errors="replace"))
            wait_until_read(fd)
    except OSError:  # no reader any more: nothing to wait for
        pass
    try:  # whole or not at all: a rank that lost the claim compares its own line with it (said_line)
        temporary = os.path.join(folder, f".{SAID}-{os.getpid()}")
        with open(temporary, "w", encoding="utf-8", errors="replace") as f:
            f.write(line)
        os.replace(temporary, os.path.join(folder, SAID))
    except OSError:
        pass


def said_line(folder: str) -> str:
    """What the claimant said (:func:`say_verdict`), "" if nothing or unknown."""
    try:
        with open(os.path.join(folder, SAID), encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def await_verdict(folder: str, limit: float) -> bool:
    """Whether the claimant's line is out (it said it), waiting up to ``limit`` seconds.  A rank that
    lost the claim must not end the job before: under MPICH the kill of a stopped rank, or an abort,
    ends every process at once, the claimant too, perhaps before it wrote its line."""
    deadline = time.monotonic() + limit
    while not os.path.exists(os.path.join(folder, SAID)):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def wait_until_read(fd: int = 2, limit: float = 2.0) -> None:
    """Where ``fd`` is a pipe (a launcher forwards this rank's output through one), wait until the
    reader has taken everything in it, at most ``limit`` seconds: what is still in the pipe when the
    launcher ends the job is lost.  Files and terminals hold what was written: no wait."""
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return
        unread, reader = array.array("i", [0]), select.poll()
        reader.register(fd, 0)  # POLLERR comes by itself: the reading end is closed
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and not reader.poll(0):
            fcntl.ioctl(fd, termios.FIONREAD, unread)  # Linux counts a pipe's unread bytes from either end
            if unread[0] == 0:
                return
            time.sleep(0.005)
    except OSError:
        pass


# the guardian's command: the standard library and this package's communication modules only
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_GUARDIAN_MAIN = (f"import sys; sys.path.insert(0, {_PACKAGE_PARENT!r}); "
                  f"from singa_mpi.communication.guardian import main; main(sys.argv[1:])")


def _guardian_environment() -> dict[str, str]:
    """PATH, and where a supervisor wants to hear of a death (singa_mpi.run_events): nothing else, so
    that nothing mistakes the guardian for a rank (it has no PMI_RANK)."""
    from singa_mpi.run_events import EVENTS_VARIABLE

    env = {"PATH": os.environ.get("PATH", "")}
    for name in (EVENTS_VARIABLE, "SINGA_MPI_KEPT"):  # KEPT: the other ranks outlive a death (keeper)
        if os.environ.get(name):
            env[name] = os.environ[name]
    return env


class Guardian:
    """The rank's side of its guardian process: start it, and tell it how the rank ends."""

    def __init__(self, folder: str, rank: int, stall_timeout: float | None = None):
        read_end, self._write_end = os.pipe()
        try:
            # stdout closed, stderr the rank's (the launcher forwards it); a bare environment
            self.process = subprocess.Popen([sys.executable, "-I", "-S", "-c", _GUARDIAN_MAIN, folder, str(rank),
                                             str(os.getpid()), str(stall_timeout or 0)], stdin=read_end,
                                            stdout=subprocess.DEVNULL, start_new_session=True,
                                            env=_guardian_environment())
        finally:
            os.close(read_end)

    def watch_init(self, stall_timeout: float) -> None:
        """From now on, watch the rank's wait in MPI_Init with this timeout (a guardian started before
        the command line was read has none)."""
        if self._write_end is not None:
            try:
                os.write(self._write_end, f"stall {stall_timeout:g}\n".encode())
            except OSError:
                pass

    def tell_trace(self, path: str, run: str, shown: str, profile: str | None = None,
                   profile_shown: str | None = None, size: int = 0) -> None:
        """The rank writes its part of ``--trace PATH`` (run ``run``; ``shown``: the path as the user gave
        it, for the line): if it vanishes, the guardian that names it writes the trace from the ranks'
        parts (:func:`singa_mpi.timeline.write_from_parts`), and the failed run's profile of the
        ``size`` ranks to ``profile`` from the same parts (``profile_shown``: as the user's workspace
        names it)."""
        if self._write_end is not None:
            try:
                told = {"path": path, "run": run, "shown": shown, "profile": profile,
                        "profile_shown": profile_shown, "size": size}
                os.write(self._write_end, b"trace " + json.dumps(told).encode() + b"\n")
            except OSError:
                pass

    def finish(self, how: str = "exit") -> None:
        """``exit``: the rank ends normally; ``abort``: it ends the job after printing why."""
        fd, self._write_end = self._write_end, None
        if fd is None:
            return
        try:
            os.write(fd, how.encode() + b"\n")
            os.close(fd)
        except OSError:
            pass
        if how == "exit":  # it leaves at once: reap it (an abort ends this process anyway)
            try:
                self.process.wait(timeout=2.0)
            except subprocess.TimeoutExpired:  # a guardian that lingers is harmless
                pass


# ------------------------------------------------------------------ the rank's side: record, watchdog, guardian

def _in_checkpoint(tracer) -> bool:
    outer = next(iter(list(tracer.stack)), None)  # (a copy: the main thread opens and closes spans)
    return outer is not None and outer.cat == "step" and outer.name == "checkpoint"


def activity_of(tracer, note: str = "") -> tuple[tuple, str, bool]:
    """(what changes when the rank progresses, what it is doing in words, whether it waits in a
    communication call), from the tracer's open spans (outermost step phase, innermost span)."""
    stack = list(tracer.stack)
    key = (tracer.step, tuple(span.started for span in stack), note)
    if not stack:
        return key, note or "between steps", False
    outer, inner = stack[0], stack[-1]
    args = inner.args or {}
    if inner.cat == "comm":
        what = f"{inner.direction} {args.get('op', '')} {args.get('peer', '')} in layer {inner.name}"
    elif inner.cat == "step":
        what = inner.name
    else:
        what = f"{inner.cat} layer {inner.name}"
    text = what if outer is inner or outer.cat != "step" else f"{outer.name}: {what}"
    return key, " ".join(f"{note + ': ' if note else ''}{text}".split()), inner.cat == "comm"


class Watchdog(threading.Thread):
    """This rank's heartbeat and stall watchdog (one thread, every ``poll`` seconds).

    It rewrites the status record from the tracer, and with a ``timeout`` it ends the job when this
    rank has waited in one communication call (or in ``waiting_in``: MPI_Init) longer than that,
    naming the rank it waits for (:func:`blame`).  While this rank sets up (``note``), a wait on
    ranks that are alive and still setting up themselves is not a stall.  Without a ``timeout``, a
    stop signal arms it (:meth:`stop_signal`)."""

    def __init__(self, life: RankLife, tracer, timeout: float | None, poll: float = 0.1):
        super().__init__(name="singa-mpi-watchdog", daemon=True)
        self.life, self.tracer, self.timeout, self.poll = life, tracer, timeout, poll
        self.note = ""
        self.role = ""  # "worker 1 of worker group 0", "server 0 of server group 0" (several groups, servers)
        self.waiting: tuple[float, str] | None = None  # (perf_counter, what): a wait the tracer does not see
        self._last_key = None
        self._stop_event = threading.Event()
        self._last_poll = time.monotonic()
        self._quiet_until = 0.0
        self.stopping: tuple[float, str] | None = None  # (perf_counter, signal) of a stop that armed it

    def run(self) -> None:
        while not self._stop_event.wait(self.poll):
            self.beat()
            if self.timeout and not self.was_suspended():
                self.check()

    def was_suspended(self, now: float | None = None) -> bool:
        """True for one timeout after this process was stopped and continued (SIGSTOP, a debugger, a
        frozen VM): its own clock jumped, so its long wait is its own doing, not the peer's.  Open
        MPI's abort continues a stopped rank (SIGCONT): it must not then blame the rank that waited
        for it; the others name it."""
        now = time.monotonic() if now is None else now
        gap, self._last_poll = now - self._last_poll, now
        if gap > self.poll + LIFE_LIMIT:
            self._quiet_until = now + (self.timeout or 0.0)
        return now < self._quiet_until

    def beat(self) -> None:
        key, text, in_comm = activity_of(self.tracer, self.note) if self.tracer is not None else \
            (self.note, self.note, False)
        if self.waiting is not None and not in_comm:
            text, in_comm = f"{self.note + ': ' if self.note else ''}{self.waiting[1]}", True
        if self.role:  # a job of several worker groups or with servers: which one this rank is
            text = f"{self.role}: {text}"
        state = IN_MPI_INIT if self.waiting is not None else SETUP if self.note else \
            CHECKPOINTING if self.tracer is not None and _in_checkpoint(self.tracer) else RUNNING
        self.life.record.publish(text, in_comm, progressed=key != self._last_key, state=state)
        self._last_key = key

    def _pending(self) -> tuple[float, str, list[int], bool] | None:
        """(since, what, the ranks awaited, whether a long wait is normal) of this rank's wait, if any."""
        span = self.tracer.pending("comm") if self.tracer is not None else None
        others = [r for r in range(self.life.size) if r != self.life.rank]
        if span is not None:
            args = span.args or {}
            awaits = [r for r in (args.get("awaits") or others) if r != self.life.rank]
            # patient: a wait that may last (rank 0 timing kernels, a server between messages, a group
            # done before the others), as long as the ranks it waits for show signs of life
            return span.started, span.describe(), awaits, bool(args.get("patient"))
        if self.waiting is not None:
            since, what = self.waiting
            return since, f"{what} for {time.perf_counter() - since:.1f}s", others, False
        return None

    def stop_signal(self, name: str) -> None:
        """A stop signal came (``name``): without a ``timeout`` of the user's, a wait that lasts
        :data:`STOP_PATIENCE` seconds from now on is a stall (the step that the stop finishes cannot
        end: say which rank holds it up, and end the job), except on a rank writing a checkpoint.
        Under a launcher the rank's MPI wait would otherwise hold the stop and say nothing until
        SIGKILL."""
        if not self.timeout:
            self.stopping = (time.perf_counter(), name)
            self.timeout = STOP_PATIENCE

    def check(self) -> None:
        pending = self._pending()
        if pending is None:
            return
        since = pending[0] if self.stopping is None else max(pending[0], self.stopping[0])
        if time.perf_counter() - since <= self.timeout:
            return
        records, now = read_all(self.life.folder), time.time()
        if pending[3] and not lifeless(records, pending[2], now, self.timeout):
            return
        if self.note and holds_up_setup(records, pending[2], now):
            return
        if self.stopping is not None and checkpointing(records, pending[2], now):
            return
        unrecorded = unrecorded_ranks(self.life.folder, records) if set(pending[2]) - set(records) else {}
        stopped = [records[r].pid for r in pending[2] if r in records and proc_state(records[r].pid) in ("T", "t")]
        if self.stopping is None:
            what = f"stalled: {pending[1]} (--stall-timeout {self.timeout:g}s)"
        else:
            what = (f"stalled after {self.stopping[1]}: {pending[1]} (a stop waits {self.timeout:g}s for every rank "
                    f"to finish its step; --stall-timeout S waits S seconds)")
        self.life.end_job(f"rank {self.life.rank}: {what}; {blame(records, pending[2], now, unrecorded)}; "
                          f"aborting the job", 4, stopped)

    def stop(self) -> None:
        self._stop_event.set()


class RankLife:
    """One rank's status record, guardian and watchdog, from before MPI_Init to the end of the run.

    ``abort(code)`` ends the whole job; until :meth:`attach` gives it MPI_Abort it exits this process,
    which makes the launcher end the others.  Begun at the entry point (:func:`start_early`, without a
    tracer or a stall timeout: the command line is not read yet), it is taken over by the launcher
    (:func:`take_early`, :meth:`adopt`)."""

    def __init__(self, rank: int, size: int, tracer=None, stall_timeout: float | None = None):
        self.rank, self.size = rank, size
        self.folder = launch_folder()
        sweep_stale(os.path.dirname(self.folder))
        self.record = StatusRecord(self.folder, rank, size)
        try:
            self.guardian: Guardian | None = Guardian(self.folder, rank, stall_timeout)
        except OSError:  # no guardian: a vanished rank is named by the launcher alone
            self.guardian = None
        self.abort = self._exit
        self.watchdog = Watchdog(self, tracer, stall_timeout)
        if tracer is not None:
            tracer.on_phase = self.watchdog.beat
        self.watchdog.start()
        _LIVES.append(self)

    def adopt(self, tracer, stall_timeout: float | None) -> None:
        """The launcher takes over a life begun at the entry point: the activity from ``tracer`` from
        now on, and the stall timeout for the watchdog and for the guardian's watch of MPI_Init."""
        self.watchdog.tracer, self.watchdog.note = tracer, ""
        tracer.on_phase = self.watchdog.beat
        self.watchdog.timeout = stall_timeout
        if stall_timeout and self.guardian is not None:
            self.guardian.watch_init(stall_timeout)

    def ended_ranks(self) -> list[int]:
        """The other ranks of this node that have ended unannounced (:func:`ended_ranks`)."""
        return ended_ranks(self.folder, self.rank)

    @staticmethod
    def _exit(code: int) -> None:
        time.sleep(0.5)  # let the launcher forward the line first
        os._exit(code)

    def attach(self, abort) -> None:
        """MPI is up: end the job with ``abort`` (MPI_Abort) from now on."""
        self.abort = abort

    def waiting_in(self, what: str | None) -> None:
        """Mark (or with None, unmark) MPI_Init, a wait the tracer does not see and during which no
        thread of this process runs (mpi4py holds the interpreter): the guardian watches it."""
        self.watchdog.waiting = None if what is None else (time.perf_counter(), what)
        note = f"{self.watchdog.note}: " if self.watchdog.note else ""
        if what is not None:
            self.record.publish(f"{note}{what}", True, progressed=True, state=IN_MPI_INIT)
        else:
            self.watchdog.beat()

    def set_note(self, note: str) -> None:
        """What this rank does while it sets up ("" once it trains)."""
        self.watchdog.note = note

    def set_role(self, role: str) -> None:
        """Which worker or server this rank is, named in its record from now on."""
        self.watchdog.role = role

    def end_job(self, message: str, code: int, stopped: Sequence[int] = ()) -> None:
        """Print ``message`` (one line) unless another rank of this node has explained the end already
        (several watchdogs fire at once when one rank stops), and abort the job.  ``stopped``: pids of
        this node's ranks that are stopped (SIGSTOP): ended first with SIGKILL, the one signal a
        stopped process cannot hold pending, so that no launcher waits on them."""
        if self.explained():
            self.say(f"singa-mpi: {message}\n")
        else:  # the claimant (a rank or guardian of this node) ends the job: not before its line is out
            await_verdict(self.folder, VERDICT_GRACE)
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        self.abort(code)

    def says_the_same(self, what: str) -> bool:
        """For a rank that lost the claim: whether the claimant's line ends with ``what`` (a failure
        every rank met, as a plugin's bug on every worker: said once, not once per rank)."""
        return await_verdict(self.folder, VERDICT_GRACE) and said_line(self.folder).endswith(what)

    def say(self, line: str) -> None:
        """Print ``line`` (ending in a newline) as the verdict this rank claimed (:meth:`explained`)."""
        say_verdict(self.folder, line)

    def explained(self) -> bool:
        """This rank ends the job on purpose and says why: no guardian need speak.  False when another
        rank of this node claimed that first."""
        first = claim_verdict(self.folder, f"rank {self.rank}")
        if self.guardian is not None:
            self.guardian.finish("abort")
        return first

    def close(self) -> None:
        """The rank ends normally: stop the thread, dismiss the guardian, remove the record."""
        self.watchdog.stop()
        if self.watchdog.is_alive() and self.watchdog is not threading.current_thread():
            self.watchdog.join(timeout=1.0)
        if self.guardian is not None:
            self.guardian.finish("exit")
        self.record.close()
        if self in _LIVES:
            _LIVES.remove(self)


_LIVES: list[RankLife] = []  # this process's open lives (one at most)


def tell_guardian_of_trace(path: str, run: str, profile: str | None = None, size: int = 0) -> None:
    """This rank writes its part of the --trace timeline ``path``, as the user gave it; ``profile``: where
    a failed run's profile of the ``size`` ranks goes (the guardian writes to their absolute paths:
    :meth:`Guardian.tell_trace`)."""
    for life in _LIVES:
        if life.guardian is not None:
            life.guardian.tell_trace(os.path.abspath(path), run, path,
                                     None if profile is None else os.path.abspath(profile), profile, size)


def close_lives() -> None:
    """Before a deliberate ``os._exit`` from another thread (a survivor that saved its emergency
    piece): tell the guardian this end is meant, so that it does not report a vanished rank."""
    for life in list(_LIVES):
        if life.guardian is not None:
            life.guardian.finish("exit")
        life.record.close()
        _LIVES.remove(life)


# ------------------------------------------------------------------ from the first moments

_EARLY: list[RankLife] = []  # the life start_early began, until the launcher takes it
_WATCHED_COMMANDS = ("train", "test")  # the commands whose runs the launcher watches (RankLife)


def start_early(argv: list[str]) -> None:
    """At the entry point, before the heavy imports (numpy, h5py, MPI: a second or more, longer on a
    busy node): under a launcher of several ranks, this rank's status record, guardian and heartbeat
    from now on, so that a rank killed while Python loads the package is named, or listed among the
    candidates, as one killed later is.  For ``train`` and ``test`` (``argv``: the command line without
    the program); a process that leaves before the launcher takes over (a bad command line) dismisses
    its guardian at exit.  Standard library only, as everything this module imports."""
    command = next((arg for arg in argv if not arg.startswith("-")), None)
    launched = launched_rank()
    if command not in _WATCHED_COMMANDS or launched is None or launched[1] <= 1 or _EARLY:
        return
    try:
        life = RankLife(*launched)
    except OSError:  # no shared memory to write: the launcher tries again, and says less without it
        return
    life.set_note("starting: Python loads the package")
    _EARLY.append(life)
    atexit.register(life.close)


def take_early(rank: int, size: int) -> RankLife | None:
    """The life :func:`start_early` began for this rank of this world, once; None if there is none."""
    if _EARLY and (_EARLY[0].rank, _EARLY[0].size) == (rank, size):
        return _EARLY.pop()
    return None


# ------------------------------------------------------------------ clean-up

def remove_quietly(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def remove_folder_if_done(folder: str) -> None:
    """The last one out removes the folder (and a verdict nobody needs any more)."""
    try:
        names = os.listdir(folder)
        if not any(n.startswith("rank") for n in names):
            for name in names:
                remove_quietly(os.path.join(folder, name))
            os.rmdir(folder)
    except OSError:
        pass
