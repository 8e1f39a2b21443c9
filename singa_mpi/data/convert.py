"""Converters from data the user has (or a package ships) into stores.

Each converter returns the paths it wrote and prints nothing (the CLI reports).
Every file is written under a temporary name next to the target and renamed
when complete, so an interrupted conversion leaves nothing half-written.
Pixels stay uint8 where the source has them (kvfile ``pixel`` bytes, as in
SINGA's create_data.cc; uint8 HDF5 datasets); readers give float32.
"""
from __future__ import annotations

import contextlib
import gzip
import hashlib
import os
import re
import shutil
import struct
import zlib
from typing import Iterable, Iterator

import numpy as np

from singa_mpi.data.shard import SHARD_FILE, mean_record_bytes
from singa_mpi.data.stores import KVFileWriter, check_backend, open_store
from singa_mpi.errors import ConfigError, DataError, writing
from singa_mpi.proto import job_pb2

IDX_IMAGES, IDX_LABELS = 2051, 2049  # MNIST: unsigned bytes, 3 and 1 dimensions
CIFAR_SHAPE = (3, 32, 32)
CIFAR_RECORD = 1 + 3 * 32 * 32  # one label byte, then the red, green and blue planes
CIFAR_CLASSES = 10
EXTENSIONS = {"hdf5": ".h5", "kvfile": ".bin", "textfile": ".csv", "shard": "_shard"}  # a shard is a folder


@contextlib.contextmanager
def atomic_path(out_path: str, what: str = "the store", folder: bool = False) -> Iterator[str]:
    """A temporary path to write (a file, or with ``folder`` a DataShard folder); renamed to ``out_path``
    on success (replacing what was there), removed on failure.  Its folder is made; a file system
    that refuses is a DataError naming ``out_path`` (never the temporary name) and ``what`` it was to
    hold (exit code 3), as is an ``out_path`` of the other kind (a folder where a file goes)."""
    tmp = temporary_path(out_path)
    if os.path.isdir(out_path) != folder and os.path.exists(out_path):
        found, expected = ("a file", "a folder") if folder else ("a folder", "a file name")
        raise DataError(f"{out_path}: {found}: expected {expected} for {what}")
    try:
        with writing(out_path, what):
            try:
                yield tmp
                if os.path.isdir(tmp) and os.path.isdir(out_path):
                    shutil.rmtree(out_path)  # a folder is not replaced by a rename
                os.replace(tmp, out_path)
            except OSError as err:
                raise _naming_the_target(err, tmp, out_path) from None
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)
        elif os.path.exists(tmp):
            os.remove(tmp)


NAME_MAX = 255  # bytes in one file name (Linux, macOS), where the file system does not say


def temporary_path(out_path: str) -> str:
    """``OUT.tmp<PID>`` in ``out_path``'s folder; where that name is longer than a file name can be (a
    valid --out of 250 characters), the start of the name, a digest of the whole and ``.tmp<PID>``."""
    suffix = f".tmp{os.getpid()}"
    folder, name = os.path.split(out_path)
    try:
        limit = os.pathconf(folder or ".", "PC_NAME_MAX")
    except (OSError, ValueError):  # a folder still to be made
        limit = NAME_MAX
    if not name or len(os.fsencode(name + suffix)) <= limit:
        return out_path + suffix
    digest = "~" + hashlib.sha1(os.fsencode(name)).hexdigest()[:12]
    head = name
    while head and len(os.fsencode(head + digest + suffix)) > limit:
        head = head[:-1]
    return os.path.join(folder, head + digest + suffix)


_HDF5_ERRNO = re.compile(r"\berrno = (\d+)")  # "(unable to open file: name = '...', errno = 36, ...)"


def _naming_the_target(err: OSError, tmp: str, out_path: str) -> OSError:
    """``err``, met while writing ``tmp``, as if met writing ``out_path``: the user named that one, and
    the temporary name (in the OS's file name, or in HDF5's message text) is gone when they read it."""
    def swap(text) -> str | None:
        return None if text is None else os.fsdecode(text).replace(tmp, out_path)

    found = _HDF5_ERRNO.search(str(err)) if err.filename is None else None
    if found and int(found.group(1)):  # h5py's: the file name and the OS's errno inside HDF5's message
        return OSError(int(found.group(1)), os.strerror(int(found.group(1))), out_path)
    if err.errno is None or err.strerror is None:
        return OSError(swap(" ".join(str(err).split())))
    return OSError(err.errno, swap(err.strerror), swap(err.filename))


