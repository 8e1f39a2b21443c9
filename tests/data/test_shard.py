"""SINGA 0.1's DataShard: the exact bytes, torn and corrupt files, mean files, converters and synthetic data."""
import os
import pathlib
import struct

import numpy as np
import pytest

from singa_mpi import cli
from singa_mpi.data import convert
from singa_mpi.data.shard import SHARD_FILE, first_record, known_shape, read_mean_file
from singa_mpi.data.stores import KVFileWriter, open_store
from singa_mpi.data.synthetic import write_synthetic
from singa_mpi.errors import DataError
from singa_mpi.proto import job_pb2

SIZE_T = struct.Struct("<Q")


def write_shard(folder, count=4, shape=(2, 3)):
    """A DataShard of uint8 records with labels 10 + i, through the "shard" backend."""
    images = np.random.default_rng(0).integers(0, 256, (count, *shape)).astype(np.uint8)
    with open_store("shard", str(folder), "w") as writer:
        writer.write_batch(images, 10 + np.arange(count))
    return images


def test_bytes_are_singas_datashard(tmp_path):
    folder = tmp_path / "train_shard"
    with open_store("shard", str(folder), "w") as writer:
        writer.write("00000", job_pb2.RecordProto(shape=[2], label=3, pixel=bytes([7, 9])))
    # SingleLabelImageRecord: shape=2 (field 1), label=3 (2), pixel (3); wrapped as Record.image (field 5)
    image = bytes([0x08, 2, 0x10, 3, 0x1A, 2, 7, 9])
    record = bytes([0x2A, len(image)]) + image
    expected = SIZE_T.pack(5) + b"00000" + SIZE_T.pack(len(record)) + record
    assert (folder / SHARD_FILE).read_bytes() == expected
    assert sorted(os.listdir(folder)) == [SHARD_FILE]  # a folder, as DataShard(folder, kCreate) makes


def test_round_trip_in_batches_with_labels(tmp_path):
    images = write_shard(tmp_path / "s", count=5)
    store = open_store("shard", str(tmp_path / "s"))
    assert len(store) == 5 and store.shape == (2, 3) and store.has_labels
    data, labels = store.read(np.array([4, 0, 4]))
    np.testing.assert_array_equal(data, images[[4, 0, 4]])
    np.testing.assert_array_equal(labels, [14, 10, 14])
    wrapped = job_pb2.Record()
    raw = (tmp_path / "s" / SHARD_FILE).read_bytes()
    (value_len,) = SIZE_T.unpack_from(raw, 8 + 5)
    wrapped.ParseFromString(raw[8 + 5 + 8:8 + 5 + 8 + value_len])  # the first value: a whole v0.1 Record
    assert list(wrapped.image.shape) == [2, 3] and wrapped.image.label == 10
    assert list(first_record(str(tmp_path / "s")).shape) == [2, 3]


@pytest.mark.parametrize("cut", [3, 8 + 5 + 4, -2], ids=["in key length", "in value length", "in value"])
def test_torn_last_tuple_is_dropped(tmp_path, cut):
    images = write_shard(tmp_path / "s")
    path = tmp_path / "s" / SHARD_FILE
    whole = path.read_bytes()
    size = len(whole) // 4  # equal-sized tuples
    path.write_bytes(whole[:3 * size + cut] if cut > 0 else whole[:cut])
    with pytest.warns(UserWarning, match=f"torn record at byte {3 * size}"):
        store = open_store("shard", str(tmp_path / "s"))
    assert len(store) == 3
    np.testing.assert_array_equal(store.read(np.arange(3))[0], images[:3])


