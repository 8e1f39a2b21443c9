"""Replicated parameters summed by bucketed, non-blocking Allreduce (any number of nodes).

Gradients of params held by the same ranks are fused into buckets of up to
``BUCKET_BYTES``; a bucket's Iallreduce starts as soon as backward has finished
every local use of its params, so the sum travels while lower layers compute.
"""
from __future__ import annotations

import numpy as np

from singa_mpi.layers.base import Layer
from singa_mpi.params import Param
from singa_mpi.planner.plan import ParamSync

BUCKET_BYTES = 8 << 20
  # gradient fusion: big enough to amortise latency, small enough to overlap


class GradientBuckets:
    """Fused gradient buffers of replicated params, summed across their ranks.

    Each param's ``grad`` becomes a view into its bucket, so the reduction is
    in place with no copies.  A bucket starts its Iallreduce once every local
    use of its params has finished backward; ``finish`` waits for all.
    """

    def __init__(self, comm, syncs: list[ParamSync], params: dict[tuple, Param], uses: dict[int, int],
                 order: list[str]):
        self.comm = comm
        self.buckets: list[dict] = []
        position = {name: i for i, name in enumerate(order)}
        mine = [s for s in syncs if comm.rank in s.ranks]
        # reverse of first use in the global order: the order in which backward finishes them
        mine.sort(key=lambda s: (s.ranks, -position.get(s.name, 0), s.name))
        current: dict | None = None
        for sync in mine:
            param = params[(sync.name, sync.offsets)]
            full = current is not None and (current["ranks"] != sync.ranks or
                                            current["size"] + param.grad.size > BUCKET_BYTES // 4)
            if current is None or full:
                current = {"ranks": sync.ranks, "size": 0, "params": []}
                self.buckets.append(current)
            current["params"].append(param)
            current["size"] += param.grad.size
        self.bucket_of: dict[int, dict] = {}
        for index, bucket in enumerate(self.buckets):
            buffer = np.zeros(bucket["size"], np.float32)
            offset = 0
            for param in bucket["params"]:
                n = param.grad.size
                param.grad = buffer[offset:offset + n].reshape(param.grad.shape)
                offset += n
                self.bucket_of[id(param)] = bucket
            bucket.update(buffer=buffer, comm=comm.sub(bucket["ranks"]), label=f"allreduce(bucket{index})")
        self.uses = uses
        self._reset()

    def _reset(self) -> None:
        self.remaining = {id(b["buffer"]): sum(self.uses[id(p)] for p in b["params"]) for b in self.buckets}
        self.requests: list[tuple] = []
        self.started: set[int] = set()

    def layer_done(self, layer: Layer) -> None:
        for param in layer.params:
            bucket = self.bucket_of.get(id(param))
            if bucket is None:
                continue
            key = id(bucket["buffer"])
            self.remaining[key] -= 1
            if self.remaining[key] == 0:
                self._start(bucket)

    def _start(self, bucket: dict) -> None:
        key = id(bucket["buffer"])
        if key not in self.started:
            self.started.add(key)
            self.requests.append((bucket, bucket["comm"].Iallreduce(bucket["buffer"], bucket["label"])))

    def finish(self) -> None:
        """Start what backward did not (params unused this step) and wait for every sum."""
        for bucket in self.buckets:
            self._start(bucket)
        for bucket, request in self.requests:
            bucket["comm"].Wait(request, bucket["label"], "Wait(Iallreduce)")
        self._reset()
