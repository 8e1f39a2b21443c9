"""Communicator calls the MPI runs depend on beyond the layers' exchanges (under mpiexec)."""
import time

from conftest import agree


def test_root_value_reaches_every_rank_while_the_others_sleep_through_a_slow_root(world):
    started = time.perf_counter()
    if world.rank == 0:
        time.sleep(0.3)  # timing kernels, as the cost model does before choosing
    value = world.root_value({"chosen": [0, 1, -1], "by": world.rank} if world.rank == 0 else None, "test")
    waited = time.perf_counter() - started
    agree(world, value == {"chosen": [0, 1, -1], "by": 0}, f"got {value}")
    agree(world, world.rank == 0 or waited >= 0.25, f"waited only {waited:.3f} s")


def test_waiting_for_the_root_costs_little_cpu(world):
    if world.size == 1:
        return
    before = time.process_time()
    if world.rank == 0:
        time.sleep(0.5)
    world.root_value(None, "test")
    used = time.process_time() - before
    agree(world, world.rank == 0 or used < 0.25, f"spent {used:.3f} s of CPU waiting 0.5 s")


def test_node_size_counts_the_ranks_sharing_this_ones_node(world):
    """`partition_dim: auto` times kernels beside a copy per other rank of rank 0's node."""
    size, one_node = world.node_size(), world.on_one_node()
    sizes = world.allgather_object(size)
    agree(world, 1 <= size <= world.size and (size == world.size) == one_node, f"node size {size} of {world.size}")
    nodes = sum(1 / s for s in sizes)  # a node of k ranks counts k times 1/k
    agree(world, abs(nodes - round(nodes)) < 1e-9 and (round(nodes) == 1) == one_node, f"node sizes {sizes}")