def corrupt(tmp_path, tuple_index, field_offset, value):
    """Overwrite one length field of tuple ``tuple_index``; its byte offset."""
    write_shard(tmp_path / "s")
    path = tmp_path / "s" / SHARD_FILE
    raw = bytearray(path.read_bytes())
    at = tuple_index * (len(raw) // 4) + field_offset
    raw[at:at + 8] = SIZE_T.pack(value)
    path.write_bytes(bytes(raw))
    return path, at


@pytest.mark.parametrize("field_offset, value, what", [
    (0, 1 << 40, "key length 1099511627776"),  # absurd anywhere
    (8 + 5, 1 << 33, "value length 8589934592"),  # beyond SINGA's int
    (8 + 5, 100_000, "value length 100000"),  # runs past the end, far longer than the records before
], ids=["key", "absurd value", "past the end"])
def test_corrupt_length_is_an_error_naming_file_and_offset(tmp_path, field_offset, value, what):
    path, at = corrupt(tmp_path, 2, field_offset, value)
    with pytest.raises(DataError, match=f"{path}: byte {at}: {what} is corrupt") as err:
        open_store("shard", str(tmp_path / "s"))
    assert "\n" not in str(err.value)


def test_a_kvfile_or_a_file_is_no_datashard(tmp_path):
    (tmp_path / "v03").mkdir()
    with KVFileWriter(str(tmp_path / "v03" / SHARD_FILE)) as writer:  # v0.2+ values: no Record wrapper
        writer.write("0", job_pb2.RecordProto(shape=[2], label=1, pixel=bytes(2)))
    with pytest.raises(DataError, match=r"record 0 \(key b'0'\) is a Record without an image: .* read by kRecordInput"):
        open_store("shard", str(tmp_path / "v03"))
    (tmp_path / "flat.bin").write_bytes(b"")
    with pytest.raises(DataError, match="flat.bin: not a folder: expected a DataShard folder holding shard.dat"):
        open_store("shard", str(tmp_path / "flat.bin"))


def test_writing_over_a_shard_replaces_it(tmp_path):
    out = str(tmp_path / "s")
    convert.write_store(out, "shard", np.zeros((3, 2), np.uint8), np.arange(3))
    convert.write_store(out, "shard", np.ones((2, 2), np.uint8), np.arange(2))
    assert len(open_store("shard", out)) == 2 and sorted(os.listdir(tmp_path)) == ["s"]


def test_mean_files_in_each_format(tmp_path):
    mean = np.arange(6, dtype=np.float32).reshape(2, 3) / 4
    v01 = convert.write_mean_file(str(tmp_path / "image_mean.bin"), mean, backend="shard")
    record = job_pb2.RecordProto()
    record.ParseFromString(pathlib.Path(v01).read_bytes())  # v0.1: one serialized SingleLabelImageRecord
    assert list(record.shape) == [2, 3]
    v03 = convert.write_mean_file(str(tmp_path / "mean_kv.bin"), mean)
    with open_store("shard", str(tmp_path / "mean_shard"), "w") as writer:
        writer.write("mean", job_pb2.RecordProto(shape=[2, 3], data=mean.reshape(-1).tolist()))
    for path in (v01, v03, str(tmp_path / "mean_shard")):
        np.testing.assert_array_equal(read_mean_file(path), mean.reshape(-1))
    (tmp_path / "mean.binaryproto").write_bytes(b"\x08\x01")
    with pytest.raises(DataError, match="Caffe binaryproto mean files are not read"):
        read_mean_file(str(tmp_path / "mean.binaryproto"))


def write_idx(path, array, magic):
    path.write_bytes(struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape)
                     + array.astype(np.uint8).tobytes())
    return str(path)


def test_data_mnist_backend_shard_writes_singas_shard(tmp_path, capsys):
    images = np.random.default_rng(1).integers(0, 256, (6, 28, 28))
    labels = np.array([5, 0, 4, 1, 9, 2])
    args = ["data", "mnist", "--images", write_idx(tmp_path / "img", images, 2051),
            "--labels", write_idx(tmp_path / "lab", labels, 2049), "--out", str(tmp_path / "mnist_train_shard"),
            "--backend", "shard"]
    assert cli.main(args) == 0
    assert os.path.isfile(tmp_path / "mnist_train_shard" / SHARD_FILE)
    image = first_record(str(tmp_path / "mnist_train_shard"))
    assert list(image.shape) == [28, 28] and image.label == 5 and len(image.pixel) == 784  # create_shard.cc's
    data, got = open_store("shard", str(tmp_path / "mnist_train_shard")).read(np.arange(6))
    np.testing.assert_array_equal(data, images)
    np.testing.assert_array_equal(got, labels)


