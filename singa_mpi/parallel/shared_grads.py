"""Gradient sums and updates through node-shared memory (all ranks of the group on one node).

A replicated parameter's values live once per node in an MPI-3 shared window
that every rank reads during forward/backward; each rank writes its gradients
into its own shared segment.  After backward, rank ``r`` sums every rank's
gradients for its chunk ``chunk(size, n, r)`` of each parameter (reading the
other segments directly), runs the updater on that chunk, and a fence makes
the new values visible to all.  This is SINGA's server role co-located with
the workers (each process updates a slice of the parameters, like the
"AllReduce" framework of SINGA's frameworks.md), without messages: it moves
each gradient byte once, instead of the Allreduce's two to four times, and
splits the updater's work and state n ways.
"""
from __future__ import annotations

import numpy as np

from singa_mpi.params import Param
from singa_mpi.planner.chunk import chunk


class ChunkView(Param):
    """The flat chunk [lo, hi) of a param that this rank sums and updates."""

    def __init__(self, param: Param, lo: int, hi: int):  # noqa: super().__init__ would allocate
        self.conf, self.name = param.conf, param.name
        self.logical_shape, self.shard = param.logical_shape, param.shard
        self.lr_scale, self.wd_scale = param.lr_scale, param.wd_scale
        self.data = param.data.reshape(-1)[lo:hi]
        self.grad = param.grad.reshape(-1)[lo:hi]
        self.lo, self.hi = lo, hi


class SharedMemoryGradients:
    """Replicated params of ``ranks`` (all of one node) placed in shared memory."""

    def __init__(self, comm, params: list[Param]):
        self.comm = comm
        self.params = params
        sizes = [p.data.size for p in params]
        total = sum(sizes)
        n, rank = comm.size, comm.rank
        # values: one copy on the node, in rank 0's segment; gradients: one segment per rank
        self.value_win, value_segments = comm.shared_arrays([total if r == 0 else 0 for r in range(n)])
        self.grad_win, self.grad_segments = comm.shared_arrays([total] * n)
        values = value_segments[0]
        if rank == 0:
            offset = 0
            for p, size in zip(params, sizes):
                values[offset:offset + size] = p.data.reshape(-1)
                offset += size
        comm.memory_fence(self.value_win, "shm(values)")
        offset = 0
        self.chunks: list[tuple[int, int, int]] = []  # (offset of the param, lo, hi) of my chunks
        self.views: list[ChunkView] = []
        for p, size in zip(params, sizes):
            shape = p.data.shape
            p.data = values[offset:offset + size].reshape(shape)
            p.grad = self.grad_segments[rank][offset:offset + size].reshape(shape)
            lo, hi = chunk(size, n, rank)
            if hi > lo:
                self.chunks.append((offset, lo, hi))
                self.views.append(ChunkView(p, lo, hi))
            offset += size

    def reduce(self) -> None:
        """Sum all ranks' gradients into my chunks (after a fence: every backward is done)."""
        self.comm.memory_fence(self.grad_win, "shm(gradients)")
        mine = self.grad_segments[self.comm.rank]
        start = self.comm._enter("sum(shm)", "shm(gradients)", "node")
        for offset, lo, hi in self.chunks:
            target = mine[offset + lo:offset + hi]
            for r, segment in enumerate(self.grad_segments):
                if r != self.comm.rank:
                    np.add(target, segment[offset + lo:offset + hi], out=target)
        self.comm._leave(start, "shm(gradients)", 0)

    def publish(self) -> None:
        """After my chunks are updated: make the new values visible before the next forward."""
        self.comm.memory_fence(self.value_win, "shm(values)")
