"""SINGA 0.1's data and parser layers: kShardData, kMnist, kRGBImage, kLabel, and how jobs may wire them."""
import numpy as np
import pytest
from google.protobuf import text_format

from singa_mpi.testing import build_layer
from singa_mpi.checks.job import validate
from singa_mpi.config.load import parse_job
from singa_mpi.data import convert
from singa_mpi.errors import ConfigError, DataError
from singa_mpi.layers.base import LayerConfigError, LayerContext
from singa_mpi.proto import job_pb2

N = 11  # records: batches of 5 wrap around


def layer_conf(text):
    return text_format.Parse(text, job_pb2.LayerProto())


def make_shard(tmp_path, shape=(2, 2), name="shard", n=N):
    """Record i holds uint8 values 4i .. 4i+3 (row i reveals its index), label i % 3."""
    data = (np.arange(n * int(np.prod(shape))) % 256).astype(np.uint8).reshape(n, *shape)
    path = str(tmp_path / name)
    convert.write_store(path, "shard", data, np.arange(n) % 3)
    return path, data


def shard_layer(path, extra="", ctx=None, seed=7, batch=5):
    text = f'name: "data" type: kShardData sharddata_conf {{ path: "{path}" batchsize: {batch} {extra} }}'
    return build_layer(layer_conf(text), [], batch=batch, seed=seed, ctx=ctx)


# ------------------------------------------------------------------ kShardData

def test_shard_data_reads_raw_values_labels_and_wraps_around(tmp_path):
    path, data = make_shard(tmp_path)
    layer = shard_layer(path)
    assert layer.out_shape == (2, 2) and layer.store is None  # the shape from the first record, nothing opened
    first = layer.forward([], True)
    assert first.dtype == np.float32
    np.testing.assert_array_equal(first, data[:5])
    np.testing.assert_array_equal(layer.aux, [0, 1, 2, 0, 1])
    layer.forward([], True)
    np.testing.assert_array_equal(layer.forward([], True), data[[10, 0, 1, 2, 3]])
    assert layer.state() == {"batches": 3}


@pytest.mark.parametrize("extra", ["", "random_skip: 9"])
def test_row_slices_and_random_skip_read_what_record_input_reads(tmp_path, extra):
    path, data = make_shard(tmp_path)
    kv = str(tmp_path / "d.bin")
    convert.write_store(kv, "kvfile", data, np.arange(N) % 3)
    text = f'name: "data" type: kRecordInput store_conf {{ backend: "kvfile" path: "{kv}" batchsize: 5 shape: 4 {extra} }}'
    v03 = build_layer(layer_conf(text), [], batch=5)
    parts = [shard_layer(path, extra, ctx=LayerContext(global_batch=5, seed=7, batch_slice=rows))
             for rows in [(0, 2), (2, 5)]]
    for _ in range(6):
        whole = v03.forward([], True)
        pieces = [part.forward([], True) for part in parts]
        np.testing.assert_array_equal(np.concatenate(pieces).reshape(5, 4), whole)
        np.testing.assert_array_equal(np.concatenate([part.aux for part in parts]), v03.aux)


def test_shape_before_the_data_exists(tmp_path):
    assert shard_layer(str(tmp_path / "examples/mnist/mnist_train_shard")).out_shape == (28, 28)
    assert shard_layer(str(tmp_path / "cifar10_test_shard")).out_shape == (3, 32, 32)
    with pytest.raises(LayerConfigError, match="sharddata_conf.path = .*: expected an existing DataShard folder"):
        shard_layer(str(tmp_path / "mine"))
    missing = shard_layer(str(tmp_path / "mnist_train_shard"))
    with pytest.raises(DataError, match=r"layer 'data': sharddata_conf.path .*mnist_train_shard: no such file "
                                        r".*singa-mpi data mnist .* --backend shard"):
        missing.forward([], True)


@pytest.mark.parametrize("extra, field", [("batchsize: 0", "sharddata_conf.batchsize"),
                                          ("", "sharddata_conf.batchsize"),
                                          ("batchsize: 5 random_skip: -1", "sharddata_conf.random_skip")])
def test_shard_data_conf_errors(tmp_path, extra, field):
    text = f'name: "data" type: kShardData sharddata_conf {{ path: "mnist" {extra} }}'
    with pytest.raises(LayerConfigError) as err:
        build_layer(layer_conf(text), [], batch=5)
    assert err.value.field == field


# ------------------------------------------------------------------ parsers

def parser(text, shape, batch=4, ctx=None):
    return build_layer(layer_conf(f'name: "p" srclayers: "data" {text}'), [shape], batch=batch, ctx=ctx)


