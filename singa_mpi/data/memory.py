"""Arrays a Python script holds, read as a store (backend ``memory``): the Python API's in-memory data.

A script gives its arrays once (:func:`register`, called by ``singa_mpi.api``'s
``RecordInput.from_arrays``) and the job names them by ``store_conf.path``: ``memory:<name>@<digest>``.
Every rank of a script under ``mpirun`` holds the same arrays and, like any store, reads only the rows
of its batches.  The digest of the contents is part of the name, so ranks whose arrays differ hold
different jobs, which the launch's vote refuses in one line before any step.  A ``.conf`` file cannot
carry arrays: run as a file, the job fails on the first read, saying so.

Texts are held the same way (:func:`register_bytes`, for ``CharRNN.from_text``: char-rnn's text and
its vocabulary), named ``memory:<name>@<digest>`` in ``char_rnn_conf``'s ``path`` and ``vocab_path``.
"""
from __future__ import annotations

import hashlib

import numpy as np

from singa_mpi.data.stores import ArrayStore, Backend, StoreOptions
from singa_mpi.errors import DataError

SCHEME = "memory:"
_ARRAYS: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
_BYTES: dict[str, bytes] = {}


LABEL_RANGE = (int(np.iinfo(np.int32).min), int(np.iinfo(np.int32).max))  # labels are held as int32


def label_outside_int32(labels: np.ndarray) -> tuple[int, int] | None:
    """(row, label) of the first label int32 cannot hold (a cast would wrap it: 2**40 becomes 0), or
    None; ``labels`` of an integer dtype."""
    outside = np.flatnonzero((labels < LABEL_RANGE[0]) | (labels > LABEL_RANGE[1]))
    return (int(outside[0]), int(labels[outside[0]])) if len(outside) else None


def register(name: str, data: np.ndarray, labels: np.ndarray | None = None) -> str:
    """Keep ``data`` (rows of records) and ``labels`` (one int per row, or None) for this process's
    jobs; returns the path that names them (``memory:<name>@<digest of the contents>``).  ValueError
    for labels that are not integers or that int32 cannot hold (never wrapped into other classes)."""
    data = np.ascontiguousarray(data, np.float32)
    labels = None if labels is None else _int32_labels(name, np.asarray(labels))
    digest = hashlib.blake2b(digest_size=8)
    for array in (data, labels):
        if array is not None:
            digest.update(str(array.shape).encode())
            digest.update(array.data)
    path = f"{SCHEME}{name}@{digest.hexdigest()}"
    _ARRAYS[path] = (data, labels)
    return path


def _int32_labels(name: str, labels: np.ndarray) -> np.ndarray:
    if labels.dtype.kind not in "iu":
        raise ValueError(f"memory arrays {name!r}: labels of dtype {labels.dtype}: expected integers")
    outside = label_outside_int32(labels)
    if outside is not None:
        raise ValueError(f"memory arrays {name!r}: row {outside[0]}: label {outside[1]}: expected a label "
                         f"int32 holds ({LABEL_RANGE[0]}..{LABEL_RANGE[1]})")
    return np.ascontiguousarray(labels, np.int32)


def register_bytes(name: str, data: bytes) -> str:
    """Keep ``data`` (a text, a vocabulary) for this process's jobs; returns the path that names it."""
    data = bytes(data)
    path = f"{SCHEME}{name}@{hashlib.blake2b(data, digest_size=8).hexdigest()}"
    _BYTES[path] = data
    return path


def is_memory_path(path: str) -> bool:
    return path.startswith(SCHEME)


def held_bytes(path: str, what: str) -> bytes:
    """The bytes ``path`` names; DataError naming ``what`` when this process holds none of that name."""
    if path not in _BYTES:
        raise DataError(f"{what} {path}: no text of that name in this process: it names a text a Python script "
                        f"gave singa_mpi.api (CharRNN.from_text); a .conf file cannot carry it (write the text "
                        f"and its vocabulary to files: singa-mpi data text -h)")
    return _BYTES[path]


def read(path: str, options: StoreOptions) -> ArrayStore:
    """The arrays ``path`` names, as a store; DataError when this process holds none of that name."""
    if path not in _ARRAYS:
        raise DataError(f"{path}: no arrays of that name in this process: the memory backend reads arrays a "
                        f"Python script gave singa_mpi.api (RecordInput.from_arrays); a .conf file cannot "
                        f"carry them (convert them into a store: singa-mpi data -h)")
    data, labels = _ARRAYS[path]
    return ArrayStore(path, data, labels if options.has_label else None)


def _no_writer(path: str, options: StoreOptions):
    raise DataError(f"{path}: the memory backend is read-only (arrays come from a Python script)")


BACKEND = Backend(reader=read, writer=_no_writer, in_memory=True)

__all__ = ["register", "label_outside_int32", "LABEL_RANGE", "register_bytes", "is_memory_path", "held_bytes", "read",
           "BACKEND", "SCHEME"]
