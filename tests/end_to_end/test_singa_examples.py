"""Every example job SINGA shipped (apache/singa ``examples/**/*.conf`` at v0.1.0, v0.2.0 and
v0.3.0-rc3: 45 files, 28 distinct, kept unchanged in tests/config/singa_examples) as a user meets it.

Each file either
* passes ``singa-mpi check``, plans on 1-4 workers, and trains 3 steps serially and on 2 workers with
  equal losses, on synthetic data of its input layers' shapes (:data:`RUNS`); or
* passes ``check`` and plans on 1-4 workers with the example plugin that ports its user layers
  (:data:`PLUGINS`: SINGA's rnnlm, examples/rnnlm, 0.3's and 0.1's with its kLabel layer;
  tests/end_to_end/test_rnnlm_example.py trains it on its own data); or
* is of a family not supported yet, and ``check`` says so in one line (:data:`NOT_YET`: none now); or
* is stale in SINGA itself (``mnist/rbm_job.conf`` wraps the job in a ``model`` field that SINGA's
  job.proto of the time rejects), and ``check`` rejects it naming the field (:data:`REJECTED`).

The 2-worker runs are two threads on :mod:`singa_mpi.communication.local`, not mpiexec: the same
WorkerRuntime and Trainer, in seconds (tests/communication/test_mpi_suites.py covers the real MPI runs).
"""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest

from singa_mpi import cli, plugins
from singa_mpi.checks.job import validate
from singa_mpi.communication.local import run_ranks
from singa_mpi.config.load import JobConfig, load_job
from singa_mpi.data.synthetic import write_synthetic
from singa_mpi.proto import job_pb2
from singa_mpi.runtimes.serial import SerialRuntime
from singa_mpi.runtimes.worker import WorkerRuntime
from singa_mpi.trainer import Trainer, summarize

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = pathlib.Path(__file__).parents[1] / "config" / "singa_examples"
MANIFEST: dict[str, str] = json.loads((EXAMPLES / "MANIFEST.json").read_text())  # each tag's path -> stored copy
FILES = sorted(set(MANIFEST.values()))

RNNLM = r"layer 'data' \(#0\): \[data_conf\]: no loaded plugin declares this extension: expected a plugin that does .*"
# file -> the plugin (relative to the repository) that ports its user layers: `check --plugin` passes.
# v0.2.0's rnnlm is v0.3.0-rc3's too (one stored copy), and examples/rnnlm/job.conf byte for byte; v0.1.0's
# puts a kLabel user layer (the plugin's too) between its data and its loss
PLUGINS = {"v0.1.0/examples/rnnlm/job.conf": "examples/rnnlm/rnnlm.py",
           "v0.2.0/examples/rnnlm/job.conf": "examples/rnnlm/rnnlm.py"}
NOT_YET: dict[str, tuple[str, str]] = {}  # file -> (why, the one-line error `check` gives: a regex of what follows
#                                           "FILE:LINE:COL: ")
JOB_FIELDS = ", ".join(sorted(job_pb2.JobProto.DESCRIPTOR.fields_by_name))  # what an unknown one is told
REJECTED = {  # SINGA's own job.proto of the time has no `model` field either
    "v0.1.0/examples/mnist/rbm_job.conf": f"model: unknown field of JobProto: expected one of {JOB_FIELDS}",
    "v0.2.0/examples/mnist/rbm_job.conf": f"model: unknown field of JobProto: expected one of {JOB_FIELDS}",
}
# SINGA's test-only sampling job (run with -test): passes check and plans; `train` refuses it.  It samples
# from a 2-layer GRU that job.conf never trains (B8): `singa-mpi sample` samples from the trained job
TEST_ONLY = {"v0.2.0/examples/char-rnn/sample.conf"}
RUNS = [name for name in FILES
        if name not in NOT_YET and name not in REJECTED and name not in TEST_ONLY and name not in PLUGINS]
