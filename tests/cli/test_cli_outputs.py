"""Every output the command line writes (plan -o, plan --auto -o, plan --format dot -o, data --out,
data cifar10 --mean, examples DIR, plot -o, draw -o, ckpt convert --out): a missing folder is made; a
path the file system refuses when the file is written is one line naming the path and what is wrong,
exit code 3 (README: "a workspace or checkpoint folder that cannot be written"), never a traceback.

Option values are checked before anything runs (tests/cli/test_cli_args.py: exit 2); what the file system
refuses only when writing (/proc takes no new files even from root, a file that took a folder's place
since the check) gets past that check. The in-process tests switch the check off to meet that case
wherever they run; the /proc ones run the commands as the issue did (root only: others are refused
up front)."""
from __future__ import annotations

import os
import pathlib
import stat
import subprocess
import sys

import numpy as np
import pytest

from singa_mpi import cli
from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.proto import job_pb2

REPO = pathlib.Path(__file__).resolve().parents[2]
DIGITS = str(REPO / "conf" / "digits_mlp.conf")


def one_line_exit_3(capsys, argv: list[str]) -> str:
    code = cli.main(argv)
    err = capsys.readouterr().err
    assert code == 3, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("singa-mpi: error: ") and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def unchecked(monkeypatch):
    """The up-front check of output options off: the write itself meets what the file system refuses."""
    monkeypatch.setattr(cli, "writable_file", str)
    monkeypatch.setattr(cli, "writable_path", str)
    monkeypatch.setattr(cli, "writable_folder", str)


@pytest.fixture
def below_a_file(tmp_path) -> pathlib.Path:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    return blocker / "out"


def metrics_workspace(folder: pathlib.Path) -> str:
    folder.mkdir()
    (folder / "metrics.jsonl").write_text('{"step": 0, "phase": "train", "loss": 1.0, "elapsed": 0.1}\n'
                                          '{"step": 10, "phase": "train", "loss": 0.5, "elapsed": 0.2}\n')
    return str(folder)


def a_checkpoint(tmp_path: pathlib.Path) -> str:
    path = str(tmp_path / "step3.h5")
    checkpoint.write(path, checkpoint.Checkpoint(step=3, params={"w": np.ones((4, 9), np.float32)}))
    return path


def singa_blobs(tmp_path: pathlib.Path) -> str:
    blobs = job_pb2.BlobProtos(name=["0#w1"], version=[10])
    blobs.blob.add(shape=[2, 3], data=[1.0] * 6)
    path = tmp_path / "step10-worker0"
    path.write_bytes(blobs.SerializeToString())
    return str(path)


def cifar_batch(tmp_path: pathlib.Path) -> str:
    path = tmp_path / "data_batch_1.bin"
    path.write_bytes(bytes(2 * (1 + 3 * 32 * 32)))
    return str(path)


# ------------------------------------------------------------------ a missing folder is made

@pytest.mark.parametrize("argv,written", [
    (["plan", DIGITS, "-n", "2", "-o", "{d}/plan.txt"], "plan.txt"),
    (["plan", DIGITS, "-n", "2", "--format", "dot", "-o", "{d}/plan.dot"], "plan.dot"),
    (["plan", DIGITS, "-n", "2", "--format", "json", "-o", "{d}/plan.json"], "plan.json"),
])
def test_an_output_in_a_folder_that_does_not_exist_makes_the_folder(capsys, tmp_path, argv, written):
    """`plan -o nodir/plan.txt` was a FileNotFoundError traceback (exit 1); `data --out` already made it."""
    folder = tmp_path / "nodir" / "deeper"
    assert cli.main([arg.replace("{d}", str(folder)) for arg in argv]) == 0
    assert (folder / written).read_text().strip()
    assert capsys.readouterr().out.strip().endswith(f"wrote {folder / written}")