def test_mnist_is_singas_x_over_a_minus_b_in_float32():
    x = np.arange(4 * 9, dtype=np.float32).reshape(4, 3, 3) * 7 % 256
    layer = parser("type: kMnist mnist_conf { norm_a: 127.5 norm_b: 1 }", (3, 3))
    y = layer.forward([x], True)
    assert layer.out_shape == (1, 3, 3) and y.shape == (4, 1, 3, 3) and y.dtype == np.float32
    # MnistLayer::ParseRecords: x = x / norm_a_ - norm_b_, float by float
    expected = [np.float32(np.float32(v) / np.float32(127.5)) - np.float32(1) for v in x.reshape(-1)]
    np.testing.assert_array_equal(y.reshape(-1), np.array(expected, np.float32))
    assert not np.allclose(y, (x.reshape(y.shape) - 1) / 127.5)  # not (x - norm_b) / norm_a
    assert layer.backward(y, [False]) == [None]
    assert parser("type: kMnist", (1, 3, 3)).out_shape == (1, 3, 3)


@pytest.mark.parametrize("text, field", [
    ("mnist_conf { norm_a: 1 kernel: 3 }", "mnist_conf.kernel"),
    ("mnist_conf { sigma: 0.5 }", "mnist_conf.sigma"),
    ("mnist_conf { elastic_freq: 10 }", "mnist_conf.elastic_freq"),
    ("mnist_conf { norm_a: 0 }", "mnist_conf.norm_a"),
])
def test_mnist_conf_errors(text, field):
    with pytest.raises(LayerConfigError) as err:
        parser(f"type: kMnist {text}", (3, 3))
    assert err.value.field == field
    if field != "mnist_conf.norm_a":
        assert "elastic distortion is not implemented" in str(err.value)
    with pytest.raises(LayerConfigError, match="square one-channel images"):
        parser("type: kMnist", (3, 4))


def test_rgb_image_takes_the_mean_off_then_crops_mirrors_and_scales(tmp_path):
    x = np.random.default_rng(0).integers(0, 256, (4, 2, 5, 5)).astype(np.float32)
    mean = np.random.default_rng(1).random((2, 5, 5)).astype(np.float32) * 100
    meanfile = convert.write_mean_file(str(tmp_path / "image_mean.bin"), mean, backend="shard")
    conf = f'cropsize: 3 mirror: true scale: 0.5 meanfile: "{meanfile}"'
    layer = parser(f"type: kRGBImage rgbimage_conf {{ {conf} }}", (2, 5, 5))
    same = parser("type: kImagePreprocess rgbimage_conf { cropsize: 3 mirror: true scale: 0.5 }", (2, 5, 5))
    for ctx in (layer.ctx, same.ctx):
        ctx.step = 3
    y = layer.forward([x], True)
    assert y.shape == (4, 2, 3, 3)
    np.testing.assert_allclose(y, same.forward([x - mean], True), rtol=1e-6)  # the crops of kImagePreprocess
    np.testing.assert_allclose(layer.forward([x], False), (x - mean)[:, :, 1:4, 1:4] * 0.5, rtol=1e-6)
    part = parser(f"type: kRGBImage rgbimage_conf {{ {conf} }}", (2, 5, 5),
                  ctx=LayerContext(global_batch=4, seed=7, step=3, batch_slice=(1, 4)))
    np.testing.assert_allclose(part.forward([x[1:]], True), y[1:], rtol=1e-6)  # crops keyed by global sample


def test_rgb_image_without_mean_scale_zero_and_bad_mean(tmp_path):
    x = np.arange(2 * 3 * 2 * 2, dtype=np.float32).reshape(2, 3, 2, 2)
    unscaled = parser("type: kRGBImage rgbimage_conf { scale: 0 }", (3, 2, 2), batch=2)
    np.testing.assert_array_equal(unscaled.forward([x], True), x)  # SINGA: `if (scale_)`
    small = convert.write_mean_file(str(tmp_path / "m.bin"), np.zeros((3, 1, 1)), backend="shard")
    layer = parser(f'type: kRGBImage rgbimage_conf {{ meanfile: "{small}" }}', (3, 2, 2), batch=2)
    with pytest.raises(DataError, match=r"layer 'p': rgbimage_conf.meanfile .* holds 3 values, the images have "
                                        r"shape \(3, 2, 2\)"):
        layer.forward([x], True)
    gone = parser(f'type: kRGBImage rgbimage_conf {{ meanfile: "{tmp_path / "cifar10/image_mean.bin"}" }}', (3, 2, 2),
                  batch=2)
    with pytest.raises(DataError, match="no such file.*singa-mpi data cifar10 .* --backend shard --mean"):
        gone.forward([x], True)


