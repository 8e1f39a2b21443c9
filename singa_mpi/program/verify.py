"""The proof that the ranks' programs of one phase fit together (pure, before any MPI call).

* every send has exactly one receive with the same peer pair, tag, size and dtype (the n-th
  message of a channel matches the n-th receive: CD sends over one bridge several times a step);
* every collective has the same operation, members and root on all of them, and every member
  of its group calls it;
* the programs cannot deadlock: a simulation runs them to the end, where sends never block, a
  blocking receive or collective waits for its partners, and a non-blocking one (started, then
  waited for) blocks only at its ``Wait``: a gradient bucket started in the middle of backward
  does not hold the rank there.

A failure is a ConfigError naming the calls.
"""
from __future__ import annotations

import math
from collections import Counter

from singa_mpi.errors import ConfigError
from singa_mpi.program.actions import Comm, Wait

SENDS = ("Send", "Isend")
RECEIVES = ("Recv", "Irecv")


def verify(calls_of: dict[int, list]) -> None:
    """ConfigError if the ranks' calls (``{rank: [Comm or Wait, ...]}``) are unpaired, inconsistent
    or could deadlock."""
    comms = {rank: [a for a in actions if isinstance(a, Comm)] for rank, actions in calls_of.items()}
    check_pairs(comms)
    check_collectives(comms)
    simulate({rank: [a for a in actions if isinstance(a, (Comm, Wait))] for rank, actions in calls_of.items()})


def check_pairs(comms: dict[int, list[Comm]]) -> None:
    sends: dict[tuple, list[Comm]] = {}
    recvs: dict[tuple, list[Comm]] = {}
    for calls in comms.values():
        for c in calls:
            if c.op in SENDS:
                sends.setdefault((c.rank, c.peer, c.tag), []).append(c)
            elif c.op in RECEIVES:
                recvs.setdefault((c.peer, c.rank, c.tag), []).append(c)
    for channel in sends.keys() | recvs.keys():
        out, into = sends.get(channel, []), recvs.get(channel, [])
        if len(out) != len(into):
            lone = (out or into)[min(len(out), len(into))]
            raise ConfigError(f"unpaired bridge: {lone.describe()} on rank {lone.rank} has no matching "
                              f"{'Recv' if lone.op in SENDS else 'Send'}")
        for s, r in zip(out, into):
            if (math.prod(s.shape), s.dtype) != (math.prod(r.shape), r.dtype):
                raise ConfigError(f"bridge {s.layer} -> {r.layer}: sends {s.dtype}{list(s.shape)} but the receiver "
                                  f"expects {r.dtype}{list(r.shape)}")


def check_collectives(comms: dict[int, list[Comm]]) -> None:
    seen: dict[str, Comm] = {}
    members: dict[str, set[int]] = {}
    for calls in comms.values():
        for c in calls:
            if c.op in SENDS or c.op in RECEIVES:
                continue
            first = seen.setdefault(c.key, c)
            if (c.op, c.group, c.root) != (first.op, first.group, first.root):
                raise ConfigError(f"collective mismatch: {c.describe()} on rank {c.rank} vs "
                                  f"{first.describe()} on rank {first.rank}")
            members.setdefault(c.key, set()).add(c.rank)
    for key, ranks in members.items():
        call = seen[key]
        if ranks != set(call.group):
            missing = sorted(set(call.group) - ranks)
            raise ConfigError(f"collective {call.describe()}: ranks {missing} of its group never call it")


def simulate(sched: dict[int, list]) -> None:
    """Run the programs' calls abstractly; ConfigError naming the stuck calls if they block.

    A work list: a rank runs until it blocks; what unblocks it (a send posted on its channel, the
    last member reaching a collective) puts it back on the list.  Each call is visited a bounded
    number of times, so planning stays linear in the calls and members."""
    pos = {rank: 0 for rank in sched}
    posted: Counter = Counter()  # (src, dst, tag) -> messages sent so far
    taken: Counter = Counter()  # (src, dst, tag) -> receives started so far
    arrived: dict[str, set[int]] = {}  # collective key -> members that have started it
    tickets: dict[tuple[int, str, str], list] = {}  # (rank, layer, op) of started calls -> what their Wait needs
    blocked: dict[tuple, set[int]] = {}  # what a rank waits for -> the ranks waiting
    ready = list(sched)

    def wake(what: tuple) -> None:
        ready.extend(blocked.pop(what, ()))

    def done(need: tuple) -> bool:
        if need[0] == "all":  # one Wait for several started receives (an exchange sent as messages)
            return all(done(each) for each in need[1])
        if need[0] == "message":
            return posted[need[1]] > need[2]
        key, size = need[1], need[2]
        return len(arrived.get(key, ())) >= size

    def start(rank: int, call) -> tuple | None:
        """The call's effects (a message posted, a member arrived); what it must wait for, if anything."""
        if isinstance(call, Wait):
            return waited_for(tickets.pop((rank, call.layer, call.op), []))
        if call.op in SENDS:
            channel = (call.rank, call.peer, call.tag)
            posted[channel] += 1
            wake(("message", channel))
            return None
        if call.op in RECEIVES:
            channel = (call.peer, call.rank, call.tag)
            ticket = ("message", channel, taken[channel])
            taken[channel] += 1
        else:
            members = arrived.setdefault(call.key, set())
            members.add(rank)
            if len(members) == len(call.group):
                wake(("collective", call.key))
            ticket = ("collective", call.key, len(call.group))
        if call.blocking:
            return ticket
        tickets.setdefault((rank, call.layer, call.op), []).append(ticket)
        return None

    waiting: dict[int, tuple] = {}  # rank -> what the call it stopped at needs
    while ready:
        rank = ready.pop()
        calls = sched[rank]
        while pos[rank] < len(calls):
            need = waiting.pop(rank, None)
            if need is None:
                need = start(rank, calls[pos[rank]])
            if need is not None and not done(need):
                waiting[rank] = need
                blocked.setdefault(first_open(need, done)[:2], set()).add(rank)
                break
            pos[rank] += 1
    stuck = [f"rank {r}: {_describe(sched[r][pos[r]])}" for r in sched if pos[r] < len(sched[r])]
    if stuck:
        raise ConfigError("the communication schedule would deadlock: " + "; ".join(stuck))


def waited_for(tickets: list) -> tuple | None:
    """What a ``Wait`` needs: its started call's ticket, or all of several (an exchange sent as
    messages starts a receive from each rank that sent it a piece)."""
    if not tickets:
        return None
    return tickets[0] if len(tickets) == 1 else ("all", tuple(tickets))


def first_open(need: tuple, done) -> tuple:
    """The ticket a blocked rank waits on next: ``need`` itself, or the first of an ``all`` not done."""
    if need[0] != "all":
        return need
    return next(each for each in need[1] if not done(each))


def _describe(action) -> str:
    return action.describe() if isinstance(action, Comm) else str(action)
