"""Gradient sums and updates through node-shared memory (all workers of the group on one node).

A replicated parameter's values live once per node in an MPI-3 shared window
that every rank reads during forward/backward.  After backward, rank ``r``
owns the chunk ``chunk(size, n, r)`` of each parameter: it forms the summed
gradient of that chunk, runs the updater on it, and a fence makes the new
values visible to all.  This is SINGA's server role co-located with the
workers (each process updates a slice of the parameters, like the "AllReduce"
framework of SINGA's frameworks.md), without messages.

The summed gradient of a chunk comes from one of two places:

* dense params: every rank writes its whole gradient into its own shared
  segment, and the owner of a chunk adds up the ranks' copies of it;
* batch-factored params (an inner product's weight, whose gradient is
  ``grad_out.T @ x`` over the batch rows): every rank writes only its factors,
  its rows of ``a.T`` and ``b``, into shared buffers that stack all ranks' rows,
  and the owner of a row chunk computes it in one GEMM over the whole batch.
  This is sufficient-factor exchange (Poseidon, Zhang et al. 2017) with the
  product sharded by rows: for batch B and a (F, D) weight it moves B·(F + D)
  numbers instead of F·D, no rank writes a whole F×D gradient, and the
  rank-summed gradient is the very GEMM the serial run computes.
"""
from __future__ import annotations

import os

import numpy as np

from singa_mpi.params import Param
from singa_mpi.planner.chunk import chunk
from singa_mpi.sync.base import first_nonfinite



def shared_memory_enabled() -> bool:
    """Whether node-shared memory may be used at all (``SINGA_MPI_SHM=0`` turns it off: gradient sums
    by bucketed Allreduce, Hogwild's groups without one shared copy).  The one reader of the variable."""
    return os.environ.get("SINGA_MPI_SHM", "1") != "0"

class ChunkView(Param):
    """The flat chunk [lo, hi) of a param that this rank sums and updates."""

    def region(self) -> tuple:
        return ("flat", self.lo, self.hi)

    def __init__(self, param: Param, lo: int, hi: int, grad: np.ndarray):  # no super().__init__: it would allocate
        self.conf, self.name = param.conf, param.name
        self.logical_shape, self.shard = param.logical_shape, param.shard
        self.lr_scale, self.wd_scale = param.lr_scale, param.wd_scale
        self.data = param.data.reshape(-1)[lo:hi]
        self.grad = grad
        self.lo, self.hi = lo, hi
        self.factors = self.queue = None
        self.pending, self.row_terms, self.rows_gathered = [], [], False


class FactorSlot:
    """This rank's rows of a batch-factored param's shared factor buffers.

    left:  (rows_here, shape[0]) receives a.T;  right: (rows_here, shape[1]) receives b,
    for this rank's gradient contribution a @ b (a: (shape[0], rows_here)).
    """

    def __init__(self, name: str, left: np.ndarray, right: np.ndarray):
        self.name, self.left, self.right = name, left, right

    def record(self, a: np.ndarray, b: np.ndarray) -> None:
        expected = (self.left.shape[1], self.left.shape[0]), self.right.shape
        if (a.shape, b.shape) != expected:
            raise RuntimeError(f"param {self.name!r}: gradient factors of shapes {a.shape} and {b.shape}, "
                               f"expected {expected[0]} and {expected[1]} (one product over this rank's batch rows)")
        np.copyto(self.left, a.T)
        np.copyto(self.right, b)

    def clear(self) -> None:
        """No contribution this step: zero factors (both: garbage times zero may be NaN)."""
        self.left.fill(0.0)
        self.right.fill(0.0)


class UpdatesItsViewsOnTheNode:
    """What every strategy shares whose params' values live once in node-shared memory (``value_win``)
    while each rank updates only its own views of them (``views``, with their summed gradients)."""

    views: list[ChunkView]
    not_rescuable = ("the params live once in node-shared memory and each rank updates its own chunk of them, "
                     "with that chunk's updater state: the dead rank's chunk went with it (SINGA_MPI_SHM=0 keeps "
                     "whole replicas)")

    def update(self, step: int, updater) -> None:
        for view in self.views:
            updater.update(step, view)

    def publish(self) -> None:
        """After my views are updated: make the new values visible before the next forward."""
        self.comm.memory_fence(self.value_win, "shm(values)")  # type: ignore[attr-defined]

    def owned(self) -> list[Param]:
        return list(self.views)

    def nonfinite_grad(self) -> Param | None:
        """The first of my views whose summed gradient is not finite (each rank looks at its own)."""
        return first_nonfinite(self.views)


