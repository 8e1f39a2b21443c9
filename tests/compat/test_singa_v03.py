"""SINGA 0.3's own binding scripts (tests/config/singa_binding: tool/python/examples at v0.3.0-rc3),
with only their import lines changed, build here the jobs SINGA's binding built: compared with SINGA's
example job files as the project reads them (same_job.py), they differ only where the script itself
says something else than the file (each difference below names the line of the script it comes
from).  One of them trains; bad arguments raise one ArgumentError naming the layer and the argument."""
from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

from same_job import differences
from singa_mpi.api.fields import ArgumentError
from singa_mpi.compat.singa_v03 import model as binding
from singa_mpi.config.load import load_job
from singa_mpi.errors import ConfigError
from singa_mpi.data.synthetic import write_synthetic
from singa_mpi.layers.base import layer_class
from singa_mpi.layers.neuron import _ACTIVATIONS
from singa_mpi.proto import job_pb2

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "config" / "singa_binding"
SINGA = ROOT / "tests" / "config" / "singa_examples" / "v0.2.0" / "examples"  # v0.3.0-rc3's, the same bytes
IMPORTS = [("from singa.model import *", "from singa_mpi.compat.singa_v03.model import *"),
           ("from examples.datasets import", "from singa_mpi.compat.singa_v03.datasets import")]
TIMEOUT = 180


def script(name: str, folder: pathlib.Path, edits: list[tuple[str, str]] = ()) -> pathlib.Path:
    """SINGA's script ``name`` with its imports changed (and ``edits``), written into ``folder``."""
    text = (SCRIPTS / f"{name}.py").read_text()
    for old, new in IMPORTS + list(edits):
        assert text.count(old) == 1, (name, old)
        text = text.replace(old, new)
    path = folder / f"{name}.py"
    path.write_text(text)
    return path


