"""Between a running job (any partitioning) and a checkpoint (logical arrays).

``collect`` gathers every rank's pieces to rank 0: its parameter shards (from
one holder per shard), its updater state (for the chunk or shard it updates),
and its input layers' positions, and assembles whole logical arrays.
``restore`` is the reverse on every rank: each takes its own shard of each
logical array, whatever partitioning or rank count wrote the file.
"""
from __future__ import annotations

import hashlib
import json
from typing import Mapping, Sequence

import numpy as np

from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.config.load import effective_partition_dim, layers_for_phase
from singa_mpi.errors import DataError
from singa_mpi.registry import selected_name

ParamShapes = Mapping[str, Sequence[int]]  # the job's params (owners) -> logical shape, as checking found them


def _index(array_shape: tuple, region: tuple):
    """Where ``region`` sits in an array of ``array_shape`` (the logical shape)."""
    if region[0] == "flat":
        return ("flat", slice(region[1], region[2]))
    return ("nd", tuple(slice(lo, hi) for lo, hi in region[1]))


def put_region(target: np.ndarray, region: tuple, value: np.ndarray) -> None:
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


def plan_summary(cfg, nranks: int, shape: dict | None = None) -> dict:
    """How the job is partitioned (``nranks``: the workers of a group), for the checkpoint and the diff
    shown when resuming differently; ``shape`` (:func:`job_shape`): the framework's groups and servers."""
    layers = {}
    for layer in cfg.proto.neuralnet.layer:
        pdim = effective_partition_dim(cfg.proto, layer)
        layers[layer.name] = f"partition_dim {pdim}" + (f" location {layer.location}" if pdim == -1 else "")
    return {"nranks": nranks, "layers": layers, **({"cluster": shape} if shape else {})}


def job_shape(runtime) -> dict:
    """The whole job a checkpoint's writer belongs to, under a framework (worker groups, or server
    ranks: a worker runtime's ``size`` is its group's): its framework, ranks, worker groups, workers
    per group and server ranks; {} for one group of workers."""
    place = getattr(runtime, "place", None)
    if place is None:
        return {}
    topo = place.topo
    return {"framework": topo.framework, "ranks": topo.world_size, "worker_groups": len(topo.worker_groups),
            "workers_per_group": topo.workers_per_group,
            "servers": sum(1 for role in topo.roles if role.kind == "server")}


def job_ranks(runtime) -> int:
    """Every rank of the job (:func:`job_shape`), where ``runtime.size`` counts one group's workers."""
    return job_shape(runtime).get("ranks", runtime.size)


def identity_parts(cfg, params: ParamShapes) -> dict:
    """What defines a job's params: their names and logical shapes (owners; ``params``, which checking
    the job found: ``dict(checks.job.validate(cfg).params)``), and the train net's layers (name, type,
    sources).  Not the step, seed, learning rate, updater, batch, data or partitioning: a job may go
    on from its checkpoint with any of those changed."""
    layers = [[layer.name, selected_name(layer), list(layer.srclayers)]
              for _, layer in layers_for_phase(cfg.proto, "train")]
    return {"params": [[name, list(shape)] for name, shape in sorted(params.items())], "layers": layers}


