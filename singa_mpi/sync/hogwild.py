"""Hogwild across worker groups: each group updates its own copy, and the copies meet now and then.

SINGA's distributed Hogwild (frameworks.md; ``src/server.cc``, SINGA-8/57) gives every worker group a
co-located server group; a group's updates are local, and every ``sync_freq`` updates the server
groups exchange the change since their last exchange ("delta"), so that every copy receives every
group's updates.  SINGA sent each delta to the slice's master group and took the master's value
back, one message pair per slice, as they came.  Here the same arithmetic is one non-blocking
Iallreduce among the workers with the same location ID in every group (``peers``):

    after every sync_freq-th update:  d = own - base;  start D = sum over groups of d
    at the next exchange (or the end):  own += D - d;  base += D

so every group's copy holds every group's updates, each exactly once, one exchange later than its
own; the sum travels while the group trains on (no group waits for the others but at the exchange
itself).  The stop vote of a Hogwild job is taken at the exchanges, over every worker
(:meth:`GroupDeltaSync.vote`): all groups stop after the same step, and a last, blocking exchange
leaves every group with the same values.

:class:`SharedHogwild` is SINGA's in-memory Hogwild (``share_memory: true``, the groups' workers on
one node): one copy of the values in node-shared memory, which every group's updater writes without
locks, as Hogwild! (Niu et al., 2011) does.  Runs of either cannot equal the serial run; they are
tested for convergence.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from singa_mpi.params import Param
from singa_mpi.sync.base import LocalSync


class GroupDeltaSync:
    """This worker's part of the exchange: the values of ``params`` (what it updates itself)."""

    listens = False
    not_rescuable = "Hogwild's groups across nodes are not saved in an emergency yet (only on one node)"

    def __init__(self, peers, world, params: list[Param], sync_freq: int, step: int = 0):
        self.peers, self.world, self.sync_freq = peers, world, max(1, sync_freq)
        self.views = [p.data.reshape(-1) for p in params]
        self.offsets = np.cumsum([0] + [v.size for v in self.views])
        self.base = self._values()
        self.sent = np.zeros_like(self.base)
        self.sums = np.zeros_like(self.base)
        self.request = None
        self.step = step  # updates so far (the step numbers every group shares)
        self.pending_stop = False
        self.pending_signal: int | None = None  # the stop signal this worker received, till the vote
        self.pending_nonfinite = False  # this worker found a non-finite value, till the vote
        self.signal: int | None = None  # the stop signal any worker of any group received, once voted
        self.nonfinite = False  # a worker of any group found a non-finite value, once voted

    def restart(self) -> None:
        """Training starts (or resumes) from the params as they are now: the base of every delta."""
        self.base = self._values()

    def _values(self) -> np.ndarray:
        return np.concatenate(self.views) if self.views else np.zeros(0, np.float32)

    # ------------------------------------------------------------- the step: nothing until publish
    def layer_done(self, layer) -> None:
        pass

    def gradients_complete(self) -> None:
        pass

    def update(self, step: int, updater) -> None:
        self.step = step + 1

    def publish(self) -> None:
        """After the group's own update: an exchange every sync_freq updates."""
        if self.at_exchange():
            self._finish()
            self._start()

    def at_exchange(self) -> bool:
        return self.step % self.sync_freq == 0

    def _pieces(self, *arrays: np.ndarray):
        """Each param's values with its run of each of ``arrays`` (laid out as the params, end to end):
        an exchange works param by param, in place, with no model-sized temporary."""
        for view, lo, hi in zip(self.views, self.offsets, self.offsets[1:]):
            yield (view, *(array[lo:hi] for array in arrays))

    def _start(self) -> None:
        for view, base, sent in self._pieces(self.base, self.sent):
            np.subtract(view, base, out=sent)
        self.sums[...] = self.sent
        self.request = self.peers.Iallreduce(self.sums, "hogwild(deltas)")

    def _finish(self) -> None:
        if self.request is None:
            return
        self.peers.Wait(self.request, "hogwild(deltas)", "Wait(Iallreduce)")
        self.request = None
        for view, sums, sent in self._pieces(self.sums, self.sent):
            view += sums
            view -= sent  # the others' changes; this group's own are in its values already
        self.base += self.sums

    def owned(self) -> list[Param]:
        return []  # the group's own strategies own them

    def nonfinite_grad(self) -> Param | None:
        return None

    def close(self) -> None:
        """An exchange still in flight completes (every group takes part in it) before the end."""
        if self.request is not None:
            self.peers.Wait(self.request, "hogwild(deltas)", "Wait(Iallreduce)")
            self.request = None

    # ------------------------------------------------------------- stopping together
    def vote(self, flag: bool, signal: int | None = None, nonfinite: bool = False,
             look: Callable[[], bool] | None = None) -> bool:
        """The per-step stop vote: kept until the next exchange, then taken over every worker of every
        group (so that all stop after the same step, with the same number of exchanges behind them);
        on a stop every worker learns the stop signal one of them received (``signal``: this one's) and
        whether one found a non-finite value (``nonfinite``): the exchange under way carries that
        group's values to every group, which must then write no checkpoint either.  ``look``, once the
        stop is agreed: whether this worker finds a non-finite value in what the stop would checkpoint
        (its values, which the exchange under way carries too), told in the same verdict."""
        self.pending_stop = self.pending_stop or flag
        self.pending_signal = self.pending_signal or signal
        self.pending_nonfinite = self.pending_nonfinite or nonfinite
        if not self.at_exchange() or not self.world.any(self.pending_stop):
            return False
        if look is not None and look():
            self.pending_nonfinite = True
        everyone = self.world.allgather_object((self.pending_signal, self.pending_nonfinite))
        self.signal = next((s for s, _ in everyone if s), None)
        self.nonfinite = any(found for _, found in everyone)
        return True

    def signal_elsewhere(self) -> int | None:
        return self.signal

    def nonfinite_elsewhere(self) -> bool:
        """A worker of some group found a non-finite value: every group stops as on its own finding."""
        return self.nonfinite

    def training_done(self, stopped: bool, signal: int | None = None) -> None:
        """At the end, a last exchange, blocking: every group ends with every group's updates.  On a
        stop the exchange in flight completes (every group stopped after the same step, but a group
        that found a non-finite value ends without this)."""
        self._finish()
        if not stopped:
            self._start()
            self._finish()


