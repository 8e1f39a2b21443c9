"""Regions of a layer's logical output and the exchange between two layouts.

A layer's output is a logical array ``(batch, features, *rest)``.  A sub-layer
holds a *region* of it: a range of rows (batch) and a range of features
(axis 1).  Connecting two differently partitioned layers is an exchange: rank
``j`` sends to rank ``i`` the intersection of what ``j`` holds with what ``i``
needs.  Which MPI operation implements the exchange follows from its shape
(see :func:`classify`); the backward pass is the reverse exchange, summing
where several receivers held the same piece (SINGA's Split semantics).
"""
from __future__ import annotations

import dataclasses

import numpy as np

Range = tuple[int, int]


@dataclasses.dataclass(frozen=True)
class Region:
    rows: Range
    features: Range

    def intersect(self, other: "Region") -> "Region | None":
        rows = (max(self.rows[0], other.rows[0]), min(self.rows[1], other.rows[1]))
        feats = (max(self.features[0], other.features[0]), min(self.features[1], other.features[1]))
        if rows[0] >= rows[1] or feats[0] >= feats[1]:
            return None
        return Region(rows, feats)

    @property
    def nrows(self) -> int:
        return self.rows[1] - self.rows[0]

    @property
    def nfeatures(self) -> int:
        return self.features[1] - self.features[0]

    def size(self, rest: int = 1) -> int:
        return self.nrows * self.nfeatures * rest

    def __str__(self) -> str:
        return f"rows {self.rows[0]}:{self.rows[1]} x features {self.features[0]}:{self.features[1]}"


@dataclasses.dataclass(frozen=True)
class Piece:
    """Rank ``src`` sends ``region`` to rank ``dst`` in the forward pass."""

    src: int
    dst: int
    region: Region


def pieces(holders: dict[int, Region], needs: dict[int, Region]) -> list[Piece]:
    """Every non-empty intersection of a holder's region with a receiver's need, by receiver.

    Each needed region must be covered exactly once: holders' regions are
    disjoint, and the receiver takes every holder's overlap.
    """
    return [p for dst, need in sorted(needs.items()) for p in pieces_to(dst, need, holders)]


def pieces_from(src: int, held: Region, needs: dict[int, Region]) -> list[Piece]:
    """What the holder ``src`` sends, by receiver: one rank's share of :func:`pieces`, without the rest."""
    return [Piece(src, dst, overlap) for dst, overlap in _overlaps(held, needs)]


def pieces_to(dst: int, need: Region, holders: dict[int, Region]) -> list[Piece]:
    """What the receiver ``dst`` gets, by holder."""
    return [Piece(src, dst, overlap) for src, overlap in _overlaps(need, holders)]


def _overlaps(region: Region, others: dict[int, Region]) -> list[tuple[int, Region]]:
    """(rank, overlap) of every region in ``others`` that meets ``region``, ranks ascending."""
    found = ((rank, region.intersect(other)) for rank, other in sorted(others.items()))
    return [(rank, overlap) for rank, overlap in found if overlap is not None]


def as_array(regions: dict[int, Region]) -> tuple[np.ndarray, np.ndarray]:
    """(ranks, bounds): the ranks ascending and their regions as rows (row_lo, row_hi, feat_lo, feat_hi)."""
    ranks = np.array(sorted(regions), dtype=np.int64)
    bounds = np.array([(*regions[r].rows, *regions[r].features) for r in ranks.tolist()],
                      dtype=np.int64).reshape(-1, 4)
    return ranks, bounds


def overlap_sizes(held: np.ndarray, needed: np.ndarray) -> np.ndarray:
    """Items of every holder's region (rows of ``held``) inside every receiver's (rows of ``needed``):
    a holders x receivers matrix, computed at once (at 1,024 ranks an exchange has a million pieces)."""
    rows = (np.minimum(held[:, None, 1], needed[None, :, 1]) - np.maximum(held[:, None, 0], needed[None, :, 0]))
    feats = (np.minimum(held[:, None, 3], needed[None, :, 3]) - np.maximum(held[:, None, 2], needed[None, :, 2]))
    return np.clip(rows, 0, None) * np.clip(feats, 0, None)


def classify(holders: dict[int, Region], needs: dict[int, Region], full: Region) -> tuple[str, str, str]:
    """(SINGA layer type, forward MPI op, backward MPI op) of an exchange.

    one holder, one receiver        -> bridge pair: Send / Recv
    one holder, receivers want all  -> kSplit:   Bcast     / Reduce (sum)
    one holder, receivers want part -> kSlice:   Scatterv  / Gatherv
    many holders, one receiver      -> kConcate: Gatherv   / Scatterv
    many holders, all want all      -> kConcate: Allgatherv / Reduce_scatter (sum)  (every holder wants it)
    many holders, each wants a part -> kConcate: Alltoallv / Alltoallv
    """
    if len(holders) == 1 and len(needs) == 1:
        return "kBridge", "Send", "Recv"
    if len(holders) == 1:
        if all(need == full for need in needs.values()):
            return "kSplit", "Bcast", "Reduce"
        return "kSlice", "Scatterv", "Gatherv"
    if len(needs) == 1:
        return "kConcate", "Gatherv", "Scatterv"
    if all(need == full for need in needs.values()) and set(holders) <= set(needs):
        return "kConcate", "Allgatherv", "Reduce_scatter"
    # also when a holder needs nothing (a layer split over fewer workers than its source): an
    # Allgatherv would hand every member the whole output
    return "kConcate", "Alltoallv", "Alltoallv"
