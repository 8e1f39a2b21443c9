"""The passes of each algorithm over a rank's units, as actions (pure, no MPI, no plan needed).

BP's forward and backward (BPTT is BP over the unrolled copies), CD's positive pass, Gibbs rounds
and gradients; each connection layer a pass meets becomes the communication call that serves it
(:func:`exchange_calls`, by the rules of :mod:`.rules`), and a layer with batch statistics adds the
sum its maths asks for.  Algorithms (:mod:`singa_mpi.algorithms`) pick their passes from here.
"""
from __future__ import annotations

import dataclasses
import math
from collections import Counter
from typing import Iterable

from singa_mpi.program import rules
from singa_mpi.program.rules import MESSAGES
from singa_mpi.program.actions import (BACKWARD, BACKWARD_PASSES, FORWARD, FORWARD_PASSES, Action, Comm, Compute,
                                       GradsFinal, Local, RunQueued, Wait)
from singa_mpi.program.units import Unit

# the non-blocking form of each backward operation, as the communicator names the call
NON_BLOCKING = {"Reduce": "Ireduce", "Reduce_scatter": "Ireduce_scatter", "Gatherv": "Igatherv",
                "Scatterv": "Iscatterv", "Alltoallv": "Ialltoallv"}


# ---------------------------------------------------------------- the passes of each algorithm

def bp_train(units: list[Unit]) -> list[Action]:
    """BP (and BPTT over unrolled copies): forward in order, backward in reverse over the units
    that need a gradient, each layer with params handing them on once final."""
    return ([Local("zero-grads")] + forward_pass(units, "forward", train=True) + backward_pass(units)
            + [Local("finish-grads")])


def backward_pass(units: list[Unit]) -> list[Action]:
    """Every unit that needs a gradient, in reverse order; ``GradsFinal`` after each with params."""
    actions: list[Action] = []
    for unit in reversed(units):
        if unit.needs_grad:
            actions += backward_of(unit, "backward", train=True)
            if unit.params:
                actions.append(GradsFinal(unit.name))
    return actions


def bp_evaluate(units: list[Unit]) -> list[Action]:
    return forward_pass(units, "forward", train=False)


def forward_pass(units: Iterable[Unit], pass_: str, train: bool) -> list[Action]:
    return [a for unit in units for a in forward_of(unit, pass_, train)]


def forward_of(unit: Unit, pass_: str, train: bool) -> list[Action]:
    """A unit's forward-like pass: its maths, or the calls of the exchange it serves."""
    if unit.exchange is not None:
        return list(exchange_calls(unit.sub, FORWARD, pass_))
    actions: list[Action] = [Compute(unit.name, pass_, train)]
    if train and unit.row_group:
        actions.append(statistics_call(unit.sub, FORWARD, pass_))
    return actions


def backward_of(unit: Unit, pass_: str, train: bool = True) -> list[Action]:
    """A unit's backward-like pass: its gradient maths, or the exchange's return trip; where it
    receives without blocking, the queued weight gradients while it travels, then its wait."""
    ex = unit.exchange
    if ex is not None:
        if not ex.with_backward:
            return []
        calls: list[Action] = list(exchange_calls(unit.sub, BACKWARD, pass_))
        started = [c for c in calls if isinstance(c, Comm) and not c.blocking]
        if not started:  # gradients sent back (a bridge's, or pieces as messages): complete at the next call
            return calls
        return calls + [RunQueued(), Wait(unit.name, started[0].op)]
    actions: list[Action] = [Compute(unit.name, pass_, train)]
    if pass_ == "backward" and unit.row_group:
        actions.append(statistics_call(unit.sub, BACKWARD, pass_))
    return actions


