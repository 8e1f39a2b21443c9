"""What the fuzz and fault suite shares: its two modes, its tally, and running the CLI under a bound.

Modes (the environment variable ``SINGA_MPI_FUZZ``):

* unset or ``ci``: few examples, derandomized (the same cases on every run), minutes in all;
* ``long``: the nightly run: many more examples, a fresh random draw each time.

Every property test counts the cases it tried and those that held (:func:`case`); the suite's
conftest prints one line per file at the end of the run, e.g.
``fuzz test_job_files.py: 1042 cases, 1042 passed``.
"""
from __future__ import annotations

import builtins
import collections
import contextlib
import dataclasses
import io
import os
import pathlib
import pickle
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator

from hypothesis import HealthCheck, Phase, settings
from hypothesis.configuration import set_hypothesis_home_dir
from hypothesis.errors import Frozen, StopTest, UnsatisfiedAssumption

ROOT = pathlib.Path(__file__).resolve().parents[2]
MODE = os.environ.get("SINGA_MPI_FUZZ", "ci")
LONG = MODE == "long"
if MODE not in ("ci", "long"):
    raise RuntimeError(f"SINGA_MPI_FUZZ={MODE!r}: expected 'ci' (the default) or 'long'")

# Hypothesis keeps caches and failure patches in .hypothesis/ below the current folder: not in the checkout
if not os.environ.get("HYPOTHESIS_STORAGE_DIRECTORY"):
    set_hypothesis_home_dir(os.path.join(tempfile.gettempdir(), "singa-mpi-hypothesis"))

# Exit codes the README documents: 0 done, 2 a bad job or argument, 3 bad data, 4 a stalled rank
# (--stall-timeout), 75 stopped on a signal after a checkpoint, 130 a second Ctrl-C; plus any code an
# error class of singa_mpi.errors declares (a new kind of error brings its documented code with it).
SIGNAL_CODES = {75, 130}
STALL_CODE = 4


def error_codes() -> set[int]:
    """The exit codes of the user-facing error classes (SingaError's own 1 is no documented verdict)."""
    from singa_mpi import errors

    found, todo = set(), [errors.SingaError]
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        code = cls.__dict__.get("exit_code")
        if isinstance(code, int) and code != 1:
            found.add(code)
    return found


def documented_codes() -> set[int]:
    return {0, STALL_CODE} | SIGNAL_CODES | error_codes()


def examples(ci: int, long: int) -> int:
    return long if LONG else ci


def fuzz_settings(ci: int, long: int, **extra) -> settings:
    """Hypothesis settings for one property: ``ci`` examples normally, ``long`` in the long mode.

    No deadline (each property states its own time bound), no example database (nothing written into
    the checkout; a failure prints its reproduction), derandomized outside the long mode, and no
    shrinking: a damaged file that hangs a reader would make every shrinking step wait for the bound,
    and each failure message already says what was mutated."""
    extra.setdefault("phases", [Phase.explicit, Phase.generate])
    return settings(max_examples=examples(ci, long), deadline=None, database=None, derandomize=not LONG,
                    print_blob=True, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                            HealthCheck.filter_too_much],
                    **extra)


def timeout(long_seconds: int):
    """The pytest-timeout bound of one property test: the project's 300 s, or more in the long mode."""
    import pytest

    return pytest.mark.timeout(long_seconds if LONG else 300)


# ------------------------------------------------------------------ the tally

TALLY: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


@contextlib.contextmanager
def case(test_file: str) -> Iterator[None]:
    """Count one generated case of ``test_file``: tried, and passed when the body ends normally.  A
    case hypothesis itself abandons (its data ran out, an assumption failed) is no case."""
    name = pathlib.Path(test_file).name
    try:
        yield
    except (StopTest, Frozen, UnsatisfiedAssumption):
        raise
    except BaseException:
        TALLY[name]["tried"] += 1
        raise
    TALLY[name]["tried"] += 1
    TALLY[name]["passed"] += 1


def summary_lines() -> list[str]:
    return [f"fuzz {name}: {c['tried']} cases, {c['passed']} passed ({MODE} mode)" for name, c in sorted(TALLY.items())]


# ------------------------------------------------------------------ running the CLI