def test_label_passes_the_data_layers_labels_on(tmp_path):
    layer = parser("type: kLabel", ())
    labels = np.array([3, 1, 2], np.int32)
    out = layer.forward([labels], True)
    assert layer.aux is labels and out.dtype == np.float32 and layer.out_shape == ()
    with pytest.raises(DataError, match="layer 'p': the records of its source carry no label"):
        layer.forward([None], True)


# ------------------------------------------------------------------ validation

JOB = """name: "v01"
train_steps: 1
train_one_batch { alg: kBP }
updater { type: kSGD learning_rate { type: kFixed base_lr: 0.1 } }
neuralnet {
  layer { name: "data" type: DATA }
  layer { name: "mnist" type: kMnist srclayers: "data" }
  layer { name: "label" type: kLabel srclayers: "data" }
  layer { name: "fc" type: kInnerProduct srclayers: "mnist" innerproduct_conf { num_output: 3 }
          param { name: "w" init { type: kGaussian } } param { name: "b" init { type: kConstant } } }
  layer { name: "loss" type: kSoftmaxLoss srclayers: "fc" srclayers: "label" }
}
"""
SHARD = 'kShardData sharddata_conf { path: "mnist_train_shard" batchsize: 4 }'
RECORDS = 'kRecordInput store_conf { backend: "kvfile" path: "mnist.bin" batchsize: 4 shape: 28 shape: 28 }'


def test_a_v01_net_with_a_label_layer_passes():
    summary = validate(parse_job(JOB.replace("DATA", SHARD), "job.conf"))
    shapes = {name: shape for name, _, shape in summary.phases[0].layers}
    assert shapes["data"] == (28, 28) and shapes["mnist"] == (1, 28, 28) and summary.phases[0].batch == 4


@pytest.mark.parametrize("layer, line", [("mnist", 7), ("label", 8)])
def test_parsers_need_a_shard_data_source(layer, line):
    text = JOB.replace("DATA", RECORDS)
    if layer == "label":  # the kMnist layer replaced, so that the kLabel layer is the first to complain
        text = text.replace('layer { name: "mnist" type: kMnist srclayers: "data" }',
                            'layer { name: "mnist" type: kInnerProduct srclayers: "data" '
                            'innerproduct_conf { num_output: 4 } param { name: "m" init { type: kConstant } } '
                            'param { name: "mb" init { type: kConstant } } }')
    with pytest.raises(ConfigError) as err:
        validate(parse_job(text, "job.conf"))
    message = str(err.value)
    assert message.startswith(f"job.conf:{line}:") and f"layer '{layer}'" in message and "\n" not in message
    assert "srclayers[0] = 'data' (kRecordInput): expected a kShardData layer" in message


def test_a_loss_label_source_must_carry_labels():
    text = JOB.replace("DATA", SHARD).replace('srclayers: "fc" srclayers: "label"', 'srclayers: "fc" srclayers: "mnist"')
    with pytest.raises(ConfigError, match=r"job.conf:11:.*srclayers\[1\] = 'mnist': expected a label source"):
        validate(parse_job(text, "job.conf"))


@pytest.mark.parametrize("kind, conf, advice", [
    ("kLMDBData", 'lmdbdata_conf { path: "x" batchsize: 4 }', "kShardData or kRecordInput: SINGA's reader of Caffe"),
    ("kPrefetch", "", "its sublayers as plain layers"),
])
def test_lmdb_and_prefetch_are_refused_with_what_to_write_instead(kind, conf, advice):
    with pytest.raises(ConfigError) as err:
        validate(parse_job(JOB.replace("DATA", f"{kind} {conf}"), "job.conf"))
    assert str(err.value).startswith("job.conf:6:") and f"type = {kind}: expected {advice}" in str(err.value)


def test_a_parser_split_on_features_is_refused_saying_why():
    from singa_mpi.config.load import parse_job
    from singa_mpi.errors import ConfigError
    from singa_mpi.planner import partition

    text = ('name: "p" train_steps: 1 train_one_batch { alg: kBP } neuralnet {\n'
            'layer { name: "data" type: kShardData partition_dim: 0 sharddata_conf { path: "mnist_train_shard" '
            'batchsize: 4 } }\n'
            'layer { name: "mnist" type: kMnist srclayers: "data" partition_dim: 1 }\n'
            'layer { name: "label" type: kLabel srclayers: "data" partition_dim: 0 }\n}')
    with pytest.raises(ConfigError, match=r"layer 'mnist' \(#1, kMnist\): partition_dim = 1: expected 0 or -1: "
                                          r"kMnist cannot be split on features \(a parser turns whole records"):
        partition(parse_job(text, "p.conf"), 2)
