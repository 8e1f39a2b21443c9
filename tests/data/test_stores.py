"""Stores: SINGA's kvfile bytes, round trips for every backend, torn files, caching, errors."""
import os
import warnings

import h5py
import numpy as np
import pytest

import nets
from singa_mpi.data.stores import KVFileWriter, open_store, read_first_record
from singa_mpi.errors import ConfigError, DataError
from singa_mpi.proto import job_pb2

BACKENDS = ["hdf5", "kvfile", "textfile", "shard"]


def pixel_records(path, count=6, shape=(2, 3)):
    """A kvfile of uint8 records with labels 10 + i, written tuple by tuple."""
    images = np.random.default_rng(0).integers(0, 256, (count, *shape)).astype(np.uint8)
    with KVFileWriter(str(path)) as writer:
        for i, image in enumerate(images):
            writer.write(f"{i:05d}", job_pb2.RecordProto(shape=list(shape), label=10 + i, pixel=image.tobytes()))
    return images


def test_kvfile_tuple_is_byte_for_byte_singas(tmp_path):
    path = tmp_path / "one.bin"
    with KVFileWriter(str(path)) as writer:
        writer.write("00000", job_pb2.RecordProto(shape=[2], label=3, pixel=bytes([7, 9])))
    # [key_len: size_t LE][key][value_len: size_t LE][RecordProto: shape=2 (field 1), label=3 (2), pixel (3)]
    expected = (bytes([5, 0, 0, 0, 0, 0, 0, 0]) + b"00000" + bytes([8, 0, 0, 0, 0, 0, 0, 0])
                + bytes([0x08, 2, 0x10, 3, 0x1A, 2, 7, 9]))
    assert path.read_bytes() == expected


def test_kvfile_pixel_and_float_records_read_back_by_index(tmp_path):
    images = pixel_records(tmp_path / "p.bin")
    store = open_store("kvfile", str(tmp_path / "p.bin"))
    assert len(store) == 6 and store.shape == (2, 3) and store.has_labels
    data, labels = store.read(np.array([4, 1, 4]))
    assert data.dtype == np.float32 and labels.dtype == np.int32
    np.testing.assert_array_equal(data, images[[4, 1, 4]])
    np.testing.assert_array_equal(labels, [14, 11, 14])
    with KVFileWriter(str(tmp_path / "f.bin")) as writer:
        writer.write(b"a", job_pb2.RecordProto(shape=[3], data=[0.5, -1.0, 2.25]))
    data, labels = open_store("kvfile", str(tmp_path / "f.bin")).read(np.array([0]))
    np.testing.assert_array_equal(data, [[0.5, -1.0, 2.25]])
    assert labels is None  # records without a label field: an unlabelled store


@pytest.mark.parametrize("limit", [0, 1 << 30], ids=["per-batch", "cached"])
@pytest.mark.parametrize("backend", ["kvfile", "hdf5"])
def test_cached_and_per_batch_reads_agree(tmp_path, backend, limit):
    data = np.random.default_rng(1).normal(size=(9, 2, 2)).astype(np.float32)
    path = str(tmp_path / "s")
    with open_store(backend, path, "w") as writer:
        writer.write_batch(data, np.arange(9))
    store = open_store(backend, path, cache_limit=limit)
    picks = np.array([8, 0, 3, 3, 5])  # unsorted with a repeat: h5py alone would refuse
    got, labels = store.read(picks)
    np.testing.assert_array_equal(got, data[picks])
    np.testing.assert_array_equal(labels, picks)
    assert (store._cache is not None) == bool(limit)  # small stores are decoded once, then indexed


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [np.uint8, np.float32])
def test_writers_round_trip_in_batches(tmp_path, backend, dtype):
    data = (np.random.default_rng(2).random((7, 2, 3)) * 200).astype(dtype)
    labels = np.array([0, 1, 2, 3, 4, 5, 6]) * 3
    path = str(tmp_path / "store")
    with open_store(backend, path, "w") as writer:
        writer.write_batch(data[:4], labels[:4])
        writer.write_batch(data[4:], labels[4:])
    store = open_store(backend, path)
    got, got_labels = store.read(np.arange(7))
    np.testing.assert_array_equal(got.reshape(data.shape), data.astype(np.float32))
    np.testing.assert_array_equal(got_labels, labels)


