"""Converters from data the user has (or a package ships) into stores.

Every converter writes to a temporary file next to the target and renames it,
so an interrupted conversion leaves nothing half-written.
"""
from __future__ import annotations

import gzip
import os
import struct
from typing import Iterable

import numpy as np

from singa_mpi.data.stores import KVFileWriter, write_hdf5
from singa_mpi.errors import ConfigError, DataError
from singa_mpi.proto import job_pb2

BACKENDS = ("hdf5", "kvfile", "textfile")
IDX_IMAGES, IDX_LABELS = 2051, 2049
CIFAR_RECORD = 1 + 3 * 32 * 32


def _open(path: str):
    if not os.path.exists(path):
        raise DataError(f"{path}: no such file")
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def read_idx(path: str, magic: int) -> np.ndarray:
    """An MNIST IDX file (plain or .gz) as uint8 (N, ...) after checking its magic number."""
    with _open(path) as f:
        blob = f.read()
    if len(blob) < 8:
        raise DataError(f"{path}: too short for an IDX file")
    (found,) = struct.unpack(">I", blob[:4])
    if found != magic:
        kind = "images" if magic == IDX_IMAGES else "labels"
        raise DataError(f"{path}: IDX magic number {found}, expected {magic} for MNIST {kind}")
    ndim = found & 0xFF
    dims = struct.unpack(f">{ndim}I", blob[4:4 + 4 * ndim])
    data = np.frombuffer(blob, np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise DataError(f"{path}: {data.size} bytes of data for dimensions {dims}")
    return data.reshape(dims)


def write_store(out_path: str, backend: str, data: np.ndarray, labels: np.ndarray | None,
                pixels: bool = False) -> str:
    """Write (data, labels) atomically; ``pixels``: kvfile records keep uint8 bytes like SINGA's."""
    if backend not in BACKENDS:
        raise ConfigError(f"--backend {backend}: expected one of {', '.join(BACKENDS)}")
    os.makedirs(os.path.dirname(out_path) or ".", exist_ok=True)
    tmp = f"{out_path}.tmp{os.getpid()}"
    try:
        if backend == "hdf5":
            write_hdf5(tmp, data, labels)
        elif backend == "kvfile":
            with KVFileWriter(tmp) as writer:
                for i, sample in enumerate(data):
                    record = job_pb2.RecordProto(shape=list(sample.shape))
                    if labels is not None:
                        record.label = int(labels[i])
                    if pixels:
                        record.pixel = np.asarray(sample, np.uint8).tobytes()
                    else:
                        record.data.extend(np.asarray(sample, np.float32).reshape(-1).tolist())
                    writer.write(f"{i:05d}", record)
        else:
            flat = np.asarray(data, np.float64).reshape(len(data), -1)
            table = flat if labels is None else np.column_stack([labels, flat])
            fmt = ["%d"] + ["%.8g"] * flat.shape[1] if labels is not None else "%.8g"
            np.savetxt(tmp, table, delimiter=",", fmt=fmt)
        os.replace(tmp, out_path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return out_path


def convert_mnist(images_idx: str, labels_idx: str, out_path: str, backend: str = "hdf5") -> list[str]:
    images = read_idx(images_idx, IDX_IMAGES)
    labels = read_idx(labels_idx, IDX_LABELS)
    if len(images) != len(labels):
        raise DataError(f"{images_idx}: {len(images)} images but {labels_idx} has {len(labels)} labels")
    return [write_store(out_path, backend, images.reshape(len(images), -1), labels, pixels=True)]


def read_cifar10(batch_files: Iterable[str]) -> tuple[np.ndarray, np.ndarray]:
    """CIFAR-10 binary batches: records of 1 label byte + 3x32x32 pixel bytes."""
    images, labels = [], []
    for path in batch_files:
        with _open(path) as f:
            blob = np.frombuffer(f.read(), np.uint8)
        if blob.size == 0 or blob.size % CIFAR_RECORD:
            raise DataError(f"{path}: {blob.size} bytes is not a whole number of CIFAR-10 records "
                            f"({CIFAR_RECORD} bytes each)")
        records = blob.reshape(-1, CIFAR_RECORD)
        labels.append(records[:, 0].astype(np.int32))
        images.append(records[:, 1:].reshape(-1, 3, 32, 32))
    return np.concatenate(images), np.concatenate(labels)


def convert_cifar10(batch_files: list[str], out_path: str, backend: str = "hdf5",
                    mean_out: str | None = None) -> list[str]:
    images, labels = read_cifar10(batch_files)
    written = [write_store(out_path, backend, images, labels, pixels=True)]
    if mean_out:
        mean = images.astype(np.float64).mean(axis=0).astype(np.float32)
        tmp = f"{mean_out}.tmp{os.getpid()}"
        os.makedirs(os.path.dirname(mean_out) or ".", exist_ok=True)
        with KVFileWriter(tmp) as writer:  # SINGA's image_mean.bin: one record "mean" of floats
            writer.write("mean", job_pb2.RecordProto(shape=[3, 32, 32], data=mean.reshape(-1).tolist()))
        os.replace(tmp, mean_out)
        written.append(mean_out)
    return written


def convert_csv(csv_path: str, out_path: str, backend: str = "hdf5", has_label: bool = True,
                separator: str = ",") -> list[str]:
    from singa_mpi.data.stores import read_textfile

    if not os.path.exists(csv_path):
        raise DataError(f"{csv_path}: no such file")
    store = read_textfile(csv_path, has_label, separator)
    return [write_store(out_path, backend, store.data, store.labels)]


def convert_digits(out_dir: str, backend: str = "hdf5", test_fraction: float = 0.2, seed: int = 0) -> list[str]:
    """scikit-learn's bundled digits (1,797 8x8 images, values 0..16) -> train and test stores.

    The split is a seeded permutation: the same files on every machine.
    """
    from sklearn.datasets import load_digits

    if not 0 < test_fraction < 1:
        raise ConfigError(f"--test-fraction {test_fraction}: expected a fraction between 0 and 1")
    digits = load_digits()
    data, labels = digits.data.astype(np.float32), digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(data))
    n_test = int(round(test_fraction * len(data)))
    test, train = order[:n_test], order[n_test:]
    ext = {"hdf5": ".h5", "kvfile": ".bin", "textfile": ".csv"}.get(backend, "")
    return [write_store(os.path.join(out_dir, f"train{ext}"), backend, data[train], labels[train]),
            write_store(os.path.join(out_dir, f"test{ext}"), backend, data[test], labels[test])]
