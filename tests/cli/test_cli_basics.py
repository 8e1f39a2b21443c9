"""Small command-line behaviour: --version, `ckpt inspect` exit codes, drawing plans without Graphviz,
help texts, the MPI tests' scratch folder, what .gitignore keeps out of a checkout."""
from __future__ import annotations

import argparse
import importlib.metadata
import os
import pathlib
import shutil
import subprocess
import sys

import numpy as np
import pytest

from singa_mpi import __version__, cli
from singa_mpi.checkpoints import hdf5 as checkpoint

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run(*args, env=None, cwd=ROOT):
    return subprocess.run([sys.executable, "-m", "singa_mpi", *args], capture_output=True, text=True,
                          timeout=120, cwd=cwd, env=env)


def test_version():
    out = run("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"singa-mpi {__version__}"
    try:
        assert importlib.metadata.version("singa_mpi") == __version__  # pyproject.toml and the package agree
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("singa_mpi is not installed")


def test_ckpt_inspect_exit_codes(tmp_path):
    good = str(tmp_path / "step3.h5")
    checkpoint.write(good, checkpoint.Checkpoint(step=3, params={"w": np.ones((2, 3), np.float32)}))
    out = run("ckpt", "inspect", good)
    assert out.returncode == 0 and "step 3" in out.stdout and "checksums OK" in out.stdout

    missing = run("ckpt", "inspect", str(tmp_path / "step9.h5"))
    assert missing.returncode == 3 and missing.stdout == ""
    assert missing.stderr == f"singa-mpi: error: {tmp_path / 'step9.h5'}: no such checkpoint file\n"

    damaged = tmp_path / "step4.h5"
    damaged.write_bytes(pathlib.Path(good).read_bytes()[:1000])
    out = run("ckpt", "inspect", str(damaged))
    assert out.returncode == 3 and out.stdout == ""
    assert out.stderr.startswith(f"singa-mpi: error: {damaged}: DAMAGED: ") and out.stderr.count("\n") == 1


def test_plan_png_without_graphviz_writes_the_dot_and_warns(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()  # a PATH without Graphviz's `dot`
    env = dict(os.environ, PATH=str(empty))
    png = tmp_path / "plan.png"
    out = run("plan", "conf/cifar10_hybrid.conf", "-n", "2", "--format", "dot", "-o", str(png), env=env)
    assert out.returncode == 0, out.stderr
    assert not png.exists() and (tmp_path / "plan.dot").read_text().startswith("digraph plan")
    assert out.stderr.startswith(f"warning: Graphviz `dot` not found: wrote {tmp_path / 'plan.dot'} instead of "
                                 f"{png} (install Graphviz: ") and out.stderr.count("\n") == 1


def _parsers(parser):
    yield parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _parsers(sub)


def test_help_texts_have_no_rest_markup():
    helps = [p.format_help() for p in _parsers(cli.build_parser())]
    assert len(helps) >= 7  # the program and its commands
    for text in helps:
        for markup in ("``", ":mod:", ":func:", ":class:"):
            assert markup not in text, text


def test_every_argument_of_every_command_has_a_help_text():
    """check's and plan's JOB, plan --phase, ckpt's ACTION and data's SOURCE showed in -h with no word."""
    unexplained = []
    for parser in _parsers(cli.build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            if isinstance(action, argparse._SubParsersAction):  # each command is explained in the list
                unexplained += [f"{parser.prog} {choice.dest}" for choice in action._choices_actions if not choice.help]
            elif not action.help:
                unexplained.append(f"{parser.prog} {'/'.join(action.option_strings) or action.dest}")
    assert unexplained == []


def test_every_workspace_option_names_the_default_it_takes():
    """train's, sample's and draw's --workspace said "(default: cluster.workspace)" while test's added "else
    workspace/JOB_NAME", where every one of them goes when the job names no workspace."""
    helps = [action.help for parser in _parsers(cli.build_parser()) for action in parser._actions
             if "--workspace" in action.option_strings]
    assert len(helps) == 4  # train, test, draw reconstructions, sample
    for text in helps:
        assert text.endswith("(default: the job's cluster.workspace, else workspace/JOB_NAME)"), text


@pytest.mark.slow
def test_mpi_tests_create_their_scratch_folder(tmp_path):
    """The README's by-hand command names a folder that need not exist yet."""
    scratch = tmp_path / "fresh" / "t"
    env = dict(os.environ, SINGA_MPI_TEST_TMP=str(scratch))
    out = subprocess.run([sys.executable, "-m", "pytest", "tests/mpi", "--collect-only", "-q", "-p", "no:cacheprovider"],
                         capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert scratch.is_dir()


@pytest.mark.skipif(not (ROOT / ".git").exists() or not shutil.which("git"), reason="not a git checkout")
def test_gitignore_covers_what_the_readme_writes():
    written = ["runs/mlp/metrics.jsonl", "data/digits/train.h5", "plan.png", "plan.dot", "compare.png",
               "workspace/digits_mlp/metrics.png", "trace.json", "examples/rnnlm/train_data.bin",
               "examples/rnnlm/vocab.txt", "examples/rnnlm/checkpoint/step81350.h5", "examples/rnnlm/metrics.jsonl",
               "examples/rnnlm/profile.json"]
    out = subprocess.run(["git", "check-ignore", "--no-index", *written], capture_output=True, text=True, cwd=ROOT)
    assert out.stdout.split() == written
    kept = subprocess.run(["git", "check-ignore", "--no-index", "docs/metrics.png"], capture_output=True, cwd=ROOT)
    assert kept.returncode == 1  # the README's pictures are tracked


def test_output_into_a_pipe_its_reader_closed_is_no_traceback():
    """`singa-mpi plan JOB | head -1`: the reader leaves early; the command ends quietly."""
    command = f"{sys.executable} -m singa_mpi plan conf/digits_sandblaster.conf | head -1"
    result = subprocess.run(["bash", "-o", "pipefail", "-c", command], cwd=ROOT, capture_output=True, text=True,
                            timeout=60)
    assert result.stdout.startswith("cluster: Sandblaster") and result.stderr == "" and result.returncode == 0


def test_main_in_process_keeps_the_callers_warning_filters(tmp_path, capsys):
    """A program (or test suite) that calls cli.main and ignores a warning keeps it ignored: main must
    not reset the process's warning filters (the suite's filter of SINGA's `gpu:` warning did not hold)."""
    import warnings

    job = tmp_path / "gpu.conf"
    job.write_text(pathlib.Path("conf/digits_mlp.conf").read_text() + "\ngpu: 0\n")
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        warnings.filterwarnings("ignore", message=".*gpu. .0. ignored")
        assert cli.main(["check", str(job)]) == 0
    assert [str(w.message) for w in seen] == []


def test_test_takes_the_default_job_as_train_does(tmp_path, capsys, monkeypatch):
    """`singa-mpi train` trained the default job but `singa-mpi test` refused to run without one: the test
    of that run needed the job named."""
    from checkpoint_jobs import job_file, train

    conf = job_file(tmp_path, steps=2, extra="\ntest_steps: 1\ntest_freq: 100\n")
    workspace = tmp_path / "ws"
    assert train(conf, workspace) == 0
    monkeypatch.setattr(cli, "default_job_path", lambda: pathlib.Path(conf))
    capsys.readouterr()
    code, said = cli.main(["test", "--workspace", str(workspace)]), capsys.readouterr()
    assert code == 0, said.err
    assert f"testing {workspace}/checkpoint/step2.h5 (step 2)" in said.out
    assert (workspace / "test_results.jsonl").exists()


def test_sample_n_says_it_counts_characters_not_ranks():
    """-n is ranks or workers in check, plan and run: sample's -n N read the same in its usage."""
    sample = next(parser for parser in _parsers(cli.build_parser()) if parser.prog == "singa-mpi sample")
    assert "[-n CHARS]" in sample.format_usage()
    count = next(action for action in sample._actions if "-n" in action.option_strings)
    assert "characters" in count.help and "after the seed text" in count.help and "not counted" in count.help


def test_every_command_s_help_says_what_it_does():
    """`singa-mpi calibrate -h` (and every command's -h) showed the usage and options alone: what the command
    does was only in the list of `singa-mpi -h`."""
    for parser in _parsers(cli.build_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:
                    described = " ".join(action.choices[choice.dest].format_help().split())
                    assert " ".join(choice.help.split())[1:] in described, choice.dest
    calibrate = subprocess.run([sys.executable, "-m", "singa_mpi", "calibrate", "-h"], capture_output=True, text=True,
                               timeout=60, cwd=ROOT)
    assert "measure the communicator's latency and bandwidth" in " ".join(calibrate.stdout.split())
