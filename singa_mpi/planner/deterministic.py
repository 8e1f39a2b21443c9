"""Deterministic mode in the plan: the job's setting, the canonical blocks of the batch, and what the
mode refuses (pure).

With ``deterministic { block_rows: b }`` every sum over the batch follows one order fixed by the job
alone, so that the same job and seed train the same bits on any number of workers:

* the batch is cut into canonical blocks of ``b`` rows (the last one may be shorter); a layer's
  products over rows run one block at a time, and a worker's rows are whole blocks, so a block's
  computation has the same shapes and operands wherever it runs (BLAS gives the same bits for the
  same shapes and operands: what the mode relies on, and ``tests/layers/test_deterministic.py``
  checks);
* a param gradient, a sum over every row of the batch, is kept as terms the job fixes (per batch row,
  two per row, or per block: ``Layer.deterministic_terms``) and formed from the whole batch's terms in
  one fixed computation: the terms are gathered in batch order (:mod:`singa_mpi.sync.deterministic`),
  each worker forms some canonical tiles of each gradient exactly as one worker alone forms them, and
  the tiles are exchanged (or, beside server ranks, sent with negative zeros for the other workers'
  tiles, so that a server's sum adds nothing); updates are element-wise in exact arithmetic order
  (``Updater.exact_elementwise``), whatever slice a worker or server updates.  No partial sum crosses a worker
  boundary, so nothing depends on how the rows were split (of ReproBLAS's two ways to a
  partition-independent sum, this is the fixed order over canonical blocks; binned summation is not
  needed).

What is not yet covered is refused by :func:`check_deterministic` (the job), :func:`refuse_in_plan`
(a feature split) and :func:`refuse_summing_exchanges` (an exchange that adds arrays), one line each.
"""
from __future__ import annotations

import dataclasses

from singa_mpi.algorithms import algorithm_name
from singa_mpi.config.load import deterministic_block_rows, wants_deterministic
from singa_mpi.errors import ConfigError
from singa_mpi.layers.base import layer_class_of
from singa_mpi.net import layer_error, phase_nodes
from singa_mpi.planner.chunk import chunk

# exchanges whose backward (or forward) adds partial arrays of several workers: their order of
# addition is MPI's, so the mode refuses a plan that needs them
SUMMING_OPS = ("Reduce", "Ireduce", "Reduce_scatter", "Ireduce_scatter", "Allreduce", "Iallreduce")


@dataclasses.dataclass(frozen=True)
class Deterministic:
    """Canonical blocks of ``block_rows`` rows."""

    block_rows: int

    def count(self, batch: int) -> int:
        """Blocks of a batch of ``batch`` rows."""
        return -(-batch // self.block_rows)

    def blocks(self, rows: tuple[int, int]) -> list[tuple[int, int]]:
        """The canonical blocks covering rows ``[lo, hi)`` of the batch (``lo`` on a block's start), as
        offsets into those rows."""
        lo, hi = rows
        b = self.block_rows
        return [(start - lo, min(start + b, hi) - lo) for start in range(lo, hi, b)]

    def rows_of(self, batch: int, nranks: int, rank: int) -> tuple[int, int]:
        """``rank``'s rows of a batch split over ``nranks`` workers: whole blocks, the first workers one
        block more where they do not divide (the one rule of :func:`chunk`, over blocks)."""
        lo, hi = chunk(self.count(batch), nranks, rank)
        return lo * self.block_rows, min(hi * self.block_rows, batch)


def deterministic_of(proto, batch: int | None = None) -> Deterministic | None:
    """The job's deterministic mode, or None (off); with the phase's ``batch``, its blocks
    (:func:`~singa_mpi.config.load.deterministic_block_rows`); without, the blocks the job writes
    (the field's default where it writes none: for checks that need no batch)."""
    if not wants_deterministic(proto):
        return None
    if batch is None:
        return Deterministic(proto.deterministic.block_rows)
    return Deterministic(deterministic_block_rows(proto, batch))


_ALGORITHMS = ("kBP", "kCD", "kBPTT")  # the algorithms the mode covers


def check_deterministic(cfg) -> None:
    """ConfigError (file:line, the field, what was expected) for the first thing deterministic mode does
    not cover; nothing when the mode is off."""
    job = cfg.proto
    mode = deterministic_of(job)
    if mode is None:
        return
    if mode.block_rows < 1:
        raise ConfigError(f"{cfg.where('deterministic', 'block_rows')}: deterministic.block_rows = "
                          f"{mode.block_rows}: expected a positive number of rows per canonical block")
    alg = algorithm_name(job.train_one_batch)
    if alg not in _ALGORITHMS:
        raise ConfigError(f"{cfg.where('train_one_batch')}: train_one_batch.alg = {alg}: deterministic mode "
                          f"covers {', '.join(_ALGORITHMS)} so far; expected one of them, or no deterministic setting")
    cluster = job.cluster
    if max(1, cluster.nworker_groups) > 1:
        raise ConfigError(f"{cfg.where('cluster', 'nworker_groups')}: cluster.nworker_groups = "
                          f"{cluster.nworker_groups}: groups update asynchronously (Downpour, Hogwild), so what "
                          f"a step sees depends on timing; expected one worker group (AllReduce, or Sandblaster "
                          f"beside server ranks) in deterministic mode")
    net = job.neuralnet
    if net.HasField("pipeline") and net.pipeline.micro_batches > 1:
        raise ConfigError(f"{cfg.where('neuralnet', 'pipeline', 'micro_batches')}: neuralnet.pipeline."
                          f"micro_batches = {net.pipeline.micro_batches}: pipelines are not deterministic yet "
                          f"(their micro-batches cut the canonical blocks); expected no pipeline in "
                          f"deterministic mode")
    for phase in ("train",):
        for node in phase_nodes(cfg, phase):
            cls = layer_class_of(node.conf)
            if not cls.deterministic:
                raise layer_error(cfg, node, "type", node.type_name,
                                  f"a layer deterministic mode covers (inner product, convolution, pooling, LRN, "
                                  f"batch norm, RBM, GRU, element-wise, dropout, softmax, losses, input, text "
                                  f"and parser layers): "
                                  f"{node.type_name} "
                                  f"{cls.deterministic_refusal or 'has no canonical order for its sums over the batch yet'}; "
                                  f"remove the deterministic setting to train this net")


def refuse_in_plan(cfg, node, pdim: int, nranks: int) -> None:
    """A layer split on features (``pdim`` 1 over several workers) in deterministic mode: refused."""
    if pdim == 1 and nranks > 1 and deterministic_of(cfg.proto) is not None:
        raise layer_error(cfg, node, "partition_dim", 1,
                          "0 or -1 in deterministic mode: a split of features cuts the sum of the input "
                          "gradient between workers, which has no canonical order yet")


def refuse_summing_exchanges(cfg, exchanges) -> None:
    """An exchange that adds several workers' arrays (only feature splits make them): refused, naming
    the layers it connects."""
    for ex in exchanges:
        for op in (ex.forward_op, ex.backward_op):
            if op in SUMMING_OPS:
                raise ConfigError(f"{cfg.where('neuralnet')}: the plan connects {ex.src_layer} to its consumers with "
                                  f"{op}, which adds the workers' arrays in MPI's order: expected layers split "
                                  f"on the batch or whole in deterministic mode")


__all__ = ["Deterministic", "deterministic_of", "check_deterministic", "refuse_in_plan",
           "refuse_summing_exchanges", "SUMMING_OPS"]
