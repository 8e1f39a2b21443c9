"""A job predicted not to fit a rank's memory is refused before any communication, in one line naming
the field behind it (singa_mpi.cost.memory), by `check -n N` and by every rank of `train`."""
import subprocess
import sys

import pytest

from checkpoint_jobs import ROOT
from mpi_jobs import mpi_env, mpiexec_command
from singa_mpi import cli
from singa_mpi.cost import memory

DIGITS, CONVNET = ROOT / "conf" / "digits_mlp.conf", ROOT / "conf" / "cifar10_convnet.conf"
SMALL = (64 * 2 ** 20, "a test's 64 MiB")  # a bound every unmutated job here fits, far from the machine's


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
    assert "over the 64.0 MiB a rank can have here (a test's 64 MiB)" in err[0] and todo in err[0], err[0]
    assert "--no-check-memory to skip this check" in err[0]
    assert cli.main(["check", path, "-n", "2", "--no-check-memory"]) == 0


def test_a_job_near_the_bound_is_warned_of_once(capsys, monkeypatch):
    from singa_mpi.config.load import load_job
    from singa_mpi.cost.auto import plan_memory
    from singa_mpi.planner import partition

    cfg = load_job(str(DIGITS))
    need = max(plan_memory(partition(cfg, 2, phase)) for phase in ("train", "test"))
    monkeypatch.setattr(memory, "memory_bound", lambda node_ranks: (int(need / 0.9), "a test's bound"))
    assert cli.main(["check", str(DIGITS), "-n", "2"]) == 0
    out = capsys.readouterr().out
    assert out.count("near the") == 1 and "a test's bound" in out, out


def test_check_n_warns_of_a_job_that_fits_a_rank_alone_but_not_n_on_this_machine(capsys, monkeypatch):
    """`check -n N` runs where the N ranks may not be (a login node, for a job spread over nodes): it
    refused any job whose N ranks would not fit this machine together; now only one that a rank alone
    would not fit, and warns of the other (train checks each node's own share)."""
    from singa_mpi.config.load import load_job
    from singa_mpi.cost.auto import plan_memory
    from singa_mpi.planner import partition

    cfg = load_job(str(DIGITS))
    need = max(plan_memory(partition(cfg, 2, phase)) for phase in ("train", "test"))
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
