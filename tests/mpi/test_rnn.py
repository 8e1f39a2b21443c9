"""BPTT on every partitioning equals the serial run: SINGA's char-rnn net, small.

Every rank trains the unrolled char-rnn (kCharRNN -> kOneHot, kRNNLabel; kGRU -> kInnerProduct ->
kSoftmaxLoss, 5 time steps, the hidden state carried from batch to batch) partitioned over the world
and alone: every layer on the batch ("data"); a pipeline with the input layers, the GRU and the
output layers on different workers ("location"); ip1 split on its outputs ("feature"); batches
divisible by the rank count and not.  The loss of every step (20 steps, over more than one pass over
the text, so the state restarts at least once), the test phase's, the final params and the
updater's state agree within ``RTOL`` of the serial values.
"""
import numpy as np
import pytest

import nets
import oracle
from conftest import agree

RTOL = 1e-5
STEPS = 20


@pytest.mark.parametrize("scheme", ["data", "location", "feature"])
@pytest.mark.parametrize("which_batch", [0, 1])
def test_bptt_matches_serial(world, scheme, which_batch):
    n = world.size
    batch = [2 * n, 2 * n + 1][which_batch]
    # 40 characters per row: the reader wraps every 7 batches (5 time steps), twice in 20 steps
    text, vocab = nets.text_data(oracle.scratch(f"rnn_text_{batch}", world.rank), size=40 * batch)
    job = nets.char_rnn(text, vocab, batch, scheme, n, steps=STEPS, test=True)
    name = f"rnn_{scheme}_{batch}"
    workspace = oracle.scratch(f"ws_{name}", world.rank)
    parallel, serial = oracle.partitioned(job, workspace, world), oracle.serial(job, workspace)
    parallel.run()
    serial.run()
    problems = []
    for phase in ("train", "test"):
        got = [h["loss"] for h in parallel.history if h["phase"] == phase]
        want = [h["loss"] for h in serial.history if h["phase"] == phase]
        if not want or len(got) != len(want):
            problems.append(f"{phase}: {len(got)} losses vs serial {len(want)}")
            continue
        err = np.abs(np.array(got) - want) / np.abs(want)
        if err.max() > RTOL:
            step = int(np.argmax(err))
            problems.append(f"{phase} loss {step}: {got[step]!r} vs serial {want[step]!r}")
    problems += oracle.compare_checkpoints(oracle.snapshot(parallel, STEPS), oracle.snapshot(serial, STEPS), RTOL)
    agree(world, not problems, f"{name}: " + "; ".join(problems))


@pytest.mark.parametrize("which_batch", [0, 1])
def test_gru_split_on_hidden_units_matches_serial(world, which_batch):
    """Without text streams (nothing carried), a GRU may split its hidden units: every time step
    gathers the whole h(t-1) and sums the partial gradients back."""
    n = world.size
    batch = [2 * n, 2 * n + 1][which_batch]
    data = nets.make_data(oracle.scratch("gru_records", world.rank) + ".h5", 64, (12,), 5)
    job = nets.gru_on_records(data, batch, split_gru=n <= 7, steps=STEPS)
    workspace = oracle.scratch(f"ws_gru_split_{batch}", world.rank)
    parallel, serial = oracle.partitioned(job, workspace, world), oracle.serial(job, workspace)
    losses, serial_losses = oracle.train(parallel), oracle.train(serial)
    problems = oracle.compare_losses(losses, serial_losses, RTOL, STEPS)
    problems += oracle.compare_checkpoints(oracle.snapshot(parallel, STEPS), oracle.snapshot(serial, STEPS), RTOL)
    agree(world, not problems, f"gru split {batch}: " + "; ".join(problems))
