"""validate(): SINGA-0.3-style jobs pass with the right shapes; every broken job fails on one line.

The broken corpus lives in tests/config/broken/.  Each file starts with
``# expect: <phrase of the message>`` and marks the line the message must point
at with ``# <-- here``; the table below adds the layer the message must name,
other substrings it must contain, and the token the reported column must point at.
"""
from __future__ import annotations

import pathlib
import re
import warnings

import pytest

import nets
from singa_mpi.checks.job import validate
from singa_mpi.config.load import load_job, parse_job
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


def test_an_updater_dividing_by_its_history_with_delta_zero_is_warned_at_the_field():
    text = (REPO_CONFS[0].parent / "digits_mlp.conf").read_text()
    text = text.replace("type: kSGD\n  momentum: 0.9\n", "type: kAdaGrad\n  delta: 0\n")
    summary = validate(parse_job(text, "job.conf"))
    said = [w for w in summary.warnings if "updater.delta" in w]
    assert len(said) == 1 and said[0].startswith("job.conf:16:3: updater.delta = 0: kAdaGrad divides ")
    text = text.replace("delta: 0\n", "delta: 1e-8\n")
    assert not [w for w in validate(parse_job(text, "job.conf")).warnings if "updater.delta" in w]


def test_a_train_net_whose_params_all_have_lr_scale_zero_is_warned_once_at_the_first():
    text = re.sub(r'param \{ name: "(\w+)" init', r'param { name: "\1" lr_scale: 0 init',
                  (REPO_CONFS[0].parent / "digits_mlp.conf").read_text())
    summary = validate(parse_job(text, "job.conf"))
    said = [w for w in summary.warnings if "lr_scale" in w]
    assert said == ["job.conf:39:24: layer 'fc1' (#2, kInnerProduct): param[0].lr_scale = 0, as for every one of the "
                    "6 params the train net trains, so the run changes none of them: expected lr_scale > 0 (1 by "
                    "default) on the params to train"]
    assert summary.said_by_runs == said  # train says it too
    one_trains = text.replace('name: "b3" lr_scale: 0', 'name: "b3"')
    assert not [w for w in validate(parse_job(one_trains, "job.conf")).warnings if "lr_scale" in w]
    # batch norm's running statistics are state the layer writes: such a net still learns them
    norm = ('layer { name: "norm" type: kBM srclayers: "fc1" ' + "".join(
        f'param {{ name: "{name}" lr_scale: 0 init {{ type: kConstant value: 1 }} }} ' for name in "sbmv") + "}\n")
    normed = one_trains.replace('name: "b3"', 'name: "b3" lr_scale: 0').replace(
        '  layer { name: "relu1" type: kReLU srclayers: "fc1" }', norm + '  layer { name: "relu1" type: kReLU srclayers: "norm" }')
    assert "kBM" in normed
    assert not [w for w in validate(parse_job(normed, "job.conf")).warnings if "lr_scale" in w]


