"""The Python API builds the jobs `.conf` files describe: a script's job equals the file's field for
field, every job file reads into the API's objects and writes back unchanged, and a bad argument
raises one ArgumentError naming the layer and the argument (no file:line: the script has none)."""
from __future__ import annotations

import pathlib
import re
import warnings

import pytest

import singa_mpi.api as sm
from singa_mpi import cli
from singa_mpi.config.load import load_job, parse_job
from singa_mpi.errors import ConfigError

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONF_FILES = sorted((ROOT / "conf").glob("*.conf"))


def readable(paths):
    """The files singa-mpi itself reads (SINGA's corpus holds a few it refuses, each for its reason:
    tests/config/test_singa_examples.py)."""
    kept = []
    for path in paths:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                load_job(path)
        except ConfigError:
            continue
        kept.append(path)
    return kept


SINGA_FILES = readable(sorted((ROOT / "tests" / "config" / "singa_examples").rglob("*.conf")))


def digits_mlp() -> sm.Job:
    """conf/digits_mlp.conf, written in Python."""
    def fc(n: int, units: int) -> sm.InnerProduct:
        return sm.InnerProduct(units, f"fc{n}", w=sm.Param(f"w{n}", sm.Init("kUniformSqrtFanIn", low=-1, high=1)),
                               b=sm.Param(f"b{n}", sm.Constant(0)))

    net = sm.Sequential()
    net.add(sm.RecordInput("data/digits/train.h5", 64, 64, name="data", phase="train", std_value=16, shuffle=True))
    net.add(sm.RecordInput("data/digits/test.h5", 359, 64, name="data", phase="test", std_value=16))
    net.add(fc(1, 256))
    net.add(sm.ReLU("relu1"))
    net.add(fc(2, 128))
    net.add(sm.ReLU("relu2"))
    net.add(fc(3, 10))
    net.add(sm.SoftmaxLoss("loss", srcs=["fc3", "data"], topk=1))
    rate = sm.LearningRate("kStep", 0.05, gamma=0.5, change_freq=300)
    return sm.Job("digits-mlp", net, updater=sm.SGD(rate, momentum=0.9, weight_decay=0.0001),
                  cluster=sm.Cluster(workspace="workspace/digits_mlp"), seed=1, train_steps=600, disp_freq=100,
                  test_steps=1, test_freq=200)


def test_a_script_builds_the_job_its_conf_file_describes():
    job = digits_mlp()
    assert job.to_proto() == load_job(ROOT / "conf" / "digits_mlp.conf").proto
    assert [layer.srcs for layer in job.net][2:4] == [["data"], ["fc1"]]  # a chain; inputs read nothing
    summary = job.check()
    assert dict((p, s) for p, s in summary.params)["w1"] == (256, 64)