def test_folder_holding_shard_dat(tmp_path):
    (tmp_path / "train_shard").mkdir()
    images = pixel_records(tmp_path / "train_shard" / "shard.dat", count=3)
    data, _ = open_store("kvfile", str(tmp_path / "train_shard")).read(np.arange(3))
    np.testing.assert_array_equal(data, images)


@pytest.mark.parametrize("cut", [3, 8 + 5 + 4, -2], ids=["in key length", "in value length", "in value"])
def test_torn_last_tuple_is_dropped_with_a_warning(tmp_path, cut):
    path = tmp_path / "t.bin"
    images = pixel_records(path, count=4)
    whole = path.read_bytes()
    tuple_size = len(whole) // 4  # equal-sized records
    path.write_bytes(whole[:3 * tuple_size + cut] if cut > 0 else whole[:cut])
    with pytest.warns(UserWarning, match="torn record"):
        store = open_store("kvfile", str(path))
    assert len(store) == 3
    np.testing.assert_array_equal(store.read(np.arange(3))[0], images[:3])


def test_duplicate_and_empty_keys_are_rejected(tmp_path):
    with KVFileWriter(str(tmp_path / "d.bin")) as writer:
        writer.write("k", job_pb2.RecordProto(label=1, pixel=b"\x01"))
        with pytest.raises(ValueError, match="already written"):
            writer.write(b"k", job_pb2.RecordProto(label=2))
        with pytest.raises(ValueError, match="empty key"):
            writer.write("", job_pb2.RecordProto(label=2))
    assert len(open_store("kvfile", str(tmp_path / "d.bin"))) == 1


def test_record_of_another_size_is_a_data_error(tmp_path):
    with KVFileWriter(str(tmp_path / "m.bin")) as writer:
        writer.write("0", job_pb2.RecordProto(shape=[2], label=0, data=[1, 2]))
        writer.write("1", job_pb2.RecordProto(shape=[3], label=1, data=[1, 2, 3]))
    with pytest.raises(DataError, match=r"record 1 \(key b'1'\) has 3 values, expected 2"):
        open_store("kvfile", str(tmp_path / "m.bin")).read(np.array([0]))


def test_mean_file_is_the_first_record(tmp_path):
    with KVFileWriter(str(tmp_path / "mean.bin")) as writer:
        writer.write("mean", job_pb2.RecordProto(shape=[2], data=[1.5, 2.5]))
        writer.write("other", job_pb2.RecordProto(shape=[2], data=[9, 9]))
    np.testing.assert_array_equal(read_first_record(str(tmp_path / "mean.bin")), [1.5, 2.5])


def test_textfile_with_and_without_labels(tmp_path):
    (tmp_path / "d.csv").write_text("1,0.5,2\n0,1.5,-3\n")
    store = open_store("textfile", str(tmp_path / "d.csv"))
    data, labels = store.read(np.array([1, 0]))
    np.testing.assert_array_equal(data, [[1.5, -3], [0.5, 2]])
    np.testing.assert_array_equal(labels, [0, 1])
    unlabelled = open_store("textfile", str(tmp_path / "d.csv"), has_label=False)
    assert unlabelled.shape == (3,) and not unlabelled.has_labels
    (tmp_path / "s.txt").write_text("2;7;8\n")
    np.testing.assert_array_equal(open_store("textfile", str(tmp_path / "s.txt"), separator=";").read([0])[0],
                                  [[7, 8]])
    (tmp_path / "bad.csv").write_text("1,a,2\n")
    with pytest.raises(DataError, match="bad.csv: line 1, column 2: 'a' is not a number: expected a table of numbers"):
        open_store("textfile", str(tmp_path / "bad.csv"))


def test_hdf5_without_labels_and_without_data(tmp_path):
    with h5py.File(tmp_path / "x.h5", "w") as f:
        f["data"] = np.arange(6, dtype=np.float32).reshape(3, 2)
    store = open_store("hdf5", str(tmp_path / "x.h5"))
    assert not store.has_labels and store.read(np.array([2]))[1] is None
    with h5py.File(tmp_path / "y.h5", "w") as f:
        f["pixels"] = np.zeros(3)
    with pytest.raises(DataError, match="without a 'data' dataset \\(found: pixels\\)"):
        open_store("hdf5", str(tmp_path / "y.h5"))


