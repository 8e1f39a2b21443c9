"""`singa-mpi plan` and `check` on a machine without MPI: nothing on their path imports mpi4py."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# a Python that cannot import mpi4py: an empty module that raises on import shadows it
BLOCK = "import sys; sys.modules['mpi4py'] = None; from singa_mpi.cli import main; sys.exit(main(sys.argv[1:]))"


def run(*args, timeout=120):
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", BLOCK, *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=timeout)


def test_plan_text_without_mpi():
    out = run("plan", "conf/cifar10_hybrid.conf")  # -n comes from cluster.nworkers_per_group: 2
    assert out.returncode == 0, out.stderr
    assert "rank 1:" in out.stdout and "concate(split(pool3))@1" in out.stdout and "Alltoallv" in out.stdout
    assert "traffic/step" in out.stdout and "total:" in out.stdout


def test_plan_json_and_dot(tmp_path):
    out = run("plan", "conf/digits_mlp.conf", "-n", "3", "--format", "json")
    assert out.returncode == 0, out.stderr
    plan = json.loads(out.stdout)
    records = plan["sublayers"]
    assert {"name", "type", "rank", "origin"} <= set(records[0])
    assert {r["rank"] for r in records} == {0, 1, 2}
    assert all(r["origin"] is None or r["type"].startswith("k") for r in records)
    dot = tmp_path / "plan.dot"
    out = run("plan", "conf/cifar10_hybrid.conf", "--format", "dot", "-o", str(dot))
    assert out.returncode == 0, out.stderr
    text = dot.read_text()
    assert text.startswith("digraph plan") and "cluster_rank1" in text and "fillcolor" in text


def test_plan_workers_override_the_cluster():
    out = run("plan", "conf/cifar10_hybrid.conf", "-n", "3")  # the job pins 2 workers; -n overrides
    assert out.returncode == 0, out.stderr
    assert "rank 2:" in out.stdout and "rank 3:" not in out.stdout
    out = run("plan", "conf/cifar10_hybrid.conf", "--workers", "0")
    assert out.returncode == 2 and "0: expected a count of at least 1" in out.stderr


def test_check_without_mpi():
    out = run("check", "conf/mnist_conv.conf")
    assert out.returncode == 0, out.stderr
    assert "OK" in out.stdout


@pytest.mark.skipif(not __import__("shutil").which("dot"), reason="Graphviz is not installed")
def test_plan_png(tmp_path):
    png = tmp_path / "plan.png"
    out = run("plan", "conf/cifar10_hybrid.conf", "--format", "dot", "-o", str(png))
    assert out.returncode == 0, out.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
