"""A server rank: holds its ranges of the params, applies the updater to gradients as they come.

SINGA's server (``src/server.cc``) over MPI.  The server's ranges come from SINGA's slicing rule
(:mod:`singa_mpi.planner.servers`); each worker of each group sends its gradient pieces of them
(:mod:`singa_mpi.sync.servers` has the message formats).  A range is updated once per group and step:
when every piece of it from every worker of one group has arrived, the pieces are summed (in
worker order: the sum the serial run's gradient is), the job's updater is applied with that group's
step, and each of the group's workers gets the fresh values of its pieces back.

* One group (Sandblaster): the group waits for its values, so training equals the serial run.
* Several groups (Downpour): each group's update is applied when it arrives, and the group goes on
  with the values it gets back; no group waits for another.  SINGA counted arrivals per range for
  all groups together, so with groups of several workers two groups' pieces could complete one
  quota (facts §3.5); here the count is per group.
* ``cluster.max_staleness: s`` (stale synchronous parallel): a group's reply is held back while the
  group is more than ``s`` updates of the range ahead of the slowest group still training.

Servers end when every worker has said BYE.  A checkpoint takes each server's ranges and updater
state (SNAPSHOT); the final one waits until every group has finished, so it holds every update.
"""
from __future__ import annotations

import os
import threading

import numpy as np

from singa_mpi.algorithms import frozen_params
from singa_mpi.config.load import JobConfig, wants_deterministic
from singa_mpi.params import Param, make_param
from singa_mpi.planner.plan import Plan, untrained_params
from singa_mpi.planner.servers import pieces, server_ranges, trained_params
from singa_mpi.sync.base import finite_at_a_glance
from singa_mpi.sync.shared_memory import ChunkView
from singa_mpi.sync.servers import (APPLIED, BYE, CONTROL, CONTROL_WORDS, FINISHED, FOUND_NONFINITE, GET, HEADER,
                                    INIT, LABEL, NOT_FINITE, OVERFLOWED, SNAPSHOT, SNAPSHOT_REPLY, STOPPED_EARLY)
from singa_mpi.topology import Role, Topology
from singa_mpi.updaters import make_updater


def range_of(param: Param, lo: int, hi: int) -> ChunkView:
    """The flat elements [lo, hi) of a param that this server keeps and the updater sees: a chunk
    with its own values (the whole logical array is not kept) and its own gradient buffer."""
    chunk = ChunkView(param, lo, hi, np.zeros(hi - lo, np.float32))
    chunk.data = chunk.data.copy()
    return chunk


class _Range:
    """One range and, per worker group, the pieces that update it."""

    def __init__(self, value: ChunkView, groups: int):
        self.value = value
        self.incoming: list[list] = [[] for _ in range(groups)]  # per group: (piece, buffer, source rank)
        self.arrived = [0] * groups
        self.clock = [0] * groups  # updates applied per group
        self.seen = [0] * groups  # the version each group last got
        self.version = 0
        self.held: list[tuple[int, int, int]] = []  # (group, status, staleness) of replies held back
        self.done: int | None = None  # the steps trained into its values (None: not updated in this run)