def test_errors_name_layer_path_and_shapes(tmp_path):
    with pytest.raises(DataError, match=r"layer 'data': .*missing.h5: no such file"):
        open_store("hdf5", str(tmp_path / "missing.h5"), layer="data")
    with pytest.raises(ConfigError, match="expected one of hdf5, kvfile, memory, shard, textfile"):
        open_store("lmdb", str(tmp_path))
    pixel_records(tmp_path / "p.bin")
    with pytest.raises(DataError, match=r"records of shape \(2, 3\), but store_conf.shape is \(5,\)"):
        open_store("kvfile", str(tmp_path / "p.bin"), shape=(5,))
    assert open_store("kvfile", str(tmp_path / "p.bin"), shape=(6,)).shape == (2, 3)  # same count: fine
    (tmp_path / "empty.bin").write_bytes(b"")
    with pytest.raises(DataError, match="empty kvfile"):
        open_store("kvfile", str(tmp_path / "empty.bin"))
    (tmp_path / "junk.h5").write_bytes(b"not hdf5")
    with warnings.catch_warnings(), pytest.raises(DataError, match="cannot read it as a hdf5 store"):
        open_store("hdf5", str(tmp_path / "junk.h5"))


@pytest.mark.parametrize("field, value, found", [
    ("data", np.array([[b"abc"] * 12] * 5), "of type |S3"),
    ("data", np.ones((5, 12), np.complex64), "of type complex64"),
    ("data", None, "a group"),
    ("label", np.array([b"a"] * 5), "of type |S1"),
    ("label", None, "a group"),
])
def test_an_hdf5_dataset_of_no_numbers_is_named_not_called_damaged(tmp_path, field, value, found):
    """Strings were "damaged HDF5 store: cannot read its records ... write it again", a group where 'data' should
    be "damaged, or not an HDF5 file", and complex values trained on their real part after numpy's warning."""
    path = str(tmp_path / "d.h5")
    with h5py.File(path, "w") as f:
        f["data"], f["label"] = np.zeros((5, 12), np.float32), np.zeros(5, np.int32)
        del f[field]
        if value is None:
            f.create_group(field)
        else:
            f[field] = value
    with pytest.raises(DataError) as err:
        open_store("hdf5", path, layer="data").read(np.arange(5))
    assert str(err.value) == (f"layer 'data': {path}: '{field}' is {found}: expected a dataset of numbers (integers or "
                              f"floats), as `singa-mpi data` writes")


def test_a_folder_named_as_a_kvfile_is_one_line_saying_what_was_expected(tmp_path):
    """A kvfile's path naming a folder (SINGA reads a v0.1 folder's shard.dat) without shard.dat said
    "PATH/shard.dat: no such file", a file nobody had named."""
    (tmp_path / "train.kv").mkdir()
    with pytest.raises(DataError) as err:
        open_store("kvfile", str(tmp_path / "train.kv"), layer="data")
    assert str(err.value) == (f"layer 'data': {tmp_path / 'train.kv'}: a folder without a file shard.dat: expected a "
                              f"kvfile (or SINGA 0.1's DataShard folder, holding shard.dat)")


def test_an_hdf5_store_it_may_not_read_is_named_so_not_damaged(tmp_path, monkeypatch):
    """h5py raises a PermissionError (an OSError) for a file the process may not read, which was worded as
    damage: "cannot read it as a hdf5 store: damaged, or not an HDF5 file: expected an HDF5 file ..."; it now
    reads as the other backends' unreadable files do.  (h5py's exception as it raises it: running as root, a
    chmod 000 is read all the same, so the next test cannot show it here.)"""
    import h5py as h5py_module

    path = nets.make_data(str(tmp_path / "d.h5"), 8, (12,), 5)

    def denied(name, mode="r", **kwargs):
        raise PermissionError(13, f"Unable to synchronously open file (unable to open file: name = '{name}', "
                                  f"errno = 13, error message = 'Permission denied', flags = 0, o_flags = 0)")

    monkeypatch.setattr(h5py_module, "File", denied)
    with pytest.raises(DataError) as err:
        open_store("hdf5", path, layer="data")
    assert str(err.value) == f"layer 'data': {path}: cannot read it as a hdf5 store (Permission denied)"


@pytest.mark.parametrize("backend", ["hdf5", "kvfile", "shard", "textfile"])
def test_a_store_it_may_not_read_is_one_line_saying_so(tmp_path, backend):
    from singa_mpi.data.convert import write_store
    from singa_mpi.data.stores import kvfile_path

    path = write_store(str(tmp_path / "d"), backend, np.zeros((4, 3), np.float32), np.arange(4))
    os.chmod(kvfile_path(path) if backend == "shard" else path, 0)
    if os.access(kvfile_path(path), os.R_OK):
        pytest.skip("this process reads a file of mode 000 (root)")
    with pytest.raises(DataError) as err:
        open_store(backend, path, layer="data")
    assert str(err.value).endswith(f"cannot read it as a {backend} store (Permission denied)"), str(err.value)