@pytest.mark.parametrize("field", ["step", "warmup_steps"])
def test_a_negative_start_step_or_warmup_is_refused_at_the_field(field):
    """step: -5 (the step a run starts from, SINGA's last snapshot step) was taken: training ran batches
    -5..-1 and a kInverse rate of gamma 1 raised 0 to a negative power at step -1, a ZeroDivisionError
    traceback; warmup_steps (a count of steps too) took -1 alike."""
    text = (REPO_CONFS[0].parent / "digits_mlp.conf").read_text().replace("disp_freq: 100\n",
                                                                         f"disp_freq: 100\n{field}: -5\n")
    with pytest.raises(ConfigError) as err:
        validate(parse_job(text, "job.conf"))
    assert str(err.value) == f"job.conf:11:1: {field} = -5: expected an integer >= 0"


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
    "unset_updater_type.conf": (None, ["updater.type = missing: expected one of", "kSGD", "kNesterov"], "updater"),
    "unset_lr_type.conf": (None, ["updater.learning_rate.type = missing: expected one of", "kFixed", "kStep"], "learning_rate"),
    "step_lr_without_change_freq.conf": (None, ["updater.learning_rate.step_conf.change_freq = 0"], "step_conf"),
    "unsupported_alg.conf": (None, ["train_one_batch.alg = kUserAlg"], "alg"),
    "param_without_init.conf": ("fc1", [], "param"),
    "init_negative_std.conf": ("fc1", [], "std"),  # numpy raised "scale < 0" in training
    "init_low_above_high.conf": ("fc1", [], "low"),  # numpy raised "high - low < 0" in training
    "init_without_type.conf": ("fc1", ["kUniform"], "init"),  # quoted kUserInit, a value not in the file
    "rbm_hdim_mismatch.conf": ("hid", ["(#2, kRBMHid)"], "hdim"),
    "rbm_missing_share_from.conf": ("hid", ["two layers of an RBM share one W"], "param"),
    "rbm_partner_missing.conf": ("vis", ["lists 'vis' as its srclayers[0]"], "srclayers"),
    "rbm_partition_mismatch.conf": ("hid", ["split on both layers or on none"], "partition_dim"),
    "rbm_under_bp.conf": ("vis", ["this job says alg: kBP"], "type"),
    "cd_k_zero.conf": (None, [], "cd_k"),
    "cd_without_rbm.conf": (None, ["kRBMVis and kRBMHid pair"], "alg"),
    "bp_without_loss.conf": (None, ["kSoftmaxLoss, kEuclideanLoss", "found none among its 2 layers"], "alg"),
    # inputs and a loss alone: trained changing nothing; plan --cost priced it at 0.04 ms a step
    "bp_without_params.conf": (None, ["found none among its 2 layers ('data', 'loss')"], "neuralnet"),
    "param_lr_scale_negative.conf": ("fc1", ["it scales the updater's learning rate"], "lr_scale"),
    "param_wd_scale_negative.conf": ("fc1", ["it scales the updater's weight decay"], "wd_scale"),
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
    "srclayer_of_other_phase.conf": ("loss", ["srclayers[0] = 'drop1'", "give phase test a layer of its own named 'drop1' (include: kTest)"], "srclayers"),
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


# ------------------------------------------------------------ blocks a job needs, deleted

def test_a_deleted_train_one_batch_is_named_missing_not_kuseralg():
    text = (REPO_CONFS[0].parent / "digits_mlp.conf").read_text().replace("train_one_batch { alg: kBP }\n", "")
    with pytest.raises(ConfigError) as info:
        validate(parse_job(text, "job.conf"))
    assert str(info.value) == ("job.conf: train_one_batch: missing: expected train_one_batch { alg: kBP } "
                               "(or kBPTT, kCD)")


def test_an_empty_train_one_batch_points_at_the_block():
    text = (REPO_CONFS[0].parent / "digits_mlp.conf").read_text().replace("{ alg: kBP }", "{ }")
    with pytest.raises(ConfigError, match=r"^job\.conf:13:1: train_one_batch\.alg: missing: expected alg: kBP"):
        validate(parse_job(text, "job.conf"))


@pytest.mark.parametrize("cut,message", [
    ("updater", "job.conf: updater: missing: expected updater { type: kSGD learning_rate"),
    ("learning_rate", "job.conf:14:1: updater.learning_rate: missing: expected learning_rate { type: kFixed"),
    ("neuralnet", "job.conf: neuralnet: missing: expected neuralnet { layer { ... } ... }"),
])
def test_a_deleted_block_is_named_missing(cut, message):
    """The campaign's "errors without FILE:LINE" were deleted blocks reported by a placeholder value
    (kUserUpdater, kUserChange) that no file holds; an absent block has no line to name, only the file."""
    text = (REPO_CONFS[0].parent / "digits_mlp.conf").read_text()
    start = text.index(f"{cut} {{")
    text = text[:start] + text[_block_end(text, text.index("{", start)):]
    with pytest.raises(ConfigError) as info:
        validate(parse_job(text, "job.conf"))
    assert str(info.value).startswith(message)


def test_an_rbm_whose_input_is_its_own_hidden_layer_is_one_line():
    """kRBMVis reads srclayers[0]; naming its kRBMHid there (a back edge, not an input) was an IndexError."""
    text = (REPO_CONFS[0].parent / "rbm_digits_1.conf").read_text()
    text = text.replace('srclayers: "data"', 'srclayers: "RBMHid"', 1)
    with pytest.raises(ConfigError) as info:
        validate(parse_job(text, "job.conf"))
    assert str(info.value).startswith("job.conf:")
    assert "layer 'RBMVis' (#2, kRBMVis): srclayers[0] = 'RBMHid' (kRBMHid): expected the layer kRBMVis reads its " \
           "input from" in str(info.value)


