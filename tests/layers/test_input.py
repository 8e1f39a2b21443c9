"""Input layers: lazy opening, normalisation, the global data order, partitioned reading, preprocessing."""
import numpy as np
import pytest
from google.protobuf import text_format

from singa_mpi.testing import build_layer
from singa_mpi.data.stores import KVFileWriter, open_store
from singa_mpi.errors import DataError
from singa_mpi.layers.base import LayerConfigError, LayerContext
from singa_mpi.proto import job_pb2

N = 11  # records in the test store: batches of 5 wrap around and cross epochs


def layer_conf(text):
    return text_format.Parse(text, job_pb2.LayerProto())


def make_store(tmp_path, backend="hdf5", n=N, shape=(3,)):
    """Record i holds i*prod(shape) .. (i+1)*prod(shape)-1 and label i % 4: rows reveal their index."""
    data = np.arange(n * int(np.prod(shape)), dtype=np.float32).reshape(n, *shape)
    path = str(tmp_path / f"d.{backend}")
    with open_store(backend, path, "w") as writer:
        writer.write_batch(data, np.arange(n) % 4)
    return path, data


def input_layer(path, batch="batchsize: 5", extra="", backend="hdf5", shape=(3,), ctx=None, seed=7,
                kind="kRecordInput"):
    dims = " ".join(f"shape: {s}" for s in shape)
    text = (f'name: "data" type: {kind} store_conf {{ backend: "{backend}" path: "{path}" {batch} {dims} '
            f'{extra} }}')
    return build_layer(layer_conf(text), [], batch=5, seed=seed, ctx=ctx)