def run_script(path: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    """The script in a fresh process (the binding's names count from 1 in each), in its folder: SINGA's
    scripts name their data relative to the working folder."""
    done = subprocess.run([sys.executable, path.name, *args], cwd=path.parent, capture_output=True, text=True,
                          timeout=TIMEOUT)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def built_job(path: pathlib.Path) -> job_pb2.JobProto:
    """The job the script builds, as `singa-mpi` reads it (written with --write-conf, not run)."""
    run_script(path, "--write-conf", "built.conf")
    return load_job(str(path.parent / "built.conf")).proto


def rbm_differences(level: int, disp_freq: int) -> dict:
    return {"checkpoint_freq": (6000, 0),  # fit() checkpoints at its last step (nb_epoch=6000)
            "cluster.workspace": (f"examples/rbm/rbm{level}", f"examples/rbm/rbm{level}/"),  # load_data(workspace=)
            "disp_freq": (600, disp_freq),  # fit(): nb_epoch // 10
            # the script's m.evaluate(X_test, test_steps=100, test_freq=500) is commented out
            "neuralnet.layer[input:test].type": (None, job_pb2.kRecordInput),
            "test_freq": (0, 500), "test_steps": (0, 100)}


TANH = {f"neuralnet.layer[L{n}].{field}": values  # Dense(..., activation='tanh'): tanh, the file's scaled tanh
        for n in (2, 4, 6, 8, 10)
        for field, values in (("type", (job_pb2.kActivation, job_pb2.kSTanh)), ("activation_conf", ("{}", None)),
                              ("activation_conf.type", (job_pb2.ActivationProto.TANH, None)))}
EXPECTED = {  # script -> (SINGA's job file, where the two differ: (the script's job, the file's))
    "cifar10_cnn": ("cifar10/job.conf", {
        "name": ("cifar10-cnn", "cifar10-convnet"),  # Sequential('cifar10-cnn', ...)
        "checkpoint_freq": (1000, 0),  # fit() checkpoints at its last step
        "disp_freq": (100, 50),  # fit(): nb_epoch // 10
        "test_freq": (300, 200),  # evaluate(..., test_freq=300)
        # datasets/cifar10.py's load_data(): batchsize=64 and random=5000 (the file: 100, random_skip commented)
        "neuralnet.layer[input:test].store_conf.batchsize": ((64,), (100,)),
        "neuralnet.layer[input:train].store_conf.batchsize": ((64,), (100,)),
        "neuralnet.layer[input:train].store_conf.random_skip": (5000, 0)}),
    "mnist_mlp": ("mnist/job.conf", {
        "train_steps": (100, 1000),  # fit(X_train, nb_epoch=100, ...)
        "checkpoint_freq": (100, 0),
        "test_freq": (100, 60),  # evaluate() without test_freq: at the start and the end (the module says why)
        "neuralnet.layer[input:test].store_conf.random_skip": (5000, 0),  # pvalues' random_skip: both stores
        **TANH}),
    "mnist_rbm1": ("rbm/rbm1.conf", rbm_differences(1, 100)),
    "mnist_rbm2": ("rbm/rbm2.conf", rbm_differences(2, 100)),
    "mnist_rbm3": ("rbm/rbm3.conf", rbm_differences(3, 100)),
    "mnist_rbm4": ("rbm/rbm4.conf", rbm_differences(4, 100)),
    "mnist_ae": ("rbm/autoencoder.conf", {
        "name": ("autoencoder", "auto-encoder"),  # Sequential('autoencoder', ...)
        "checkpoint_freq": (12200, 0),
        "cluster.workspace": ("examples/rbm/autoencoder", "examples/rbm/autoencoder/"),
        "disp_freq": (1220, 100)}),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_a_binding_script_builds_singa_s_job(name, tmp_path):
    singa_file, expected = EXPECTED[name]
    built = built_job(script(name, tmp_path))
    assert differences(built, load_job(str(SINGA / singa_file)).proto) == expected


def test_with_the_file_s_settings_the_cifar10_script_builds_the_file_s_job(tmp_path):
    """The same script given the values job.conf holds: equal, but for the binding's final checkpoint."""
    edits = [("Sequential('cifar10-cnn'", "Sequential('cifar10-convnet'"),
             ("cifar10.load_data()", "cifar10.load_data(batchsize=100, random=0)"),
             ("with_test=True)", "with_test=True, disp_freq=50)"), ("test_freq=300", "test_freq=200")]
    built = built_job(script("cifar10_cnn", tmp_path, edits))
    assert differences(built, load_job(str(SINGA / "cifar10/job.conf")).proto) == {"checkpoint_freq": (1000, 0)}


def test_the_activations_the_comparison_takes_as_equal_are_one_layer_class():
    assert _ACTIVATIONS["RELU"] is layer_class("kReLU")
    assert _ACTIVATIONS["SIGMOID"] is layer_class("kSigmoid")


def test_the_binding_names_layers_and_params_as_it_did(tmp_path):
    built = built_job(script("mnist_rbm2", tmp_path))
    layers = [(layer.name, [p.name for p in layer.param], list(layer.srclayers)) for layer in built.neuralnet.layer]
    assert layers == [("data0", [], []), ("layer1", ["w1", "b12"], ["data0"]), ("sigmoid1", [], ["layer1"]),
                      ("RBMVis", ["w2", "b2"], ["sigmoid1", "RBMHid"]), ("RBMHid", ["w2_", "b22"], ["RBMVis"])]
    assert list(built.checkpoint_path) == ["examples/rbm/rbm1/checkpoint/step6000-worker0"]


def test_the_mnist_mlp_script_trains_and_returns_the_binding_s_results(tmp_path):
    """SINGA's mnist_mlp.py, imports changed, trains here on synthetic MNIST-shaped kvfile stores at
    SINGA's paths; its results are per step (acc, loss; the test's as test_acc, test_loss)."""
    path = script("mnist_mlp", tmp_path, [("#for k, v in", "import json; print('RESULT', json.dumps(result))\n#")])
    run_script(path, "--write-conf", "built.conf")
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        written = sorted(os.path.relpath(p) for p in write_synthetic("built.conf", count=1000))
    finally:
        os.chdir(cwd)
    assert written == ["examples/mnist/test_data.bin", "examples/mnist/train_data.bin"]
    done = run_script(path)
    result = {int(step): values for step, values in json.loads(done.stdout.split("RESULT ", 1)[1]).items()}
    assert sorted(step for step in result if "loss" in result[step]) == list(range(0, 100, 10))
    assert all(0 <= result[step]["acc"] <= 1 and result[step]["loss"] > 0 for step in range(0, 100, 10))
    assert "test_acc" in result[100] and "test_loss" in result[100]
    assert (tmp_path / "examples" / "mnist" / "job.conf").exists()  # the run's workspace: the script's


@pytest.fixture
def fresh_names():
    binding.reset_names()
    yield
    binding.reset_names()


@pytest.mark.parametrize("build, message", [
    (lambda: binding.Dense(10, activation="softplus"),
     r"^layer 'layer1' \(Dense\): argument activation = 'softplus': expected one of relu, sigmoid, tanh, stanh, "
     r"softmax$"),
    (lambda: binding.Dense(-5), r"^layer 'layer1' \(Dense\): argument output_dim = -5: expected a positive integer$"),
    (lambda: binding.Dense(10, w_sdt=0.1), r"^layer 'layer1' \(Dense\): unknown argument w_sdt: expected one of "),
    (lambda: binding.Convolution2D(32, 0), r"^layer 'conv1' \(Convolution2D\): argument kernel = 0: expected a "
                                           r"positive integer$"),
    (lambda: binding.MaxPooling2D(pool_size=(3, 2)), r"^layer 'pool0' \(MaxPooling2D\): argument pool_size = "
                                                     r"\(3, 2\): expected an int or a square pair"),
    (lambda: binding.Dropout(1.5), r"^layer 'dropout0' \(Dropout\): argument ratio = 1.5: expected a number"),
    (lambda: binding.SGD(lr=0.1, lr_type="cosine"), r"^Updater: argument lr_type = 'cosine': expected one of "),
    (lambda: binding.Store(batch_size=64), r"^Store: unknown argument batch_size: expected one of .*\bbatchsize\b"),
    (lambda: binding.Cluster(), r"^Cluster: argument workspace: expected the workspace folder$"),
    (lambda: binding.Data("recordinputs"), r"^layer 'data0' \(Data\): argument load = 'recordinputs': expected one "
                                           r"of .*\brecordinput\b"),
    # raw Python errors, or the fields the script never wrote (lr_scale, std, a param's generated name)
    (lambda: binding.SGD(lr=0.1, momentum="0.9"), r"^Updater: argument momentum = '0.9': expected a number >= 0$"),
    (lambda: binding.SGD(lr=0.1, decay=-1), r"^Updater: argument decay = -1: expected a number >= 0$"),
    (lambda: binding.Dense(10, init="normal"), r"^layer 'layer1' \(Dense\): argument init = 'normal': expected one of "
                                               r"constant, gaussian, "),
    (lambda: binding.Dense(10, w_lr="2"), r"^layer 'layer1' \(Dense\): argument w_lr = '2': expected a number$"),
    (lambda: binding.Dense(10, b_wd=None), r"^layer 'layer1' \(Dense\): argument b_wd = None: expected a number$"),
    (lambda: binding.Dense(10, w_std="x"), r"^layer 'layer1' \(Dense\): argument w_std = 'x': expected a number$"),
    (lambda: binding.Dense(10, w_param=3), r"^layer 'layer1' \(Dense\): argument w_param = 3: expected a Parameter"),
    (lambda: binding.Parameter(init="normal"), r"^Parameter: argument init = 'normal': expected one of "),
    (lambda: binding.Parameter(lr="x"), r"^Parameter: argument lr = 'x': expected a number$"),
    (lambda: binding.Convolution2D(32, (5,)), r"^layer 'conv1' \(Convolution2D\): argument kernel = \(5,\): expected a "
                                              r"positive integer or a pair of them$"),
    (lambda: binding.Convolution2D(32, 5, pad="x"), r"^layer 'conv1' \(Convolution2D\): argument pad = 'x': expected "
                                                    r"an integer >= 0 or a pair of them$"),
    (lambda: binding.Data("recordinput", conf=3), r"^layer 'data0' \(Data\): argument conf = 3: expected a Store"),
    (lambda: binding.Loss("softmaxloss", topk="1"), r"^layer 'softmaxloss0' \(Loss\): argument topk = '1': expected a "
                                                    r"positive integer$"),
    (lambda: binding.Sequential("m", []).add(3), r"^Sequential.add: argument layer = 3: expected a layer"),
    (lambda: binding.Sequential("m", []).fit(3, nb_epoch=3), r"^fit: argument data = 3: expected the training data"),
    (lambda: binding.Sequential("m", []).fit(binding.Data("recordinput", path="x"), nb_epoch=3, batch_size="3"),
     r"^fit: argument batch_size = '3': expected a positive integer$"),
])
def test_a_bad_argument_raises_one_error_naming_the_layer_and_the_argument(fresh_names, build, message):
    with pytest.raises(ArgumentError, match=message):
        build()


def test_a_bad_setting_the_layer_takes_is_refused_by_the_job_s_check(fresh_names):
    model = binding.Sequential("bad", [])
    model.add(binding.Dense(10, activation="softmax", partition_dim=3))
    model.compile(loss="categorical_crossentropy", optimizer=binding.SGD(0.1), cluster=binding.Cluster("ws"))
    data = binding.Data("recordinput", conf=binding.Store(path="x.bin", backend="kvfile", batchsize=8, shape=4))
    model.fit(data, nb_epoch=10, with_test=True)
    model.build()
    with pytest.raises(ArgumentError, match=r"layer 'layer1'.*partition_dim = 3"):
        model.to_job().check()


def test_no_gpu_and_no_executable(fresh_names):
    model = binding.Sequential("m", [])
    data = binding.Data("recordinput", conf=binding.Store(path="x.bin", batchsize=8, shape=4))
    with pytest.raises(ArgumentError, match=r"^fit: argument device = 0: singa_mpi trains on CPUs"):
        model.fit(data, nb_epoch=10, device=0)
    with pytest.raises(ArgumentError, match=r"^evaluate: argument execpath = 'bin/singa'"):
        model.evaluate(data, execpath="bin/singa")


def test_fit_or_evaluate_before_compile_says_so(fresh_names):
    """It failed the job's check: "layer 'softmax1' (#2, kSoftmax): srclayers = ['layer1', 'data1']: expected
    1 source layer(s)" (the loss compile makes of the softmax was not there)."""
    data = binding.Data("recordinput", conf=binding.Store(path="x.bin", batchsize=8, shape=4))
    for call in ("fit", "evaluate"):
        model = binding.Sequential("m", [])
        model.add(binding.Dense(3, activation="softmax"))
        with pytest.raises(ArgumentError, match=rf"^{call}: the model is not compiled: expected m.compile\(loss=..., "
                                                rf"optimizer=..., cluster=Cluster\(workspace\)\) first$"):
            getattr(model, call)(data, **({"nb_epoch": 2} if call == "fit" else {}))


def test_a_chain_compiled_without_a_loss_says_a_loss_is_needed(fresh_names):
    """compile(loss=None), an Energy model's call, on a Sequential chain failed the job's check:
    "layer 'softmax2' (#4, kSoftmax): srclayers = ['layer2', 'data2']: expected 1 source layer(s)"."""
    data = binding.Data("recordinput", conf=binding.Store(path="x.bin", batchsize=8, shape=4))
    for call in ("fit", "evaluate"):
        model = binding.Sequential("m", [])
        model.add(binding.Dense(8, activation="relu"))
        model.add(binding.Dense(3, activation="softmax"))
        model.compile(optimizer=binding.SGD(0.1), cluster=binding.Cluster("ws"))
        with pytest.raises(ArgumentError) as err:
            getattr(model, call)(data, **({"nb_epoch": 2} if call == "fit" else {}))
        assert str(err.value) == (f"{call}: the model has no loss: expected m.compile(loss=..., ...) with one of "
                                  f"'categorical_crossentropy', 'mean_squared_error' (loss=None is for an Energy "
                                  f"model's RBM)")
    added = binding.Sequential("m", [])  # a loss layer the script added itself needs none from compile
    added.add(binding.Dense(3))
    added.add(binding.Loss("softmaxloss"))
    added.compile(optimizer=binding.SGD(0.1), cluster=binding.Cluster("ws"))
    added.fit(data, nb_epoch=2, with_test=True)
    added._compiled("fit")


def test_argv_options_are_read_and_singa_s_flags_left_alone():
    options = binding._argv_options(["x.py", "-singa_conf", "conf/singa.conf", "--resume", "--write-conf=a.conf"])
    assert options == {"resume": True, "overwrite": False, "check_finite": True, "check_memory": True,
                       "write_conf": "a.conf"}
    assert not binding._argv_options(["x.py", "--no-check-finite"])["check_finite"]
    assert not binding._argv_options(["x.py", "--no-check-memory"])["check_memory"]
    with pytest.raises(ArgumentError, match="--write-conf: expected the path"):
        binding._argv_options(["x.py", "--write-conf"])
    assert re.search(r"Sequential\('mlp', argv=sys.argv\)", (SCRIPTS / "mnist_mlp.py").read_text())


def test_evaluate_after_fit_tests_what_fit_trained(fresh_names, tmp_path, monkeypatch):
    """Keras's order, m.fit(X, nb_epoch=N) then m.evaluate(X_test): evaluate trained the job again and
    was refused the workspace fit had just filled ("holds another run's checkpoints")."""
    import nets

    monkeypatch.chdir(tmp_path)
    nets.make_data("train.h5", 64, (6,), 3)
    nets.make_data("test.h5", 32, (6,), 3, seed=4)
    model = binding.Sequential("keras-order", [])
    model.add(binding.Dense(8, init="uniform", activation="relu"))
    model.add(binding.Dense(3, init="uniform", activation="softmax"))
    model.compile(loss="categorical_crossentropy", optimizer=binding.SGD(lr=0.1), cluster=binding.Cluster("ws"))
    train = binding.Data("recordinput", phase="train", conf=binding.Store(path="train.h5", backend="hdf5",
                                                                          batchsize=16, shape=6))
    test = binding.Data("recordinput", phase="test", conf=binding.Store(path="test.h5", backend="hdf5",
                                                                        batchsize=32, shape=6))
    trained = model.fit(train, nb_epoch=4, disp_freq=2)
    assert sorted(trained) == [0, 2], trained
    checkpoints = sorted(os.listdir("ws/checkpoint"))
    tested = model.evaluate(test, test_steps=1)
    (step, metrics), = tested.items()
    assert step == 4 and set(metrics) == {"test_loss", "test_acc"}, tested
    assert sorted(os.listdir("ws/checkpoint")) == checkpoints  # nothing trained again
    again = binding.Sequential("keras-order", [])  # the script run a second time: its argv takes the flags
    again.add(binding.Dense(3, init="uniform", activation="softmax"))
    again.compile(loss="categorical_crossentropy", optimizer=binding.SGD(lr=0.1), cluster=binding.Cluster("ws"))
    with pytest.raises(ConfigError, match=r"expected --resume to continue that run, or --overwrite to move it"):
        again.fit(train, nb_epoch=4)


def softmax_model(name: str, hidden: tuple[int, ...] = ()) -> binding.Sequential:
    """A binding script's model: Dense ReLU layers of ``hidden`` units, then a 3-class softmax, compiled
    with SGD into the workspace ws (the names counted afresh, as a script run anew counts them)."""
    binding.reset_names()
    built = binding.Sequential(name, [])
    for units in hidden:
        built.add(binding.Dense(units, init="uniform", activation="relu"))
    built.add(binding.Dense(3, init="uniform", activation="softmax"))
    built.compile(loss="categorical_crossentropy", optimizer=binding.SGD(lr=0.1), cluster=binding.Cluster("ws"))
    return built


def hdf5_data(path: str, phase: str, batch: int) -> binding.Data:
    """A binding script's input of one phase: the HDF5 store at ``path``, rows of 6 values."""
    return binding.Data("recordinput", phase=phase, conf=binding.Store(path=path, backend="hdf5", batchsize=batch,
                                                                       shape=6))


def test_evaluate_of_a_test_only_model_tests_the_workspace_s_checkpoint(fresh_names, tmp_path, monkeypatch):
    """A script that only tests (m.evaluate(X_test) without fit, the model trained by an earlier run):
    its job has no training input, which the check refused ("expected the name of a layer of phase
    train"); now it tests the newest checkpoint, or the checkpoint_path given, as evaluate after fit does."""
    import nets

    monkeypatch.chdir(tmp_path)
    nets.make_data("train.h5", 64, (6,), 3)
    nets.make_data("test.h5", 32, (6,), 3, seed=4)

    def model():
        return softmax_model("test-only", hidden=(8,))

    trainer = model()
    trainer.fit(hdf5_data("train.h5", "train", 16), nb_epoch=4)
    after_fit = trainer.evaluate(hdf5_data("test.h5", "test", 32), test_steps=1)
    tested = model().evaluate(hdf5_data("test.h5", "test", 32), test_steps=1)
    assert tested == after_fit and sorted(tested[4]) == ["test_acc", "test_loss"], tested
    tester = model()
    given = tester.evaluate(hdf5_data("test.h5", "test", 32), test_steps=1,
                            checkpoint_path=["ws/checkpoint/step4.h5"])
    assert given == after_fit
    assert [list(layer.include) for layer in tester.jobconf.neuralnet.layer if layer.type == job_pb2.kRecordInput] == [
        [job_pb2.kTest]]  # the job built is the binding's: the test input of phase test


def test_a_test_with_no_good_checkpoint_names_the_binding_s_own_argument(fresh_names, tmp_path, monkeypatch):
    """A binding script whose checkpoints were all damaged (or that had none) was told
    `evaluate(..., checkpoints=[FILE])`, the Python API's argument; the binding's is checkpoint_path."""
    import warnings

    import nets
    from singa_mpi.errors import DataError

    monkeypatch.chdir(tmp_path)
    nets.make_data("train.h5", 64, (6,), 3)
    nets.make_data("test.h5", 32, (6,), 3, seed=4)

    def model(workspace):
        binding.reset_names()
        built = binding.Sequential("damaged", [])
        built.add(binding.Dense(3, init="uniform", activation="softmax"))
        built.compile(loss="categorical_crossentropy", optimizer=binding.SGD(lr=0.1),
                      cluster=binding.Cluster(workspace))
        return built

    def store(path, batch):
        return binding.Store(path=path, backend="hdf5", batchsize=batch, shape=6)

    def tested(workspace):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # each damaged file's own note
            with pytest.raises(DataError) as err:
                model(workspace).evaluate(binding.Data("recordinput", phase="test", conf=store("test.h5", 32)),
                                          test_steps=1)
        return str(err.value)

    said = "evaluate(..., checkpoint_path=[FILE])"
    assert tested("empty").endswith(f"no checkpoint to test: expected a workspace that fit() wrote, or {said}")
    model("ws").fit(binding.Data("recordinput", phase="train", conf=store("train.h5", 16)), nb_epoch=2)
    for path in (tmp_path / "ws" / "checkpoint").glob("step*.h5"):
        path.write_bytes(b"\0" * 64)
    message = tested("ws")
    assert "every checkpoint there is damaged" in message and message.endswith(
        f"none to test: expected {said} or a workspace with a good checkpoint"), message


def test_fit_with_validate_data_returns_the_validation_s_metrics(fresh_names, tmp_path, monkeypatch):
    """m.fit(X_train, validate_data=X_valid, nb_epoch=N, validate_steps=S), the binding's case (2): the
    run validated (metrics.jsonl's phase "val") but the results held no val_ metrics."""
    import nets

    monkeypatch.chdir(tmp_path)
    nets.make_data("train.h5", 64, (6,), 3)
    nets.make_data("valid.h5", 32, (6,), 3, seed=4)
    model = binding.Sequential("validated", [])
    model.add(binding.Dense(3, init="uniform", activation="softmax"))
    model.compile(loss="categorical_crossentropy", optimizer=binding.SGD(lr=0.1), cluster=binding.Cluster("ws"))
    train = binding.Data("recordinput", phase="train", conf=binding.Store(path="train.h5", backend="hdf5",
                                                                          batchsize=16, shape=6))
    valid = binding.Data("recordinput", phase="val", conf=binding.Store(path="valid.h5", backend="hdf5",
                                                                        batchsize=32, shape=6))
    results = model.fit(train, validate_data=valid, nb_epoch=20, disp_freq=10, validate_freq=10, validate_steps=1)
    validated = {step: sorted(key for key in metrics if key.startswith("val_")) for step, metrics in results.items()}
    assert validated == {0: ["val_acc", "val_loss"], 10: ["val_acc", "val_loss"], 20: ["val_acc", "val_loss"]}, results


def test_fit_with_validate_data_validates_without_being_told_the_steps(fresh_names, tmp_path, monkeypatch):
    """m.fit(X_train, validate_data=X_valid, nb_epoch=1000), the binding's README case (2), set
    validate_freq alone: without validate_steps the run never validated, and under 10 steps its
    validate_freq of nb_epoch // 10 = 0 was refused by the job's check; a validate_data of another phase
    (load_data's X_test) failed the check on a source layer the script never named."""
    import nets

    monkeypatch.chdir(tmp_path)
    nets.make_data("train.h5", 64, (6,), 3)
    nets.make_data("valid.h5", 32, (6,), 3, seed=4)

    def model():
        return softmax_model("validated")

    def data(path, phase):
        return hdf5_data(path, phase, 16)

    with pytest.raises(ArgumentError) as err:
        model().fit(data("train.h5", "train"), validate_data=data("valid.h5", "test"), nb_epoch=4)
    assert str(err.value) == ("fit: argument validate_data: a Data of phase 'test': expected a Data of phase 'val' "
                              "(Data(..., phase='val'))")
    validated = model()
    results = validated.fit(data("train.h5", "train"), validate_data=data("valid.h5", "val"), nb_epoch=4)
    assert validated.jobconf.validate_steps == 10 and validated.jobconf.validate_freq == 1
    assert [step for step, metrics in sorted(results.items()) if "val_acc" in metrics] == [0, 1, 2, 3, 4], results


def test_a_parameter_given_to_two_params_is_refused_where_the_script_gives_it(fresh_names):
    """The binding README's tip, par = Parameter(init='uniform', scale=0.05) given as w_param and b_param
    of every Dense: the binding names a Parameter's param once, so all were 'w1', and the job's check
    said "param[1].name = 'w1': expected a name not used twice in one layer", at fit, naming no argument."""
    par = binding.Parameter(init="uniform", scale=0.05)
    with pytest.raises(ArgumentError) as err:
        binding.Dense(100, w_param=par, b_param=par, activation="tanh")
    assert str(err.value) == ("layer 'layer1' (Dense): argument b_param: the Parameter (param 'w1') given as layer "
                              "'layer1''s w_param: expected a Parameter(...) of its own (one Parameter given twice "
                              "makes two params named 'w1')")
    parw, parb = binding.Parameter(init="gaussian", std=0.01), binding.Parameter(init="constant")
    binding.Dense(100, w_param=parw, b_param=parb)
    with pytest.raises(ArgumentError, match=r"^layer 'layer3' \(Dense\): argument w_param: the Parameter \(param "
                                            r"'w2'\) given as layer 'layer2''s w_param: expected"):
        binding.Dense(10, w_param=parw, b_param=binding.Parameter(init="constant"))
    conv = binding.Parameter(init="gaussian", std=0.0001)  # a convolution renames its params: w4, then w5
    first, second = binding.Convolution2D(32, 5, w_param=conv), binding.Convolution2D(32, 5, w_param=conv)
    assert [first.layer.param[0].name, second.layer.param[0].name] == ["w4", "w5"]


def test_a_test_only_evaluate_reads_singa_s_name_of_a_checkpoint(fresh_names, tmp_path, monkeypatch):
    """The binding README's case (4), m.evaluate(X_test, checkpoint_path=workspace+'/checkpoint/step4-worker0'):
    "cannot read the checkpoint: No such file or directory", where the job's own checkpoint_path reads
    SINGA's name as this tool's step4.h5 in that folder."""
    import nets

    monkeypatch.chdir(tmp_path)
    nets.make_data("train.h5", 64, (6,), 3)
    nets.make_data("test.h5", 32, (6,), 3, seed=4)

    def model():
        return softmax_model("singa-name")

    model().fit(hdf5_data("train.h5", "train", 16), nb_epoch=4)
    newest = model().evaluate(hdf5_data("test.h5", "test", 32), test_steps=1)
    named = model().evaluate(hdf5_data("test.h5", "test", 32), test_steps=1,
                             checkpoint_path="ws/checkpoint/step4-worker0")
    assert named == newest and list(named) == [4], named


def test_compile_given_an_argument_it_does_not_take_names_the_ones_it_takes(fresh_names):
    """m.compile(updater=sgd, cluster=topo), as the binding README's CNN example writes it, said
    "argument optimizer = None" (an argument the script never wrote), and compile(lr=0.1) said
    "unknown argument lr: expected one of " and nothing more."""
    model = binding.Sequential("m", [])
    model.add(binding.Dense(3, activation="softmax"))
    with pytest.raises(ArgumentError) as err:
        model.compile(updater=binding.SGD(0.1), cluster=binding.Cluster("ws"), loss="categorical_crossentropy")
    assert str(err.value) == ("compile: unknown argument updater: expected compile(optimizer=..., cluster=..., "
                              "loss=..., topk=...) (the updater is its optimizer)")
    with pytest.raises(ArgumentError) as err:
        model.compile(optimizer=binding.SGD(0.1), cluster=binding.Cluster("ws"), lr=0.1)
    assert str(err.value) == "compile: unknown argument lr: expected compile(optimizer=..., cluster=..., loss=..., topk=...)"
    with pytest.raises(ArgumentError, match=r"^Algorithm: unknown argument cd_k: expected no other argument$"):
        binding.Algorithm(job_pb2.kBP, cd_k=2)  # CD's alone


def test_a_fit_of_fewer_than_ten_steps_returns_its_training_results(fresh_names, tmp_path, monkeypatch):
    """m.fit(X_train, nb_epoch=5) displayed every nb_epoch // 10 = 0 steps, that is never: it returned {}."""
    import nets

    monkeypatch.chdir(tmp_path)
    nets.make_data("train.h5", 64, (6,), 3)
    model = binding.Sequential("short", [])
    model.add(binding.Dense(3, init="uniform", activation="softmax"))
    model.compile(loss="categorical_crossentropy", optimizer=binding.SGD(lr=0.1), cluster=binding.Cluster("ws"))
    train = binding.Data("recordinput", phase="train", conf=binding.Store(path="train.h5", backend="hdf5",
                                                                          batchsize=16, shape=6))
    results = model.fit(train, nb_epoch=5)
    assert sorted(results) == [0, 1, 2, 3, 4] and model.jobconf.disp_freq == 1, results
