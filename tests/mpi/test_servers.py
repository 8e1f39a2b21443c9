"""Sandblaster (one worker group, separate server ranks) equals the serial run.

The servers hold the params cut by SINGA's slicing rule and apply the updater; the workers send
gradient pieces and take fresh values back.  With one group nothing is asynchronous, so every step's
loss, the final params and the updater's state (assembled from the servers' ranges) must agree with
the serial run within ``RTOL``, for data, feature and hybrid partitioning inside the group, one
server or two.  Needs at least 2 ranks (one worker, one server).
"""
import numpy as np
import pytest

import nets
import oracle
from conftest import agree

RTOL = 1e-5
STEPS = 10
SCHEMES = ["data", "feature", "hybrid"]


def _servers(world) -> list[int]:
    return [n for n in (1, 2) if world.size - n >= 1]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("rule", ["adam-bias-corrected", "momentum"])
@pytest.mark.parametrize("nservers", [1, 2])
def test_sandblaster_trains_as_the_serial_run(world, scheme, rule, nservers):
    if world.size < 2 or nservers not in _servers(world):
        pytest.skip(f"{nservers} server(s) and at least one worker need {nservers + 1} ranks")
    nworkers = world.size - nservers
    if scheme != "data" and nworkers == 1:
        pytest.skip("feature and hybrid splits need two workers")
    path = nets.make_data(oracle.scratch("servers_data", world.rank) + ".h5", 64, (12,), 5)
    text = nets.mlp(path, 4 * nworkers + 1, scheme, nworkers, steps=STEPS,
                    updater=nets.updater(rule) if rule in nets.UPDATER_RULES else nets.UPDATER)
    workspace = oracle.scratch(f"ws_servers_{scheme}_{rule}_{nservers}", world.rank)
    trainer = oracle.with_servers(text, workspace, world, nservers)
    problems = []
    if trainer is not None:
        serial = oracle.serial(text, workspace)
        losses, serial_losses = oracle.train(trainer), oracle.train(serial)
        problems += oracle.compare_losses(losses, serial_losses, RTOL, STEPS)
        got, want = oracle.snapshot(trainer, STEPS), oracle.snapshot(serial, STEPS)
        problems += oracle.compare_checkpoints(got, want, RTOL, state=True)
        if got is not None and not want.updater:
            problems.append("the serial run kept no updater state")
        if not np.isfinite(serial_losses).all():
            problems.append(f"serial losses not finite: {serial_losses}")
    oracle.finish(trainer)
    agree(world, not problems, f"{scheme} {rule} {nservers} server(s): " + "; ".join(problems))


@pytest.mark.parametrize("scheme", ["data", "filters", "hybrid"])
def test_sandblaster_convnet_trains_as_the_serial_run(world, scheme):
    """Convolutions split on filters keep their weights in shards whose pieces cut across the servers'
    ranges (index arrays, not runs): the values must still land where the serial run has them."""
    if world.size < 3 and scheme != "data":
        pytest.skip("feature and hybrid splits need two workers and a server")
    if world.size < 2:
        pytest.skip("a worker and a server need 2 ranks")
    nservers = 2 if world.size >= 4 else 1
    nworkers = world.size - nservers
    path = nets.make_data(oracle.scratch("servers_conv_data", world.rank) + ".h5", 64, (2, 8, 8), 5)
    text = nets.convnet(path, 2 * nworkers + 1, scheme, STEPS, pool="AVG", act="kSTanh")
    workspace = oracle.scratch(f"ws_servers_conv_{scheme}", world.rank)
    trainer = oracle.with_servers(text, workspace, world, nservers)
    problems = []
    if trainer is not None:
        serial = oracle.serial(text, workspace)
        problems += oracle.compare_losses(oracle.train(trainer), oracle.train(serial), RTOL, STEPS)
        problems += oracle.compare_checkpoints(oracle.snapshot(trainer, STEPS), oracle.snapshot(serial, STEPS),
                                               RTOL, state=True)
    oracle.finish(trainer)
    agree(world, not problems, f"convnet {scheme} {nservers} server(s): " + "; ".join(problems))