def record_ids(rows):
    return (rows[:, 0] // 3).astype(int)  # for the (3,)-shaped store, unnormalised


def test_setup_needs_no_data_file_and_a_shape(tmp_path):
    layer = input_layer(str(tmp_path / "not-yet.h5"))
    assert layer.out_shape == (3,) and layer.store is None
    with pytest.raises(LayerConfigError) as err:
        input_layer(str(tmp_path / "x.h5"), shape=())
    assert err.value.field == "store_conf.shape"
    with pytest.raises(LayerConfigError, match="store_conf.backend = 'lmdb'"):
        input_layer(str(tmp_path / "x.h5"), backend="lmdb")


def test_normalisation_labels_and_wrap_around(tmp_path):
    path, data = make_store(tmp_path)
    layer = input_layer(path, extra="mean_value: 2 std_value: 4")
    first = layer.forward([], True)
    assert first.dtype == np.float32 and first.shape == (5, 3)
    np.testing.assert_allclose(first, (data[:5] - 2) / 4)
    np.testing.assert_array_equal(layer.aux, [0, 1, 2, 3, 0])
    assert layer.aux.dtype == np.int32
    layer.forward([], True)
    third = layer.forward([], True)  # positions 10..14: record 10, then the store starts over
    np.testing.assert_allclose(third * 4 + 2, data[[10, 0, 1, 2, 3]])


def test_mean_and_std_files(tmp_path):
    path, data = make_store(tmp_path, "kvfile", shape=(2,))
    for name, values in [("mean.bin", [1.0, 2.0]), ("std.bin", [2.0, 0.5])]:
        with KVFileWriter(str(tmp_path / name)) as writer:
            writer.write("mean", job_pb2.RecordProto(shape=[2], data=values))
    extra = f'mean_file: "{tmp_path / "mean.bin"}" std_file: "{tmp_path / "std.bin"}"'
    layer = input_layer(path, backend="kvfile", shape=(2,), extra=extra)
    np.testing.assert_allclose(layer.forward([], True), (data[:5] - [1, 2]) / [2, 0.5])


def test_random_skip_is_seeded_and_within_range(tmp_path):
    path, _ = make_store(tmp_path)
    starts = []
    for seed in range(12):
        first = record_ids(input_layer(path, extra="random_skip: 7", seed=seed).forward([], True))
        np.testing.assert_array_equal(first, (first[0] + np.arange(5)) % N)  # consecutive after the skip
        again = record_ids(input_layer(path, extra="random_skip: 7", seed=seed).forward([], True))
        np.testing.assert_array_equal(again, first)
        starts.append(first[0])
    assert set(starts) <= set(range(8)) and len(set(starts)) > 2


def test_shuffle_gives_a_new_permutation_each_epoch(tmp_path):
    path, _ = make_store(tmp_path)
    layer = input_layer(path, batch=f"batchsize: {N}", extra="shuffle: true")
    epochs = [record_ids(layer.forward([], True)) for _ in range(3)]
    for ids in epochs:
        assert sorted(ids) == list(range(N))
    assert len({tuple(ids) for ids in epochs}) == 3 and list(epochs[0]) != list(range(N))
    again = input_layer(path, batch=f"batchsize: {N}", extra="shuffle: true")
    np.testing.assert_array_equal(record_ids(again.forward([], True)), epochs[0])


@pytest.mark.parametrize("backend", ["hdf5", "kvfile", "textfile"])
@pytest.mark.parametrize("extra", ["", "shuffle: true", "random_skip: 9", "shuffle: true random_skip: 4"])
def test_row_slices_read_exactly_the_rows_of_the_whole_batch(tmp_path, backend, extra):
    path, _ = make_store(tmp_path, backend)
    whole = input_layer(path, backend=backend, extra=extra)
    parts = [input_layer(path, backend=backend, extra=extra, ctx=LayerContext(global_batch=5, seed=7, batch_slice=rows))
             for rows in [(0, 3), (3, 5)]]
    for _ in range(7):  # three epochs, with batches that straddle epoch boundaries
        full = whole.forward([], True)
        pieces = [part.forward([], True) for part in parts]
        np.testing.assert_array_equal(np.concatenate(pieces), full)
        np.testing.assert_array_equal(np.concatenate([part.aux for part in parts]), whole.aux)


def test_per_partition_batch_sizes_add_up_to_the_global_batch(tmp_path):
    path, _ = make_store(tmp_path)
    split = input_layer(path, batch="batchsize: 3 batchsize: 2", extra="shuffle: true")
    single = input_layer(path, extra="shuffle: true")
    assert split.batch_size == 5
    for _ in range(3):
        np.testing.assert_array_equal(split.forward([], True), single.forward([], True))


def test_store_path_falls_back_to_the_workspace(tmp_path, monkeypatch):
    make_store(tmp_path)
    monkeypatch.chdir(tmp_path.parent)
    layer = input_layer("d.hdf5", ctx=LayerContext(global_batch=5, seed=7, workspace=str(tmp_path)))
    assert layer.forward([], True).shape == (5, 3)


def test_data_problems_are_data_errors_naming_the_layer(tmp_path):
    with pytest.raises(DataError, match=r"layer 'data': store_conf.path .*nope.h5: no such file"):
        input_layer(str(tmp_path / "nope.h5")).forward([], True)
    path, _ = make_store(tmp_path)
    with pytest.raises(DataError, match=r"layer 'data': .*records of shape \(3,\), but store_conf.shape is \(4,\)"):
        input_layer(path, shape=(4,)).forward([], True)
    with open_store("hdf5", str(tmp_path / "unlabelled.h5"), "w") as writer:
        writer.write_batch(np.zeros((6, 3)))
    with pytest.raises(DataError, match="has no labels"):
        input_layer(str(tmp_path / "unlabelled.h5")).forward([], True)
    unlabelled = input_layer(str(tmp_path / "unlabelled.h5"), extra="has_label: false")
    unlabelled.forward([], True)
    assert unlabelled.aux is None


def test_csv_input_reads_text_files_by_default(tmp_path):
    (tmp_path / "d.csv").write_text("".join(f"{i % 2},{i},{-i}\n" for i in range(6)))
    text = f'name: "csv" type: kCSVInput store_conf {{ path: "{tmp_path / "d.csv"}" batchsize: 4 shape: 2 }}'
    layer = build_layer(layer_conf(text), [], batch=4)
    np.testing.assert_array_equal(layer.forward([], True), [[0, 0], [1, -1], [2, -2], [3, -3]])
    np.testing.assert_array_equal(layer.aux, [0, 1, 0, 1])


# ------------------------------------------------------------------ kImagePreprocess

def preprocess(text, shape, batch=4, ctx=None):
    return build_layer(layer_conf(f'name: "img" type: kImagePreprocess rgbimage_conf {{ {text} }}'),
                       [shape], batch=batch, ctx=ctx)


def test_random_crop_and_mirror_per_global_sample(tmp_path):
    x = np.arange(4 * 2 * 5 * 5, dtype=np.float32).reshape(4, 2, 5, 5)
    whole = preprocess("cropsize: 3 mirror: true scale: 0.5", (2, 5, 5))
    whole.ctx.step = 2
    y = whole.forward([x], True)
    assert y.shape == (4, 2, 3, 3) and y.dtype == np.float32
    for i in range(4):  # each output is a 3x3 window of its own image, maybe mirrored, times 0.5
        windows = [x[i, :, r:r + 3, c:c + 3] * 0.5 for r in range(3) for c in range(3)]
        assert any(np.array_equal(y[i], w) or np.array_equal(y[i], w[:, :, ::-1]) for w in windows)
    np.testing.assert_array_equal(whole.forward([x], True), y)  # same step: same crops
    whole.ctx.step = 3
    assert not np.array_equal(whole.forward([x], True), y)
    part = preprocess("cropsize: 3 mirror: true scale: 0.5", (2, 5, 5),
                      ctx=LayerContext(global_batch=4, seed=7, step=2, batch_slice=(1, 4)))
    np.testing.assert_array_equal(part.forward([x[1:]], True), y[1:])


def test_centre_crop_at_test_and_no_crop_keeps_shape():
    x = np.random.default_rng(0).normal(size=(2, 3, 6, 4))  # float64 stays float64
    layer = preprocess("cropsize: 2 mirror: true", (3, 6, 4), batch=2)
    np.testing.assert_array_equal(layer.forward([x], False), x[:, :, 2:4, 1:3])
    plain = preprocess("scale: 2", (3, 6, 4), batch=2)
    assert plain.out_shape == (3, 6, 4)
    out = plain.forward([x], True)
    assert out.dtype == np.float64
    np.testing.assert_array_equal(out, 2 * x)
    assert plain.backward(out, [True]) == [None]


def test_preprocess_conf_errors():
    with pytest.raises(LayerConfigError, match="rgbimage_conf.cropsize = 7"):
        preprocess("cropsize: 7", (3, 6, 6))
    with pytest.raises(LayerConfigError, match="rgbimage_conf.meanfile"):
        preprocess('meanfile: "m.bin"', (3, 6, 6))
    with pytest.raises(LayerConfigError, match="srclayers"):
        preprocess("cropsize: 2", (36,))


@pytest.mark.parametrize("written, resumed", [(2, 1), (1, 2), (2, 3)])
def test_a_resume_with_another_number_of_worker_groups_goes_on_after_the_batches_read(tmp_path, written, resumed):
    """A reader's position counted its own group's batches (every G-th global one) and was taken as its
    own count by a job of another number of groups: a Downpour checkpoint of 2 groups, resumed by one
    synchronous group after 10 steps, read global batch 10 again (groups 0 and 1 had read 0..19), and a
    serial checkpoint resumed by 2 groups skipped batches 10..19.  Every group now starts after the
    global batches read, at the first of its own."""
    path, _ = make_store(tmp_path, n=200)
    writer = input_layer(path, ctx=LayerContext(global_batch=5, seed=7, stream=(0, written)))
    for _ in range(10):
        writer.forward([], True)
    state = writer.state()
    for group in range(resumed):
        reader = input_layer(path, ctx=LayerContext(global_batch=5, seed=7, stream=(group, resumed)))
        reader.load_state(state)
        first = reader.global_batch_number()
        # none read before, and at most resumed - 1 skipped where 10 * written is no multiple of resumed
        assert 0 <= first - 10 * written < 2 * resumed - 1 and first % resumed == group, (group, first)
    last = input_layer(path, ctx=LayerContext(global_batch=5, seed=7, stream=(written - 1, written)))
    last.load_state(state)
    assert last.global_batch_number() == 10 * written + written - 1  # the same layout: as it was


def test_a_resume_takes_each_group_s_own_position_and_another_layout_the_batches_they_read(tmp_path):
    """A checkpoint of groups at their own pace (ahead<g>: group g's batches beyond group 0's): each
    group of the same layout goes on from its own position; a job of another number of groups starts
    after every batch the groups read in all (group 0's count times the groups took none ahead)."""
    path, _ = make_store(tmp_path, n=200)
    state = {"batches": 10, "groups": 3, "ahead1": 4, "ahead2": -2}
    for group, own in enumerate((10, 14, 8)):
        reader = input_layer(path, ctx=LayerContext(global_batch=5, seed=7, stream=(group, 3)))
        reader.load_state(state)
        assert reader.batches == own
        if group == 0:  # the writer's: the checkpoint moves each ahead<g> by the steps trained since
            assert reader.state() == state
    one = input_layer(path, ctx=LayerContext(global_batch=5, seed=7, stream=(0, 1)))
    one.load_state(state)
    assert one.global_batch_number() == 10 + 14 + 8 and one.state() == {"batches": 32}


@pytest.mark.parametrize("text,shape", [("cropsize: 3 mirror: true scale: 0.5", (2, 5, 7)),
                                        ("cropsize: 4 mirror: true", (3, 4, 6)), ("mirror: true", (1, 3, 3)),
                                        ("cropsize: 2", (2, 5, 5))])
@pytest.mark.parametrize("train", [True, False])
def test_crops_are_each_sample_s_window_at_its_drawn_place(text, shape, train):
    """The layer's crops against sample-by-sample slicing at the places it drew (an odd batch, a slice of rows)."""
    ctx = LayerContext(global_batch=9, seed=5, step=4, batch_slice=(2, 7))
    layer = preprocess(text, shape, ctx=ctx)
    x = np.random.default_rng(1).standard_normal((5,) + shape).astype(np.float32)
    tops, lefts, flips = layer._placement(*shape[1:], train)
    assert not train or flips.any() or "mirror" not in text  # the seed mirrors some
    crop_h, crop_w = layer.crop
    expected = []
    for i in range(5):
        window = x[i, :, tops[i]:tops[i] + crop_h, lefts[i]:lefts[i] + crop_w]
        expected.append((window[:, :, ::-1] if flips[i] else window) * np.float32(layer.scale))
    y = layer.forward([x], train)
    assert y.dtype == np.float32 and y.flags.c_contiguous
    np.testing.assert_array_equal(y, np.stack(expected))
