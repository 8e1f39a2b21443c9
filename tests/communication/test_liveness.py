"""The verdict's order: the rank that claims it says its line, and the launcher has read it, before any
rank of the node ends the job (an end under MPICH kills every process at once, a claimant that has not
written yet too: CI once lost the whole stall line so)."""
from __future__ import annotations

import os
import select
import signal
import subprocess
import threading
import time

from singa_mpi.communication import liveness


def a_life(folder, rank: int, aborts: list) -> liveness.RankLife:
    """A rank's life with only what ending the job needs: its folder, no guardian, an abort that records."""
    life = object.__new__(liveness.RankLife)
    life.folder, life.rank, life.guardian, life.abort = str(folder), rank, None, aborts.append
    return life


def a_stopped_process() -> subprocess.Popen:
    proc = subprocess.Popen(["sleep", "60"])
    os.kill(proc.pid, signal.SIGSTOP)
    return proc


def test_the_wait_for_a_pipe_ends_when_its_reader_has_taken_everything():
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"singa-mpi: a line\n")
        timer = threading.Timer(0.3, os.read, (read_end, 100))
        began = time.monotonic()
        timer.start()
        liveness.wait_until_read(write_end, limit=5.0)
        assert 0.25 <= time.monotonic() - began < 4.0
        timer.join()
    finally:
        os.close(read_end)
        os.close(write_end)


def test_no_wait_where_nothing_can_read_the_pipe_nor_for_a_file(tmp_path):
    read_end, write_end = os.pipe()
    os.write(write_end, b"unread\n")
    os.close(read_end)
    began = time.monotonic()
    liveness.wait_until_read(write_end, limit=5.0)
    os.close(write_end)
    with open(tmp_path / "log", "w") as f:
        f.write("x")
        f.flush()
        liveness.wait_until_read(f.fileno(), limit=5.0)
    assert time.monotonic() - began < 1.0


def test_the_claimant_says_its_line_then_marks_it_said(tmp_path):
    read_end, write_end = os.pipe()
    try:
        assert not liveness.await_verdict(str(tmp_path), limit=0.05)
        reader = threading.Thread(target=lambda: got.append(os.read(read_end, 100)))
        got: list[bytes] = []
        reader.start()
        liveness.say_verdict(str(tmp_path), "singa-mpi: rank 1: stalled\n", fd=write_end)
        reader.join(5)
        assert got == [b"singa-mpi: rank 1: stalled\n"]
        assert liveness.await_verdict(str(tmp_path), limit=0.05)
    finally:
        os.close(read_end)
        os.close(write_end)


def test_a_rank_that_lost_the_claim_kills_the_stopped_rank_only_once_the_claimants_line_is_out(tmp_path):
    stopped, aborts = a_stopped_process(), []
    try:
        assert liveness.claim_verdict(str(tmp_path), "rank 1")  # rank 1 claimed; it has not written yet
        said_at = []

        def rank_1_says():
            said_at.append(stopped.poll())  # still there when rank 1's line goes out
            with open(os.devnull, "w") as devnull:
                liveness.say_verdict(str(tmp_path), "", fd=devnull.fileno())

        timer = threading.Timer(0.4, rank_1_says)
        began = time.monotonic()
        timer.start()
        a_life(tmp_path, 0, aborts).end_job("rank 0: stalled", 4, [stopped.pid])
        waited = time.monotonic() - began
        timer.join()
        assert said_at == [None] and aborts == [4]
        assert 0.35 <= waited < liveness.VERDICT_GRACE
        assert stopped.wait(5) == -signal.SIGKILL
    finally:
        stopped.kill()
        stopped.wait()


def test_a_rank_that_lost_the_claim_ends_the_job_itself_when_the_claimant_never_speaks(tmp_path, monkeypatch):
    monkeypatch.setattr(liveness, "VERDICT_GRACE", 0.3)
    stopped, aborts = a_stopped_process(), []
    try:
        assert liveness.claim_verdict(str(tmp_path), "guardian")
        began = time.monotonic()
        a_life(tmp_path, 2, aborts).end_job("rank 2: stalled", 4, [stopped.pid])
        assert aborts == [4] and 0.25 <= time.monotonic() - began < 3.0
        assert stopped.wait(5) == -signal.SIGKILL
    finally:
        stopped.kill()
        stopped.wait()


def test_the_first_rank_claims_says_and_ends_the_job_at_once(tmp_path, capfd):
    stopped, aborts = a_stopped_process(), []
    try:
        began = time.monotonic()
        a_life(tmp_path, 0, aborts).end_job("rank 0: stalled: not responding: rank 1", 4, [stopped.pid])
        assert time.monotonic() - began < liveness.VERDICT_GRACE / 2
        assert capfd.readouterr().err == "singa-mpi: rank 0: stalled: not responding: rank 1\n"
        assert (tmp_path / "verdict").read_text() == "rank 0" and (tmp_path / liveness.SAID).exists()
        assert aborts == [4] and stopped.wait(5) == -signal.SIGKILL
    finally:
        stopped.kill()
        stopped.wait()


def test_a_claimant_with_nothing_to_say_still_lets_the_others_end_the_job(tmp_path):
    read_end, write_end = os.pipe()
    try:
        liveness.say_verdict(str(tmp_path), "", fd=write_end)
        assert liveness.await_verdict(str(tmp_path), limit=0.05)
        assert not select.select([read_end], [], [], 0)[0]  # nothing written
    finally:
        os.close(read_end)
        os.close(write_end)
