"""The example jobs work here: they ship in the package, every one tests on data `singa-mpi data
synthetic` makes, a job pinned to a worker count runs on others with --workers, missing data names the
command that makes it, and the bundled digits are prepared wherever a job asks for them."""
import filecmp
import json
import os
import pathlib
import subprocess
import sys

import h5py
import numpy as np
import pytest

import nets
from singa_mpi import cli, plugins
from singa_mpi.config.load import load_job
from singa_mpi.data.prepare import how_to_make
from singa_mpi.data.stores import read_first_record
from singa_mpi.data.synthetic import write_synthetic
from singa_mpi.errors import ConfigError
from singa_mpi.launcher import Request, RunOptions, run_training
from singa_mpi.launcher.describe import World, describe, read_job
from mpi_jobs import mpi_env, mpiexec_command

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "conf").glob("*.conf"))


def test_the_examples_ship_inside_the_package():
    packaged = cli.EXAMPLES
    assert packaged.parent == ROOT / "singa_mpi"
    assert sorted(p.name for p in packaged.glob("*.conf")) == [p.name for p in EXAMPLES]
    assert all(filecmp.cmp(p, packaged / p.name, shallow=False) for p in EXAMPLES)
    assert cli.default_job_path() == packaged / "digits_mlp.conf"


def test_examples_command_copies_the_jobs_out(tmp_path, capsys):
    assert cli.main(["examples", str(tmp_path / "mine")]) == 0
    plugin_files = sorted(p.name for p in (ROOT / "conf").glob("*.py"))  # swish_lion.py, beside its job
    assert sorted(p.name for p in (tmp_path / "mine").iterdir()) == sorted([p.name for p in EXAMPLES] + plugin_files)
    edited = tmp_path / "mine" / "digits_mlp.conf"
    edited.write_text("# mine\n")
    assert cli.main(["examples", str(tmp_path / "mine")]) == 0
    assert edited.read_text() == "# mine\n" and f"kept {edited}" in capsys.readouterr().out
    assert cli.main(["examples", str(tmp_path / "mine"), "--overwrite"]) == 0
    assert filecmp.cmp(edited, ROOT / "conf" / "digits_mlp.conf", shallow=False)


# jobs that start from the checkpoints of others (the RBM chains): tests/scripts/test_rbm_chain.py runs them in order
with plugins.isolated():  # at collection: the plugin of digits_swish_lion.conf must not stay registered
    CHAINED = [p for p in EXAMPLES if load_job(p).proto.checkpoint_path]


@pytest.mark.parametrize("conf", [p for p in EXAMPLES if p not in CHAINED], ids=lambda p: p.name)
def test_every_example_tests_on_synthetic_data(conf, tmp_path, monkeypatch):
    """The job as shipped tests (or validates) during training; one step of it, with one test batch,
    runs on the stores `singa-mpi data synthetic --like` writes."""
    cfg = load_job(conf)
    job = cfg.proto
    assert (job.test_steps > 0 and job.test_freq > 0) or (job.validate_steps > 0 and job.validate_freq > 0)
    monkeypatch.chdir(tmp_path)  # the conf's relative store paths land here
    assert write_synthetic(str(conf), count=64)
    job.test_steps, job.validate_steps = min(job.test_steps, 1), min(job.validate_steps, 1)
    ws = tmp_path / "ws"
    assert run_training(cfg, lambda c: str(ws), RunOptions(steps=1)) == 0
    phases = [json.loads(line)["phase"] for line in (ws / "metrics.jsonl").read_text().splitlines()]
    assert {"test", "val"} & set(phases)


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_the_hybrid_example_plans_on_1_to_4_workers(n, capsys):
    for phase in ("train", "test"):
        assert cli.main(["plan", str(ROOT / "conf" / "cifar10_hybrid.conf"), "-n", str(n), "--phase", phase]) == 0
        out = capsys.readouterr().out
        assert f"rank {n - 1}:" in out and f"rank {n}:" not in out


