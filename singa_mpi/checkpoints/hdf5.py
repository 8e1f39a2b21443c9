"""HDF5 checkpoints that do not depend on how the job was partitioned.

One file per checkpoint, ``WORKSPACE/checkpoint/step<N>.h5``, readable with
plain h5py or h5dump::

    /                       attrs: format_version, step, job_name, seed, nranks, elapsed, complete
    /job_config             the job's text (string dataset)
    /plan                   JSON summary of the partitioning it was written under
    /params/<name>          float32, the full logical (unsharded) array
    /updater/<name>/<slot>  float32 updater state (momentum "history", "update"), logical shape;
                            attrs: counters (e.g. Adam's step count "t")
    /readers/<phase>/<layer> attrs: the layer's carried state (``Layer.state()``), e.g. an input
                             layer's ``batches`` (how many global batches it has read)
    /carried/<phase>/<layer>/<name>  float32 arrays a layer carries from batch to batch, one row
                             per row of the global batch (``Layer.carried()``: an RNN's hidden state)

Every dataset carries a ``crc32`` attribute; ``complete`` is set last.  A file
is written under a temporary name in the same folder, flushed, fsynced and
renamed, so a crash at any moment leaves the previous checkpoint intact, and a
damaged file (truncated, bit rot) is detected by :func:`read` and named.
Loading never unpickles: only arrays, numbers and strings are read.
"""
from __future__ import annotations

import dataclasses
import glob
import json
import os
import re
import warnings
import zlib

import h5py
import numpy as np

from singa_mpi.errors import DataError

FORMAT_VERSION = 2
_STEP = re.compile(r"step(\d+)\.h5$")
EXIT_CHECKPOINTED = 75  # EX_TEMPFAIL: stopped on a signal after writing a checkpoint; resume to go on


@dataclasses.dataclass
class Checkpoint:
    """The content of a checkpoint, as logical arrays."""

    step: int
    params: dict[str, np.ndarray]
    updater: dict[str, dict[str, np.ndarray]] = dataclasses.field(default_factory=dict)
    counters: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    # phase -> layer -> the layer's state (``Layer.state()``: names to numbers)
    readers: dict[str, dict[str, dict]] = dataclasses.field(default_factory=dict)
    # phase -> layer -> name -> (global batch, ...) array (``Layer.carried()``)
    carried: dict[str, dict[str, dict[str, np.ndarray]]] = dataclasses.field(default_factory=dict)
    job_name: str = ""
    job_config: str = ""
    plan: dict = dataclasses.field(default_factory=dict)
    seed: int = 0
    nranks: int = 1
    elapsed: float = 0.0  # seconds of training since step 0 when written (files without it: 0)
    path: str = ""


def checkpoint_dir(workspace: str) -> str:
    return os.path.join(workspace, "checkpoint")


def checkpoint_path(workspace: str, step: int) -> str:
    return os.path.join(checkpoint_dir(workspace), f"step{step}.h5")


def crc(array: np.ndarray) -> int:
    return zlib.crc32(np.ascontiguousarray(array).tobytes())


def _dataset(group, name: str, data: np.ndarray) -> None:
    data = np.ascontiguousarray(data, np.float32)
    ds = group.create_dataset(name, data=data)
    ds.attrs["crc32"] = crc(data)


def write(path: str, ckpt: Checkpoint, fault_after: int | None = None) -> str:
    """Write ``ckpt`` atomically to ``path``.

    ``fault_after`` (tests only) raises after that many parameter datasets, to
    prove that an interrupted write leaves no file behind and the old one intact.
    """
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with h5py.File(tmp, "w") as f:
            f.attrs.update(format_version=FORMAT_VERSION, step=ckpt.step, job_name=ckpt.job_name,
                           seed=ckpt.seed, nranks=ckpt.nranks, elapsed=float(ckpt.elapsed), complete=0)
            f.create_dataset("job_config", data=ckpt.job_config)
            f.create_dataset("plan", data=json.dumps(ckpt.plan, sort_keys=True))
            params = f.create_group("params")
            for k, (name, value) in enumerate(sorted(ckpt.params.items())):
                if fault_after is not None and k >= fault_after:
                    raise OSError(f"injected fault while writing {path}")
                _dataset(params, name, value)
            updater = f.create_group("updater")
            for name, slots in sorted(ckpt.updater.items()):
                group = updater.create_group(name)
                for slot, value in sorted(slots.items()):
                    _dataset(group, slot, value)
                group.attrs.update(ckpt.counters.get(name, {}))
            for name in set(ckpt.counters) - set(ckpt.updater):
                updater.create_group(name).attrs.update(ckpt.counters[name])
            readers = f.create_group("readers")
            for phase, layers in sorted(ckpt.readers.items()):
                group = readers.create_group(phase)
                for layer, state in sorted(layers.items()):
                    group.create_group(layer).attrs.update(state)
            for phase, layers in sorted(ckpt.carried.items()):
                for layer, arrays in sorted(layers.items()):
                    group = f.require_group(f"carried/{phase}/{layer}")
                    for name, value in sorted(arrays.items()):
                        _dataset(group, name, value)
            f.attrs["complete"] = 1
            f.flush()
        with open(tmp, "rb") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, path)
        _fsync_dir(os.path.dirname(path) or ".")
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def _scalar(value):
    """An HDF5 attribute as a Python number (numpy scalars do not survive JSON or comparisons well)."""
    return value.item() if hasattr(value, "item") and getattr(value, "ndim", 0) == 0 else value


