"""A job predicted not to fit a rank's memory is refused before any communication, in one line naming
the field behind it (singa_mpi.cost.memory), by `check -n N` and by every rank of `train`."""
import gc
import pathlib
import re
import subprocess
import sys
import tracemalloc

import pytest

from checkpoint_jobs import ROOT
from mpi_jobs import mpi_env, mpiexec_command
from singa_mpi import cli
from singa_mpi.cost import memory

DIGITS, CONVNET = ROOT / "conf" / "digits_mlp.conf", ROOT / "conf" / "cifar10_convnet.conf"
SMALL = (256 * 2 ** 20, "a test's 256 MiB")  # a bound every unmutated job here fits, far from the machine's


def mutated(tmp_path, source, old: str, new: str) -> tuple[str, int]:
    """A copy of ``source`` with ``old`` replaced by ``new`` once; (its path, the line of the change)."""
    text = source.read_text()
    assert old in text
    path = tmp_path / source.name
    path.write_text(text.replace(old, new, 1))
    return str(path), text[:text.index(old)].count("\n") + 1


MUTATIONS = [  # (job, old, new, the field named, what the line tells to do)
    (DIGITS, "num_output: 256", "num_output: 2000000", "innerproduct_conf.num_output = 2000000", "partition_dim: 1"),
    (DIGITS, "batchsize: 64 ", "batchsize: 200000 ", "store_conf.batchsize = 200000", "fewer rows per rank"),
    (CONVNET, "pad: 2 }", "pad: 300 }", "convolution_conf.pad = 300", "a smaller pad"),
]