def cd_train(units: list[Unit], cd_k: int) -> list[Action]:
    """CD-k (SINGA's CDWorker): the positive pass, ``cd_k`` Gibbs rounds per RBM pair, then each
    RBM layer's gradients (hidden first: W's last contribution, then the visible bias)."""
    actions: list[Action] = [Local("zero-grads")]
    actions += forward_pass(units, "positive", train=True)
    pairs = rbm_pairs(units)
    for _ in range(cd_k):
        for pair in pairs:
            actions += gibbs_round(pair, train=True)
    for pair in pairs:
        for unit in reversed(pair):
            if unit.energy_role:
                actions.append(Compute(unit.name, "gradients"))
                if unit.params:
                    actions.append(GradsFinal(unit.name))
    actions.append(Local("finish-grads"))
    return actions


def cd_evaluate(units: list[Unit]) -> list[Action]:
    """The positive pass and one reconstruction, whose error the visible layer reports."""
    actions = forward_pass(units, "positive", train=False)
    for pair in rbm_pairs(units):
        actions += top_down(pair)
        actions += [Compute(u.name, "negative", False) for u in pair if u.energy_role == "visible"]
    return actions


def rbm_pairs(units: list[Unit]) -> list[list[Unit]]:
    """Per RBM pair with a unit on this rank: its units here in execution order (visible layer,
    the connection layers of its edge, hidden layer), pairs in the order their first unit runs."""
    keys = {u.pair for u in units if u.energy_role}
    pairs: dict[tuple[str, str], list[Unit]] = {}
    for unit in units:
        if unit.pair in keys and (unit.energy_role or unit.exchange is not None):
            pairs.setdefault(unit.pair, []).append(unit)
    return list(pairs.values())


def top_down(pair: list[Unit]) -> list[Action]:
    """The hidden layer's message ĥ·W back down the pair's edge (every unit but the visible one)."""
    return [a for unit in reversed(pair) if unit.energy_role != "visible" for a in backward_of(unit, "top-down")]


def gibbs_round(pair: list[Unit], train: bool) -> list[Action]:
    """Top-down, then the negative pass up the pair."""
    return top_down(pair) + forward_pass(pair, "negative", train)


# ---------------------------------------------------------------- communication calls

def exchange_calls(sub, direction: str, pass_: str = "") -> list[Comm]:
    """The calls ``sub`` (a connection layer) makes for its exchange in ``direction``, in order: a
    bridge's one message, one collective, or (pieces as messages: :data:`MESSAGES`) an ``Isend`` of
    each piece for another rank, then a receive of each piece from another."""
    ex, rank = sub.exchange, sub.rank
    forward = direction == FORWARD
    sent, received = ex.sent_by(rank), ex.received_by(rank)
    if not forward:
        sent, received = received, sent
    key = f"{direction}:{ex.id}"
    if sub.role in ("bridge_src", "bridge_dst"):
        sends = (sub.role == "bridge_src") == forward
        peer = ex.group[0] if ex.group[1] == rank else ex.group[1]
        # a send never blocks (Isend, completed at the layer's next call); a forward receive does,
        # a backward one is started and waited for after the queued weight gradients
        op = "Isend" if sends else ("Recv" if forward else "Irecv")
        return [Comm(rank, op, peer, ex.group, None, rules.tag(ex.id, direction), sub.out_shape, ex.dtype,
                     sub.name, direction, key, sent, received, pass_, blocking=op != "Irecv")]
    if ex.forward_op == MESSAGES[0]:
        return message_calls(sub, direction, pass_)
    op = ex.forward_op if forward else NON_BLOCKING[ex.backward_op]
    return [Comm(rank, op, None, ex.group, rules.root(ex), None, sub.out_shape, ex.dtype, sub.name, direction,
                 key, sent, received, pass_, blocking=forward)]