def test_a_pinned_worker_count_follows_the_launched_ranks():
    """cluster.nworkers_per_group is SINGA's process count: another launched count runs, with a note;
    --workers N states the count explicitly and must match the ranks."""
    conf = str(ROOT / "conf" / "cifar10_hybrid.conf")  # cluster { nworkers_per_group: 2 }
    launch = _described(conf, 3)
    assert [launch.topo.role(rank).index for rank in range(3)] == [0, 1, 2]
    assert launch.cfg.proto.cluster.nworkers_per_group == 3
    assert launch.notes[0].startswith(f"note: {conf}:") and launch.notes[0].endswith(
        "cluster.nworkers_per_group = 2 in the job; running on the 3 launched rank(s)")
    with pytest.raises(ConfigError, match=r"--workers 4: expected the number of MPI ranks \(3\)"):
        _described(conf, 3, RunOptions(workers=4))


def _described(conf: str, ranks: int, options=None):
    """The launch description every one of ``ranks`` launched ranks computes for ``conf``."""
    request = Request(conf, lambda _: "ws", options or RunOptions())
    return describe(read_job(request), World(ranks), request)


def test_a_location_beyond_the_launched_ranks_names_the_layer(tmp_path):
    data = nets.make_data(str(tmp_path / "data.h5"), 64, (12,), 5)
    conf = tmp_path / "placed.conf"
    conf.write_text(nets.mlp(data, 7, "pipeline", 3, steps=4) + "\ncluster { nworkers_per_group: 3 }\n")
    with pytest.raises(ConfigError, match=r"placed.conf:\d+:\d+: layer '\w+': location = 2: expected a worker "
                                          r"below 2, the number of MPI ranks .* launch with mpiexec -n 3"):
        _described(str(conf), 2)


@pytest.mark.slow
def test_a_pinned_job_runs_on_3_ranks(tmp_path):
    data = nets.make_data(str(tmp_path / "data.h5"), 64, (12,), 5)
    conf = tmp_path / "pinned.conf"
    conf.write_text(nets.mlp(data, 7, "hybrid", 2, steps=4) + "\ncluster { nworkers_per_group: 2 }\n")

    def train(*extra):
        cmd = mpiexec_command(3) + [sys.executable, "-m", "singa_mpi", "train", str(conf), "--workspace",
                                    str(tmp_path / "ws"), *extra]
        return subprocess.run(cmd, cwd=ROOT, env=mpi_env(), capture_output=True, text=True, timeout=300)

    done = train()
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("running on the 3 launched rank(s)") == 1  # said once, by rank 0
    assert (tmp_path / "ws" / "checkpoint" / "step4.h5").exists()
    refused = train("--workers", "2", "--overwrite")  # asked for explicitly: must match the ranks
    assert refused.returncode == 2 and "--workers 2: expected the number of MPI ranks (3)" in refused.stderr


