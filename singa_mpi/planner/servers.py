"""Which server holds which slice of which parameter, and what each worker sends it.  Pure, no MPI.

SINGA 0.x (SINGA-19, ``src/utils/common.cc``) concatenates the trained parameters in order, cuts
the vector into about equal slices with :func:`slice_params` (a parameter may span slices, a slice
may hold several small parameters) and hands consecutive slices to the servers of a group with
:func:`partition_slices`.  Both are SINGA's rules, pinned by SINGA's own test vectors
(tests/planner/test_servers.py); the odd ``total // n + total % n`` capacity is SINGA's.

As consecutive slices go to consecutive servers, each server holds one contiguous flat range of
each parameter it touches (:class:`ServerRange`).  A worker holds a shard of each parameter (a box of
the logical array, from the partition plan); :func:`pieces` intersects the two: one
:class:`ServerPiece` per (worker, shard, server) that share elements, with the positions on both
sides.  A box's elements in C order have ascending flat indices, so the worker's side of a piece is
always one contiguous run of its shard; the server's side is contiguous unless the shard splits
trailing axes (a feature-split weight), and then an index array.  Both sides compute the same list
from the same plan, so the list's order gives every piece its MPI tag.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from singa_mpi.planner.plan import Plan

FIRST_PIECE_TAG = 16  # tags below are the protocol's control messages (singa_mpi.sync.servers)


def _capacity(total: int, num: int) -> int:
    return total // num + total % num  # SINGA's "average" (sic): the test vectors depend on it


def slice_params(num: int, sizes: list[int]) -> list[list[int]]:
    """SINGA's ``Slice(num, sizes)``: each param's slice sizes, cutting the concatenation into about
    ``num`` boxes of equal capacity (a box may take up to 10% more to keep a param whole)."""
    if num <= 0:
        return []
    avg = _capacity(sum(sizes), num)
    diff = avg // 10
    capacity, slices = avg, []
    for size in sizes:
        cut, left = [], size
        while left > 0:
            if capacity >= left:
                capacity -= left
                cut.append(left)
                left = 0
            elif capacity + diff >= left:
                cut.append(left)
                left, capacity = 0, 0
            elif capacity >= diff:
                cut.append(capacity)
                left -= capacity
                capacity = avg
            else:
                capacity = avg
        slices.append(cut)
    return slices


def partition_slices(num: int, slices: list[int]) -> list[int]:
    """SINGA's ``PartitionSlices(num, slices)``: the box (server) of each slice, consecutive
    slices filling box 0, then box 1, ... (a box may take up to 10% more)."""
    if num <= 0:
        return []
    avg = _capacity(sum(slices), num)
    diff = avg // 10
    box, boxid, owners, i = avg, 0, [], 0
    while i < len(slices):
        size = slices[i]
        if box >= size:
            box -= size
            owners.append(boxid)
            i += 1
        elif box + diff >= size:
            owners.append(boxid)
            box = 0
            i += 1
        else:
            box, boxid = avg, boxid + 1
    return owners


@dataclasses.dataclass(frozen=True)
class ServerRange:
    """Server ``server`` of a group holds the flat elements [lo, hi) of param ``name``."""

    server: int
    name: str
    logical_shape: tuple[int, ...]
    lo: int
    hi: int

    @property
    def size(self) -> int:
        return self.hi - self.lo


def server_ranges(params: list[tuple[str, tuple[int, ...]]], nservers: int, nserver_groups: int = 1
                  ) -> list[ServerRange]:
    """Every server's range of every param (``params``: the trained params, in the job's order).
    Sliced into lcm(server groups, servers per group) pieces as SINGA does, so that the cut suits
    both the servers of a group and the groups."""
    sizes = [math.prod(shape) for _, shape in params]
    per_param = slice_params(math.lcm(max(1, nserver_groups), nservers), sizes)
    owners = partition_slices(nservers, [size for cut in per_param for size in cut])
    ranges, k = [], 0
    for (name, shape), cut in zip(params, per_param):
        offset = 0
        for size in cut:
            server = owners[k]
            k += 1
            last = ranges[-1] if ranges else None
            if last is not None and last.name == name and last.server == server:
                ranges[-1] = dataclasses.replace(last, hi=offset + size)  # consecutive slices: one range
            else:
                ranges.append(ServerRange(server, name, tuple(shape), offset, offset + size))
            offset += size
    return ranges


@dataclasses.dataclass(frozen=True, eq=False)
class ServerPiece:
    """What worker ``worker`` sends server ``server`` of one shard: its flat elements
    [local_lo, local_hi), which are the server's range elements ``remote`` (relative to the range's lo;
    a slice, or an index array when the shard splits trailing axes)."""

    worker: int
    server: int
    name: str
    offsets: tuple[tuple[int, int], ...]  # the worker's shard of the logical param
    local_lo: int
    local_hi: int
    remote: slice | np.ndarray
    tag: int

    @property
    def size(self) -> int:
        return self.local_hi - self.local_lo


def trained_params(the_plan: Plan, frozen: set[str]) -> list[tuple[str, tuple[int, ...]]]:
    """(name, logical shape) of the params a server keeps: trained ones, in the plan's order."""
    seen: dict[str, tuple[int, ...]] = {}
    for sub in the_plan.sublayers:
        for shard in sub.params:
            if shard.trained and shard.name not in frozen and shard.name not in seen:
                seen[shard.name] = shard.logical_shape
    return list(seen.items())


