"""The partition planner: a net and a rank count in, a :class:`Plan` out.  No MPI.

Rules (SINGA 0.x seeds 001, 002, 004, extended to placement):

* ``partition_dim: 0`` -> one sub-layer per rank, rank ``i`` computing rows
  ``chunk(B, n, i)`` of the batch; parameters replicated (gradients summed by
  the runtime).
* ``partition_dim: 1`` -> one sub-layer per rank computing output features
  ``chunk(F, n, i)`` (axis 1: inner-product units, convolution filters);
  parameters sharded accordingly.  Layer types whose maths cannot be split on
  features (softmax, losses, LRN across channels, input and output layers)
  are rejected with a message.
* ``partition_dim: -1`` -> one sub-layer on rank ``location`` (default 0).

For every edge the planner compares what each source sub-layer holds with what
each destination sub-layer needs (seed 004's OneToOne/OneToAll rule) and, where
they differ, inserts a connection layer: a bridge pair (Send/Recv) between two
ranks, or a collective Slice/Split/Concate (see :mod:`.regions`).  Names follow
SINGA: ``fc1@0``, ``concate(split(pool3))@1``, ``bridge_src(fc1->fc2)``.  In a pipelined
training step every such layer moves its pieces as point-to-point messages instead (``Send``/``Recv``:
:data:`~singa_mpi.program.rules.MESSAGES`): a collective would make all its members meet in one micro-batch's slot, so a layer
split over the workers of two stages would fuse the stages into one.

The global order (original layers in topological order, each preceded by the
connection layers of its incoming edges) is every rank's execution order
restricted to its own sub-layers, so collectives are entered in the same order
everywhere and a bridge's Send (non-blocking) comes right before its Recv:
the schedule cannot deadlock, and :mod:`.schedule` checks that it does not.
"""
from __future__ import annotations

import dataclasses
import math

from singa_mpi.algorithms import frozen_params
from singa_mpi.config.load import JobConfig, effective_partition_dim
from singa_mpi.errors import ConfigError
from singa_mpi.graph import Node
from singa_mpi.layers.base import ONE_TO_ALL, Layer, LayerContext
from singa_mpi.net import global_batch_size, instantiate, layer_error, phase_nodes, set_up
from singa_mpi.planner.chunk import chunk
from singa_mpi.planner.deterministic import (Deterministic, check_deterministic, deterministic_of, refuse_in_plan,
                                              refuse_summing_exchanges)
from singa_mpi.planner.pipeline import Pipeline, check_pipeline, join_blocks, pipeline_of
from singa_mpi.planner.regions import (Piece, Region, as_array, classify, overlap_sizes, pieces, pieces_from,
                                      pieces_to)
from singa_mpi.program.rules import MESSAGES


@dataclasses.dataclass(frozen=True)
class ParamShard:
    """A sub-layer's part of a logical parameter."""

    name: str  # the owner param's name (share_from resolved)
    logical_shape: tuple[int, ...]
    offsets: tuple[tuple[int, int], ...]  # (lo, hi) per axis
    # the layer adds its gradient as one product over its batch rows (ParamSpec.batch_factored)
    batch_factored: bool = False
    trained: bool = True  # False: state the layer writes (ParamSpec.trained): never synchronised
    terms: str = "rows"  # deterministic mode: what its gradient terms are (Layer.terms_for: rows, pairs, blocks, "")

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(hi - lo for lo, hi in self.offsets)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


