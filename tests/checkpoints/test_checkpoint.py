"""Checkpoints: exact resume, resume on other rank counts and partitionings, crash safety, damage, signals."""
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import nets
from singa_mpi.checkpoints import hdf5 as checkpoint, tools as ckpt_tools
from singa_mpi.errors import DataError
from singa_mpi.proto import job_pb2
from checkpoint_jobs import ROOT, as_newer_format, final, job_file, mpi_train, train, train_records
from mpi_jobs import launcher, mpi_env, mpiexec_command


def test_exact_resume_is_bitwise(tmp_path):
    conf = job_file(tmp_path)
    assert train(conf, tmp_path / "straight") == 0
    assert train(conf, tmp_path / "split", steps=10) == 0
    assert train(conf, tmp_path / "split", resume=True) == 0
    a, b = final(tmp_path / "straight", 20), final(tmp_path / "split", 20)
    assert sorted(a.params) == sorted(b.params)
    for name in a.params:
        np.testing.assert_array_equal(a.params[name], b.params[name])
        for slot in a.updater[name]:
            np.testing.assert_array_equal(a.updater[name][slot], b.updater[name][slot])
    assert a.readers == b.readers == {"train": {"data": {"batches": 20}}}


def test_the_first_progress_line_after_a_resume_averages_the_steps_of_an_uninterrupted_run(tmp_path):
    """A line every 5 steps, a resume from step 8: the line at step 10 averages steps 6-10 as in the
    run that went straight through (the checkpoint holds the sums of steps 6 and 7)."""
    conf = job_file(tmp_path, disp_freq=5)
    assert train(conf, tmp_path / "straight") == 0
    assert train(conf, tmp_path / "split", steps=8) == 0
    window = final(tmp_path / "split", 8).display_window
    assert window["loss/count"] == 2 * 7 and 0 < window["loss"] < 10 * 2 * 7, window  # 2 steps of 7 rows
    assert train(conf, tmp_path / "split", resume=True) == 0
    assert [r["step"] for r in train_records(tmp_path / "straight")] == [0, 5, 10, 15]
    assert train_records(tmp_path / "split") == train_records(tmp_path / "straight")


def test_interrupted_write_leaves_the_previous_checkpoint(tmp_path):
    conf = job_file(tmp_path, steps=4)
    train(conf, tmp_path / "ws")
    good = final(tmp_path / "ws", 4)
    target = checkpoint.checkpoint_path(str(tmp_path / "ws"), 4)
    with pytest.raises(OSError, match="injected fault"):
        checkpoint.write(target, checkpoint.Checkpoint(step=4, params={k: v * 0 for k, v in good.params.items()}),
                         fault_after=2)
    again = checkpoint.read(target)
    for name in good.params:
        np.testing.assert_array_equal(again.params[name], good.params[name])
    assert not [p for p in os.listdir(os.path.dirname(target)) if ".tmp" in p]