# A store too big to be decoded whole is read from its mapped file batch by batch, in a subprocess: the old
# reader died by SIGBUS there, which no pytest.raises catches
CHANGED_WHILE_READ = """
import sys
import numpy as np
from singa_mpi.data.stores import open_store
backend, path, file, how = sys.argv[1:]
store = open_store(backend, path, cache_limit=0)
store.read(np.arange(len(store) - 1, 0, -1))
with open(file, "r+b") as f:
    if how == "truncated":
        f.truncate(100)
    else:  # the same bytes written again in place, as a converter run again would
        f.write(f.read())
try:
    store.read(np.array([len(store) - 1]))  # a page past the new end: SIGBUS
except Exception as err:
    print(type(err).__name__, err)
"""


@pytest.mark.parametrize("how", ["truncated", "rewritten"])
@pytest.mark.parametrize("backend", ["kvfile", "shard"])
def test_a_kvfile_that_changes_while_a_run_reads_it_is_one_line_not_a_bus_error(tmp_path, backend, how):
    """A kvfile over MEMORY_LIMIT is mapped and read batch by batch; cut short in place meanwhile (a converter
    writing it again), the next read touched pages past its new end and the process died of SIGBUS ("Bus
    error", exit 135, every other rank aborted), or read other records than its index said."""
    import subprocess
    import sys

    from singa_mpi.data.convert import write_store
    from singa_mpi.data.stores import kvfile_path

    path = write_store(str(tmp_path / "d"), backend, np.arange(4000, dtype=np.float32).reshape(200, 20), np.arange(200) % 3)
    file = kvfile_path(path)
    done = subprocess.run([sys.executable, "-c", CHANGED_WHILE_READ, backend, path, file, how],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.startswith(f"DataError {file}: changed while this run read it"), done.stdout
    assert "expected it unchanged until the run ends" in done.stdout and "\n" not in done.stdout.strip()


@pytest.mark.parametrize("backend", ["kvfile", "shard"])
def test_kvfile_labels_are_read_whole_without_decoding_the_records(tmp_path, backend):
    """every_label parses each record's label (the launcher checks them all before training); a store
    without labels has none to give."""
    from singa_mpi.data.convert import write_store

    data = np.zeros((7, 2, 3), np.uint8)
    path = write_store(str(tmp_path / "l"), backend, data, np.arange(7) * 3)
    with open_store(backend, path) as store:
        store.cache_limit = 0
        np.testing.assert_array_equal(store.every_label(), np.arange(7) * 3)
    path = write_store(str(tmp_path / "u"), backend, data, None)
    with open_store(backend, path) as store:
        assert store.every_label() is None


@pytest.mark.parametrize("backend", ["kvfile", "shard", "hdf5"])
def test_labels_are_read_a_bounded_number_of_records_at_a_time(tmp_path, backend, monkeypatch):
    """The check before training reads a store's labels WALK_RECORDS records at a time, so a file of any
    size is checked in bounded memory (a kvfile over 1 GiB went unchecked, its bad labels met mid-run)."""
    from singa_mpi.data import stores
    from singa_mpi.data.convert import write_store

    monkeypatch.setattr(stores, "WALK_RECORDS", 3)
    path = write_store(str(tmp_path / "l"), backend, np.zeros((7, 2, 3), np.uint8), np.arange(7) * 3)
    with open_store(backend, path) as store:
        store.cache_limit = 0
        chunks = list(store.label_chunks())
    assert [(start, len(labels)) for start, labels in chunks] == [(0, 3), (3, 3), (6, 1)]
    np.testing.assert_array_equal(np.concatenate([labels for _, labels in chunks]), np.arange(7) * 3)


@pytest.mark.parametrize("declared", [[], [12]])
def test_a_kvfile_whose_records_hold_no_values_is_one_line_naming_the_record(tmp_path, declared):
    """Records of a label alone (no float data, no pixels) read as records of shape (0,): "records of shape
    (0,), but store_conf.shape is (12,): expected a shape whose sizes multiply to 0", as if the job were
    wrong; with a shape declared, "record 0 has 0 values but shape [12]".  Now the file and the record."""
    path = str(tmp_path / "labels_only.bin")
    with KVFileWriter(path) as writer:
        for i in range(4):
            writer.write(f"{i:05d}", job_pb2.RecordProto(shape=declared, label=1))
    with pytest.raises(DataError) as err:
        open_store("kvfile", path, layer="data", shape=(12,))
    assert str(err.value) == (f"layer 'data': {path}: record 0 (key b'00000') holds no values: expected a RecordProto "
                              f"with its values as float data or pixel bytes")


def test_an_hdf5_store_of_records_without_values_is_one_line(tmp_path):
    path = str(tmp_path / "zero.h5")
    with h5py.File(path, "w") as f:
        f["data"], f["label"] = np.zeros((5, 3, 0), np.float32), np.zeros(5, np.int32)
    with pytest.raises(DataError) as err:
        open_store("hdf5", path, layer="data", shape=(12,))
    assert str(err.value) == (f"layer 'data': {path}: 'data' of shape (5, 3, 0): records of no values: expected "
                              f"(N, *shape) with every size above 0")


def test_a_mean_file_of_another_kind_says_what_it_is(tmp_path):
    """An HDF5 or CSV store, an MNIST file or a kvfile of labelled samples given as a mean file was "a
    damaged kvfile" (a corrupt key length at byte 0), or worse, its first image was taken as the mean."""
    from singa_mpi.data.convert import write_store

    expected = ("expected a kvfile of one record holding one value per input value (`singa-mpi data cifar10 ... "
                "--mean FILE` writes SINGA's image_mean.bin)")
    data, labels = np.zeros((3, 2), np.float32), np.arange(3)
    files = {"a.h5": "an HDF5 file", "a.csv": "a text file (a CSV store?)",
             "a.bin": "a kvfile of 3 labelled records (a store of samples?)", "idx": "an MNIST IDX image file"}
    write_store(str(tmp_path / "a.h5"), "hdf5", data, labels)
    write_store(str(tmp_path / "a.csv"), "textfile", data, labels)
    write_store(str(tmp_path / "a.bin"), "kvfile", data, labels)
    (tmp_path / "idx").write_bytes(bytes([0, 0, 8, 3, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 7]))
    for name, kind in files.items():
        with pytest.raises(DataError) as err:
            read_first_record(str(tmp_path / name))
        assert str(err.value) == f"{tmp_path / name}: {kind}: {expected}"


@pytest.mark.parametrize("text, separator, problem", [
    (b"1," + b",".join([b"0.5"] * 5000) + b"\n2," + b"0.5," * 999 + b"abc," + b",".join([b"0.5"] * 4000) + b"\n",
     ",", "line 2, column 1001: 'abc' is not a number"),
    (b"# a comment\n\n1,2,3\n2,3," + b"9" * 500 + b"a\n", ",",
     "line 4, column 3: '9999999999999999999999999999999999999999... (501 characters)' is not a number"),
    (b"1 2 3\n4 5 6\n", ",", "line 1, column 1: '1 2 3' is not a number"),
    (b"1,2,3\n2,3\n", ",", "line 2: 2 values, where line 1 has 3"),
    (b"1 2 3\n2 3 \xe9\n", "", "line 2, byte 5: 0xe9 is not UTF-8 text"),
])
def test_a_text_table_that_is_not_numbers_names_the_field_not_the_row(tmp_path, text, separator, problem):
    """numpy's message quoted the whole field (with a wrong separator, the whole row: megabytes on one
    line), counted rows from 0, and said nothing about the line of a byte that is no UTF-8."""
    (tmp_path / "t.csv").write_bytes(text)
    with pytest.raises(DataError) as err:
        open_store("textfile", str(tmp_path / "t.csv"), separator=separator)
    between = "whitespace" if not separator else repr(separator)
    assert str(err.value) == f"{tmp_path / 't.csv'}: {problem}: expected a table of numbers separated by {between}"


@pytest.mark.parametrize("has_label, column", [(True, 3), (False, 3)])
def test_a_text_store_of_nan_or_inf_is_refused_naming_the_value(tmp_path, has_label, column):
    """numpy reads "nan" and "inf": a CSV with missing values converted (and trained) without a word."""
    (tmp_path / "t.csv").write_text("1,0.5,2\n0,1.5,nan\n1,2,inf\n")
    with pytest.raises(DataError) as err:
        open_store("textfile", str(tmp_path / "t.csv"), has_label=has_label)
    assert str(err.value) == (f"{tmp_path / 't.csv'}: row 2, column {column}: nan: expected a finite number "
                              f"(a missing value?)")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("value", [np.nan, -np.inf])
def test_a_store_decoded_whole_names_its_first_nonfinite_record(tmp_path, backend, value):
    """A store small enough to be decoded whole on its first read is looked at whole before training:
    the first NaN or infinity is found by record and value (a text store refuses it when read)."""
    data = np.random.default_rng(4).normal(size=(40, 2, 3)).astype(np.float32)
    data[31, 1, 2], data[35, 0, 0] = value, np.nan
    path = str(tmp_path / "store")
    with open_store(backend, path, "w") as writer:
        writer.write_batch(data, np.arange(40) % 3)
    if backend == "textfile":
        with pytest.raises(DataError, match=r"row 32, column 7: .*expected a finite number"):
            open_store(backend, path)
        return
    store = open_store(backend, path)
    record, at, found = store.first_nonfinite()
    assert (record, at) == (31, 5) and (np.isnan(found) if np.isnan(value) else found == value)
    assert store._cache is None  # looked at in pieces: the reads to come decide what they keep
    assert store.first_nonfinite(limit=40 * 6 * 4) is None  # too big for a read of that limit to decode whole
    clean = str(tmp_path / "clean")
    with open_store(backend, clean, "w") as writer:
        writer.write_batch(np.nan_to_num(data), np.arange(40) % 3)
    assert open_store(backend, clean).first_nonfinite() is None


def test_a_store_of_pixels_is_not_decoded_to_look_for_nonfinite_values(tmp_path):
    """uint8 holds no NaN: an HDF5 store of pixels is not read whole for nothing."""
    path = str(tmp_path / "pixels.h5")
    with open_store("hdf5", path, "w") as writer:
        writer.write_batch(np.zeros((5, 4), np.uint8), np.arange(5))
    store = open_store("hdf5", path)
    store._decode_span = None  # a scan would call it
    assert store.first_nonfinite() is None


def random_kvfile(path, rng, count: int, classes: int, backend: str = "kvfile", unlabelled: bool = False) -> None:
    """``count`` records of 6 values: pixels or floats, labels in 0..classes (the limit itself included,
    and beyond), some with a field protobuf keeps as unknown; ``unlabelled``: some without a label."""
    from singa_mpi.data.shard import DataShardWriter

    writer = DataShardWriter(str(path)) if backend == "shard" else KVFileWriter(str(path))
    with writer:
        for i in range(count):
            record = job_pb2.RecordProto(shape=[2, 3])
            if i == 0 or not unlabelled or rng.random() < 0.9:  # the first holds one: a labelled store
                record.label = int(rng.choice([0, classes - 1, classes, classes + 1, 2 ** 31 - 1, -1,
                                               int(rng.integers(0, classes))]))
            if rng.random() < 0.5:
                record.pixel = rng.integers(0, 256, 6).astype(np.uint8).tobytes()
            else:
                record.data.extend(rng.normal(size=6).tolist())
            if rng.random() < 0.1:
                record.MergeFromString(bytes([0xA0, 0x06, 0x07]))  # field 100, an unknown varint
            writer.write(f"{i:06d}", record)


def parsed_labels(store) -> np.ndarray:
    """The labels as the per-record parse reads them (every_label's way before it read them together)."""
    return np.array([store.record(row).label for row in range(len(store))], np.int64)


@pytest.mark.parametrize("backend", ["kvfile", "shard"])
@pytest.mark.parametrize("count", [1, 2, 997])
@pytest.mark.parametrize("seed", [0, 1])
def test_every_kvfile_label_is_read_as_the_per_record_parse_reads_it(tmp_path, backend, count, seed, monkeypatch):
    """The labels of every record, read together from the bytes, are the parse's, label by label: at the
    class limit and past it, negative, beside unknown fields; no record is parsed for them (seed 1: read
    100 records at a time).  (Records without a label are refused: the next test.)"""
    from singa_mpi.data import stores

    if seed:
        monkeypatch.setattr(stores, "WALK_RECORDS", 100)
    random_kvfile(tmp_path / "s", np.random.default_rng(seed), count, classes=10, backend=backend)
    with open_store(backend, str(tmp_path / "s")) as store:
        expected = parsed_labels(store)
        store.record = None  # the labels come from the bytes of all records at once
        got = store.every_label()
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("backend", ["kvfile", "shard"])
@pytest.mark.parametrize("walked", [1 << 20, 100])
def test_a_record_without_a_label_in_a_labelled_kvfile_is_refused_naming_it(tmp_path, backend, walked, monkeypatch):
    """Record 0 holds a label, a later one none: protobuf reads it as label 0, and the run trained on a wrong
    label without a word.  The check before training (the walk, ``walked`` records at a time) and every read
    of it refuse it in one line naming the first such record and its key."""
    from singa_mpi.data import stores

    monkeypatch.setattr(stores, "WALK_RECORDS", walked)
    random_kvfile(tmp_path / "s", np.random.default_rng(3), 500, classes=10, backend=backend, unlabelled=True)
    with open_store(backend, str(tmp_path / "s")) as store:
        first = next(row for row in range(len(store)) if not store.record(row).HasField("label"))
        expected = (f"{store.path}: record {first} (key {store.keys[first]!r}) has no label, while record 0 has one: "
                    f"expected a label in every record (protobuf reads a missing one as label 0)")
        with pytest.raises(DataError) as err:
            store.every_label()
        assert str(err.value) == expected
        store.cache_limit = 0
        with pytest.raises(DataError) as err:
            store.read(np.array([first + 1, first]))  # one read record by record, as a big store's batches
        assert str(err.value) == expected
        store.read(np.arange(first))  # the records before it read
    with open_store(backend, str(tmp_path / "s")) as store:
        with pytest.raises(DataError) as err:
            store.read(np.array([0]))  # a small store's first read decodes it whole
        assert str(err.value) == expected


def test_every_label_of_records_protobuf_reads_otherwise_comes_from_the_parse(tmp_path):
    """Records the walk does not read exactly (an unknown group field beside the label) are parsed one by
    one, with the parse's result; a label given as bytes (an unknown field to protobuf: no label) is
    refused as a record without one."""
    with KVFileWriter(str(tmp_path / "odd.bin")) as writer:
        writer.write("0", job_pb2.RecordProto(shape=[1], label=4, pixel=b"\x01"))
        writer.write("1", job_pb2.RecordProto.FromString(bytes([0x08, 1, 0x10, 5, 0x1A, 1, 2, 0xA3, 0x06, 0xA4, 0x06])))
    with open_store("kvfile", str(tmp_path / "odd.bin")) as store:
        np.testing.assert_array_equal(store.every_label(), [4, 5])
    with KVFileWriter(str(tmp_path / "bytes.bin")) as writer:
        writer.write("0", job_pb2.RecordProto(shape=[1], label=4, pixel=b"\x01"))
        writer.write("1", job_pb2.RecordProto.FromString(bytes([0x08, 1, 0x12, 1, 9, 0x1A, 1, 2])))
    with open_store("kvfile", str(tmp_path / "bytes.bin")) as store, pytest.raises(DataError, match="record 1 .* no label"):
        store.every_label()


@pytest.mark.parametrize("walked", [1 << 20, 100])
@pytest.mark.parametrize("backend", ["kvfile", "shard"])
def test_a_kvfile_is_looked_at_for_nonfinite_values_without_a_parse_per_record(tmp_path, backend, walked,
                                                                               monkeypatch):
    """The float values of every record are looked at where they lie in the file (any byte alignment):
    the first NaN or infinity is the decode's, and no record is parsed for it (``walked``: the records
    whose fields are read at a time)."""
    from singa_mpi.data import stores

    monkeypatch.setattr(stores, "WALK_RECORDS", walked)
    rng = np.random.default_rng(7)
    random_kvfile(tmp_path / "s", rng, 500, classes=10, backend=backend)
    with open_store(backend, str(tmp_path / "s")) as store:
        data = store._decode(np.arange(len(store)))[0].reshape(len(store), -1)
        floats = [row for row in range(len(store)) if len(store.record(row).data)]
    assert len(floats) > 100
    assert open_store(backend, str(tmp_path / "s")).first_nonfinite() is None
    from singa_mpi.data.shard import DataShardWriter

    path = tmp_path / "bad"
    with (DataShardWriter if backend == "shard" else KVFileWriter)(str(path)) as writer:  # two bad records
        for row, values in enumerate(data):
            record = job_pb2.RecordProto(shape=[2, 3], label=1)
            if row in floats:
                values = values.copy()
                values[[4, 1]] = (np.nan, np.inf) if row == floats[-40] else values[[4, 1]]
                values[2] = -np.inf if row == floats[-3] else values[2]
                record.data.extend(values.tolist())
            else:
                record.pixel = values.astype(np.uint8).tobytes()
            writer.write("k" * (1 + row % 5), record) if row < 5 else writer.write(f"{row:0{1 + row % 7}d}", record)
    with open_store(backend, str(path)) as store:
        store.record = None
        assert store.first_nonfinite() == (floats[-40], 1, np.inf)


def test_float_values_written_unpacked_are_looked_at_by_the_decode(tmp_path):
    """Floats written one field each (protobuf reads them too): the decode finds the NaN."""
    nan = np.float32(np.nan).tobytes()
    unpacked = bytes([0x08, 2, 0x10, 1]) + b"".join(bytes([0x25]) + v for v in (np.float32(1).tobytes(), nan))
    with KVFileWriter(str(tmp_path / "u.bin")) as writer:
        writer.write("0", job_pb2.RecordProto(shape=[2], label=1, data=[1, 2]))
        writer.write("1", job_pb2.RecordProto.FromString(unpacked))
    found = open_store("kvfile", str(tmp_path / "u.bin")).first_nonfinite()
    assert found[:2] == (1, 1) and np.isnan(found[2])


@pytest.mark.parametrize("seed", range(6))
def test_values_read_in_strided_runs_are_those_of_each_record(seed, monkeypatch):
    """Records at distances that change now and then (keys growing a digit), in pieces of a few records:
    the first NaN found is the one a look at each record finds."""
    from singa_mpi.data import stores

    rng = np.random.default_rng(seed)
    size, count = int(rng.integers(1, 5)), int(rng.integers(1, 60))
    gaps = np.repeat(rng.integers(4 * size, 4 * size + 9, 5), rng.integers(1, 15, 5))[:count - 1]
    first = int(rng.integers(0, 7))
    starts = np.concatenate([[first], first + np.cumsum(gaps)]).astype(np.int64)
    # bytes below 0x40: any four of them read as a finite float32, at any alignment
    buffer = bytearray(rng.integers(0, 0x40, int(starts[-1]) + 4 * size, dtype=np.uint8).tobytes())
    bad = sorted(rng.choice(len(starts), min(2, len(starts)), replace=False))
    for record in bad:
        buffer[starts[record] + 4 * (size - 1):starts[record] + 4 * size] = np.float32(np.inf).tobytes()
    monkeypatch.setattr(stores, "SCAN_BYTES", 4 * size * 3)  # three records at a time
    records = np.arange(len(starts)) * 2  # their numbers in the store
    assert stores._first_nonfinite_at(bytes(buffer), starts, records, size) == (2 * bad[0], size - 1, np.inf)


KINDS = {"hdf5": "an HDF5 file", "kvfile": "a kvfile", "textfile": "a text file (a CSV store?)",
         "shard": "a DataShard folder"}


@pytest.mark.parametrize("written", BACKENDS)
@pytest.mark.parametrize("backend", ["hdf5", "kvfile", "textfile"])
def test_a_store_read_with_another_backend_says_which_backend_reads_it(tmp_path, written, backend):
    """An HDF5 store named `backend: "kvfile"` was "byte 0: key length ... is corrupt: the file is damaged",
    a kvfile read as text "0xbf is not UTF-8 text", a DataShard read as a kvfile "records of shape (0,)",
    a DataShard folder read as HDF5 "a folder: expected a file": the line now says what the file is and
    which backend reads it (HDF5's own line says a file is not an HDF5 file)."""
    from singa_mpi.data.convert import write_store
    from singa_mpi.data.stores import BackendMismatch

    if written == backend or (backend == "hdf5" and written != "shard"):
        return
    data = np.random.default_rng(3).normal(size=(10, 4)).astype(np.float32)
    path = write_store(str(tmp_path / f"s.{written}"), written, data, np.arange(10) % 3)
    with pytest.raises(BackendMismatch) as err:
        open_store(backend, path, layer="data", shape=(4,))
    if written == "shard" and backend == "kvfile":
        assert str(err.value) == (f"layer 'data': {path}/shard.dat: a DataShard (SINGA 0.1's Record values), read "
                                  f"with backend \"kvfile\": expected backend \"shard\" for it (or a kvfile of "
                                  f"RecordProto values)")
    else:
        assert str(err.value) == (f"layer 'data': {path}: {KINDS[written]}, read with backend \"{backend}\": "
                                  f"expected backend \"{written}\" for it (or another file at this path)")