def test_a_folder_where_the_store_is_a_file_is_one_line_before_any_step(tmp_path, monkeypatch, capfd):
    """store_conf.path naming data/mnist (the folder) where the HDF5 store is data/mnist/train.h5: `check`
    passed it without a word and training failed after the first test pass, naming no line."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data" / "mnist").mkdir(parents=True)
    conf = tmp_path / "folder.conf"
    conf.write_text((ROOT / "conf" / "mnist_mlp.conf").read_text().replace('"data/mnist/train.h5"', '"data/mnist"', 1))
    assert cli.main(["train", str(conf), "--workspace", "ws"]) == 3
    captured = capfd.readouterr()
    assert "step 0" not in captured.out
    assert captured.err == (f"singa-mpi: error: {conf}:24:34: layer 'data': store_conf.path data/mnist: a folder: "
                            f"expected a file (backend hdf5 reads one file)\n")
    assert cli.main(["check", str(conf)]) == 0
    assert f"{conf}:24:34: layer 'data': data file 'data/mnist' is a folder: expected a file" in capfd.readouterr().out


def test_synthetic_data_fits_the_jobs_classes_and_writes_its_mean_and_std_files(tmp_path, monkeypatch, capfd):
    """A 2-class job got labels 0..9 (its first step failed on label 9), and a std_file was never
    written, while the error that named it said synthetic would make it."""
    monkeypatch.chdir(tmp_path)
    text = (ROOT / "conf" / "digits_mlp.conf").read_text().replace("num_output: 10 }", "num_output: 2 }", 1)
    text = text.replace('path: "data/digits/train.h5"', 'path: "syn/train.h5" mean_file: "syn/mean.bin" '
                                                         'std_file: "syn/std.bin"', 1)
    text = text.replace('path: "data/digits/test.h5"', 'path: "syn/test.h5"', 1).replace(" std_value: 16", "")
    (tmp_path / "two.conf").write_text(text)
    assert cli.main(["data", "synthetic", "--like", "two.conf", "--count", "64"]) == 0
    assert sorted(os.listdir(tmp_path / "syn")) == ["mean.bin", "std.bin", "test.h5", "train.h5"]
    with h5py.File(tmp_path / "syn" / "train.h5") as f:
        assert set(np.unique(f["label"][()])) == {0, 1}
    np.testing.assert_allclose(read_first_record(str(tmp_path / "syn" / "std.bin")), 73.9, rtol=1e-6)
    assert cli.main(["train", "two.conf", "--steps", "2", "--workspace", "ws"]) == 0
    capfd.readouterr()


def test_missing_data_names_the_converter_and_the_synthetic_command(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    conf = str(ROOT / "conf" / "mnist_mlp.conf")
    assert cli.main(["train", conf]) == 3
    err = capfd.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith(f"singa-mpi: error: {conf}:24:34: layer 'data': store_conf.path data/mnist/train.h5: "
                          f"no such file (looked in the current folder {tmp_path} or in the workspace ")
    assert ("make it with `singa-mpi data mnist --images train-images-idx3-ubyte.gz --labels "
            "train-labels-idx1-ubyte.gz --out data/mnist/train.h5`") in err
    assert f"random data of the job's shapes with `singa-mpi data synthetic --like {conf}`" in err
    # `check` warns with the same commands; the synthetic command it names makes every missing file
    assert cli.main(["check", conf]) == 0
    assert f"singa-mpi data synthetic --like {conf}" in capfd.readouterr().out
    assert cli.main(["data", "synthetic", "--like", conf, "--count", "10"]) == 0
    assert cli.main(["check", conf]) == 0
    assert "warning" not in capfd.readouterr().out


def test_how_to_make_each_known_store():
    store = load_job(ROOT / "conf" / "cifar10_convnet.conf").proto.neuralnet.layer[0].store_conf
    assert how_to_make(store.path, "path", store, "job.conf") == (
        "make it with `singa-mpi data cifar10 --batches cifar-10-batches-bin/data_batch_{1,2,3,4,5}.bin "
        "--out data/cifar10/train.bin --backend kvfile --mean data/cifar10/image_mean.bin`, or random data of "
        "the job's shapes with `singa-mpi data synthetic --like job.conf`")
    assert "--batches cifar-10-batches-bin/test_batch.bin --out data/cifar10/test.bin" in how_to_make(
        "data/cifar10/test.bin", "path", store, "job.conf")
    assert "`singa-mpi data digits --out runs/digits --backend kvfile`" in how_to_make(
        "runs/digits/train.bin", "path", store, "job.conf")
    assert how_to_make("mine/x.h5", "path", store, None) == (
        "make it with `singa-mpi data synthetic --like JOB.conf` (random data of the job's shapes) or convert "
        "your data (`singa-mpi data -h`)")


def test_digits_are_prepared_wherever_a_job_asks_for_them(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    conf = str(ROOT / "conf" / "digits_mlp.conf")  # named explicitly: not the job-less default
    assert cli.main(["train", conf, "--steps", "2", "--workspace", "ws"]) == 0
    assert "preparing scikit-learn's digits in data/digits/" in capsys.readouterr().out
    assert (tmp_path / "data" / "digits" / "train.h5").exists() and (tmp_path / "data" / "digits" / "test.h5").exists()
    moved = tmp_path / "moved.conf"  # any folder named digits, any backend the converter writes
    moved.write_text(pathlib.Path(conf).read_text().replace('backend: "hdf5" path: "data/digits/train.h5"',
                                                            'backend: "kvfile" path: "elsewhere/digits/train.bin"'))
    assert cli.main(["train", str(moved), "--steps", "2", "--workspace", "ws2"]) == 0
    assert (tmp_path / "elsewhere" / "digits" / "train.bin").exists()