def test_truncated_checkpoint_is_detected_and_resume_falls_back(tmp_path):
    conf = job_file(tmp_path, steps=10, extra="checkpoint_freq: 5\n")
    train(conf, tmp_path / "ws")
    newest = checkpoint.checkpoint_path(str(tmp_path / "ws"), 10)
    size = os.path.getsize(newest)
    with open(newest, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(DataError, match=r"step10\.h5"):
        checkpoint.read(newest)
    with pytest.warns(UserWarning, match=r"skipping damaged checkpoint: .*step10\.h5"):
        assert checkpoint.newest_good(str(tmp_path / "ws")).step == 5
    with pytest.raises(DataError, match=r"step10\.h5: DAMAGED: "):
        ckpt_tools.inspect(newest)


def test_corrupted_dataset_fails_its_checksum(tmp_path):
    import h5py

    conf = job_file(tmp_path, steps=2)
    train(conf, tmp_path / "ws")
    path = checkpoint.checkpoint_path(str(tmp_path / "ws"), 2)
    with h5py.File(path, "r+") as f:
        f["params/w_fc1"][0, 0] += 1
    with pytest.raises(DataError, match="fails its whole-file checksum"):
        checkpoint.read(path)
    with open(path, "rb") as f:  # sealed anew, as if damaged before the write: the dataset's own crc32
        image = checkpoint.seal(f.read())
    with open(path, "wb") as f:
        f.write(image)
    with pytest.raises(DataError, match="params/w_fc1 fails its checksum"):
        checkpoint.read(path)


def test_keep_prunes_old_checkpoints(tmp_path):
    conf = job_file(tmp_path, steps=12, extra="checkpoint_freq: 3\n")
    train(conf, tmp_path / "ws", keep=2)
    assert [step for step, _ in checkpoint.listed(str(tmp_path / "ws"))] == [12, 9]


def test_checkpoint_path_initialises_params_by_name(tmp_path):
    conf = job_file(tmp_path, steps=3)
    train(conf, tmp_path / "pre")
    pre = final(tmp_path / "pre", 3)
    init = job_file(tmp_path, steps=1, name="init",
                    extra=f'checkpoint_path: "{checkpoint.checkpoint_path(str(tmp_path / "pre"), 3)}"\n')
    train(init, tmp_path / "post", steps=0)  # zero steps: the final checkpoint holds the loaded values
    post = final(tmp_path / "post", 0)
    for name in pre.params:
        np.testing.assert_array_equal(post.params[name], pre.params[name])


def test_checkpoint_path_params_it_lacks_keep_their_init_a_misfit_is_an_error(tmp_path):
    """SINGA's stacked-RBM use: a checkpoint initialises the params it holds, the job's own init
    the rest (listed in a note); a param of another shape is an error unless --allow-partial."""
    conf = job_file(tmp_path, steps=1)
    train(conf, tmp_path / "pre")
    path = checkpoint.checkpoint_path(str(tmp_path / "pre"), 1)
    ckpt = checkpoint.read(path)
    w_fc2 = ckpt.params.pop("w_fc2")
    checkpoint.write(path, ckpt)
    init = job_file(tmp_path, steps=1, name="init", extra=f'checkpoint_path: "{path}"\n')
    assert train(init, tmp_path / "fresh", steps=0) == 0
    assert train(init, tmp_path / "post", steps=0) == 0
    started = final(tmp_path / "post", 0)
    np.testing.assert_array_equal(started.params["w_fc1"], ckpt.params["w_fc1"])
    np.testing.assert_array_equal(started.params["w_fc2"], final(tmp_path / "fresh", 0).params["w_fc2"])
    assert not np.array_equal(started.params["w_fc2"], w_fc2)
    ckpt.params["w_fc2"], ckpt.params["b_fc1"] = w_fc2, np.zeros(3, np.float32)
    checkpoint.write(path, ckpt)
    with pytest.raises(DataError, match=r"'b_fc1' has shape \(3,\), the net expects \(16,\) \(use --allow-partial"):
        train(init, tmp_path / "post2", allow_partial=False)  # as `singa-mpi train` without the flag
    assert train(init, tmp_path / "post3", allow_partial=True) == 0


def test_testing_another_nets_checkpoint_names_the_misfit_and_suggests_no_flag_test_lacks(tmp_path):
    """`singa-mpi test` has no --allow-partial (a net tested at its initial values answers nothing):
    its error must not suggest it."""
    from singa_mpi.test_command import run_test

    conf = job_file(tmp_path, steps=1)
    train(conf, tmp_path / "ws")
    other = job_file(tmp_path, steps=1, name="other", extra="test_steps: 1 test_freq: 1\n")
    text = open(other).read()
    with open(other, "w") as f:
        f.write(text.replace("num_output: 16", "num_output: 15", 1))  # fc1: 15 units where the run had 16
    with pytest.raises(DataError) as caught:
        run_test(other, lambda cfg: str(tmp_path / "ws"))
    assert "the net expects (15, 12): expected a checkpoint of this net" in str(caught.value)
    assert "--allow-partial" not in str(caught.value)


@pytest.mark.parametrize("other, reason", [
    ("init.conf", "not a checkpoint: expected a singa_mpi HDF5 checkpoint or SINGA 0.x's BlobProtos file (protobuf: "),
    ("data.h5", "an HDF5 file, but not a singa_mpi checkpoint (no step attribute: a data store, say)")])
def test_a_checkpoint_path_that_is_no_checkpoint_names_the_jobs_line(tmp_path, other, reason):
    """A file of another kind (the job file itself, a data store): one line at the job's
    checkpoint_path entry, exit 3 (it named only the file: with protobuf's words, or, for a data
    store, as a checkpoint whose writing was interrupted)."""
    conf = job_file(tmp_path, steps=1, name="init", extra=f'checkpoint_path: "{tmp_path / other}"\n')
    line = len(open(conf).read().splitlines())
    with pytest.raises(DataError) as caught:
        train(conf, tmp_path / "ws", steps=0)
    assert str(caught.value).startswith(f"{conf}:{line}:1: checkpoint_path '{tmp_path / other}': "
                                        f"{tmp_path / other}: {reason}"), caught.value
    assert caught.value.exit_code == 3


def test_param_without_init_must_come_from_checkpoint_path(tmp_path):
    """SINGA's rbm2.conf names w1 without init: its values can only come from checkpoint_path."""
    from singa_mpi.checks.job import validate
    from singa_mpi.config.load import parse_job
    from singa_mpi.errors import ConfigError

    conf = job_file(tmp_path, steps=1)
    train(conf, tmp_path / "pre")
    path = checkpoint.checkpoint_path(str(tmp_path / "pre"), 1)
    text = open(conf).read()
    no_init = text.replace('name: "w_fc2"  init { type: kGaussian std: 0.3 }', 'name: "w_fc2"', 1)
    assert no_init != text
    with pytest.raises(ConfigError, match=r"param\[0\]\.init = missing: expected init \{ type: \.\.\. \}"):
        validate(parse_job(no_init, "no_init.conf"))
    loaded = tmp_path / "loaded.conf"
    loaded.write_text(no_init + f'checkpoint_path: "{path}"\n')
    assert train(str(loaded), tmp_path / "post", steps=0) == 0
    np.testing.assert_array_equal(final(tmp_path / "post", 0).params["w_fc2"], final(tmp_path / "pre", 1).params["w_fc2"])
    ckpt = checkpoint.read(path)
    del ckpt.params["w_fc2"]
    checkpoint.write(path, ckpt)
    with pytest.raises(DataError, match=r"no parameter 'w_fc2' \(shape \(10, 16\)\): expected it there, as the "
                                        r"job gives it no init"):
        train(str(loaded), tmp_path / "post2", steps=0)


def test_inspect_and_convert_singa_checkpoints(tmp_path):
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4, 3)).astype(np.float32)
    for worker, rows in ((0, w[:2]), (1, w[2:])):  # w1, b1: a feature-partitioned layer's parts
        blobs = job_pb2.BlobProtos(name=["0#w1", "0#b1"], version=[10, 10])
        blobs.blob.add(shape=[2, 3], data=rows.reshape(-1).tolist())
        blobs.blob.add(shape=[2], data=[1.0, 2.0])  # equal parts (SINGA writes no replica twice): joined too
        if worker == 0:  # b0: a data-parallel layer's, written by its owner, worker 0, alone
            blobs.name.append("0#b0")
            blobs.version.append(10)
            blobs.blob.add(shape=[3], data=[7.0, 8.0, 9.0])
        (tmp_path / f"step10-worker{worker}").write_bytes(blobs.SerializeToString())
    out = str(tmp_path / "converted.h5")
    message = ckpt_tools.convert_singa([str(tmp_path / "step10-worker1"), str(tmp_path / "step10-worker0")], out,
                                       shapes={"w1": (4, 3)}, job="job.conf")  # w1's axis: the job's (4, 3)
    assert "3 params" in message and "step 10" in message
    ckpt = checkpoint.read(out)
    np.testing.assert_allclose(ckpt.params["w1"], w)  # feature parts joined in worker order
    np.testing.assert_allclose(ckpt.params["b1"], [1, 2, 1, 2])  # once taken for one replica: [1, 2]
    np.testing.assert_allclose(ckpt.params["b0"], [7, 8, 9])
    text = ckpt_tools.inspect(out)
    assert "step 10" in text and "w1" in text and "[4, 3]" in text and "checksums OK" in text


