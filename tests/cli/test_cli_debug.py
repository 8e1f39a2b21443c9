"""``--debug`` (alias ``--traceback``) adds the Python traceback to an error; the exit code stays the
error's own (2 a bad job, 3 bad data, 6 out of memory, ...): it was 1, the code the README keeps for bugs,
for every error under --debug. A real bug stays exit 1 with its traceback, with or without --debug."""
from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

from singa_mpi import cli

REPO = pathlib.Path(__file__).resolve().parents[2]


def run(*argv: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "singa_mpi", *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("flag", ["--debug", "--traceback"])
def test_a_bad_job_under_debug_is_exit_2_with_the_traceback(tmp_path, flag):
    done = run(flag, "check", str(tmp_path / "missing.conf"), cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("Traceback (most recent call last):"), done.stderr
    assert "singa_mpi.errors.ConfigError" in done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("singa-mpi: error: ") and "cannot read job configuration" in last, last


def test_bad_data_under_debug_is_exit_3(tmp_path):
    done = run("--debug", "plot", str(tmp_path / "no-workspace"), cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    assert "Traceback" in done.stderr and "metrics.jsonl: no such file" in done.stderr.strip().splitlines()[-1]


def test_in_process_the_code_is_returned_and_the_traceback_printed(capsys, tmp_path):
    assert cli.main(["--debug", "check", str(tmp_path / "missing.conf")]) == 2
    err = capsys.readouterr().err
    assert "Traceback (most recent call last):" in err and "singa_mpi.errors.ConfigError" in err, err
    assert err.strip().splitlines()[-1].startswith("singa-mpi: error: ")


def test_out_of_memory_under_debug_is_exit_6(capsys, monkeypatch, tmp_path):
    def too_big(args):
        raise MemoryError("Unable to allocate 96.0 GiB for an array with shape (2147483647, 12)")

    monkeypatch.setattr(cli, "cmd_check", too_big)
    assert cli.main(["--debug", "check", str(tmp_path / "job.conf")]) == 6
    err = capsys.readouterr().err
    assert "Traceback" in err and "MemoryError" in err
    assert err.strip().splitlines()[-1].startswith("singa-mpi: error: out of memory (Unable to allocate 96.0 GiB")


def test_a_bug_is_exit_1_with_its_traceback_with_or_without_debug(monkeypatch, tmp_path):
    def broken(args):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(cli, "cmd_check", broken)
    for argv in (["--debug", "check", "job.conf"], ["check", "job.conf"]):
        with pytest.raises(ZeroDivisionError):  # __main__ lets it reach Python: traceback, exit 1
            cli.main(argv)


@pytest.mark.parametrize("flag, shown", [([], False), (["--debug"], True)])
def test_train_passes_debug_on_to_the_run(monkeypatch, flag, shown):
    """--debug also shows the communication table's bookkeeping rows: the run must be told."""
    from singa_mpi import launcher

    seen = {}
    monkeypatch.setattr(launcher, "run_training", lambda job, workspace, options: seen.setdefault("debug", options.debug) and 0)
    cli.main([*flag, "train", "conf/digits_mlp.conf", "--steps", "1"])
    assert seen == {"debug": shown}