def check_replaceable(out_path: str, backend: str) -> None:
    """A DataShard replaces a folder whole: refuse one that holds anything but a DataShard's file (a
    user's folder named as --out lost every file in it)."""
    if backend == "shard" and os.path.isdir(out_path):
        others = sorted(set(os.listdir(out_path)) - {SHARD_FILE})
        if others:
            shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
            raise DataError(f"{out_path}: a folder holding {shown}: expected a new folder or a DataShard's "
                            f"(only {SHARD_FILE} in it), which the store replaces whole")


def check_folder(out_dir: str, what: str) -> None:
    """DataError when ``out_dir``, where ``what`` is written, is a file (the OS says only "File exists")."""
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise DataError(f"{out_dir}: a file: expected a folder for {what}")


def write_store(out_path: str, backend: str, data: np.ndarray, labels: np.ndarray | None,
                pixels: bool = False, what: str = "the store") -> str:
    """Write all of (data (N, *shape), labels (N,) or None) as one store, atomically.

    uint8 data (or any data with ``pixels=True``, cast to uint8) is stored as
    pixel bytes; anything else as float32.  ``what``: the store, for an error that it cannot be written.
    """
    check_backend(backend)
    check_replaceable(out_path, backend)
    with atomic_path(out_path, what, folder=backend == "shard") as tmp:
        _write_store_at(tmp, backend, data, labels, pixels)
    return out_path


def _write_store_at(path: str, backend: str, data: np.ndarray, labels: np.ndarray | None, pixels: bool) -> None:
    if pixels:
        data = np.asarray(data).astype(np.uint8, copy=False)
    with open_store(backend, path, "w") as writer:
        writer.write_batch(data, labels)


