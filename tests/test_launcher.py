"""The launcher: `singa-mpi test` under mpiexec runs the test phase once, partitioned; runs end clean."""
import json
import subprocess
import sys

import numpy as np

from test_checkpoint import ROOT, job_file, train
from test_mpi_suites import mpi_env, mpiexec_command

TEST_PHASE = "\ntest_steps: 3\ntest_freq: 100\n"


def _cli(n, *args, timeout=300):
    prefix = mpiexec_command(n) if n else []
    result = subprocess.run(prefix + [sys.executable, "-m", "singa_mpi", *args], cwd=ROOT, env=mpi_env(),
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def _test_entries(workspace, name="metrics.jsonl"):
    path = workspace / name
    lines = path.read_text().splitlines() if path.exists() else []
    return [entry for entry in map(json.loads, lines) if entry["phase"] == "test"]


def test_test_command_under_mpiexec_runs_the_test_phase_once_partitioned(tmp_path):
    conf = job_file(tmp_path, "feature", steps=6, extra=TEST_PHASE)
    workspace = tmp_path / "ws"
    assert train(conf, workspace) == 0
    training_record = (workspace / "metrics.jsonl").read_text()
    serial = _cli(0, "test", conf, "--workspace", str(workspace))
    parallel = _cli(2, "test", conf, "--workspace", str(workspace))
    printed = [line for line in parallel.stdout.splitlines() if " test " in line]
    assert len(printed) == 1, parallel.stdout  # one test, printed by one rank
    used = workspace / "checkpoint" / "step6.h5"
    for result in (serial, parallel):  # which checkpoint was tested, said once
        assert result.stdout.count(f"testing {used} (step 6)") == 1, result.stdout
    assert (workspace / "metrics.jsonl").read_text() == training_record  # no duplicate of the final test
    entries = _test_entries(workspace, "test_results.jsonl")
    assert len(entries) == 2  # the serial test and the partitioned one, one line each
    serial_entry, parallel_entry = entries[-2], entries[-1]
    assert serial_entry["step"] == parallel_entry["step"] == 6
    assert serial_entry["checkpoint"] == parallel_entry["checkpoint"] == str(used)
    assert np.isclose(serial_entry["loss"], parallel_entry["loss"], rtol=1e-5, atol=0)
    assert np.isclose(serial_entry["accuracy"], parallel_entry["accuracy"])
    assert " test " in serial.stdout


def test_pipeline_run_ends_without_leftover_mpi_objects(tmp_path):
    """Bridges' last sends are completed and every communicator made for the run is freed, so
    MPI_Finalize has nothing to complain about."""
    conf = job_file(tmp_path, "pipeline", steps=4, extra=TEST_PHASE)
    result = _cli(3, "train", conf, "--workspace", str(tmp_path / "ws"))
    assert "pending" not in result.stderr.lower() and "leak" not in result.stderr.lower(), result.stderr