@pytest.mark.parametrize("input_layer", [0, 1])
def test_a_param_of_two_shapes_in_two_phases_is_one_line(input_layer):
    """The train and test input layers reading records of 65 and 64 numbers gave fc1's weight two
    shapes: `check` passed it, and training ended in numpy's matmul error (exit 1)."""
    text = (REPO_CONFS[0].parent / "digits_mlp.conf").read_text()
    inputs = [m.start() for m in re.finditer(r"batchsize: \d+ shape: 64", text)]
    assert len(inputs) == 2
    at = text.index("shape: 64", inputs[input_layer])
    text = text[:at] + "shape: 65" + text[at + len("shape: 64"):]
    with pytest.raises(ConfigError) as info:
        validate(parse_job(text, "job.conf"))
    shapes = ["(256, 65) in an earlier phase's", "(256, 64) in an earlier phase's"][input_layer]
    assert str(info.value).startswith("job.conf:39:13: layer 'fc1' (#2, kInnerProduct): param[0].name = 'w1': "
                                      "expected one shape in every phase: "), str(info.value)
    assert shapes in str(info.value) and "in the test net" in str(info.value)


# ------------------------------------------------------------ numbers that are no numbers

@pytest.mark.parametrize("old,new,expected", [
    ("low: -1", "low: nan", ("job.conf:39:55: layer 'fc1' (#2, kInnerProduct): param[0].init.low = nan: expected a "
                            "finite number")),
    ("momentum: 0.9", "momentum: inf", "job.conf:16:3: updater.momentum = inf: expected a finite number"),
    ("base_lr: 0.05", "base_lr: -inf", ("job.conf:18:31: updater.learning_rate.base_lr = -inf: expected a finite "
                                       "number")),
    ("gamma: 0.5", "gamma: 1e39", ("job.conf:18:57: updater.learning_rate.step_conf.gamma = 1e39: expected a finite "
                                  "number")),  # beyond float32: read as inf
    ("std_value: 16", "std_value: NaN", ("job.conf:25:18: layer 'data' (#0, kRecordInput): store_conf.std_value = NaN: "
                                        "expected a finite number")),
    ("weight_decay: 0.0001", "weight_decay: 0.0001 clip_high: inf", "job.conf:17:24: updater.clip_high = inf"),
])
def test_non_finite_floats_are_refused_where_written(old, new, expected):
    """`low: nan` passed check and then overflowed in training; every float field is walked."""
    text = (REPO_CONFS[0].parent / "digits_mlp.conf").read_text()
    assert old in text
    with pytest.raises(ConfigError) as info:
        validate(parse_job(text.replace(old, new, 1), "job.conf"))
    assert str(info.value).startswith(expected)


def test_non_finite_floats_in_repeated_fields_name_the_index():
    text = (REPO_CONFS[0].parent / "digits_mlp.conf").read_text().replace(
        "type: kStep base_lr: 0.05 step_conf { gamma: 0.5 change_freq: 300 }",
        "type: kFixedStep fixedstep_conf { step: 0 step: 100 step_lr: 0.1 step_lr: nan }")
    with pytest.raises(ConfigError) as info:
        validate(parse_job(text, "job.conf"))
    assert "updater.learning_rate.fixedstep_conf.step_lr[1] = nan: expected a finite number" in str(info.value)
    assert str(info.value).startswith("job.conf:18:")


# ------------------------------------------------------------ cluster shapes: check refuses what train refuses

def _with_cluster(fields: str) -> str:
    """digits_mlp.conf with ``cluster { <fields> }`` for its cluster block."""
    text = (REPO_CONFS[0].parent / "digits_mlp.conf").read_text()
    return re.sub(r"(?m)^cluster \{.*\}$", f"cluster {{ {fields} }}", text)


