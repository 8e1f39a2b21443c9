"""The communicator interface inside one process: n ranks as n threads (serial tests).

:class:`LocalGroup` makes ``n`` endpoints, :class:`LocalComm` rank ``r`` of
``n``, with the semantics and the byte accounting of
:class:`~singa_mpi.communication.mpi.MPIComm` (see
:mod:`singa_mpi.communication.base`), so every exchange and every sync
strategy runs under plain pytest; :func:`run_ranks` runs ``fn(comm)`` on one
thread per rank and turns a deadlock into a test failure::

    results = run_ranks(3, lambda comm: comm.allgather_object(comm.rank))

What is kept from MPI, because code that passes here must not hang there:

* sends are eager (``Isend``/``Send`` copy and return) and messages between a
  pair of ranks with one tag arrive in the order sent, received in the order
  the receives were posted;
* a collective is matched by call order on its communicator; a member's part
  is copied when it starts the call, and its result is written when it waits
  and every member has started (so an ``Iallreduce`` started in backward and
  waited later works); members calling different operations at the same
  position (``Reduce`` against ``Ireduce`` included) all raise;
* sizes and dtypes must match as MPI requires (float32, int32, float64 only),
  and ``*_object`` values travel pickled;
* sub-communicators from ``sub(ranks)`` match by creation order, which must
  agree between any two members.

Threads share memory, so ``shared_arrays`` are plain numpy arrays, a fence is a
barrier and ``on_one_node()`` is True.  ``abort`` raises :class:`LocalAbort` in
the caller and in every call any rank of the group makes afterwards.
"""
from __future__ import annotations

import collections
import pickle
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from singa_mpi.communication.base import others, ring_bytes, rooted_bytes, scatter_sum_bytes
from singa_mpi.threads import shared_by_threads
from singa_mpi.tracing import Tracer

_DTYPES = (np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.float64))  # what MPIComm can send


class LocalAbort(RuntimeError):
    """The group was aborted (``abort``, a failed rank, or a timeout); ``origin``: the world rank
    that caused it, or -1."""

    def __init__(self, message: str, origin: int):
        super().__init__(message)
        self.origin = origin


class _Request:
    """A started operation; ``Wait`` finishes it once (and returns what it produced).

    ``ready()`` (called holding the group's lock): whether ``Wait`` would return at once;
    ``source``: the member a receive takes its message from."""

    def __init__(self, finish: Callable[[], Any] | None = None, ready: Callable[[], bool] | None = None,
                 source: int | None = None):
        self._finish = finish
        self.ready = ready if ready is not None else (lambda: True)
        self.source = source

    @property
    def active(self) -> bool:
        """Started and neither waited for nor cancelled (MPI: not yet MPI_REQUEST_NULL)."""
        return self._finish is not None

    def cancel(self) -> None:
        self._finish = None

    def Wait(self) -> Any:
        finish, self._finish = self._finish, None
        return finish() if finish is not None else None


class _Hub:
    """What the members of one communicator share: mailboxes, collective slots, subgroups."""

    def __init__(self, group: "LocalGroup", members: tuple[int, ...]):
        self.group, self.members, self.size = group, members, len(members)
        self.mail: dict[tuple, np.ndarray] = {}  # (src, dst, tag, n-th message) -> payload
        self.sent: collections.Counter = collections.Counter()  # (src, dst, tag) -> messages sent
        self.slots: dict[int, dict] = {}  # n-th collective -> {"parts": {rank: (op, root, payload)}, ...}
        self.subs: dict[tuple, _Hub] = {}  # (ranks, n-th creation) -> the subgroup's hub
        self.created: dict[int, list[tuple[int, ...]]] = {}  # member -> subgroups it made, in order


