"""``singa-mpi ckpt inspect`` and ``ckpt convert`` (SINGA 0.x BlobProtos -> HDF5); ``checkpoint_path`` files."""
from __future__ import annotations

import math
import os
import re

import h5py
import numpy as np

from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.errors import DataError
from singa_mpi.proto import job_pb2


def inspect(path: str) -> str:
    """A summary of a checkpoint: step, params and shapes, plan, checksum verdict.

    DataError (exit code 3) when the file is missing or damaged."""
    if os.path.isdir(path):
        raise DataError(f"{path}: a folder: expected a checkpoint file, such as WORKSPACE/checkpoint/step<N>.h5")
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such checkpoint file")
    try:
        ckpt = checkpoint.read(path)
        verdict = "all checksums OK"
    except DataError as err:
        raise DataError(f"{path}: DAMAGED: {str(err).removeprefix(path + ': ')}") from None
    identity = f"identity {ckpt.job_identity}" if ckpt.job_identity else "no job identity"
    lines = [f"{path}: step {ckpt.step}, job '{ckpt.job_name}' ({identity}), seed {ckpt.seed}, written by "
             f"{_writers(ckpt)}, format {ckpt.format_version}; {verdict}"]
    total = sum(v.size for v in ckpt.params.values())
    lines.append(f"params ({len(ckpt.params)}, {total:,} values):")
    for name, value in sorted(ckpt.params.items()):
        slots = ", ".join(sorted(ckpt.updater.get(name, {})))
        lines.append(f"  {name:<16} {str(list(value.shape)):<16} updater state: {slots or '-'}")
    for phase, readers in sorted(ckpt.readers.items()):
        for layer, state in sorted(readers.items()):
            text = ", ".join(f"{key} {value}" for key, value in sorted(state.items()))
            lines.append(f"state {phase}/{layer}: {text}")
    layers = ckpt.plan.get("layers", {})
    if layers:
        lines.append("partitioning: " + "; ".join(f"{k}: {v}" for k, v in sorted(layers.items())))
    if ckpt.job_config:
        lines.append(f"job config: {len(ckpt.job_config.splitlines())} lines (h5dump -d job_config {path})")
    return "\n".join(lines)


def _writers(ckpt: checkpoint.Checkpoint) -> str:
    """The job that wrote ``ckpt``: its workers, or under a framework every rank, by groups and servers
    (files written before the plan named them: one group's workers)."""
    shape = ckpt.plan.get("cluster")
    if not isinstance(shape, dict):
        return f"{ckpt.nranks} worker(s)"
    servers = f" + {shape.get('servers')} server(s)" if shape.get("servers") else ""
    return (f"{shape.get('ranks', ckpt.nranks)} rank(s) ({shape.get('framework')}: {shape.get('worker_groups')} "
            f"worker group(s) x {shape.get('workers_per_group')} worker(s){servers})")


def read_blobprotos(path: str) -> list[tuple[str, int, np.ndarray]]:
    """(name, version, array) of a SINGA 0.x checkpoint file (binary BlobProtos)."""
    blobs = job_pb2.BlobProtos()
    try:
        with open(path, "rb") as f:
            blobs.ParseFromString(f.read())
    except OSError as err:
        raise DataError(f"{path}: cannot read ({err.strerror})") from None
    except Exception as err:  # protobuf's DecodeError: not a BlobProtos file
        raise DataError(f"{path}: not a checkpoint: expected a singa_mpi HDF5 checkpoint or SINGA 0.x's "
                        f"BlobProtos file (protobuf: {str(err).split(': ')[-1]})") from None
    if not (len(blobs.name) == len(blobs.blob)):
        raise DataError(f"{path}: {len(blobs.name)} names for {len(blobs.blob)} blobs")
    out = []
    for k, (name, blob) in enumerate(zip(blobs.name, blobs.blob)):
        shape = tuple(blob.shape) or (len(blob.data),)
        if math.prod(shape) != len(blob.data):
            raise DataError(f"{path}: blob {name!r} has {len(blob.data)} values for shape {shape}")
        version = blobs.version[k] if k < len(blobs.version) else 0
        # v0.2/v0.3 prefix unrolled names with "0#"; v0.1 did not
        out.append((re.sub(r"^0#", "", name), version, np.asarray(blob.data, np.float32).reshape(shape)))
    return out


def convert_singa(paths: list[str], out: str, step: int | None = None) -> str:
    """SINGA 0.x worker checkpoints (step<N>-worker<W>) -> one singa_mpi HDF5 checkpoint.

    A param found in several worker files is a feature-partitioned param whose parts are joined along
    axis 0 in worker order (:func:`_join`).
    """
    pieces: dict[str, list[tuple[str, np.ndarray]]] = {}
    for path in paths:
        if os.path.isfile(path) and h5py.is_hdf5(path):
            raise DataError(f"{path}: an HDF5 file (a singa_mpi checkpoint needs no conversion): expected SINGA "
                            f"0.x's BlobProtos files, step<N>-worker<W>")
    for path in sorted(paths, key=_worker_index):
        for name, _, value in read_blobprotos(path):
            pieces.setdefault(name, []).append((path, value))
    params = _join(pieces)
    if not params:  # an empty file parses as a BlobProtos of nothing
        raise DataError(f"{', '.join(paths)}: no parameters: expected SINGA 0.x checkpoint files holding "
                        f"the params (step<N>-worker<W>)")
    if step is None:
        m = re.search(r"step(\d+)", os.path.basename(paths[0]))
        step = int(m.group(1)) if m else 0
    ckpt = checkpoint.Checkpoint(step=step, params=params, job_name="converted from SINGA 0.x",
                                 plan={"source": [os.path.basename(p) for p in paths]})
    checkpoint.write(out, ckpt, option="--out", after="")  # no run, no previous checkpoints to speak of
    return f"wrote {out}: {len(params)} params from {len(paths)} SINGA file(s), step {step}"