def test_ckpt_commands_refuse_what_they_would_ignore_or_destroy(tmp_path, capsys):
    """convert replaced an existing --out (a run's own checkpoint) without a word, took one worker's file
    twice, and wrote a checkpoint of no params from an empty file; inspect ignored a second file."""
    from singa_mpi import cli

    blobs = job_pb2.BlobProtos(name=["0#b1"], version=[10])
    blobs.blob.add(shape=[2], data=[1.0, 2.0])
    (tmp_path / "step10-worker0").write_bytes(blobs.SerializeToString())
    (tmp_path / "step10-worker1").write_bytes(b"")
    out = tmp_path / "out.h5"
    out.write_bytes(b"a run's checkpoint")
    convert = ["ckpt", "convert", str(tmp_path / "step10-worker0"), "--out", str(out)]
    assert cli.main(convert) == 2 and f"--out {out} exists" in capsys.readouterr().err
    assert out.read_bytes() == b"a run's checkpoint"
    assert cli.main(convert + ["--overwrite"]) == 0 and checkpoint.read(str(out)).params["b1"].shape == (2,)
    assert cli.main(convert[:3] + convert[2:] + ["--overwrite"]) == 2
    assert "a file given twice" in capsys.readouterr().err
    assert cli.main(["ckpt", "convert", str(tmp_path / "step10-worker1"), "--out", str(tmp_path / "e.h5")]) == 3
    assert "no parameters" in capsys.readouterr().err and not (tmp_path / "e.h5").exists()
    assert cli.main(["ckpt", "inspect", str(out), str(tmp_path / "nope.h5")]) == 2
    assert "expected one checkpoint" in capsys.readouterr().err
    assert cli.main(["ckpt", "inspect", str(tmp_path)]) == 3
    assert "a folder: expected a checkpoint file" in capsys.readouterr().err
    assert cli.main(["ckpt", "convert", str(out), "--out", str(tmp_path / "again.h5")]) == 3
    assert "an HDF5 file (a singa_mpi checkpoint needs no conversion)" in capsys.readouterr().err


