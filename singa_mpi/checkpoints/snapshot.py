"""Between a running job (any partitioning) and a checkpoint (logical arrays).

``collect`` gathers every rank's pieces to rank 0: its parameter shards (from
one holder per shard), its updater state (for the chunk or shard it updates),
and its input layers' positions, and assembles whole logical arrays.
``restore`` is the reverse on every rank: each takes its own shard of each
logical array, whatever partitioning or rank count wrote the file.
"""
from __future__ import annotations

import numpy as np

from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.config.load import effective_partition_dim
from singa_mpi.errors import DataError


def _index(array_shape: tuple, region: tuple):
    """Where ``region`` sits in an array of ``array_shape`` (the logical shape)."""
    if region[0] == "flat":
        return ("flat", slice(region[1], region[2]))
    return ("nd", tuple(slice(lo, hi) for lo, hi in region[1]))


def _put(target: np.ndarray, region: tuple, value: np.ndarray) -> None:
    kind, index = _index(target.shape, region)
    if kind == "flat":
        target.reshape(-1)[index] = value.reshape(-1)
    else:
        target[index] = value


def _take(source: np.ndarray, region: tuple) -> np.ndarray:
    kind, index = _index(source.shape, region)
    if kind == "flat":
        return source.reshape(-1)[index]
    return source[index]


def plan_summary(cfg, nranks: int) -> dict:
    """How the job is partitioned, for the checkpoint and the diff shown when resuming differently."""
    layers = {}
    for layer in cfg.proto.neuralnet.layer:
        pdim = effective_partition_dim(cfg.proto, layer)
        layers[layer.name] = f"partition_dim {pdim}" + (f" location {layer.location}" if pdim == -1 else "")
    return {"nranks": nranks, "layers": layers}


def local_pieces(trainer) -> dict:
    """What this rank contributes to a checkpoint."""
    runtime, updater = trainer.runtime, trainer.updater
    params = [(p.name, p.logical_shape, ("nd", p.shard), np.array(p.data))
              for p in trainer.train_net.params if runtime.contributes(p)]
    states = []
    for owner in runtime.owned_params():
        region = owner.region()
        if region[0] == "flat" or runtime.contributes(owner):  # a flat chunk has one owner
            for slot, value in updater.state(owner.name).items():
                states.append((owner.name, slot, owner.logical_shape, region, np.array(value)))
    readers = {phase: {layer.name: layer.state() for layer in net.layers if layer.state()}
               for phase, net in trainer.nets().items()}
    carried = [(phase, layer.name, name, layer.ctx.rows(), layer.ctx.global_batch, np.array(value))
               for phase, net in trainer.nets().items() for layer in net.layers
               for name, value in layer.carried().items()]
    return {"params": params, "states": states, "readers": readers, "counters": updater.counters(),
            "carried": carried}


def collect(trainer, step: int) -> checkpoint.Checkpoint | None:
    """The whole job's state at ``step`` on rank 0 (None elsewhere).  Collective."""
    everyone = trainer.runtime.gather_object(local_pieces(trainer))
    if everyone is None:
        return None
    ckpt = checkpoint.Checkpoint(step=step, params={}, job_name=trainer.job.name, job_config=trainer.cfg.text,
                                 plan=plan_summary(trainer.cfg, trainer.runtime.size), seed=trainer.job.seed,
                                 nranks=trainer.runtime.size)
    for pieces in everyone:
        for name, shape, region, value in pieces["params"]:
            target = ckpt.params.setdefault(name, np.zeros(shape, np.float32))
            _put(target, region, value)
        for name, slot, shape, region, value in pieces["states"]:
            target = ckpt.updater.setdefault(name, {}).setdefault(slot, np.zeros(shape, np.float32))
            _put(target, region, value)
        for phase, layers in pieces["readers"].items():
            ckpt.readers.setdefault(phase, {}).update(layers)
        for name, counters in pieces["counters"].items():
            ckpt.counters.setdefault(name, {}).update(counters)
        for phase, layer, name, (lo, hi), batch, value in pieces["carried"]:
            arrays = ckpt.carried.setdefault(phase, {}).setdefault(layer, {})
            target = arrays.setdefault(name, np.zeros((batch,) + value.shape[1:], np.float32))
            target[lo:hi] = value  # this worker's rows of the global batch
    return ckpt


def restore(trainer, ckpt: checkpoint.Checkpoint, full: bool, allow_partial: bool = False) -> list[str]:
    """Load ``ckpt`` into this rank's shards.  ``full``: also updater state and data positions.

    Returns the params left as initialised: when initialising (not ``full``, SINGA's
    ``checkpoint_path``) those the checkpoint lacks; with ``allow_partial`` those that do not fit.
    A param without an init must be in the checkpoint and fit (DataError otherwise).
    """
    skipped = []
    params = {p.name: p for net in trainer.nets().values() for p in net.params}
    for param in {id(p): p for p in params.values()}.values():
        value = ckpt.params.get(param.name)
        problem = None
        if value is None and param.from_checkpoint:
            raise DataError(f"{ckpt.path}: no parameter {param.name!r} (shape {param.logical_shape}): expected it "
                            f"there, as the job gives it no init {{ ... }} to start from")
        if value is None:
            if not full:  # SINGA's checkpoint_path: params it lacks start from their init
                skipped.append(f"{param.name} (not in the checkpoint)")
                continue
            problem = f"no parameter {param.name!r} (shape {param.logical_shape})"
        elif value.shape != param.logical_shape:
            problem = f"parameter {param.name!r} has shape {value.shape}, the net expects {param.logical_shape}"
        if problem:
            if param.from_checkpoint:
                raise DataError(f"{ckpt.path}: {problem}: expected it to fit, as the job gives it no init {{ ... }}")
            if not allow_partial:
                raise DataError(f"{ckpt.path}: {problem} (use --allow-partial to keep the initial values)")
            skipped.append(f"{param.name} ({problem})")
            continue
        param.data[...] = _take(value, ("nd", param.shard))
    if not full:
        return skipped
    for owner in trainer.runtime.owned_params():
        slots = ckpt.updater.get(owner.name, {})
        state = {slot: _take(value, owner.region()).reshape(owner.data.shape) for slot, value in slots.items()
                 if value.shape == owner.logical_shape}
        if state:
            trainer.updater.load_state(owner.name, state)
    trainer.updater.load_counters(ckpt.counters)
    for phase, net in trainer.nets().items():
        for layer in net.layers:
            if layer.name in ckpt.readers.get(phase, {}):
                layer.load_state(ckpt.readers[phase][layer.name])
            lo, hi = layer.ctx.rows()
            for name, value in ckpt.carried.get(phase, {}).get(layer.name, {}).items():
                layer.load_carried(name, value[lo:hi])
    return skipped
