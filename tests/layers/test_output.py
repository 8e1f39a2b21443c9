"""Output layers: accuracy counts, top-k order, and CSV/kvfile writers read back."""
import numpy as np
import pytest
from google.protobuf import text_format

from singa_mpi.testing import build_layer
from singa_mpi.data.stores import KVFileStore, open_store
from singa_mpi.layers.base import LayerConfigError, LayerContext
from singa_mpi.proto import job_pb2


def layer_conf(text):
    return text_format.Parse(text, job_pb2.LayerProto())


def test_accuracy_counts_correct_rows_and_resets():
    acc = build_layer(layer_conf('name: "a" type: kAccuracy'), [(3,), ()], batch=4)
    scores = np.array([[0, 1, 0], [1, 0, 0], [0, 0, 1.0], [0.2, 0.1, 0.7]])
    out = acc.forward([scores, np.array([1, 2, 2, 0], np.int32)], False)
    assert out is scores
    acc.forward([scores[:2], np.array([1, 0])], False)
    assert acc.metrics() == {"accuracy": 4.0, "accuracy/count": 6.0}
    assert acc.metrics() == {}
    assert acc.backward(None, [True, False]) == [None, None]


def test_argsort_gives_the_topk_indices_largest_first():
    top = build_layer(layer_conf('name: "t" type: kArgSort argsort_conf { topk: 3 }'), [(4,)], batch=2)
    assert top.out_shape == (3,)
    out = top.forward([np.array([[0.1, 0.7, 0.2, 0.0], [5.0, 1.0, 5.0, 3.0]], np.float32)], False)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [[1, 2, 0], [0, 2, 3]])  # ties: lower index first
    with pytest.raises(LayerConfigError, match="argsort_conf.topk = 5"):
        build_layer(layer_conf('name: "t" type: kArgSort argsort_conf { topk: 5 }'), [(4,)], batch=2)


def writer_layer(kind, path, tmp_path, shape=(2,), ctx=None):
    ctx = ctx or LayerContext(global_batch=2, workspace=str(tmp_path / "ws"))
    return build_layer(layer_conf(f'name: "out" type: {kind} store_conf {{ path: "{path}" }}'), [shape],
                       batch=2, ctx=ctx)


def test_csv_output_appends_rows_under_the_workspace(tmp_path):
    layer = writer_layer("kCSVOutput", "feat/out.csv", tmp_path)
    path = tmp_path / "ws" / "feat" / "out.csv"
    assert not path.exists()  # opened on the first batch, not in setup
    rows = np.array([[1.5, 2.0], [3.0, 1 / 3]], np.float32)
    assert layer.forward([rows], False) is rows
    layer.forward([rows * 2], False)
    assert path.read_text().splitlines()[0] == "1.5,2"
    store = open_store("textfile", str(path), has_label=False)
    np.testing.assert_array_equal(store.read(np.arange(4))[0], np.concatenate([rows, rows * 2]))  # exact float32
    layer.close_files()


def test_record_output_writes_a_kvfile_with_running_keys(tmp_path):
    layer = writer_layer("kRecordOutput", str(tmp_path / "feat.bin"), tmp_path, shape=(1, 2))
    first = np.array([[[1.5, 2.0]], [[3.0, 4.0]]], np.float32)
    layer.forward([first], False)
    layer.forward([first[:1] - 1], False)
    layer.close_files()
    store = KVFileStore(str(tmp_path / "feat.bin"))
    assert store.keys == [b"0000000000", b"0000000001", b"0000000002"]
    assert store.shape == (1, 2) and not store.has_labels
    np.testing.assert_array_equal(store.read(np.arange(3))[0], np.concatenate([first, first[:1] - 1]))


def test_writers_refuse_a_batch_slice(tmp_path):
    ctx = LayerContext(global_batch=4, batch_slice=(0, 2), workspace=str(tmp_path))
    with pytest.raises(LayerConfigError, match="partition_dim = 0: expected -1"):
        writer_layer("kCSVOutput", "x.csv", tmp_path, ctx=ctx)
    with pytest.raises(LayerConfigError, match="store_conf.path"):
        build_layer(layer_conf('name: "out" type: kRecordOutput'), [(2,)], batch=2)


def test_a_writer_dropped_without_close_files_is_closed_without_a_resource_warning(tmp_path):
    import gc
    import warnings

    layer = writer_layer("kCSVOutput", "out.csv", tmp_path)
    layer.forward([np.ones((2, 2), np.float32)], False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        del layer
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]
    assert (tmp_path / "ws" / "out.csv").read_text() == "1,1\n1,1\n"


@pytest.mark.parametrize("kind", ["kCSVOutput", "kRecordOutput"])
def test_a_resumed_writer_cuts_the_file_back_to_its_state_and_appends(tmp_path, kind):
    batches = [np.full((2, 2), i, np.float32) for i in range(4)]
    straight = writer_layer(kind, "straight.out", tmp_path)
    for rows in batches:
        straight.forward([rows], False)
    straight.close_files()
    first = writer_layer(kind, "resumed.out", tmp_path)
    first.forward([batches[0]], False)
    state = first.state()  # a checkpoint after one batch
    assert state == {"bytes": (tmp_path / "ws" / "resumed.out").stat().st_size, "rows": 2}
    first.forward([batches[1] + 9], False)  # trained after the checkpoint: dropped
    first.close_files()
    resumed = writer_layer(kind, "resumed.out", tmp_path)
    resumed.load_state(state)
    assert resumed.state() == state  # carried on until it writes
    for rows in batches[1:]:
        resumed.forward([rows], False)
    resumed.close_files()
    assert (tmp_path / "ws" / "resumed.out").read_bytes() == (tmp_path / "ws" / "straight.out").read_bytes()


def test_an_output_file_that_cannot_be_written_is_a_data_error_naming_it(tmp_path):
    from singa_mpi.errors import DataError

    (tmp_path / "ws").mkdir()
    (tmp_path / "ws" / "feat").write_text("a file where the folder should be")
    layer = writer_layer("kCSVOutput", "feat/out.csv", tmp_path)
    with pytest.raises(DataError, match=r"layer 'out': .*feat/out.csv: cannot write this output file: "):
        layer.forward([np.ones((2, 2), np.float32)], False)
