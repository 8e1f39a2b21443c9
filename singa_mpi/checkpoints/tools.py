"""``singa-mpi ckpt inspect`` and ``ckpt convert`` (SINGA 0.x BlobProtos -> HDF5); ``checkpoint_path`` files."""
from __future__ import annotations

import math
import os
import re
from typing import Mapping, Sequence

import h5py
import numpy as np

from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.errors import DataError
from singa_mpi.proto import job_pb2


def inspect(path: str) -> str:
    """A summary of a checkpoint: step, params and shapes, plan, checksum verdict.

    DataError (exit code 3) when the file is missing or damaged."""
    checkpoint.refuse_irregular(path)
    if not os.path.isfile(path):
        raise DataError(f"{path}: no such checkpoint file")
    try:
        ckpt = checkpoint.read(path)
        verdict = "all checksums OK"
    except checkpoint.NotACheckpoint:
        raise
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
    checkpoint.refuse_irregular(path, "expected SINGA 0.x's BlobProtos file, such as step<N>-worker<W>")
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


Shapes = Mapping[str, Sequence[int]]  # a job's params (owners) -> whole shape
AXIS_UNKNOWN = ("SINGA's files do not say on which axis: axis 0 (SINGA's (out, in) layout), or axis 1 for an "
                "InnerProduct layer with transpose: true")


def convert_singa(paths: list[str], out: str, step: int | None = None, shapes: Shapes | None = None,
                  job: str | None = None) -> str:
    """SINGA 0.x worker checkpoints (step<N>-worker<W>) -> one singa_mpi HDF5 checkpoint.

    A param found in several worker files is a feature-partitioned param whose parts are joined in
    worker order (:func:`_join`): along the axis that gives it its shape in ``shapes``, the params of
    ``job`` (the job that wrote the files); without them a 1-D param's parts alone can be joined.
    """
    pieces: dict[str, list[tuple[str, np.ndarray]]] = {}
    for path in paths:
        if os.path.isfile(path) and h5py.is_hdf5(path):
            raise DataError(f"{path}: an HDF5 file (a singa_mpi checkpoint needs no conversion): expected SINGA "
                            f"0.x's BlobProtos files, step<N>-worker<W>")
    for path in sorted(paths, key=_worker_index):
        for name, _, value in read_blobprotos(path):
            pieces.setdefault(name, []).append((path, value))
    params = _join(pieces, shapes, job=job or "")
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


def _join(pieces: dict[str, list[tuple[str, np.ndarray]]], shapes: Shapes | None,
          job: str | None = None) -> dict[str, np.ndarray]:
    """Per param, its values from the worker files (in worker order) that hold it: the whole param
    from one file, or its parts joined.  SINGA's ``Worker::Checkpoint`` writes only the params a
    worker owns: a data-parallel replica (``partition_dim: 0``) is its owner's, worker 0's, alone, so
    a name in several files is a feature-partitioned param (``partition_dim: 1``), even where the
    parts hold equal values (the zero biases of step 0): taken for one replica, such a param came out
    a part of its size.  Its parts are cut along its output features: axis 0 of a bias, a weight in
    SINGA's (out, in) layout or a convolution's, but axis 1 of an InnerProduct weight stored
    (in, out) (``transpose: true``), which the files do not record.  The axis is the one that gives
    the param its shape in ``shapes``, else the only axis its parts can be joined on; parts that
    ``shapes`` does not settle are refused for ``ckpt convert`` (``job``: its --job, "" for none) and
    joined on axis 0 for a job's checkpoint_path (``job`` None: the job's own check then names a
    param that does not fit)."""
    params = {}
    for name, parts in pieces.items():
        first = parts[0][1]
        if len(parts) == 1:
            params[name] = first
            continue
        detail = ", ".join(f"{os.path.basename(p)}: {list(v.shape)}" for p, v in parts)
        axes = [axis for axis in range(first.ndim) if all(v.ndim == first.ndim and np.delete(v.shape, axis).tolist()
                                                          == np.delete(first.shape, axis).tolist() for _, v in parts)]
        if not axes:
            raise DataError(f"param {name!r} has shapes that cannot be joined ({detail})")
        joined = {axis: tuple(sum(v.shape[axis] for _, v in parts) if k == axis else n
                              for k, n in enumerate(first.shape)) for axis in axes}
        wanted = tuple(shapes[name]) if shapes is not None and name in shapes else None
        axis = next((a for a in axes if joined[a] == wanted), axes[0] if len(axes) == 1 else None)
        if axis is None and job is None:
            axis = axes[0]
        if axis is None:
            raise DataError(_unsettled(name, detail, wanted, job))
        params[name] = np.concatenate([v for _, v in parts], axis=axis)
    return params