def test_ckpt_convert_on_a_disk_that_refuses_names_its_own_option(tmp_path, monkeypatch, capsys):
    """A full disk under `ckpt convert` advised a training run's way out: --keep, another --workspace,
    and --resume from the previous checkpoints, none of which the command has."""
    import errno

    from singa_mpi import cli

    blobs = job_pb2.BlobProtos(name=["0#b1"], version=[10])
    blobs.blob.add(shape=[2], data=[1.0, 2.0])
    (tmp_path / "step10-worker0").write_bytes(blobs.SerializeToString())

    def full(path, image):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "_write_durably", full)
    assert cli.main(["ckpt", "convert", str(tmp_path / "step10-worker0"), "--out", str(tmp_path / "x.h5")]) == 3
    err = capsys.readouterr().err.strip()
    assert "No space left on device: the disk is full: free space there or choose another --out" in err, err
    assert "--workspace" not in err and "--resume" not in err and "--keep" not in err and "\n" not in err


def test_no_pickle_in_checkpoint_code():
    for module in ("checkpoints/hdf5.py", "checkpoints/tools.py", "checkpoints/snapshot.py"):
        source = (ROOT / "singa_mpi" / module).read_text()
        assert "pickle" not in source.replace("never unpickles", ""), module


# ------------------------------------------------------------------ under MPI

@pytest.mark.slow
def test_resume_across_rank_counts_and_partitionings(tmp_path):
    """6 steps on 1 rank (batch split), 2 ranks (features split), 3 ranks (hybrid), 3 ranks (pipeline)."""
    confs = {s: job_file(tmp_path, s, steps=24, name=s) for s in ("data", "feature", "hybrid", "pipeline")}
    assert train(confs["data"], tmp_path / "serial") == 0
    ws = tmp_path / "moving"
    mpi_train(1, confs["data"], ws, "--steps", "6")
    out = mpi_train(2, confs["feature"], ws, "--steps", "12", "--resume")
    assert "different partitioning" in out.stdout and "workers: 1 -> 2" in out.stdout
    mpi_train(3, confs["hybrid"], ws, "--steps", "18", "--resume")
    mpi_train(3, confs["pipeline"], ws, "--resume")
    reference, moved = final(tmp_path / "serial", 24), final(ws, 24)
    for name, value in reference.params.items():
        scale = max(float(np.abs(value).max()), 1e-6)
        assert float(np.abs(moved.params[name] - value).max()) / scale < 1e-5, name


