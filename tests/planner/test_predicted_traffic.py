"""The plan predicts what runs: `singa-mpi plan --format json` bytes per step equal the measured table.

For the MNIST MLP and the CIFAR-10 convnet under the data, feature, hybrid and
pipeline schemes of scripts/bench_scaling.py, a short run on 2 ranks writes its
measured communication table (WORKSPACE/communication.json, the table printed
at the end of a run); every row the plan predicts must match within 5%, and no
row the plan does not know about may move data during the steps.
"""
import json
import pathlib
import subprocess
import sys

import pytest
from google.protobuf import text_format

from mpi_jobs import mpi_env, mpiexec_command

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from bench_scaling import NETS, partitioned  # noqa: E402
from bench_serial import job_on_synthetic_data  # noqa: E402

STEPS = 3
# rows that move data outside the step's exchanges and syncs (once per run or per display)
NOT_PER_STEP = {"stop-signal vote", "metrics", "gather(objects)", "allgather(objects)", "barrier"}


def _job(tmp_path, net: str, scheme: str) -> pathlib.Path:
    conf, shape, _ = NETS[net]
    cfg = partitioned(job_on_synthetic_data(conf, str(tmp_path), shape, 400), scheme)
    job = cfg.proto
    job.train_steps, job.disp_freq, job.checkpoint_freq = STEPS, 0, 0
    job.ClearField("checkpoint_path")
    job.cluster.ClearField("nworkers_per_group")
    path = tmp_path / f"{net}_{scheme}.conf"
    path.write_text(text_format.MessageToString(job))
    return path


def _run(*args, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("scheme", ["data", "feature", "hybrid", "pipeline"])
@pytest.mark.parametrize("net", ["mnist_mlp", "cifar10_convnet"])
@pytest.mark.slow
def test_plan_predicts_the_measured_bytes(tmp_path, net, scheme):
    job = _job(tmp_path, net, scheme)
    planned = _run(sys.executable, "-m", "singa_mpi", "plan", str(job), "-n", "2", "--format", "json")
    assert planned.returncode == 0, planned.stderr
    plan = json.loads(planned.stdout)
    predicted = {int(rank): rows for rank, rows in plan["predicted_bytes"].items()}

    workspace = tmp_path / "ws"
    trained = _run(*mpiexec_command(2), sys.executable, "-m", "singa_mpi", "train", str(job),
                   "--workspace", str(workspace))
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    measured = json.loads((workspace / "communication.json").read_text())
    assert measured["method"] == plan["sync_method"] == "shared_memory"
    assert measured["steps"] == STEPS

    problems = []
    for rank, rows in predicted.items():
        got = measured["workers"][rank]
        for label, nbytes in rows.items():
            moved = got.get(label, {"bytes": 0})["bytes"] / STEPS
            if abs(moved - nbytes) > 0.05 * max(nbytes, 1):
                problems.append(f"rank {rank} {label}: predicted {nbytes} B/step, measured {moved:.0f}")
        for label, row in got.items():
            if label not in rows and label not in NOT_PER_STEP and not label.startswith("setup") and row["bytes"]:
                problems.append(f"rank {rank} {label}: {row['bytes']} B measured, not in the plan")
    assert not problems, "\n".join(problems)
    assert any(nbytes for rows in predicted.values() for nbytes in rows.values()), "a plan that moves nothing"
