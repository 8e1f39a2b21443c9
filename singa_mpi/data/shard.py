"""SINGA 0.1's DataShard (backend "shard"): a folder holding ``shard.dat``; and its mean files.

Byte format (v0.1 ``include/utils/data_shard.h``, ``src/utils/data_shard.cc``):
``<folder>/shard.dat`` is a concatenation of ``[key_len][key][val_len][val]``
tuples, lengths as ``size_t`` (8 bytes, little-endian on x86-64) -- the kvfile
encoding, so :func:`singa_mpi.data.stores.scan_kvfile` indexes it (dropping a
torn last tuple as DataShard does on open, rejecting corrupt lengths).  Each
value is a serialized ``Record { type image: SingleLabelImageRecord }``; our
``RecordProto`` is wire-compatible with SingleLabelImageRecord.

Mean files, as v0.1's RGBImageLayer reads ``rgbimage_conf.meanfile``: one
serialized SingleLabelImageRecord whose float ``data`` is the per-pixel mean
(``WriteProtoToBinaryFile`` in v0.1's examples/cifar10/create_shard.cc).  A
kvfile or DataShard whose first record holds the mean (v0.2+'s image_mean.bin)
is read too.
"""
from __future__ import annotations

import os
import struct

import numpy as np
from google.protobuf.message import DecodeError

from singa_mpi.data.stores import (MAX_KEY_BYTES, Backend, KVFileStore, KVFileWriter, foreign_kind,
                                   read_first_record, record_values, starts_as_kvfile)
from singa_mpi.errors import DataError
from singa_mpi.proto import job_pb2

SHARD_FILE = "shard.dat"
_LEN = struct.Struct("<Q")  # size_t lengths, as in every kvfile
# Per-record shapes of the data sets SINGA 0.1's examples read, by a word of the shard's path:
# what `check` and `plan` assume while the shard is not there yet (SINGA reads the first record).
KNOWN_SHAPES = (("mnist", (28, 28)), ("cifar", (3, 32, 32)))


def known_shape(path: str) -> tuple[int, ...] | None:
    """The record shape of the data set ``path`` names (MNIST, CIFAR-10), else None."""
    words = path.lower()
    return next((shape for word, shape in KNOWN_SHAPES if word in words), None)


def _parse_record(blob: bytes, where: str) -> job_pb2.RecordProto:
    """The image of a serialized v0.1 ``Record``; DataError if it is none."""
    wrapper = job_pb2.Record()
    try:
        wrapper.ParseFromString(blob)
    except DecodeError:
        raise DataError(f"{where} is not a SINGA 0.1 Record") from None
    if not wrapper.HasField("image"):
        raise DataError(f"{where} is a Record without an image: expected SINGA 0.1's Record {{ image }} "
                        f"(a v0.2+ kvfile is read by kRecordInput)")
    return wrapper.image


class DataShardStore(KVFileStore):
    """A DataShard folder read as a record store: the kvfile index, records unwrapped from ``Record``."""

    wrapped_in = 5  # Record.image

    def __init__(self, folder: str, cache_limit: int | None):
        if not os.path.isdir(folder):
            raise DataError(f"{folder}: not a folder: expected a DataShard folder holding {SHARD_FILE}")
        super().__init__(os.path.join(folder, SHARD_FILE), cache_limit)

    def record(self, row: int) -> job_pb2.RecordProto:
        start = int(self.offsets[row])
        return _parse_record(self._buffer[start:start + int(self.lengths[row])],
                             f"{self.path}: record {row} (key {self.keys[row]!r})")


class DataShardWriter(KVFileWriter):
    """Writes a DataShard folder: each record wrapped in a ``Record``, as v0.1's create_shard.cc."""

    def __init__(self, folder: str, key_format: str = "{:05d}"):
        os.makedirs(folder, exist_ok=True)
        super().__init__(os.path.join(folder, SHARD_FILE), key_format)

    def write(self, key: bytes | str, record: job_pb2.RecordProto) -> None:
        super().write(key, job_pb2.Record(image=record))


BACKEND = Backend(reader=lambda path, o: DataShardStore(path, o.cache_limit),
                  writer=lambda path, o: DataShardWriter(path, o.key_format))


def first_record(folder: str) -> job_pb2.RecordProto:
    """The first record of a DataShard, read alone (SINGA's Setup reads it for the shape)."""
    path = os.path.join(folder, SHARD_FILE)
    with open(path, "rb") as f:
        blob = f.read(8 + MAX_KEY_BYTES + 8)  # the first key and the first value's length, at most
        if not starts_as_kvfile(blob, os.fstat(f.fileno()).st_size):
            raise DataError(f"{path}: no whole record at byte 0 (an empty or corrupt DataShard)")
        (key_len,) = _LEN.unpack_from(blob, 0)
        (value_len,) = _LEN.unpack_from(blob, 8 + key_len)
        f.seek(16 + key_len)
        value = f.read(value_len)
    if len(value) != value_len:
        raise DataError(f"{path}: the first record is cut short (a DataShard of one torn record)")
    return _parse_record(value, f"{path}: record 0")


def record_shape(record: job_pb2.RecordProto) -> tuple[int, ...]:
    """A record's shape, or (number of values,) when it declares none (as the kvfile reader)."""
    return tuple(record.shape) or (record_values(record).size,)


# ------------------------------------------------------------------ mean files

def read_mean_file(path: str) -> np.ndarray:
    """Per-pixel means, flat float32: v0.1's SingleLabelImageRecord file, or a kvfile/DataShard's first record."""
    if os.path.isdir(path):
        return record_values(first_record(path)).astype(np.float32)
    if "binaryproto" in os.path.basename(path):
        raise DataError(f"{path}: Caffe binaryproto mean files are not read: expected SINGA's image_mean.bin "
                        f"(`singa-mpi data cifar10 ... --mean FILE` writes one)")
    with open(path, "rb") as f:
        blob = f.read()
    if starts_as_kvfile(blob):
        return read_first_record(path)
    kind = foreign_kind(path)
    if kind is not None:
        raise DataError(f"{path}: {kind}: expected a mean file: a serialized SingleLabelImageRecord (SINGA 0.1's "
                        f"image_mean.bin) or a kvfile whose record holds the mean")
    record = job_pb2.RecordProto()
    try:
        record.ParseFromString(blob)
    except DecodeError:
        raise DataError(f"{path}: not a mean file: expected a serialized SingleLabelImageRecord "
                        f"(SINGA 0.1's image_mean.bin) or a kvfile whose first record holds the mean") from None
    values = record_values(record)
    if not values.size:
        raise DataError(f"{path}: a record without values: expected the per-pixel mean as float data")
    return values.astype(np.float32)


def mean_record_bytes(mean: np.ndarray) -> bytes:
    """v0.1's image_mean.bin: one serialized SingleLabelImageRecord (shape and float data)."""
    record = job_pb2.RecordProto(shape=list(mean.shape))
    record.data.extend(np.asarray(mean, np.float32).reshape(-1).tolist())
    return record.SerializeToString()