def test_data_cifar10_backend_shard_with_v01_mean(tmp_path):
    pixels = np.random.default_rng(2).integers(0, 256, (3, 3072)).astype(np.uint8)
    (tmp_path / "data_batch_1.bin").write_bytes(np.column_stack([np.array([1, 7, 3], np.uint8), pixels]).tobytes())
    out, mean = str(tmp_path / "cifar10_train_shard"), str(tmp_path / "image_mean.bin")
    assert cli.main(["data", "cifar10", "--batches", str(tmp_path / "data_batch_1.bin"), "--out", out,
                     "--backend", "shard", "--mean", mean]) == 0
    data, labels = open_store("shard", out).read(np.arange(3))
    np.testing.assert_array_equal(data.reshape(3, -1), pixels)
    np.testing.assert_array_equal(labels, [1, 7, 3])
    record = job_pb2.RecordProto()
    record.ParseFromString(pathlib.Path(mean).read_bytes())
    np.testing.assert_allclose(record.data, pixels.mean(axis=0), rtol=1e-6)


V01_CIFAR = """name: "c" train_steps: 1 train_one_batch { alg: kBP }
updater { type: kSGD learning_rate { type: kFixed base_lr: 0.1 } }
neuralnet {
  layer { name: "data" type: kShardData sharddata_conf { path: "PATH/images_train" batchsize: 4 } exclude: kTest }
  layer { name: "data" type: kShardData sharddata_conf { path: "PATH/cifar10_test_shard" batchsize: 4 } exclude: kTrain }
  layer { name: "rgb" type: kRGBImage srclayers: "data" rgbimage_conf { meanfile: "PATH/image_mean.bin" } }
  layer { name: "label" type: kLabel srclayers: "data" }
}"""


def test_synthetic_like_writes_shards_and_the_v01_mean(tmp_path):
    conf = tmp_path / "job.conf"
    conf.write_text(V01_CIFAR.replace("PATH", str(tmp_path)))
    written = write_synthetic(str(conf), count=5)
    assert written == [str(tmp_path / name) for name in ("images_train", "image_mean.bin", "cifar10_test_shard")]
    # no data set named in "images_train": the shape its kRGBImage reader wants
    assert open_store("shard", str(tmp_path / "images_train")).shape == (3, 32, 32)
    assert read_mean_file(str(tmp_path / "image_mean.bin")).shape == (3 * 32 * 32,)
    assert write_synthetic(str(conf)) == []  # existing files are kept
    assert known_shape("examples/mnist/mnist_test_shard") == (28, 28) and known_shape("x/y") is None


def test_a_v01_mean_file_of_another_kind_says_what_it_is(tmp_path):
    """An HDF5 or CSV store given as rgbimage_conf.meanfile was "not a mean file" at best, or parsed as a
    record of nonsense values."""
    convert.write_store(str(tmp_path / "a.h5"), "hdf5", np.zeros((3, 2), np.float32), np.arange(3))
    (tmp_path / "a.csv").write_text("1,2,3\n")
    for name, kind in (("a.h5", "an HDF5 file"), ("a.csv", "a text file (a CSV store?)")):
        with pytest.raises(DataError) as err:
            read_mean_file(str(tmp_path / name))
        assert str(err.value) == (f"{tmp_path / name}: {kind}: expected a mean file: a serialized SingleLabelImage"
                                  f"Record (SINGA 0.1's image_mean.bin) or a kvfile whose record holds the mean")
