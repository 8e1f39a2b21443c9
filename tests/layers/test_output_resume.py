"""Output layers across runs: a resumed run's files equal an uninterrupted run's, --overwrite archives them."""
import os
import pathlib
import subprocess
import sys

import pytest

import nets
from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.launcher import RunOptions, run_training
from mpi_jobs import mpi_env, mpiexec_command

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUTPUTS = ('layer {{ name: "csv" type: kCSVOutput srclayers: "fc3" partition_dim: -1 {where} '
           'store_conf {{ path: "feat/out.csv" }} }}\n'
           'layer {{ name: "rec" type: kRecordOutput srclayers: "fc3" partition_dim: -1 {where} '
           'store_conf {{ path: "feat/out.bin" }} }}\n')
FILES = ("feat/out.csv", "feat/out.bin")


def job_file(tmp_path, steps=12, scheme="data", where="", extra="checkpoint_freq: 4\n"):
    data = tmp_path / "data.h5"
    if not data.exists():
        nets.make_data(str(data), 40, (12,), 5)
    text = nets.mlp(str(data), 6, scheme, 2).replace("train_steps: 20", f"train_steps: {steps}")
    text = text.replace("\n}\n", "\n" + OUTPUTS.format(where=where) + "}\n")
    path = tmp_path / f"{scheme}.conf"
    path.write_text(text + extra)
    return str(path)


def train(conf, workspace, **options):
    return run_training(conf, lambda cfg: str(workspace), RunOptions(**options))


def contents(workspace):
    return {name: (workspace / name).read_bytes() for name in FILES}


def test_a_resumed_run_writes_the_files_an_uninterrupted_run_writes(tmp_path):
    conf = job_file(tmp_path)
    assert train(conf, tmp_path / "straight") == 0
    straight = contents(tmp_path / "straight")
    assert straight["feat/out.csv"].count(b"\n") == 12 * 6
    ws = tmp_path / "split"
    assert train(conf, ws, steps=6) == 0  # a final checkpoint at 6
    assert train(conf, ws, resume=True) == 0
    assert contents(ws) == straight


def test_rows_written_after_the_checkpoint_are_dropped_on_resume(tmp_path):
    """A run killed after its last checkpoint (step 8) wrote rows of batches 8 and 9 as well."""
    conf = job_file(tmp_path)
    assert train(conf, tmp_path / "straight") == 0
    ws = tmp_path / "killed"
    assert train(conf, ws, steps=10) == 0
    os.remove(checkpoint.checkpoint_path(str(ws), 10))  # as if killed before it: the newest is step 8
    assert (ws / "feat/out.csv").read_bytes().count(b"\n") == 10 * 6
    assert train(conf, ws, resume=True) == 0
    assert contents(ws) == contents(tmp_path / "straight")


def test_resume_without_the_output_file_is_one_line_naming_it(tmp_path, capsys):
    from singa_mpi import cli

    conf = job_file(tmp_path)
    ws = tmp_path / "ws"
    assert train(conf, ws, steps=6) == 0
    os.remove(ws / "feat/out.csv")
    assert cli.main(["train", conf, "--workspace", str(ws), "--resume"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(ws / "feat/out.csv") in err[0] and "step 6" in err[0], err


def test_overwrite_archives_the_output_files_with_the_checkpoints(tmp_path, capsys):
    conf = job_file(tmp_path, steps=4)
    ws = tmp_path / "ws"
    assert train(conf, ws) == 0
    before = contents(ws)
    capsys.readouterr()
    assert train(conf, ws, overwrite=True, steps=2) == 0
    moved = capsys.readouterr().out.splitlines()[0]
    previous = next(ws.glob("previous-*"))
    assert moved == (f"--overwrite: moved the previous run (checkpoint, metrics.jsonl, feat/out.csv, "
                     f"feat/out.bin) to {previous}")
    assert contents(previous) == before
    assert (ws / "feat/out.csv").read_bytes().count(b"\n") == 2 * 6  # the new run's rows only


def test_overwrite_archives_an_output_outside_the_workspace_under_its_name(tmp_path, capsys):
    outside = tmp_path / "elsewhere" / "rows.csv"
    conf = job_file(tmp_path, steps=2)
    text = open(conf).read().replace('path: "feat/out.csv"', f'path: "{outside}"')
    pathlib.Path(conf).write_text(text)
    ws = tmp_path / "ws"
    assert train(conf, ws) == 0
    rows = outside.read_bytes()
    assert train(conf, ws, overwrite=True, steps=1) == 0
    previous = next(ws.glob("previous-*"))
    assert (previous / "rows.csv").read_bytes() == rows
    assert str(outside) in capsys.readouterr().out


def mpi_train(n, conf, workspace, *args):
    cmd = mpiexec_command(n) + [sys.executable, "-m", "singa_mpi", "train", conf, "--workspace", str(workspace),
                                *args]
    result = subprocess.run(cmd, cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.mark.slow
def test_under_mpi_the_rank_that_writes_resumes_its_files(tmp_path):
    """The writers on rank 1 (location: 1) of a data-parallel job: rank 0 gathers their state into the
    checkpoint and rank 1 continues from it; --overwrite (rank 0) archives the files."""
    conf = job_file(tmp_path, where="location: 1")
    mpi_train(2, conf, tmp_path / "straight")
    straight = contents(tmp_path / "straight")
    ws = tmp_path / "split"
    mpi_train(2, conf, ws, "--steps", "10")
    os.remove(checkpoint.checkpoint_path(str(ws), 10))
    out = mpi_train(2, conf, ws, "--resume")
    assert "resuming from" in out.stdout and "(step 8)" in out.stdout
    assert contents(ws) == straight
    out = mpi_train(2, conf, ws, "--overwrite", "--steps", "1")
    previous = next(ws.glob("previous-*"))
    assert contents(previous) == straight and "feat/out.csv" in out.stdout


def test_an_output_path_that_cannot_be_created_is_one_line_and_exit_3(tmp_path, capsys):
    from singa_mpi import cli

    conf = job_file(tmp_path, steps=2)
    pathlib.Path(conf).write_text(open(conf).read().replace('path: "feat/out.csv"', 'path: "/proc/nodir/out.csv"'))
    assert cli.main(["train", conf, "--workspace", str(tmp_path / "ws")]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("singa-mpi: error: layer 'csv': /proc/nodir/out.csv: "), err
