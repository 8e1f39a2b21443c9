"""Deterministic mode's sync: every worker's per-row gradient terms gathered in batch order, every
gradient formed from the whole batch's rows, the same computation on every worker as on one.

During backward a layer in deterministic mode keeps its param gradients as terms (``Param.add_rows``):
an inner product per batch row (the output gradient and input rows of its weight, the output
gradient rows of its bias), a convolution per canonical block (each block's weight and bias
gradients, a few thousand numbers).  After backward this strategy packs its rank's terms of every
world-replicated param into one buffer, one Allgatherv brings every rank's (rank order is batch
order: a worker's rows are whole canonical blocks, in rank order), and each param's terms become
the whole batch's rows; reading the gradient then forms it (``params.form_rows``) exactly as a run
on one worker forms it from its own rows.  No partial sum ever crosses a worker, so no addition
order depends on the rank count.  What it costs: the rows of an inner product are B·(F + D) floats
against F·D for its gradient (fewer for the batches of an MLP), but every worker forms every
gradient (the weight-gradient GEMMs are not split between workers).  Every worker then updates its
replica with the same gradient (LocalSync's update).
"""
from __future__ import annotations

import numpy as np

from singa_mpi.params import Param
from singa_mpi.planner.syncs import GATHER_LABEL, Gathered
from singa_mpi.sync.base import LocalSync


class DeterministicSync(LocalSync):
    """The world-replicated params of a deterministic run, each with its terms per rank (``Gathered``)."""

    def __init__(self, comm, params: list[Param], specs: list[Gathered]):
        super().__init__(params)
        for param in self.params:
            param.rows_gathered = True
        self.comm = comm
        self.specs = list(specs)
        self.widths = [spec.width for spec in self.specs]
        self.counts = [sum(spec.terms[rank] * spec.width for spec in self.specs) for rank in range(comm.size)]
        self.displs = [int(x) for x in np.cumsum([0] + self.counts[:-1])]
        self.send = np.empty(self.counts[comm.rank], np.float32)
        self.recv = np.empty(sum(self.counts), np.float32)

    def gradients_complete(self) -> None:
        splits = self._pack()
        self.comm.Allgatherv(self.send, self.recv, self.counts, self.displs, GATHER_LABEL)
        self._unpack(splits)

    def _terms(self, param: Param, spec: Gathered) -> tuple[np.ndarray, np.ndarray | None]:
        """``param``'s one term of this step; rows of zeros when nothing contributed to it."""
        if len(param.row_terms) > 1:
            raise RuntimeError(f"param {param.name!r}: {len(param.row_terms)} row terms in one step: expected one "
                               f"(deterministic mode gathers one use per param and worker)")
        if param.row_terms:
            return param.row_terms[0]
        if not param.fresh:  # a contribution that is no rows: a layer outside the mode's computation
            raise RuntimeError(f"param {param.name!r} received a gradient that is not per-row terms in "
                               f"deterministic mode")
        rows, shape = spec.terms[self.comm.rank], param.data.shape  # no contribution: terms of zeros
        if spec.kind == "rows" and len(shape) == 2:
            return np.zeros((rows, shape[0]), np.float32), np.zeros((rows, shape[1]), np.float32)
        return np.zeros((rows, spec.width), np.float32), None

    def _pack(self) -> list[int]:
        """This rank's terms into ``send``, param after param, left rows then right rows; the width
        of each param's left rows (the same on every rank: the same layers)."""
        offset, splits = 0, []
        for param, spec in zip(self.params, self.specs):
            left, right = self._terms(param, spec)
            splits.append(left.shape[1])
            for part in (left, right):
                if part is None:
                    continue
                size = part.size
                self.send[offset:offset + size].reshape(part.shape)[...] = part
                offset += size
        return splits

    def _unpack(self, splits: list[int]) -> None:
        """Every param's terms become the whole batch's rows, in rank (= batch) order."""
        offsets = list(self.displs)
        for param, width, split, spec in zip(self.params, self.widths, splits, self.specs):
            lefts, rights = [], []
            for rank, rows in enumerate(spec.terms):
                at = offsets[rank]
                lefts.append(self.recv[at:at + rows * split].reshape(rows, split))
                at += rows * split
                if width > split:
                    rights.append(self.recv[at:at + rows * (width - split)].reshape(rows, width - split))
                offsets[rank] = at + rows * (width - split)
            param.row_terms = [(np.concatenate(lefts), np.concatenate(rights) if rights else None)]
            param.grad  # formed now, from the whole batch's rows
