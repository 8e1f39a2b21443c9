"""What each rank holds: feature partitioning keeps about 1/N of an inner-product layer's weights
and of their updater state per rank, as the plan says (the bytes are counted, not estimated)."""
import math

import numpy as np

import nets
import oracle
from conftest import agree


def test_feature_split_weights_and_their_updater_state_are_one_nth_per_rank(world):
    path = nets.make_data(oracle.scratch("memory_data", world.rank) + ".h5", 64, (12,), 5)
    text = nets.mlp(path, 8, "feature", world.size, steps=2)  # momentum: one state array per param
    trainer = oracle.partitioned(text, oracle.scratch("ws_memory", world.rank), world)
    oracle.train(trainer)
    the_plan = trainer.runtime.plans["train"]
    planned = {(s.name, s.offsets): 4 * s.size for sub in the_plan.on_rank(world.rank) for s in sub.params}
    held = {(p.name, p.shard): p.data.nbytes for p in trainer.train_net.params}
    state = {p.name: sum(a.nbytes for a in trainer.updater.state(p.name).values())
             for p in trainer.runtime.owned_params()}
    problems = []
    if held != planned:
        problems.append(f"param bytes {held} vs the plan's {planned}")
    for (name, offsets), nbytes in held.items():
        logical = 4 * math.prod(next(p.logical_shape for p in trainer.train_net.params if p.name == name))
        if name.startswith("w_") and nbytes > 4 * math.ceil(logical / 4 / world.size) + 4 * logical // world.size:
            problems.append(f"{name}: {nbytes} bytes on this rank of {logical}: more than about 1/{world.size}")
        if state.get(name, 0) not in (0, nbytes):  # momentum history: one array of the shard's size
            problems.append(f"{name}: updater state {state.get(name)} bytes for a shard of {nbytes}")
    if not any(state.values()):
        problems.append("no updater state after two steps")
    summary = f"rank {world.rank}: {sum(held.values())} bytes of params, {np.sum(list(state.values()))} of state"
    agree(world, not problems, "; ".join(problems) + f" ({summary})")