PATHS, DISTINCT = 45, 28
# the distinct files by what `check` does: "runs" = passes; "runs with a plugin" = passes with its PLUGINS entry
COUNTS = {"runs": 23, "runs with a plugin": 2, "test only": 1, "rejected": 2}
COUNTS_BY_PATH = {"runs": 37, "runs with a plugin": 3, "test only": 2,
                  "rejected": 3}  # the same over the 45 paths of the three tags

STEPS = 3
TRAIN_BATCH, TEST_BATCH = 5, 3  # odd: the 2-worker runs split them unevenly
RTOL = 1e-5  # per step, relative, on what SINGA displays: the loss (BP) or the reconstruction error (CD)
OBJECTIVES = {"loss", "squared_error"}
ONE_ROW = 1 / TEST_BATCH + 1e-9  # other metrics (accuracy) count rows: one near-tie may flip
WIDE, NARROWED = 4096, 1024  # AlexNet's fc6/fc7: 3 steps of its 62M weights took 10-15 s on 2 cores
INPUT_CONFS = ("store_conf", "sharddata_conf", "lmdbdata_conf", "char_rnn_conf")  # fields with an input's batch size


def path_of(name: str) -> str:
    return str(EXAMPLES / name)


def plugin_args(name: str) -> list[str]:
    """``--plugin FILE`` for a file of :data:`PLUGINS`, else nothing."""
    return ["--plugin", str(ROOT / PLUGINS[name])] if name in PLUGINS else []


