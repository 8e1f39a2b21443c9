"""What the training loop reports and writes: metrics.jsonl values, means, rates, checkpoints, stop messages."""
import json

import nets
from singa_mpi.launcher import RunOptions, run_training


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


def test_metrics_jsonl_keeps_full_precision_and_progress_lines_stay_rounded(tmp_path, capsys):
    assert train(job_file(tmp_path), tmp_path / "ws") == 0
    lines = capsys.readouterr().out.splitlines()
    losses = [m["loss"] for m in metrics(tmp_path / "ws") if m["phase"] == "train"]
    assert len(losses) == 6
    assert any(v != round(v, 6) for v in losses)  # more than 6 decimals survive
    progress = [line for line in lines if " train " in line]
    assert progress and all(f"loss {v:.4f}" in line for v, line in zip(losses, progress))
