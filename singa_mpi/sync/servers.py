"""A worker's side of parameter servers: gradients out slice by slice, fresh values back.

SINGA's ``Update``/``Collect`` (seed 003, ``src/worker.cc``) over MPI point-to-point messages.  The
servers of the job's server group hold every trained parameter, cut into ranges as SINGA cuts them
(:mod:`singa_mpi.planner.servers`).  As soon as backward has finished every local use of a param,
this worker sends each server its piece of the gradient (non-blocking, so the message travels while
lower layers compute) and posts the receive of the fresh values; ``gradients_complete`` waits for
all replies (Collect), ``update`` copies the values in.  The worker keeps no updater state: the
servers apply the job's updater, so checkpoints take params and state from them.

Messages (tags below :data:`singa_mpi.planner.servers.FIRST_PIECE_TAG` are the protocol's own):

* a gradient piece: float32[n + 1], the last word the worker's step as int32 (the learning-rate
  schedule follows the requesting group's step, as in SINGA);
* a reply: float32[n + HEADER]: the values, then int32 words ``status`` (APPLIED; NOT_FINITE:
  the summed gradient held a NaN or an infinity and was not applied; OVERFLOWED: the gradient was
  finite, the values it updated are not), the range's version (updates
  applied so far), the staleness of this update (other groups' updates applied since this group
  last got the range's values), the slowest and fastest group's update count, ``stop`` (why
  every group stops after its current step: STOPPED_EARLY, a group stopped on a signal; or
  FOUND_NONFINITE, a group's gradient was not finite), and ``signal`` (the stop signal a server or a
  group received, 0 for none: the job's root names it in its acknowledgement and WORKSPACE/stopped.txt);
* control messages int32[CONTROL_WORDS] on tag CONTROL: GET (send me my pieces' current values),
  FINISHED (this worker trained its last step; word 1: it stopped early; word 2: the stop signal its
  group received, 0 for none), SNAPSHOT (send the root
  your params and updater state; word 1: only once every group has finished), BYE (this worker
  is done with the servers);
* INIT (an object, from the job's root worker before any gradient): the checkpoint to start from,
  if any, and whether to refuse non-finite gradients.
"""
from __future__ import annotations

import numpy as np

from singa_mpi.params import Param
from singa_mpi.sync.base import first_bad_value

CONTROL, SNAPSHOT_REPLY, INIT = 1, 2, 3  # tags
CONTROL_WORDS = 3
GET, FINISHED, SNAPSHOT, BYE = 1, 2, 3, 4  # control kinds
HEADER = 7  # int32 words after a reply's values
STATUS, VERSION, STALENESS, SLOWEST, FASTEST, STOP, SIGNAL = range(HEADER)
APPLIED, NOT_FINITE, OVERFLOWED = 0, 1, 2
STOPPED_EARLY, FOUND_NONFINITE = 1, 2  # a reply's STOP word: why every group stops
LABEL = "servers"