@dataclasses.dataclass
class Outcome:
    """How one CLI run ended: its code (None if it did not end in time), its output, and the
    traceback of an exception that escaped ``cli.main`` (in-process runs)."""

    argv: list[str]
    code: int | None
    out: str
    err: str
    seconds: float
    escaped: str = ""  # a traceback: an exception other than SystemExit left main()
    timed_out: bool = False

    def show(self) -> str:
        return (f"$ singa-mpi {' '.join(self.argv)}\nexit {self.code} after {self.seconds:.1f}s"
                f"{' (TIMED OUT)' if self.timed_out else ''}\n--- stdout (tail)\n{self.out[-1500:]}\n"
                f"--- stderr (tail)\n{self.err[-2500:]}\n{self.escaped[-2500:]}")


@dataclasses.dataclass
class Forked:
    """How a function run in a forked child ended: ``returned`` its value, or it ``raised`` (the
    traceback), ``crashed`` (a signal ended the child) or ``timed out`` (the child was killed)."""

    how: str
    value: object = None
    seconds: float = 0.0


def in_fork(function: Callable, *args, limit: float) -> Forked:
    """``function(*args)`` in a fork of this process, killed after ``limit`` seconds.

    A fork starts at once (everything is imported already), and unlike an alarm signal, killing it
    also ends a loop inside a C library (libhdf5 on a damaged file) and leaves this process's signal
    handlers, threads and warnings filters alone."""
    read_end, write_end = os.pipe()
    began = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: run, send the pickled result, leave without running any cleanup
        os.close(read_end)
        _die_with_parent()
        try:
            result = ("returned", function(*args))
        except BaseException:  # noqa: BLE001 - reported to the parent
            result = ("raised", traceback.format_exc())
        try:
            payload = pickle.dumps(result)
        except Exception as err:  # noqa: BLE001
            payload = pickle.dumps(("raised", f"unpicklable result: {err}"))
        with os.fdopen(write_end, "wb") as pipe:
            pipe.write(payload)
        os._exit(0)
    os.close(write_end)
    finished = False
    try:
        payload, finished = _read_until(read_end, began + limit)
    finally:  # also when this process is interrupted (pytest-timeout, Ctrl-C): no child outlives the test
        if not finished:
            os.kill(pid, signal.SIGKILL)
        _, status = os.waitpid(pid, 0)
    seconds = time.monotonic() - began
    if not finished:
        return Forked("timed out", None, seconds)
    if not payload:
        return Forked("crashed", f"signal {os.WTERMSIG(status)}" if os.WIFSIGNALED(status) else "no result", seconds)
    how, value = pickle.loads(payload)
    return Forked(how, value, seconds)


