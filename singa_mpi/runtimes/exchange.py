"""Connection layers: the planner's exchanges executed with a communicator (a runtime's part, not
layer maths: they see ranks, which no layer in :mod:`singa_mpi.layers` does).

Forward and backward are mirror pairs (as in ChainerMN):

=================  ==========================  =================================
SINGA type         forward (data)              backward (gradient)
=================  ==========================  =================================
kBridgeSrc/Dst     Send -> Recv                Recv <- Send
kSplit             Bcast from the holder       Reduce (sum) to the holder
kSlice             Scatterv from the holder    Gatherv to the holder
kConcate           Gatherv to one receiver     Scatterv from it
kConcate           Allgatherv                  Reduce_scatter (sum)
kConcate           Alltoallv                   Alltoallv
any, pipelined     Isend / Recv per piece      Isend / Irecv per piece (summed)
=================  ==========================  =================================

In a pipelined step every exchange sends its pieces as point-to-point messages (the last row): a
collective would make its members meet in one micro-batch's slot (see
:func:`singa_mpi.program.passes.message_calls`).

The layer does not choose its calls: the rank's step program names each one (operation, peer,
root, tag: :func:`singa_mpi.program.build.exchange_calls`) and the runtime hands the layer its
forward and backward call.  Backward exchanges are started non-blocking
(:meth:`ExchangeLayer.start_backward`); while they are in flight the rank computes the weight
gradients queued by the layers above (see :class:`~singa_mpi.params.GradientQueue`), then waits
(:meth:`ExchangeLayer.finish_backward`), as the program orders.

Every exchange is a list of pieces (rows x features of the source layer's
logical output) that rank ``src`` sends to rank ``dst``; the MPI operation only
decides how the packed pieces travel.  Gradients coming back are *added* into
the holder's gradient, which is the sum a Split needs.  Label exchanges
(``kind == "aux"``) move int32 labels forward only and publish them as
``self.aux`` for the loss layer.
"""
from __future__ import annotations

import math

import numpy as np

from singa_mpi.layers.base import Layer
from singa_mpi.params import GradientQueue
from singa_mpi.planner.regions import Piece, Region
from singa_mpi.program.rules import MESSAGES


def _local_index(held: Region, piece: Region, ndim: int) -> tuple[slice, ...]:
    """Index of ``piece`` inside an array that holds ``held`` (rows, features, rest...)."""
    rows = slice(piece.rows[0] - held.rows[0], piece.rows[1] - held.rows[0])
    if ndim == 1:
        return (rows,)
    feats = slice(piece.features[0] - held.features[0], piece.features[1] - held.features[0])
    return (rows, feats)


class _Together:
    """Several started receives completed by one ``Wait`` (an exchange sent as messages gets a piece
    from each of several ranks; its program waits once)."""

    def __init__(self, requests: list):
        self.requests = requests

    def Wait(self) -> None:
        for request in self.requests:
            request.Wait()


