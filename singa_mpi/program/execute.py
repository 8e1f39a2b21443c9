"""Runs a step program's passes on a net: the one engine behind every algorithm and runtime.

The program (:mod:`singa_mpi.program`) says what happens in which order; the executor only
dispatches: a ``Compute`` to the layer's maths, an exchange's ``Comm`` to its connection layer
(which performs exactly the calls the program names: where an exchange is several calls in a row,
its pieces as messages, the layer makes them all at the last), ``RunQueued`` to the gradient queue, a
``Wait`` to the layer that started the call, ``GradsFinal`` to the sync strategy.  Calls issued by
a layer's maths (batch statistics) or by the sync strategy (buckets, node-shared memory), and the
sync and update at the end of a training step, are performed where the program says by those who
own them (the trainer runs ``SyncGradients`` and ``Update``); the executor passes over them.
"""
from __future__ import annotations

from typing import Callable, Iterable

from singa_mpi.layers.base import Layer
from singa_mpi.net import Net
from singa_mpi.program.actions import (BACKWARD, BACKWARD_PASSES, Comm, Compute, GradsFinal, Local, Release,
                                       RunQueued, Wait)

LayerDone = Callable[[Layer], None]


def execute(actions: Iterable, net: Net, on_layer_done: LayerDone | None = None) -> None:
    """Perform ``actions`` on ``net`` in order (``on_layer_done``: the sync strategy's hook)."""
    skipped: set[str] = set()
    todo = list(actions)
    sends = False  # the calls of the exchange under way include a send
    for position, action in enumerate(todo):
        kind = type(action)
        if kind is Compute:
            _compute(action, net, skipped)
            net.poll_sends()
        elif kind is Comm:
            if action.by != "exchange":
                continue
            sends = sends or action.op == "Isend"
            if not _more_calls(todo, position):
                _exchange(action, net)
                if sends:
                    net.sending.append(net.by_name[action.layer].layer)
                sends = False
        elif kind is Wait:
            if action.layer in net.by_name:
                net.finish_exchange(net.by_name[action.layer])
        elif kind is RunQueued:
            net.run_queued()
        elif kind is GradsFinal:
            if on_layer_done is not None and action.layer not in skipped:
                on_layer_done(net.by_name[action.layer].layer)
        elif kind is Local:
            net.zero_grads() if action.what == "zero-grads" else net.finish_grads()
        elif kind is Release:
            for name in action.layers:
                net.by_name[name].layer.release()


def _more_calls(actions: list, position: int) -> bool:
    """Whether the call at ``position`` is followed by another of the same exchange and direction
    (an exchange sent as messages: its layer makes them all at the last)."""
    call = actions[position]
    following = actions[position + 1] if position + 1 < len(actions) else None
    return (type(following) is Comm and following.by == "exchange" and following.layer == call.layer
            and following.direction == call.direction)


def _compute(action: Compute, net: Net, skipped: set[str]) -> None:
    wire = net.by_name[action.layer]
    pass_ = action.pass_
    net.tracer.direction = pass_
    if pass_ == "gradients":
        net.run_param_gradients(wire)
        for param in wire.layer.params:
            # the visible layer holds W but adds nothing to it: where its hidden layer is on another
            # worker, this worker's part of W's sum is an explicit zero
            param.finish_grad()
    elif pass_ in BACKWARD_PASSES:
        layer = wire.layer
        if pass_ == "backward" and layer.grad is None and not layer.is_loss:
            # nothing consumed its output (SINGA's cudnn_bm.conf leaves pool2 dangling): no gradient
            skipped.add(action.layer)
            return
        net.run_backward(wire)
    else:
        net.run_pass(wire, pass_, action.train)


def _exchange(call: Comm, net: Net) -> None:
    wire = net.by_name[call.layer]
    net.tracer.direction = call.pass_ or call.direction
    if call.direction != BACKWARD:
        net.run_pass(wire, call.pass_ or "forward", True)
        return
    net.start_exchange(wire)
    if call.blocking:  # gradients sent back and none to receive: nothing to wait for here
        net.finish_exchange(wire)
