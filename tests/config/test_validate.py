"""validate(): SINGA-0.3-style jobs pass with the right shapes; every broken job fails on one line.

The broken corpus lives in tests/config/broken/.  Each file starts with
``# expect: <phrase of the message>`` and marks the line the message must point
at with ``# <-- here``; the table below adds the layer the message must name,
other substrings it must contain, and the token the reported column must point at.
"""
from __future__ import annotations

import pathlib
import warnings

import pytest

from singa_mpi.config.load import load_job, parse_job
from singa_mpi.config.validate import validate
from singa_mpi.errors import ConfigError

HERE = pathlib.Path(__file__).parent
BROKEN = HERE / "broken"
SINGA03 = HERE / "singa03"
REPO_CONFS = sorted((HERE.parent.parent / "conf").glob("*.conf"))
MARKER = "# <-- here"


def check(path: pathlib.Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gpu: is a warning; tested in test_load.py
        return validate(load_job(path))


# ------------------------------------------------------------ confs that must pass

def ip_weights(*dims: int) -> int:
    """Weights + biases of a chain of inner-product layers dims[0] -> dims[1] -> ..."""
    return sum(a * b + b for a, b in zip(dims, dims[1:]))


CIFAR_SHAPES = {"data": (3, 32, 32), "conv1": (32, 32, 32), "pool1": (32, 15, 15), "norm1": (32, 15, 15),
                "conv2": (32, 15, 15), "pool2": (32, 7, 7), "conv3": (64, 7, 7), "pool3": (64, 3, 3),
                "ip1": (10,), "loss": (10,)}
CIFAR_WEIGHTS = (32 * 75 + 32) + (32 * 800 + 32) + (64 * 800 + 64) + (10 * 576 + 10)

# file -> (phases with (layer count, batch), weights, output shapes of some layers in the train phase)
ACCEPTED = {
    "mnist_mlp.conf": ({"train": (13, 64), "test": (13, 100)}, ip_weights(784, 2500, 2000, 1500, 1000, 500, 10),
                       {"data": (784,), "fc1": (2500,), "tanh5": (500,), "loss": (10,)}),
    "cifar10_convnet.conf": ({"train": (14, 100), "test": (14, 100)}, CIFAR_WEIGHTS, CIFAR_SHAPES),
    "cifar10_cudnn.conf": ({"train": (14, 100), "test": (14, 100)}, CIFAR_WEIGHTS, CIFAR_SHAPES),
    "mnist_exclude.conf": ({"train": (6, 50), "test": (5, 50), "val": (5, 50)}, ip_weights(784, 100, 10),
                           {"hidden": (100,), "drop": (100,), "out": (10,)}),
    "csv_textfile.conf": ({"train": (5, 16), "test": (5, 36)}, ip_weights(13, 32, 3), {"csv": (13,), "fc2": (3,)}),
    "mnist_lenet_hybrid.conf": ({"train": (9, 64), "test": (9, 100)},
                                (20 * 25 + 20) + (50 * 500 + 50) + ip_weights(800, 500, 10),
                                {"conv1": (20, 24, 24), "pool1": (20, 12, 12), "conv2": (50, 8, 8),
                                 "pool2": (50, 4, 4), "ip1": (500,)}),
}


def test_every_singa03_conf_has_expectations():
    assert sorted(p.name for p in SINGA03.glob("*.conf")) == sorted(ACCEPTED)


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_singa03_conf_is_accepted(name):
    phases, weights, shapes = ACCEPTED[name]
    summary = check(SINGA03 / name)
    assert {p.phase: (len(p.layers), p.batch) for p in summary.phases} == phases
    assert summary.num_weights == weights
    train = {layer: shape for layer, _, shape in summary.phases[0].layers}
    assert {layer: train[layer] for layer in shapes} == shapes
    assert summary.algorithm == "kBP"
    # the data files do not exist: one warning per input layer, pointing at its path
    assert summary.warnings and all("not found: make it with `singa-mpi data" in w and
                                    f"`singa-mpi data synthetic --like {SINGA03 / name}`" in w
                                    for w in summary.warnings)
    text = (SINGA03 / name).read_text().splitlines()
    for warning in summary.warnings:
        line = int(warning.split(":")[1])
        assert "path:" in text[line - 1]


def test_cudnn_conf_only_warns_about_gpu():
    with pytest.warns(UserWarning, match=r"gpu: \[0\] ignored"):
        summary = validate(load_job(SINGA03 / "cifar10_cudnn.conf"))
    assert [t for _, t, _ in summary.phases[0].layers][1:5] == ["kCudnnConv", "kCudnnPool", "kCudnnActivation",
                                                               "kCudnnLRN"]


def test_summary_lists_owned_params_only():
    summary = check(SINGA03 / "mnist_exclude.conf")
    assert [name for name, _ in summary.params] == ["b1", "b2", "w1", "w2"]  # w2_test/b2_test share
    assert dict(summary.params)["w2"] == (10, 100)
    assert (summary.updater, summary.train_steps) == ("kAdaGrad", 500)


@pytest.mark.parametrize("conf", REPO_CONFS, ids=lambda p: p.name)
def test_shipped_confs_are_accepted(conf):
    assert check(conf).phases[0].phase == "train"


def test_existing_data_gives_no_warning(tmp_path):
    data = tmp_path / "train.bin"
    data.write_bytes(b"")
    summary = validate(parse_job(SMALL.format(data=data, extra="")))
    assert summary.warnings == []


SMALL = """
name: "small"
train_steps: 5
train_one_batch {{ alg: kBP }}
updater {{ type: kSGD learning_rate {{ type: kFixed base_lr: 0.1 }} }}
neuralnet {{
  layer {{ name: "data" type: kRecordInput store_conf {{ backend: "kvfile" path: "{data}" batchsize: 4 shape: 6 }} }}
  layer {{ name: "fc" type: kInnerProduct srclayers: "data" innerproduct_conf {{ num_output: 3 }}
           param {{ name: "w" init {{ type: kGaussian }} }} param {{ name: "b" init {{ type: kConstant }} }} }}
  layer {{ name: "loss" type: kSoftmaxLoss srclayers: "fc" srclayers: "data" }}
  {extra}
}}
"""


def test_a_phase_is_checked_only_when_it_runs():
    # a broken layer that only the validation phase keeps
    val_only = 'layer { name: "probe" type: kReLU srclayers: "nowhere" include: kVal }'
    validate(parse_job(SMALL.format(data="d.bin", extra=val_only)))
    with pytest.raises(ConfigError, match=r"layer 'probe' .*srclayers\[0\] = 'nowhere': expected the name of a "
                                          r"layer of phase val"):
        validate(parse_job("validate_steps: 2\nvalidate_freq: 5\n" + SMALL.format(data="d.bin", extra=val_only)))


def test_phase_variants_of_one_layer_may_declare_the_same_params():
    variants = SMALL.replace('layer {{ name: "fc"', 'layer {{ name: "fc" include: kTrain').format(
        data="d.bin", extra='layer { name: "fc" type: kInnerProduct srclayers: "data" include: kTest '
                            'innerproduct_conf { num_output: 3 } param { name: "w" init { type: kGaussian } } '
                            'param { name: "b" init { type: kConstant } } }')
    summary = validate(parse_job("test_steps: 1\ntest_freq: 5\n" + variants))
    assert [p.phase for p in summary.phases] == ["train", "test"]
    assert [name for name, _ in summary.params] == ["b", "w"]


def test_share_from_may_name_a_param_declared_later_in_the_file():
    text = SMALL.replace('srclayers: "data" innerproduct_conf {{ num_output: 3 }}',
                         'srclayers: "fc0" innerproduct_conf {{ num_output: 3 }}')
    text = text.format(data="d.bin", extra="")
    text = text.replace('  layer { name: "fc"',
                        '  layer { name: "fc0" type: kInnerProduct srclayers: "data" innerproduct_conf { num_output: 6 '
                        '} param { name: "w0" share_from: "w1" } param { name: "b0" init { type: kConstant } } }\n'
                        '  layer { name: "fc1" type: kInnerProduct srclayers: "fc0" innerproduct_conf { num_output: 6 '
                        '} param { name: "w1" init { type: kGaussian } } param { name: "b1" init { type: kConstant } } '
                        '}\n  layer { name: "fc"', 1)
    summary = validate(parse_job(text))
    assert dict(summary.params)["w1"] == (6, 6)
    assert "w0" not in dict(summary.params)


# ------------------------------------------------------------ the broken corpus

# file -> (layer the message names or None, other substrings, token at the reported column or None)
CASES = {
    "unknown_srclayer.conf": ("fc1", ["srclayers[0] = 'dat'", "known: data, fc1, loss"], "srclayers"),
    "duplicate_layer_name.conf": ("fc1", ["name = 'fc1'", "(#2, kReLU)", "layer #1 has it"], "name"),
    "cycle.conf": ("fc1", ["srclayers", "fc1 -> relu1 -> relu2 -> fc1"], "srclayers"),
    "missing_num_output.conf": ("fc1", ["innerproduct_conf.num_output = missing"], "innerproduct_conf"),
    "conv_kernel_too_large.conf": ("conv1", ["convolution_conf.kernel = 9x9"], "kernel"),
    "conv_missing_num_filters.conf": ("conv1", ["convolution_conf.num_filters = missing"], "convolution_conf"),
    "pool_kernel_too_large.conf": ("pool1", ["pooling_conf.kernel = 7x7"], "kernel"),
    "batchsize_zero.conf": ("data", ["positive"], "batchsize"),
    "batchsize_mismatch.conf": ("labels", ["store_conf.batchsize = 16", "expected 8"], "batchsize"),
    "partition_dim_layer_2.conf": ("fc1", ["partition_dim = 2"], "partition_dim"),
    "partition_dim_net_3.conf": (None, ["neuralnet.partition_dim = 3"], "partition_dim"),
    "share_from_missing.conf": ("fc2", ["param[0].share_from = 'w9'", "known: b1, b2, w1"], "share_from"),
    "share_from_wrong_shape.conf": ("fc2", ["param[0].share_from = 'w1'"], "share_from"),
    "loss_label_not_input.conf": ("loss", ["srclayers[1] = 'relu1'", "kSoftmaxLoss"], "srclayers"),
    "loss_one_src.conf": ("loss", ["srclayers = ['fc1']"], "srclayers"),
    "unknown_layer_type.conf": ("foo", ["type = kFooBar", "kInnerProduct", "kSoftmaxLoss", "kCConvolution"],
                                "kFooBar"),
    "user_layer.conf": ("mine", ["user_type = kMyLayer", "no loaded plugin registers one", "--plugin"], "user_type"),
    "unknown_updater_type.conf": (None, ["updater.type = kSGDD", "kSGD", "kAdaGrad", "kAdam"], "kSGDD"),
    "unset_updater_type.conf": (None, ["updater.type = kUserUpdater", "kSGD", "kNesterov"], "updater"),
    "unset_lr_type.conf": (None, ["updater.learning_rate.type = kUserChange", "kFixed", "kStep"], "learning_rate"),
    "step_lr_without_change_freq.conf": (None, ["updater.learning_rate.step_conf.change_freq = 0"], "step_conf"),
    "unsupported_alg.conf": (None, ["train_one_batch.alg = kUserAlg"], "alg"),
    "param_without_init.conf": ("fc1", [], "param"),
    "rbm_hdim_mismatch.conf": ("hid", ["(#2, kRBMHid)"], "hdim"),
    "rbm_missing_share_from.conf": ("hid", ["two layers of an RBM share one W"], "param"),
    "rbm_partner_missing.conf": ("vis", ["lists 'vis' as its srclayers[0]"], "srclayers"),
    "rbm_partition_mismatch.conf": ("hid", ["split on both layers or on none"], "partition_dim"),
    "rbm_under_bp.conf": ("vis", ["this job says alg: kBP"], "type"),
    "cd_k_zero.conf": (None, [], "cd_k"),
    "cd_without_rbm.conf": (None, ["kRBMVis and kRBMHid pair"], "alg"),
    "param_without_name.conf": ("fc1", ["param[1].name = missing"], "param"),
    "param_name_reused.conf": ("fc2", ["param[1].name = 'b1'", "layer 'fc1' declares it"], "name"),
    "ip_missing_bias_param.conf": ("fc1", ["param[1] = missing"], "layer"),
    "include_exclude_mixed.conf": ("data", ["exclude = kTrain", "(#1, kRecordInput)", "layer #0"], "exclude"),
    "syntax_missing_colon.conf": ("fc1", ["innerproduct_conf.num_output"], "4"),
    "syntax_extra_brace.conf": (None, ['unexpected "}"'], "}"),
    "unknown_field.conf": ("pool1", ["pooling_conf.kernal", "PoolingProto"], "kernal"),
    "bad_phase_value.conf": ("data", ["include = kTset", "kTrain, kVal, kTest"], "kTset"),
    "train_steps_missing.conf": (None, ["train_steps = missing"], None),  # nothing to point at: no line
    "train_steps_zero.conf": (None, ["train_steps = 0"], "train_steps"),
    "test_freq_zero.conf": (None, ["test_freq = 0", "test_steps = 10"], "test_freq"),
    "no_layer_for_test_phase.conf": (None, ["phase test"], "neuralnet"),
    "srclayer_of_other_phase.conf": ("loss", ["srclayers[0] = 'drop1'", "known: data, fc1, loss"], "srclayers"),
    "srclayer_is_itself.conf": ("loss", ["srclayers[1] = 'loss'"], "srclayers"),
    "layer_name_with_at.conf": ("fc1@0", ["name = 'fc1@0'"], "name"),
    "lrn_even_local_size.conf": ("norm1", ["lrn_conf.local_size = 4"], "local_size"),
    "negative_location.conf": ("fc1", ["location = -1"], "location"),
    "topk_too_large.conf": ("loss", ["softmaxloss_conf.topk = 5"], "topk"),
    "dropout_ratio_one.conf": ("drop1", ["dropout_conf.dropout_ratio = 1"], "dropout_ratio"),
    "store_without_path.conf": ("data", ["store_conf.path = missing"], "store_conf"),
}


def test_the_corpus_and_the_table_agree():
    files = sorted(p.name for p in BROKEN.glob("*.conf"))
    assert len(files) >= 24
    assert files == sorted(CASES)


def expected_position(text: str, token: str | None) -> tuple[int, int] | None:
    """(line, col) of ``token`` on the line marked ``# <-- here``; None if nothing is marked."""
    marked = [n for n, line in enumerate(text.splitlines(), 1) if MARKER in line]
    assert len(marked) == (0 if token is None else 1), "mark exactly the line the message must point at"
    if token is None:
        return None
    line = text.splitlines()[marked[0] - 1]
    assert token in line.split(MARKER)[0], f"{token!r} is not on the marked line"
    return marked[0], line.index(token) + 1


@pytest.mark.parametrize("name", sorted(CASES))
def test_broken_conf_fails_on_one_line_naming_file_line_layer_and_field(name):
    path = BROKEN / name
    text = path.read_text()
    layer, substrings, token = CASES[name]
    assert text.startswith("# expect: ")
    expect = text.splitlines()[0][len("# expect: "):]
    with pytest.raises(ConfigError) as info:
        check(path)
    message = str(info.value)
    assert "\n" not in message and "\r" not in message
    position = expected_position(text, token)
    prefix = f"{path}: " if position is None else f"{path}:{position[0]}:{position[1]}: "
    assert message.startswith(prefix), f"{message!r} does not start with {prefix!r}"
    if layer is not None:
        assert f"layer '{layer}' (#" in message
    for part in [expect] + substrings:
        assert part in message, f"{part!r} not in {message!r}"


def test_message_lists_are_complete():
    """Listed names are what the registries accept (the list is the user's menu)."""
    from singa_mpi.params import INITS
    from singa_mpi.updaters import LR_SCHEDULES, UPDATERS

    def listed(name: str) -> list[str]:
        with pytest.raises(ConfigError) as info:
            check(BROKEN / name)
        return str(info.value).split(" (did you mean")[0].split("expected one of ")[1].split(", ")

    assert sorted(listed("unset_updater_type.conf")) == sorted(UPDATERS)
    assert sorted(listed("unknown_updater_type.conf")) == sorted(UPDATERS)
    assert sorted(listed("unset_lr_type.conf")) == sorted(LR_SCHEDULES)
    assert sorted(listed("unsupported_alg.conf")) == ["kBP", "kBPTT", "kCD"]
    layer_types = listed("unknown_layer_type.conf")
    assert layer_types == sorted(layer_types) and len(layer_types) >= 20
