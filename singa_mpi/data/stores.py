"""Record stores: SINGA's kvfile, CSV text files and HDF5, read by record index.

``open_store(backend, path, "r")`` gives a :class:`RecordStore`; a data-parallel
input sub-layer reads only its own rows of each global batch, so reading is
random access: ``store.read(indices) -> (data, labels)``.  ``open_store(...,
"w")`` gives a writer that appends batches (converters and output layers).

Caching: the first ``read`` decodes the whole store into memory when its
float32 form is smaller than ``cache_limit`` (:data:`MEMORY_LIMIT`, 1 GiB).  An
epoch touches every record anyway, so this costs no more than one epoch of
per-batch decoding, and afterwards a batch is one numpy fancy-indexing operation
(no per-record protobuf parsing in the steady state).  Larger stores decode only
the requested records on every read.  A store decoded whole is small enough to
be looked at whole before training: :meth:`RecordStore.first_nonfinite` finds
its first NaN or infinity (larger stores are checked batch by batch as read).

kvfile layout (SINGA 0.2+ ``io::KVFile``, also v0.1's ``<folder>/shard.dat``):
a concatenation of ``[key_len][key][value_len][value]`` tuples, lengths as
8-byte little-endian unsigned integers (``size_t`` on x86-64), values
serialized ``RecordProto``s holding ``pixel`` bytes (uint8) or float ``data``.
Backend "shard" (:mod:`singa_mpi.data.shard`) reads v0.1's DataShard folders,
the same tuples with each record wrapped in a ``Record``.
"""
from __future__ import annotations

import dataclasses
import mmap
import os
import re
import struct
import warnings
from typing import Callable, Iterator, Sequence

import numpy as np
from google.protobuf.message import DecodeError

from singa_mpi.data import wire
from singa_mpi.errors import DataError
from singa_mpi.file_kinds import TEXT, kind_of_file
from singa_mpi.proto import job_pb2
from singa_mpi.registry import Registry

MEMORY_LIMIT = 1 << 30  # bytes of float32 data below which a store is decoded once and cached
SCAN_BYTES = 1 << 24  # float32 bytes decoded at a time by a scan of a whole store for NaN and infinity
_LEN = struct.Struct("<Q")
MAX_KEY_BYTES = 1 << 16  # keys name records (SINGA's converters: 5 to 8 digits)
MAX_VALUE_BYTES = (1 << 31) - 1  # SINGA reads a value length into an int
WALK_RECORDS = 1 << 20  # records whose fields (or labels) are read together at a time (memory: ~100 bytes each)
LABEL_FIELD, DATA_FIELD = 2, 4  # RecordProto's field numbers of ``label`` (int32) and ``data`` (packed floats)

Arrays = tuple[np.ndarray, "np.ndarray | None"]


class ShapeMismatch(DataError):
    """A store's records hold another number of values than the layer's ``store_conf.shape``: the job's
    field is the one to name (the launcher puts its file:line in front)."""


class BackendMismatch(DataError):
    """A store read with another backend than its kind (an HDF5 file named ``backend: "kvfile"``): the
    job's ``store_conf.backend`` is the field to name (the launcher puts its file:line in front)."""


def label_text(value) -> str:
    """A label as stored, for a message: a whole number in full (2147483647, where ``:g`` gave 2.14748e+09,
    a number no one could look for), a fraction as Python prints it (2.5), nan as nan."""
    value = value.item() if isinstance(value, np.generic) else value
    if isinstance(value, float) and np.isfinite(value) and value == int(value):
        value = int(value)
    return str(value)


def _where(path: str, layer: str | None) -> str:
    """Error-message prefix naming the layer (if any) and the file."""
    return f"layer '{layer}': {path}" if layer else path


# ------------------------------------------------------------------ readers

