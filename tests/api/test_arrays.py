"""In-memory data: numpy arrays as a store (backend ``memory``), read by rows like any store; a
script's arrays train the numbers a file of the same rows trains, on every rank count; bad arrays
raise one ArgumentError naming the layer and the argument; ranks holding different arrays are refused
at launch in one line; a job file cannot carry arrays and says so."""
from __future__ import annotations

import pathlib
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest

import nets
import singa_mpi.api as sm
from mpi_jobs import mpi_env, mpiexec_command
from singa_mpi.errors import DataError, SingaError


def _rows(count: int = 48, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.standard_normal((count, 12)).astype(np.float32), rng.integers(0, 5, count)


def _job(first: sm.Layer) -> sm.Job:
    net = sm.Sequential([first, sm.InnerProduct(8, "fc1", w=sm.Param("w1", sm.Uniform(-0.1, 0.1))), sm.STanh("act"),
                         sm.InnerProduct(5, "fc2", w=sm.Param("w2", sm.Uniform(-0.1, 0.1))),
                         sm.SoftmaxLoss("loss", srcs=["fc2", "data"])])
    return sm.Job("arrays", net, updater=sm.SGD(0.2, momentum=0.9), seed=2, train_steps=9, disp_freq=1)


def test_arrays_train_what_a_store_of_the_same_rows_trains(tmp_path):
    x, y = _rows()
    path = tmp_path / "rows.h5"
    with h5py.File(path, "w") as f:  # the layout singa-mpi's hdf5 stores use (tests/nets.make_data)
        f["data"], f["label"] = x, y.astype(np.int32)
    from_file = _job(sm.RecordInput(str(path), 16, 12, name="data", shuffle=True)).fit(tmp_path / "file")
    from_arrays = _job(sm.RecordInput.from_arrays(x, y, 16, shuffle=True)).fit(tmp_path / "arrays")
    assert from_arrays.metric("loss") == from_file.metric("loss")
    assert len(from_arrays.metric("loss")) == 9


def test_check_looks_for_no_file_for_arrays():
    x, y = _rows()
    assert _job(sm.RecordInput.from_arrays(x, y, 16)).check().warnings == []


def test_predict_gives_the_scores_the_test_phase_measured(tmp_path):
    x, y = _rows(80, seed=3)
    net = sm.Sequential([sm.RecordInput.from_arrays(x[:48], y[:48], 16, phase="train"),
                         sm.RecordInput.from_arrays(x[48:], y[48:], 32, phase="test"),
                         sm.InnerProduct(8, "fc1"), sm.STanh("act"), sm.InnerProduct(5, "fc2"),
                         sm.SoftmaxLoss("loss", srcs=["fc2", "data"])])
    job = sm.Job("predict", net, updater=sm.SGD(0.2, momentum=0.9), seed=2, train_steps=30, disp_freq=10,
                 test_steps=1, test_freq=30)
    tested = job.fit(tmp_path / "ws").last("test")
    scores = job.predict(x[48:], tmp_path / "ws")  # the loss layer's source: fc2
    assert scores.shape == (32, 5)
    assert np.mean(scores.argmax(axis=1) == y[48:]) == pytest.approx(tested["accuracy"], abs=1e-12)
    few = job.predict(x[48:53], tmp_path / "ws", batchsize=2)  # 3 batches, the last one wrapping around
    assert few.shape == (5, 5) and np.allclose(few, scores[:5], rtol=1e-5, atol=1e-6)
    assert job.predict(x[:3], tmp_path / "ws", layer="act").shape == (3, 8)
    with pytest.raises(sm.ArgumentError, match="layer = 'nope': expected one of data, fc1, act, fc2, loss"):
        job.predict(x[:3], tmp_path / "ws", layer="nope")
    with pytest.raises(DataError, match="no checkpoint to predict with"):
        job.predict(x[:3], tmp_path / "elsewhere")
    # rows of another width: the argument named, not the checkpoint blamed for the net x would build
    with pytest.raises(sm.ArgumentError, match=r"predict: argument x of shape \(3, 10\): expected rows of \(12,\)"):
        job.predict(x[:3, :10], tmp_path / "ws")


@pytest.mark.parametrize("x,y,words", [
    (np.zeros(12, np.float32), None, ["argument x of shape (12,)", "one record per row"]),
    ([[1.0, 2.0], [3.0]], None, ["argument x: rows of different lengths", "expected rows of one shape"]),
    (np.zeros((2, 3), np.float32), [[0], [1, 2]], ["argument y: rows of different lengths"]),
    (np.array([["a", "b"]]), None, ["argument x", "dtype <U1", "expected numbers"]),
    (np.zeros((4, 3), np.float32), np.zeros(5, np.int64), ["argument y of shape (5,)", "one integer label per row of x (4,)"]),
    (np.zeros((4, 3), np.float32), np.full(4, 0.5), ["argument y", "dtype float64"]),
    (np.zeros((4, 3), np.float32), np.array([0, 1, -1, 2]), ["argument y holds -1", "labels from 0"]),
    # int32 holds the labels: 2**40 and 2**63 would wrap, training as class 0 (row and value named)
    (np.zeros((48, 3), np.float32), np.where(np.arange(48) == 40, 2 ** 40, 1),
     ["argument y: row 40: label 1099511627776", "up to 2147483647"]),
    (np.zeros((48, 3), np.float32), np.where(np.arange(48) == 40, np.uint64(2 ** 63), np.uint64(1)),
     ["argument y: row 40: label 9223372036854775808"]),
])
def test_bad_arrays_raise_one_line_naming_the_layer_and_the_argument(x, y, words):
    with pytest.raises(sm.ArgumentError) as err:
        sm.RecordInput.from_arrays(x, y, 2, name="data")
    assert str(err.value).startswith("layer 'data' (kRecordInput): ")
    for word in words:
        assert word in str(err.value)


def test_the_memory_store_never_wraps_a_label():
    from singa_mpi.data import memory

    with pytest.raises(ValueError, match=r"row 2: label 4294967296: expected a label int32 holds"):
        memory.register("wide", np.zeros((3, 2), np.float32), np.array([0, 1, 2 ** 32]))
    with pytest.raises(ValueError, match="labels of dtype float64: expected integers"):
        memory.register("halves", np.zeros((2, 2), np.float32), np.array([0.5, 1.0]))


def test_labels_beyond_the_loss_s_classes_stop_the_run_naming_the_layer_and_the_label(tmp_path):
    x, y = _rows()
    y[3] = 7  # five classes; in the first batch, which the script's arrays name by row as they do the others'
    with pytest.raises(SingaError, match=r"^layer 'data': row 3 of its y: label 7: expected a class index in 0..4 "
                                         r"\(layer 'loss' scores 5 classes\)$"):
        _job(sm.RecordInput.from_arrays(x, y, 16)).fit(tmp_path / "ws")
    y[3], y[40] = 0, 7  # past the first batch of 16
    with pytest.raises(SingaError, match=r"^layer 'data': row 40 of its y: label 7: expected a class index"):
        _job(sm.RecordInput.from_arrays(x, y, 16)).fit(tmp_path / "ws2")


def test_a_job_file_cannot_carry_arrays_and_says_so(tmp_path):
    x, y = _rows()
    path = tmp_path / "arrays.conf"
    _job(sm.RecordInput.from_arrays(x, y, 16)).to_conf(path)
    assert 'backend: "memory"' in path.read_text()
    done = subprocess.run([sys.executable, "-m", "singa_mpi", "train", str(path), "--workspace", str(tmp_path / "ws")],
                          cwd=tmp_path, env=mpi_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 3 and "Traceback" not in done.stderr
    assert "no arrays of that name in this process" in done.stderr


SCRIPT = textwrap.dedent('''
    import json, os, sys
    import numpy as np
    import singa_mpi.api as sm

    rank = os.environ.get("PMI_RANK") or os.environ.get("OMPI_COMM_WORLD_RANK") or "0"
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((48, 12)).astype(np.float32), rng.integers(0, 5, 48)
    if sys.argv[2] == "differ" and rank == "1":
        x = x + 1
    net = sm.Sequential([sm.RecordInput.from_arrays(x, y, 16, shuffle=True),
                         sm.InnerProduct(8, "fc1", w=sm.Param("w1", sm.Uniform(-0.1, 0.1)), partition_dim=1),
                         sm.STanh("act"), sm.InnerProduct(5, "fc2", w=sm.Param("w2", sm.Uniform(-0.1, 0.1))),
                         sm.SoftmaxLoss("loss", srcs=["fc2", "data"])], partition_dim=0)
    job = sm.Job("arrays", net, updater=sm.SGD(0.2, momentum=0.9), seed=2, train_steps=9, disp_freq=1)
    history = job.fit(sys.argv[1])
    with open(f"{sys.argv[1]}-rank{rank}.json", "w") as f:
        json.dump([v for _, v in history.metric("loss")], f)
''')


def _script(tmp_path: pathlib.Path, ranks: int, label: str, how: str = "same") -> subprocess.CompletedProcess:
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    prefix = mpiexec_command(ranks) if ranks > 1 else []
    return subprocess.run(prefix + [sys.executable, str(script), str(tmp_path / label), how], cwd=tmp_path,
                          env=mpi_env(), capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_script_s_arrays_train_the_serial_numbers_on_every_rank_count(tmp_path):
    import json

    assert _script(tmp_path, 1, "one").returncode == 0
    serial = json.loads((tmp_path / "one-rank0.json").read_text())
    for ranks in (2, 3):
        done = _script(tmp_path, ranks, f"n{ranks}")
        assert done.returncode == 0, done.stderr[-3000:]
        for rank in range(ranks):
            assert json.loads((tmp_path / f"n{ranks}-rank{rank}.json").read_text()) == pytest.approx(serial, rel=1e-5)


@pytest.mark.slow
def test_ranks_given_different_arrays_are_refused_at_launch_in_one_line(tmp_path):
    done = _script(tmp_path, 2, "differ", "differ")
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if line.startswith("singa-mpi: error")]
    assert len(lines) == 1 and "ranks disagree: layer #0 'data' store_conf" in lines[0]
    assert not (tmp_path / "differ" / "checkpoint").exists() or not any((tmp_path / "differ" / "checkpoint").iterdir())


def test_nets_helper_layout_matches():
    """The hdf5 layout the first test writes by hand is the one tests/nets.py writes."""
    with h5py.File(nets.make_data("/tmp/singa_api_layout.h5", 4, (12,), 5)) as f:
        assert sorted(f) == ["data", "label"]


def test_predict_needs_no_test_input(tmp_path):
    x, y = _rows(48)
    job = _job(sm.RecordInput.from_arrays(x, y, 16, phase="train"))  # a train input alone
    job.fit(tmp_path / "ws")
    assert job.predict(x[:5], tmp_path / "ws").shape == (5, 5)


def test_predict_refuses_rows_of_another_shape_than_a_convnet_s_records(tmp_path):
    """Flat rows of a convnet's record size (4 * 6 * 6 numbers, a 2-D x) were read as images; now the
    argument is refused in one line naming the per-sample shape the net reads."""
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((16, 4, 6, 6)).astype(np.float32), rng.integers(0, 3, 16)
    net = sm.Sequential([sm.RecordInput.from_arrays(x, y, 8), sm.Convolution(2, 3, "conv", pad=1),
                         sm.Pooling(2, "pool"), sm.InnerProduct(3, "fc"), sm.SoftmaxLoss("loss", srcs=["fc", "data"])])
    job = sm.Job("convnet", net, updater=sm.SGD(0.05), seed=1, train_steps=2, disp_freq=1)
    job.fit(tmp_path / "ws")
    assert job.predict(x[:3], tmp_path / "ws").shape == (3, 3)
    for rows in (x[:3].reshape(3, -1), x[:3].reshape(3, 4, 36), x[:3].reshape(3, 6, 6, 4)):
        with pytest.raises(sm.ArgumentError) as err:
            job.predict(rows, tmp_path / "ws")
        assert str(err.value) == (f"predict: argument x of shape {rows.shape}: expected rows of (4, 6, 6) (144 numbers "
                                  f"each), the records input layer 'data' of the trained net reads")


@pytest.mark.parametrize("rows,words", [
    (np.zeros(12, np.float32), "predict: argument x of shape (12,) and dtype float32: expected numbers, one row per "
                               "sample (at least one row; x[None] for a single sample)"),
    (np.zeros((0, 12), np.float32), "predict: argument x of shape (0, 12)"),
    ([[0.0] * 12, [0.0] * 11], "predict: argument x: rows of different lengths"),
])
def test_predict_names_x_when_it_holds_no_rows_of_numbers(tmp_path, rows, words):
    x, y = _rows(16)
    job = _job(sm.RecordInput.from_arrays(x, y, 16))
    job.fit(tmp_path / "ws", steps=1)
    with pytest.raises(sm.ArgumentError) as err:
        job.predict(rows, tmp_path / "ws")
    assert str(err.value).startswith(words), str(err.value)


def test_predict_of_a_layer_that_runs_in_training_alone_names_it(tmp_path):
    """predict builds the test phase's net: a layer of phase train is not in it (a raw KeyError)."""
    x, y = _rows(16)
    net = sm.Sequential([sm.RecordInput.from_arrays(x, y, 16), sm.InnerProduct(5, "fc"),
                         sm.ReLU("side", srcs="fc", phase="train"), sm.SoftmaxLoss("loss", srcs=["fc", "data"])])
    job = sm.Job("train-only-layer", net, updater=sm.SGD(0.1), seed=1, train_steps=1)
    job.fit(tmp_path / "ws")
    with pytest.raises(sm.ArgumentError, match=r"^predict: argument layer = 'side': it runs in training alone: "
                                               r"expected a layer of the test phase's net, one of data, fc, loss$"):
        job.predict(x, tmp_path / "ws", layer="side")


def test_predict_with_a_test_phase_the_job_never_checked_names_the_layer(tmp_path):
    """A job trained without a test whose loss reads a layer of training alone: predict's test-phase
    net failed in the graph's sort with a raw KeyError."""
    x, y = _rows(16)
    net = sm.Sequential([sm.RecordInput.from_arrays(x, y, 16), sm.InnerProduct(5, "fc"),
                         sm.Dropout(0.5, "drop", phase="train"), sm.SoftmaxLoss("loss", srcs=["drop", "data"])])
    job = sm.Job("train-only-source", net, updater=sm.SGD(0.1), seed=1, train_steps=1)
    job.fit(tmp_path / "ws")
    with pytest.raises(sm.ArgumentError, match=r"^predict: the job's test phase: layer 'loss' \(#3, kSoftmaxLoss\): "
                                               r"srclayers\[0\] = 'drop': layer 'drop' is not kept for phase test"):
        job.predict(x, tmp_path / "ws", layer="fc")


def test_a_test_reads_test_steps_batches_on_from_the_last_test_and_round_the_rows(tmp_path):
    """docs/python-api.md: a test of 10 rows in batches of 8 reads rows 0-7, then 8, 9, 0-5, ...; its
    accuracy counts each row once only where batchsize x test_steps is the number of rows."""
    x, y = _rows(40)
    x_test, y_test = _rows(10, seed=3)
    net = sm.Sequential([sm.RecordInput.from_arrays(x, y, 8, phase="train"),
                         sm.RecordInput.from_arrays(x_test, y_test, 8, phase="test"),
                         sm.InnerProduct(5, "fc"), sm.SoftmaxLoss("loss", srcs=["fc", "data"])])
    job = sm.Job("rounds", net, updater=sm.SGD(0.0), seed=1, train_steps=6, disp_freq=2, test_steps=1, test_freq=2)
    tested = job.fit(tmp_path / "ws").metric("accuracy", "test")
    right = job.predict(x_test, tmp_path / "ws").argmax(1) == y_test  # a rate of 0: the params of every test
    read = np.tile(right, 4)  # rows 0-9, 0-9, ...
    assert tested == [(step, pytest.approx(read[8 * k:8 * k + 8].mean())) for k, step in enumerate((0, 2, 4, 6))]
    assert job.evaluate(tmp_path / "ws")["accuracy"] == pytest.approx(read[:8].mean())  # a test of its own: row 0 on