def _unsettled(name: str, detail: str, wanted: tuple | None, job: str | None) -> str:
    if not job:
        return (f"param {name!r} comes in parts ({detail}): {AXIS_UNKNOWN}: expected --job JOB.conf, the job "
                f"that wrote them, to tell")
    if wanted is None:
        return f"param {name!r} comes in parts ({detail}): {job} has no param {name!r}: expected the job that wrote them"
    return (f"param {name!r} comes in parts ({detail}) that join to no shape {list(wanted)}, as {job} gives it: "
            f"expected the job that wrote them")


def _worker_index(path: str) -> int:
    m = re.search(r"worker(\d+)", os.path.basename(path))
    return int(m.group(1)) if m else 0


def read_initial(path: str, shapes: Shapes | None = None) -> checkpoint.Checkpoint:
    """A ``checkpoint_path`` entry as a checkpoint of params (SINGA's stacked-RBM jobs name these) for
    the job whose params have ``shapes`` (None: not known, SINGA's parts are joined on axis 0).

    * a singa_mpi HDF5 checkpoint: read as it is;
    * a folder: the newest good checkpoint of that workspace (or of that checkpoint folder), so a
      job names the run before it in a chain, whatever its step count;
    * a SINGA 0.x BlobProtos file (``step6000-worker0``): read with every ``-worker<W>`` file of
      the same step beside it, joined as ``ckpt convert --job`` joins them, to the job's shapes;
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
    checkpoint.refuse_irregular(path)  # (h5py.is_hdf5 would block for good on a pipe)
    if os.path.exists(path) and not h5py.is_hdf5(path):
        return _read_singa(path, shapes)
    ours = ours_for_singa_name(path)
    if ours is not None:
        if os.path.exists(ours):
            return checkpoint.read(ours)
        raise DataError(f"{path}: no such checkpoint, nor {ours} (this tool's name for it): expected the "
                        f"job that writes it to have run (its workspace and train_steps decide the name)")
    if not os.path.exists(path):
        raise DataError(f"{path}: no such checkpoint")
    return checkpoint.read(path)


def ours_for_singa_name(path: str) -> str | None:
    """This tool's name, ``DIR/step<N>.h5``, of a SINGA checkpoint name ``DIR/step<N>-worker<W>`` that
    does not exist (where running SINGA's job here put its checkpoint); None for any other path."""
    m = re.fullmatch(r"step(\d+)-worker\d+", os.path.basename(path))
    if os.path.exists(path) or m is None:
        return None
    return os.path.join(os.path.dirname(path), f"step{m.group(1)}.h5")


def _workspace_of(folder: str) -> str:
    """A workspace, or the workspace of a checkpoint folder named in its place."""
    folder = os.path.normpath(folder)
    if os.path.basename(folder) == "checkpoint" and not os.path.isdir(checkpoint.checkpoint_dir(folder)):
        return os.path.dirname(folder)
    return folder


def _read_singa(path: str, shapes: Shapes | None) -> checkpoint.Checkpoint:
    m = re.fullmatch(r"(step\d+)-worker\d+", os.path.basename(path))
    folder = os.path.dirname(path) or "."
    siblings = sorted(os.path.join(folder, f) for f in os.listdir(folder)
                      if m and re.fullmatch(rf"{m.group(1)}-worker\d+", f)) or [path]
    pieces: dict[str, list[tuple[str, np.ndarray]]] = {}
    for file in sorted(siblings, key=_worker_index):
        for name, _, value in read_blobprotos(file):
            pieces.setdefault(name, []).append((file, value))
    step = re.search(r"step(\d+)", os.path.basename(path))
    return checkpoint.Checkpoint(step=int(step.group(1)) if step else 0, params=_join(pieces, shapes), path=path)