def _die_with_parent() -> None:
    """Linux: the kernel kills this child if the test process dies (prctl PR_SET_PDEATHSIG)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _read_until(fd: int, deadline: float) -> tuple[bytes, bool]:
    """Everything written to ``fd`` until its end, or what came before ``deadline`` (then False)."""
    chunks = []
    with os.fdopen(fd, "rb", buffering=0) as pipe:
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([pipe], [], [], left)[0]:
                return b"".join(chunks), False
            chunk = pipe.read(1 << 16)
            if not chunk:
                return b"".join(chunks), True
            chunks.append(chunk)


def _main_capturing(argv: list[str]) -> tuple[int | None, str, str, str]:
    """In the child: cli.main(argv) with file descriptors 1 and 2 (C libraries' output too) captured."""
    from singa_mpi import cli

    files = [tempfile.TemporaryFile(), tempfile.TemporaryFile()]  # noqa: SIM115 - closed with the child
    for fd, file in zip((1, 2), files):
        os.dup2(file.fileno(), fd)
    sys.stdout = io.TextIOWrapper(io.FileIO(1, "w", closefd=False), line_buffering=True, errors="replace")
    sys.stderr = io.TextIOWrapper(io.FileIO(2, "w", closefd=False), line_buffering=True, errors="replace")
    code, escaped = None, ""
    try:
        code = cli.main(argv)
    except SystemExit as exit_:  # argparse's usage errors
        code = exit_.code if isinstance(exit_.code, int) else 2
    except BaseException:  # noqa: BLE001 - the property is that nothing else escapes
        escaped = traceback.format_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    out, err = (_read_back(file) for file in files)
    return code, out, err, escaped


def _read_back(file) -> str:
    file.seek(0)
    return file.read().decode(errors="replace")


def run_in_process(argv: list[str], limit: float) -> Outcome:
    """``singa_mpi.cli.main(argv)`` as the CLI would run it, in a fork of this process (no interpreter
    start-up), stopped after ``limit`` seconds.  An exception that leaves main() is recorded."""
    forked = in_fork(_main_capturing, argv, limit=limit)
    if forked.how == "returned":
        code, out, err, escaped = forked.value
        return Outcome(argv, code, out, err, forked.seconds, escaped)
    if forked.how == "timed out":
        return Outcome(argv, None, "", "", forked.seconds, timed_out=True)
    return Outcome(argv, None, "", "", forked.seconds, escaped=f"the child {forked.how}: {forked.value}")


def cli_env(**extra: str) -> dict[str, str]:
    """Environment of a CLI subprocess: this checkout's singa_mpi, one BLAS thread, MPI on shared memory."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONUNBUFFERED="1", **extra)
    env.setdefault("UCX_TLS", "self,sm")
    env.pop("SINGA_MPI_TEST_TMP", None)
    return env


# `python -m singa_mpi ARGS` with its address space capped first (the cap is the first argument)
_CAPPED_MAIN = ("import resource, runpy, sys; cap = int(sys.argv.pop(1)); "
                "resource.setrlimit(resource.RLIMIT_AS, (cap, cap)); "
                "runpy.run_module('singa_mpi', run_name='__main__', alter_sys=True)")


def run_subprocess(argv: list[str], cwd: str | os.PathLike, limit: float, memory_gib: float = 3.0) -> Outcome:
    """``python -m singa_mpi ARGV`` in ``cwd``, its address space capped at ``memory_gib`` (a job that
    asks for terabytes must fail, not take the machine), killed with its process group after ``limit``
    seconds."""
    cap = str(int(memory_gib * (1 << 30)))
    began = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-c", _CAPPED_MAIN, cap, *argv], cwd=cwd, env=cli_env(), text=True,
                            errors="replace", stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=limit)
        timed_out = False
    except subprocess.TimeoutExpired:
        kill_group(proc.pid)
        out, err = proc.communicate()
        timed_out = True
    return Outcome(argv, None if timed_out else proc.returncode, out, err, time.monotonic() - began,
                   timed_out=timed_out)


def kill_group(pid: int) -> None:
    """SIGKILL the process group a child of ours leads (started with a new session)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


# ------------------------------------------------------------------ the one-line property

PYTHON_EXCEPTIONS = sorted(name for name, obj in vars(builtins).items()
                           if isinstance(obj, type) and issubclass(obj, BaseException) and name != "KeyboardInterrupt")
_LEAKED = re.compile(r"\b(" + "|".join(PYTHON_EXCEPTIONS) + r")\b:")


def _outside_parentheses(line: str) -> str:
    """The line without its parenthesised details: "damaged (OSError: ...)" explains, then cites the cause."""
    while True:
        shorter = re.sub(r"\([^()]*\)", "", line)
        if shorter == line:
            return line
        line = shorter


def one_line_problems(outcome: Outcome, allowed: set[int]) -> list[str]:
    """What breaks "a documented exit code, and on failure exactly one error line, no traceback".

    Lines that start with ``warning:`` are notes, not errors.  An error line must not be a Python
    exception dressed as a message (``TypeError: ...``): that is a bug reaching the user (one cited in
    parentheses after an explanation is fine)."""
    problems = []
    if outcome.timed_out:
        return [f"did not end within its time bound ({outcome.seconds:.0f}s)"]
    if outcome.escaped:
        problems.append("an exception escaped cli.main: " + outcome.escaped.strip().splitlines()[-1])
    if "Traceback (most recent call last)" in outcome.out + outcome.err:
        problems.append("a traceback in the output")
    if outcome.code not in allowed:
        problems.append(f"exit code {outcome.code}, expected one of {sorted(allowed)}")
    if outcome.code not in (0, None, *SIGNAL_CODES):  # a signal's exit says more than one line (the resume command)
        errors = [line for line in outcome.err.splitlines() if line.strip() and not line.startswith("warning: ")]
        if len(errors) != 1 or not errors[0].startswith("singa-mpi: error: "):
            problems.append(f"{len(errors)} error lines on stderr, expected one 'singa-mpi: error: ...' line")
        leaked = [line for line in errors if _LEAKED.search(_outside_parentheses(line))]
        if leaked:
            problems.append(f"a Python exception reaches the user: {leaked[0][:300]}")
    return problems
