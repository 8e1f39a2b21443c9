"""`train --profile`'s prediction beside the measured step (singa_mpi.cost.beside): the table from a
made-up profile and a replay with made-up kernel times (exact arithmetic)."""
import pytest

import nets
from singa_mpi.cost.beside import Prediction, beside_lines
from singa_mpi.cost.model import predict
from singa_mpi.planner import SHARED_MEMORY, plan
from cost_support import RowKernels, rates


def row(cat, name, seconds):
    return {"cat": cat, "name": name, "calls": 1.0, "bytes": 0.0, "seconds": seconds}


@pytest.fixture
def feature_prediction(tmp_path):
    data = nets.make_data(str(tmp_path / "d.h5"), 64, (12,), 5)
    the_plan = plan(nets.job(nets.mlp(data, 16, "feature", 2)), 2)
    cost = predict(the_plan, SHARED_MEMORY, RowKernels(), rates())
    return Prediction(cost, the_plan, SHARED_MEMORY, kernels_timed=0, corunners=1, cache="/cache/kernels.json")


def cells(lines, label):
    """The numbers of the table row ``label``."""
    for line in lines:
        if line.split()[:len(label.split())] == label.split():
            return [float(x) if x != "-" else None for x in line.split()[len(label.split()):len(label.split()) + 4]
                    if x.replace(".", "", 1).isdigit() or x == "-"]
    raise AssertionError(f"no row {label!r} in:\n" + "\n".join(lines))


def test_each_layer_beside_the_slowest_worker_and_the_step_beside_its_phases(feature_prediction):
    profile = {"steps": 7, "ranks": [
        [row("forward", "fc1", 0.002), row("backward", "fc1", 0.001), row("forward", "concate(split(fc1))@0", 0.004),
         row("comm", "concate(split(fc1))@0", 0.0039), row("step", "train_one_batch", 0.010),
         row("step", "sync", 0.001), row("step", "update", 0.0005), row("step", "checkpoint", 0.1)],
        [row("forward", "fc1", 0.003), row("backward", "fc1", 0.0005), row("forward", "concate(split(fc1))@1", 0.001),
         row("backward", "concate(split(fc1))@1", 0.002), row("step", "train_one_batch", 0.011),
         row("step", "sync", 0.0002), row("step", "update", 0.0004)]]}
    lines = beside_lines(profile, feature_prediction)
    cost = feature_prediction.cost
    fc1 = next(layer for layer in cost.layers if layer.name == "fc1")
    predicted_fwd, measured_fwd, predicted_bwd, measured_bwd = cells(lines, "fc1")
    assert predicted_fwd == pytest.approx(1e3 * fc1.forward, abs=1e-3)
    assert predicted_bwd == pytest.approx(1e3 * fc1.backward, abs=1e-3)
    assert (measured_fwd, measured_bwd) == (3.0, 1.0)  # the slowest worker's, pass by pass
    assert cells(lines, "fc2")[1] is None  # not in the profile: no measurement
    predicted_comm, measured_comm = cells(lines, "connection layers")[:2]
    assert measured_comm == 4.0  # worker 0: 4 ms; worker 1: 1 + 2 ms
    assert predicted_comm == pytest.approx(1e3 * sum(layer.comm for layer in cost.layers), abs=1e-3)
    step = lines[-1]
    # the slowest worker's train_one_batch + sync + update (the checkpoint is not the step)
    assert "measured 11.60 ms over 7 steps" in step
    assert f"predicted {1e3 * cost.step:.2f} ms" in step
    assert f"predicted/measured {cost.step / 0.0116:.2f}" in step
    assert "2 worker(s), batch 16, param sync shared_memory" in lines[0] and "beside 1 cop(ies)" in lines[0]


def test_a_cd_job_says_why_it_has_no_prediction(tmp_path, capsys, monkeypatch):
    from singa_mpi import cli

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    data = nets.make_data(str(tmp_path / "d.h5"), 64, (12,), 5)
    conf = tmp_path / "rbm.conf"
    conf.write_text(nets.rbm(data, 8, steps=3))
    assert cli.main(["train", str(conf), "--workspace", str(tmp_path / "ws"), "--profile"]) == 0
    printed = capsys.readouterr().out
    assert "profile: per training step over 3 steps" in printed
    assert "no prediction: the cost model replays BP's forward and backward passes, not kCD's" in printed
    assert "predicted beside measured" not in printed and not (tmp_path / "cache").exists()


def test_a_prediction_that_cannot_be_cached_is_a_line_and_the_run_still_succeeds(tmp_path, capsys, monkeypatch):
    from singa_mpi import cli
    from checkpoint_jobs import job_file

    (tmp_path / "not_a_folder").write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "not_a_folder"))  # the kernel cache cannot be written
    conf = job_file(tmp_path, "data", steps=3)
    assert cli.main(["train", conf, "--workspace", str(tmp_path / "ws"), "--profile"]) == 0
    captured = capsys.readouterr()
    printed = captured.out
    assert "profile: per training step over 3 steps" in printed
    # the kernels timed are used all the same (they were thrown away for "no prediction: [Errno 20] ...")
    assert "predicted beside measured" in printed and "no prediction" not in printed
    warning, = [line for line in captured.err.splitlines() if "kernel times not cached" in line]
    assert warning.startswith("warning: ") and "not_a_folder" in warning
