"""Record stores: SINGA's kvfile, CSV text files and HDF5, read by record index.

A data-parallel input sub-layer reads only its rows of each global batch, so
reading is random access: ``store.read(indices) -> (data, labels)``.  Stores
are small enough here to decode once into memory (numpy arrays); HDF5 files
larger than ``MEMORY_LIMIT`` are read lazily with h5py.

kvfile layout (SINGA 0.2+ ``io::KVFile``, also v0.1's ``shard.dat``): a
concatenation of ``[key_len][key][value_len][value]`` with lengths as 8-byte
little-endian unsigned integers and values serialized ``RecordProto``s.
"""
from __future__ import annotations

import os
import struct
import warnings
from typing import Callable

import numpy as np

from singa_mpi.errors import ConfigError, DataError
from singa_mpi.proto import job_pb2

MEMORY_LIMIT = 1 << 30
_LEN = struct.Struct("<Q")


class RecordStore:
    """Records with per-sample ``shape``; ``labels`` is None for unlabelled stores."""

    def __init__(self, data: np.ndarray, labels: np.ndarray | None, path: str):
        self.data, self.labels, self.path = data, labels, path

    def __len__(self) -> int:
        return len(self.data)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.data.shape[1:])

    def read(self, indices: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        data = np.asarray(self.data[indices], np.float32)
        labels = None if self.labels is None else np.asarray(self.labels[indices], np.int32)
        return data, labels


class LazyHDF5Store(RecordStore):
    """An HDF5 store too big to load: h5py reads sorted unique indices, then reorders."""

    def __init__(self, path: str, data_name: str = "data", label_name: str = "label"):
        import h5py

        self.file = h5py.File(path, "r")
        labels = self.file[label_name] if label_name in self.file else None
        super().__init__(self.file[data_name], labels, path)

    def read(self, indices):
        unique, inverse = np.unique(indices, return_inverse=True)
        data = np.asarray(self.data[unique], np.float32)[inverse]
        labels = None if self.labels is None else np.asarray(self.labels[unique], np.int32)[inverse]
        return data, labels


# ------------------------------------------------------------------ kvfile

def _kvfile_path(path: str) -> str:
    """SINGA accepts a file, or a folder holding shard.dat (v0.1's DataShard)."""
    return os.path.join(path, "shard.dat") if os.path.isdir(path) else path


def iter_kvfile(path: str):
    """(key, value) pairs of a kvfile; a torn last tuple is dropped with a warning (as SINGA does)."""
    path = _kvfile_path(path)
    with open(path, "rb") as f:
        blob = f.read()
    offset, end = 0, len(blob)
    while offset < end:
        if offset + 8 > end:
            break
        (klen,) = _LEN.unpack_from(blob, offset)
        if offset + 8 + klen + 8 > end:
            break
        key = blob[offset + 8:offset + 8 + klen]
        (vlen,) = _LEN.unpack_from(blob, offset + 8 + klen)
        start = offset + 16 + klen
        if start + vlen > end:
            break
        yield key, blob[start:start + vlen]
        offset = start + vlen
    if offset < end:
        warnings.warn(f"{path}: ignoring a torn record at byte {offset} (an interrupted write)", stacklevel=2)


def decode_record(value: bytes) -> job_pb2.RecordProto:
    record = job_pb2.RecordProto()
    record.ParseFromString(value)
    return record


def record_values(record: job_pb2.RecordProto) -> np.ndarray:
    """The record's pixels (uint8 bytes) or float data, as float32."""
    if len(record.data):
        return np.asarray(record.data, np.float32)
    return np.frombuffer(record.pixel, np.uint8).astype(np.float32)


def read_kvfile(path: str) -> RecordStore:
    records = [decode_record(value) for _, value in iter_kvfile(path)]
    if not records:
        raise DataError(f"{path}: kvfile holds no records")
    shape = tuple(records[0].shape) or (len(record_values(records[0])),)
    data = np.empty((len(records), *shape), np.float32)
    labels = np.empty(len(records), np.int32)
    for i, record in enumerate(records):
        values = record_values(record)
        if values.size != data[i].size:
            raise DataError(f"{path}: record {i} has {values.size} values, the first had {data[i].size} "
                            f"(shape {shape})")
        data[i] = values.reshape(shape)
        labels[i] = record.label
    has_label = any(r.HasField("label") for r in records)
    return RecordStore(data, labels if has_label else None, path)


class KVFileWriter:
    """Writes SINGA kvfile tuples; keys must be unique and non-empty."""

    def __init__(self, path: str):
        self.path = path
        self.file = open(path, "wb")
        self.keys: set[bytes] = set()

    def write(self, key: bytes | str, record: job_pb2.RecordProto) -> None:
        key = key.encode() if isinstance(key, str) else key
        if not key or key in self.keys:
            raise ValueError(f"{self.path}: key {key!r} is empty or already written")
        value = record.SerializeToString()
        self.keys.add(key)
        self.file.write(_LEN.pack(len(key)) + key + _LEN.pack(len(value)) + value)

    def close(self) -> None:
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()

    def __enter__(self) -> "KVFileWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ------------------------------------------------------------------ text and hdf5

def read_textfile(path: str, has_label: bool = True, separator: str = ",") -> RecordStore:
    try:
        table = np.loadtxt(path, delimiter=separator or None, dtype=np.float64, ndmin=2)
    except ValueError as err:
        raise DataError(f"{path}: not a {separator!r}-separated table of numbers ({err})") from None
    if has_label:
        return RecordStore(table[:, 1:].astype(np.float32), table[:, 0].astype(np.int32), path)
    return RecordStore(table.astype(np.float32), None, path)


def read_hdf5(path: str) -> RecordStore:
    import h5py

    with h5py.File(path, "r") as f:
        if "data" not in f:
            raise DataError(f"{path}: HDF5 store without a 'data' dataset (found: {', '.join(f) or 'nothing'})")
        if f["data"].nbytes > MEMORY_LIMIT:
            return LazyHDF5Store(path)
        data = f["data"][...].astype(np.float32)
        labels = f["label"][...].astype(np.int32) if "label" in f else None
    return RecordStore(data, labels, path)


def write_hdf5(path: str, data: np.ndarray, labels: np.ndarray | None) -> str:
    import h5py

    with h5py.File(path, "w") as f:
        f.create_dataset("data", data=np.asarray(data, np.float32))
        if labels is not None:
            f.create_dataset("label", data=np.asarray(labels, np.int32))
    return path


READERS: dict[str, Callable[..., RecordStore]] = {
    "kvfile": lambda path, **kw: read_kvfile(path),
    "textfile": lambda path, has_label=True, separator=",", **kw: read_textfile(path, has_label, separator),
    "hdf5": lambda path, **kw: read_hdf5(path),
}


def open_store(backend: str, path: str, **options) -> RecordStore:
    """Read a store; ConfigError for an unknown backend, DataError for a missing or bad file."""
    if backend not in READERS:
        raise ConfigError(f"store_conf.backend = {backend!r}: expected one of {', '.join(sorted(READERS))}")
    if not os.path.exists(path):
        raise DataError(f"{path}: no such data file")
    try:
        return READERS[backend](path, **options)
    except OSError as err:
        raise DataError(f"{path}: cannot read the {backend} store ({err})") from None