class SharedHogwild(LocalSync):
    """Every group's only worker on one node: ``params`` placed in one node-shared copy (``node``:
    the communicator of the node's ranks, every group's), updated by each group's updater in place."""

    # not_rescuable stays None: each group's updater keeps its own state for every param, so one survivor's
    # replica at its own step is a whole state (asynchronous: as good as any other step's)

    def __init__(self, node, params: list[Param], group: int = 0, groups: int = 1):
        super().__init__(params)
        sizes = [p.data.size for p in params]
        # the values, then one stop word: the groups share no step and take no vote, so a group that stops
        # early (a signal that reached it alone) raises it, and every other group stops after its step;
        # then each group's steps in this run (int32 words), where group 0's checkpoint finds every pace
        words = sum(sizes) + 1
        self.window, segments = node.shared_arrays([words + groups if r == 0 else 0 for r in range(node.size)])
        values, self.stop_word = segments[0][:words - 1], segments[0][words - 1:words]
        self.steps, self.group = segments[0][words:].view(np.int32), group
        offset = 0
        for param, size in zip(params, sizes):
            if node.rank == 0:  # every rank starts from the same values: rank 0's copy serves them all
                values[offset:offset + size] = param.data.reshape(-1)
            offset += size
        if node.rank == 0:
            self.stop_word[0] = 0.0
            self.steps[:] = 0
        node.memory_fence(self.window, "hogwild(values)")
        offset = 0
        for param, size in zip(params, sizes):
            param.data = values[offset:offset + size].reshape(param.data.shape)
            offset += size

    def update(self, step: int, updater) -> None:
        super().update(step, updater)
        self.steps[self.group] += 1  # this group's word alone: no other rank writes it

    def group_steps(self) -> list[int]:
        """The steps each group has updated the values with in this run."""
        return [int(n) for n in self.steps]

    def training_done(self, stopped: bool, signal: int | None = None) -> None:
        """A group that stops early tells the others (they read the word after each step): the stop
        ``signal`` it received, or -1 for a stop without one."""
        if stopped:
            self.stop_word[0] = float(signal) if signal else -1.0

    def stop_asked(self) -> bool:
        """Another group stopped early: this one stops too."""
        return bool(self.stop_word[0])

    def signal_elsewhere(self) -> int | None:
        """The stop signal the group that stopped first received (None: it stopped without one)."""
        word = float(self.stop_word[0])
        return int(word) if word > 0 else None
