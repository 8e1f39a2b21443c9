"""`python -m singa_mpi check JOB`: exit 0 and a summary, or exit 2 and ONE line on stderr.

Each case runs in a fresh interpreter, as a user would, so nothing imported by
other tests (layer registries, warnings filters) can hide a problem.
"""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
CONFIG = REPO / "tests" / "config"


def run_check(*args: str, cwd: pathlib.Path = REPO) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "singa_mpi", "check", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


def test_good_conf_exits_0_with_a_summary():
    conf = CONFIG / "singa03" / "cifar10_convnet.conf"
    result = run_check(str(conf), "-v")
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    assert f"{conf}: OK  job 'cifar10-convnet'  kBP  kSGD  1000 steps" in out
    assert "  train: 14 layers, batch 100" in out and "  test: 14 layers, batch 100" in out
    assert "  params: 8  (85,098 weights)" in out
    assert any(line.split()[:2] == ["pool3", "kCPooling"] and line.endswith("(64, 3, 3)") for line in out)
    # missing data is a warning, not an error
    assert sum(line.startswith("warning: ") and "not found" in line for line in out) == 2
    assert "Traceback" not in result.stderr


def test_gpu_is_a_warning_and_the_check_passes():
    result = run_check(str(CONFIG / "singa03" / "cifar10_cudnn.conf"))
    assert result.returncode == 0, result.stderr
    assert "warning: " in result.stderr and "gpu: [0] ignored" in result.stderr
    assert "Traceback" not in result.stderr


def single_error_line(result: subprocess.CompletedProcess) -> str:
    assert result.returncode == 2, (result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("singa-mpi: error: ")
    assert "Traceback" not in result.stderr
    return lines[0][len("singa-mpi: error: "):]


@pytest.mark.parametrize("name", ["unknown_srclayer.conf", "syntax_extra_brace.conf", "user_layer.conf"])
def test_broken_conf_exits_2_with_one_line(name):
    conf = CONFIG / "broken" / name
    text = conf.read_text()
    marked = next(n for n, row in enumerate(text.splitlines(), 1) if "# <-- here" in row)
    message = single_error_line(run_check(str(conf)))
    assert message.startswith(f"{conf}:{marked}:")
    assert text.splitlines()[0][len("# expect: "):] in message


def test_user_layer_without_a_plugin_says_how_to_load_one(tmp_path):
    (tmp_path / "user.conf").write_text(
        'name: "u"\ntrain_steps: 1\ntrain_one_batch { alg: kBP }\n'
        'updater { type: kSGD learning_rate { type: kFixed } }\n'
        'neuralnet {\n  layer { name: "custom" type: kUserLayer user_type: "kMine" }\n}\n')
    message = single_error_line(run_check("user.conf", cwd=tmp_path))
    assert message == ("user.conf:6:43: layer 'custom' (#0, kMine): user_type = kMine: expected a layer a plugin "
                       "registers (no loaded plugin registers one: --plugin MODULE_OR_FILE; a built-in layer is "
                       "selected by type, not user_type)")


def test_missing_file_exits_2():
    message = single_error_line(run_check("does/not/exist.conf"))
    assert message.startswith("does/not/exist.conf: cannot read job configuration")


def test_relative_path_is_reported_as_given(tmp_path):
    (tmp_path / "job.conf").write_text('name: "x"\ntrain_steps: 3\n'
                                       'neuralnet {\n  layer { name: "a" type: kReLUU }\n}\n')
    message = single_error_line(run_check("job.conf", cwd=tmp_path))
    assert message.startswith("job.conf:4:27: layer 'a' (#0): type = kReLUU: expected one of ")


def test_workers_option_plans_every_phase_on_that_many_workers():
    """`check -n N` says how many workers are meant: the plans a launch on N ranks would make, checked."""
    conf = REPO / "conf" / "cifar10_hybrid.conf"  # pinned to 2 workers; runs on others
    result = run_check(str(conf), "-n", "3")
    assert result.returncode == 0, result.stderr
    assert "  plans on 3 worker(s): train, test OK" in result.stdout.splitlines()
    result = run_check(str(REPO / "conf" / "digits_mlp.conf"), "--workers", "100")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "partition_dim = 0: expected a batch of at least 100 rows to split over 100 workers" in result.stderr


@pytest.mark.parametrize("job", ["digits_hogwild", "digits_downpour", "digits_allreduce"])
def test_one_rank_checks_the_one_process_run_that_trains_the_whole_net(job):
    """`check -n 1` of a job whose cluster asks for several ranks refused ("3 worker group(s) x 1
    worker(s) need 3 ranks, launched with 1: expected mpiexec -n 3") while `train` on one process, and
    `mpiexec -n 1 ... train`, train it: it now says what such a run says, and checks its plans."""
    result = run_check(f"conf/{job}.conf", "-n", "1")
    assert result.returncode == 0, result.stderr
    out = result.stdout.splitlines()
    note, = [line for line in out if line.startswith("note: ")]
    assert note.startswith(f"note: conf/{job}.conf:67:1: cluster ") and "running as one process: the whole net, " \
        "serially and synchronously" in note
    assert "  plans on 1 worker(s): train, test OK" in out


@pytest.mark.parametrize("command", [["check"], ["plan", "-n", "2"]])
def test_under_mpiexec_check_and_plan_speak_once(tmp_path, command):
    """Users wrap every command in mpiexec or srun: each rank runs the same check, and rank 0 alone
    prints its summary or its error (the lines came once per rank)."""
    from mpi_jobs import mpi_env, mpiexec_command

    good = REPO / "conf" / "digits_mlp.conf"
    bad = tmp_path / "bad.conf"
    bad.write_text(good.read_text().replace("momentum: 0.9", "momentum: 1.5", 1))
    for conf, code in ((good, 0), (bad, 2)):
        result = subprocess.run(mpiexec_command(3) + [sys.executable, "-m", "singa_mpi", *command, str(conf)],
                                cwd=REPO, env=mpi_env(), capture_output=True, text=True, timeout=120)
        assert result.returncode == code, result.stderr
        if code:
            assert result.stderr.count("singa-mpi: error:") == 1 and "updater.momentum = 1.5" in result.stderr
        else:
            first = result.stdout.splitlines()[0]
            assert result.stdout.count(first) == 1, result.stdout  # the summary's or the plan's first line


def test_under_mpiexec_a_bad_argument_and_a_conversion_are_said_once(tmp_path):
    """Every rank parses the same arguments and would convert the same files: rank 0 alone does the
    work and says so; the others leave with nothing to do (or, for a bad argument, silently)."""
    from mpi_jobs import mpi_env, mpiexec_command

    def run(*args):
        return subprocess.run(mpiexec_command(2) + [sys.executable, "-m", "singa_mpi", *args], cwd=tmp_path,
                              env=mpi_env(PYTHONPATH=str(REPO)), capture_output=True, text=True, timeout=120)

    bad = run("train", str(REPO / "conf" / "digits_mlp.conf"), "--steps", "-3")
    assert bad.returncode == 2 and bad.stderr.count("argument --steps: -3") == 1, bad.stderr
    done = run("data", "digits", "--out", "digits")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["wrote digits/train.h5", "wrote digits/test.h5"], done.stdout
    assert sorted(os.listdir(tmp_path / "digits")) == ["test.h5", "train.h5"]  # no other rank's temporary
