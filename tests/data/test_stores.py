"""Stores: SINGA's kvfile byte layout, round trips, torn files; text and HDF5 reading."""
import struct

import numpy as np
import pytest

from singa_mpi.data.stores import KVFileWriter, iter_kvfile, open_store, read_kvfile, write_hdf5
from singa_mpi.errors import ConfigError, DataError
from singa_mpi.proto import job_pb2


def test_kvfile_tuple_layout_is_singas(tmp_path):
    path = tmp_path / "one.bin"
    record = job_pb2.RecordProto(shape=[2], label=3, pixel=bytes([7, 9]))
    with KVFileWriter(str(path)) as w:
        w.write("00000", record)
    blob = path.read_bytes()
    value = record.SerializeToString()
    assert blob == struct.pack("<Q", 5) + b"00000" + struct.pack("<Q", len(value)) + value


def test_kvfile_round_trip_pixels_and_floats(tmp_path):
    path = str(tmp_path / "s.bin")
    rng = np.random.default_rng(0)
    pixels = rng.integers(0, 256, (4, 2, 3, 3)).astype(np.uint8)
    with KVFileWriter(path) as w:
        for i, img in enumerate(pixels):
            w.write(f"{i:05d}", job_pb2.RecordProto(shape=[2, 3, 3], label=i, pixel=img.tobytes()))
    store = read_kvfile(path)
    np.testing.assert_array_equal(store.data, pixels.astype(np.float32))
    np.testing.assert_array_equal(store.labels, [0, 1, 2, 3])
    data, labels = store.read(np.array([3, 1]))
    np.testing.assert_array_equal(labels, [3, 1])
    floats = str(tmp_path / "f.bin")
    with KVFileWriter(floats) as w:
        w.write("a", job_pb2.RecordProto(shape=[3], label=1, data=[0.5, -1.0, 2.0]))
    np.testing.assert_allclose(read_kvfile(floats).data, [[0.5, -1.0, 2.0]])


def test_kvfile_folder_with_shard_dat_and_torn_tail(tmp_path):
    folder = tmp_path / "shard"
    folder.mkdir()
    with KVFileWriter(str(folder / "shard.dat")) as w:
        for i in range(3):
            w.write(str(i), job_pb2.RecordProto(shape=[1], label=i, data=[float(i)]))
    with open(folder / "shard.dat", "ab") as f:
        f.write(struct.pack("<Q", 4) + b"torn")  # an interrupted write
    with pytest.warns(UserWarning, match="torn record"):
        store = read_kvfile(str(folder))
    assert len(store) == 3
    assert [k for k, _ in iter_kvfile(str(folder / "shard.dat"))][:3] == [b"0", b"1", b"2"]


def test_kvfile_rejects_duplicate_and_empty_keys(tmp_path):
    with KVFileWriter(str(tmp_path / "d.bin")) as w:
        w.write("k", job_pb2.RecordProto(label=1))
        with pytest.raises(ValueError, match="already written"):
            w.write("k", job_pb2.RecordProto(label=2))
        with pytest.raises(ValueError):
            w.write("", job_pb2.RecordProto(label=2))


def test_textfile_and_hdf5(tmp_path):
    csv = tmp_path / "d.csv"
    csv.write_text("1,0.5,2\n0,1.5,-3\n")
    store = open_store("textfile", str(csv))
    np.testing.assert_allclose(store.data, [[0.5, 2], [1.5, -3]])
    np.testing.assert_array_equal(store.labels, [1, 0])
    unlabelled = open_store("textfile", str(csv), has_label=False)
    assert unlabelled.labels is None and unlabelled.data.shape == (2, 3)
    h5 = write_hdf5(str(tmp_path / "d.h5"), np.arange(12).reshape(3, 4), np.array([2, 1, 0]))
    data, labels = open_store("hdf5", h5).read(np.array([2, 0, 2]))
    np.testing.assert_array_equal(labels, [0, 2, 0])
    np.testing.assert_array_equal(data[0], [8, 9, 10, 11])


def test_errors(tmp_path):
    with pytest.raises(DataError, match="no such data file"):
        open_store("hdf5", str(tmp_path / "missing.h5"))
    with pytest.raises(ConfigError, match="expected one of hdf5, kvfile, textfile"):
        open_store("lmdb", str(tmp_path))