def job_identity(cfg, params: ParamShapes) -> str:
    """16 hex digits of a hash of :func:`identity_parts`: equal for the same net, whatever the run."""
    text = json.dumps(identity_parts(cfg, params), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def other_job(cfg, params: ParamShapes, ckpt: checkpoint.Checkpoint) -> str | None:
    """How ``ckpt`` shows it was written by another job than ``cfg`` (its identity differs), else None.
    A file without an identity (format 2, converted from SINGA) is taken as this job's."""
    mine = job_identity(cfg, params)
    if not ckpt.job_identity or ckpt.job_identity == mine:
        return None
    return (f"{ckpt.path}: written by another job ('{ckpt.job_name}', identity {ckpt.job_identity}) than "
            f"{cfg.path} ('{cfg.proto.name}', identity {mine}): {_difference(params, ckpt)}")


def _difference(params: ParamShapes, ckpt: checkpoint.Checkpoint) -> str:
    """The first few params that differ by name or shape, else that the layers differ."""
    mine = {name: tuple(shape) for name, shape in params.items()}
    theirs = {name: tuple(value.shape) for name, value in ckpt.params.items()}
    lines = [f"{name} {theirs.get(name, 'absent')} there, {mine.get(name, 'absent')} here"
             for name in sorted(set(mine) | set(theirs)) if mine.get(name) != theirs.get(name)]
    if not lines:
        return "the same params, but layers of other types or sources"
    more = f" and {len(lines) - 3} more" if len(lines) > 3 else ""
    return "params differ: " + ", ".join(lines[:3]) + more


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
    carried = own_carried(trainer)
    others = trainer.runtime.gather_groups([piece for piece in carried if piece[0] == "train"])
    return {"params": params, "states": states, "readers": readers, "counters": _own(updater.counters(), trainer),
            "carried": carried, "groups": dict(enumerate(others or []))}


def own_carried(trainer) -> list[tuple]:
    """This worker's rows of what its layers carry from batch to batch: (phase, layer, name, (lo, hi)
    of the global batch, global batch, array)."""
    return [(phase, layer.name, name, layer.ctx.rows(), layer.ctx.global_batch, np.array(value))
            for phase, net in trainer.nets().items() for layer in net.layers
            for name, value in layer.carried().items()]


def contribute_group_state(trainer) -> None:
    """A worker of group g > 0 at a checkpoint: its hidden state to group 0's worker of its location ID,
    where the groups keep one pace (collective over them; nothing elsewhere: asynchronous groups are not
    waited for, and resume from zeros, which the resume notes)."""
    trainer.runtime.gather_groups([piece for piece in own_carried(trainer) if piece[0] == "train"])


def _put_carried(target: dict, pieces: list[tuple]) -> None:
    for phase, layer, name, (lo, hi), batch, value in pieces:
        arrays = target.setdefault(phase, {}).setdefault(layer, {})
        rows = arrays.setdefault(name, np.zeros((batch,) + value.shape[1:], np.float32))
        rows[lo:hi] = value  # this worker's rows of the global batch


def _own(counters: dict[str, dict[str, int]], trainer) -> dict[str, dict[str, int]]:
    """The updater counters of the params this rank updates (its owned params): the root merges every
    rank's, so a counter of a param this rank does not update (a param of fewer node-shared chunks than
    ranks, one a server updates) must neither be restored here, where it would stand still, nor come
    from here."""
    updated = {owner.name for owner in trainer.runtime.owned_params()}
    return {name: values for name, values in counters.items() if name in updated}


def collect(trainer, step: int, final: bool = False) -> checkpoint.Checkpoint | None:
    """The whole job's state at ``step`` on rank 0 (None elsewhere).  Collective.  With server ranks
    the params and updater state are theirs (``final``: once every worker group has finished).  Its job
    identity comes from ``trainer.job_params`` (the launch sets them)."""
    everyone = trainer.runtime.gather_object(local_pieces(trainer))
    if everyone is None:
        return None
    served = trainer.runtime.server_state(final)
    if served is not None:  # after the workers' pieces: the servers' values are the job's
        everyone = everyone + [{"params": part["params"], "states": part["states"], "readers": {},
                                "counters": part["counters"], "carried": [], "groups": {}} for part in served]
    known = trainer.job_params  # None: a trainer built without them (a test's, a script's) writes no identity
    ckpt = checkpoint.Checkpoint(step=step, params={}, job_name=trainer.job.name, job_config=trainer.cfg.text,
                                 plan=plan_summary(trainer.cfg, trainer.runtime.size, job_shape(trainer.runtime)),
                                 seed=trainer.job.seed, nranks=job_ranks(trainer.runtime),
                                 job_identity=job_identity(trainer.cfg, known) if known is not None else "")
    for pieces in everyone:
        for name, shape, region, value in pieces["params"]:
            target = ckpt.params.setdefault(name, np.zeros(shape, np.float32))
            put_region(target, region, value)
        for name, slot, shape, region, value in pieces["states"]:
            target = ckpt.updater.setdefault(name, {}).setdefault(slot, np.zeros(shape, np.float32))
            put_region(target, region, value)
        for phase, layers in pieces["readers"].items():
            ckpt.readers.setdefault(phase, {}).update(layers)
        for name, counters in pieces["counters"].items():
            ckpt.counters.setdefault(name, {}).update(counters)
        _put_carried(ckpt.carried, pieces["carried"])
        for group, carried in pieces["groups"].items():
            if group > 0:  # group 0's are its own "carried"
                _put_carried(ckpt.group_carried.setdefault(group, {}), carried)
    ckpt.worker_groups = trainer.runtime.groups
    steps = trainer.runtime.group_steps(served)
    if steps is not None:  # the training readers: every group's position, not group 0's alone
        ckpt.readers["train"] = {name: paced(state, steps) for name, state in ckpt.readers.get("train", {}).items()}
    return ckpt


def paced(state: dict, steps: Sequence[int]) -> dict:
    """Group 0's training reader ``state`` with each group's own position: ``steps``, the steps each
    group has trained in this run (one batch each), moves ``ahead<g>`` (group g's batches beyond group
    0's) by group g's steps beyond group 0's.  Other states (no ``groups``, or another count) as they are."""
    if int(state.get("groups", 1)) != len(steps):
        return state
    paced = {key: value for key, value in state.items() if not key.startswith("ahead")}
    for g in range(1, len(steps)):
        ahead = int(state.get(f"ahead{g}", 0)) + steps[g] - steps[0]
        if ahead:
            paced[f"ahead{g}"] = ahead
    return paced


def misfit(ckpt: checkpoint.Checkpoint, name: str, shape: Sequence[int], from_checkpoint: bool, full: bool,
           allow_partial: bool | None) -> str | None:
    """Whether param ``name`` of logical ``shape`` can take its values from ``ckpt`` (:func:`restore`'s
    rule; ``from_checkpoint``: the job gives it no init): None when it can, the note of a param left as
    initialised when it may be, else DataError.  Pure: every rank judges the whole job's params with it
    before any communication (:func:`misfits`), so a checkpoint that does not fit is one voted line."""
    shape = tuple(shape)
    value = ckpt.params.get(name)
    problem = None
    if value is None and from_checkpoint:
        raise DataError(f"{ckpt.path}: no parameter {name!r} (shape {shape}): expected it "
                        f"there, as the job gives it no init {{ ... }} to start from")
    if value is None:
        if not full:  # SINGA's checkpoint_path: params it lacks start from their init
            return f"{name} (not in the checkpoint)"
        problem = f"no parameter {name!r} (shape {shape})"
    elif value.shape != shape:
        problem = f"parameter {name!r} has shape {value.shape}, the net expects {shape}"
    if problem is None:
        return None
    if from_checkpoint:
        raise DataError(f"{ckpt.path}: {problem}: expected it to fit, as the job gives it no init {{ ... }}")
    if allow_partial is None:  # testing or predicting: a param at its initial value is no answer
        raise DataError(f"{ckpt.path}: {problem}: expected a checkpoint of this net (a job with "
                        f"other layers or shapes wrote it)")
    if not allow_partial:
        raise DataError(f"{ckpt.path}: {problem} (use --allow-partial to keep the initial values)")
    return f"{name} ({problem})"


def misfits(ckpt: checkpoint.Checkpoint, params: ParamShapes, without_init: set[str], full: bool,
            allow_partial: bool | None) -> list[str]:
    """:func:`misfit` over the job's ``params`` (owners -> logical shape; ``without_init``: those the job
    gives no init), in their order: the notes of params left as initialised, or the first DataError."""
    return [unfit for name, shape in params.items()
            if (unfit := misfit(ckpt, name, shape, name in without_init, full, allow_partial)) is not None]


def restore(trainer, ckpt: checkpoint.Checkpoint, full: bool, allow_partial: bool | None = None) -> list[str]:
    """Load ``ckpt`` into this rank's shards.  ``full``: also updater state and data positions.

    Returns the params left as initialised: when initialising (not ``full``, SINGA's
    ``checkpoint_path``) those the checkpoint lacks; with ``allow_partial`` those that do not fit.
    A param without an init must be in the checkpoint and fit (DataError otherwise; its message
    suggests `--allow-partial` where the command has it: ``allow_partial`` False, not None).
    """
    skipped = []
    params = {p.name: p for net in trainer.nets().values() for p in net.params}
    for param in {id(p): p for p in params.values()}.values():
        unfit = misfit(ckpt, param.name, param.logical_shape, param.from_checkpoint, full, allow_partial)
        if unfit is not None:
            skipped.append(unfit)
            continue
        param.data[...] = _take(ckpt.params[param.name], ("nd", param.shard))
    if not full:
        return skipped
    for owner in trainer.runtime.owned_params():
        slots = ckpt.updater.get(owner.name, {})
        state = {slot: _take(value, owner.region()).reshape(owner.data.shape) for slot, value in slots.items()
                 if value.shape == owner.logical_shape}
        if state:
            trainer.updater.load_state(owner.name, state)
    trainer.updater.load_counters(_own(ckpt.counters, trainer))
    stream = (trainer.runtime.group, trainer.runtime.groups)
    for phase, net in trainer.nets().items():
        for layer in net.layers:
            if layer.name in ckpt.readers.get(phase, {}):
                layer.load_state(ckpt.readers[phase][layer.name])
            lo, hi = layer.ctx.rows()
            for name, value in group_carried(ckpt, stream).get(phase, {}).get(layer.name, {}).items():
                layer.load_carried(name, value[lo:hi])
    trainer.algorithm.resume_readers(ckpt.readers.get("train", {}), stream)
    return skipped


def group_carried(ckpt: checkpoint.Checkpoint, stream: tuple[int, int]) -> dict:
    """What worker group g of G (``stream``) resumes carrying (phase -> layer -> name -> global batch rows):
    its own state when the checkpoint was written by G groups (none, i.e. zeros, for an asynchronous
    group: its state was not gathered); else, from an older checkpoint or one of another number of
    groups, group 0's, as every group resumed before states were kept per group (:func:`group_state_note`)."""
    group, groups = stream
    if group == 0 or max(ckpt.worker_groups, 1) != groups:
        return ckpt.carried
    return ckpt.group_carried.get(group, {})


def group_state_note(ckpt: checkpoint.Checkpoint, groups: int) -> str | None:
    """The one line a resume of ``groups`` worker groups says of the carried state (a text reader's hidden
    state) it does not restore per group, or None: one group, nothing carried, or every group's state there."""
    if not ckpt.carried.get("train") or max(ckpt.worker_groups, 1) == groups == 1:
        return None
    written = max(ckpt.worker_groups, 1)
    if written != groups:
        which = "written with one group, or before states were kept per group" if written == 1 else \
            f"written by {written} worker groups"
        return (f"note: {ckpt.path} holds worker group 0's text position and hidden state alone ({which}): "
                f"every one of the {groups} groups resumes from them, as before")
    missing = [g for g in range(1, groups) if g not in ckpt.group_carried]
    if not missing:
        return None
    return (f"note: {ckpt.path}: worker group(s) {', '.join(map(str, missing))} resume at their own text positions "
            f"with a hidden state of zeros (asynchronous groups' states are not gathered at checkpoints)")
