"""Input and output layers: normalisation, data order, partitioned reading, writers."""
import numpy as np
import pytest

from gradcheck import build_layer
from singa_mpi.data.stores import KVFileWriter, read_kvfile, write_hdf5
from singa_mpi.errors import DataError
from singa_mpi.layers.base import LayerContext
from singa_mpi.proto import job_pb2
from test_neuron import conf


def store(tmp_path, n=11, shape=(3,)):
    data = np.arange(n * int(np.prod(shape)), dtype=np.float32).reshape(n, *shape)
    return write_hdf5(str(tmp_path / "d.h5"), data, np.arange(n) % 4), data


def input_layer(path, batch=5, extra="", ctx=None, shape=(3,)):
    dims = " ".join(f"shape: {s}" for s in shape)
    text = f'name: "data" type: kRecordInput store_conf {{ backend: "hdf5" path: "{path}" batchsize: {batch} {dims} {extra} }}'
    return build_layer(conf(text), [], batch=batch, ctx=ctx, dtype=np.float32)


def test_normalisation_and_wrap_around(tmp_path):
    path, data = store(tmp_path)
    layer = input_layer(path, extra="mean_value: 2 std_value: 4")
    first = layer.forward([], True)
    np.testing.assert_allclose(first, (data[:5] - 2) / 4)
    np.testing.assert_array_equal(layer.aux, [0, 1, 2, 3, 0])
    layer.forward([], True)
    third = layer.forward([], True)  # records 10, 0, 1, 2, 3: wraps around the end of the store
    np.testing.assert_allclose(third * 4 + 2, data[[10, 0, 1, 2, 3]])


@pytest.mark.parametrize("extra", ["", "shuffle: true", "random_skip: 7", "shuffle: true random_skip: 3"])
def test_row_slices_read_exactly_the_rows_of_the_whole(tmp_path, extra):
    path, _ = store(tmp_path)
    whole = input_layer(path, extra=extra)
    parts = [input_layer(path, extra=extra, ctx=LayerContext(global_batch=5, seed=7, batch_slice=rows))
             for rows in [(0, 3), (3, 5)]]
    for _ in range(6):  # several epochs
        full = whole.forward([], True)
        pieces = [p.forward([], True) for p in parts]
        np.testing.assert_array_equal(np.concatenate(pieces), full)
        np.testing.assert_array_equal(np.concatenate([p.aux for p in parts]), whole.aux)


def test_shuffle_permutes_each_epoch_and_is_seeded(tmp_path):
    path, data = store(tmp_path, n=10)
    layer = input_layer(path, batch=10, extra="shuffle: true")
    first, second = layer.forward([], True), layer.forward([], True)
    assert sorted(first[:, 0]) == sorted(data[:, 0]) and not np.array_equal(first, second)
    again = input_layer(path, batch=10, extra="shuffle: true")
    np.testing.assert_array_equal(again.forward([], True), first)


def test_mean_file_and_kvfile_backend(tmp_path):
    kv = str(tmp_path / "d.bin")
    with KVFileWriter(kv) as w:
        for i in range(4):
            w.write(f"{i:05d}", job_pb2.RecordProto(shape=[2], label=i, pixel=bytes([i, 2 * i])))
    mean = str(tmp_path / "mean.bin")
    with KVFileWriter(mean) as w:
        w.write("mean", job_pb2.RecordProto(shape=[2], data=[1.0, 2.0]))
    text = (f'name: "data" type: kRecordInput store_conf {{ backend: "kvfile" path: "{kv}" mean_file: "{mean}" '
            f'batchsize: 4 shape: 2 }}')
    layer = build_layer(conf(text), [], batch=4)
    np.testing.assert_allclose(layer.forward([], True), [[-1, -2], [0, 0], [1, 2], [2, 4]])


def test_missing_file_and_wrong_shape_are_data_errors(tmp_path):
    layer = input_layer(str(tmp_path / "nope.h5"))
    with pytest.raises(DataError, match=r"layer 'data': .*nope.h5: no such data file"):
        layer.forward([], True)
    path, _ = store(tmp_path)
    with pytest.raises(DataError, match=r"samples of shape \(3,\), store_conf.shape is \(4,\)"):
        input_layer(path, shape=(4,)).forward([], True)


def test_image_preprocess_crop_mirror_and_partitions(tmp_path):
    text = 'name: "img" type: kImagePreprocess rgbimage_conf { cropsize: 3 mirror: true scale: 0.5 }'
    x = np.arange(4 * 2 * 5 * 5, dtype=np.float32).reshape(4, 2, 5, 5)
    whole = build_layer(conf(text), [(2, 5, 5)], batch=4, dtype=np.float32)
    whole.ctx.step = 2
    y = whole.forward([x], True)
    assert y.shape == (4, 2, 3, 3)
    part = build_layer(conf(text), [(2, 5, 5)], batch=4,
                       ctx=LayerContext(global_batch=4, seed=7, step=2, batch_slice=(2, 4)))
    np.testing.assert_array_equal(part.forward([x[2:]], True), y[2:])
    centre = whole.forward([x], False)
    np.testing.assert_array_equal(centre, x[:, :, 1:4, 1:4] * 0.5)


def test_output_layers(tmp_path):
    acc = build_layer(conf('name: "a" type: kAccuracy'), [(3,), ()], batch=3)
    acc.forward([np.array([[0, 1, 0], [1, 0, 0], [0, 0, 1.0]]), np.array([1, 2, 2])], False)
    assert acc.metrics() == {"accuracy": 2.0, "count": 3.0}
    top = build_layer(conf('name: "t" type: kArgSort argsort_conf { topk: 2 }'), [(3,)], batch=1)
    np.testing.assert_array_equal(top.forward([np.array([[0.1, 0.7, 0.2]])], False), [[1, 2]])
    csv = build_layer(conf('name: "c" type: kCSVOutput store_conf { path: "out.csv" }'), [(2,)], batch=2,
                      ctx=LayerContext(global_batch=2, workspace=str(tmp_path)))
    csv.forward([np.array([[1.5, 2.0], [3.0, 4.0]])], False)
    assert (tmp_path / "out.csv").read_text().splitlines() == ["1.5,2", "3,4"]
    rec = build_layer(conf('name: "r" type: kRecordOutput store_conf { path: "out.bin" }'), [(2,)], batch=2,
                      ctx=LayerContext(global_batch=2, workspace=str(tmp_path)))
    rec.forward([np.array([[1.5, 2.0], [3.0, 4.0]])], False)
    rec.handle.close()
    np.testing.assert_allclose(read_kvfile(str(tmp_path / "out.bin")).data, [[1.5, 2.0], [3.0, 4.0]])
