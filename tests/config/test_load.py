"""Parsing a job (parse errors as FILE:LINE:COL), phase filtering and partition_dim inheritance."""
from __future__ import annotations

import warnings

import pytest

from singa_mpi import plugins
from singa_mpi.config.load import effective_partition_dim, layers_for_phase, load_job, parse_job
from singa_mpi.errors import ConfigError
from singa_mpi.proto import job_pb2


def parse_error(text: str, path: str = "job.conf") -> str:
    with pytest.raises(ConfigError) as info:
        parse_job(text, path)
    message = str(info.value)
    assert "\n" not in message and "\r" not in message
    return message


def test_a_valid_text_parses_into_the_proto_with_positions():
    cfg = parse_job('name: "j"\ntrain_steps: 3\nneuralnet {\n  layer { name: "a" type: kReLU }\n}\n', "j.conf")
    assert cfg.proto.name == "j" and cfg.proto.train_steps == 3
    assert cfg.proto.neuralnet.layer[0].type == job_pb2.kReLU
    assert cfg.path == "j.conf"
    assert cfg.layer_where(0, "type") == "j.conf:4:21"
    assert cfg.where("train_steps") == "j.conf:2:1"


def test_unknown_field_names_file_line_col_layer_and_suggests_the_field():
    text = 'neuralnet {\n  layer {\n    name: "pool1"\n    type: kCPooling\n    pooling_conf { kernal: 3 }\n  }\n}\n'
    message = parse_error(text)
    assert message == ("job.conf:5:20: layer 'pool1' (#0, kCPooling): pooling_conf.kernal: unknown field of "
                       "PoolingProto (did you mean 'kernel'?)")


def test_unknown_top_level_field():
    assert parse_error("train_step: 10\n") == ("job.conf:1:1: train_step: unknown field of JobProto "
                                               "(did you mean 'train_steps'?)")


def test_bad_enum_value_lists_the_valid_names():
    message = parse_error('updater {\n  type: kSGDD\n}\n')
    assert message == ("job.conf:2:9: updater.type = kSGDD: expected one of "
                       "kSGD, kAdaGrad, kRMSProp, kNesterov, kAdaDelta, kAdam, kAdamMax (did you mean 'kSGD'?)")
    pool = parse_error('neuralnet { layer { name: "p" type: kPooling pooling_conf { pool: MIN } } }')
    assert pool.endswith("layer 'p' (#0, kPooling): pooling_conf.pool = MIN: expected one of MAX, AVG")


def test_misspelled_enum_values_suggest_the_closest_name():
    alg = parse_error("train_one_batch { alg: kBp }\n")
    assert alg == "job.conf:1:24: train_one_batch.alg = kBp: expected one of kBP, kCD, kBPTT (did you mean 'kBP'?)"
    layer = parse_error('neuralnet {\n  layer { name: "fc1" type: kInnerProdct }\n}\n')
    assert layer.startswith("job.conf:2:29: layer 'fc1' (#0): type = kInnerProdct: expected one of kAccuracy, ")
    assert layer.endswith(", kSoftmaxLoss (did you mean 'kInnerProduct'?)")
    phase = parse_error('neuralnet { layer { name: "d" type: kReLU include: ktest } }')
    assert "include = ktest: expected one of " in phase and phase.endswith(" (did you mean 'kTest'?)")
    nothing_close = parse_error('neuralnet { layer { name: "p" type: kPooling pooling_conf { pool: MIN } } }')
    assert "did you mean" not in nothing_close


def test_unknown_layer_type_lists_the_implemented_types():
    message = parse_error('neuralnet {\n  layer { name: "x" }\n  layer { name: "y" type: kFooBar }\n}\n')
    assert message.startswith("job.conf:3:27: layer 'y' (#1): type = kFooBar: expected one of ")
    listed = message.split("expected one of ")[1].split(", ")
    assert {"kInnerProduct", "kCConvolution", "kSoftmaxLoss", "kRecordInput"} <= set(listed)
    assert "kUserLayer" not in listed and listed == sorted(listed)


def test_unbalanced_braces():
    # a layer left open: the next `layer` lands inside it, where it is not a field
    unclosed = parse_error('neuralnet {\n  layer { name: "a"\n  layer { name: "b" }\n}\n')
    assert unclosed == ("job.conf:3:3: layer 'a' (#0): layer: unknown field of LayerProto "
                        "(is a '}' missing before it?)")
    at_end = parse_error('neuralnet {\n  layer { name: "a" }\n')
    assert at_end == 'job.conf:2:21: the file ends inside neuralnet { ... } opened at line 1:11: expected "}" to close it'
    extra = parse_error('cluster { workspace: "w" }\n}\n')
    assert extra == 'job.conf:2:1: unexpected "}": no block is open here (one closing brace too many?)'


