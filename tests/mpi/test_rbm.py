"""Contrastive divergence on every partitioning equals the serial run.

Every rank trains an RBM job (SINGA's rbm2 shape, small: data -> inner product ->
sigmoid -> RBMVis <-> RBMHid, the lower layers frozen) partitioned over the world
and alone: CD-1 and CD-2; batch rows split ("data"), hidden units split
("feature": the top-down message summed by Reduce_scatter), and each layer whole
on some worker ("location": bridges both ways); batches divisible by the rank
count and not.  The reconstruction error of every step, the test phase's, the
final params and the updater state agree within ``RTOL`` of the serial values.

Sampling is keyed by global row and unit, so the same hidden states are drawn
whatever the partitioning; what differs is float32 summation order, and a
hidden probability within that noise of its uniform draw could flip one sample.
Over these 20 steps none does (measured: errors below 1e-6).
"""
import numpy as np
import pytest

import nets
import oracle
from conftest import agree

RTOL = 1e-5
STEPS = 20


def _errors(trainer, phase: str) -> list[float]:
    return [h["squared_error"] for h in trainer.history if h["phase"] == phase]


@pytest.mark.parametrize("scheme", ["data", "feature", "location"])
@pytest.mark.parametrize("cd_k", [1, 2])
@pytest.mark.parametrize("which_batch", [0, 1])
def test_cd_matches_serial(world, scheme, cd_k, which_batch):
    n = world.size
    batch = [4 * n, 4 * n + 1][which_batch]
    data = nets.make_data(oracle.scratch("rbm_data", world.rank) + ".h5", 64, (12,), 5, unit=True)
    text = nets.rbm(data, batch, scheme, cd_k, n, steps=STEPS, gaussian=(cd_k == 2), test=True)
    name = f"rbm_{scheme}_cd{cd_k}_{batch}"
    workspace = oracle.scratch(f"ws_{name}", world.rank)
    parallel, serial = oracle.partitioned(text, workspace, world), oracle.serial(text, workspace)
    parallel.run()
    serial.run()
    problems = []
    for phase in ("train", "test"):
        got, want = _errors(parallel, phase), _errors(serial, phase)
        if not want or len(got) != len(want):
            problems.append(f"{phase}: {len(got)} errors vs serial {len(want)}")
            continue
        err = np.abs(np.array(got) - want) / np.abs(want)
        if err.max() > RTOL:
            step = int(np.argmax(err))
            problems.append(f"{phase} error {step}: {got[step]!r} vs serial {want[step]!r}")
    problems += oracle.compare_checkpoints(oracle.snapshot(parallel, STEPS), oracle.snapshot(serial, STEPS), RTOL)
    if not np.isfinite(_errors(serial, "train")).all():
        problems.append("serial errors not finite")
    agree(world, not problems, f"{name}: " + "; ".join(problems))
