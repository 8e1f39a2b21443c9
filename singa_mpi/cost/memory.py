"""Whether a job fits the memory a rank can have, checked before any communication (every rank of
``train`` and ``test`` in phase 1, and ``check -n N``): the fullest rank's predicted bytes (:func:`fullest`, by :func:`.auto.memory_by_rank`,
the one prediction ``plan --auto --memory-limit`` uses: params with their gradients and updater state,
the activations and work arrays of the step's rows, the test net's outputs, the checkpoint's copies)
against this process's share of the node (the cgroup's limit where one is set, else physical memory,
divided among the ranks on the node).  Over it: one line naming the biggest contributor's field; over
``WARN_SHARE`` of it: a warning.

Under MPI every rank compares the fullest rank's need with its own node's share: on nodes of one size
(what a launch asks of Slurm or a hostfile) that is the fullest rank's own check; on nodes of different
sizes it refuses a job whose fullest rank would not fit the smallest node's share even if that rank
lands on a larger node, as nothing here knows which rank runs where before the launch (no rank may
communicate before the check: it is what decides whether they start)."""
from __future__ import annotations

import math
import os
from typing import Iterable

from singa_mpi.cost.auto import memory_by_rank
from singa_mpi.errors import ConfigError

WARN_SHARE = 0.8  # a prediction over this share of the bound is warned of (the prediction is no promise)
SWITCH = "--no-check-memory"
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")  # v2, v1
GiB = 2 ** 30
BY_ROWS = ("activations", "work arrays", "passing arrays")  # parts that grow with a rank's rows (memory_by_rank's)
NAMED = ("params", "activations")  # the parts whose field an over-the-bound line names
# the field that sets a layer's params (its width), by the conf that holds it
WIDTHS = {"innerproduct_conf": "num_output", "convolution_conf": "num_filters", "rbm_conf": "hdim",
          "gru_conf": "dim_hidden", "embedding_conf": "vocab_size"}


def memory_bound(node_ranks: int) -> tuple[int, str]:
    """(bytes a rank may use, where that came from): the cgroup's limit where set and below physical
    memory, else physical memory; divided among ``node_ranks`` ranks."""
    total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    source = f"{_size(total)} of physical memory"
    for path in CGROUP_LIMITS:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < total:  # v2 "max", v1's huge number: no limit
            total, source = int(text), f"the cgroup limit {_size(int(text))} ({path})"
        break
    return total // node_ranks, f"{source} / {node_ranks} rank(s) on this node"


def fullest(cfg, plans: Iterable, trains: bool = True) -> tuple[int, dict, object]:
    """(bytes, their parts, its plan) of the fullest rank of a run of ``cfg`` with these ``plans`` (one per
    phase): of a training run (``trains``), the train plan's ranks with the other phases' nets evaluated
    beside (:func:`.auto.memory_by_rank`); else each plan's alone (a test run).  (0, {}, None) without plans."""
    plans = list(plans)
    trained = [plan for plan in plans if plan.phase == "train"] if trains else []
    nets = [(plan, [other for other in plans if other is not plan]) for plan in trained] or [(plan, []) for plan in plans]
    return max(((sum(p.values()), p, plan) for plan, beside in nets
                for p in memory_by_rank(plan, cfg.proto.updater, bool(trained), beside)),
               key=lambda found: found[0], default=(0, {}, None))


def check_memory(cfg, plans: Iterable, node_ranks: int, switch: str = SWITCH, trains: bool = True) -> str | None:
    """ConfigError when a plan's fullest rank needs more than a rank can have (:func:`memory_bound`),
    naming the biggest contributor's file:line and field; over ``WARN_SHARE`` of it, the warning to
    give (else None).  ``switch``: how the caller turns the check off ("": it cannot); ``trains``: False
    for a run that only tests (params alone: no gradients, updater state or checkpoint)."""
    need, parts, the_plan = fullest(cfg, plans, trains)
    limit, source = memory_bound(node_ranks)
    if the_plan is None or need <= WARN_SHARE * limit:
        return None
    # named: the biggest part of params or activations (the work arrays, the passing arrays and the
    # checkpoint's copies grow with them: a convolution's columns with the padded input its source makes)
    named = [(key, n) for key, n in parts.items() if key[0] in the_plan.origins]
    (layer, what), most = max([item for item in named if item[0][1] in NAMED] or named, key=lambda item: item[1])
    rows = max((sub.out_shape[0] for sub in the_plan.sublayers if sub.origin == layer and sub.out_shape), default=0)
    lead, todo = _contributor(cfg, the_plan, the_plan.origins[layer], what, rows)
    line = (f"{lead}: predicted {_size(need)} on a rank (the fullest of {the_plan.nranks}) in the {the_plan.phase} "
            f"phase ({what} of layer '{layer}': {_size(most)}), ")
    if need <= limit:
        return f"{line}near the {_size(limit)} a rank can have here ({source})"
    skip = f"; or {switch} to skip this check" if switch else ""
    raise ConfigError(f"{line}over the {_size(limit)} a rank can have here ({source}): expected a job that "
                      f"fits: {todo}{skip}")