def test_scalar_value_errors_name_field_and_value():
    assert parse_error("train_steps: 1.5") == "job.conf:1:14: train_steps = 1.5: expected an integer"
    assert parse_error("updater { momentum: fast }") == "job.conf:1:21: updater.momentum = fast: expected a number"
    assert parse_error("name: 12") == 'job.conf:1:7: name = 12: expected a "quoted string"'
    assert parse_error("debug: maybe") == "job.conf:1:8: debug = maybe: expected true or false"
    assert parse_error("train_steps: 1\ntrain_steps: 2") == (
        "job.conf:2:14: train_steps: written twice: expected at most one value (not a repeated field)")


def test_missing_colon_names_the_field():
    message = parse_error('neuralnet {\n  layer {\n    name: "fc"\n    innerproduct_conf { num_output 4 }\n  }\n}')
    assert message == ("job.conf:4:36: layer 'fc' (#0): innerproduct_conf.num_output: "
                       'expected ":" between the field name and its value')


def test_a_value_where_a_block_belongs_names_the_field():
    """protobuf said only 'Expected "{".'"""
    message = parse_error('neuralnet {\n  layer {\n    name: "fc"\n    innerproduct_conf: 10\n  }\n}')
    assert message == ("job.conf:4:24: layer 'fc' (#0): innerproduct_conf = 10: expected { ... } around its fields "
                       "(a block, not a value)")
    assert parse_error("updater: kSGD") == "job.conf:1:10: updater = kSGD: expected { ... } around its fields " \
                                          "(a block, not a value)"


def test_protobuf_echo_of_the_line_is_dropped_also_with_crlf():
    message = parse_error('neuralnet {\r\n  layer { name: "a" type: kFooBar }\r\n}\r\n')
    assert message.startswith("job.conf:2:27: layer 'a' (#0): type = kFooBar: expected one of")
    assert "'  layer" not in message


def test_an_extension_no_plugin_declares_is_an_error_naming_it():
    with pytest.raises(ConfigError, match=r"^<string>:1:49: layer 'd' \(#0, kUserLayer\): \[nobody_conf\]: no loaded "
                                          r"plugin declares this extension"):
        parse_job('neuralnet { layer { name: "d" type: kUserLayer [nobody_conf] { path: "x" } } }')


def test_an_extension_declared_in_python_parses():
    conf = plugins.extension("load_test_conf", path=str, window=10)
    cfg = parse_job('neuralnet { layer { name: "d" user_type: "kD" [load_test_conf] { path: "x" } } }')
    layer = cfg.proto.neuralnet.layer[0]
    assert (layer.Extensions[conf].path, layer.Extensions[conf].window) == ("x", 10)


def test_load_job_of_a_missing_file_is_a_config_error(tmp_path):
    path = tmp_path / "nope.conf"
    with pytest.raises(ConfigError, match=rf"^{path}: cannot read job configuration: No such file"):
        load_job(path)


def test_a_missing_example_job_says_where_the_examples_are(tmp_path, monkeypatch):
    """README's `singa-mpi test conf/digits_mlp.conf`, run where there is no conf/ (singa_mpi installed
    without the checkout, `singa-mpi train` having run the packaged job), said only "No such file"."""
    from singa_mpi.config.load import EXAMPLES

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as err:
        load_job("conf/digits_mlp.conf")
    assert str(err.value) == (f"conf/digits_mlp.conf: cannot read job configuration: No such file or directory (an "
                              f"example job of singa_mpi's: `singa-mpi examples` copies them to ./conf/, or give "
                              f"{EXAMPLES / 'digits_mlp.conf'})")
    assert load_job(str(EXAMPLES / "digits_mlp.conf")).proto.name == "digits-mlp"


def test_load_job_reports_the_path_it_was_given(tmp_path):
    path = tmp_path / "bad.conf"
    path.write_text("name: \"x\"\nfoo: 1\n")
    with pytest.raises(ConfigError, match=rf"^{path}:2:1: foo: unknown field of JobProto: expected one of checkpoint_after, .*, warmup_steps$"):
        load_job(str(path))