@pytest.mark.slow
def test_exact_resume_on_the_same_ranks_is_bitwise(tmp_path):
    conf = job_file(tmp_path, "feature", steps=16, disp_freq=3)  # the resume at 8 falls inside a line's steps
    mpi_train(2, conf, tmp_path / "straight")
    mpi_train(2, conf, tmp_path / "split", "--steps", "8")
    mpi_train(2, conf, tmp_path / "split", "--resume")
    a, b = final(tmp_path / "straight", 16), final(tmp_path / "split", 16)
    for name in a.params:
        np.testing.assert_array_equal(a.params[name], b.params[name])
    assert train_records(tmp_path / "split") == train_records(tmp_path / "straight")


@pytest.mark.parametrize("nranks", [1, 2])
@pytest.mark.slow
def test_sigterm_checkpoints_and_the_resumed_run_continues_the_curve(tmp_path, nranks):
    total = 3000
    conf = job_file(tmp_path, steps=total)
    reference = tmp_path / "reference"
    mpi_train(nranks, conf, reference)
    ws = tmp_path / "ws"
    env = mpi_env()
    cmd = mpiexec_command(nranks) + [sys.executable, "-m", "singa_mpi", "train", conf, "--workspace", str(ws)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics = ws / "metrics.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and (not metrics.exists() or metrics.read_text().count("\n") < 20):
        time.sleep(0.05)
    proc.send_signal(signal.Signals[launcher().stop_signal])  # SIGTERM to MPICH's mpiexec, SIGUSR1 to Open MPI's
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == checkpoint.EXIT_CHECKPOINTED, err[-2000:]
    stopped = checkpoint.listed(str(ws))[0][0]
    assert 0 < stopped < total
    mpi_train(nranks, conf, ws, "--resume")
    ref_lines = [line for line in (reference / "metrics.jsonl").read_text().splitlines() if '"train"' in line]
    got_lines = [line for line in metrics.read_text().splitlines() if '"train"' in line]
    strip = lambda line: {k: v for k, v in __import__("json").loads(line).items()  # noqa: E731
                          if k in ("step", "loss", "accuracy")}
    assert [strip(x) for x in got_lines][-(total - stopped):] == [strip(x) for x in ref_lines][stopped:]


def test_updater_counters_survive_two_resumes_where_a_rank_updates_no_chunk_of_a_param(tmp_path):
    """On 3 ranks a param of 2 rows (fc2's) has node-shared chunks on 2 of them: the third restored its
    counter, never advanced it, and its stale count, gathered last, overwrote the others' in the next
    checkpoint, so textbook Adam's step went wrong after a second resume."""
    rule = "updater { " + nets.UPDATER_RULES["adam-bias-corrected"] + " learning_rate { type: kFixed base_lr: 0.01 } }"
    conf = job_file(tmp_path, steps=6)
    text = re.sub(r"updater \{[^}]*\{[^}]*\} \}", rule, open(conf).read()).replace("num_output: 10", "num_output: 2")
    assert rule in text
    open(conf, "w").write(text)
    for steps in (2, 4, 6):
        mpi_train(3, conf, tmp_path / "ws", "--steps", str(steps), *(["--resume"] if steps > 2 else []))
    mpi_train(3, conf, tmp_path / "whole")
    assert final(tmp_path / "ws", 6).counters == {name: {"steps": 6} for name in final(tmp_path / "ws", 6).params}
    for name, value in final(tmp_path / "whole", 6).params.items():
        np.testing.assert_allclose(final(tmp_path / "ws", 6).params[name], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_resuming_with_another_updater_resumes_the_params_and_starts_its_state_afresh(tmp_path, capsys):
    """A checkpoint of SGD with momentum resumed by a job that now uses Adam: SGD's momentum history was
    loaded as Adam's first moment, silently.  Now one warning, and Adam starts as from no state."""
    conf = job_file(tmp_path, steps=2)
    assert train(conf, tmp_path / "ws") == 0
    assert final(tmp_path / "ws", 2).updater  # SGD's momentum history is in it
    shutil.copytree(tmp_path / "ws", tmp_path / "fresh")
    start = final(tmp_path / "fresh", 2)
    start.updater, start.counters = {}, {}  # what Adam must start from
    checkpoint.write(checkpoint.checkpoint_path(str(tmp_path / "fresh"), 2), start)
    adam = tmp_path / "adam.conf"
    adam.write_text(open(conf).read().replace("type: kSGD momentum: 0.9", "type: kAdam adam_conf { beta1: 0.9 beta2: 0.99 }"))
    capsys.readouterr()
    assert train(str(adam), tmp_path / "ws", resume=True, steps=4) == 0
    said = [line for line in capsys.readouterr().out.splitlines() if "updater" in line]
    assert said == [f"warning: {checkpoint.checkpoint_path(str(tmp_path / 'ws'), 2)}: written with updater kSGD, "
                    f"this job uses kAdam: the params are resumed, kAdam's state starts afresh (kSGD's state means "
                    f"something else to it)"], said
    assert train(str(adam), tmp_path / "fresh", resume=True, steps=4) == 0
    resumed, expected = final(tmp_path / "ws", 4), final(tmp_path / "fresh", 4)
    for name in expected.params:
        np.testing.assert_array_equal(resumed.params[name], expected.params[name], err_msg=name)
        for slot in expected.updater[name]:
            np.testing.assert_array_equal(resumed.updater[name][slot], expected.updater[name][slot], err_msg=name)
    capsys.readouterr()
    assert train(str(adam), tmp_path / "ws", resume=True, steps=6) == 0  # the same updater: no word, state kept
    assert "updater" not in capsys.readouterr().out


def _transposed_job(tmp_path) -> str:
    """A job whose InnerProduct ``fc`` (3 inputs, 4 outputs) stores its weight (in, out): transpose: true."""
    import nets

    data = nets.make_data(str(tmp_path / "data.h5"), 16, (3,), 4)
    layers = [nets._data_layer(data, 4, (3,)), nets._ip("fc", "data", 4, transpose=True), nets._loss("fc")]
    path = tmp_path / "transposed.conf"
    path.write_text(nets.job_text(layers))
    return str(path)


def test_convert_joins_a_transposed_weights_parts_on_the_axis_the_job_gives(tmp_path, capsys):
    """SINGA cuts a feature-partitioned InnerProduct's weight along its outputs: axis 1 of a (in, out)
    weight (transpose: true), which its files do not record.  `ckpt convert` joined every param's parts
    on axis 0: w_fc came out (6, 2) instead of (3, 4).  With --job (the job that wrote them) each param's
    shape tells the axis; without it, parts of two axes are refused in one line."""
    from singa_mpi import cli

    w = np.arange(12, dtype=np.float32).reshape(3, 4)  # (in, out)
    for worker in (0, 1):
        blobs = job_pb2.BlobProtos(name=["0#w_fc", "0#b_fc"], version=[10, 10])
        part = w[:, 2 * worker:2 * worker + 2]
        blobs.blob.add(shape=list(part.shape), data=part.reshape(-1).tolist())
        blobs.blob.add(shape=[2], data=[worker, worker])
        (tmp_path / f"step10-worker{worker}").write_bytes(blobs.SerializeToString())
    files = [str(tmp_path / "step10-worker0"), str(tmp_path / "step10-worker1")]
    out = tmp_path / "converted.h5"
    assert cli.main(["ckpt", "convert", *files, "--out", str(out)]) == 3
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "param 'w_fc' comes in parts" in err and "transpose: true" in err, err
    assert err.endswith("expected --job JOB.conf, the job that wrote them, to tell") and not out.exists()
    job = _transposed_job(tmp_path)
    assert cli.main(["ckpt", "convert", *files, "--out", str(out), "--job", job]) == 0
    np.testing.assert_array_equal(checkpoint.read(str(out)).params["w_fc"], w)
    np.testing.assert_array_equal(checkpoint.read(str(out)).params["b_fc"], [0, 0, 1, 1])
    # a job's checkpoint_path naming SINGA's files joins them to that job's shapes
    from singa_mpi.launcher.checks import merged_checkpoint_paths
    from singa_mpi.config.load import load_job

    with open(job, "a") as f:
        f.write(f'checkpoint_path: "{files[0]}"\n')
    np.testing.assert_array_equal(merged_checkpoint_paths(load_job(job)).params["w_fc"], w)


def test_a_checkpoint_moves_each_group_s_reader_position_by_the_steps_it_trained():
    """Group 0's training reader state, with the steps each group trained in the run (Downpour's
    servers count them): each other group's ahead<g> moves by its steps beyond group 0's."""
    from singa_mpi.checkpoints.snapshot import paced

    state = {"batches": 10, "groups": 3, "ahead1": 4}
    assert paced(state, [6, 4, 9]) == {"batches": 10, "groups": 3, "ahead1": 2, "ahead2": 3}
    assert paced(state, [6, 2, 6]) == {"batches": 10, "groups": 3}  # group 1 fell back to group 0: none ahead
    assert paced({"batches": 10}, [6, 8]) == {"batches": 10}  # a reader of one group's layout (a test's)


def test_ckpt_inspect_calls_a_file_of_another_kind_no_checkpoint_not_damaged(tmp_path):
    """`ckpt inspect job.conf` (or a data store, or a newer singa_mpi's checkpoint) said
    `DAMAGED: a text file (a job file?), not a checkpoint`: the file is fine, it is another kind."""
    conf = job_file(tmp_path, steps=2)
    train(conf, tmp_path / "ws")
    newer = str(tmp_path / "step2.h5")
    shutil.copy(checkpoint.checkpoint_path(str(tmp_path / "ws"), 2), newer)
    as_newer_format(newer)
    store = str(tmp_path / "data.h5")
    for path, said in [(conf, "a text file (a job file?), not a checkpoint"),
                       (store, "an HDF5 file, but not a singa_mpi checkpoint"),
                       (newer, f"checkpoint format {checkpoint.FORMAT_VERSION + 1} is newer than this singa_mpi")]:
        with pytest.raises(DataError) as err:
            ckpt_tools.inspect(path)
        assert str(err.value).startswith(f"{path}: {said}"), err.value
    with pytest.raises(DataError, match=r"step2\.h5: DAMAGED: an empty file"):  # a checkpoint cut to nothing
        empty = tmp_path / "ws" / "checkpoint" / "step2.h5"
        empty.write_bytes(b"")
        ckpt_tools.inspect(str(empty))


def test_ckpt_inspect_of_something_that_is_no_regular_file_does_not_call_it_missing(tmp_path):
    """`ckpt inspect /dev/null` said `no such checkpoint file` of a path that exists."""
    fifo = str(tmp_path / "pipe")
    os.mkfifo(fifo)
    for path in ("/dev/null", fifo):
        with pytest.raises(DataError) as err:
            ckpt_tools.inspect(path)
        assert str(err.value) == (f"{path}: not a regular file (a device or a pipe): expected a checkpoint file, such "
                                  f"as WORKSPACE/checkpoint/step<N>.h5"), err.value


# (a hang guard: before the fix each of these blocked for good in read(), waiting for the pipe's writer)
@pytest.mark.timeout(60)
def test_a_pipe_or_device_named_as_a_checkpoint_is_refused_wherever_one_is_read(tmp_path):
    """A FIFO given as checkpoint_path or --checkpoint blocked for good in read() (only `ckpt inspect`
    refused it): every reader of a checkpoint now refuses it in one line, before opening it."""
    from singa_mpi import pictures, sampling

    fifo = str(tmp_path / "pipe")
    os.mkfifo(fifo)
    expected = "expected a checkpoint file, such as WORKSPACE/checkpoint/step<N>.h5"
    for path in (fifo, "/dev/null"):
        refusal = f"{path}: not a regular file (a device or a pipe): {expected}"
        for reader in (checkpoint.read, ckpt_tools.read_initial, lambda p: sampling.find_checkpoint(p, str(tmp_path)),
                       pictures.read_checkpoint):
            with pytest.raises(DataError) as err:
                reader(path)
            assert str(err.value) == refusal, (reader, err.value)
    with pytest.raises(DataError, match=r"pipe: not a regular file \(a device or a pipe\): expected SINGA 0\.x's "):
        ckpt_tools.convert_singa([fifo], str(tmp_path / "out.h5"))


@pytest.mark.timeout(60)
def test_check_refuses_a_pipe_or_device_as_checkpoint_path_as_train_does(tmp_path, capsys):
    """`singa-mpi check JOB` whose checkpoint_path is a FIFO (or /dev/null) said "OK" (exit 0), while train
    refused it in one line: unlike a missing file, which the job before it in a chain writes, a pipe never
    becomes a checkpoint.  check now refuses it with train's line (exit 3)."""
    from singa_mpi import cli

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    for path in (str(fifo), "/dev/null"):
        conf = job_file(tmp_path, steps=1, name="init", extra=f'checkpoint_path: "{path}"\n')
        line = len(open(conf).read().splitlines())
        assert cli.main(["check", conf]) == DataError.exit_code
        out, err = capsys.readouterr()
        assert err.strip().splitlines() == [
            f"singa-mpi: error: {conf}:{line}:1: checkpoint_path '{path}': {path}: not a regular file (a device or "
            f"a pipe): expected a checkpoint file, such as WORKSPACE/checkpoint/step<N>.h5"], (out, err)


@pytest.mark.timeout(60)
def test_a_pipe_as_checkpoint_path_or_checkpoint_is_one_line_exit_3_before_training(tmp_path, capsys):
    """`train` with a FIFO as its checkpoint_path, `test --checkpoint FIFO`: one line naming it, exit 3."""
    from singa_mpi import cli

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    conf = job_file(tmp_path, steps=1, name="init", extra=f'checkpoint_path: "{fifo}"\n')
    line = len(open(conf).read().splitlines())
    assert cli.main(["train", conf, "--workspace", str(tmp_path / "ws")]) == DataError.exit_code
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"singa-mpi: error: {conf}:{line}:1: checkpoint_path '{fifo}': {fifo}: not a regular file (a "
                   f"device or a pipe): expected a checkpoint file, such as WORKSPACE/checkpoint/step<N>.h5"], err
    plain = job_file(tmp_path, steps=1, extra="\ntest_steps: 1\ntest_freq: 100\n")
    assert cli.main(["test", plain, "--workspace", str(tmp_path / "ws"), "--checkpoint", str(fifo)]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].endswith(f"{fifo}: not a regular file (a device or a pipe): expected a "
                                             f"checkpoint file, such as WORKSPACE/checkpoint/step<N>.h5"), err


def test_each_worker_groups_hidden_state_is_kept_and_goes_back_to_its_group(tmp_path):
    """Several groups' char-rnn: group 0's carried rows in /carried, group g's in /groups/g/carried; a resume
    of as many groups gives each its own (an asynchronous group, whose state no one gathered: zeros); an
    older file, or one of another number of groups, gives every group group 0's and says so once."""
    from singa_mpi.checkpoints.snapshot import group_carried, group_state_note

    rows = {g: {"train": {"0#gru1": {"hidden": np.full((3, 4), g + 1, np.float32)}}} for g in range(3)}
    ckpt = checkpoint.Checkpoint(step=5, params={"w": np.ones(2, np.float32)}, carried=rows[0],
                                 worker_groups=3, group_carried={1: rows[1], 2: rows[2]})
    path = checkpoint.write(str(tmp_path / "step5.h5"), ckpt)
    back = checkpoint.read(path)
    assert back.worker_groups == 3 and sorted(back.group_carried) == [1, 2]
    for g in range(3):
        np.testing.assert_array_equal(group_carried(back, (g, 3))["train"]["0#gru1"]["hidden"], g + 1)
        np.testing.assert_array_equal(group_carried(back, (g, 2))["train"]["0#gru1"]["hidden"], 1)  # 2 groups: 0's
    assert group_state_note(back, 3) is None
    assert "written by 3 worker groups): every one of the 2 groups resumes from them" in group_state_note(back, 2)
    asynchronous = dataclasses.replace(back, group_carried={2: rows[2]})
    assert group_carried(asynchronous, (1, 3)) == {}  # zeros: its state was not gathered
    assert group_state_note(asynchronous, 3).endswith("worker group(s) 1 resume at their own text positions with "
                                                      "a hidden state of zeros (asynchronous groups' states are "
                                                      "not gathered at checkpoints)")
    older = checkpoint.read(checkpoint.write(str(tmp_path / "step6.h5"), dataclasses.replace(
        ckpt, worker_groups=0, group_carried={})))
    assert older.worker_groups == 0 and older.group_carried == {}
    assert group_carried(older, (1, 2)) is older.carried and group_state_note(older, 1) is None
    assert "(written with one group, or before states were kept per group)" in group_state_note(older, 2)
    one = checkpoint.read(checkpoint.write(str(tmp_path / "step7.h5"), dataclasses.replace(ckpt, worker_groups=1,
                                                                                             group_carried={})))
    assert one.worker_groups == 0  # one group writes the file of old: no attribute