def _join(pieces: dict[str, list[tuple[str, np.ndarray]]]) -> dict[str, np.ndarray]:
    """Per param, its values from the worker files (in worker order) that hold it: the whole param
    from one file, or parts joined on axis 0.  SINGA's ``Worker::Checkpoint`` writes only the params
    a worker owns: a data-parallel replica (``partition_dim: 0``) is its owner's, worker 0's, alone,
    so a name in several files is a feature-partitioned param (``partition_dim: 1``: weights and
    biases cut along axis 0 into parts of one shape), even where the parts hold equal values (the
    zero biases of step 0): taken for one replica, such a param came out a part of its size."""
    params = {}
    for name, parts in pieces.items():
        shapes = {v.shape for _, v in parts}
        first = parts[0][1]
        if len(parts) == 1:
            params[name] = first
        elif all(len(s) == first.ndim and s[1:] == first.shape[1:] for s in shapes):
            params[name] = np.concatenate([v for _, v in parts], axis=0)
        else:
            detail = ", ".join(f"{os.path.basename(p)}: {list(v.shape)}" for p, v in parts)
            raise DataError(f"param {name!r} has shapes that cannot be joined ({detail})")
    return params


def _worker_index(path: str) -> int:
    m = re.search(r"worker(\d+)", os.path.basename(path))
    return int(m.group(1)) if m else 0


def read_initial(path: str) -> checkpoint.Checkpoint:
    """A ``checkpoint_path`` entry as a checkpoint of params (SINGA's stacked-RBM jobs name these).

    * a singa_mpi HDF5 checkpoint: read as it is;
    * a folder: the newest good checkpoint of that workspace (or of that checkpoint folder), so a
      job names the run before it in a chain, whatever its step count;
    * a SINGA 0.x BlobProtos file (``step6000-worker0``): read with every ``-worker<W>`` file of
      the same step beside it, joined as ``ckpt convert`` joins them;
    * a SINGA name that does not exist, ``DIR/step<N>-worker<W>``: this tool's checkpoint of that
      step in the same folder, ``DIR/step<N>.h5`` (where running SINGA's previous job here put it).
    """
    if os.path.isdir(path):
        workspace = _workspace_of(path)
        found = checkpoint.newest_good(workspace, todo="none to initialise from: expected the job that trains "
                                                      f"into {workspace} to have run (again)")
        if found is None:
            raise DataError(f"{path}: no good checkpoint in {checkpoint.checkpoint_dir(workspace)}: expected "
                            f"the job that trains into {workspace} to have run")
        return found
    if os.path.exists(path) and not h5py.is_hdf5(path):
        return _read_singa(path)
    m = re.fullmatch(r"step(\d+)-worker\d+", os.path.basename(path))
    if not os.path.exists(path) and m:
        ours = os.path.join(os.path.dirname(path), f"step{m.group(1)}.h5")
        if os.path.exists(ours):
            return checkpoint.read(ours)
        raise DataError(f"{path}: no such checkpoint, nor {ours} (this tool's name for it): expected the "
                        f"job that writes it to have run (its workspace and train_steps decide the name)")
    if not os.path.exists(path):
        raise DataError(f"{path}: no such checkpoint")
    return checkpoint.read(path)


def _workspace_of(folder: str) -> str:
    """A workspace, or the workspace of a checkpoint folder named in its place."""
    folder = os.path.normpath(folder)
    if os.path.basename(folder) == "checkpoint" and not os.path.isdir(checkpoint.checkpoint_dir(folder)):
        return os.path.dirname(folder)
    return folder


def _read_singa(path: str) -> checkpoint.Checkpoint:
    m = re.fullmatch(r"(step\d+)-worker\d+", os.path.basename(path))
    folder = os.path.dirname(path) or "."
    siblings = sorted(os.path.join(folder, f) for f in os.listdir(folder)
                      if m and re.fullmatch(rf"{m.group(1)}-worker\d+", f)) or [path]
    pieces: dict[str, list[tuple[str, np.ndarray]]] = {}
    for file in sorted(siblings, key=_worker_index):
        for name, _, value in read_blobprotos(file):
            pieces.setdefault(name, []).append((file, value))
    step = re.search(r"step(\d+)", os.path.basename(path))
    return checkpoint.Checkpoint(step=int(step.group(1)) if step else 0, params=_join(pieces), path=path)
