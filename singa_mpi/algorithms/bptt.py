"""Back-propagation through time (``alg: kBPTT``): BP over the unrolled net (seed 003).

The net's recurrent layers are already unrolled into copies over time
(:mod:`singa_mpi.config.unroll`), the copies of a layer sharing one set of params:
the forward pass runs the copies in time order, the backward pass in reverse, and
each shared param's gradient is the sum over the time steps (SINGA's kAggGrad);
then one update per batch, as BP does.

The hidden state is carried from one batch to the next when the job reads text as
contiguous streams (a ``kCharRNN`` input: row i of batch n+1 continues row i of
batch n): the first copy of each recurrent layer starts from the last copy's
output of the previous batch (truncated BPTT: no gradient flows into it), where
SINGA started every batch from zeros (its ``full_state`` was hard-coded false,
bug B7).  When the streams start again (the reader wraps around the text), the
state starts from zeros again; every worker knows when from the text's size
(:func:`~singa_mpi.layers.text.windows_per_pass`), not from the reader, which may
live on another worker.  A run starts from zeros; checkpoints keep the state,
so a resumed run continues exactly.  Test and validation batches start from zeros.
"""
from __future__ import annotations

import math

from singa_mpi.algorithms.base import LayerDone
from singa_mpi.algorithms.bp import BackPropagation
from singa_mpi.config.load import layers_for_phase
from singa_mpi.net import Net
from singa_mpi.proto import job_pb2

SEQUENTIAL_READERS = {job_pb2.kCharRNN}  # inputs whose batches continue each other row by row


class BackPropagationThroughTime(BackPropagation):
    readers: list = []  # the job's sequential readers (their confs), in training
    period: int | None = None  # batches per pass over the text: the state restarts at multiples of it
    ahead = 0  # windows this group's reader is ahead of the step count (a resumed asynchronous group)

    def bind(self, job: job_pb2.JobProto) -> None:
        self.readers = sequential_readers(job)

    def report(self, metrics: dict[str, float]) -> dict[str, float]:
        """Adds perplexity, exp(loss): the loss is the mean cross-entropy per time step (character)."""
        if "loss" in metrics:
            return {**metrics, "perplexity": math.exp(min(metrics["loss"], 700.0))}
        return metrics

    def train_one_batch(self, net: Net, on_layer_done: LayerDone | None = None) -> None:
        super().train_one_batch(net, on_layer_done)
        if self.readers and net.layers:
            ctx = net.layers[0].ctx
            if self.period is None:
                from singa_mpi.layers.text import reader_period, text_groups

                self.period = reader_period(self.readers[0], ctx.workspace, text_groups(ctx)[1])
            carry_state(net, afresh=(ctx.step + self.ahead + 1) % self.period == 0)

    def resume_readers(self, states: dict[str, dict], stream: tuple[int, int]) -> None:
        """A resumed worker of group g of G (``stream``), from the checkpoint's training reader ``states``:
        where its group's text reader stands relative to the step count, known to every worker of the
        group, the reader's or not (:func:`~singa_mpi.layers.text.group_ahead`)."""
        from singa_mpi.layers.text import group_ahead

        names = {conf.name.split("#", 1)[-1] for conf in self.readers}
        found = [group_ahead(state, stream) for name, state in states.items() if name.split("#", 1)[-1] in names]
        self.ahead = next((ahead for ahead in found if ahead is not None), 0)


def sequential_readers(job: job_pb2.JobProto) -> list[job_pb2.LayerProto]:
    """The training net's readers whose batches continue each other row by row: with one, a kBPTT
    job carries its hidden state from batch to batch."""
    return [conf for _, conf in layers_for_phase(job, "train") if conf.type in SEQUENTIAL_READERS]


def carry_state(net: Net, afresh: bool = False) -> None:
    """Each recurrent layer's first copy on this worker starts the next batch from its last copy's
    output (the same rows: the copies of a layer are partitioned alike), or from zeros (``afresh``)."""
    copies: dict[str, list] = {}
    for layer in net.layers:
        if layer.recurrent:
            base = layer.conf.name.split("#", 1)[-1]
            copies.setdefault(base, []).append(layer)
    for family in copies.values():
        first = min(family, key=lambda layer: layer.conf.unroll_index)
        last = max(family, key=lambda layer: layer.conf.unroll_index)
        first.initial_state = None if afresh else last.data.copy()
