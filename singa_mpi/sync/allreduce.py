"""Replicated parameters summed by bucketed, non-blocking Allreduce (any number of nodes).

Gradients of params held by the same ranks are fused into the buckets that
:func:`singa_mpi.planner.syncs.buckets` lays out; a bucket's Iallreduce starts
as soon as backward has finished every local use of its params, so the sum
travels while lower layers compute.  Every holder then applies the updater to
its replica (the same sum in, the same values out).
"""
from __future__ import annotations

import numpy as np

from singa_mpi.layers.base import Layer
from singa_mpi.params import Param
from singa_mpi.planner.syncs import Bucket
from singa_mpi.sync.base import LocalSync, finite_at_a_glance, first_nonfinite


class AllreduceSync(LocalSync):
    """Gradient buckets of this rank; each param's ``grad`` becomes a view into its bucket,
    so the sum is in place with no copies.  Updates as LocalSync does, once the sums are in."""

    listens = True

    def __init__(self, comm, buckets: list[Bucket], params: dict[tuple, Param], uses: dict[int, int]):
        super().__init__([])
        self.comm = comm
        self.buckets = [b for b in buckets if comm.rank in b.ranks]
        self.params: list[Param] = []
        self.members: list[list[Param]] = []
        self.buffers: list[np.ndarray] = []
        self.comms = []
        self.bucket_of: dict[int, int] = {}
        for index, bucket in enumerate(self.buckets):
            buffer = np.zeros(bucket.size, np.float32)
            offset, members = 0, []
            for key in bucket.shards:
                param = params[key]
                n = param.grad.size
                param.grad = buffer[offset:offset + n].reshape(param.grad.shape)
                offset += n
                members.append(param)
                self.bucket_of[id(param)] = index
            self.params += members
            self.members.append(members)
            self.buffers.append(buffer)
            # every member creates the sub-communicators in the same (global bucket) order
            self.comms.append(comm.sub(bucket.ranks))
        self.uses = [sum(uses[id(p)] for p in members) for members in self.members]
        self._reset()

    def _reset(self) -> None:
        self.remaining = list(self.uses)
        self.requests: list = [None] * len(self.buckets)

    def layer_done(self, layer: Layer) -> None:
        for param in layer.params:
            index = self.bucket_of.get(id(param))
            if index is None:
                continue
            self.remaining[index] -= 1
            if self.remaining[index] == 0:
                self._start(index)

    def _start(self, index: int) -> None:
        if self.requests[index] is None:
            for param in self.members[index]:  # products still pending (Param.pending) go into the buffer
                param.finish_grad()
            self.requests[index] = self.comms[index].Iallreduce(self.buffers[index], self.buckets[index].label)

    def gradients_complete(self) -> None:
        """Start what backward did not (params unused this step) and wait for every sum."""
        for index in range(len(self.buckets)):
            self._start(index)
        for index, request in enumerate(self.requests):
            self.comms[index].Wait(request, self.buckets[index].label, "Wait(Iallreduce)")
        self._reset()

    def nonfinite_grad(self) -> Param | None:
        """One pass per bucket (its params' summed gradients side by side); a bucket that is not
        finite at a glance is searched param by param."""
        for buffer, members in zip(self.buffers, self.members):
            with np.errstate(over="ignore"):
                glance = finite_at_a_glance(buffer)
            if not glance:
                found = first_nonfinite(members)
                if found is not None:
                    return found
        return None  # every param of this strategy is in a bucket