class ExchangeLayer(Layer):
    """One rank's side of an exchange (see the module docstring)."""

    num_srcs = (0, 1)

    def __init__(self, sub, comm, conf, calls: dict):
        """``sub``: the plan's entry; ``calls``: the program's calls for each direction ("forward",
        and "backward" when gradients flow back), in order."""
        super().__init__(conf)
        self.calls = calls
        # weight-gradient GEMMs to run while a backward exchange is in flight (set by the runtime)
        self.queue: GradientQueue | None = None
        ex = sub.exchange
        self.sub, self.ex, self.name = sub, ex, sub.name
        self.rank = sub.rank
        # pieces as point-to-point messages (a pipeline's exchange): no collective, no group of its own
        self.messages = sub.role == "collective" and ex.forward_op == MESSAGES[0]
        self.comm = comm.sub(ex.group) if sub.role == "collective" and not self.messages else comm
        self.members = list(ex.group)
        self.held = ex.holders.get(self.rank)
        self.need = ex.needs.get(self.rank)
        self.rest = tuple(ex.rest_shape)
        self.labels = ex.kind == "aux"
        self.dtype = np.int32 if self.labels else np.float32
        self.sends = ex.sends_of(self.rank)  # by receiver
        self.recvs = ex.recvs_of(self.rank)  # by holder
        # Allgatherv: a holder sends its whole held region once, to everybody
        self.own = [Piece(self.rank, self.rank, self.held)] if self.held is not None else []
        # Reduce_scatter: the gradient blocks of every holder, in rank order
        self.held_blocks = [Piece(r, self.rank, region) for r, region in sorted(ex.holders.items())]
        self._requests: list = []
        self._pending: tuple | None = None  # a backward call started and not yet waited for
        self._buffers: dict[str, np.ndarray] = {}
        self._layouts: dict[tuple[int, str], tuple[list[int], list[int]]] = {}

    # ------------------------------------------------------------- helpers
    def _shape(self, region: Region) -> tuple[int, ...]:
        if self.labels:
            return (region.nrows,)
        return (region.nrows, region.nfeatures) + self.rest

    def _size(self, region: Region) -> int:
        return math.prod(self._shape(region))

    def _buffer(self, key: str, shape, dtype=None) -> np.ndarray:
        """A buffer allocated on first use and reused every step (its size never changes)."""
        shape = tuple(shape) if not isinstance(shape, int) else (shape,)
        dtype = dtype or self.dtype
        buf = self._buffers.get(key)
        if buf is None or buf.shape != shape or buf.dtype != dtype:
            buf = self._buffers[key] = np.empty(shape, dtype)
        return buf

    def _empty(self, region: Region | None, key: str = "out") -> np.ndarray:
        return self._buffer(key, self._shape(region) if region else (0,))

    def _pack(self, array: np.ndarray, held: Region, pieces: list[Piece], by: str, name: str = "send"
              ) -> tuple[np.ndarray, list[int], list[int]]:
        """Pieces of ``array`` (holding ``held``) in one buffer; counts/displs per group member.

        A single piece that is the whole (contiguous) array is sent as it is, without a copy."""
        counts, displs = self._layout(pieces, by)
        if len(pieces) == 1 and pieces[0].region == held and array.flags.c_contiguous:
            return array.reshape(-1), counts, displs
        buf = self._buffer(name, sum(counts), array.dtype)
        offset = 0
        for p in pieces:
            n = self._size(p.region)
            buf[offset:offset + n].reshape(self._shape(p.region))[...] = array[_local_index(held, p.region, array.ndim)]
            offset += n
        return buf, counts, displs

    def _layout(self, pieces: list[Piece], by: str) -> tuple[list[int], list[int]]:
        """Counts and displacements per group member of ``pieces`` grouped by their ``by``
        ("src" or "dst") rank; fixed for the run, so computed once per piece list."""
        key = (id(pieces), by)
        if key not in self._layouts:
            counts = [0] * len(self.members)
            position = {rank: i for i, rank in enumerate(self.members)}
            for p in pieces:
                counts[position[getattr(p, by)]] += self._size(p.region)
            self._layouts[key] = (counts, [int(d) for d in np.cumsum([0] + counts[:-1])])
        return self._layouts[key]

    def _unpack(self, buf: np.ndarray, pieces, into: np.ndarray, region: Region, add: bool) -> None:
        offset = 0
        for p in pieces:
            n = self._size(p.region)
            block = buf[offset:offset + n].reshape(self._shape(p.region))
            index = _local_index(region, p.region, into.ndim)
            if add:
                into[index] += block
            else:
                into[index] = block
            offset += n

    def edge(self) -> tuple[str, str]:
        return self.ex.src_layer, self.ex.dst_layer

    def _wait_sends(self) -> None:
        for request in self._requests:
            self.comm.Wait(request, self.name, "Wait(Isend)")
        self._requests = []

    def close(self) -> None:
        """Complete the sends of the last pass (their requests would outlive MPI_Finalize)."""
        self._wait_sends()

    def poll(self) -> bool:
        """Move this layer's sends on without waiting; True once none is under way."""
        self._requests = self.comm.progress(self._requests)
        return not self._requests

    # ------------------------------------------------------------- forward
    def setup(self, src_shapes):
        return self._shape(self.need)[1:] if self.need else ()

    def forward(self, inputs: list[np.ndarray], train: bool) -> np.ndarray:
        self._wait_sends()
        x = np.ascontiguousarray(inputs[0], self.dtype) if inputs else None
        out = self._exchange_forward(x)
        if self.labels:
            self.aux = out
            return np.empty((0,), np.float32)
        return out

    def _exchange_forward(self, x: np.ndarray | None) -> np.ndarray:
        out = self._empty(self.need)
        if self.messages:
            self._forward_messages(x, out)
            return out
        call = self.calls["forward"][0]
        if call.op == "Isend":
            self._requests.append(self.comm.Isend(x, call.peer, call.tag, self.name))
        elif call.op == "Recv":
            self.comm.Recv(out, call.peer, call.tag, self.name)
        elif call.op == "Bcast":
            if self.rank == call.root:
                out[...] = x
            self.comm.Bcast(out, self.members.index(call.root), self.name)
        else:
            self._collective_forward(call.op, x, out, call.root)
        return out

    def _send_piece(self, call, array: np.ndarray, held: Region, piece: Region, key: str) -> None:
        """The program's ``Isend`` of ``piece`` of ``array`` (holding ``held``): the array itself where
        the piece is all of it, else a copy into the buffer ``key`` (kept until the send completes)."""
        if piece == held and array.flags.c_contiguous:
            buf = array
        else:
            buf = self._buffer(key, self._shape(piece), array.dtype)
            buf[...] = array[_local_index(held, piece, array.ndim)]
        self._requests.append(self.comm.Isend(buf, call.peer, call.tag, self.name))

    def _forward_messages(self, x: np.ndarray | None, out: np.ndarray) -> None:
        """The program's calls in order: an ``Isend`` of each piece another rank needs, then a ``Recv``
        of each piece another rank holds; the piece this rank holds and needs is copied."""
        to = {p.dst: p.region for p in self.sends}
        from_ = {p.src: p.region for p in self.recvs}
        own = from_.get(self.rank)
        if own is not None and x is not None:
            out[_local_index(self.need, own, out.ndim)] = x[_local_index(self.held, own, x.ndim)]
        for call in self.calls["forward"]:
            if call.op == "Isend":
                self._send_piece(call, x, self.held, to[call.peer], f"send>{call.peer}")
            else:
                region = from_[call.peer]
                buf = self._buffer(f"recv<{call.peer}", self._shape(region))
                self.comm.Recv(buf, call.peer, call.tag, self.name)
                out[_local_index(self.need, region, out.ndim)] = buf

    def _collective_forward(self, op: str, x: np.ndarray | None, out: np.ndarray, root: int | None) -> None:
        """Scatterv, Gatherv, Allgatherv or Alltoallv of the packed pieces."""
        if x is None:
            send, scounts, sdispls = np.empty(0, self.dtype), [0] * len(self.members), [0] * len(self.members)
        else:
            pieces = self.own if op == "Allgatherv" else self.sends
            send, scounts, sdispls = self._pack(x, self.held, pieces, "dst")
        rcounts, rdispls = self._layout(self.recvs, "src")
        recv = self._buffer("recv", sum(rcounts))
        name, groot = self.name, (self.members.index(root) if root is not None else None)
        if op == "Scatterv":
            self.comm.Scatterv(send, scounts, sdispls, recv, groot, name)
        elif op == "Gatherv":
            self.comm.Gatherv(send, recv, rcounts, rdispls, groot, name)
        elif op == "Allgatherv":
            self.comm.Allgatherv(send, recv, rcounts, rdispls, name)
        else:
            self.comm.Alltoallv(send, scounts, sdispls, recv, rcounts, rdispls, name)
        if self.need is not None:
            self._unpack(recv, self.recvs, out, self.need, add=False)

    # ------------------------------------------------------------- backward
    def backward(self, grad: np.ndarray | None, need: list[bool]) -> list[np.ndarray | None]:
        """The whole return trip at once (the executor splits it, to hide queued work behind it)."""
        self.start_backward(grad, need)
        if self.queue is not None and self._pending is not None and self._pending[0] is not None:
            self.queue.run()
        return self.finish_backward()

    def start_backward(self, grad: np.ndarray | None, need: list[bool]) -> None:
        """Start the program's backward call (non-blocking): the gradients of what this rank needed
        travel back to the holders; :meth:`finish_backward` waits and unpacks."""
        self._wait_sends()
        if not self.ex.with_backward:
            self._pending = (None, None, None, [None] * len(need))
            return
        # the gradient of what this rank held: written by the one receive that fills it, or summed
        gx = self._buffer("grad_in", self._shape(self.held), np.float32) if self.held is not None else None
        g = grad if grad is not None else (np.zeros(self._shape(self.need), np.float32) if self.need else None)
        g = np.ascontiguousarray(g, np.float32) if g is not None else None
        if self.messages:
            self._pending = self._start_backward_messages(g, gx, need)
            return
        call = self.calls["backward"][0]
        op, name = call.op, self.name
        groot = self.members.index(call.root) if call.root is not None else None
        request, unpack = None, None
        if op == "Isend":
            self._requests.append(self.comm.Isend(g, call.peer, call.tag, name))
        elif op == "Irecv":
            request = self.comm.Irecv(gx, call.peer, call.tag, name)
        elif op == "Ireduce":
            request = self.comm.Ireduce(g, gx if self.rank == call.root else None, groot, name)
        elif op == "Ireduce_scatter":
            send, counts, _ = self._pack(g, self.need, self.held_blocks, "src", "grad_send")
            recv = gx.reshape(-1) if gx is not None else np.empty(0, np.float32)
            request = self.comm.Ireduce_scatter(send, recv, counts, name)
        else:  # Igatherv, Iscatterv, Ialltoallv: the forward pieces travel back, and add up
            if gx is not None:
                gx.fill(0.0)
            if g is not None:
                send, scounts, sdispls = self._pack(g, self.need, self.recvs, "src", "grad_send")
            else:
                send, scounts, sdispls = np.empty(0, np.float32), [0] * len(self.members), [0] * len(self.members)
            rcounts, rdispls = self._layout(self.sends, "dst")
            recv = self._buffer("grad_recv", sum(rcounts), np.float32)
            if op == "Igatherv":
                request = self.comm.Igatherv(send, recv, rcounts, rdispls, groot, name)
            elif op == "Iscatterv":
                request = self.comm.Iscatterv(send, scounts, sdispls, recv, groot, name)
            else:
                request = self.comm.Ialltoallv(send, scounts, sdispls, recv, rcounts, rdispls, name)
            if gx is not None:
                unpack = lambda: self._unpack(recv, self.sends, gx, self.held, add=True)  # noqa: E731
        self._pending = (request, unpack, op, [gx] if need else [])

    def _start_backward_messages(self, g: np.ndarray | None, gx: np.ndarray | None, need: list[bool]) -> tuple:
        """The forward's pieces back as messages (the program's calls in order): an ``Isend`` of the
        gradient of each piece another rank sent here, an ``Irecv`` of the gradient of each piece sent
        from here; the gradient of the piece kept here is added at once, the received ones at the wait
        (a piece several ranks received comes back from each of them: the sum a Split needs)."""
        came_from = {p.src: p.region for p in self.recvs}  # what this rank received, by holder
        went_to = {p.dst: p.region for p in self.sends}  # what it sent, by receiver
        if gx is not None:
            gx.fill(0.0)
            own = came_from.get(self.rank)
            if own is not None and g is not None:
                gx[_local_index(self.held, own, gx.ndim)] += g[_local_index(self.need, own, g.ndim)]
        started = []
        for call in self.calls["backward"]:
            if call.op == "Isend":
                self._send_piece(call, g, self.need, came_from[call.peer], f"grad>{call.peer}")
            else:
                region = went_to[call.peer]
                buf = self._buffer(f"grad<{call.peer}", self._shape(region), np.float32)
                started.append((self.comm.Irecv(buf, call.peer, call.tag, self.name), buf, region))

        def unpack() -> None:
            for _, buf, region in started:
                gx[_local_index(self.held, region, gx.ndim)] += buf

        request = _Together([r for r, _, _ in started]) if started else None
        return request, unpack if started else None, "Irecv", [gx] if need else []

    def finish_backward(self) -> list[np.ndarray | None]:
        """Wait for the call :meth:`start_backward` started; the gradients for this layer's sources."""
        request, unpack, op, grads = self._pending
        self._pending = None
        if request is not None:
            self.comm.Wait(request, self.name, f"Wait({op})")
        if unpack is not None:
            unpack()
        return grads
