"""Smoke test of scripts/bench_scaling.py: each run printed with its numbers as it is made, the table so far."""
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_each_run_and_the_table_so_far_are_printed_before_the_end(tmp_path):
    cmd = [sys.executable, str(ROOT / "scripts" / "bench_scaling.py"), "--ranks", "1", "--repeat", "1", "--steps", "2",
           "--nets", "mnist_mlp", "--schemes", "data", "feature", "--json", str(tmp_path / "runs.json")]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    run = re.compile(r"  measured mnist_mlp (data|feature) n=1 \(1/1\): [\d,.]+ samples/s, [\d.]+ ms/step$")
    measured = [i for i, line in enumerate(lines) if run.match(line)]
    assert len(measured) == 2, out.stdout
    partial = lines.index("mnist_mlp data done; the table so far:")
    assert measured[0] < partial < measured[1], out.stdout
    assert re.match(r"mnist_mlp +data +n=1 ", lines[partial + 1]), out.stdout
    assert (tmp_path / "runs.json").exists()


def test_auto_pipeline_runs_the_layout_plan_auto_chose(tmp_path):
    """``--schemes auto-pipeline``: every rank applies the one layout chosen for the run (partition_dims,
    workers, the pipeline setting); on one rank the net runs whole, unpipelined."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_scaling
    from bench_serial import job_on_synthetic_data
    from singa_mpi.planner import partition
    from singa_mpi.program.schedules import stages_of

    assert bench_scaling.scheme_name("auto-pipeline") == "auto-pipeline"
    cfg = job_on_synthetic_data("cifar10_convnet.conf", str(tmp_path), (3, 32, 32), 16)
    names = [layer.name for layer in cfg.proto.neuralnet.layer]
    second = names[names.index("conv2"):]
    chosen = {"dims": dict(dict.fromkeys(names, -1), conv2=0),
              "locations": {name: int(name in second) for name in names}, "pipeline": ["1f1b", 4]}
    plan = partition(bench_scaling.partitioned(cfg, "auto-pipeline", chosen, 2), 2)
    assert (plan.pipeline.schedule, plan.pipeline.micro_batches) == ("1f1b", 4) and stages_of(plan) == {0: 0, 1: 1}
    assert {sub.rank for sub in plan.sublayers if sub.origin == "conv2"} == {0, 1}
    alone = job_on_synthetic_data("cifar10_convnet.conf", str(tmp_path), (3, 32, 32), 16)
    one = {"dims": dict.fromkeys(names, -1), "locations": dict.fromkeys(names, 0), "pipeline": None}
    assert partition(bench_scaling.partitioned(alone, "auto-pipeline", one, 1), 1).pipeline is None


def _row(ranks, oversubscribed):
    return dict(net="mnist_mlp", scheme="data", ranks=ranks, oversubscribed=oversubscribed, samples_per_s=1000.0,
                speedup=1.0, speedup_best=1.0, speedup_range=None, exposed_comm_share=0.0, bytes_per_step=0,
                repeats=1)


def test_the_oversubscribed_footnote_only_under_a_marked_row(capsys):
    """The 16-core machine's tables (16 ranks at most) each ended in "* oversubscribed: ... correctness
    only, not speed", with no row marked: a reader could take the whole table for meaningless."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_scaling

    bench_scaling.print_table([_row(1, False), _row(16, False)])
    assert "oversubscribed" not in capsys.readouterr().out
    bench_scaling.print_table([_row(1, False), _row(32, True)])
    out = capsys.readouterr().out
    assert "n=32*" in out and "* oversubscribed: more ranks than cores" in out