class SharedMemorySync(UpdatesItsViewsOnTheNode):
    """Replicated params of ``comm``'s ranks (all of one node) placed in shared memory.

    ``batch_rows`` maps id(param) of the batch-factored params to the number of
    batch rows each rank contributes to its gradient (in rank order); the other
    params are summed densely.
    """

    def __init__(self, comm, params: list[Param], batch_rows: dict[int, list[int]]):
        self.comm = comm
        self.params = params
        n, rank = comm.size, comm.rank
        sizes = [p.data.size for p in params]
        dense = [p for p in params if id(p) not in batch_rows]
        dense_total = sum(p.data.size for p in dense)
        factor_total = sum(sum(batch_rows[id(p)]) * sum(p.data.shape) for p in params if id(p) in batch_rows)
        # values: one copy on the node, in rank 0's segment; dense gradients: one segment per
        # rank; the stacked factors of every rank: after rank 0's dense segment
        self.value_win, value_segments = comm.shared_arrays([sum(sizes) if r == 0 else 0 for r in range(n)])
        self.grad_win, grad_segments = comm.shared_arrays(
            [dense_total + (factor_total if r == 0 else 0) for r in range(n)])
        self.dense_segments = [segment[:dense_total] for segment in grad_segments]
        factor_area = grad_segments[0][dense_total:]
        values = value_segments[0]
        if rank == 0:
            offset = 0
            for p, size in zip(params, sizes):
                values[offset:offset + size] = p.data.reshape(-1)
                offset += size
        comm.memory_fence(self.value_win, "shm(values)")

        self.dense_chunks: list[tuple[int, int, int]] = []  # (offset in the dense segments, lo, hi)
        self.factored: list[tuple[np.ndarray, np.ndarray, int, int, np.ndarray]] = []  # left, right, r0, r1, out
        self.views: list[ChunkView] = []
        self.bytes_read = 0  # per step, from the other ranks' writes (for the communication table)
        value_offset = dense_offset = factor_offset = 0
        for p, size in zip(params, sizes):
            shape = p.data.shape
            p.data = values[value_offset:value_offset + size].reshape(shape)
            value_offset += size
            if id(p) in batch_rows:
                rows_per_rank = batch_rows[id(p)]
                total_rows, (height, width) = sum(rows_per_rank), shape
                left = factor_area[factor_offset:factor_offset + total_rows * height].reshape(total_rows, height)
                factor_offset += total_rows * height
                right = factor_area[factor_offset:factor_offset + total_rows * width].reshape(total_rows, width)
                factor_offset += total_rows * width
                k0 = sum(rows_per_rank[:rank])
                k1 = k0 + rows_per_rank[rank]
                p.factors, p.grad = FactorSlot(p.name, left[k0:k1], right[k0:k1]), None
                r0, r1 = chunk(height, n, rank)  # whole rows: each chunk is one GEMM
                others = total_rows - rows_per_rank[rank]
                if r1 > r0:
                    self.bytes_read += 4 * others * ((r1 - r0) + width)
                    out = np.zeros((r1 - r0) * width, np.float32)
                    self.factored.append((left, right, r0, r1, out.reshape(r1 - r0, width)))
                    self.views.append(ChunkView(p, r0 * width, r1 * width, out))
            else:
                p.grad = self.dense_segments[rank][dense_offset:dense_offset + size].reshape(shape)
                lo, hi = chunk(size, n, rank)
                self.bytes_read += 4 * (n - 1) * (hi - lo)
                if hi > lo:
                    self.dense_chunks.append((dense_offset, lo, hi))
                    self.views.append(ChunkView(p, lo, hi, p.grad.reshape(-1)[lo:hi]))
                dense_offset += size

    # ------------------------------------------------------------- the step
    listens = False  # sums start after the fence that ends every rank's backward

    def layer_done(self, layer) -> None:
        pass

    def gradients_complete(self) -> None:
        """Form the summed gradient of my chunks (after a fence: every backward is done)."""
        self.comm.memory_fence(self.grad_win, "shm(gradients)")
        mine = self.dense_segments[self.comm.rank]
        tracer = self.comm.tracer
        span = tracer.begin("shm(gradients)", "comm", {"op": "sum(shm)", "peer": "node"})
        for offset, lo, hi in self.dense_chunks:
            target = mine[offset + lo:offset + hi]
            for r, segment in enumerate(self.dense_segments):
                if r != self.comm.rank:
                    np.add(target, segment[offset + lo:offset + hi], out=target)
        tracer.end(span, self.bytes_read)
        for left, right, r0, r1, out in self.factored:  # computation, not communication
            np.matmul(left[:, r0:r1].T, right, out=out)

    def close(self) -> None:
        pass  # the windows belong to the communicator, which frees them