def pieces(the_plan: Plan, ranges: list[ServerRange]) -> list[ServerPiece]:
    """Every piece of every worker, tagged per (worker, server) in the plan's order."""
    by_name: dict[str, list[ServerRange]] = {}
    for r in ranges:
        by_name.setdefault(r.name, []).append(r)
    shards: dict[int, list] = {}
    for sub in the_plan.sublayers:
        held = shards.setdefault(sub.rank, [])
        for shard in sub.params:
            key = (shard.name, shard.offsets)
            if shard.name in by_name and key not in {(s.name, s.offsets) for s in held}:
                held.append(shard)
    result, tags = [], {}
    for worker in sorted(shards):
        for shard in shards[worker]:
            flat = _flat_indices(shard.logical_shape, shard.offsets)
            for r in by_name[shard.name]:
                lo, hi = np.searchsorted(flat, [r.lo, r.hi])
                if hi <= lo:
                    continue
                remote = flat[lo:hi] - r.lo
                if remote[-1] - remote[0] + 1 == remote.size:
                    remote = slice(int(remote[0]), int(remote[-1]) + 1)
                tag = tags.get((worker, r.server), FIRST_PIECE_TAG)
                tags[(worker, r.server)] = tag + 1
                result.append(ServerPiece(worker, r.server, shard.name, shard.offsets, int(lo), int(hi), remote, tag))
    return result


def _flat_indices(shape: tuple[int, ...], offsets: tuple[tuple[int, int], ...]) -> np.ndarray:
    """The logical flat index of each element of the box ``offsets``, in the box's C order (ascending)."""
    strides = [math.prod(shape[k + 1:]) for k in range(len(shape))]
    flat = np.zeros((1,) * len(shape), np.int64)
    for axis, ((lo, hi), stride) in enumerate(zip(offsets, strides)):
        along = np.arange(lo, hi, dtype=np.int64) * stride
        flat = flat + along.reshape((1,) * axis + (-1,) + (1,) * (len(shape) - axis - 1))
    return flat.reshape(-1)


def describe(ranges: list[ServerRange], server_ranks: tuple[int, ...]) -> list[str]:
    """For ``plan``: which server holds which part of each param, one line per server."""
    lines = []
    for s, rank in enumerate(server_ranks):
        mine = [r for r in ranges if r.server == s]
        total = sum(r.size for r in mine)
        parts = ", ".join(f"{r.name}[{r.lo}:{r.hi}]" if r.size < math.prod(r.logical_shape) else r.name
                          for r in mine)
        lines.append(f"  server {s} (rank {rank}): {total:,} values: {parts or 'nothing'}")
    return lines
