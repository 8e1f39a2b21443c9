"""The launcher: `singa-mpi test` under mpiexec runs the test phase once, partitioned; runs end clean."""
import json
import re
import subprocess
import sys

import numpy as np
import pytest

from checkpoint_jobs import ROOT, job_file, train
from mpi_jobs import mpi_env, mpiexec_command

TEST_PHASE = "\ntest_steps: 3\ntest_freq: 100\n"


def _cli(n, *args, timeout=300):
    prefix = mpiexec_command(n) if n else []
    result = subprocess.run(prefix + [sys.executable, "-m", "singa_mpi", *args], cwd=ROOT, env=mpi_env(),
                            capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def _test_entries(workspace, name="metrics.jsonl"):
    path = workspace / name
    lines = path.read_text().splitlines() if path.exists() else []
    return [entry for entry in map(json.loads, lines) if entry["phase"] == "test"]


@pytest.mark.slow
def test_test_command_under_mpiexec_runs_the_test_phase_once_partitioned(tmp_path):
    conf = job_file(tmp_path, "feature", steps=6, extra=TEST_PHASE)
    workspace = tmp_path / "ws"
    assert train(conf, workspace) == 0
    training_record = (workspace / "metrics.jsonl").read_text()
    serial = _cli(0, "test", conf, "--workspace", str(workspace))
    parallel = _cli(2, "test", conf, "--workspace", str(workspace))
    printed = [line for line in parallel.stdout.splitlines() if " test " in line]
    assert len(printed) == 1, parallel.stdout  # one test, printed by one rank
    used = workspace / "checkpoint" / "step6.h5"
    for result in (serial, parallel):  # which checkpoint was tested, said once
        assert result.stdout.count(f"testing {used} (step 6)") == 1, result.stdout
    assert (workspace / "metrics.jsonl").read_text() == training_record  # no duplicate of the final test
    entries = _test_entries(workspace, "test_results.jsonl")
    assert len(entries) == 2  # the serial test and the partitioned one, one line each
    serial_entry, parallel_entry = entries[-2], entries[-1]
    assert serial_entry["step"] == parallel_entry["step"] == 6
    assert serial_entry["checkpoint"] == parallel_entry["checkpoint"] == str(used)
    assert np.isclose(serial_entry["loss"], parallel_entry["loss"], rtol=1e-5, atol=0)
    assert np.isclose(serial_entry["accuracy"], parallel_entry["accuracy"])
    assert " test " in serial.stdout


@pytest.mark.slow
def test_pipeline_run_ends_without_leftover_mpi_objects(tmp_path):
    """Bridges' last sends are completed and every communicator made for the run is freed, so
    MPI_Finalize has nothing to complain about."""
    conf = job_file(tmp_path, "pipeline", steps=4, extra=TEST_PHASE)
    result = _cli(3, "train", conf, "--workspace", str(tmp_path / "ws"))
    assert "pending" not in result.stderr.lower() and "leak" not in result.stderr.lower(), result.stderr


# ------------------------------------------------------------------ launcher mix-ups

@pytest.mark.parametrize("environ,refused", [
    ({}, None),  # a plain serial run
    ({"PMI_SIZE": "1", "PMI_RANK": "0"}, None),  # mpiexec -n 1
    ({"PMI_SIZE": "2", "PMI_RANK": "0"}, "PMI_SIZE=2"),
    ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "0"}, "OMPI_COMM_WORLD_SIZE=4"),
    ({"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0", "SLURM_STEP_ID": "0"}, "SLURM_STEP_NUM_TASKS=2"),
    ({"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0"}, None),  # the batch script itself, no srun step
])
def test_a_world_of_one_under_a_launcher_of_n_is_refused(environ, refused):
    from singa_mpi.errors import ConfigError
    from singa_mpi.launcher.start import refuse_launcher_mix_up

    if refused is None:
        refuse_launcher_mix_up(environ, "MPICH Version: 5.0.2")
        return
    with pytest.raises(ConfigError) as err:
        refuse_launcher_mix_up(environ, "Open MPI v4.1.4")
    assert refused in str(err.value) and "Open MPI v4.1.4" in str(err.value) and "\n" not in str(err.value)
    other = {k: ("1" if k in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID") else v) for k, v in environ.items()}
    with pytest.raises(SystemExit) as quiet:  # every other process: the same code, no second line
        refuse_launcher_mix_up(other, "Open MPI v4.1.4")
    assert quiet.value.code == 2


@pytest.mark.parametrize("environ, refused", [
    ({"PMI_SIZE": "2", "PMI_RANK": "0"}, "mpiexec as 2 processes (PMI_SIZE=2)"),
    ({"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "0"}, "mpirun as 4 processes (OMPI_COMM_WORLD_SIZE=4)"),
    ({"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0", "SLURM_STEP_ID": "0"}, "srun as 2 processes"),
    ({"SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": "0"}, None),  # the batch script itself: run's place
    ({"PMI_SIZE": "1", "PMI_RANK": "0"}, None),  # one process: one supervisor, one job
])
def test_run_under_a_launcher_of_n_is_refused(environ, refused):
    from singa_mpi.errors import ConfigError
    from singa_mpi.launcher.start import refuse_launched_run

    if refused is None:
        refuse_launched_run(environ)
        return
    with pytest.raises(ConfigError) as err:
        refuse_launched_run(environ)
    assert str(err.value).startswith(f"run: started by {refused}") and "\n" not in str(err.value)
    other = {k: ("1" if k in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID") else v) for k, v in environ.items()}
    with pytest.raises(SystemExit) as quiet:  # every other process: the same code, no second line
        refuse_launched_run(other)
    assert quiet.value.code == 2


@pytest.mark.slow
def test_run_nested_in_mpiexec_is_one_line_not_n_jobs(tmp_path):
    """`mpiexec -n 2 singa-mpi run -n 2 JOB`: each of the 2 processes started a supervisor and a 2-rank
    job of its own, both into one workspace, and the launch ended with exit 0."""
    job = str(ROOT / "conf" / "digits_mlp.conf")
    cmd = mpiexec_command(2) + [sys.executable, "-m", "singa_mpi", "run", "-n", "2", job, "--workspace",
                                str(tmp_path / "ws"), "--steps", "5"]
    done = subprocess.run(cmd, cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert lines[0].startswith("singa-mpi: error: run: started by ") and "python -m singa_mpi train JOB" in lines[0]
    assert not (tmp_path / "ws").exists() and "Traceback" not in done.stdout


def test_mpich_launcher_with_mpi4py_on_open_mpi_is_one_line_exit_2(tmp_path):
    """The cluster mix-up of the issue: MPICH's mpiexec first on PATH, mpi4py loading Open MPI. It ran
    N serial copies of the job into one workspace, exit 0."""
    from singa_mpi.communication.launchers import LauncherNotFound, find_launcher

    try:
        mpich, open_mpi = find_launcher("mpich"), find_launcher("openmpi")
    except LauncherNotFound as err:
        pytest.skip(f"needs both MPIs: {err}")
    env = open_mpi.environ(OMP_NUM_THREADS="1")  # mpi4py on Open MPI...
    job = str(ROOT / "conf" / "digits_mlp.conf")
    cmd = mpich.command(2) + [sys.executable, "-m", "singa_mpi", "train", job, "--workspace", str(tmp_path / "ws")]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)  # ...under hydra
    errors = [line for line in done.stderr.splitlines() if line.startswith("singa-mpi: error:")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr[-2000:]
    assert "PMI_SIZE=2" in errors[0] and "Open MPI" in errors[0]
    assert not (tmp_path / "ws").exists()


# ------------------------------------------------------------------ what the first step would meet (#36)

def _first_batch_job(tmp_path, labels: int, extra: str = ""):
    import nets
    from singa_mpi.config.load import load_job

    store = nets.make_data(str(tmp_path / f"labels{labels}.h5"), 100, (12,), labels)
    conf = tmp_path / f"job{labels}.conf"
    conf.write_text(nets.mlp(store, 32, "data") + extra)
    return load_job(str(conf)), store


def _first_batch_refusal(cfg, tmp_path, backend: str, store: str) -> tuple[str, str]:
    """The one line the check before training refuses ``cfg`` with, its stores pointed at ``store`` (of
    ``backend``), and the file that line should name (a DataShard folder's shard.dat)."""
    from singa_mpi.errors import DataError
    from singa_mpi.launcher.checks import check_first_batches

    for layer in cfg.proto.neuralnet.layer:
        if layer.HasField("store_conf"):
            layer.store_conf.backend, layer.store_conf.path = backend, store
    with pytest.raises(DataError) as err:
        check_first_batches(cfg, str(tmp_path), ["train"])
    return str(err.value), store if backend == "kvfile" else f"{store}/shard.dat"


def test_the_first_batch_of_every_phase_is_read_before_any_communication(tmp_path):
    """Phase 1's look at the data (every rank, before the vote): the loss's labels of the first global
    batch are checked, and the message names the store they came from."""
    from singa_mpi.errors import DataError
    from singa_mpi.launcher.checks import check_first_batches

    cfg, _ = _first_batch_job(tmp_path, 5)
    check_first_batches(cfg, str(tmp_path), ["train"])  # 5 classes for a net of 5: nothing to say
    cfg, store = _first_batch_job(tmp_path, 50)
    with pytest.raises(DataError) as err:
        check_first_batches(cfg, str(tmp_path), ["train"])
    assert "layer 'loss': label" in str(err.value) and "expected a class index in 0..4" in str(err.value)
    assert f"in the first batch of layer 'data' read from {store}" in str(err.value)


def _char_rnn_job(tmp_path, vocab_size: int):
    import nets

    text, vocab = nets.text_data(str(tmp_path / "text"))
    job = nets.char_rnn(text, vocab, 4, "data", steps=2)
    size = len(open(vocab, "rb").read())
    assert job.count(f"vocab_size: {size} ") == 1
    conf = tmp_path / f"charrnn{vocab_size}.conf"
    conf.write_text(job.replace(f"vocab_size: {size} ", f"vocab_size: {vocab_size} "))
    return conf, size


def test_a_vocab_size_below_the_texts_ids_is_named_with_its_field_before_training(tmp_path):
    """A kOneHot of vocab_size 3 on a text of more symbols passed check (check reads no data) and ended
    step 0 with "layer '0#onehot': id 7 outside the vocabulary 0..2", naming no file, line or field."""
    from singa_mpi.config.load import load_job
    from singa_mpi.errors import ConfigError
    from singa_mpi.launcher.checks import check_first_batches

    conf, size = _char_rnn_job(tmp_path, 3)
    with pytest.raises(ConfigError) as err:
        check_first_batches(load_job(str(conf)), str(tmp_path), ["train"])
    line = next(n for n, text in enumerate(conf.read_text().splitlines(), 1) if "vocab_size: 3 " in text)
    assert re.fullmatch(rf"{re.escape(str(conf))}:{line}:\d+: layer '0#onehot' \(#1, kOneHot\): "
                        rf"onehot_conf.vocab_size = 3: expected at least {size}: the text \S+input.txt \(read by "
                        rf"layer 'data', its vocabulary \S+vocab.txt\) holds ids up to {size - 1}", str(err.value))
    conf, _ = _char_rnn_job(tmp_path, size)
    check_first_batches(load_job(str(conf)), str(tmp_path), ["train"])  # the vocabulary's own size: fine


def test_a_vocab_size_below_the_texts_ids_is_one_line_from_two_ranks(tmp_path):
    conf, size = _char_rnn_job(tmp_path, 3)
    result = subprocess.run(mpiexec_command(2) + [sys.executable, "-m", "singa_mpi", "train", str(conf),
                                                  "--workspace", str(tmp_path / "ws")],
                            cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "onehot_conf.vocab_size = 3: expected at least" in lines[0], result.stderr
    assert "Traceback" not in result.stdout + result.stderr and "step" not in result.stdout


def test_an_output_layer_narrower_than_the_texts_ids_is_named_with_its_field_before_training(tmp_path):
    """ip1's num_output below the ids of the text that kRNNLabel labels with: only the first batch's labels
    were checked, as "layer '0#loss': label N: expected a class index in 0..K", naming no file, line or
    field (or, past the first batch, a later step ended)."""
    from singa_mpi.config.load import load_job
    from singa_mpi.errors import ConfigError
    from singa_mpi.launcher.checks import check_first_batches

    conf, size = _char_rnn_job(tmp_path, 0)
    job = conf.read_text().replace("vocab_size: 0 ", f"vocab_size: {size} ")
    assert job.count(f"num_output: {size} ") == 1
    conf.write_text(job.replace(f"num_output: {size} ", f"num_output: {size - 1} "))
    with pytest.raises(ConfigError) as err:
        check_first_batches(load_job(str(conf)), str(tmp_path), ["train"])
    line = next(n for n, text in enumerate(conf.read_text().splitlines(), 1) if f"num_output: {size - 1} " in text)
    assert re.fullmatch(rf"{re.escape(str(conf))}:{line}:\d+: layer '0#ip1' \(#4, kInnerProduct\): "
                        rf"innerproduct_conf.num_output = {size - 1}: expected at least {size}: layer '0#loss' scores "
                        rf"its {size - 1} outputs as classes of the labels of layer '0#label', and the text "
                        rf"\S+input.txt \(its vocabulary \S+vocab.txt\) holds ids up to {size - 1}", str(err.value))


def test_records_of_another_shape_name_the_jobs_shape_field(tmp_path):
    """`store_conf.shape: 13` for records of 12 values said "layer 'data': STORE: records of shape (12,),
    but store_conf.shape is (13,)": no file:line of the field, nothing about what to change."""
    cfg, store, index, line = first_batch_refusal(tmp_path, "shape: 12", "shape: 13")
    assert line == (f"{cfg.layer_where(index, 'store_conf', 'shape')}: layer 'data': {store}: records of "
                    f"shape (12,), but store_conf.shape is (13,): expected a shape whose sizes multiply "
                    f"to 12, the values in each record, or another store")
    assert line.startswith(f"{cfg.path}:")


def first_batch_refusal(tmp_path, old: str, new: str):
    """(the job, its HDF5 store, the data layer's index, the DataError's line) of the launcher's look at
    the first batch of tests/nets.py's MLP over 100 rows of 12 values, its text's ``old`` made ``new``."""
    import nets
    from singa_mpi.config.load import load_job
    from singa_mpi.errors import DataError
    from singa_mpi.launcher.checks import check_first_batches

    store = nets.make_data(str(tmp_path / "data.h5"), 100, (12,), 5)
    conf = tmp_path / "job.conf"
    conf.write_text(nets.mlp(store, 32, "data").replace(old, new))
    cfg = load_job(str(conf))
    index = next(k for k, layer in enumerate(cfg.proto.neuralnet.layer) if layer.name == "data")
    with pytest.raises(DataError) as err:
        check_first_batches(cfg, str(tmp_path), ["train"])
    return cfg, store, index, str(err.value)


def test_a_store_of_another_backend_names_the_jobs_backend_field(tmp_path):
    """An HDF5 store named `backend: "kvfile"` said the file was damaged (a key length at byte 0)."""
    cfg, store, index, line = first_batch_refusal(tmp_path, 'backend: "hdf5"', 'backend: "kvfile"')
    assert line == (f"{cfg.layer_where(index, 'store_conf', 'backend')}: layer 'data': {store}: an HDF5 "
                    f"file, read with backend \"kvfile\": expected backend \"hdf5\" for it (or another "
                    f"file at this path)")


def test_testing_before_any_training_says_which_workspace_to_name(tmp_path):
    """`singa-mpi train --workspace runs/digits` then `singa-mpi test JOB` (the job's own workspace, empty)
    said "expected `--checkpoint FILE` or a trained workspace", not how to name the one it trained in."""
    from singa_mpi.errors import DataError
    from singa_mpi.test_command import run_test

    conf = job_file(tmp_path, steps=1, extra=TEST_PHASE)
    with pytest.raises(DataError) as err:
        run_test(conf, lambda cfg: str(tmp_path / "empty"))
    assert str(err.value) == (f"{tmp_path / 'empty'}: no checkpoint found: expected `--checkpoint FILE` or the "
                              f"--workspace of a trained run (`singa-mpi train JOB --workspace WS` writes "
                              f"WS/checkpoint/step<N>.h5)")


@pytest.mark.parametrize("label", [12, 2.5, 2 ** 31 - 1, 16711681.0])
def test_a_bad_label_past_the_first_batch_is_named_with_its_file_and_record_before_training(tmp_path, label):
    """An HDF5 store's labels are read whole before training (cheap beside its records): a label out
    of the loss's classes, or a fraction (read as an int it was cut to 2), ended some later step
    without naming the file or the record.  The label is given as stored: 2147483647 was "2.14748e+09",
    a float 16711681 (a flipped byte) "1.67117e+07", numbers a user could not look for."""
    import h5py

    from singa_mpi.errors import DataError
    from singa_mpi.launcher.checks import check_first_batches

    cfg, store = _first_batch_job(tmp_path, 5)
    with h5py.File(store, "r+") as f:
        labels = f["label"][()].astype(np.float64)
        labels[90] = label  # not in the first batch of 32 (the job's seeded shuffle leaves it out)
        del f["label"]
        f["label"] = labels if label != int(label) else labels.astype(np.int32)
    with pytest.raises(DataError) as err:
        check_first_batches(cfg, str(tmp_path), ["train"])
    assert str(err.value) == (f"{store}: record 90: label {int(label) if label == int(label) else label}: expected a "
                              f"class index in 0..4 (layer 'loss' scores 5 classes)")


@pytest.mark.parametrize("big", [False, True])
@pytest.mark.parametrize("backend", ["kvfile", "shard"])
def test_a_bad_kvfile_label_past_the_first_batch_is_named_before_training(tmp_path, backend, big, monkeypatch):
    """A kvfile's (or DataShard's) labels are parsed from every record before training: a label out of the
    loss's classes was found by the step that read it, mid-run, naming neither the file nor the record.
    ``big``: a file over MEMORY_LIMIT, its labels read WALK_RECORDS records at a time (such a file's labels
    went unchecked, the walk that reads them taking 0.05 s for 200 MB)."""
    import h5py

    from singa_mpi.data import stores
    from singa_mpi.data.convert import write_store

    cfg, h5 = _first_batch_job(tmp_path, 5)
    with h5py.File(h5, "r") as f:
        data, labels = f["data"][()], f["label"][()]
    labels[90] = 12  # not in the first batch of 32 (the job's seeded shuffle leaves it out)
    store = write_store(str(tmp_path / f"labels.{backend}"), backend, data, labels)
    if big:
        monkeypatch.setattr(stores, "MEMORY_LIMIT", 1000)  # bytes: the file is some 6 kB
        monkeypatch.setattr(stores, "WALK_RECORDS", 16)  # record 90 in the sixth walk
    message, where = _first_batch_refusal(cfg, tmp_path, backend, store)
    assert message == (f"{where}: record 90: label 12: expected a class index in 0..4 "
                              f"(layer 'loss' scores 5 classes)")


@pytest.mark.parametrize("backend", ["kvfile", "shard"])
def test_a_kvfile_record_without_a_label_is_named_before_training(tmp_path, backend):
    """Record 90 of a labelled kvfile (or DataShard) holds no label: protobuf read it as label 0 and the
    run trained on it without a word; the check before any communication names the record."""
    import h5py

    from singa_mpi.data.convert import write_store
    from singa_mpi.data.shard import DataShardWriter
    from singa_mpi.data.stores import KVFileWriter
    from singa_mpi.proto import job_pb2

    cfg, h5 = _first_batch_job(tmp_path, 5)
    with h5py.File(h5, "r") as f:
        data, labels = f["data"][()], f["label"][()]
    store = write_store(str(tmp_path / f"labels.{backend}"), backend, data, labels)
    with (DataShardWriter if backend == "shard" else KVFileWriter)(store) as writer:  # again, record 90 unlabelled
        for row, values in enumerate(data):
            record = job_pb2.RecordProto(shape=[12], data=values.tolist())
            if row != 90:  # not in the first batch of 32 (the job's seeded shuffle leaves it out)
                record.label = int(labels[row])
            writer.write(f"{row:05d}", record)
    message, where = _first_batch_refusal(cfg, tmp_path, backend, store)
    assert message == (f"{where}: record 90 (key b'00090') has no label, while record 0 has one: expected a "
                              f"label in every record (protobuf reads a missing one as label 0)")


@pytest.mark.parametrize("backend", ["kvfile", "shard"])
def test_a_kvfile_whose_record_0_alone_has_no_label_is_named_so(tmp_path, backend):
    """A store's labels are known by its record 0: one without a label, the others labelled, was refused as
    "PATH has no labels (set store_conf.has_label: false for unlabelled data)", advice that trains on
    none of the labels the file holds; the line now names the record, and the first that has one."""
    from singa_mpi.data.shard import DataShardWriter
    from singa_mpi.data.stores import KVFileWriter
    from singa_mpi.proto import job_pb2

    cfg, _ = _first_batch_job(tmp_path, 5)
    store = str(tmp_path / f"labels.{backend}")
    with (DataShardWriter if backend == "shard" else KVFileWriter)(store) as writer:
        for row in range(40):
            record = job_pb2.RecordProto(shape=[12], data=[float(row)] * 12)
            if row > 2:
                record.label = row % 5
            writer.write(f"{row:05d}", record)
    message, where = _first_batch_refusal(cfg, tmp_path, backend, store)
    assert message == (f"layer 'data': {where}: record 0 (key b'00000') has no label, while record 3 has one: "
                              f"expected a label in every record (or store_conf.has_label: false to read none)")


@pytest.mark.parametrize("backend", ["hdf5", "kvfile"])
def test_a_nan_past_the_first_batch_of_a_store_decoded_whole_is_refused_before_training(tmp_path, backend,
                                                                                        monkeypatch):
    """A NaN or an infinity in a store was found by the step that read it (hours in, perhaps); a store that
    the first read decodes whole is looked at whole before any communication, and refused in one line
    naming the file, the record and what was expected.  --no-check-finite looks at nothing, and a store
    too big to be decoded whole is still left to the check of each batch the training reads."""
    import h5py

    from singa_mpi.data import stores
    from singa_mpi.data.convert import write_store
    from singa_mpi.errors import DataError
    from singa_mpi.launcher.checks import check_first_batches

    cfg, h5 = _first_batch_job(tmp_path, 5)
    with h5py.File(h5, "r+") as f:
        f["data"][90, 7] = np.inf  # not in the first batch of 32 (the job's seeded shuffle leaves it out)
        data, labels = f["data"][()], f["label"][()]
    store = h5
    if backend == "kvfile":
        store = write_store(str(tmp_path / "data.kvfile"), backend, data, labels)
        for layer in cfg.proto.neuralnet.layer:
            if layer.HasField("store_conf"):
                layer.store_conf.backend, layer.store_conf.path = backend, store
    with pytest.raises(DataError) as err:
        check_first_batches(cfg, str(tmp_path), ["train"])
    assert str(err.value) == (f"layer 'data': {store}: record 90, value 7 is inf: expected finite numbers (training "
                              f"would stop at the step that reads it): clean the store (or pass --no-check-finite "
                              f"to train on it anyway)")
    check_first_batches(cfg, str(tmp_path), ["train"], check_finite=False)
    monkeypatch.setattr(stores, "MEMORY_LIMIT", 100 * 12 * 4)  # 100 records of 12 float32: now too big
    check_first_batches(cfg, str(tmp_path), ["train"])


def test_checkpoint_path_is_read_in_phase_one_unless_resume_continues_the_workspace(tmp_path):
    from singa_mpi.errors import DataError
    from singa_mpi.launcher.checks import read_checkpoint_paths

    cfg, _ = _first_batch_job(tmp_path, 5, f'checkpoint_path: "{tmp_path}/pre/checkpoint/step3.h5"\n')
    assert read_checkpoint_paths(_first_batch_job(tmp_path, 5)[0], str(tmp_path / "ws"), resume=False) is None
    with pytest.raises(DataError, match=r"checkpoint_path .*step3\.h5. not found: expected a checkpoint file there"):
        read_checkpoint_paths(cfg, str(tmp_path / "ws"), resume=False)
    with pytest.raises(DataError, match=r"checkpoint_path .*step3\.h5. not found: expected a checkpoint file there"):  # --resume of an empty workspace starts afresh
        read_checkpoint_paths(cfg, str(tmp_path / "ws"), resume=True)


def test_labels_that_a_kLabel_layer_takes_from_a_shard_are_checked_too(tmp_path):
    """SINGA 0.1's pipeline: kShardData -> kLabel -> the loss; the line names the shard."""
    from singa_mpi.data import convert
    from singa_mpi.errors import DataError
    from singa_mpi.launcher.checks import check_first_batches
    from nets import v01_job

    import nets

    shard = str(tmp_path / "shard")
    images = np.random.default_rng(5).integers(0, 256, (17, 8, 8))
    convert.write_store(shard, "shard", images, np.full(17, 7), pixels=True)  # 4 classes in the net
    with pytest.raises(DataError) as err:
        check_first_batches(nets.job(v01_job(shard, fc1="", label="")), str(tmp_path), ["train"])
    assert "label 7: expected a class index in 0..3" in str(err.value), err.value
    assert f"of layer 'data' read from {shard}" in str(err.value), err.value


def test_test_command_on_a_workspace_of_damaged_checkpoints_says_what_it_expects(tmp_path):
    """Every checkpoint damaged: `test` advised a training run's way out ("move them aside to start
    again from step 0"); it says there is none to test and what it expects instead, in one line."""
    conf = job_file(tmp_path, steps=2, extra=TEST_PHASE)
    assert train(conf, tmp_path / "ws") == 0
    for path in (tmp_path / "ws" / "checkpoint").glob("step*.h5"):
        path.write_bytes(path.read_bytes()[:100])
    cmd = [sys.executable, "-m", "singa_mpi", "test", conf, "--workspace", str(tmp_path / "ws")]
    result = subprocess.run(cmd, cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=120)
    errors = [line for line in result.stderr.splitlines() if line.startswith("singa-mpi: error")]
    assert result.returncode == 3 and len(errors) == 1, result.stderr[-2000:]
    assert "every checkpoint there is damaged" in errors[0] and "none to test: expected `--checkpoint FILE`" in \
        errors[0] and "step 0" not in errors[0], errors[0]


@pytest.mark.parametrize("given,said", [
    (["--steps", "2"], "nothing to do: --steps 2 is not beyond the checkpoint's step 4: expected --steps N with N "
                       "above 4 to train further (N counts from step 0)"),
    ([], "nothing to do: the job's train_steps 4 is not beyond the checkpoint's step 4: expected --steps N with N "
         "above 4 to train further (N counts from step 0)"),
])
def test_a_resume_with_no_step_left_says_so_in_the_words_of_the_option_given(tmp_path, capsys, given, said):
    """`--resume --steps 5` at step 700 said "train_steps is 5": an option the user never wrote."""
    from singa_mpi import cli

    conf = job_file(tmp_path, steps=4)
    workspace = tmp_path / "ws"
    assert train(conf, workspace) == 0
    capsys.readouterr()
    assert cli.main(["train", conf, "--workspace", str(workspace), "--resume", *given]) == 0
    assert said in capsys.readouterr().out


def test_fit_words_a_resume_with_no_step_left_as_its_own_argument():
    from singa_mpi.api.run import FIT_SPELLING
    from singa_mpi.launcher import RunOptions
    from singa_mpi.launcher.train import nothing_to_do

    assert nothing_to_do(700, 5, RunOptions(steps=5, spelling=FIT_SPELLING)) == (
        "nothing to do: fit(..., steps=5) is not beyond the checkpoint's step 700: expected fit(..., steps=N) with "
        "N above 700 to train further (N counts from step 0)")


@pytest.mark.parametrize("steps, said", [(4, False), (5, True), (2_000_000_000, True)])
def test_a_test_reading_its_store_over_again_is_warned_once_before_training(tmp_path, steps, said):
    """test_steps 2,000,000,000 (batch 32, 100 records) was taken without a word: each test pass would read
    the store, which wraps around as SINGA's, 640 million times.  Up to one pass (4 batches; the last wraps
    in part, as SINGA's examples' do) nothing is said; beyond it one line at test_steps."""
    import warnings

    from singa_mpi.launcher.checks import check_first_batches

    cfg, store = _first_batch_job(tmp_path, 5, f"test_steps: {steps}\ntest_freq: 10\n")
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        check_first_batches(cfg, str(tmp_path), ["train", "test"])
    lines = [str(warning.message) for warning in shown]
    if not said:
        assert lines == []
        return
    line = cfg.text.splitlines().index(f"test_steps: {steps}") + 1
    assert lines == [f"{cfg.path}:{line}:1: test_steps = {steps}: a test reads {steps:,} batches of 32 = "
                     f"{steps * 32:,} records, and layer 'data' reads {store}, which holds 100: it reads them over "
                     f"again (the store wraps around); expected test_steps <= 4, one pass"]