class ServerSync:
    """Every trained param of this worker, updated by the servers (``servers``: their world ranks).

    ``world``: the communicator that holds workers and servers; ``pieces``: this worker's
    :class:`~singa_mpi.planner.servers.ServerPiece` list; ``params``: this worker's params by
    (name, shard offsets); ``uses``: id(param) -> local layers using it in backward;
    ``asynchronous``: several worker groups (GET before evaluations)."""

    listens = True
    state_on_servers = True  # an emergency checkpoint takes the values and updater state from the servers

    def __init__(self, world, servers: tuple[int, ...], pieces: list, params: dict[tuple, Param],
                 uses: dict[int, int], asynchronous: bool, group: tuple[int, ...] = (), former=None):
        self.world, self.servers, self.asynchronous = world, servers, asynchronous
        # deterministic mode: ``former`` completes the gradients after backward (the workers' terms
        # gathered, each worker's tiles formed): nothing is sent before then
        self.former = former
        self.listens = former is None
        # a reply waits on the servers and on every worker of the group (their pieces complete it)
        self.awaits = tuple(servers) + tuple(r for r in group if r != world.rank)
        self.pieces = [(piece, params[(piece.name, piece.offsets)]) for piece in pieces]
        self.params = list({id(p): p for _, p in self.pieces}.values())
        self.pieces_of: dict[int, list] = {}
        for piece, param in self.pieces:
            self.pieces_of.setdefault(id(param), []).append(piece)
        self.uses = {id(p): uses.get(id(p), 0) for p in self.params}
        self.out = {id(piece): np.zeros(piece.size + 1, np.float32) for piece, _ in self.pieces}
        self.back = {id(piece): np.zeros(piece.size + HEADER, np.float32) for piece, _ in self.pieces}
        self.talks_to = sorted({piece.server for piece, _ in self.pieces})
        self._nonfinite: Param | None = None
        self._overflowed: tuple[Param, float] | None = None  # a param the servers' update made non-finite
        self._stop = 0  # the largest STOP word seen
        self._signal = 0  # the first stop signal a reply named (a server's, another group's)
        self._seen: list[np.ndarray] = []  # reply headers since the last metrics()
        self._reset()

    def _reset(self) -> None:
        self.remaining = dict(self.uses)
        self.requests: list = []
        self.sent: set[int] = set()

    # ------------------------------------------------------------- the step
    def layer_done(self, layer) -> None:
        for param in layer.params:
            key = id(param)
            if key not in self.remaining:
                continue
            self.remaining[key] -= 1
            if self.remaining[key] == 0:
                self._send(param)

    def _send(self, param: Param) -> None:
        """Post the receives of the param's fresh values, then send its gradient pieces."""
        if id(param) in self.sent:
            return
        self.sent.add(id(param))
        param.finish_grad()
        flat, step = param.grad.reshape(-1), self.world.tracer.step
        for piece in self.pieces_of[id(param)]:
            rank = self.servers[piece.server]
            self.requests.append(self.world.Irecv(self.back[id(piece)], rank, piece.tag, LABEL))
            out = self.out[id(piece)]
            out[:piece.size] = flat[piece.local_lo:piece.local_hi]
            out[piece.size:].view(np.int32)[0] = step
            self.requests.append(self.world.Isend(out, rank, piece.tag, LABEL))

    def gradients_complete(self) -> None:
        """Send what backward did not (params unused this step: a zero gradient), then wait for every
        reply: the servers have applied the step (SINGA's Collect)."""
        if self.former is not None:
            self.former.gradients_complete()
        for param in self.params:
            self._send(param)
        self.world.Waitall(self.requests, LABEL, awaits=self.awaits)
        self._nonfinite = self._overflowed = None
        for piece, param in self.pieces:
            header = self.back[id(piece)][piece.size:].view(np.int32)
            self._seen.append(header.copy())
            if header[STATUS] == NOT_FINITE and self._nonfinite is None:
                self._nonfinite = param
            if header[STATUS] == OVERFLOWED and self._overflowed is None:  # the reply holds the values
                self._overflowed = (param, first_bad_value(self.back[id(piece)][:piece.size]))
            self._stop = max(self._stop, int(header[STOP]))
            self._signal = self._signal or int(header[SIGNAL])
        self._reset()

    def update(self, step: int, updater) -> None:
        """The servers updated; take their values."""
        self._take_values()

    def _take_values(self) -> None:
        for piece, param in self.pieces:
            param.data.reshape(-1)[piece.local_lo:piece.local_hi] = self.back[id(piece)][:piece.size]

    def publish(self) -> None:
        pass

    def owned(self) -> list[Param]:
        return []  # the servers own the values and the updater state

    def nonfinite_grad(self) -> Param | None:
        """A param whose summed gradient a server found not finite (and did not apply)."""
        return self._nonfinite

    def overflowed(self) -> tuple[Param, float] | None:
        """A param whose values a server's update of a finite gradient made non-finite, with the
        first such value."""
        return self._overflowed

    def close(self) -> None:
        """This worker is done with the servers (every worker says so; the servers then end)."""
        self._control(BYE)

    # ------------------------------------------------------------- beyond the step
    def refresh(self) -> None:
        """The servers' current values (before a test or validation pass of an asynchronous job: other
        groups have updated since this group's last step)."""
        if not self.asynchronous:
            return
        requests = [self.world.Irecv(self.back[id(piece)], self.servers[piece.server], piece.tag, LABEL)
                    for piece, _ in self.pieces]
        self._control(GET)
        self.world.Waitall(requests, LABEL, awaits=tuple(self.servers))
        self._take_values()

    def training_done(self, stopped: bool, signal: int | None = None) -> None:
        self._control(FINISHED, int(stopped), signal or 0)

    def signal_elsewhere(self) -> int | None:
        """The stop signal a server rank or another group received, as the servers' replies named it."""
        return self._signal or None

    def stop_asked(self) -> bool:
        """A server said a group stopped early (a signal, a non-finite gradient): stop too."""
        return self._stop > 0

    def nonfinite_elsewhere(self) -> bool:
        """A server refused a group's non-finite gradient: the job ends as on a non-finite value."""
        return self._stop == FOUND_NONFINITE

    def metrics(self) -> dict[str, float]:
        """Staleness since the last call (mean and max over this worker's replies), and the update
        counts of the slowest and fastest group."""
        if not self._seen or not self.asynchronous:
            self._seen = []
            return {}
        seen, self._seen = np.array(self._seen), []
        latest = seen[-len(self.pieces):]  # the last step's replies
        return {"staleness": float(seen[:, STALENESS].mean()), "staleness_max": float(seen[:, STALENESS].max()),
                "slowest_group": float(latest[:, SLOWEST].min()), "fastest_group": float(latest[:, FASTEST].max())}

    def start(self, checkpoint, check_finite: bool) -> None:
        """The job's root only, before any gradient: the servers' initial state (every server waits
        for it).  ``checkpoint``: (Checkpoint, full) that was loaded, or None (the params' inits)."""
        if checkpoint is None:
            payload = {"params": None, "full": False, "check_finite": check_finite}
        else:
            ckpt, full = checkpoint
            payload = {"params": ckpt.params, "full": full, "updater": ckpt.updater if full else {},
                       "counters": ckpt.counters if full else {}, "check_finite": check_finite}
        for rank in self.servers:
            self.world.send_object(payload, rank, INIT, LABEL)

    def snapshot(self, final: bool) -> list[dict]:
        """The job's root only: every server's params and updater state (``final``: once every group
        has finished training)."""
        parts = []
        for rank in self.servers:
            self.world.Send(np.array([SNAPSHOT, int(final), 0], np.int32), rank, CONTROL, LABEL)
            # the last checkpoint waits for every group to finish: as long as the slowest group takes
            parts.append(self.world.recv_object(rank, SNAPSHOT_REPLY, LABEL, patient=final and self.asynchronous))
        return parts

    def _control(self, kind: int, arg: int = 0, signal: int = 0) -> None:
        message = np.array([kind, arg, signal], np.int32)
        for server in (self.talks_to if kind == GET else range(len(self.servers))):
            self.world.Send(message, self.servers[server], CONTROL, LABEL)
