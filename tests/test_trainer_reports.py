"""What the training loop reports and writes: metrics.jsonl values, means, rates, checkpoints, stop messages."""
import os
import subprocess
import sys

import numpy as np
import pytest

from mpi_jobs import mpi_env, mpiexec_command
from report_jobs import ROOT, job_file, metrics, train


def test_metrics_jsonl_keeps_full_precision_and_progress_lines_stay_rounded(tmp_path, capsys):
    assert train(job_file(tmp_path), tmp_path / "ws") == 0
    lines = capsys.readouterr().out.splitlines()
    losses = [m["loss"] for m in metrics(tmp_path / "ws") if m["phase"] == "train"]
    assert len(losses) == 6
    assert any(v != round(v, 6) for v in losses)  # more than 6 decimals survive
    progress = [line for line in lines if " train " in line]
    assert progress and all(f"loss {v:.4f}" in line for v, line in zip(losses, progress))


ACCURACY = 'layer { name: "acc" type: kAccuracy srclayers: "fc3" srclayers: "data" }'


def with_accuracy(conf_path):
    text = open(conf_path).read()
    path = conf_path.replace(".conf", "_acc.conf")
    with open(path, "w") as f:
        f.write(text.replace("\n}\n", f"\n{ACCURACY}\n}}\n"))
    return path


def test_each_metric_is_the_mean_over_the_rows_that_produced_it(tmp_path):
    from singa_mpi.algorithms import make_algorithm
    from singa_mpi.checks.job import validate
    from singa_mpi.config.load import load_job
    from singa_mpi.net import build_serial_net
    from singa_mpi.trainer import summarize

    plain = job_file(tmp_path)
    for conf in (plain, with_accuracy(plain)):
        cfg = load_job(conf)
        validate(cfg)
        net = build_serial_net(cfg, "train", 5, str(tmp_path), {})
        make_algorithm("kBP").evaluate(net)  # one forward pass
        layers = {layer.name: layer for layer in net.layers}
        assert ("acc" in layers) == (conf != plain)
        scores = layers["fc3"].data.astype(np.float64)  # (8, 5)
        labels = layers["data"].aux.astype(np.int64)
        log_p = scores - scores.max(axis=1, keepdims=True)
        log_p -= np.log(np.exp(log_p).sum(axis=1, keepdims=True))
        got = summarize(net.collect_metrics())
        assert list(got) == ["loss", "accuracy"]
        assert got["loss"] == pytest.approx(-log_p[np.arange(8), labels].mean(), rel=1e-6)
        assert got["accuracy"] == (scores.argmax(axis=1) == labels).mean()


def test_an_accuracy_layer_leaves_the_reported_loss_unchanged(tmp_path):
    plain = job_file(tmp_path, extra="test_steps: 2 test_freq: 3\n")
    assert train(plain, tmp_path / "plain") == 0
    assert train(with_accuracy(plain), tmp_path / "acc") == 0
    a, b = metrics(tmp_path / "plain"), metrics(tmp_path / "acc")
    assert [(m["step"], m["phase"]) for m in a] == [(m["step"], m["phase"]) for m in b]
    for x, y in zip(a, b):
        assert x["loss"] == y["loss"] and x["accuracy"] == y["accuracy"]


def test_summarize_divides_each_metric_by_its_own_count():
    from singa_mpi.trainer import summarize

    got = summarize({"accuracy": 6.0, "accuracy/count": 16.0, "loss": 10.0, "loss/count": 8.0,
                     "other": 3.0, "empty": 0.0, "empty/count": 0.0})
    assert list(got) == ["loss", "accuracy", "empty", "other"]
    assert got["loss"] == 1.25 and got["accuracy"] == 0.375 and got["other"] == 3.0
    assert got["empty"] != got["empty"]  # nan: no rows


