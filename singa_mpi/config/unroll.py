"""Unrolling recurrent nets (SINGA 0.2/0.3's NeuralNet::Unrolling): a pure transform of a phase's layers.

A layer whose ``unroll_len`` (its own, else ``neuralnet.unroll_len``) is U > 1
becomes U copies named ``"<t>#<name>"`` (SINGA's names), each with
``unroll_index = t``.  Layers with U = 1 keep their name (SINGA also renamed
them ``0#...``; here names, plans, errors and checkpoints show what the file
says).  Params: copy 0 keeps the file's param names (checkpoints hold those);
copy t > 0 names its params ``"<t>#<param>"`` and shares copy 0's values
(``share_from``), so every copy adds into one gradient.

Sources of copy t, per ``srclayers[k]`` with ``unroll_conn_type[k]`` and ``shift[k]``:

====================  ==============================================================
kUnrollOneToOne       source copy t - shift (none while t < shift); a source with one
                      copy feeds every copy (SINGA left that undefined)
kUnrollOneToAll       every copy of the source, in order
kUnrollFirstToLast    copy 0 gets the source's last copy; the other copies get nothing
====================  ==============================================================

A recurrent layer (kGRU) copy t >= 1 also gets its own copy t - 1, appended after
the file's sources (SINGA, net.cc:210-216).  :func:`check` reports bad unrolling
fields with file:line before anything else looks at the copies.
"""
from __future__ import annotations

from singa_mpi.config.limits import LIMIT_NOTE, MAX_LAYERS
from singa_mpi.errors import ConfigError
from singa_mpi.proto import job_pb2
from singa_mpi.registry import selected_name

# layers and their unrolled copies: char-rnn unrolls 6 layers 50 times (300 copies); `check` of 96,000
# copies took 15 s and 650 MB, so a net that unrolls beyond this is refused before its copies are made
MAX_UNROLLED_LAYERS = 5 * MAX_LAYERS
RECURRENT = {"kGRU"}  # copy t takes copy t - 1 of itself as its last source
ONE_TO_ONE, ONE_TO_ALL, FIRST_TO_LAST = (job_pb2.kUnrollOneToOne, job_pb2.kUnrollOneToAll,
                                         job_pb2.kUnrollFirstToLast)

Layers = list[tuple[int, job_pb2.LayerProto]]


def unroll_len(job: job_pb2.JobProto, layer: job_pb2.LayerProto) -> int:
    return layer.unroll_len if layer.HasField("unroll_len") else job.neuralnet.unroll_len


def copy_name(name: str, t: int, length: int) -> str:
    return f"{t}#{name}" if length > 1 else name


def unroll(job: job_pb2.JobProto, layers: Layers) -> Layers:
    """The copies of ``layers`` ((file index, conf) of one phase) in file order; unchanged when nothing
    is unrolled.  Call :func:`check` first: this assumes valid fields."""
    lengths = {conf.name: unroll_len(job, conf) for _, conf in layers}
    if all(n == 1 for n in lengths.values()):
        return layers
    out = []
    for index, conf in layers:
        length = lengths[conf.name]
        for t in range(length):
            out.append((index, _copy(conf, t, length, lengths)))
    return out


def _copy(conf: job_pb2.LayerProto, t: int, length: int, lengths: dict[str, int]) -> job_pb2.LayerProto:
    copy = job_pb2.LayerProto()
    copy.CopyFrom(conf)
    copy.name = copy_name(conf.name, t, length)
    copy.unroll_index, copy.unroll_len = t, length  # written out: a copy knows it is one of ``length``
    for field in ("srclayers", "unroll_conn_type", "shift"):
        copy.ClearField(field)
    copy.srclayers.extend(_sources(conf, t, lengths))
    if selected_name(conf) in RECURRENT and t > 0:
        copy.srclayers.append(copy_name(conf.name, t - 1, length))
    if t > 0 and length > 1:
        for param in copy.param:
            owner = param.share_from or param.name
            param.name = f"{t}#{param.name}"
            param.share_from = owner
    return copy


def _sources(conf: job_pb2.LayerProto, t: int, lengths: dict[str, int]) -> list[str]:
    names = []
    for k, src in enumerate(conf.srclayers):
        kind = conf.unroll_conn_type[k] if k < len(conf.unroll_conn_type) else ONE_TO_ONE
        shift = conf.shift[k] if k < len(conf.shift) else 0
        count = lengths.get(src, 1)
        if kind == ONE_TO_ALL:
            names += [copy_name(src, j, count) for j in range(count)]
        elif kind == FIRST_TO_LAST:
            names += [copy_name(src, count - 1, count)] if t == 0 else []
        elif count == 1:
            names.append(src)
        elif t - shift >= 0:  # only the copy it reads: naming them all for each copy was quadratic
            names.append(copy_name(src, t - shift, count))
    return names