@pytest.mark.parametrize("cluster,expected", [
    ("nserver_groups: 2", "nworker_groups: 1 cannot be divided among nserver_groups: 2"),
    ("nworker_groups: 2 nserver_groups: 2 server_worker_separate: true",
     "nserver_groups: 2 with server_worker_separate: true (several groups of server ranks that synchronise"),
    ("nworker_groups: 3", "nworker_groups: 3 with nserver_groups: 1 and server_worker_separate: false is not "
                          "supported (co-located servers are each group's own; Downpour needs server ranks"),
])
def test_unsupported_cluster_shapes_name_what_is_unsupported(cluster, expected):
    """`check` and `train` share the rule (topology._refuse_unsupported), in the same words."""
    from singa_mpi.topology import check_supported, topology

    text = _with_cluster(cluster)
    with pytest.raises(ConfigError) as from_check:
        validate(parse_job(text, "job.conf"))
    assert str(from_check.value).startswith("job.conf:")
    assert expected in str(from_check.value)
    cfg = parse_job(text, "job.conf")
    cluster_proto = cfg.proto.cluster
    cluster_proto.nworkers_per_group = 2
    separate = cluster_proto.nservers_per_group * cluster_proto.nserver_groups if cluster_proto.server_worker_separate \
        else 0
    world = max(cluster_proto.nworker_groups, 1) * 2 + separate
    with pytest.raises(ConfigError) as from_train:
        check_supported(topology(world, cluster_proto), cfg.where("cluster"))
    assert str(from_train.value) == str(from_check.value)


@pytest.mark.parametrize("field", ["nworker_groups", "nserver_groups", "nworkers_per_group", "nservers_per_group"])
def test_cluster_counts_below_one_are_refused_at_the_field(field):
    text = _with_cluster(f"{field}: 0")
    line = text.splitlines().index(f"cluster {{ {field}: 0 }}") + 1
    with pytest.raises(ConfigError) as info:
        validate(parse_job(text, "job.conf"))
    assert str(info.value) == f"job.conf:{line}:11: cluster.{field} = 0: expected at least 1"


def test_huge_cluster_counts_cost_nothing_to_check():
    """The shape is judged from the counts: no role is built for a billion workers."""
    text = _with_cluster("nworkers_per_group: 1000000000")
    validate(parse_job(text, "job.conf"))


# ------------------------------------------------------------ mutated jobs: one line, with a position

MUTATED = REPO_CONFS + sorted(SINGA03.glob("*.conf"))
# SINGA_MPI_FUZZ=long (the nightly fuzz run) tries every mutant; CI every 9th of the common kinds
STRIDE = 1 if __import__("os").environ.get("SINGA_MPI_FUZZ") == "long" else 9
_COMMENT = re.compile(r'("(?:[^"\\\n]|\\.)*")|#[^\n]*')
_SCALAR = re.compile(r'\b([A-Za-z_]\w*)[ \t]*:[ \t]*("[^"\n]*"|[-+\w.]+)')
_BLOCK = re.compile(r'\b([A-Za-z_]\w*)[ \t]*:?[ \t]*\{')
_NUMBER = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$")
POSITIONED = re.compile(r"^job\.conf:\d+:\d+: ")
ABSENT = re.compile(r"^job\.conf: ([\w.]+)(?::| =) missing: ")  # "updater: missing", "train_steps = missing"