def _read_bytes(path: str) -> bytes:
    """A whole file, gunzipped when its name ends in .gz."""
    if os.path.isdir(path):
        raise DataError(f"{path}: a folder: expected a file")
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such file")
    try:
        with (gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")) as f:
            return f.read()
    except (OSError, EOFError, zlib.error) as err:  # zlib: damage inside a .gz's compressed data
        raise DataError(f"{path}: cannot read it ({err})") from None


# ------------------------------------------------------------------ MNIST

def read_idx(path: str, magic: int) -> np.ndarray:
    """An MNIST IDX file (plain or .gz) as uint8 (N, ...) after checking its magic number."""
    blob = _read_bytes(path)
    kind = "images" if magic == IDX_IMAGES else "labels"
    if len(blob) < 4:
        raise DataError(f"{path}: {len(blob)} bytes, too short for an IDX file of MNIST {kind}")
    (found,) = struct.unpack(">I", blob[:4])
    if found != magic:
        raise DataError(f"{path}: IDX magic number {found}, expected {magic} for MNIST {kind}")
    ndim = magic & 0xFF  # the magic's last byte counts the dimensions
    header = 4 + 4 * ndim
    if len(blob) < header:
        raise DataError(f"{path}: truncated IDX header")
    dims = struct.unpack(f">{ndim}I", blob[4:header])
    data = np.frombuffer(blob, np.uint8, offset=header)
    if data.size != int(np.prod(dims)):
        raise DataError(f"{path}: {data.size} bytes of data for dimensions {dims} "
                        f"(expected {int(np.prod(dims))}; truncated file?)")
    return data.reshape(dims)


def convert_mnist(images_idx: str, labels_idx: str, out_path: str, backend: str = "hdf5") -> list[str]:
    """MNIST IDX images (N, 28, 28) and labels (N,) -> one store of 28x28 uint8 records (SINGA's shape).

    Labels are kept as the file holds them (0..255): EMNIST's IDX files (47 or 62 classes, letters
    1..26) convert as MNIST's do.  A job whose loss scores fewer classes refuses the store before
    training, naming the first record outside them."""
    images = read_idx(images_idx, IDX_IMAGES)
    labels = read_idx(labels_idx, IDX_LABELS)
    if len(images) != len(labels):
        raise DataError(f"{images_idx}: {len(images)} images but {labels_idx} has {len(labels)} labels")
    return [write_store(out_path, backend, images, labels.astype(np.int32))]


# ------------------------------------------------------------------ CIFAR-10

def read_cifar10(batch_files: Iterable[str]) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10 binary batches -> uint8 images (N, 3, 32, 32) and int32 labels (N,)."""
    images, labels = [], []
    for path in batch_files:
        blob = np.frombuffer(_read_bytes(path), np.uint8)
        if blob.size == 0:
            raise DataError(f"{path}: empty: expected CIFAR-10 records ({CIFAR_RECORD} bytes each)")
        if blob.size % CIFAR_RECORD:
            whole, over = divmod(blob.size, CIFAR_RECORD)
            raise DataError(f"{path}: {blob.size} bytes is not a whole number of CIFAR-10 records "
                            f"({CIFAR_RECORD} bytes each): {whole} whole and {over} bytes over (a truncated file, "
                            f"or not CIFAR-10's binary version?)")
        records = blob.reshape(-1, CIFAR_RECORD)
        if records[:, 0].max() >= CIFAR_CLASSES:
            raise DataError(f"{path}: label byte {records[:, 0].max()}: expected 0..{CIFAR_CLASSES - 1} "
                            f"(a CIFAR-100 file?)")
        labels.append(records[:, 0].astype(np.int32))
        images.append(records[:, 1:].reshape((-1,) + CIFAR_SHAPE))
    if not images:
        raise ConfigError("convert_cifar10: expected at least one batch file")
    return np.concatenate(images), np.concatenate(labels)


def write_mean_file(path: str, mean: np.ndarray, backend: str = "kvfile") -> str:
    """SINGA's image_mean.bin: a kvfile with one record "mean" whose float data is the mean (v0.2+),
    or for DataShard users (``backend`` "shard") v0.1's one serialized record."""
    with atomic_path(path, "the mean file") as tmp:
        _write_mean_at(tmp, mean, backend)
    return path


def _write_mean_at(path: str, mean: np.ndarray, backend: str) -> None:
    if backend == "shard":
        with open(path, "wb") as f:
            f.write(mean_record_bytes(mean))
    else:
        with KVFileWriter(path) as writer:
            record = job_pb2.RecordProto(shape=list(mean.shape))
            record.data.extend(np.asarray(mean, np.float32).reshape(-1).tolist())
            writer.write("mean", record)


def convert_cifar10(batch_files: list[str], out_path: str, backend: str = "hdf5",
                    mean_out: str | None = None) -> list[str]:
    """CIFAR-10 binary batches -> one store (and, with ``mean_out``, the per-pixel mean file)."""
    check_backend(backend)
    check_replaceable(out_path, backend)
    images, labels = read_cifar10(batch_files)
    if not mean_out:
        return [write_store(out_path, backend, images, labels)]
    # both under temporary names first: a mean file that cannot be written leaves the old store in place
    with atomic_path(out_path, "the store", folder=backend == "shard") as store_tmp, \
            atomic_path(mean_out, "the mean file") as mean_tmp:
        _write_store_at(store_tmp, backend, images, labels, pixels=False)
        _write_mean_at(mean_tmp, images.mean(axis=0, dtype=np.float64), backend)
    return [out_path, mean_out]


# ------------------------------------------------------------------ CSV and digits

def convert_csv(csv_path: str, out_path: str, backend: str = "hdf5", has_label: bool = True,
                separator: str = ",") -> list[str]:
    """``label,v1,v2,...`` lines (or unlabelled rows) -> one store of flat float records."""
    check_backend(backend)
    store = open_store("textfile", csv_path, has_label=has_label, separator=separator)
    data, labels = store.read(np.arange(len(store)))
    return [write_store(out_path, backend, data, labels)]


def convert_digits(out_dir: str, backend: str = "hdf5", test_fraction: float = 0.2, seed: int = 0) -> list[str]:
    """scikit-learn's bundled digits (1,797 8x8 images, values 0..16) -> [train, test] stores.

    Records are 64 floats 0..16 (confs normalise with std_value: 16).  The split is
    a permutation seeded by ``seed``: the same files on every machine.
    """
    from sklearn.datasets import load_digits

    check_backend(backend)
    check_folder(out_dir, "the digits' train and test stores")
    if not 0 < test_fraction < 1:
        raise ConfigError(f"test_fraction {test_fraction}: expected a fraction between 0 and 1")
    digits = load_digits()
    data, labels = digits.data.astype(np.float32), digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(data))
    n_test = int(round(test_fraction * len(data)))
    if not 0 < n_test < len(data):
        raise ConfigError(f"test_fraction {test_fraction}: leaves {n_test} of {len(data)} records for testing "
                          f"and {len(data) - n_test} for training: expected a fraction that leaves some in both")
    test, train = order[:n_test], order[n_test:]  # files in shuffled order, for confs without shuffle
    ext = EXTENSIONS[backend]
    return [write_store(os.path.join(out_dir, f"train{ext}"), backend, data[train], labels[train]),
            write_store(os.path.join(out_dir, f"test{ext}"), backend, data[test], labels[test])]