@pytest.mark.parametrize("path", CONF_FILES + SINGA_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_job_file_reads_into_the_api_and_writes_back_unchanged(path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SINGA's files: fields singa-mpi ignores (gpu, ...)
        read = load_job(path).proto
        job = sm.Job.from_conf(path)
        assert job.to_proto() == read
        assert parse_job(job.to_conf(), str(path)).proto == read  # the text singa-mpi runs


def test_the_corpus_is_there():
    assert len(CONF_FILES) >= 20 and len(SINGA_FILES) >= 20


def test_the_written_file_is_what_the_cli_checks_and_trains(tmp_path, capsys):
    job = digits_mlp()
    job.net["fc1"].proto.partition_dim = 1
    path = tmp_path / "digits.conf"
    job.to_conf(path)
    assert cli.main(["check", str(path)]) == 0
    assert sm.Job.from_conf(path).to_proto() == job.to_proto()


def test_partitioning_and_placement_are_plain_arguments():
    net = sm.Net([sm.RecordInput("d.h5", 8, 4, name="data"),
                  sm.InnerProduct(6, "fc1", srcs="data", partition_dim="auto"),
                  sm.STanh("act", srcs="fc1", partition_dim=-1, location=1),
                  sm.InnerProduct(3, "fc2", srcs="act", partition_dim=1),
                  sm.SoftmaxLoss("loss", srcs=["fc2", "data"])], partition_dim=0,
                 pipeline={"micro_batches": 2, "schedule": "zb"})
    text = sm.Job("placed", net, train_steps=5).to_conf()
    assert "partition_dim: auto" in text and "location: 1" in text and 'schedule: "zb"' in text
    read = sm.Job.from_conf(text)
    assert read.net["fc1"].proto.partition_dim == load_job_text_auto()
    assert read.net["act"].proto.location == 1 and read.net.settings.pipeline.micro_batches == 2


def load_job_text_auto() -> int:
    from singa_mpi.config.load import AUTO

    return AUTO


def test_a_sequential_names_and_chains_what_it_is_given():
    net = sm.Sequential([sm.RecordInput("d.h5", 8, 4, name="data"), sm.InnerProduct(6), sm.ReLU(),
                         sm.InnerProduct(3), sm.SoftmaxLoss(srcs=["innerproduct2", "data"])])
    assert net.names() == ["data", "innerproduct1", "relu1", "innerproduct2", "softmaxloss1"]
    assert [layer.srcs for layer in net] == [[], ["data"], ["innerproduct1"], ["relu1"], ["innerproduct2", "data"]]
    assert [p.name for p in net["innerproduct2"].params] == ["innerproduct2_w", "innerproduct2_b"]
    summary = sm.Job("auto-named", net, updater=sm.SGD(0.01), train_steps=2).check()
    assert dict(summary.params) == {"innerproduct1_w": (6, 4), "innerproduct1_b": (6,), "innerproduct2_w": (3, 6),
                                    "innerproduct2_b": (3,)}


def test_any_layer_type_and_plugin_types_take_their_blocks_by_name():
    layer = sm.Layer("kRBMHid", "hid", "vis", rbm_conf={"hdim": 30, "gaussian": True},
                     params=[sm.Param("w", share_from="w0")])
    assert layer.proto.rbm_conf.hdim == 30 and layer.proto.param[0].share_from == "w0"
    plugin = sm.Layer("MySwish", "swish", "fc1")  # a plugin's user_type
    assert plugin.type == "MySwish" and plugin.proto.user_type == "MySwish"


@pytest.mark.parametrize("build,words", [
    (lambda: sm.InnerProduct("10", "fc1"), ["layer 'fc1' (kInnerProduct)", "innerproduct_conf.num_output = '10'",
                                            "expected an integer"]),
    (lambda: sm.Layer("kInnerProduct", "fc1", innerproduct_conf={"num_outputs": 3}),
     ["layer 'fc1'", "unknown argument innerproduct_conf.num_outputs", "innerproduct_conf.num_output"]),
    (lambda: sm.Activation("SOFTPLUS", "act"), ["layer 'act' (kActivation)", "'SOFTPLUS'", "RELU, SIGMOID, TANH"]),
    (lambda: sm.ReLU("relu", partition_dim=3), ["layer 'relu' (kReLU)", "partition_dim = 3", "'auto'"]),
    (lambda: sm.ReLU("relu", location=-1), ["layer 'relu'", "location = -1", "worker id"]),
    (lambda: sm.ReLU("relu", phase="training"), ["layer 'relu'", "phase = 'training'", "train, test"]),
    (lambda: sm.Pooling(3, "pool", pool="MEDIAN"), ["layer 'pool' (kPooling)", "pooling_conf.pool = 'MEDIAN'", "MAX"]),
    (lambda: sm.Param("w", {"type": "kUniform", "low": "a"}), ["param 'w'", "init.low = 'a'", "a number"]),
    (lambda: sm.SGD(0.1, momentum=True), ["updater (kSGD)", "momentum = True", "a number"]),
    (lambda: sm.Cluster(workers=2.5), ["cluster", "nworkers_per_group = 2.5", "an integer"]),
    (lambda: sm.Job("j", seed="x"), ["job", "seed = 'x'", "an integer"]),
])
def test_a_bad_argument_raises_one_line_naming_the_part_and_the_argument(build, words):
    with pytest.raises(sm.ArgumentError) as err:
        build()
    message = str(err.value)
    assert isinstance(err.value, ValueError) and "\n" not in message
    for word in words:
        assert word in message, message


def test_check_names_the_layer_and_field_without_a_file_position():
    net = sm.Net([sm.RecordInput("d.h5", 8, 4, name="data"), sm.InnerProduct(-5, "fc1", srcs="data"),
                  sm.SoftmaxLoss("loss", srcs=["fc1", "data"])])
    with pytest.raises(sm.ArgumentError) as err:
        sm.Job("negative", net, updater=sm.SGD(0.01), train_steps=5).check()
    message = str(err.value)
    assert message.startswith("layer 'fc1' (#1, kInnerProduct): innerproduct_conf.num_output = -5"), message
    assert "<python>" not in message


@pytest.mark.parametrize("settings,message", [
    ({"train_steps": -1}, "job: argument train_steps = -1: expected a positive integer"),
    ({"train_steps": 5, "disp_freq": -1}, "job: argument disp_freq = -1: expected an integer >= 0"),
    ({"train_steps": 5, "test_steps": 2}, "job: argument test_freq = 0: expected a positive test_freq when "
                                          "test_steps = 2"),
    ({}, "job: argument train_steps = missing: expected a positive number of training steps"),
])
def test_check_names_a_bad_job_setting_as_the_job_s_argument(settings, message):
    """They said ``train_steps = -1: ...`` without the ``job:`` the constructor's errors begin with."""
    net = sm.Net([sm.RecordInput("d.h5", 8, 4, name="data"), sm.InnerProduct(5, "fc1", srcs="data"),
                  sm.SoftmaxLoss("loss", srcs=["fc1", "data"])])
    with pytest.raises(sm.ArgumentError) as err:
        sm.Job("j", net, updater=sm.SGD(0.01), **settings).check()
    assert str(err.value) == message


def test_check_s_warnings_name_the_layer_and_the_argument_not_the_generated_text(tmp_path, monkeypatch):
    """They began `<python>:8:7:` (lines of text the script never saw) and advised `--like <python>`
    (then `--like JOB.conf`, a file the script never wrote);
    a warning of the parser (gpu ignored) now points at the script's line that called check()."""
    monkeypatch.chdir(tmp_path)
    net = sm.Net([sm.RecordInput("d.h5", 8, 4, name="data"), sm.InnerProduct(5, "fc1", srcs="data"),
                  sm.SoftmaxLoss("loss", srcs=["fc1", "data"])])
    job = sm.Job("warned", net, updater=sm.SGD(0.01), train_steps=5, checkpoint_path=["nope/ck"], gpu=[0])
    with pytest.warns(UserWarning, match=r"^gpu: \[0\] ignored: singa_mpi trains on CPUs$") as said:
        summary = job.check()
    assert [w.filename for w in said] == [__file__]
    data, checkpoint = summary.warnings
    assert data.startswith("layer 'data': data file 'd.h5' not found: make it with `singa-mpi data synthetic "
                           "--like job.conf` on the file job.to_conf(\"job.conf\") writes"), data
    assert checkpoint.startswith("checkpoint_path 'nope/ck' not found: "), checkpoint
    assert all("<python>" not in line and "JOB.conf" not in line for line in summary.warnings)


def test_check_s_advice_for_missing_data_works_as_said(tmp_path, monkeypatch):
    """A script's job was told `singa-mpi data synthetic --like JOB.conf`, a command-line placeholder for
    a file the script never wrote; the advice now says how to write it, and following it makes the data."""
    from singa_mpi.data.synthetic import write_synthetic

    monkeypatch.chdir(tmp_path)
    net = sm.Sequential([sm.RecordInput("d.h5", 8, 4, name="data"), sm.InnerProduct(5, "fc1"),
                         sm.SoftmaxLoss("loss", srcs=["fc1", "data"])])
    job = sm.Job("advised", net, updater=sm.SGD(0.01), train_steps=5)
    (advice,) = job.check().warnings
    command = re.search(r"`singa-mpi data synthetic --like (\S+)` on the file job\.to_conf\(\"(\S+)\"\) writes",
                        advice)
    assert command and command.group(1) == command.group(2), advice
    job.to_conf(command.group(2))
    assert write_synthetic(command.group(1), count=8) == ["d.h5"] and job.check().warnings == []


def test_numpy_numbers_are_numbers_wherever_the_api_takes_one():
    import numpy as np

    assert sm.SGD(np.float32(0.5)).proto.learning_rate.base_lr == 0.5
    assert sm.SGD(np.int64(1)).proto.learning_rate.base_lr == 1.0
    assert sm.ReLU("relu", location=np.int64(1)).proto.location == 1
    assert list(sm.RecordInput("d.h5", np.int64(8), np.int64(4)).proto.store_conf.shape) == [4]
    with pytest.raises(sm.ArgumentError, match="expected a dict of LRGenProto's fields"):
        sm.SGD(True)  # a bool is no rate


@pytest.mark.parametrize("source", ["conf/digits_mlpp.conf", "missing.conf", "runs/x/job"])
def test_a_mistyped_path_says_the_file_is_missing_not_that_it_is_bad_job_text(source):
    with pytest.raises(ConfigError, match=rf"^{source}: cannot read job configuration: No such file"):
        sm.Job.from_conf(source)


def test_one_line_of_job_text_is_still_job_text():
    assert sm.Job.from_conf('name: "one-line"').name == "one-line"


@pytest.mark.parametrize("type,close", [("kInnerProdct", "kInnerProduct"), ("krelu", "kReLU")])
def test_a_mistyped_layer_type_names_the_built_ins_it_is_close_to(type, close):
    with pytest.raises(sm.ArgumentError) as err:
        sm.Layer(type, "fc1", innerproduct_conf={"num_output": 3})
    assert str(err.value).startswith(f"layer 'fc1' ({type}): argument type = '{type}': expected a built-in layer "
                                     f"type (did you mean {close}")
    assert "user_type" not in str(err.value)


def test_a_plugin_type_no_loaded_plugin_registers_is_named_as_the_script_wrote_it():
    net = sm.Sequential([sm.RecordInput("d.h5", 8, 12, name="data"), sm.Layer("MySwish", "swish"),
                         sm.InnerProduct(5, "fc1"), sm.SoftmaxLoss("loss", srcs=["fc1", "data"])])
    with pytest.raises(sm.ArgumentError, match=r"^layer 'swish' \(MySwish\): argument type = 'MySwish': expected a "
                                               r"built-in layer type or a plugin's type \(no loaded plugin registers"):
        sm.Job("j", net, updater=sm.SGD(0.1), train_steps=2).check()


@pytest.mark.parametrize("build,message", [
    (lambda: sm.SoftmaxLoss("loss", srcs=3),
     "layer 'loss' (kSoftmaxLoss): argument srcs = 3: expected a layer's name or a list of layers' names"),
    (lambda: sm.SoftmaxLoss("loss", srcs=["fc2", 3]),
     "layer 'loss' (kSoftmaxLoss): argument srcs = ['fc2', 3]: expected a layer's name or a list of layers' names"),
    (lambda: sm.ReLU("relu", params=3), "layer 'relu' (kReLU): argument params = 3: expected a list of Param(...)"),
    (lambda: sm.ReLU("relu", phase=3), "layer 'relu' (kReLU): argument phase = 3: expected one of train, test"),
    (lambda: sm.InnerProduct(10, 5), "a kInnerProduct layer: argument name = 5: expected a string"),
    (lambda: sm.Layer(3, "x"), "a layer: argument type = 3: expected a layer type's name"),
    (lambda: sm.RecordInput("d.h5", 8, "12", name="data"),
     "layer 'data' (kRecordInput): argument shape = '12': expected a record's shape"),
    (lambda: sm.RecordInput("d.h5", "8", 12, name="data"),
     "layer 'data' (kRecordInput): argument batchsize = '8': expected a positive integer"),
    (lambda: sm.Sequential(sm.ReLU("relu")), "net: argument layers = Layer('kReLU', 'relu', srcs=[]): expected a list"),
    (lambda: sm.Net(3), "net: argument layers = 3: expected a list of layers"),
    (lambda: sm.Job("j", 3), "job: argument net = 3: expected a Net or a Sequential"),
    (lambda: sm.Job("j", updater=0.1), "job: argument updater = 0.1: expected an updater such as SGD(0.1)"),
    (lambda: sm.Job("j", cluster=2), "job: argument cluster = 2: expected a Cluster(...)"),
    (lambda: sm.SGD("0.1"),
     "updater (kSGD): argument lr = '0.1': expected a number (a fixed rate), a LearningRate(...)"),
    (lambda: sm.Param("w", "uniform"), "param 'w': argument init = 'uniform': expected an init such as Uniform("),
])
def test_a_bad_wiring_argument_is_one_line_naming_the_argument_as_the_script_wrote_it(build, message):
    """Not numpy's or Python's own error ('int' object is not iterable), nor the proto's field names
    (srclayers, param) the script never wrote."""
    with pytest.raises(sm.ArgumentError) as err:
        build()
    assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)


def test_srcs_none_reads_nothing():
    assert sm.InnerProduct(3, "fc1", srcs=None).srcs == []


def test_saving_and_loading_a_job_say_what_is_wrong_in_one_line(tmp_path):
    """to_conf into a folder that is not there, or onto a folder, raised Python's OSError; from_conf
    of a number, a TypeError."""
    from singa_mpi.errors import DataError

    job = digits_mlp()
    missing = tmp_path / "no" / "digits.conf"
    with pytest.raises(DataError, match=rf"^{re.escape(str(missing))}: cannot write the job's text: No such file or "
                                        rf"directory: expected a file in a folder you can write$"):
        job.to_conf(missing)
    with pytest.raises(DataError, match=rf"^{re.escape(str(tmp_path))}: cannot write the job's text: Is a directory"):
        job.to_conf(tmp_path)
    with pytest.raises(sm.ArgumentError, match=r"^to_conf: argument path = 3: expected a file name$"):
        job.to_conf(3)
    with pytest.raises(sm.ArgumentError, match=r"^from_conf: argument source = 3: expected a .conf file's path or job "
                                               r"text$"):
        sm.Job.from_conf(3)