@pytest.mark.parametrize("source, old, new, field, todo", MUTATIONS, ids=["num_output", "batchsize", "pad"])
def test_a_job_over_the_bound_is_one_line_naming_the_field(tmp_path, capsys, monkeypatch, source, old, new, field,
                                                           todo):
    monkeypatch.setattr(memory, "memory_bound", lambda node_ranks: SMALL)
    assert cli.main(["check", str(source), "-n", "2"]) == 0  # the job as written fits
    assert "GiB" not in capsys.readouterr().out
    path, line = mutated(tmp_path, source, old, new)
    assert cli.main(["check", path, "-n", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"singa-mpi: error: {path}:{line}:") and field in err[0], err[0]
    assert "over the 256.0 MiB a rank can have here (a test's 256 MiB)" in err[0] and todo in err[0], err[0]
    assert "--no-check-memory to skip this check" in err[0]
    assert cli.main(["check", path, "-n", "2", "--no-check-memory"]) == 0


def test_a_job_near_the_bound_is_warned_of_once(capsys, monkeypatch):
    from singa_mpi.config.load import load_job
    from singa_mpi.planner import partition

    cfg = load_job(str(DIGITS))
    need = memory.fullest(cfg, [partition(cfg, 2, phase) for phase in ("train", "test")])[0]
    monkeypatch.setattr(memory, "memory_bound", lambda node_ranks: (int(need / 0.9), "a test's bound"))
    assert cli.main(["check", str(DIGITS), "-n", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("near the") == 1 and "a test's bound" in out, out


def test_check_n_warns_of_a_job_that_fits_a_rank_alone_but_not_n_on_this_machine(capsys, monkeypatch):
    """`check -n N` runs where the N ranks may not be (a login node, for a job spread over nodes): it
    refused any job whose N ranks would not fit this machine together; now only one that a rank alone
    would not fit, and warns of the other (train checks each node's own share)."""
    from singa_mpi.config.load import load_job
    from singa_mpi.planner import partition

    cfg = load_job(str(DIGITS))
    need = memory.fullest(cfg, [partition(cfg, 2, phase) for phase in ("train", "test")])[0]
    monkeypatch.setattr(memory, "memory_bound", lambda node_ranks: (int(need * 1.5) // node_ranks, "a test's bound"))
    assert cli.main(["check", str(DIGITS), "-n", "2"]) == 0
    out = capsys.readouterr().out
    said = [line for line in out.splitlines() if "a rank can have here" in line]  # (not a missing data file's)
    assert len(said) == 1 and said[0].startswith("warning: "), out
    assert "(if all 2 ranks share this machine; across nodes" in said[0], said
    monkeypatch.setattr(memory, "memory_bound", lambda node_ranks: (int(need * 0.5) // node_ranks, "a test's bound"))
    assert cli.main(["check", str(DIGITS), "-n", "2"]) == 2  # not even one rank alone


def test_num_output_2e9_is_refused_against_the_machines_memory_by_check_and_train(tmp_path, capsys):
    path, line = mutated(tmp_path, DIGITS, "num_output: 256", "num_output: 2000000000")
    assert cli.main(["check", path, "-n", "2"]) == 2
    checked = capsys.readouterr().err
    assert f"{path}:{line}:" in checked and "innerproduct_conf.num_output = 2000000000" in checked, checked
    assert "rank(s) on this node" in checked
    # one process: refused before it reads data or allocates a param (was: out of memory, exit 6)
    assert cli.main(["train", path, "--workspace", str(tmp_path / "ws")]) == 2
    trained = capsys.readouterr().err.strip().splitlines()
    assert len(trained) == 1 and "innerproduct_conf.num_output = 2000000000" in trained[0], trained
    assert not (tmp_path / "ws").exists()


@pytest.mark.parametrize("text, expected", [("max", None), ("1073741824", 2 ** 30), ("9223372036854771712", None)])
def test_the_bound_is_the_cgroups_limit_where_set_else_physical_memory_over_the_nodes_ranks(tmp_path, monkeypatch,
                                                                                               text, expected):
    limit = tmp_path / "memory.max"
    limit.write_text(text + "\n")
    monkeypatch.setattr(memory, "CGROUP_LIMITS", (str(limit),))
    bound, source = memory.memory_bound(4)
    physical = memory.os.sysconf("SC_PHYS_PAGES") * memory.os.sysconf("SC_PAGE_SIZE")
    assert bound == (expected or physical) // 4
    assert (str(limit) in source) == (expected is not None) and source.endswith("/ 4 rank(s) on this node"), source


def test_under_mpi_every_rank_refuses_it_before_any_communication_and_one_line_says_so(tmp_path):
    path, line = mutated(tmp_path, DIGITS, "num_output: 256", "num_output: 2000000000")
    result = subprocess.run(mpiexec_command(2) + [sys.executable, "-m", "singa_mpi", "train", path, "--workspace",
                                                  str(tmp_path / "ws")],
                            cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=240)
    assert result.returncode == 2, result.stderr[-3000:]
    errors = [text for text in result.stderr.splitlines() if "error" in text.lower()]
    assert len(errors) == 1 and f"{path}:{line}:" in errors[0], result.stderr[-3000:]
    assert "innerproduct_conf.num_output = 2000000000" in errors[0] and "/ 2 rank(s) on this node" in errors[0]
    assert "Abort" not in result.stderr and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert not (tmp_path / "ws").exists()  # refused in the vote, before the root made the workspace


def _shrunk(name: str, batch: int) -> str:
    """conf/NAME in the current folder, at ``batch`` rows, 3 training steps and one test step."""
    text = (ROOT / "conf" / name).read_text()
    for field, value in (("train_steps", 3), ("test_steps", 1), ("batchsize", batch), ("random_skip", 0)):
        text = re.sub(rf"\b{field}: \d+", f"{field}: {value}", text)
    pathlib.Path(name).write_text(text)
    return name


@pytest.mark.slow
@pytest.mark.parametrize("name, batch", [("cifar10_convnet.conf", 16), ("rbm_mnist_1.conf", 100)])
def test_the_prediction_is_within_a_quarter_of_the_measured_peak(tmp_path, monkeypatch, name, batch):
    """The predicted need of a conv-heavy job and an RBM on one process against the peak tracemalloc
    measures of the run (numpy reports every array to it; the run is made once before, so modules
    imported on first use are not counted): within 25% either way.  It left out the layers' work arrays
    (im2col's columns, FFT spectra, masks), the decoded stores, the test net's outputs and the
    checkpoint's copies: predicted 23-25% of the measured peak of both jobs at their conf/ sizes; now
    1.00-1.14 of the fullest rank's on the 5 jobs measured (docs/troubleshooting.md).  Checked as the check
    decides: no refusal at a bound 25% above the peak, a warning at least with 80% of the bound at 25%
    below it."""
    from singa_mpi.config.load import load_job, phases_of
    from singa_mpi.cost.auto import placement_free
    from singa_mpi.errors import ConfigError
    from singa_mpi.planner import partition

    monkeypatch.chdir(tmp_path)
    job = _shrunk(name, batch)
    assert cli.main(["data", "synthetic", "--like", job, "--count", "200"]) == 0
    assert cli.main(["train", job, "--workspace", "first", "--steps", "1"]) == 0
    gc.collect()
    tracemalloc.start()
    try:
        assert cli.main(["train", job, "--workspace", "measured"]) == 0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    cfg = load_job(job)
    plans = [partition(placement_free(cfg), 1, phase) for phase in phases_of(cfg)]  # one process's, as train's

    def verdict(bound: float) -> str:
        monkeypatch.setattr(memory, "memory_bound", lambda node_ranks: (int(bound), "a test's bound"))
        try:
            return "near" if memory.check_memory(cfg, plans, 1) else "fits"
        except ConfigError:
            return "over"

    assert verdict(1.25 * peak) != "over", peak  # predicted at most 25% above the peak
    assert verdict(0.75 * peak / memory.WARN_SHARE) != "fits", peak  # and more than 25% below it


def test_the_test_command_is_checked_too_and_no_check_memory_skips_it(tmp_path, capsys, monkeypatch):
    """`singa-mpi test` ran a job that could not fit without a look (it allocated the params and died
    out of memory, exit 6); now refused as train is, in one line before any checkpoint is read, for the
    params alone (no gradients, updater state or checkpoint copies); --no-check-memory skips it."""
    monkeypatch.chdir(tmp_path)  # the digits are prepared here
    path, line = mutated(tmp_path, DIGITS, "num_output: 256", "num_output: 2000000000")
    assert cli.main(["test", path, "--workspace", str(tmp_path / "ws")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{path}:{line}:" in err[0], err
    assert "innerproduct_conf.num_output = 2000000000" in err[0] and "in the test phase" in err[0], err[0]
    assert "--no-check-memory to skip this check" in err[0], err[0]
    assert cli.main(["test", path, "--workspace", str(tmp_path / "ws"), "--no-check-memory"]) == 3
    assert "no checkpoint found" in capsys.readouterr().err  # past the check, to the checkpoints


def test_a_test_run_is_predicted_without_gradients_updater_state_or_checkpoint_copies():
    from singa_mpi.config.load import load_job
    from singa_mpi.planner import partition

    cfg = load_job(str(DIGITS))
    test_plan = partition(cfg, 1, "test")
    tested = memory.fullest(cfg, [test_plan], trains=False)[1]
    trained = memory.fullest(cfg, [partition(cfg, 1, "train"), test_plan])[1]
    params = sum(n for (_, what), n in tested.items() if what == "params")
    assert params == 4 * 50_826  # the values alone (digits_mlp: 50,826 weights)
    assert sum(n for (_, what), n in trained.items() if what == "params") > 2 * params  # with gradients, history
    assert not [what for _, what in tested if what == "checkpoint copies"]
