"""What every TrainOneBatch algorithm provides (seed 003).

An algorithm says which passes a step makes over a net: which layers compute, in which order,
under which pass name, and when a layer's parameter gradients are final (``GradsFinal``, where
gradient sums may start).  It says so as a program (:mod:`singa_mpi.program`):
:meth:`Algorithm.train_actions` and :meth:`Algorithm.evaluate_actions` list the actions over a
rank's units, and the executor (:mod:`singa_mpi.runtimes.executor`) runs them.  It never
updates parameters: the trainer hands the gradients to the sync strategy and the updater, so the
same algorithm runs serially and on every partitioning.

A plugin algorithm may instead override ``train_one_batch(net, on_layer_done)`` and call
:func:`forward_pass` and :func:`backward_pass`, which run those passes' programs.
"""
from __future__ import annotations

from typing import Callable

from singa_mpi.layers.base import Layer
from singa_mpi.net import Net
from singa_mpi.program import passes
from singa_mpi.proto import job_pb2
from singa_mpi.program.execute import execute

LayerDone = Callable[[Layer], None]


class Algorithm:
    @classmethod
    def from_conf(cls, conf: job_pb2.AlgProto) -> Algorithm:
        """An instance configured from the job's ``train_one_batch`` block."""
        return cls()

    def bind(self, job: job_pb2.JobProto) -> None:
        """Learn what the algorithm needs of the whole job (the trainer calls it once)."""

    def resume_readers(self, states: dict[str, dict], stream: tuple[int, int]) -> None:
        """Learn where the training readers of worker group g of G (``stream``) resume, from a checkpoint's
        reader ``states`` (kBPTT: when its group's text wraps); nothing by default."""

    def report(self, metrics: dict[str, float]) -> dict[str, float]:
        """The metrics a progress line and metrics.jsonl show, from the layers' means."""
        return metrics

    @staticmethod
    def trains(layer_cls: type[Layer]) -> bool:
        """Whether this algorithm trains the params of layers of ``layer_cls`` (BP: all)."""
        return True

    # the step as a program (BP's unless an algorithm says otherwise)
    def train_actions(self, units: list) -> list:
        return passes.bp_train(units)

    def evaluate_actions(self, units: list) -> list:
        return passes.bp_evaluate(units)

    def train_one_batch(self, net: Net, on_layer_done: LayerDone | None = None) -> None:
        execute(step_actions(self, net, train=True), net, on_layer_done)

    def evaluate(self, net: Net) -> None:
        """One pass in test mode (test and validation phases)."""
        execute(step_actions(self, net, train=False), net)


def step_actions(algorithm: Algorithm, net: Net, train: bool) -> tuple:
    """The actions of ``net``'s step: the program the runtime gave the net, else the algorithm's
    passes over the net's units (built once per net)."""
    if net.program is not None:
        return net.program.actions
    cache = net.__dict__.setdefault("_actions", {})
    key = (type(algorithm), train)
    if key not in cache:
        cache[key] = tuple(passes.number_calls(passes.passes(algorithm, net.step_units(), train)))
    return cache[key]


def forward_pass(net: Net, phase: str, train: bool) -> None:
    """Every layer in topological order, computing ``phase``."""
    execute(passes.number_calls(passes.forward_pass(net.step_units(), phase, train)), net)


def backward_pass(net: Net, on_layer_done: LayerDone | None = None) -> None:
    """Every layer that needs a gradient, in reverse topological order; ``on_layer_done(layer)``
    once a layer with params has added its last gradient contribution."""
    execute(passes.number_calls(passes.backward_pass(net.step_units())), net, on_layer_done)