def mpi_train(n, conf, workspace, *args, timeout=300):
    cmd = mpiexec_command(n) + [sys.executable, "-m", "singa_mpi", "train", conf, "--workspace", str(workspace),
                                *args]
    result = subprocess.run(cmd, cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_samples_per_second_count_the_global_batch_when_rank_0_starts_with_a_bridge(tmp_path):
    """The input layer on worker 1: worker 0's first layer receives from it (no batchsize of its own)."""
    conf = job_file(tmp_path, steps=60, scheme="pipeline", extra="")
    text = open(conf).read().replace("disp_freq: 1", "disp_freq: 20")
    text = text.replace("location: 0", "location: X").replace("location: 1", "location: 0").replace("location: X",
                                                                                                   "location: 1")
    assert 'name: "data" type: kRecordInput partition_dim: -1 location: 1' in text
    open(conf, "w").write(text)
    mpi_train(2, conf, tmp_path / "ws")
    train_lines = [m for m in metrics(tmp_path / "ws") if m["phase"] == "train"]
    assert [m["step"] for m in train_lines] == [0, 20, 40]
    for before, after in zip(train_lines[1:], train_lines[2:]):
        # 20 steps of 8 rows between the two lines: rate x time = rows (the time also holds one line's logging)
        rows = after["samples_per_s"] * (after["elapsed"] - before["elapsed"])
        assert 0.5 < rows / (20 * 8) < 2, rows


def test_checkpoint_after_0_writes_step_0_and_a_resume_does_not_rewrite_its_start(tmp_path, capsys):
    from singa_mpi.checkpoints import hdf5 as checkpoint

    conf = job_file(tmp_path, steps=6, extra="checkpoint_freq: 3\n")
    assert train(conf, tmp_path / "init", steps=0) == 0  # the final checkpoint of 0 steps: the initial state
    assert train(conf, tmp_path / "ws", steps=3) == 0
    listed = lambda: sorted(step for step, _ in checkpoint.listed(str(tmp_path / "ws")))  # noqa: E731
    assert listed() == [0, 3]
    initial = checkpoint.read(checkpoint.checkpoint_path(str(tmp_path / "init"), 0))
    step0 = checkpoint.read(checkpoint.checkpoint_path(str(tmp_path / "ws"), 0))
    for name, value in initial.params.items():
        np.testing.assert_array_equal(step0.params[name], value)
    step3 = checkpoint.checkpoint_path(str(tmp_path / "ws"), 3)
    before = os.stat(step3).st_mtime_ns
    capsys.readouterr()
    assert train(conf, tmp_path / "ws", resume=True) == 0
    out = capsys.readouterr().out
    assert "resuming from" in out and "step3.h5" not in out.replace(f"resuming from {step3}", "")
    assert os.stat(step3).st_mtime_ns == before
    assert listed() == [0, 3, 6]


def test_a_resume_past_a_progress_step_whose_line_was_lost_says_so(tmp_path, capsys):
    """A rank that died inside a progress step after the survivors' update left an emergency checkpoint
    past that step, whose line was never printed: the resumed run went on without a word for it
    (docs/self-healing.md).  Here the dead run's metrics.jsonl lacks that record, as it would."""
    import json

    conf = job_file(tmp_path, steps=6, extra="checkpoint_freq: 3\n")  # a progress line every step
    assert train(conf, tmp_path / "ws", steps=3) == 0
    kept = [line for line in (tmp_path / "ws" / "metrics.jsonl").read_text().splitlines()
            if (json.loads(line)["step"], json.loads(line)["phase"]) != (2, "train")]
    (tmp_path / "ws" / "metrics.jsonl").write_text("".join(line + "\n" for line in kept))
    capsys.readouterr()
    assert train(conf, tmp_path / "ws", resume=True) == 0
    out = capsys.readouterr().out
    assert out.count("no progress line") == 1 and (
        "step 2: no progress line: the run before this one ended inside that step, after its update, so its metrics "
        "were never reported (this run resumed from the checkpoint at step 3, past it)\n") in out, out
    assert [m["step"] for m in metrics(tmp_path / "ws") if m["phase"] == "train"] == [0, 1, 3, 4, 5]
    # a resume whose step before has its line: nothing said
    assert train(conf, tmp_path / "ws2", steps=3) == 0 and train(conf, tmp_path / "ws2", resume=True) == 0
    assert "no progress line" not in capsys.readouterr().out


@pytest.mark.slow
def test_a_stop_signal_names_one_step_in_the_log_the_checkpoint_and_the_resume(tmp_path):
    """stepN.h5 holds the state after N batches (steps 0..N-1); the log and --resume say N too."""
    import signal
    import time

    from singa_mpi.checkpoints import hdf5 as checkpoint

    conf = job_file(tmp_path, steps=3000)
    ws = tmp_path / "ws"
    cmd = [sys.executable, "-m", "singa_mpi", "train", conf, "--workspace", str(ws)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=mpi_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not (ws / "metrics.jsonl").exists()
                                           or (ws / "metrics.jsonl").read_text().count("\n") < 20):
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == checkpoint.EXIT_CHECKPOINTED, err[-2000:]
    stopped, path = checkpoint.listed(str(ws))[0]
    assert 0 < stopped < 3000 and path.endswith(f"step{stopped}.h5")
    assert f"stopped on a signal after {stopped} steps (checkpoint {path})" in out
    assert metrics(ws)[-1]["step"] == stopped - 1  # the last batch trained: steps 0..N-1
    resumed = mpi_train(1, conf, ws, "--resume", "--steps", str(stopped + 2))
    assert f"resuming from {path} (step {stopped})" in resumed.stdout
    assert [m["step"] for m in metrics(ws)[-3:]] == [stopped - 1, stopped, stopped + 1]


OUTPUT = 'layer {{ name: "out" type: {kind} srclayers: "fc3" partition_dim: -1 store_conf {{ path: "{path}" }} }}'


def with_output(conf_path, kind="kCSVOutput", path="feat/out.csv"):
    text = open(conf_path).read()
    new = conf_path.replace(".conf", "_out.conf")
    with open(new, "w") as f:
        f.write(text.replace("\n}\n", "\n" + OUTPUT.format(kind=kind, path=path) + "\n}\n"))
    return new


def train_recording_resource_warnings(conf, workspace, **options):
    import gc
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        try:
            code = train(conf, workspace, **options)
        except KeyboardInterrupt:
            code = None
        gc.collect()
    return code, [w for w in caught if issubclass(w.category, ResourceWarning)]


@pytest.mark.parametrize("kind, path", [("kCSVOutput", "feat/out.csv"), ("kRecordOutput", "feat/out.bin")])
def test_output_layers_need_no_batchsize_and_close_their_files(tmp_path, kind, path):
    from singa_mpi.data.stores import open_store

    conf = with_output(job_file(tmp_path, steps=6), kind, path)
    code, leaked = train_recording_resource_warnings(conf, tmp_path / "ws")
    assert code == 0 and not leaked, [str(w.message) for w in leaked]
    backend = "textfile" if kind == "kCSVOutput" else "kvfile"
    options = {"has_label": False} if kind == "kCSVOutput" else {}
    with open_store(backend, str(tmp_path / "ws" / path), **options) as store:
        assert len(store) == 6 * 8 and store.shape == (5,)  # every row of every batch, fc3's 5 features


def test_output_files_are_closed_when_training_fails(tmp_path, monkeypatch):
    from singa_mpi import trainer as training

    def fail_at_step_2(self, step, phase, metrics, samples_per_s=None):
        if step == 2:
            raise KeyboardInterrupt
    monkeypatch.setattr(training.Trainer, "record", fail_at_step_2)
    conf = with_output(job_file(tmp_path, steps=6))
    code, leaked = train_recording_resource_warnings(conf, tmp_path / "ws")
    assert code is None and not leaked, [str(w.message) for w in leaked]
    assert len((tmp_path / "ws" / "feat" / "out.csv").read_text().splitlines()) == 3 * 8


def test_an_output_batchsize_must_agree_with_the_input_batch(tmp_path):
    from singa_mpi.checks.job import validate
    from singa_mpi.config.load import load_job
    from singa_mpi.errors import ConfigError

    conf = with_output(job_file(tmp_path))
    for size, ok in ((8, True), (3, False)):
        text = open(conf).read().replace('path: "feat/out.csv"', f'path: "feat/out.csv" batchsize: {size}')
        path = tmp_path / f"b{size}.conf"
        path.write_text(text)
        if ok:
            validate(load_job(str(path)))
        else:
            with pytest.raises(ConfigError, match="layer 'out'.*batchsize = 3: expected 8, the batch size of input"):
                validate(load_job(str(path)))