class ServerRuntime:
    """Server ``role.index`` of server group ``role.group`` (``world``: every rank of the job)."""

    def __init__(self, cfg: JobConfig, seed: int, world, topo: Topology, role: Role, plans: dict[str, Plan]):
        self.cfg, self.world, self.topo, self.role = cfg, world, topo, role
        self.tracer = world.tracer
        self.updater = make_updater(cfg.proto.updater, exact=wants_deterministic(cfg.proto))
        self.max_staleness = cfg.proto.cluster.max_staleness if cfg.proto.cluster.HasField("max_staleness") else -1
        the_plan = plans["train"]
        frozen = frozen_params(cfg.proto) | untrained_params(the_plan.sublayers)
        params = trained_params(the_plan, frozen)
        self.ranges_all = server_ranges(params, len(topo.server_groups[role.group]))
        owners = {p.name: p for node in the_plan.origins.values() for p in node.conf.param if not p.share_from}
        groups = len(topo.worker_groups)
        self.ranges: dict[str, _Range] = {}
        for r in self.ranges_all:
            if r.server == role.index:
                whole = make_param(owners[r.name], r.logical_shape, tuple((0, n) for n in r.logical_shape), seed)
                self.ranges[r.name] = _Range(range_of(whole, r.lo, r.hi), groups)
        self.mine = [p for p in pieces(the_plan, self.ranges_all) if p.server == role.index]
        self.workers = [rank for ranks in topo.worker_groups for rank in ranks]
        self.group_of = {rank: (g, w) for g, ranks in enumerate(topo.worker_groups) for w, rank in enumerate(ranks)}
        self.finished_workers: set[int] = set()
        self.stop_reason = 0  # STOPPED_EARLY or FOUND_NONFINITE once a group stopped or sent one
        # set by the stop signals' handler (launcher.run attaches this server as it attaches a trainer): a
        # signal that reaches a server alone stops every group too (it was swallowed: the job trained on)
        self.stop_requested, self.stop_signal = False, None
        self.group_signal = 0  # the stop signal a group that stopped received (FINISHED's word 2)
        self.check_finite = True
        self.replies: dict[tuple[int, int], tuple] = {}  # (group, id(piece)) -> (buffer, request)
        self.lock = threading.Lock()  # held while a range changes: an emergency piece sees none half-updated

    # ------------------------------------------------------------- the loop
    def serve(self) -> None:
        with self.tracer.span("serving", "step"):
            self._initial_state(self.world.recv_object(self.topo.worker_groups[0][0], INIT, LABEL))
            self._serve()

    def _serve(self) -> None:
        requests, meaning, slots = [], [], {}
        for g, ranks in enumerate(self.topo.worker_groups):
            for piece in self.mine:
                buffer = np.zeros(piece.size + 1, np.float32)
                entry = (piece, buffer, ranks[piece.worker])
                self.ranges[piece.name].incoming[g].append(entry)
                slots.setdefault((g, piece.name), []).append(len(requests))
                requests.append(self.world.Irecv(buffer, ranks[piece.worker], piece.tag, LABEL))
                meaning.append((g, entry))
        # one control receive per worker, not one from any source: MPICH's ch4 lost any-source matches
        # when some senders came over shared memory and others over the network (two nodes, UCX on TCP)
        controls = {}
        for rank in self.workers:
            controls[len(requests)] = (rank, np.zeros(CONTROL_WORDS, np.int32))
            requests.append(self.world.Irecv(controls[len(requests)][1], rank, CONTROL, LABEL))
            meaning.append(None)
        said_bye, snapshots_waiting = set(), []
        workers = tuple(self.workers)
        while len(said_bye) < len(self.workers):
            index, _ = self.world.Waitany(requests, LABEL, awaits=workers, patient=True)
            if meaning[index] is None:
                source, control = controls[index]
                kind, arg = int(control[0]), int(control[1])
                requests[index] = self.world.Irecv(control, source, CONTROL, LABEL)
                if kind == BYE:
                    said_bye.add(source)
                elif kind == FINISHED:
                    self._finished(source, bool(arg), int(control[2]))
                elif kind == GET:
                    self._send_values(source)
                elif kind == SNAPSHOT:
                    snapshots_waiting.append((source, bool(arg)))
                snapshots_waiting = [(s, final) for s, final in snapshots_waiting if not self._snapshot_if_ready(s, final)]
                continue
            g, (piece, buffer, rank) = meaning[index]
            the_range = self.ranges[piece.name]
            the_range.arrived[g] += 1
            if the_range.arrived[g] == len(the_range.incoming[g]):
                self._apply(the_range, g)
                for k in slots[(g, piece.name)]:  # the group's next pieces of this range
                    next_piece, next_buffer, next_rank = meaning[k][1]
                    requests[k] = self.world.Irecv(next_buffer, next_rank, next_piece.tag, LABEL)
        self.world.Cancel(requests, LABEL)
        self.world.Waitall([request for _, request in self.replies.values()], LABEL)

    # ------------------------------------------------------------- updates
    def _apply(self, the_range: _Range, g: int) -> None:
        """Every piece of the range from group ``g`` is in: sum, update, reply (or hold back)."""
        value, grad = the_range.value, the_range.value.grad
        grad.fill(-0.0)  # the additive identity for every float (+0.0 + -0.0 is +0.0): see TermsForServers
        step = 0
        for piece, buffer, _ in the_range.incoming[g]:  # worker order: a fixed summation order
            grad[piece.remote] += buffer[:piece.size]
            step = max(step, int(buffer[piece.size:].view(np.int32)[0]))
        the_range.arrived[g] = 0
        status = APPLIED
        with np.errstate(over="ignore"):
            finite = not self.check_finite or finite_at_a_glance(grad) or np.isfinite(grad).all()
        if not finite:
            status = NOT_FINITE
        else:
            with self.lock:
                self.updater.update(step, value)
                the_range.done = step + 1
            with np.errstate(over="ignore"):  # a finite gradient can still overflow the values
                finite = not self.check_finite or finite_at_a_glance(value.data) or np.isfinite(value.data).all()
            status = APPLIED if finite else OVERFLOWED
        if status != APPLIED:
            self.stop_reason = FOUND_NONFINITE  # every group stops, none checkpoints
        if self.stop_requested:  # every group stops after this step, as on a group's own stop
            self.stop_reason = max(self.stop_reason, STOPPED_EARLY)
        staleness = the_range.version - the_range.seen[g]
        the_range.version += 1
        the_range.clock[g] += 1
        the_range.held.append((g, status, staleness))
        self._release(the_range)

    def _release(self, the_range: _Range) -> None:
        """Reply to every held group that is at most ``max_staleness`` updates ahead of the slowest
        group still training."""
        training = [c for g, c in enumerate(the_range.clock) if not self._group_finished(g)]
        slowest = min(training) if training else None
        kept = []
        for g, status, staleness in the_range.held:
            if self.max_staleness >= 0 and slowest is not None and the_range.clock[g] - slowest > self.max_staleness:
                kept.append((g, status, staleness))
                continue
            the_range.seen[g] = the_range.version
            header = [status, the_range.version, staleness, min(the_range.clock), max(the_range.clock),
                      self.stop_reason, self._signal_word()]
            for piece, _, rank in the_range.incoming[g]:
                self._reply(g, piece, rank, the_range, header)
        the_range.held = kept

    def _reply(self, g: int, piece, rank: int, the_range: _Range, header: list[int]) -> None:
        key = (g, id(piece))
        if key in self.replies:
            buffer, request = self.replies[key]
            self.world.Wait(request, LABEL, "Wait(Isend)")  # the previous reply has left this buffer
        else:
            buffer = np.zeros(piece.size + HEADER, np.float32)
        buffer[:piece.size] = the_range.value.data[piece.remote]
        buffer[piece.size:].view(np.int32)[:] = header
        self.replies[key] = (buffer, self.world.Isend(buffer, rank, piece.tag, LABEL))

    def _send_values(self, rank: int) -> None:
        """GET: the current values of every piece this worker holds here."""
        g, w = self.group_of[rank]
        for piece in self.mine:
            if piece.worker == w:
                r = self.ranges[piece.name]
                self._reply(g, piece, rank, r, [APPLIED, r.version, 0, min(r.clock), max(r.clock),
                                                self.stop_reason, self._signal_word()])

    # ------------------------------------------------------------- groups finishing, snapshots
    def _signal_word(self) -> int:
        """A reply's SIGNAL word: the stop signal this server or a group received first (0: none)."""
        return self.group_signal or int(self.stop_signal or 0)

    def _finished(self, rank: int, stopped: bool, signal: int = 0) -> None:
        self.group_signal = self.group_signal or signal
        self.finished_workers.add(rank)
        self.stop_reason = max(self.stop_reason, STOPPED_EARLY if stopped else 0)
        for the_range in self.ranges.values():  # the slowest group may have just left
            self._release(the_range)

    def _group_finished(self, g: int) -> bool:
        return all(rank in self.finished_workers for rank in self.topo.worker_groups[g])

    def _snapshot_if_ready(self, rank: int, final: bool) -> bool:
        if final and len(self.finished_workers) < len(self.workers):
            return False
        params, states = [], []
        for name, r in self.ranges.items():
            value = r.value
            params.append((name, value.logical_shape, value.region(), value.data.copy()))
            for slot, array in self.updater.state(name).items():
                states.append((name, slot, value.logical_shape, value.region(), array))
        # each group's updates of these ranges in this run: the checkpoint's readers go on from each group's
        groups = range(len(self.topo.worker_groups))
        steps = [max((r.clock[g] for r in self.ranges.values()), default=0) for g in groups]
        self.world.send_object({"params": params, "states": states, "counters": self._own_counters(),
                                "steps": steps}, rank, SNAPSHOT_REPLY, LABEL)
        return True

    def _own_counters(self) -> dict[str, dict[str, int]]:
        """The updater's counters of this server's ranges: the root merges every server's, so a
        counter of a param another server updates must not come from here."""
        return {name: values for name, values in self.updater.counters().items() if name in self.ranges}

    def emergency_pieces(self) -> list[dict] | str:
        """This server's ranges and their updater state for an emergency checkpoint, one piece per step
        the ranges have reached (checkpoints.emergency); or why it has none."""
        if len(self.topo.worker_groups) > 1:
            return "the worker groups update the servers asynchronously: the ranges agree on no step"
        by_step: dict[int, dict] = {}
        for name, r in self.ranges.items():
            if r.done is None:
                continue
            piece = by_step.setdefault(r.done, {"rank": self.world.rank, "pid": os.getpid(), "step": r.done,
                                                "params": [], "owned": [], "readers": {}, "counters": {},
                                                "carried": [], "refused": None, "elapsed": 0.0, "expected": {},
                                                "header": None, "trains": False})
            value = r.value
            piece["params"].append((name, tuple(value.logical_shape), value.region(), value.data.copy()))
            piece["owned"].append((name, tuple(value.logical_shape), value.region(), self.updater.state(name)))
            counters = self.updater.counters().get(name)
            if counters:
                piece["counters"][name] = counters
        return list(by_step.values()) or "no range was updated in this run yet"

    def _initial_state(self, payload: dict) -> None:
        """INIT: the checkpoint the workers started from (params; with ``full`` the updater's state)."""
        self.check_finite = payload.get("check_finite", True)
        if payload["params"] is None:
            return
        for name, r in self.ranges.items():
            value = payload["params"].get(name)
            if value is not None and value.shape == r.value.logical_shape:
                r.value.data[...] = value.reshape(-1)[r.value.lo:r.value.hi]
            if payload["full"]:
                slots = payload["updater"].get(name, {})
                state = {slot: array.reshape(-1)[r.value.lo:r.value.hi] for slot, array in slots.items()
                         if array.shape == r.value.logical_shape}
                if state:
                    self.updater.load_state(name, state)
        if payload["full"]:  # only this server's ranges count updates here
            self.updater.load_counters({name: values for name, values in payload["counters"].items()
                                        if name in self.ranges})
