"""HDF5 checkpoints: every parameter as its full logical array, written atomically.

Layout of ``WORKSPACE/checkpoint/step<N>.h5`` (plain h5py/h5dump can read it)::

    /                 attrs: format_version, step, job_name, job_config (the job text)
    /params/<name>    float32 dataset, the logical (unsharded) array; attrs: crc32

The file is written to a temporary name in the same folder, flushed, fsynced
and renamed over the final name, so a crash leaves the previous checkpoint
intact.  No pickle is used anywhere: loading a file cannot execute code.
"""
from __future__ import annotations

import glob
import os
import re
import zlib

import h5py
import numpy as np

from singa_mpi.errors import DataError

FORMAT_VERSION = 1
_STEP = re.compile(r"step(\d+)\.h5$")


def checkpoint_dir(workspace: str) -> str:
    return os.path.join(workspace, "checkpoint")


def checkpoint_path(workspace: str, step: int) -> str:
    return os.path.join(checkpoint_dir(workspace), f"step{step}.h5")


def crc(array: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(array).tobytes())


def write(path: str, step: int, params: dict[str, np.ndarray], job_name: str, job_text: str) -> str:
    """Write ``params`` (name -> logical array) atomically to ``path``."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs["format_version"] = FORMAT_VERSION
            f.attrs["step"] = step
            f.attrs["job_name"] = job_name
            f.attrs["job_config"] = job_text
            group = f.create_group("params")
            for name, value in params.items():
                data = np.ascontiguousarray(value, np.float32)
                ds = group.create_dataset(name, data=data)
                ds.attrs["crc32"] = crc(data)
            f.flush()
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def read(path: str) -> tuple[int, dict[str, np.ndarray]]:
    """(step, name -> array); DataError naming the file for anything damaged."""
    try:
        with h5py.File(path, "r") as f:
            step = int(f.attrs["step"])
            params = {}
            for name, ds in f["params"].items():
                data = ds[...]
                if "crc32" in ds.attrs and crc(data) != int(ds.attrs["crc32"]):
                    raise DataError(f"{path}: checkpoint dataset params/{name} fails its checksum")
                params[name] = data
    except (OSError, KeyError) as err:
        raise DataError(f"{path}: not a readable singa_mpi checkpoint ({err})") from None
    return step, params


def newest(workspace: str) -> str | None:
    """The checkpoint with the highest step in the workspace, or None."""
    found = []
    for path in glob.glob(os.path.join(checkpoint_dir(workspace), "step*.h5")):
        m = _STEP.search(path)
        if m:
            found.append((int(m.group(1)), path))
    return max(found)[1] if found else None