def _fsync_dir(folder: str) -> None:
    """Make the rename itself durable."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_array(ds, path: str, where: str) -> np.ndarray:
    data = ds[...]
    if "crc32" not in ds.attrs:
        raise DataError(f"{path}: {where} has no checksum: not a singa_mpi checkpoint")
    if crc(data) != int(ds.attrs["crc32"]):
        raise DataError(f"{path}: {where} fails its checksum (the file is damaged)")
    return data


def _text(ds) -> str:
    value = ds[()]
    return value.decode() if isinstance(value, bytes) else str(value)


def read(path: str) -> Checkpoint:
    """Read and verify a checkpoint; DataError naming the file and the damaged part."""
    try:
        with h5py.File(path, "r") as f:
            if int(f.attrs.get("complete", 0)) != 1:
                raise DataError(f"{path}: incomplete checkpoint (writing was interrupted)")
            version = int(f.attrs.get("format_version", 0))
            if version > FORMAT_VERSION:
                raise DataError(f"{path}: checkpoint format {version} is newer than this singa_mpi "
                                f"({FORMAT_VERSION}): upgrade singa_mpi")
            ckpt = Checkpoint(step=int(f.attrs["step"]), params={}, job_name=str(f.attrs.get("job_name", "")),
                              seed=int(f.attrs.get("seed", 0)), nranks=int(f.attrs.get("nranks", 1)),
                              elapsed=float(f.attrs.get("elapsed", 0.0)), path=path)
            ckpt.job_config = _text(f["job_config"]) if "job_config" in f else ""
            ckpt.plan = json.loads(_text(f["plan"])) if "plan" in f else {}
            for name, ds in f["params"].items():
                ckpt.params[name] = _read_array(ds, path, f"params/{name}")
            for name, group in f.get("updater", {}).items():
                ckpt.updater[name] = {slot: _read_array(ds, path, f"updater/{name}/{slot}")
                                      for slot, ds in group.items()}
                if group.attrs:
                    ckpt.counters[name] = {k: int(v) for k, v in group.attrs.items()}
            for phase, group in f.get("readers", {}).items():
                ckpt.readers[phase] = {layer: {k: _scalar(v) for k, v in g.attrs.items()} for layer, g in group.items()}
            for phase, group in f.get("carried", {}).items():
                ckpt.carried[phase] = {layer: {name: _read_array(ds, path, f"carried/{phase}/{layer}/{name}")
                                               for name, ds in g.items()} for layer, g in group.items()}
    except DataError:
        raise
    except (OSError, KeyError, ValueError) as err:
        raise DataError(f"{path}: not a readable singa_mpi checkpoint ({err})") from None
    return ckpt


def listed(workspace: str) -> list[tuple[int, str]]:
    """(step, path) of the checkpoint files in the workspace, newest first."""
    found = []
    for path in glob.glob(os.path.join(checkpoint_dir(workspace), "step*.h5")):
        m = _STEP.search(path)
        if m:
            found.append((int(m.group(1)), path))
    return sorted(found, reverse=True)


def newest_good(workspace: str) -> Checkpoint | None:
    """The newest checkpoint that reads and verifies; damaged newer ones are skipped with a warning."""
    for _, path in listed(workspace):
        try:
            return read(path)
        except DataError as err:
            warnings.warn(f"skipping damaged checkpoint: {err}", stacklevel=2)
    return None


def prune(workspace: str, keep: int) -> list[str]:
    """Delete all but the ``keep`` newest checkpoints; returns the removed paths."""
    removed = []
    for _, path in listed(workspace)[keep:]:
        os.remove(path)
        removed.append(path)
    return removed


def plan_diff(saved: dict, current: dict) -> list[str]:
    """Short human-readable differences between two plan summaries."""
    lines = []
    if saved.get("nranks") != current.get("nranks"):
        lines.append(f"workers: {saved.get('nranks')} -> {current.get('nranks')}")
    old, new = saved.get("layers", {}), current.get("layers", {})
    for name in sorted(set(old) | set(new)):
        if old.get(name) != new.get(name):
            lines.append(f"layer {name}: {old.get(name, 'absent')} -> {new.get(name, 'absent')}")
    return lines
