"""Deterministic mode's sync: every worker's per-row gradient terms gathered in batch order, every
gradient formed from the whole batch's rows tile by tile, each tile the same computation wherever
it runs as on one worker.

During backward a layer in deterministic mode keeps its param gradients as terms (``Param.add_rows``):
an inner product per batch row (the output gradient and input rows of its weight, the output
gradient rows of its bias), a convolution per canonical block (each block's weight and bias
gradients, a few thousand numbers).  After backward this strategy packs its rank's terms of every
world-replicated param into one buffer, one Allgatherv brings every rank's (rank order is batch
order: a worker's rows are whole canonical blocks, in rank order), and each param's terms become
the whole batch's rows.  Each worker then forms its share of the gradients' canonical tiles
(``planner.syncs.forming_tiles``: row ranges fixed by each gradient's shape, dealt to the workers in
contiguous runs of about equal work) exactly as a run on one worker forms every tile
(``params.form_terms``), into its place in one buffer that holds every gradient end to end; a second,
in-place Allgatherv brings every worker's tiles to every worker.  No partial sum ever crosses a
worker, so no addition order depends on the rank count.  What it costs: the rows of an inner product
are B·(F + D) floats against F·D for its gradient (fewer for the batches of an MLP), and the formed
gradients as many floats as an allreduce moves.  Every worker then updates its replica with the same
gradient (LocalSync's update).
"""
from __future__ import annotations

import numpy as np

from singa_mpi.params import Param, form_terms
from singa_mpi.planner.syncs import FORMED_LABEL, GATHER_LABEL, SHARED_ROWS_LABEL, Gathered
from singa_mpi.sync.base import LocalSync
from singa_mpi.sync.shared_memory import ChunkView, UpdatesItsViewsOnTheNode


class DeterministicSync(LocalSync):
    """The world-replicated params of a deterministic run, each with its terms per rank (``Gathered``)."""

    def __init__(self, comm, params: list[Param], specs: list[Gathered], tiles: list[tuple[tuple[int, int, int], ...]]):
        super().__init__(params)
        for param in self.params:
            param.rows_gathered = True
        self.comm = comm
        self.specs = list(specs)
        self.counts = [sum(spec.uses * spec.terms[rank] * spec.width for spec in self.specs)
                       for rank in range(comm.size)]
        self.displs = [int(x) for x in np.cumsum([0] + self.counts[:-1])]
        self.send = np.empty(self.counts[comm.rank], np.float32)
        self.recv = np.empty(sum(self.counts), np.float32)
        self.mine = [[(lo, hi) for lo, hi, rank in each if rank == comm.rank] for each in tiles]
        self.formed, self.formed_counts = self._gradients_end_to_end(tiles)
        self.formed_displs = [int(x) for x in np.cumsum([0] + self.formed_counts[:-1])]

    def _gradients_end_to_end(self, tiles) -> tuple[np.ndarray, list[int]]:
        """One buffer holding every param's gradient in turn (each param's ``grad`` becomes its view), and
        the floats of it each rank forms: a rank's tiles are one contiguous run of it."""
        formed = np.zeros(sum(p.data.size for p in self.params), np.float32)
        counts, at = [0] * self.comm.size, 0
        for param, each in zip(self.params, tiles):
            param.grad = formed[at:at + param.data.size].reshape(param.data.shape)
            inner = param.data.size // max(1, param.data.shape[0]) if param.data.ndim else 1
            for lo, hi, rank in each:
                counts[rank] += (hi - lo) * inner if param.data.ndim else 1
            at += param.data.size
        return formed, counts

    def gradients_complete(self) -> None:
        splits = self._pack(self.send)
        self.comm.Allgatherv(self.send, self.recv, self.counts, self.displs, GATHER_LABEL)
        self._unpack(splits)
        self._form_mine()
        self.comm.Allgatherv(None, self.formed, self.formed_counts, self.formed_displs, FORMED_LABEL)

    def _form_mine(self) -> None:
        """This rank's tiles of every gradient, from the whole batch's terms (as one worker forms them)."""
        for param, mine in zip(self.params, self.mine):
            terms, param.row_terms = param.row_terms, []
            if mine:
                form_terms(terms, param.grad, mine)
            param.fresh = False

    def _terms(self, param: Param, spec: Gathered) -> list[tuple[np.ndarray, np.ndarray | None]]:
        """``param``'s terms of this step, one set per use; terms of zeros when nothing contributed."""
        if param.row_terms:
            if len(param.row_terms) != spec.uses:
                raise RuntimeError(f"param {param.name!r}: {len(param.row_terms)} sets of gradient terms in one "
                                   f"step, the plan says {spec.uses}")
            return param.row_terms
        if not param.fresh:  # a contribution that is no terms: a layer outside the mode's computation
            raise RuntimeError(f"param {param.name!r} received a gradient that is not per-row terms in "
                               f"deterministic mode")
        rows, shape = spec.terms[self.comm.rank], param.data.shape
        if spec.kind in ("rows", "pairs") and len(shape) == 2:
            zero = (np.zeros((rows, shape[0]), np.float32), np.zeros((rows, shape[1]), np.float32))
        else:
            zero = (np.zeros((rows, spec.width), np.float32), None)
        return [zero] * spec.uses

    def _pack(self, send: np.ndarray) -> list[int]:
        """This rank's terms into ``send``: param after param, use after use, left rows then right rows;
        the width of each param's left rows (the same on every rank: the same layers)."""
        offset, splits = 0, []
        for param, spec in zip(self.params, self.specs):
            terms = self._terms(param, spec)
            splits.append(terms[0][0].shape[1])
            for left, right in terms:
                for part in (left, right):
                    if part is not None:
                        send[offset:offset + part.size].reshape(part.shape)[...] = part
                        offset += part.size
        return splits

    def _unpack(self, splits: list[int]) -> None:  # from ``recv``
        """Every param's terms become the whole batch's, use by use, in rank (= batch) order (the order
        one worker records them in)."""
        offsets = list(self.displs)
        for param, spec, split in zip(self.params, self.specs, splits):
            right_width = spec.width - split
            per_use: list[tuple[list, list]] = [([], []) for _ in range(spec.uses)]
            for rank, rows in enumerate(spec.terms):
                at = offsets[rank]
                for lefts, rights in per_use:
                    lefts.append(self.recv[at:at + rows * split].reshape(rows, split))
                    at += rows * split
                    if right_width:
                        rights.append(self.recv[at:at + rows * right_width].reshape(rows, right_width))
                        at += rows * right_width
                offsets[rank] = at
            param.row_terms = [(np.concatenate(lefts), np.concatenate(rights) if rights else None)
                               for lefts, rights in per_use]