class RecordStore:
    """Random access to records of one per-sample ``shape``; ``labels`` may be absent.

    Subclasses give ``shape``, ``has_labels``, ``__len__`` and ``_decode(rows)``
    for sorted unique row numbers; this class adds caching and reordering.
    """

    shape: tuple[int, ...]
    has_labels: bool

    def __init__(self, path: str, cache_limit: int | None = None):
        self.path = path
        self.cache_limit = MEMORY_LIMIT if cache_limit is None else cache_limit  # looked up now: tests lower it
        self._cache: Arrays | None = None

    def __len__(self) -> int:
        raise NotImplementedError

    def _decode(self, rows: np.ndarray) -> Arrays:
        """float32 (len(rows), *shape) and int32 (len(rows),) labels or None; rows sorted, unique."""
        raise NotImplementedError

    def _decode_span(self, start: int, stop: int) -> np.ndarray:
        """The values of records start..stop-1.  # (stop - start, *shape) float32"""
        return self._decode(np.arange(start, stop))[0]

    def _may_hold_nonfinite(self) -> bool:
        """False where the stored type has no NaN or infinity (uint8 pixels): nothing to scan."""
        return True

    def decodes_whole(self, limit: int | None = None) -> bool:
        """Whether a first read decodes every record and keeps them: their float32 form is below ``limit``
        (default: this store's cache_limit)."""
        return len(self) * int(np.prod(self.shape)) * 4 < (self.cache_limit if limit is None else limit)

    def first_nonfinite(self, limit: int | None = None) -> tuple[int, int, float] | None:
        """(record, value index, value) of the first NaN or infinity of a store that a first read decodes
        whole (``limit``: that read's cache_limit, default MEMORY_LIMIT, the input layers'), decoded a few
        MiB at a time; None when every value is finite, and for a store too big to be decoded whole (the
        input layer looks at each batch it reads instead)."""
        if self._cache is not None:  # held already (text files, a script's arrays): a look costs little
            return _first_nonfinite_in(self._cache[0], 0)
        if not self.decodes_whole(MEMORY_LIMIT if limit is None else limit) or not self._may_hold_nonfinite():
            return None
        return self._scan_nonfinite()

    def _scan_nonfinite(self) -> tuple[int, int, float] | None:
        """:meth:`first_nonfinite` of every record, decoded a few MiB at a time."""
        rows = max(1, SCAN_BYTES // (4 * int(np.prod(self.shape))))
        for start in range(0, len(self), rows):
            found = _first_nonfinite_in(self._decode_span(start, min(start + rows, len(self))), start)
            if found is not None:
                return found
        return None

    def _release(self) -> None:
        """Drop file handles once everything is cached (subclasses that hold any)."""

    def labels_after_all(self) -> str | None:
        """Of a store read as unlabelled, where it holds labels all the same and what was expected (a
        kvfile's records each have theirs, or not); None where labels are all or none (a dataset, a column)."""
        return None

    def label_chunks(self) -> Iterator[tuple[int, np.ndarray]]:
        """(first record, its labels and those after it, as stored) for every record in turn, a bounded
        number at a time, where reading them costs little beside the records (nothing without labels, or
        where it would cost a decode): checked before training, a bad one is named with its record."""
        if self._cache is not None and self._cache[1] is not None:
            yield 0, self._cache[1]

    def every_label(self) -> np.ndarray | None:
        """Every record's label as :meth:`label_chunks` gives them, in one array; None where it gives none."""
        chunks = [labels for _, labels in self.label_chunks()]
        return np.concatenate(chunks) if chunks else None

    def read(self, indices: np.ndarray) -> Arrays:
        """Records ``indices`` (any order, repeats allowed): (len, *shape) float32, (len,) int32 or None."""
        indices = np.asarray(indices, np.int64).reshape(-1)
        if indices.size and (indices.min() < 0 or indices.max() >= len(self)):
            raise IndexError(f"{self.path}: record index outside 0..{len(self) - 1}")
        if self._cache is None and self.decodes_whole():
            self._cache = self._decode(np.arange(len(self)))
            self._release()
        if self._cache is not None:
            data, labels = self._cache
            return data[indices], None if labels is None else labels[indices]
        # stores too big to cache: decode each needed record once, in file order
        rows, inverse = np.unique(indices, return_inverse=True)
        data, labels = self._decode(rows)
        return data[inverse], None if labels is None else labels[inverse]

    def close(self) -> None:
        self._release()

    def __enter__(self) -> "RecordStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _first_nonfinite_in(values: np.ndarray, first: int) -> tuple[int, int, float] | None:
    """(first + row, value index, value) of the first NaN or infinity of ``values`` (records from
    ``first`` on), or None."""
    flat = values.reshape(len(values), -1)
    finite = np.isfinite(flat)
    if finite.all():
        return None
    row = int(np.argmin(finite.all(axis=1)))
    at = int(np.argmin(finite[row]))
    return first + row, at, float(flat[row, at])


class ArrayStore(RecordStore):
    """Records already decoded into arrays (text files are parsed in one go)."""

    def __init__(self, path: str, data: np.ndarray, labels: np.ndarray | None):
        super().__init__(path)
        self._cache = (np.asarray(data, np.float32), None if labels is None else np.asarray(labels, np.int32))
        self.shape = tuple(self._cache[0].shape[1:])
        self.has_labels = labels is not None

    def __len__(self) -> int:
        return len(self._cache[0])


def starts_as_kvfile(blob: bytes, size: int | None = None) -> bool:
    """Whether ``blob`` (the start of a file of ``size`` bytes) starts with a whole kvfile tuple.

    A serialized record never does: its first eight bytes read as a length far beyond any key."""
    size = len(blob) if size is None else size
    if len(blob) < 16:
        return False
    (key_len,) = _LEN.unpack_from(blob, 0)
    if key_len > MAX_KEY_BYTES or 16 + key_len > len(blob):
        return False
    (value_len,) = _LEN.unpack_from(blob, 8 + key_len)
    return 16 + key_len + value_len <= size


def backend_of_file(path: str) -> tuple[str, str] | None:
    """(backend, what it is) of the store ``path`` looks like, by its first bytes: an HDF5 file, a text
    file, a kvfile (a whole first tuple), a folder holding a DataShard's shard.dat; None otherwise."""
    if os.path.isdir(path):
        return ("shard", "a DataShard folder") if os.path.isfile(os.path.join(path, "shard.dat")) else None
    kind = kind_of_file(path)
    if kind is not None:
        return ("hdf5", kind) if "HDF5" in kind else ("textfile", f"{kind} (a CSV store?)") if kind == TEXT else None
    try:
        with open(path, "rb") as f:
            if starts_as_kvfile(f.read(16 + MAX_KEY_BYTES), os.fstat(f.fileno()).st_size):
                return "kvfile", "a kvfile"
    except OSError:
        pass
    return None


def misread(path: str, backend: str) -> BackendMismatch | None:
    """The error for a store of another backend's kind read as a ``backend`` store, else None."""
    found = backend_of_file(path)
    if found is None or found[0] == backend:
        return None
    other, what = found
    return BackendMismatch(f"{path}: {what}, read with backend \"{backend}\": expected backend \"{other}\" for "
                           f"it (or another file at this path)")


def kvfile_path(path: str) -> str:
    """SINGA accepts a file, or (v0.1's DataShard) a folder holding ``shard.dat``."""
    return os.path.join(path, "shard.dat") if os.path.isdir(path) else path


def _check_length(path: str, at: int, what: str, length: int, limit: int, why: str) -> None:
    """DataError naming the byte offset of a length no writer could have written."""
    if length > limit:
        raise DataError(f"{path}: byte {at}: {what} length {length} is corrupt (expected at most {limit} "
                        f"bytes: {why}): the file is damaged, not just cut short")


def scan_kvfile(buffer, path: str) -> tuple[list[bytes], np.ndarray, np.ndarray]:
    """Keys, value offsets and value lengths of every whole tuple in ``buffer``.

    A torn last tuple (an interrupted write: the file ends inside it) is ignored
    with a warning, as SINGA's KVFile and DataShard do on open.  A corrupt length
    is a DataError naming its byte offset: one beyond what SINGA can hold (keys
    name records; values are read into an ``int``), or one that runs past the end
    of the file while being far longer than every record before it (a torn tuple
    declares a length like its neighbours').  Reading the headers is one small
    step per record; the values themselves are not touched here.
    """
    keys, offsets, lengths = [], [], []
    position, end, longest = 0, len(buffer), 0
    while position + 8 <= end:
        (key_len,) = _LEN.unpack_from(buffer, position)
        _check_length(path, position, "key", key_len, MAX_KEY_BYTES, "keys name records")
        value_at = position + 16 + key_len
        if value_at > end:
            break
        (value_len,) = _LEN.unpack_from(buffer, position + 8 + key_len)
        _check_length(path, position + 8 + key_len, "value", value_len, MAX_VALUE_BYTES,
                      "SINGA reads a value length into an int")
        if value_at + value_len > end:
            if keys:  # slack for values of variable size
                _check_length(path, position + 8 + key_len, "value", value_len, 2 * longest + 4096,
                              "it runs past the end of the file, and a torn record is as long as those before")
            break
        keys.append(bytes(buffer[position + 8:position + 8 + key_len]))
        offsets.append(value_at)
        lengths.append(value_len)
        longest = max(longest, value_len)
        position = value_at + value_len
    if position < end:
        warnings.warn(f"{path}: ignoring a torn record at byte {position} of {end} (an interrupted write)",
                      stacklevel=3)
    return keys, np.array(offsets, np.int64), np.array(lengths, np.int64)


def _first_nonfinite_at(buffer, starts: np.ndarray, records: np.ndarray,
                        size: int) -> tuple[int, int, float] | None:
    """(record, value index, value) of the first NaN or infinity among the ``size`` float32 values at each
    byte offset ``starts`` of ``buffer`` (those of ``records``, ascending), a few MiB at a time.

    Records a converter writes lie at a constant distance from each other (a change of key length
    starts another run): each run is read as one strided table, not record by record."""
    raw, width, found = np.frombuffer(buffer, np.uint8), 4 * size, None
    gaps = np.diff(starts)
    changes = [0, *(np.flatnonzero(gaps[1:] != gaps[:-1]) + 1).tolist(), len(gaps)]
    step, begin = max(1, SCAN_BYTES // width), 0
    for lo, hi in zip(changes, changes[1:]):  # gaps[lo:hi] alike: records lo..hi (those before begin read)
        end = hi + 1
        stride = int(gaps[lo]) if lo < len(gaps) else width
        for first in range(begin, end, step):
            rows = min(step, end - first)
            table = np.lib.stride_tricks.as_strided(raw[starts[first]:], (rows, width), (stride, 1), writeable=False)
            found = _first_nonfinite_in(np.ascontiguousarray(table).view(np.float32), 0)
            if found is not None:
                found = (int(records[first + found[0]]), found[1], found[2])
                break
        begin = end
        if found is not None:
            break
    del raw  # no view may outlive the call: the mmap closes when the store does
    return found


def record_values(record: job_pb2.RecordProto) -> np.ndarray:
    """A record's float ``data`` if it has any, else its ``pixel`` bytes (as SINGA's Parse does)."""
    if len(record.data):
        return np.asarray(record.data, np.float32)
    return np.frombuffer(record.pixel, np.uint8)


class KVFileStore(RecordStore):
    """A kvfile indexed once by its headers; records are decoded on demand (or all, then cached).

    The checks before training read every record's label and look at its values without a protobuf
    parse per record (:mod:`singa_mpi.data.wire`), where the records are encoded as protobuf's own
    writers encode them; otherwise record by record."""

    wrapped_in: int | None = None  # the field of an outer message holding each RecordProto (a DataShard's)

    def __init__(self, path: str, cache_limit: int | None = None):
        super().__init__(kvfile_path(path), cache_limit)
        if os.path.isdir(path) and not os.path.isfile(self.path):  # not "PATH/shard.dat: no such file": no one named it
            raise DataError(f"{path}: a folder without a file shard.dat: expected a kvfile (or SINGA 0.1's DataShard "
                            f"folder, holding shard.dat)")
        if not os.path.isfile(self.path):
            raise DataError(f"{self.path}: no such file")
        self._file = open(self.path, "rb")
        try:
            self._index()
        except DataError:
            self._release()
            raise

    def _index(self) -> None:
        opened = os.fstat(self._file.fileno())
        if opened.st_size == 0:
            raise DataError(f"{self.path}: empty kvfile (no records)")
        self._opened = (opened.st_size, opened.st_mtime_ns)  # the file the index describes
        self._buffer = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)
        self.keys, self.offsets, self.lengths = scan_kvfile(self._buffer, self.path)
        if not self.keys:
            raise DataError(f"{self.path}: no whole record in this kvfile")
        first = self.record(0)
        self.size = record_values(first).size
        if self.size == 0 and self._is_datashard():
            raise BackendMismatch(f"{self.path}: a DataShard (SINGA 0.1's Record values), read with backend "
                                  f"\"kvfile\": expected backend \"shard\" for it (or a kvfile of RecordProto values)")
        if self.size == 0:  # else read as records of shape (0,), which no store_conf.shape matches
            raise DataError(f"{self.path}: record 0 (key {self.keys[0]!r}) holds no values: expected a RecordProto "
                            f"with its values as float data or pixel bytes")
        self.shape = tuple(first.shape) or (self.size,)
        if int(np.prod(self.shape)) != self.size:
            raise DataError(f"{self.path}: record 0 has {self.size} values but shape {list(first.shape)}")
        self.has_labels = first.HasField("label")

    def __len__(self) -> int:
        return len(self.offsets)

    def _is_datashard(self) -> bool:
        """Whether record 0 is a DataShard's Record (its image one level down), which read as a kvfile's
        RecordProto holds no values."""
        start, wrapper = int(self.offsets[0]), job_pb2.Record()
        try:
            wrapper.ParseFromString(self._buffer[start:start + int(self.lengths[0])])
        except DecodeError:
            return False
        return wrapper.HasField("image") and record_values(wrapper.image).size > 0

    def record(self, row: int) -> job_pb2.RecordProto:
        """The parsed RecordProto at position ``row`` of the file."""
        start = int(self.offsets[row])
        record = job_pb2.RecordProto()
        try:
            record.ParseFromString(self._buffer[start:start + int(self.lengths[row])])
        except DecodeError:
            raise DataError(f"{self.path}: record {row} (key {self.keys[row]!r}) is not a RecordProto") from None
        return record

    def _refuse_changed(self) -> None:
        """DataError when the file is no longer the one indexed: a mapped page past the end of a file cut short
        kills the process (SIGBUS: "Bus error", not a word on the file), and a file written again in place
        holds other records than the index says.  Looked at before each read of the mapped records."""
        now = os.fstat(self._file.fileno())
        if (now.st_size, now.st_mtime_ns) != self._opened:
            raise DataError(f"{self.path}: changed while this run read it ({now.st_size} bytes now, {self._opened[0]} "
                            f"when opened, modified since): expected it unchanged until the run ends (write a new "
                            f"store under another name)")

    def _decode(self, rows: np.ndarray) -> Arrays:
        self._refuse_changed()
        # per-record protobuf parsing cannot be vectorised; everything after it is
        records = [self.record(int(row)) for row in rows]
        values = [record_values(record) for record in records]
        sizes = np.array([v.size for v in values])
        bad = np.flatnonzero(sizes != self.size)
        if bad.size:
            row = int(rows[bad[0]])
            raise DataError(f"{self.path}: record {row} (key {self.keys[row]!r}) has {sizes[bad[0]]} values, "
                            f"expected {self.size} (shape {self.shape}, from record 0)")
        data = np.stack(values).astype(np.float32, copy=False).reshape((len(rows),) + self.shape)
        if not self.has_labels:
            return data, None
        self._refuse_unlabelled(rows, np.array([record.HasField("label") for record in records]))
        return data, np.array([record.label for record in records], np.int32)

    def _refuse_unlabelled(self, rows: np.ndarray, labelled: np.ndarray) -> None:
        """DataError naming the first of ``rows`` (ascending) not ``labelled``, in a store whose record 0 has a
        label: protobuf reads a missing one as 0, and SINGA trained on it (a wrong label, without a word)."""
        if not labelled.all():
            raise DataError(f"{self.missing_label(int(rows[np.argmin(labelled)]), 0)} (protobuf reads a missing one as "
                            f"label 0)")

    def missing_label(self, row: int, labelled: int) -> str:
        """Where record ``row`` has no label, while record ``labelled`` has one, and what was expected."""
        return (f"{self.path}: record {row} (key {self.keys[row]!r}) has no label, while record {labelled} has one: "
                f"expected a label in every record")

    def labels_after_all(self) -> str | None:
        """Record 0 holds no label, so the store reads as unlabelled: the first record holding one, read as
        :meth:`label_chunks` reads labels (only to word a refusal), else None."""
        for start in range(0, len(self), WALK_RECORDS):
            stop = min(start + WALK_RECORDS, len(self))
            fields = self._record_fields(start, stop)
            label = None if fields is None else fields.get(LABEL_FIELD)
            labelled = (np.array([self.record(row).HasField("label") for row in range(start, stop)])
                        if fields is None else np.zeros(0, bool) if label is None else label.count > 0)
            if labelled.any():
                return self.missing_label(0, start + int(np.argmax(labelled)))
        return None

    def _record_fields(self, start: int, stop: int) -> dict[int, wire.Field] | None:
        """The fields of the RecordProtos of records start..stop-1, read together
        (:func:`singa_mpi.data.wire.walk`); None where only a parse of each record reads them as protobuf does."""
        self._refuse_changed()
        offsets, lengths = self.offsets[start:stop], self.lengths[start:stop]
        if self.wrapped_in is not None:
            outer = wire.walk(self._buffer, offsets, lengths)
            inner = None if outer is None else outer.get(self.wrapped_in)
            if inner is None or inner.wire != wire.DELIMITED or (inner.count != 1).any():
                return None  # records without it (the parse words that), or several (protobuf merges them)
            offsets, lengths = inner.value, inner.length
        return wire.walk(self._buffer, offsets, lengths)

    def label_chunks(self) -> Iterator[tuple[int, np.ndarray]]:
        """Each record's label, WALK_RECORDS records at a time (memory: some 100 bytes a record of the
        chunk, whatever the file's size): read from the bytes of the chunk's records together (0.05 s for
        a 200 MB file), or parsed record by record (about a microsecond each) where those are not as
        protobuf writes them."""
        if self._cache is not None or not self.has_labels or self._file.closed:
            yield from super().label_chunks()
            return
        for start in range(0, len(self), WALK_RECORDS):
            stop = min(start + WALK_RECORDS, len(self))
            fields = self._record_fields(start, stop)
            label = None if fields is None else fields.get(LABEL_FIELD)
            rows = np.arange(start, stop)
            if fields is None or (label is not None and label.wire != wire.VARINT):
                records = [self.record(row) for row in range(start, stop)]
                self._refuse_unlabelled(rows, np.array([record.HasField("label") for record in records]))
                yield start, np.array([record.label for record in records], np.int64)
                continue
            self._refuse_unlabelled(rows, np.zeros(len(rows), bool) if label is None else label.count > 0)
            yield start, wire.int32_of(label.value).astype(np.int64)

    def _scan_nonfinite(self) -> tuple[int, int, float] | None:
        """The float ``data`` of every record, looked at where the bytes lie (uint8 ``pixel`` records hold
        no NaN); decoded a few MiB at a time where the records are not as protobuf writes them."""
        for start in range(0, len(self), WALK_RECORDS):
            fields = self._record_fields(start, min(start + WALK_RECORDS, len(self)))
            data = None if fields is None else fields.get(DATA_FIELD)
            if fields is None or (data is not None and (data.wire != wire.DELIMITED or (data.count > 1).any())):
                return super()._scan_nonfinite()  # unpacked or repeated values: the decode's concern
            if data is None:
                continue  # pixels alone
            floats = np.flatnonzero(data.length > 0)  # the others are read as their pixels
            if (data.length[floats] != 4 * self.size).any():
                return super()._scan_nonfinite()  # a record of another size: the decode words it
            found = _first_nonfinite_at(self._buffer, data.value[floats], start + floats, self.size)
            if found is not None:
                return found
        return None

    def _release(self) -> None:
        if not self._file.closed:
            if hasattr(self, "_buffer"):  # absent when the file was empty
                self._buffer.close()
            self._file.close()


MEAN_EXPECTED = ("expected a kvfile of one record holding one value per input value (`singa-mpi data cifar10 "
                 "... --mean FILE` writes SINGA's image_mean.bin)")


def read_first_record(path: str) -> np.ndarray:
    """The values of a kvfile's first record (SINGA's mean/std file, e.g. image_mean.bin).  A file of
    another kind (an HDF5 or text store, a kvfile of labelled samples) is a DataError saying what it
    is, not that a kvfile is damaged."""
    try:
        store = KVFileStore(path, cache_limit=0)
    except DataError:
        kind = foreign_kind(path)
        if kind is None:
            raise
        raise DataError(f"{path}: {kind}: {MEAN_EXPECTED}") from None
    try:
        if len(store) > 1 and store.has_labels:  # SINGA took an image store's first image as the mean
            raise DataError(f"{path}: a kvfile of {len(store)} labelled records (a store of samples?): "
                            f"{MEAN_EXPECTED}")
        return record_values(store.record(0)).astype(np.float32)
    finally:
        store.close()


def foreign_kind(path: str) -> str | None:
    """What a file that is no kvfile or SINGA record looks like (:mod:`singa_mpi.file_kinds`): an HDF5,
    gzip, IDX or image file, or text (a CSV?); else None."""
    kind = kind_of_file(path)
    return f"{kind} (a CSV store?)" if kind == TEXT else kind


def read_textfile(path: str, has_label: bool = True, separator: str = ",") -> ArrayStore:
    """``label,v1,v2,...`` lines (or ``v1,v2,...`` without labels), parsed in one go."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # numpy warns on an empty file; we raise below
            table = np.loadtxt(path, delimiter=separator or None, dtype=np.float64, ndmin=2)
    except (ValueError, UnicodeDecodeError) as err:
        between = repr(separator) if separator else "whitespace"
        found = first_bad_field(path, separator) or f"({_shortened(' '.join(str(err).split()), 200)})"
        raise DataError(f"{path}: {found}: expected a table of numbers separated by {between}") from None
    if table.size == 0:
        raise DataError(f"{path}: empty text file (no records)")
    if not has_label:
        return ArrayStore(path, _finite(path, table, 0), None)
    if table.shape[1] < 2:
        raise DataError(f"{path}: one column only, expected label,v1,v2,... (has_label: false?)")
    labels = table[:, 0]
    whole = np.isfinite(labels) & (labels == np.round(labels)) & (labels >= 0) & (labels < 2 ** 31)
    if not whole.all():  # a cast would make 1.7 a 1 and nan, -3 or 1e12 nonsense, without a word
        row = int(np.argmin(whole))
        raise DataError(f"{path}: row {row + 1}: label {label_text(labels[row])}: expected a whole number >= 0 in the "
                        f"first column (has_label: false, or --no-label, if the file holds no labels)")
    return ArrayStore(path, _finite(path, table[:, 1:], 1), labels.astype(np.int32))


def _finite(path: str, values: np.ndarray, before: int) -> np.ndarray:
    """``values`` (columns ``before`` + 1 on of the file), or a DataError naming the first nan or inf:
    numpy reads them, and the net would learn nothing from them, to say so only after some steps."""
    finite = np.isfinite(values)
    if not finite.all():
        row, column = (int(i) for i in np.argwhere(~finite)[0])
        raise DataError(f"{path}: row {row + 1}, column {column + 1 + before}: {values[row, column]:g}: expected "
                        f"a finite number (a missing value?)")
    return values


def _shortened(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def first_bad_field(path: str, separator: str) -> str | None:
    """Where a text table is not numbers, as a reader can find it: ``line L, column C: 'x' is not a
    number`` (the field alone, cut short: a row may be megabytes), a line of another column count, or
    a byte that is no UTF-8; None when every field reads (numpy refused it for another reason).
    Lines and columns count from 1; ``#`` starts a comment and blank lines are skipped, as numpy does."""
    columns, first = None, 0
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                return f"line {number}, byte {err.start + 1}: 0x{raw[err.start]:02x} is not UTF-8 text"
            fields = line.split("#", 1)[0].split(separator or None)
            if not "".join(fields).strip():
                continue
            for column, field in enumerate(fields, 1):
                try:
                    float(field)
                except ValueError:
                    return f"line {number}, column {column}: {_shortened(field.strip())!r} is not a number"
            if columns is None:
                columns, first = len(fields), number
            elif len(fields) != columns:
                return f"line {number}: {len(fields)} values, where line {first} has {columns}"
    return None


# What h5py raises on a damaged file depends on the damaged byte (flipping bytes of a small store gives
# all of these): OSError when the superblock is gone, RuntimeError ("bad heap free list"), KeyError,
# ValueError ("Insufficient precision ..."), TypeError from objects HDF5 could not resolve.
HDF5_DAMAGE = (OSError, RuntimeError, KeyError, ValueError, TypeError, AttributeError, IndexError, OverflowError)


# HDF5's messages, as h5py passes them on: "Unable to synchronously open file (file signature not found)"
_HDF5_REASON = re.compile(r"^(?:Unable to|Can't) [^(]*\((.+)\)$")
HDF5_EXPECTED = "expected an HDF5 file with a 'data' dataset of records (N, *shape), as `singa-mpi data` writes"


def _hdf5_reason(err: BaseException) -> str:
    """`` (HDF5: <its reason>)`` when HDF5 said what it found wrong, else nothing: the exception's class
    and h5py's own wording (an object of an unexpected kind) tell a user nothing about the file."""
    text = " ".join(str(err).split()).strip("'\"")  # on one line; a KeyError quotes its message
    found = _HDF5_REASON.match(text)
    return f" (HDF5: {found.group(1)})" if found else ""


class HDF5Store(RecordStore):
    """Datasets ``data`` (N, *shape) and optional ``label`` (N,) of an HDF5 file.

    An empty or damaged file is a DataError naming it and what is wrong, when opened (its header,
    datasets and shapes) or when records are read (damage inside the data)."""

    def __init__(self, path: str, cache_limit: int | None = None):
        import h5py

        super().__init__(path, cache_limit)
        self._file = None
        try:
            self._file = h5py.File(path, "r")
            self._open_datasets()
        except DataError:
            self._release()
            raise
        except PermissionError as err:  # an OSError too, but no damage: the OS's reason, as for other backends
            self._release()
            raise OSError(err.errno, os.strerror(err.errno)) from None
        except HDF5_DAMAGE as err:
            self._release()
            raise DataError(f"{path}: cannot read it as a hdf5 store: damaged, or not an HDF5 file"
                            f"{_hdf5_reason(err)}: {HDF5_EXPECTED}") from None

    def _open_datasets(self) -> None:
        path = self.path
        if "data" not in self._file:
            found = ", ".join(self._file) or "nothing"
            raise DataError(f"{path}: HDF5 store without a 'data' dataset (found: {found})")
        self._data = self._file["data"]
        self._labels = self._file["label"] if "label" in self._file else None
        for name, dataset in (("data", self._data), ("label", self._labels)):
            if dataset is not None and (not hasattr(dataset, "dtype") or dataset.dtype.kind not in "biuf"):
                # else strings are "damaged" when read, a group "not an HDF5 file", complex values cut to reals
                found = f"of type {dataset.dtype}" if hasattr(dataset, "dtype") else "a group"
                raise DataError(f"{path}: '{name}' is {found}: expected a dataset of numbers (integers or floats), "
                                f"as `singa-mpi data` writes")
        if self._data.ndim == 0:
            raise DataError(f"{path}: 'data' is a scalar: expected one row per record (N, *shape)")
        self.shape = tuple(self._data.shape[1:])
        if 0 in self.shape:  # else refused as a store_conf.shape that should multiply to 0
            raise DataError(f"{path}: 'data' of shape {self._data.shape}: records of no values: expected (N, *shape) "
                            f"with every size above 0")
        self.has_labels = self._labels is not None
        self._length = len(self._data)
        if self._length == 0:
            raise DataError(f"{path}: empty HDF5 store ('data' holds no records)")
        if self._labels is not None and (self._labels.ndim != 1 or len(self._labels) != self._length):
            raise DataError(f"{path}: 'label' of shape {self._labels.shape} for {self._length} records: "
                            f"expected ({self._length},)")

    def __len__(self) -> int:
        return self._length

    def _decode(self, rows: np.ndarray) -> Arrays:
        whole = len(rows) == self._length  # rows are sorted and unique: all of them
        pick = slice(None) if whole else rows  # h5py fancy indexing wants increasing indices
        try:
            data = np.asarray(self._data[pick], np.float32)
            labels = None if self._labels is None else np.asarray(self._labels[pick], np.int32)
        except HDF5_DAMAGE as err:
            raise DataError(f"{self.path}: damaged HDF5 store: cannot read its records{_hdf5_reason(err)}: expected "
                            f"records HDF5 can read: write it again (`singa-mpi data`)") from None
        return data, labels

    def _may_hold_nonfinite(self) -> bool:
        return self._data.dtype.kind not in "iub"  # pixels (uint8) or other integers: always finite

    def _decode_span(self, start: int, stop: int) -> np.ndarray:
        try:
            return np.asarray(self._data[start:stop], np.float32)  # a slice: h5py's fancy indexing is slow
        except HDF5_DAMAGE as err:
            raise DataError(f"{self.path}: damaged HDF5 store: cannot read its records{_hdf5_reason(err)}: expected "
                            f"records HDF5 can read: write it again (`singa-mpi data`)") from None

    def label_chunks(self) -> Iterator[tuple[int, np.ndarray]]:
        if self._cache is not None or self._labels is None or not self._file:
            yield from super().label_chunks()
            return
        for start in range(0, self._length, WALK_RECORDS):
            try:  # as stored: a float label is not yet cast
                labels = np.asarray(self._labels[start:start + WALK_RECORDS])
            except HDF5_DAMAGE:  # reading the records reports the damage
                return
            yield start, labels

    def _release(self) -> None:
        if self._file:
            self._file.close()


# ------------------------------------------------------------------ writers

class StoreWriter:
    """Appends batches of records to one file: ``write_batch``, ``flush``, ``close``."""

    file: object

    def write_batch(self, data: np.ndarray, labels: np.ndarray | None = None) -> None:
        raise NotImplementedError

    def flush(self) -> None:
        self.file.flush()

    def close(self) -> None:
        self.file.close()  # idempotent for Python and h5py files

    def __enter__(self) -> "StoreWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class KVFileWriter(StoreWriter):
    """Writes SINGA kvfile tuples; keys must be unique and non-empty (as KVFile::Insert)."""

    def __init__(self, path: str, key_format: str = "{:05d}"):
        self.path = path
        self.key_format = key_format  # keys of write_batch: a running count, like SINGA's converters
        self.file = open(path, "wb")
        self.keys: set[bytes] = set()

    def write(self, key: bytes | str, record: job_pb2.RecordProto) -> None:
        key = key.encode() if isinstance(key, str) else bytes(key)
        if not key:
            raise ValueError(f"{self.path}: empty key")
        if key in self.keys:
            raise ValueError(f"{self.path}: key {key!r} already written")
        value = record.SerializeToString()
        self.keys.add(key)
        self.file.write(_LEN.pack(len(key)) + key + _LEN.pack(len(value)) + value)

    def write_batch(self, data: np.ndarray, labels: np.ndarray | None = None) -> None:
        """One RecordProto per row: uint8 rows as ``pixel`` bytes, others as float ``data``."""
        shape = list(data.shape[1:])
        pixels = data.dtype == np.uint8
        flat = (data if pixels else np.asarray(data, np.float32)).reshape(len(data), -1)
        # one protobuf message per record: the format has no batch form
        for i, row in enumerate(flat):
            record = job_pb2.RecordProto(shape=shape)
            if pixels:
                record.pixel = row.tobytes()
            else:
                record.data.extend(row.tolist())
            if labels is not None:
                record.label = int(labels[i])
            self.write(self.key_format.format(len(self.keys)), record)


class TextFileWriter(StoreWriter):
    """Appends ``label,v1,v2,...`` lines (no label column when labels are None)."""

    def __init__(self, path: str, separator: str = ","):
        self.path, self.separator = path, separator or ","
        self.file = open(path, "w")

    def write_batch(self, data: np.ndarray, labels: np.ndarray | None = None) -> None:
        flat = np.asarray(data).reshape(len(data), -1)
        # %.9g keeps every float32 exactly; integers (pixels) print without a fraction
        if labels is None:
            np.savetxt(self.file, flat, delimiter=self.separator, fmt="%.9g")
        else:
            table = np.column_stack([np.asarray(labels, np.float64), flat.astype(np.float64)])
            np.savetxt(self.file, table, delimiter=self.separator, fmt=["%d"] + ["%.9g"] * flat.shape[1])


class HDF5Writer(StoreWriter):
    """Appends batches to resizable ``data`` and ``label`` datasets (uint8 data stays uint8)."""

    def __init__(self, path: str):
        import h5py

        self.path = path
        self.file = h5py.File(path, "w")

    def write_batch(self, data: np.ndarray, labels: np.ndarray | None = None) -> None:
        data = data if data.dtype == np.uint8 else np.asarray(data, np.float32)
        if "data" not in self.file:
            self.file.create_dataset("data", data=data, maxshape=(None,) + data.shape[1:], chunks=True)
            if labels is not None:
                self.file.create_dataset("label", data=np.asarray(labels, np.int32), maxshape=(None,), chunks=True)
            return
        if data.shape[1:] != self.file["data"].shape[1:] or (labels is None) == ("label" in self.file):
            raise ValueError(f"{self.path}: batch of shape {data.shape} (labels: {labels is not None}) does not "
                             f"match the records written before")
        _append(self.file["data"], data)
        if labels is not None:
            _append(self.file["label"], np.asarray(labels, np.int32))


def _append(dataset, rows: np.ndarray) -> None:
    start = dataset.shape[0]
    dataset.resize(start + len(rows), axis=0)
    dataset[start:] = rows


# ------------------------------------------------------------------ registry

@dataclasses.dataclass(frozen=True)
class StoreOptions:
    """What a backend may need besides the path."""

    has_label: bool = True  # textfile: the first column is the label
    separator: str = ","  # textfile
    cache_limit: int | None = None  # readers: decode everything on the first read below this size (MEMORY_LIMIT)
    key_format: str = "{:05d}"  # kvfile writers: keys of a running count


@dataclasses.dataclass(frozen=True)
class Backend:
    """How to open one kind of store for reading and for writing."""

    reader: Callable[[str, StoreOptions], RecordStore]
    writer: Callable[[str, StoreOptions], StoreWriter]
    in_memory: bool = False  # its paths name what the process holds, not files (nothing to look for on disk)


BACKENDS: Registry[Backend] = Registry("store backend", "backend", shared_names=False)  # no user_type to choose
BACKENDS.register("hdf5", obj=Backend(reader=lambda path, o: HDF5Store(path, o.cache_limit),
                                      writer=lambda path, o: HDF5Writer(path)))
BACKENDS.register("kvfile", obj=Backend(reader=lambda path, o: KVFileStore(path, o.cache_limit),
                                        writer=lambda path, o: KVFileWriter(path, o.key_format)))
BACKENDS.register("textfile", obj=Backend(reader=lambda path, o: read_textfile(path, o.has_label, o.separator),
                                          writer=lambda path, o: TextFileWriter(path, o.separator)))
BACKENDS.register_lazy("shard", "singa_mpi.data.shard:BACKEND")  # SINGA 0.1's DataShard folders
BACKENDS.register_lazy("memory", "singa_mpi.data.memory:BACKEND")  # a Python script's arrays (singa_mpi.api)


def in_memory(backend: str) -> bool:
    """Whether ``backend``'s paths name arrays in the process rather than files (unknown: False; a
    job naming one is refused where the backend is looked up)."""
    return backend in BACKENDS and BACKENDS.get(backend).in_memory


def check_backend(backend: str) -> Backend:
    """The registered backend; ConfigError listing the valid names otherwise."""
    return BACKENDS.get(backend)


def open_store(backend: str, path: str, mode: str = "r", *, layer: str | None = None,
               shape: Sequence[int] | None = None, has_label: bool = True, separator: str = ",",
               cache_limit: int | None = None, key_format: str = "{:05d}") -> RecordStore | StoreWriter:
    """A RecordStore (mode "r") or a batch writer (mode "w") for ``backend`` at ``path``.

    Reading: DataError naming the layer (if given) and the path for a missing or
    unreadable file, or when the records do not hold ``prod(shape)`` values
    (SINGA checks the value count only, so shape 784 reads 1x28x28 records).
    ``has_label`` and ``separator`` apply to text files; ``key_format`` to kvfile writers.
    """
    kind = check_backend(backend)
    options = StoreOptions(has_label, separator, cache_limit, key_format)
    if mode == "w":
        return kind.writer(path, options)
    if mode != "r":
        raise ValueError(f"open_store mode {mode!r}: expected 'r' or 'w'")
    if not kind.in_memory and not os.path.exists(path):
        raise DataError(f"{_where(path, layer)}: no such file")
    if backend in ("hdf5", "textfile") and os.path.isdir(path):  # a kvfile may be a v0.1 folder (shard.dat)
        other = misread(path, backend)  # a DataShard folder
        message = f"{path}: a folder: expected a file" if other is None else str(other)
        raise (DataError if other is None else BackendMismatch)(f"layer '{layer}': {message}" if layer else message)
    try:
        store = kind.reader(path, options)
    except DataError as err:
        # a file of another backend's kind, where the reader's words would call it damaged or not text (HDF5's
        # say "not an HDF5 file"; kShardData's name its folder, and it has no backend field)
        mismatch = backend in ("kvfile", "textfile") and not isinstance(err, BackendMismatch)
        found = misread(path, backend) or err if mismatch else err
        raise type(found)(f"layer '{layer}': {found}" if layer else str(found)) from None
    except OSError as err:  # the OS's reason, not Python's "[Errno 21] ...: 'path'"
        raise DataError(f"{_where(path, layer)}: cannot read it as a {backend} store "
                        f"({err.strerror or ' '.join(str(err).split())})") from None
    if len(store) == 0:  # every reader refuses one already; a plugin's might not
        store.close()
        raise DataError(f"{_where(path, layer)}: empty {backend} store (no records)")
    if shape is not None and int(np.prod(store.shape)) != int(np.prod(shape)):
        store.close()
        raise ShapeMismatch(f"{_where(path, layer)}: records of shape {store.shape}, but store_conf.shape is "
                            f"{tuple(shape)}: expected a shape whose sizes multiply to {int(np.prod(store.shape))}, "
                            f"the values in each record, or another store")
    return store
