"""The one module that talks MPI.

:class:`MPIComm` wraps an ``mpi4py`` communicator with buffer-based methods
named after the MPI calls the planner schedules (Send/Recv, Bcast, Reduce,
Scatterv, Gatherv, Allgatherv, Reduce_scatter, Alltoallv, Allreduce).  Every
call is a tracer span (bytes, seconds, per layer label, and the world ranks it
waits for); the stall watchdog of :mod:`singa_mpi.communication.liveness` reads
the open span (what is pending, where, since when, on whom), so a stalled step
and the rank that holds it up can be named.

Layers, algorithms and the planner never import this module; they receive a
communicator object.  Nothing on the `check`/`plan` path imports it.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time

import numpy as np

# Open MPI's non-blocking Allreduce (libnbc) picks a ring or binomial tree by default; on the gradient
# buckets (megabytes) Rabenseifner's algorithm is 1.4x faster and on par with MPICH (mnist_mlp, 2 ranks,
# SINGA_MPI_SHM=0: 916-938 samples/s by default, 1288-1300 with it; MPICH 1272-1302).  MCA parameters
# are read at MPI_Init, so before the import; the user's own setting wins; other MPIs ignore it.
os.environ.setdefault("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3")
from mpi4py import MPI  # noqa: E402 - the only mpi4py import in the package

from singa_mpi.communication.base import others, ring_bytes, rooted_bytes, scatter_sum_bytes
from singa_mpi.communication.liveness import wait_until_read
from singa_mpi.errors import PeerLost
from singa_mpi.tracing import Tracer

_MPI_TYPES = {np.dtype(np.float32): MPI.FLOAT, np.dtype(np.int32): MPI.INT, np.dtype(np.float64): MPI.DOUBLE}


class MPIComm:
    """A worker group's communicator; ``sub(ranks)`` gives communicators of subgroups.

    Every call is a span of the shared :class:`~singa_mpi.tracing.Tracer`
    (category ``"comm"``, named by the caller's label) with the bytes it moved
    (see :mod:`singa_mpi.communication.base` for how they are counted).
    """

    def __init__(self, comm: MPI.Comm | None = None, tracer: Tracer | None = None, owned: bool = False,
                 status=None):
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.rank = self.comm.Get_rank()
        self.size = self.comm.Get_size()
        self.tracer = tracer if tracer is not None else Tracer(self.rank)
        self.status = status  # this rank's liveness.StatusRecord (None: not kept), shared with sub-communicators
        self._owned = owned  # created here (a split or a group): freed by ``free``
        self._subs: dict[tuple[int, ...], MPIComm] = {}
        self._windows: list = []
        self.world_ranks = self._world_ranks()
        self._others = tuple(r for i, r in enumerate(self.world_ranks) if i != self.rank)

    def _world_ranks(self) -> tuple[int, ...]:
        """The world rank of each member (the stall watchdog names ranks as the launcher numbers them)."""
        if self.comm == MPI.COMM_WORLD:
            return tuple(range(self.size))
        mine, whole = self.comm.Get_group(), MPI.COMM_WORLD.Get_group()
        ranks = MPI.Group.Translate_ranks(mine, list(range(self.size)), whole)
        mine.Free()
        whole.Free()
        return tuple(int(r) for r in ranks)

    # ------------------------------------------------------------- bookkeeping
    def _enter(self, op: str, layer: str, peer: str, tag: int | None = None, partner: int | None = None):
        """Open the call's span; it waits on ``partner`` (a member's rank) or on every other member."""
        awaits = self._others if partner is None else (self.world_ranks[partner],)
        return self.tracer.begin(layer, "comm", {"op": op, "peer": peer, "tag": tag, "awaits": awaits})

    def _leave(self, span, label: str, nbytes: int) -> None:
        self.tracer.end(span, int(nbytes))

    @contextlib.contextmanager
    def _setting_up(self, op: str, label: str, members: tuple[int, ...] | None = None):
        """A collective call that makes communicators or windows, as a span like any other: it waits
        for every member (``members``: this communicator's ranks taking part; all by default), so
        the stall watchdog must see it (a rank stopped during start-up holds the others here)."""
        awaits = self._others if members is None else tuple(self.world_ranks[r] for r in members if r != self.rank)
        span = self.tracer.begin(label, "comm", {"op": op, "peer": "group", "tag": None, "awaits": awaits})
        try:
            yield
        finally:
            self._leave(span, label, 0)

    @staticmethod
    def _buf(array: np.ndarray):
        return [array, _MPI_TYPES[array.dtype]]

    @staticmethod
    def _vbuf(array: np.ndarray, counts, displs):
        return [array, (list(counts), list(displs)), _MPI_TYPES[array.dtype]]

    # ------------------------------------------------------------- subgroups
    def sub(self, ranks: tuple[int, ...]) -> "MPIComm":
        """The communicator of ``ranks`` (all members must call this, in the same order)."""
        ranks = tuple(ranks)
        if ranks == tuple(range(self.size)):
            return self
        if ranks not in self._subs:
            whole = self.comm.Get_group()
            group = whole.Incl(list(ranks))
            with self._setting_up("Create_group", "communicators", ranks):
                made = self.comm.Create_group(group)
            self._subs[ranks] = MPIComm(made, self.tracer, owned=True, status=self.status)
            group.Free()
            whole.Free()
        return self._subs[ranks]

    def split(self, color: int, key: int) -> "MPIComm":
        """MPI_Comm_split: the communicator of the ranks that passed the same ``color`` (collective)."""
        with self._setting_up("Split", "communicators"):
            made = self.comm.Split(color, key)
        return MPIComm(made, self.tracer, owned=True, status=self.status)

    def free(self) -> None:
        """Release the sub-communicators and shared windows made here, and this one if made here
        (before MPI_Finalize: MPICH reports communicators still referenced at exit)."""
        for sub in self._subs.values():
            sub.free()
        self._subs.clear()
        for win in self._windows:
            win.Unlock_all()
            win.Free()
        self._windows.clear()
        if self._owned and self.comm != MPI.COMM_NULL:
            self.comm.Free()

    # ------------------------------------------------------------- point to point
    def Isend(self, array: np.ndarray, dest: int, tag: int, layer: str):
        start = self._enter("Isend", layer, f"to rank {dest}", tag, dest)
        request = self.comm.Isend(self._buf(array), dest=dest, tag=tag)
        self._leave(start, layer, array.nbytes)
        return request

    def Send(self, array: np.ndarray, dest: int, tag: int, layer: str) -> None:
        start = self._enter("Send", layer, f"to rank {dest}", tag, dest)
        self.comm.Send(self._buf(array), dest=dest, tag=tag)
        self._leave(start, layer, array.nbytes)

    def Recv(self, array: np.ndarray, source: int, tag: int, layer: str) -> None:
        start = self._enter("Recv", layer, f"from rank {source}", tag, source)
        self.comm.Recv(self._buf(array), source=source, tag=tag)
        self._leave(start, layer, array.nbytes)

    def Wait(self, request, layer: str, what: str = "Wait") -> None:
        start = self._enter(what, layer, "request")
        request.Wait()
        self._leave(start, layer, 0)

    def progress(self, requests: list) -> list:
        """Let the library move the started ``requests`` on without blocking; those still under way.
        A large message (rendezvous) leaves only while its sender is inside the library: a rank that
        computes on after an Isend would hold its receiver until its next call."""
        return [request for request in requests if not request.Test()]

    # ------------------------------------------------------------- servers: any source, many requests
    # A server waits for whichever worker's message comes first; a worker for all of a step's replies.
    def Waitany(self, requests: list, layer: str, awaits: tuple[int, ...] | None = None,
                patient: bool = False) -> tuple[int, int]:
        """(index, source member) of the first of ``requests`` to complete; ``awaits``: the members
        that may send (the stall watchdog names them); ``patient``: a wait of any length is normal
        (the stall watchdog leaves it to the ranks that wait on a reply)."""
        awaited = self._others if awaits is None else tuple(self.world_ranks[r] for r in awaits)
        span = self.tracer.begin(layer, "comm", {"op": "Waitany", "peer": "any rank", "tag": None, "awaits": awaited,
                                                 "patient": patient})
        status = MPI.Status()
        while True:  # test and yield, not MPI's spin: a server shares its core on an oversubscribed node
            index, done = _lost_peer_as_error(MPI.Request.Testany, requests, status)
            if done:
                break
            os.sched_yield()
        self._leave(span, layer, 0)
        return index, status.Get_source()

    def Waitall(self, requests: list, layer: str, awaits: tuple[int, ...] | None = None) -> None:
        awaited = self._others if awaits is None else tuple(self.world_ranks[r] for r in awaits)
        span = self.tracer.begin(layer, "comm", {"op": "Waitall", "peer": "servers", "tag": None, "awaits": awaited})
        while not _lost_peer_as_error(MPI.Request.Testall, requests):  # as Waitany: yield while servers work
            os.sched_yield()
        self._leave(span, layer, 0)

    def Cancel(self, requests: list, label: str) -> None:
        """Withdraw receives that will never be matched (a server's, once every worker said BYE)."""
        for request in requests:
            if request != MPI.REQUEST_NULL:
                request.Cancel()
                request.Wait()

    def send_object(self, value, dest: int, tag: int, label: str) -> None:
        """A Python object to one member (setup, control messages and checkpoints: never per layer)."""
        start = self._enter("send", label, f"to rank {dest}", tag, dest)
        self.comm.send(value, dest=dest, tag=tag)
        self._leave(start, label, 0)

    def recv_object(self, source: int, tag: int, label: str, patient: bool = False):
        """``patient``: a long wait is normal (a checkpoint that waits for the other worker groups)."""
        start = self.tracer.begin(label, "comm", {"op": "recv", "peer": f"from rank {source}", "tag": tag,
                                                  "awaits": (self.world_ranks[source],), "patient": patient})
        value = self.comm.recv(source=source, tag=tag)
        self._leave(start, label, 0)
        return value

    # ------------------------------------------------------------- collectives
    def Bcast(self, array: np.ndarray, root: int, layer: str) -> None:
        start = self._enter("Bcast", layer, f"root {root}")
        self.comm.Bcast(self._buf(array), root=root)
        self._leave(start, layer, array.nbytes * (self.size - 1 if self.rank == root else 1))

    def Reduce(self, send: np.ndarray, recv: np.ndarray | None, root: int, layer: str) -> None:
        start = self._enter("Reduce", layer, f"root {root}")
        self.comm.Reduce(self._buf(send), self._buf(recv) if recv is not None else None, op=MPI.SUM, root=root)
        self._leave(start, layer, send.nbytes * (self.size - 1 if self.rank == root else 1))

    def Scatterv(self, send: np.ndarray | None, counts, displs, recv: np.ndarray, root: int, layer: str) -> None:
        start = self._enter("Scatterv", layer, f"root {root}")
        sendbuf = self._vbuf(send, counts, displs) if self.rank == root else None
        self.comm.Scatterv(sendbuf, self._buf(recv), root=root)
        self._leave(start, layer, rooted_bytes(self.rank, root, counts, recv))

    def Gatherv(self, send: np.ndarray, recv: np.ndarray | None, counts, displs, root: int, layer: str) -> None:
        start = self._enter("Gatherv", layer, f"root {root}")
        recvbuf = self._vbuf(recv, counts, displs) if self.rank == root else None
        self.comm.Gatherv(self._buf(send), recvbuf, root=root)
        self._leave(start, layer, rooted_bytes(self.rank, root, counts, send))

    def Allgatherv(self, send: np.ndarray | None, recv: np.ndarray, counts, displs, layer: str) -> None:
        """``send`` None: in place, this rank's block already at its place in ``recv``."""
        start = self._enter("Allgatherv", layer, "group")
        self.comm.Allgatherv(MPI.IN_PLACE if send is None else self._buf(send), self._vbuf(recv, counts, displs))
        self._leave(start, layer, recv.itemsize * (counts[self.rank] * (self.size - 1) + others(counts, self.rank)))

    def Reduce_scatter(self, send: np.ndarray, recv: np.ndarray, counts, layer: str) -> None:
        start = self._enter("Reduce_scatter", layer, "group")
        self.comm.Reduce_scatter(self._buf(send), self._buf(recv), recvcounts=list(counts), op=MPI.SUM)
        self._leave(start, layer, scatter_sum_bytes(self.rank, self.size, counts, send.itemsize))

    def Alltoallv(self, send: np.ndarray, scounts, sdispls, recv: np.ndarray, rcounts, rdispls, layer: str) -> None:
        start = self._enter("Alltoallv", layer, "group")
        self.comm.Alltoallv(self._vbuf(send, scounts, sdispls), self._vbuf(recv, rcounts, rdispls))
        self._leave(start, layer, recv.itemsize * (others(scounts, self.rank) + others(rcounts, self.rank)))

    def Allreduce(self, array: np.ndarray, layer: str) -> None:
        """In-place sum over the group."""
        start = self._enter("Allreduce", layer, "group")
        self.comm.Allreduce(MPI.IN_PLACE, self._buf(array), op=MPI.SUM)
        self._leave(start, layer, 2 * ring_bytes(array.nbytes, self.size))

    def Iallreduce(self, array: np.ndarray, layer: str):
        """Start an in-place sum over the group; ``Wait`` on the returned request."""
        start = self._enter("Iallreduce", layer, "group")
        request = self.comm.Iallreduce(MPI.IN_PLACE, self._buf(array), op=MPI.SUM)
        self._leave(start, layer, 2 * ring_bytes(array.nbytes, self.size))
        return request

    # ------------------------------------------------------------- non-blocking (backward exchanges)
    # Started, then computation runs, then ``Wait``: what the slower rank would make the faster
    # one wait for is spent on queued weight-gradient GEMMs instead (see params.GradientQueue).
    def _start(self, op: str, layer: str, peer: str, nbytes: int, call, partner: int | None = None):
        start = self._enter(op, layer, peer, partner=partner)
        request = call()
        self._leave(start, layer, nbytes)
        return request

    def Irecv(self, array: np.ndarray, source: int, tag: int, layer: str):
        return self._start("Irecv", layer, f"from rank {source}", array.nbytes,
                           lambda: self.comm.Irecv(self._buf(array), source=source, tag=tag), source)

    def Ireduce(self, send: np.ndarray, recv: np.ndarray | None, root: int, layer: str):
        nbytes = send.nbytes * (self.size - 1 if self.rank == root else 1)
        return self._start("Ireduce", layer, f"root {root}", nbytes, lambda: self.comm.Ireduce(
            self._buf(send), self._buf(recv) if recv is not None else None, op=MPI.SUM, root=root))

    def Iscatterv(self, send: np.ndarray | None, counts, displs, recv: np.ndarray, root: int, layer: str):
        sendbuf = self._vbuf(send, counts, displs) if self.rank == root else None
        return self._start("Iscatterv", layer, f"root {root}", rooted_bytes(self.rank, root, counts, recv),
                           lambda: self.comm.Iscatterv(sendbuf, self._buf(recv), root=root))

    def Igatherv(self, send: np.ndarray, recv: np.ndarray | None, counts, displs, root: int, layer: str):
        recvbuf = self._vbuf(recv, counts, displs) if self.rank == root else None
        return self._start("Igatherv", layer, f"root {root}", rooted_bytes(self.rank, root, counts, send),
                           lambda: self.comm.Igatherv(self._buf(send), recvbuf, root=root))

    def Ireduce_scatter(self, send: np.ndarray, recv: np.ndarray, counts, layer: str):
        nbytes = scatter_sum_bytes(self.rank, self.size, counts, send.itemsize)
        return self._start("Ireduce_scatter", layer, "group", nbytes, lambda: self.comm.Ireduce_scatter(
            self._buf(send), self._buf(recv), recvcounts=list(counts), op=MPI.SUM))

    def Ialltoallv(self, send: np.ndarray, scounts, sdispls, recv: np.ndarray, rcounts, rdispls, layer: str):
        nbytes = recv.itemsize * (others(scounts, self.rank) + others(rcounts, self.rank))
        return self._start("Ialltoallv", layer, "group", nbytes, lambda: self.comm.Ialltoallv(
            self._vbuf(send, scounts, sdispls), self._vbuf(recv, rcounts, rdispls)))

    # ------------------------------------------------------------- shared memory (one node)
    def on_one_node(self) -> bool:
        """Whether every rank of this communicator shares one node's memory."""
        with self._setting_up("Split_type", "communicators"):
            node = self.comm.Split_type(MPI.COMM_TYPE_SHARED)
        same = node.Get_size() == self.size
        node.Free()
        return same

    def node_size(self) -> int:
        """How many ranks of this communicator share this rank's node (collective)."""
        with self._setting_up("Split_type", "communicators"):
            node = self.comm.Split_type(MPI.COMM_TYPE_SHARED)
        size = node.Get_size()
        node.Free()
        return size

    def shared_arrays(self, owner_counts: list[int]) -> tuple[object, list[np.ndarray]]:
        """One float32 segment of ``owner_counts[r]`` items per rank r, visible to all ranks.

        Collective.  Returns (window, [segment of rank r for each r]); keep the window alive.
        """
        itemsize = np.dtype(np.float32).itemsize
        with self._setting_up("Win_allocate_shared", "shared memory"):
            win = MPI.Win.Allocate_shared(owner_counts[self.rank] * itemsize, itemsize, comm=self.comm)
        segments = []
        for r, n in enumerate(owner_counts):
            buf, _ = win.Shared_query(r)
            segments.append(np.ndarray((n,), np.float32, buffer=buf) if n else np.zeros(0, np.float32))
        win.Lock_all()
        self._windows.append(win)
        return win, segments

    def memory_fence(self, win, label: str) -> None:
        """Make every rank's writes to the shared window visible to every other rank."""
        start = self._enter("Barrier(shm)", label, "group")
        win.Sync()
        self.comm.Barrier()
        win.Sync()
        self._leave(start, label, 0)

    # ------------------------------------------------------------- objects (setup only)
    def allgather_object(self, value, label: str = "allgather(objects)"):
        start = self._enter("allgather", label, "group")
        result = self.comm.allgather(value)
        self._leave(start, label, 0)
        return result

    def root_value(self, value, label: str):
        """Rank 0's ``value`` on every rank, the others waiting asleep: rank 0 may be timing kernels
        (the cost model choosing a partitioning), and ranks spinning in a blocking call would take
        the cores, or the hyperthreads, it is timing on (they made the timings 1.2-1.7x too slow)."""
        start = self.tracer.begin(label, "comm", {"op": "Ibarrier", "peer": "group", "tag": None,
                                                  "awaits": self._others, "patient": True})
        arrived = self.comm.Ibarrier()
        while not arrived.Test():
            time.sleep(0.002)
        value = self.comm.bcast(value, root=0)
        self._leave(start, label, 0)
        return value

    def gather_object(self, value, root: int = 0, label: str = "gather(objects)"):
        """Python objects to ``root`` (setup and checkpoints only: never on the step's hot path)."""
        start = self._enter("gather", label, f"root {root}")
        result = self.comm.gather(value, root=root)
        self._leave(start, label, 0)
        return result

    def any(self, flag: bool) -> bool:
        """True on every rank if ``flag`` is true on any rank (e.g. a stop signal arrived)."""
        value = np.array([1 if flag else 0], np.int32)
        start = self._enter("Allreduce", "stop-signal vote", "group")
        self.comm.Allreduce(MPI.IN_PLACE, [value, MPI.INT], op=MPI.MAX)
        self._leave(start, "stop-signal vote", value.nbytes)
        return bool(value[0])

    def allreduce_dict(self, values: dict[str, float]) -> dict[str, float]:
        """Sum per key over the group (metrics); keys may differ between ranks."""
        keys = sorted(set().union(*self.allgather_object(sorted(values), "metrics")))
        array = np.array([values.get(k, 0.0) for k in keys], np.float64)
        start = self._enter("Allreduce", "metrics", "group")
        self.comm.Allreduce(MPI.IN_PLACE, [array, MPI.DOUBLE], op=MPI.SUM)
        self._leave(start, "metrics", array.nbytes)
        return dict(zip(keys, array.tolist()))

    def barrier(self, label: str = "barrier", patient: bool = False) -> None:
        """``patient``: waiting long here is normal (a worker group done before the others)."""
        start = self.tracer.begin(label, "comm", {"op": "Barrier", "peer": "group", "tag": None,
                                                  "awaits": self._others, "patient": patient})
        self.comm.Barrier()
        self._leave(start, label, 0)

    def abort(self, code: int = 1) -> None:
        """End every rank of the job now (after this rank's output is out)."""
        sys.stdout.flush()
        sys.stderr.flush()
        # MPI_Abort kills the processes at once, and what is still in the pipe to the launcher would be
        # lost: wait until the launcher has read it (no wait where the output is a file or terminal)
        for fd in (1, 2):
            wait_until_read(fd, limit=0.5)
        MPI.COMM_WORLD.Abort(code)


def _lost_peer_as_error(test, *args):
    """``test(*args)``; an MPI error there (MPICH reports a peer process that died while requests to
    it were pending) becomes PeerLost: the dead rank's guardian names it, this rank need not."""
    try:
        return test(*args)
    except MPI.Exception as err:
        raise PeerLost(f"a rank this one waited for failed ({' '.join(str(err).split())})") from None


def world(tracer: Tracer | None = None, status=None) -> MPIComm:
    return MPIComm(MPI.COMM_WORLD, tracer, status=status)


def world_size() -> int:
    return MPI.COMM_WORLD.Get_size()


def library() -> str:
    """The MPI library mpi4py loaded, in one line ("Open MPI v4.1.4, ...", "MPICH Version: 5.0.2")."""
    first_line = (MPI.Get_library_version().strip().splitlines() or ["unknown MPI"])[0]
    return " ".join(first_line.split(",")[0].split())
