"""What the trainer asks of parameter synchronisation, one step at a time.

A step is: backward (``layer_done`` after each layer whose param gradients are
final), ``gradients_complete`` (every sum this rank needs has arrived),
``update`` (the updater runs on what this rank owns), ``publish`` (new values
visible to every rank that reads them before the next forward).  Between the
sums and the update, ``nonfinite_grad`` lets the trainer look for a NaN or an
infinity in the summed gradients this rank is about to apply.  A strategy
owns a set of params; :class:`Synchronizer` puts several side by side (e.g.
node-shared memory for params every worker holds, gradient buckets for params
a subset holds, local updates for the rest).
"""
from __future__ import annotations

import math
from typing import Iterable, Protocol, Sequence

import numpy as np

from singa_mpi.layers.base import Layer
from singa_mpi.params import Param


class SyncStrategy(Protocol):
    def layer_done(self, layer: Layer) -> None: ...
    def gradients_complete(self) -> None: ...
    def update(self, step: int, updater) -> None: ...
    def publish(self) -> None: ...
    def owned(self) -> list[Param]: ...
    def nonfinite_grad(self) -> Param | None: ...
    def close(self) -> None: ...


def finite_at_a_glance(array: np.ndarray) -> bool:
    """True when every value of ``array`` is finite, from one BLAS pass and no temporary (x·x is
    NaN or infinite whenever an x is); False also when finite values' squares overflow (|x| above
    1.8e19): then the element test decides.  Call it under ``np.errstate(over="ignore")``."""
    flat = array.reshape(-1)
    return math.isfinite(np.dot(flat, flat))


def first_nonfinite(params: Iterable[Param], values: bool = False) -> Param | None:
    """The first of ``params`` whose gradient (``values``: whose values) holds a NaN or an
    infinity, else None."""
    with np.errstate(over="ignore"):  # an overflowing x·x is no finding: the element test decides
        for param in params:
            array = param.data if values else param.grad
            if array is not None and not finite_at_a_glance(array) and not np.isfinite(array).all():
                return param
    return None


def first_bad_value(array: np.ndarray) -> float:
    """The first NaN or infinity of ``array`` (which holds one)."""
    flat = array.reshape(-1)
    return float(flat[int(np.argmin(np.isfinite(flat)))])


class LocalSync:
    """Params no other worker holds: nothing to sum, this rank updates them all.

    Also the base of strategies whose every holder updates its own replica (after a sum)."""

    listens = False  # whether layer_done does anything (it is on backward's hot path)
    # why this rank's state cannot go into an emergency checkpoint (checkpoints.emergency), or None: every
    # holder here keeps whole replicas and their updater state, consistent after each update
    not_rescuable: str | None = None

    def __init__(self, params: Sequence[Param]):
        self.params = list(params)

    def layer_done(self, layer: Layer) -> None:
        pass

    def gradients_complete(self) -> None:
        pass

    def update(self, step: int, updater) -> None:
        for param in self.params:
            updater.update(step, param)

    def publish(self) -> None:
        pass

    def owned(self) -> list[Param]:
        return self.params

    def nonfinite_grad(self) -> Param | None:
        """The first param whose gradient (summed, about to be applied) is not finite."""
        return first_nonfinite(self.params)

    def close(self) -> None:
        pass


class FrozenParams(LocalSync):
    """Params the algorithm does not train (CD: the layers below an RBM): owned, so that
    checkpoints keep them, and never updated."""

    def update(self, step: int, updater) -> None:
        pass

    def nonfinite_grad(self) -> Param | None:
        return None  # never applied: whatever their gradients hold cannot reach the values


class Synchronizer:
    """Several strategies, each over its own params, driven as one (in the given order)."""

    def __init__(self, strategies: Sequence[SyncStrategy], tracer=None):
        self.strategies = list(strategies)
        self.tracer = tracer
        # layer_done is on the backward hot path: call only strategies that listen
        self._listeners = [s for s in self.strategies if getattr(s, "listens", True)]

    def layer_done(self, layer: Layer) -> None:
        for strategy in self._listeners:
            strategy.layer_done(layer)

    def gradients_complete(self) -> None:
        if self.tracer is not None:
            self.tracer.direction = "params"
        for strategy in self.strategies:
            strategy.gradients_complete()

    def update(self, step: int, updater) -> None:
        for strategy in self.strategies:
            strategy.update(step, updater)

    def publish(self) -> None:
        for strategy in self.strategies:
            strategy.publish()

    def owned(self) -> list[Param]:
        return [param for strategy in self.strategies for param in strategy.owned()]

    def state_on_servers(self) -> bool:
        """Whether servers hold this rank's params and updater state (they save them in an emergency)."""
        return any(getattr(s, "state_on_servers", False) for s in self.strategies)

    def not_rescuable(self) -> str | None:
        """Why this rank cannot save its state in an emergency, or None (see LocalSync.not_rescuable)."""
        return next((s.not_rescuable for s in self.strategies if getattr(s, "not_rescuable", None)), None)

    def nonfinite_grad(self) -> Param | None:
        """After ``gradients_complete``: the first param this rank would update with a NaN or an
        infinity, else None (local: the trainer votes on it)."""
        for strategy in self.strategies:
            found = strategy.nonfinite_grad()
            if found is not None:
                return found
        return None

    def close(self) -> None:
        for strategy in self.strategies:
            strategy.close()

    # what strategies with servers or other groups add (the others have nothing to do)
    def _each(self, method: str, *args) -> list:
        return [getattr(s, method)(*args) for s in self.strategies if hasattr(s, method)]

    def refresh(self) -> None:
        """Before a test or validation pass: the latest values where others update them too."""
        self._each("refresh")

    def training_done(self, stopped: bool, signal: int | None = None) -> None:
        """This worker trained its last step (``stopped``: early, on a signal or a finding; ``signal``:
        the stop signal its group received, told to the other groups)."""
        self._each("training_done", stopped, signal)

    def signal_elsewhere(self) -> int | None:
        """The stop signal that a server rank or another worker group received, as far as it was told
        here (with a stop: the groups and servers stop after it), else None."""
        return next((signal for signal in self._each("signal_elsewhere") if signal), None)

    def stop_asked(self) -> bool:
        """Another group stopped early: this one stops too (after its vote)."""
        return any(self._each("stop_asked"))

    def nonfinite_elsewhere(self) -> bool:
        """Another worker group's gradient was not finite (servers refused it): stop as on one's own."""
        return any(self._each("nonfinite_elsewhere"))

    def overflowed(self) -> tuple[Param, float] | None:
        """After ``gradients_complete``: a param whose finite gradient the servers applied into
        non-finite values, with the first of them (servers update there, not here), else None."""
        return next((found for found in self._each("overflowed") if found is not None), None)

    def metrics(self) -> dict[str, float]:
        """What the strategies measure per step (staleness), for the progress lines."""
        merged: dict[str, float] = {}
        for found in self._each("metrics"):
            merged.update(found)
        return merged