class TermsForServers(DeterministicSync):
    """Deterministic mode beside server ranks (Sandblaster): the workers gather their terms and each
    forms its tiles as :class:`DeterministicSync` does, but no second Allgatherv: each worker sends
    the servers its gradient with every other worker's tiles -0.0, and a server's sum over the
    workers (begun from -0.0, ``runtimes.server``) adds to each element exactly one formed value
    and negative zeros, which change no float (x + -0.0 is x, for x = +0.0 too): the servers add
    nothing, and apply the updater to the serial run's gradient.  ``gradients_complete`` is called
    by the :class:`~singa_mpi.sync.servers.ServerSync` before it sends."""

    def gradients_complete(self) -> None:
        splits = self._pack(self.send)
        self.comm.Allgatherv(self.send, self.recv, self.counts, self.displs, GATHER_LABEL)
        self._unpack(splits)
        self.formed.fill(-0.0)
        self._form_mine()


class SharedDeterministicSync(UpdatesItsViewsOnTheNode, DeterministicSync):
    """Deterministic mode with every worker on one node: the same terms, tiles and computations as
    :class:`DeterministicSync`, through node-shared memory instead of messages (the default mode's
    :class:`~singa_mpi.sync.shared_memory.SharedMemorySync` does so for sums).  Each rank writes its
    terms at its place in one shared buffer (a fence instead of the first Allgatherv); the values live
    once on the node, and each rank forms its tiles and updates those tiles' values and the updater's
    state for them alone (a fence makes them visible instead of the second Allgatherv).  A tile's
    update is element-wise, so updating it alone gives the bits of updating the whole array
    (``tests/layers/test_deterministic.py`` checks the element-wise kernels)."""

    def __init__(self, comm, params: list[Param], specs: list[Gathered], tiles: list[tuple[tuple[int, int, int], ...]]):
        super().__init__(comm, params, specs, tiles)
        self.rows_win, segments = comm.shared_arrays([sum(self.counts) if r == 0 else 0 for r in range(comm.size)])
        self.recv = segments[0]
        lo = self.displs[comm.rank]
        self.send = self.recv[lo:lo + self.counts[comm.rank]]
        self.value_win, values = comm.shared_arrays([self.formed.size if r == 0 else 0 for r in range(comm.size)])
        self.views = self._shared_values(values[0])
        comm.memory_fence(self.value_win, "shm(values)")

    def _shared_values(self, values: np.ndarray) -> list[ChunkView]:
        """Every param's values moved into the node's one copy (rank 0 writes them); a view of each run
        of this rank's tiles, with its gradient, for the updater."""
        views, at = [], 0
        for param, mine in zip(self.params, self.mine):
            size, shape = param.data.size, param.data.shape
            if self.comm.rank == 0:
                values[at:at + size] = param.data.reshape(-1)
            param.data = values[at:at + size].reshape(shape)
            inner = size // max(1, shape[0]) if param.data.ndim else 1
            for lo, hi in _runs(mine):
                views.append(ChunkView(param, lo * inner, hi * inner, param.grad.reshape(-1)[lo * inner:hi * inner]))
            at += size
        return views

    def gradients_complete(self) -> None:
        splits = self._pack(self.send)
        self.comm.memory_fence(self.rows_win, SHARED_ROWS_LABEL)
        span = self.comm.tracer.begin(SHARED_ROWS_LABEL, "comm", {"op": "read(shm)", "peer": "node"})
        self._unpack(splits)
        self.comm.tracer.end(span, 4 * (self.recv.size - self.send.size))
        self._form_mine()


def _runs(tiles: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Adjacent tiles merged: one updater call (and one view of its state) per run."""
    runs: list[tuple[int, int]] = []
    for lo, hi in tiles:
        if runs and runs[-1][1] == lo:
            runs[-1] = (runs[-1][0], hi)
        else:
            runs.append((lo, hi))
    return runs