def _block_end(text: str, brace: int) -> int:
    """Index after the ``}`` closing the ``{`` at ``brace`` (the example jobs have no braces in strings)."""
    depth = 0
    for i in range(brace, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return i + 1
    return len(text)


def mutants(text: str):
    """(label, always tried, mutated text): fields deleted, numbers set to 0, -1, 0.5 or huge, sources
    swapped, layers renamed, enums set to a placeholder, blocks deleted, emptied or (layers) duplicated."""
    text = _COMMENT.sub(lambda m: m.group(1) or "", text)
    layers = re.findall(r'layer\s*\{\s*name:\s*"([^"]+)"', text)
    for m in _SCALAR.finditer(text):
        name, value = m.groups()
        before, after = text[:m.start(2)], text[m.end(2):]
        yield f"delete {name}@{m.start()}", False, text[:m.start()] + text[m.end():]
        if _NUMBER.match(value):
            for new in ("0", "-1", "0.5", "1000000000", "3e38"):
                yield f"{name}: {new}@{m.start()}", False, before + new + after
        if name == "srclayers":
            for other in sorted({layers[0], layers[-1]}):
                yield f"srclayers: {other}@{m.start()}", True, before + f'"{other}"' + after
        if name == "name":
            yield f"rename@{m.start()}", False, before + '"renamed"' + after
        if value.startswith("k"):
            yield f"{name}: kUserLayer@{m.start()}", False, before + "kUserLayer" + after
    for m in _BLOCK.finditer(text):
        end = _block_end(text, m.end() - 1)
        top = text.count("{", 0, m.start()) == text.count("}", 0, m.start())
        yield f"delete block {m.group(1)}@{m.start()}", top, text[:m.start()] + text[end:]
        yield f"empty block {m.group(1)}@{m.start()}", top, text[:m.end()] + "}" + text[end:]
        if m.group(1) == "layer":
            copy = re.sub(r'(name:\s*")([^"]+)"', r'\1\2_dup"', text[m.start():end])
            yield f"duplicate layer@{m.start()}", False, text[:end] + "\n" + copy + text[end:]


def _check_message(text: str) -> str | None:
    """``check``'s one-line error for ``text`` (None when it passes); anything but a SingaError escapes."""
    from singa_mpi.errors import SingaError

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            validate(parse_job(text, "job.conf"))
    except SingaError as err:
        return str(err)
    return None


@pytest.mark.parametrize("conf", MUTATED, ids=lambda p: f"{p.parent.name}/{p.name}")
@pytest.mark.slow
def test_mutated_jobs_fail_on_one_line_that_names_the_place(conf):
    """Every error `check` gives a mutant starts with FILE:LINE:COL, or with FILE alone for a block the
    mutant no longer has (``FILE: updater: missing: ...``, ``FILE: train_steps = missing: ...``); nothing but a
    SingaError is raised."""
    from singa_mpi.config.source import SourceMap

    tried, problems = 0, []
    for k, (label, always, mutant) in enumerate(mutants(conf.read_text())):
        if not always and k % STRIDE:
            continue
        tried += 1
        message = _check_message(mutant)
        if message is None or POSITIONED.match(message):
            continue
        absent = ABSENT.match(message)
        if absent is None or SourceMap("job.conf", mutant).find(absent.group(1).split(".")[0]) is not None:
            problems.append(f"{label}: {message}")
        assert "\n" not in message
    assert tried >= 20 and not problems, "\n".join(problems[:20])


# ------------------------------------------------------------ a layer nothing reads

def _duplicated(text: str, layer: str, share: bool = False) -> str:
    """``text`` with a copy of layer ``layer`` named ``<layer>_dup`` (its params renamed, or shared with
    the original's), reading the same sources: nothing reads the copy's output."""
    out = []
    for line in text.split("\n"):
        out.append(line)
        if f'layer {{ name: "{layer}"' in line:
            copy = line.replace(f'name: "{layer}"', f'name: "{layer}_dup"')
            if share:
                copy = re.sub(r'param \{ name: "(\w+)"[^}]*\}( \})?',
                              lambda m: f'param {{ name: "{m.group(1)}_dup" share_from: "{m.group(1)}" }}', copy)
            else:
                copy = re.sub(r'param \{ name: "(\w+)"', lambda m: f'param {{ name: "{m.group(1)}_dup"', copy)
            out.append(copy)
    return "\n".join(out)


@pytest.mark.parametrize("layer,share", [("act1", False), ("fc2", False), ("fc2", True), ("loss", False),
                                         ("data", False)])
def test_a_dangling_duplicate_layer_trains_serially_and_partitioned(tmp_path, layer, share):
    """A copy of a middle layer, of the loss or of the input under a new name (nothing consumes its
    output) is accepted by check: then it must train, serially and on 2 and 3 workers split on the batch
    or on the features, like the job without it (the campaign saw a TypeError in backward)."""
    import nets
    from singa_mpi.launcher import RunOptions, run_training
    from singa_mpi.program.job import job_programs
    from singa_mpi.testing import check_equivalence

    data = nets.make_data(str(tmp_path / "d.h5"), 48, (12,), 5)
    text = _duplicated(nets.mlp(data, 8, "hybrid", steps=2), layer, share)
    cfg = parse_job(text, "job.conf")
    summary = validate(cfg)
    assert f"{layer}_dup" in [name for name, _, _ in summary.phases[0].layers]
    job_programs(cfg, 2, ["train"])  # what `check -n 2` and `plan -n 2` do
    assert run_training(cfg, lambda _: str(tmp_path / "ws"), RunOptions()) == 0
    check_equivalence(text, workers=(2, 3), steps=2, partition_dims=(0, 1))


def test_a_text_store_separator_of_two_characters_is_one_line():
    """numpy splits on one character: "ab" passed check and failed the first step with a TypeError."""
    text = nets.mlp("/tmp/unused.csv", 8, "data").replace('backend: "hdf5"', 'backend: "textfile" separator: "ab"', 1)
    assert 'separator: "ab"' in text
    with pytest.raises(ConfigError) as info:
        validate(parse_job(text, "job.conf"))
    assert "layer 'data' (#0, kRecordInput): store_conf.separator = 'ab': expected one character" in str(info.value)
