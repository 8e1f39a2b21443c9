"""The training loop: SINGA's schedule predicates, metrics.jsonl, and the default job's accuracy."""
import json


import nets
from singa_mpi import cli
from singa_mpi.proto import job_pb2
from singa_mpi import trainer as training


def test_schedule_predicates_follow_singa():
    job = job_pb2.JobProto(disp_freq=10, disp_after=5, test_freq=20, test_steps=3, test_after=0,
                           validate_freq=7, validate_steps=0, checkpoint_freq=4, checkpoint_after=8)
    assert [s for s in range(40) if training.display_now(job, s)] == [5, 15, 25, 35]
    assert [s for s in range(40) if training.test_now(job, s)] == [0, 20]
    assert not any(training.validate_now(job, s) for s in range(40))  # validate_steps 0 turns validation off
    assert [s for s in range(20) if training.checkpoint_now(job, s)] == [8, 12, 16]


def test_metrics_jsonl_and_test_before_the_batch(tmp_path):
    data = nets.make_data(str(tmp_path / "d.h5"), 40, (12,), 5)
    text = nets.mlp(data, 8, "data").replace("train_steps: 20", "train_steps: 6").replace("disp_freq: 1", "disp_freq: 2")
    text = text.replace('neuralnet {', 'test_steps: 2 test_freq: 3\nneuralnet {')
    conf = tmp_path / "job.conf"
    conf.write_text(text)
    assert cli.main(["train", str(conf), "--workspace", str(tmp_path / "ws")]) == 0
    lines = [json.loads(line) for line in (tmp_path / "ws" / "metrics.jsonl").read_text().splitlines()]
    assert [(m["step"], m["phase"]) for m in lines] == [
        (0, "test"), (0, "train"), (2, "train"), (3, "test"), (4, "train"), (6, "test")]
    for m in lines:
        assert {"step", "phase", "loss", "accuracy", "elapsed"} <= set(m)
    assert all("samples_per_s" in m for m in lines if m["phase"] == "train")


def test_default_job_reaches_95_percent_on_digits(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # the digits data and the workspace go below the current folder
    assert cli.main(["train"]) == 0
    final = [json.loads(line) for line in (tmp_path / "workspace" / "digits_mlp" / "metrics.jsonl")
             .read_text().splitlines()][-1]
    assert final["phase"] == "test" and final["step"] == 600
    assert final["accuracy"] >= 0.95
    assert "preparing scikit-learn's digits" in capsys.readouterr().out


def test_a_layer_nobody_consumes_is_left_out_of_backward(tmp_path):
    """SINGA's cifar10/cudnn_bm.conf leaves a pooling layer dangling: it computes forward, gets no
    gradient, passes none on, and the run trains as without it."""
    data = nets.make_data(str(tmp_path / "d.h5"), 40, (12,), 5)
    text = nets.mlp(data, 8, "data").replace("train_steps: 20", "train_steps: 4")
    dangling = text.replace('neuralnet {', 'neuralnet {\nlayer { name: "dangle" type: kSigmoid srclayers: "fc1" }', 1)
    losses = []
    for name, job in (("plain", text), ("dangling", dangling)):
        conf = tmp_path / f"{name}.conf"
        conf.write_text(job)
        assert cli.main(["train", str(conf), "--workspace", str(tmp_path / name)]) == 0
        lines = [json.loads(line) for line in (tmp_path / name / "metrics.jsonl").read_text().splitlines()]
        losses.append([m["loss"] for m in lines if m["phase"] == "train"])
    assert losses[0] == losses[1] and len(losses[0]) == 4


def test_a_checkpoint_and_a_validation_before_step_n_are_at_step_n(tmp_path):
    """The validation and the checkpoint that come before training step 10 (progress: "step 10 val",
    step10.h5) ran marked as step 9, the step before: a rank killed in them was named by its guardian "at
    step 9 (val)", the supervisor then said "vanished at step 9; restarting ... from checkpoint step 10"
    and counted one step fewer trained again.  Each is marked with its own step (here, in the timeline)."""
    from checkpoint_jobs import job_file

    conf = job_file(tmp_path, steps=12, extra="\ncheckpoint_freq: 5\nvalidate_steps: 1\nvalidate_freq: 10\n")
    trace = tmp_path / "trace.json"
    assert cli.main(["train", conf, "--workspace", str(tmp_path / "ws"), "--trace", str(trace)]) == 0
    spans = [(e["name"], e["args"]["step"]) for e in json.loads(trace.read_text())["traceEvents"]
             if e.get("cat") == "step" and e.get("name") in ("checkpoint", "val")]
    # ("val", 12): the final model is validated too, after its checkpoint
    assert spans == [("checkpoint", 0), ("val", 0), ("checkpoint", 5), ("checkpoint", 10), ("val", 10),
                     ("checkpoint", 12), ("val", 12)], spans