def check_fresh(name: str, *args: str) -> tuple[int, str]:
    """`singa-mpi check` in a process of its own: (exit code, stderr).  For the user layer jobs without
    their plugin: protobuf keeps an extension's declaration for the life of a process (plugins.isolated()
    cannot take it back), so once a test of this session loaded the rnnlm plugin, ``[data_conf]`` parses
    here and `check` stops at the next thing: kData's user_type, which no loaded plugin registers."""
    done = subprocess.run([sys.executable, "-m", "singa_mpi", "check", path_of(name), *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)
    return done.returncode, done.stderr


def check_of(name: str, capsys) -> tuple[int, str]:
    """`singa-mpi check` of a stored file as a user meets it (with its plugin if it has one): in this
    process, but for the files without plugin whose error names an extension (:func:`check_fresh`)."""
    if name in NOT_YET and NOT_YET[name][1] == RNNLM:
        return check_fresh(name)
    with plugins.isolated():  # a plugin loaded for one file is not there for the next
        code = cli.main(["check", path_of(name), *plugin_args(name)])
    return code, capsys.readouterr().err


def checked(name: str, capsys) -> None:
    """`singa-mpi check` passes."""
    code = cli.main(["check", path_of(name)])
    err = capsys.readouterr().err
    assert code == 0, err


# ------------------------------------------------------------------ the files themselves

def test_the_stored_copies_are_every_example_of_the_three_tags():
    tags = Counter(path.split("/", 1)[0] for path in MANIFEST)
    assert tags == {"v0.1.0": 10, "v0.2.0": 17, "v0.3.0-rc3": 18}
    assert sorted(p.relative_to(EXAMPLES).as_posix() for p in EXAMPLES.rglob("*.conf")) == FILES
    assert len(MANIFEST) == PATHS and len(FILES) == DISTINCT
    for path, stored in MANIFEST.items():  # a copy is stored under the first tag that has it
        assert path.split("/", 1)[1] == stored.split("/", 1)[1] and stored <= path


@pytest.mark.parametrize("name", sorted(NOT_YET) + sorted(REJECTED))
def test_unsupported_and_stale_files_fail_check_in_one_line(name, capfd):
    path = path_of(name)
    code, err = check_of(name, capfd)
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    expected = NOT_YET[name][1] if name in NOT_YET else re.escape(REJECTED[name])
    # FILE:LINE:COL, or FILE alone for a field the file does not write (sample.conf's train_steps)
    assert re.fullmatch(rf"singa-mpi: error: {re.escape(path)}(:\d+:\d+)?: {expected}", lines[0]), lines[0]


@pytest.mark.parametrize("name", sorted(PLUGINS))
def test_a_ported_user_layer_job_needs_its_plugin(name, capfd):
    """Without the plugin the job's first extension is one line (as for any user layer job); with it
    the job checks and plans on 1-4 workers, and its kHidden (one sequence) stays whole."""
    path = path_of(name)
    code, err = check_fresh(name)
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1, err
    assert re.fullmatch(rf"singa-mpi: error: {re.escape(path)}:\d+:\d+: {RNNLM}", lines[0]), lines[0]
    with plugins.isolated():
        assert cli.main(["check", path, *plugin_args(name)]) == 0, capfd.readouterr().err
        out = capfd.readouterr().out
        assert "plugin " in out and "kData, kEmbedding, kHidden, kLabel, kLoss" in out, out
        for n in (1, 2, 3, 4):
            assert cli.main(["plan", path, "-n", str(n), *plugin_args(name)]) == 0
            out = capfd.readouterr().out
            assert f"rank {n - 1}:" in out and f"rank {n}:" not in out, out
            assert len(re.findall(r"^    hidden\b", out, re.MULTILINE)) == 1, out  # whole, on one rank
            assert cli.main(["check", path, "-n", str(n), *plugin_args(name)]) == 0, capfd.readouterr().err


def category(name: str, capsys) -> str:
    """What `check` does with the file: passes ("runs", or "runs with a plugin" given its PLUGINS entry),
    or fails as its list says it should."""
    code, err = check_of(name, capsys)
    err = err.strip()
    message = err.split(": ", 3)[-1]  # after "singa-mpi: error: FILE:LINE:COL"
    if code == 0:
        return "test only" if name in TEST_ONLY else "runs with a plugin" if name in PLUGINS else "runs"
    if name in NOT_YET and re.fullmatch(NOT_YET[name][1], message):
        return "not yet"
    if name in REJECTED and message == REJECTED[name]:
        return "rejected"
    return f"unexpected: {err}"


def test_the_summary_of_categories(capsys):
    """Every distinct file by what `check` does with it: a regression changes the counts."""
    found = {name: category(name, capsys) for name in FILES}
    assert Counter(found.values()) == COUNTS, {name: c for name, c in found.items() if c != "runs"}
    assert Counter(found[stored] for stored in MANIFEST.values()) == COUNTS_BY_PATH


# ------------------------------------------------------------------ check, plan, train

@pytest.mark.parametrize("name", sorted(TEST_ONLY))
def test_a_test_only_job_checks_and_plans_and_train_refuses_it(name, capsys):
    checked(name, capsys)
    assert cli.main(["plan", path_of(name), "-n", "1"]) == 0  # its batch is one row: one worker
    capsys.readouterr()
    assert cli.main(["train", path_of(name)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "a test-only job (no train_steps, test_steps 100)" in err


@pytest.mark.parametrize("name", RUNS)
def test_example_passes_check_and_plans_on_1_to_4_workers(name, capsys):
    checked(name, capsys)
    for n in (1, 2, 3, 4):  # -n overrides a cluster.nworkers_per_group the file pins
        assert cli.main(["plan", path_of(name), "-n", str(n)]) == 0
        out = capsys.readouterr().out
        assert f"rank {n - 1}:" in out and f"rank {n}:" not in out, out
        assert cli.main(["check", path_of(name), "-n", str(n)]) == 0, capsys.readouterr().err  # every phase


def relocated(name: str, folder: pathlib.Path) -> str:
    """A copy of the file in ``folder`` whose absolute data paths (alexnet's /data/dataset/imagenet/...)
    are made relative, so that its synthetic data is written under the test's folder."""
    text = re.sub(r'((?:path|mean_file|std_file|meanfile)\s*:\s*)"/', r'\1"', pathlib.Path(path_of(name)).read_text())
    copy = folder / pathlib.Path(name).name
    copy.write_text(text)
    return str(copy)


def shrunk(path: str) -> JobConfig:
    """The job as the file says, made small in memory so that 3 steps take seconds: every input's
    batch TRAIN_BATCH rows in training and TEST_BATCH otherwise, one test and validation batch, no
    checkpoints.  ``cluster.nworkers_per_group`` (SINGA's process count; 1 or 2 in these files) is
    cleared: the run's 2 workers are the count.  ``checkpoint_path`` (rbm2-4 and the autoencoder start
    from the previous stage's checkpoint) is cleared, and the params it would have loaded get a small
    Gaussian init: the stages train from initial values.  Inner-product layers of WIDE outputs or more
    (AlexNet's fc6 and fc7) get NARROWED outputs."""
    cfg = load_job(path)
    job = cfg.proto
    job.cluster.ClearField("nworkers_per_group")
    del job.checkpoint_path[:]
    job.test_steps, job.validate_steps = min(job.test_steps, 1), min(job.validate_steps, 1)
    job.checkpoint_freq = 0
    for layer in job.neuralnet.layer:
        train = (not layer.include or job_pb2.kTrain in layer.include) and job_pb2.kTrain not in layer.exclude
        for field in INPUT_CONFS:
            if layer.HasField(field):
                conf, batch = getattr(layer, field), TRAIN_BATCH if train else TEST_BATCH
                if field == "store_conf":  # repeated: one value, or one per worker (SINGA-131)
                    conf.ClearField("batchsize")
                    conf.batchsize.append(batch)
                else:
                    conf.batchsize = batch
        if layer.HasField("innerproduct_conf") and layer.innerproduct_conf.num_output >= WIDE:
            layer.innerproduct_conf.num_output = NARROWED
        for param in layer.param:
            if not param.HasField("init") and not param.share_from:
                param.init.type, param.init.std = job_pb2.kGaussian, 0.01
    validate(cfg)
    return cfg


def three_steps(trainer: Trainer) -> list[dict[str, float]]:
    """The metrics of each of STEPS training steps, then of one test batch if the job tests."""
    metrics = []
    for step in range(STEPS):
        trainer.train_one_batch(step)
        metrics.append(summarize(trainer.runtime.reduce_metrics(trainer.train_net.collect_metrics())))
    if trainer.test_net is not None:
        metrics.append(trainer.evaluate(trainer.test_net, 1, "test", STEPS))
    return metrics


@pytest.mark.parametrize("name", RUNS)
@pytest.mark.slow
def test_example_trains_3_steps_on_2_workers_as_serially(name, tmp_path, monkeypatch, capsys):
    checked(name, capsys)
    monkeypatch.chdir(tmp_path)  # the files' relative data paths land here
    path = relocated(name, tmp_path)
    written = write_synthetic(path, count=4 * TRAIN_BATCH)
    assert written and not any(os.path.isabs(p) for p in written), written
    cfg = shrunk(path)
    for workspace in ("serial", "workers"):
        os.makedirs(workspace)
    serial = Trainer(cfg, "serial", SerialRuntime(cfg, cfg.proto.seed, "serial"), log=lambda line: None)
    want = three_steps(serial)
    serial.runtime.close()
    cfg = shrunk(path)  # the workers' own copy (every rank shares it, as ranks share a file)

    def rank(comm) -> list[dict[str, float]]:
        runtime = WorkerRuntime(cfg, cfg.proto.seed, "workers", comm)
        metrics = three_steps(Trainer(cfg, "workers", runtime, log=lambda line: None))
        runtime.close()
        return metrics

    got = run_ranks(2, rank, timeout=120)
    assert got[0] == got[1]  # the metrics are reduced over the workers
    assert len(want) == len(got[0]) == STEPS + (cfg.proto.test_steps > 0), (want, got[0])
    assert OBJECTIVES & set(want[0]), want[0]
    for step, (mine, serial_metrics) in enumerate(zip(got[0], want, strict=True)):
        assert sorted(mine) == sorted(serial_metrics), (step, mine, serial_metrics)
        for key, value in serial_metrics.items():
            assert np.isfinite(value), (step, serial_metrics)
            tolerance = {"rtol": RTOL} if key in OBJECTIVES else {"rtol": 0, "atol": ONE_ROW}
            np.testing.assert_allclose(mine[key], value, **tolerance,
                                       err_msg=f"{name}: step {step} {key} on 2 workers vs serially")
