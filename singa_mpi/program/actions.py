"""The actions of a rank's step program: frozen records, each with a one-line string form.

A program is a tuple of these, in the order the rank performs them.  The string forms are what
the ``plan --program`` printout shows, what the pre-flight digest hashes and what a test compares
with the tracer's record of a real step.

=================  ===========================================================================
action             what the executor does
=================  ===========================================================================
``Compute``        a layer's pass: ``forward``, ``positive``, ``negative`` (outputs from inputs),
                   ``backward``, ``top-down`` (gradients to the sources), ``gradients`` (CD's
                   param gradients from what the passes kept)
``Comm``           one communication call (operation, peer or group, root, tag, dtype, shape,
                   bytes); ``by`` says who issues it: the executor through a connection layer
                   (``exchange``), a layer's own maths (``layer``: batch statistics), or the sync
                   strategy (``sync``: gradient buckets, node-shared memory)
``RunQueued``      the weight gradients waiting for an exchange to hide behind, while it travels
``Wait``           completes the non-blocking exchange a layer started; gradients go to its sources
``GradsFinal``     a layer's param gradients are final: the sync strategy may start their sums
``Local``          bookkeeping without communication (``zero-grads``, ``finish-grads``)
``SyncGradients``  every sum this rank needs arrives (the strategy's waits, its ``sync`` calls)
``Update``         the updater on the params this rank owns, and the new values published
``Release``        a pipeline's micro-batch is done: its layers drop what their passes kept
=================  ===========================================================================

A non-blocking send (a bridge's Isend) completes before its connection layer's next call, or when
the run closes: no action of its own.
"""
from __future__ import annotations

import dataclasses

from singa_mpi.program.rules import BACKWARD, FORWARD, PARAMS

__all__ = ["Compute", "Comm", "RunQueued", "Wait", "GradsFinal", "Local", "SyncGradients", "Update", "Release",
           "FORWARD", "BACKWARD", "PARAMS", "Action"]

FORWARD_PASSES = ("forward", "positive", "negative")  # outputs from inputs
BACKWARD_PASSES = ("backward", "top-down")  # gradients (or CD's top-down messages) to the sources


@dataclasses.dataclass(frozen=True)
class Compute:
    """``layer``'s maths for ``pass_`` (``train``: a training pass, with dropout, batch statistics...)."""

    layer: str
    pass_: str
    train: bool = True

    def __str__(self) -> str:
        return f"{self.pass_} {self.layer}"


@dataclasses.dataclass(frozen=True)
class Comm:
    """One communication call on one rank."""

    rank: int
    op: str  # Send, Recv, Bcast, Reduce, Scatterv, Gatherv, Allgatherv, Reduce_scatter, Alltoallv, Allreduce...
    peer: int | None  # for Send/Recv
    group: tuple[int, ...]  # members of a collective (both ranks for Send/Recv)
    root: int | None
    tag: int | None
    shape: tuple[int, ...]  # Send/Recv: the message; collectives: this rank's local buffer
    dtype: str
    layer: str  # the sub-layer it serves, or the sync's label (a bucket, the statistics of a layer)
    direction: str  # forward, backward or params
    key: str  # the same on every member of one call (an occurrence of an exchange, a bucket)
    send_bytes: int
    recv_bytes: int
    pass_: str = ""  # the algorithm's pass the call belongs to (CD calls an exchange in several)
    blocking: bool = True  # False: started here, completed by a Wait (or, for a send, the layer's next call)
    by: str = "exchange"  # who issues it: exchange (the executor), layer (its maths), sync (the strategy)

    def describe(self) -> str:
        who = f"peer {self.peer}" if self.peer is not None else f"group {list(self.group)}"
        tag = f" tag {self.tag}" if self.tag is not None else ""
        return f"{self.direction} {self.op} {who}{tag} {self.dtype}{list(self.shape)} ({self.layer})"

    def __str__(self) -> str:
        start = "" if self.blocking else "start "
        return f"{start}{self.describe()}"


@dataclasses.dataclass(frozen=True)
class RunQueued:
    """The queued weight-gradient products, computed while the exchange before this action travels."""

    def __str__(self) -> str:
        return "queued weight gradients"


@dataclasses.dataclass(frozen=True)
class Wait:
    """Completes ``layer``'s non-blocking ``op`` (the tracer's ``Wait(op)``)."""

    layer: str
    op: str

    def __str__(self) -> str:
        return f"wait {self.op} ({self.layer})"


@dataclasses.dataclass(frozen=True)
class GradsFinal:
    """``layer`` added its last contribution to its params' gradients this step."""

    layer: str

    def __str__(self) -> str:
        return f"gradients final {self.layer}"


@dataclasses.dataclass(frozen=True)
class Local:
    """Bookkeeping of the step without communication: ``zero-grads`` or ``finish-grads``."""

    what: str

    def __str__(self) -> str:
        return self.what


@dataclasses.dataclass(frozen=True)
class SyncGradients:
    """Every gradient sum this rank needs has arrived (the sync strategy's waits)."""

    def __str__(self) -> str:
        return "sync gradients"


@dataclasses.dataclass(frozen=True)
class Update:
    """The updater on what this rank owns; the new values visible before the next forward pass."""

    def __str__(self) -> str:
        return "update"


@dataclasses.dataclass(frozen=True)
class Release:
    """Micro-batch ``micro``'s backward is done on this rank: ``layers`` (its units here) drop their
    activations, so that a schedule's memory is the micro-batches it holds in flight."""

    micro: int
    layers: tuple[str, ...]

    def __str__(self) -> str:
        return f"release micro-batch {self.micro}"


Action = Compute | Comm | RunQueued | Wait | GradsFinal | Local | SyncGradients | Update | Release
