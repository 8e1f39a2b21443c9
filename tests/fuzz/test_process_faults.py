"""Scripted process faults: a rank of an `mpiexec -n 2/3` run is killed, stopped or signalled at a
drawn moment (during start-up, from 0.2 s after the ranks' processes exist, or during training,
perhaps while a checkpoint is written), or the ranks are started with jobs or options that disagree.

The properties (the README's troubleshooting section documents each exit code):

* the job ends within a bound: no hang;
* no traceback; the exit code is the fault's: SIGKILL -> the launcher's 9 or 137, and once training
  runs a ``singa-mpi: rank R ...`` line names the killed rank (no line ever names another rank);
  SIGSTOP -> 4 (``--stall-timeout``; or the launcher's kill code, see fault_problems) with the stopped
  rank named as the one not responding;
  SIGTERM or SIGUSR1 (once, or twice 50 ms apart) -> 75 and the way to resume;
* afterwards a serial ``--resume`` continues from the newest good checkpoint (or starts afresh), reaches
  its last step and leaves no temporary checkpoint file behind;
* ranks started with different jobs, seeds or steps are refused with exit 2 and one error line that
  names the odd rank.
"""
from __future__ import annotations

import contextlib
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import time

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import fuzz_support as fz
import nets
from singa_mpi.checkpoints import hdf5 as checkpoint
from mpi_jobs import mpi_env, mpiexec_command, ranks_of  # ranks_of: {MPI rank: pid} below mpiexec, from /proc

pytestmark = [pytest.mark.fuzz, pytest.mark.mpi]
STALL_TIMEOUT = 5  # seconds: --stall-timeout of every run here
BOUNDS = {"SIGKILL": 30, "SIGSTOP": STALL_TIMEOUT + 30, "SIGTERM": 60, "SIGUSR1": 60, "SIGTERM twice": 60}
KILL_CODES = {9, 137}  # MPICH's hydra ends the other ranks and exits with one of these (README)
FAULTS = list(BOUNDS)
# Start-up faults come this long after the ranks' processes exist: in the interpreter's own first
# moments no Python code runs that could catch a signal or name the rank (the launcher's to report)
SETUP_FROM = 0.2


def long_job(folder: pathlib.Path, checkpoint_freq: int, scheme: str = "data", batch: int = 64) -> pathlib.Path:
    """tests/nets.py's MLP for 100,000 steps (never reached): progress every 50 steps, checkpoints
    every ``checkpoint_freq``."""
    data = folder / "data.h5"
    if not data.exists():
        nets.make_data(str(data), 256, (12,), 5)
    text = nets.mlp(str(data), batch, scheme, steps=100_000).replace("disp_freq: 1", "disp_freq: 50")
    path = folder / f"job-{scheme}-{batch}.conf"
    path.write_text(text + f"checkpoint_freq: {checkpoint_freq}\n")
    return path


def train_command(job: pathlib.Path, workspace: pathlib.Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "singa_mpi", "train", str(job), "--workspace", str(workspace),
            "--stall-timeout", str(STALL_TIMEOUT), *extra]


def launch(command: list[str]) -> subprocess.Popen:
    return subprocess.Popen(command, cwd=fz.ROOT, env=mpi_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, errors="replace", start_new_session=True)