@dataclasses.dataclass
class Exchange:
    """What an inserted connection layer moves, seen from the whole group."""

    id: int  # position among the plan's exchanges: the MPI tag base and the schedule key
    src_layer: str  # original layer names of the edge
    dst_layer: str
    kind: str  # "data" (float32, with a backward) or "aux" (int32 labels, forward only)
    forward_op: str  # MESSAGES[0] ("Send") for a bridge and for pieces sent as messages (a pipeline's)
    backward_op: str | None
    group: tuple[int, ...]  # ranks taking part, ascending
    holders: dict[int, Region]
    needs: dict[int, Region]
    rest_shape: tuple[int, ...]  # per-sample dims after axis 1 (e.g. H, W)
    with_backward: bool  # the source needs a gradient (decided globally: every member agrees)

    @property
    def dtype(self) -> str:
        return "float32" if self.kind == "data" else "int32"

    @property
    def itemsize(self) -> int:
        return 4

    @property
    def pieces(self) -> list[Piece]:
        """Every (holder, receiver) block, by receiver then holder.  Built on demand: an exchange between
        a batch split and a feature split over n ranks has n^2 of them, and planning never lists them
        all (each rank asks for its own with :meth:`sends_of` / :meth:`recvs_of`)."""
        return pieces(self.holders, self.needs)

    def sends_of(self, rank: int) -> list[Piece]:
        """The blocks ``rank`` sends (itself included), by receiver."""
        held = self.holders.get(rank)
        return [] if held is None else pieces_from(rank, held, self.needs)

    def recvs_of(self, rank: int) -> list[Piece]:
        """The blocks ``rank`` receives (from itself included), by holder."""
        need = self.needs.get(rank)
        return [] if need is None else pieces_to(rank, need, self.holders)

    def bytes_between(self, src: int, dst: int) -> int:
        held, need = self.holders.get(src), self.needs.get(dst)
        overlap = held.intersect(need) if held is not None and need is not None else None
        return 0 if overlap is None else overlap.size(math.prod(self.rest_shape)) * self.itemsize

    def sent_by(self, rank: int) -> int:
        """Forward bytes ``rank`` sends to the other members (pieces to itself are copies)."""
        return self._traffic()[0].get(rank, 0)

    def received_by(self, rank: int) -> int:
        return self._traffic()[1].get(rank, 0)

    def _traffic(self) -> tuple[dict[int, int], dict[int, int]]:
        """Bytes sent and received per rank, from one holders x receivers matrix, kept (every rank's
        schedule asks for every member; piece by piece, planning grew as ranks^4, then ranks^2 objects)."""
        cached = self.__dict__.get("_traffic_table")
        if cached is None:
            src_ranks, held = as_array(self.holders)
            dst_ranks, needed = as_array(self.needs)
            sizes = overlap_sizes(held, needed) * (math.prod(self.rest_shape) * self.itemsize)
            sizes[src_ranks[:, None] == dst_ranks[None, :]] = 0  # a rank's piece to itself is a copy
            sent = dict(zip(src_ranks.tolist(), sizes.sum(axis=1).tolist()))
            received = dict(zip(dst_ranks.tolist(), sizes.sum(axis=0).tolist()))
            cached = self.__dict__["_traffic_table"] = (sent, received)
        return cached


@dataclasses.dataclass
class SubLayer:
    """One node of the partitioned net: an original layer's part, or an inserted layer."""

    name: str
    type: str  # SINGA type name (kInnerProduct, kBridgeSrc, kConcate, ...)
    rank: int
    origin: str | None  # original layer name; None for inserted layers
    srcs: list[str]  # names of sub-layers on the same rank feeding this one
    kinds: list[str]  # per src: "data" or "aux"
    region: Region  # the part of the (origin's or the edge source's) logical output held here
    out_shape: tuple[int, ...]  # local output shape including the batch dimension
    pdim: int = -1
    params: list[ParamShard] = dataclasses.field(default_factory=list)
    exchange: Exchange | None = None
    role: str = ""  # for inserted layers: "bridge_src", "bridge_dst" or "collective"
    needs_grad: bool = False  # decided globally, identical on every rank
    # for original layers, what the runtime needs to instantiate this part of it:
    batch_slice: tuple[int, int] | None = None  # rows of the global batch (partition_dim 0)
    feature_slice: tuple[int, int] | None = None  # output features (partition_dim 1)
    src_shapes: list[tuple[int, ...]] = dataclasses.field(default_factory=list)  # logical, for setup
    # a layer with batch statistics split on the batch: the workers whose rows it sums over
    # (forward and backward of a training step), ascending; empty otherwise
    row_group: tuple[int, ...] = ()
    # deterministic mode: the partial sums such a layer's statistics carry, one per canonical block
    # of the batch (:mod:`singa_mpi.layers.batchnorm`); 1: one sum per worker
    statistics_blocks: int = 1
    micro: int = 0  # the micro-batch it computes, in a pipelined plan (:mod:`.pipeline`)


