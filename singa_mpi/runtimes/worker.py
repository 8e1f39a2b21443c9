"""One worker per MPI rank: build this rank's part of the plan and run it.

The worker whose rank is ``r`` builds the sub-layers the plan places on ``r``
(in the plan's global order, so sub-communicators are created in the same order
everywhere), allocates their parameter shards from the logical initial values,
and joins the step's exchanges.  Replicated parameter shards (batch-partitioned
layers, shared params) have their gradients summed with bucketed Iallreduce,
started during the backward pass as soon as a bucket's layers are done.
"""
from __future__ import annotations

import os
import re

from singa_mpi.config.load import JobConfig
from singa_mpi.errors import ConfigError
from singa_mpi.layers.connection import ExchangeLayer
from singa_mpi.net import Net, Wire
from singa_mpi.params import GradientQueue, Param, make_param
from singa_mpi.planner import plan as make_plan
from singa_mpi.planner.plan import Plan
from singa_mpi.planner.schedule import digest, schedule_lines
from singa_mpi.proto import job_pb2
from singa_mpi.sync.allreduce import GradientBuckets
from singa_mpi.sync.shared_memory import SharedMemoryGradients


class WorkerRuntime:
    """Trainer runtime for an MPI world of ``comm.size`` workers."""

    def __init__(self, cfg: JobConfig, seed: int, workspace: str, comm):
        self.cfg, self.seed, self.workspace, self.comm = cfg, seed, workspace, comm
        self.rank, self.size = comm.rank, comm.size
        self.is_root = self.rank == 0
        self.shared: dict[tuple, Param] = {}
        self.plans: dict[str, Plan] = {}
        self.buckets: dict[int, GradientBuckets] = {}
        self.shm: SharedMemoryGradients | None = None
        self._one_node: bool | None = None

    # -------------------------------------------------------------- building
    def plan_all(self, phases: list[str]) -> None:
        """Plan every phase (pure, no communication): errors surface before any MPI call."""
        for phase in phases:
            self.plans[phase] = make_plan(self.cfg, self.size, phase, seed=self.seed, workspace=self.workspace)

    def begin_step(self, step: int) -> None:
        self.comm.step = step

    def build_net(self, phase: str) -> Net:
        if phase not in self.plans:
            self.plan_all([phase])
        the_plan = self.plans[phase]
        owner_confs = {spec.conf.name: spec.conf for sub in the_plan.sublayers if sub.layer is not None
                       for spec in sub.layer.param_specs if not spec.conf.share_from}
        by_name: dict[str, Layer] = {}
        wires = []
        for sub in the_plan.sublayers:
            if sub.rank != self.rank:
                continue
            if sub.origin is None:
                layer = ExchangeLayer(sub, self.comm, job_pb2.LayerProto(name=sub.name))
            else:
                layer = sub.layer
                layer.params = [self._param(spec, owner_confs) for spec in layer.param_specs]
            by_name[sub.name] = layer
            wires.append(Wire(layer, [by_name[s] for s in sub.srcs], list(sub.kinds), needs_grad=sub.needs_grad))
        net = Net(wires)
        if phase == "train":
            self._setup_buckets(net, the_plan)
            self._setup_queue(net, the_plan)
        return net

    def _setup_queue(self, net: Net, the_plan: Plan) -> None:
        """Weight gradients of params that no other rank sums with (feature shards, params of
        unpartitioned layers) wait in a queue for the next backward exchange to hide behind.
        Replicated params are left alone: their sums start as soon as their gradients are final."""
        synced = {(s.name, s.offsets) for s in the_plan.param_syncs}
        queue = GradientQueue()
        for param in net.params:
            if (param.name, param.shard) not in synced and param.factors is None:
                param.queue = queue
        for layer in net.layers:
            if isinstance(layer, ExchangeLayer):
                layer.queue = queue

    def _param(self, spec, owner_confs) -> Param:
        name = spec.conf.share_from or spec.conf.name
        key = (name, spec.shard)
        if key not in self.shared:
            self.shared[key] = make_param(owner_confs[name], spec.logical_shape, spec.shard, self.seed)
        return self.shared[key]

    def _setup_buckets(self, net: Net, the_plan: Plan) -> None:
        """Replicated params: node-shared memory when the whole world is one node, else Iallreduce."""
        params = {(p.name, p.shard): p for p in net.params}
        everyone = tuple(range(self.size))
        if self._one_node is None:
            # SINGA_MPI_SHM=0 forces the message path (bucketed Iallreduce) even on one node
            self._one_node = os.environ.get("SINGA_MPI_SHM", "1") != "0" and self.comm.on_one_node()
        syncs = the_plan.param_syncs
        uses: dict[int, int] = {}
        for layer in net.layers:
            for p in layer.params:
                uses[id(p)] = uses.get(id(p), 0) + 1
        if self._one_node:
            world_params = [params[(s.name, s.offsets)] for s in syncs if s.ranks == everyone]
            if world_params:
                self.shm = SharedMemoryGradients(self.comm, world_params,
                                                 self._batch_rows(net, world_params, uses))
            syncs = [s for s in syncs if s.ranks != everyone]
        order = list(dict.fromkeys(shard.name for sub in the_plan.sublayers for shard in sub.params))
        self.buckets[id(net)] = GradientBuckets(self.comm, syncs, params, uses, order)

    def _batch_rows(self, net: Net, world_params: list[Param], uses: dict[int, int]) -> dict[int, list[int]]:
        """Which replicated params can be summed from their gradient factors, and each rank's rows.

        A param qualifies when, on every rank, exactly one local layer uses it and declares its
        gradient batch-factored (see ``ParamSpec.batch_factored``).  Collective (setup only).
        """
        rows_here: dict[tuple, int] = {}
        for layer in net.layers:
            for spec, param in zip(layer.param_specs, layer.params):
                if spec.batch_factored and uses[id(param)] == 1 and param.data.ndim == 2:
                    lo, hi = layer.ctx.rows()
                    rows_here[(param.name, param.shard)] = hi - lo
        everyone = self.comm.allgather_object(rows_here, "setup(factored params)")
        batch_rows = {}
        for param in world_params:
            key = (param.name, param.shard)
            if all(key in theirs for theirs in everyone):
                batch_rows[id(param)] = [theirs[key] for theirs in everyone]
        return batch_rows

    def check_agreement(self) -> None:
        """All ranks must hold the same plan: compare schedule digests before step 1,
        and on a mismatch name the first differing entry."""
        lines = [line for _, the_plan in sorted(self.plans.items()) for line in schedule_lines(the_plan)]
        everyone = self.comm.allgather_object(digest(lines))
        if len(set(everyone)) == 1:
            return
        schedules_of = self.comm.allgather_object(lines)  # small: one line per communication call
        for rank, theirs in enumerate(schedules_of):
            if theirs != lines:
                first = next((i for i, (a, b) in enumerate(zip(lines, theirs)) if a != b), min(len(lines), len(theirs)))
                mine = lines[first] if first < len(lines) else "(nothing)"
                other = theirs[first] if first < len(theirs) else "(nothing)"
                raise ConfigError(f"rank {rank} planned a different communication schedule than rank {self.rank}: "
                                  f"entry {first} is '{other}' there and '{mine}' here: expected every rank to "
                                  f"read the same job configuration")

    # -------------------------------------------------------------- steps
    def owned_params(self, net: Net) -> list[Param]:
        """What this rank updates: its chunks of node-shared params, and all its other params."""
        if self.shm is None:
            return net.params
        shared = {id(p) for p in self.shm.params}
        return list(self.shm.views) + [p for p in net.params if id(p) not in shared]

    def gradient_hook(self, net: Net):
        buckets = self.buckets.get(id(net))
        return buckets.layer_done if buckets and buckets.buckets else None

    def reduce_gradients(self, net: Net) -> None:
        self.comm.direction = "params"
        buckets = self.buckets.get(id(net))
        if buckets is not None:
            buckets.finish()
        if self.shm is not None:
            self.shm.reduce()

    def finish_update(self) -> None:
        if self.shm is not None:
            self.shm.publish()

    def reduce_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        return self.comm.allreduce_dict(metrics)

    def comm_seconds(self) -> float:
        return self.comm.comm_seconds()

    def report(self, steps: int) -> str | None:
        """Per connection layer and for parameter averaging: calls, bytes and ms per step on each rank
        (the table printed at the end of a run; collective, returns the text on rank 0)."""
        merged: dict[str, tuple[int, int, float]] = {}
        for label, a in self.comm.accounts.items():  # one row per connection layer, not per sub-layer
            key = re.sub(r"@\d+$", "", label)
            calls, nbytes, seconds = merged.get(key, (0, 0, 0.0))
            merged[key] = (calls + a.calls, nbytes + a.bytes, seconds + a.seconds)
        rows = self.comm.gather_object(merged)
        if rows is None or steps <= 0:
            return None
        labels = sorted({label for per_rank in rows for label in per_rank})
        lines = [f"communication per step over {steps} steps (per rank: MiB sent+received / ms):",
                 f"  {'layer':<38}" + "".join(f"{'rank ' + str(r):>18}" for r in range(len(rows)))]
        for label in labels:
            cells = []
            for per_rank in rows:
                calls, nbytes, seconds = per_rank.get(label, (0, 0, 0.0))
                cells.append(f"{nbytes / steps / 2**20:>9.2f} /{1e3 * seconds / steps:>6.2f}" if calls else f"{'-':>16}")
            lines.append(f"  {label:<38}" + "".join(f"{c:>18}" for c in cells))
        return "\n".join(lines)

    def contributes(self, param: Param) -> bool:
        """Whether this rank is the one that reports ``param``'s shard (its lowest holder)."""
        if not hasattr(self, "_lowest_holder"):
            lowest: dict[tuple, int] = {}
            for sub in self.plans["train"].sublayers:
                for shard in sub.params:
                    key = (shard.name, shard.offsets)
                    lowest[key] = min(lowest.get(key, sub.rank), sub.rank)
            self._lowest_holder = lowest
        return self._lowest_holder.get((param.name, param.shard), self.rank) == self.rank

    def gather_object(self, value):
        return self.comm.gather_object(value)

    def any(self, flag: bool) -> bool:
        return self.comm.any(flag)