class LocalGroup:
    """``n`` endpoints of one world communicator, each with its own tracer; ``comms[r]`` is rank r.

    ``timeout``: seconds any one call may wait before raising TimeoutError (None: forever;
    :func:`run_ranks` watches the whole run instead).
    """

    def __init__(self, n: int, timeout: float | None = 60.0, record: bool = False):
        if n < 1:
            raise ValueError(f"LocalGroup({n}): expected at least one rank")
        self.cond = threading.Condition()  # one lock for every communicator of the group
        self.timeout = timeout
        self.aborted: LocalAbort | None = None
        world = _Hub(self, tuple(range(n)))
        self.comms = [LocalComm(world, r, Tracer(r, record)) for r in range(n)]

    def abort(self, reason: str, origin: int = -1) -> None:
        """Make every waiting and every later call of every rank raise :class:`LocalAbort`."""
        with self.cond:
            if self.aborted is None:
                self.aborted = LocalAbort(f"group aborted: {reason}", origin)
            self.cond.notify_all()

    def check(self) -> None:
        if self.aborted is not None:
            raise LocalAbort(str(self.aborted), self.aborted.origin)

    def wait(self, ready: Callable[[], bool], what: str) -> None:
        """Block (holding ``cond``) until ``ready()``; raise if aborted or timed out."""
        if not self.cond.wait_for(lambda: self.aborted is not None or ready(), self.timeout):
            raise TimeoutError(f"{what}: waited {self.timeout:g}s for the other ranks")
        self.check()


def _flat(array: np.ndarray, what: str) -> np.ndarray:
    """The buffer as MPI sees it: its items in memory order (a view, so results land in it)."""
    if array.dtype not in _DTYPES:
        raise TypeError(f"{what}: dtype {array.dtype}: expected float32, int32 or float64 (as MPIComm)")
    if not array.flags.c_contiguous:
        raise ValueError(f"{what}: a non-contiguous buffer of shape {array.shape}: expected a C-contiguous array")
    return array.reshape(-1)


def _put(into: np.ndarray, block: np.ndarray, what: str) -> None:
    if into.size != block.size or into.dtype != block.dtype:
        raise ValueError(f"{what}: {block.size} {block.dtype} items arrive for a buffer of "
                         f"{into.size} {into.dtype}: expected the sizes and dtypes to match")
    into[...] = block


def _sum(blocks: list[np.ndarray]) -> np.ndarray:
    total = blocks[0].copy()
    for block in blocks[1:]:
        total += block
    return total