def message_calls(sub, direction: str, pass_: str = "") -> list[Comm]:
    """A connection layer on several workers whose pieces travel as messages (a pipeline's): forward,
    an ``Isend`` of each held piece another rank needs, then a ``Recv`` of each needed piece another
    rank holds; backward the reverse, the receives started (``Irecv``) and waited for after the queued
    weight gradients.  A piece between a rank and itself is a copy, no call.  Every piece's calls
    share a key (``forward:ID:SRC>DST``) and the exchange's tag (:func:`rules.tag`)."""
    ex, rank = sub.exchange, sub.rank
    forward = direction == FORWARD
    outgoing = [(p.dst, p) for p in ex.sends_of(rank) if p.dst != rank]
    incoming = [(p.src, p) for p in ex.recvs_of(rank) if p.src != rank]
    if not forward:
        outgoing, incoming = incoming, outgoing
    tag, rest = rules.tag(ex.id, direction), math.prod(ex.rest_shape)
    receive = "Recv" if forward else "Irecv"

    def call(op: str, peer: int, piece) -> Comm:
        region = piece.region
        shape = (region.nrows,) if ex.kind == "aux" else (region.nrows, region.nfeatures) + tuple(ex.rest_shape)
        size = region.size(rest) * ex.itemsize
        sends = op == "Isend"
        return Comm(rank, op, peer, tuple(sorted((rank, peer))), None, tag, shape, ex.dtype, sub.name, direction,
                    f"{direction}:{ex.id}:{piece.src}>{piece.dst}", size if sends else 0, 0 if sends else size,
                    pass_, blocking=op != "Irecv")

    return [call("Isend", peer, piece) for peer, piece in outgoing] + \
        [call(receive, peer, piece) for peer, piece in incoming]


def connection_calls(sub) -> dict[str, list[Comm]]:
    """A connection layer's calls in each direction it makes them ("backward" only when gradients
    flow back): what the runtime hands the layer to perform."""
    calls = {FORWARD: exchange_calls(sub, FORWARD)}
    if sub.exchange.with_backward:
        calls[BACKWARD] = exchange_calls(sub, BACKWARD)
    return calls


def statistics_call(sub, direction: str, pass_: str) -> Comm:
    """A batch-statistics layer's sum over the workers holding the batch's other rows: two float64
    values per channel (Σx, Σx² forward; Σdy, Σdy·x̂ backward), issued by the layer's maths."""
    channels = sub.out_shape[1] if len(sub.out_shape) > 1 else 1
    blocks = sub.statistics_blocks  # deterministic mode: a pair per canonical block of the batch
    moved = rules.ring_bytes(blocks * 2 * channels * 8, len(sub.row_group))
    shape = (2, channels) if blocks == 1 else (blocks, 2, channels)
    return Comm(sub.rank, "Allreduce", None, sub.row_group, None, None, shape, "float64",
                f"{sub.origin}(statistics)", direction, f"{direction}:statistics:{sub.origin}", moved, moved,
                pass_, by="layer")


def passes(algorithm, units: list[Unit], train: bool) -> list[Action]:
    """The algorithm's passes over ``units``: its own program where it has one, else BP's (a
    plugin algorithm that overrides ``train_one_batch`` is checked as BP)."""
    build = getattr(algorithm, "train_actions" if train else "evaluate_actions", None)
    if build is None:
        return bp_train(units) if train else bp_evaluate(units)
    return build(units)


def number_calls(actions: list[Action]) -> list[Action]:
    """Each call's key made unique per occurrence (CD calls an exchange once per Gibbs round):
    every member makes the same calls in the same order, so the n-th occurrences match."""
    seen: Counter = Counter()
    result = []
    for action in actions:
        if isinstance(action, Comm):
            seen[action.key] += 1
            if seen[action.key] > 1:
                action = dataclasses.replace(action, key=f"{action.key}#{seen[action.key]}")
        result.append(action)
    return result


__all__ = ["passes", "bp_train", "bp_evaluate", "backward_pass", "forward_pass", "cd_train", "cd_evaluate",
           "exchange_calls", "message_calls", "connection_calls", "statistics_call", "number_calls", "BACKWARD_PASSES",
           "FORWARD_PASSES"]
