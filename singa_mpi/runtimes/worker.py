"""One worker of a group: build this worker's part of the plan and run it.

The worker whose location ID is ``r`` (its rank in the group communicator)
instantiates the sub-layers the plan places on ``r`` from their specs (in the
plan's global order, so sub-communicators are created in the same order
everywhere), allocates their parameter shards from the logical initial values,
and joins the step's exchanges.  Replicated parameter shards are synchronised
by the strategies of :mod:`singa_mpi.sync`: node-shared memory when the whole
group is on one node (``SINGA_MPI_SHM=0`` turns it off), bucketed Iallreduce
otherwise and for shards a subset of the workers holds.
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable

import numpy as np

from singa_mpi import plugins
from singa_mpi.algorithms import frozen_params, make_algorithm
from singa_mpi.checkpoints.hdf5 import not_written, write_whole
from singa_mpi.config.load import JobConfig
from singa_mpi.cost.beside import Prediction, predict_plan
from singa_mpi.errors import ConfigError, SingaError
from singa_mpi.layers.base import Layer, LayerContext, layer_class_of
from singa_mpi.runtimes.exchange import ExchangeLayer
from singa_mpi.net import Net, Wire
from singa_mpi.params import GradientQueue, Param, make_param
from singa_mpi.progress import communication_table
from singa_mpi.planner import ALLREDUCE, SHARED_MEMORY, partition
from singa_mpi.planner.plan import Plan, SubLayer, untrained_params
from singa_mpi.planner.schedule import digest, schedule_lines, table_label
from singa_mpi.planner.syncs import (DETERMINISTIC, DETERMINISTIC_SHARED, buckets, factored_rows, forming_tiles,
                                     gathered_rows, shared_memory_syncs)
from singa_mpi.program.build import SERVERS, program
from singa_mpi.program.job import JobPrograms, job_programs
from singa_mpi.program.passes import connection_calls
from singa_mpi.program.schedules import pipeline_shape
from singa_mpi.program.units import units_of_plan
from singa_mpi.proto import job_pb2
from singa_mpi.sync.allreduce import AllreduceSync
from singa_mpi.sync.base import FrozenParams, LocalSync, Synchronizer
from singa_mpi.sync.deterministic import DeterministicSync, SharedDeterministicSync, TermsForServers
from singa_mpi.sync.hogwild import GroupDeltaSync, SharedHogwild
from singa_mpi.sync.servers import ServerSync
from singa_mpi.sync.shared_memory import SharedMemorySync, shared_memory_enabled
from singa_mpi.topology import Role, Topology


@dataclasses.dataclass
class Place:
    """Where a worker's group sits in a job of several groups or with servers (the launcher makes it).

    world: the job's communicator (servers and every group); topo, role: from
    :func:`singa_mpi.topology.topology`; peers: the workers of the other groups with this worker's
    location ID (Hogwild's exchanges), or None."""

    world: object
    topo: Topology
    role: Role
    peers: object | None = None  # Hogwild's exchanges: the same location ID in every group
    node: object | None = None  # in-memory Hogwild: every rank of the job, on one node
    sync_freq: int = 1

    @property
    def groups(self) -> int:
        return len(self.topo.worker_groups)

    @property
    def has_servers(self) -> bool:
        return self.topo.servers_separate

    @property
    def hogwild(self) -> bool:
        return not self.topo.servers_separate and self.groups > 1


NO_PREDICTION_FOR_GROUPS = ("no prediction: the cost model prices one group of workers without server ranks "
                            "(this job has several groups or servers)")


class WorkerRuntime:
    """Trainer runtime of one worker in a group of ``comm.size`` workers (``comm``: the group's).

    ``place``: the group's place among several groups or beside server ranks (None: the only group,
    its params synchronised among its workers).  Only group 0 evaluates and writes: its root is
    the job's root."""

    def __init__(self, cfg: JobConfig, seed: int, workspace: str, comm, programs: JobPrograms | None = None,
                 place: Place | None = None):
        self.cfg, self.seed, self.workspace, self.comm = cfg, seed, workspace, comm
        self.rank, self.size = comm.rank, comm.size
        self.place = place
        self.group = place.role.group if place is not None else 0
        self.groups = place.groups if place is not None else 1
        self.evaluates = self.group == 0  # test and validation: group 0's (SINGA's)
        self.is_root = self.rank == 0 and self.group == 0
        self.tracer = comm.tracer
        self.shared: dict[tuple, Param] = {}
        # the launch's plans and proved programs (a worker built by hand plans its phases itself)
        self.programs = programs
        self.plans: dict[str, Plan] = dict(programs.plans) if programs is not None else {}
        self.method: str | None = None  # how world-replicated params sync; chosen in build_net("train")
        self._sync: Synchronizer | None = None
        self.nets: list[Net] = []

    # -------------------------------------------------------------- agreement
    def check_agreement(self) -> None:
        """All workers must hold the same plan, computed by the same plugins: compare the plugins'
        fingerprints and the schedule digests before step 1, and on a mismatch name what differs."""
        method, algorithm = self.method or SHARED_MEMORY, make_algorithm(self.cfg.proto.train_one_batch)
        lines = [line for _, the_plan in sorted(self.plans.items())
                 for line in schedule_lines(the_plan, method, algorithm)]
        mine = (plugins.fingerprints(), digest(lines))
        everyone = self.comm.allgather_object(mine)
        for rank, (loaded, _) in enumerate(everyone):
            if loaded != mine[0]:
                raise ConfigError(f"worker {rank} loaded plugins [{', '.join(loaded)}] and worker {self.rank} "
                                  f"[{', '.join(mine[0])}] (module and file digest): expected every worker to load "
                                  f"the same plugin code")
        if len({plan_digest for _, plan_digest in everyone}) == 1:
            return
        schedules_of = self.comm.allgather_object(lines)  # small: one line per communication call
        for rank, theirs in enumerate(schedules_of):
            if theirs != lines:
                first = next((i for i, (a, b) in enumerate(zip(lines, theirs)) if a != b), min(len(lines), len(theirs)))
                mine = lines[first] if first < len(lines) else "(nothing)"
                other = theirs[first] if first < len(theirs) else "(nothing)"
                raise ConfigError(f"worker {rank} planned a different communication schedule than worker "
                                  f"{self.rank}: entry {first} is '{other}' there and '{mine}' here: expected "
                                  f"every worker to read the same job configuration")

    # -------------------------------------------------------------- building
    def begin_step(self, step: int) -> None:
        self.tracer.step = step
        status = getattr(self.comm, "status", None)  # the rank's liveness record: a dead rank's last step
        if status is not None:
            status.set_step(step)

    def build_net(self, phase: str) -> Net:
        if phase not in self.plans:
            self.plans.update(job_programs(self.cfg, self.size, [phase]).plans)
        the_plan = self.plans[phase]
        by_name: dict[str, Layer] = {}
        wires = []
        for sub in the_plan.sublayers:
            if sub.rank != self.rank:
                continue
            if sub.origin is None:
                layer = ExchangeLayer(sub, self.comm, job_pb2.LayerProto(name=sub.name), connection_calls(sub))
            else:
                layer = self._instantiate(the_plan, sub)
            by_name[sub.name] = layer
            wires.append(Wire(layer, [by_name[s] for s in sub.srcs], list(sub.kinds), needs_grad=sub.needs_grad))
        net = Net(wires, self.tracer, names=list(by_name))
        net.units = units_of_plan(the_plan, self.rank)
        self.nets.append(net)
        if phase == "train":
            self.method = self._choose_method()
            self._sync = self._make_sync(net, the_plan)
            self._setup_queue(net, the_plan)
        net.program = self._program(phase, the_plan)
        return net

    def _program(self, phase: str, the_plan: Plan):
        """The step this rank runs: the program the pre-flight checks proved and digested."""
        servers = self.place is not None and self.place.has_servers
        method = SERVERS if servers else self.method or SHARED_MEMORY
        if self.programs is not None and (phase, method) in self.programs.programs:
            return self.programs.program(phase, method, self.rank)
        return program(the_plan, self.rank, make_algorithm(self.cfg.proto.train_one_batch), method)

    def _choose_method(self) -> str:
        """The launch's choice; a worker built by hand asks its group: shared memory when every
        worker of the group is on this node (collective).  Not for a group of distributed Hogwild:
        its exchanges write every replica, which node-shared chunks cannot take."""
        if self.programs is not None and self.programs.method not in (None, SERVERS):
            return self.programs.method
        if self.plans.get("train") is not None and self.plans["train"].deterministic is not None:
            return DETERMINISTIC_SHARED if shared_memory_enabled() and self.comm.on_one_node() else DETERMINISTIC
        if not shared_memory_enabled() or (self.place is not None and self.place.hogwild):
            return ALLREDUCE
        return SHARED_MEMORY if self.comm.on_one_node() else ALLREDUCE

    def _instantiate(self, the_plan: Plan, sub: SubLayer) -> Layer:
        """The sub-layer from its spec: class, context (slices), setup, params."""
        node = the_plan.origins[sub.origin]
        ctx = LayerContext(global_batch=the_plan.batch, batch_slice=sub.batch_slice,
                           feature_slice=sub.feature_slice, seed=self.seed, workspace=self.workspace,
                           phase=the_plan.phase,
                           stream=(self.group, self.groups),
                           block_rows=the_plan.deterministic.block_rows if the_plan.deterministic else None)
        if sub.row_group:  # batch statistics summed over the workers holding the batch's rows
            ctx.allreduce = self._row_sum(sub)
        layer = layer_class_of(node.conf)(node.conf, ctx)
        layer.out_shape = tuple(layer.setup(sub.src_shapes))
        layer.params = [self._param(the_plan, spec) for spec in layer.param_specs]
        return layer

    def _row_sum(self, sub: SubLayer):
        """sum(array) over ``sub.row_group`` (the communicator is made now, in the plan's order)."""
        comm, label = self.comm.sub(sub.row_group), f"{sub.origin}(statistics)"

        def allreduce(array: np.ndarray) -> np.ndarray:
            total = np.ascontiguousarray(array, np.float64)
            comm.Allreduce(total, label)
            return total
        return allreduce

    def _param(self, the_plan: Plan, spec) -> Param:
        """This worker's shard of a param, shared by every layer and phase that uses it."""
        name = spec.conf.share_from or spec.conf.name
        key = (name, spec.shard)
        if key not in self.shared:
            owner = next(p for node in the_plan.origins.values() for p in node.conf.param
                         if p.name == name and not p.share_from)
            self.shared[key] = make_param(owner, spec.logical_shape, spec.shard, self.seed)
        return self.shared[key]

    def _make_sync(self, net: Net, the_plan: Plan) -> Synchronizer:
        """Node-shared memory for params every worker holds (one node), buckets for params a
        subset holds (or all, off one node), local updates for the rest; with server ranks, the
        servers for every trained param."""
        params = {(p.name, p.shard): p for p in net.params}
        uses: dict[int, int] = {}
        for layer in net.layers:
            for p in layer.params:
                uses[id(p)] = uses.get(id(p), 0) + 1
        if self.place is not None and self.place.has_servers:
            return self._server_sync(net, the_plan, params, uses)
        if self.place is not None and self.place.node is not None:  # in-memory Hogwild: one worker per group
            frozen = frozen_params(self.cfg.proto) | untrained_params(the_plan.sublayers)
            return Synchronizer([SharedHogwild(self.place.node, [p for p in net.params if p.name not in frozen],
                                               self.group, self.place.groups),
                                 FrozenParams([p for p in net.params if p.name in frozen])], self.tracer)
        strategies = []
        gathered = gathered_rows(the_plan, self.method)
        if gathered:
            keys = [key for key in gathered if key in params]
            if len(keys) != len(gathered):  # every worker holds every world-replicated shard
                raise RuntimeError(f"rank {self.comm.rank} lacks world-replicated params the plan gathers: "
                                   f"{sorted(key[0] for key in gathered if key not in params)}")
            tiles = forming_tiles(the_plan, self.method)
            kind = SharedDeterministicSync if self.method == DETERMINISTIC_SHARED else DeterministicSync
            strategies.append(kind(self.comm, [params[key] for key in keys], [gathered[key] for key in keys],
                                                [tiles[key] for key in keys]))
        in_shm = [params[(s.name, s.offsets)] for s in shared_memory_syncs(the_plan, self.method)]
        if in_shm:
            rows = factored_rows(the_plan)
            batch_rows = {id(params[key]): per_rank for key, per_rank in rows.items() if key in params}
            strategies.append(SharedMemorySync(self.comm, in_shm, batch_rows))
        bucketed = AllreduceSync(self.comm, buckets(the_plan, self.method), params, uses)
        if bucketed.buckets:
            strategies.append(bucketed)
        synced = {id(p) for p in in_shm} | {id(p) for p in bucketed.params}
        synced |= {id(params[key]) for key in gathered if key in params}
        frozen = frozen_params(self.cfg.proto) | untrained_params(the_plan.sublayers)  # the plan syncs none
        rest = [p for p in net.params if id(p) not in synced]
        strategies.append(LocalSync([p for p in rest if p.name not in frozen]))
        if self.place is not None and self.place.hogwild:  # the groups' copies meet every sync_freq updates
            updated = [p for strategy in strategies for p in strategy.owned()]
            strategies.append(GroupDeltaSync(self.place.peers, self.place.world, updated, self.place.sync_freq))
        strategies.append(FrozenParams([p for p in rest if p.name in frozen]))
        return Synchronizer(strategies, self.tracer)

    def _server_sync(self, net: Net, the_plan: Plan, params: dict, uses: dict[int, int]) -> Synchronizer:
        """Every trained param through the group's server ranks; frozen ones stay as they are."""
        from singa_mpi.planner.servers import pieces, server_ranges, trained_params

        place = self.place
        frozen = frozen_params(self.cfg.proto) | untrained_params(the_plan.sublayers)
        servers = place.topo.server_groups[0]
        ranges = server_ranges(trained_params(the_plan, frozen), len(servers))
        mine = [p for p in pieces(the_plan, ranges) if p.worker == self.rank]
        served = ServerSync(place.world, servers, mine, params, uses, asynchronous=place.groups > 1,
                            group=place.topo.worker_groups[place.role.group],
                            former=self._terms_for_servers(the_plan, params))
        rest = [p for p in net.params if id(p) not in {id(q) for q in served.params}]
        return Synchronizer([served, FrozenParams(rest)], self.tracer)

    def _terms_for_servers(self, the_plan: Plan, params: dict) -> TermsForServers | None:
        """Deterministic mode beside servers: the gathering and forming of the gradients the group's
        workers send (None in the default mode)."""
        gathered = gathered_rows(the_plan, SERVERS)
        if not gathered:
            return None
        keys = list(gathered)
        tiles = forming_tiles(the_plan, SERVERS)
        return TermsForServers(self.comm, [params[key] for key in keys], [gathered[key] for key in keys],
                               [tiles[key] for key in keys])

    def begin_training(self, loaded, check_finite: bool) -> None:
        """Before the first step: the job's root gives the servers their initial state (``loaded``:
        the (checkpoint, full) the trainer restored, or None)."""
        if self.place is not None and self.place.has_servers and self.is_root:
            self._sync.strategies[0].start(loaded, check_finite)
        for strategy in self._sync.strategies if self._sync is not None else []:
            if isinstance(strategy, GroupDeltaSync):  # the exchanges count changes from what training starts at
                strategy.restart()

    def server_state(self, final: bool) -> list[dict] | None:
        """The servers' params and updater state (the root, for a checkpoint), or None without servers."""
        if self.place is None or not self.place.has_servers:
            return None
        return self._sync.strategies[0].snapshot(final)

    def group_steps(self, served: list[dict] | None) -> list[int] | None:
        """Each group's steps in this run: the most any server applied of it (Downpour), or the counts
        beside in-memory Hogwild's values; None for one group, or distributed Hogwild's (one pace: they
        exchange every sync_freq steps, so a checkpoint's step is every group's)."""
        if self.place is None or self.place.groups == 1:
            return None
        if served is not None:
            return [max(steps) for steps in zip(*(part["steps"] for part in served))]
        strategy = self._sync.strategies[0] if self._sync is not None else None
        return strategy.group_steps() if isinstance(strategy, SharedHogwild) else None

    def _setup_queue(self, net: Net, the_plan: Plan) -> None:
        """Weight gradients of params that no other worker sums with (feature shards, params of
        unpartitioned layers) wait in a queue for the next backward exchange to hide behind.
        Replicated params are left alone: their sums start as soon as their gradients are final."""
        synced = {(s.name, s.offsets) for s in the_plan.param_syncs}
        queue = GradientQueue()
        for param in net.params:
            if (param.name, param.shard) not in synced and param.factors is None:
                param.queue = queue
        net.queue = queue

    # -------------------------------------------------------------- steps
    def sync(self) -> Synchronizer:
        return self._sync

    def owned_params(self) -> list[Param]:
        return self._sync.owned() if self._sync is not None else []

    def reduce_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        return self.comm.allreduce_dict(metrics)

    def comm_seconds(self) -> float:
        return self.tracer.seconds("comm")

    def contributes(self, param: Param) -> bool:
        """Whether this worker is the one that reports ``param``'s shard (its lowest holder)."""
        if not hasattr(self, "_lowest_holder"):
            lowest: dict[tuple, int] = {}
            for sub in self.plans["train"].sublayers:
                for shard in sub.params:
                    key = (shard.name, shard.offsets)
                    lowest[key] = min(lowest.get(key, sub.rank), sub.rank)
            self._lowest_holder = lowest
        return self._lowest_holder.get((param.name, param.shard), self.rank) == self.rank

    def gather_object(self, value):
        """Every worker's ``value`` on the group's root (None elsewhere); only group 0's root (the
        job's root, ``is_root``) writes what it gathers."""
        return self.comm.gather_object(value)

    def gather_groups(self, value) -> list | None:
        """Every group's ``value`` on group 0's worker of this location ID, over Hogwild's exchange
        communicator (the same location ID in every group, in group order), where the groups keep one
        pace: distributed Hogwild's exchanges and stop votes are collective, so every group checkpoints
        after the same steps.  Downpour's and in-memory Hogwild's groups go at their own pace: None."""
        if self.place is None or self.place.peers is None:
            return None
        return self.place.peers.gather_object(value, label="gather(group states)")

    def allgather_object(self, value) -> list:
        """Every worker's ``value`` on every worker of the group (the timeline's clock origin)."""
        return self.comm.allgather_object(value)

    def any(self, flag: bool) -> bool:
        """True on every worker of the group if ``flag`` is on any."""
        return self.comm.any(flag)

    def vote_to_stop(self, flag: bool, signal: int | None = None, nonfinite: bool = False,
                     look: Callable[[], bool] | None = None) -> bool:
        """The trainer's vote after each step; distributed Hogwild's groups must stop together (their
        exchanges are collective): they vote at the exchanges only, every worker of every group (and
        learn the stop ``signal`` a rank of another group received, and whether one found a NaN, also
        by ``look`` once the stop is agreed)."""
        for strategy in self._sync.strategies if self._sync is not None else []:
            if isinstance(strategy, GroupDeltaSync):
                return strategy.vote(flag, signal, nonfinite, look)
        return self.any(flag)

    def barrier(self) -> None:
        self.comm.barrier()

    # -------------------------------------------------------------- the end of a run
    def pipeline(self) -> tuple[str, int, int, float] | None:
        """(schedule, micro-batches, stages, idle share of its timeline) of this group's pipelined
        training step, else None."""
        the_plan = self.plans.get("train")
        if the_plan is None or the_plan.pipeline is None:
            return None
        return pipeline_shape(the_plan)

    def predict_step(self) -> Prediction | str | None:
        """The cost model's training step for this run's plan, on the root: a :class:`Prediction`, or a
        line saying why there is none; None elsewhere.  Collective: the other workers wait asleep while
        the root times kernels (spinning in a blocking call they would take the cores it times on)."""
        if self.place is not None:
            return NO_PREDICTION_FOR_GROUPS if self.is_root else None
        nodes = -(-self.size // self.comm.node_size())
        found = None
        if self.is_root:
            try:
                the_plan = self.plans.get("train") or partition(self.cfg, self.size, "train")
                found = predict_plan(the_plan, self.method or SHARED_MEMORY, nodes)
            except (SingaError, OSError) as err:  # the run itself succeeded: a line, not a failure
                found = f"no prediction: {err}"
        self.comm.root_value(None, "prediction")
        return found

    def measured(self) -> dict[str, tuple[int, int, float]]:
        """This worker's communication so far, one row per connection layer or sync
        (calls, bytes, seconds), read from the tracer."""
        merged: dict[str, tuple[int, int, float]] = {}
        for label, total in self.tracer.by_name("comm").items():
            key = table_label(label)
            calls, nbytes, seconds = merged.get(key, (0, 0, 0.0))
            merged[key] = (calls + total.calls, nbytes + total.bytes, seconds + total.seconds)
        return merged

    def report(self, steps: int, debug: bool = False) -> str | None:
        """Per connection layer and sync: MiB and ms per step on each worker (the table printed at
        the end of a run, its bookkeeping rows only with ``debug``; every row is written to
        WORKSPACE/communication.json; collective, root returns it)."""
        rows = self.gather_object(self.measured())
        if rows is None or steps <= 0 or not self.is_root:
            return None
        table = communication_table(rows, steps, debug)
        try:
            self._write_measured(rows, steps)
        except OSError as err:  # a by-product: the run (its checkpoint written) is not failed for it
            note = f"note: {os.path.join(self.workspace, 'communication.json')}: {not_written(err)}"
            return f"{table}\n{note}" if table else note
        return table

    def _write_measured(self, rows: list[dict], steps: int) -> None:
        table = {"steps": steps, "method": self.method,
                 "workers": [{label: {"calls": c, "bytes": b, "seconds": s} for label, (c, b, s) in per_rank.items()}
                             for per_rank in rows]}
        write_whole(os.path.join(self.workspace, "communication.json"), json.dumps(table, indent=1))

    def close(self) -> None:
        """Finish outstanding sends, then free every communicator and window made for this run
        (MPICH reports requests and communicators still referenced at MPI_Finalize).  Collective."""
        for net in self.nets:
            for layer in net.layers:
                if isinstance(layer, ExchangeLayer):
                    layer.close()
        if self._sync is not None:
            self._sync.close()
        if self.place is not None and self.place.peers is not None:
            self.place.peers.free()
        self.comm.free()