@dataclasses.dataclass
class ParamSync:
    """Ranks that hold the same shard of a parameter: their gradients are summed."""

    name: str
    offsets: tuple[tuple[int, int], ...]
    ranks: tuple[int, ...]
    size: int


@dataclasses.dataclass
class Plan:
    """A partitioned net: data only (specs, ranks, slices, exchanges, syncs), no layer objects.

    The runtime instantiates the sub-layers of its rank from these specs."""

    phase: str
    nranks: int
    batch: int
    sublayers: list[SubLayer]  # global order
    exchanges: list[Exchange]
    param_syncs: list[ParamSync]
    origins: dict[str, Node]  # original layer name -> node
    shapes: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)  # logical per-sample outputs
    pipeline: Pipeline | None = None  # micro-batches and their schedule (a pipelined training step)
    deterministic: Deterministic | None = None  # canonical blocks of rows (deterministic mode)

    def on_rank(self, rank: int) -> list[SubLayer]:
        """``rank``'s sub-layers in execution order (indexed once: every rank's schedule asks)."""
        by_rank = self.__dict__.get("_by_rank")
        if by_rank is None or by_rank[0] != len(self.sublayers):
            table: dict[int, list[SubLayer]] = {}
            for sub in self.sublayers:
                table.setdefault(sub.rank, []).append(sub)
            by_rank = self.__dict__["_by_rank"] = (len(self.sublayers), table)
        return list(by_rank[1].get(rank, []))

    def sublayer(self, name: str) -> SubLayer:
        return next(s for s in self.sublayers if s.name == name)


# ---------------------------------------------------------------- planning

@dataclasses.dataclass
class _Placed:
    """An original layer's sub-layers, by rank, during planning."""

    node: Node
    pdim: int
    layers: dict[int, Layer]  # rank -> set-up layer instance (shapes, param specs)
    regions: dict[int, Region]
    out_shape: tuple[int, ...]  # logical per-sample shape
    rows: tuple[int, int]  # the rows of the batch this plan computes: all, or one micro-batch's
    needs_grad: bool = False


def partition(cfg: JobConfig, nranks: int, phase: str = "train") -> Plan:
    """Partition the ``phase`` net of ``cfg`` over ``nranks`` workers; ConfigError if impossible.

    Layers are set up here (throw-away instances) to learn shapes and parameter
    specs; the plan keeps only the resulting data.
    """
    if nranks < 1:
        raise ConfigError(f"number of workers = {nranks}: expected at least 1")
    nodes = phase_nodes(cfg, phase)
    batch = global_batch_size(cfg, nodes)
    built = instantiate(cfg, nodes, lambda n: LayerContext(global_batch=batch, phase=phase))
    order = [node for node, _, _ in built]
    pipe = pipeline_of(cfg.proto, phase, nranks)
    if pipe is not None:
        check_pipeline(cfg)  # what a micro-batch cannot run is refused here too, however the job was made
    mode = deterministic_of(cfg.proto, batch)
    if mode is not None:
        check_deterministic(cfg)  # likewise
    blocks = []  # per micro-batch (one: the whole batch), its sub-layers and exchanges
    for rows in pipe.blocks(batch) if pipe is not None else [(0, batch)]:
        placed: dict[str, _Placed] = {}
        base_ctx = LayerContext(global_batch=batch, phase=phase, block_rows=mode.block_rows if mode else None)
        for node, logical, _ in built:
            placed[node.name] = _place(cfg, node, logical, nranks, base_ctx, placed, rows)
        _mark_needs_grad(order, placed)
        blocks.append(_connect(cfg, order, placed, nranks, messages=pipe is not None))
    sublayers, exchanges = blocks[0] if pipe is None else join_blocks(blocks)
    _check_every_rank_busy(cfg, sublayers, nranks)
    if mode is not None:
        refuse_summing_exchanges(cfg, exchanges)
    plan_ = Plan(phase, nranks, batch, sublayers, exchanges, _param_syncs(cfg, placed, sublayers),
                 {n.name: n for n in order}, {n.name: placed[n.name].out_shape for n in order}, pipe, mode)
    return plan_