def wait_for(condition, proc: subprocess.Popen, limit: float) -> bool:
    """Poll ``condition()`` until it holds (True), the job ends or ``limit`` seconds pass (False)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and proc.poll() is None:
        if condition():
            return True
        time.sleep(0.02)
    return False


def send(fault: str, pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        if fault == "SIGTERM twice":
            os.kill(pid, signal.SIGTERM)
            time.sleep(0.05)
            os.kill(pid, signal.SIGTERM)
        else:
            os.kill(pid, getattr(signal, fault))


def finish(proc: subprocess.Popen, ranks: dict[int, int], limit: float) -> tuple[int | None, str, str, float]:
    """(exit code or None if it did not end within ``limit``, stdout, stderr, seconds); every process of
    the job is gone afterwards (a stopped rank too)."""
    began = time.monotonic()
    try:
        out, err = proc.communicate(timeout=limit)
        code = proc.returncode
    except subprocess.TimeoutExpired:
        fz.kill_group(proc.pid)
        out, err = proc.communicate()
        code = None
    for pid in ranks.values():
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return code, out, err, time.monotonic() - began


def named_ranks(err: str) -> set[int]:
    """Ranks that singa-mpi's own lines name as killed or not responding (not the launcher's banner)."""
    named = set()
    for line in err.splitlines():
        if line.startswith("singa-mpi:"):
            named |= {int(r) for r in re.findall(r"rank (\d+) \(pid \d+[^)]*\)[^;]*vanished", line)}
            named |= {int(r) for r in re.findall(r"not responding: rank (\d+)", line)}
    return named


def candidates(err: str) -> set[int]:
    """The ranks of a "one of ranks 1, 2 vanished ... too fast to tell which was first" line."""
    found = re.search(r"^singa-mpi: one of ranks ([\d, ?]+) vanished", err, re.MULTILINE)
    return {int(r) for r in re.findall(r"\d+", found.group(1))} if found else set()


def oversubscribed(nranks: int) -> bool:
    """More ranks than cores: the launcher's clean-up can overtake every guardian, and the README
    promises only the candidates then (singa_mpi.communication.liveness: "Not guaranteed")."""
    return nranks > (os.cpu_count() or 1)


def fault_problems(fault: str, target: int, training: bool, code: int | None, out: str, err: str,
                   nranks: int) -> list[str]:
    if code is None:
        return [f"did not end within {BOUNDS[fault]}s of the fault"]
    problems = ["a traceback in the output"] if "Traceback (most recent call last)" in out + err else []
    named = named_ranks(err)
    if named - {target}:
        problems.append(f"names rank(s) {sorted(named - {target})}, not the faulty rank {target}")
    if fault == "SIGKILL":
        if code not in KILL_CODES:
            problems.append(f"exit {code}, expected the launcher's {sorted(KILL_CODES)}")
        if training and target not in named and not (oversubscribed(nranks) and target in candidates(err)):
            problems.append(f"no singa-mpi line names the killed rank {target}")
    elif fault == "SIGSTOP":
        # 4 from the rank that aborts; but a stopped rank only dies by SIGKILL, and MPICH's hydra may
        # report that kill instead (always so in MPI_Init, where the guardian kills its waiting rank)
        if code not in {fz.STALL_CODE} | KILL_CODES:
            problems.append(f"exit {code}, expected {fz.STALL_CODE} (a stall) or the launcher's {sorted(KILL_CODES)}")
        if target not in named:
            problems.append(f"the stall line does not name the stopped rank {target} as not responding")
    else:
        if code != checkpoint.EXIT_CHECKPOINTED:
            problems.append(f"exit {code}, expected {checkpoint.EXIT_CHECKPOINTED} (stopped on a signal)")
        if "--resume" not in out and "run the same command" not in out:
            problems.append("no word on how to go on (resume with: ... / run the same command)")
    return problems


def resume_problems(job: pathlib.Path, workspace: pathlib.Path) -> list[str]:
    """A serial --resume (any rank count may resume) runs three steps past the newest good checkpoint."""
    good = checkpoint.newest_good(str(workspace)) if checkpoint.listed(str(workspace)) else None
    end = (good.step if good else 0) + 3
    outcome = fz.run_subprocess(["train", str(job), "--workspace", str(workspace), "--resume", "--steps", str(end)],
                                fz.ROOT, limit=120)
    problems = [f"resume: {p}" for p in fz.one_line_problems(outcome, {0})]
    if outcome.code == 0 and not os.path.exists(checkpoint.checkpoint_path(str(workspace), end)):
        problems.append(f"resume: no step{end}.h5 at the end")
    leftovers = [p.name for p in pathlib.Path(checkpoint.checkpoint_dir(str(workspace))).glob("*.tmp*")]
    if leftovers:
        problems.append(f"resume: temporary checkpoint files left: {leftovers}")
    return problems + ([] if not problems else [outcome.show()])


@st.composite
def faults(draw):
    nranks, training = draw(st.sampled_from([2, 3])), draw(st.booleans())
    return {"nranks": nranks, "fault": draw(st.sampled_from(FAULTS)), "target": draw(st.integers(0, nranks - 1)),
            "training": training, "delay": draw(st.floats(0 if training else SETUP_FROM, 1.5)),
            "checkpoint_freq": draw(st.sampled_from([20, 100, 1000]))}


def known(nranks: int, fault: str, target: int, training: bool, delay: float) -> dict:
    return {"nranks": nranks, "fault": fault, "target": target, "training": training, "delay": delay,
            "checkpoint_freq": 100}


KNOWN_FAULTS = [  # the cases, whatever the draw
    known(3, "SIGKILL", 1, True, 0.3),  # the dead rank named (not another rank's PID)
    known(3, "SIGSTOP", 2, False, 0.6),  # a stall during start-up
    known(2, "SIGTERM twice", 1, True, 0.2),  # twice 50 ms apart: still 75
    known(3, "SIGTERM", 2, False, 0.3),  # during start-up: not silent
]


@fz.timeout(7200)
@fz.fuzz_settings(ci=5, long=100)
@example(case=KNOWN_FAULTS[0])
@example(case=KNOWN_FAULTS[1])
@example(case=KNOWN_FAULTS[2])
@example(case=KNOWN_FAULTS[3])
@given(case=faults())
@pytest.mark.slow
def test_a_fault_in_one_rank_ends_the_job_clearly_and_resume_goes_on(case):
    with fz.case(__file__), tempfile.TemporaryDirectory(prefix="fuzz-fault-") as folder:
        folder = pathlib.Path(folder)
        job, workspace = long_job(folder, case["checkpoint_freq"]), folder / "ws"
        proc = launch(mpiexec_command(case["nranks"]) + train_command(job, workspace))
        ranks = {}

        def all_started() -> bool:
            ranks.update(ranks_of(proc.pid))
            return len(ranks) == case["nranks"]

        try:
            assert wait_for(all_started, proc, 60), "the ranks did not start"
            metrics = workspace / "metrics.jsonl"
            if case["training"]:
                assert wait_for(lambda: metrics.exists() and metrics.read_text().count("\n") >= 1, proc, 120), \
                    "no training progress"
            time.sleep(case["delay"])
            send(case["fault"], ranks[case["target"]])
        finally:
            code, out, err, seconds = finish(proc, ranks, BOUNDS[case["fault"]])
        problems = fault_problems(case["fault"], case["target"], case["training"], code, out, err, case["nranks"])
        problems += resume_problems(job, workspace)
        assert not problems, f"{case}: {problems}\nexit {code} after {seconds:.1f}s\n--- stdout\n{out[-1500:]}\n" \
                             f"--- stderr\n{err[-3000:]}"


# ------------------------------------------------------------------ ranks that disagree

DISAGREEMENTS = ["--seed", "--steps", "feature scheme", "batch size", "learning rate"]


def disagreeing_command(folder: pathlib.Path, nranks: int, odd_rank: int, how: str) -> list[str]:
    """An MPMD launch: every rank trains the same job but ``odd_rank``, whose job or options differ."""
    job = long_job(folder, 100)
    workspace = folder / "ws"
    odd_job, extra = job, []
    if how == "--seed":
        extra = ["--seed", "7"]
    elif how == "--steps":
        extra = ["--steps", "50"]
    elif how == "feature scheme":
        odd_job = long_job(folder, 100, scheme="feature")
    elif how == "batch size":
        odd_job = long_job(folder, 100, batch=32)
    else:
        odd_job = folder / "job-lr.conf"
        odd_job.write_text(job.read_text().replace("base_lr: 0.05", "base_lr: 0.07"))
    base = mpiexec_command(nranks)[:-2]  # the launcher and its options, without `-n N`
    command = []
    for rank in range(nranks):
        mine = train_command(odd_job, workspace, *extra) if rank == odd_rank else train_command(job, workspace)
        command += ([":"] if rank else []) + ["-n", "1"] + mine
    return base + command


@fz.timeout(3600)
@fz.fuzz_settings(ci=3, long=30)
@given(nranks=st.sampled_from([2, 3]), odd=st.integers(0, 2), how=st.sampled_from(DISAGREEMENTS))
@pytest.mark.slow
def test_ranks_started_with_different_jobs_or_options_are_refused_in_one_line(nranks, odd, how):
    odd %= nranks
    with fz.case(__file__), tempfile.TemporaryDirectory(prefix="fuzz-disagree-") as folder:
        proc = launch(disagreeing_command(pathlib.Path(folder), nranks, odd, how))
        code, out, err, seconds = finish(proc, {}, 90)
        outcome = fz.Outcome([f"mpiexec -n {nranks}, rank {odd}: {how}"], code, out, err, seconds,
                             timed_out=code is None)
        problems = fz.one_line_problems(outcome, {2})
        if code == 2 and f"rank {odd}" not in err:
            problems.append(f"the error does not name rank {odd}, whose job or options differ")
        assert not problems, f"{problems}\n{outcome.show()}"
