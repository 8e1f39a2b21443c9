"""scripts/profile_step.py under mpiexec: the per-rank, per-layer table of a pipelined scheme."""
import pathlib
import re
import subprocess
import sys

from mpi_jobs import launcher, mpiexec_command

ROOT = pathlib.Path(__file__).resolve().parents[2]
ROW = re.compile(r"^\s+(\d+)\s+(\S+)\s+([\d.]+|-)\s+([\d.]+|-)\s+([\d.]+|-)\s+([\d.]+|-)$", re.M)


def test_a_pipelined_scheme_shows_each_stage_on_its_rank_and_each_micro_batch_s_exchange():
    cmd = mpiexec_command(2) + [sys.executable, "scripts/profile_step.py", "--scheme", "zb-2", "--steps", "1"]
    out = subprocess.run(cmd, cwd=ROOT, env=launcher().environ(OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1"),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("mnist_mlp zb-2 on 2 rank(s)"), out.stdout
    ranks_of: dict[str, set[int]] = {}
    for rank, layer, *_ in ROW.findall(out.stdout):
        ranks_of.setdefault(layer, set()).add(int(rank))
    layers = {name for name in ranks_of if "(" not in name}
    assert layers == {"data", "fc1", "tanh1", "fc2", "tanh2", "fc3", "tanh3", "fc4", "tanh4", "fc5", "tanh5",
                      "fc6", "loss"}, out.stdout
    assert all(len(ranks_of[name]) == 1 for name in layers), out.stdout  # whole layers, one stage each
    assert ranks_of["fc1"] == {0} and ranks_of["loss"] == {1}, out.stdout
    # the activation crosses the cut once per micro-batch: a sending bridge on the first stage, a
    # receiving one on the second
    for micro in (0, 1):
        assert any(name.startswith("bridge_src(") and name.endswith(f"/mb{micro}") and ranks == {0}
                   for name, ranks in ranks_of.items()), out.stdout
        assert any(name.startswith("bridge_dst(") and name.endswith(f"/mb{micro}") and ranks == {1}
                   for name, ranks in ranks_of.items()), out.stdout
    assert re.search(r"rank 0: ms per step: .*in communication calls [\d.]+", out.stdout), out.stdout
    assert re.search(r"rank 1: ms per step: .*in communication calls [\d.]+", out.stdout), out.stdout


def test_an_unknown_scheme_is_refused_with_the_valid_names():
    out = subprocess.run([sys.executable, "scripts/profile_step.py", "--scheme", "zb"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "'zb': expected one of data, feature, hybrid" in out.stderr and "zb-M" in out.stderr, out.stderr