def check(cfg) -> None:
    """One-line ConfigErrors (file:line, layer, field) for unrolling fields that cannot work."""
    job = cfg.proto
    if job.neuralnet.unroll_len < 1:
        raise ConfigError(f"{cfg.where('neuralnet', 'unroll_len')}: neuralnet.unroll_len = "
                          f"{job.neuralnet.unroll_len}: expected at least 1")
    layers = list(job.neuralnet.layer)
    _check_copies(cfg, layers)
    by_name: dict[str, list[job_pb2.LayerProto]] = {}
    for layer in layers:
        by_name.setdefault(layer.name, []).append(layer)
    for index, layer in enumerate(layers):
        where = lambda *f: cfg.layer_where(index, *f)  # noqa: E731
        who = f"layer '{layer.name}' (#{index}, {selected_name(layer)})"
        length = unroll_len(job, layer)
        if length < 1:
            raise ConfigError(f"{where('unroll_len')}: {who}: unroll_len = {length}: expected at least 1")
        for k, kind in enumerate(layer.unroll_conn_type):
            if kind == job_pb2.kUnrollCustomized:
                raise ConfigError(f"{where('unroll_conn_type', k)}: {who}: unroll_conn_type[{k}] = "
                                  f"kUnrollCustomized: expected kUnrollOneToOne, kUnrollOneToAll or "
                                  f"kUnrollFirstToLast (SINGA never implemented it)")
        for k, shift in enumerate(layer.shift):
            if not 0 <= shift < length:
                raise ConfigError(f"{where('shift', k)}: {who}: shift[{k}] = {shift}: expected 0..{length - 1} "
                                  f"(the layer is unrolled {length} times)")
        for k, src in enumerate(layer.srclayers):
            kind = layer.unroll_conn_type[k] if k < len(layer.unroll_conn_type) else ONE_TO_ONE
            counts = {unroll_len(job, s) for s in by_name.get(src, [])}
            if kind == ONE_TO_ONE and any(c not in (1, length) for c in counts):
                raise ConfigError(f"{where('srclayers', k)}: {who}: srclayers[{k}] = {src!r}: expected a source "
                                  f"unrolled {length} times or not at all for kUnrollOneToOne (it is unrolled "
                                  f"{max(counts)} times); use unroll_conn_type kUnrollOneToAll or kUnrollFirstToLast")


def stateless_unrolling(cfg) -> str | None:
    """The warning line for a net unrolled (some layer's unroll_len > 1) where nothing carries state
    from copy to copy: no recurrent layer, no kCharRNN windows, every source kUnrollOneToOne without
    shift.  SINGA unrolled it all the same (tied copies, one gradient); a plain MLP given
    ``neuralnet { unroll_len: 3 }`` trains three copies of itself each step and never says so."""
    job = cfg.proto
    layers = list(job.neuralnet.layer)
    if all(unroll_len(job, layer) <= 1 for layer in layers):
        return None
    for layer in layers:
        timed = selected_name(layer) in RECURRENT | {"kCharRNN"}
        if timed or any(kind != ONE_TO_ONE for kind in layer.unroll_conn_type) or any(layer.shift):
            return None
    index, layer = next((k, layer) for k, layer in enumerate(layers) if unroll_len(job, layer) > 1)
    own = layer.HasField("unroll_len")
    where = cfg.layer_where(index, "unroll_len") if own else cfg.where("neuralnet", "unroll_len")
    field = f"layer '{layer.name}': unroll_len" if own else "neuralnet.unroll_len"
    length = unroll_len(job, layer)
    return (f"{where}: {field} = {length}: no layer carries state across the {length} copies (no kGRU, no "
            f"shift, no kUnrollOneToAll or kUnrollFirstToLast source): each step trains {length} tied copies "
            f"of the net, sharing its params and adding their gradients, as SINGA did; leave unroll_len out "
            f"for one copy")


def _check_copies(cfg, layers: list[job_pb2.LayerProto]) -> None:
    """Unrolled copies are layers too: at most MAX_UNROLLED_LAYERS of them in the net (an unroll_len of
    a million would build a million layers before anything else could complain)."""
    total = 0
    for index, layer in enumerate(layers):
        total += max(unroll_len(cfg.proto, layer), 1)
        if total > MAX_UNROLLED_LAYERS:
            own = layer.HasField("unroll_len")
            where = cfg.layer_where(index, "unroll_len") if own else cfg.where("neuralnet", "unroll_len")
            field = "unroll_len" if own else "neuralnet.unroll_len"
            raise ConfigError(f"{where}: layer '{layer.name}' (#{index}, {selected_name(layer)}): {field} = "
                              f"{unroll_len(cfg.proto, layer)}: expected at most {MAX_UNROLLED_LAYERS:,} layers "
                              f"once unrolled, found {total:,} by this layer ({LIMIT_NOTE})")