def test_plan_png_without_graphviz_makes_the_folder_of_its_dot_file(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no Graphviz `dot` here
    png = tmp_path / "nodir" / "plan.png"
    assert cli.main(["plan", DIGITS, "-n", "2", "--format", "dot", "-o", str(png)]) == 0
    assert (tmp_path / "nodir" / "plan.dot").read_text().startswith("digraph")


# ------------------------------------------------------------------ a refusal when writing: one line, exit 3

@pytest.mark.parametrize("argv", [
    ["plan", DIGITS, "-n", "2", "-o", "{out}/plan.txt"],
    ["plan", DIGITS, "-n", "2", "--format", "dot", "-o", "{out}/plan.dot"],
    ["plan", DIGITS, "-n", "2", "--format", "dot", "-o", "{out}/plan.png"],
    ["data", "digits", "--out", "{out}"],
    ["data", "digits", "--out", "{out}", "--backend", "kvfile"],
    ["data", "digits", "--out", "{out}", "--backend", "shard"],
    ["data", "text", "--out", "{out}", "{repo}/README.md"],
    ["data", "cifar10", "--batches", "{cifar}", "--out", "{out}/c.h5"],
    ["data", "cifar10", "--batches", "{cifar}", "--out", "{tmp}/c.h5", "--mean", "{out}/mean.bin"],
    ["examples", "{out}"],
    ["plot", "{ws}", "-o", "{out}/m.png"],
    ["draw", "filters", "{ckpt}", "--shape", "3x3", "-o", "{out}/f.png"],
    ["ckpt", "convert", "{blobs}", "--out", "{out}/c.h5"],
])
def test_an_output_the_file_system_refuses_is_one_line_exit_3(capsys, tmp_path, below_a_file, unchecked,
                                                               monkeypatch, argv):
    if argv[0] in ("plot", "draw"):
        pytest.importorskip("matplotlib")
    monkeypatch.setenv("PATH", str(tmp_path))  # plan.png: no Graphviz, so its .dot is written
    values = {"{out}": str(below_a_file), "{repo}": str(REPO), "{tmp}": str(tmp_path),
              "{cifar}": cifar_batch(tmp_path) if "{cifar}" in argv else "",
              "{ws}": metrics_workspace(tmp_path / "ws") if "{ws}" in argv else "",
              "{ckpt}": a_checkpoint(tmp_path) if "{ckpt}" in argv else "",
              "{blobs}": singa_blobs(tmp_path) if "{blobs}" in argv else ""}
    for key, value in values.items():
        argv = [arg.replace(key, value) for arg in argv]
    line = one_line_exit_3(capsys, argv)
    assert f": error: {below_a_file}" in line and "cannot write" in line, line
    assert "Error" not in line and "Errno" not in line, line  # the OS's words, not Python's
    assert not list(tmp_path.glob("**/*.tmp*")), "a temporary file was left behind"


def test_the_line_says_what_to_do(capsys, below_a_file, unchecked):
    line = one_line_exit_3(capsys, ["plan", DIGITS, "-n", "2", "-o", f"{below_a_file}/plan.txt"])
    assert line == (f"singa-mpi: error: {below_a_file}/plan.txt: cannot write the plan: Not a directory "
                    f"({below_a_file}): expected a path whose folders exist or can be made, on a file system "
                    f"you can write")


def test_plan_auto_output_the_file_system_refuses(capsys, below_a_file, unchecked, monkeypatch):
    from singa_mpi.cost import auto

    # the cost model's choice (its own tests time kernels; here only the writing counts)
    choice = auto.Choice({"fc1": 0}, 1e-3, 1e-3, 1, 2**20, "test")
    monkeypatch.setattr(auto, "choose_for_job", lambda *a, **k: choice)
    monkeypatch.setattr(auto, "original_dims", lambda cfg: {"fc1": 0})
    monkeypatch.setattr(auto, "with_dims", lambda cfg, dims: cfg)
    line = one_line_exit_3(capsys, ["plan", DIGITS, "-n", "2", "--auto", "-o", f"{below_a_file}/auto.conf"])
    assert "cannot write the job" in line and str(below_a_file) in line


def test_graphviz_failing_to_write_is_one_line(capsys, tmp_path, monkeypatch):
    """Graphviz's own refusal (its stderr's first line) instead of CalledProcessError's traceback."""
    fake = tmp_path / "dot"
    fake.write_text("#!/bin/sh\necho 'Error: Could not open \"x\" for writing : Permission denied' >&2\n"
                    "echo 'second line' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(tmp_path))
    out = tmp_path / "plan.png"
    line = one_line_exit_3(capsys, ["plan", DIGITS, "-n", "2", "--format", "dot", "-o", str(out)])
    assert line == (f"singa-mpi: error: {out}: Graphviz `dot` could not write it: Error: Could not open \"x\" for "
                    f"writing : Permission denied")


def test_graphviz_refusing_the_format_is_a_command_line_error(capsys, tmp_path, monkeypatch):
    fake = tmp_path / "dot"
    fake.write_text("#!/bin/sh\necho 'Format: \"xyz\" not recognized. Use one of: png svg pdf' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cli.main(["plan", DIGITS, "-n", "2", "--format", "dot", "-o", str(tmp_path / "plan.xyz")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and 'Format: "xyz" not recognized' in err, err


def test_a_name_too_long_for_the_file_system_is_refused_up_front(capsys, tmp_path):
    """pathlib's exists() raised ENAMETOOLONG inside the option check: a traceback."""
    long = tmp_path / ("x" * 300) / "plan.txt"
    with pytest.raises(SystemExit) as stop:
        cli.main(["plan", DIGITS, "-n", "2", "-o", str(long)])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and err.count("\n") == 1, err
    assert "argument -o/--output: " in err and "File name too long" in err and "Traceback" not in err, err


def test_examples_into_a_file_is_refused_up_front(capsys, tmp_path):
    """`examples afile` said "afile/char_rnn.conf: cannot write an example job: File exists" (exit 3), where
    `examples afile/sub` was already refused up front (exit 2)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(SystemExit) as stop:
        cli.main(["examples", str(blocker)])
    assert stop.value.code == 2
    assert capsys.readouterr().err == (f"singa-mpi examples: error: argument dir: {blocker}: is a file, not a folder: "
                                       f"expected a folder (or a path where one can be made) (see singa-mpi "
                                       f"examples -h)\n")
    assert blocker.read_text() == "x"


@pytest.mark.parametrize("argv,expected", [
    (["data", "digits", "--out", "{file}"], "is a file, not a folder: expected a folder (or a path where one can be "
                                            "made) for the digits' train and test stores"),
    (["data", "text", "--out", "{file}"], "is a file, not a folder: expected a folder (or a path where one can be "
                                          "made) for the text and its vocabulary"),
    (["data", "mnist", "--images", "i", "--labels", "l", "--out", "{folder}"], "is a folder: expected a file name "
                                                                                "for the store"),
])
def test_data_out_of_the_wrong_kind_is_refused_up_front(capsys, tmp_path, argv, expected):
    """`data digits --out FILE` exited 3 ("a file: expected a folder", found while writing) where
    `data digits --out FILE/sub` exited 2: both are the command line's mistake, exit 2, nothing written."""
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "a-folder").mkdir()
    paths = {"{file}": str(tmp_path / "a-file"), "{folder}": str(tmp_path / "a-folder")}
    argv = [paths.get(arg, arg) for arg in argv]
    out = next(arg for arg in argv if arg in paths.values())
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == f"singa-mpi: error: data {argv[1]}: argument --out: {out}: {expected}\n"
    assert sorted(os.listdir(tmp_path)) == ["a-file", "a-folder"] and (tmp_path / "a-file").read_text() == "x"


# ------------------------------------------------------------------ the commands, as run

@pytest.mark.skipif(os.geteuid() != 0, reason="/proc is refused up front (exit 2) to users other than root")
@pytest.mark.parametrize("argv", [
    ["plan", DIGITS, "-n", "2", "-o", "/proc/singa-mpi-test/plan.txt"],
    ["data", "digits", "--out", "/proc/singa-mpi-test-digits"],
    ["examples", "/proc/singa-mpi-test-conf"],
])
@pytest.mark.slow
def test_proc_refuses_the_write_in_one_line(tmp_path, argv):
    done = subprocess.run([sys.executable, "-m", "singa_mpi", *argv], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("singa-mpi: error: /proc/singa-mpi-test") and "cannot write" in done.stderr


@pytest.mark.parametrize("name", ["plan.txt", "plan.gv", "plan.DOT"])
def test_plan_dot_text_goes_to_the_file_named_with_or_without_graphviz(capsys, tmp_path, monkeypatch, name):
    """`--format dot -o plan.txt` wrote plan.dot instead (no Graphviz) or failed on Graphviz's `-Ttxt`:
    dot text is text, written where asked; only pictures need Graphviz."""
    fake = tmp_path / "bin" / "dot"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\necho 'Format: \"txt\" not recognized' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    for path in (str(tmp_path), str(fake.parent)):  # without Graphviz, then with it
        monkeypatch.setenv("PATH", path)
        out = tmp_path / path.replace("/", "_") / name
        assert cli.main(["plan", DIGITS, "-n", "2", "--format", "dot", "-o", str(out)]) == 0
        assert out.read_text().startswith("digraph") and not out.with_suffix(".dot").exists()
        said = capsys.readouterr()
        assert said.out.strip().endswith(f"wrote {out}") and said.err == ""
