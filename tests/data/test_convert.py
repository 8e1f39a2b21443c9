"""Converters from MNIST IDX, CIFAR-10 binary, CSV and scikit-learn's digits, on tiny files made here."""
import gzip
import struct

import numpy as np
import pytest

from singa_mpi.data import convert
from singa_mpi.data.stores import open_store, read_kvfile
from singa_mpi.errors import DataError


def write_idx(path, array, magic, gz=False):
    header = struct.pack(">I", magic) + struct.pack(f">{array.ndim}I", *array.shape)
    opener = gzip.open if gz else open
    with opener(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("backend", ["hdf5", "kvfile", "textfile"])
def test_mnist(tmp_path, gz, backend):
    images = np.random.default_rng(0).integers(0, 256, (5, 28, 28))
    labels = np.array([3, 1, 4, 1, 5])
    suffix = ".gz" if gz else ""
    write_idx(tmp_path / f"img{suffix}", images, 2051, gz)
    write_idx(tmp_path / f"lab{suffix}", labels, 2049, gz)
    out = str(tmp_path / "mnist.store")
    convert.convert_mnist(str(tmp_path / f"img{suffix}"), str(tmp_path / f"lab{suffix}"), out, backend)
    store = open_store(backend, out)
    np.testing.assert_array_equal(store.data.reshape(5, -1), images.reshape(5, -1))
    np.testing.assert_array_equal(store.labels, labels)


def test_mnist_bad_magic(tmp_path):
    write_idx(tmp_path / "img", np.zeros((2, 2, 2)), 2049)
    write_idx(tmp_path / "lab", np.zeros(2), 2049)
    with pytest.raises(DataError, match="magic number 2049, expected 2051"):
        convert.convert_mnist(str(tmp_path / "img"), str(tmp_path / "lab"), str(tmp_path / "o.h5"))


def test_cifar10_with_mean(tmp_path):
    rng = np.random.default_rng(1)
    labels = np.array([0, 9, 4], np.uint8)
    pixels = rng.integers(0, 256, (3, 3072)).astype(np.uint8)
    (tmp_path / "b.bin").write_bytes(np.column_stack([labels, pixels]).tobytes())
    out, mean = str(tmp_path / "train.bin"), str(tmp_path / "mean.bin")
    convert.convert_cifar10([str(tmp_path / "b.bin")], out, "kvfile", mean_out=mean)
    store = read_kvfile(out)
    assert store.data.shape == (3, 3, 32, 32)
    np.testing.assert_array_equal(store.labels, labels)
    np.testing.assert_allclose(read_kvfile(mean).data[0], pixels.reshape(3, 3, 32, 32).mean(axis=0), rtol=1e-6)
    (tmp_path / "bad.bin").write_bytes(b"\0" * 100)
    with pytest.raises(DataError, match="not a whole number of CIFAR-10 records"):
        convert.convert_cifar10([str(tmp_path / "bad.bin")], str(tmp_path / "x.h5"))


def test_csv(tmp_path):
    (tmp_path / "in.csv").write_text("2,1,1\n0,3,4\n")
    out = convert.convert_csv(str(tmp_path / "in.csv"), str(tmp_path / "o.h5"))[0]
    store = open_store("hdf5", out)
    np.testing.assert_array_equal(store.labels, [2, 0])


def test_digits_split_is_deterministic_and_disjoint(tmp_path):
    train, test = convert.convert_digits(str(tmp_path / "a"))
    again = convert.convert_digits(str(tmp_path / "b"))
    a_train, a_test = open_store("hdf5", train), open_store("hdf5", test)
    assert len(a_train) + len(a_test) == 1797 and len(a_test) == 359
    np.testing.assert_array_equal(a_train.data, open_store("hdf5", again[0]).data)
    rows = {row.tobytes() for row in a_train.data}
    overlap = sum(row.tobytes() in rows for row in a_test.data)
    assert overlap < 5  # only the few duplicate images of the data set itself
    assert a_train.data.max() == 16 and a_train.shape == (64,)
