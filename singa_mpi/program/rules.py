"""The rules of a step's communication, each defined once (every reader of a program imports them).

* tags: a bridge's forward message carries ``2 * exchange id``, its gradient ``2 * id + 1``, so
  the two directions of one bridge, and different bridges between the same pair, never match each
  other (an exchange sent as messages: each of its pieces, one per pair of ranks, likewise);
* roots: a Bcast or Scatterv starts at the exchange's (only) holder, a Gatherv ends at its (only)
  receiver; the backward of each uses the same root;
* bytes: a ring Allreduce of N bytes over n ranks moves ``2 N (n - 1) / n`` each way per rank:
  the communicator's own counting rule (:func:`singa_mpi.communication.base.ring_bytes`), which
  programs and the cost model price with;
* the schedule's digest: what the pre-flight vote compares.
"""
from __future__ import annotations

import hashlib

from singa_mpi.communication.base import ring_bytes

FORWARD, BACKWARD, PARAMS = "forward", "backward", "params"
ROOTED = ("Bcast", "Scatterv", "Gatherv")
# an exchange's (forward, backward) operations when its pieces travel as point-to-point messages: a
# bridge's, and every exchange of a pipelined step (a collective would make its members meet)
MESSAGES = ("Send", "Recv")


def tag(exchange_id: int, direction: str) -> int:
    """The MPI tag of a bridge's message in ``direction`` (forward data or backward gradient)."""
    return 2 * exchange_id + (1 if direction == BACKWARD else 0)


def root(exchange) -> int | None:
    """The world rank at the root of ``exchange``'s rooted collective (both directions), else None."""
    if exchange.forward_op in ("Bcast", "Scatterv"):
        return next(iter(exchange.holders))
    if exchange.forward_op == "Gatherv":
        return next(iter(exchange.needs))
    return None


__all__ = ["tag", "root", "ring_bytes", "FORWARD", "BACKWARD", "PARAMS", "ROOTED", "MESSAGES"]


def schedule_line(phase: str, call) -> str:
    """One communication call of a rank's program as the schedule lists and digests it."""
    return f"{phase}: rank {call.rank}: {call.describe()}"


def schedule_digest(lines: list[str]) -> str:
    """A short digest of schedule lines (one per call), identical on every rank of a consistent job:
    what the pre-flight vote compares."""
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]