class LocalComm:
    """Rank ``rank`` of a communicator whose members are threads of this process (see the module)."""

    def __init__(self, hub: _Hub, rank: int, tracer: Tracer, owned: bool = False):
        self.hub, self.group = hub, hub.group
        self.rank, self.size = rank, hub.size
        self.world_rank = hub.members[rank]
        self.tracer = tracer
        self._owned, self._freed = owned, False
        self._subs: dict[tuple[int, ...], LocalComm] = {}
        self._windows: list = []
        self._calls = 0  # collectives started on this communicator: the matching key
        self._posted: collections.Counter = collections.Counter()  # receives posted per (src, dst, tag)

    # ------------------------------------------------------------- bookkeeping (as MPIComm)
    def _enter(self, op: str, layer: str, peer: str, tag: int | None = None):
        return self.tracer.begin(layer, "comm", {"op": op, "peer": peer, "tag": tag})

    def _leave(self, span, nbytes: int) -> None:
        self.tracer.end(span, int(nbytes))

    def _start(self, op: str, layer: str, peer: str, starter, *args) -> _Request:
        """A span around ``starter(op, *args) -> (request, bytes)``; the request is returned."""
        span = self._enter(op, layer, peer)
        request, nbytes = starter(op, *args)
        self._leave(span, nbytes)
        return request

    def _call(self, op: str, layer: str, peer: str, starter, *args) -> Any:
        """The blocking call: a span around starting and waiting; what the request produced."""
        span = self._enter(op, layer, peer)
        request, nbytes = starter(op, *args)
        result = request.Wait()
        self._leave(span, nbytes)
        return result

    def _check(self) -> None:
        if self._freed:
            raise RuntimeError(f"rank {self.rank}: communicator used after free()")
        self.group.check()

    # ------------------------------------------------------------- subgroups
    def sub(self, ranks: Sequence[int]) -> "LocalComm":
        """The communicator of ``ranks`` (all members must call this, in the same order)."""
        ranks = tuple(ranks)
        if ranks == tuple(range(self.size)):
            return self
        if ranks not in self._subs:
            if self.rank not in ranks:
                raise ValueError(f"rank {self.rank}: sub({list(ranks)}) called by a non-member: "
                                 f"expected only the members to call it")
            with self.group.cond:
                self._check()
                mine = self.hub.created.setdefault(self.rank, [])
                mine.append(ranks)
                self._check_creation_order(ranks)
                key = (ranks, mine.count(ranks))
                hub = self.hub.subs.setdefault(key, _Hub(self.group, tuple(self.hub.members[r] for r in ranks)))
            self._subs[ranks] = LocalComm(hub, ranks.index(self.rank), self.tracer, owned=True)
        return self._subs[ranks]

    def _check_creation_order(self, ranks: tuple[int, ...]) -> None:
        """Two members must create the subgroups they both belong to in one order (MPI matches
        Comm_create_group calls by order)."""
        for other in ranks:
            mine = [g for g in self.hub.created[self.rank] if other in g]
            theirs = [g for g in self.hub.created.get(other, []) if self.rank in g]
            if mine[:len(theirs)] != theirs[:len(mine)]:
                raise RuntimeError(f"sub-communicators created in different orders: rank {self.rank} made "
                                   f"{mine}, rank {other} made {theirs}: expected the same order on every member")

    def split(self, color: int, key: int) -> "LocalComm":
        """MPI_Comm_split: the communicator of the ranks that passed the same ``color`` (collective)."""

        def finish(parts, slot):
            if "hubs" not in slot:  # the first member to finish makes every color's hub
                order = sorted(parts, key=lambda r: (parts[r][1], r))
                slot["hubs"] = {c: _Hub(self.group, tuple(self.hub.members[r] for r in order if parts[r][0] == c))
                                for c in {p[0] for p in parts.values()}}
                slot["ranks"] = {c: [r for r in order if parts[r][0] == c] for c in slot["hubs"]}
            return LocalComm(slot["hubs"][color], slot["ranks"][color].index(self.rank), self.tracer, owned=True)

        return self._collective("split", None, (color, key), finish).Wait()

    def free(self) -> None:
        """Release the sub-communicators and windows made here, and this one if made here."""
        for sub in self._subs.values():
            sub.free()
        self._subs.clear()
        self._windows.clear()
        if self._owned:
            self._freed = True

    # ------------------------------------------------------------- the two mechanisms
    def _collective(self, op: str, root: int | None, payload, finish) -> _Request:
        """Deposit this member's part of the next collective on this communicator.

        The request's ``Wait`` blocks until every member has deposited, checks that they all
        called ``op`` with ``root``, and returns ``finish(parts, slot)``: parts[r] is member r's
        payload, ``slot`` a dict shared by the members for what must exist once."""
        if root is not None and not 0 <= root < self.size:
            raise ValueError(f"rank {self.rank}: {op} with root {root}: expected 0..{self.size - 1}")
        hub, cond = self.hub, self.group.cond
        with cond:
            self._check()
            index, self._calls = self._calls, self._calls + 1
            slot = hub.slots.setdefault(index, {"parts": {}, "readers": 0})
            slot["parts"][self.rank] = (op, root, payload)
            cond.notify_all()

        def wait():
            with cond:
                self.group.wait(lambda: len(slot["parts"]) == hub.size,
                                f"rank {self.rank}: {op} (collective {index} of its communicator)")
                calls = {r: (o, rt) for r, (o, rt, _) in slot["parts"].items()}
                if len(set(calls.values())) > 1:
                    seen = ", ".join(f"rank {r} {o}(root {rt})" for r, (o, rt) in sorted(calls.items()))
                    raise RuntimeError(f"collective {index} mismatched: {seen}: expected one operation and root")
                slot["readers"] += 1
                if slot["readers"] == hub.size:
                    del hub.slots[index]
                return finish({r: p for r, (_, _, p) in slot["parts"].items()}, slot)

        return _Request(wait, lambda: len(slot["parts"]) == hub.size)

    def _send(self, array: np.ndarray, dest: int, tag: int) -> None:
        """Eager: the message is copied into the receiver's mailbox now."""
        self._peer(dest)
        message = _flat(array, f"rank {self.rank}: send to rank {dest} tag {tag}").copy()
        with self.group.cond:
            self._check()
            key = (self.rank, dest, tag)
            self.hub.mail[key + (self.hub.sent[key],)] = message
            self.hub.sent[key] += 1
            self.group.cond.notify_all()

    def _receive(self, array: np.ndarray, source: int, tag: int) -> _Request:
        """Post a receive now (fixing which message it gets); ``Wait`` blocks until it is there."""
        self._peer(source)
        what = f"rank {self.rank}: Recv from rank {source} tag {tag}"
        into = _flat(array, what)
        key = (source, self.rank, tag)
        with self.group.cond:
            self._check()
            nth, self._posted[key] = self._posted[key], self._posted[key] + 1

        def wait():
            with self.group.cond:
                self.group.wait(lambda: key + (nth,) in self.hub.mail, what)
                message = self.hub.mail.pop(key + (nth,))
            _put(into, message, what)

        return _Request(wait, lambda: key + (nth,) in self.hub.mail, source)

    def _peer(self, rank: int) -> None:
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {self.rank}: peer rank {rank}: expected 0..{self.size - 1}")

    # ------------------------------------------------------------- point to point
    def Isend(self, array: np.ndarray, dest: int, tag: int, layer: str) -> _Request:
        span = self._enter("Isend", layer, f"to rank {dest}", tag)
        self._send(array, dest, tag)
        self._leave(span, array.nbytes)
        return _Request()

    def Send(self, array: np.ndarray, dest: int, tag: int, layer: str) -> None:
        span = self._enter("Send", layer, f"to rank {dest}", tag)
        self._send(array, dest, tag)
        self._leave(span, array.nbytes)

    def Recv(self, array: np.ndarray, source: int, tag: int, layer: str) -> None:
        span = self._enter("Recv", layer, f"from rank {source}", tag)
        self._receive(array, source, tag).Wait()
        self._leave(span, array.nbytes)

    def Irecv(self, array: np.ndarray, source: int, tag: int, layer: str) -> _Request:
        span = self._enter("Irecv", layer, f"from rank {source}", tag)
        request = self._receive(array, source, tag)
        self._leave(span, array.nbytes)
        return request

    def Wait(self, request, layer: str, what: str = "Wait") -> None:
        span = self._enter(what, layer, "request")
        request.Wait()
        self._leave(span, 0)

    def progress(self, requests: list) -> list:
        """In one process every message is delivered as it is sent: nothing stays under way."""
        return []

    def Waitany(self, requests: list, layer: str, awaits: tuple[int, ...] | None = None,
                patient: bool = False) -> tuple[int, int | None]:
        """(index, source member) of the first active request of ``requests`` that is ready (a
        server's loop over every worker's messages); ``awaits`` and ``patient`` as MPIComm's (they
        name the ranks its watchdog would blame; threads need no watchdog)."""
        span = self._enter("Waitany", layer, "any rank")
        with self.group.cond:
            self.group.wait(lambda: any(r.active and r.ready() for r in requests),
                            f"rank {self.rank}: Waitany over {len(requests)} requests")
            index = next(i for i, r in enumerate(requests) if r.active and r.ready())
            requests[index].Wait()  # the lock is re-entrant: the receive takes its message now
        self._leave(span, 0)
        return index, requests[index].source

    def Waitall(self, requests: list, layer: str, awaits: tuple[int, ...] | None = None) -> None:
        span = self._enter("Waitall", layer, "servers")
        for request in requests:
            request.Wait()
        self._leave(span, 0)

    def Cancel(self, requests: list, label: str) -> None:
        """Withdraw receives that will never be matched (a server's, once every worker said BYE)."""
        for request in requests:
            request.cancel()

    # ------------------------------------------------------------- objects, point to point
    def send_object(self, value, dest: int, tag: int, label: str) -> None:
        """A Python object to one member, pickled (setup, control messages and checkpoints)."""
        self._peer(dest)
        span = self._enter("send", label, f"to rank {dest}", tag)
        with self.group.cond:
            self._check()
            key = ("object", self.rank, dest, tag)
            self.hub.mail[key + (self.hub.sent[key],)] = pickle.dumps(value)
            self.hub.sent[key] += 1
            self.group.cond.notify_all()
        self._leave(span, 0)

    def recv_object(self, source: int, tag: int, label: str, patient: bool = False):
        """The next object ``source`` sends with ``tag`` (``patient`` as MPIComm's)."""
        self._peer(source)
        span = self._enter("recv", label, f"from rank {source}", tag)
        key = ("object", source, self.rank, tag)
        with self.group.cond:
            self._check()
            nth, self._posted[key] = self._posted[key], self._posted[key] + 1
            self.group.wait(lambda: key + (nth,) in self.hub.mail, f"rank {self.rank}: recv_object from rank {source}")
            value = pickle.loads(self.hub.mail.pop(key + (nth,)))
        self._leave(span, 0)
        return value

    # ------------------------------------------------------------- collectives
    # Each ``_start_*`` deposits this member's part and returns (request, bytes as MPIComm counts
    # them); the public methods are the blocking call and its non-blocking I-twin around it.
    def _start_bcast(self, op: str, array: np.ndarray, root: int):
        flat = _flat(array, f"rank {self.rank}: {op}")

        def finish(parts, slot):
            if self.rank != root:
                _put(flat, parts[root], f"rank {self.rank}: {op} from root {root}")

        request = self._collective(op, root, flat.copy() if self.rank == root else None, finish)
        return request, array.nbytes * (self.size - 1 if self.rank == root else 1)

    def _start_reduce(self, op: str, send: np.ndarray, recv: np.ndarray | None, root: int):
        if self.rank == root and recv is None:
            raise ValueError(f"rank {self.rank}: {op} root without a receive buffer")

        def finish(parts, slot):
            if self.rank == root:
                _put(_flat(recv, op), _sum([parts[r] for r in range(self.size)]), f"rank {root}: {op}")

        request = self._collective(op, root, _flat(send, f"rank {self.rank}: {op}").copy(), finish)
        return request, send.nbytes * (self.size - 1 if self.rank == root else 1)

    def _start_scatterv(self, op: str, send, counts, displs, recv: np.ndarray, root: int):
        blocks = None
        if self.rank == root:
            flat = _flat(send, f"rank {root}: {op}")
            blocks = [flat[d:d + c].copy() for c, d in zip(counts, displs)]
        into = _flat(recv, f"rank {self.rank}: {op}")

        def finish(parts, slot):
            _put(into, parts[root][self.rank], f"rank {self.rank}: {op} from root {root}")

        return self._collective(op, root, blocks, finish), rooted_bytes(self.rank, root, counts, recv)

    def _start_gatherv(self, op: str, send: np.ndarray, recv, counts, displs, root: int | None):
        """Gatherv to ``root``, or to every member when ``root`` is None (Allgatherv)."""

        def finish(parts, slot):
            if root is None or self.rank == root:
                into = _flat(recv, f"rank {self.rank}: {op}")
                for r, (c, d) in enumerate(zip(counts, displs)):
                    _put(into[d:d + c], parts[r], f"rank {self.rank}: {op}: the block of rank {r}")

        request = self._collective(op, root, _flat(send, f"rank {self.rank}: {op}").copy(), finish)
        if root is None:
            return request, send.itemsize * (counts[self.rank] * (self.size - 1) + others(counts, self.rank))
        return request, rooted_bytes(self.rank, root, counts, send)

    def _start_reduce_scatter(self, op: str, send: np.ndarray, recv: np.ndarray, counts):
        mine = _flat(send, f"rank {self.rank}: {op}").copy()
        if mine.size != sum(counts):
            raise ValueError(f"rank {self.rank}: {op} of {mine.size} items with counts {list(counts)}: "
                             f"expected {sum(counts)} items")
        lo = int(sum(counts[:self.rank]))
        hi = lo + int(counts[self.rank])

        def finish(parts, slot):
            _put(_flat(recv, op), _sum([parts[r][lo:hi] for r in range(self.size)]), f"rank {self.rank}: {op}")

        return self._collective(op, None, mine, finish), scatter_sum_bytes(self.rank, self.size, counts, send.itemsize)

    def _start_alltoallv(self, op: str, send, scounts, sdispls, recv, rcounts, rdispls):
        flat = _flat(send, f"rank {self.rank}: {op}")
        into = _flat(recv, f"rank {self.rank}: {op}")

        def finish(parts, slot):
            for r, (c, d) in enumerate(zip(rcounts, rdispls)):
                _put(into[d:d + c], parts[r][self.rank], f"rank {self.rank}: {op}: the block from rank {r}")

        request = self._collective(op, None, [flat[d:d + c].copy() for c, d in zip(scounts, sdispls)], finish)
        return request, recv.itemsize * (others(scounts, self.rank) + others(rcounts, self.rank))

    def _start_allreduce(self, op: str, array: np.ndarray, combine=_sum, nbytes: int | None = None):
        """In-place ``combine`` (a sum unless told) over the group; bytes of a ring unless told."""
        flat = _flat(array, f"rank {self.rank}: {op}")

        def finish(parts, slot):
            _put(flat, combine([parts[r] for r in range(self.size)]), f"rank {self.rank}: {op}")

        # a MAX must not match a SUM at the same position: the operation is part of the match
        request = self._collective(op if combine is _sum else f"{op}({combine.__name__})", None, flat.copy(), finish)
        return request, 2 * ring_bytes(array.nbytes, self.size) if nbytes is None else nbytes

    def Bcast(self, array: np.ndarray, root: int, layer: str) -> None:
        self._call("Bcast", layer, f"root {root}", self._start_bcast, array, root)

    def Reduce(self, send: np.ndarray, recv: np.ndarray | None, root: int, layer: str) -> None:
        self._call("Reduce", layer, f"root {root}", self._start_reduce, send, recv, root)

    def Ireduce(self, send: np.ndarray, recv: np.ndarray | None, root: int, layer: str) -> _Request:
        return self._start("Ireduce", layer, f"root {root}", self._start_reduce, send, recv, root)

    def Scatterv(self, send, counts, displs, recv: np.ndarray, root: int, layer: str) -> None:
        self._call("Scatterv", layer, f"root {root}", self._start_scatterv, send, counts, displs, recv, root)

    def Iscatterv(self, send, counts, displs, recv: np.ndarray, root: int, layer: str) -> _Request:
        return self._start("Iscatterv", layer, f"root {root}", self._start_scatterv, send, counts, displs, recv, root)

    def Gatherv(self, send: np.ndarray, recv, counts, displs, root: int, layer: str) -> None:
        self._call("Gatherv", layer, f"root {root}", self._start_gatherv, send, recv, counts, displs, root)

    def Igatherv(self, send: np.ndarray, recv, counts, displs, root: int, layer: str) -> _Request:
        return self._start("Igatherv", layer, f"root {root}", self._start_gatherv, send, recv, counts, displs, root)

    def Allgatherv(self, send: np.ndarray | None, recv: np.ndarray, counts, displs, layer: str) -> None:
        """``send`` None: in place, this rank's block already at its place in ``recv``."""
        if send is None:
            send = _flat(recv, f"rank {self.rank}: Allgatherv")[displs[self.rank]:displs[self.rank] + counts[self.rank]]
        self._call("Allgatherv", layer, "group", self._start_gatherv, send, recv, counts, displs, None)

    def Reduce_scatter(self, send: np.ndarray, recv: np.ndarray, counts, layer: str) -> None:
        self._call("Reduce_scatter", layer, "group", self._start_reduce_scatter, send, recv, counts)

    def Ireduce_scatter(self, send: np.ndarray, recv: np.ndarray, counts, layer: str) -> _Request:
        return self._start("Ireduce_scatter", layer, "group", self._start_reduce_scatter, send, recv, counts)

    def Alltoallv(self, send, scounts, sdispls, recv, rcounts, rdispls, layer: str) -> None:
        self._call("Alltoallv", layer, "group", self._start_alltoallv, send, scounts, sdispls, recv, rcounts, rdispls)

    def Ialltoallv(self, send, scounts, sdispls, recv, rcounts, rdispls, layer: str) -> _Request:
        return self._start("Ialltoallv", layer, "group", self._start_alltoallv,
                           send, scounts, sdispls, recv, rcounts, rdispls)

    def Allreduce(self, array: np.ndarray, layer: str) -> None:
        """In-place sum over the group."""
        self._call("Allreduce", layer, "group", self._start_allreduce, array)

    def Iallreduce(self, array: np.ndarray, layer: str) -> _Request:
        """Start an in-place sum over the group; ``Wait`` on the returned request."""
        return self._start("Iallreduce", layer, "group", self._start_allreduce, array)

    def barrier(self, label: str = "barrier", patient: bool = False) -> None:
        self._call("Barrier", label, "group", self._start_barrier)

    def root_value(self, value, label: str):
        """Rank 0's ``value`` on every rank (threads wait without spinning here anyway)."""
        return self.allgather_object(value, label)[0]

    def _start_barrier(self, op: str) -> tuple[_Request, int]:
        return self._collective(op, None, None, _nothing), 0

    # ------------------------------------------------------------- shared memory (threads share it all)
    def on_one_node(self) -> bool:
        return True

    def node_size(self) -> int:
        return self.size

    def shared_arrays(self, owner_counts: list[int]) -> tuple[object, list[np.ndarray]]:
        """One float32 segment of ``owner_counts[r]`` items per rank r, the same arrays on every
        rank (collective).  Returns (window, segments)."""

        def finish(parts, slot):
            if len({tuple(p) for p in parts.values()}) > 1:
                raise ValueError(f"shared_arrays: members passed different owner counts {parts}: expected one list")
            if "segments" not in slot:
                slot["segments"] = [np.zeros(int(n), np.float32) for n in owner_counts]
            return slot["segments"]

        segments = self._collective("shared_arrays", None, list(owner_counts), finish).Wait()
        window = ("window", segments)
        self._windows.append(window)
        return window, segments

    def memory_fence(self, win, label: str) -> None:
        """A barrier: after it, every rank's writes are visible to every other (the lock orders them)."""
        self._call("Barrier(shm)", label, "group", self._start_barrier)

    # ------------------------------------------------------------- objects (setup only)
    def _start_objects(self, op: str, value, root: int | None):
        """Pickled, as mpi4py sends them: every receiver gets its own copy; no bytes counted."""

        def finish(parts, slot):
            if root is None or self.rank == root:
                return [pickle.loads(parts[r]) for r in range(self.size)]
            return None

        return self._collective(op, root, pickle.dumps(value), finish), 0

    def allgather_object(self, value, label: str = "allgather(objects)") -> list:
        return self._call("allgather", label, "group", self._start_objects, value, None)

    def gather_object(self, value, root: int = 0, label: str = "gather(objects)") -> list | None:
        return self._call("gather", label, f"root {root}", self._start_objects, value, root)

    def any(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is true on any rank."""
        value = np.array([1 if flag else 0], np.int32)
        self._call("Allreduce", "stop-signal vote", "group", self._start_allreduce, value, _max, value.nbytes)
        return bool(value[0])

    def allreduce_dict(self, values: dict[str, float]) -> dict[str, float]:
        """Sum per key over the group (metrics); keys may differ between ranks."""
        keys = sorted(set().union(*self.allgather_object(sorted(values), "metrics")))
        array = np.array([values.get(k, 0.0) for k in keys], np.float64)
        self._call("Allreduce", "metrics", "group", self._start_allreduce, array, _sum, array.nbytes)
        return dict(zip(keys, array.tolist()))

    def abort(self, code: int = 1) -> None:
        """End every rank of the group: raises :class:`LocalAbort` here and in every other rank's
        next (or current) call."""
        reason = f"rank {self.world_rank} called abort({code})"
        self.group.abort(reason, self.world_rank)
        raise LocalAbort(f"group aborted: {reason}", self.world_rank)


def _nothing(parts, slot) -> None:
    return None


def _max(blocks: list[np.ndarray]) -> np.ndarray:
    return np.max(blocks, axis=0)


# ------------------------------------------------------------------ running ranks as threads

def run_ranks(n: int, fn: Callable[[LocalComm], Any], timeout: float = 30.0, group: LocalGroup | None = None
              ) -> list:
    """``fn(comm)`` on one thread per rank of a new :class:`LocalGroup` (or ``group``); the results
    in rank order.

    The first exception a rank raises aborts the others and is re-raised here with a note naming
    the rank; a run still going after ``timeout`` seconds raises TimeoutError naming the call each
    unfinished rank is in (a deadlock becomes a test failure, not a hang).  While the ranks run,
    numpy's BLAS has an equal share of the cores per rank (:func:`singa_mpi.threads.shared_by_threads`)."""
    group = group if group is not None else LocalGroup(n, timeout=None)
    results: list = [None] * n
    errors: list[tuple[int, BaseException]] = []  # in the order they happened
    lock = threading.Lock()

    def body(rank: int) -> None:
        try:
            results[rank] = fn(group.comms[rank])
        except BaseException as exc:  # noqa: B902 -- reported to the caller's thread
            with lock:
                errors.append((rank, exc))
            group.abort(f"rank {rank} raised {type(exc).__name__}", rank)

    threads = [threading.Thread(target=body, args=(r,), name=f"local-rank-{r}", daemon=True) for r in range(n)]
    with shared_by_threads(n):  # the ranks share this process's cores, BLAS threads included
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
    stuck = [r for r, thread in enumerate(threads) if thread.is_alive()]
    if errors:
        # the cause, not the aborts it made other ranks raise
        rank, exc = next(((r, e) for r, e in errors if not (isinstance(e, LocalAbort) and e.origin != r)), errors[0])
        exc.add_note(f"raised on rank {rank} of {n} (run_ranks)")
        raise exc
    if stuck:
        where = "; ".join(f"rank {r}: {_pending(group.comms[r])}" for r in stuck)
        group.abort(f"timeout after {timeout:g}s")
        raise TimeoutError(f"{len(stuck)} of {n} ranks still running after {timeout:g}s (a deadlock?): {where}")
    return results


def _pending(comm: LocalComm) -> str:
    span = comm.tracer.pending("comm")
    return span.describe() if span is not None else "not in a communication call"