def _place(cfg: JobConfig, node: Node, logical: Layer, nranks: int, base_ctx: LayerContext,
           placed: dict[str, _Placed], block: tuple[int, int]) -> _Placed:
    """``node``'s sub-layers over ``nranks`` workers for the rows ``block`` of the batch (all of it, or a
    micro-batch's: a layer not split on the batch then computes the block's rows, one split on it
    splits them)."""
    batch = block[1] - block[0]
    whole = None if block == (0, base_ctx.global_batch) else block  # a whole layer's batch_slice
    of_what = f"batch is {batch}" if whole is None else \
        f"a micro-batch of neuralnet.pipeline holds {batch}"
    pdim = effective_partition_dim(cfg.proto, node.conf)
    cls = type(logical)
    out_shape = logical.out_shape
    nfeat = out_shape[0] if out_shape else 1
    if pdim == 1 and not cls.feature_partitionable:
        inherited = "" if node.conf.HasField("partition_dim") else " (inherited from neuralnet.partition_dim)"
        raise layer_error(cfg, node, "partition_dim", f"1{inherited}",
                          f"0 or -1: {node.type_name} cannot be split on features "
                          f"({_why_not_feature(cls)}); set partition_dim on this layer")
    if pdim == 0 and cls.batch_split_refusal and nranks > 1:
        if node.conf.HasField("partition_dim"):
            raise layer_error(cfg, node, "partition_dim", 0, f"-1 or 1: {node.type_name} cannot be split on the batch "
                                                             f"({cls.batch_split_refusal})")
        pdim = -1  # inherited from the net: this layer runs whole on its location, its neighbours split
    if nranks == 1:
        pdim = -1 if pdim == -1 else 0  # one worker: every layer is whole on rank 0
    refuse_in_plan(cfg, node, pdim, nranks)
    if node.conf.location >= nranks > 1:
        # a split layer does not use its location, but one naming a worker the launch lacks is a slip
        # (a job written for more workers, or a typo) that a whole layer would not survive either
        split = "" if pdim == -1 else f"; this layer is split over them (partition_dim {pdim}), so leave it out"
        raise layer_error(cfg, node, "location", node.conf.location,
                          f"a worker id below the number of workers ({nranks}){split}")
    if pdim == -1:
        # one worker runs the whole net, wherever the job places layers on more (as a run of one process does)
        ranks = {node.conf.location if nranks > 1 else 0: (whole, None)}
    elif pdim == 0:
        if batch < nranks:
            raise layer_error(cfg, node, "partition_dim", 0,
                              f"a batch of at least {nranks} rows to split over {nranks} workers ({of_what})")
        if base_ctx.block_rows is not None and -(-batch // base_ctx.block_rows) < nranks:
            blocks = -(-batch // base_ctx.block_rows)
            raise layer_error(cfg, node, "partition_dim", 0,
                              f"at least {nranks} canonical blocks of rows to split over {nranks} workers in "
                              f"deterministic mode ({of_what}: {blocks} block(s) of deterministic.block_rows = "
                              f"{base_ctx.block_rows}); set block_rows to at most {batch // nranks} (the same in "
                              f"every run to be compared)")
        ranks = {r: (_rows_of(block, nranks, r, base_ctx.block_rows), None) for r in range(nranks)}
    elif cls.feature_split_rows:  # e.g. an RBM's visible layer: the partner's units split, its rows here
        units = logical.feature_units()
        if units < nranks or batch < nranks:
            raise layer_error(cfg, node, "partition_dim", 1,
                              f"at least {nranks} hidden units and batch rows to split over {nranks} workers "
                              f"(has {units} units; {of_what})")
        ranks = {r: (_rows_of(block, nranks, r, base_ctx.block_rows), chunk(units, nranks, r)) for r in range(nranks)}
    else:
        if cls.connection != ONE_TO_ALL:
            _check_one_to_one_features(cfg, node, nfeat, placed)
        # fewer outputs than workers (10 classes on 16 ranks): split over the first ``nfeat`` workers, one
        # feature each; the others hold none of this layer (the exchanges around it say who has what)
        over = min(nranks, nfeat)
        ranks = {r: (whole, chunk(nfeat, over, r)) for r in range(over)}
    layers, regions = {}, {}
    src_shapes = _src_shapes(node, placed, cls)
    for rank, (rows, feats) in ranks.items():
        ctx = dataclasses.replace(base_ctx, batch_slice=rows, feature_slice=feats)
        layer = cls(node.conf, ctx)
        set_up(cfg, node, layer, list(src_shapes))
        layers[rank] = layer
        held = (0, nfeat) if cls.feature_split_rows else feats or (0, nfeat)
        regions[rank] = Region(rows or block, held)
    return _Placed(node, pdim, layers, regions, out_shape, block)


def _rows_of(block: tuple[int, int], nranks: int, rank: int, block_rows: int | None = None) -> tuple[int, int]:
    """``rank``'s share of the rows ``block`` split over ``nranks`` workers (deterministic mode, with
    ``block_rows``: whole canonical blocks)."""
    if block_rows is not None:
        lo, hi = Deterministic(block_rows).rows_of(block[1] - block[0], nranks, rank)
    else:
        lo, hi = chunk(block[1] - block[0], nranks, rank)
    return block[0] + lo, block[0] + hi


def _why_not_feature(cls: type[Layer]) -> str:
    if cls.feature_split_refusal:
        return cls.feature_split_refusal
    if cls.is_input:
        return "input layers read whole records"
    if cls.is_loss:
        return "a loss needs every class score of a row"
    return "its output mixes features across any split"


def _check_one_to_one_features(cfg: JobConfig, node: Node, nfeat: int, placed: dict[str, _Placed]) -> None:
    """A OneToOne layer split on features computes on the same slice of its input."""
    for src in node.conf.srclayers:
        src_out = placed[src].out_shape
        if src_out and src_out[0] != nfeat:
            raise layer_error(cfg, node, "partition_dim", 1,
                              f"0 or -1: this {node.type_name} layer changes axis 1 from {src_out[0]} "
                              f"(layer '{src}') to {nfeat}, so it cannot compute on a feature slice")


def _src_shapes(node: Node, placed: dict[str, _Placed], cls: type[Layer]) -> list[tuple[int, ...]]:
    kinds = list(cls.input_kinds) or ["data"] * len(node.conf.srclayers)
    return [placed[s].out_shape if k == "data" else () for s, k in zip(node.conf.srclayers, kinds)
            if s in placed]


def _mark_needs_grad(order: list[Node], placed: dict[str, _Placed]) -> None:
    """A layer needs a gradient if it or anything feeding its data inputs has params."""
    for node in order:
        p = placed[node.name]
        any_layer = next(iter(p.layers.values()))
        kinds = list(type(any_layer).input_kinds) or ["data"] * len(node.conf.srclayers)
        p.needs_grad = bool(any_layer.param_specs) or any(
            placed[s].needs_grad for s, k in zip(node.conf.srclayers, kinds) if k == "data" and s in placed)


def _sub_name(node: Node, rank: int, pdim: int) -> str:
    return node.name if pdim == -1 else f"{node.name}@{rank}"


def _needed_region(dst: _Placed, rank: int, src: _Placed, kind: str) -> Region:
    """What dst's sub-layer on ``rank`` needs of src's logical output (seed 004's table).

    Rows: its own rows if dst is split on the batch, else all.  Features: its own
    slice if dst is a OneToOne layer split on features, else all (OneToAll).
    """
    splits_rows = dst.pdim == 0 or (dst.pdim == 1 and type(dst.layers[rank]).feature_split_rows)
    rows = dst.regions[rank].rows if splits_rows else src.rows
    if kind == "aux":
        return Region(rows, (0, 1))
    if dst.pdim == 1 and type(dst.layers[rank]).connection != ONE_TO_ALL:
        return Region(rows, dst.regions[rank].features)
    return Region(rows, (0, src.out_shape[0] if src.out_shape else 1))


def _holder_regions(src: _Placed, kind: str) -> dict[int, Region]:
    if kind == "data":
        return dict(src.regions)
    return {rank: Region(region.rows, (0, 1)) for rank, region in src.regions.items()}


def _connect(cfg: JobConfig, order: list[Node], placed: dict[str, _Placed], nranks: int, messages: bool = False
             ) -> tuple[list[SubLayer], list[Exchange]]:
    """The sub-layers in order with the connection layers of every edge whose ends differ
    (``messages``: every exchange's pieces as point-to-point messages, for a pipeline)."""
    sublayers: list[SubLayer] = []
    exchanges: list[Exchange] = []
    used_names: set[str] = set()
    for node in order:
        dst = placed[node.name]
        cls = type(next(iter(dst.layers.values())))
        kinds = list(cls.input_kinds) or ["data"] * len(node.conf.srclayers)
        # per rank: the names of this layer's inputs on that rank, in srclayers order
        inputs: dict[int, list[str]] = {rank: [] for rank in dst.layers}
        for src_name, kind in zip(node.conf.srclayers, kinds):
            if src_name not in placed:
                continue  # a declared back edge (energy models)
            src = placed[src_name]
            holders = _holder_regions(src, kind)
            needs = {rank: _needed_region(dst, rank, src, kind) for rank in dst.layers}
            if all(rank in holders and holders[rank] == need for rank, need in needs.items()):
                for rank in dst.layers:
                    inputs[rank].append(_sub_name(src.node, rank, src.pdim))
                continue
            exchange, conn_layers = _make_exchange(len(exchanges), src, dst, kind, holders, needs, used_names,
                                                   messages)
            exchanges.append(exchange)
            sublayers.extend(conn_layers)
            receiving = {c.rank: c.name for c in conn_layers if c.role != "bridge_src"}
            for rank in dst.layers:
                inputs[rank].append(receiving[rank])
        src_shapes = _src_shapes(node, placed, cls)
        for rank, layer in sorted(dst.layers.items()):
            region = dst.regions[rank]
            local = (region.nrows,) + layer.local_out_shape() if layer.out_shape else (region.nrows,)
            sublayers.append(SubLayer(
                name=_sub_name(node, rank, dst.pdim), type=node.type_name, rank=rank, origin=node.name,
                srcs=inputs[rank], kinds=kinds[:len(inputs[rank])], region=region, out_shape=local,
                pdim=dst.pdim, params=[_shard(spec, cls) for spec in layer.param_specs],
                needs_grad=dst.needs_grad, batch_slice=layer.ctx.batch_slice,
                feature_slice=layer.ctx.feature_slice, src_shapes=list(src_shapes),
                row_group=_row_group(dst, cls), statistics_blocks=_statistics_blocks(dst, cls, layer)))
    return sublayers, exchanges


def _row_group(placed: _Placed, cls: type[Layer]) -> tuple[int, ...]:
    """The workers that split a batch-statistics layer's rows (empty: one sub-layer holds them all)."""
    if not cls.batch_statistics or len(placed.layers) < 2 or placed.pdim != 0:
        return ()
    return tuple(sorted(placed.layers))


def _statistics_blocks(placed: _Placed, cls: type[Layer], layer: Layer) -> int:
    """The canonical blocks of the batch a split batch-statistics layer's sums carry (deterministic
    mode), else 1."""
    block_rows = layer.ctx.block_rows
    if not _row_group(placed, cls) or block_rows is None:
        return 1
    return -(-layer.ctx.global_batch // block_rows)


def _shard(spec, cls: type[Layer]) -> ParamShard:
    return ParamShard(spec.conf.share_from or spec.conf.name, spec.logical_shape, spec.shard, spec.batch_factored,
                      spec.trained, cls.terms_for(spec.role))


def _make_exchange(eid: int, src: _Placed, dst: _Placed, kind: str, holders: dict[int, Region],
                   needs: dict[int, Region], used_names: set[str], messages: bool = False
                   ) -> tuple[Exchange, list[SubLayer]]:
    nfeat = src.out_shape[0] if (src.out_shape and kind == "data") else 1
    full = Region(src.rows, (0, nfeat))
    type_name, fwd, bwd = classify(holders, needs, full)
    if messages:
        fwd, bwd = MESSAGES
    rest = tuple(src.out_shape[1:]) if kind == "data" else ()
    group = tuple(sorted(set(holders) | set(needs)))
    with_backward = kind == "data" and src.needs_grad
    exchange = Exchange(eid, src.node.name, dst.node.name, kind, fwd, bwd if kind == "data" else None, group,
                        holders, needs, rest, with_backward)
    if type_name == "kBridge":
        (s_rank,), (d_rank,) = holders, needs
        label = f"{_sub_name(src.node, s_rank, src.pdim)}->{_sub_name(dst.node, d_rank, dst.pdim)}"
        if kind == "aux":
            label += ".label"
        src_sub = _sub_name(src.node, s_rank, src.pdim)
        common = dict(origin=None, exchange=exchange, needs_grad=with_backward, kinds=[kind])
        return exchange, [
            SubLayer(f"bridge_src({label})", "kBridgeSrc", s_rank, srcs=[src_sub],
                     region=holders[s_rank], out_shape=_local_shape(holders[s_rank], rest, kind),
                     role="bridge_src", **common),
            SubLayer(f"bridge_dst({label})", "kBridgeDst", d_rank, srcs=[],
                     region=needs[d_rank], out_shape=_local_shape(needs[d_rank], rest, kind),
                     role="bridge_dst", **{**common, "kinds": []}),
        ]
    base = {"kSplit": f"split({src.node.name})", "kSlice": f"slice({src.node.name})"}.get(type_name)
    if base is None:
        inner = "split" if fwd in ("Allgatherv",) else "slice"
        base = f"concate({inner}({src.node.name}))" if len(needs) > 1 else f"concate({src.node.name})"
    if kind == "aux":
        base = f"{base}.label"
    if base in used_names:  # the same source feeds several differently placed layers
        base = f"{base}[{dst.node.name}]"
    used_names.add(base)
    conn = []
    for rank in group:
        srcs = [_sub_name(src.node, rank, src.pdim)] if rank in holders else []
        region = needs.get(rank)
        conn.append(SubLayer(
            f"{base}@{rank}" if len(group) > 1 else base, type_name, rank, None, srcs, [kind] * len(srcs),
            region or Region((0, 0), (0, 0)), _local_shape(region, rest, kind) if region else (0,),
            exchange=exchange, role="collective", needs_grad=with_backward))
    return exchange, conn


def _local_shape(region: Region, rest: tuple[int, ...], kind: str) -> tuple[int, ...]:
    if kind == "aux":
        return (region.nrows,)
    return (region.nrows, region.nfeatures) + tuple(rest)


def _check_every_rank_busy(cfg: JobConfig, sublayers: list[SubLayer], nranks: int) -> None:
    busy = {s.rank for s in sublayers if s.origin is not None}
    idle = [r for r in range(nranks) if r not in busy]
    if idle:  # no one layer's fault: the net's place in the job
        raise ConfigError(
            f"{cfg.where('neuralnet')}: worker(s) {_runs(idle)} of {nranks} would run no layer: expected every worker to "
            f"own part of the net (use fewer workers, partition_dim 0/1, or location to place layers there)")


def _runs(ranks: list[int]) -> str:
    """``[1, 2, 5, 6, 7, 8]`` as ``1, 2, 5..8``: a run of three or more ranks as its ends, so that a line
    naming the idle workers of ``-n 1024`` stays one short line."""
    runs: list[list[int]] = []
    for rank in ranks:
        if runs and rank == runs[-1][-1] + 1:
            runs[-1].append(rank)
        else:
            runs.append([rank])
    return ", ".join(f"{run[0]}..{run[-1]}" if len(run) > 2 else ", ".join(map(str, run)) for run in runs)


def _param_syncs(cfg: JobConfig, placed: dict[str, _Placed], sublayers: list[SubLayer]) -> list[ParamSync]:
    """Group identical shards held on several ranks; reject overlapping but different shards."""
    holders: dict[tuple[str, tuple], set[int]] = {}
    shapes: dict[str, dict[tuple, str]] = {}
    for sub in sublayers:
        for shard in sub.params:
            holders.setdefault((shard.name, shard.offsets), set()).add(sub.rank)
            shapes.setdefault(shard.name, {}).setdefault(shard.offsets, sub.name)
    frozen = frozen_params(cfg.proto) | untrained_params(sublayers)  # never updated: nothing to sum
    for name, shards in shapes.items():
        clash = _first_overlap(list(shards))
        if clash is not None:
            a, b = clash
            raise ConfigError(
                f"param {name!r} is partitioned differently by {shards[a]} ({_fmt(a)}) and "
                f"{shards[b]} ({_fmt(b)}): expected the layers sharing it to use the same partition_dim")
    syncs = []
    for (name, offsets), ranks in sorted(holders.items()):
        if len(ranks) > 1 and name not in frozen:
            syncs.append(ParamSync(name, offsets, tuple(sorted(ranks)), math.prod(hi - lo for lo, hi in offsets)))
    return syncs


def _first_overlap(boxes: list[tuple[tuple[int, int], ...]]) -> tuple | None:
    """Two distinct boxes (``(lo, hi)`` per axis) that overlap, or None.

    A sweep along the axis with the most distinct intervals (a feature split's axis: its shards
    are disjoint there, so at most one is open at a time): O(n log n) for the shards a plan makes,
    where comparing every pair grew as ranks^2 per param."""
    if len(boxes) < 2:
        return None
    axis = max(range(len(boxes[0])), key=lambda a: len({box[a] for box in boxes}))
    open_boxes: list[tuple[tuple[int, int], ...]] = []
    for box in sorted(boxes, key=lambda b: (b[axis][0], b)):
        open_boxes = [o for o in open_boxes if o[axis][1] > box[axis][0]]
        for other in open_boxes:
            if all(max(x[0], y[0]) < min(x[1], y[1]) for x, y in zip(other, box)):
                return (min(other, box), max(other, box))
        open_boxes.append(box)
    return None


def untrained_params(sublayers: list[SubLayer]) -> set[str]:
    """Names of params the layers write themselves (batch norm's running statistics)."""
    return {shard.name for sub in sublayers for shard in sub.params if not shard.trained}


def _fmt(offsets) -> str:
    return "[" + ", ".join(f"{lo}:{hi}" for lo, hi in offsets) + "]"