def _size(nbytes: float) -> str:
    return f"{nbytes / GiB:.1f} GiB" if nbytes >= GiB else f"{nbytes / 2 ** 20:.1f} MiB"


def _contributor(cfg, the_plan, node, what: str, rows: int) -> tuple[str, str]:
    """(FILE:LINE:COL: layer 'NAME': CONF.FIELD = VALUE, what to do) of the field behind the biggest
    contributor: of activations the batch when a rank's rows outnumber a row's floats, else the width
    (a convolution's or pooling's pad where set, else the layer's or the nearest source's width field)."""
    fix_rows = f"fewer rows per rank ({rows} here: a smaller batchsize, or more ranks)"
    if what in BY_ROWS and rows >= math.prod(the_plan.shapes[node.name]):
        for source in the_plan.origins.values():
            for conf in ("store_conf", "sharddata_conf", "char_rnn_conf"):
                if source.conf.HasField(conf) and getattr(source.conf, conf).batchsize:
                    value = getattr(source.conf, conf).batchsize
                    field, shown = ((conf, "batchsize", 0), value[0]) if conf == "store_conf" else \
                        ((conf, "batchsize"), value)
                    where = cfg.layer_where(source.index, *field)
                    return f"{where}: layer '{source.name}': {conf}.batchsize = {shown}", fix_rows
    for conf in ("convolution_conf", "pooling_conf"):
        if what in BY_ROWS and node.conf.HasField(conf) and getattr(node.conf, conf).pad:
            return (f"{cfg.layer_where(node.index, conf, 'pad')}: layer '{node.name}': {conf}.pad = "
                    f"{getattr(node.conf, conf).pad}"), f"a smaller pad, or {fix_rows}"
    fix = ("split the layer over the ranks with partition_dim: 1, launch more ranks, or make it narrower"
           if what not in BY_ROWS else f"a narrower layer, or {fix_rows}")
    wide = _width_source(the_plan, node, what)
    if wide is None:
        return f"{cfg.layer_where(node.index)}: layer '{node.name}'", fix
    conf = _width_conf(wide)
    value = getattr(getattr(wide.conf, conf), WIDTHS[conf])
    where = cfg.layer_where(wide.index, conf, WIDTHS[conf])
    return f"{where}: layer '{wide.name}': {conf}.{WIDTHS[conf]} = {value}", fix


def _width_conf(node) -> str | None:
    return next((name for name in WIDTHS if node.conf.HasField(name)), None)


def _width_source(the_plan, node, what: str):
    """The layer whose width field makes ``node``'s ``what`` big: its own, unless it has none or (of its
    params) its input is wider; then the nearest up its first sources that has one (None: none has)."""
    conf, origins = _width_conf(node), the_plan.origins
    srcs = [name for name in node.conf.srclayers if name in origins]
    if conf is not None and srcs and what not in BY_ROWS:
        shape = the_plan.shapes[srcs[0]]
        wide = (shape[0] if conf == "convolution_conf" else math.prod(shape)) if shape else 1  # its input's width
        if wide <= getattr(getattr(node.conf, conf), WIDTHS[conf]):
            return node
    elif conf is not None or not srcs:
        return node if conf is not None else None
    source = origins[srcs[0]]
    while _width_conf(source) is None and source.conf.srclayers and source.conf.srclayers[0] in origins:
        source = origins[source.conf.srclayers[0]]
    return source if _width_conf(source) is not None else node if conf is not None else None
