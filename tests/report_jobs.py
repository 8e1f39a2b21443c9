"""The report tests' job (tests/nets.py's 12-16-10-5 MLP on 40 synthetic rows) trained in this
process, and the metrics.jsonl it writes.

Shared by tests/test_trainer_reports.py and tests/test_progress.py.
"""
import json
import pathlib

import nets
from singa_mpi.launcher import RunOptions, run_training


ROOT = pathlib.Path(__file__).resolve().parents[1]


def job_file(tmp_path, steps=6, batch=8, scheme="data", nranks=2, extra="", name="job"):
    data = tmp_path / "data.h5"
    if not data.exists():
        nets.make_data(str(data), 40, (12,), 5)
    text = nets.mlp(str(data), batch, scheme, nranks).replace("train_steps: 20", f"train_steps: {steps}")
    path = tmp_path / f"{name}.conf"
    path.write_text(text + extra)
    return str(path)


def train(conf, workspace, **options):
    return run_training(conf, lambda cfg: str(workspace), RunOptions(**options))


def metrics(workspace):
    return [json.loads(line) for line in (workspace / "metrics.jsonl").read_text().splitlines()]
