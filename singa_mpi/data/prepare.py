"""The stores a job reads: which are missing, the command that makes each, and the bundled digits.

Store paths in a job file are used as written: a relative path is relative to
the folder ``singa-mpi`` runs in (then, failing that, to the workspace), never
to the job file.  A missing store of scikit-learn's bundled digits
(``.../digits/train.h5`` or ``test.h5``, as ``singa-mpi data digits`` names
them) is prepared wherever a job asks for it; for anything else the error
names the converter of a known set (MNIST, CIFAR-10, digits) and
``singa-mpi data synthetic --like JOB``, which writes random stores of the
job's shapes.
"""
from __future__ import annotations

import os

from singa_mpi.data.convert import EXTENSIONS, convert_digits
from singa_mpi.data.memory import is_memory_path
from singa_mpi.data.stores import in_memory
from singa_mpi.errors import DataError, Unwritable
from singa_mpi.proto import job_pb2

INPUT_TYPES = (job_pb2.kRecordInput, job_pb2.kCSVInput)
STORE_FIELDS = ("path", "mean_file", "std_file")
CIFAR_TRAIN = "cifar-10-batches-bin/data_batch_{1,2,3,4,5}.bin"
CIFAR_TEST = "cifar-10-batches-bin/test_batch.bin"


def store_files(layer: job_pb2.LayerProto) -> list[tuple[str, str]]:
    """(field, path) of every file an input layer reads: the store, and its mean and std files."""
    if layer.type not in INPUT_TYPES or not layer.HasField("store_conf"):
        return []
    store = layer.store_conf
    if in_memory(store.backend):  # a script's arrays: no file
        return [(field, getattr(store, field)) for field in STORE_FIELDS if field != "path" and getattr(store, field)]
    return [(field, getattr(store, field)) for field in STORE_FIELDS if getattr(store, field)]


TEXT_TODO = "make it and its vocabulary with `singa-mpi data text --out DIR` (DIR/input.txt, DIR/vocab.txt)"


def reader_files(layer: job_pb2.LayerProto, job_path: str | None) -> list[tuple[str, str, str, str]]:
    """(conf, field, path, how to make it) of what the readers beside the store input layers read:
    SINGA 0.1's DataShard folder (kShardData), char-rnn's text and vocabulary (kCharRNN)."""
    if layer.type == job_pb2.kShardData and layer.sharddata_conf.path:
        path = layer.sharddata_conf.path
        return [("sharddata_conf", "path", path,
                 how_to_make(path, "path", job_pb2.StoreProto(backend="shard", path=path), job_path))]
    if layer.type == job_pb2.kCharRNN:
        conf = layer.char_rnn_conf
        files = [(field, getattr(conf, field)) for field in ("path", "vocab_path")]
        return [("char_rnn_conf", field, path, TEXT_TODO) for field, path in files
                if path and not is_memory_path(path)]  # a script's text is no file
    from singa_mpi.layers.base import LAYERS, layer_class_of, layer_type_name  # a plugin's reader says what it reads

    return layer_class_of(layer).input_files(layer) if layer_type_name(layer) in LAYERS else []


FOLDER_BACKENDS = ("kvfile", "shard")  # whose store may be a folder (SINGA 0.1's DataShard: shard.dat inside)


def folder_problem(path: str, field: str, store: job_pb2.StoreProto) -> str | None:
    """What is wrong when ``path`` (``store_conf.FIELD``) is a folder where the store reads a file, else
    None: an HDF5 or text store, a mean or std file, are files."""
    if not os.path.isdir(path) or (field == "path" and _backend(store) in FOLDER_BACKENDS):
        return None
    reader = f"backend {_backend(store)} reads one file" if field == "path" else f"{field} is one file"
    return f"a folder: expected a file ({reader})"


def _backend(store: job_pb2.StoreProto) -> str:
    return store.backend or "textfile"


def _is_test(path: str) -> bool:
    return "test" in os.path.basename(path).lower()


def is_bundled_digits(path: str, store: job_pb2.StoreProto) -> bool:
    """``path`` is one of the files ``singa-mpi data digits --out DIR`` writes for the store's backend."""
    backend = _backend(store)
    folder, name = os.path.split(os.path.normpath(path))
    return (os.path.basename(folder) == "digits" and backend in EXTENSIONS
            and name in (f"train{EXTENSIONS[backend]}", f"test{EXTENSIONS[backend]}"))


def known_set_command(path: str, field: str, store: job_pb2.StoreProto) -> str | None:
    """The converter command for a store of MNIST, CIFAR-10 or the digits (by its path), else None."""
    words = path.lower().replace("\\", "/")
    backend = _backend(store)
    suffix = "" if backend == "hdf5" else f" --backend {backend}"
    if is_bundled_digits(path, store):
        return f"singa-mpi data digits --out {os.path.dirname(os.path.normpath(path))}{suffix}"
    if "mnist" in words and field == "path":
        prefix = "t10k" if _is_test(path) else "train"
        return (f"singa-mpi data mnist --images {prefix}-images-idx3-ubyte.gz "
                f"--labels {prefix}-labels-idx1-ubyte.gz --out {path}{suffix}")
    if "cifar" in words:
        if field == "mean_file":  # written next to the training store by --mean
            train = store.path if not _is_test(store.path) else os.path.join(
                os.path.dirname(store.path), f"train{EXTENSIONS.get(backend, '')}")
            return f"singa-mpi data cifar10 --batches {CIFAR_TRAIN} --out {train}{suffix} --mean {path}"
        if field == "path":
            if _is_test(path):
                return f"singa-mpi data cifar10 --batches {CIFAR_TEST} --out {path}{suffix}"
            mean = f" --mean {store.mean_file}" if store.mean_file else ""
            return f"singa-mpi data cifar10 --batches {CIFAR_TRAIN} --out {path}{suffix}{mean}"
    return None


def synthetic_command(job_path: str | None) -> str:
    """The command that writes random stores for the job in ``job_path`` (None: a job that is no file)."""
    return f"`singa-mpi data synthetic --like {job_path or 'JOB.conf'}`"


def how_to_make(path: str, field: str, store: job_pb2.StoreProto, job_path: str | None) -> str:
    """One clause saying which command writes the missing file ``path`` (store_conf.``field``)."""
    synthetic = synthetic_command(job_path)
    known = known_set_command(path, field, store)
    if known is None:
        return f"make it with {synthetic} (random data of the job's shapes) or convert your data (`singa-mpi data -h`)"
    return f"make it with `{known}`, or random data of the job's shapes with {synthetic}"


def prepare_digits(path: str, store: job_pb2.StoreProto) -> list[str]:
    """Write scikit-learn's digits into the folder of ``path`` (train and test stores); DataError (one
    line) when that folder cannot be written."""
    folder = os.path.dirname(os.path.normpath(path)) or "."
    try:
        return convert_digits(folder, backend=_backend(store))
    except Unwritable as err:  # below a regular file, a read-only folder, a full disk
        raise DataError(f"{err.path}: cannot prepare scikit-learn's digits for {path}: {err.reason}: expected a "
                        f"folder you can write (or make the store with `singa-mpi data digits --out DIR`)") from None