def test_gpu_ids_are_accepted_with_a_warning():
    with pytest.warns(UserWarning, match=r"j.conf: gpu: \[0, 1\] ignored: singa_mpi trains on CPUs"):
        cfg = parse_job("gpu: 0\ngpu: 1\n", "j.conf")
    assert list(cfg.proto.gpu) == [0, 1]


def test_no_warning_without_gpu():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parse_job('name: "x"')


# ------------------------------------------------------------------ phases

PHASED = """
neuralnet {
  layer { name: "data" include: kTrain }
  layer { name: "data" include: kTest }
  layer { name: "data" include: kVal include: kTest }
  layer { name: "fc" }
  layer { name: "drop" include: kTrain }
  layer { name: "loss" }
}
"""

EXCLUDED = """
neuralnet {
  layer { name: "data" exclude: kTest exclude: kVal }
  layer { name: "data" exclude: kTrain }
  layer { name: "fc" }
  layer { name: "drop" exclude: kTest }
}
"""


def names(job, phase):
    return [(index, layer.name) for index, layer in layers_for_phase(job, phase)]


def test_include_keeps_a_layer_only_for_the_listed_phases():
    job = parse_job(PHASED).proto
    assert names(job, "train") == [(0, "data"), (3, "fc"), (4, "drop"), (5, "loss")]
    assert names(job, "test") == [(1, "data"), (2, "data"), (3, "fc"), (5, "loss")]
    assert names(job, "val") == [(2, "data"), (3, "fc"), (5, "loss")]


def test_exclude_drops_a_layer_for_the_listed_phases():
    job = parse_job(EXCLUDED).proto
    assert names(job, "train") == [(0, "data"), (2, "fc"), (3, "drop")]
    assert names(job, "test") == [(1, "data"), (2, "fc")]
    assert names(job, "val") == [(1, "data"), (2, "fc"), (3, "drop")]


def test_same_name_in_different_phases_keeps_each_layer_its_own_conf():
    job = parse_job('neuralnet {\n layer { name: "data" include: kTrain store_conf { batchsize: 64 } }\n'
                    ' layer { name: "data" include: kTest store_conf { batchsize: 100 } } }').proto
    (train_index, train), = layers_for_phase(job, "train")
    (test_index, test), = layers_for_phase(job, "test")
    assert (train_index, list(train.store_conf.batchsize)) == (0, [64])
    assert (test_index, list(test.store_conf.batchsize)) == (1, [100])


def test_unknown_phase_name_is_a_programming_error():
    with pytest.raises(KeyError):
        layers_for_phase(parse_job(PHASED).proto, "deploy")


# ------------------------------------------------------- partition_dim

@pytest.mark.parametrize("net, layer, expected", [
    ("", "", 0),                                       # SINGA: NetProto.partition_dim defaults to 0
    ("partition_dim: 1", "", 1),                       # inherited from the net
    ("partition_dim: 1", "partition_dim: -1", -1),     # the layer's own value wins, even the default -1
    ("partition_dim: 1", "partition_dim: 0", 0),
    ("partition_dim: -1", "", -1),
    ("", "partition_dim: 1", 1),
])
def test_effective_partition_dim(net, layer, expected):
    job = parse_job(f'neuralnet {{ {net} layer {{ name: "a" {layer} }} }}').proto
    assert effective_partition_dim(job, job.neuralnet.layer[0]) == expected


@pytest.mark.timeout(30)
def test_every_damaged_text_fails_with_a_one_line_config_error():
    """Truncations and stray characters never escape as anything but ConfigError FILE:LINE:COL: one line."""
    base = ('name: "d"\nupdater { type: kSGD learning_rate { type: kFixed } }\nneuralnet {\n'
            '  layer { name: "a" type: kRecordInput store_conf { shape: [3, 4] batchsize: 2 } include: kTrain }\n'
            '  layer { name: "b" type: kReLU srclayers: "a" }\n}\n')
    parse_job(base)
    texts = [base[:cut] for cut in range(len(base))]
    texts += [base[:cut] + bad + base[cut:] for cut in range(0, len(base), 5) for bad in ("}", "{", ":", "[", '"')]
    failures = 0
    for text in texts:
        try:
            parse_job(text, "d.conf")
        except ConfigError as err:
            failures += 1
            message = str(err)
            assert "\n" not in message and message.startswith("d.conf:"), message
    assert failures > len(texts) // 2
